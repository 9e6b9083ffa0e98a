//! The state-machine seam: the broker's state machine implements [`StateMachine`]; the adapter here
//! turns it into openraft's `RaftStateMachine`.
//!
//! The state machine is in memory. On restart the member loads its restart images ([`restart`]):
//! the state and what apply built as of a recent entry, so openraft re-applies only the entries
//! after it. Without usable images openraft installs the last persisted snapshot (if any) and
//! re-applies every retained entry up to the persisted committed index, so the consume-queue index
//! is rebuilt from the log itself. Snapshots carry state, never message bodies.
//!
//! ## `sm/snapshot.bin`, format version 1
//!
//! The postcard encoding of [`SnapshotFile`], with no header (as every earlier build wrote it):
//! openraft's `SnapshotMeta` (last log id as `Option<LogId>`, then the last membership with its log
//! id, voter sets and nodes), then the state machine's bytes as a length-prefixed byte string. A
//! later version begins with the envelope of [`format`]; a file in a version newer than
//! [`SNAPSHOT_FILE_FORMAT_VERSION`] stops the member at start with a message that says so. The
//! state machine's bytes carry their own version (the broker's `BrokerState`), since they also
//! travel alone to a peer that installs the snapshot.

mod checkpoints;
pub mod format;
pub mod restart;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use checkpoints::{Checkpoints, Measured};
use futures::StreamExt;
use openraft::OptionalSend;
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use serde::{Deserialize, Serialize};

use crate::types::{EntryPayload, LogId, Payload, SnapshotMeta, StoredMembership, TypeConfig};

/// The application state machine of a broker group.
///
/// `apply` is called once per committed entry, in log order, on every member. It must be
/// deterministic: the same entries yield the same state and replies everywhere.
pub trait StateMachine: Send + Sync + 'static {
    /// Applies a committed entry with application data and returns the reply for the proposer.
    fn apply(&mut self, index: u64, term: u64, payload: &[u8]) -> Bytes;
    /// What the adapter calls for each entry with application data. An error stops the member
    /// (openraft takes it as a fatal storage error): a state machine returns one for an entry it
    /// must not apply, such as one in a format newer than it reads ([`format::NewerFormat`]),
    /// since skipping it would make this replica diverge. The default never fails.
    fn try_apply(&mut self, index: u64, term: u64, payload: &[u8]) -> io::Result<Bytes> {
        Ok(self.apply(index, term, payload))
    }
    /// [`StateMachine::try_apply`] of an entry no proposer waits on (every entry a follower
    /// applies, and a restarted member's re-applied ones): the same change to the state, but the
    /// reply is not wanted, so a state machine may skip building it. The default applies the
    /// entry and drops the reply.
    fn try_apply_unanswered(&mut self, index: u64, term: u64, payload: &[u8]) -> io::Result<()> {
        self.try_apply(index, term, payload).map(drop)
    }
    /// Notes an entry without application data (a leader's blank entry, a membership change).
    fn apply_empty(&mut self, _index: u64) {}
    /// Serialises the state (not the messages) as of the last applied entry.
    fn snapshot(&self) -> Vec<u8>;
    /// As [`StateMachine::snapshot`], into `buf` (cleared first) where the state machine can:
    /// apply hands it the buffer of a checkpoint it dropped, so a large state is not written
    /// into freshly faulted pages at every checkpoint.
    fn snapshot_into(&self, buf: Vec<u8>) -> Vec<u8> {
        drop(buf);
        self.snapshot()
    }
    /// Replaces the whole state with a snapshot's.
    fn restore(&mut self, data: &[u8]) -> io::Result<()>;
    /// A restart image ([`restart`]) of the state as it is now: what apply built for the entries
    /// after `since` (the index of the previous image, or of the state the member started from),
    /// taken here, while apply waits, and encoded by the image writer's thread, off the apply
    /// path ([`ImageEncoder`]). None: this state machine keeps no images, and a restart
    /// re-applies the retained log.
    fn restart_image(&self, _since: u64) -> Option<ImageEncoder> {
        None
    }
    /// Replaces the whole state with the one `images` (oldest first, a chain from
    /// [`StateMachine::restart_image`]) describe. An error leaves the state as it was; the member
    /// then starts from its snapshot and re-applies the log.
    fn load_restart_images(&mut self, _images: &[Vec<u8>]) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this state machine keeps no restart images",
        ))
    }
}

