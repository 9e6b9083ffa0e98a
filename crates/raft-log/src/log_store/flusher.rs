//! The flusher: group commit of appended records.
//!
//! One thread per log takes every queued [`FlushJob`], `fdatasync`s each distinct file of the
//! round once, then completes the jobs in submission order: one fsync covers every append queued
//! before it. With [`FlushMode::UnsafeNoFsync`] a round syncs nothing unless it holds a barrier
//! (a barrier always waits for the disk).
//!
//! A follower's lone append may run its round inline instead ([`Flusher::try_inline`]): on the
//! calling task, when no round runs and nothing waits for the thread. One at a time, that saves
//! the two thread hand-offs (to the flusher and back) on the path of every answer to the leader.
//!
//! On failure: if any fsync of a round fails, every job of that round completes with the error
//! (openraft then stops the member: what was written may not be on disk). If the thread is gone,
//! a submitted job completes at once with "log flusher stopped".
//!
//! After a successful fsync the flusher drops the durable pages behind a window from the page
//! cache ([`Uncache`]). With the `testing` feature it also records each synced length for the
//! power-loss aid (see `power_loss`).

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use openraft::storage::IOFlushed;

use crate::config::FlushMode;
use crate::types::TypeConfig;

/// What to do once a flush completes.
pub(super) enum FlushDone {
    /// An append: tell openraft its entries are stored.
    Raft(IOFlushed<TypeConfig>),
    /// A barrier: wake the caller waiting for every earlier append to be durable.
    Barrier(mpsc::Sender<io::Result<()>>),
}

/// Files to make durable, and whom to tell once they are.
pub(super) struct FlushJob {
    pub(super) files: Vec<SyncTarget>,
    pub(super) done: FlushDone,
}

/// A file to fdatasync, with its path for errors and the power-loss test aid.
#[derive(Clone)]
pub(crate) struct SyncTarget {
    pub(crate) file: Arc<File>,
    pub(crate) path: Arc<PathBuf>,
    /// The segment's length when the target was taken (the file may be preallocated past it).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) len: u64,
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
    pub(crate) done_to: Arc<AtomicU64>,
}

/// Less than this (of an active segment) is not worth a system call.
const UNCACHE_STEP_BYTES: u64 = 1 << 20;

impl Uncache {
    /// The byte range `[from, to)` to advise away, given what was dropped already (`done`); None
    /// when it is not worth a system call.
    fn range(&self, done: u64) -> Option<(u64, u64)> {
        let below = self.below & !4095;
        let step = if self.whole { 1 } else { UNCACHE_STEP_BYTES };
        (below >= done.saturating_add(step)).then_some((done, below))
    }

    /// Only after the range was fsynced: `POSIX_FADV_DONTNEED` drops clean pages (dirty ones would
    /// be written back first, and kept). Advice only; a failure loses nothing and is ignored.
    fn apply(&self, file: &File) {
        let Some((from, to)) = self.range(self.done_to.load(Ordering::Relaxed)) else {
            return;
        };
        let advised = nix::fcntl::posix_fadvise(
            file,
            from as i64,
            (to - from) as i64,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
        if advised.is_ok() {
            self.done_to.fetch_max(to, Ordering::Relaxed);
        }
    }
}

impl SyncTarget {
    fn sync(&self) -> io::Result<()> {
        #[cfg(feature = "testing")]
        let len = super::power_loss::length_to_record(self.len);
        let t = std::time::Instant::now();
        self.file.sync_data().map_err(|e| {
            io::Error::new(e.kind(), format!("fdatasync {}: {e}", self.path.display()))
        })?;
        crate::metrics::observe_fsync(t.elapsed());
        #[cfg(feature = "testing")]
        if let Some(len) = len {
            super::power_loss::record_durable(&self.path, len)?;
        }
        Ok(())
    }
}

/// The handle to the group-commit thread; the thread ends once every handle is dropped.
#[derive(Clone)]
pub(super) struct Flusher {
    tx: Arc<Mutex<mpsc::Sender<FlushJob>>>,
    rounds: Arc<Rounds>,
    mode: FlushMode,
}

/// What the thread and inline rounds share, so rounds never overlap and complete in order.
struct Rounds {
    /// Jobs submitted to the thread and not completed yet.
    queued: AtomicUsize,
    /// Held while a round runs, on the thread or inline.
    running: Mutex<()>,
    /// When the last round ended, in nanoseconds since `epoch`.
    last_end_ns: AtomicU64,
    epoch: Instant,
}

impl Rounds {
    fn run(&self, jobs: Vec<FlushJob>, mode: FlushMode) {
        let _running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let n = jobs.len();
        run_round(jobs, mode);
        self.note_end();
        self.queued.fetch_sub(n, Ordering::SeqCst);
    }

