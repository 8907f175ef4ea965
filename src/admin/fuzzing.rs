//! A harness for fuzzing the admin API's request handling, shared by the cargo-fuzz
//! target `fuzz/fuzz_targets/admin.rs` and the in-process loop `integration-tests/fuzz_loop.rs`
//! (so both judge the same thing). Not part of the service.
//!
//! Each input is the bytes a client writes on one connection, parsed by the same hyper
//! HTTP/1 server and router the service runs (token check, body cap, every route's
//! extractors and id validation), over an in-memory pipe. A stand-in job loop answers what
//! the handlers ask of the job, so every route is reached without Kafka.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config::Config;
use crate::job::Control;
use crate::metrics::Metrics;
use crate::requests::{Request, StateAnswer};

/// The token the harness's config requires; seeds send it so guarded routes run too.
pub const TOKEN: &str = "t0ken";

/// What the stand-in loop answers where only the real job could succeed; a 500 carrying it
/// is the stand-in's, any other 500 is a finding.
const STAND_IN: &str = "stand-in job loop";

/// No request may take this long: nothing here waits on Kafka or a slow client.
const HANG: Duration = Duration::from_secs(20);

pub struct Harness {
    app: Router,
    runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Harness {
    pub fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let token = dir.path().join("token");
        std::fs::write(&token, TOKEN).map_err(|e| e.to_string())?;
        let config = dir.path().join("streamstate.toml");
        // Nothing listens on port 9: the one route that would write to Kafka (rollback)
        // needs a known rule first, and the harness has none.
        let text = format!(
            r#"[kafka]
bootstrap_servers = "127.0.0.1:9"
app_id = "fuzz"
input_topics = ["events"]
output_topic = "out"
control_topic = "rules"
dead_letter_topic = "dlq"
[job]
key = "/user_id"
[state]
dir = "{state}"
[checkpoint]
storage = "file://{storage}"
[admin]
listen = "127.0.0.1:0"
token_file = "{token}"
"#,
            state = dir.path().join("state").display(),
            storage = dir.path().join("checkpoints").display(),
            token = token.display(),
        );
        std::fs::write(&config, text).map_err(|e| e.to_string())?;
        let config = Config::load(&config).map_err(|e| e.to_string())?;
        let metrics = Metrics::new().map_err(|e| e.to_string())?;
        let control = Arc::new(Control::default());
        control.ready.store(true, Ordering::SeqCst);
        control.alive.store(true, Ordering::SeqCst);
        let requests = control
            .requests
            .take_receiver()
            .ok_or("request receiver taken")?;
        std::thread::spawn(move || {
            for r in requests {
                // A handler that gave up waiting has dropped its end: nothing to answer.
                let _ = match r {
                    Request::Checkpoint { reply } => reply.send(Err(STAND_IN.into())).is_ok(),
                    Request::Savepoint { reply, .. } => reply.send(Err(STAND_IN.into())).is_ok(),
                    Request::Stop { reply, .. } => reply.send(Err(STAND_IN.into())).is_ok(),
                    Request::State { reply, .. } => reply.send(Ok(StateAnswer::NotFound)).is_ok(),
                };
            }
        });
        let app = super::router(control, metrics, &config).map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            app,
            runtime,
            _dir: dir,
        })
    }

    /// Serves `data` as one connection's bytes, checks what came back and returns the
    /// status of each response, in order.
    ///
    /// # Panics
    /// On what the fuzzer is to find: a hang, an answer that is not HTTP, or a 500 that
    /// is not the stand-in loop's.
    pub fn check(&self, data: &[u8]) -> Vec<u16> {
        let app = self.app.clone();
        let out = self.runtime.block_on(async move {
            let (client, server) = tokio::io::duplex(64 * 1024);
            let mut http = hyper::server::conn::http1::Builder::new();
            // The service's settings, plus half-close: the harness ends its input with EOF
            // and then reads, where hyper would otherwise drop the answers in flight.
            http.timer(TokioTimer::new())
                .header_read_timeout(super::HEADER_READ_TIMEOUT)
                .half_close(true);
            let connection =
                http.serve_connection(TokioIo::new(server), TowerToHyperService::new(app));
            let (mut rd, mut wr) = tokio::io::split(client);
            let write = async {
                // The server may answer and close before reading everything (413).
                let _ = wr.write_all(data).await;
                let _ = wr.shutdown().await;
            };
            let read = async {
                let mut out = Vec::new();
                let _ = rd.read_to_end(&mut out).await;
                out
            };
            let run = async {
                let ((), out, _) = tokio::join!(write, read, connection);
                out
            };
            tokio::time::timeout(HANG, run).await
        });
        let Ok(out) = out else {
            panic!("no answer within {HANG:?}");
        };
        // Empty: nothing that looked like a request head arrived.
        let mut statuses = Vec::new();
        for (status, body) in responses(&out) {
            if status == 500 {
                let body = String::from_utf8_lossy(body);
                assert!(body.contains(STAND_IN), "500: {body}");
            }
            statuses.push(status);
        }
        statuses
    }
}

