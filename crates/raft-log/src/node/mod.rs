//! A member of a broker group's Raft group: the public API the broker uses.
//!
//! [`Member`] starts openraft on our log store and runs two tasks beside it: the status task
//! (metrics → [`Status`], catch-up tracking, campaign permission) and CheckQuorum (is a leader cut
//! off?). What they decide is pure and lives in its own module; the tasks own the clock and I/O.
//!
//! - [`status`]: [`Role`], [`Status`] and the metrics → status mapping.
//! - [`quorum`]: CheckQuorum's decision.
//! - [`write_error`]: the one mapping of openraft's write errors to [`ProposeError`].

mod quorum;
mod status;
#[cfg(test)]
mod test_metrics;
mod write_error;

pub use status::{PeerProgress, Role, Status};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::rt::WatchReceiver;
use openraft::{BasicNode, ChangeMembers, ServerState};
use raftmq_proto::v1::raft_peer_service_server::RaftPeerServiceServer;
use tokio::sync::watch;

use crate::config::RaftConfig;
use crate::error::{Error, ProposeError};
use crate::log_store::{LogReader, LogStore, RecoveryReport, meta::Meta};
use crate::network::{Identity, NetworkFactory};
use crate::server::PeerServer;
use crate::state_machine::{Adapter, Shared, StateMachine};
use crate::types::{EntryPayload, Raft};

/// What a member needs to start.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    pub cluster: String,
    pub broker: String,
    pub node_id: u64,
    /// The initial voters (node id → peer address), this member included. Used only on the first
    /// start, to bootstrap the group; later starts reuse what is on disk.
    pub initial_members: BTreeMap<u64, String>,
    /// Peer id → the address this member dials for Raft traffic to that peer, in place of the
    /// address in the membership (a separate replication network, or a fault proxy in tests).
    pub peer_routes: BTreeMap<u64, String>,
    pub data_dir: PathBuf,
    pub raft: RaftConfig,
    /// TLS for the peer network: peers are dialled over TLS presenting this node's certificate,
    /// and the peer service admits only a caller whose certificate names a member of this
    /// cluster and group. None: plaintext, no certificate check.
    pub tls: Option<Arc<raftmq_security::tls::Tls>>,
}

/// A running member.
pub struct Member<S: StateMachine> {
    raft: Raft<Adapter<S>>,
    shared: Arc<Shared<S>>,
    reader: LogReader,
    store: LogStore,
    me: Identity,
    last_append_ms: Arc<AtomicU64>,
    /// The commit index the leader last sent (index + 1; 0 = none yet).
    leader_commit: Arc<AtomicU64>,
    started: Instant,
    /// Whether the peer service requires a member's certificate (TLS on).
    tls: bool,
    election_timeout_max: Duration,
    status_rx: watch::Receiver<Status>,
    leadership_rx: watch::Receiver<(Role, u64)>,
    /// True while this member leads but has heard from no majority for the CheckQuorum window.
    cut_off_rx: watch::Receiver<bool>,
    recovery: RecoveryReport,
    _db: sled::Db,
}

