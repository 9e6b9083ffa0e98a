//! The POP workload (RocketMQ 5's receive / ack, replicated by the broker group): consumers of one
//! consumer group that receive the workload's own messages from [`TOPIC`] while the producers send
//! them and the faults hit, and record every receive, acknowledgement and invisibility change;
//! then the drain and the read of the group's dead-letter topic. [`check_pop`] compares it.
//!
//! Contract:
//! - The group [`POP_GROUP`] is created through `CreateGroup` on the leader before the load
//!   starts, with [`POP_MAX_ATTEMPTS`] deliveries before a message is dead-lettered. It consumes
//!   [`TOPIC`] itself (every queue; no topic of its own): what it must receive is exactly what the
//!   nodes hold of the workload at the end, read back for the main check anyway.
//! - [`PopCfg::consumers`] consumers loop: one `Pop` of up to [`POP_BATCH`] messages from every
//!   queue, invisible for 1-3 s (drawn per receive, seeded), long-polling at most
//!   [`POP_WAIT_MS`]; a `NOT_LEADER` reply is followed to the leader it names. Each message
//!   received is then, by the seeded draw, acknowledged (most), made invisible again for 1-3 s
//!   with `ChangeInvisible` and then acknowledged under the new handle, or left alone to expire
//!   (it comes back with the next attempt, or goes to the dead-letter topic after the last one).
//! - Every call is recorded with what its reply proves: a receive answered (with its deliveries),
//!   refused (`NOT_LEADER`, a refused connection: nothing applied) or unknown (timeout, dropped
//!   connection, `UNAVAILABLE`: it may have handed messages out that nobody saw); an ack per
//!   handle answered OK, answered `INVALID_RECEIPT_HANDLE`, not applied (every attempt refused)
//!   or unknown (no answer, or `INVALID` after an attempt that may have applied); a change
//!   answered OK (with the new handle and deadline), stale, not applied or unknown.
//! - Drain ([`drain`]): after the last fault healed, the load stopped and the group converged, the
//!   consumers keep receiving and acknowledge everything, until every deadline that can be
//!   pending has passed and nothing was received for [`DRAIN_QUIET`] (bounded by [`DRAIN_MAX`];
//!   hitting the bound fails the round). Messages out of attempts are dead-lettered by the
//!   receive that finds them due, and stored in `%DLQ%pop-hist` by the leader's mover.
//! - Dead letters ([`read_dlq`]): read from the leader with v1 `Pull` until every message whose
//!   last seen delivery was the last attempt and was not acknowledged is there, and the topic has
//!   not grown for [`DLQ_SETTLE`] (the mover runs at least once a second; what it still holds is
//!   not observable from outside, so the settle window covers dead letters of deliveries nobody
//!   saw), bounded by [`DLQ_WAIT_MAX`].
//!
//! [`check_pop`]: super::check::check_pop

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use raftmq_proto::v1::{
    ChangeInvisibleRequest, CreateGroupRequest, ErrorCode, GroupConfig, PopAckRequest, PopRequest,
    PullRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::faults::find_leader;
use super::workload::{Clients, never_sent};
use super::{CONVERGE_TIMEOUT, History, MsgId, TOPIC, decode, lock};
use crate::{Cluster, code, connect};

/// The POP consumer group of the history workload.
pub const POP_GROUP: &str = "pop-hist";
/// Deliveries of a message before the group dead-letters it.
pub const POP_MAX_ATTEMPTS: u32 = 3;
/// Messages per receive.
pub const POP_BATCH: u32 = 8;
/// Long poll of one receive.
pub const POP_WAIT_MS: u32 = 500;
/// Invisible times drawn for receives and changes.
pub const POP_INVISIBLE_MS_MIN: u64 = 1_000;
pub const POP_INVISIBLE_MS_MAX: u64 = 3_000;
/// The drain ends once nothing was received for this long after every deadline passed.
pub const DRAIN_QUIET: Duration = Duration::from_secs(3);
/// Bound of the drain.
pub const DRAIN_MAX: Duration = Duration::from_secs(60);
/// The dead-letter topic must not grow for this long before it is read for the check.
pub const DLQ_SETTLE: Duration = Duration::from_millis(2_500);
/// Bound of the wait for the dead-letter topic.
pub const DLQ_WAIT_MAX: Duration = Duration::from_secs(30);
/// One receive RPC: its long poll plus time to propose, commit and answer (also sent to the
/// broker as the gRPC deadline, which shortens its long poll to answer in time).
const POP_RPC_TIMEOUT: Duration = Duration::from_millis(POP_WAIT_MS as u64 + 1_500);
/// One ack or change attempt.
const RPC_TIMEOUT: Duration = Duration::from_millis(1_500);
/// An ack or change is retried (following `NOT_LEADER`) until this deadline.
const OP_DEADLINE: Duration = Duration::from_secs(4);

/// The group's dead-letter topic.
pub fn pop_dlq_topic() -> String {
    format!("%DLQ%{POP_GROUP}")
}

/// Milliseconds since the epoch: the clock the leader stamps into POP entries (the replicated
/// clock is the highest stamp applied; the nodes run on this host).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The POP workload of a round ([`ScenarioCfg::pop`](super::ScenarioCfg::pop)).
#[derive(Clone, Debug)]
pub struct PopCfg {
    /// Concurrent consumers.
    pub consumers: u64,
    /// Percent of messages made invisible again and then acknowledged.
    pub change_pct: u32,
    /// Percent of messages left to expire (received again later, or dead-lettered).
    pub ignore_pct: u32,
    /// The group is FIFO and the producers' messages carry message groups: a group's next
    /// message must not be handed out before the one before it is acknowledged or
    /// dead-lettered (checked by [`super::check::check_pop`]).
    pub fifo: bool,
}

impl Default for PopCfg {
    fn default() -> Self {
        PopCfg {
            consumers: 3,
            change_pct: 10,
            ignore_pct: 15,
            fifo: false,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// History

/// A (queue, offset) of [`TOPIC`]: what the group's state names a message by.
pub type PopKey = (u32, u64);

/// What the consumer decided for a message it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Ack,
    ChangeThenAck,
    Ignore,
}

#[derive(Clone, Debug)]
pub enum PopCallOutcome {
    /// Answered with this many messages.
    Received(u32),
    /// Nothing can have been applied (`NOT_LEADER`, a refused connection, an invalid request).
    Refused(String),
    /// It may have been applied and handed out messages nobody saw.
    Unknown(String),
}

/// One `Pop` RPC.
#[derive(Clone, Debug)]
pub struct PopCall {
    pub consumer: u64,
    pub by: String,
    pub invisible_ms: u64,
    pub start: Duration,
    pub end: Duration,
    pub start_wall_ms: u64,
    pub end_wall_ms: u64,
    pub drain: bool,
    pub outcome: PopCallOutcome,
}

/// One message handed out to a consumer (a receive whose reply arrived).
#[derive(Clone, Debug)]
pub struct Delivery {
    pub consumer: u64,
    pub key: PopKey,
    /// The workload's payload id, when the body is one.
    pub id: Option<MsgId>,
    pub attempt: u32,
    pub handle: String,
    /// What the receive asked for; `invisible_until_ms - invisible_ms` is the replicated clock
    /// when it was applied.
    pub invisible_ms: u64,
    pub invisible_until_ms: u64,
    /// The receive's start and reply.
    pub start: Duration,
    pub end: Duration,
    pub drain: bool,
    pub fate: Fate,
}

impl Delivery {
    /// The replicated clock when the receive was applied.
    pub fn clock_ms(&self) -> u64 {
        self.invisible_until_ms.saturating_sub(self.invisible_ms)
    }
}

/// What the reply to an ack or change proves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Ok,
    /// `INVALID_RECEIPT_HANDLE` with no earlier attempt that may have applied: the handle was not
    /// the message's current delivery.
    Invalid(String),
    /// Every attempt was refused before it could apply (`NOT_LEADER`, refused connection).
    NotApplied(String),
    /// No answer, or `INVALID` after an attempt that may have applied.
    Unknown(String),
}

/// One handle of a `PopAck`.
#[derive(Clone, Debug)]
pub struct AckEvent {
    pub consumer: u64,
    pub key: PopKey,
    /// The attempt of the delivery the handle belongs to.
    pub attempt: u32,
    pub handle: String,
    pub start: Duration,
    pub end: Duration,
    pub answer: Answer,
}

/// One `ChangeInvisible`.
#[derive(Clone, Debug)]
pub struct ChangeEvent {
    pub consumer: u64,
    pub key: PopKey,
    pub attempt: u32,
    pub handle: String,
    pub invisible_ms: u64,
    pub start: Duration,
    pub end: Duration,
    pub end_wall_ms: u64,
    pub answer: Answer,
    /// With [`Answer::Ok`]: the new handle and deadline.
    pub new_handle: Option<String>,
    pub invisible_until_ms: Option<u64>,
}

/// One message of the dead-letter topic.
#[derive(Clone, Debug)]
pub struct DlqEntry {
    pub offset: u64,
    /// `__rmq.dlq.origin` ("topic/queue/offset").
    pub origin: Option<String>,
    /// `__rmq.dlq.attempts`.
    pub attempts: Option<String>,
    pub body: Vec<u8>,
}

impl DlqEntry {
    /// The origin when it is a message of [`TOPIC`].
    pub fn key(&self) -> Option<PopKey> {
        let o = self.origin.as_deref()?;
        let mut it = o.rsplitn(3, '/');
        let off = it.next()?.parse().ok()?;
        let q = it.next()?.parse().ok()?;
        (it.next()? == TOPIC).then_some((q, off))
    }
}

/// The dead-letter topic as read from the leader at the end.
#[derive(Clone, Debug, Default)]
pub struct DlqRead {
    pub entries: Vec<DlqEntry>,
    pub errors: Vec<String>,
    /// From the end of the drain until the read that was kept.
    pub waited: Duration,
    /// Messages expected there (last seen delivery was the last attempt, never acknowledged) that
    /// were not, when the wait gave up.
    pub expected_missing: Vec<PopKey>,
}

#[derive(Clone, Debug, Default)]
pub struct DrainStats {
    pub took: Duration,
    pub timed_out: bool,
    pub received: u64,
}

/// Everything the POP consumers did and saw.
#[derive(Clone, Debug, Default)]
pub struct PopHistory {
    pub max_attempts: u32,
    /// The group is FIFO ([`PopCfg::fifo`]).
    pub fifo: bool,
    pub calls: Vec<PopCall>,
    pub deliveries: Vec<Delivery>,
    pub acks: Vec<AckEvent>,
    pub changes: Vec<ChangeEvent>,
    pub drain: Option<DrainStats>,
    pub dlq: Option<DlqRead>,
}

// ---------------------------------------------------------------------------------------------
// The group

/// Creates [`POP_GROUP`] on the leader (idempotent: an existing group with the same config is
/// OK), and checks the config it answers.
pub async fn create_pop_group(c: &Cluster, fifo: bool) -> Result<(), String> {
    let t = Instant::now();
    let mut last = String::new();
    let want = GroupConfig {
        name: POP_GROUP.into(),
        max_attempts: POP_MAX_ATTEMPTS,
        retry_delays_ms: Vec::new(),
        fifo,
    };
    while t.elapsed() < CONVERGE_TIMEOUT {
        let leader = find_leader(c, CONVERGE_TIMEOUT).await?;
        let req = CreateGroupRequest {
            group: Some(want.clone()),
            update: false,
        };
        match tokio::time::timeout(RPC_TIMEOUT, c.client(leader).await.create_group(req)).await {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                match code(&r.error) {
                    ErrorCode::Ok => {
                        let got = r.group.unwrap_or_default();
                        if got.max_attempts != POP_MAX_ATTEMPTS {
                            return Err(format!(
                                "create group {POP_GROUP}: it has max_attempts {} instead of \
                                 {POP_MAX_ATTEMPTS}",
                                got.max_attempts
                            ));
                        }
                        return Ok(());
                    }
                    _ => last = format!("{:?}", r.error),
                }
            }
            Ok(Err(s)) => last = s.to_string(),
            Err(_) => last = "timeout".into(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("create group {POP_GROUP}: {last}"))
}

// ---------------------------------------------------------------------------------------------
// Consumers

/// Where the next attempt goes after a reply or failure.
enum Next {
    Done,
    /// Retry: nothing of this attempt can have applied.
    Clean(String),
    /// Retry: this attempt may have applied.
    Ambiguous(String),
}

struct PopConsumer {
    id: u64,
    hist: Arc<History>,
    cfg: PopCfg,
    rng: StdRng,
    target: String,
    addrs: Vec<String>,
    rr: usize,
    clients: Clients,
}

impl PopConsumer {
    fn new(id: u64, hist: Arc<History>, addrs: Vec<String>, cfg: PopCfg, seed: u64) -> Self {
        PopConsumer {
            id,
            hist,
            cfg,
            rng: StdRng::seed_from_u64(seed ^ 0x504f_5000 ^ (id << 40)),
            target: addrs[(id as usize) % addrs.len()].clone(),
            addrs,
            rr: id as usize,
            clients: Clients::default(),
        }
    }

    fn next_node(&mut self) {
        self.rr += 1;
        self.target = self.addrs[self.rr % self.addrs.len()].clone();
    }

    /// Where to go after an error reply other than the ones the caller handles itself: the
    /// leader a `NOT_LEADER` names (or the next node), the next node after `BUSY` (nothing
    /// applied), or the next node with the outcome unknown.
    fn refused(&mut self, e: &Option<raftmq_proto::v1::Error>, by: &str) -> Next {
        match e.as_ref().map(|e| e.code()) {
            Some(ErrorCode::NotLeader) if self.follow(e) => Next::Done,
            Some(ErrorCode::NotLeader) => Next::Clean(format!("NOT_LEADER from {by}")),
            Some(ErrorCode::Busy) => Next::Clean(format!("{e:?}")),
            _ => Next::Ambiguous(format!("{e:?} from {by}")),
        }
    }

    /// Waits before the next attempt: briefly at a followed leader (`Next::Done`), else records
    /// why the attempt failed (and whether it may have applied) and moves to the next node.
    async fn retry(&mut self, next: Next, last: &mut String, ambiguous: &mut bool) {
        match next {
            Next::Done => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                return;
            }
            Next::Clean(w) => *last = w,
            Next::Ambiguous(w) => {
                *ambiguous = true;
                *last = w;
            }
        }
        self.next_node();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    /// Follows a `NOT_LEADER` hint; false when it names no other node.
    fn follow(&mut self, e: &Option<raftmq_proto::v1::Error>) -> bool {
        match e.as_ref().and_then(|e| e.leader.as_ref()) {
            Some(l) if l.address != self.target => {
                self.target = l.address.clone();
                true
            }
            _ => false,
        }
    }

    fn invisible(&mut self) -> u64 {
        self.rng
            .random_range(POP_INVISIBLE_MS_MIN..=POP_INVISIBLE_MS_MAX)
    }

    /// One receive and what follows for each message; returns how many were received.
    async fn round(&mut self, drain: bool) -> u32 {
        let invisible_ms = self.invisible();
        let req = PopRequest {
            group: POP_GROUP.into(),
            topic: TOPIC.into(),
            queue: None,
            max_messages: POP_BATCH,
            invisible_ms,
            max_wait_ms: POP_WAIT_MS,
            tag_expression: String::new(),
            consumer_id: format!("pop-hist-{}", self.id),
        };
        let by = self.target.clone();
        let mut c = self.clients.get(&by).await;
        let mut request = tonic::Request::new(req);
        request.set_timeout(POP_RPC_TIMEOUT);
        let start = self.hist.now();
        let start_wall_ms = wall_ms();
        let res =
            tokio::time::timeout(POP_RPC_TIMEOUT + Duration::from_millis(200), c.pop(request))
                .await;
        let end = self.hist.now();
        let end_wall_ms = wall_ms();
        let mut messages = Vec::new();
        let outcome = match res {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                match code(&r.error) {
                    ErrorCode::Ok => {
                        messages = r.messages;
                        PopCallOutcome::Received(messages.len() as u32)
                    }
                    ErrorCode::NotLeader => {
                        if !self.follow(&r.error) {
                            self.next_node();
                        }
                        PopCallOutcome::Refused(format!("NOT_LEADER from {by}"))
                    }
                    ErrorCode::GroupNotFound
                    | ErrorCode::TopicNotFound
                    | ErrorCode::InvalidArgument
                    | ErrorCode::Busy => PopCallOutcome::Refused(format!("{:?}", r.error)),
                    _ => {
                        self.next_node();
                        PopCallOutcome::Unknown(format!("{:?} from {by}", r.error))
                    }
                }
            }
            Ok(Err(s)) => {
                self.next_node();
                if never_sent(&s) {
                    PopCallOutcome::Refused(format!("{} from {by}", s.message()))
                } else {
                    PopCallOutcome::Unknown(format!("{} from {by}", s.message()))
                }
            }
            Err(_) => {
                self.next_node();
                PopCallOutcome::Unknown(format!("receive timeout at {by}"))
            }
        };
        let failed = !matches!(outcome, PopCallOutcome::Received(_));
        let mut delivered = Vec::new();
        for m in &messages {
            let Some(sm) = &m.message else { continue };
            let fate = if drain {
                Fate::Ack
            } else {
                let x = self.rng.random_range(0..100u32);
                if x < self.cfg.ignore_pct {
                    Fate::Ignore
                } else if x < self.cfg.ignore_pct + self.cfg.change_pct {
                    Fate::ChangeThenAck
                } else {
                    Fate::Ack
                }
            };
            delivered.push(Delivery {
                consumer: self.id,
                key: (sm.queue, sm.offset),
                id: decode(&sm.body),
                attempt: m.delivery_attempt,
                handle: m.receipt_handle.clone(),
                invisible_ms,
                invisible_until_ms: m.invisible_until_ms,
                start,
                end,
                drain,
                fate,
            });
        }
        {
            let mut p = lock(&self.hist.pop);
            p.calls.push(PopCall {
                consumer: self.id,
                by,
                invisible_ms,
                start,
                end,
                start_wall_ms,
                end_wall_ms,
                drain,
                outcome,
            });
            p.deliveries.extend(delivered.iter().cloned());
        }
        if failed {
            tokio::time::sleep(Duration::from_millis(30)).await;
            return 0;
        }
        // Changes first (one at a time), then one ack of every handle to acknowledge.
        let mut to_ack: Vec<(PopKey, u32, String)> = Vec::new();
        for d in &delivered {
            match d.fate {
                Fate::Ignore => {}
                Fate::Ack => to_ack.push((d.key, d.attempt, d.handle.clone())),
                Fate::ChangeThenAck => {
                    if let Some(h) = self.change(d).await {
                        to_ack.push((d.key, d.attempt, h));
                    }
                }
            }
        }
        if !to_ack.is_empty() {
            self.ack(to_ack).await;
        }
        delivered.len() as u32
    }

    /// `ChangeInvisible` of a delivery; the new handle when answered OK.
    async fn change(&mut self, d: &Delivery) -> Option<String> {
        let invisible_ms = self.invisible();
        let start = self.hist.now();
        let t = Instant::now();
        let mut ambiguous = false;
        let mut last = String::new();
        let mut result = None;
        let answer = loop {
            if t.elapsed() >= OP_DEADLINE {
                let why = format!("deadline passed: {last}");
                break if ambiguous {
                    Answer::Unknown(why)
                } else {
                    Answer::NotApplied(why)
                };
            }
            let req = ChangeInvisibleRequest {
                group: POP_GROUP.into(),
                topic: TOPIC.into(),
                receipt_handle: d.handle.clone(),
                invisible_ms,
            };
            let by = self.target.clone();
            let mut c = self.clients.get(&by).await;
            let next = match tokio::time::timeout(RPC_TIMEOUT, c.change_invisible(req)).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    match code(&r.error) {
                        ErrorCode::Ok => {
                            result = Some((r.receipt_handle, r.invisible_until_ms));
                            break Answer::Ok;
                        }
                        ErrorCode::InvalidReceiptHandle => {
                            let why = format!("{:?}", r.error);
                            break if ambiguous {
                                Answer::Unknown(format!(
                                    "INVALID after an ambiguous attempt: {why}"
                                ))
                            } else {
                                Answer::Invalid(why)
                            };
                        }
                        _ => self.refused(&r.error, &by),
                    }
                }
                Ok(Err(s)) if never_sent(&s) => Next::Clean(format!("{} from {by}", s.message())),
                Ok(Err(s)) => Next::Ambiguous(format!("{} from {by}", s.message())),
                Err(_) => Next::Ambiguous(format!("timeout at {by}")),
            };
            self.retry(next, &mut last, &mut ambiguous).await;
        };
        let (new_handle, until) = match result {
            Some((h, u)) => (Some(h), Some(u)),
            None => (None, None),
        };
        lock(&self.hist.pop).changes.push(ChangeEvent {
            consumer: self.id,
            key: d.key,
            attempt: d.attempt,
            handle: d.handle.clone(),
            invisible_ms,
            start,
            end: self.hist.now(),
            end_wall_ms: wall_ms(),
            answer,
            new_handle: new_handle.clone(),
            invisible_until_ms: until,
        });
        new_handle
    }

    /// One `PopAck` of every handle (retried until each is answered or the deadline passes).
    async fn ack(&mut self, handles: Vec<(PopKey, u32, String)>) {
        let start = self.hist.now();
        let t = Instant::now();
        let mut ambiguous = false;
        let mut last = String::new();
        let answers: Vec<Answer> = loop {
            if t.elapsed() >= OP_DEADLINE {
                let why = format!("deadline passed: {last}");
                let a = if ambiguous {
                    Answer::Unknown(why)
                } else {
                    Answer::NotApplied(why)
                };
                break vec![a; handles.len()];
            }
            let req = PopAckRequest {
                group: POP_GROUP.into(),
                topic: TOPIC.into(),
                receipt_handles: handles.iter().map(|h| h.2.clone()).collect(),
            };
            let by = self.target.clone();
            let mut c = self.clients.get(&by).await;
            let next = match tokio::time::timeout(RPC_TIMEOUT, c.pop_ack(req)).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    match code(&r.error) {
                        ErrorCode::Ok if r.results.len() == handles.len() => {
                            break r
                                .results
                                .iter()
                                .map(|x| match code(&x.error) {
                                    ErrorCode::Ok => Answer::Ok,
                                    ErrorCode::InvalidReceiptHandle if !ambiguous => {
                                        Answer::Invalid(format!("{:?}", x.error))
                                    }
                                    _ => Answer::Unknown(format!(
                                        "{:?}{}",
                                        x.error,
                                        if ambiguous {
                                            " after an ambiguous attempt"
                                        } else {
                                            ""
                                        }
                                    )),
                                })
                                .collect();
                        }
                        ErrorCode::Ok => {
                            let why = format!(
                                "{} results for {} handles from {by}",
                                r.results.len(),
                                handles.len()
                            );
                            break vec![Answer::Unknown(why); handles.len()];
                        }
                        _ => self.refused(&r.error, &by),
                    }
                }
                Ok(Err(s)) if never_sent(&s) => Next::Clean(format!("{} from {by}", s.message())),
                Ok(Err(s)) => Next::Ambiguous(format!("{} from {by}", s.message())),
                Err(_) => Next::Ambiguous(format!("timeout at {by}")),
            };
            self.retry(next, &mut last, &mut ambiguous).await;
        };
        let end = self.hist.now();
        let mut p = lock(&self.hist.pop);
        for ((key, attempt, handle), answer) in handles.into_iter().zip(answers) {
            p.acks.push(AckEvent {
                consumer: self.id,
                key,
                attempt,
                handle,
                start,
                end,
                answer,
            });
        }
    }
}