/// Splits a connection's output into (status, body) per response, reading each head's
/// `content-length` or chunked framing, so text a body echoes (an id from the path, say)
/// is never taken for another response.
///
/// # Panics
/// When the output is not a sequence of HTTP/1 responses.
fn responses(mut out: &[u8]) -> Vec<(u16, &[u8])> {
    let mut all = Vec::new();
    while !out.is_empty() {
        let Some(head_len) = out.windows(4).position(|w| w == b"\r\n\r\n") else {
            panic!(
                "a response head without its end: {:?}",
                String::from_utf8_lossy(out)
            );
        };
        let head = String::from_utf8_lossy(&out[..head_len]).to_ascii_lowercase();
        // hyper answers in the request's version (1.0 or 1.1).
        let status = head
            .strip_prefix("http/1.1 ")
            .or_else(|| head.strip_prefix("http/1.0 "))
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok());
        let Some(status) = status else {
            panic!("not an HTTP response: {head:?}");
        };
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        };
        let rest = &out[head_len + 4..];
        let (body, used) = if let Some(len) = header("content-length:") {
            let len: usize = len
                .parse()
                .unwrap_or_else(|_| panic!("content-length {len:?}"));
            assert!(rest.len() >= len, "body shorter than its content-length");
            (&rest[..len], len)
        } else if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
            let len = chunked_len(rest);
            (&rest[..len], len)
        } else {
            (rest, rest.len()) // delimited by the connection's close
        };
        all.push((status, body));
        out = &rest[used..];
    }
    all
}

/// Bytes a chunked body takes, up to and including its last (empty) chunk's CRLFs.
fn chunked_len(body: &[u8]) -> usize {
    let mut at = 0;
    loop {
        let Some(line) = body[at..].windows(2).position(|w| w == b"\r\n") else {
            panic!("chunked body without a size line");
        };
        let size = std::str::from_utf8(&body[at..at + line])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .unwrap_or_else(|| panic!("bad chunk size"));
        at += line + 2 + size + 2;
        assert!(at <= body.len(), "chunk longer than the output");
        if size == 0 {
            return at;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus/admin")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The harness must reach the routes, not just hyper's parser: each seed gets the
    /// answer its route gives.
    #[test]
    fn seeds_reach_their_routes() {
        let h = Harness::new().expect("harness");
        for (name, expected) in [
            ("livez", vec![200]),
            ("pipelined", vec![200, 200]),
            ("checkpoint_id", vec![404]),
            ("checkpoint_dotdot", vec![400]),
            ("trigger", vec![500]),
            ("savepoint_target", vec![400]),
            ("stop", vec![500]),
            ("rollback", vec![404]),
            ("state", vec![404]),
            ("bad_token", vec![401]),
            ("rules", vec![404, 200, 200]),
            ("echo_status", vec![404, 200]),
        ] {
            assert_eq!(h.check(&seed(name)), expected, "{name}");
        }
        assert_eq!(h.check(b""), Vec::<u16>::new());
        assert_eq!(h.check(b"\x00garbage\r\n\r\n"), vec![400]);
    }

    #[test]
    fn responses_are_split_by_their_framing_not_by_text_in_bodies() {
        let out = b"HTTP/1.1 404 Not Found\r\ncontent-length: 16\r\n\r\nHTTP/1.1 500 x y\
HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n\
HTTP/1.0 400 Bad Request\r\n\r\nrest";
        let got: Vec<(u16, &[u8])> = responses(out);
        assert_eq!(
            got,
            vec![
                (404, b"HTTP/1.1 500 x y".as_slice()),
                (200, b"3\r\nabc\r\n0\r\n\r\n".as_slice()),
                (400, b"rest".as_slice()),
            ]
        );
    }
}
