//! The Confluent wire format: byte 0 (the "magic byte"), the schema id as 4 bytes
//! big-endian, then the payload (for Protobuf, message indexes first).

use crate::decode::DecodeError;

pub const MAGIC: u8 = 0;
pub const HEADER_BYTES: usize = 5;

/// The schema id and the rest of the record.
pub fn split(payload: &[u8]) -> Result<(u32, &[u8]), DecodeError> {
    match payload.first() {
        None => return Err(DecodeError::Empty),
        Some(&MAGIC) => {}
        Some(&b) => return Err(DecodeError::BadMagicByte(b)),
    }
    if payload.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated(format!(
            "{} bytes, shorter than the wire format's 5-byte header",
            payload.len()
        )));
    }
    let id = u32::from_be_bytes([payload[1], payload[2], payload[3], payload[4]]);
    Ok((id, &payload[HEADER_BYTES..]))
}

/// The 5-byte header naming `id`.
pub fn header(id: u32) -> [u8; HEADER_BYTES] {
    let b = id.to_be_bytes();
    [MAGIC, b[0], b[1], b[2], b[3]]
}

/// A zig-zag varint (Protobuf's message indexes); advances `buf`.
pub fn read_zigzag(buf: &mut &[u8]) -> Result<i64, DecodeError> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let Some((&b, rest)) = buf.split_first() else {
            return Err(DecodeError::Truncated(
                "the message indexes end early".into(),
            ));
        };
        *buf = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(DecodeError::InvalidProtobuf(
        "a message index varint is longer than 10 bytes".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_header_and_names_what_is_wrong() {
        assert_eq!(split(&[0, 0, 0, 1, 2, 9, 9]), Ok((258, &[9u8, 9][..])));
        assert_eq!(split(&[0, 0, 0, 0, 7]), Ok((7, &[][..])));
        assert_eq!(split(&[]), Err(DecodeError::Empty));
        assert_eq!(
            split(b"{\"a\":1}").map_err(|e| e.reason()),
            Err("bad_magic_byte")
        );
        assert_eq!(split(&[0, 0, 1]).map_err(|e| e.reason()), Err("truncated"));
        assert_eq!(header(258), [0, 0, 0, 1, 2]);
    }

    #[test]
    fn reads_zigzag_varints() {
        let mut b: &[u8] = &[0x00, 0x02, 0x03, 0xac, 0x02];
        assert_eq!(read_zigzag(&mut b), Ok(0));
        assert_eq!(read_zigzag(&mut b), Ok(1));
        assert_eq!(read_zigzag(&mut b), Ok(-2));
        assert_eq!(read_zigzag(&mut b), Ok(150));
        assert!(b.is_empty());
        let mut cut: &[u8] = &[0x80];
        assert_eq!(
            read_zigzag(&mut cut).map_err(|e| e.reason()),
            Err("truncated")
        );
    }
}