/// A restart image taken at an entry ([`StateMachine::restart_image`]), still to be encoded: given
/// the state's [`StateMachine::snapshot`] at that entry (which the adapter took for a checkpoint;
/// an image holds it rather than serialising the state again), the image's bytes. Called on the
/// image writer's thread: at 1,000 topics × 8 queues encoding what apply built since the last
/// image (a run per message) held apply up for ~20 ms per image on every node (issue 20).
pub type ImageEncoder = Box<dyn FnOnce(&[u8]) -> Vec<u8> + Send>;

/// A state machine that keeps nothing: applies to an empty reply, snapshots to no bytes. For
/// tests of the log, the storage and the formats, where the applied state does not matter
/// (re-exported as `testkit::NoState`).
#[cfg(any(test, feature = "testing"))]
pub struct NoState;

#[cfg(any(test, feature = "testing"))]
impl StateMachine for NoState {
    fn apply(&mut self, _index: u64, _term: u64, _payload: &[u8]) -> Bytes {
        Bytes::new()
    }
    fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }
    fn restore(&mut self, _data: &[u8]) -> io::Result<()> {
        Ok(())
    }
}

pub type Snapshot = openraft::storage::Snapshot<
    openraft::impls::leader_id_adv::LeaderId<u64, u64>,
    u64,
    openraft::BasicNode,
    Vec<u8>,
>;

/// The format version of `sm/snapshot.bin` this build writes and the newest it reads.
pub const SNAPSHOT_FILE_FORMAT_VERSION: u32 = 1;

/// A checkpoint, or a restart image, is taken only after this many times the state's size (as
/// last serialised) was applied since the last one of its kind, on top of
/// `checkpoint_every_entries` and `restart_image_bytes`, so the bytes serialised per byte applied
/// stay bounded however large the state grows. Measured (issue 20): at 1,000 topics the producer
/// windows made a state of 16–18 MB after 3–4 million messages, and a checkpoint every 1,024
/// entries plus an image every 128 MiB took ~10 % of the leader's CPU (apply's serialisation
/// 5.1 %, the image writer 4.7 %). The price: a restart re-applies up to this many times the
/// state's size of log (~590 MB for an 18 MB state), and a retention trim may keep as much more
/// log than its point asks for; both at most [`STATE_REWRITE_BYTES_MAX`].
pub const STATE_REWRITE_RATIO: u64 = 32;
/// The most log [`STATE_REWRITE_RATIO`] may put between two checkpoints (1 GiB): a state of
/// hundreds of megabytes is rewritten more often than the ratio says rather than leave a
/// restart gigabytes to re-apply, or a retention trim that much log to keep.
pub const STATE_REWRITE_BYTES_MAX: u64 = 1 << 30;
const _: () = assert!(STATE_REWRITE_RATIO >= 1);
const _: () = assert!(STATE_REWRITE_BYTES_MAX >= crate::config::RESTART_IMAGE_BYTES_DEFAULT);

/// Members of a group start their checkpoint and image counters at this many different points
/// ([`Shared::stagger`]): three, the usual group, each a third of `raft.restart_image_bytes`
/// from the next.
pub const STAGGER_PHASES: u64 = 3;
const _: () = assert!(STAGGER_PHASES >= 1);

/// How far ahead node `node_id` starts its counters, for images every `every_bytes`.
fn stagger_bytes(every_bytes: u64, node_id: u64) -> u64 {
    every_bytes / STAGGER_PHASES * (node_id % STAGGER_PHASES)
}

/// `sm/snapshot.bin` (format version 1, byte layout in the module doc). Field order is the order on
/// disk: never reorder or change the fields; a new layout is a new format version.
#[derive(Clone, Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    /// One byte string (postcard writes it as it would a sequence of `u8`, in one copy).
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

impl Measured for SnapshotFile {
    fn bytes(&self) -> u64 {
        self.data.len() as u64
    }
}

impl SnapshotFile {
    /// Reads a snapshot file; `path` names it in errors.
    fn decode(path: &Path, bytes: &[u8]) -> io::Result<SnapshotFile> {
        let (_version, body) = format::versioned(
            || format!("snapshot file {}", path.display()),
            bytes,
            SNAPSHOT_FILE_FORMAT_VERSION,
        )?;
        postcard::from_bytes(body).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }

    /// Version 1 is written bare, as every earlier build wrote it.
    fn encode(&self) -> io::Result<Vec<u8>> {
        let out = Vec::with_capacity(self.data.len() + 256);
        crate::encoding::postcard_extend(self, out).map_err(io::Error::other)
    }
}

