//! Savepoints: checkpoints a person asks for, in the state layer's canonical,
//! backend-neutral format, never pruned.
//!
//! A savepoint is stored exactly like a checkpoint (a [`Manifest`] with the input and
//! control offsets, plus the state files, checksummed and published atomically) through
//! the same [`CheckpointStorage`] code, at its own location: by default
//! `<checkpoint.storage>/savepoints`, or a target the request names. Its id is
//! `sp-<n>-<run>` for the checkpoint `chk-<n>-<run>` it was taken with, so both carry the
//! same offsets and the same state. Nothing ever calls `prune` on a savepoint location.
//!
//! A client-supplied target is a URL that must be an absolute `file://` path under the
//! checkpoint directory or one of `admin.savepoint_roots`, or an `s3://` URL in the
//! checkpoint bucket; `..` is refused before the URL parser could normalise it away.

use std::path::{Component, Path};

use serde::Deserialize;

use crate::checkpoint::{CheckpointError, CheckpointRef, CheckpointStorage, FsStorage, S3Storage};
use crate::config::{Config, StorageLocation, parse_storage_url};
use crate::history::SavepointRecord;

/// Sub-location of the checkpoint storage that holds savepoints by default.
pub const DIR: &str = "savepoints";

/// A validated place to write a savepoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavepointTarget {
    pub location: StorageLocation,
}

/// `POST /savepoints` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavepointRequest {
    /// Base URL; default: `<checkpoint.storage>/savepoints`.
    #[serde(default)]
    pub target: Option<String>,
}

/// Where savepoints go unless a request says otherwise.
pub fn default_location(config: &Config) -> Result<StorageLocation, CheckpointError> {
    let loc = config
        .checkpoint_location()
        .map_err(|e| CheckpointError::Unsupported(e.to_string()))?;
    Ok(match loc {
        StorageLocation::File(dir) => StorageLocation::File(dir.join(DIR)),
        StorageLocation::S3 { bucket, prefix } if prefix.is_empty() => StorageLocation::S3 {
            bucket,
            prefix: DIR.into(),
        },
        StorageLocation::S3 { bucket, prefix } => StorageLocation::S3 {
            bucket,
            prefix: format!("{prefix}/{DIR}"),
        },
    })
}

/// Checks a client's target URL; the error is a sentence for a 400 answer.
pub fn validate_target(config: &Config, raw: &str) -> Result<SavepointTarget, String> {
    if raw
        .split(['/', '\\'])
        .any(|seg| seg == ".." || seg.eq_ignore_ascii_case("%2e%2e"))
        || raw.contains("%2e%2e")
        || raw.contains("%2E%2E")
    {
        return Err("target must not contain `..`".into());
    }
    let location = parse_storage_url("target", raw).map_err(|e| e.to_string())?;
    let checkpoints = config.checkpoint_location().map_err(|e| e.to_string())?;
    match (&location, &checkpoints) {
        (StorageLocation::File(path), _) => {
            if !path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
            {
                return Err("target must be a plain absolute path".into());
            }
            let mut roots: Vec<&Path> = config
                .admin
                .savepoint_roots
                .iter()
                .map(|p| p.as_path())
                .collect();
            if let StorageLocation::File(base) = &checkpoints {
                roots.push(base);
            }
            if !roots.iter().any(|r| path.starts_with(r)) {
                return Err("target directory is not under the checkpoint directory or an admin.savepoint_roots entry".into());
            }
        }
        (StorageLocation::S3 { bucket, .. }, StorageLocation::S3 { bucket: ours, .. })
            if bucket == ours => {}
        (StorageLocation::S3 { .. }, _) => {
            return Err("an s3:// target must be in the checkpoint storage's bucket".into());
        }
    }
    Ok(SavepointTarget { location })
}

/// Opens a savepoint location for this app and instance.
pub fn open(
    config: &Config,
    location: &StorageLocation,
) -> Result<Box<dyn CheckpointStorage>, CheckpointError> {
    let (app, instance) = (&config.kafka.app_id, config.job.instance);
    match location {
        StorageLocation::File(dir) => Ok(Box::new(FsStorage::open(dir, app, instance)?)),
        StorageLocation::S3 { bucket, prefix } => Ok(Box::new(S3Storage::open(
            bucket,
            prefix,
            app,
            instance,
            config.checkpoint.timeout,
        )?)),
    }
}

