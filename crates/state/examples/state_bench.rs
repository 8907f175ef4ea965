//! State benchmark (not a test): the state cache on and off for an S-like
//! pattern, ops/s per state kind and backend, and snapshot time/size for 1M
//! keys, plus the incremental snapshot after 1,000 updates.
//! Run: `cargo run --release -p streamstate-state --example state_bench [keys] [--cache-only]`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use streamstate_state::*;

struct Sum;
impl AggregateFunction for Sum {
    type In = u64;
    type Acc = (u64, u64);
    type Out = u64;
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, v: u64, a: (u64, u64)) -> (u64, u64) {
        (a.0 + v, a.1 + 1)
    }
    fn get_result(&self, a: &(u64, u64)) -> u64 {
        a.0
    }
    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

fn keys(n: u64) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| format!("user-{i:08}").into_bytes())
        .collect()
}

fn rate(label: &str, kind: BackendKind, ops: u64, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let t = Instant::now();
    f()?;
    let secs = t.elapsed().as_secs_f64();
    println!("{kind:?}\t{label:<28}\t{:>12.0} ops/s", ops as f64 / secs);
    Ok(())
}

/// A rule engine's per-key state, roughly: an accumulator per rule.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Acc {
    count: u64,
    sum: f64,
    last_ts: u64,
}

/// The S-like pattern: per event, a dedup check-and-insert of a new event id
/// (map state with TTL) and a read-modify-write of `states` value states of
/// the event's key, with a checkpoint (snapshot) after every
/// `events_per_epoch` events. Returns events/s with and without the time in
/// checkpoints, and the p50 and max checkpoint times (the barrier write-back
/// of the cache is part of the checkpoint). With `batch` > 0, events come in
/// batches of that many, as the job loop polls them: the batch's dedup entries
/// and values are read ahead together.
#[allow(clippy::too_many_arguments)]
fn s_like(
    kind: BackendKind,
    cache_bytes: u64,
    batch: u64,
    keys: u64,
    events_per_epoch: u64,
    epochs: u64,
    states: usize,
    dir: &std::path::Path,
) -> Result<(f64, f64, f64, f64, CacheStats)> {
    let store = StateStore::open_with_clock(
        StoreConfig::new(kind, dir.join("live"), 128).with_cache_bytes(cache_bytes),
        Arc::new(ManualClock::new(1)),
    )?;
    let accs = (0..states)
        .map(|i| store.value_state(&ValueStateDescriptor::<Acc>::new(format!("acc-{i}"))))
        .collect::<Result<Vec<_>>>()?;
    let dedup = store.map_state(
        &MapStateDescriptor::<u64, u64>::new("dedup")
            .with_ttl(TtlConfig::new(std::time::Duration::from_secs(600))),
    )?;
    let ks = self::keys(keys);
    let mut barrier = Vec::with_capacity(epochs as usize);
    let mut completing: Option<std::thread::JoinHandle<Result<()>>> = None;
    let t = Instant::now();
    let mut event = 0u64;
    let key_of = |event: u64| &ks[(event.wrapping_mul(2_654_435_761) % keys) as usize];
    for epoch in 0..epochs {
        let end = event + events_per_epoch;
        while event < end {
            let size = batch.max(1).min(end - event);
            if batch > 0 {
                store.begin_batch()?;
                let mut ahead = store.prefetch_list();
                for e in event..event + size {
                    dedup.prefetch(&mut ahead, key_of(e), &[], &e)?;
                    for a in &accs {
                        a.prefetch(&mut ahead, key_of(e), &[])?;
                    }
                }
                store.prefetch(ahead)?;
            }
            for _ in 0..size {
                store.set_current_key(key_of(event))?;
                if !dedup.contains(&event)? {
                    dedup.put(&event, &event)?;
                }
                for a in &accs {
                    let mut acc = a.value()?.unwrap_or(Acc {
                        count: 0,
                        sum: 0.0,
                        last_ts: 0,
                    });
                    acc.count += 1;
                    acc.sum += event as f64;
                    acc.last_ts = event;
                    a.update(&acc)?;
                }
                event += 1;
            }
            store.end_batch()?;
        }
        // The barrier is what the job thread pauses for; the rest completes on another
        // thread while the next epoch runs, as the service's committer does.
        let b = Instant::now();
        let chk = dir.join(format!("chk-{epoch}"));
        let (mut result, rest) = store.snapshot_deferred(epoch, &chk)?;
        barrier.push(b.elapsed().as_secs_f64() * 1e3);
        if let Some(previous) = completing.take() {
            previous.join().expect("completing thread")?;
        }
        let old = (epoch > 0).then(|| dir.join(format!("chk-{}", epoch - 1)));
        completing = Some(std::thread::spawn(move || -> Result<()> {
            if let Some(rest) = rest {
                rest.complete(&mut result)?;
            }
            if let Some(old) = old {
                let _ = std::fs::remove_dir_all(old);
            }
            Ok(())
        }));
    }
    if let Some(last) = completing.take() {
        last.join().expect("completing thread")?;
    }
    let secs = t.elapsed().as_secs_f64();
    let stats = store.cache_stats();
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    barrier.sort_by(|a, b| a.total_cmp(b));
    let in_barriers: f64 = barrier.iter().sum::<f64>() / 1e3;
    let p50 = barrier[barrier.len() / 2];
    let max = *barrier.last().unwrap_or(&0.0);
    let n = (epochs * events_per_epoch) as f64;
    Ok((n / secs, n / (secs - in_barriers), p50, max, stats))
}

