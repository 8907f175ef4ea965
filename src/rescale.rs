//! Rescaling N → M instances from a savepoint set.
//!
//! The procedure (see `docs/rescaling.md`): stop every instance with a savepoint
//! (`POST /stop {"savepoint": true}`), record the N savepoints as one **set**
//! (`streamstate savepoint-set`), start M instances with `--from-savepoint-set <name>`.
//! A set is written once, atomically, and only when all N parts are present, come from
//! one N-instance deployment (instance `i` of N, key groups as [`KeyGroups`] splits
//! them among N) and share one numbering of keys into key groups. Each new instance
//! restores the keyed state of its new key-group range from the parts that overlap it,
//! and the state layer redistributes
//! operator state: broadcast state is copied, and the source offsets, union list state,
//! reach every new instance, which reads the partitions it owns from them.

use serde::{Deserialize, Serialize};
use streamstate_state::{KeyGroupRange, KeyGroups};

use crate::checkpoint::{CheckpointError, CheckpointStorage, Manifest, PartitionOffset};
use crate::cluster;
use crate::config::Config;
use crate::savepoint;
use crate::source::Partition;

#[derive(Debug, thiserror::Error)]
pub enum RescaleError {
    #[error(transparent)]
    Storage(#[from] CheckpointError),
    #[error("savepoint set name {0:?} must be 1-64 characters of [A-Za-z0-9._-]")]
    BadName(String),
    #[error("savepoint set {name}: {reason}")]
    Incomplete { name: String, reason: String },
    #[error("savepoint set {0} does not exist")]
    Missing(String),
    #[error("savepoint set {name} cannot be read: {reason}")]
    Corrupt { name: String, reason: String },
}

/// One old instance's savepoint in a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetPart {
    pub instance: u32,
    /// `sp-<n>-<run>`, under that instance's savepoint location.
    pub savepoint: String,
    pub key_groups: KeyGroupRange,
    /// The part's manifest copies of its source offsets: what `rescale-plan` shows and a
    /// rescaled start compares with the group's committed offsets (restore reads state).
    pub offsets: Vec<PartitionOffset>,
    pub control_offsets: Vec<PartitionOffset>,
}

/// The record of one stop-with-savepoint of all N instances.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavepointSet {
    pub name: String,
    pub instances: u32,
    pub max_parallelism: u32,
    /// The parts' [`KeyGroups`] alignment; absent when keys are numbered modulo (every
    /// set written before alignment existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aligned_partitions: Option<u32>,
    pub created_at_ms: u64,
    pub parts: Vec<SetPart>,
}

fn document(name: &str) -> String {
    format!("sets/{name}.json")
}

/// Savepoint storage of instance `instance` (the default savepoint location).
pub fn part_storage(
    config: &Config,
    instance: u32,
) -> Result<Box<dyn CheckpointStorage>, CheckpointError> {
    let mut c = config.clone();
    c.job.instance = instance;
    savepoint::open(&c, &savepoint::default_location(&c)?)
}

