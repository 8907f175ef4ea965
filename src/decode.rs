//! Turns raw Kafka record bytes into a JSON event and its state key. The bytes are JSON,
//! or Avro or Protobuf read by [`crate::format`]; everything after that first step is
//! the same for every format.
//!
//! Every way a record can be unusable has its own [`DecodeError`] variant, because the
//! variant's [`DecodeError::reason`] becomes the dead-letter header and metric label that an
//! operator filters on.

use std::sync::Arc;

use serde_json::Value;

use crate::format::ValueReader;

/// Deeper documents are refused before serde_json's own recursion limit (128) would be hit,
/// so a hostile record costs bounded stack and time.
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record has no value")]
    Empty,
    #[error("record of {size} bytes exceeds job.max_record_bytes ({max})")]
    TooLarge { size: usize, max: usize },
    #[error("record is not valid UTF-8 at byte {0}")]
    NotUtf8(usize),
    #[error("record nests deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("record is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("key field {0} is missing")]
    MissingKey(String),
    #[error("key field {0} is not a string or number")]
    KeyNotScalar(String),
    #[error("key of {size} bytes exceeds job.max_key_bytes ({max})")]
    KeyTooLarge { size: usize, max: usize },
    #[error("event time field {0} is missing")]
    MissingTimestamp(String),
    #[error("event time field {0} is not ms since the epoch or an RFC 3339 time")]
    BadTimestamp(String),
    #[error(
        "event time {timestamp_ms} ms is more than job.max_event_time_skew ({max_skew_ms} ms) from the wall clock ({now_ms} ms)"
    )]
    EventTimeOutOfRange {
        timestamp_ms: u64,
        now_ms: u64,
        max_skew_ms: u64,
    },
    #[error("record does not start with the wire format's magic byte 0 (found {0:#04x})")]
    BadMagicByte(u8),
    #[error("record is truncated: {0}")]
    Truncated(String),
    #[error("schema id {0} is not in the schema registry")]
    UnknownSchemaId(u32),
    #[error("{0}")]
    SchemaMismatch(String),
    #[error("{0}")]
    UnsupportedSchema(String),
    #[error("record is not valid Avro: {0}")]
    InvalidAvro(String),
    #[error("record is not valid Protobuf: {0}")]
    InvalidProtobuf(String),
    /// Not the record's fault: the job aborts the epoch and replays it, and never
    /// dead-letters a record for it ([`DecodeError::is_transient`]).
    #[error("{0}")]
    RegistryUnavailable(String),
}

impl DecodeError {
    /// A short, fixed label: safe as a metric label and a header value.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::TooLarge { .. } => "too_large",
            Self::NotUtf8(_) => "not_utf8",
            Self::TooDeep => "too_deep",
            Self::InvalidJson(_) => "invalid_json",
            Self::MissingKey(_) => "missing_key",
            Self::KeyNotScalar(_) => "key_not_scalar",
            Self::KeyTooLarge { .. } => "key_too_large",
            Self::MissingTimestamp(_) => "missing_timestamp",
            Self::BadTimestamp(_) => "bad_timestamp",
            Self::EventTimeOutOfRange { .. } => "event_time_out_of_range",
            Self::BadMagicByte(_) => "bad_magic_byte",
            Self::Truncated(_) => "truncated",
            Self::UnknownSchemaId(_) => "unknown_schema_id",
            Self::SchemaMismatch(_) => "schema_mismatch",
            Self::UnsupportedSchema(_) => "unsupported_schema",
            Self::InvalidAvro(_) => "invalid_avro",
            Self::InvalidProtobuf(_) => "invalid_protobuf",
            Self::RegistryUnavailable(_) => "registry_unavailable",
        }
    }

    /// A failure of the schema registry, not of the record: replay, never dead-letter.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::RegistryUnavailable(_))
    }
}

/// A decoded event and the key its state lives under.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub key: String,
    pub value: Value,
    /// Event time (ms) when the decoder has a timestamp field.
    pub timestamp_ms: Option<u64>,
}

/// Decoding rules fixed at start from `[job]`.
#[derive(Debug, Clone)]
pub struct Decoder {
    key_pointer: String,
    max_record_bytes: usize,
    max_key_bytes: usize,
    timestamp_pointer: Option<String>,
    max_skew_ms: Option<u64>,
    reader: Arc<ValueReader>,
}

impl Decoder {
    pub fn new(key_pointer: &str, max_record_bytes: usize, max_key_bytes: usize) -> Self {
        Self {
            key_pointer: key_pointer.to_string(),
            max_record_bytes,
            max_key_bytes,
            timestamp_pointer: None,
            max_skew_ms: None,
            reader: Arc::new(ValueReader::Json),
        }
    }

