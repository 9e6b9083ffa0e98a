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
//! - `save_vote`, `truncate_after` and `purge` do their blocking work (waiting for the flusher,
//!   fsyncs, sled flushes) on a blocking thread, never on one of the runtime's workers.
//! - Any I/O error is returned to openraft (or passed to the callback), which then stops the node:
//!   a member whose storage fails must not keep voting.
//!
//! This module is the façade implementing openraft's storage traits; the parts live in:
//! - [`record`]: the byte-level record format; `segment`: one segment file and its index;
//! - `append`: the write path (records into the active segment, rolling segments);
//! - `recovery`: what `open` does, planned from what is on disk and then applied;
//! - `flusher`: the group-commit thread that `fdatasync`s appends and barriers;
//! - `tail_cache`: the newest entries in memory; `read_plan`: which entries of a range come
//!   from memory and which from which file;
//! - `pacer`: pacing of catch-up reads; [`meta`]: vote, committed and purge point in sled;
//! - `power_loss` (feature `testing` only): the power-loss test aid.

mod append;
mod flusher;
pub mod meta;
mod pacer;
#[cfg(feature = "testing")]
mod power_loss;
mod read_plan;
pub mod record;
mod recovery;
mod segment;
mod tail_cache;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::File;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use openraft::OptionalSend;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};

use crate::config::FlushMode;
use crate::types::{Entry, EntryPayload, LogId, TypeConfig, Vote};
use flusher::{FlushDone, FlushJob, Flusher};
pub(crate) use flusher::{SyncTarget, Uncache};
use meta::Meta;
#[cfg(feature = "testing")]
pub use power_loss::simulate_power_loss;
use segment::Segment;
use tail_cache::TailCache;

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

/// The durable Raft log of one member.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<RwLock<Inner>>,
    meta: Meta,
    flusher: Flusher,
    repair: Arc<AtomicU64>,
    append_bytes_max: Arc<AtomicU64>,
    pacer: Arc<pacer::Pacer>,
    /// This member's node id (0: not set, no append runs its flush inline).
    own_id: Arc<AtomicU64>,
}

/// A follower's append runs its flush inline (see `flusher`) only when the last flush ended at
/// least this long ago. One send at a time, a follower's appends come ~400 us apart here; under
/// load they come back to back and go to the flusher thread, whose one fsync covers several.
const INLINE_FLUSH_IDLE_MIN: std::time::Duration = std::time::Duration::from_micros(150);