    fn note_end(&self) {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        self.last_end_ns.store(ns, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let now = self.epoch.elapsed().as_nanos() as u64;
        Duration::from_nanos(now.saturating_sub(self.last_end_ns.load(Ordering::Relaxed)))
    }
}

impl Flusher {
    pub(super) fn start(mode: FlushMode) -> Flusher {
        let (tx, rx) = mpsc::channel::<FlushJob>();
        let rounds = Arc::new(Rounds {
            queued: AtomicUsize::new(0),
            running: Mutex::new(()),
            last_end_ns: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        let on_thread = rounds.clone();
        std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || flusher_loop(rx, mode, &on_thread))
            .expect("spawn the log flusher thread");
        Flusher {
            tx: Arc::new(Mutex::new(tx)),
            rounds,
            mode,
        }
    }

    /// Queues a job; it completes (with an error if the thread is gone) on the flusher thread.
    pub(super) fn submit(&self, job: FlushJob) {
        self.rounds.queued.fetch_add(1, Ordering::SeqCst);
        let sent = self.tx.lock().map(|tx| tx.send(job));
        if let Ok(Err(mpsc::SendError(job))) = sent {
            self.rounds.queued.fetch_sub(1, Ordering::SeqCst);
            complete(job.done, Err(io::Error::other("log flusher stopped")));
        }
    }

    /// Runs `job`'s round here, blocking the caller for its fsync, when the flusher is idle: no
    /// round running, nothing queued for the thread, and the last round ended at least
    /// `idle_min` ago (appends arriving back to back go to the thread, where one fsync covers
    /// several). Order holds: every earlier job has completed, and a later one waits for this
    /// round. Otherwise hands the job back.
    pub(super) fn try_inline(&self, job: FlushJob, idle_min: Duration) -> Result<(), FlushJob> {
        let r = &self.rounds;
        if r.queued.load(Ordering::SeqCst) != 0 || r.idle_for() < idle_min {
            return Err(job);
        }
        let Ok(_running) = r.running.try_lock() else {
            return Err(job);
        };
        if r.queued.load(Ordering::SeqCst) != 0 {
            return Err(job);
        }
        run_round(vec![job], self.mode);
        r.note_end();
        crate::metrics::note_inline_round();
        Ok(())
    }

    /// Blocks until every job submitted before it (and `files`) is on disk. Call it off the async
    /// runtime's workers.
    pub(super) fn barrier(&self, files: Vec<SyncTarget>) -> io::Result<()> {
        let (tx, rx) = mpsc::channel();
        self.submit(FlushJob {
            files,
            done: FlushDone::Barrier(tx),
        });
        rx.recv()
            .map_err(|_| io::Error::other("log flusher stopped"))?
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

/// The files of a round, each distinct file once, in the order the jobs name them.
fn distinct_files(jobs: &[FlushJob]) -> Vec<&SyncTarget> {
    let mut seen: Vec<*const File> = Vec::new();
    let mut out: Vec<&SyncTarget> = Vec::new();
    for t in jobs.iter().flat_map(|j| &j.files) {
        let p = Arc::as_ptr(&t.file);
        match seen.iter().position(|s| *s == p) {
            // The one fsync covers the file's later writes too: its target with the longest
            // length (what the power-loss aid records as durable).
            Some(i) if t.len > out[i].len => out[i] = t,
            Some(_) => {}
            None => {
                seen.push(p);
                out.push(t);
            }
        }
    }
    out
}

/// Whether a round must reach the disk: always with fsync on, and for any barrier.
fn must_sync(mode: FlushMode, jobs: &[FlushJob]) -> bool {
    matches!(mode, FlushMode::Fsync) || jobs.iter().any(|j| matches!(j.done, FlushDone::Barrier(_)))
}

/// Runs one round: syncs, drops durable pages from the page cache, completes the jobs in order.
fn run_round(jobs: Vec<FlushJob>, mode: FlushMode) {
    let sync = must_sync(mode, &jobs);
    let mut result: io::Result<()> = Ok(());
    if sync {
        result = distinct_files(&jobs).into_iter().try_for_each(|t| t.sync());
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

fn flusher_loop(rx: mpsc::Receiver<FlushJob>, mode: FlushMode, rounds: &Rounds) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        rounds.run(jobs, mode);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn target(file: &Arc<File>, path: &std::path::Path, below: u64, whole: bool) -> SyncTarget {
        SyncTarget {
            file: file.clone(),
            path: Arc::new(path.to_path_buf()),
            len: 0,
            uncache: Uncache {
                below,
                whole,
                done_to: Arc::default(),
            },
        }
    }

    fn barrier_job(files: Vec<SyncTarget>) -> (FlushJob, mpsc::Receiver<io::Result<()>>) {
        let (tx, rx) = mpsc::channel();
        (
            FlushJob {
                files,
                done: FlushDone::Barrier(tx),
            },
            rx,
        )
    }

    #[test]
    fn t01_uncache_waits_for_a_step_unless_the_segment_is_sealed() {
        let u = |below, whole| Uncache {
            below,
            whole,
            done_to: Arc::default(),
        };
        // Active segment: less than a step past what was dropped is not worth a call.
        assert_eq!(u(UNCACHE_STEP_BYTES - 1, false).range(0), None);
        assert_eq!(
            u(UNCACHE_STEP_BYTES, false).range(0),
            Some((0, UNCACHE_STEP_BYTES))
        );
        assert_eq!(u(UNCACHE_STEP_BYTES + 4095, false).range(4096), None);
        assert_eq!(
            u(UNCACHE_STEP_BYTES + 4096, false).range(4096),
            Some((4096, UNCACHE_STEP_BYTES + 4096))
        );
        // Offsets round down to a page.
        assert_eq!(
            u(2 * UNCACHE_STEP_BYTES + 100, false).range(0),
            Some((0, 2 * UNCACHE_STEP_BYTES))
        );
        // Sealed: any whole page left goes.
        assert_eq!(u(8192, true).range(4096), Some((4096, 8192)));
        assert_eq!(u(4095, true).range(0), None);
    }

    #[test]
    fn t02_a_round_syncs_each_distinct_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let (pa, pb) = (dir.path().join("a"), dir.path().join("b"));
        let a = Arc::new(File::create(&pa).unwrap());
        let b = Arc::new(File::create(&pb).unwrap());
        let (j1, _r1) = barrier_job(vec![target(&a, &pa, 0, false)]);
        let (j2, _r2) = barrier_job(vec![target(&b, &pb, 0, false), target(&a, &pa, 0, false)]);
        let (j3, _r3) = barrier_job(vec![target(&b, &pb, 0, false)]);
        let jobs = vec![j1, j2, j3];
        let files: Vec<*const File> = distinct_files(&jobs)
            .iter()
            .map(|t| Arc::as_ptr(&t.file))
            .collect();
        assert_eq!(files, vec![Arc::as_ptr(&a), Arc::as_ptr(&b)]);
    }

    #[test]
    fn t06_a_file_synced_once_for_several_appends_counts_its_longest_length() {
        let dir = tempfile::tempdir().unwrap();
        let pa = dir.path().join("a");
        let a = Arc::new(File::create(&pa).unwrap());
        let at = |len| SyncTarget {
            len,
            ..target(&a, &pa, 0, false)
        };
        let (j1, _r1) = barrier_job(vec![at(100)]);
        let (j2, _r2) = barrier_job(vec![at(250)]);
        let (j3, _r3) = barrier_job(vec![at(180)]);
        let jobs = vec![j1, j2, j3];
        let lens: Vec<u64> = distinct_files(&jobs).iter().map(|t| t.len).collect();
        assert_eq!(lens, vec![250]);
    }

    #[test]
    fn t03_only_fsync_mode_or_a_barrier_reaches_the_disk() {
        let (barrier, _rx) = barrier_job(Vec::new());
        assert!(must_sync(FlushMode::Fsync, &[]));
        assert!(!must_sync(FlushMode::UnsafeNoFsync, &[]));
        assert!(must_sync(FlushMode::UnsafeNoFsync, &[barrier]));
    }

    #[test]
    fn t04_barriers_complete_after_their_files_are_synced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap(),
        );
        (&*file).write_all(b"records").unwrap();
        let flusher = Flusher::start(FlushMode::UnsafeNoFsync);
        // Several barriers from several threads: each completes, each with success.
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (f, t) = (flusher.clone(), target(&file, &path, 0, false));
                std::thread::spawn(move || f.barrier(vec![t]))
            })
            .collect();
        for h in handles {
            h.join().unwrap().unwrap();
        }
        flusher.barrier(Vec::new()).unwrap();
    }

