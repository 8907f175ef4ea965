//! `streamstate rules validate|publish|delete|list|diff`: rules kept as files in a git
//! repository reach the job like `kubectl apply`.
//!
//! Every verb that writes first reads the control topic to its end
//! ([`super::control_log`]) and decides against what the job would hold, then publishes
//! through the admin server's own control-topic producer
//! ([`crate::admin::control_producer::ControlProducer`]: idempotent, keyed by rule id,
//! the Java client's partitioner), so there is one way onto the topic. Publishing is all
//! or nothing: one bad file or one version not above the one in force, and nothing is
//! published. See `docs/rules-cli.md`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Subcommand;
use serde_json::{Value, json};

use super::Refused;
use super::cluster_client::ClusterClient;
use super::control_log::{self, InForce};
use super::rule_files::{self, RuleFile};
use crate::admin::control_producer::ControlProducer;
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Checks rule files against the rule JSON Schema and the engine's parser, without
    /// connecting. Exit code 3: a file is refused (each problem names file, rule, pointer).
    Validate {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Validates, then publishes each rule keyed by its id; refuses (publishing nothing) a
    /// version not above the one in force. A rule identical to the one in force is skipped.
    Publish {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Deletes a rule in force: publishes `{"id", "version": <in force + 1>, "status":
    /// "deleted"}`, so an older publish can never bring it back.
    Delete {
        #[arg(long, short)]
        config: PathBuf,
        id: String,
    },
    /// What the control topic holds, read to its end: every rule id with its version and
    /// status (deleted ones too), and the records the job ignores or refuses.
    List {
        #[arg(long, short)]
        config: PathBuf,
        /// Every rule as JSON (with its body) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Compares rule files with what is in force: new, changed (field by field), unchanged,
    /// and in force but in none of the files. Exit code 0 either way.
    Diff {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

pub fn run(command: RulesCommand) -> anyhow::Result<()> {
    match command {
        RulesCommand::Validate { files } => {
            let rules = validated(&files)?;
            for r in &rules {
                println!("ok {} version {} ({})", r.id, r.version, r.file.display());
            }
            println!("{} rules in {} files valid", rules.len(), files.len());
            Ok(())
        }
        RulesCommand::Publish { config, files } => {
            let rules = validated(&files)?;
            let (config, in_force) = read(&config)?;
            publish(config, &in_force, &rules)
        }
        RulesCommand::Delete { config, id } => {
            let (config, in_force) = read(&config)?;
            delete(config, &in_force, &id)
        }
        RulesCommand::List { config, json } => {
            let (_, in_force) = read(&config)?;
            list(&in_force, json)
        }
        RulesCommand::Diff { config, files } => {
            let rules = validated(&files)?;
            let (_, in_force) = read(&config)?;
            print!("{}", diff(&in_force, &rules));
            Ok(())
        }
    }
}

/// The files' rules, or every problem on stderr and a refusal.
fn validated(files: &[PathBuf]) -> anyhow::Result<Vec<RuleFile>> {
    rule_files::load_all(files).map_err(|problems| {
        for p in &problems {
            eprintln!("refused: {p}");
        }
        Refused(format!(
            "{} problem(s) in the rule files; nothing was published",
            problems.len()
        ))
        .into()
    })
}

fn read(path: &Path) -> anyhow::Result<(Config, InForce)> {
    let config = Config::load(path)?;
    let client = ClusterClient::connect(&config)?;
    let in_force = control_log::read(&config, &client)?;
    Ok((config, in_force))
}

/// What publishing one file's rule would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    Publish,
    Unchanged,
    Refuse(String),
}

pub fn plan(in_force: &InForce, rule: &RuleFile) -> Plan {
    let Some(current) = in_force.rules.get(&rule.id) else {
        return Plan::Publish;
    };
    if rule.version > current.version {
        return Plan::Publish;
    }
    if current.status != "deleted" && rule.version == current.version && rule.body == current.rule {
        return Plan::Unchanged;
    }
    let what = if current.status == "deleted" {
        "was deleted at"
    } else {
        "is in force at"
    };
    Plan::Refuse(format!(
        "{}: rule {:?} version {} is not above version {}: it {what} version {} (the job would ignore it); raise `version`",
        rule.file.display(),
        rule.id,
        rule.version,
        current.version,
        current.version
    ))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn publish(config: Config, in_force: &InForce, rules: &[RuleFile]) -> anyhow::Result<()> {
    let plans: Vec<(&RuleFile, Plan)> = rules.iter().map(|r| (r, plan(in_force, r))).collect();
    let refused: Vec<&String> = plans
        .iter()
        .filter_map(|(_, p)| match p {
            Plan::Refuse(why) => Some(why),
            _ => None,
        })
        .collect();
    if !refused.is_empty() {
        for why in &refused {
            eprintln!("refused: {why}");
        }
        return Err(Refused(format!(
            "{} rule(s) refused; nothing was published",
            refused.len()
        ))
        .into());
    }
    let producer = ControlProducer::new(Arc::new(config));
    let rt = runtime()?;
    for (rule, plan) in plans {
        if plan == Plan::Unchanged {
            println!(
                "unchanged {} version {} ({})",
                rule.id,
                rule.version,
                rule.file.display()
            );
            continue;
        }
        let body = serde_json::to_vec(&rule.body)?;
        let (partition, offset) = rt.block_on(producer.publish(&rule.id, &body))?;
        println!(
            "published {} version {} ({}) to {}[{partition}] at offset {offset}",
            rule.id,
            rule.version,
            rule.file.display(),
            in_force.topic
        );
    }
    Ok(())
}

fn delete(config: Config, in_force: &InForce, id: &str) -> anyhow::Result<()> {
    let Some(current) = in_force.active(id) else {
        let why = match in_force.rules.get(id) {
            Some(r) => format!("rule {id:?} is already deleted (at version {})", r.version),
            None => format!(
                "rule {id:?} is not on the control topic `{}`",
                in_force.topic
            ),
        };
        return Err(Refused(why).into());
    };
    let version = current.version + 1;
    let body = serde_json::to_vec(&json!({"id": id, "version": version, "status": "deleted"}))?;
    let producer = ControlProducer::new(Arc::new(config));
    let (partition, offset) = runtime()?.block_on(producer.publish(id, &body))?;
    println!(
        "deleted {id}: published version {version} with status deleted to {}[{partition}] at offset {offset}",
        in_force.topic
    );
    Ok(())
}

fn list(in_force: &InForce, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        let rules: Vec<&crate::control::RuleView> = in_force.rules.values().collect();
        println!("{}", serde_json::to_string_pretty(&rules)?);
        return Ok(());
    }
    let mut rows = vec![[
        "ID".to_string(),
        "VERSION".into(),
        "STATUS".into(),
        "KIND".into(),
        "PARTITION".into(),
        "OFFSET".into(),
    ]];
    for r in in_force.rules.values() {
        rows.push([
            r.id.clone(),
            r.version.to_string(),
            r.status.clone(),
            r.rule
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_string(),
            r.control_partition.to_string(),
            r.control_offset.to_string(),
        ]);
    }
    print!("{}", super::columns(&rows));
    let active = in_force
        .rules
        .values()
        .filter(|r| r.status != "deleted")
        .count();
    println!(
        "{active} in force, {} deleted; {} records read from {}",
        in_force.rules.len() - active,
        in_force.records,
        in_force.topic
    );
    for s in &in_force.skipped {
        println!(
            "skipped {}[{}] at offset {} ({}): {}",
            in_force.topic,
            s.partition,
            s.offset,
            s.id.as_deref().unwrap_or("no id"),
            s.why
        );
    }
    Ok(())
}

/// `rules diff`: one line per rule, then indented field changes.
pub fn diff(in_force: &InForce, rules: &[RuleFile]) -> String {
    let mut out = String::new();
    for rule in rules {
        let current = in_force.rules.get(&rule.id);
        let refusal = match plan(in_force, rule) {
            Plan::Refuse(_) => format!(
                " (publish refuses: version {} is not above {})",
                rule.version,
                current.map_or(0, |c| c.version)
            ),
            _ => String::new(),
        };
        match current {
            None => out.push_str(&format!("+ {} version {} (new)\n", rule.id, rule.version)),
            Some(c) if c.status == "deleted" => out.push_str(&format!(
                "+ {} version {} (deleted at version {}){refusal}\n",
                rule.id, rule.version, c.version
            )),
            Some(c) if c.rule == rule.body => out.push_str(&format!(
                "= {} version {} (unchanged)\n",
                rule.id, rule.version
            )),
            Some(c) => {
                out.push_str(&format!(
                    "~ {} version {} -> {}{refusal}\n",
                    rule.id, c.version, rule.version
                ));
                let mut changes = Vec::new();
                json_diff(&c.rule, &rule.body, String::new(), &mut changes);
                for line in changes {
                    out.push_str(&format!("    {line}\n"));
                }
            }
        }
    }
    for (id, r) in &in_force.rules {
        if r.status != "deleted" && !rules.iter().any(|f| f.id == *id) {
            out.push_str(&format!(
                "- {id} version {} in force, in none of these files (`rules delete {id}` removes it)\n",
                r.version
            ));
        }
    }
    out
}

/// Field-level differences as `pointer: old -> new` (`(none)` for an absent side).
fn json_diff(old: &Value, new: &Value, at: String, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => json_diff(x, y, p, out),
                    (Some(x), None) => out.push(format!("{p}: {x} -> (none)")),
                    (None, Some(y)) => out.push(format!("{p}: (none) -> {y}")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                json_diff(x, y, format!("{at}/{i}"), out);
            }
        }
        (a, b) if a != b => out.push(format!(
            "{}: {a} -> {b}",
            if at.is_empty() { "/" } else { &at }
        )),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::RuleView;
    use std::collections::BTreeMap;

    fn view(id: &str, version: u64, status: &str, rule: Value) -> RuleView {
        RuleView {
            id: id.into(),
            version,
            status: status.into(),
            applied_at_ms: 0,
            control_partition: 0,
            control_offset: 0,
            rule,
            matches: 0,
            outputs: 0,
            history: Vec::new(),
        }
    }

    fn file(id: &str, version: u64, body: Value) -> RuleFile {
        RuleFile {
            file: PathBuf::from(format!("{id}.json")),
            id: id.into(),
            version,
            body,
        }
    }

    fn in_force(rules: Vec<RuleView>) -> InForce {
        InForce {
            topic: "rules".into(),
            rules: rules
                .into_iter()
                .map(|r| (r.id.clone(), r))
                .collect::<BTreeMap<_, _>>(),
            skipped: Vec::new(),
            records: 0,
        }
    }

    #[test]
    fn publish_plans_follow_the_versions_in_force() {
        let body =
            json!({"id": "a", "version": 2, "kind": "aggregate", "aggregate": {"fn": "count"}});
        let state = in_force(vec![
            view("a", 2, "active", body.clone()),
            view("d", 5, "deleted", Value::Null),
        ]);
        assert_eq!(plan(&state, &file("a", 2, body.clone())), Plan::Unchanged);
        assert_eq!(plan(&state, &file("a", 3, body.clone())), Plan::Publish);
        assert_eq!(plan(&state, &file("new", 1, body.clone())), Plan::Publish);
        let mut changed = body.clone();
        changed["aggregate"]["fn"] = json!("sum");
        assert!(matches!(
            plan(&state, &file("a", 2, changed)),
            Plan::Refuse(_)
        ));
        assert!(matches!(
            plan(&state, &file("a", 1, body.clone())),
            Plan::Refuse(_)
        ));
        assert!(matches!(
            plan(&state, &file("d", 5, body.clone())),
            Plan::Refuse(_)
        ));
        assert_eq!(plan(&state, &file("d", 6, body)), Plan::Publish);
    }

    #[test]
    fn diff_shows_new_changed_unchanged_and_only_in_force() {
        let a = json!({"id": "a", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count"}});
        let mut a2 = a.clone();
        a2["version"] = json!(2);
        a2["aggregate"]["fn"] = json!("sum");
        a2["aggregate"]["field"] = json!("/x");
        let state = in_force(vec![
            view("a", 1, "active", a.clone()),
            view("b", 4, "active", json!({"id": "b"})),
            view("c", 1, "active", json!({"id": "c"})),
        ]);
        let text = diff(
            &state,
            &[
                file("a", 2, a2),
                file("c", 1, json!({"id": "c"})),
                file("n", 1, json!({})),
            ],
        );
        assert_eq!(
            text,
            "~ a version 1 -> 2\n    /aggregate/field: (none) -> \"/x\"\n    /aggregate/fn: \"count\" -> \"sum\"\n    /version: 1 -> 2\n\
             = c version 1 (unchanged)\n+ n version 1 (new)\n\
             - b version 4 in force, in none of these files (`rules delete b` removes it)\n"
        );
    }
}
