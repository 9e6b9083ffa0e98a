//! Test aid (feature `testing`): what a power loss would leave of the log.
//!
//! With `RAFTMQ_TRACK_DURABLE=1` in its environment, the flusher records next to each segment the
//! length known to be on disk after each fsync. [`simulate_power_loss`] then drops, from the files
//! of a stopped member, every byte past the recorded length. Builds without the feature (release
//! binaries) neither read the switch nor write the records.
//!
//! The record, `<segment>.durable`: 8 bytes, the durable length of `<segment>.log` as a
//! little-endian `u64`. It is written whole or not at all (a temporary file, then a rename), so a
//! kill mid-write never leaves it empty. A missing or malformed record means nothing of the
//! segment is known to be durable.
//!
//! A tracking member also leaves an empty `durable-tracking` file in its log directory when it
//! opens the log. [`simulate_power_loss`] refuses a directory without it: there the missing
//! records would mean "nothing is durable" and wipe the log, when in truth nobody recorded
//! anything (the switch was not set, or the binary was built without the `testing` feature).

use std::io;
use std::path::Path;

/// `RAFTMQ_TRACK_DURABLE=1`: record durable lengths (a small write per fsync). Read once.
static TRACK_DURABLE: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("RAFTMQ_TRACK_DURABLE").is_some_and(|v| v == "1"));

/// The file whose presence says the log in a directory was opened with tracking on.
const TRACKING_MARKER: &str = "durable-tracking";

/// Marks `log_dir` as tracked, if tracking is on.
pub(super) fn note_tracking(log_dir: &Path) -> io::Result<()> {
    if *TRACK_DURABLE {
        std::fs::write(log_dir.join(TRACKING_MARKER), b"")?;
    }
    Ok(())
}

/// The length to record once a segment is synced: its length of records `len` when the sync was
/// asked for (not its file's, which may be preallocated past them), so not more than the sync
/// covered; None when tracking is off.
pub(super) fn length_to_record(len: u64) -> Option<u64> {
    TRACK_DURABLE.then_some(len)
}

/// Records `len` as the durable length of the segment at `segment`.
pub(super) fn record_durable(segment: &Path, len: u64) -> io::Result<()> {
    let tmp = segment.with_extension("durable.tmp");
    std::fs::write(&tmp, len.to_le_bytes())?;
    std::fs::rename(&tmp, segment.with_extension("durable"))
}

/// Drops from every segment under `log_dir` what the flusher had not recorded as durable (see
/// `RAFTMQ_TRACK_DURABLE`): the state a power loss would leave. For tests of a stopped node.
/// Returns the bytes dropped; an error, changing nothing, if the log was not opened with tracking
/// on.
pub fn simulate_power_loss(log_dir: &Path) -> io::Result<u64> {
    if !log_dir.join(TRACKING_MARKER).exists() {
        return Err(io::Error::other(format!(
            "{} holds no record of durable lengths: run the member with RAFTMQ_TRACK_DURABLE=1, \
             built with raftmq-raft-log's `testing` feature",
            log_dir.display()
        )));
    }
    let mut dropped = 0;
    for e in std::fs::read_dir(log_dir)? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "log") {
            let durable = match std::fs::read(path.with_extension("durable")) {
                Ok(b) if b.len() == 8 => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                _ => 0,
            };
            let len = std::fs::metadata(&path)?.len();
            if len > durable {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)?
                    .set_len(durable)?;
                dropped += len - durable;
            }
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t01_power_loss_keeps_what_was_recorded_durable() {
        let dir = tempfile::tempdir().unwrap();
        let synced = dir.path().join("00000000000000000001.log");
        let unsynced = dir.path().join("00000000000000000009.log");
        let torn = dir.path().join("00000000000000000020.log");
        std::fs::write(&synced, [7u8; 100]).unwrap();
        record_durable(&synced, 60).unwrap();
        // No record at all: nothing of it is known to be durable.
        std::fs::write(&unsynced, [7u8; 30]).unwrap();
        // A record of the wrong length is not trusted either.
        std::fs::write(&torn, [7u8; 10]).unwrap();
        std::fs::write(torn.with_extension("durable"), [1u8; 3]).unwrap();
        // Not a segment: left alone.
        std::fs::write(dir.path().join("other"), [7u8; 5]).unwrap();
        // Without the marker of a tracking member, nothing is touched.
        let err = simulate_power_loss(dir.path()).unwrap_err();
        assert!(err.to_string().contains("RAFTMQ_TRACK_DURABLE"), "{err}");
        assert_eq!(std::fs::metadata(&synced).unwrap().len(), 100);
        std::fs::write(dir.path().join(TRACKING_MARKER), b"").unwrap();

        assert_eq!(simulate_power_loss(dir.path()).unwrap(), 40 + 30 + 10);
        let len = |p: &Path| std::fs::metadata(p).unwrap().len();
        assert_eq!(len(&synced), 60);
        assert_eq!(len(&unsynced), 0);
        assert_eq!(len(&torn), 0);
        assert_eq!(len(&dir.path().join("other")), 5);
        assert!(!synced.with_extension("durable.tmp").exists());
        // A second power loss drops nothing more.
        assert_eq!(simulate_power_loss(dir.path()).unwrap(), 0);
    }
}