    #[test]
    fn t05_a_stopped_flusher_fails_every_job() {
        let (tx, rx) = mpsc::channel::<FlushJob>();
        drop(rx);
        let mut flusher = Flusher::start(FlushMode::Fsync);
        flusher.tx = Arc::new(Mutex::new(tx));
        let err = flusher.barrier(Vec::new()).unwrap_err();
        assert!(err.to_string().contains("log flusher stopped"), "{err}");
    }

    #[test]
    fn t07_a_lone_job_runs_inline_only_while_the_flusher_is_idle() {
        let dir = tempfile::tempdir().unwrap();
        let pa = dir.path().join("a");
        let a = Arc::new(File::create(&pa).unwrap());
        let flusher = Flusher::start(FlushMode::Fsync);
        let hour = Duration::from_secs(3600);
        // The last round ended less than the idle time ago: handed back, not completed.
        let (job, rx) = barrier_job(vec![target(&a, &pa, 0, false)]);
        let job = flusher.try_inline(job, hour).unwrap_err();
        assert!(rx.try_recv().is_err());
        // Idle: completed here, before the call returns.
        assert!(flusher.try_inline(job, Duration::ZERO).is_ok());
        assert!(rx.try_recv().unwrap().is_ok());
        // A job waits for the thread: handed back (it must complete first).
        flusher.rounds.queued.fetch_add(1, Ordering::SeqCst);
        let (job, rx) = barrier_job(vec![target(&a, &pa, 0, false)]);
        let job = flusher.try_inline(job, Duration::ZERO).unwrap_err();
        flusher.rounds.queued.fetch_sub(1, Ordering::SeqCst);
        // A round runs: handed back.
        let running = flusher.rounds.running.lock().unwrap();
        let job = flusher.try_inline(job, Duration::ZERO).unwrap_err();
        drop(running);
        assert!(rx.try_recv().is_err());
        // Through the thread it completes as before, and the count of queued jobs returns to 0.
        flusher.submit(job);
        assert!(rx.recv().unwrap().is_ok());
        // (The thread counts a round's jobs off just after completing them.)
        let deadline = Instant::now() + Duration::from_secs(5);
        while flusher.rounds.queued.load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(flusher.rounds.queued.load(Ordering::SeqCst), 0);
    }
}
