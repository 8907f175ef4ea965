//! The source operator's read positions as union list state, as Flink's Kafka consumer
//! kept its partition offsets: written into the state store at every barrier, so they are
//! snapshotted, restored, inspected, exported and imported like any other operator state.
//!
//! On restore every instance receives every instance's entries (union redistribution) and
//! keeps the partitions it owns; that filter is the start positions' (`job::start`), so
//! rescaling N → M needs nothing of its own. Manifest format 1 kept the offsets only in
//! the manifest: [`restored`] reads them from there for such checkpoints (the migration).

use streamstate_state::{StateError, StateStore};

use crate::checkpoint::{Manifest, PartitionOffset};
use crate::source::Offsets;

/// Next offset to read per input partition (and per partition of the internal topic in
/// repartition mode). Names under `streamstate.` are the runtime's.
pub const INPUT: &str = "streamstate.source_offsets";
/// Next offset to read per control-topic partition.
pub const CONTROL: &str = "streamstate.control_offsets";
/// The first manifest format whose state holds the two lists.
pub const SINCE_FORMAT: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum OffsetStateError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error(
        "checkpoint {checkpoint} (manifest format {format}) has no operator state {list:?}: \
         it cannot say where the input resumes"
    )]
    Missing {
        checkpoint: String,
        format: u32,
        list: &'static str,
    },
    #[error(
        "checkpoint {checkpoint}: operator state {list:?} holds two offsets for \
         {topic}/{partition} ({first} and {second}); an input partition has one owner"
    )]
    Conflict {
        checkpoint: String,
        list: &'static str,
        topic: String,
        partition: i32,
        first: i64,
        second: i64,
    },
}

/// Where a restored state resumes reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Positions {
    pub input: Offsets,
    pub control: Offsets,
}

/// At the barrier, before the state snapshot: this instance's positions (the manifest's
/// entries) replace the lists (after a rescale they held every old instance's entries).
pub fn snapshot(
    store: &StateStore,
    input: &[PartitionOffset],
    control: &[PartitionOffset],
) -> Result<(), StateError> {
    store.union_list_state(INPUT)?.update(input)?;
    store.union_list_state(CONTROL)?.update(control)
}

/// The positions `manifest`'s checkpoint resumes at, once its state is restored into
/// `store` (for a savepoint set, every part's): from the operator state, or for format 1
/// from the manifest. Input partitions must not repeat with different offsets; a control
/// partition read by several old instances resumes at the lowest of their offsets, so no
/// rule update is skipped (re-reading one is harmless: versions gate it).
pub fn restored(store: &StateStore, manifest: &Manifest) -> Result<Positions, OffsetStateError> {
    let checkpoint = manifest.checkpoint.to_string();
    let (input, control) = if manifest.format_version < SINCE_FORMAT {
        (manifest.offsets.clone(), manifest.control_offsets.clone())
    } else {
        let read = |list: &'static str| -> Result<Vec<PartitionOffset>, OffsetStateError> {
            if !store.has_operator_list(list) {
                return Err(OffsetStateError::Missing {
                    checkpoint: checkpoint.clone(),
                    format: manifest.format_version,
                    list,
                });
            }
            Ok(store.union_list_state::<PartitionOffset>(list)?.get()?)
        };
        (read(INPUT)?, read(CONTROL)?)
    };
    Ok(Positions {
        input: merge(&checkpoint, INPUT, input, Duplicates::Refuse)?,
        control: merge(&checkpoint, CONTROL, control, Duplicates::Lowest)?,
    })
}

enum Duplicates {
    Refuse,
    Lowest,
}

fn merge(
    checkpoint: &str,
    list: &'static str,
    entries: Vec<PartitionOffset>,
    duplicates: Duplicates,
) -> Result<Offsets, OffsetStateError> {
    let mut out = Offsets::new();
    for e in entries {
        match out.entry((e.topic.clone(), e.partition)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(e.offset);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => match duplicates {
                Duplicates::Lowest => *o.get_mut() = (*o.get()).min(e.offset),
                Duplicates::Refuse if *o.get() == e.offset => {}
                Duplicates::Refuse => {
                    return Err(OffsetStateError::Conflict {
                        checkpoint: checkpoint.to_string(),
                        list,
                        topic: e.topic,
                        partition: e.partition,
                        first: *o.get(),
                        second: e.offset,
                    });
                }
            },
        }
    }
    Ok(out)
}

