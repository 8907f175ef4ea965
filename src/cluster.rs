//! Static ownership across instances: which input partitions and key groups instance
//! `i` of `N` owns.
//!
//! There is no cluster manager: Kafka is the log, Kubernetes starts `N` instances with
//! ordinals `0..N`, and ownership is a pure function of `(partitions, key groups, N,
//! i)`. The key groups are aligned to the input partitions ([`KeyGroups`]): each of the
//! `P` partitions holds a contiguous block of `max_parallelism / P` groups, and the
//! group of a key lies in the block of the partition Kafka's default partitioner sends
//! it to. Instance `i` owns Flink's contiguous share of the partitions and with them
//! their blocks of key groups, so a keyed record never needs another instance, and a
//! job can rescale to any instance count up to `P` while state moves by key group.
//! Ownership changes only at a restart (rescaling from a savepoint).
//!
//! In repartition mode (`job.repartition`) the input is not keyed by the state key: the
//! input partitions are only split evenly among the instances (hop 1 forwards every event
//! to the internal topic), and the internal topic's partitions, one per key group, are
//! owned exactly like keyed input partitions (hop 2).

use streamstate_state::{KeyGroupRange, KeyGroups};

use crate::source::Partition;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    #[error("job.instance ({instance}) must be below job.instances ({instances})")]
    InstanceOutOfRange { instance: u32, instances: u32 },
    #[error(
        "job.instances ({instances}) exceeds state.max_parallelism ({max_parallelism}): an instance would own no key group"
    )]
    TooManyInstances {
        instances: u32,
        max_parallelism: u32,
    },
    #[error(
        "job.instances ({instances}) exceeds the {partitions} partitions of input topic `{topic}`: an instance \
         would own no partition. Add partitions to the input (with state.max_parallelism a multiple of the new \
         count) or run at most {partitions} instances"
    )]
    MorePartitionsNeeded {
        topic: String,
        partitions: u32,
        instances: u32,
    },
    #[error(
        "with job.instances > 1, every input topic must feed the key groups partition by partition: the state's \
         {key_groups} need {needed} partitions per topic, and topic `{topic}` has {partitions}. At the first start, \
         set state.max_parallelism to a multiple of the partition count; for existing state, rekey a savepoint \
         (streamstate checkpoints surgery <savepoint> --savepoint-dir <dir> rekey --max-parallelism <multiple of \
         {partitions}> --aligned-partitions {partitions}) and start from it, repartition the input (job.repartition), \
         or run one instance"
    )]
    PartitionsMismatch {
        topic: String,
        partitions: u32,
        key_groups: KeyGroups,
        needed: u32,
    },
}

/// What one instance owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub key_groups: KeyGroupRange,
    /// Input partitions to consume, in order.
    pub partitions: Vec<Partition>,
}

/// The key groups a job starts with: aligned to its input's partition count when every
/// topic has the same count and it divides `max_parallelism` (so it can later run on
/// several instances), else numbered modulo, which only one instance can use with fewer
/// partitions than key groups. In repartition mode the internal topic has one partition
/// per key group: modulo.
pub fn key_groups_for_input(
    all: &[Partition],
    max_parallelism: u32,
    repartition: bool,
) -> KeyGroups {
    let counts = partition_counts(all);
    let mut each = counts.values().copied();
    let shared = match (each.next(), repartition) {
        (Some(first), false) if each.all(|n| n == first) => Some(first),
        _ => None,
    };
    KeyGroups::for_input(max_parallelism, shared)
}

fn partition_counts(all: &[Partition]) -> std::collections::BTreeMap<&str, u32> {
    let mut counts = std::collections::BTreeMap::<&str, u32>::new();
    for (topic, _) in all {
        *counts.entry(topic).or_default() += 1;
    }
    counts
}

