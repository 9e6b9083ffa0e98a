//! The workload: producers that send recognisable payloads and record every send, a committer
//! that moves a consumer group's offsets, the large-log fill, and the read-back of every node.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use super::report::{FillStats, body_str};
use super::{
    ATTEMPT_TIMEOUT, CONVERGE_TIMEOUT, GROUP, History, MsgId, OffsetEvent, Op, Outcome, QUEUES,
    TOPIC, encode, lock,
};
use crate::{Cluster, code, connect};

// ---------------------------------------------------------------------------------------------
// Clients

/// Channels per address, reused across sends (lazy: they reconnect after a node restarts).
#[derive(Default)]
pub(super) struct Clients(HashMap<String, BrokerServiceClient<Channel>>);

impl Clients {
    pub(super) async fn get(&mut self, addr: &str) -> BrokerServiceClient<Channel> {
        if let Some(c) = self.0.get(addr) {
            return c.clone();
        }
        let c = connect(addr).await;
        self.0.insert(addr.to_string(), c.clone());
        c
    }
}

/// True when a transport error proves the request never left (nothing can have been stored).
pub(super) fn never_sent(s: &tonic::Status) -> bool {
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
    /// Each attempt of a batch is a new batch (a new sequence), as a RocketMQ 5 client's retry
    /// through another node is; the messages carry ids ([`ID_PROPERTY`]) the group stores once.
    pub new_batch_per_attempt: bool,
    /// Each batch's messages carry the message group [`fifo_group`] (a FIFO group's order).
    pub message_groups: bool,
}

/// Message groups per producer when [`HistProducer::message_groups`] is set.
pub const FIFO_GROUPS_PER_PRODUCER: u64 = 3;

/// The message group of a workload message: its producer's batch sequence modulo
/// [`FIFO_GROUPS_PER_PRODUCER`], so a producer's groups interleave and each keeps its own order.
pub fn fifo_group(id: MsgId) -> String {
    format!("mg{}-{}", id.producer, id.seq % FIFO_GROUPS_PER_PRODUCER)
}

/// The queue every message of [`fifo_group`] goes to (as a client hashes a group to a queue).
pub fn fifo_queue(producer: u64, seq: u64) -> u32 {
    ((producer * FIFO_GROUPS_PER_PRODUCER + seq % FIFO_GROUPS_PER_PRODUCER) % QUEUES as u64) as u32
}