/// Shared between the adapter (owned by openraft) and the broker, which reads the state.
pub struct Shared<S> {
    pub sm: RwLock<S>,
    applied: Mutex<(Option<LogId>, StoredMembership)>,
    snapshot_path: PathBuf,
    current: Mutex<Option<SnapshotFile>>,
    /// Checkpoints of the state taken while applying (every `RaftConfig::checkpoint_every_entries`
    /// entries, and with every restart image), keyed by log index. A snapshot is the newest
    /// checkpoint at or below the compaction target, so a peer that installs it replicates every
    /// entry the log still retains after it.
    checkpoints: Mutex<Checkpoints<SnapshotFile>>,
    /// The index compaction wants a snapshot for (set by `Member::compact`).
    pub(crate) target: std::sync::atomic::AtomicU64,
    /// Apply takes a checkpoint of the (small) state once this many entries were applied since
    /// the last one, and with every restart image.
    checkpoint_every: u64,
    /// The index of the last checkpoint taken.
    last_checkpoint: std::sync::atomic::AtomicU64,
    /// Payload bytes applied since the last checkpoint.
    checkpoint_since: std::sync::atomic::AtomicU64,
    /// Bytes of the last checkpoint taken: the size of the state as serialised, which paces the
    /// next checkpoint and image ([`STATE_REWRITE_RATIO`]).
    state_bytes: std::sync::atomic::AtomicU64,
    /// Checkpoints taken since start (images included).
    checkpoints_taken: std::sync::atomic::AtomicU64,
    /// Restart images ([`restart`]); None when `raft.restart_image_bytes` is 0.
    images: Option<Images>,
}

/// The restart images of a member.
struct Images {
    dir: PathBuf,
    /// Payload bytes applied between images.
    every_bytes: u64,
    writer: Mutex<restart::Writer>,
    /// (index of the previous image or of the state started from, payload bytes applied since).
    since: Mutex<(u64, u64)>,
}

/// What loading restart images at start found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartLoad {
    /// Images loaded (0: none usable; the member re-applies from its snapshot).
    pub images: usize,
    /// The index the state was loaded at.
    pub index: u64,
    /// Bytes of the image files read.
    pub bytes: u64,
    pub millis: u64,
}

impl<S> Shared<S> {
    pub fn last_applied(&self) -> Option<LogId> {
        self.applied.lock().ok().and_then(|g| g.0)
    }
}

pub struct Adapter<S> {
    shared: Arc<Shared<S>>,
}

