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

use bytes::Bytes;
use postcard::ser_flavors::Flavor;

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

/// Appends one encoded record to `out`: the plain encoding, the reference [`Records`] is tested
/// against (writes go through `Records`).
#[cfg(test)]
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

/// A normal entry's bytes at least this long are written from where they are (see [`Records`]);
/// shorter ones are copied with the record's other bytes: a copy of a few KiB costs less than a
/// piece more in the write (an entry of one 1 KiB message, spliced, made one at a time ~3 %
/// slower, within the noise but in three of four pairs).
pub const SPLICE_BYTES_MIN: usize = 16 << 10;

/// The records of one write, encoded as [`encode`] does, with each normal entry's bytes (of at
/// least [`SPLICE_BYTES_MIN`]) left where they are: `head` holds every other byte, and the write
/// gathers the pieces ([`Records::slices`]). A write of a batch no longer copies its entries into
/// one buffer first (a fresh one per write, as large as the batch).
#[derive(Default)]
pub struct Records {
    head: Vec<u8>,
    /// Each payload and where it goes: before `head[at..]`, after the pieces before it.
    spliced: Vec<(usize, Bytes)>,
    /// The records' whole length: `head` and the spliced bytes.
    len: usize,
}

impl Records {
    /// Empty, with room for `head` bytes besides the spliced ones.
    pub fn with_capacity(head: usize) -> Records {
        Records {
            head: Vec::with_capacity(head),
            ..Default::default()
        }
    }

    /// The records' length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.head.clear();
        self.spliced.clear();
        self.len = 0;
    }

    /// Appends one record (the bytes [`encode`] appends). On an error nothing is appended.
    pub fn push(&mut self, log_id: &LogId, payload: &EntryPayload) -> std::io::Result<()> {
        let start = self.head.len();
        let spliced_before = self.spliced.len();
        let mut header = [0u8; HEADER_BYTES];
        header[8..16].copy_from_slice(&log_id.index.to_le_bytes());
        header[16..24].copy_from_slice(&log_id.leader_id.term.to_le_bytes());
        header[24..32].copy_from_slice(&log_id.leader_id.node_id.to_le_bytes());
        self.head.extend_from_slice(&header);
        let flavor = Splice {
            head: &mut self.head,
            spliced: &mut self.spliced,
            big: spliced(payload),
        };
        let done = postcard::serialize_with_flavor(payload, flavor)
            .map_err(std::io::Error::other)
            .and_then(|()| {
                let spliced: usize = self.spliced[spliced_before..]
                    .iter()
                    .map(|(_, b)| b.len())
                    .sum();
                let payload_len = self.head.len() - start - HEADER_BYTES + spliced;
                if payload_len as u64 > PAYLOAD_BYTES_MAX as u64 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!(
                            "log entry of {payload_len} bytes exceeds the {PAYLOAD_BYTES_MAX}-byte record limit"
                        ),
                    ));
                }
                Ok(payload_len)
            });
        let payload_len = match done {
            Ok(n) => n,
            Err(e) => {
                self.head.truncate(start);
                self.spliced.truncate(spliced_before);
                return Err(e);
            }
        };
        self.head[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        let mut from = start + 8;
        for (at, b) in &self.spliced[spliced_before..] {
            h.update(&self.head[from..*at]);
            h.update(b);
            from = *at;
        }
        h.update(&self.head[from..]);
        self.head[start + 4..start + 8].copy_from_slice(&h.finalize().to_le_bytes());
        self.len += HEADER_BYTES + payload_len;
        Ok(())
    }

    /// The records' bytes in order, as pieces to write together.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        let mut from = 0;
        self.spliced
            .iter()
            .flat_map(move |(at, b)| {
                let before = &self.head[from..*at];
                from = *at;
                [before, &b[..]]
            })
            .chain(std::iter::once_with(move || {
                let last = self.spliced.last().map_or(0, |(at, _)| *at);
                &self.head[last..]
            }))
            .filter(|s| !s.is_empty())
    }
}

/// The bytes of `payload` that [`Records`] writes from where they lie: a normal entry's of at least
/// [`SPLICE_BYTES_MIN`].
fn spliced(payload: &EntryPayload) -> Option<&Bytes> {
    match payload {
        EntryPayload::Normal(p) if p.0.len() >= SPLICE_BYTES_MIN => Some(&p.0),
        _ => None,
    }
}

