//! A Jepsen-style workload, fault injector and history checker for one three-node broker group.
//!
//! Contract: concurrent producers send unique, recognisable payloads (`hist|<producer>|<seq>|<i>|`)
//! and record every send as acknowledged (with its queue and offsets), failed (every attempt was
//! answered with a reply that proves nothing was stored) or unknown (a timeout, a dropped
//! connection, `UNAVAILABLE`: it may or may not have been stored). A committer moves one consumer
//! group's offsets forward. Meanwhile faults are injected one after the other (each healed and the
//! group converged before the next). After the last fault heals, the load stops, every node is read
//! back completely, and [`check`] compares what was read with the history:
//!
//! - lost: acknowledged and read at its acknowledged (queue, offset) on no node (split into the
//!   prefix, middle and suffix of its producer's run: before its first read send, between, after
//!   its last read send);
//! - misplaced: acknowledged at one (queue, offset) but read at another;
//! - unexpected: read but never sent (or sent to another queue); aborted: read although every
//!   attempt of its send was refused;
//! - divergence: one (queue, offset) with different bytes on two nodes; missing: a node lacks an
//!   entry another node holds (all nodes have applied the leader's commit index when read);
//! - order: within a queue, one producer's messages not in the order it sent them;
//! - duplicates: one payload at two offsets;
//! - offsets going backwards: a fetch right after an acknowledged commit on the same node, or any
//!   node at the end, showing less than the acknowledged commit;
//! - liveness: per fault, the longest time without any acknowledgement from the fault until the
//!   next fault, and the time from healing to the first acknowledgement.
//!
//! Failure: [`Report::is_ok`] is false and [`Report::excerpts`] holds the part of the history that
//! shows each problem (the producer's sends around it and the faults near it). Convergence that
//! does not happen within its bound is returned as `Err` naming what was awaited.
//!
//! Every fault also records the group's term before it and after the group converged again
//! ([`FaultEvent::term_before`], [`FaultEvent::term_after`]): a fault that leaves the leader alone
//! ([`FaultKind::leaves_leader`]) should not raise it.
//!
//! Large-log mode ([`ScenarioCfg::large_log`], `soak --large-log-mb N`): before the load starts,
//! [`fill_log`] sends N MiB through the leader in Raft entries of [`FILL_SEND_BYTES`] (128 KiB)
//! and waits until all three nodes have applied them, so faults meet a group holding gigabytes.
//! After a follower fault heals, the round waits until that follower's last log index reaches the
//! leader's commit index at heal time ([`FaultEvent::catch_up`], bounded by
//! [`LargeLogCfg::catch_up_timeout`]; a timeout fails the round). The fill goes to its own topic,
//! [`FILL_TOPIC`], read back from every node and checked by [`check`] like the workload's
//! messages, but compacted while it is read (see [`read_fill`]): each body that is exactly the
//! payload its header names is kept as that header alone, so the check costs memory per message,
//! not per byte: a 1 GiB fill read back from three nodes took 12-15 s and its check 1-2 s on a
//! 2-core VM.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use crate::{Cluster, code, connect};

pub const TOPIC: &str = "hist";
pub const QUEUES: u32 = 4;
pub const GROUP: &str = "hist-g";
/// The broker's largest randomized election timeout; a pause must outlast it to depose a leader.
pub const ELECTION_TIMEOUT_MS_MAX: u64 = 450;
/// One RPC attempt of a send; the op is retried (same producer id and sequence) until its deadline.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Bound of every wait for the group to elect a leader and converge after a fault heals.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(60);
const EXCERPTS_MAX: usize = 20;

// ---------------------------------------------------------------------------------------------
// Payloads

/// Identifies one message of the workload: the `idx`-th message of send `seq` of `producer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MsgId {
    pub producer: u64,
    pub seq: u64,
    pub idx: u32,
}

/// `hist|<producer>|<seq>|<idx>|` padded with a byte derived from the id to `len` bytes (the
/// header alone when it is not shorter than `len`).
pub fn encode(id: MsgId, len: usize) -> Vec<u8> {
    let head = format!("hist|{}|{}|{}|", id.producer, id.seq, id.idx).into_bytes();
    if head.len() >= len {
        return head;
    }
    let pad = b'a' + ((id.producer + id.seq + id.idx as u64) % 26) as u8;
    // A memset and a copy: this crate is built unoptimised, and the fill encodes gigabytes.
    let mut b = vec![pad; len];
    b[..head.len()].copy_from_slice(&head);
    b
}

pub fn decode(b: &[u8]) -> Option<MsgId> {
    let s = std::str::from_utf8(b).ok()?;
    let mut it = s.split('|');
    if it.next()? != "hist" {
        return None;
    }
    let id = MsgId {
        producer: it.next()?.parse().ok()?,
        seq: it.next()?.parse().ok()?,
        idx: it.next()?.parse().ok()?,
    };
    let pad = it.next()?;
    let want = encode(id, b.len());
    (want == b && !pad.contains('|')).then_some(id)
}

// ---------------------------------------------------------------------------------------------
// History

#[derive(Clone, Debug)]
pub enum Outcome {
    Acked {
        offsets: Vec<u64>,
        by: String,
        duplicate: bool,
    },
    /// Every attempt was answered with a refusal: nothing can have been stored.
    Failed(String),
    /// Timeout, dropped connection or an ambiguous error: it may have been stored.
    Unknown(String),
}

#[derive(Clone, Debug)]
pub struct Op {
    pub producer: u64,
    pub seq: u64,
    pub queue: u32,
    pub count: u32,
    pub len: usize,
    pub start: Duration,
    pub end: Duration,
    pub attempts: u32,
    pub outcome: Outcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    KillLeader,
    KillFollower,
    KillTwo,
    KillAll,
    PauseLeader,
    WipeFollower,
    PowerLossOne,
    PowerLossAll,
    BitFlip,
    TruncateSegment,
    /// Mixed: the leader paused past the election timeout while a follower is killed.
    PauseLeaderKillFollower,
    /// The leader cut off from both followers (both directions); clients still reach it.
    PartitionLeader,
    /// One follower cut off from both other nodes.
    PartitionFollower,
    /// A partial partition: the leader and one follower cannot hear each other; the other
    /// follower hears both.
    PartitionPartial,
    /// One-way: nothing the leader sends arrives; what the followers send to it does.
    PartitionOneWay,
    /// One follower cut off from both other nodes for [`PARTITION_LONG`] while the load goes on:
    /// it falls far behind and must catch up after the heal.
    PartitionFollowerLong,
}

/// How long [`FaultKind::PartitionFollowerLong`] keeps its follower cut off.
pub const PARTITION_LONG: Duration = Duration::from_secs(60);

impl FaultKind {
    /// Every kind; new kinds are appended, so the index of an existing kind never changes.
    pub const ALL: [FaultKind; 16] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::KillTwo,
        FaultKind::KillAll,
        FaultKind::PauseLeader,
        FaultKind::WipeFollower,
        FaultKind::PowerLossOne,
        FaultKind::PowerLossAll,
        FaultKind::BitFlip,
        FaultKind::TruncateSegment,
        FaultKind::PauseLeaderKillFollower,
        FaultKind::PartitionLeader,
        FaultKind::PartitionFollower,
        FaultKind::PartitionPartial,
        FaultKind::PartitionOneWay,
        FaultKind::PartitionFollowerLong,
    ];

    /// The kinds the soak draws from by default (every kind but the 60 s partition), in the order
    /// of [`FaultKind::ALL`]: a seed draws the same faults from it as it did before that kind
    /// existed.
    pub const CLASSIC: [FaultKind; 15] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::KillTwo,
        FaultKind::KillAll,
        FaultKind::PauseLeader,
        FaultKind::WipeFollower,
        FaultKind::PowerLossOne,
        FaultKind::PowerLossAll,
        FaultKind::BitFlip,
        FaultKind::TruncateSegment,
        FaultKind::PauseLeaderKillFollower,
        FaultKind::PartitionLeader,
        FaultKind::PartitionFollower,
        FaultKind::PartitionPartial,
        FaultKind::PartitionOneWay,
    ];

    /// The kinds the soak draws from by default in large-log mode: a follower that must catch up
    /// on a large log.
    pub const LARGE_LOG: [FaultKind; 3] = [
        FaultKind::KillFollower,
        FaultKind::WipeFollower,
        FaultKind::PartitionFollowerLong,
    ];

    /// The fault hits one follower only: the leader keeps leading, and the group's term should
    /// not rise.
    pub fn leaves_leader(self) -> bool {
        matches!(
            self,
            FaultKind::KillFollower
                | FaultKind::WipeFollower
                | FaultKind::PartitionFollower
                | FaultKind::PartitionFollowerLong
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillFollower => "kill-follower",
            FaultKind::KillTwo => "kill-two",
            FaultKind::KillAll => "kill-all",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::WipeFollower => "wipe-follower",
            FaultKind::PowerLossOne => "power-loss-one",
            FaultKind::PowerLossAll => "power-loss-all",
            FaultKind::BitFlip => "bit-flip",
            FaultKind::TruncateSegment => "truncate-segment",
            FaultKind::PauseLeaderKillFollower => "pause-leader+kill-follower",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::PartitionFollower => "partition-follower",
            FaultKind::PartitionPartial => "partition-partial",
            FaultKind::PartitionOneWay => "partition-one-way",
            FaultKind::PartitionFollowerLong => "partition-follower-long",
        }
    }
}

