//! Log storage of our own: the Raft log of a broker group is its commit log.
//!
//! Entries live in segment files of append-only records (format in [`record`]). Each segment keeps
//! an in-memory index from Raft index to file position, so a lookup never scans. Small metadata —
//! the vote, the committed log id, the last purged log id — lives in sled ([`meta`]).
//!
//! Contract with openraft:
//! - `append` writes the records into the page cache and returns; the callback fires only after a
//!   flusher thread has `fdatasync`ed them. One fsync covers every append queued before it (group
//!   commit). With `FlushMode::Fsync` (the default) nothing is acknowledged before it is on disk.
//! - `save_vote` first waits until every earlier append is on disk, then writes the vote to sled and
//!   flushes it, so a vote is never persisted ahead of the log it was cast with.
//! - `truncate_after` and `purge` are durable before they return (they are rare).
//! - Any I/O error is returned to openraft (or passed to the callback), which then stops the node:
//!   a member whose storage fails must not keep voting.

pub mod meta;
mod pacer;
pub mod record;
mod segment;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};

use openraft::OptionalSend;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};

use crate::config::FlushMode;
use crate::types::{Entry, EntryPayload, LogId, TypeConfig, Vote};
use meta::Meta;
use segment::Segment;

/// The shared state of the log: segments and the tail.
struct Inner {
    dir: PathBuf,
    segments: BTreeMap<u64, Segment>,
    last: Option<LogId>,
    /// Entries at or below this index are purged: never returned, even while their segment stays.
    purged: Option<u64>,
    segment_bytes_max: u64,
    /// Bytes at the end of the active segment left in the page cache after an fsync (0: all).
    page_cache_window_bytes: u64,
    /// The newest entries, as appended: replication and pulls of recent messages read them here
    /// instead of reading and decoding the segment again.
    tail: TailCache,
}

/// Payload bytes the tail cache holds at most.
const TAIL_CACHE_BYTES: usize = 32 << 20;

/// A dense run of the newest entries `[first, first + entries.len())`, bounded in payload bytes.
#[derive(Default)]
struct TailCache {
    first: u64,
    entries: std::collections::VecDeque<Entry>,
    bytes: usize,
}

impl TailCache {
    fn size(e: &Entry) -> usize {
        payload_len_hint(&e.payload) + std::mem::size_of::<Entry>()
    }

    fn pop_front(&mut self) -> Option<Entry> {
        let e = self.entries.pop_front()?;
        self.bytes -= Self::size(&e);
        self.first += 1;
        Some(e)
    }

    fn push(&mut self, e: Entry) {
        if self.entries.is_empty() || self.first + self.entries.len() as u64 != e.log_id.index {
            // Not the next index (the first append, or the log went on past a snapshot): restart.
            self.clear();
            self.first = e.log_id.index;
        }
        self.bytes += Self::size(&e);
        self.entries.push_back(e);
        while self.bytes > TAIL_CACHE_BYTES && self.pop_front().is_some() {}
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Forgets every entry from `index` on (the log was truncated there).
    fn truncate_from(&mut self, index: u64) {
        while self.first + self.entries.len() as u64 > index {
            let Some(e) = self.entries.pop_back() else {
                break;
            };
            self.bytes -= Self::size(&e);
        }
    }

    /// Forgets every entry at or below `index` (purged).
    fn purge_to(&mut self, index: u64) {
        while self.first <= index && self.pop_front().is_some() {}
    }

    fn get(&self, index: u64) -> Option<&Entry> {
        self.entries.get(index.checked_sub(self.first)? as usize)
    }
}

/// The durable Raft log of one member.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<RwLock<Inner>>,
    meta: Meta,
    flusher: Flusher,
    repair: Arc<AtomicU64>,
    append_bytes_max: Arc<AtomicU64>,
    pacer: Arc<pacer::Pacer>,
}

/// A reader of the log, cloned into openraft's replication tasks and the broker's pull path.
#[derive(Clone)]
pub struct LogReader {
    inner: Arc<RwLock<Inner>>,
    meta: Meta,
    repair: Arc<AtomicU64>,
    /// Payload bytes one replication read (one append to a follower) carries at most.
    append_bytes_max: Arc<AtomicU64>,
    /// Paces replication reads from disk while clients write.
    pacer: Arc<pacer::Pacer>,
}

