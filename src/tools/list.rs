//! `checkpoints list`: every checkpoint of this instance in storage.

use serde::Serialize;

use crate::checkpoint::open_storage;
use crate::config::Config;

#[derive(Debug, Serialize)]
pub struct Row {
    pub id: u64,
    pub run: String,
    pub name: String,
    pub instance: Option<u32>,
    pub completed: bool,
    pub created_at_ms: Option<u64>,
    pub size_bytes: Option<u64>,
    /// Why the manifest could not be read, if it could not.
    pub error: Option<String>,
}

pub fn rows(config: &Config) -> anyhow::Result<Vec<Row>> {
    let storage = open_storage(config)?;
    let mut out = Vec::new();
    for info in storage.list()? {
        let c = info.checkpoint;
        let m = storage.read_manifest(&c);
        out.push(Row {
            id: c.id,
            run: c.run.clone(),
            name: c.to_string(),
            instance: m.as_ref().ok().map(|m| m.instance),
            completed: info.completed,
            created_at_ms: m.as_ref().ok().map(|m| m.created_at_ms),
            size_bytes: m.as_ref().ok().map(|m| m.state.total_size()),
            error: m.err().map(|e| e.to_string()),
        });
    }
    Ok(out)
}

pub fn run(config: &Config, json: bool) -> anyhow::Result<()> {
    let rows = rows(config)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<8} {:<10} {:<8} {:<9} {:<26} {:>12}",
        "ID", "RUN", "INSTANCE", "COMPLETED", "CREATED", "SIZE"
    );
    for r in rows {
        let created = r
            .created_at_ms
            .map(|ms| {
                humantime::format_rfc3339_millis(
                    std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
                )
                .to_string()
            })
            .unwrap_or_else(|| "-".into());
        let instance = r.instance.map_or("-".to_string(), |i| i.to_string());
        let size = r.size_bytes.map_or("-".to_string(), |s| s.to_string());
        println!(
            "{:<8} {:<10} {:<8} {:<9} {:<26} {:>12}",
            r.id,
            r.run,
            instance,
            if r.completed { "yes" } else { "no" },
            created,
            size
        );
        if let Some(e) = r.error {
            println!("         ! {e}");
        }
    }
    Ok(())
}