#[derive(Clone, Debug)]
pub struct FaultEvent {
    pub kind: FaultKind,
    pub nodes: Vec<u64>,
    pub start: Duration,
    pub healed: Duration,
    pub converged: Duration,
    pub note: String,
    /// The term of the leader found before the fault.
    pub term_before: Option<u64>,
    /// The highest term any node reported once the group had converged after the fault.
    pub term_after: Option<u64>,
    /// Large-log mode, follower faults: how the follower caught up after the heal.
    pub catch_up: Option<CatchUpEvent>,
}

impl FaultEvent {
    /// The group's term rose across the fault (None: not known).
    pub fn term_rose(&self) -> Option<bool> {
        Some(self.term_after? > self.term_before?)
    }
}

#[derive(Clone, Debug)]
pub struct CatchUpEvent {
    pub node: u64,
    /// The leader's commit index when the fault healed.
    pub target: u64,
    /// The follower's last log index when the wait ended.
    pub reached: u64,
    /// From the heal until the follower's last log index reached `target` (or the wait gave up).
    pub took: Duration,
    pub caught_up: bool,
}

#[derive(Clone, Debug)]
pub struct OffsetEvent {
    pub queue: u32,
    pub committed: u64,
    pub by: String,
    pub at: Duration,
    pub fetched: Option<u64>,
}

pub struct History {
    pub t0: Instant,
    pub ops: Mutex<Vec<Op>>,
    pub faults: Mutex<Vec<FaultEvent>>,
    pub offsets: Mutex<Vec<OffsetEvent>>,
    pub acks: AtomicU64,
    /// When the load stopped (set by [`run_scenario`]); ends the last fault's liveness window.
    pub load_end: Mutex<Option<Duration>>,
}

impl Default for History {
    fn default() -> Self {
        History {
            t0: Instant::now(),
            ops: Mutex::default(),
            faults: Mutex::default(),
            offsets: Mutex::default(),
            acks: AtomicU64::new(0),
            load_end: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl History {
    pub fn now(&self) -> Duration {
        self.t0.elapsed()
    }
}

// ---------------------------------------------------------------------------------------------
// Clients

/// Channels per address, reused across sends (lazy: they reconnect after a node restarts).
#[derive(Default)]
struct Clients(HashMap<String, BrokerServiceClient<Channel>>);

impl Clients {
    async fn get(&mut self, addr: &str) -> BrokerServiceClient<Channel> {
        if let Some(c) = self.0.get(addr) {
            return c.clone();
        }
        let c = connect(addr).await;
        self.0.insert(addr.to_string(), c.clone());
        c
    }
}

/// True when a transport error proves the request never left (nothing can have been stored).
fn never_sent(s: &tonic::Status) -> bool {
    let d = format!("{s:?}");
    d.contains("onnection refused") || d.contains("tcp connect error")
}

/// One producer: sends batches one at a time, follows NOT_LEADER, retries a batch with the same
/// (producer id, sequence) until its deadline.
pub struct HistProducer {
    pub id: u64,
    topic: String,
    seq: u64,
    target: String,
    addrs: Vec<String>,
    rr: usize,
    clients: Clients,
}

impl HistProducer {
    pub fn new(id: u64, addrs: Vec<String>) -> HistProducer {
        HistProducer::with_topic(id, addrs, TOPIC)
    }

    /// A producer of `topic` (which must have [`QUEUES`] queues).
    pub fn with_topic(id: u64, addrs: Vec<String>, topic: &str) -> HistProducer {
        HistProducer {
            id,
            topic: topic.to_string(),
            seq: 0,
            target: addrs[0].clone(),
            addrs,
            rr: 0,
            clients: Clients::default(),
        }
    }

    /// Sends `count` messages of `len` bytes to `queue` and records the op in `hist`.
    pub async fn send(
        &mut self,
        hist: &History,
        queue: u32,
        count: u32,
        len: usize,
        deadline: Duration,
    ) -> Outcome {
        self.seq += 1;
        let seq = self.seq;
        let req = SendRequest {
            topic: self.topic.clone(),
            queue,
            messages: (0..count)
                .map(|idx| Message {
                    body: encode(
                        MsgId {
                            producer: self.id,
                            seq,
                            idx,
                        },
                        len,
                    )
                    .into(),
                    ..Default::default()
                })
                .collect(),
            producer_id: self.id,
            sequence: seq,
        };
        let start = hist.now();
        let t = Instant::now();
        let mut definite = true;
        let mut last = String::new();
        let mut attempts = 0;
        let outcome = loop {
            if t.elapsed() >= deadline {
                let why = format!("deadline passed after {attempts} attempts: {last}");
                break if definite {
                    Outcome::Failed(why)
                } else {
                    Outcome::Unknown(why)
                };
            }
            attempts += 1;
            let mut c = self.clients.get(&self.target).await;
            match tokio::time::timeout(ATTEMPT_TIMEOUT, c.send(req.clone())).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    match code(&r.error) {
                        ErrorCode::Ok => {
                            break Outcome::Acked {
                                offsets: r.results.iter().map(|x| x.offset).collect(),
                                by: self.target.clone(),
                                duplicate: r.duplicate,
                            };
                        }
                        ErrorCode::NotLeader => {
                            last = format!("NOT_LEADER from {}", self.target);
                            if let Some(l) = r.error.as_ref().and_then(|e| e.leader.clone())
                                && l.address != self.target
                            {
                                self.target = l.address;
                                continue;
                            }
                        }
                        // Refused before proposing: nothing stored by this attempt.
                        ErrorCode::Busy | ErrorCode::TopicNotFound => {
                            last = format!("{:?}", r.error);
                        }
                        ErrorCode::InvalidArgument | ErrorCode::MessageTooLarge => {
                            let why = format!("{:?}", r.error);
                            break if definite {
                                Outcome::Failed(why)
                            } else {
                                Outcome::Unknown(why)
                            };
                        }
                        // UNAVAILABLE, INTERNAL...: the proposal may be in some log.
                        _ => {
                            definite = false;
                            last = format!("{:?}", r.error);
                        }
                    }
                }
                Ok(Err(s)) => {
                    if !never_sent(&s) {
                        definite = false;
                    }
                    last = format!("{} from {}", s.message(), self.target);
                }
                Err(_) => {
                    definite = false;
                    last = format!("attempt timeout at {}", self.target);
                }
            }
            // Unknown leader or unreachable node: try the next node.
            self.rr += 1;
            self.target = self.addrs[self.rr % self.addrs.len()].clone();
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if matches!(outcome, Outcome::Acked { .. }) {
            hist.acks.fetch_add(1, Ordering::Relaxed);
        }
        lock(&hist.ops).push(Op {
            producer: self.id,
            seq,
            queue,
            count,
            len,
            start,
            end: hist.now(),
            attempts,
            outcome: outcome.clone(),
        });
        outcome
    }
}

#[derive(Clone, Debug)]
pub struct WorkloadCfg {
    pub producers: u64,
    /// Bound on sends per producer (the load also stops at `stop` or at the scenario's deadline).
    pub max_ops_per_producer: u64,
    pub op_deadline: Duration,
    pub batch_max: u32,
    pub body_len_max: usize,
}

impl Default for WorkloadCfg {
    fn default() -> Self {
        WorkloadCfg {
            producers: 3,
            max_ops_per_producer: 200_000,
            op_deadline: Duration::from_secs(5),
            batch_max: 4,
            body_len_max: 256,
        }
    }
}

async fn producer_loop(
    hist: Arc<History>,
    id: u64,
    addrs: Vec<String>,
    cfg: WorkloadCfg,
    seed: u64,
    stop: Arc<AtomicBool>,
    until: Instant,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (id << 32));
    let mut p = HistProducer::new(id, addrs);
    for _ in 0..cfg.max_ops_per_producer {
        if stop.load(Ordering::Relaxed) || Instant::now() >= until {
            break;
        }
        let queue = rng.random_range(0..QUEUES);
        let count = rng.random_range(1..=cfg.batch_max);
        let len = rng.random_range(24..=cfg.body_len_max);
        p.send(&hist, queue, count, len, cfg.op_deadline).await;
    }
}

/// Commits ever larger offsets of [`GROUP`] through the leader and reads each back from the node
/// that acknowledged it.
async fn committer_loop(
    hist: Arc<History>,
    addrs: Vec<String>,
    stop: Arc<AtomicBool>,
    until: Instant,
) {
    let mut clients = Clients::default();
    let mut target = addrs[0].clone();
    let mut rr = 0;
    let mut value = 0u64;
    // Bounded in count and time; paced so offsets are a small share of the load.
    for i in 0..1_000_000u64 {
        if stop.load(Ordering::Relaxed) || Instant::now() >= until {
            break;
        }
        let queue = (i % QUEUES as u64) as u32;
        if queue == 0 {
            value += 1;
        }
        let mut c = clients.get(&target).await;
        let req = CommitOffsetRequest {
            group: GROUP.into(),
            topic: TOPIC.into(),
            queue,
            offset: value,
        };
        let ok = match tokio::time::timeout(ATTEMPT_TIMEOUT, c.commit_offset(req)).await {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                match code(&r.error) {
                    ErrorCode::Ok => true,
                    ErrorCode::NotLeader => {
                        if let Some(l) = r.error.and_then(|e| e.leader) {
                            target = l.address;
                        } else {
                            rr += 1;
                            target = addrs[rr % addrs.len()].clone();
                        }
                        false
                    }
                    _ => false,
                }
            }
            _ => {
                rr += 1;
                target = addrs[rr % addrs.len()].clone();
                false
            }
        };
        if ok {
            let fetched = match tokio::time::timeout(
                ATTEMPT_TIMEOUT,
                c.fetch_offset(FetchOffsetRequest {
                    group: GROUP.into(),
                    topic: TOPIC.into(),
                    queue,
                }),
            )
            .await
            {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    (code(&r.error) == ErrorCode::Ok).then_some(if r.found { r.offset } else { 0 })
                }
                _ => None,
            };
            lock(&hist.offsets).push(OffsetEvent {
                queue,
                committed: value,
                by: target.clone(),
                at: hist.now(),
                fetched,
            });
        }
        tokio::time::sleep(Duration::from_millis(if ok { 40 } else { 100 })).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster helpers

/// The leader every running node agrees on, or Err after `timeout`.
pub async fn find_leader(c: &Cluster, timeout: Duration) -> Result<u64, String> {
    find_leader_term(c, timeout).await.map(|(l, _)| l)
}

/// As [`find_leader`], with the leader's term.
pub async fn find_leader_term(c: &Cluster, timeout: Duration) -> Result<(u64, u64), String> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < timeout {
        let mut leaders = Vec::new();
        let mut seen = Vec::new();
        let mut all = true;
        let mut term = 0;
        for id in c.nodes.keys() {
            if !c.is_up(*id) {
                continue;
            }
            match c.status(*id).await {
                Some(st) => {
                    if st.role == "leader" {
                        leaders.push(*id);
                        term = st.term;
                    }
                    seen.push(st.leader.map(|l| l.node_id));
                }
                None => all = false,
            }
        }
        if all && leaders.len() == 1 && seen.iter().all(|l| *l == Some(leaders[0])) {
            return Ok((leaders[0], term));
        }
        last = format!("leaders {leaders:?}, seen {seen:?}, all answered {all}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!("no agreed leader within {timeout:?}: {last}"))
}

/// Waits for an agreed leader and for every node to have applied the leader's commit index.
pub async fn wait_converged(c: &Cluster, timeout: Duration) -> Result<u64, String> {
    wait_converged_term(c, timeout).await.map(|(l, _)| l)
}

/// As [`wait_converged`], with the highest term the nodes reported once they had converged.
pub async fn wait_converged_term(c: &Cluster, timeout: Duration) -> Result<(u64, u64), String> {
    let t = Instant::now();
    let leader = find_leader(c, timeout).await?;
    let target = c
        .status(leader)
        .await
        .ok_or("leader stopped answering")?
        .committed;
    let mut last = String::new();
    while t.elapsed() < timeout {
        let mut behind = Vec::new();
        let mut term = 0;
        for id in c.nodes.keys() {
            match c.status(*id).await {
                Some(st) if st.applied >= target => term = term.max(st.term),
                Some(st) => behind.push(format!("node {id} applied {}", st.applied)),
                None => behind.push(format!("node {id} silent")),
            }
        }
        if behind.is_empty() {
            return Ok((leader, term));
        }
        last = behind.join(", ");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!(
        "nodes did not apply commit index {target} of leader {leader} within {timeout:?}: {last}"
    ))
}

fn segments(data_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data_dir.join("log"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The newest non-empty segment file of a stopped node.
fn last_segment(data_dir: &Path) -> Option<(PathBuf, u64)> {
    segments(data_dir)
        .into_iter()
        .rev()
        .filter_map(|p| std::fs::metadata(&p).ok().map(|m| (p, m.len())))
        .find(|(_, len)| *len > 0)
}

/// Flips one bit in the second half of the newest segment of a stopped node.
pub fn flip_bit(data_dir: &Path, rng: &mut StdRng) -> Result<String, String> {
    let (path, len) = last_segment(data_dir).ok_or("no segment to damage")?;
    let mut b = std::fs::read(&path).map_err(|e| e.to_string())?;
    let pos = rng.random_range(len / 2..len) as usize;
    let bit = rng.random_range(0..8u8);
    b[pos] ^= 1 << bit;
    std::fs::write(&path, b).map_err(|e| e.to_string())?;
    Ok(format!(
        "flipped bit {bit} at byte {pos} of {} ({len} bytes)",
        path.display()
    ))
}

/// Cuts the newest segment of a stopped node at a random length in its second half.
pub fn truncate_segment(data_dir: &Path, rng: &mut StdRng) -> Result<String, String> {
    let (path, len) = last_segment(data_dir).ok_or("no segment to damage")?;
    let to = rng.random_range(len / 2..len);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(to))
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "truncated {} from {len} to {to} bytes",
        path.display()
    ))
}

fn power_loss(c: &Cluster, id: u64) -> Result<String, String> {
    // What the seam will see, per segment: file length and the recorded durable length.
    let mut before = Vec::new();
    for p in segments(&c.data_dir(id)) {
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        let record = p.with_extension("durable");
        let durable = match std::fs::read(&record) {
            Ok(b) => match <[u8; 8]>::try_from(b.as_slice()) {
                Ok(a) => u64::from_le_bytes(a).to_string(),
                Err(_) => {
                    // The seam writes its record whole (a temporary file, then a rename); any
                    // other length means the record is not the seam's, and the true durable
                    // length is unknown: dropping the segment would be more than a power loss
                    // does, so leave it whole and say so.
                    std::fs::write(&record, len.to_le_bytes()).map_err(|e| e.to_string())?;
                    format!("TORN record of {} bytes, segment left whole", b.len())
                }
            },
            Err(_) => "none".into(),
        };
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        before.push(format!(
            "{} len {len} durable {durable}",
            name.unwrap_or_default()
        ));
    }
    raftmq_raft_log::log_store::simulate_power_loss(&c.data_dir(id).join("log"))
        .map(|n| {
            format!(
                "node {id}: dropped {n} unsynced bytes [{}]",
                before.join(", ")
            )
        })
        .map_err(|e| format!("power loss on node {id}: {e}"))
}

fn hold(rng: &mut StdRng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo_ms..=hi_ms))
}

