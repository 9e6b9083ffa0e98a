//! Restart images: what apply built, persisted as it goes, so a restarted member loads it instead
//! of re-applying its whole retained log (DESIGN.md "Storage"; issue 20: restart cost independent
//! of retained data).
//!
//! Every `raft.restart_image_bytes` of applied payload, the adapter asks the state machine for an
//! image ([`StateMachine::restart_image`]): its whole small state plus what apply built for the
//! entries after the previous image (the broker's consume-queue runs, tag and group hashes, id
//! and key fingerprints). Apply waits only while the state machine takes what the image holds; a
//! background thread encodes it and writes it to `sm/restart/{index:020}.img`. Each image names
//! the one before it (`prev`), so the images form a chain whose deltas together hold everything
//! built since the snapshot. At start the member loads the longest chain that begins at or below
//! the snapshot and ends at an entry its log still holds (same index and term), sets its applied
//! index there, and openraft re-applies only the tail after it. Anything else (no images, a broken chain, a damaged file, a state machine
//! that refuses the images) falls back to the snapshot and a full re-apply, as before; nothing is
//! lost either way.
//!
//! A retention snapshot at index S drops the images at or below S (their deltas hold only
//! entries at or below the trim point, whose messages are gone). Installing a snapshot from the
//! leader drops them all.
//!
//! ## `sm/restart/{index:020}.img`, format version 1
//!
//! `[crc32 of the rest: u32 LE][postcard of ImageFile]`: `prev` (varint), openraft's
//! `SnapshotMeta` of the image's last entry, then the state machine's bytes (length-prefixed; they
//! carry their own version). A later version begins with the envelope of [`super::format`].

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use serde::{Deserialize, Serialize};

use super::format;
use crate::types::SnapshotMeta;

/// The format version of restart image files this build writes and the newest it reads.
pub const RESTART_IMAGE_FORMAT_VERSION: u32 = 1;

/// The file extension of restart images.
const EXT: &str = "img";

/// One restart image file. Field order is the order on disk: never reorder or change the fields.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ImageFile {
    /// The index the previous image (or the state this chain started from) was taken at: this
    /// image's delta holds what apply built for the entries after it.
    pub prev: u64,
    /// The last applied entry and membership when the image was taken.
    pub meta: SnapshotMeta,
    /// The state machine's image: one byte string (postcard writes it as it would a sequence of
    /// `u8`, in one copy).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

impl ImageFile {
    /// The file's bytes in one buffer: what the writer's [`Self::head`] and data add up to.
    #[cfg(test)]
    pub(crate) fn encode(&self) -> io::Result<Vec<u8>> {
        // Sized ahead: growing a buffer of megabytes costs its copies and fresh pages.
        let mut out = Vec::with_capacity(4 + self.data.len() + 256);
        out.extend_from_slice(&[0u8; 4]);
        out = crate::encoding::postcard_extend(self, out).map_err(io::Error::other)?;
        let crc = crc32fast::hash(&out[4..]);
        out[..4].copy_from_slice(&crc.to_le_bytes());
        Ok(out)
    }

    /// The bytes of [`Self::encode`] before the data (the checksum, `prev`, `meta` and the
    /// data's length), so the writer writes the data from where it is: a copy of an image of tens
    /// of megabytes into a fresh buffer, page faults included, was 2.4 % of a follower's samples
    /// at 1,000 topics (of 5.7 % in the writer's thread).
    pub(crate) fn head(&self) -> io::Result<Vec<u8>> {
        /// `ImageFile` up to its data's length prefix (postcard writes a byte string's length
        /// as it writes a `usize`).
        #[derive(Serialize)]
        struct Head<'a> {
            prev: u64,
            meta: &'a SnapshotMeta,
            len: usize,
        }
        let head = Head {
            prev: self.prev,
            meta: &self.meta,
            len: self.data.len(),
        };
        let mut out =
            crate::encoding::postcard_extend(&head, vec![0u8; 4]).map_err(io::Error::other)?;
        let mut crc = crc32fast::Hasher::new();
        crc.update(&out[4..]);
        crc.update(&self.data);
        out[..4].copy_from_slice(&crc.finalize().to_le_bytes());
        Ok(out)
    }

    /// Reads an image file; `path` names it in errors.
    pub(crate) fn decode(path: &Path, bytes: &[u8]) -> io::Result<ImageFile> {
        let bad = |what: String| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("restart image {}: {what}", path.display()),
            )
        };
        let (_version, body) = format::versioned(
            || format!("restart image {}", path.display()),
            bytes,
            RESTART_IMAGE_FORMAT_VERSION,
        )?;
        let (crc, rest) = body
            .split_first_chunk::<4>()
            .ok_or_else(|| bad(format!("{} bytes is too short", body.len())))?;
        if u32::from_le_bytes(*crc) != crc32fast::hash(rest) {
            return Err(bad("checksum mismatch (torn or damaged)".into()));
        }
        postcard::from_bytes(rest).map_err(|e| bad(e.to_string()))
    }
}