fn cache_figures(tmp: &std::path::Path) -> Result<()> {
    // The rule engine keeps every running rule of a key in one value (src/rules/running.rs).
    let states = 1;
    println!(
        "S-like: per event 1 dedup contains+put (map, TTL) + {states} value read-modify-write, a snapshot per epoch"
    );
    println!(
        "backend\tkeys\tevents/epoch\tcache\tbatch\tevents/s\tstate ops/s\tevents/s outside checkpoints\tcheckpoint p50 ms\tmax ms\thit ratio"
    );
    // Many events per key per epoch (the cache's case), then almost one per key.
    for (keys, per_epoch, epochs) in [(10_000u64, 50_000u64, 10u64), (1_000_000, 50_000, 20)] {
        for kind in [BackendKind::Rocksdb, BackendKind::Hashmap] {
            for (cache, batch) in [(0, 0), (0, 256), (DEFAULT_CACHE_BYTES, 0)] {
                let dir = tmp.join(format!("s-like-{kind:?}-{keys}-{cache}-{batch}"));
                let (eps, processing, p50, max, st) =
                    s_like(kind, cache, batch, keys, per_epoch, epochs, states, &dir)?;
                let ratio = if st.hits + st.misses > 0 {
                    format!("{:.3}", st.hits as f64 / (st.hits + st.misses) as f64)
                } else {
                    "-".into()
                };
                println!(
                    "{kind:?}\t{keys}\t{per_epoch}\t{}\t{batch}\t{eps:.0}\t{:.0}\t{processing:.0}\t{p50:.1}\t{max:.1}\t{ratio}",
                    if cache == 0 {
                        "off".to_string()
                    } else {
                        format!("{} MiB", cache >> 20)
                    },
                    // contains + put + states × (get + update)
                    eps * (2 + 2 * states) as f64,
                );
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let snapshot_keys: u64 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let ops: u64 = 300_000;
    let ks = keys(100_000);
    let tmp = std::env::temp_dir().join(format!("streamstate-bench-{}", std::process::id()));
    cache_figures(&tmp)?;
    if args.iter().any(|a| a == "--cache-only") {
        let _ = std::fs::remove_dir_all(&tmp);
        return Ok(());
    }
    println!("backend\tstate kind (set_current_key + op)\tthroughput");
    for kind in [BackendKind::Hashmap, BackendKind::Rocksdb] {
        let store = StateStore::open_with_clock(
            StoreConfig::new(kind, tmp.join(format!("{kind:?}")), 128),
            Arc::new(ManualClock::new(1)),
        )?;
        let v = store.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
        let vt = store.value_state(
            &ValueStateDescriptor::<u64>::new("count-ttl")
                .with_ttl(TtlConfig::new(std::time::Duration::from_secs(60))),
        )?;
        let l = store.list_state(&ListStateDescriptor::<u64>::new("list"))?;
        let m = store.map_state(&MapStateDescriptor::<u32, u64>::new("map"))?;
        let r = store.reducing_state(&ReducingStateDescriptor::new(
            "reduce",
            |a: &u64, b: &u64| a + b,
        ))?;
        let a = store.aggregating_state(&AggregatingStateDescriptor::new("agg", Sum))?;
        let n = ks.len() as u64;
        let key = |i: u64| &ks[(i.wrapping_mul(2_654_435_761) % n) as usize];
        rate("value get+update", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                let c = v.value()?.unwrap_or(0);
                v.update(&(c + 1))?;
            }
            Ok(())
        })?;
        rate("value get+update (TTL)", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                let c = vt.value()?.unwrap_or(0);
                vt.update(&(c + 1))?;
            }
            Ok(())
        })?;
        rate("list add", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                l.add(&i)?;
            }
            Ok(())
        })?;
        rate("list get (~3 elements)", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                std::hint::black_box(l.get()?);
            }
            Ok(())
        })?;
        rate("map put", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                m.put(&((i % 8) as u32), &i)?;
            }
            Ok(())
        })?;
        rate("map get", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                std::hint::black_box(m.get(&((i % 8) as u32))?);
            }
            Ok(())
        })?;
        rate("reducing add", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                r.add(&i)?;
            }
            Ok(())
        })?;
        rate("aggregating add", kind, ops, || {
            for i in 0..ops {
                store.set_current_key(key(i))?;
                a.add(i)?;
            }
            Ok(())
        })?;
        drop((v, vt, l, m, r, a));
        drop(store);

        // Snapshots of `snapshot_keys` keys.
        let store = StateStore::open(StoreConfig::new(
            kind,
            tmp.join(format!("{kind:?}-snap")),
            128,
        ))?;
        let v = store.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
        let big = keys(snapshot_keys);
        let t = Instant::now();
        for (i, k) in big.iter().enumerate() {
            store.set_current_key(k)?;
            v.update(&(i as u64))?;
        }
        let fill = t.elapsed();
        let t = Instant::now();
        let first = store.snapshot(1, &tmp.join(format!("{kind:?}-chk-1")))?;
        let first_time = t.elapsed();
        for k in big.iter().take(1000) {
            store.set_current_key(k)?;
            v.update(&7)?;
        }
        let t = Instant::now();
        let second = store.snapshot(2, &tmp.join(format!("{kind:?}-chk-2")))?;
        let second_time = t.elapsed();
        let old: HashSet<(String, String)> = first
            .files
            .iter()
            .map(|f| (f.path.clone(), f.sha256.clone()))
            .collect();
        let new_bytes: u64 = second
            .files
            .iter()
            .filter(|f| !old.contains(&(f.path.clone(), f.sha256.clone())))
            .map(|f| f.size)
            .sum();
        // A checkpoint as the job takes it: the barrier on the job thread, the rest
        // (RocksDB's files, the heap's frozen copy written out) after it.
        for k in big.iter().take(1000) {
            store.set_current_key(k)?;
            v.update(&8)?;
        }
        let t = Instant::now();
        let (mut third, rest) = store.snapshot_deferred(3, &tmp.join(format!("{kind:?}-chk-3")))?;
        let barrier_time = t.elapsed();
        let t = Instant::now();
        if let Some(rest) = rest {
            rest.complete(&mut third)?;
        }
        let after_barrier_time = t.elapsed();
        let t = Instant::now();
        let restored = StateStore::open(StoreConfig::new(
            kind,
            tmp.join(format!("{kind:?}-restore")),
            128,
        ))?;
        restored.restore(&[(tmp.join(format!("{kind:?}-chk-2")), second.clone())])?;
        let restore_time = t.elapsed();
        println!(
            "{kind:?}\tsnapshot {snapshot_keys} keys: fill {:.2?}, snapshot {:.2?}, {:.1} MB in {} files; after 1000 updates: snapshot {:.2?}, new files {:.1} KB of {:.1} MB total; checkpoint: barrier (job thread) {:.2?}, then {:.2?} after it; restore {:.2?}",
            fill,
            first_time,
            first.total_size() as f64 / 1e6,
            first.files.len(),
            second_time,
            new_bytes as f64 / 1e3,
            second.total_size() as f64 / 1e6,
            barrier_time,
            after_barrier_time,
            restore_time
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
