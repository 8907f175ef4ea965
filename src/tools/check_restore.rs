//! `streamstate check-restore`: would restoring this checkpoint or savepoint with the
//! current binary and config succeed? Compares the snapshot's recorded states (name,
//! kind, TTL, value schema) and key-group count with what the job declares, using the
//! same schema rule the store applies at registration ([`streamstate_state::schema::compare`]).

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use streamstate_state::offline::RawSnapshot;
use streamstate_state::{SchemaChange, StateDeclaration, StateMeta};

use super::{Refused, fetch};
use crate::config::Config;

#[derive(Debug, Args)]
pub struct CheckRestoreArgs {
    #[arg(long, short)]
    pub config: PathBuf,
    /// A checkpoint (`chk-<id>-<run>`, `<id>`, or `latest`: the newest completed one, and
    /// no checkpoint at all then counts as a first start, which succeeds) or a savepoint
    /// directory.
    #[arg(long)]
    pub from: String,
    /// Accept states the job no longer declares.
    #[arg(long)]
    pub allow_drop: bool,
    /// Overrides `[job] instance`.
    #[arg(long)]
    pub instance: Option<u32>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Restored as it is.
    Keep,
    /// Restored, and its values rewritten by the job's migration at the first registration.
    Migrate,
    /// Only the job has it: it starts empty.
    New,
    /// Only the snapshot has it: the job never reads it (accepted with `--allow-drop`).
    Drop,
    /// The restore would fail.
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// A state name, or `<key groups>`.
    pub name: String,
    pub verdict: Verdict,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub source: String,
    pub lines: Vec<Line>,
    pub ok: bool,
}

fn kind(k: streamstate_state::StateKind) -> String {
    format!("{k:?}").to_lowercase()
}

/// The comparison itself, on what the snapshot recorded and what the job declares.
pub fn check(
    snapshot: &[StateMeta],
    snapshot_max_parallelism: u32,
    declared: &[StateDeclaration],
    configured_max_parallelism: Option<u32>,
    allow_drop: bool,
) -> Vec<Line> {
    let mut lines = Vec::new();
    let line = |name: &str, verdict, reason: String| Line {
        name: name.to_string(),
        verdict,
        reason,
    };
    match configured_max_parallelism {
        Some(n) if n != snapshot_max_parallelism => lines.push(line(
            "<key groups>",
            Verdict::Fail,
            format!(
                "the snapshot has {snapshot_max_parallelism} key groups, state.max_parallelism is {n}: re-key it first \
                 (`checkpoints surgery <from> --savepoint-dir <dir> rekey --max-parallelism {n}`) or unset it"
            ),
        )),
        _ => lines.push(line("<key groups>", Verdict::Keep, format!("{snapshot_max_parallelism} key groups"))),
    }
    for s in snapshot {
        let Some(d) = declared.iter().find(|d| d.name == s.name) else {
            let reason = format!(
                "the job does not declare this {} state; its entries would be carried along unread \
                 (remove them with `checkpoints surgery … drop-state {}`)",
                kind(s.kind),
                s.name
            );
            lines.push(line(
                &s.name,
                if allow_drop {
                    Verdict::Drop
                } else {
                    Verdict::Fail
                },
                if allow_drop {
                    reason
                } else {
                    format!("{reason}; pass --allow-drop to accept")
                },
            ));
            continue;
        };
        if d.kind != s.kind {
            lines.push(line(
                &s.name,
                Verdict::Fail,
                format!("kind changed from {} to {}", kind(s.kind), kind(d.kind)),
            ));
            continue;
        }
        if d.ttl.is_some() != s.ttl.is_some() {
            let (from, to) = if s.ttl.is_some() {
                ("on", "off")
            } else {
                ("off", "on")
            };
            lines.push(line(
                &s.name,
                Verdict::Fail,
                format!("TTL turned {to} (stored values are framed with TTL {from}); use `checkpoints surgery … add-ttl` to add one"),
            ));
            continue;
        }
        let ttl_note = match (&s.ttl, &d.ttl) {
            (Some(a), Some(b)) if a != b => format!(
                "; TTL settings change ({} ms -> {} ms, new rules apply to existing entries)",
                a.ttl_ms, b.ttl_ms
            ),
            _ => String::new(),
        };
        match streamstate_state::schema::compare(s.schema.as_ref(), &d.schema, &d.migrates_from) {
            SchemaChange::Keep => {
                let what = match &s.schema {
                    Some(sc) => format!(
                        "{} {} v{}, unchanged",
                        kind(s.kind),
                        sc.value_type,
                        sc.version
                    ),
                    None => format!(
                        "{} (no schema recorded in the snapshot: not verifiable, taken as {} v{})",
                        kind(s.kind),
                        d.schema.value_type,
                        d.schema.version
                    ),
                };
                lines.push(line(&s.name, Verdict::Keep, format!("{what}{ttl_note}")));
            }
            SchemaChange::Migrate { from, to } => lines.push(line(
                &s.name,
                Verdict::Migrate,
                format!(
                    "schema v{from} ({}) -> v{to} ({}) by the job's migration{ttl_note}",
                    s.schema.as_ref().map_or("?", |x| x.value_type.as_str()),
                    d.schema.value_type
                ),
            )),
            SchemaChange::Incompatible(reason) => lines.push(line(&s.name, Verdict::Fail, reason)),
        }
    }
    for d in declared {
        if !snapshot.iter().any(|s| s.name == d.name) {
            lines.push(line(
                &d.name,
                Verdict::New,
                format!(
                    "new {} state ({} v{}): starts empty",
                    kind(d.kind),
                    d.schema.value_type,
                    d.schema.version
                ),
            ));
        }
    }
    lines
}

