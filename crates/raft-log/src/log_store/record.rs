//! The on-disk record format of the log, one record per Raft entry.
//!
//! A segment file (`{first_index:020}.log`) is a sequence of records, all little endian:
//!
//! | offset | size | field                                                             |
//! |--------|------|-------------------------------------------------------------------|
//! | 0      | 4    | `payload_len`: length of the payload in bytes                     |
//! | 4      | 4    | `crc`: CRC-32 (IEEE) of bytes 8 .. 32 + payload_len               |
//! | 8      | 8    | `index`: the Raft log index; dense and increasing within a file   |
//! | 16     | 8    | `term`: the term of the leader that proposed the entry            |
//! | 24     | 8    | `node_id`: the id of that leader (openraft's advanced leader id)  |
//! | 32     | len  | `payload`: the entry payload (blank, normal, membership), postcard |
//!
//! A record is valid when its header fits in the file, `payload_len` is at most
//! [`PAYLOAD_BYTES_MAX`], the whole payload fits in the file and the CRC matches. Recovery keeps the
//! longest valid prefix of dense records and cuts the file there (a torn tail from a crash).
//!
//! ## Format version
//!
//! This is version 1 of the data dir's format, recorded in the metadata store
//! (`meta.rs`, key `format_version`). A record has no version field of its own: a reader that
//! cannot parse a record takes it for a torn tail and cuts the log there, so a record in an unknown
//! layout would be lost, not refused. A new layout (or payload encoding) takes a new data-dir
//! version, which a build that does not know it refuses before reading any segment.
//!
//! The payload is openraft's `EntryPayload` in postcard: a varint tag (0 blank, 1 normal,
//! 2 membership) then its fields; a normal entry's data is the application's bytes as a
//! length-prefixed byte string. That enum's variant order is openraft's, and it is our tag on
//! disk: the golden test below fails if an openraft upgrade moves it.

use crate::types::{EntryPayload, LogId};

pub const HEADER_BYTES: usize = 32;
/// An upper bound on one entry: a batch is at most 4 MiB of bodies plus framing, so 64 MiB leaves
/// room and still rejects a garbage length at once.
pub const PAYLOAD_BYTES_MAX: u32 = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub payload_len: u32,
    pub crc: u32,
    pub index: u64,
    pub term: u64,
    pub node_id: u64,
}

impl Header {
    pub fn parse(b: &[u8; HEADER_BYTES]) -> Header {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Header {
            payload_len: u32_at(0),
            crc: u32_at(4),
            index: u64_at(8),
            term: u64_at(16),
            node_id: u64_at(24),
        }
    }

    pub fn log_id(&self) -> LogId {
        crate::types::log_id(self.term, self.node_id, self.index)
    }

    pub fn record_len(&self) -> u64 {
        HEADER_BYTES as u64 + self.payload_len as u64
    }
}

/// CRC over the header fields after the CRC itself, then the payload.
pub fn checksum(header_tail: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(header_tail);
    h.update(payload);
    h.finalize()
}

/// Appends one encoded record to `out`.
pub fn encode(out: &mut Vec<u8>, log_id: &LogId, payload: &EntryPayload) -> std::io::Result<()> {
    let start = out.len();
    out.extend_from_slice(&[0u8; HEADER_BYTES]);
    out[start + 8..start + 16].copy_from_slice(&log_id.index.to_le_bytes());
    out[start + 16..start + 24].copy_from_slice(&log_id.leader_id.term.to_le_bytes());
    out[start + 24..start + 32].copy_from_slice(&log_id.leader_id.node_id.to_le_bytes());
    let out_len_before_payload = out.len();
    let mut buf = std::mem::take(out);
    buf = crate::encoding::postcard_extend(payload, buf).map_err(std::io::Error::other)?;
    *out = buf;
    let payload_len = out.len() - out_len_before_payload;
    if payload_len as u64 > PAYLOAD_BYTES_MAX as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "log entry of {payload_len} bytes exceeds the {PAYLOAD_BYTES_MAX}-byte record limit"
            ),
        ));
    }
    out[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    let crc = checksum(
        &out[start + 8..start + HEADER_BYTES],
        &out[start + HEADER_BYTES..],
    );
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

pub fn decode_payload(payload: &[u8]) -> std::io::Result<EntryPayload> {
    postcard::from_bytes(payload)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Payload;

    #[test]
    fn encode_then_parse_round_trips_and_crc_detects_a_flipped_bit() {
        let mut buf = Vec::new();
        let id = crate::types::log_id(3, 2, 17);
        let p = EntryPayload::Normal(Payload(bytes::Bytes::from_static(b"hello")));
        encode(&mut buf, &id, &p).unwrap();
        let h = Header::parse(buf[..HEADER_BYTES].try_into().unwrap());
        assert_eq!(h.log_id(), id);
        assert_eq!(h.record_len() as usize, buf.len());
        assert_eq!(h.crc, checksum(&buf[8..HEADER_BYTES], &buf[HEADER_BYTES..]));
        assert_eq!(decode_payload(&buf[HEADER_BYTES..]).unwrap(), p);
        buf[HEADER_BYTES + 1] ^= 0x10;
        assert_ne!(h.crc, checksum(&buf[8..HEADER_BYTES], &buf[HEADER_BYTES..]));
    }
}

/// Golden bytes: today's record layout and entry payload encoding, frozen as hex literals taken
/// from the code before format versions were added. A failure means segments already on disk would
/// no longer read: never update a literal; a new layout takes a new data-dir format version.
#[cfg(test)]
mod golden {
    use super::*;
    use crate::golden::hex;
    use crate::types::Payload;

    fn membership() -> openraft::Membership<u64, openraft::BasicNode> {
        crate::golden::membership(&[1, 2])
    }

    /// One record of each payload kind (openraft's `EntryPayload`: its variant order is our tag on
    /// disk, so an openraft upgrade that moved it would fail here).
    fn records() -> Vec<(LogId, EntryPayload, &'static str)> {
        vec![
            (
                crate::types::log_id(2, 1, 17),
                EntryPayload::Blank,
                "010000006b3d14d711000000000000000200000000000000010000000000000000",
            ),
            (
                crate::types::log_id(3, 2, 18),
                EntryPayload::Normal(Payload(bytes::Bytes::from_static(b"hello"))),
                "0700000032b35342120000000000000003000000000000000200000000000000010568656c6c6f",
            ),
            (
                crate::types::log_id(3, 2, 19),
                EntryPayload::Membership(membership()),
                "360000006fb7c48f130000000000000003000000000000000200000000000000020102010203010e3132372e302e302e313a39303031020e3132372e302e302e313a39303032030e3132372e302e302e313a39303033",
            ),
        ]
    }

    #[test]
    fn every_payload_kind_encodes_to_its_golden_record_and_back() {
        for (id, payload, _) in records() {
            let mut buf = Vec::new();
            encode(&mut buf, &id, &payload).unwrap();
            println!("{payload:?}\n  {}", hex(&buf));
        }
        for (id, payload, golden) in records() {
            let mut buf = Vec::new();
            encode(&mut buf, &id, &payload).unwrap();
            assert_eq!(hex(&buf), golden, "{payload:?}");
            let h = Header::parse(buf[..HEADER_BYTES].try_into().unwrap());
            assert_eq!(h.log_id(), id);
            assert_eq!(h.record_len() as usize, buf.len());
            assert_eq!(h.crc, checksum(&buf[8..HEADER_BYTES], &buf[HEADER_BYTES..]));
            assert_eq!(decode_payload(&buf[HEADER_BYTES..]).unwrap(), payload);
        }
    }
}