/// Bounds of [`inject_opts`].
#[derive(Clone, Debug)]
pub struct InjectOpts {
    /// Bound of the wait for a leader before the fault and for convergence after it.
    pub converge_timeout: Duration,
    /// After a fault that leaves the leader alone ([`FaultKind::leaves_leader`]): wait at most this
    /// long from the heal for the follower's last log index to reach the leader's commit index at
    /// heal time, and fail when it does not. None: no such wait (the convergence wait remains).
    pub catch_up_timeout: Option<Duration>,
}

impl Default for InjectOpts {
    fn default() -> Self {
        InjectOpts {
            converge_timeout: CONVERGE_TIMEOUT,
            catch_up_timeout: None,
        }
    }
}

/// Injects one fault under load, heals it, and waits for the group to converge.
pub async fn inject(
    c: &mut Cluster,
    hist: &History,
    kind: FaultKind,
    rng: &mut StdRng,
) -> Result<(), String> {
    inject_opts(c, hist, kind, rng, &InjectOpts::default()).await
}

/// As [`inject`], with the bounds and the catch-up wait of `opts`.
pub async fn inject_opts(
    c: &mut Cluster,
    hist: &History,
    kind: FaultKind,
    rng: &mut StdRng,
    opts: &InjectOpts,
) -> Result<(), String> {
    let (leader, term_before) = find_leader_term(c, opts.converge_timeout).await?;
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let followers: Vec<u64> = ids.iter().copied().filter(|i| *i != leader).collect();
    let follower = followers[rng.random_range(0..followers.len())];
    let any = ids[rng.random_range(0..ids.len())];
    let start = hist.now();
    let mut note = String::new();
    // Each sleep below IS the fault: how long the node stays dead or frozen under load.
    let nodes = match kind {
        FaultKind::KillLeader | FaultKind::KillFollower => {
            let id = if kind == FaultKind::KillLeader {
                leader
            } else {
                follower
            };
            c.kill(id);
            tokio::time::sleep(hold(rng, 200, 1500)).await;
            c.spawn(id);
            vec![id]
        }
        FaultKind::KillTwo => {
            c.kill(leader);
            c.kill(follower);
            tokio::time::sleep(hold(rng, 200, 1000)).await;
            c.spawn(leader);
            c.spawn(follower);
            vec![leader, follower]
        }
        FaultKind::KillAll | FaultKind::PowerLossAll => {
            for id in &ids {
                c.kill(*id);
            }
            if kind == FaultKind::PowerLossAll {
                for id in &ids {
                    writeln!(note, "{}", power_loss(c, *id)?).ok();
                }
            }
            tokio::time::sleep(hold(rng, 50, 500)).await;
            for id in &ids {
                c.spawn(*id);
            }
            ids.clone()
        }
        FaultKind::PauseLeader => {
            c.pause(leader);
            tokio::time::sleep(hold(
                rng,
                ELECTION_TIMEOUT_MS_MAX + 150,
                ELECTION_TIMEOUT_MS_MAX * 3,
            ))
            .await;
            c.resume(leader);
            vec![leader]
        }
        FaultKind::PauseLeaderKillFollower => {
            c.kill(follower);
            c.pause(leader);
            tokio::time::sleep(hold(
                rng,
                ELECTION_TIMEOUT_MS_MAX + 150,
                ELECTION_TIMEOUT_MS_MAX * 3,
            ))
            .await;
            c.spawn(follower);
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.resume(leader);
            vec![leader, follower]
        }
        FaultKind::WipeFollower => {
            c.kill(follower);
            std::fs::remove_dir_all(c.data_dir(follower)).map_err(|e| e.to_string())?;
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.spawn(follower);
            vec![follower]
        }
        FaultKind::PowerLossOne => {
            c.kill(any);
            note = power_loss(c, any)?;
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.spawn(any);
            vec![any]
        }
        FaultKind::PartitionLeader
        | FaultKind::PartitionFollower
        | FaultKind::PartitionPartial
        | FaultKind::PartitionOneWay
        | FaultKind::PartitionFollowerLong => {
            let proxy = c
                .proxy
                .as_ref()
                .ok_or("a partition needs a cluster started with the fault proxy")?;
            let nodes = match kind {
                FaultKind::PartitionLeader => {
                    proxy.isolate(leader);
                    vec![leader]
                }
                FaultKind::PartitionFollower | FaultKind::PartitionFollowerLong => {
                    proxy.isolate(follower);
                    vec![follower]
                }
                FaultKind::PartitionPartial => {
                    proxy.cut_pair(leader, follower);
                    vec![leader, follower]
                }
                _ => {
                    for f in &followers {
                        proxy.set_link(leader, *f, true);
                    }
                    vec![leader]
                }
            };
            note = format!("cut links {:?}", proxy.cut_links());
            let d = if kind == FaultKind::PartitionFollowerLong {
                PARTITION_LONG
            } else {
                hold(rng, 300, 2500)
            };
            tokio::time::sleep(d).await;
            proxy.heal();
            nodes
        }
        FaultKind::BitFlip | FaultKind::TruncateSegment => {
            c.kill(any);
            note = if kind == FaultKind::BitFlip {
                flip_bit(&c.data_dir(any), rng)?
            } else {
                truncate_segment(&c.data_dir(any), rng)?
            };
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.spawn(any);
            vec![any]
        }
    };
    let healed = hist.now();
    let healed_at = Instant::now();
    tracing::info!(kind = kind.name(), ?nodes, note, "fault healed");
    let caught_node = nodes.first().copied();
    lock(&hist.faults).push(FaultEvent {
        kind,
        nodes,
        start,
        healed,
        converged: healed,
        note: note.trim().to_string(),
        term_before: Some(term_before),
        term_after: None,
        catch_up: None,
    });
    let mut r = Ok(());
    if let (Some(limit), Some(node)) = (opts.catch_up_timeout, caught_node)
        && kind.leaves_leader()
    {
        let (cu, failure) = wait_caught_up(c, node, leader, healed_at, limit).await;
        if let Some(fe) = lock(&hist.faults).last_mut() {
            fe.catch_up = Some(cu);
        }
        if let Some(e) = failure {
            r = Err(e);
        }
    }
    let r = match r {
        Ok(()) => wait_converged_term(c, opts.converge_timeout).await,
        Err(e) => Err(e),
    };
    if let Some(fe) = lock(&hist.faults).last_mut() {
        fe.converged = hist.now();
        fe.term_after = r.as_ref().ok().map(|(_, term)| *term);
    }
    r.map(|_| ())
        .map_err(|e| format!("after {}: {e}", kind.name()))
}