/// Instance `instance` of `instances` over `all` input partitions (every topic's), with
/// the state's `key_groups`.
pub fn ownership(
    all: &[Partition],
    key_groups: KeyGroups,
    instances: u32,
    instance: u32,
) -> Result<Ownership, ClusterError> {
    if instance >= instances {
        return Err(ClusterError::InstanceOutOfRange {
            instance,
            instances,
        });
    }
    let max_parallelism = key_groups.max_parallelism();
    if instances > max_parallelism {
        return Err(ClusterError::TooManyInstances {
            instances,
            max_parallelism,
        });
    }
    if instances == 1 {
        // One instance owns every key group, whatever the partition counts.
        return Ok(Ownership {
            key_groups: KeyGroupRange::all(max_parallelism),
            partitions: all.to_vec(),
        });
    }
    for (topic, partitions) in partition_counts(all) {
        if !key_groups.fits_partitions(partitions) {
            return Err(ClusterError::PartitionsMismatch {
                topic: topic.to_string(),
                partitions,
                key_groups,
                needed: key_groups.aligned_partitions().unwrap_or(max_parallelism),
            });
        }
        if !key_groups.fits_instances(instances) {
            return Err(ClusterError::MorePartitionsNeeded {
                topic: topic.to_string(),
                partitions,
                instances,
            });
        }
    }
    let range = key_groups.range_for_instance(instances, instance);
    let partitions = all
        .iter()
        .filter(|(_, p)| range.contains(key_groups.first_of_partition(*p as u32)))
        .cloned()
        .collect();
    Ok(Ownership {
        key_groups: range,
        partitions,
    })
}

