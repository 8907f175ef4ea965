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

/// How keys are numbered into `max_parallelism` key groups: fixed with it at a job's
/// first start and recorded in every snapshot.
///
/// Aligned to `partitions` input partitions (a divisor of `max_parallelism`), the `k =
/// max_parallelism / partitions` groups of partition `p` are `p*k ..= p*k + k - 1`: a key
/// is in group `(h % partitions) * k + (h % max_parallelism) / partitions`, where `h` is
/// Kafka's positive murmur2, so its group lies in the block of the partition Kafka's
/// default partitioner sends it to. An instance that owns a contiguous run of partitions
/// then owns a contiguous range of key groups, and rescaling moves whole groups, not
/// partitions: 12 partitions and 120 key groups run on 1, 4, 12 or 3 instances.
///
/// With one partition, or one key group per partition, this is [`key_group_for`] (`h %
/// max_parallelism`, Flink's numbering over Kafka's hash), the numbering of every
/// snapshot written before alignment existed. Both are stored as `partitions = 1`, so
/// two values number keys alike exactly when they are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyGroups {
    max_parallelism: u32,
    partitions: u32,
}

impl KeyGroups {
    /// `partitions` must divide `max_parallelism` (at most [`MAX_MAX_PARALLELISM`]).
    pub fn aligned(max_parallelism: u32, partitions: u32) -> crate::Result<Self> {
        if max_parallelism == 0 || max_parallelism > MAX_MAX_PARALLELISM {
            return Err(crate::StateError::Invalid(format!(
                "max_parallelism {max_parallelism} must be 1..={MAX_MAX_PARALLELISM}"
            )));
        }
        if partitions == 0 || !max_parallelism.is_multiple_of(partitions) {
            return Err(crate::StateError::Invalid(format!(
                "max_parallelism {max_parallelism} is not a multiple of the {partitions} input partitions \
                 its key groups would be aligned to"
            )));
        }
        Ok(Self {
            max_parallelism,
            partitions: if partitions == max_parallelism {
                1
            } else {
                partitions
            },
        })
    }

    /// Kafka's (and Flink's) numbering: `h % max_parallelism`.
    pub fn modulo(max_parallelism: u32) -> Self {
        Self {
            max_parallelism,
            partitions: 1,
        }
    }

    /// Aligned to `partitions` when it divides `max_parallelism`, else [`Self::modulo`]:
    /// the numbering a job starts with when its input has that many partitions per topic.
    pub fn for_input(max_parallelism: u32, partitions: Option<u32>) -> Self {
        partitions
            .and_then(|p| Self::aligned(max_parallelism, p).ok())
            .unwrap_or(Self::modulo(max_parallelism))
    }

    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    /// The partition count the groups are aligned to; `None` for [`Self::modulo`]
    /// (which is also alignment to `max_parallelism` partitions, one group each).
    pub fn aligned_partitions(&self) -> Option<u32> {
        (self.partitions > 1).then_some(self.partitions)
    }

    /// Whether an input topic of `partitions` partitions feeds these key groups
    /// partition by partition (what several instances need).
    pub fn fits_partitions(&self, partitions: u32) -> bool {
        match self.aligned_partitions() {
            Some(p) => p == partitions,
            None => partitions == self.max_parallelism,
        }
    }

    /// Key groups per partition of an input that [`Self::fits_partitions`].
    pub fn per_partition(&self) -> u32 {
        match self.aligned_partitions() {
            Some(p) => self.max_parallelism / p,
            None => 1,
        }
    }

    /// The first key group of `partition`'s block, for an input that
    /// [`Self::fits_partitions`].
    pub fn first_of_partition(&self, partition: u32) -> u32 {
        partition * self.per_partition()
    }

    /// The key group of `key`.
    #[inline]
    pub fn of(&self, key: &[u8]) -> u32 {
        let h = (murmur2(key) as u32) & 0x7fff_ffff;
        if self.partitions == 1 {
            h % self.max_parallelism
        } else {
            (h % self.partitions) * (self.max_parallelism / self.partitions)
                + (h % self.max_parallelism) / self.partitions
        }
    }

    /// The input partition whose keys group `key_group` holds, for an input that
    /// [`Self::fits_partitions`].
    pub fn partition_of(&self, key_group: u32) -> u32 {
        key_group / self.per_partition()
    }