impl<S: StateMachine> Adapter<S> {
    /// `restart_image_bytes`: payload bytes applied between restart images (0: none).
    pub fn new(
        sm: S,
        dir: &Path,
        checkpoint_every: u64,
        restart_image_bytes: u64,
    ) -> io::Result<(Adapter<S>, Arc<Shared<S>>)> {
        std::fs::create_dir_all(dir)?;
        let snapshot_path = dir.join("snapshot.bin");
        let current = match std::fs::read(&snapshot_path) {
            Ok(b) => Some(SnapshotFile::decode(&snapshot_path, &b)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let images_dir = dir.join("restart");
        let images = if restart_image_bytes == 0 {
            None
        } else {
            let floor = current
                .as_ref()
                .and_then(|f| f.meta.last_log_id.map(|l| l.index))
                .unwrap_or(0);
            Some(Images {
                writer: Mutex::new(restart::Writer::start(images_dir.clone())?),
                dir: images_dir,
                every_bytes: restart_image_bytes,
                since: Mutex::new((floor, 0)),
            })
        };
        let shared = Arc::new(Shared {
            sm: RwLock::new(sm),
            applied: Mutex::new((None, StoredMembership::default())),
            snapshot_path,
            current: Mutex::new(current),
            checkpoints: Mutex::new(Checkpoints::new(
                checkpoints::CHECKPOINTS_MAX,
                checkpoints::CHECKPOINTS_BYTES_MAX,
            )),
            target: std::sync::atomic::AtomicU64::new(0),
            checkpoint_every: checkpoint_every.max(1),
            last_checkpoint: std::sync::atomic::AtomicU64::new(0),
            checkpoint_since: std::sync::atomic::AtomicU64::new(0),
            state_bytes: std::sync::atomic::AtomicU64::new(0),
            checkpoints_taken: std::sync::atomic::AtomicU64::new(0),
            images,
        });
        Ok((
            Adapter {
                shared: shared.clone(),
            },
            shared,
        ))
    }
}

fn lock_err() -> io::Error {
    io::Error::other("state machine lock poisoned by an earlier panic")
}

impl<S: StateMachine> Shared<S> {
    /// Loads the restart images ([`restart`]) whose last entry `holds` says the log still has
    /// (same index and term), before openraft starts: the member then re-applies only what came
    /// after. Images that cannot be used are removed, and the state stays as it was.
    pub fn load_restart_images(&self, holds: impl Fn(&LogId) -> bool) -> io::Result<RestartLoad> {
        let started = std::time::Instant::now();
        let mut found = RestartLoad {
            images: 0,
            index: 0,
            bytes: 0,
            millis: 0,
        };
        let Some(images) = &self.images else {
            return Ok(found);
        };
        let floor = images.since.lock().map_err(|_| lock_err())?.0;
        let mut files = BTreeMap::new();
        for index in restart::list(&images.dir)? {
            let path = restart::path_of(&images.dir, index);
            let read = std::fs::read(&path)
                .and_then(|b| Ok((b.len() as u64, restart::ImageFile::decode(&path, &b)?)));
            match read {
                Ok(f) => {
                    files.insert(index, f);
                }
                Err(e) => tracing::warn!(error = %e, "restart image skipped"),
            }
        }
        let prevs = files.iter().map(|(i, (_, f))| (*i, f.prev)).collect();
        let chain = restart::chain(&prevs, floor, |i| {
            files[&i].1.meta.last_log_id.as_ref().is_some_and(&holds)
        });
        let Some(&top) = chain.last() else {
            if !files.is_empty() {
                tracing::info!(
                    images = files.len(),
                    floor,
                    "no chain of restart images fits the log: re-applying it"
                );
            }
            self.image_writer(restart::Job::RemoveAll)?;
            return Ok(found);
        };
        let meta = files[&top].1.meta.clone();
        let mut datas = Vec::with_capacity(chain.len());
        for i in &chain {
            let (len, f) = files.remove(i).expect("in the chain");
            found.bytes += len;
            datas.push(f.data);
        }
        let mut sm = self.sm.write().map_err(|_| lock_err())?;
        if let Err(e) = sm.load_restart_images(&datas) {
            tracing::warn!(error = %e, "restart images refused: re-applying the log");
            drop(sm);
            self.image_writer(restart::Job::RemoveAll)?;
            return Ok(found);
        }
        *self.applied.lock().map_err(|_| lock_err())? =
            (meta.last_log_id, meta.last_membership.clone());
        *images.since.lock().map_err(|_| lock_err())? = (top, 0);
        found.images = chain.len();
        found.index = top;
        found.millis = started.elapsed().as_millis() as u64;
        Ok(found)
    }

    /// Staggers this member's checkpoints and restart images from its peers'. Every replica
    /// applies the same entries, so counters started at zero made all of them serialise their
    /// state at the same entry: on shared cores each stall was the longer for the others' (1,000
    /// topics, an 18 MB state: three nodes built an image at once and each held its apply up
    /// for 260–390 ms, ~200 ms of CPU each). A member starts both byte counters ahead by its
    /// share of [`STAGGER_PHASES`] of `restart_image_bytes` (0, 43 or 85 MiB at the default),
    /// after its restart images are loaded. That many bytes stay between the members' images
    /// while they apply the same entries, as each counts from its own last image, also when a
    /// large state spaces images further apart ([`STATE_REWRITE_RATIO`]; at 18 MB, ~590 MB).
    /// Without images (`restart_image_bytes` 0) nothing changes.
    pub fn stagger(&self, node_id: u64) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(images) = &self.images else {
            return Ok(());
        };
        let ahead = stagger_bytes(images.every_bytes, node_id);
        images.since.lock().map_err(|_| lock_err())?.1 = ahead;
        self.checkpoint_since.store(ahead, Relaxed);
        Ok(())
    }

    fn image_writer(&self, job: restart::Job) -> io::Result<()> {
        if let Some(images) = &self.images {
            images.writer.lock().map_err(|_| lock_err())?.send(job);
        }
        Ok(())
    }

    /// After an applied entry: takes a checkpoint once `checkpoint_every` entries were applied
    /// since the last one, and a restart image once `every_bytes` of payload were applied since
    /// the last image, handing it to the writer; neither before [`STATE_REWRITE_RATIO`] times the
    /// state's size was applied since the last of its kind. An image is a checkpoint too: both
    /// hold the snapshot, serialised once. (At 1,000 topics the two came about as often, and each
    /// serialisation held apply up for milliseconds: issue 20.)
    fn after_apply(&self, log_id: LogId, payload_bytes: u64) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let rewrite = self
            .state_bytes
            .load(Relaxed)
            .saturating_mul(STATE_REWRITE_RATIO)
            .min(STATE_REWRITE_BYTES_MAX);
        let (mut since, image_due) = match &self.images {
            Some(images) => {
                let mut since = images.since.lock().map_err(|_| lock_err())?;
                since.1 += payload_bytes;
                let due = since.1 >= images.every_bytes.max(rewrite);
                (Some(since), due)
            }
            None => (None, false),
        };
        let applied_since = self.checkpoint_since.fetch_add(payload_bytes, Relaxed) + payload_bytes;
        let checkpoint_due = log_id.index
            >= self.last_checkpoint.load(Relaxed) + self.checkpoint_every
            && applied_since >= rewrite;
        if !(image_due || checkpoint_due) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        // The buffer of the last checkpoint dropped, for this one to be written into.
        let spare = self
            .checkpoints
            .lock()
            .map_err(|_| lock_err())?
            .take_spare()
            .map(|cp| cp.data)
            .unwrap_or_default();
        let (snapshot, image) = {
            let sm = self.sm.read().map_err(|_| lock_err())?;
            let snapshot = sm.snapshot_into(spare);
            let image = match &since {
                Some(s) if image_due => sm.restart_image(s.0),
                _ => None,
            };
            (snapshot, image)
        };
        crate::metrics::observe_checkpoint(image.is_some(), started.elapsed());
        let membership = self.applied.lock().map_err(|_| lock_err())?.1.clone();
        let meta = SnapshotMeta {
            last_log_id: Some(log_id),
            last_membership: membership,
        };
        // The image holds the snapshot too (the copy the image's encoding made before).
        let image = image.map(|encode| (encode, snapshot.clone()));
        self.checkpoint(
            log_id.index,
            SnapshotFile {
                meta: meta.clone(),
                data: snapshot,
            },
        )?;
        let Some(since) = since.as_mut().filter(|_| image_due) else {
            return Ok(());
        };
        let Some((encode, snapshot)) = image else {
            // A state machine without images: ask again only after as many bytes more.
            since.1 = 0;
            return Ok(());
        };
        let pending = restart::Pending {
            prev: since.0,
            meta,
            snapshot,
            encode,
        };
        **since = (log_id.index, 0);
        self.image_writer(restart::Job::Write(log_id.index, pending))
    }