/// Repartition mode: instance `instance` of `instances` reads a contiguous share of `all`
/// input partitions (any count; some instances may get none) for hop 1, and the partitions
/// of `internal` (the repartition topic, `max_parallelism` partitions, partition = key
/// group) in its key-group range for hop 2. `partitions` lists input then internal ones.
pub fn repartition_ownership(
    all: &[Partition],
    internal: &str,
    max_parallelism: u32,
    instances: u32,
    instance: u32,
) -> Result<Ownership, ClusterError> {
    if instance >= instances {
        return Err(ClusterError::InstanceOutOfRange {
            instance,
            instances,
        });
    }
    if instances > max_parallelism {
        return Err(ClusterError::TooManyInstances {
            instances,
            max_parallelism,
        });
    }
    let key_groups = KeyGroupRange::for_instance(max_parallelism, instances, instance);
    let (n, i) = (instances as usize, instance as usize);
    let share = &all[all.len() * i / n..all.len() * (i + 1) / n];
    let partitions = share
        .iter()
        .cloned()
        .chain((key_groups.start..=key_groups.end).map(|kg| (internal.to_string(), kg as i32)))
        .collect();
    Ok(Ownership {
        key_groups,
        partitions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(topic: &str, n: i32) -> Vec<Partition> {
        (0..n).map(|p| (topic.to_string(), p)).collect()
    }

    #[test]
    fn instances_split_partitions_and_key_groups_alike_and_cover_everything_once() {
        let all: Vec<Partition> = [parts("a", 8), parts("b", 8)].concat();
        for n in 1..=8 {
            let mut seen = Vec::new();
            for i in 0..n {
                let o = ownership(&all, KeyGroups::modulo(8), n, i).expect("ownership");
                for (_, p) in &o.partitions {
                    assert!(
                        o.key_groups.contains(*p as u32),
                        "partition {p} outside {:?}",
                        o.key_groups
                    );
                }
                seen.extend(o.partitions);
            }
            seen.sort();
            assert_eq!(
                seen,
                {
                    let mut a = all.clone();
                    a.sort();
                    a
                },
                "{n} instances own every partition exactly once"
            );
        }
    }

    #[test]
    fn repartition_splits_any_input_count_and_owns_internal_partitions_by_key_group() {
        let all: Vec<Partition> = [parts("a", 3), parts("b", 2)].concat();
        for n in 1..=6 {
            let (mut input, mut internal) = (Vec::new(), Vec::new());
            for i in 0..n {
                let o = repartition_ownership(&all, "r", 6, n, i).expect("ownership");
                for (t, p) in o.partitions {
                    if t == "r" {
                        assert!(
                            o.key_groups.contains(p as u32),
                            "{p} outside {:?}",
                            o.key_groups
                        );
                        internal.push(p);
                    } else {
                        input.push((t, p));
                    }
                }
            }
            input.sort();
            internal.sort();
            assert_eq!(input, all, "{n} instances read every input partition once");
            assert_eq!(
                internal,
                (0..6).collect::<Vec<_>>(),
                "{n} instances own every key group once"
            );
        }
        assert!(matches!(
            repartition_ownership(&all, "r", 2, 3, 0),
            Err(ClusterError::TooManyInstances { .. })
        ));
    }

    #[test]
    fn one_instance_owns_all_whatever_the_counts() {
        let all = [parts("a", 3), parts("b", 5)].concat();
        let o = ownership(&all, KeyGroups::modulo(128), 1, 0).expect("ownership");
        assert_eq!(o.partitions, all);
        assert_eq!(o.key_groups, KeyGroupRange::new(0, 127));
    }

    #[test]
    fn twelve_partitions_and_120_key_groups_split_by_whole_partitions_on_any_count() {
        let all: Vec<Partition> = [parts("a", 12), parts("b", 12)].concat();
        let key_groups = key_groups_for_input(&all, 120, false);
        assert_eq!(key_groups.aligned_partitions(), Some(12));
        for n in [1, 2, 3, 4, 5, 7, 12] {
            let mut seen = Vec::new();
            for i in 0..n {
                let o = ownership(&all, key_groups, n, i).expect("ownership");
                for (_, p) in &o.partitions {
                    let block = *p as u32 * 10..*p as u32 * 10 + 10;
                    assert!(
                        block.clone().all(|kg| o.key_groups.contains(kg)),
                        "{n} instances: partition {p}'s groups {block:?} outside {}",
                        o.key_groups
                    );
                }
                seen.extend(o.partitions);
            }
            seen.sort();
            assert_eq!(seen, all, "{n} instances own every partition exactly once");
        }
        let four = ownership(&all, key_groups, 4, 1).expect("ownership");
        assert_eq!(four.key_groups, KeyGroupRange::new(30, 59));
        assert_eq!(
            four.partitions,
            [("a", 3), ("a", 4), ("a", 5), ("b", 3), ("b", 4), ("b", 5)]
                .map(|(t, p)| (t.to_string(), p))
        );
    }

    #[test]
    fn the_starting_numbering_aligns_only_to_one_shared_dividing_count() {
        let aligned =
            |all: &[Partition], mp, rp| key_groups_for_input(all, mp, rp).aligned_partitions();
        assert_eq!(aligned(&parts("a", 12), 120, false), Some(12));
        assert_eq!(
            aligned(&parts("a", 12), 12, false),
            None,
            "one group per partition is modulo"
        );
        assert_eq!(
            aligned(&parts("a", 7), 120, false),
            None,
            "7 does not divide 120"
        );
        assert_eq!(
            aligned(&[parts("a", 12), parts("b", 6)].concat(), 120, false),
            None
        );
        assert_eq!(
            aligned(&parts("a", 12), 120, true),
            None,
            "repartition: modulo"
        );
    }

    #[test]
    fn refuses_what_cannot_be_owned_consistently_naming_the_keys() {
        let all = parts("a", 4);
        assert_eq!(
            ownership(&all, KeyGroups::modulo(4), 2, 2),
            Err(ClusterError::InstanceOutOfRange {
                instance: 2,
                instances: 2
            })
        );
        assert_eq!(
            ownership(&all, KeyGroups::modulo(4), 5, 0),
            Err(ClusterError::TooManyInstances {
                instances: 5,
                max_parallelism: 4
            })
        );
        // State numbered modulo 8 (an older job's), 4 partitions: not partition by partition.
        let err = ownership(&all, KeyGroups::modulo(8), 2, 0).expect_err("refused");
        assert!(matches!(
            err,
            ClusterError::PartitionsMismatch {
                partitions: 4,
                needed: 8,
                ..
            }
        ));
        let text = err.to_string();
        assert!(
            text.contains("topic `a` has 4") && text.contains("state.max_parallelism"),
            "{text}"
        );
        // Aligned to 12 partitions, but the topic now has 24.
        let twelve = KeyGroups::aligned(120, 12).expect("aligned");
        let err = ownership(&parts("a", 24), twelve, 2, 0).expect_err("refused");
        assert!(
            err.to_string().contains("need 12 partitions per topic"),
            "{err}"
        );
        // More instances than partitions.
        let err = ownership(&parts("a", 12), twelve, 13, 0).expect_err("refused");
        assert_eq!(
            err,
            ClusterError::MorePartitionsNeeded {
                topic: "a".into(),
                partitions: 12,
                instances: 13
            }
        );
        assert!(err.to_string().contains("job.instances (13)"), "{err}");
    }
}
