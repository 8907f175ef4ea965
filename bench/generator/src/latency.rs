//! `bench-latency`: end-to-end latency as a read_committed reader sees it.
//!
//! Reads an output topic from its end (records written from now on) and, for every record
//! whose value carries the generator's `"ts":<ms>` (the intended send time in open-loop
//! mode), takes `now - ts`. So latency includes producer backlog, the contender's batching
//! and its transaction commit. Stops once the file `--done` exists and no record arrived
//! for `--idle-ms`; prints `{"records", "p50_ms", "p99_ms", "p999_ms", "max_ms"}`.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    /// Records whose intended send time is earlier than this many ms after this reader
    /// started are left out (warm-up, and any priming input).
    #[arg(long, default_value_t = 5_000)]
    warmup_ms: u64,
    #[arg(long)]
    done: PathBuf,
    #[arg(long, default_value_t = 3_000)]
    idle_ms: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", format!("bench-latency-{}", std::process::id()))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .context("creating the consumer")?;
    consumer.subscribe(&[&args.topic]).context("subscribing")?;
    let mut latencies: Vec<u64> = Vec::new();
    let since = now_ms() + args.warmup_ms;
    let mut last_record = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last_record = Instant::now();
                let Some(ts) = m.payload().and_then(intended_ms) else {
                    continue;
                };
                if ts >= since {
                    latencies.push(now_ms().saturating_sub(ts));
                }
            }
            Some(Err(e)) => eprintln!("bench-latency: consumer error: {e}"),
            None => {}
        }
        if args.done.exists() && last_record.elapsed() >= Duration::from_millis(args.idle_ms) {
            break;
        }
    }
    latencies.sort_unstable();
    let q = |p: f64| -> Option<u64> {
        (!latencies.is_empty())
            .then(|| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)])
    };
    println!(
        "{}",
        serde_json::json!({"records": latencies.len(), "p50_ms": q(0.5), "p99_ms": q(0.99),
                           "p999_ms": q(0.999), "max_ms": latencies.last()})
    );
    Ok(())
}

/// The number after the first `"ts":` in `value`, without parsing the whole JSON.
fn intended_ms(value: &[u8]) -> Option<u64> {
    let at = value.windows(5).position(|w| w == b"\"ts\":")? + 5;
    let digits: Vec<u8> = value[at..]
        .iter()
        .copied()
        .skip_while(|b| *b == b' ')
        .take_while(u8::is_ascii_digit)
        .collect();
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