/// The offsets a stored list holds, decoded (what `checkpoints inspect` shows): `None`
/// for lists that are not the source's.
pub fn decode_stored(
    name: &str,
    hex_entries: &[String],
) -> Option<Result<Vec<PartitionOffset>, String>> {
    if name != INPUT && name != CONTROL {
        return None;
    }
    Some(
        hex_entries
            .iter()
            .map(|h| {
                let bytes = hex::decode(h).map_err(|e| format!("{name}: {e}"))?;
                postcard::from_bytes(&bytes).map_err(|e| format!("{name}: {e}"))
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{CheckpointRef, FORMAT_VERSION};
    use streamstate_state::{BackendKind, StoreConfig};

    fn offsets(entries: &[(&str, i32, i64)]) -> Offsets {
        entries
            .iter()
            .map(|(t, p, o)| ((t.to_string(), *p), *o))
            .collect()
    }

    fn store(dir: &std::path::Path, name: &str, index: u32, count: u32) -> StateStore {
        let config =
            StoreConfig::new(BackendKind::Hashmap, dir.join(name), 4).for_instance(index, count);
        StateStore::open(config).expect("open store")
    }

    /// [`snapshot`] of two offset maps, as the barrier writes them.
    fn write(store: &StateStore, input: &Offsets, control: &Offsets) {
        let entries = |o: &Offsets| -> Vec<PartitionOffset> {
            o.iter()
                .map(|((topic, partition), offset)| PartitionOffset {
                    topic: topic.clone(),
                    partition: *partition,
                    offset: *offset,
                })
                .collect()
        };
        snapshot(store, &entries(input), &entries(control)).expect("write lists");
    }

    /// Snapshots `before` and restores it into a new store of the same instance.
    fn round_trip(
        dir: &std::path::Path,
        before: &StateStore,
    ) -> (StateStore, streamstate_state::SnapshotResult) {
        let snap = before.snapshot(1, &dir.join("chk")).expect("snapshot");
        let after = store(dir, "after", 0, 1);
        after
            .restore(&[(dir.join("chk"), snap.clone())])
            .expect("restore");
        (after, snap)
    }

    fn manifest(
        format_version: u32,
        input: &[(&str, i32, i64)],
        control: &[(&str, i32, i64)],
        state: streamstate_state::SnapshotResult,
    ) -> Manifest {
        let list = |e: &[(&str, i32, i64)]| {
            e.iter()
                .map(|(t, p, o)| PartitionOffset {
                    topic: t.to_string(),
                    partition: *p,
                    offset: *o,
                })
                .collect()
        };
        Manifest {
            format_version,
            checkpoint: CheckpointRef::new(7, "0badcafe"),
            app_id: "a".into(),
            instance: 0,
            created_at_ms: 0,
            offsets: list(input),
            control_offsets: list(control),
            producer_pool_size: Some(2),
            state,
        }
    }

    #[test]
    fn restores_the_positions_written_at_the_barrier() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (input, control) = (
            offsets(&[("in", 0, 10), ("in", 1, 20)]),
            offsets(&[("rules", 0, 3)]),
        );
        let before = store(dir.path(), "before", 0, 1);
        write(&before, &input, &control);
        let (after, snap) = round_trip(dir.path(), &before);
        // The manifest's copy disagrees on purpose: format 2 restores from the state.
        let m = manifest(FORMAT_VERSION, &[("in", 0, 999)], &[], snap);
        assert_eq!(
            restored(&after, &m).expect("positions"),
            Positions { input, control }
        );
    }

    #[test]
    fn a_format_1_checkpoint_resumes_at_its_manifest_offsets() {
        let dir = tempfile::tempdir().expect("tempdir");
        // What the previous version wrote: state without the lists, offsets in the manifest.
        let before = store(dir.path(), "before", 0, 1);
        let (after, snap) = round_trip(dir.path(), &before);
        let m = manifest(1, &[("in", 0, 10), ("in", 1, 20)], &[("rules", 0, 3)], snap);
        assert_eq!(
            restored(&after, &m).expect("positions"),
            Positions {
                input: offsets(&[("in", 0, 10), ("in", 1, 20)]),
                control: offsets(&[("rules", 0, 3)]),
            }
        );
        // The same state under a format-2 manifest lacks the lists: named, not guessed.
        let m2 = Manifest {
            format_version: FORMAT_VERSION,
            ..m
        };
        let err = restored(&after, &m2).expect_err("missing lists");
        assert!(err.to_string().contains(INPUT), "{err}");
    }

    /// `tests/fixtures/checkpoint-format-1`: a checkpoint the previous version wrote.
    #[test]
    fn a_checkpoint_written_in_format_1_restores_and_its_successor_is_format_2() {
        use crate::checkpoint::{CheckpointStorage, FsStorage};
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/checkpoint-format-1");
        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("storage");
        copy_tree(&base, &copy);
        let storage = FsStorage::open(&copy, "tools-1105-1796365791187-0", 0).expect("storage");
        let c = CheckpointRef::parse("chk-3-9c25c7f5").expect("name");
        let m = storage
            .read_manifest(&c)
            .expect("a format-1 manifest parses");
        assert_eq!(m.format_version, 1);
        storage
            .fetch(&m, &dir.path().join("fetched"))
            .expect("fetch");
        let config =
            StoreConfig::new(BackendKind::Rocksdb, dir.path().join("work"), 128).for_instance(0, 1);
        let store = StateStore::open(config).expect("open");
        store
            .restore(&[(dir.path().join("fetched"), m.state.clone())])
            .expect("restore");
        assert!(
            store.approximate_entries().expect("entries") > 0,
            "the counts came back"
        );
        let topic = "tools-1105-1796365791187-0-in";
        let p = restored(&store, &m).expect("positions");
        assert_eq!(
            p.input,
            offsets(&[
                (topic, 0, 704),
                (topic, 1, 803),
                (topic, 2, 757),
                (topic, 3, 736)
            ])
        );
        assert_eq!(
            p.control,
            offsets(&[("tools-1105-1796365791187-0-rules", 0, 0)])
        );
        // The next barrier writes the lists: that checkpoint restores from its state.
        write(&store, &p.input, &p.control);
        let next = store
            .snapshot(4, &dir.path().join("chk-4"))
            .expect("snapshot");
        let config = StoreConfig::new(BackendKind::Rocksdb, dir.path().join("work-2"), 128)
            .for_instance(0, 1);
        let again = StateStore::open(config).expect("open");
        again
            .restore(&[(dir.path().join("chk-4"), next.clone())])
            .expect("restore");
        let m4 = Manifest {
            format_version: FORMAT_VERSION,
            offsets: Vec::new(),
            control_offsets: Vec::new(),
            state: next,
            ..m
        };
        assert_eq!(restored(&again, &m4).expect("positions"), p);
    }

    fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).expect("mkdir");
        for e in std::fs::read_dir(from).expect("read_dir") {
            let e = e.expect("entry");
            let target = to.join(e.file_name());
            if e.file_type().expect("type").is_dir() {
                copy_tree(&e.path(), &target);
            } else {
                std::fs::copy(e.path(), &target).expect("copy");
            }
        }
    }

    #[test]
    fn a_rescaled_instance_receives_every_old_instances_offsets() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut parts = Vec::new();
        for (i, (input, control)) in [
            (
                offsets(&[("in", 0, 10), ("in", 1, 11)]),
                offsets(&[("rules", 0, 5)]),
            ),
            (
                offsets(&[("in", 2, 12), ("in", 3, 13)]),
                offsets(&[("rules", 0, 4)]),
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let old = store(dir.path(), &format!("old-{i}"), i as u32, 2);
            write(&old, &input, &control);
            let target = dir.path().join(format!("part-{i}"));
            parts.push((target.clone(), old.snapshot(1, &target).expect("snapshot")));
        }
        // 2 → 3: each new instance gets the union; the start keeps what it owns.
        for new in 0..3 {
            let s = store(dir.path(), &format!("new-{new}"), new, 3);
            s.restore(&parts).expect("restore");
            let m = manifest(FORMAT_VERSION, &[], &[], parts[0].1.clone());
            let p = restored(&s, &m).expect("positions");
            assert_eq!(
                p.input,
                offsets(&[("in", 0, 10), ("in", 1, 11), ("in", 2, 12), ("in", 3, 13)])
            );
            assert_eq!(
                p.control,
                offsets(&[("rules", 0, 4)]),
                "the lowest control offset"
            );
        }
    }

    #[test]
    fn an_input_partition_with_two_offsets_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), "one", 0, 1);
        s.union_list_state::<PartitionOffset>(INPUT)
            .expect("list")
            .update(&[
                PartitionOffset {
                    topic: "in".into(),
                    partition: 0,
                    offset: 1,
                },
                PartitionOffset {
                    topic: "in".into(),
                    partition: 0,
                    offset: 2,
                },
            ])
            .expect("update");
        s.union_list_state::<PartitionOffset>(CONTROL)
            .expect("list");
        let snap = s.snapshot(1, &dir.path().join("chk")).expect("snapshot");
        let err = restored(&s, &manifest(FORMAT_VERSION, &[], &[], snap)).expect_err("conflict");
        assert!(
            matches!(
                err,
                OffsetStateError::Conflict {
                    first: 1,
                    second: 2,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn inspect_decodes_only_the_source_lists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = store(dir.path(), "one", 0, 1);
        write(&s, &offsets(&[("in", 3, 42)]), &Offsets::new());
        let snap = s.snapshot(1, &dir.path().join("chk")).expect("snapshot");
        let raw = streamstate_state::offline::RawSnapshot::read(
            &dir.path().join("chk"),
            &snap,
            &dir.path().join("scratch"),
        )
        .expect("read");
        let hex = &raw.part.operator_lists[INPUT].entries;
        assert_eq!(
            decode_stored(INPUT, hex)
                .expect("source list")
                .expect("decodes"),
            vec![PartitionOffset {
                topic: "in".into(),
                partition: 3,
                offset: 42
            }]
        );
        assert!(decode_stored("buffer", hex).is_none());
    }
}
