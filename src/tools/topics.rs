//! `streamstate topics check|create --config F`: the topics a config needs, whether the
//! cluster has them in a usable shape, and creating the missing ones.
//!
//! The service never creates the topics it is configured with (a typo in a topic name
//! must stop the start, not quietly create an empty topic); this is the operator's way to
//! set them up once, with the settings the job relies on. `create` never changes a topic
//! that exists: a wrong one is reported, and fixing it (more partitions, another cleanup
//! policy) is a decision for whoever owns that topic. See `docs/topics.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use rdkafka::admin::{NewTopic, TopicReplication};

use super::Refused;
use super::cluster_client::{ClusterClient, TopicInfo};
use crate::config::Config;

/// Kafka's default `max.message.bytes` of a topic (1 MiB + batch overhead).
pub const KAFKA_DEFAULT_MAX_MESSAGE_BYTES: usize = 1_048_588;

/// Partitions of created input and output topics when neither `--partitions` nor
/// `state.max_parallelism` says: the key groups are fixed at the job's first start to
/// the input's partition count, so one partition would forbid ever scaling out.
pub const DEFAULT_PARTITIONS: u32 = 4;

#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Lists every topic the config needs and whether it exists with a usable partition
    /// count and settings. Exit code 3: something is missing or wrong.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Creates the missing topics with the settings `check` asks for (the control topic
    /// compacted, the dead-letter topic taking the largest dead letter), then checks.
    /// Existing topics are never changed.
    Create {
        #[arg(long, short)]
        config: PathBuf,
        /// Partitions of created input and output topics (default: state.max_parallelism,
        /// else 4). Dead-letter and control topics get 1.
        #[arg(long)]
        partitions: Option<u32>,
    },
}

pub fn run(command: TopicsCommand) -> anyhow::Result<()> {
    match command {
        TopicsCommand::Check { config } => {
            let (config, client) = open(&config)?;
            let rows = check(&config, &client)?;
            report(&rows)
        }
        TopicsCommand::Create { config, partitions } => {
            let (config, client) = open(&config)?;
            let created = create(&config, &client, partitions)?;
            for (topic, n) in &created {
                println!("created {topic} ({n} partitions)");
            }
            if created.is_empty() {
                println!("nothing to create");
            }
            report(&check(&config, &client)?)
        }
    }
}

fn open(path: &Path) -> anyhow::Result<(Config, ClusterClient)> {
    let config = Config::load(path)?;
    let client = ClusterClient::connect(&config)?;
    Ok((config, client))
}

/// What a topic is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Input,
    Output,
    DeadLetter,
    Control,
    Repartition,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Self::Input => "input",
            Self::Output => "output",
            Self::DeadLetter => "dead-letter",
            Self::Control => "control",
            Self::Repartition => "repartition",
        }
    }
}

/// A topic the config needs and what it must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Need {
    pub topic: String,
    pub role: Role,
    pub partitions: PartitionNeed,
    /// Least `max.message.bytes` (the dead-letter topic).
    pub min_max_message_bytes: Option<usize>,
    /// `cleanup.policy` must include `compact` (the control topic).
    pub compact: bool,
}

/// What a topic's partition count must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionNeed {
    Any,
    /// One per key group (the repartition topic), or the first input topic's count.
    Exactly(usize),
    /// Keyed input shared by several instances: a divisor of the key-group count (so the
    /// groups align to the partitions, `src/cluster.rs`), at least one per instance.
    Divides {
        max_parallelism: usize,
        instances: usize,
    },
}

impl PartitionNeed {
    /// Why `n` partitions do not do, if they do not.
    fn refuses(&self, n: usize, role: Role) -> Option<String> {
        match *self {
            Self::Any => None,
            Self::Exactly(want) if n == want => None,
            Self::Exactly(want) => Some(match role {
                Role::Repartition => format!(
                    "needs {want} partitions (one per key group, state.max_parallelism); delete it while no job uses it"
                ),
                _ => format!(
                    "needs {want} partitions: with job.instances > 1 every input topic needs the first one's count"
                ),
            }),
            Self::Divides {
                max_parallelism,
                instances,
            } if n == 0 || !max_parallelism.is_multiple_of(n) || n < instances => Some(format!(
                "needs a partition count that divides state.max_parallelism ({max_parallelism}) and is at least \
                 job.instances ({instances}): with job.instances > 1 each instance owns whole partitions and their key groups"
            )),
            Self::Divides { .. } => None,
        }
    }

    /// The count to create a missing topic with, `preferred` if it does.
    fn to_create(&self, preferred: usize, role: Role) -> usize {
        match *self {
            Self::Any => preferred,
            Self::Exactly(n) => n,
            Self::Divides {
                max_parallelism, ..
            } => {
                if self.refuses(preferred, role).is_none() {
                    preferred
                } else {
                    max_parallelism
                }
            }
        }
    }
}