/// Records the newest completed savepoint of each of instances `0..instances` (or the
/// given ids, in instance order) as set `name`. Refuses unless the parts form a whole.
pub fn create(
    config: &Config,
    name: &str,
    instances: u32,
    ids: Option<&[String]>,
) -> Result<SavepointSet, RescaleError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(RescaleError::BadName(name.to_string()));
    }
    let incomplete = |reason: String| RescaleError::Incomplete {
        name: name.to_string(),
        reason,
    };
    if let Some(ids) = ids
        && ids.len() != instances as usize
    {
        return Err(incomplete(format!(
            "{} savepoint ids given for {instances} instances",
            ids.len()
        )));
    }
    let mut parts = Vec::new();
    let mut numbering: Option<KeyGroups> = None;
    for i in 0..instances {
        let storage = part_storage(config, i)?;
        let chosen = match ids {
            Some(ids) => savepoint::parse_savepoint_id(&ids[i as usize]).ok_or_else(|| {
                incomplete(format!(
                    "{:?} is not a savepoint id (sp-<n>-<run>)",
                    ids[i as usize]
                ))
            })?,
            None => {
                // Newest by time: ids restart when an instance's checkpoint history does.
                let mut newest: Option<(u64, crate::checkpoint::CheckpointRef)> = None;
                for c in storage.list()?.into_iter().filter(|c| c.completed) {
                    let at = storage.read_manifest(&c.checkpoint)?.created_at_ms;
                    if newest.as_ref().is_none_or(|(t, _)| at > *t) {
                        newest = Some((at, c.checkpoint));
                    }
                }
                newest
                    .map(|(_, c)| c)
                    .ok_or_else(|| incomplete(format!("instance {i} has no completed savepoint")))?
            }
        };
        let manifest = storage.read_manifest(&chosen)?;
        let r = &manifest.state;
        let key_groups = r
            .identity
            .key_groups()
            .map_err(|e| incomplete(format!("instance {i}: {e}")))?;
        if !key_groups.fits_instances(instances) {
            return Err(incomplete(format!(
                "{instances} instances cannot share {key_groups}"
            )));
        }
        let expected = key_groups.range_for_instance(instances, i);
        if manifest.instance != i
            || r.identity.instance_count != instances
            || r.identity.key_group_range != expected
        {
            return Err(incomplete(format!(
                "savepoint {} is instance {} of {} (key groups {}), not instance {i} of {instances} ({expected})",
                savepoint::savepoint_id(&chosen),
                manifest.instance,
                r.identity.instance_count,
                r.identity.key_group_range
            )));
        }
        if *numbering.get_or_insert(key_groups) != key_groups {
            return Err(incomplete(format!(
                "parts disagree on the key groups: {} and {key_groups}",
                numbering.map(|n| n.to_string()).unwrap_or_default()
            )));
        }
        parts.push(SetPart {
            instance: i,
            savepoint: savepoint::savepoint_id(&chosen),
            key_groups: r.identity.key_group_range,
            offsets: manifest.offsets.clone(),
            control_offsets: manifest.control_offsets.clone(),
        });
    }
    let numbering = numbering.ok_or_else(|| incomplete("no instances".into()))?;
    let set = SavepointSet {
        name: name.to_string(),
        instances,
        max_parallelism: numbering.max_parallelism(),
        aligned_partitions: numbering.aligned_partitions(),
        created_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        parts,
    };
    let bytes = serde_json::to_vec_pretty(&set).map_err(|e| incomplete(e.to_string()))?;
    // Instance 0's savepoint location holds the set records of the app.
    part_storage(config, 0)?.put_document(&document(name), &bytes)?;
    Ok(set)
}

