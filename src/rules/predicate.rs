//! Predicates: `{"field": "/x", "<op>": value}` leaves combined with `and`, `or`, `not`.
//!
//! Compiled once per rule version: pointers are split into tokens, `in` lists are kept
//! as a vector, and the tree's size is bounded so one event's cost is bounded too.

use serde_json::{Map, Value};

use super::spec::{RuleError, reason};

/// Deepest predicate tree accepted (a leaf alone has depth 1).
pub const MAX_DEPTH: usize = 16;
/// Most nodes (leaves + combinators) in one rule's predicates, summed over the rule.
pub const MAX_NODES: usize = 256;
/// Longest `in` list.
pub const MAX_IN_VALUES: usize = 1024;

/// An RFC 6901 JSON pointer, split into unescaped tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Pointer {
    text: String,
    tokens: Vec<String>,
}

impl Pointer {
    pub fn parse(text: &str, field: &str) -> Result<Self, RuleError> {
        let bad = |why: &str| {
            RuleError::new(
                reason::BAD_POINTER,
                format!("{field}: `{text}` is not a JSON pointer ({why})"),
            )
        };
        if text.is_empty() {
            return Ok(Self {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = text.strip_prefix('/') else {
            return Err(bad("must start with '/'"));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut token = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err(bad("'~' must be followed by 0 or 1")),
                    }
                } else {
                    token.push(c);
                }
            }
            tokens.push(token);
        }
        Ok(Self {
            text: text.to_string(),
            tokens,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Walks `value`; no allocation.
    pub fn resolve<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        let mut cur = value;
        for t in &self.tokens {
            cur = match cur {
                Value::Object(m) => m.get(t.as_str())?,
                Value::Array(a) => {
                    if t.len() > 1 && t.starts_with('0') {
                        return None;
                    }
                    a.get(t.parse::<usize>().ok()?)?
                }
                _ => return None,
            };
        }
        Some(cur)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Eq(Value),
    Ne(Value),
    Gt(Value),
    Gte(Value),
    Lt(Value),
    Lte(Value),
    In(Vec<Value>),
    Exists(bool),
}

const OPS: [&str; 8] = ["eq", "ne", "gt", "gte", "lt", "lte", "in", "exists"];

#[derive(Debug, Clone, PartialEq)]
pub enum Predicate {
    /// `field: None` tests the value itself (used by `having`, on the aggregate value).
    Leaf {
        field: Option<Pointer>,
        op: Op,
    },
    And(Vec<Predicate>),
    Or(Vec<Predicate>),
    Not(Box<Predicate>),
}

/// Counts nodes across every predicate of one rule.
#[derive(Debug, Default)]
pub struct Budget {
    pub nodes: usize,
}

/// Whether a leaf must name a `field` (filters, steps) or must not (`having`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Field,
    Value,
}

impl Predicate {
    /// Compiles `v` found at `path` (for messages), e.g. `filter` or `sequence.steps[1]`.
    pub fn compile(
        v: &Value,
        path: &str,
        subject: Subject,
        budget: &mut Budget,
    ) -> Result<Self, RuleError> {
        Self::compile_at(v, path, subject, budget, 1)
    }

    fn compile_at(
        v: &Value,
        path: &str,
        subject: Subject,
        budget: &mut Budget,
        depth: usize,
    ) -> Result<Self, RuleError> {
        if depth > MAX_DEPTH {
            return Err(RuleError::new(
                reason::TOO_COMPLEX,
                format!("{path}: predicates nest deeper than {MAX_DEPTH}"),
            ));
        }
        budget.nodes += 1;
        if budget.nodes > MAX_NODES {
            return Err(RuleError::new(
                reason::TOO_COMPLEX,
                format!("{path}: more than {MAX_NODES} predicate nodes in the rule"),
            ));
        }
        let Value::Object(m) = v else {
            return Err(RuleError::new(
                reason::INVALID,
                format!("{path}: a predicate is a JSON object"),
            ));
        };
        for combinator in ["and", "or", "not"] {
            if let Some(inner) = m.get(combinator) {
                if m.len() != 1 {
                    let other = m
                        .keys()
                        .find(|k| k.as_str() != combinator)
                        .map(String::as_str)
                        .unwrap_or("");
                    return Err(RuleError::new(
                        reason::UNKNOWN_FIELD,
                        format!(
                            "{path}: `{combinator}` cannot be combined with `{other}` in one object"
                        ),
                    ));
                }
                let sub = format!("{path}.{combinator}");
                if combinator == "not" {
                    return Ok(Self::Not(Box::new(Self::compile_at(
                        inner,
                        &sub,
                        subject,
                        budget,
                        depth + 1,
                    )?)));
                }
                let Value::Array(items) = inner else {
                    return Err(RuleError::new(
                        reason::INVALID,
                        format!("{sub}: must be an array of predicates"),
                    ));
                };
                if items.is_empty() {
                    return Err(RuleError::new(
                        reason::INVALID,
                        format!("{sub}: must not be empty"),
                    ));
                }
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    out.push(Self::compile_at(
                        item,
                        &format!("{sub}[{i}]"),
                        subject,
                        budget,
                        depth + 1,
                    )?);
                }
                return Ok(if combinator == "and" {
                    Self::And(out)
                } else {
                    Self::Or(out)
                });
            }
        }
        Self::leaf(m, path, subject)
    }

    fn leaf(m: &Map<String, Value>, path: &str, subject: Subject) -> Result<Self, RuleError> {
        let field = match (m.get("field"), subject) {
            (Some(Value::String(p)), Subject::Field) => {
                Some(Pointer::parse(p, &format!("{path}.field"))?)
            }
            (Some(_), Subject::Field) => {
                return Err(RuleError::new(
                    reason::INVALID,
                    format!("{path}.field: must be a JSON pointer string"),
                ));
            }
            (None, Subject::Field) => {
                return Err(RuleError::new(
                    reason::INVALID,
                    format!("{path}: a predicate needs `field` (or and/or/not)"),
                ));
            }
            (Some(_), Subject::Value) => {
                return Err(RuleError::new(
                    reason::UNKNOWN_FIELD,
                    format!("{path}.field: `having` tests the aggregate value; no field"),
                ));
            }
            (None, Subject::Value) => None,
        };
        let mut op = None;
        for (k, v) in m {
            if k == "field" {
                continue;
            }
            if !OPS.contains(&k.as_str()) {
                return Err(RuleError::new(
                    reason::UNKNOWN_OP,
                    format!("{path}: unknown operator `{k}` (one of {})", OPS.join(" ")),
                ));
            }
            if op.is_some() {
                return Err(RuleError::new(
                    reason::INVALID,
                    format!("{path}: one operator per predicate; use `and` to combine"),
                ));
            }
            let at = format!("{path}.{k}");
            op = Some(match k.as_str() {
                "eq" => Op::Eq(v.clone()),
                "ne" => Op::Ne(v.clone()),
                "gt" | "gte" | "lt" | "lte" => {
                    if !(v.is_number() || v.is_string()) {
                        return Err(RuleError::new(
                            reason::INVALID,
                            format!("{at}: compares with a number or a string"),
                        ));
                    }
                    match k.as_str() {
                        "gt" => Op::Gt(v.clone()),
                        "gte" => Op::Gte(v.clone()),
                        "lt" => Op::Lt(v.clone()),
                        _ => Op::Lte(v.clone()),
                    }
                }
                "in" => match v {
                    Value::Array(items) if items.len() <= MAX_IN_VALUES => Op::In(items.clone()),
                    Value::Array(_) => {
                        return Err(RuleError::new(
                            reason::TOO_COMPLEX,
                            format!("{at}: more than {MAX_IN_VALUES} values"),
                        ));
                    }
                    _ => {
                        return Err(RuleError::new(
                            reason::INVALID,
                            format!("{at}: must be an array"),
                        ));
                    }
                },
                _ => match v {
                    Value::Bool(b) => Op::Exists(*b),
                    _ => {
                        return Err(RuleError::new(
                            reason::INVALID,
                            format!("{at}: must be true or false"),
                        ));
                    }
                },
            });
        }
        let Some(op) = op else {
            return Err(RuleError::new(
                reason::INVALID,
                format!("{path}: no operator (one of {})", OPS.join(" ")),
            ));
        };
        Ok(Self::Leaf { field, op })
    }

    /// Evaluates against an event (leaves with a field) or a value (leaves without).
    pub fn eval(&self, v: &Value) -> bool {
        match self {
            Self::Leaf { field, op } => {
                let x = match field {
                    Some(p) => p.resolve(v),
                    None => Some(v),
                };
                op.test(x)
            }
            Self::And(ps) => ps.iter().all(|p| p.eval(v)),
            Self::Or(ps) => ps.iter().any(|p| p.eval(v)),
            Self::Not(p) => !p.eval(v),
        }
    }
}

impl Op {
    /// `x` is `None` when the field is missing: only `exists: false` and `ne` hold then.
    pub fn test(&self, x: Option<&Value>) -> bool {
        match (self, x) {
            (Self::Exists(want), x) => x.is_some() == *want,
            (Self::Ne(c), x) => !x.is_some_and(|x| json_eq(x, c)),
            (_, None) => false,
            (Self::Eq(c), Some(x)) => json_eq(x, c),
            (Self::In(cs), Some(x)) => cs.iter().any(|c| json_eq(x, c)),
            (Self::Gt(c), Some(x)) => compare(x, c).is_some_and(|o| o.is_gt()),
            (Self::Gte(c), Some(x)) => compare(x, c).is_some_and(|o| o.is_ge()),
            (Self::Lt(c), Some(x)) => compare(x, c).is_some_and(|o| o.is_lt()),
            (Self::Lte(c), Some(x)) => compare(x, c).is_some_and(|o| o.is_le()),
        }
    }
}

/// JSON equality, except that numbers compare by value (`1 == 1.0`).
pub fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => match (x.as_u64(), y.as_u64()) {
                (Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            },
        },
        _ => a == b,
    }
}

