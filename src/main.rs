//! The `streamstate` binary: `run`, `check-config`, `demo`, `checkpoints …` and
//! `check-restore`. Errors become one line on
//! stderr and a non-zero exit; everything below this file returns typed errors.

mod demo;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use streamstate::{service, tools};
use streamstate::config::Config;
use streamstate::job::{Control, StartOptions};
use streamstate::metrics::Metrics;
use tracing::{error, info};

#[derive(Parser)]
#[command(version, about = "Stateful exactly-once stream jobs over Kafka, with Flink's state model")]
struct Cli {
    /// `text` for terminals, `json` for log collectors.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the job described by a config file.
    Run {
        #[arg(long, short)]
        config: PathBuf,
        /// If the checkpoint the committed offsets name is missing or broken, restore the
        /// newest intact older one instead. Records after its offsets are processed again:
        /// this run is at-least-once.
        #[arg(long)]
        allow_older_checkpoint: bool,
    },
    /// Load and validate a config file (and environment overrides) without connecting.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Offline checkpoint tools on checkpoint storage (never on a running instance's
    /// files); see docs/checkpoint-tools.md. Exit code 3: a check failed.
    Checkpoints {
        #[arg(long, short)]
        config: PathBuf,
        /// Overrides `[job] instance` (whose checkpoints to read).
        #[arg(long)]
        instance: Option<u32>,
        #[command(subcommand)]
        command: tools::CheckpointsCommand,
    },
    /// Would a restore from this checkpoint or savepoint succeed with this binary and
    /// config? Per state: keep / migrate / new / drop / fail. Exit code 3: it would fail.
    CheckRestore(tools::check_restore::CheckRestoreArgs),
    /// Run the job on an in-process mock Kafka with generated events (no broker needed).
    Demo {
        /// Stop after this long (e.g. `60s`); default: until Ctrl-C.
        #[arg(long)]
        duration: Option<humantime::Duration>,
        /// Admin/metrics address.
        #[arg(long, default_value = "127.0.0.1:9464")]
        admin_listen: std::net::SocketAddr,
    },
}

fn main() -> ExitCode {
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let cli = Cli::parse();
    let json_logs = matches!(cli.log_format, LogFormat::Json);
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::CheckConfig { config } => Config::load(&config).map(|_| println!("config ok")).map_err(Into::into),
        Command::Run { config, allow_older_checkpoint } => {
            let options = StartOptions { allow_older_checkpoint };
            Config::load(&config).map_err(Into::into).and_then(|c| run_service(c, options))
        }
        Command::Demo { duration, admin_listen } => run_demo(duration.map(Into::into), admin_listen),
        Command::Checkpoints { config, instance, command } => tools::run_checkpoints(&config, instance, command),
        Command::CheckRestore(args) => tools::check_restore::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = if e.is::<tools::Refused>() { ExitCode::from(tools::EXIT_REFUSED) } else { ExitCode::FAILURE };
            // One line, in the format the operator chose.
            let line = one_line(&e);
            if json_logs {
                error!("{line}");
            } else {
                eprintln!("error: {line}");
            }
            code
        }
    }
}

/// The error and its causes on one line, skipping causes whose text the line already has
/// (librdkafka errors repeat their cause in their own message).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,librdkafka=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Admin server on the async runtime, the job loop on its own thread, signals into flags.
fn run_service(config: Config, options: StartOptions) -> anyhow::Result<()> {
    let metrics = Metrics::new().context("registering metrics")?;
    let control = Arc::new(Control::default());
    Ok(service::serve(config, metrics, control, options, None)?)
}

fn run_demo(duration: Option<std::time::Duration>, admin: std::net::SocketAddr) -> anyhow::Result<()> {
    let cluster = demo::start_cluster()?;
    let bootstrap = cluster.bootstrap_servers();
    let work = std::env::temp_dir().join(format!("streamstate-demo-{}", std::process::id()));
    let config = Config::from_defaults(&demo::config(bootstrap.clone(), &work, admin))?;
    info!(bootstrap = %bootstrap, work = %work.display(), "demo: mock cluster up (no exactly-once guarantee: see README)");
    let metrics = Metrics::new().context("registering metrics")?;
    let control = Arc::new(Control::default());
    let generator = {
        let control = control.clone();
        std::thread::spawn(move || demo::generate(bootstrap, control))
    };
    let reporter = {
        let (metrics, control) = (metrics.clone(), control.clone());
        std::thread::spawn(move || demo::report(metrics, control, admin))
    };
    if let Some(d) = duration {
        let control = control.clone();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            control.shutdown.store(true, Ordering::SeqCst);
        });
    }
    let result = service::serve(config, metrics, control.clone(), StartOptions::default(), None);
    control.shutdown.store(true, Ordering::SeqCst);
    let _ = reporter.join();
    match generator.join() {
        Ok(r) => r?,
        Err(_) => anyhow::bail!("demo generator panicked"),
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&work);
    Ok(result?)
}