/// A consumer of the load phase: receives until `stop` or `until` (bounded in count too).
pub(super) async fn pop_consumer_loop(
    hist: Arc<History>,
    id: u64,
    addrs: Vec<String>,
    cfg: PopCfg,
    seed: u64,
    stop: Arc<AtomicBool>,
    until: Instant,
) {
    let mut c = PopConsumer::new(id, hist, addrs, cfg, seed);
    for _ in 0..1_000_000u64 {
        if stop.load(Ordering::Relaxed) || Instant::now() >= until {
            break;
        }
        c.round(false).await;
    }
}

/// The latest wall-clock time (ms) at which a delivery made so far can still become visible
/// again: every deadline answered, and for a receive or change whose outcome is unknown, its
/// end plus the longest invisible time (the nodes had converged, so it was applied by then if at
/// all).
fn horizon_ms(p: &PopHistory) -> u64 {
    let unknown_pop = p
        .calls
        .iter()
        .filter(|c| matches!(c.outcome, PopCallOutcome::Unknown(_)))
        .map(|c| c.end_wall_ms + POP_INVISIBLE_MS_MAX);
    let unknown_change = p
        .changes
        .iter()
        .filter(|c| matches!(c.answer, Answer::Unknown(_)))
        .map(|c| c.end_wall_ms + POP_INVISIBLE_MS_MAX);
    let known = p.deliveries.iter().map(|d| d.invisible_until_ms);
    let changed = p.changes.iter().filter_map(|c| c.invisible_until_ms);
    unknown_pop
        .chain(unknown_change)
        .chain(known)
        .chain(changed)
        .max()
        .unwrap_or(0)
}