/// About how many bytes of [`Records`]' own buffer a record of `payload` takes (its header and
/// what is not spliced), to size the buffer ahead.
pub fn head_bytes_hint(payload: &EntryPayload) -> usize {
    let rest = match payload {
        EntryPayload::Normal(p) if spliced(payload).is_none() => p.0.len(),
        EntryPayload::Normal(_) => 0,
        _ => 256,
    };
    HEADER_BYTES + 16 + rest
}

/// postcard writing into a record's head, leaving one byte string (the entry's payload) out.
struct Splice<'a> {
    head: &'a mut Vec<u8>,
    spliced: &'a mut Vec<(usize, Bytes)>,
    big: Option<&'a Bytes>,
}

impl Flavor for Splice<'_> {
    type Output = ();

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        match self.big {
            Some(b) if data.as_ptr() == b.as_ptr() && data.len() == b.len() => {
                self.spliced.push((self.head.len(), b.clone()));
                self.big = None;
            }
            _ => self.head.extend_from_slice(data),
        }
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.head.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

pub fn decode_payload(payload: &[u8]) -> std::io::Result<EntryPayload> {
    postcard::from_bytes(payload)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// [`decode_payload`] of `payload`, a slice of `buf`: the entry's bytes are a slice of `buf`
/// (no copy).
pub fn decode_payload_in(buf: &bytes::Bytes, payload: &[u8]) -> std::io::Result<EntryPayload> {
    crate::encoding::decode_shared(&buf.slice_ref(payload))
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

    fn normal(len: usize, fill: u8) -> EntryPayload {
        EntryPayload::Normal(Payload(vec![fill; len].into()))
    }

    /// `Records` writes `encode`'s bytes, a large payload written from where it lies, and an entry
    /// it refuses leaves the records as they were.
    #[test]
    fn records_hold_the_bytes_encode_writes_without_copying_large_payloads() {
        let entries = [
            EntryPayload::Blank,
            normal(SPLICE_BYTES_MIN - 1, 1),
            normal(SPLICE_BYTES_MIN, 2),
            normal(300_000, 3),
            EntryPayload::Membership(crate::golden::membership(&[1, 2])),
            normal(5, 4),
            normal(70_000, 5),
        ];
        let mut plain = Vec::new();
        let mut records = Records::with_capacity(0);
        for (i, p) in entries.iter().enumerate() {
            let id = crate::types::log_id(4, 1, 100 + i as u64);
            encode(&mut plain, &id, p).unwrap();
            records.push(&id, p).unwrap();
            assert_eq!(records.len(), plain.len(), "after entry {i}");
        }
        let pieces: Vec<&[u8]> = records.slices().collect();
        assert_eq!(pieces.concat(), plain);
        // The three large payloads are pieces of their own, the entries' own bytes.
        let large: Vec<&Bytes> = entries
            .iter()
            .filter_map(|p| match p {
                EntryPayload::Normal(p) if p.0.len() >= SPLICE_BYTES_MIN => Some(&p.0),
                _ => None,
            })
            .collect();
        assert_eq!(large.len(), 3);
        for b in large {
            assert!(
                pieces
                    .iter()
                    .any(|s| s.as_ptr() == b.as_ptr() && s.len() == b.len())
            );
        }
        // Too large an entry: refused, and the records are unchanged.
        let err = records
            .push(
                &crate::types::log_id(4, 1, 200),
                &normal(PAYLOAD_BYTES_MAX as usize, 6),
            )
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        assert_eq!(records.len(), plain.len());
        assert_eq!(records.slices().collect::<Vec<_>>().concat(), plain);
        records.clear();
        assert!(records.is_empty());
        assert_eq!(records.slices().count(), 0);
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
            let mut records = Records::default();
            records.push(&id, &payload).unwrap();
            assert_eq!(hex(&records.slices().collect::<Vec<_>>().concat()), golden);
            let h = Header::parse(buf[..HEADER_BYTES].try_into().unwrap());
            assert_eq!(h.log_id(), id);
            assert_eq!(h.record_len() as usize, buf.len());
            assert_eq!(h.crc, checksum(&buf[8..HEADER_BYTES], &buf[HEADER_BYTES..]));
            assert_eq!(decode_payload(&buf[HEADER_BYTES..]).unwrap(), payload);
        }
    }
}
