//! The benchmark's input, as a pure function of its [`Spec`]: the same seed gives the same
//! records in the same order, so every contender of every repeat reads identical bytes.
//!
//! Each record is a JSON event of about [`Spec::event_bytes`] bytes, keyed by `user_id`
//! (drawn uniformly or Zipf(1.0) from `keys` keys), with a unique `event_id` — except for
//! a `duplicate_rate` share of records that re-send one of the last [`RECENT`] events
//! byte for byte (what an upstream retry produces), which dedup rules must drop.
//!
//! Each record also carries its [`Event`]'s fields, from which [`avro`] writes the same
//! event in Avro (the Confluent wire format) for the Avro twin of the input topic.

pub mod avro;

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How far back a duplicate may reach: well inside any sensible dedup TTL.
pub const RECENT: usize = 1024;

/// Event types, with the share of events of each (per mille).
pub const EVENT_TYPES: [(&str, u32); 4] = [
    ("view", 600),
    ("click", 250),
    ("cart", 100),
    ("purchase", 50),
];

const COUNTRIES: [&str; 8] = ["DE", "FR", "US", "GB", "JP", "BR", "IN", "ES"];
const DEVICES: [&str; 3] = ["ios", "android", "web"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dist {
    Uniform,
    /// Zipf with exponent 1.0: key rank `k` has weight `1/k`.
    Zipf,
}

impl std::str::FromStr for Dist {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "uniform" => Ok(Self::Uniform),
            "zipf" => Ok(Self::Zipf),
            other => Err(format!("unknown distribution `{other}` (uniform|zipf)")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Spec {
    pub events: u64,
    pub keys: u64,
    pub dist: Dist,
    pub seed: u64,
    /// Share of records that re-send an earlier event (same key, same `event_id`).
    pub duplicate_rate: f64,
    /// Target record size; short fields are padded up to it.
    pub event_bytes: usize,
    /// Event time of the first record; each next one is 1 ms later.
    pub start_ms: u64,
}

/// One record to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: String,
    /// The event as JSON.
    pub value: Vec<u8>,
    /// True when this record re-sends an earlier one.
    pub duplicate: bool,
    /// The fields `value` was written from (for other encodings of the same event).
    pub event: Event,
}

/// One event's fields, in the order the JSON writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub event_id: String,
    pub user_id: String,
    /// The JSON field `type`.
    pub kind: &'static str,
    /// `amount` in cents: JSON writes `cents / 100` with two decimals (`12.05`), so the
    /// JSON number is the double nearest `cents / 100`, which `cents as f64 / 100.0` is.
    pub cents: u32,
    pub ts: u64,
    pub country: &'static str,
    pub device: &'static str,
    pub page: String,
    /// Padding up to the target size.
    pub payload: String,
}

impl Record {
    /// Sets the event time to `ts`, in `value` too; false (and nothing changed) when
    /// `value` has no `"ts":` field. The JSON is this generator's own (one `"ts":` field,
    /// written as digits), so the digits are replaced in place rather than the record
    /// parsed and written again: the open-loop generator does this per record, on the CPU
    /// it shares with the broker.
    #[must_use]
    pub fn restamp(&mut self, ts: u64) -> bool {
        let Some(digits) = ts_digits(&self.value) else {
            return false;
        };
        self.value.splice(digits, ts.to_string().into_bytes());
        self.event.ts = ts;
        true
    }
}

/// Where the number of the first `"ts":` field in the JSON `value` is (its digits, after
/// any spaces), without parsing the rest: the generator rewrites it per record and the
/// latency reader reads it per record, both on the broker's CPU.
pub fn ts_digits(value: &[u8]) -> Option<std::ops::Range<usize>> {
    const FIELD: &[u8] = b"\"ts\":";
    let after = value.windows(FIELD.len()).position(|w| w == FIELD)? + FIELD.len();
    let start = after + value[after..].iter().take_while(|b| **b == b' ').count();
    let digits = value[start..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    Some(start..start + digits)
}

impl Event {
    pub fn amount(&self) -> f64 {
        f64::from(self.cents) / 100.0
    }
}

/// Inverse-CDF sampler over ranks `1..=n` with weights `1/k`.
struct ZipfTable {
    cdf: Vec<f64>,
}

impl ZipfTable {
    fn new(n: u64) -> Self {
        let mut acc = 0.0;
        let cdf = (1..=n)
            .map(|k| {
                acc += 1.0 / k as f64;
                acc
            })
            .collect();
        Self { cdf }
    }

    /// A 0-based rank.
    fn sample(&self, rng: &mut StdRng) -> u64 {
        let total = self.cdf.last().copied().unwrap_or(0.0);
        let u = rng.random::<f64>() * total;
        self.cdf.partition_point(|&c| c <= u) as u64
    }
}

pub struct Generator {
    spec: Spec,
    rng: StdRng,
    zipf: Option<ZipfTable>,
    recent: VecDeque<Record>,
    produced: u64,
    /// Unique events so far (names the next `event_id`).
    unique: u64,
}

impl Generator {
    pub fn new(spec: Spec) -> Self {
        let zipf = (spec.dist == Dist::Zipf).then(|| ZipfTable::new(spec.keys.max(1)));
        Self {
            rng: StdRng::seed_from_u64(spec.seed),
            zipf,
            recent: VecDeque::with_capacity(RECENT),
            produced: 0,
            unique: 0,
            spec,
        }
    }

    fn key_index(&mut self) -> u64 {
        match &self.zipf {
            Some(z) => z.sample(&mut self.rng),
            None => self.rng.random_range(0..self.spec.keys.max(1)),
        }
    }

    fn fresh(&mut self) -> Record {
        let key = format!("u{:07}", self.key_index());
        let roll = self.rng.random_range(0..1000u32);
        let mut acc = 0;
        let kind = EVENT_TYPES
            .iter()
            .find(|(_, share)| {
                acc += share;
                roll < acc
            })
            .map_or("view", |(name, _)| name);
        let cents = self.rng.random_range(1..100_000u32);
        let country = COUNTRIES[self.rng.random_range(0..COUNTRIES.len())];
        let device = DEVICES[self.rng.random_range(0..DEVICES.len())];
        let page = self.rng.random_range(0..100_000u32);
        let ts = self.spec.start_ms + self.produced;
        let event_id = format!("{:016x}-{:010}", self.spec.seed, self.unique);
        let head = format!(
            "{{\"event_id\":\"{event_id}\",\"user_id\":\"{key}\",\"type\":\"{kind}\",\"amount\":{}.{:02},\"ts\":{ts},\"country\":\"{country}\",\"device\":\"{device}\",\"page\":\"/p/{page}\",\"payload\":\"",
            cents / 100,
            cents % 100,
        );
        self.unique += 1;
        let pad = self.spec.event_bytes.saturating_sub(head.len() + 2);
        let payload: String = (0..pad)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let mut value = head.into_bytes();
        value.extend_from_slice(payload.as_bytes());
        value.extend_from_slice(b"\"}");
        Record {
            value,
            duplicate: false,
            event: Event {
                event_id,
                user_id: key.clone(),
                kind,
                cents,
                ts,
                country,
                device,
                page: format!("/p/{page}"),
                payload,
            },
            key,
        }
    }
}

impl Iterator for Generator {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        if self.produced >= self.spec.events {
            return None;
        }
        let resend = !self.recent.is_empty() && self.rng.random::<f64>() < self.spec.duplicate_rate;
        let record = if resend {
            let i = self.rng.random_range(0..self.recent.len());
            Record {
                duplicate: true,
                ..self.recent[i].clone()
            }
        } else {
            let r = self.fresh();
            if self.recent.len() == RECENT {
                self.recent.pop_front();
            }
            self.recent.push_back(r.clone());
            r
        };
        self.produced += 1;
        Some(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn spec(dist: Dist, seed: u64) -> Spec {
        Spec {
            events: 50_000,
            keys: 100_000,
            dist,
            seed,
            duplicate_rate: 0.01,
            event_bytes: 250,
            start_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn same_seed_gives_same_records_and_another_seed_does_not() {
        let a: Vec<Record> = Generator::new(spec(Dist::Zipf, 7)).take(2000).collect();
        let b: Vec<Record> = Generator::new(spec(Dist::Zipf, 7)).take(2000).collect();
        let c: Vec<Record> = Generator::new(spec(Dist::Zipf, 8)).take(2000).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn records_are_json_of_the_target_size_keyed_by_user_id() {
        for r in Generator::new(spec(Dist::Uniform, 1)).take(1000) {
            let v: serde_json::Value = serde_json::from_slice(&r.value).expect("valid JSON");
            assert_eq!(v["user_id"].as_str(), Some(r.key.as_str()));
            assert!(v["amount"].is_number() && v["ts"].is_u64() && v["type"].is_string());
            assert!(
                (245..=255).contains(&r.value.len()),
                "size {}",
                r.value.len()
            );
        }
    }

    #[test]
    fn restamp_rewrites_only_the_event_time() {
        // The same width as the generator's own times, and a shorter one.
        for (mut r, ts) in Generator::new(spec(Dist::Uniform, 5))
            .take(100)
            .zip([1_765_000_000_123, 7].into_iter().cycle())
        {
            let before: serde_json::Value = serde_json::from_slice(&r.value).expect("JSON");
            assert!(r.restamp(ts));
            let mut after: serde_json::Value = serde_json::from_slice(&r.value).expect("JSON");
            assert_eq!(after["ts"].as_u64(), Some(ts));
            assert_eq!(r.event.ts, ts);
            after["ts"] = before["ts"].clone();
            assert_eq!(after, before);
        }
        let mut r = Generator::new(spec(Dist::Uniform, 5))
            .next()
            .expect("a record");
        r.value = b"{\"other\":1}".to_vec();
        assert!(!r.restamp(9), "no ts field: nothing to restamp");
        assert_eq!(r.value, b"{\"other\":1}");
    }

    #[test]
    fn ts_digits_finds_the_number_after_spaces() {
        let v = br#"{"id":"x","ts": 1700000000123,"n":1}"#;
        let r = ts_digits(v).expect("a ts field");
        assert_eq!(&v[r], b"1700000000123");
        assert_eq!(ts_digits(br#"{"n":1}"#), None);
    }

    #[test]
    fn about_one_percent_resend_an_earlier_event_id_with_the_same_key() {
        let records: Vec<Record> = Generator::new(spec(Dist::Uniform, 3)).collect();
        let mut seen = HashMap::new();
        let mut repeats = 0;
        for r in &records {
            let v: serde_json::Value = serde_json::from_slice(&r.value).expect("valid JSON");
            let id = v["event_id"].as_str().expect("event_id").to_string();
            match seen.insert(id, r.key.clone()) {
                Some(key) => {
                    assert_eq!(key, r.key, "a duplicate keeps its key");
                    assert!(r.duplicate);
                    repeats += 1;
                }
                None => assert!(!r.duplicate),
            }
        }
        let rate = repeats as f64 / records.len() as f64;
        assert!((0.008..0.012).contains(&rate), "duplicate rate {rate}");
    }

    #[test]
    fn zipf_concentrates_on_few_keys_and_uniform_spreads() {
        let share_of_top = |dist| {
            let mut counts: HashMap<String, u64> = HashMap::new();
            for r in Generator::new(spec(dist, 5)) {
                *counts.entry(r.key).or_default() += 1;
            }
            let mut c: Vec<u64> = counts.into_values().collect();
            c.sort_unstable_by(|a, b| b.cmp(a));
            c.iter().take(100).sum::<u64>() as f64 / 50_000.0
        };
        // Zipf(1.0) over 100k keys: the top 100 ranks hold H(100)/H(100k) ≈ 0.43.
        let zipf = share_of_top(Dist::Zipf);
        assert!((0.38..0.48).contains(&zipf), "zipf top-100 share {zipf}");
        let uniform = share_of_top(Dist::Uniform);
        assert!(uniform < 0.01, "uniform top-100 share {uniform}");
        let distinct: HashSet<String> = Generator::new(spec(Dist::Uniform, 5))
            .map(|r| r.key)
            .collect();
        assert!(
            distinct.len() > 35_000,
            "uniform distinct keys {}",
            distinct.len()
        );
    }
}