/// The drain (see the module docs): every consumer receives and acknowledges everything until
/// every deadline passed and nothing came for [`DRAIN_QUIET`], at most [`DRAIN_MAX`].
pub(super) async fn drain(
    hist: Arc<History>,
    addrs: Vec<String>,
    cfg: &PopCfg,
    seed: u64,
) -> DrainStats {
    let t = Instant::now();
    let start_wall = wall_ms();
    let done = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    // Wall time of the last reply that carried messages.
    let last_msgs = Arc::new(AtomicU64::new(start_wall));
    let mut tasks = Vec::new();
    for id in 1..=cfg.consumers.max(1) {
        let (hist, addrs, cfg) = (hist.clone(), addrs.clone(), cfg.clone());
        let (done, received, last_msgs) = (done.clone(), received.clone(), last_msgs.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = PopConsumer::new(id, hist, addrs, cfg, seed ^ 0xd7a1);
            // Bounded by `done` (set by the deadline below) and a count.
            for _ in 0..1_000_000u64 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let n = c.round(true).await;
                if n > 0 {
                    received.fetch_add(n as u64, Ordering::Relaxed);
                    last_msgs.fetch_max(wall_ms(), Ordering::Relaxed);
                }
            }
        }));
    }
    let mut timed_out = true;
    while t.elapsed() < DRAIN_MAX {
        let horizon = horizon_ms(&lock(&hist.pop))
            .max(start_wall + POP_INVISIBLE_MS_MAX)
            .max(last_msgs.load(Ordering::Relaxed));
        if wall_ms() >= horizon + DRAIN_QUIET.as_millis() as u64 {
            timed_out = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::Relaxed);
    for h in tasks {
        // Each ends within one round (a receive and its acks, bounded by their deadlines).
        let _ = h.await;
    }
    DrainStats {
        took: t.elapsed(),
        timed_out,
        received: received.load(Ordering::Relaxed),
    }
}

