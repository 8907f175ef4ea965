//! One running instance: the admin server on an async runtime, the job loop on its own
//! thread, SIGTERM/SIGINT into the shutdown flag. The binary's `run` and library users'
//! own `main`s (see `examples/`) both start here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::info;

use crate::admin;
use crate::config::Config;
use crate::function::ProcessFunction;
use crate::job::{Control, Job, JobError, StartOptions};
use crate::metrics::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("admin.listen: cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("registering metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error(transparent)]
    Job(#[from] JobError),
    #[error("job thread panicked")]
    Panicked,
}

/// Runs `function` as the job until SIGTERM/SIGINT (then drains, takes a final
/// checkpoint and returns) or a fatal error. For Rust users' own binaries.
pub fn run(config: Config, function: Box<dyn ProcessFunction>) -> Result<(), ServiceError> {
    let metrics = Metrics::new()?;
    serve(
        config,
        metrics,
        Arc::new(Control::default()),
        StartOptions::default(),
        Some(function),
    )
}

/// Like [`run`] with the pieces supplied; `function: None` runs the built-in
/// `[job] function`. The admin server stops last, after the job's final checkpoint.
pub fn serve(
    config: Config,
    metrics: Metrics,
    control: Arc<Control>,
    options: StartOptions,
    function: Option<Box<dyn ProcessFunction>>,
) -> Result<(), ServiceError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(ServiceError::Runtime)?;
    metrics
        .checkpoint_interval
        .set(config.checkpoint.interval.as_secs_f64());
    metrics
        .transaction_timeout
        .set(config.kafka.transaction_timeout.as_secs_f64());
    runtime.block_on(async {
        let listen = config.admin.listen;
        let listener = admin::bind(listen).await.map_err(|source| ServiceError::Bind { addr: listen, source })?;
        let (stop_admin, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = admin::router(control.clone(), metrics.clone(), &config)?;
        let server = tokio::spawn(admin::serve(listener, app, metrics.clone(), async {
            stopped.await.unwrap_or(())
        }));
        let signals = tokio::spawn(shutdown_on_signal(control.clone()));
        let watcher = tokio::spawn(watch_transactions(control.clone(), metrics.clone()));
        info!(admin = %listen, app_id = %config.kafka.app_id, instance = config.job.instance, "starting");
        let job_control = control.clone();
        let job = tokio::task::spawn_blocking(move || match function {
            Some(f) => Job::start_with(config, metrics, job_control, options, f)?.run(),
            None => Job::start(config, metrics, job_control, options)?.run(),
        })
        .await;
        if matches!(job, Ok(Ok(()))) && control.hold_after_stop.load(Ordering::SeqCst) {
            info!("stopped with hold: idle and not ready until SIGTERM");
            hold_until_signal(&control).await;
        }
        control.shutdown.store(true, Ordering::SeqCst);
        signals.abort();
        watcher.abort();
        let _ = stop_admin.send(());
        let _ = server.await;
        Ok(job.map_err(|_| ServiceError::Panicked)??)
    })
}

/// Warns (once per transaction) when the open transaction nears `transaction.timeout.ms`,
/// and ends the process when librdkafka holds a transactional call far past its bound.
/// Runs on the admin runtime, not the job loop, because a stuck loop is what makes a
/// transaction hang.
async fn watch_transactions(control: Arc<Control>, metrics: Metrics) {
    const TICK: std::time::Duration = std::time::Duration::from_secs(1);
    let mut tick = tokio::time::interval(TICK);
    // After a pause (SIGSTOP) the missed ticks are not made up: they would count the
    // pause as time the call was held.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Some(warning) = control.transactions.check_near_timeout() {
            warning.log();
            metrics.transactions_near_timeout.inc();
        }
        if let Some(stuck) = control.transactions.check_stuck(TICK) {
            stuck.log();
            std::process::exit(STUCK_EXIT_CODE);
        }
    }
}

/// The exit status after a transactional call that librdkafka would not return from: the
/// same as a run that ended with an error.
const STUCK_EXIT_CODE: i32 = 1;

async fn shutdown_on_signal(control: Arc<Control>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: draining and taking a final checkpoint"),
        _ = int.recv() => info!("SIGINT: draining and taking a final checkpoint"),
    }
    control.signalled.store(true, Ordering::SeqCst);
    control.shutdown.store(true, Ordering::SeqCst);
}

/// Keeps `/livez` answering (the loop's heartbeat, beaten here) until SIGTERM or SIGINT
/// (which the signal task records, also if it came before the hold began).
async fn hold_until_signal(control: &Control) {
    while !control.signalled.load(Ordering::SeqCst) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        control.heartbeat_ms.store(now, Ordering::Relaxed);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    info!("signal received while holding: exiting");
}