/// The URL a location was (or could be) given as.
pub fn location_url(location: &StorageLocation) -> String {
    match location {
        StorageLocation::File(dir) => format!("file://{}", dir.display()),
        StorageLocation::S3 { bucket, prefix } => format!("s3://{bucket}/{prefix}"),
    }
}

/// `sp-<n>-<run>` for checkpoint `chk-<n>-<run>`.
pub fn savepoint_id(c: &CheckpointRef) -> String {
    format!("sp-{}-{}", c.id, c.run)
}

/// Inverse of [`savepoint_id`]; `None` for anything else (so no client string ever
/// becomes a path).
pub fn parse_savepoint_id(id: &str) -> Option<CheckpointRef> {
    CheckpointRef::parse(&format!("chk-{}", id.strip_prefix("sp-")?))
}

/// Completed savepoints at `location`, newest first, from their manifests.
pub fn list(
    config: &Config,
    location: &StorageLocation,
) -> Result<Vec<SavepointRecord>, CheckpointError> {
    let storage = open(config, location)?;
    let url = location_url(location);
    let mut out = Vec::new();
    for info in storage.list()?.into_iter().rev() {
        if !info.completed {
            continue;
        }
        let m = storage.read_manifest(&info.checkpoint)?;
        out.push(SavepointRecord {
            id: savepoint_id(&m.checkpoint),
            checkpoint: m.checkpoint.to_string(),
            location: url.clone(),
            created_at_ms: m.created_at_ms,
            size_bytes: m.state.total_size(),
            offsets: m.offsets,
            control_offsets: m.control_offsets,
            completed: true,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(storage: &str, roots: &[&str]) -> Config {
        let mut c: Config = serde_json::from_value(serde_json::json!({
            "kafka": {"bootstrap_servers": "x:1", "app_id": "a", "input_topics": ["i"], "output_topic": "o", "dead_letter_topic": "d"},
            "job": {"key": "/k"},
        }))
        .expect("config");
        c.checkpoint.storage = storage.into();
        c.admin.savepoint_roots = roots.iter().map(Into::into).collect();
        c
    }

    #[test]
    fn targets_must_stay_under_allowed_roots() {
        let c = config("file:///data/chk", &["/backups"]);
        assert!(validate_target(&c, "file:///data/chk/manual").is_ok());
        assert!(validate_target(&c, "file:///backups/sp").is_ok());
        for bad in [
            "file:///data/chk/../../etc",
            "file:///data/chk/%2e%2e/x",
            "file:///etc/streamstate",
            "file:///data/chkX/y",
            "s3://bucket/x",
            "http://example.com/x",
            "relative/path",
            "",
        ] {
            assert!(validate_target(&c, bad).is_err(), "{bad} must be refused");
        }
        let s3 = config("s3://ours/ckpt", &[]);
        assert!(validate_target(&s3, "s3://ours/elsewhere").is_ok());
        assert!(validate_target(&s3, "s3://theirs/x").is_err());
        assert!(validate_target(&s3, "file:///tmp/x").is_err());
    }

    #[test]
    fn savepoint_ids_round_trip_and_reject_junk() {
        let c = CheckpointRef::new(7, "0badcafe");
        assert_eq!(parse_savepoint_id(&savepoint_id(&c)), Some(c));
        for junk in ["chk-7-0badcafe", "sp-7", "sp-../x", "sp-7-0badcafe/..", "7"] {
            assert_eq!(parse_savepoint_id(junk), None, "{junk}");
        }
    }

    #[test]
    fn default_location_is_below_the_checkpoints() {
        assert_eq!(
            default_location(&config("file:///d/c", &[])).ok(),
            Some(StorageLocation::File("/d/c/savepoints".into()))
        );
        assert_eq!(
            default_location(&config("s3://b", &[])).ok(),
            Some(StorageLocation::S3 {
                bucket: "b".into(),
                prefix: "savepoints".into()
            })
        );
    }
}