impl<S: StateMachine> Member<S> {
    /// Opens the data dir, recovers the log, and starts Raft. On the very first start (nothing on
    /// disk) it bootstraps the group from `initial_members`.
    pub async fn start(cfg: MemberConfig, sm: S) -> Result<Self, Error> {
        let oc = Arc::new(
            cfg.raft
                .to_openraft(&format!("{}/{}", cfg.cluster, cfg.broker))?,
        );
        let dir = &cfg.data_dir;
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create the data dir", dir, e))?;
        let meta_dir = dir.join("meta");
        let db = sled::Config::new()
            .path(&meta_dir)
            .flush_every_ms(Some(200))
            .open()
            .map_err(|e| Error::metadata("open the metadata store", &meta_dir, e))?;
        let tree = db.open_tree("raft").map_err(|e| {
            Error::metadata("open the raft tree of the metadata store", &meta_dir, e)
        })?;
        let meta =
            Meta::open(tree).map_err(|e| Error::io("open the metadata store", &meta_dir, e))?;
        let log_dir = dir.join("log");
        let (store, recovery) = LogStore::open(
            &log_dir,
            meta,
            cfg.raft.segment_bytes_max,
            cfg.raft.flush_mode,
            cfg.raft.page_cache_window_bytes,
        )
        .map_err(|e| Error::io("open the log in", &log_dir, e))?;
        if recovery.truncated_bytes > 0 || recovery.dropped_segments > 0 {
            tracing::warn!(?recovery, "log recovery cut damaged or unsynced records");
        }
        store.set_own_id(cfg.node_id);
        store.set_append_bytes_max(cfg.raft.append_bytes_max);
        store.set_catch_up_bytes_per_sec_busy(cfg.raft.catch_up_bytes_per_sec_busy);
        let reader = store.reader();
        let sm_dir = dir.join("sm");
        let (adapter, shared) = Adapter::new(
            sm,
            &sm_dir,
            cfg.raft.checkpoint_every_entries,
            cfg.raft.restart_image_bytes,
        )
        .map_err(|e| Error::io("open the snapshots in", &sm_dir, e))?;
        let loaded = shared
            .load_restart_images(|id| {
                reader
                    .read(id.index, id.index + 1)
                    .is_ok_and(|v| v.first().is_some_and(|(l, _)| l == id))
            })
            .map_err(|e| Error::io("load the restart images in", &sm_dir, e))?;
        if loaded.images > 0 {
            tracing::info!(
                images = loaded.images,
                index = loaded.index,
                bytes = loaded.bytes,
                ms = loaded.millis,
                "state loaded from restart images; re-applying only the entries after index {}",
                loaded.index
            );
        }
        shared
            .stagger(cfg.node_id)
            .map_err(|e| Error::io("stagger the checkpoints in", &sm_dir, e))?;
        let me = Identity {
            cluster: cfg.cluster.clone(),
            broker: cfg.broker.clone(),
            node_id: cfg.node_id,
            secret: cfg.raft.peer_secret.clone(),
        };
        let net = NetworkFactory::new(
            me.clone(),
            cfg.peer_routes.clone(),
            cfg.raft.pipeline_appends,
            Duration::from_micros(cfg.raft.commit_notice_hold_us),
            cfg.tls.clone(),
        );
        let links = net.links();
        let raft = Raft::new(cfg.node_id, oc, net, store.clone(), adapter)
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| Error::Raft(e.to_string()))?;
        if !initialized && cfg.initial_members.is_empty() {
            // Joining an existing group: the leader adds it as a learner (`raftmq node add`) and
            // replicates the group's membership and log to it.
            tracing::info!(
                node_id = cfg.node_id,
                "no data and no initial members: waiting to be added to a group"
            );
        } else if !initialized {
            if !cfg.initial_members.contains_key(&cfg.node_id) {
                return Err(Error::Config(format!(
                    "node {} is not among the initial members {:?} and has no data to rejoin from",
                    cfg.node_id,
                    cfg.initial_members.keys().collect::<Vec<_>>()
                )));
            }
            let members: BTreeMap<u64, BasicNode> = cfg
                .initial_members
                .iter()
                .map(|(id, a)| (*id, BasicNode { addr: a.clone() }))
                .collect();
            // Every initial member writes the same first membership entry; doing it on all of them
            // is safe and spares a start-up order.
            if let Err(e) = raft.initialize(members).await {
                tracing::info!(error = %e, "initialize skipped");
            }
        }
        if reader.repairing().is_some() {
            // It may have acknowledged entries it lost: no campaign until replication restores
            // them (votes are refused in the peer server meanwhile). The status task lifts it.
            raft.runtime_config().elect(false);
        }
        let last_append_ms = Arc::new(AtomicU64::new(0));
        let leader_commit = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let (status_tx, status_rx) = watch::channel(Status::initial(cfg.node_id));
        let (leadership_tx, leadership_rx) = watch::channel((Role::Follower, 0));
        let (cut_off_tx, cut_off_rx) = watch::channel(false);
        spawn_check_quorum(
            raft.clone(),
            cut_off_tx,
            Duration::from_millis(cfg.raft.heartbeat_interval_ms.max(1)),
            Duration::from_millis(
                cfg.raft.election_timeout_ms_max + 2 * cfg.raft.heartbeat_interval_ms,
            ),
        );
        spawn_status_task(StatusTask {
            raft: raft.clone(),
            tx: status_tx,
            leadership_tx,
            last_append_ms: last_append_ms.clone(),
            leader_commit: leader_commit.clone(),
            started,
            store: store.clone(),
            links,
        });
        Ok(Member {
            raft,
            shared,
            reader,
            store,
            me,
            last_append_ms,
            leader_commit,
            started,
            tls: cfg.tls.is_some(),
            election_timeout_max: Duration::from_millis(cfg.raft.election_timeout_ms_max),
            status_rx,
            leadership_rx,
            cut_off_rx,
            recovery,
            _db: db,
        })
    }

    /// CheckQuorum (as etcd's): true while this member leads but has heard from no majority of
    /// the voters, itself included, for an election timeout plus two heartbeats. openraft keeps a
    /// cut-off leader in its role until it hears a higher term; the broker watches this to refuse
    /// sends at once instead of letting them wait for a commit that cannot come. One task per
    /// member updates it every heartbeat interval; it changes only on a transition.
    pub fn cut_off(&self) -> watch::Receiver<bool> {
        self.cut_off_rx.clone()
    }

    /// The gRPC service peers call; serve it on the member's port.
    pub fn peer_service(
        &self,
    ) -> tonic::service::interceptor::InterceptedService<
        RaftPeerServiceServer<PeerServer<S>>,
        crate::server::PeerGuard,
    > {
        let server = RaftPeerServiceServer::new(PeerServer {
            raft: self.raft.clone(),
            me: self.me.clone(),
            last_append_ms: self.last_append_ms.clone(),
            leader_commit: self.leader_commit.clone(),
            started: self.started,
            log: self.reader.clone(),
        })
        .max_decoding_message_size(crate::network::PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(crate::network::PEER_MESSAGE_BYTES_MAX);
        tonic::service::interceptor::InterceptedService::new(
            server,
            crate::server::PeerGuard::new(&self.me, self.tls),
        )
    }

    /// Proposes one entry; returns its log index and the state machine's reply once it is committed
    /// (on a majority's disks) and applied here.
    pub async fn propose(&self, payload: Bytes) -> Result<(u64, Bytes), ProposeError> {
        self.raft
            .client_write(crate::types::Payload(payload))
            .await
            .map(|r| (r.log_id.index, r.data.0))
            .map_err(write_error::propose_error)
    }

    /// A read barrier on the leader: returns once a quorum confirmed this member still leads and
    /// it has applied every entry committed before the call (its own term's first entry
    /// included, so a new leader has applied what the previous one acknowledged). Decisions read
    /// from the state after it (a transaction's half message, a scheduled message to recall) see
    /// every acknowledged write.
    pub async fn read_barrier(&self) -> Result<(), ProposeError> {
        match self
            .raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
        {
            Ok(_) => Ok(()),
            Err(openraft::error::RaftError::APIError(
                openraft::error::LinearizableReadError::ForwardToLeader(_),
            )) => Err(ProposeError::NotLeader {
                leader: self.status().leader_address(),
            }),
            Err(openraft::error::RaftError::APIError(e)) => {
                Err(ProposeError::Unavailable(e.to_string()))
            }
            Err(e) => Err(ProposeError::Fatal(e.to_string())),
        }
    }

    /// Reads entries `[start, end)` that are present in this member's log, with their payloads
    /// (None for blank and membership entries).
    pub fn read_entries(&self, start: u64, end: u64) -> std::io::Result<Vec<(u64, Option<Bytes>)>> {
        Ok(self
            .reader
            .read(start, end)?
            .into_iter()
            .map(|(id, p)| {
                let data = match p {
                    EntryPayload::Normal(d) => Some(d.0),
                    _ => None,
                };
                (id.index, data)
            })
            .collect())
    }

    /// The first index still held in the log.
    pub fn first_log_index(&self) -> Option<u64> {
        self.reader.first_index()
    }

    /// The state machine, to read (briefly; apply takes the write lock).
    pub fn state(&self) -> &std::sync::RwLock<S> {
        &self.shared.sm
    }

    pub fn status(&self) -> Status {
        self.status_rx.borrow().clone()
    }

    /// What `f` reads of the status, without a copy of it. [`Self::status`] clones every field
    /// (the membership's addresses, each peer's progress: a dozen allocations), which the checks
    /// a request makes (am I the leader, what is applied) and the tasks woken on every commit
    /// paid each time (issue 20). `f` runs under the watch's read lock: keep it short, no await.
    pub fn status_with<R>(&self, f: impl FnOnce(&Status) -> R) -> R {
        f(&self.status_rx.borrow())
    }

    /// A watch of the status, updated on every Raft metrics change.
    pub fn watch(&self) -> watch::Receiver<Status> {
        self.status_rx.clone()
    }

    /// This member's role and term, changed only when either changes (unlike [`Self::watch`],
    /// which changes with every commit): for waiting on a change of leadership.
    pub fn leadership(&self) -> watch::Receiver<(Role, u64)> {
        self.leadership_rx.clone()
    }

    /// Ready to serve as a member of its group: it leads, or it follows a leader it heard from
    /// within an election timeout and holds what that leader committed (not catching up, not
    /// repairing). The health service's readiness reports this.
    pub fn ready(&self) -> bool {
        let st = self.status_rx.borrow();
        match st.role {
            Role::Leader => true,
            Role::Follower | Role::Learner => {
                st.leader.is_some()
                    && st.catch_up.is_none()
                    && self.reader.repairing().is_none()
                    && st
                        .millis_since_leader_contact
                        .is_some_and(|ms| ms <= self.election_timeout_max.as_millis() as u64)
            }
            Role::Candidate | Role::Shutdown => false,
        }
    }

    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// While this member repairs a log that lost entries it had stored: (last index held, index
    /// it must reach before it votes or campaigns again). None once repaired.
    pub fn repairing(&self) -> Option<(u64, u64)> {
        self.reader.repairing()
    }

    pub fn disk_bytes(&self) -> u64 {
        self.store.disk_bytes()
    }

    /// Bytes of the state checkpoints apply holds in memory for the next snapshot.
    pub fn checkpoint_bytes(&self) -> u64 {
        self.shared.checkpoint_bytes()
    }

    /// (bytes of the state as last checkpointed, checkpoints taken since start).
    pub fn checkpoint_stats(&self) -> (u64, u64) {
        self.shared.checkpoint_stats()
    }

    /// (first index, last index, bytes, modified time) of every sealed segment, oldest first.
    pub fn sealed_segments(&self) -> Vec<(u64, u64, u64, Option<std::time::SystemTime>)> {
        self.store.sealed_segments()
    }

    /// Drops this member's log up to and including `upto`: takes a snapshot of the state (which
    /// covers `upto` once it is applied), then asks openraft to purge. Whole segments at or below
    /// the purge point are deleted; openraft may delay the purge while a replication still reads
    /// them. A member whose log was purged catches a far-behind peer up with the snapshot.
    pub async fn compact(&self, upto: u64) -> Result<(), ProposeError> {
        let st = self.status();
        if st.applied < upto {
            return Err(ProposeError::Invalid(format!(
                "cannot compact to {upto}: only {} applied",
                st.applied
            )));
        }
        // The snapshot is the newest state checkpoint at or below `upto`; the log is purged to it.
        // openraft ignores a trigger while a build runs and keeps a newer snapshot it already has,
        // so wait a little for the metrics to move, then purge to whatever snapshot there is.
        let before = st.snapshot;
        if before < upto {
            self.shared
                .target
                .store(upto, std::sync::atomic::Ordering::Relaxed);
            self.raft
                .trigger()
                .snapshot()
                .await
                .map_err(|e| ProposeError::Fatal(e.to_string()))?;
            let mut w = self.watch();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            while w.borrow().snapshot <= before {
                if tokio::time::timeout_at(deadline, w.changed())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        }
        let snapshot = self.status().snapshot.min(upto);
        if snapshot == 0 {
            return Ok(());
        }
        self.raft
            .trigger()
            .purge_log(snapshot)
            .await
            .map_err(|e| ProposeError::Fatal(e.to_string()))
    }

    /// Asks the leader to hand leadership to `to`. Only a caught-up member can take it.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), ProposeError> {
        let st = self.status();
        if st.role != Role::Leader {
            return Err(ProposeError::NotLeader {
                leader: st.leader_address(),
            });
        }
        if !st.voters.contains(&to) {
            return Err(ProposeError::Invalid(format!(
                "node {to} is not a voter of this group"
            )));
        }
        if to == self.me.node_id {
            return Ok(());
        }
        let caught_up = st.peers.iter().any(|p| p.node_id == to && p.lag == 0);
        if !caught_up {
            return Err(ProposeError::Unavailable(format!(
                "node {to} has not caught up with the leader's log"
            )));
        }
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| ProposeError::Fatal(e.to_string()))
    }

    /// Adds a non-voting learner and waits until it has caught up.
    pub async fn add_learner(&self, node_id: u64, address: String) -> Result<(), ProposeError> {
        self.raft
            .add_learner(node_id, BasicNode { addr: address }, true)
            .await
            .map(|_| ())
            .map_err(write_error::propose_error)
    }

    /// Sets the voters (promoting learners, removing members) through joint consensus.
    pub async fn change_voters(&self, voters: BTreeSet<u64>) -> Result<(), ProposeError> {
        if voters.is_empty() {
            return Err(ProposeError::Invalid(
                "the voter set cannot be empty".into(),
            ));
        }
        self.raft
            .change_membership(ChangeMembers::ReplaceAllVoters(voters), false)
            .await
            .map(|_| ())
            .map_err(write_error::propose_error)
    }

    /// Triggers an election on this member now (used by a preferred leader).
    pub async fn trigger_elect(&self) -> Result<(), ProposeError> {
        self.raft
            .trigger()
            .elect(true)
            .await
            .map_err(|e| ProposeError::Fatal(e.to_string()))
    }

    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

