//! Rule files as they live in a git repository: read, checked against the rule JSON
//! Schema and the engine's own parser, before anything reaches the control topic.
//!
//! Two checks because each sees what the other cannot: the schema
//! (`schemas/rule-v1.schema.json`, the published contract) reports every shape error at
//! once with its JSON pointer; the engine's parser ([`crate::rules::spec::compile`]) is the
//! judge the running job applies (durations, pointer syntax, window multiples, complexity
//! limits) and reports its first refusal with a dotted path, turned into a pointer here. A
//! file passes only when both accept every rule in it.
//!
//! A file holds one rule (a JSON object) or several (a JSON array of objects).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use crate::control::MAX_RULE_BYTES;
use crate::rules::spec;

/// The rule JSON Schema, compiled into the binary so the CLI checks exactly the schema
/// this version documents.
const SCHEMA: &str = include_str!("../../schemas/rule-v1.schema.json");

/// One problem in one rule file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    /// The rule's `id` when the file got far enough to have one.
    pub rule: Option<String>,
    /// JSON pointer into the file's JSON (`""` is the whole document).
    pub pointer: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.file.display())?;
        match &self.rule {
            Some(id) => write!(f, "rule {id:?}: ")?,
            None => write!(f, "rule ?: ")?,
        }
        let at = if self.pointer.is_empty() {
            "(document)"
        } else {
            &self.pointer
        };
        write!(f, "{at}: {}", self.message)
    }
}

/// A rule that both checks accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleFile {
    pub file: PathBuf,
    pub id: String,
    pub version: u64,
    /// The body as it will be published (compact JSON of this value).
    pub body: Value,
}

/// Reads and checks every file; the rules come back only when every file is clean, so a
/// caller that publishes can never publish part of a bad set.
pub fn load_all(files: &[PathBuf]) -> Result<Vec<RuleFile>, Vec<Problem>> {
    let mut rules = Vec::new();
    let mut problems = Vec::new();
    for file in files {
        match load(file) {
            Ok(mut r) => rules.append(&mut r),
            Err(mut p) => problems.append(&mut p),
        }
    }
    // Two files publishing the same id would race each other on the topic.
    let mut seen: BTreeMap<&str, &Path> = BTreeMap::new();
    for r in &rules {
        if let Some(first) = seen.insert(&r.id, &r.file) {
            problems.push(Problem {
                file: r.file.clone(),
                rule: Some(r.id.clone()),
                pointer: "/id".into(),
                message: format!("the same id is also defined in {}", first.display()),
            });
        }
    }
    if problems.is_empty() {
        Ok(rules)
    } else {
        Err(problems)
    }
}

/// Reads one file and checks every rule in it.
pub fn load(file: &Path) -> Result<Vec<RuleFile>, Vec<Problem>> {
    let problem = |rule: Option<String>, pointer: String, message: String| Problem {
        file: file.to_path_buf(),
        rule,
        pointer,
        message,
    };
    let text = std::fs::read_to_string(file)
        .map_err(|e| vec![problem(None, String::new(), format!("cannot read: {e}"))])?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| {
        vec![problem(
            None,
            String::new(),
            format!("not JSON: {e} (line {}, column {})", e.line(), e.column()),
        )]
    })?;
    let (items, base): (Vec<(&Value, String)>, bool) = match &doc {
        Value::Array(a) => (
            a.iter()
                .enumerate()
                .map(|(i, v)| (v, format!("/{i}")))
                .collect(),
            true,
        ),
        v => (vec![(v, String::new())], false),
    };
    if base && items.is_empty() {
        return Err(vec![problem(
            None,
            String::new(),
            "an empty array: no rules".into(),
        )]);
    }
    let mut rules = Vec::new();
    let mut problems = Vec::new();
    for (value, prefix) in items {
        match check(value) {
            Ok((id, version)) => rules.push(RuleFile {
                file: file.to_path_buf(),
                id,
                version,
                body: value.clone(),
            }),
            Err(found) => problems.extend(found.into_iter().map(|(pointer, message)| {
                problem(rule_id(value), format!("{prefix}{pointer}"), message)
            })),
        }
    }
    if problems.is_empty() {
        Ok(rules)
    } else {
        Err(problems)
    }
}

fn rule_id(v: &Value) -> Option<String> {
    v.get("id").and_then(Value::as_str).map(str::to_string)
}

/// Both checks on one rule: `(pointer, message)` for every problem found.
fn check(rule: &Value) -> Result<(String, u64), Vec<(String, String)>> {
    let mut found: Vec<(String, String)> = Vec::new();
    match validator() {
        Ok(v) => {
            for e in v.iter_errors(rule) {
                found.push((e.instance_path().to_string(), format!("{e} (schema)")));
            }
        }
        Err(e) => found.push((String::new(), format!("the built-in schema is broken: {e}"))),
    }
    if rule.get("status").and_then(Value::as_str) == Some("deleted") {
        found.push((
            "/status".into(),
            "`deleted` is not a rule to publish; use `streamstate rules delete ID`".into(),
        ));
    } else if let Err(e) = spec::compile(rule) {
        found.push((
            engine_pointer(&e.message),
            format!("{} ({})", e.message, e.reason),
        ));
    }
    let size = rule.to_string().len();
    if size > MAX_RULE_BYTES {
        found.push((
            String::new(),
            format!("{size} bytes as published; the control topic takes at most {MAX_RULE_BYTES}"),
        ));
    }
    match (
        found.is_empty(),
        rule_id(rule),
        rule.get("version").and_then(Value::as_u64),
    ) {
        (true, Some(id), Some(version)) => Ok((id, version)),
        (true, _, _) => Err(vec![(String::new(), "needs `id` and `version`".into())]),
        (false, _, _) => Err(found),
    }
}