    /// Whether `parallelism` instances each own at least one key group (and, aligned, one
    /// partition): what [`Self::range_for_instance`] requires.
    pub fn fits_instances(&self, parallelism: u32) -> bool {
        parallelism <= self.aligned_partitions().unwrap_or(self.max_parallelism)
    }

    /// Instance `index` of `parallelism` (see [`Self::fits_instances`]): Flink's contiguous split, of whole partitions'
    /// blocks when aligned (so `parallelism` may not exceed `partitions` there), of key
    /// groups otherwise.
    pub fn range_for_instance(&self, parallelism: u32, index: u32) -> KeyGroupRange {
        match self.aligned_partitions() {
            None => KeyGroupRange::for_instance(self.max_parallelism, parallelism, index),
            Some(p) => {
                let k = self.per_partition();
                let parts = KeyGroupRange::for_instance(p, parallelism, index);
                KeyGroupRange::new(parts.start * k, (parts.end + 1) * k - 1)
            }
        }
    }
}

impl std::fmt::Display for KeyGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.aligned_partitions() {
            None => write!(f, "{} key groups numbered modulo", self.max_parallelism),
            Some(p) => write!(
                f,
                "{} key groups aligned to {p} partitions",
                self.max_parallelism
            ),
        }
    }
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

    fn keys() -> impl Iterator<Item = Vec<u8>> {
        (0..20_000u32).map(|i| format!("user-{i}").into_bytes())
    }

    #[test]
    fn unaligned_and_one_group_per_partition_numberings_are_kafkas_modulo() {
        for mp in [1u32, 4, 12, 128] {
            for kgs in [
                KeyGroups::modulo(mp),
                KeyGroups::aligned(mp, mp).unwrap(),
                KeyGroups::aligned(mp, 1).unwrap(),
            ] {
                for key in keys() {
                    assert_eq!(kgs.of(&key), key_group_for(&key, mp));
                }
            }
            assert_eq!(KeyGroups::modulo(mp), KeyGroups::aligned(mp, mp).unwrap());
        }
    }

    #[test]
    fn aligned_groups_of_a_key_lie_in_the_block_of_its_kafka_partition() {
        let kgs = KeyGroups::aligned(120, 12).unwrap();
        let mut used = std::collections::BTreeSet::new();
        for key in keys() {
            let kg = kgs.of(&key);
            assert!(kg < 120);
            let partition = key_group_for(&key, 12);
            assert_eq!(kgs.partition_of(kg), partition, "{kg}");
            assert!((partition * 10..partition * 10 + 10).contains(&kg));
            used.insert(kg);
        }
        assert_eq!(used.len(), 120, "20,000 keys reach every group");
        assert_ne!(kgs, KeyGroups::modulo(120));
        assert_ne!(kgs, KeyGroups::aligned(120, 24).unwrap());
        assert!(kgs.fits_partitions(12) && !kgs.fits_partitions(120));
        assert!(KeyGroups::modulo(120).fits_partitions(120));
    }

    #[test]
    fn aligned_instance_ranges_are_whole_partition_blocks_tiling_the_groups() {
        let kgs = KeyGroups::aligned(120, 12).unwrap();
        for n in 1..=12 {
            let mut next = 0;
            for i in 0..n {
                let r = kgs.range_for_instance(n, i);
                assert_eq!(r.start, next, "{n} instances");
                assert_eq!(r.start % 10, 0);
                assert_eq!((r.end + 1) % 10, 0);
                next = r.end + 1;
            }
            assert_eq!(next, 120);
        }
        // One key group per partition: Flink's ranges, as before the alignment existed.
        let flat = KeyGroups::aligned(12, 12).unwrap();
        for n in 1..=12 {
            for i in 0..n {
                assert_eq!(
                    flat.range_for_instance(n, i),
                    KeyGroupRange::for_instance(12, n, i)
                );
            }
        }
    }

    #[test]
    fn alignment_must_divide_the_key_groups() {
        assert!(KeyGroups::aligned(120, 7).is_err());
        assert!(KeyGroups::aligned(0, 1).is_err());
        assert!(KeyGroups::aligned(MAX_MAX_PARALLELISM * 2, 2).is_err());
        assert!(KeyGroups::aligned(120, 0).is_err());
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
