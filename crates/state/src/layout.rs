//! The byte layout shared by every backend and by the savepoint format, so
//! that a snapshot from one backend is readable by the other and a key-group
//! range is one contiguous scan.
//!
//! Storage key: `[key group: u16 BE][state id: u16 BE][varint len][key]
//! [varint len][namespace]` followed, for map state, by the postcard bytes of
//! the user key. Lengths make every prefix unambiguous.
//!
//! Timer key: `[key group: u16 BE][TIMER_EVENT|TIMER_PROCESSING: u16 BE]
//! [timestamp: u64 BE][varint len][key][varint len][namespace]`, value empty,
//! so timers of a key group sort by time.
//!
//! List value: a concatenation of `[varint len][element]`, so appending is a
//! byte concatenation (RocksDB merge operator) and never needs a read.
//!
//! Varints are unsigned LEB128. Values are postcard 1.x (a stable, documented
//! wire format), prefixed by an 8-byte little-endian timestamp when the state
//! has a TTL.

use crate::error::{Result, StateError};

pub(crate) const TIMER_EVENT: u16 = 0xFFFF;
pub(crate) const TIMER_PROCESSING: u16 = 0xFFFE;
/// Ids at or above this are reserved for internal tables.
pub(crate) const FIRST_RESERVED_ID: u16 = 0xFF00;

#[inline]
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Returns (value, bytes consumed).
#[inline]
pub(crate) fn get_varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    for (i, b) in buf.iter().enumerate().take(10) {
        v |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

#[inline]
pub(crate) fn encode_prefix(out: &mut Vec<u8>, kg: u32, state: u16, key: &[u8], ns: &[u8]) {
    out.clear();
    out.extend_from_slice(&(kg as u16).to_be_bytes());
    out.extend_from_slice(&state.to_be_bytes());
    put_varint(out, key.len() as u64);
    out.extend_from_slice(key);
    put_varint(out, ns.len() as u64);
    out.extend_from_slice(ns);
}

pub(crate) fn encode_timer(
    out: &mut Vec<u8>,
    kg: u32,
    domain: u16,
    ts: u64,
    key: &[u8],
    ns: &[u8],
) {
    out.clear();
    out.extend_from_slice(&(kg as u16).to_be_bytes());
    out.extend_from_slice(&domain.to_be_bytes());
    out.extend_from_slice(&ts.to_be_bytes());
    put_varint(out, key.len() as u64);
    out.extend_from_slice(key);
    put_varint(out, ns.len() as u64);
    out.extend_from_slice(ns);
}

/// Parsed storage key (without the map user key, if any).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct KeyParts<'a> {
    pub kg: u32,
    pub state: u16,
    pub ts: Option<u64>,
    pub key: &'a [u8],
    pub ns: &'a [u8],
    /// What follows the namespace: the map user key, empty otherwise.
    pub rest: &'a [u8],
}

pub(crate) fn decode_key(buf: &[u8]) -> Result<KeyParts<'_>> {
    let bad = || StateError::Invalid(format!("malformed storage key {}", hex::encode(buf)));
    if buf.len() < 4 {
        return Err(bad());
    }
    let kg = u16::from_be_bytes([buf[0], buf[1]]) as u32;
    let state = u16::from_be_bytes([buf[2], buf[3]]);
    let mut pos = 4;
    let mut ts = None;
    if state == TIMER_EVENT || state == TIMER_PROCESSING {
        let b = buf.get(4..12).ok_or_else(bad)?;
        ts = Some(u64::from_be_bytes(b.try_into().map_err(|_| bad())?));
        pos = 12;
    }
    let (klen, n) = get_varint(&buf[pos..]).ok_or_else(bad)?;
    pos += n;
    let key = buf.get(pos..pos + klen as usize).ok_or_else(bad)?;
    pos += klen as usize;
    let (nlen, n) = get_varint(buf.get(pos..).ok_or_else(bad)?).ok_or_else(bad)?;
    pos += n;
    let ns = buf.get(pos..pos + nlen as usize).ok_or_else(bad)?;
    let rest = &buf[pos + nlen as usize..];
    Ok(KeyParts {
        kg,
        state,
        ts,
        key,
        ns,
        rest,
    })
}

/// First key strictly after every key that starts with `prefix`.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0xFF; prefix.len() + 1]
}

/// Start and end (exclusive) of a key-group range in storage-key space.
pub(crate) fn key_group_bounds(start: u32, end: u32) -> (Vec<u8>, Vec<u8>) {
    let s = (start as u16).to_be_bytes().to_vec();
    let e = if end + 1 > u16::MAX as u32 {
        vec![0xFF, 0xFF, 0xFF]
    } else {
        ((end + 1) as u16).to_be_bytes().to_vec()
    };
    (s, e)
}

pub(crate) fn append_list_element(out: &mut Vec<u8>, element: &[u8]) {
    put_varint(out, element.len() as u64);
    out.extend_from_slice(element);
}

/// Splits a stored list into its elements.
pub(crate) fn list_elements(buf: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let (len, n) = get_varint(&buf[pos..])
            .ok_or_else(|| StateError::Invalid("malformed list value".into()))?;
        pos += n;
        let e = buf
            .get(pos..pos + len as usize)
            .ok_or_else(|| StateError::Invalid("truncated list value".into()))?;
        out.push(e);
        pos += len as usize;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_keys_round_trip_and_sort_by_key_group_first() {
        let mut a = Vec::new();
        encode_prefix(&mut a, 3, 9, b"zzz", b"");
        let mut b = Vec::new();
        encode_prefix(&mut b, 4, 1, b"a", b"ns");
        assert!(a < b);
        let p = decode_key(&b).unwrap();
        assert_eq!((p.kg, p.state, p.key, p.ns), (4, 1, &b"a"[..], &b"ns"[..]));
        let mut t = Vec::new();
        encode_timer(&mut t, 7, TIMER_EVENT, 42, b"k", b"w");
        let p = decode_key(&t).unwrap();
        assert_eq!(
            (p.kg, p.state, p.ts, p.key, p.ns),
            (7, TIMER_EVENT, Some(42), &b"k"[..], &b"w"[..])
        );
    }

    #[test]
    fn prefix_end_is_exclusive_upper_bound() {
        assert_eq!(prefix_end(&[1, 2]), vec![1, 3]);
        assert_eq!(prefix_end(&[1, 0xFF]), vec![2]);
    }

    #[test]
    fn list_elements_detect_truncation() {
        let mut buf = Vec::new();
        append_list_element(&mut buf, b"hello");
        append_list_element(&mut buf, b"");
        assert_eq!(list_elements(&buf).unwrap(), vec![&b"hello"[..], &b""[..]]);
        assert!(list_elements(&buf[..3]).is_err());
    }
}