/// Messages that must reach the dead-letter topic: the last seen delivery was the last attempt
/// and no ack of the message was answered OK or left unknown.
pub fn expected_dead_letters(p: &PopHistory) -> BTreeSet<PopKey> {
    let mut last: BTreeMap<PopKey, u32> = BTreeMap::new();
    for d in &p.deliveries {
        let a = last.entry(d.key).or_default();
        *a = (*a).max(d.attempt);
    }
    let acked: BTreeSet<PopKey> = p
        .acks
        .iter()
        .filter(|a| matches!(a.answer, Answer::Ok | Answer::Unknown(_)))
        .map(|a| a.key)
        .collect();
    last.into_iter()
        .filter(|(k, a)| *a >= p.max_attempts && !acked.contains(k))
        .map(|(k, _)| k)
        .collect()
}

/// Reads every message of the dead-letter topic from `addr` (a missing topic is an empty one).
async fn read_dlq_once(addr: &str) -> Result<Vec<DlqEntry>, String> {
    let mut c = connect(addr).await;
    let topic = pop_dlq_topic();
    let mut out = Vec::new();
    let mut offset = 0;
    // Bounded: at most 100k pulls.
    for _ in 0..100_000u32 {
        let req = PullRequest {
            topic: topic.clone(),
            queue: 0,
            offset,
            max_messages: 256,
            ..Default::default()
        };
        let r = match tokio::time::timeout(RPC_TIMEOUT, c.pull(req)).await {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) => return Err(format!("pull {topic}@{offset} from {addr}: {s}")),
            Err(_) => return Err(format!("pull {topic}@{offset} from {addr}: timeout")),
        };
        match code(&r.error) {
            ErrorCode::Ok => {}
            ErrorCode::TopicNotFound if offset == 0 => return Ok(out),
            _ => return Err(format!("pull {topic}@{offset} from {addr}: {:?}", r.error)),
        }
        if r.messages.is_empty() {
            break;
        }
        for m in r.messages {
            offset = m.offset + 1;
            out.push(DlqEntry {
                offset: m.offset,
                origin: m.properties.get("__rmq.dlq.origin").cloned(),
                attempts: m.properties.get("__rmq.dlq.attempts").cloned(),
                body: m.body.to_vec(),
            });
        }
    }
    Ok(out)
}