/// Keeps `tx` (see [`Member::cut_off`]) up to date every `tick`, until the member shuts down.
/// The decision is [`quorum::CheckQuorum`]'s; this task reads the clock and the metrics.
fn spawn_check_quorum<S: StateMachine>(
    raft: Raft<Adapter<S>>,
    tx: watch::Sender<bool>,
    tick: Duration,
    window: Duration,
) {
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(tick);
        let mut check = quorum::CheckQuorum::new(window);
        loop {
            interval.tick().await;
            let (leading_term, voters) = {
                let rx = raft.metrics();
                let m = rx.borrow_watched();
                if m.state == ServerState::Shutdown {
                    return;
                }
                quorum::read_metrics(&m)
            };
            let cut_off = check.tick(
                leading_term,
                &voters,
                <openraft::TokioInstant as openraft::Instant>::now(),
            );
            tx.send_if_modified(|cur| std::mem::replace(cur, cut_off) != cut_off);
        }
    });
}

/// What the status task needs.
struct StatusTask<S: StateMachine> {
    raft: Raft<Adapter<S>>,
    tx: watch::Sender<Status>,
    leadership_tx: watch::Sender<(Role, u64)>,
    last_append_ms: Arc<AtomicU64>,
    leader_commit: Arc<AtomicU64>,
    started: Instant,
    store: LogStore,
    links: Arc<std::sync::Mutex<crate::peers::Links>>,
}

