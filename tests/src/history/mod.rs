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
//!
//! POP mode ([`ScenarioCfg::pop`], `soak --pop`, `t37`): POP consumers of group [`POP_GROUP`]
//! (3 attempts, 1-3 s invisible) receive [`TOPIC`] itself beside the producers, under the same
//! faults, and ack, change the invisibility and ack, or let messages expire; after the heal they
//! drain the topic and the group's dead-letter topic is read from the leader. [`check_pop`] then
//! requires: nothing acknowledged (ack answered OK) is received again or dead-lettered; every
//! stored message is received and, in the end, acknowledged or dead-lettered once, with
//! `__rmq.dlq.attempts` = 3 and its own body; attempts never repeat or go backwards, stay within
//! 1..=3, and a message is never handed out again before its deadline by the replicated clock.
//! Details and the drain's bounds in [`pop`].
//!
//! Delay mode ([`ScenarioCfg::delay`], `soak --delay`, `t39`): senders schedule messages on a
//! DELAY topic under the same faults; after the heal every one must be delivered once, never
//! before its time, identically on every node (see [`delay`]).
//!
//! Transaction mode ([`ScenarioCfg::txn`], `soak --txn`, `t41`): senders store half messages on
//! a TRANSACTION topic and commit, roll back or leave them open under the same faults; after
//! the heal the open ones are committed, and every committed one must be stored once, every
//! rolled-back one never, identically on every node (see [`txn`]).
//!
//! Modules: [`workload`] sends and records the history and reads every node back; [`faults`]
//! injects and heals faults; [`check`](mod@check) compares the history with what was read;
//! [`report`] holds and prints the result; [`scenario`] runs a round of all of them; [`pop`] is
//! the POP workload.
//!
//! [`check`]: fn@check

use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

pub mod check;
pub mod delay;
pub mod faults;
pub mod pop;
pub mod report;
pub mod scenario;
pub mod txn;
pub mod workload;

pub use check::{check, check_pop};
pub use delay::{DELAY_TOPIC, DelayCfg, DelayHistory, DelayReport, check_delay};
pub use faults::{
    FaultKind, InjectOpts, PARTITION_LONG, find_leader, find_leader_term, flip_bit, inject,
    inject_opts, truncate_segment, wait_converged, wait_converged_term,
};
pub use pop::{
    POP_GROUP, POP_MAX_ATTEMPTS, PopCfg, PopHistory, expected_dead_letters, pop_dlq_topic,
};
pub use report::{FaultLiveness, FillReport, FillStats, PopReport, Report};
pub use scenario::{FaultPlan, RoundOutcome, ScenarioCfg, run_round, run_scenario};
pub use txn::{TXN_TOPIC, TxnCfg, TxnHistory, TxnReport, check_txn};
pub use workload::{
    FILL_BODY_LEN, FILL_MSGS_PER_SEND, FILL_PRODUCER_BASE, FILL_SEND_BYTES, FILL_TOPIC,
    HistProducer, LargeLogCfg, NodeRead, QueueSum, WorkloadCfg, fill_log, read_fill, read_node,
};

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
    /// The POP consumers' calls, the drain and the dead letters (empty unless the round runs the
    /// POP workload, [`ScenarioCfg::pop`]).
    pub pop: Mutex<pop::PopHistory>,
    /// The scheduled-message senders' sends (empty unless the round runs the delay workload,
    /// [`ScenarioCfg::delay`]).
    pub delay: Mutex<delay::DelayHistory>,
    /// The transaction senders' transactions (empty unless the round runs the transaction
    /// workload, [`ScenarioCfg::txn`]).
    pub txn: Mutex<txn::TxnHistory>,
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
            pop: Mutex::default(),
            delay: Mutex::default(),
            txn: Mutex::default(),
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

/// Creates topic `name` of type `ty` with [`QUEUES`] queues on the leader (an existing one is
/// fine), retrying through elections for up to 30 s.
pub(crate) async fn create_typed_topic(
    c: &crate::Cluster,
    name: &str,
    ty: raftmq_proto::v1::TopicMessageType,
) -> Result<(), String> {
    use raftmq_proto::v1::{CreateTopicRequest, ErrorCode};
    let t = std::time::Instant::now();
    loop {
        let leader = c.leader().await;
        let r = c
            .client(leader)
            .await
            .create_topic(CreateTopicRequest {
                name: name.into(),
                queues: QUEUES,
                update: false,
                message_type: ty as i32,
            })
            .await;
        match r.map(|r| r.into_inner()) {
            Ok(r)
                if matches!(
                    crate::code(&r.error),
                    ErrorCode::Ok | ErrorCode::TopicExists
                ) =>
            {
                return Ok(());
            }
            other if t.elapsed() > std::time::Duration::from_secs(30) => {
                return Err(format!("creating {name}: {other:?}"));
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}
