//! Key groups: the unit of rescaling. The key-group function is Kafka's default
//! partitioner so that, with `max_parallelism` = number of input partitions, a
//! keyed input partition and a key group are the same thing and state follows
//! Kafka's partitioning without a shuffle.

use serde::{Deserialize, Serialize};

/// Largest `max_parallelism` accepted: key groups are stored as a big-endian
/// u16 prefix, and Flink caps at the same number.
pub const MAX_MAX_PARALLELISM: u32 = 1 << 15;

/// Kafka's `Utils.murmur2` (seed 0x9747b28c), bit for bit.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = 0x9747_b28c ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= (rest[2] as u32) << 16;
    }
    if rest.len() >= 2 {
        h ^= (rest[1] as u32) << 8;
    }
    if !rest.is_empty() {
        h ^= rest[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The key group of `key`: Kafka's `toPositive(murmur2(key)) % n`.
#[inline]
pub fn key_group_for(key: &[u8], max_parallelism: u32) -> u32 {
    debug_assert!(max_parallelism > 0);
    ((murmur2(key) as u32) & 0x7fff_ffff) % max_parallelism
}

/// A contiguous, inclusive range of key groups owned by one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyGroupRange {
    pub start: u32,
    pub end: u32,
}

impl KeyGroupRange {
    pub fn new(start: u32, end: u32) -> Self {
        assert!(start <= end, "key group range {start}..={end} is empty");
        Self { start, end }
    }

    /// Every key group: what a single instance owns.
    pub fn all(max_parallelism: u32) -> Self {
        Self::new(0, max_parallelism - 1)
    }

    /// Flink's `computeKeyGroupRangeForOperatorIndex`: instance `index` of
    /// `parallelism` gets a contiguous slice, sizes differing by at most one.
    pub fn for_instance(max_parallelism: u32, parallelism: u32, index: u32) -> Self {
        assert!(parallelism > 0 && parallelism <= max_parallelism && index < parallelism);
        let mp = max_parallelism as u64;
        let p = parallelism as u64;
        let i = index as u64;
        let start = (i * mp).div_ceil(p);
        let end = ((i + 1) * mp).div_ceil(p) - 1;
        Self::new(start as u32, end as u32)
    }

    #[inline]
    pub fn contains(&self, key_group: u32) -> bool {
        self.start <= key_group && key_group <= self.end
    }

    pub fn len(&self) -> u32 {
        self.end - self.start + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn intersects(&self, other: &KeyGroupRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl std::fmt::Display for KeyGroupRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..={}", self.start, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Vectors from Kafka's own UtilsTest.testMurmur2.
    #[test]
    fn murmur2_matches_kafka_utils_test_vectors() {
        let cases: &[(&[u8], i32)] = &[
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (data, expected) in cases {
            assert_eq!(murmur2(data), *expected, "{:?}", std::str::from_utf8(data));
        }
    }

    #[test]
    fn key_group_is_kafka_default_partition() {
        // toPositive(-790332482) = 1357151166; 1357151166 % 128 = 62.
        assert_eq!(key_group_for(b"foobar", 128), 62);
        // positive hash: 479470107 % 10 = 7
        assert_eq!(key_group_for(b"abc", 10), 7);
        for n in [1u32, 3, 12, 128, 32768] {
            assert!(key_group_for(b"anything", n) < n);
        }
    }

    #[test]
    fn instance_ranges_tile_the_key_groups_without_gaps() {
        for mp in [1u32, 7, 128, 1000] {
            for p in 1..=mp.min(17) {
                let mut next = 0;
                for i in 0..p {
                    let r = KeyGroupRange::for_instance(mp, p, i);
                    assert_eq!(r.start, next);
                    next = r.end + 1;
                }
                assert_eq!(next, mp);
            }
        }
        assert_eq!(
            KeyGroupRange::for_instance(128, 3, 0),
            KeyGroupRange::new(0, 42)
        );
        assert_eq!(
            KeyGroupRange::for_instance(128, 3, 2),
            KeyGroupRange::new(86, 127)
        );
    }
}
