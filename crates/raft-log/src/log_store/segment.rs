//! One segment file: append-only records (see [`super::record`]) and the in-memory index from Raft
//! index to file position.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::record::{self, HEADER_BYTES, Header, PAYLOAD_BYTES_MAX};
use crate::types::{EntryPayload, LogId};

pub struct Segment {
    first_index: u64,
    path: Arc<PathBuf>,
    file: Arc<File>,
    /// `positions[i]` is the file offset of the record of index `first_index + i`.
    positions: Vec<u64>,
    len: u64,
    /// Offset below which this file's pages have been dropped from the page cache.
    uncached_to: Arc<AtomicU64>,
}

impl Segment {
    pub fn path_for(dir: &Path, first_index: u64) -> PathBuf {
        dir.join(format!("{first_index:020}.log"))
    }

    /// A new, empty segment with `prealloc` bytes allocated up front (see [`preallocate`]).
    pub fn create(dir: &Path, first_index: u64, prealloc: u64) -> io::Result<Segment> {
        let path = Self::path_for(dir, first_index);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        file.set_len(0)?;
        preallocate(&file, &path, prealloc);
        Ok(Segment {
            first_index,
            path: Arc::new(path),
            file: Arc::new(file),
            positions: Vec::new(),
            len: 0,
            uncached_to: Arc::default(),
        })
    }