/// Waits until `node`'s last log index reaches the commit index the leader had when the fault
/// healed (`healed_at`), at most `limit` from the heal. Prints progress every 5 s. The second value
/// is the failure, when it did not catch up in time.
async fn wait_caught_up(
    c: &Cluster,
    node: u64,
    leader_hint: u64,
    healed_at: Instant,
    limit: Duration,
) -> (CatchUpEvent, Option<String>) {
    let deadline = healed_at + limit;
    let mut ev = CatchUpEvent {
        node,
        target: 0,
        reached: 0,
        took: Duration::ZERO,
        caught_up: false,
    };
    // The commit index of the node that leads now (the fault left the leader alone: the hint).
    let mut order = vec![leader_hint];
    order.extend(
        c.nodes
            .keys()
            .copied()
            .filter(|i| *i != leader_hint && *i != node),
    );
    let mut target = None;
    // Bounded by the deadline (and a count).
    for _ in 0..100_000u32 {
        for id in &order {
            if let Some(st) = c.status(*id).await
                && st.role == "leader"
            {
                target = Some(st.committed);
                break;
            }
        }
        if target.is_some() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let Some(target) = target else {
        ev.took = healed_at.elapsed();
        let e = format!(
            "CATCH-UP NOT MEASURED: no leader answered within {:.0} s of the heal",
            limit.as_secs_f64()
        );
        return (ev, Some(e));
    };
    ev.target = target;
    let mut last_print = Instant::now();
    let mut at_print = (Instant::now(), 0u64);
    // Bounded by the deadline (and a count).
    for _ in 0..10_000_000u32 {
        if let Some(st) = c.status(node).await {
            ev.reached = st.last_log_index;
            if st.last_log_index >= target {
                ev.took = healed_at.elapsed();
                ev.caught_up = true;
                return (ev, None);
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            let rate = ev.reached.saturating_sub(at_print.1) as f64
                / at_print.0.elapsed().as_secs_f64().max(1e-3);
            eprintln!(
                "  catch-up of node {node}: last log index {} of {target}, {rate:.0} entries/s, \
                 {:.0} s since the heal (limit {:.0} s)",
                ev.reached,
                healed_at.elapsed().as_secs_f64(),
                limit.as_secs_f64()
            );
            last_print = Instant::now();
            at_print = (Instant::now(), ev.reached);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ev.took = healed_at.elapsed();
    let e = format!(
        "CATCH-UP TIMEOUT: follower {node} reached last log index {} of {target} (the leader's \
         commit index at the heal) in {:.1} s; the limit is {:.0} s",
        ev.reached,
        ev.took.as_secs_f64(),
        limit.as_secs_f64()
    );
    (ev, Some(e))
}

// ---------------------------------------------------------------------------------------------
// Reading back

#[derive(Debug, Default)]
pub struct NodeRead {
    pub queues: BTreeMap<u32, Vec<(u64, Vec<u8>)>>,
    pub offsets: BTreeMap<u32, Option<u64>>,
    /// The Raft log index each (queue, offset) was stored by, as this node reports it.
    pub log_index: BTreeMap<(u32, u64), u64>,
    pub errors: Vec<String>,
}

/// Reads every queue of [`TOPIC`] and every offset of [`GROUP`] from the node at `addr`.
pub async fn read_node(addr: &str) -> NodeRead {
    read_topic(addr, TOPIC, Some(GROUP), 500, false).await.0
}

/// What one node holds in one queue of [`FILL_TOPIC`], to compare across nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueSum {
    pub messages: u64,
    /// One past the last offset read.
    pub next_offset: u64,
    /// A hash of every (offset, body) in order (the compacted body: see [`read_fill`]).
    pub checksum: u64,
}

/// Reads every queue of [`FILL_TOPIC`] from the node at `addr`, with a [`QueueSum`] per queue.
///
/// Compacted: a body that is exactly the fill payload its header names ([`FILL_BODY_LEN`] bytes)
/// is kept as that header alone (`encode(id, 0)`), which determines the body byte for byte; any
/// other body is kept as a marker naming its length, a hash of its bytes and its start, which
/// [`check`] reports as unexpected. Check the result against [`History`] ops whose `len` is 0 (as
/// `run_round` does): then every comparison [`check`] makes of compacted bodies (divergence,
/// missing, lost, misplaced, duplicates, order) is the comparison of the real bodies.
pub async fn read_fill(addr: &str) -> (NodeRead, Vec<QueueSum>) {
    read_topic(addr, FILL_TOPIC, None, FILL_PULL_MAX, true).await
}

async fn read_topic(
    addr: &str,
    topic: &str,
    group: Option<&str>,
    max_messages: u32,
    compact: bool,
) -> (NodeRead, Vec<QueueSum>) {
    let mut c = connect(addr).await;
    let mut out = NodeRead::default();
    let mut sums = Vec::new();
    for queue in 0..QUEUES {
        let mut msgs = Vec::new();
        let mut offset = 0;
        let mut sum = QueueSum::default();
        let mut hasher = std::hash::DefaultHasher::new();
        // Bounded: at most 10M pulls of up to `max_messages` messages.
        for _ in 0..10_000_000u64 {
            let r = match c
                .pull(PullRequest {
                    topic: topic.into(),
                    queue,
                    offset,
                    max_messages,
                    ..Default::default()
                })
                .await
            {
                Ok(r) => r.into_inner(),
                Err(s) => {
                    out.errors.push(format!("pull q{queue}@{offset}: {s}"));
                    break;
                }
            };
            if code(&r.error) != ErrorCode::Ok {
                out.errors
                    .push(format!("pull q{queue}@{offset}: {:?}", r.error));
                break;
            }
            if r.messages.is_empty() {
                break;
            }
            for m in r.messages {
                if m.offset != offset {
                    out.errors.push(format!(
                        "q{queue}: offset {} where {offset} was due (offsets must be dense)",
                        m.offset
                    ));
                }
                offset = m.offset + 1;
                out.log_index.insert((queue, m.offset), m.log_index);
                let body = if compact {
                    let b = compact_fill(&m.body);
                    (m.offset, &b).hash(&mut hasher);
                    sum.messages += 1;
                    b
                } else {
                    m.body.to_vec()
                };
                msgs.push((m.offset, body));
            }
        }
        sum.next_offset = offset;
        sum.checksum = hasher.finish();
        sums.push(sum);
        out.queues.insert(queue, msgs);
        let Some(group) = group else {
            continue;
        };
        let f = c
            .fetch_offset(FetchOffsetRequest {
                group: group.into(),
                topic: topic.into(),
                queue,
            })
            .await;
        match f {
            Ok(r) => {
                let r = r.into_inner();
                out.offsets.insert(queue, r.found.then_some(r.offset));
            }
            Err(s) => out.errors.push(format!("fetch offset q{queue}: {s}")),
        }
    }
    (out, sums)
}

/// The payload id of `b` when `b` is exactly `encode(id, b.len())` (as [`decode`], but parsing
/// only the header: the fill's bodies are 8 KiB, and this crate is built unoptimised).
fn decode_prefix(b: &[u8]) -> Option<MsgId> {
    let head = &b[..b.len().min(96)];
    let mut it = head.split(|c| *c == b'|');
    if it.next()? != b"hist" {
        return None;
    }
    let mut num = || -> Option<u64> { std::str::from_utf8(it.next()?).ok()?.parse().ok() };
    let producer = num()?;
    let seq = num()?;
    let idx = u32::try_from(num()?).ok()?;
    let id = MsgId { producer, seq, idx };
    (encode(id, b.len()) == b).then_some(id)
}

/// A fill body as [`read_fill`] keeps it.
fn compact_fill(b: &[u8]) -> Vec<u8> {
    match decode_prefix(b) {
        Some(id) if b.len() == FILL_BODY_LEN => encode(id, 0),
        _ => {
            let mut h = std::hash::DefaultHasher::new();
            b.hash(&mut h);
            format!(
                "not-a-fill-payload|{} bytes|hash {:016x}|{}",
                b.len(),
                h.finish(),
                body_str(b)
            )
            .into_bytes()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checking

#[derive(Debug, Default, Clone)]
pub struct FaultLiveness {
    pub kind: Option<FaultKind>,
    /// Longest time without any acknowledgement from the fault to the next fault (or load end).
    pub max_gap: Duration,
    /// From healing to the first acknowledgement after it.
    pub after_heal: Duration,
}

#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub ops: u64,
    pub acked_ops: u64,
    pub acked_msgs: u64,
    pub failed_ops: u64,
    pub unknown_ops: u64,
    pub read_msgs: u64,
    pub lost: u64,
    pub lost_prefix: u64,
    pub lost_middle: u64,
    pub lost_suffix: u64,
    pub misplaced: u64,
    pub unexpected: u64,
    pub aborted: u64,
    pub divergent: u64,
    pub missing: u64,
    pub order: u64,
    pub duplicates: u64,
    pub offsets_backwards: u64,
    pub offset_commits: u64,
    pub read_errors: u64,
    pub faults: Vec<FaultEvent>,
    pub liveness: Vec<FaultLiveness>,
    pub excerpts: Vec<String>,
    /// Large-log mode: the fill and the check of [`FILL_TOPIC`].
    pub fill: Option<Box<FillReport>>,
}

/// The fill of a large-log round and what every node held of it at the end.
#[derive(Debug, Default)]
pub struct FillReport {
    pub stats: FillStats,
    /// [`check`] of the fill's history against every node's compacted read ([`read_fill`]).
    pub check: Report,
    /// Per node, per queue of [`FILL_TOPIC`].
    pub sums: BTreeMap<u64, Vec<QueueSum>>,
    /// Every node holds the same messages, offsets and bodies in every queue of the fill.
    pub sums_identical: bool,
    /// Reading the fill back from every node (concurrently) and compacting it.
    pub read_took: Duration,
    pub check_took: Duration,
}

impl FillReport {
    pub fn is_ok(&self) -> bool {
        self.check.is_ok() && self.sums_identical
    }
}

/// How the fill of a large-log round went.
#[derive(Clone, Debug, Default)]
pub struct FillStats {
    pub target_bytes: u64,
    pub sends: u64,
    pub acked_sends: u64,
    pub acked_bytes: u64,
    pub took: Duration,
    /// The fill timeout passed before every send was acknowledged.
    pub timed_out: bool,
    /// From the end of the fill until every node had applied the leader's commit index.
    pub converged_after: Duration,
}

impl FillStats {
    pub fn acked_mib(&self) -> f64 {
        self.acked_bytes as f64 / (1u64 << 20) as f64
    }

    pub fn mib_per_sec(&self) -> f64 {
        self.acked_mib() / self.took.as_secs_f64().max(1e-3)
    }
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.lost
            + self.misplaced
            + self.unexpected
            + self.aborted
            + self.divergent
            + self.missing
            + self.order
            + self.duplicates
            + self.offsets_backwards
            + self.read_errors
            == 0
            && self.fill.as_ref().is_none_or(|f| f.is_ok())
    }

    fn excerpt(&mut self, s: String) {
        if self.excerpts.len() < EXCERPTS_MAX {
            self.excerpts.push(s);
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {}: ops {} (acked {}, failed {}, unknown {}), acked msgs {}, read msgs {}, \
             offset commits {}",
            self.seed,
            self.ops,
            self.acked_ops,
            self.failed_ops,
            self.unknown_ops,
            self.acked_msgs,
            self.read_msgs,
            self.offset_commits
        )?;
        writeln!(
            f,
            "  lost {} (prefix {}, middle {}, suffix {}), misplaced {}, unexpected {}, aborted {}, \
             divergent {}, missing {}, order {}, duplicates {}, offsets backwards {}, read errors {}",
            self.lost,
            self.lost_prefix,
            self.lost_middle,
            self.lost_suffix,
            self.misplaced,
            self.unexpected,
            self.aborted,
            self.divergent,
            self.missing,
            self.order,
            self.duplicates,
            self.offsets_backwards,
            self.read_errors
        )?;
        for (fe, l) in self.faults.iter().zip(&self.liveness) {
            writeln!(
                f,
                "  fault {:<27} nodes {:?} at {:>8.3}s healed +{:.3}s converged +{:.3}s; \
                 longest without ack {:.3}s, first ack after heal {:.3}s {}",
                fe.kind.name(),
                fe.nodes,
                fe.start.as_secs_f64(),
                (fe.healed - fe.start).as_secs_f64(),
                (fe.converged - fe.start).as_secs_f64(),
                l.max_gap.as_secs_f64(),
                l.after_heal.as_secs_f64(),
                fe.note.replace('\n', "; ")
            )?;
            let mut extra = String::new();
            if let (Some(a), Some(b)) = (fe.term_before, fe.term_after) {
                write!(extra, "term {a} -> {b}").ok();
                if fe.kind.leaves_leader() && b > a {
                    extra.push_str(" (RISEN by a follower fault)");
                }
            }
            if let Some(cu) = &fe.catch_up {
                write!(
                    extra,
                    "; node {} {} log index {} (of {}) {:.3}s after the heal",
                    cu.node,
                    if cu.caught_up {
                        "caught up to"
                    } else {
                        "DID NOT CATCH UP, reached"
                    },
                    cu.reached,
                    cu.target,
                    cu.took.as_secs_f64()
                )
                .ok();
            }
            if !extra.is_empty() {
                writeln!(f, "        {extra}")?;
            }
        }
        for e in &self.excerpts {
            writeln!(f, "  --- {e}")?;
        }
        if let Some(fill) = &self.fill {
            let st = &fill.stats;
            writeln!(
                f,
                "  fill: {:.0} of {:.0} MiB acknowledged ({} of {} sends) in {:.1}s, {:.1} MiB/s{}; \
                 every node applied it {:.1}s later; read back from every node in {:.1}s, \
                 checked in {:.1}s",
                st.acked_mib(),
                st.target_bytes as f64 / (1u64 << 20) as f64,
                st.acked_sends,
                st.sends,
                st.took.as_secs_f64(),
                st.mib_per_sec(),
                if st.timed_out {
                    " (FILL TIMED OUT)"
                } else {
                    ""
                },
                st.converged_after.as_secs_f64(),
                fill.read_took.as_secs_f64(),
                fill.check_took.as_secs_f64()
            )?;
            for line in fill.check.to_string().lines() {
                writeln!(f, "  fill {line}")?;
            }
            for (id, qs) in &fill.sums {
                let v: Vec<String> = qs
                    .iter()
                    .enumerate()
                    .map(|(q, s)| {
                        format!(
                            "q{q} {} msgs next {} sum {:016x}",
                            s.messages, s.next_offset, s.checksum
                        )
                    })
                    .collect();
                writeln!(f, "  fill node {id}: {}", v.join(", "))?;
            }
            writeln!(
                f,
                "  fill identical on every node: {}",
                if fill.sums_identical { "yes" } else { "NO" }
            )?;
        }
        Ok(())
    }
}

fn fmt_op(o: &Op) -> String {
    let out = match &o.outcome {
        Outcome::Acked {
            offsets,
            by,
            duplicate,
        } => format!(
            "ACKED by {by} offsets {}..={}{}",
            offsets.first().copied().unwrap_or(0),
            offsets.last().copied().unwrap_or(0),
            if *duplicate { " (duplicate)" } else { "" }
        ),
        Outcome::Failed(w) => format!("FAILED {w}"),
        Outcome::Unknown(w) => format!("UNKNOWN {w}"),
    };
    format!(
        "p{} s{} q{} x{} [{:.3}s..{:.3}s] {} attempts: {out}",
        o.producer,
        o.seq,
        o.queue,
        o.count,
        o.start.as_secs_f64(),
        o.end.as_secs_f64(),
        o.attempts
    )
}

/// The sends of `producer` around `seq` and the faults within 3 s of them.
fn op_context(
    ops: &BTreeMap<(u64, u64), Op>,
    faults: &[FaultEvent],
    producer: u64,
    seq: u64,
) -> String {
    let mut s = String::new();
    let lo = seq.saturating_sub(3);
    let mut span: Option<(Duration, Duration)> = None;
    for ((_, q), o) in ops.range((producer, lo)..=(producer, seq + 3)) {
        let mark = if *q == seq { ">>" } else { "  " };
        writeln!(s, "      {mark} {}", fmt_op(o)).ok();
        span = Some(match span {
            None => (o.start, o.end),
            Some((a, b)) => (a.min(o.start), b.max(o.end)),
        });
    }
    if let Some((a, b)) = span {
        let margin = Duration::from_secs(3);
        for fe in faults {
            if fe.converged + margin >= a && fe.start <= b + margin {
                writeln!(
                    s,
                    "         fault {} nodes {:?} [{:.3}s..healed {:.3}s..converged {:.3}s] {}",
                    fe.kind.name(),
                    fe.nodes,
                    fe.start.as_secs_f64(),
                    fe.healed.as_secs_f64(),
                    fe.converged.as_secs_f64(),
                    fe.note.replace('\n', "; ")
                )
                .ok();
            }
        }
    }
    s
}

fn body_str(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 40 {
        format!("{}…({} bytes)", &s[..s.floor_char_boundary(40)], b.len())
    } else {
        s.into_owned()
    }
}

/// Compares the history with what every node holds. `reads` maps node id to what it served.
pub fn check(hist: &History, reads: &BTreeMap<u64, NodeRead>, seed: u64) -> Report {
    let ops_v = lock(&hist.ops).clone();
    let faults = lock(&hist.faults).clone();
    let offsets = lock(&hist.offsets).clone();
    let load_end = lock(&hist.load_end).unwrap_or_else(|| hist.now());
    let mut r = Report {
        seed,
        faults: faults.clone(),
        ..Default::default()
    };
    let ops: BTreeMap<(u64, u64), Op> = ops_v
        .iter()
        .map(|o| ((o.producer, o.seq), o.clone()))
        .collect();
    r.ops = ops.len() as u64;
    for o in ops.values() {
        match &o.outcome {
            Outcome::Acked { offsets, .. } => {
                r.acked_ops += 1;
                r.acked_msgs += offsets.len() as u64;
            }
            Outcome::Failed(_) => r.failed_ops += 1,
            Outcome::Unknown(_) => r.unknown_ops += 1,
        }
    }

    // Read errors.
    for (id, nr) in reads {
        for e in &nr.errors {
            r.read_errors += 1;
            r.excerpt(format!("read error on node {id}: {e}"));
        }
    }

    // Divergence and missing entries; the canonical value of each (queue, offset).
    let mut canon: BTreeMap<(u32, u64), Vec<u8>> = BTreeMap::new();
    for q in 0..QUEUES {
        let mut by_off: BTreeMap<u64, BTreeMap<u64, &Vec<u8>>> = BTreeMap::new();
        for (id, nr) in reads {
            for (off, body) in nr.queues.get(&q).map(|v| v.as_slice()).unwrap_or(&[]) {
                by_off.entry(*off).or_default().insert(*id, body);
            }
        }
        for (off, per_node) in by_off {
            let distinct: BTreeSet<&Vec<u8>> = per_node.values().copied().collect();
            if distinct.len() > 1 {
                r.divergent += 1;
                let mut s = format!("DIVERGENT q{q}@{off}:");
                for (id, b) in &per_node {
                    let li = reads[id].log_index.get(&(q, off)).copied().unwrap_or(0);
                    write!(s, " node {id}={:?} (log index {li})", body_str(b)).ok();
                }
                // The sends behind the first divergent entry, with the faults near them.
                if r.divergent == 1 {
                    for b in &distinct {
                        if let Some(id) = decode(b) {
                            s.push('\n');
                            s.push_str(&op_context(&ops, &faults, id.producer, id.seq));
                        }
                    }
                }
                r.excerpt(s);
            }
            for id in reads.keys() {
                if !per_node.contains_key(id) {
                    r.missing += 1;
                    r.excerpt(format!(
                        "MISSING q{q}@{off} on node {id}, held by nodes {:?}",
                        per_node.keys().collect::<Vec<_>>()
                    ));
                }
            }
            // The value most nodes hold stands for the entry.
            let mut votes: BTreeMap<&Vec<u8>, usize> = BTreeMap::new();
            for b in per_node.values() {
                *votes.entry(*b).or_default() += 1;
            }
            if let Some((b, _)) = votes.into_iter().max_by_key(|(_, n)| *n) {
                canon.insert((q, off), b.clone());
            }
        }
    }
    r.read_msgs = canon.len() as u64;

    // Where each payload was read; unexpected, aborted, duplicates, order.
    let mut found: BTreeMap<MsgId, Vec<(u32, u64)>> = BTreeMap::new();
    let mut last_in_queue: BTreeMap<(u32, u64), (u64, u32, u64)> = BTreeMap::new();
    for ((q, off), body) in &canon {
        let Some(id) = decode(body) else {
            r.unexpected += 1;
            r.excerpt(format!(
                "UNEXPECTED q{q}@{off}: {:?} is no payload of this run",
                body_str(body)
            ));
            continue;
        };
        found.entry(id).or_default().push((*q, *off));
        match ops.get(&(id.producer, id.seq)) {
            None => {
                r.unexpected += 1;
                r.excerpt(format!("UNEXPECTED q{q}@{off}: {id:?} was never sent"));
            }
            Some(o) if id.idx >= o.count || o.queue != *q || encode(id, o.len) != *body => {
                r.unexpected += 1;
                r.excerpt(format!(
                    "UNEXPECTED q{q}@{off}: {id:?} does not match its send\n{}",
                    op_context(&ops, &faults, id.producer, id.seq)
                ));
            }
            Some(o) => {
                if let Outcome::Failed(_) = o.outcome {
                    r.aborted += 1;
                    r.excerpt(format!(
                        "ABORTED q{q}@{off}: {id:?} read although its send failed\n{}",
                        op_context(&ops, &faults, id.producer, id.seq)
                    ));
                }
            }
        }
        if let Some((seq, idx, prev_off)) = last_in_queue.get(&(*q, id.producer)).copied()
            && (id.seq, id.idx) <= (seq, idx)
        {
            r.order += 1;
            r.excerpt(format!(
                "ORDER q{q}: p{} s{seq}#{idx} at offset {prev_off} before s{}#{} at offset {off}\n{}",
                id.producer,
                id.seq,
                id.idx,
                op_context(&ops, &faults, id.producer, id.seq)
            ));
        }
        last_in_queue.insert((*q, id.producer), (id.seq, id.idx, *off));
    }
    for (id, at) in &found {
        if at.len() > 1 {
            r.duplicates += at.len() as u64 - 1;
            r.excerpt(format!(
                "DUPLICATE {id:?} at {at:?}\n{}",
                op_context(&ops, &faults, id.producer, id.seq)
            ));
        }
    }

    // Lost: acknowledged messages not at their acknowledged position.
    let mut read_seqs: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for id in found.keys() {
        let e = read_seqs.entry(id.producer).or_insert((id.seq, id.seq));
        e.0 = e.0.min(id.seq);
        e.1 = e.1.max(id.seq);
    }
    for o in ops.values() {
        let Outcome::Acked { offsets: offs, .. } = &o.outcome else {
            continue;
        };
        for (idx, off) in offs.iter().enumerate() {
            let id = MsgId {
                producer: o.producer,
                seq: o.seq,
                idx: idx as u32,
            };
            if canon.get(&(o.queue, *off)) == Some(&encode(id, o.len)) {
                continue;
            }
            if let Some(at) = found.get(&id) {
                r.misplaced += 1;
                r.excerpt(format!(
                    "MISPLACED {id:?} acked at q{}@{off}, read at {at:?}\n{}",
                    o.queue,
                    op_context(&ops, &faults, o.producer, o.seq)
                ));
                continue;
            }
            r.lost += 1;
            let part = match read_seqs.get(&o.producer) {
                Some((first, _)) if o.seq < *first => "prefix",
                Some((_, last)) if o.seq > *last => "suffix",
                Some(_) => "middle",
                None => "prefix",
            };
            match part {
                "prefix" => r.lost_prefix += 1,
                "suffix" => r.lost_suffix += 1,
                _ => r.lost_middle += 1,
            }
            let held: Vec<String> = reads
                .iter()
                .map(|(n, nr)| {
                    let v = nr.queues.get(&o.queue);
                    format!(
                        "node {n} q{} len {} has {:?}",
                        o.queue,
                        v.map(|v| v.len()).unwrap_or(0),
                        v.and_then(|v| v.get(*off as usize))
                            .map(|(_, b)| body_str(b))
                    )
                })
                .collect();
            r.excerpt(format!(
                "LOST ({part}) {id:?} acked at q{}@{off}; {}\n{}",
                o.queue,
                held.join("; "),
                op_context(&ops, &faults, o.producer, o.seq)
            ));
        }
    }

    // Consumer-group offsets.
    r.offset_commits = offsets.len() as u64;
    let mut max_acked: BTreeMap<u32, u64> = BTreeMap::new();
    for e in &offsets {
        let m = max_acked.entry(e.queue).or_default();
        *m = (*m).max(e.committed);
        if let Some(f) = e.fetched
            && f < e.committed
        {
            r.offsets_backwards += 1;
            r.excerpt(format!(
                "OFFSET BACKWARDS q{} at {:.3}s: {} acked by {}, then it answered {f}",
                e.queue,
                e.at.as_secs_f64(),
                e.committed,
                e.by
            ));
        }
    }
    for (id, nr) in reads {
        for (q, want) in &max_acked {
            let got = nr.offsets.get(q).copied().flatten();
            if got.is_none_or(|g| g < *want) {
                r.offsets_backwards += 1;
                r.excerpt(format!(
                    "OFFSET BACKWARDS at the end: node {id} q{q} holds {got:?}, {want} was acknowledged"
                ));
            }
        }
    }

    // Liveness.
    let mut acks: Vec<Duration> = ops_v
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Acked { .. }))
        .map(|o| o.end)
        .collect();
    acks.sort();
    for (i, fe) in faults.iter().enumerate() {
        let end = faults.get(i + 1).map(|n| n.start).unwrap_or(load_end);
        let mut prev = fe.start;
        let mut max_gap = Duration::ZERO;
        for a in acks.iter().filter(|a| **a > fe.start && **a <= end) {
            max_gap = max_gap.max(*a - prev);
            prev = *a;
        }
        if prev == fe.start {
            // No acknowledgement at all until the next fault: the whole window was unavailable.
            max_gap = end.saturating_sub(fe.start);
        }
        let after_heal = acks
            .iter()
            .find(|a| **a > fe.healed)
            .map(|a| *a - fe.healed)
            .unwrap_or(end.saturating_sub(fe.healed));
        r.liveness.push(FaultLiveness {
            kind: Some(fe.kind),
            max_gap,
            after_heal,
        });
    }
    r
}

// ---------------------------------------------------------------------------------------------
// Scenarios

#[derive(Clone, Debug)]
pub enum FaultPlan {
    Fixed(Vec<FaultKind>),
    /// `count` faults drawn (with the scenario's seed) from `kinds`.
    Random {
        count: usize,
        kinds: Vec<FaultKind>,
    },
}

#[derive(Clone, Debug)]
pub struct ScenarioCfg {
    pub seed: u64,
    pub plan: FaultPlan,
    pub workload: WorkloadCfg,
    /// Acknowledged sends awaited before the first fault and between faults (bounded by `calm`).
    pub acks_between: u64,
    pub calm: Duration,
    /// Hard bound of the load phase (which starts after the fill in large-log mode).
    pub max_duration: Duration,
    /// Large-log mode: fill the log first, wait for followers to catch up after follower faults.
    pub large_log: Option<LargeLogCfg>,
}

impl ScenarioCfg {
    pub fn new(seed: u64, plan: FaultPlan) -> ScenarioCfg {
        ScenarioCfg {
            seed,
            plan,
            workload: WorkloadCfg::default(),
            acks_between: 50,
            calm: Duration::from_secs(5),
            max_duration: Duration::from_secs(600),
            large_log: None,
        }
    }
}

/// The fill's topic (with [`QUEUES`] queues), apart from the workload's [`TOPIC`].
pub const FILL_TOPIC: &str = "hist-fill";
/// Messages per fill send; each send is one Raft entry of [`FILL_SEND_BYTES`].
pub const FILL_MSGS_PER_SEND: u32 = 16;
pub const FILL_BODY_LEN: usize = 8 << 10;
pub const FILL_SEND_BYTES: u64 = FILL_MSGS_PER_SEND as u64 * FILL_BODY_LEN as u64;
/// Fill producers' ids start above this (the workload's producers count from 1).
pub const FILL_PRODUCER_BASE: u64 = 1_000_000;
/// Deadline of one fill send (retried with the same producer id and sequence until then).
const FILL_OP_DEADLINE: Duration = Duration::from_secs(30);
/// Messages per pull when reading the fill back (2 MiB).
const FILL_PULL_MAX: u32 = 256;

/// Large-log mode of a round.
///
/// Why the fill has its own topic: [`check`] keeps every body it reads, from every node, and a
/// copy of the canonical one: for a 1 GiB fill that is 4 GiB and more of memory (and N times that
/// for an N GiB fill), with every byte compared a few times in this unoptimised crate. The fill is
/// instead read from [`FILL_TOPIC`] by [`read_fill`], which keeps each body as the header that
/// determines it, and then goes through the same [`check`] as the workload: every acknowledged
/// fill message must be at its acknowledged offset on every node (lost, misplaced), nothing else
/// may be there (unexpected, aborted, duplicates, order), and the nodes must agree offset by offset
/// (divergent, missing); a per-queue count, end offset and checksum are compared across nodes too.
/// Memory is tens of bytes per 8 KiB message, and the three nodes are read concurrently, so the
/// read-back of a 1 GiB round is bound by the nodes' disks (seconds to tens of seconds), well
/// under a minute.
#[derive(Clone, Debug)]
pub struct LargeLogCfg {
    /// MiB sent before the load starts.
    pub mib: u64,
    /// Concurrent fill producers, each with one send in flight.
    pub producers: u64,
    /// The fill stops sending after this long (what was acknowledged stays and is checked).
    pub fill_timeout: Duration,
    /// The longest a follower may take from a heal to catch up; 60 s + `mib` at 20 MiB/s.
    pub catch_up_timeout: Duration,
}

impl LargeLogCfg {
    pub fn new(mib: u64) -> LargeLogCfg {
        LargeLogCfg {
            mib,
            producers: 8,
            fill_timeout: Duration::from_secs(120) + Duration::from_secs_f64(mib as f64 / 4.0),
            catch_up_timeout: Duration::from_secs(60) + Duration::from_secs_f64(mib as f64 / 20.0),
        }
    }

    /// Bound of every wait for a leader and for convergence: a node restarting or catching up
    /// replays or receives the whole log.
    pub fn converge_timeout(&self) -> Duration {
        CONVERGE_TIMEOUT.max(self.catch_up_timeout)
    }
}

/// Sends `cfg.mib` MiB to [`FILL_TOPIC`] through the leader, in sends of [`FILL_MSGS_PER_SEND`]
/// messages of [`FILL_BODY_LEN`] bytes (one Raft entry each, replicated and fsynced by the
/// group), from `cfg.producers` producers at once, each send recorded in `hist`. Prints progress
/// on stderr once a second. Returns once every producer stopped: every send was made, or the fill
/// timeout passed (then within one send deadline).
pub async fn fill_log(c: &Cluster, hist: Arc<History>, cfg: &LargeLogCfg) -> FillStats {
    let addrs = c.addrs();
    let total_sends = (cfg.mib << 20).div_ceil(FILL_SEND_BYTES);
    let target_mib = cfg.mib as f64;
    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let deadline = t + cfg.fill_timeout;
    let mut tasks = Vec::new();
    for p in 1..=cfg.producers.max(1) {
        let (hist, addrs, next, acked) = (hist.clone(), addrs.clone(), next.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let mut prod = HistProducer::with_topic(FILL_PRODUCER_BASE + p, addrs, FILL_TOPIC);
            // Bounded by the number of sends and by the deadline.
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total_sends {
                    break;
                }
                let queue = (i % QUEUES as u64) as u32;
                let out = prod
                    .send(
                        &hist,
                        queue,
                        FILL_MSGS_PER_SEND,
                        FILL_BODY_LEN,
                        FILL_OP_DEADLINE,
                    )
                    .await;
                if let Outcome::Acked { .. } = out {
                    acked.fetch_add(FILL_SEND_BYTES, Ordering::Relaxed);
                }
            }
        }));
    }
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut prev = (Instant::now(), 0u64);
    // Bounded: every producer stops within one send deadline of the fill deadline.
    let bound = cfg.fill_timeout + FILL_OP_DEADLINE + Duration::from_secs(10);
    while t.elapsed() < bound && !tasks.iter().all(|h| h.is_finished()) {
        for _ in 0..20 {
            if tasks.iter().all(|h| h.is_finished()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let done = acked.load(Ordering::Relaxed);
        let rate = mib(done - prev.1) / prev.0.elapsed().as_secs_f64().max(1e-3);
        prev = (Instant::now(), done);
        eprintln!(
            "  fill: {:.0} of {target_mib:.0} MiB, {rate:.1} MiB/s (average {:.1} MiB/s), {:.0} s",
            mib(done),
            mib(done) / t.elapsed().as_secs_f64().max(1e-3),
            t.elapsed().as_secs_f64()
        );
    }
    for h in tasks {
        // Each ends within one send deadline (its sends record themselves; never aborted, or a
        // send stored but not recorded would read back as unexpected).
        let _ = h.await;
    }
    let took = t.elapsed();
    let ops = lock(&hist.ops);
    let acked_sends = ops
        .iter()
        .filter(|o| matches!(o.outcome, Outcome::Acked { .. }))
        .count() as u64;
    FillStats {
        target_bytes: cfg.mib << 20,
        sends: ops.len() as u64,
        acked_sends,
        acked_bytes: acked_sends * FILL_SEND_BYTES,
        took,
        timed_out: acked_sends < total_sends,
        converged_after: Duration::ZERO,
    }
}

/// Waits (bounded by `calm`) until `n` more sends have been acknowledged.
async fn calm(hist: &History, n: u64, calm: Duration) {
    let base = hist.acks.load(Ordering::Relaxed);
    let t = Instant::now();
    while t.elapsed() < calm && hist.acks.load(Ordering::Relaxed) < base + n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn create_topic(c: &Cluster, name: &str) -> Result<(), String> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < CONVERGE_TIMEOUT {
        let leader = find_leader(c, CONVERGE_TIMEOUT).await?;
        match c
            .client(leader)
            .await
            .create_topic(CreateTopicRequest {
                name: name.into(),
                queues: QUEUES,
                update: false,
            })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                match code(&r.error) {
                    ErrorCode::Ok | ErrorCode::TopicExists => return Ok(()),
                    _ => last = format!("{:?}", r.error),
                }
            }
            Err(s) => last = s.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("create topic {name}: {last}"))
}

