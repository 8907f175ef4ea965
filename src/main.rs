//! The `streamstate` binary: `run`, `check-config`, `demo`, `checkpoints …`,
//! `check-restore`, and the operator verbs `topics …` and `rules …`. Errors become one line on
//! stderr and a non-zero exit; everything below this file returns typed errors.

mod demo;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use streamstate::config::Config;
use streamstate::job::{Control, StartOptions};
use streamstate::metrics::Metrics;
use streamstate::{rescale, service, tools};
use tracing::{error, info};

/// jemalloc for the whole process: Rust, RocksDB and librdkafka (the `unprefixed` feature
/// replaces `malloc` itself). The stateful path allocates per event (decoded JSON, outputs,
/// producer copies), and glibc's allocator was a fifth of its CPU; with jemalloc S-EO ran
/// about 11% more events per CPU-second in an interleaved A/B (bench/README.md, "Allocator
/// and fewer allocations").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    version,
    about = "Stateful exactly-once stream jobs over Kafka, with Flink's state model"
)]
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
        /// Restore this savepoint (`sp-<n>-<run>`, as `POST /savepoints` answered)
        /// instead of the committed checkpoint. Refused when the group's committed
        /// offsets differ from the savepoint's (records were processed after it).
        #[arg(long, value_name = "ID")]
        from_savepoint: Option<String>,
        /// Base URL the savepoint was written to, when not the default
        /// `<checkpoint.storage>/savepoints` (the `location` field of the savepoint).
        #[arg(long, value_name = "URL", requires = "from_savepoint")]
        savepoint_location: Option<String>,
        /// With --from-savepoint: restore even if the committed offsets differ
        /// (not exactly-once across this restart).
        #[arg(long, requires = "from_savepoint")]
        ignore_committed_offsets: bool,
        /// Rescaled start: restore this instance's share of the savepoint set NAME
        /// (`streamstate savepoint-set`). Safe to keep on the command line: once this
        /// instance has committed a checkpoint of its own, that one is restored instead.
        #[arg(long, value_name = "NAME", conflicts_with = "from_savepoint")]
        from_savepoint_set: Option<String>,
    },
    /// Load and validate a config file (and environment overrides) without connecting.
    CheckConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Record one savepoint of each of N stopped instances as a set, for a rescaled start
    /// (`run --from-savepoint-set NAME`). Refused unless all N parts are present.
    SavepointSet {
        #[arg(long, short)]
        config: PathBuf,
        /// Name of the set (`[A-Za-z0-9._-]`, written once).
        #[arg(long)]
        name: String,
        /// How many instances took the savepoints (the old `job.instances`).
        #[arg(long)]
        instances: u32,
        /// The savepoint ids in instance order; default: each instance's newest.
        #[arg(long, value_delimiter = ',')]
        ids: Option<Vec<String>>,
    },
    /// Print what each of the configured `job.instances` would restore from a set.
    RescalePlan {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        set: String,
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
    /// The topics a config needs: `check` them, `create` the missing ones (see
    /// docs/topics.md). Exit code 3: a topic is missing or wrong.
    Topics {
        #[command(subcommand)]
        command: tools::topics::TopicsCommand,
    },
    /// Rule files to the control topic: `validate`, `publish`, `delete`, `list`, `diff`
    /// (see docs/rules-cli.md). Exit code 3: refused, nothing published.
    Rules {
        #[command(subcommand)]
        command: tools::rules_cli::RulesCommand,
    },
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
    init_logging(cli.log_format, matches!(cli.command, Command::Demo { .. }));
    let result = match cli.command {
        Command::CheckConfig { config } => Config::load(&config)
            .map(|_| println!("config ok"))
            .map_err(Into::into),
        Command::SavepointSet {
            config,
            name,
            instances,
            ids,
        } => Config::load(&config).map_err(Into::into).and_then(|c| {
            let set = rescale::create(&c, &name, instances, ids.as_deref())?;
            println!("{}", serde_json::to_string_pretty(&set)?);
            Ok(())
        }),
        Command::RescalePlan { config, set } => {
            Config::load(&config).map_err(Into::into).and_then(|c| {
                let set = rescale::read(&c, &set)?;
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rescale::plan(
                        &set,
                        c.job.instances,
                        c.job.repartition.then(|| c.repartition_topic()).as_deref()
                    )?)?
                );
                Ok(())
            })
        }
        Command::Run {
            config,
            allow_older_checkpoint,
            from_savepoint,
            savepoint_location,
            ignore_committed_offsets,
            from_savepoint_set,
        } => {
            let options = StartOptions {
                allow_older_checkpoint,
                from_savepoint,
                savepoint_location,
                ignore_committed_offsets,
                from_savepoint_set,
            };
            Config::load(&config)
                .map_err(Into::into)
                .and_then(|c| run_service(c, options))
        }
        Command::Demo {
            duration,
            admin_listen,
        } => run_demo(duration.map(Into::into), admin_listen),
        Command::Checkpoints {
            config,
            instance,
            command,
        } => tools::run_checkpoints(&config, instance, command),
        Command::CheckRestore(args) => tools::check_restore::run(args),
        Command::Topics { command } => tools::topics::run(command),
        Command::Rules { command } => tools::rules_cli::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = if e.is::<tools::Refused>() {
                ExitCode::from(tools::EXIT_REFUSED)
            } else {
                ExitCode::FAILURE
            };
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

/// `demo` adds its own filter ([`demo::quiet_checkpoints`]) so its progress line stays
/// readable.
fn init_logging(format: LogFormat, demo: bool) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,librdkafka=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(demo.then(demo::quiet_checkpoints))
        .with(fmt)
        .init();
}

/// Admin server on the async runtime, the job loop on its own thread, signals into flags.
fn run_service(config: Config, options: StartOptions) -> anyhow::Result<()> {
    let metrics = Metrics::new().context("registering metrics")?;
    let control = Arc::new(Control::default());
    Ok(service::serve(config, metrics, control, options, None)?)
}

fn run_demo(
    duration: Option<std::time::Duration>,
    admin: std::net::SocketAddr,
) -> anyhow::Result<()> {
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
    let result = service::serve(
        config,
        metrics,
        control.clone(),
        StartOptions::default(),
        None,
    );
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