/// Numbers with numbers, strings with strings (byte order); anything else is unordered.
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.as_str().cmp(y.as_str())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn p(v: Value) -> Predicate {
        Predicate::compile(&v, "filter", Subject::Field, &mut Budget::default()).expect("compiles")
    }

    fn err(v: Value) -> &'static str {
        Predicate::compile(&v, "filter", Subject::Field, &mut Budget::default())
            .expect_err("refused")
            .reason
    }

    #[test]
    fn every_operator_on_a_field() {
        let e = json!({"type": "payment", "amount": 250, "tags": ["a"], "name": "bob", "nested": {"a/b": {"~x": 1}}});
        assert!(p(json!({"field": "/type", "eq": "payment"})).eval(&e));
        assert!(!p(json!({"field": "/type", "eq": "refund"})).eval(&e));
        assert!(
            p(json!({"field": "/amount", "eq": 250.0})).eval(&e),
            "numbers compare by value"
        );
        assert!(p(json!({"field": "/type", "ne": "refund"})).eval(&e));
        assert!(
            p(json!({"field": "/missing", "ne": "x"})).eval(&e),
            "ne is not(eq): true on a missing field"
        );
        assert!(p(json!({"field": "/amount", "gt": 249})).eval(&e));
        assert!(!p(json!({"field": "/amount", "gt": 250})).eval(&e));
        assert!(p(json!({"field": "/amount", "gte": 250})).eval(&e));
        assert!(!p(json!({"field": "/amount", "gte": 250.5})).eval(&e));
        assert!(p(json!({"field": "/amount", "lt": 251})).eval(&e));
        assert!(!p(json!({"field": "/amount", "lt": 250})).eval(&e));
        assert!(p(json!({"field": "/amount", "lte": 250})).eval(&e));
        assert!(!p(json!({"field": "/amount", "lte": 249.99})).eval(&e));
        assert!(
            p(json!({"field": "/name", "gt": "alice"})).eval(&e),
            "strings compare lexicographically"
        );
        assert!(
            !p(json!({"field": "/name", "gt": 3})).eval(&e),
            "string vs number is unordered: false"
        );
        assert!(p(json!({"field": "/type", "in": ["refund", "payment"]})).eval(&e));
        assert!(!p(json!({"field": "/type", "in": ["refund"]})).eval(&e));
        assert!(p(json!({"field": "/tags/0", "exists": true})).eval(&e));
        assert!(!p(json!({"field": "/tags/1", "exists": true})).eval(&e));
        assert!(p(json!({"field": "/nope", "exists": false})).eval(&e));
        assert!(
            !p(json!({"field": "/nope", "gt": 1})).eval(&e),
            "missing field: false"
        );
        assert!(
            p(json!({"field": "/nested/a~1b/~0x", "eq": 1})).eval(&e),
            "pointer escapes"
        );
    }

    #[test]
    fn and_or_not() {
        let e = json!({"a": 1, "b": 2});
        assert!(p(json!({"and": [{"field": "/a", "eq": 1}, {"field": "/b", "eq": 2}]})).eval(&e));
        assert!(!p(json!({"and": [{"field": "/a", "eq": 1}, {"field": "/b", "eq": 3}]})).eval(&e));
        assert!(p(json!({"or": [{"field": "/a", "eq": 5}, {"field": "/b", "eq": 2}]})).eval(&e));
        assert!(!p(json!({"or": [{"field": "/a", "eq": 5}, {"field": "/b", "eq": 5}]})).eval(&e));
        assert!(p(json!({"not": {"field": "/a", "eq": 5}})).eval(&e));
        assert!(!p(json!({"not": {"or": [{"field": "/a", "eq": 1}]}})).eval(&e));
    }

    #[test]
    fn having_tests_the_value_itself() {
        let h = Predicate::compile(
            &json!({"gt": 1000}),
            "having",
            Subject::Value,
            &mut Budget::default(),
        )
        .expect("ok");
        assert!(h.eval(&json!(1000.5)));
        assert!(!h.eval(&json!(1000)));
        let e = Predicate::compile(
            &json!({"field": "/x", "gt": 1}),
            "having",
            Subject::Value,
            &mut Budget::default(),
        );
        assert_eq!(e.expect_err("field refused").reason, reason::UNKNOWN_FIELD);
    }

    #[test]
    fn malformed_predicates_are_refused_with_a_reason() {
        assert_eq!(err(json!({"field": "/a", "like": "x"})), reason::UNKNOWN_OP);
        assert_eq!(err(json!({"field": "a", "eq": 1})), reason::BAD_POINTER);
        assert_eq!(err(json!({"field": "/a~2", "eq": 1})), reason::BAD_POINTER);
        assert_eq!(err(json!({"field": "/a"})), reason::INVALID);
        assert_eq!(
            err(json!({"field": "/a", "eq": 1, "gt": 0})),
            reason::INVALID
        );
        assert_eq!(err(json!({"field": "/a", "gt": [1]})), reason::INVALID);
        assert_eq!(
            err(json!({"field": "/a", "exists": "yes"})),
            reason::INVALID
        );
        assert_eq!(err(json!({"and": []})), reason::INVALID);
        assert_eq!(
            err(json!({"and": [{"field": "/a", "eq": 1}], "x": 1})),
            reason::UNKNOWN_FIELD
        );
        assert_eq!(
            err(json!({"field": "/a", "in": vec![1; MAX_IN_VALUES + 1]})),
            reason::TOO_COMPLEX
        );
        let mut deep = json!({"field": "/a", "eq": 1});
        for _ in 0..MAX_DEPTH {
            deep = json!({"not": deep});
        }
        assert_eq!(err(deep), reason::TOO_COMPLEX);
        let wide: Vec<Value> = (0..MAX_NODES)
            .map(|_| json!({"field": "/a", "eq": 1}))
            .collect();
        assert_eq!(err(json!({"or": wide})), reason::TOO_COMPLEX);
    }
}