/// A round's outcome: the checked report (Err: the group did not converge or a follower did not
/// catch up within its bound), and the faults injected either way.
pub struct RoundOutcome {
    pub result: Result<Report, String>,
    pub faults: Vec<FaultEvent>,
}

/// Starts a three-node group with durable-length tracking (for power loss), runs the workload
/// through the planned faults, reads every node back and checks the history.
///
/// Err: the group did not converge within its bound (with the faults so far); the history check
/// itself is in the returned report.
pub async fn run_scenario(cfg: &ScenarioCfg) -> Result<Report, String> {
    run_round(cfg).await.result
}

/// As [`run_scenario`], with the faults of a round that failed too. The nodes' data dirs are
/// removed before it returns, unless the round failed and `RAFTMQ_KEEP_FAILED` is set (then the
/// report or the error names where they are).
pub async fn run_round(cfg: &ScenarioCfg) -> RoundOutcome {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let plan: Vec<FaultKind> = match &cfg.plan {
        FaultPlan::Fixed(v) => v.clone(),
        FaultPlan::Random { count, kinds } => (0..*count)
            .map(|_| kinds[rng.random_range(0..kinds.len())])
            .collect(),
    };
    eprintln!(
        "seed {}: faults {:?}",
        cfg.seed,
        plan.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    let mut c = Cluster::start_opts(3, &[], &[("RAFTMQ_TRACK_DURABLE", "1")], true).await;
    let mut hist = None;
    let mut result = scenario(cfg, plan, &mut rng, &mut c, &mut hist).await;
    let faults = hist.map(|h| lock(&h.faults).clone()).unwrap_or_default();
    // Every node stops before its data dir goes (or is kept).
    c.kill_all();
    let failed = result.as_ref().map_or(true, |r| !r.is_ok());
    let keep = failed && std::env::var_os("RAFTMQ_KEEP_FAILED").is_some();
    match tempfile::tempdir() {
        Ok(fresh) => {
            let dir = std::mem::replace(&mut c.dir, fresh);
            let shown = dir.path().display().to_string();
            if keep {
                // The nodes' data dirs and logs, for a post-mortem.
                let kept = format!("data dirs and node logs kept in {}", dir.keep().display());
                match &mut result {
                    Ok(report) => report.excerpts.push(kept),
                    Err(e) => {
                        e.push('\n');
                        e.push_str(&kept);
                    }
                }
            } else if let Err(e) = dir.close() {
                eprintln!("WARNING: could not remove the round's data dirs {shown}: {e}");
            }
        }
        // The old dir is then removed when the cluster drops.
        Err(e) => eprintln!("WARNING: no temporary dir: {e}"),
    }
    RoundOutcome { result, faults }
}

/// The round on a started cluster; `hist_out` receives the workload's history once it exists.
async fn scenario(
    cfg: &ScenarioCfg,
    plan: Vec<FaultKind>,
    rng: &mut StdRng,
    c: &mut Cluster,
    hist_out: &mut Option<Arc<History>>,
) -> Result<Report, String> {
    create_topic(c, TOPIC).await?;
    let converge_timeout = cfg
        .large_log
        .as_ref()
        .map(|l| l.converge_timeout())
        .unwrap_or(CONVERGE_TIMEOUT);
    let opts = InjectOpts {
        converge_timeout,
        catch_up_timeout: cfg.large_log.as_ref().map(|l| l.catch_up_timeout),
    };
    let mut fill = None;
    if let Some(ll) = &cfg.large_log {
        create_topic(c, FILL_TOPIC).await?;
        let fill_hist = Arc::new(History::default());
        eprintln!(
            "seed {}: filling the log with {} MiB ({} producers, sends of {} KiB)",
            cfg.seed,
            ll.mib,
            ll.producers,
            FILL_SEND_BYTES >> 10
        );
        let mut stats = fill_log(c, fill_hist.clone(), ll).await;
        let t = Instant::now();
        if let Err(e) = wait_converged(c, converge_timeout).await {
            return Err(failure_text(
                cfg.seed,
                c,
                &[],
                &format!("after the fill of {} MiB: {e}", ll.mib),
            ));
        }
        stats.converged_after = t.elapsed();
        eprintln!(
            "seed {}: fill done: {:.0} MiB acknowledged in {:.1} s ({:.1} MiB/s){}, every node \
             applied it {:.1} s later",
            cfg.seed,
            stats.acked_mib(),
            stats.took.as_secs_f64(),
            stats.mib_per_sec(),
            if stats.timed_out {
                " FILL TIMED OUT"
            } else {
                ""
            },
            stats.converged_after.as_secs_f64()
        );
        fill = Some((fill_hist, stats));
    }
    let addrs: Vec<String> = c.nodes.values().map(|n| n.addr.clone()).collect();
    let hist = Arc::new(History::default());
    *hist_out = Some(hist.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + cfg.max_duration;
    let mut tasks = Vec::new();
    for p in 1..=cfg.workload.producers {
        tasks.push(tokio::spawn(producer_loop(
            hist.clone(),
            p,
            addrs.clone(),
            cfg.workload.clone(),
            cfg.seed,
            stop.clone(),
            until,
        )));
    }
    tasks.push(tokio::spawn(committer_loop(
        hist.clone(),
        addrs.clone(),
        stop.clone(),
        until,
    )));

    calm(&hist, cfg.acks_between, cfg.calm).await;
    let mut result = Ok(());
    for kind in plan {
        if Instant::now() >= until {
            break;
        }
        // The long partition runs under load: not started when the load ends before it heals.
        if kind == FaultKind::PartitionFollowerLong
            && until.saturating_duration_since(Instant::now()) < PARTITION_LONG
        {
            eprintln!(
                "seed {}: {} skipped: the load ends within {} s",
                cfg.seed,
                kind.name(),
                PARTITION_LONG.as_secs()
            );
            continue;
        }
        if let Err(e) = inject_opts(c, &hist, kind, rng, &opts).await {
            result = Err(e);
            break;
        }
        calm(&hist, cfg.acks_between, cfg.calm).await;
    }
    stop.store(true, Ordering::Relaxed);
    *lock(&hist.load_end) = Some(hist.now());
    for t in tasks {
        // Each task ends within one op deadline of `stop`.
        let _ = t.await;
    }
    let converged = match result {
        Ok(()) => wait_converged(c, converge_timeout).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = converged {
        let faults = lock(&hist.faults).clone();
        return Err(failure_text(cfg.seed, c, &faults, &e));
    }
    let mut reads = BTreeMap::new();
    for (id, n) in &c.nodes {
        reads.insert(*id, read_node(&n.addr).await);
    }
    let mut report = check(&hist, &reads, cfg.seed);
    if let Some((fill_hist, stats)) = fill {
        report.fill = Some(Box::new(check_fill(c, &fill_hist, stats, cfg.seed).await));
    }
    Ok(report)
}

/// Reads the fill back from every node at once and checks it (see [`LargeLogCfg`]).
async fn check_fill(c: &Cluster, fill_hist: &History, stats: FillStats, seed: u64) -> FillReport {
    let t = Instant::now();
    let mut handles = Vec::new();
    for (id, n) in &c.nodes {
        let addr = n.addr.clone();
        handles.push((*id, tokio::spawn(async move { read_fill(&addr).await })));
    }
    let mut reads = BTreeMap::new();
    let mut sums = BTreeMap::new();
    for (id, h) in handles {
        match h.await {
            Ok((nr, s)) => {
                reads.insert(id, nr);
                sums.insert(id, s);
            }
            Err(e) => {
                let mut nr = NodeRead::default();
                nr.errors.push(format!("reading the fill failed: {e}"));
                reads.insert(id, nr);
            }
        }
    }
    let read_took = t.elapsed();
    let t = Instant::now();
    // The ops as the compacted bodies stand for them (see `read_fill`).
    let ops: Vec<Op> = lock(&fill_hist.ops)
        .iter()
        .map(|o| Op {
            len: 0,
            ..o.clone()
        })
        .collect();
    let compacted = History {
        t0: fill_hist.t0,
        ops: Mutex::new(ops),
        load_end: Mutex::new(Some(fill_hist.now())),
        ..History::default()
    };
    let check = check(&compacted, &reads, seed);
    let first = sums.values().next();
    let sums_identical = sums.len() == reads.len() && sums.values().all(|s| Some(s) == first);
    FillReport {
        stats,
        check,
        sums,
        sums_identical,
        read_took,
        check_took: t.elapsed(),
    }
}

/// The error of a round that did not converge: the faults so far, the first panic and the tail of
/// every node's log.
fn failure_text(seed: u64, c: &Cluster, faults: &[FaultEvent], e: &str) -> String {
    let mut s = format!("seed {seed}: {e}\nfaults:\n");
    for fe in faults {
        writeln!(s, "  {fe:?}").ok();
    }
    for id in c.nodes.keys() {
        // The first panic and the last lines that are not heartbeat or replication noise.
        let log = c.node_log(*id);
        let lines: Vec<&str> = log.lines().collect();
        if let Some(i) = lines.iter().position(|l| l.contains("panicked")) {
            writeln!(s, "node {id} panicked:").ok();
            for l in &lines[i..(i + 6).min(lines.len())] {
                writeln!(s, "  {l}").ok();
            }
        }
        let tail: Vec<&str> = lines
            .iter()
            .rev()
            .filter(|l| !l.contains("heartbeat") && !l.contains("RaftMsg"))
            .take(12)
            .copied()
            .collect();
        writeln!(s, "node {id} log tail:").ok();
        for l in tail.into_iter().rev() {
            writeln!(s, "  {l}").ok();
        }
    }
    s
}
