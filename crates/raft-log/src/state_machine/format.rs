//! Format versions of what raftmq writes to disk or sends between nodes, and the one check that
//! stops a node meeting a version newer than it knows.
//!
//! Every format below is **version 1 today, and version 1 is exactly the bytes the builds before
//! versioning wrote**: nothing already on a disk changes, and a data dir or a snapshot made by an
//! earlier build reads as version 1.
//!
//! | what                                   | where the version lives                            |
//! |----------------------------------------|----------------------------------------------------|
//! | data dir: log records, entry payloads, metadata values | sled key `format_version` (`log_store::meta`) |
//! | snapshot file `sm/snapshot.bin`        | absent = 1; later versions begin with [`ENVELOPE_MAGIC`] |
//! | broker state inside a snapshot         | absent = 1; later versions begin with [`ENVELOPE_MAGIC`] |
//! | replicated commands                    | absent = 1; a new command is a new enum tag; a wholesale change begins with [`ENVELOPE_MAGIC`] |
//!
//! ## The envelope of a later version
//!
//! ```text
//! offset  size  field
//! 0       10    ENVELOPE_MAGIC: ten 0xFF bytes
//! 10      4     version: u32, little endian, >= 2
//! 14      ...   the body, in that version's encoding
//! ```
//!
//! No version-1 value starts with those ten bytes: each is a postcard value whose first field is a
//! varint (a collection length, an enum tag) or an `Option` tag, and ten 0xFF bytes are an
//! over-long varint and an invalid `Option` tag, which postcard refuses. So a build that predates
//! a version fails to decode its envelope instead of misreading it, and a build that knows the
//! envelope stops with [`NewerFormat`]'s message. Version 1 is never written inside an envelope,
//! so that a mixed cluster during a rolling upgrade (or a rollback) keeps reading what the newer
//! build writes until the cluster is told to move on.

use std::fmt;

/// Ten 0xFF bytes: the start of a versioned envelope (see the module doc).
pub const ENVELOPE_MAGIC: [u8; 10] = [0xFF; 10];
/// Bytes before an envelope's body.
pub const ENVELOPE_HEADER_BYTES: usize = ENVELOPE_MAGIC.len() + 4;

/// Something was written by a newer format than this build reads. The node must stop: reading on
/// would misread it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewerFormat {
    /// What was read, with its place: "data dir d1", "snapshot file d1/sm/snapshot.bin".
    pub what: String,
    pub found: u32,
    pub known: u32,
}

impl fmt::Display for NewerFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} was written by format version {}; this broker-node reads up to version {}: \
             upgrade the binary",
            self.what, self.found, self.known
        )
    }
}

impl std::error::Error for NewerFormat {}

impl From<NewerFormat> for std::io::Error {
    fn from(e: NewerFormat) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }
}

/// The format version of `bytes` and its body: an envelope's version and what follows it, or 1
/// and the whole input when there is no envelope (the encoding every earlier build wrote). A
/// version above `known` is an error naming `what`.
pub fn versioned(
    what: impl FnOnce() -> String,
    bytes: &[u8],
    known: u32,
) -> Result<(u32, &[u8]), NewerFormat> {
    let Some(rest) = bytes.strip_prefix(&ENVELOPE_MAGIC[..]) else {
        return Ok((1, bytes));
    };
    // A truncated envelope still says it is not version 1.
    let found = rest
        .get(..4)
        .map(|v| u32::from_le_bytes(v.try_into().expect("4 bytes")))
        .unwrap_or(u32::MAX);
    if found > known || found < 2 {
        return Err(NewerFormat {
            what: what(),
            found,
            known,
        });
    }
    Ok((found, &rest[4..]))
}

/// An empty envelope of `version` (>= 2), with room for `body_capacity` bytes of body: append the
/// body to it. The same bytes as [`envelope`], without building the body apart and copying it.
pub fn envelope_to_fill(version: u32, body_capacity: usize) -> Vec<u8> {
    envelope_to_fill_in(Vec::new(), version, body_capacity)
}

/// As [`envelope_to_fill`], in `buf` (cleared first): a buffer kept from before keeps its pages.
pub fn envelope_to_fill_in(mut buf: Vec<u8>, version: u32, body_capacity: usize) -> Vec<u8> {
    debug_assert!(version >= 2, "version 1 is written bare");
    buf.clear();
    buf.reserve(ENVELOPE_HEADER_BYTES + body_capacity);
    buf.extend_from_slice(&ENVELOPE_MAGIC);
    buf.extend_from_slice(&version.to_le_bytes());
    buf
}

/// Wraps `body` in the envelope of `version` (>= 2).
pub fn envelope(version: u32, body: &[u8]) -> Vec<u8> {
    debug_assert!(version >= 2, "version 1 is written bare");
    let mut out = envelope_to_fill(version, body.len());
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_bytes_are_version_1_and_a_newer_envelope_is_refused_by_name() {
        assert_eq!(
            versioned(|| "x".into(), b"\x01\x02", 1),
            Ok((1, &b"\x01\x02"[..]))
        );
        let e = versioned(
            || "snapshot file d/sm/snapshot.bin".into(),
            &envelope(3, b"z"),
            1,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "snapshot file d/sm/snapshot.bin was written by format version 3; this broker-node \
             reads up to version 1: upgrade the binary"
        );
        assert_eq!(
            versioned(|| "x".into(), &envelope(2, b"z"), 2),
            Ok((2, &b"z"[..]))
        );
        // Torn after the magic: still not something to read as version 1.
        assert!(versioned(|| "x".into(), &ENVELOPE_MAGIC, 1).is_err());
    }

    /// The magic can never begin a version-1 postcard value: the decoders of earlier builds refuse
    /// an envelope rather than misread it.
    #[test]
    fn no_version_1_decoder_accepts_an_envelope() {
        let e = envelope(2, &[0; 64]);
        assert!(postcard::from_bytes::<u32>(&e).is_err(), "an enum tag");
        assert!(
            postcard::from_bytes::<u64>(&e).is_err(),
            "a collection length"
        );
        assert!(postcard::from_bytes::<Vec<u8>>(&e).is_err(), "a collection");
        assert!(postcard::from_bytes::<Option<u8>>(&e).is_err(), "an option");
        assert!(postcard::from_bytes::<String>(&e).is_err(), "a string");
    }
}