    /// Read values with this format's reader instead of as JSON (`[job] format`).
    pub fn with_reader(mut self, reader: ValueReader) -> Self {
        self.reader = Arc::new(reader);
        self
    }

    /// Also extract event time from this JSON pointer; events without it are refused.
    pub fn with_timestamp(mut self, pointer: Option<&str>) -> Self {
        self.timestamp_pointer = pointer.map(str::to_string);
        self
    }

    /// Refuse event times further than `skew` from the wall clock (`job.max_event_time_skew`).
    pub fn with_max_skew(mut self, skew: Option<std::time::Duration>) -> Self {
        self.max_skew_ms = skew.map(|d| d.as_millis().min(u64::MAX as u128) as u64);
        self
    }

    pub fn decode(&self, payload: Option<&[u8]>) -> Result<Event, DecodeError> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.decode_at(payload, now_ms)
    }

    /// [`Decoder::decode`] with the wall clock given (the skew check's "now").
    pub fn decode_at(&self, payload: Option<&[u8]>, now_ms: u64) -> Result<Event, DecodeError> {
        let bytes = payload
            .filter(|b| !b.is_empty())
            .ok_or(DecodeError::Empty)?;
        if bytes.len() > self.max_record_bytes {
            return Err(DecodeError::TooLarge {
                size: bytes.len(),
                max: self.max_record_bytes,
            });
        }
        let value = self.reader.read(bytes, self.max_record_bytes)?;
        let key = match value.pointer(&self.key_pointer) {
            None | Some(Value::Null) => {
                return Err(DecodeError::MissingKey(self.key_pointer.clone()));
            }
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(_) => return Err(DecodeError::KeyNotScalar(self.key_pointer.clone())),
        };
        if key.len() > self.max_key_bytes {
            return Err(DecodeError::KeyTooLarge {
                size: key.len(),
                max: self.max_key_bytes,
            });
        }
        let timestamp_ms = match &self.timestamp_pointer {
            None => None,
            Some(p) => Some(match value.pointer(p) {
                None | Some(Value::Null) => return Err(DecodeError::MissingTimestamp(p.clone())),
                Some(Value::Number(n)) => n
                    .as_u64()
                    .ok_or_else(|| DecodeError::BadTimestamp(p.clone()))?,
                Some(Value::String(s)) => humantime::parse_rfc3339_weak(s)
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as u64)
                    .ok_or_else(|| DecodeError::BadTimestamp(p.clone()))?,
                Some(_) => return Err(DecodeError::BadTimestamp(p.clone())),
            }),
        };
        if let (Some(ts), Some(max_skew_ms)) = (timestamp_ms, self.max_skew_ms)
            && ts.abs_diff(now_ms) > max_skew_ms
        {
            return Err(DecodeError::EventTimeOutOfRange {
                timestamp_ms: ts,
                now_ms,
                max_skew_ms,
            });
        }
        Ok(Event {
            key,
            value,
            timestamp_ms,
        })
    }
}