    /// Opens a segment and validates it record by record, changing nothing: the segment holds its
    /// longest valid dense prefix. Returns the segment, the bytes after that prefix (to cut with
    /// [`Self::cut_to_valid`] before any append), and the highest index this member is known to
    /// have held in it (also past a damaged record whose length is intact, as long as the records
    /// after it still check out).
    pub fn recover(path: &Path, first_index: u64) -> io::Result<(Segment, u64, u64)> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let file_len = file.metadata()?.len();
        let mut positions = Vec::new();
        let mut pos = 0u64;
        let mut payload = Vec::new();
        let index = |positions: &Vec<u64>| first_index + positions.len() as u64;
        while let Check::Valid(len) =
            check_record(&file, file_len, pos, index(&positions), &mut payload)?
        {
            positions.push(pos);
            pos += len;
        }
        let seen = index(&positions);
        let seen =
            seen.saturating_sub(1)
                .max(salvage_scan(&file, file_len, pos, seen, &mut payload)?);
        // Zeros after the valid prefix are preallocated space never written: nothing to cut.
        let cut = match zeros_from(&file, pos, file_len)? {
            true => 0,
            false => file_len - pos,
        };
        Ok((
            Segment {
                first_index,
                path: Arc::new(path.to_path_buf()),
                file: Arc::new(file),
                positions,
                len: pos,
                uncached_to: Arc::default(),
            },
            cut,
            seen,
        ))
    }

    /// Opens a sealed segment from its index file ([`Self::write_index`]) instead of reading every
    /// record: None (read it all then) when the index is missing, damaged, of another segment, or
    /// of another length of the file, or when the last record it names does not check out.
    /// Records are still checked (index and CRC) whenever they are read.
    pub fn open_indexed(path: &Path, first_index: u64) -> io::Result<Option<Segment>> {
        let Ok(idx) = std::fs::read(path.with_extension(INDEX_EXT)) else {
            return Ok(None);
        };
        let Some(positions) = decode_index(&idx, first_index) else {
            return Ok(None);
        };
        let Some((&last_pos, len)) = positions.last().zip(index_len(&idx)) else {
            return Ok(None);
        };
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let file_len = file.metadata()?.len();
        let last = first_index + positions.len() as u64 - 1;
        let mut payload = Vec::new();
        match check_record(&file, file_len, last_pos, last, &mut payload)? {
            Check::Valid(n) if file_len == len && last_pos + n == len => {}
            _ => return Ok(None),
        }
        Ok(Some(Segment {
            first_index,
            path: Arc::new(path.to_path_buf()),
            file: Arc::new(file),
            positions,
            len,
            uncached_to: Arc::default(),
        }))
    }

    /// Writes this (sealed) segment's index file: its record positions and length, so the next
    /// start opens it without reading it ([`Self::open_indexed`]). Written in place of a temporary
    /// file; a torn one fails its checksum and the segment is read whole.
    pub fn write_index(&self) -> io::Result<()> {
        let mut out = Vec::with_capacity(INDEX_HEADER_BYTES + 8 * self.positions.len() + 4);
        out.extend_from_slice(INDEX_MAGIC);
        out.extend_from_slice(&self.first_index.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&(self.positions.len() as u64).to_le_bytes());
        for p in &self.positions {
            out.extend_from_slice(&p.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        let path = self.path.with_extension(INDEX_EXT);
        let tmp = self.path.with_extension("idx.tmp");
        std::fs::write(&tmp, &out)?;
        std::fs::rename(&tmp, &path)
    }

    /// Gives back the preallocated space past the last record of a segment being sealed, so a
    /// sealed segment is exactly its records (what its index file records). Not synced: should
    /// the new length be lost, the next start finds zeros after the records, which it reads as
    /// unused space, and reads the segment whole since its index file no longer matches.
    pub fn seal(&self) -> io::Result<()> {
        if self.file.metadata()?.len() > self.len {
            self.file.set_len(self.len)?;
        }
        Ok(())
    }

    /// Whether this segment has an index file.
    pub fn has_index(&self) -> bool {
        self.path.with_extension(INDEX_EXT).exists()
    }

    fn remove_index(&self) -> io::Result<()> {
        match std::fs::remove_file(self.path.with_extension(INDEX_EXT)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Cuts the file to the valid prefix [`Self::recover`] found, durably.
    pub fn cut_to_valid(&self) -> io::Result<()> {
        self.remove_index()?;
        self.file.set_len(self.len)?;
        self.file.sync_all()
    }

    pub fn first_index(&self) -> u64 {
        self.first_index
    }
    pub fn next_index(&self) -> u64 {
        self.first_index + self.positions.len() as u64
    }
    pub fn count(&self) -> u64 {
        self.positions.len() as u64
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    /// What the flusher needs to make this segment's writes so far durable. After the fsync it
    /// drops the pages below `uncache_below` from the page cache (all of them at `u64::MAX`).
    pub(crate) fn sync_target(&self, uncache_below: u64) -> super::SyncTarget {
        super::SyncTarget {
            file: self.file.clone(),
            path: self.path.clone(),
            len: self.len,
            uncache: super::Uncache {
                below: uncache_below.min(self.len),
                whole: uncache_below >= self.len,
                done_to: self.uncached_to.clone(),
            },
        }
    }
    pub fn modified(&self) -> Option<std::time::SystemTime> {
        self.file.metadata().and_then(|m| m.modified()).ok()
    }

    /// Appends encoded records; `idx` holds (index, offset within `buf`) of each.
    pub fn append(&mut self, buf: &record::Records, idx: &[(u64, u64)]) -> io::Result<()> {
        if let Some((first, _)) = idx.first()
            && *first != self.next_index()
        {
            return Err(io::Error::other(format!(
                "segment expects index {}, got {first}",
                self.next_index()
            )));
        }
        // At the end of the records, not of the file: the file may be preallocated past them.
        write_all_vectored_at(&self.file, buf.slices(), self.len)?;
        for (_, off) in idx {
            self.positions.push(self.len + off);
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    fn end_of(&self, index: u64) -> u64 {
        let i = (index - self.first_index) as usize;
        self.positions.get(i + 1).copied().unwrap_or(self.len)
    }

    pub fn read_header(&self, index: u64) -> io::Result<Header> {
        let pos = self.positions[(index - self.first_index) as usize];
        let mut hb = [0u8; HEADER_BYTES];
        self.file.read_exact_at(&mut hb, pos)?;
        Ok(Header::parse(&hb))
    }

    /// The end of the longest run of records from `start` (below `end`) that holds at most
    /// `budget` bytes, and its bytes; with `at_least_one`, the first record counts whatever its size.
    pub fn end_within(&self, start: u64, end: u64, budget: u64, at_least_one: bool) -> (u64, u64) {
        if start >= end {
            return (start, 0);
        }
        let from = self.positions[(start - self.first_index) as usize];
        let bytes_to = |stop: u64| self.end_of(stop - 1) - from;
        if bytes_to(end) <= budget {
            return (end, bytes_to(end));
        }
        // The largest stop in (start, end] whose run fits: positions grow with the index.
        let (mut lo, mut hi) = (start, end);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if bytes_to(mid) <= budget {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo == start && at_least_one {
            lo = start + 1;
        }
        (lo, if lo == start { 0 } else { bytes_to(lo) })
    }

    /// What reading the records `[start, end)` takes: planned under the log's lock, done after it
    /// is released (see [`SegmentRead`]). None for an empty range.
    pub fn plan_read(&self, start: u64, end: u64) -> Option<SegmentRead> {
        (start < end).then(|| SegmentRead {
            file: self.file.clone(),
            path: self.path.clone(),
            from: self.positions[(start - self.first_index) as usize],
            to: self.end_of(end - 1),
            start,
            end,
        })
    }

    /// Cuts every record from `next` on, durably.
    pub fn truncate_to(&mut self, next: u64) -> io::Result<()> {
        if next >= self.next_index() {
            return Ok(());
        }
        self.remove_index()?;
        let keep = next.saturating_sub(self.first_index) as usize;
        let new_len = self.positions.get(keep).copied().unwrap_or(self.len);
        self.positions.truncate(keep);
        self.file.set_len(new_len)?;
        self.file.sync_all()?;
        self.len = new_len;
        let durable = self.path.with_extension("durable");
        if durable.exists() {
            let tmp = self.path.with_extension("durable.tmp");
            std::fs::write(&tmp, new_len.to_le_bytes())?;
            std::fs::rename(&tmp, durable)?;
        }
        Ok(())
    }

    pub fn remove(self) -> io::Result<()> {
        let _ = std::fs::remove_file(self.path.with_extension("durable"));
        self.remove_index()?;
        std::fs::remove_file(&*self.path)
    }
}

/// Allocates `bytes` for a new segment's records (`fallocate`; the file reads as zeros past what
/// was written). An fdatasync of an append that grows a file also writes the inode's new size;
/// writing inside allocated space spares that: on this project's VMs, 1,100-byte writes each
/// followed by fdatasync took p50 157 µs appending and 110-116 µs inside a preallocated file.
/// Advice only: where the file system cannot (or `bytes` is 0), the file grows as it is written.
fn preallocate(file: &File, path: &Path, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let r = nix::fcntl::fallocate(
        file,
        nix::fcntl::FallocateFlags::empty(),
        0,
        bytes.min(i64::MAX as u64) as i64,
    );
    if let Err(e) = r {
        tracing::debug!(path = %path.display(), error = %e, "cannot preallocate a log segment");
    }
}

/// Whether every byte of `[from, to)` is zero (read in 1 MiB pieces). Only the parts holding
/// data are read: preallocated space never written is a hole to `SEEK_DATA` on file systems
/// that tell (ext4, xfs), so a start does not read up to a segment's size of zeros. Where the
/// file system cannot tell, all of it is read.
fn zeros_from(file: &File, from: u64, to: u64) -> io::Result<bool> {
    let mut buf = vec![0u8; (to.saturating_sub(from)).min(1 << 20) as usize];
    let mut pos = from;
    while pos < to {
        let Some((data, hole)) = data_extent(file, pos) else {
            return Ok(true);
        };
        let end = hole.min(to);
        let mut at = data.max(pos);
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..n], at)?;
            if buf[..n].iter().any(|b| *b != 0) {
                return Ok(false);
            }
            at += n as u64;
        }
        pos = end;
    }
    Ok(true)
}

/// The first stretch at or after `pos` that may hold data, as (start, end): None when only holes
/// follow; `(pos, u64::MAX)` when the file system cannot tell.
fn data_extent(file: &File, pos: u64) -> Option<(u64, u64)> {
    use nix::unistd::{Whence, lseek};
    let data = match lseek(file, pos as i64, Whence::SeekData) {
        Ok(d) => d as u64,
        Err(nix::errno::Errno::ENXIO) => return None,
        Err(_) => return Some((pos, u64::MAX)),
    };
    let hole = lseek(file, data as i64, Whence::SeekHole).map_or(u64::MAX, |h| h as u64);
    Some((data, hole))
}

/// A sealed segment's index file, `{first_index:020}.idx` beside it: `INDEX_MAGIC`, then as u64
/// LE the first index, the segment's length in bytes and the record count, then each record's
/// position (u64 LE), then a CRC-32 (u32 LE) of everything before it.
const INDEX_EXT: &str = "idx";
const INDEX_MAGIC: &[u8; 8] = b"RMQIDX01";
const INDEX_HEADER_BYTES: usize = 8 + 3 * 8;

/// The positions an index file holds, if it is whole, of `first_index` and names at least one
/// record.
fn decode_index(b: &[u8], first_index: u64) -> Option<Vec<u64>> {
    let (body, crc) = b.split_last_chunk::<4>()?;
    if crc32fast::hash(body) != u32::from_le_bytes(*crc) {
        return None;
    }
    let rest = body.strip_prefix(INDEX_MAGIC)?;
    let word = |i: usize| {
        rest.get(i * 8..i * 8 + 8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
    };
    let (first, count) = (word(0)?, word(2)?);
    if first != first_index || count == 0 || rest.len() as u64 != (3 + count) * 8 {
        return None;
    }
    (3..3 + count as usize).map(word).collect()
}

/// The segment length an index file (already checked by [`decode_index`]) records.
fn index_len(b: &[u8]) -> Option<u64> {
    b.get(16..24)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
}

/// What the record at a position is.
enum Check {
    /// A whole record of the expected index with a good checksum, this many bytes long.
    Valid(u64),
    /// A header of the expected index whose record fits in the file, but a bad checksum.
    BadChecksum(u64),
    /// Anything else: past the end, a torn record, another index, a garbage length.
    Invalid,
}

/// Checks the record at `pos`, which should hold `index` (format in [`record`]).
fn check_record(
    file: &File,
    file_len: u64,
    pos: u64,
    index: u64,
    payload: &mut Vec<u8>,
) -> io::Result<Check> {
    if pos + HEADER_BYTES as u64 > file_len {
        return Ok(Check::Invalid);
    }
    let mut hb = [0u8; HEADER_BYTES];
    file.read_exact_at(&mut hb, pos)?;
    // All zeros: preallocated space never written (a record's header never is).
    if hb.iter().all(|b| *b == 0) {
        return Ok(Check::Invalid);
    }
    let h = Header::parse(&hb);
    if h.index != index || h.payload_len > PAYLOAD_BYTES_MAX || pos + h.record_len() > file_len {
        return Ok(Check::Invalid);
    }
    payload.resize(h.payload_len as usize, 0);
    file.read_exact_at(payload, pos + HEADER_BYTES as u64)?;
    Ok(if record::checksum(&hb[8..], payload) == h.crc {
        Check::Valid(h.record_len())
    } else {
        Check::BadChecksum(h.record_len())
    })
}

/// Past the first bad record at `pos` (expected to hold `index`): if only its checksum is bad,
/// skip it and follow the chain of valid records after it. Returns the highest index so found
/// (0 if none): a flipped bit inside a payload then still shows how far this member had stored.
fn salvage_scan(
    file: &File,
    file_len: u64,
    mut pos: u64,
    mut index: u64,
    payload: &mut Vec<u8>,
) -> io::Result<u64> {
    let Check::BadChecksum(len) = check_record(file, file_len, pos, index, payload)? else {
        return Ok(0);
    };
    pos += len;
    index += 1;
    let mut seen = 0;
    while let Check::Valid(len) = check_record(file, file_len, pos, index, payload)? {
        seen = index;
        pos += len;
        index += 1;
    }
    Ok(seen)
}

/// A planned read of consecutive records of one segment. It holds the file open, so it can be done
/// without the log's lock: a purge that deletes the segment meanwhile leaves the open file
/// readable, and anything else that changed the bytes (a truncation and a re-append of entries
/// that were never committed) fails the index or CRC check of a record instead of being served.
pub struct SegmentRead {
    file: Arc<File>,
    path: Arc<PathBuf>,
    from: u64,
    to: u64,
    start: u64,
    end: u64,
}

/// The most pieces one `pwritev` is given (Linux takes up to `IOV_MAX`, 1,024).
const WRITE_PIECES_MAX: usize = 256;

/// Writes `pieces` one after another at `offset`, with as few system calls as the pieces allow.
fn write_all_vectored_at<'a>(
    file: &File,
    pieces: impl Iterator<Item = &'a [u8]>,
    mut offset: u64,
) -> io::Result<()> {
    let mut pieces = pieces.peekable();
    let mut batch: Vec<io::IoSlice<'a>> = Vec::new();
    while pieces.peek().is_some() {
        batch.clear();
        batch.extend(pieces.by_ref().take(WRITE_PIECES_MAX).map(io::IoSlice::new));
        let mut at: &mut [io::IoSlice<'a>] = &mut batch;
        while !at.is_empty() {
            let n = match nix::sys::uio::pwritev(file, at, offset as i64) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(e.into()),
            };
            offset += n as u64;
            io::IoSlice::advance_slices(&mut at, n);
        }
    }
    Ok(())
}

impl SegmentRead {
    pub fn bytes(&self) -> u64 {
        self.to - self.from
    }

    /// Reads the records (all inside this segment) with one read, checking each index and CRC.
    pub fn read(&self, out: &mut Vec<(LogId, EntryPayload)>) -> io::Result<()> {
        let mut buf = vec![0u8; (self.to - self.from) as usize];
        self.file.read_exact_at(&mut buf, self.from)?;
        // Each record's payload is a slice of the one buffer read (`record::decode_payload_in`).
        let buf = bytes::Bytes::from(buf);
        let mut off = 0usize;
        for index in self.start..self.end {
            let bad = || {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "log record {index} in {} failed its CRC check",
                        self.path.display()
                    ),
                )
            };
            let hb: &[u8; HEADER_BYTES] = buf
                .get(off..off + HEADER_BYTES)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(bad)?;
            let h = Header::parse(hb);
            let body = buf
                .get(off + HEADER_BYTES..off + h.record_len() as usize)
                .ok_or_else(bad)?;
            if h.index != index || record::checksum(&hb[8..], body) != h.crc {
                return Err(bad());
            }
            out.push((h.log_id(), record::decode_payload_in(&buf, body)?));
            off += h.record_len() as usize;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1. Zeros are found across preallocated space (read or skipped as a hole), and one written
    ///    byte anywhere after the start, before or after a hole, is not missed.
    #[test]
    fn t01_zeros_from_skips_holes_but_not_a_written_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let mib = 1u64 << 20;
        preallocate(&file, &path, 8 * mib);
        file.write_all_at(b"records", 0).unwrap();
        let len = file.metadata().unwrap().len();
        assert!(zeros_from(&file, 7, len).unwrap());
        assert!(!zeros_from(&file, 0, len).unwrap());
        // A byte far past the written start, behind unwritten space.
        file.write_all_at(&[1], 6 * mib + 3).unwrap();
        assert!(!zeros_from(&file, 7, len).unwrap());
        assert!(zeros_from(&file, 7, 6 * mib + 3).unwrap());
        assert!(zeros_from(&file, 6 * mib + 4, len).unwrap());
        // A sparse file (no preallocation): a byte past a hole.
        let sparse = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("sparse"))
            .unwrap();
        sparse.write_all_at(&[2], 3 * mib).unwrap();
        assert!(!zeros_from(&sparse, 0, 3 * mib + 1).unwrap());
        assert!(zeros_from(&sparse, 0, 3 * mib).unwrap());
    }

    /// 2. A gathered write puts every piece in order at its offset, over more pieces than one
    ///    system call takes, and the records of a segment read back with their payloads shared
    ///    out of one buffer.
    #[test]
    fn t02_a_gathered_write_lands_every_piece_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("s"))
            .unwrap();
        let owned: Vec<Vec<u8>> = (0..WRITE_PIECES_MAX * 2 + 7)
            .map(|i| vec![i as u8; i % 5 * 700])
            .collect();
        write_all_vectored_at(&file, owned.iter().map(|v| &v[..]), 10).unwrap();
        let want = owned.concat();
        let mut got = vec![0u8; want.len()];
        file.read_exact_at(&mut got, 10).unwrap();
        assert!(got == want, "the pieces landed out of order or short");
        assert_eq!(file.metadata().unwrap().len(), 10 + want.len() as u64);

        let mut seg = Segment::create(dir.path(), 1, 0).unwrap();
        let (mut records, mut idx) = (record::Records::default(), Vec::new());
        let payloads: Vec<EntryPayload> = (1..=3u64)
            .map(|i| {
                EntryPayload::Normal(crate::types::Payload(
                    vec![i as u8; 4000 * i as usize].into(),
                ))
            })
            .collect();
        for (i, p) in payloads.iter().enumerate() {
            idx.push((i as u64 + 1, records.len() as u64));
            records
                .push(&crate::types::log_id(1, 1, i as u64 + 1), p)
                .unwrap();
        }
        seg.append(&records, &idx).unwrap();
        let mut out = Vec::new();
        seg.plan_read(1, 4).unwrap().read(&mut out).unwrap();
        let read: Vec<&EntryPayload> = out.iter().map(|(_, p)| p).collect();
        assert_eq!(read, payloads.iter().collect::<Vec<_>>());
        let starts: Vec<usize> = out
            .iter()
            .map(|(_, p)| match p {
                EntryPayload::Normal(p) => p.0.as_ptr() as usize,
                _ => unreachable!(),
            })
            .collect();
        // One buffer: each payload starts past the one before by its length, the next header and
        // the next payload's 3-byte prefix (postcard: the variant, then the length).
        assert_eq!(starts[1] - starts[0], 4000 + HEADER_BYTES + 3);
        assert_eq!(starts[2] - starts[1], 8000 + HEADER_BYTES + 3);
    }
}