/// Payload bytes of one append to a follower unless the configuration says otherwise.
pub const APPEND_BYTES_MAX_DEFAULT: u64 = 4 << 20;

/// What recovery found when the log was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    pub entries: u64,
    /// Bytes cut from the tail of the last segment (a torn or unsynced write).
    pub truncated_bytes: u64,
    /// Segments removed after a damaged record in an earlier segment.
    pub dropped_segments: usize,
    /// The highest log index this member is known to have held before recovery: the committed
    /// index it had persisted, and any index seen in records or segments past a damaged record.
    /// Above the recovered last index, the member lost entries it may have acknowledged; it must
    /// neither vote nor campaign until replication has brought it back to this index.
    pub repair_floor: u64,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, validating every record and cutting a torn tail.
    pub fn open(
        dir: &Path,
        meta: Meta,
        segment_bytes_max: u64,
        flush_mode: FlushMode,
        page_cache_window_bytes: u64,
    ) -> io::Result<(Self, RecoveryReport)> {
        std::fs::create_dir_all(dir)?;
        let mut report = RecoveryReport::default();
        let mut firsts: Vec<(u64, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if let Some(stem) = name.strip_suffix(".log")
                && let Ok(first) = stem.parse::<u64>()
            {
                firsts.push((first, e.path()));
            }
        }
        firsts.sort();
        let purged = meta.purged()?;
        let mut segments = BTreeMap::new();
        let mut expect_next: Option<u64> = None;
        let mut damaged = false;
        // Entries at or below the purge point are gone for good; a gap up to it is no hole.
        let purged_next = purged.map(|p| p.index + 1).unwrap_or(0);
        for (i, (first, path)) in firsts.iter().enumerate() {
            let gap = expect_next.is_some_and(|n| *first > n && *first > purged_next);
            if damaged || gap || expect_next.is_some_and(|n| *first < n) {
                // It held entries from `first` on: this member once stored at least that far.
                report.repair_floor = report.repair_floor.max(*first);
                // Everything after a damaged record, or after a gap, cannot be trusted to be dense.
                tracing::error!(path = %path.display(), "removing log segment after a damaged record or gap");
                std::fs::remove_file(path)?;
                let _ = std::fs::remove_file(path.with_extension("durable"));
                report.dropped_segments += 1;
                damaged = true;
                continue;
            }
            let is_last = i + 1 == firsts.len();
            let (seg, cut, seen) = Segment::recover(path, *first)?;
            report.repair_floor = report.repair_floor.max(seen);
            if cut > 0 {
                report.truncated_bytes += cut;
                if !is_last {
                    tracing::error!(path = %path.display(), cut, "damaged record inside a sealed log segment; later segments dropped");
                    damaged = true;
                } else {
                    tracing::warn!(path = %path.display(), cut, "cut a torn tail from the log");
                }
            }
            report.entries += seg.count();
            expect_next = Some(seg.next_index());
            // A segment wholly at or below the purge point (kept while it was the active one), or
            // an empty sealed one, holds nothing to serve.
            let fully_purged = seg.next_index() <= purged_next && !is_last;
            if (seg.count() == 0 && !is_last && !damaged) || fully_purged {
                seg.remove()?;
                continue;
            }
            segments.insert(*first, seg);
        }
        report.segments = segments.len();
        let mut inner = Inner {
            dir: dir.to_path_buf(),
            segments,
            last: None,
            purged: purged.map(|p| p.index),
            segment_bytes_max,
            page_cache_window_bytes,
            tail: TailCache::default(),
        };
        inner.last = inner.read_last_log_id()?.or(purged);
        sync_dir(dir)?;
        if let Some(c) = meta.committed()? {
            report.repair_floor = report.repair_floor.max(c.index);
        }
        let last_index = inner.last.map(|l| l.index).unwrap_or(0);
        if report.repair_floor <= last_index {
            report.repair_floor = 0;
        } else {
            tracing::error!(
                last_index,
                held_before = report.repair_floor,
                "the log lost entries this member had stored; it will not vote or campaign until \
                 replication brings it back to index {}",
                report.repair_floor
            );
        }
        let flusher = Flusher::start(flush_mode);
        Ok((
            LogStore {
                inner: Arc::new(RwLock::new(inner)),
                meta,
                flusher,
                repair: Arc::new(AtomicU64::new(report.repair_floor)),
                append_bytes_max: Arc::new(AtomicU64::new(APPEND_BYTES_MAX_DEFAULT)),
                pacer: Arc::new(pacer::Pacer::new(std::time::Instant::now())),
            },
            report,
        ))
    }

    pub fn reader(&self) -> LogReader {
        LogReader {
            inner: self.inner.clone(),
            meta: self.meta.clone(),
            repair: self.repair.clone(),
            append_bytes_max: self.append_bytes_max.clone(),
            pacer: self.pacer.clone(),
        }
    }

    /// Bytes a second that replication reads from disk (a follower catching up) may take while
    /// clients write to this leader; 0: unpaced. See [`pacer`].
    pub fn set_catch_up_bytes_per_sec_busy(&self, bytes_per_sec: u64) {
        self.pacer.set_busy_rate(bytes_per_sec);
    }

    /// Caps the payload bytes of one replication read, so an append to a lagging follower is cut
    /// by bytes rather than entries (at least one entry is always sent).
    pub fn set_append_bytes_max(&self, bytes: u64) {
        self.append_bytes_max.store(bytes.max(1), Ordering::Relaxed);
    }

    /// Bytes of every segment file, for disk-use metrics and retention.
    pub fn disk_bytes(&self) -> u64 {
        self.inner
            .read()
            .map(|g| g.segments.values().map(|s| s.len()).sum())
            .unwrap_or(0)
    }

    /// (first index, last index, byte length, modified time) of every sealed segment, oldest first.
    pub fn sealed_segments(&self) -> Vec<(u64, u64, u64, Option<std::time::SystemTime>)> {
        let Ok(g) = self.inner.read() else {
            return Vec::new();
        };
        let n = g.segments.len();
        g.segments
            .values()
            .take(n.saturating_sub(1))
            .map(|s| {
                (
                    s.first_index(),
                    s.next_index().saturating_sub(1),
                    s.len(),
                    s.modified(),
                )
            })
            .collect()
    }

    fn write_entries(&self, entries: Vec<Entry>) -> io::Result<Vec<SyncTarget>> {
        let mut g = self.inner.write().map_err(|_| poisoned())?;
        // Sized for the whole batch up front: growing by doubling would copy it again and again.
        let mut buf = Vec::with_capacity(
            entries
                .iter()
                .map(|e| payload_len_hint(&e.payload) + record::HEADER_BYTES + 16)
                .sum::<usize>()
                .min(g.segment_bytes_max as usize),
        );
        let mut files = Vec::new();
        let mut batch_first: Option<u64> = None;
        let mut idx_in_buf: Vec<(u64, u64)> = Vec::new(); // (index, offset in buf)
        for e in entries {
            let id = e.log_id;
            if let Some(last) = g.last
                && id.index != last.index + 1
            {
                return Err(io::Error::other(format!(
                    "log hole: appending index {} after {}",
                    id.index, last.index
                )));
            }
            let need_roll = match g.segments.values().next_back() {
                None => true,
                Some(s) => {
                    (s.len() + buf.len() as u64 >= g.segment_bytes_max
                        && (s.count() > 0 || !buf.is_empty()))
                        // After a snapshot install the log goes on past the active segment's end:
                        // start a new segment there, so a segment's indexes stay dense.
                        || (buf.is_empty() && s.next_index() != id.index)
                }
            };
            if need_roll {
                if !buf.is_empty() {
                    files.push(g.flush_buf(&mut buf, &mut idx_in_buf)?);
                }
                // The segment being sealed leaves the page cache whole once it is on disk.
                if g.page_cache_window_bytes > 0
                    && let Some(sealed) = g.segments.values().next_back()
                {
                    files.push(sealed.sync_target(u64::MAX));
                }
                let dir = g.dir.clone();
                let seg = Segment::create(&dir, id.index)?;
                sync_dir(&dir)?;
                g.segments.insert(id.index, seg);
                batch_first = None;
            }
            batch_first.get_or_insert(id.index);
            idx_in_buf.push((id.index, buf.len() as u64));
            record::encode(&mut buf, &id, &e.payload)?;
            g.last = Some(id);
            g.tail.push(e);
        }
        if !buf.is_empty() {
            files.push(g.flush_buf(&mut buf, &mut idx_in_buf)?);
        }
        Ok(files)
    }

    /// Blocks until every append submitted so far is on disk.
    fn barrier(&self) -> io::Result<()> {
        let file = {
            let g = self.inner.read().map_err(|_| poisoned())?;
            g.segments.values().next_back().map(|s| s.sync_target(0))
        };
        let (tx, rx) = mpsc::channel();
        self.flusher.submit(FlushJob {
            files: file.into_iter().collect(),
            done: FlushDone::Barrier(tx),
        });
        rx.recv()
            .map_err(|_| io::Error::other("log flusher stopped"))?
    }
}