/// The file of the image taken at `index`.
pub(crate) fn path_of(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:020}.{EXT}"))
}

/// The indexes of the image files in `dir`, ascending (none when it does not exist).
pub(crate) fn list(dir: &Path) -> io::Result<Vec<u64>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in rd {
        let name = e?.file_name();
        let name = name.to_string_lossy();
        if let Some(i) = name
            .strip_suffix(&format!(".{EXT}"))
            .and_then(|s| s.parse().ok())
        {
            out.push(i);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Which images to load: the indexes, oldest first, of the longest chain that starts at or
/// below `floor` (the snapshot's index, 0 without one) and ends at the newest image `usable`
/// says the log still holds. `images` maps each image's index to its `prev`. Empty when no
/// chain ends above `floor`.
pub(crate) fn chain(
    images: &BTreeMap<u64, u64>,
    floor: u64,
    usable: impl Fn(u64) -> bool,
) -> Vec<u64> {
    'top: for (&top, _) in images.range(floor + 1..).rev() {
        if !usable(top) {
            continue;
        }
        let mut path = vec![top];
        let mut at = top;
        loop {
            let prev = images[&at];
            if prev <= floor {
                path.reverse();
                return path;
            }
            if !images.contains_key(&prev) {
                continue 'top;
            }
            path.push(prev);
            at = prev;
        }
    }
    Vec::new()
}

/// An image taken at apply and not yet encoded ([`crate::state_machine::ImageEncoder`]): the
/// writer encodes it into an [`ImageFile`].
pub(crate) struct Pending {
    pub prev: u64,
    pub meta: SnapshotMeta,
    /// The state's snapshot at the image's entry, which the image holds.
    pub snapshot: Vec<u8>,
    pub encode: crate::state_machine::ImageEncoder,
}

/// What the writer thread does, in the order asked.
pub(crate) enum Job {
    Write(u64, Pending),
    /// Removes the images at or below this index.
    RemoveUpto(u64),
    RemoveAll,
}

/// Encodes and writes images off the apply path, one at a time, in order.
pub(crate) struct Writer {
    tx: mpsc::Sender<Job>,
}

impl Writer {
    pub(crate) fn start(dir: PathBuf) -> io::Result<Writer> {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("restart-images".into())
            .spawn(move || {
                for job in rx {
                    if let Err(e) = run(&dir, job) {
                        // An image that is not written costs only time at the next start.
                        tracing::warn!(error = %e, dir = %dir.display(), "restart image");
                    }
                }
            })?;
        Ok(Writer { tx })
    }

    pub(crate) fn send(&self, job: Job) {
        // The thread ends only with the process.
        let _ = self.tx.send(job);
    }
}

fn run(dir: &Path, job: Job) -> io::Result<()> {
    match job {
        Job::Write(index, pending) => {
            let started = std::time::Instant::now();
            let file = ImageFile {
                prev: pending.prev,
                meta: pending.meta,
                data: (pending.encode)(&pending.snapshot),
            };
            std::fs::create_dir_all(dir)?;
            let head = file.head()?;
            let path = path_of(dir, index);
            let tmp = path.with_extension("tmp");
            {
                use std::io::Write;
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(&head)?;
                f.write_all(&file.data)?;
                f.sync_all()?;
            }
            std::fs::rename(&tmp, &path)?;
            crate::log_store::sync_dir(dir)?;
            tracing::debug!(
                index,
                prev = file.prev,
                bytes = head.len() + file.data.len(),
                ms = started.elapsed().as_millis() as u64,
                "restart image written"
            );
        }
        Job::RemoveUpto(upto) => {
            for i in list(dir)?.into_iter().take_while(|i| *i <= upto) {
                std::fs::remove_file(path_of(dir, i))?;
            }
        }
        Job::RemoveAll => {
            for i in list(dir)? {
                std::fs::remove_file(path_of(dir, i))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::hex;

    fn images(pairs: &[(u64, u64)]) -> BTreeMap<u64, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn t1_the_chain_runs_from_the_floor_to_the_newest_usable_image() {
        let all = images(&[(100, 0), (200, 100), (300, 200), (400, 300)]);
        assert_eq!(chain(&all, 0, |_| true), [100, 200, 300, 400]);
        // The log lost its tail past 350: the chain ends at 300.
        assert_eq!(chain(&all, 0, |i| i <= 350), [100, 200, 300]);
        // A snapshot at 200 (images at or below it removed or not): the chain starts after it.
        assert_eq!(chain(&all, 200, |_| true), [300, 400]);
        assert_eq!(
            chain(&images(&[(300, 200), (400, 300)]), 250, |_| true),
            [300, 400]
        );
        // A snapshot newer than every image: nothing to load.
        assert!(chain(&all, 400, |_| true).is_empty());
    }

    #[test]
    fn t2_a_broken_chain_falls_back_to_its_usable_part_or_to_nothing() {
        // 200 is missing: 300 cannot reach the floor; 100 can.
        let gap = images(&[(100, 0), (300, 200), (400, 300)]);
        assert_eq!(chain(&gap, 0, |_| true), [100]);
        // The only chain starts above the snapshot's index: its start is unknown.
        assert!(chain(&images(&[(300, 200)]), 100, |_| true).is_empty());
        // No image is in the log any more.
        assert!(chain(&gap, 0, |_| false).is_empty());
    }

    #[test]
    fn t3_an_image_file_reads_back_and_a_changed_byte_is_refused() {
        let file = ImageFile {
            prev: 1024,
            meta: SnapshotMeta {
                last_log_id: Some(crate::types::log_id(3, 1, 2048)),
                last_membership: crate::types::StoredMembership::new(
                    Some(crate::types::log_id(1, 1, 1)),
                    crate::golden::membership(&[1, 2, 3]),
                ),
            },
            data: vec![1, 2, 3, 4],
        };
        let bytes = file.encode().unwrap();
        println!("image file\n  {}", hex(&bytes));
        // The data is written as one byte string: the bytes postcard gives a plain `Vec<u8>`
        // field, as builds before wrote it.
        #[derive(Serialize)]
        struct Plain<'a> {
            prev: u64,
            meta: &'a SnapshotMeta,
            data: &'a Vec<u8>,
        }
        let plain = Plain {
            prev: file.prev,
            meta: &file.meta,
            data: &file.data,
        };
        assert_eq!(bytes[4..], postcard::to_stdvec(&plain).unwrap()[..]);
        // The writer's two parts, the head and the data, make the same bytes.
        let mut parts = file.head().unwrap();
        parts.extend_from_slice(&file.data);
        assert_eq!(parts, bytes);
        let big = ImageFile {
            data: vec![7; 300],
            ..file.clone()
        };
        let mut parts = big.head().unwrap();
        parts.extend_from_slice(&big.data);
        assert_eq!(parts, big.encode().unwrap(), "a length of two varint bytes");
        let back = ImageFile::decode(Path::new("x.img"), &bytes).unwrap();
        assert_eq!(
            (back.prev, back.meta, back.data),
            (file.prev, file.meta, file.data)
        );
        for at in [0, 5, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            let e = ImageFile::decode(Path::new("x.img"), &bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains("x.img"), "{e}");
        }
        let e = ImageFile::decode(Path::new("x.img"), &bytes[..2]).unwrap_err();
        assert!(e.to_string().contains("too short"), "{e}");
    }

    #[test]
    fn t4_the_writer_writes_lists_and_removes_in_order() {
        let dir = tempfile::tempdir().unwrap();
        // The writer encodes what apply took: here, the snapshot twice.
        let file = |prev| Pending {
            prev,
            meta: SnapshotMeta::default(),
            snapshot: vec![7, 8],
            encode: Box::new(|s: &[u8]| [s, s].concat()),
        };
        for (i, prev) in [(10, 0), (20, 10), (30, 20)] {
            run(dir.path(), Job::Write(i, file(prev))).unwrap();
        }
        assert_eq!(list(dir.path()).unwrap(), [10, 20, 30]);
        run(dir.path(), Job::RemoveUpto(20)).unwrap();
        assert_eq!(list(dir.path()).unwrap(), [30]);
        let b = std::fs::read(path_of(dir.path(), 30)).unwrap();
        let back = ImageFile::decode(Path::new("30"), &b).unwrap();
        assert_eq!((back.prev, back.data), (20, vec![7, 8, 7, 8]));
        run(dir.path(), Job::RemoveAll).unwrap();
        assert!(list(dir.path()).unwrap().is_empty());
        assert!(list(&dir.path().join("absent")).unwrap().is_empty());
    }
}