pub fn read(config: &Config, name: &str) -> Result<SavepointSet, RescaleError> {
    let bytes = part_storage(config, 0)?
        .get_document(&document(name))?
        .ok_or_else(|| RescaleError::Missing(name.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| RescaleError::Corrupt {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

impl SavepointSet {
    /// How the parts number keys into key groups.
    pub fn key_groups(&self) -> Result<KeyGroups, RescaleError> {
        KeyGroups::aligned(self.max_parallelism, self.aligned_partitions.unwrap_or(1)).map_err(
            |e| RescaleError::Corrupt {
                name: self.name.clone(),
                reason: e.to_string(),
            },
        )
    }

    /// The parts whose keyed state overlaps `range`.
    pub fn parts_for(&self, range: KeyGroupRange) -> Vec<&SetPart> {
        self.parts
            .iter()
            .filter(|p| p.key_groups.intersects(&range))
            .collect()
    }

    /// Input offsets of every partition, from the part that owned it.
    pub fn offsets(&self) -> Vec<PartitionOffset> {
        self.parts
            .iter()
            .flat_map(|p| p.offsets.iter().cloned())
            .collect()
    }
}

/// What one new instance restores from a set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanEntry {
    pub instance: u32,
    pub key_groups: KeyGroupRange,
    /// Old instances whose keyed state overlaps the new range (every part is read for
    /// operator and broadcast state).
    pub keyed_state_from: Vec<u32>,
    /// Input partitions and the offsets they resume at.
    pub offsets: Vec<PartitionOffset>,
}

/// The plan for `instances` new instances (`streamstate rescale-plan`). `repartition`
/// names the internal topic in repartition mode: its partitions follow the key groups,
/// the input partitions are split as [`cluster::repartition_ownership`] does.
pub fn plan(
    set: &SavepointSet,
    instances: u32,
    repartition: Option<&str>,
) -> Result<Vec<PlanEntry>, RescaleError> {
    let numbering = set.key_groups()?;
    if instances == 0 || !numbering.fits_instances(instances) {
        return Err(RescaleError::Incomplete {
            name: set.name.clone(),
            reason: format!("{instances} instances cannot share {numbering}"),
        });
    }
    let offsets = set.offsets();
    let mut inputs: Vec<Partition> = offsets
        .iter()
        .filter(|o| Some(o.topic.as_str()) != repartition)
        .map(|o| (o.topic.clone(), o.partition))
        .collect();
    inputs.sort();
    (0..instances)
        .map(|i| {
            let key_groups = numbering.range_for_instance(instances, i);
            let owned = |o: &PartitionOffset| match repartition {
                None => Ok(key_groups.contains(numbering.first_of_partition(o.partition as u32))),
                Some(internal) => cluster::repartition_ownership(
                    &inputs,
                    internal,
                    set.max_parallelism,
                    instances,
                    i,
                )
                .map(|own| own.partitions.contains(&(o.topic.clone(), o.partition))),
            };
            let mut mine = Vec::new();
            for o in &offsets {
                if owned(o).map_err(|e| RescaleError::Incomplete {
                    name: set.name.clone(),
                    reason: e.to_string(),
                })? {
                    mine.push(o.clone());
                }
            }
            Ok(PlanEntry {
                instance: i,
                key_groups,
                keyed_state_from: set
                    .parts_for(key_groups)
                    .iter()
                    .map(|p| p.instance)
                    .collect(),
                offsets: mine,
            })
        })
        .collect()
}

/// Reads every part's manifest (what a restore fetches).
pub fn manifests(
    config: &Config,
    set: &SavepointSet,
) -> Result<Vec<(u32, Manifest)>, RescaleError> {
    let mut out = Vec::new();
    for p in &set.parts {
        let id =
            savepoint::parse_savepoint_id(&p.savepoint).ok_or_else(|| RescaleError::Corrupt {
                name: set.name.clone(),
                reason: format!("bad part id {}", p.savepoint),
            })?;
        out.push((
            p.instance,
            part_storage(config, p.instance)?.read_manifest(&id)?,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(instance: u32, start: u32, end: u32, control: i64) -> SetPart {
        SetPart {
            instance,
            savepoint: format!("sp-1-r{instance}"),
            key_groups: KeyGroupRange::new(start, end),
            offsets: vec![PartitionOffset {
                topic: "in".into(),
                partition: instance as i32,
                offset: 10,
            }],
            control_offsets: vec![PartitionOffset {
                topic: "rules".into(),
                partition: 0,
                offset: control,
            }],
        }
    }

    #[test]
    fn a_new_range_reads_the_parts_that_overlap_it() {
        let set = SavepointSet {
            name: "s".into(),
            instances: 3,
            max_parallelism: 4,
            aligned_partitions: None,
            created_at_ms: 0,
            parts: vec![part(0, 0, 1, 7), part(1, 2, 2, 5), part(2, 3, 3, 9)],
        };
        let ids = |r| {
            set.parts_for(r)
                .iter()
                .map(|p| p.instance)
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(KeyGroupRange::new(0, 1)), vec![0]);
        assert_eq!(ids(KeyGroupRange::new(2, 3)), vec![1, 2]);
        assert_eq!(ids(KeyGroupRange::new(0, 3)), vec![0, 1, 2]);
        assert_eq!(set.offsets().len(), 3);
    }
}