impl Inner {
    fn flush_buf(
        &mut self,
        buf: &mut Vec<u8>,
        idx: &mut Vec<(u64, u64)>,
    ) -> io::Result<SyncTarget> {
        let seg = self
            .segments
            .values_mut()
            .next_back()
            .ok_or_else(|| io::Error::other("no active segment"))?;
        seg.append(buf, idx)?;
        buf.clear();
        idx.clear();
        let uncache_below = match self.page_cache_window_bytes {
            0 => 0,
            w => seg.len().saturating_sub(w),
        };
        Ok(seg.sync_target(uncache_below))
    }

    fn read_last_log_id(&self) -> io::Result<Option<LogId>> {
        for s in self.segments.values().rev() {
            if s.count() > 0 {
                return Ok(Some(s.read_header(s.next_index() - 1)?.log_id()));
            }
        }
        Ok(None)
    }

    fn segment_of(&self, index: u64) -> Option<&Segment> {
        let (_, s) = self.segments.range(..=index).next_back()?;
        (index < s.next_index()).then_some(s)
    }

    /// Plans reading entries `[start, end)`: those in the tail cache are taken at once, the rest
    /// become file reads that [`ReadPlan::run`] does after the caller released the lock (a read
    /// from disk must not hold up appends).
    fn plan_range(&self, start: u64, end: u64) -> ReadPlan {
        self.plan_range_within(start, end, u64::MAX)
    }