fn validator() -> Result<&'static jsonschema::Validator, String> {
    static V: OnceLock<Result<jsonschema::Validator, String>> = OnceLock::new();
    V.get_or_init(|| {
        let schema: Value = serde_json::from_str(SCHEMA).map_err(|e| e.to_string())?;
        jsonschema::draft202012::new(&schema).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The engine names a place as a dotted path before a colon (`aggregate.window.size: …`,
/// `sequence.steps[1].and[0].field: …`); as a JSON pointer that is
/// `/aggregate/window/size`. Messages without such a path (`rule: …`, serde's) point at
/// the whole rule.
pub fn engine_pointer(message: &str) -> String {
    let Some((path, _)) = message.split_once(": ") else {
        return String::new();
    };
    let valid = !path.is_empty()
        && path
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._[]".contains(c));
    if !valid || path == "rule" {
        return String::new();
    }
    let mut out = String::new();
    for part in path.split('.') {
        let mut rest = part;
        let name_end = rest.find('[').unwrap_or(rest.len());
        out.push('/');
        out.push_str(&rest[..name_end]);
        rest = &rest[name_end..];
        while let Some(stripped) = rest.strip_prefix('[') {
            let Some(close) = stripped.find(']') else {
                break;
            };
            out.push('/');
            out.push_str(&stripped[..close]);
            rest = &stripped[close + 1..];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, body: &str) -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, body).expect("write");
        p
    }

    #[test]
    fn engine_paths_become_json_pointers() {
        assert_eq!(
            engine_pointer("aggregate.window.size: `x` is not a duration"),
            "/aggregate/window/size"
        );
        assert_eq!(
            engine_pointer("sequence.steps[1].and[0].field: `a` is not a JSON pointer"),
            "/sequence/steps/1/and/0/field"
        );
        assert_eq!(engine_pointer("rule: unknown field `x`"), "");
        assert_eq!(engine_pointer("no path here"), "");
    }

    #[test]
    fn a_good_file_loads_with_its_id_and_version() {
        let dir = tempfile::tempdir().expect("dir");
        let f = write(
            &dir,
            "a.json",
            r#"{"id":"a","version":3,"kind":"aggregate","aggregate":{"fn":"count"}}"#,
        );
        let rules = load_all(&[f]).expect("valid");
        assert_eq!((rules[0].id.as_str(), rules[0].version), ("a", 3));
    }

    #[test]
    fn schema_and_engine_problems_name_file_rule_and_pointer() {
        let dir = tempfile::tempdir().expect("dir");
        // The schema refuses the unknown fn; the engine refuses the bad duration the
        // schema cannot judge.
        let f = write(
            &dir,
            "bad.json",
            r#"[{"id":"ok","version":1,"kind":"aggregate","aggregate":{"fn":"count"}},
                {"id":"b","version":1,"kind":"aggregate","aggregate":{"fn":"median","field":"/x"}},
                {"id":"c","version":1,"kind":"dedup","dedup":{"field":"/x","ttl":"soon"}}]"#,
        );
        let problems = load_all(&[f.clone()]).expect_err("refused");
        let b = problems
            .iter()
            .find(|p| p.rule.as_deref() == Some("b"))
            .expect("b refused");
        assert_eq!(b.pointer, "/1/aggregate/fn", "{b}");
        assert_eq!(b.file, f);
        let c = problems
            .iter()
            .find(|p| p.rule.as_deref() == Some("c"))
            .expect("c refused");
        assert_eq!(c.pointer, "/2/dedup/ttl", "{c}");
        assert!(
            c.to_string().contains("bad.json: rule \"c\": /2/dedup/ttl"),
            "{c}"
        );
        assert!(problems.iter().all(|p| p.rule.as_deref() != Some("ok")));
    }

    #[test]
    fn unparsable_files_and_duplicate_ids_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let broken = write(&dir, "broken.json", "{\"id\": ");
        let p = load_all(&[broken]).expect_err("not JSON");
        assert!(p[0].message.contains("not JSON"), "{}", p[0]);
        let one = r#"{"id":"same","version":1,"kind":"aggregate","aggregate":{"fn":"count"}}"#;
        let a = write(&dir, "a.json", one);
        let b = write(&dir, "b.json", one);
        let p = load_all(&[a, b]).expect_err("duplicate");
        assert!(p[0].message.contains("a.json"), "{}", p[0]);
    }
}