    /// Keeps the checkpoint of entry `index`, within the bounds of [`checkpoints`].
    fn checkpoint(&self, index: u64, cp: SnapshotFile) -> io::Result<()> {
        use std::sync::atomic::Ordering::Relaxed;
        self.last_checkpoint.store(index, Relaxed);
        self.checkpoint_since.store(0, Relaxed);
        self.state_bytes.store(cp.data.len() as u64, Relaxed);
        self.checkpoints_taken.fetch_add(1, Relaxed);
        self.checkpoints
            .lock()
            .map_err(|_| lock_err())?
            .insert(index, cp);
        Ok(())
    }

    /// Bytes of the state checkpoints held in memory.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.checkpoints.lock().map_or(0, |c| c.bytes())
    }

    /// (bytes of the last checkpoint of the state, checkpoints taken since start).
    pub fn checkpoint_stats(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.state_bytes.load(Relaxed),
            self.checkpoints_taken.load(Relaxed),
        )
    }

    fn persist(&self, file: &SnapshotFile) -> io::Result<()> {
        let bytes = file.encode()?;
        let tmp = self.snapshot_path.with_extension("tmp");
        std::fs::write(&tmp, &bytes)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &self.snapshot_path)?;
        if let Some(dir) = self.snapshot_path.parent() {
            crate::log_store::sync_dir(dir)?;
        }
        Ok(())
    }
}

pub struct Builder<S> {
    shared: Arc<Shared<S>>,
}

impl<S: StateMachine> RaftSnapshotBuilder<TypeConfig> for Builder<S> {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let target = self
            .shared
            .target
            .load(std::sync::atomic::Ordering::Relaxed);
        let file = self
            .shared
            .checkpoints
            .lock()
            .map_err(|_| lock_err())?
            .take_upto(target)
            .cloned();
        let file = match file {
            Some(f) => f,
            // No checkpoint covers the target (nothing applied that far yet, or a forced build):
            // the state as of the last applied entry.
            None => {
                let sm = self.shared.sm.read().map_err(|_| lock_err())?;
                let (last, membership) =
                    self.shared.applied.lock().map_err(|_| lock_err())?.clone();
                SnapshotFile {
                    meta: SnapshotMeta {
                        last_log_id: last,
                        last_membership: membership,
                    },
                    data: sm.snapshot(),
                }
            }
        };
        self.shared.persist(&file)?;
        // Images at or below the snapshot hold only entries the trim dropped.
        if let Some(l) = file.meta.last_log_id {
            self.shared
                .image_writer(restart::Job::RemoveUpto(l.index))?;
        }
        let snap = Snapshot {
            meta: file.meta.clone(),
            snapshot: file.data.clone(),
        };
        *self.shared.current.lock().map_err(|_| lock_err())? = Some(file);
        Ok(snap)
    }
}