/// The property holding a message's id when [`HistProducer::new_batch_per_attempt`] is set.
pub const ID_PROPERTY: &str = "hist.id";

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
            new_batch_per_attempt: false,
            message_groups: false,
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
        let mut outcomes = self
            .send_parts(hist, &[(queue, count)], len, deadline)
            .await;
        outcomes.pop().expect("one part")
    }

    /// Sends a batch to each (queue, count) of `parts` in one call (`SendMany` when more than
    /// one: one log entry), each part a batch of its own sequence, and records an op per part.
    pub async fn send_parts(
        &mut self,
        hist: &History,
        parts: &[(u32, u32)],
        len: usize,
        deadline: Duration,
    ) -> Vec<Outcome> {
        let mut reqs: Vec<SendRequest> = parts
            .iter()
            .map(|&(queue, count)| {
                self.seq += 1;
                self.request(self.seq, queue, count, len)
            })
            .collect();
        let seqs: Vec<u64> = reqs.iter().map(|r| r.sequence).collect();
        let start = hist.now();
        let t = Instant::now();
        let mut definite = true;
        let mut last = String::new();
        let mut attempts = 0;
        let outcomes: Vec<Outcome> = loop {
            let failed = |definite: bool, why: String| {
                if definite {
                    Outcome::Failed(why)
                } else {
                    Outcome::Unknown(why)
                }
            };
            if t.elapsed() >= deadline {
                let why = format!("deadline passed after {attempts} attempts: {last}");
                break vec![failed(definite, why); reqs.len()];
            }
            attempts += 1;
            if self.new_batch_per_attempt {
                for (r, seq) in reqs.iter_mut().zip(&seqs) {
                    r.sequence = (seq << 20) | attempts as u64;
                }
            }
            let mut c = self.clients.get(&self.target).await;
            // The call's own error, and each part's answer.
            let answer = if reqs.len() == 1 {
                tokio::time::timeout(ATTEMPT_TIMEOUT, c.send(reqs[0].clone()))
                    .await
                    .map(|r| {
                        r.map(|r| {
                            let r = r.into_inner();
                            (r.error.clone(), vec![r])
                        })
                    })
            } else {
                let call = SendManyRequest {
                    parts: reqs.clone(),
                };
                tokio::time::timeout(ATTEMPT_TIMEOUT, c.send_many(call))
                    .await
                    .map(|r| {
                        r.map(|r| {
                            let r = r.into_inner();
                            (r.error, r.parts)
                        })
                    })
            };
            match answer {
                Ok(Ok((error, answers))) => match code(&error) {
                    ErrorCode::Ok if answers.len() == reqs.len() => {
                        let codes: Vec<ErrorCode> =
                            answers.iter().map(|r| code(&r.error)).collect();
                        // A part refused before it was proposed (a restarted node that has not
                        // applied the topic yet, busy): the call is tried again, and the parts
                        // stored meanwhile answer from their producer windows.
                        if let Some(i) = codes
                            .iter()
                            .position(|c| matches!(c, ErrorCode::Busy | ErrorCode::TopicNotFound))
                        {
                            last = format!("part {i}: {:?}", answers[i].error);
                        } else {
                            break answers
                                .into_iter()
                                .zip(codes)
                                .map(|(r, c)| match c {
                                    ErrorCode::Ok => Outcome::Acked {
                                        offsets: r.results.iter().map(|x| x.offset).collect(),
                                        by: self.target.clone(),
                                        duplicate: r.duplicate,
                                    },
                                    // Refused for what it is: not stored by this attempt.
                                    ErrorCode::InvalidArgument | ErrorCode::MessageTooLarge => {
                                        failed(definite, format!("{:?}", r.error))
                                    }
                                    _ => Outcome::Unknown(format!("{:?}", r.error)),
                                })
                                .collect();
                        }
                    }
                    ErrorCode::Ok => {
                        let why = format!("{} answers to {} parts", answers.len(), reqs.len());
                        break vec![Outcome::Unknown(why); reqs.len()];
                    }
                    ErrorCode::NotLeader => {
                        last = format!("NOT_LEADER from {}", self.target);
                        if let Some(l) = error.as_ref().and_then(|e| e.leader.clone())
                            && l.address != self.target
                        {
                            self.target = l.address;
                            continue;
                        }
                    }
                    // Refused before proposing: nothing stored by this attempt.
                    ErrorCode::Busy | ErrorCode::TopicNotFound => {
                        last = format!("{error:?}");
                    }
                    ErrorCode::InvalidArgument | ErrorCode::MessageTooLarge => {
                        break vec![failed(definite, format!("{error:?}")); reqs.len()];
                    }
                    // UNAVAILABLE, INTERNAL...: the proposal may be in some log.
                    _ => {
                        definite = false;
                        last = format!("{error:?}");
                    }
                },
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
        let end = hist.now();
        for ((req, seq), outcome) in reqs.iter().zip(&seqs).zip(&outcomes) {
            if matches!(outcome, Outcome::Acked { .. }) {
                hist.acks.fetch_add(1, Ordering::Relaxed);
            }
            lock(&hist.ops).push(Op {
                producer: self.id,
                seq: *seq,
                queue: req.queue,
                count: req.messages.len() as u32,
                len,
                start,
                end,
                attempts,
                outcome: outcome.clone(),
            });
        }
        outcomes
    }

    /// The batch of sequence `seq`: `count` recognisable messages of `len` bytes to `queue`.
    fn request(&self, seq: u64, queue: u32, count: u32, len: usize) -> SendRequest {
        let mut req = SendRequest {
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
            dedup_property: String::new(),
        };
        if self.message_groups {
            req.queue = fifo_queue(self.id, seq);
            for (idx, m) in req.messages.iter_mut().enumerate() {
                let id = MsgId {
                    producer: self.id,
                    seq,
                    idx: idx as u32,
                };
                m.properties
                    .insert(raftmq_proto::MESSAGE_GROUP_PROPERTY.into(), fifo_group(id));
            }
        }
        if self.new_batch_per_attempt {
            req.dedup_property = ID_PROPERTY.into();
            for (idx, m) in req.messages.iter_mut().enumerate() {
                m.properties
                    .insert(ID_PROPERTY.into(), format!("{}.{seq}.{idx}", self.id));
            }
        }
        req
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
    /// Producers send each attempt as a new batch with message ids (see
    /// [`HistProducer::new_batch_per_attempt`]).
    pub new_batch_per_attempt: bool,
    /// Messages carry message groups, each group in one queue ([`HistProducer::message_groups`]).
    pub message_groups: bool,
}

impl Default for WorkloadCfg {
    fn default() -> Self {
        WorkloadCfg {
            producers: 3,
            max_ops_per_producer: 200_000,
            op_deadline: Duration::from_secs(5),
            batch_max: 4,
            body_len_max: 256,
            new_batch_per_attempt: false,
            message_groups: false,
        }
    }
}

pub(super) async fn producer_loop(
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
    p.new_batch_per_attempt = cfg.new_batch_per_attempt;
    p.message_groups = cfg.message_groups;
    for _ in 0..cfg.max_ops_per_producer {
        if stop.load(Ordering::Relaxed) || Instant::now() >= until {
            break;
        }
        let queue = rng.random_range(0..QUEUES);
        let count = rng.random_range(1..=cfg.batch_max);
        let len = rng.random_range(24..=cfg.body_len_max);
        // Every other send, on average, is one call to two queues (a `SendMany`: one entry
        // holding both batches), so every fault scenario checks it too.
        if rng.random_bool(0.5) {
            let other = (queue + 1) % QUEUES;
            let parts = [(queue, count), (other, rng.random_range(1..=cfg.batch_max))];
            p.send_parts(&hist, &parts, len, cfg.op_deadline).await;
        } else {
            p.send(&hist, queue, count, len, cfg.op_deadline).await;
        }
    }
}

/// Commits ever larger offsets of [`GROUP`] through the leader and reads each back from the node
/// that acknowledged it.
pub(super) async fn committer_loop(
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
///
/// [`check`]: fn@super::check
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
///
/// [`check`]: fn@super::check
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