/// Keeps the status watch up to date on every Raft metrics change (and every 100 ms), tracks the
/// catch-up of this member and, on a leader, of each peer, and lets this member campaign only while
/// it is neither repairing its log nor catching up.
fn spawn_status_task<S: StateMachine>(task: StatusTask<S>) {
    let StatusTask {
        raft,
        tx,
        leadership_tx,
        last_append_ms,
        leader_commit,
        started,
        store,
        links,
    } = task;
    let mut rx = raft.metrics();
    let reader = store.reader();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut trackers = status::Trackers::default();
        let mut may_campaign = reader.repairing().is_none();
        loop {
            // Built under the metrics borrow, which ends before the next await: a clone of the
            // metrics per commit cost more than reading them (issue 20).
            let st = {
                let m = rx.borrow_watched();
                // Peer links matter only on a leader; spare their lock otherwise.
                let links = m.replication.as_ref().and_then(|_| links.lock().ok());
                let local = status::Local {
                    links: links.as_deref(),
                    leader_commit: leader_commit.load(Ordering::Relaxed).checked_sub(1),
                    started,
                    last_append_ms: last_append_ms.load(Ordering::Relaxed),
                };
                status::from_metrics(&m, &local, &mut trackers, status::Now::read(), || {
                    store.disk_bytes()
                })
            };
            let allowed = st.catch_up.is_none() && reader.repairing().is_none();
            if allowed != may_campaign {
                may_campaign = allowed;
                tracing::info!(
                    may_campaign,
                    last_log_index = st.last_log_index,
                    "{}",
                    if allowed {
                        "caught up: campaigning again when the leader goes silent"
                    } else {
                        "catching up with the leader: not campaigning until caught up"
                    }
                );
                raft.runtime_config().elect(allowed);
            }
            let leadership = (st.role, st.term);
            if leadership_tx
                .send_if_modified(|cur| std::mem::replace(cur, leadership) != leadership)
            {
                // Who led when, in every node's log: what a rolling restart's report lines up.
                tracing::info!(role = ?st.role, term = st.term, leader = ?st.leader, "leadership changed");
            }
            tx.send_if_modified(|cur| {
                if *cur != st {
                    *cur = st;
                    true
                } else {
                    false
                }
            });
            if leadership.0 == Role::Shutdown {
                break;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { break },
                _ = tick.tick() => {}
            }
        }
    });
}