/// Bytes → JSON with the limits every record from Kafka gets (size, UTF-8, nesting).
pub fn parse_json(payload: Option<&[u8]>, max_bytes: usize) -> Result<Value, DecodeError> {
    let bytes = payload
        .filter(|b| !b.is_empty())
        .ok_or(DecodeError::Empty)?;
    if bytes.len() > max_bytes {
        return Err(DecodeError::TooLarge {
            size: bytes.len(),
            max: max_bytes,
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| DecodeError::NotUtf8(e.valid_up_to()))?;
    // Depth never exceeds the count of opening brackets, which is a fast, vectorized
    // count; only a record with more than MAX_DEPTH of them gets the exact scan.
    if opening_brackets(bytes) > MAX_DEPTH && nesting_depth(text) > MAX_DEPTH {
        return Err(DecodeError::TooDeep);
    }
    serde_json::from_str(text).map_err(|e| DecodeError::InvalidJson(e.to_string()))
}

/// `[` and `{` anywhere, strings included: an upper bound of [`nesting_depth`].
fn opening_brackets(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'[' || b == b'{').count()
}

/// Bracket depth outside strings; a cheap pre-scan so deep nesting never reaches the parser.
fn nesting_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder() -> Decoder {
        Decoder::new("/user", 1024, 16)
    }

    #[test]
    fn extracts_string_and_numeric_keys() {
        let d = decoder();
        assert_eq!(
            d.decode(Some(br#"{"user":"u1","n":1}"#)).map(|e| e.key),
            Ok("u1".into())
        );
        assert_eq!(
            d.decode(Some(br#"{"user":42}"#)).map(|e| e.key),
            Ok("42".into())
        );
    }

    #[test]
    fn classifies_every_kind_of_bad_record() {
        let d = decoder();
        let reason = |p: Option<&[u8]>| d.decode(p).map(|_| ()).map_err(|e| e.reason());
        assert_eq!(reason(None), Err("empty"));
        assert_eq!(reason(Some(b"{not json")), Err("invalid_json"));
        assert_eq!(reason(Some(&[0xff, 0xfe, b'{'])), Err("not_utf8"));
        assert_eq!(reason(Some(br#"{"other":1}"#)), Err("missing_key"));
        assert_eq!(reason(Some(br#"{"user":null}"#)), Err("missing_key"));
        assert_eq!(reason(Some(br#"{"user":{"a":1}}"#)), Err("key_not_scalar"));
        assert_eq!(
            reason(Some(br#"{"user":"0123456789abcdefXYZ"}"#)),
            Err("key_too_large")
        );
        assert_eq!(reason(Some(&[b' '; 2048])), Err("too_large"));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let d2 = Decoder::new("/user", 1 << 20, 16);
        assert_eq!(
            d2.decode(Some(deep.as_bytes())).map_err(|e| e.reason()),
            Err("too_deep")
        );
    }

    #[test]
    fn reads_event_time_as_epoch_ms_or_rfc3339_and_refuses_anything_else() {
        let d = Decoder::new("/user", 1024, 16).with_timestamp(Some("/ts"));
        let ts = |p: &[u8]| {
            d.decode(Some(p))
                .map(|e| e.timestamp_ms)
                .map_err(|e| e.reason())
        };
        assert_eq!(
            ts(br#"{"user":"u","ts":1700000000123}"#),
            Ok(Some(1_700_000_000_123))
        );
        assert_eq!(
            ts(br#"{"user":"u","ts":"2023-11-14T22:13:20.123Z"}"#),
            Ok(Some(1_700_000_000_123))
        );
        assert_eq!(ts(br#"{"user":"u"}"#), Err("missing_timestamp"));
        assert_eq!(ts(br#"{"user":"u","ts":-5}"#), Err("bad_timestamp"));
        assert_eq!(
            ts(br#"{"user":"u","ts":"yesterday"}"#),
            Err("bad_timestamp")
        );
        assert_eq!(ts(br#"{"user":"u","ts":[1]}"#), Err("bad_timestamp"));
    }

    #[test]
    fn event_times_further_than_the_skew_from_now_are_out_of_range() {
        let day = std::time::Duration::from_secs(86_400);
        let d = Decoder::new("/user", 1024, 16)
            .with_timestamp(Some("/ts"))
            .with_max_skew(Some(day));
        let now = 1_700_000_000_000u64;
        let ts = |t: u64| {
            d.decode_at(Some(format!(r#"{{"user":"u","ts":{t}}}"#).as_bytes()), now)
                .map(|e| e.timestamp_ms)
                .map_err(|e| e.reason())
        };
        assert_eq!(ts(now - 3_600_000), Ok(Some(now - 3_600_000)));
        assert_eq!(
            ts(now + 86_400_000),
            Ok(Some(now + 86_400_000)),
            "exactly the skew is in range"
        );
        assert_eq!(ts(now + 86_400_001), Err("event_time_out_of_range"));
        assert_eq!(ts(0), Err("event_time_out_of_range"));
        assert_eq!(ts(u64::MAX), Err("event_time_out_of_range"));
        let year_3000 = d
            .decode_at(Some(br#"{"user":"u","ts":"3000-01-01T00:00:00Z"}"#), now)
            .map_err(|e| e.reason());
        assert_eq!(year_3000, Err("event_time_out_of_range"));
        // Unset: no bound.
        let free = Decoder::new("/user", 1024, 16).with_timestamp(Some("/ts"));
        assert!(free.decode_at(Some(br#"{"user":"u","ts":0}"#), now).is_ok());
    }

    #[test]
    fn brackets_inside_strings_do_not_count_as_nesting() {
        let text = format!(r#"{{"user":"u","s":"{}"}}"#, "[".repeat(500));
        assert_eq!(nesting_depth(&text), 1);
        assert_eq!(
            opening_brackets(text.as_bytes()),
            501,
            "so the exact scan ran"
        );
        assert!(
            Decoder::new("/user", 1 << 20, 16)
                .decode(Some(text.as_bytes()))
                .is_ok()
        );
    }
}