    /// As [`Self::plan_range`], stopping once the planned records hold `budget` bytes (at least one
    /// entry is planned whatever its size).
    fn plan_range_within(&self, start: u64, end: u64, budget: u64) -> ReadPlan {
        let mut plan = ReadPlan::default();
        let mut left = budget;
        let mut i = match self.purged {
            Some(p) => start.max(p + 1),
            None => start,
        };
        while i < end {
            if let Some(e) = self.tail.get(i) {
                let size = payload_len_hint(&e.payload) as u64;
                if size > left && !plan.pieces.is_empty() {
                    break;
                }
                left = left.saturating_sub(size);
                plan.push_cached(e.log_id, e.payload.clone());
                i += 1;
                continue;
            }
            let Some(seg) = self.segment_of(i) else {
                // Below the first held index (purged, or never written): skip to what is held.
                // A missing index above it is a hole: stop there rather than skip it.
                let floor = self.purged.map_or(0, |p| p + 1);
                let below_start = self
                    .segments
                    .range(..=i)
                    .all(|(_, s)| s.next_index() <= floor);
                match self.segments.range(i + 1..).next() {
                    Some((first, _)) if *first < end && below_start => {
                        i = *first;
                        continue;
                    }
                    _ => break,
                }
            };
            let mut stop = end.min(seg.next_index());
            if !self.tail.entries.is_empty() && i < self.tail.first {
                stop = stop.min(self.tail.first);
            }
            let (stop, bytes) = seg.end_within(i, stop, left, plan.pieces.is_empty());
            if stop == i {
                break;
            }
            left = left.saturating_sub(bytes);
            plan.pieces.extend(seg.plan_read(i, stop).map(Piece::File));
            i = stop;
        }
        plan
    }
}

/// Entries to read, in order: some already in memory, some still to read from segment files.
#[derive(Default)]
struct ReadPlan {
    pieces: Vec<Piece>,
}

impl ReadPlan {
    fn reads_files(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::File(_)))
    }

    fn file_bytes(&self) -> u64 {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::File(r) => r.bytes(),
                Piece::Cached(_) => 0,
            })
            .sum()
    }
}

