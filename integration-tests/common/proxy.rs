//! A TCP forwarder that a test can cut and restore: a service's view of a server (the
//! S3 test server) going away and coming back, while the server itself keeps its data.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Both ends of every forwarded connection, so a cut can close them.
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Forwards connections to `target` from a fresh loopback port.
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr");
        let cut = Arc::new(AtomicBool::new(false));
        let live: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, l) = (cut.clone(), live.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if c.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&target, Duration::from_secs(3)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let mut streams = l.lock().unwrap_or_else(|e| e.into_inner());
                for s in [&client, &server] {
                    if let Ok(s) = s.try_clone() {
                        streams.push(s);
                    }
                }
                drop(streams);
                pump(&client, &server);
                pump(&server, &client);
            }
        });
        Self { addr, cut, live }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// From now on every connection is closed at once, and open ones are closed.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn pump(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
