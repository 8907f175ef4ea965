//! Upgrading across the manifest format on the real broker: a checkpoint as the previous
//! version wrote it (format 1: the source offsets only in the manifest, none in the
//! state's operator lists) restores at its manifest's offsets, exactly once, and the
//! checkpoints after it keep the offsets as the source's union list state (format 2).
//! `src/source/offset_state.rs` restores a checkpoint the previous binary wrote
//! (`tests/fixtures/checkpoint-format-1`); this test takes the same path through a start.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};

const LISTS: [&str; 2] = ["streamstate.source_offsets", "streamstate.control_offsets"];

#[test]
fn a_format_1_checkpoint_resumes_at_its_manifest_offsets_exactly_once() {
    let job = Job::new("upgrade", 4);
    job.write_config("300ms", "");
    let evs = events(12_000, 5, 77);
    produce_all(&job.input, &evs[..6_000], None);
    let mut first = job.spawn();
    wait_all_committed(&job, &mut first);
    // SIGTERM commits a final checkpoint: the newest one is the one the group names.
    let status = first.terminate(Duration::from_secs(60));
    assert!(status.success(), "stop: {status}; log:\n{}", first.log());
    let root = job.checkpoint_dir().join(&job.app_id).join("instance-0");
    let manifest = newest_checkpoint(&root);
    let chk = manifest.parent().expect("checkpoint dir");
    let written = read_json(&chk.join("state-meta.json"));
    for list in LISTS {
        assert_eq!(
            written["operator_lists"][list]["mode"], "union",
            "a new checkpoint keeps {list} as union list state"
        );
    }
    assert_eq!(
        written["operator_lists"][LISTS[0]]["entries"]
            .as_array()
            .map(Vec::len),
        Some(4),
        "one entry per input partition"
    );
    downgrade_to_format_1(chk);

    produce_all(&job.input, &evs[6_000..], None);
    let mut second = job.spawn();
    wait_all_committed(&job, &mut second);
    let log = second.log();
    assert!(
        log.contains("restored state from checkpoint")
            && log.contains("predates offsets in operator state"),
        "log:\n{log}"
    );
    let status = second.terminate(Duration::from_secs(60));
    assert!(status.success(), "stop: {status}; log:\n{}", second.log());
    let after = newest_checkpoint(&root);
    assert_ne!(after, manifest, "the upgraded run checkpointed");
    assert_eq!(read_json(&after)["format_version"], 2);
    let meta = read_json(&after.parent().expect("dir").join("state-meta.json"));
    assert_eq!(
        meta["operator_lists"][LISTS[0]]["entries"]
            .as_array()
            .map(Vec::len),
        Some(4),
        "the upgraded run writes the offsets into operator state"
    );

    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(
        outputs + dead,
        12_000,
        "every input is an output or a dead letter"
    );
    independent_check(&job, &CheckerOptions::all());
}

/// Rewrites a checkpoint as format 1 wrote it: no source lists in `state-meta.json`,
/// `format_version` 1, and the manifest's size and SHA-256 of the rewritten file.
fn downgrade_to_format_1(chk: &Path) {
    let meta_path = chk.join("state-meta.json");
    let mut meta = read_json(&meta_path);
    let lists = meta["operator_lists"]
        .as_object_mut()
        .expect("operator_lists");
    for list in LISTS {
        assert!(lists.remove(list).is_some(), "{list} in {meta_path:?}");
    }
    let bytes = serde_json::to_vec_pretty(&meta).expect("meta JSON");
    std::fs::write(&meta_path, &bytes).expect("write meta");
    let manifest_path = chk.join("manifest.json");
    let mut manifest = read_json(&manifest_path);
    manifest["format_version"] = 1.into();
    let file = manifest["state"]["files"]
        .as_array_mut()
        .expect("files")
        .iter_mut()
        .find(|f| f["path"] == "state-meta.json")
        .expect("state-meta.json in the manifest");
    file["size"] = (bytes.len() as u64).into();
    file["sha256"] = hex::encode(Sha256::digest(&bytes)).into();
    std::fs::write(
        &manifest_path,
        serde_json::to_vec_pretty(&manifest).expect("manifest JSON"),
    )
    .expect("write manifest");
}

fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