pub fn report(
    config: &Config,
    from: &str,
    declared: &[StateDeclaration],
    allow_drop: bool,
) -> anyhow::Result<Report> {
    if from == "latest" && !std::path::Path::new(from).is_dir() {
        let storage = crate::checkpoint::open_storage(config)?;
        if super::latest(storage.as_ref())?.is_none() {
            let line = Line {
                name: "<none>".into(),
                verdict: Verdict::Keep,
                reason: format!(
                    "no completed checkpoint in {}: a first start, nothing to restore",
                    storage.describe()
                ),
            };
            return Ok(Report {
                source: "no checkpoint".into(),
                lines: vec![line],
                ok: true,
            });
        }
    }
    let f = fetch(config, from, true)?;
    let meta = RawSnapshot::read_meta(&f.dir)?;
    // States the function creates on demand are judged against themselves: kept.
    let prefixes = crate::functions::dynamic_state_prefixes(config.job.function);
    let mut declared = declared.to_vec();
    for s in &meta.part.states {
        if prefixes.iter().any(|p| s.name.starts_with(p))
            && !declared.iter().any(|d| d.name == s.name)
            && let Some(schema) = &s.schema
        {
            declared.push(StateDeclaration {
                name: s.name.clone(),
                kind: s.kind,
                ttl: s.ttl.clone(),
                schema: schema.clone(),
                migrates_from: Vec::new(),
            });
        }
    }
    let lines = check(
        &meta.part.states,
        meta.part.identity.max_parallelism,
        &declared,
        config.state.max_parallelism,
        allow_drop,
    );
    let ok = lines.iter().all(|l| l.verdict != Verdict::Fail);
    Ok(Report {
        source: f.origin.source.clone(),
        lines,
        ok,
    })
}

pub fn run(args: CheckRestoreArgs) -> anyhow::Result<()> {
    let mut config = Config::load(&args.config)?;
    if let Some(i) = args.instance {
        config.job.instance = i;
    }
    let declared = crate::functions::declared_states(&config);
    let r = report(&config, &args.from, &declared, args.allow_drop)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        for l in &r.lines {
            println!(
                "{:<8} {}: {}",
                format!("{:?}", l.verdict).to_lowercase(),
                l.name,
                l.reason
            );
        }
    }
    if r.ok {
        if !args.json {
            println!("restore from {} would succeed", r.source);
        }
        Ok(())
    } else {
        let failed: Vec<&str> = r
            .lines
            .iter()
            .filter(|l| l.verdict == Verdict::Fail)
            .map(|l| l.name.as_str())
            .collect();
        Err(Refused(format!(
            "restore from {} would fail: {}",
            r.source,
            failed.join(", ")
        ))
        .into())
    }
}
