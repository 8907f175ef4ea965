//! `bench-generator`: fills the benchmark's input topic once (or, with `--rate`, produces
//! open loop at a fixed rate for latency runs) and publishes the rules file.
//!
//! Prints one JSON summary line on stdout: records, duplicates, bytes, seconds.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Parser;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamstate_bench_generator::{Dist, Generator, Spec};

#[derive(Parser, Debug)]
#[command(about = "Seeded benchmark input for streamstate")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:19092")]
    bootstrap: String,
    #[arg(long, default_value = "bench-input")]
    topic: String,
    /// Partitions of the input topic when this creates it (an existing topic must match).
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Key cardinality (`user_id` values).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    #[arg(long, default_value = "uniform")]
    dist: Dist,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 0.01)]
    duplicate_rate: f64,
    #[arg(long, default_value_t = 250)]
    event_bytes: usize,
    /// Open loop: this many records per second, each stamped (field `ts` and the Kafka
    /// timestamp) with its intended send time, so latency includes any backlog. 0: as
    /// fast as the broker takes them, `ts` from a fixed start.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Rules to publish before the input: a JSON array of rules, each keyed by its `id`.
    #[arg(long)]
    rules: Option<PathBuf>,
    #[arg(long, default_value = "bench-rules")]
    control_topic: String,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        // Java's partitioner, so input partitions match streamstate's key groups.
        .set("partitioner", "murmur2_random")
        .create()
        .context("creating the producer")?;
    ensure_topic(&args.bootstrap, &args.topic, args.partitions)?;
    if let Some(path) = &args.rules {
        ensure_topic(&args.bootstrap, &args.control_topic, 1)?;
        publish_rules(&producer, path, &args.control_topic)?;
    }
    let start_ms = if args.rate > 0 {
        now_ms()
    } else {
        1_700_000_000_000
    };
    let spec = Spec {
        events: args.events,
        keys: args.keys,
        dist: args.dist,
        seed: args.seed,
        duplicate_rate: args.duplicate_rate,
        event_bytes: args.event_bytes,
        start_ms,
    };
    let (mut duplicates, mut bytes) = (0u64, 0u64);
    let started = Instant::now();
    for (i, mut record) in Generator::new(spec).enumerate() {
        let mut timestamp = None;
        if args.rate > 0 {
            // Intended send time of record i; the ts field is rewritten to it (same width
            // is not needed: consumers parse JSON).
            let due = Duration::from_secs_f64(i as f64 / args.rate as f64);
            let intended = start_ms + due.as_millis() as u64;
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
            record.value = restamp(&record.value, intended)?;
            timestamp = Some(intended as i64);
        }
        duplicates += u64::from(record.duplicate);
        bytes += record.value.len() as u64;
        let mut r = BaseRecord::to(&args.topic)
            .key(&record.key)
            .payload(&record.value);
        if let Some(ts) = timestamp {
            r = r.timestamp(ts);
        }
        send(&producer, r)?;
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the input")?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({"topic": args.topic, "records": args.events, "duplicates": duplicates,
                           "bytes": bytes, "seconds": secs, "keys": args.keys,
                           "dist": format!("{:?}", args.dist).to_lowercase(), "seed": args.seed})
    );
    Ok(())
}

fn send(
    producer: &BaseProducer,
    mut record: BaseRecord<'_, String, Vec<u8>>,
) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => {
                producer.poll(Duration::ZERO);
                return Ok(());
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => bail!("producing: {e}"),
        }
    }
}

fn restamp(value: &[u8], ts: u64) -> anyhow::Result<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(value)?;
    v["ts"] = ts.into();
    Ok(serde_json::to_vec(&v)?)
}

fn publish_rules(producer: &BaseProducer, path: &PathBuf, topic: &str) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let rules: Vec<serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array", path.display()))?;
    for rule in rules {
        let id = rule["id"]
            .as_str()
            .context("a rule without a string id")?
            .to_string();
        let value = serde_json::to_vec(&rule)?;
        send(producer, BaseRecord::to(topic).key(&id).payload(&value))?;
    }
    producer
        .flush(Duration::from_secs(30))
        .context("flushing the rules")?;
    Ok(())
}

fn ensure_topic(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating the admin client")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let results = rt.block_on(admin.create_topics(
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => bail!("creating topic {t}: {e}"),
        }
    }
    // A new topic's partitions appear in metadata once their leaders are elected.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let md = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .context("reading topic metadata")?;
        let found = md
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len() as i32);
        if found == partitions {
            return Ok(());
        }
        if found > 0 || Instant::now() > deadline {
            bail!(
                "topic {topic} has {found} partitions, not {partitions}: delete it or pass --partitions {found}"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