impl<S: StateMachine> RaftStateMachine<TypeConfig> for Adapter<S> {
    type SnapshotData = Vec<u8>;
    type SnapshotBuilder = Builder<S>;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok(self.shared.applied.lock().map_err(|_| lock_err())?.clone())
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: futures::Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let log_id = entry.log_id;
            let payload_bytes = match &entry.payload {
                EntryPayload::Normal(p) => p.0.len() as u64,
                _ => 0,
            };
            let reply = {
                let mut sm = self.shared.sm.write().map_err(|_| lock_err())?;
                let mut applied = self.shared.applied.lock().map_err(|_| lock_err())?;
                let reply = match &entry.payload {
                    // An error stops the member (openraft takes it as fatal): this entry and the
                    // ones after it stay unapplied, and their responders go with the member.
                    EntryPayload::Normal(p) if responder.is_some() => {
                        sm.try_apply(log_id.index, log_id.leader_id.term, &p.0)?
                    }
                    // No one waits for the reply (a follower's entries): not built.
                    EntryPayload::Normal(p) => {
                        sm.try_apply_unanswered(log_id.index, log_id.leader_id.term, &p.0)?;
                        Bytes::new()
                    }
                    EntryPayload::Membership(m) => {
                        applied.1 = StoredMembership::new(Some(log_id), m.clone());
                        sm.apply_empty(log_id.index);
                        Bytes::new()
                    }
                    EntryPayload::Blank => {
                        sm.apply_empty(log_id.index);
                        Bytes::new()
                    }
                };
                applied.0 = Some(log_id);
                reply
            };
            // Every responder is answered, or the proposer would wait forever; before a
            // checkpoint is taken, which this entry's proposer need not wait for.
            if let Some(r) = responder {
                r.send(Payload(reply));
            }
            self.shared.after_apply(log_id, payload_bytes)?;
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Builder {
            shared: self.shared.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Vec<u8>,
    ) -> Result<(), io::Error> {
        {
            let mut sm = self.shared.sm.write().map_err(|_| lock_err())?;
            sm.restore(&snapshot)?;
            let mut applied = self.shared.applied.lock().map_err(|_| lock_err())?;
            *applied = (meta.last_log_id, meta.last_membership.clone());
        }
        // The state jumped: every image is of another history; the next chain starts here.
        if let Some(images) = &self.shared.images {
            *images.since.lock().map_err(|_| lock_err())? =
                (meta.last_log_id.map(|l| l.index).unwrap_or(0), 0);
        }
        self.shared.image_writer(restart::Job::RemoveAll)?;
        let file = SnapshotFile {
            meta: meta.clone(),
            data: snapshot,
        };
        self.shared.persist(&file)?;
        *self.shared.current.lock().map_err(|_| lock_err())? = Some(file);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let g = self.shared.current.lock().map_err(|_| lock_err())?;
        Ok(g.as_ref().map(|f| Snapshot {
            meta: f.meta.clone(),
            snapshot: f.data.clone(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::golden::hex;

    fn snapshot_file() -> SnapshotFile {
        let membership = crate::golden::membership(&[1, 2, 3]);
        SnapshotFile {
            meta: SnapshotMeta {
                last_log_id: Some(crate::types::log_id(4, 2, 500)),
                last_membership: StoredMembership::new(
                    Some(crate::types::log_id(1, 1, 1)),
                    membership,
                ),
            },
            data: vec![0xAB, 0xCD, 0x00, 0x01],
        }
    }

    /// Golden bytes: `sm/snapshot.bin` as today's code writes it, frozen before format versions
    /// were added. Never update the literal: snapshot files on disk would no longer read.
    const SNAPSHOT_FILE_GOLDEN: &str = "010402f40301010101010301020303010e3132372e302e302e313a39303031020e3132372e302e302e313a39303032030e3132372e302e302e313a393030330004abcd0001";

    /// A state machine that counts its snapshots and makes an image of the snapshot it is given.
    #[derive(Default)]
    struct Counting {
        applied: u64,
        snapshots: std::sync::atomic::AtomicUsize,
        /// Bytes a snapshot carries after the applied index.
        pad: usize,
    }

    impl StateMachine for Counting {
        fn apply(&mut self, index: u64, _term: u64, _payload: &[u8]) -> Bytes {
            self.applied = index;
            Bytes::new()
        }
        fn snapshot(&self) -> Vec<u8> {
            self.snapshots
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut out = self.applied.to_le_bytes().to_vec();
            out.resize(8 + self.pad, 0);
            out
        }
        fn restore(&mut self, _data: &[u8]) -> io::Result<()> {
            Ok(())
        }
        fn restart_image(&self, _since: u64) -> Option<ImageEncoder> {
            Some(Box::new(<[u8]>::to_vec))
        }
    }

    /// Applies `entries` entries of `bytes` payload bytes each; returns the checkpoints' indexes,
    /// the images' indexes and how many snapshots the state machine took.
    fn checkpoints_and_images(
        every: u64,
        image_bytes: u64,
        entries: u64,
        bytes: u64,
    ) -> (Vec<u64>, Vec<u64>, usize) {
        checkpoints_and_images_of(Counting::default(), every, image_bytes, entries, bytes)
    }

    /// [`checkpoints_and_images`] of the state machine `sm`.
    fn checkpoints_and_images_of(
        sm: Counting,
        every: u64,
        image_bytes: u64,
        entries: u64,
        bytes: u64,
    ) -> (Vec<u64>, Vec<u64>, usize) {
        checkpoints_and_images_of_node(sm, 0, every, image_bytes, entries, bytes)
    }

    /// [`checkpoints_and_images_of`] on the member of node `node_id`, staggered as a node starts.
    fn checkpoints_and_images_of_node(
        sm: Counting,
        node_id: u64,
        every: u64,
        image_bytes: u64,
        entries: u64,
        bytes: u64,
    ) -> (Vec<u64>, Vec<u64>, usize) {
        let dir = tempfile::tempdir().unwrap();
        let (_adapter, shared) = Adapter::new(sm, dir.path(), every, image_bytes).unwrap();
        shared.stagger(node_id).unwrap();
        let mut images = Vec::new();
        for index in 1..=entries {
            shared.sm.write().unwrap().apply(index, 1, &[]);
            let log_id = crate::types::log_id(1, 1, index);
            shared.applied.lock().unwrap().0 = Some(log_id);
            shared.after_apply(log_id, bytes).unwrap();
            if let Some(im) = &shared.images
                && im.since.lock().unwrap().0 == index
            {
                images.push(index);
            }
        }
        let cps: Vec<u64> = shared.checkpoints.lock().unwrap().indexes().collect();
        for (i, cp) in shared.checkpoints.lock().unwrap().iter() {
            // Each holds the state as of its own entry.
            assert_eq!(cp.data[..8], i.to_le_bytes(), "checkpoint {i}");
        }
        let snapshots = shared
            .sm
            .read()
            .unwrap()
            .snapshots
            .load(std::sync::atomic::Ordering::Relaxed);
        (cps, images, snapshots)
    }

    /// Checkpoints come every `checkpoint_every` entries and with every restart image, and the
    /// two share one snapshot: a state serialised once per checkpoint, never twice at one entry.
    #[test]
    fn t1_an_image_is_a_checkpoint_and_both_take_one_snapshot() {
        // No images: every 10 entries.
        let (cps, images, snaps) = checkpoints_and_images(10, 0, 35, 300);
        assert_eq!((cps, images, snaps), (vec![10, 20, 30], vec![], 3));
        // Images every 4 entries (1,200 bytes): each is the checkpoint, none comes between.
        let (cps, images, snaps) = checkpoints_and_images(10, 1000, 20, 300);
        assert_eq!(images, [4, 8, 12, 16, 20]);
        assert_eq!((cps, snaps), (images, 5));
        // Images every 17 entries: checkpoints 10 entries after the last one of either kind.
        let (cps, images, snaps) = checkpoints_and_images(10, 5000, 60, 300);
        assert_eq!(images, [17, 34, 51]);
        assert_eq!(cps, [10, 17, 27, 34, 44, 51]);
        assert_eq!(snaps, cps.len());
    }

    /// 2. A large state is rewritten only after [`STATE_REWRITE_RATIO`] times its size was
    ///    applied since the last checkpoint or image (at most [`STATE_REWRITE_BYTES_MAX`]),
    ///    whatever the entry count and image bytes allow: its serialisation stays a fixed share
    ///    of apply's work.
    #[test]
    fn t2_a_large_state_is_checkpointed_after_its_size_times_the_ratio() {
        // A state whose size times the ratio is 1,728 bytes: checkpoints at least 6 entries of
        // 300 bytes apart. The first comes after 1 entry, before the state's size is known.
        let pad = 1728 / STATE_REWRITE_RATIO as usize - 8;
        assert_eq!((pad + 8) as u64 * STATE_REWRITE_RATIO, 1728);
        let sm = |pad| Counting {
            pad,
            ..Counting::default()
        };
        let (cps, images, snaps) = checkpoints_and_images_of(sm(pad), 1, 0, 20, 300);
        assert_eq!((cps, images, snaps), (vec![1, 7, 13, 19], vec![], 4));
        // Images asked for every 1,000 bytes come every 1,800 (6 entries) instead, and serve as
        // the checkpoints: none between them.
        let (cps, images, snaps) = checkpoints_and_images_of(sm(pad), 1, 1000, 20, 300);
        assert_eq!(images, [6, 12, 18]);
        assert_eq!(cps, [1, 6, 12, 18]);
        assert_eq!(snaps, 4);
        // A state of 40 MB would wait for 1.28 GB; the bound, 1 GiB, comes first: 4 entries of
        // 300 MB, so checkpoints at 1, 5 and 9 (5 is then dropped: the three are over 64 MiB).
        let big = (40 << 20) - 8;
        let (cps, _, snaps) = checkpoints_and_images_of(sm(big), 1, 0, 10, 300 << 20);
        assert_eq!((cps, snaps), (vec![1, 9], 3));
        // A small state keeps the cadence the entry count and image bytes set.
        let (cps, images, _) = checkpoints_and_images_of(sm(0), 1, 1000, 8, 300);
        assert_eq!((cps, images), (vec![1, 2, 3, 4, 5, 6, 7, 8], vec![4, 8]));
    }

    /// 3. The members of a group, applying the same entries, take their images at different
    ///    entries: a third of the image interval apart, each keeping its own cadence.
    #[test]
    fn t3_the_members_of_a_group_take_their_images_at_different_entries() {
        // Images every 1,800 bytes (6 entries of 300); no checkpoints by entry count.
        let of =
            |node| checkpoints_and_images_of_node(Counting::default(), node, 1000, 1800, 20, 300);
        let (cps1, images1, _) = of(1);
        let (_, images2, _) = of(2);
        let (_, images3, _) = of(3);
        assert_eq!(images1, [4, 10, 16], "node 1: 600 bytes ahead");
        assert_eq!(images2, [2, 8, 14, 20], "node 2: 1,200 bytes ahead");
        assert_eq!(images3, [6, 12, 18], "node 3: as without staggering");
        assert_eq!(cps1, images1, "each image is still the checkpoint");
        // A node id beyond the phases shares a phase: 4 is 1's.
        assert_eq!(of(4).1, images1);
        assert_eq!(stagger_bytes(0, 2), 0, "no images, no offset");
    }

    #[test]
    fn a_snapshot_file_encodes_to_its_golden_bytes_and_back() {
        let file = snapshot_file();
        let bytes = postcard::to_stdvec(&file).unwrap();
        println!("snapshot file\n  {}", hex(&bytes));
        assert_eq!(hex(&bytes), SNAPSHOT_FILE_GOLDEN);
        assert_eq!(file.encode().unwrap(), bytes, "version 1 is written bare");
        let back = SnapshotFile::decode(Path::new("snapshot.bin"), &bytes).unwrap();
        assert_eq!((back.meta, back.data), (file.meta, file.data));
    }

    /// A snapshot file from a newer build stops the member at start, naming the file and versions.
    #[test]
    fn a_snapshot_file_of_a_newer_format_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let body = snapshot_file().encode().unwrap();
        std::fs::write(dir.path().join("snapshot.bin"), format::envelope(3, &body)).unwrap();
        let Err(e) = Adapter::new(NoState, dir.path(), 1, 0) else {
            panic!("a newer snapshot file was read");
        };
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            format!(
                "snapshot file {} was written by format version 3; this broker-node reads up to \
                 version 1: upgrade the binary",
                dir.path().join("snapshot.bin").display()
            )
        );
        // Today's bytes still read.
        std::fs::write(dir.path().join("snapshot.bin"), &body).unwrap();
        assert!(Adapter::new(NoState, dir.path(), 1, 0).is_ok());
    }
}