/// Every topic `config` needs, given what exists now (the partition count the job
/// derives its key groups from depends on the input as it is).
pub fn needs(config: &Config, existing: &BTreeMap<String, TopicInfo>) -> Vec<Need> {
    let k = &config.kafka;
    let plain = |topic: &str, role| Need {
        topic: topic.to_string(),
        role,
        partitions: PartitionNeed::Any,
        min_max_message_bytes: None,
        compact: false,
    };
    let count = |t: &String| existing.get(t).map(|i| i.partitions);
    let keyed_instances = config.job.instances > 1 && !config.job.repartition;
    // As the job derives it (src/job.rs): the first input topic's count with several
    // keyed instances, else every input partition.
    let max_parallelism = config
        .state
        .max_parallelism
        .map(|n| n as usize)
        .or_else(|| {
            if keyed_instances {
                k.input_topics.first().and_then(count)
            } else {
                k.input_topics.iter().map(count).sum()
            }
        });
    let mut out: Vec<Need> = k
        .input_topics
        .iter()
        .enumerate()
        .map(|(i, t)| Need {
            partitions: match (keyed_instances, max_parallelism, i) {
                (false, _, _) | (_, None, _) => PartitionNeed::Any,
                (true, Some(max_parallelism), 0) => PartitionNeed::Divides {
                    max_parallelism,
                    instances: config.job.instances as usize,
                },
                (true, Some(max_parallelism), _) => k.input_topics.first().and_then(count).map_or(
                    PartitionNeed::Divides {
                        max_parallelism,
                        instances: config.job.instances as usize,
                    },
                    PartitionNeed::Exactly,
                ),
            },
            ..plain(t, Role::Input)
        })
        .collect();
    out.push(plain(&k.output_topic, Role::Output));
    out.push(Need {
        min_max_message_bytes: Some(largest_dead_letter(config)),
        ..plain(&k.dead_letter_topic, Role::DeadLetter)
    });
    if let Some(c) = &k.control_topic {
        out.push(Need {
            compact: true,
            ..plain(c, Role::Control)
        });
    }
    if config.job.repartition {
        out.push(Need {
            partitions: max_parallelism.map_or(PartitionNeed::Any, PartitionNeed::Exactly),
            ..plain(&config.repartition_topic(), Role::Repartition)
        });
    }
    out
}

/// The largest record the job writes to the dead-letter topic: the payload it keeps
/// (`Config::dead_letter_max_bytes`), the key, and room for the reason headers.
pub fn largest_dead_letter(config: &Config) -> usize {
    config.dead_letter_max_bytes() + config.job.max_key_bytes + 64 * 1024
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Missing,
    Wrong,
    /// Absent, but the job creates it itself at start (the repartition topic).
    CreatedAtStart,
}

impl Status {
    fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Missing => "MISSING",
            Self::Wrong => "WRONG",
            Self::CreatedAtStart => "absent",
        }
    }
    fn fails(self) -> bool {
        matches!(self, Self::Missing | Self::Wrong)
    }
}

/// One line of the check's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub need: Need,
    pub partitions: Option<usize>,
    pub status: Status,
    pub detail: String,
}

pub fn check(config: &Config, client: &ClusterClient) -> anyhow::Result<Vec<Row>> {
    let existing = client.topics()?;
    let needs = needs(config, &existing);
    let present: Vec<&str> = needs
        .iter()
        .filter(|n| existing.contains_key(&n.topic))
        .map(|n| n.topic.as_str())
        .collect();
    let configs = client.configs(&present)?;
    Ok(needs
        .into_iter()
        .map(|need| judge(need, &existing, &configs))
        .collect())
}

fn judge(
    need: Need,
    existing: &BTreeMap<String, TopicInfo>,
    configs: &BTreeMap<String, BTreeMap<String, String>>,
) -> Row {
    let Some(info) = existing.get(&need.topic) else {
        let (status, detail) = if need.role == Role::Repartition {
            (
                Status::CreatedAtStart,
                "`run` creates it at its first start (or `topics create`)".to_string(),
            )
        } else {
            (Status::Missing, "does not exist".to_string())
        };
        return Row {
            need,
            partitions: None,
            status,
            detail,
        };
    };
    let settings = configs.get(&need.topic);
    let setting = |name: &str| settings.and_then(|s| s.get(name)).cloned();
    let mut wrong = Vec::new();
    let mut notes = Vec::new();
    if let Some(why) = need.partitions.refuses(info.partitions, need.role) {
        wrong.push(why);
    }
    if let Some(least) = need.min_max_message_bytes {
        match setting("max.message.bytes").and_then(|v| v.parse::<usize>().ok()) {
            Some(v) if v >= least => {
                notes.push(format!("max.message.bytes {v} >= {least}"));
            }
            Some(v) => wrong.push(format!(
                "max.message.bytes {v} < {least}, the largest dead letter (job.max_record_bytes, job.max_key_bytes and headers); set max.message.bytes={least}"
            )),
            None => wrong.push("max.message.bytes unknown (describe configs gave none)".into()),
        }
    }
    if need.compact {
        match setting("cleanup.policy") {
            Some(p) if p.split(',').any(|x| x.trim() == "compact") => {
                notes.push(format!("cleanup.policy {p}"));
            }
            other => wrong.push(format!(
                "cleanup.policy {} must be compact: with delete, rules older than retention.ms vanish and a job starting without a checkpoint never sees them",
                other.as_deref().unwrap_or("unknown")
            )),
        }
    }
    let status = if wrong.is_empty() {
        Status::Ok
    } else {
        Status::Wrong
    };
    let detail = if wrong.is_empty() { notes } else { wrong }.join("; ");
    Row {
        need,
        partitions: Some(info.partitions),
        status,
        detail,
    }
}

