//! `bench-latency`: end-to-end latency as a read_committed reader sees it.
//!
//! Reads an output topic from its end (records written from now on) and, for every record
//! whose value carries the generator's `"ts":<ms>` (the intended send time in open-loop
//! mode), takes `now - ts`. So latency includes producer backlog, the contender's batching
//! and its transaction commit. Stops once the file `--done` exists and no record arrived
//! for `--idle-ms`; prints `{"records", "p50_ms", "p99_ms", "p999_ms", "max_ms"}`.
//!
//! With `--input-topic`, a second consumer (read_uncommitted) takes the same `now - ts`
//! for the input records, printed as `input_*`: the part of the latency spent before the
//! contender could read the event (the generator's backlog, the broker, this reader's
//! fetch), so a miss can be split between the rig and the contender.
//!
//! A transaction's commit makes its whole epoch readable at once, so the output arrives
//! in bursts; a record's place in its burst is time spent draining it (this reader's
//! fetches, on a CPU it shares with the broker), not waiting for the commit. Printed as
//! `burst_*`: per record, the time since its burst's first record was received (a burst
//! ends at a gap of `--burst-gap-ms` without records), and `bursts`, how many there were.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use streamstate_bench_generator::ts_digits;

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
    /// Also measure when the input records became readable (see the module docs).
    #[arg(long)]
    input_topic: Option<String>,
    /// A gap this long without records ends a burst (see the module docs).
    #[arg(long, default_value_t = 50)]
    burst_gap_ms: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let since = now_ms() + args.warmup_ms;
    let input = args.input_topic.clone().map(|topic| {
        let (bootstrap, done, idle_ms) = (args.bootstrap.clone(), args.done.clone(), args.idle_ms);
        std::thread::spawn(move || {
            measure(
                &bootstrap,
                &topic,
                "read_uncommitted",
                since,
                &done,
                idle_ms,
                None,
            )
            .map(|(seen, _)| seen)
        })
    });
    let (output, bursts) = measure(
        &args.bootstrap,
        &args.topic,
        "read_committed",
        since,
        &args.done,
        args.idle_ms,
        Some(Duration::from_millis(args.burst_gap_ms)),
    )?;
    let mut out = output.summary("");
    if let (Some(out), Some(bursts)) = (out.as_object_mut(), bursts) {
        if let serde_json::Value::Object(more) = bursts.in_burst.summary("burst_") {
            out.extend(more);
        }
        out.insert("bursts".into(), bursts.count.into());
    }
    if let Some(handle) = input {
        let seen = handle
            .join()
            .map_err(|_| anyhow::anyhow!("the input reader panicked"))??;
        if let (Some(out), serde_json::Value::Object(more)) =
            (out.as_object_mut(), seen.summary("input_"))
        {
            out.extend(more);
        }
    }
    println!("{out}");
    Ok(())
}

/// Latencies (ms) of every record of `topic` whose `ts` is at or after `since`, until
/// `done` exists and `idle_ms` passed without a record; with `burst_gap`, also each such
/// record's place in its burst.
fn measure(
    bootstrap: &str,
    topic: &str,
    isolation: &str,
    since: u64,
    done: &std::path::Path,
    idle_ms: u64,
    burst_gap: Option<Duration>,
) -> anyhow::Result<(Latencies, Option<Bursts>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set(
            "group.id",
            format!("bench-latency-{}-{topic}", std::process::id()),
        )
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .context("creating the consumer")?;
    consumer.subscribe(&[topic]).context("subscribing")?;
    let mut latencies: Vec<u64> = Vec::new();
    let mut bursts = burst_gap.map(Bursts::new);
    let mut last_record = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last_record = Instant::now();
                let measured = m.payload().and_then(intended_ms).filter(|ts| *ts >= since);
                if let Some(ts) = measured {
                    latencies.push(now_ms().saturating_sub(ts));
                }
                if let Some(b) = bursts.as_mut() {
                    b.received(last_record, measured.is_some());
                }
            }
            Some(Err(e)) => eprintln!("bench-latency: consumer error on {topic}: {e}"),
            None => {}
        }
        // The idle check first: `exists` is a syscall, and this runs once per record.
        if last_record.elapsed() >= Duration::from_millis(idle_ms) && done.exists() {
            break;
        }
    }
    latencies.sort_unstable();
    if let Some(b) = bursts.as_mut() {
        b.in_burst.0.sort_unstable();
    }
    Ok((Latencies(latencies), bursts))
}

/// How the measured records arrived: in how many bursts, and each one's time (ms) since
/// its burst's first record. Every record received marks the bursts' boundaries; only the
/// measured ones are counted.
struct Bursts {
    gap: Duration,
    count: u64,
    in_burst: Latencies,
    /// The current burst's first and last record.
    span: Option<(Instant, Instant)>,
    /// Whether a measured record was counted in the current burst.
    counted: bool,
}

impl Bursts {
    fn new(gap: Duration) -> Self {
        Self {
            gap,
            count: 0,
            in_burst: Latencies(Vec::new()),
            span: None,
            counted: false,
        }
    }

    fn received(&mut self, now: Instant, measured: bool) {
        let start = match self.span {
            Some((start, last)) if now - last < self.gap => start,
            _ => {
                self.counted = false;
                now
            }
        };
        self.span = Some((start, now));
        if measured {
            self.count += u64::from(!self.counted);
            self.counted = true;
            self.in_burst.0.push((now - start).as_millis() as u64);
        }
    }
}

/// Sorted latencies in ms.
struct Latencies(Vec<u64>);

impl Latencies {
    fn summary(&self, prefix: &str) -> serde_json::Value {
        let v = &self.0;
        let q = |p: f64| -> Option<u64> {
            (!v.is_empty()).then(|| v[((v.len() as f64 * p) as usize).min(v.len() - 1)])
        };
        serde_json::json!({
            format!("{prefix}records"): v.len(), format!("{prefix}p50_ms"): q(0.5),
            format!("{prefix}p99_ms"): q(0.99), format!("{prefix}p999_ms"): q(0.999),
            format!("{prefix}max_ms"): v.last(),
        })
    }
}

/// The number of the first `"ts":` field in `value`, without parsing the whole JSON.
fn intended_ms(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(&value[ts_digits(value)?])
        .ok()?
        .parse()
        .ok()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_ends_a_burst_and_places_are_timed_from_its_first_record() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut b = Bursts::new(Duration::from_millis(50));
        for ms in [0, 10, 30] {
            b.received(at(ms), true);
        }
        // 70 ms later: a new burst.
        b.received(at(100), true);
        b.received(at(105), true);
        // An unmeasured record starts the third burst; the measured one is timed from it.
        b.received(at(300), false);
        b.received(at(320), true);
        // A burst of unmeasured records only is not counted.
        b.received(at(500), false);
        assert_eq!(b.count, 3);
        assert_eq!(b.in_burst.0, vec![0, 10, 30, 0, 5, 20]);
    }
}