/// Reads the dead-letter topic from the leader once every expected dead letter is there and it
/// stopped growing (see the module docs), at most [`DLQ_WAIT_MAX`].
pub(super) async fn read_dlq(c: &Cluster, p: &PopHistory) -> DlqRead {
    let t = Instant::now();
    let expected = expected_dead_letters(p);
    let mut read = DlqRead::default();
    let mut last_len = None;
    let mut grew_at = Instant::now();
    // Bounded by time.
    while t.elapsed() < DLQ_WAIT_MAX {
        let leader = match find_leader(c, CONVERGE_TIMEOUT).await {
            Ok(l) => l,
            Err(e) => {
                read.errors
                    .push(format!("no leader to read the dead letters: {e}"));
                return read;
            }
        };
        match read_dlq_once(&c.nodes[&leader].addr).await {
            Ok(entries) => {
                if last_len != Some(entries.len()) {
                    last_len = Some(entries.len());
                    grew_at = Instant::now();
                }
                let have: BTreeSet<PopKey> = entries.iter().filter_map(|e| e.key()).collect();
                read.expected_missing = expected.difference(&have).copied().collect();
                read.entries = entries;
                read.errors.clear();
                if read.expected_missing.is_empty() && grew_at.elapsed() >= DLQ_SETTLE {
                    break;
                }
            }
            Err(e) => read.errors = vec![e],
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    read.waited = t.elapsed();
    read
}
