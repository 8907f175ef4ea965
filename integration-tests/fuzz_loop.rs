//! In-process fuzz loop over the same four targets as cargo-fuzz in `fuzz/` (decoder + key
//! extraction, rule spec + control envelope, checkpoint manifest, admin requests): mutations
//! of the seed corpus in `fuzz/corpus/<target>` plus random bytes, for
//! `STREAMSTATE_FUZZ_SECONDS` per target (default 5). Used by `integration-tests/fuzz.sh`
//! when cargo-fuzz cannot build (see docs/reliability.md); no broker needed.

use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use streamstate::admin::fuzzing::Harness;
use streamstate::checkpoint::{CheckpointRef, Manifest, is_safe_path};
use streamstate::control::Rules;
use streamstate::decode::Decoder;
use streamstate::state::{BackendKind, StateStore, StoreConfig};

fn seconds() -> Duration {
    Duration::from_secs(
        std::env::var("STREAMSTATE_FUZZ_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5),
    )
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| std::fs::read(e.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    seeds.push(Vec::new());
    seeds
}

const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"true",
    b"-1",
    b"1e999",
    b"\\u0000",
    b"\\ud800",
    b"\"user_id\"",
    b"\"ts\"",
    b"\"id\"",
    b"\"version\"",
    b"\"kind\"",
    b"\"aggregate\"",
    b"\"status\"",
    b"\"deleted\"",
    b"\"state\"",
    b"\"files\"",
    b"\"path\"",
    b"../",
    b"\xff",
    b"\xc3",
    b"18446744073709551615",
    b"\r\n",
    b"\r\n\r\n",
    b"%2e%2e%2f",
    b"Content-Length: ",
    b"Transfer-Encoding: chunked\r\n",
    b"Authorization: Bearer t0ken\r\n",
    b"/checkpoints/",
    b"/state/",
    b"/rules/",
];

fn mutate(rng: &mut impl Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.random_range(0..seeds.len())].clone();
    for _ in 0..rng.random_range(1..8) {
        let at = if d.is_empty() {
            0
        } else {
            rng.random_range(0..=d.len())
        };
        match rng.random_range(0..6) {
            0 if !d.is_empty() => {
                let i = at.min(d.len() - 1);
                d[i] ^= 1 << rng.random_range(0..8)
            }
            1 if !d.is_empty() => {
                let i = at.min(d.len() - 1);
                d.remove(i);
            }
            2 => d
                .splice(
                    at..at,
                    TOKENS[rng.random_range(0..TOKENS.len())].iter().copied(),
                )
                .for_each(drop),
            3 => {
                let b: u8 = rng.random();
                d.insert(at, b)
            }
            4 if !d.is_empty() => {
                let end = rng.random_range(at.min(d.len())..=d.len());
                let s = d[at.min(d.len())..end].to_vec();
                d.splice(at..at, s).for_each(drop)
            }
            _ => d.truncate(at),
        }
    }
    d
}

fn fuzz(target: &str, mut one: impl FnMut(&[u8])) {
    let seeds = corpus(target);
    let mut rng = rand::rngs::StdRng::seed_from_u64(
        std::env::var("STREAMSTATE_FUZZ_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(rand::random),
    );
    let (until, mut n) = (Instant::now() + seconds(), 0u64);
    for s in &seeds {
        one(s);
    }
    while Instant::now() < until {
        let input = if rng.random_ratio(1, 10) {
            (0..rng.random_range(0..256))
                .map(|_| rng.random())
                .collect()
        } else {
            mutate(&mut rng, &seeds)
        };
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| one(&input)));
        assert!(
            caught.is_ok(),
            "{target}: crash on input {:?}",
            String::from_utf8_lossy(&input)
        );
        n += 1;
    }
    eprintln!("fuzz {target}: {n} inputs in {:?}, no crash", seconds());
}

#[test]
fn decode() {
    let plain = Decoder::new("/user_id", 64 * 1024, 64);
    let timed = Decoder::new("/a/0/b~1c", 64 * 1024, 64)
        .with_timestamp(Some("/ts"))
        .with_max_skew(Some(Duration::from_secs(86_400)));
    fuzz("decode", |data| {
        for d in [&plain, &timed] {
            if let Ok(e) = d.decode_at(Some(data), 1_700_000_000_000) {
                assert!(e.key.len() <= 64);
            }
        }
    });
}

#[test]
fn rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = StateStore::open(StoreConfig::new(
        BackendKind::Hashmap,
        dir.path().join("s"),
        4,
    ))
    .expect("store");
    let rules = Rules::new(&store, Default::default());
    let mut offset = 0;
    fuzz("rules", |data| {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
            let _ = streamstate::rules::spec::compile(&v);
        }
        let split = data
            .first()
            .map_or(0, |b| (*b as usize).min(data.len().saturating_sub(1)));
        let (key, payload) = if data.is_empty() {
            (data, data)
        } else {
            data[1..].split_at(split.min(data.len() - 1))
        };
        offset += 1;
        let _ = rules
            .prepare(Some(key), Some(payload), 0, offset, 1_700_000_000_000)
            .expect("state layer");
    });
}

#[test]
fn manifest() {
    let expected = CheckpointRef::new(7, "0badcafe");
    fuzz("manifest", |data| {
        if let Ok(m) = Manifest::parse(data, &expected) {
            assert_eq!(m.checkpoint, expected);
            assert!(m.state.files.iter().all(|f| is_safe_path(&f.path)));
        }
    });
}

#[test]
fn admin() {
    let harness = Harness::new().expect("admin harness");
    fuzz("admin", |data| drop(harness.check(data)));
}