enum Piece {
    Cached(Vec<(LogId, EntryPayload)>),
    File(segment::SegmentRead),
}

impl ReadPlan {
    fn push_cached(&mut self, id: LogId, payload: EntryPayload) {
        if let Some(Piece::Cached(v)) = self.pieces.last_mut() {
            v.push((id, payload));
        } else {
            self.pieces.push(Piece::Cached(vec![(id, payload)]));
        }
    }

    /// Does the file reads (call it without the log's lock) and returns the entries in order.
    fn run(self) -> io::Result<Vec<(LogId, EntryPayload)>> {
        let mut out = Vec::new();
        for p in self.pieces {
            match p {
                Piece::Cached(mut v) => out.append(&mut v),
                Piece::File(r) => r.read(&mut out)?,
            }
        }
        Ok(out)
    }
}

/// About how many bytes `payload` takes encoded (exact for the data, a guess for the rest).
pub(crate) fn payload_len_hint(payload: &EntryPayload) -> usize {
    match payload {
        EntryPayload::Normal(p) => p.0.len() + 8,
        _ => 256,
    }
}

fn poisoned() -> io::Error {
    io::Error::other("log store lock poisoned by an earlier panic")
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn range_to(range: &impl RangeBounds<u64>, last: Option<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s + 1,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => e + 1,
        Bound::Excluded(e) => *e,
        Bound::Unbounded => last.map(|l| l + 1).unwrap_or(0),
    };
    (start, end)
}

impl LogReader {
    /// Reads committed or uncommitted entries `[start, end)` that are present; used by the broker to
    /// serve pulls. Stops early at a hole (purged or not yet written).
    pub fn read(&self, start: u64, end: u64) -> io::Result<Vec<(LogId, EntryPayload)>> {
        self.read_planned(|_| (start, end))
    }

    /// Reads the range `bounds` picks from the log's state: planned under the lock, the file reads
    /// done after releasing it.
    fn read_planned(
        &self,
        bounds: impl FnOnce(&Inner) -> (u64, u64),
    ) -> io::Result<Vec<(LogId, EntryPayload)>> {
        let plan = {
            let g = self.inner.read().map_err(|_| poisoned())?;
            let (start, end) = bounds(&g);
            g.plan_range(start, end)
        };
        plan.run()
    }

    /// While this member is repairing a log that lost entries it had stored (see
    /// [`RecoveryReport::repair_floor`]): (last index held, index it must reach). None once it
    /// has caught up; from then on it stays None.
    pub fn repairing(&self) -> Option<(u64, u64)> {
        let floor = self.repair.load(Ordering::Acquire);
        if floor == 0 {
            return None;
        }
        let last = self.inner.read().ok()?.last.map(|l| l.index).unwrap_or(0);
        if last >= floor {
            self.repair.store(0, Ordering::Release);
            tracing::info!(
                last,
                "log repaired from peers: voting and campaigning again"
            );
            return None;
        }
        Some((last, floor))
    }