/// ... and only when it carries at most this many payload bytes. A flush inline blocks the
/// runtime worker it runs on, and with it the node's other work (one worker per node when nodes
/// share a machine). Without this cap, 1,000 topics x 8 queues (`SendMany` entries of many
/// queues' messages, each followed by a heavy apply) lost 10 % to inline flushes (interleaved
/// pairs: 65,502 / 66,257 / 62,199 -> 57,094 / 60,168 / 54,541 msg/s); with it, the pairs were
/// within the noise (63,652 / 67,419 / 57,378 against 68,982 / 60,793 / 58,555).
const INLINE_FLUSH_BYTES_MAX: u64 = 16 << 10;

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
    /// Opens (or creates) the log in `dir`, validating every record (but those of sealed segments
    /// with an index file) and cutting a torn tail.
    pub fn open(
        dir: &Path,
        meta: Meta,
        segment_bytes_max: u64,
        flush_mode: FlushMode,
        page_cache_window_bytes: u64,
    ) -> io::Result<(Self, RecoveryReport)> {
        std::fs::create_dir_all(dir)?;
        #[cfg(feature = "testing")]
        power_loss::note_tracking(dir)?;
        let purged = meta.purged()?;
        let committed = meta.committed()?;
        let (scanned, found) = recovery::survey(dir)?;
        let plan = recovery::plan(&found, purged.map(|p| p.index), committed.map(|c| c.index));
        let segments = recovery::apply(dir, scanned, &plan)?;
        // Sealed segments read whole (written by an older build, or whose index was lost) get
        // their index file now.
        let sealed = segments.len().saturating_sub(1);
        for seg in segments.values().take(sealed) {
            if seg.count() > 0
                && !seg.has_index()
                && let Err(e) = seg.write_index()
            {
                tracing::warn!(error = %e, "writing a sealed segment's index file");
            }
        }
        let report = plan.report;
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
        let flusher = Flusher::start(flush_mode);
        Ok((
            LogStore {
                inner: Arc::new(RwLock::new(inner)),
                meta,
                flusher,
                repair: Arc::new(AtomicU64::new(report.repair_floor)),
                append_bytes_max: Arc::new(AtomicU64::new(APPEND_BYTES_MAX_DEFAULT)),
                pacer: Arc::new(pacer::Pacer::new(std::time::Instant::now())),
                own_id: Arc::new(AtomicU64::new(0)),
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

    /// This member's node id: appends of entries another leader proposed (a follower's) may then
    /// run their flush inline when the flusher is idle. A leader's own appends always go to the
    /// flusher thread, so its fsync runs alongside replication rather than before it.
    pub fn set_own_id(&self, node_id: u64) {
        self.own_id.store(node_id, Ordering::Relaxed);
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

    /// Blocks until every append submitted so far is on disk. Call it off the runtime's workers.
    fn barrier(&self) -> io::Result<()> {
        let file = {
            let g = self.inner.read().map_err(|_| poisoned())?;
            g.segments.values().next_back().map(|s| s.sync_target(0))
        };
        self.flusher.barrier(file.into_iter().collect())
    }

    /// Runs `f`, which blocks (a wait for the flusher, an fsync, a sled flush), on a blocking
    /// thread and waits for it: the runtime's workers keep carrying heartbeats and client requests
    /// meanwhile, and the caller still returns only once `f` is done.
    async fn off_runtime(
        &self,
        what: &'static str,
        f: impl FnOnce(&LogStore) -> io::Result<()> + Send + 'static,
    ) -> io::Result<()> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| io::Error::other(format!("{what} task failed: {e}")))?
    }

    /// Cuts every entry after `last_log_id`, durably. Blocks.
    fn truncate_after_now(&self, last_log_id: Option<LogId>) -> io::Result<()> {
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

    /// Records the purge point, then deletes the sealed segments wholly at or below it, durably.
    /// Blocks.
    fn purge_now(&self, log_id: LogId) -> io::Result<()> {
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

impl Inner {
    fn read_last_log_id(&self) -> io::Result<Option<LogId>> {
        for s in self.segments.values().rev() {
            if s.count() > 0 {
                return Ok(Some(s.read_header(s.next_index() - 1)?.log_id()));
            }
        }
        Ok(None)
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

    /// Durable before it returns, and never ahead of the log: waits for every earlier append to be
    /// on disk, then writes and flushes the vote. Both steps block, so they run on a blocking
    /// thread rather than on one of the runtime's workers.
    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let vote = *vote;
        self.off_runtime("vote write", move |s| {
            s.barrier()?;
            s.meta.save_vote(&vote)
        })
        .await
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
        let bytes: u64 = entries
            .iter()
            .map(|e| payload_len_hint(&e.payload) as u64)
            .sum();
        let own = self.own_id.load(Ordering::Relaxed);
        // A follower's small append (entries another leader proposed) may flush inline.
        let may_inline = own != 0
            && bytes <= INLINE_FLUSH_BYTES_MAX
            && entries
                .first()
                .is_some_and(|e| e.log_id.leader_id.node_id != own);
        self.pacer.note_appended(bytes);
        match self.write_entries(entries) {
            Ok(files) => {
                let job = FlushJob {
                    files,
                    done: FlushDone::Raft(callback),
                };
                let job = if may_inline {
                    self.flusher.try_inline(job, INLINE_FLUSH_IDLE_MIN).err()
                } else {
                    Some(job)
                };
                if let Some(job) = job {
                    self.flusher.submit(job);
                }
                Ok(())
            }
            Err(e) => {
                callback.io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        self.off_runtime("log truncation", move |s| s.truncate_after_now(last_log_id))
            .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.off_runtime("log purge", move |s| s.purge_now(log_id))
            .await
    }
}
