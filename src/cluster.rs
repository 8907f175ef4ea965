//! Static ownership across instances: which input partitions and key groups instance
//! `i` of `N` owns.
//!
//! There is no cluster manager: Kafka is the log, Kubernetes starts `N` instances with
//! ordinals `0..N`, and ownership is a pure function of `(partitions, max_parallelism,
//! N, i)`. Instance `i` owns the contiguous key-group range Flink would give it and,
//! because the key-group function is Kafka's default partitioner, exactly the input
//! partitions with the same numbers: a keyed record never needs another instance.
//! Ownership changes only at a restart (rescaling from a savepoint).
//!
//! In repartition mode (`job.repartition`) the input is not keyed by the state key: the
//! input partitions are only split evenly among the instances (hop 1 forwards every event
//! to the internal topic), and the internal topic's partitions, one per key group, are
//! owned exactly like keyed input partitions (hop 2).

use streamstate_state::KeyGroupRange;

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
        "with job.instances > 1, every input topic needs state.max_parallelism ({max_parallelism}) partitions so that \
         key group = partition; topic `{topic}` has {partitions}. Repartition the input (job.repartition) or match the counts"
    )]
    PartitionsMismatch {
        topic: String,
        partitions: u32,
        max_parallelism: u32,
    },
}

/// What one instance owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub key_groups: KeyGroupRange,
    /// Input partitions to consume, in order.
    pub partitions: Vec<Partition>,
}

/// Instance `instance` of `instances` over `all` input partitions (every topic's).
pub fn ownership(
    all: &[Partition],
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
    if instances == 1 {
        // One instance owns every key group, whatever the partition counts.
        return Ok(Ownership {
            key_groups: KeyGroupRange::new(0, max_parallelism - 1),
            partitions: all.to_vec(),
        });
    }
    let mut counts = std::collections::BTreeMap::<&str, u32>::new();
    for (topic, _) in all {
        *counts.entry(topic).or_default() += 1;
    }
    if let Some((topic, partitions)) = counts.iter().find(|(_, n)| **n != max_parallelism) {
        return Err(ClusterError::PartitionsMismatch {
            topic: topic.to_string(),
            partitions: *partitions,
            max_parallelism,
        });
    }
    let key_groups = KeyGroupRange::for_instance(max_parallelism, instances, instance);
    let partitions = all
        .iter()
        .filter(|(_, p)| key_groups.contains(*p as u32))
        .cloned()
        .collect();
    Ok(Ownership {
        key_groups,
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
                let o = ownership(&all, 8, n, i).expect("ownership");
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
        let o = ownership(&all, 128, 1, 0).expect("ownership");
        assert_eq!(o.partitions, all);
        assert_eq!(o.key_groups, KeyGroupRange::new(0, 127));
    }

    #[test]
    fn refuses_what_cannot_be_owned_consistently() {
        let all = parts("a", 4);
        assert_eq!(
            ownership(&all, 4, 2, 2),
            Err(ClusterError::InstanceOutOfRange {
                instance: 2,
                instances: 2
            })
        );
        assert_eq!(
            ownership(&all, 4, 5, 0),
            Err(ClusterError::TooManyInstances {
                instances: 5,
                max_parallelism: 4
            })
        );
        assert!(matches!(
            ownership(&all, 8, 2, 0),
            Err(ClusterError::PartitionsMismatch { partitions: 4, .. })
        ));
    }
}