    /// The first index still present in the log, if any.
    pub fn first_index(&self) -> Option<u64> {
        let g = self.inner.read().ok()?;
        g.segments
            .values()
            .find(|s| s.count() > 0)
            .map(|s| s.first_index())
    }
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let rows = self.read_planned(|g| range_to(&range, g.last.map(|l| l.index)))?;
        Ok(rows
            .into_iter()
            .map(|(log_id, payload)| Entry { log_id, payload })
            .collect())
    }

    /// A replication read: at most `append_bytes_max` bytes of entries (at least one), so an
    /// append to a far-behind follower carries a bounded amount of work whatever the entries'
    /// sizes. The file reads run on a blocking thread: reading old entries for a lagging follower
    /// never holds up the async workers that carry heartbeats and client requests.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, io::Error> {
        let budget = self.append_bytes_max.load(Ordering::Relaxed);
        let plan = {
            let g = self.inner.read().map_err(|_| poisoned())?;
            g.plan_range_within(start, end, budget)
        };
        let rows = if plan.reads_files() {
            let delay = self
                .pacer
                .delay_for(plan.file_bytes(), std::time::Instant::now());
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            tokio::task::spawn_blocking(move || plan.run())
                .await
                .map_err(|e| io::Error::other(format!("log read task failed: {e}")))??
        } else {
            plan.run()?
        };
        Ok(rows
            .into_iter()
            .map(|(log_id, payload)| Entry { log_id, payload })
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.meta.vote()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let purged = self.meta.purged()?;
        let g = self.inner.read().map_err(|_| poisoned())?;
        let last = g.last.or(purged);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.reader()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.barrier()?;
        self.meta.save_vote(vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.meta.save_committed(committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        // The committed id is written without a flush and may be ahead of what survived a crash
        // (committed by the others before this member's own fsync): never claim past the log.
        let committed = self.meta.committed()?;
        let g = self.inner.read().map_err(|_| poisoned())?;
        Ok(match (committed, g.last) {
            (Some(c), Some(l)) if c.index > l.index => Some(l),
            (Some(_), None) => None,
            (c, _) => c,
        })
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.pacer.note_appended(
            entries
                .iter()
                .map(|e| payload_len_hint(&e.payload) as u64)
                .sum(),
        );
        match self.write_entries(entries) {
            Ok(files) => {
                self.flusher.submit(FlushJob {
                    files,
                    done: FlushDone::Raft(callback),
                });
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        self.barrier()?;
        let mut g = self.inner.write().map_err(|_| poisoned())?;
        let keep_next = last_log_id.map(|l| l.index + 1).unwrap_or(0);
        g.tail.truncate_from(keep_next);
        let doomed: Vec<u64> = g.segments.range(keep_next..).map(|(k, _)| *k).collect();
        for first in doomed {
            if let Some(seg) = g.segments.remove(&first) {
                seg.remove()?;
            }
        }
        if let Some((_, seg)) = g.segments.range_mut(..keep_next).next_back() {
            seg.truncate_to(keep_next)?;
        }
        g.last = g.read_last_log_id()?.or(self.meta.purged()?);
        let dir = g.dir.clone();
        drop(g);
        sync_dir(&dir)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.meta.save_purged(&log_id)?;
        let mut g = self.inner.write().map_err(|_| poisoned())?;
        let n = g.segments.len();
        let doomed: Vec<u64> = g
            .segments
            .values()
            .take(n.saturating_sub(1))
            .filter(|s| s.next_index() <= log_id.index + 1)
            .map(|s| s.first_index())
            .collect();
        for first in doomed {
            if let Some(seg) = g.segments.remove(&first) {
                seg.remove()?;
            }
        }
        if g.last.is_none_or(|l| l.index < log_id.index) {
            g.last = Some(log_id);
        }
        g.purged = Some(log_id.index);
        g.tail.purge_to(log_id.index);
        let dir = g.dir.clone();
        drop(g);
        sync_dir(&dir)
    }
}

/// What to do once a flush completes.
enum FlushDone {
    Raft(IOFlushed<TypeConfig>),
    Barrier(mpsc::Sender<io::Result<()>>),
}

/// A file to fdatasync, with its path for the power-loss test aid.
#[derive(Clone)]
pub(crate) struct SyncTarget {
    pub(crate) file: Arc<File>,
    pub(crate) path: Arc<PathBuf>,
    pub(crate) uncache: Uncache,
}

/// The part of a segment to drop from the page cache once it is durable.
///
/// Why: a log written at full speed would otherwise grow the page cache by every byte written,
/// and each new page-cache page costs the kernel far more than a reused one (on this project's
/// 2-core VMs, touching never-used memory costs ~10 us per 4 KiB page against ~3 us for a page
/// freed a moment ago; appends of 128 KiB took 340 us instead of 60 us once the page cache had
/// grown by a few hundred MiB). Dropping what is durable and behind the window keeps the log's
/// page cache small, and new writes reuse pages just freed. Readers lose nothing they need from
/// memory: recent entries are served from the tail cache; older ones are read from the file.
#[derive(Clone)]
pub(crate) struct Uncache {
    /// Drop the pages below this offset (rounded down to a page).
    pub(crate) below: u64,
    /// The segment is sealed: drop all of it, however little is left.
    pub(crate) whole: bool,
    /// Below this offset, pages were already dropped (shared by the segment's targets).
    pub(crate) done_to: Arc<std::sync::atomic::AtomicU64>,
}

/// Less than this (of an active segment) is not worth a system call.
const UNCACHE_STEP_BYTES: u64 = 1 << 20;

impl Uncache {
    /// Only after the range was fsynced: `POSIX_FADV_DONTNEED` drops clean pages (dirty ones would
    /// be written back first, and kept). Advice only; a failure loses nothing and is ignored.
    fn apply(&self, file: &File) {
        use std::sync::atomic::Ordering;
        let below = self.below & !4095;
        let done = self.done_to.load(Ordering::Relaxed);
        let step = if self.whole { 1 } else { UNCACHE_STEP_BYTES };
        if below < done.saturating_add(step) {
            return;
        }
        let advised = nix::fcntl::posix_fadvise(
            file,
            done as i64,
            (below - done) as i64,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
        if advised.is_ok() {
            self.done_to.fetch_max(below, Ordering::Relaxed);
        }
    }
}

/// Set `RAFTMQ_TRACK_DURABLE=1` to have the flusher record, next to each segment, the length known
/// to be on disk after each fsync (`<segment>.durable`). Tests use it to simulate a power loss of
/// a killed node: every byte past the recorded length is dropped. Never set it in production: it
/// costs a small write per fsync.
static TRACK_DURABLE: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("RAFTMQ_TRACK_DURABLE").is_some_and(|v| v == "1"));

impl SyncTarget {
    fn sync(&self) -> io::Result<()> {
        let len = if *TRACK_DURABLE {
            Some(self.file.metadata()?.len())
        } else {
            None
        };
        let t = std::time::Instant::now();
        self.file.sync_data()?;
        crate::metrics::observe_fsync(t.elapsed());
        if let Some(len) = len {
            // Written whole or not at all (tmp + rename): a kill mid-write must not leave it empty.
            let tmp = self.path.with_extension("durable.tmp");
            std::fs::write(&tmp, len.to_le_bytes())?;
            std::fs::rename(&tmp, self.path.with_extension("durable"))?;
        }
        Ok(())
    }
}

/// Drops from every segment under `log_dir` what the flusher had not recorded as durable (see
/// `RAFTMQ_TRACK_DURABLE`): the state a power loss would leave. For tests of a stopped node.
pub fn simulate_power_loss(log_dir: &Path) -> io::Result<u64> {
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

struct FlushJob {
    files: Vec<SyncTarget>,
    done: FlushDone,
}

/// The group-commit thread: it takes every queued job, `fdatasync`s each distinct file once, then
/// completes the jobs in submission order.
#[derive(Clone)]
struct Flusher {
    tx: Arc<Mutex<mpsc::Sender<FlushJob>>>,
}

impl Flusher {
    fn start(mode: FlushMode) -> Flusher {
        let (tx, rx) = mpsc::channel::<FlushJob>();
        std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || flusher_loop(rx, mode))
            .expect("spawn the log flusher thread");
        Flusher {
            tx: Arc::new(Mutex::new(tx)),
        }
    }

    fn submit(&self, job: FlushJob) {
        let sent = self.tx.lock().map(|tx| tx.send(job));
        if let Ok(Err(mpsc::SendError(job))) = sent {
            complete(job.done, Err(io::Error::other("log flusher stopped")));
        }
    }
}

fn complete(done: FlushDone, r: io::Result<()>) {
    match done {
        FlushDone::Raft(cb) => cb.io_completed(r),
        FlushDone::Barrier(tx) => {
            let _ = tx.send(r);
        }
    }
}

fn flusher_loop(rx: mpsc::Receiver<FlushJob>, mode: FlushMode) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        let sync = matches!(mode, FlushMode::Fsync)
            || jobs.iter().any(|j| matches!(j.done, FlushDone::Barrier(_)));
        let mut result: io::Result<()> = Ok(());
        if sync {
            let mut synced: Vec<*const File> = Vec::new();
            'jobs: for j in &jobs {
                for t in &j.files {
                    let p = Arc::as_ptr(&t.file);
                    if synced.contains(&p) {
                        continue;
                    }
                    synced.push(p);
                    if let Err(e) = t.sync() {
                        result = Err(e);
                        break 'jobs;
                    }
                }
            }
        }
        if sync && result.is_ok() {
            for t in jobs.iter().flat_map(|j| &j.files) {
                t.uncache.apply(&t.file);
            }
        }
        for j in jobs {
            let r = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            complete(j.done, r);
        }
    }
}
