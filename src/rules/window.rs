//! State namespaces and window assignment.
//!
//! Every piece of rule state lives in a namespace that starts with the rule id and
//! version, so a new version starts from empty state and timers can tell which rule
//! (and version) registered them:
//!
//! `<rule id> 0x00 <version: u64 BE> <tag: u8> <tag-specific: i64/u64 BE>`
//!
//! Tags: `W` window (start), `H` compare history, `R` running aggregate, `S` sessions of a
//! key, `s` one session's distinct values (session id), `D` dedup, `Q` sequence,
//! `A` anomaly model; `E` (no rule id, version 0) every un-grouped window of a key that
//! ends at the argument (see [`super::windowed`]).

pub const WINDOW: u8 = b'W';
pub const HISTORY: u8 = b'H';
pub const RUNNING: u8 = b'R';
pub const SESSIONS: u8 = b'S';
pub const SESSION_DISTINCT: u8 = b's';
pub const DEDUP: u8 = b'D';
pub const SEQUENCE: u8 = b'Q';
pub const ANOMALY: u8 = b'A';
pub const WINDOW_END: u8 = b'E';

pub fn namespace(id: &str, version: u64, tag: u8, arg: Option<i64>) -> Vec<u8> {
    let mut ns = Vec::with_capacity(id.len() + 18);
    ns.extend_from_slice(id.as_bytes());
    ns.push(0);
    ns.extend_from_slice(&version.to_be_bytes());
    ns.push(tag);
    if let Some(a) = arg {
        ns.extend_from_slice(&a.to_be_bytes());
    }
    ns
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub id: &'a str,
    pub version: u64,
    pub tag: u8,
    pub arg: Option<i64>,
}

pub fn parse(ns: &[u8]) -> Option<Parsed<'_>> {
    let nul = ns.iter().position(|b| *b == 0)?;
    let id = std::str::from_utf8(&ns[..nul]).ok()?;
    let rest = &ns[nul + 1..];
    let version = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let tag = *rest.get(8)?;
    let arg = match rest.len() {
        9 => None,
        17 => Some(i64::from_be_bytes(rest[9..17].try_into().ok()?)),
        _ => return None,
    };
    Some(Parsed {
        id,
        version,
        tag,
        arg,
    })
}

/// Start of the window of `size` (aligned to the epoch) that holds `ts`.
pub fn tumbling_start(ts: i64, size: u64) -> i64 {
    ts - ts.rem_euclid(size as i64)
}

/// Starts of every sliding window `[start, start + size)` holding `ts`, oldest first.
pub fn sliding_starts(ts: i64, size: u64, slide: u64) -> Vec<i64> {
    let last = tumbling_start(ts, slide);
    let n = (size / slide) as i64;
    (0..n).rev().map(|i| last - i * slide as i64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_round_trip() {
        let ns = namespace("r-1", 7, WINDOW, Some(-60_000));
        assert_eq!(
            parse(&ns),
            Some(Parsed {
                id: "r-1",
                version: 7,
                tag: WINDOW,
                arg: Some(-60_000)
            })
        );
        assert_eq!(
            parse(&namespace("x", 1, DEDUP, None)).map(|p| p.arg),
            Some(None)
        );
        assert_eq!(parse(b"no-nul"), None);
    }

    #[test]
    fn window_assignment_at_boundaries() {
        assert_eq!(tumbling_start(60_000, 60_000), 60_000, "exactly at start");
        assert_eq!(tumbling_start(119_999, 60_000), 60_000, "end - 1");
        assert_eq!(
            tumbling_start(120_000, 60_000),
            120_000,
            "end is the next window"
        );
        assert_eq!(sliding_starts(25, 30, 10), vec![0, 10, 20]);
        assert_eq!(sliding_starts(30, 30, 10), vec![10, 20, 30]);
        assert_eq!(sliding_starts(5, 30, 10), vec![-20, -10, 0]);
    }
}