/// Prints the table; an error (exit 3) when any topic is missing or wrong.
fn report(rows: &[Row]) -> anyhow::Result<()> {
    print!("{}", table(rows));
    let failing: Vec<&Row> = rows.iter().filter(|r| r.status.fails()).collect();
    if failing.is_empty() {
        println!("topics ok: {} needed, all usable", rows.len());
        return Ok(());
    }
    let missing = failing
        .iter()
        .filter(|r| r.status == Status::Missing)
        .count();
    let mut msg = format!(
        "{} of {} topics missing or wrong: {}",
        failing.len(),
        rows.len(),
        failing
            .iter()
            .map(|r| format!("{} ({})", r.need.topic, r.status.name().to_lowercase()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if missing > 0 {
        msg.push_str("; `streamstate topics create --config FILE` creates the missing ones");
    }
    Err(Refused(msg).into())
}

/// The check as a fixed-width table (one header line, one line per topic).
pub fn table(rows: &[Row]) -> String {
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.need.role.name().to_string(),
                r.need.topic.clone(),
                r.partitions.map_or("-".into(), |p| p.to_string()),
                r.status.name().to_string(),
                r.detail.clone(),
            ]
        })
        .collect();
    let header = ["ROLE", "TOPIC", "PARTITIONS", "STATUS", "DETAIL"].map(str::to_string);
    let all: Vec<[String; 5]> = std::iter::once(header).chain(cells).collect();
    super::columns(&all)
}

/// Creates every missing topic; returns `(topic, partitions)` of those created.
pub fn create(
    config: &Config,
    client: &ClusterClient,
    partitions: Option<u32>,
) -> anyhow::Result<Vec<(String, usize)>> {
    let existing = client.topics()?;
    let data_partitions = partitions
        .or(config.state.max_parallelism)
        .unwrap_or(DEFAULT_PARTITIONS) as usize;
    if data_partitions == 0 {
        anyhow::bail!("--partitions must be at least 1");
    }
    // Partition needs as they will be once the missing input topics exist.
    let mut after = existing.clone();
    for t in &config.kafka.input_topics {
        after.entry(t.clone()).or_insert(TopicInfo {
            partitions: data_partitions,
        });
    }
    let dlq_bytes = largest_dead_letter(config)
        .max(KAFKA_DEFAULT_MAX_MESSAGE_BYTES)
        .to_string();
    let mut plan: Vec<(String, usize, Vec<(&str, &str)>)> = Vec::new();
    for need in needs(config, &after) {
        if existing.contains_key(&need.topic) {
            continue;
        }
        let (n, settings): (usize, Vec<(&str, &str)>) = match need.role {
            Role::Input | Role::Output => (
                need.partitions.to_create(data_partitions, need.role),
                vec![],
            ),
            Role::DeadLetter => (1, vec![("max.message.bytes", dlq_bytes.as_str())]),
            Role::Control => (1, vec![("cleanup.policy", "compact")]),
            Role::Repartition => (
                need.partitions.to_create(data_partitions, need.role),
                vec![],
            ),
        };
        plan.push((need.topic, n, settings));
    }
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    let new: Vec<NewTopic<'_>> = plan
        .iter()
        .map(|(t, n, settings)| {
            // Replication: the broker's default (-1), as for the repartition topic.
            settings.iter().fold(
                NewTopic::new(t, *n as i32, TopicReplication::Fixed(-1)),
                |nt, (k, v)| nt.set(k, v),
            )
        })
        .collect();
    client.create(&new)?;
    let created: Vec<(String, usize)> = plan.iter().map(|(t, n, _)| (t.clone(), *n)).collect();
    client.wait_for(&created)?;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_instances_need_a_dividing_count_of_at_least_one_partition_each() {
        let need = PartitionNeed::Divides {
            max_parallelism: 120,
            instances: 4,
        };
        for ok in [4, 12, 60, 120] {
            assert_eq!(need.refuses(ok, Role::Input), None, "{ok}");
        }
        for bad in [0, 2, 3, 7, 240] {
            assert!(need.refuses(bad, Role::Input).is_some(), "{bad}");
        }
        assert_eq!(need.to_create(12, Role::Input), 12);
        assert_eq!(
            need.to_create(7, Role::Input),
            120,
            "a count that does not divide is not created"
        );
        assert_eq!(PartitionNeed::Exactly(5).to_create(4, Role::Repartition), 5);
        assert_eq!(PartitionNeed::Any.refuses(1, Role::Output), None);
    }
}
