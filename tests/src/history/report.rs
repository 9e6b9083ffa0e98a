//! The result of a check: counts per kind of problem, liveness per fault, excerpts of the history,
//! and how it prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use super::faults::FaultKind;
use super::pop::{Answer, PopHistory, PopKey};
use super::workload::QueueSum;
use super::{EXCERPTS_MAX, FaultEvent, Op, Outcome};

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
    /// Acknowledged sends that took more than one attempt.
    pub retried_ops: u64,
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
    ///
    /// [`FILL_TOPIC`]: super::FILL_TOPIC
    pub fill: Option<Box<FillReport>>,
    /// The POP workload's figures and problems, when the round ran it.
    pub pop: Option<Box<PopReport>>,
    /// The scheduled-message workload's figures and problems, when the round ran it.
    pub delay: Option<Box<super::delay::DelayReport>>,
    /// The transaction workload's figures and problems, when the round ran it.
    pub txn: Option<Box<super::txn::TxnReport>>,
}

/// What [`check_pop`] found: figures, then problem counters (each must be zero).
///
/// [`check_pop`]: super::check_pop
#[derive(Debug, Default, Clone)]
pub struct PopReport {
    /// Receive RPCs, and those whose outcome is unknown (they may have handed out messages).
    pub calls: u64,
    pub calls_unknown: u64,
    /// Deliveries seen (a message received once per attempt).
    pub received: u64,
    /// Distinct messages received, and messages of the topic the group had to consume.
    pub messages: u64,
    pub stored: u64,
    /// Deliveries with attempt > 1 (the message came back after its invisible time).
    pub redelivered: u64,
    /// Deliveries the consumer left to expire on purpose.
    pub ignored: u64,
    /// Acks per handle: answered OK, answered INVALID_RECEIPT_HANDLE, never applied, unknown.
    pub acked: u64,
    pub ack_invalid: u64,
    pub ack_not_applied: u64,
    pub ack_unknown: u64,
    /// Invisibility changes: answered OK, stale, unknown or never applied.
    pub changed: u64,
    pub change_stale: u64,
    pub change_unknown: u64,
    /// Messages read from the dead-letter topic.
    pub dead_lettered: u64,
    /// Messages received by the drain, how long it took, and how long the dead letters took to
    /// settle.
    pub drain_received: u64,
    pub drain_took: Duration,
    pub dlq_waited: Duration,
    // Problems.
    /// Received again after an ack of it was answered OK.
    pub redelivered_after_ack: u64,
    /// Stored in the topic, never received, not in the dead-letter topic.
    pub lost: u64,
    /// Received, never acknowledged (no ack answered OK or unknown), not in the dead-letter topic.
    pub unsettled: u64,
    /// A delivery with an attempt at or below one seen before it (or the same attempt twice).
    pub attempt_backwards: u64,
    /// A delivery attempt of 0 or above the group's max_attempts.
    pub attempt_out_of_range: u64,
    /// Handed out again before the previous delivery's deadline (by the replicated clock).
    pub redelivered_early: u64,
    /// A message in the dead-letter topic more than once.
    pub dlq_duplicates: u64,
    /// Dead-lettered with `__rmq.dlq.attempts` other than max_attempts, or with fewer deliveries
    /// seen while every receive was answered.
    pub dlq_early: u64,
    /// A dead letter whose origin is not a stored message of the topic or whose body differs.
    pub dlq_corrupt: u64,
    /// In the dead-letter topic although an ack of it was answered OK.
    pub acked_then_dlq: u64,
    /// The drain hit its bound, or the dead-letter topic could not be read.
    pub drain_timeouts: u64,
    pub dlq_errors: u64,
    /// FIFO ([`super::pop::PopCfg::fifo`]): a message handed out while the message before it
    /// in its queue and message group was neither acknowledged (no ack of it answered OK or
    /// unknown had started before the receive's reply) nor dead-lettered.
    pub fifo_out_of_order: u64,
    /// FIFO: message groups and the ordered pairs checked (figures).
    pub fifo_groups: u64,
    pub fifo_pairs: u64,
}

impl PopReport {
    pub fn problems(&self) -> u64 {
        self.redelivered_after_ack
            + self.lost
            + self.unsettled
            + self.attempt_backwards
            + self.attempt_out_of_range
            + self.redelivered_early
            + self.dlq_duplicates
            + self.dlq_early
            + self.dlq_corrupt
            + self.acked_then_dlq
            + self.drain_timeouts
            + self.dlq_errors
            + self.fifo_out_of_order
    }

    pub fn is_ok(&self) -> bool {
        self.problems() == 0
    }
}

impl std::fmt::Display for PopReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "pop: received {} ({} messages of {} stored), acked {}, expired/redelivered {} \
             (left to expire {}), dead-lettered {}; ack invalid {}, ack unknown {}, ack not \
             applied {}; changes ok {}, stale {}, unknown {}; receives {} (unknown {}); drain \
             {:.1}s ({} received), dead letters settled {:.1}s later",
            self.received,
            self.messages,
            self.stored,
            self.acked,
            self.redelivered,
            self.ignored,
            self.dead_lettered,
            self.ack_invalid,
            self.ack_unknown,
            self.ack_not_applied,
            self.changed,
            self.change_stale,
            self.change_unknown,
            self.calls,
            self.calls_unknown,
            self.drain_took.as_secs_f64(),
            self.drain_received,
            self.dlq_waited.as_secs_f64()
        )?;
        write!(
            f,
            "pop: redelivered after ack {}, lost {}, unsettled {}, attempt backwards {}, attempt \
             out of range {}, redelivered early {}, dlq duplicates {}, dlq early {}, dlq corrupt \
             {}, acked then dlq {}, drain timeouts {}, dlq errors {}; fifo: {} groups, {} \
             ordered pairs, out of order {}",
            self.redelivered_after_ack,
            self.lost,
            self.unsettled,
            self.attempt_backwards,
            self.attempt_out_of_range,
            self.redelivered_early,
            self.dlq_duplicates,
            self.dlq_early,
            self.dlq_corrupt,
            self.acked_then_dlq,
            self.drain_timeouts,
            self.dlq_errors,
            self.fifo_groups,
            self.fifo_pairs,
            self.fifo_out_of_order
        )
    }
}

/// The fill of a large-log round and what every node held of it at the end.
#[derive(Debug, Default)]
pub struct FillReport {
    pub stats: FillStats,
    /// [`check`] of the fill's history against every node's compacted read ([`read_fill`]).
    ///
    /// [`check`]: fn@super::check
    /// [`read_fill`]: super::read_fill
    pub check: Report,
    /// Per node, per queue of [`FILL_TOPIC`].
    ///
    /// [`FILL_TOPIC`]: super::FILL_TOPIC
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
            && self.pop.as_ref().is_none_or(|p| p.is_ok())
            && self.delay.as_ref().is_none_or(|d| d.is_ok())
            && self.txn.as_ref().is_none_or(|t| t.is_ok())
    }

    pub(super) fn excerpt(&mut self, s: String) {
        if self.excerpts.len() < EXCERPTS_MAX {
            self.excerpts.push(s);
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed {}: ops {} (acked {}, {} of them retried, failed {}, unknown {}), acked msgs {}, \
             read msgs {}, offset commits {}",
            self.seed,
            self.ops,
            self.acked_ops,
            self.retried_ops,
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
        if let Some(d) = &self.delay {
            writeln!(f, "  {}", d.to_string().trim_end())?;
        }
        if let Some(t) = &self.txn {
            writeln!(f, "  {}", t.to_string().trim_end())?;
        }
        if let Some(p) = &self.pop {
            for line in p.to_string().lines() {
                writeln!(f, "  {line}")?;
            }
        }
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
pub(super) fn op_context(
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

/// Everything the POP consumers did with the message at `key`, in time order, and the faults
/// within 3 s of it.
pub(super) fn pop_context(p: &PopHistory, faults: &[FaultEvent], key: PopKey) -> String {
    let mut lines: Vec<(Duration, String)> = Vec::new();
    for d in p.deliveries.iter().filter(|d| d.key == key) {
        lines.push((
            d.end,
            format!(
                "[{:.3}s..{:.3}s] c{} received attempt {} handle {} invisible {} ms until {}{} \
                 ({:?}){}",
                d.start.as_secs_f64(),
                d.end.as_secs_f64(),
                d.consumer,
                d.attempt,
                d.handle,
                d.invisible_ms,
                d.invisible_until_ms,
                d.id.map(|i| format!(" p{} s{}#{}", i.producer, i.seq, i.idx))
                    .unwrap_or_default(),
                d.fate,
                if d.drain { " drain" } else { "" }
            ),
        ));
    }
    for c in p.changes.iter().filter(|c| c.key == key) {
        lines.push((
            c.end,
            format!(
                "[{:.3}s..{:.3}s] c{} change attempt {} handle {} by {} ms: {}{}",
                c.start.as_secs_f64(),
                c.end.as_secs_f64(),
                c.consumer,
                c.attempt,
                c.handle,
                c.invisible_ms,
                answer_str(&c.answer),
                match (&c.new_handle, c.invisible_until_ms) {
                    (Some(h), Some(u)) => format!(" -> {h} until {u}"),
                    _ => String::new(),
                }
            ),
        ));
    }
    for a in p.acks.iter().filter(|a| a.key == key) {
        lines.push((
            a.end,
            format!(
                "[{:.3}s..{:.3}s] c{} ack attempt {} handle {}: {}",
                a.start.as_secs_f64(),
                a.end.as_secs_f64(),
                a.consumer,
                a.attempt,
                a.handle,
                answer_str(&a.answer)
            ),
        ));
    }
    if let Some(dlq) = &p.dlq {
        for e in dlq.entries.iter().filter(|e| e.key() == Some(key)) {
            lines.push((
                Duration::MAX,
                format!(
                    "dead letter at offset {} (attempts {:?})",
                    e.offset, e.attempts
                ),
            ));
        }
    }
    lines.sort_by_key(|(t, _)| *t);
    let mut s = String::new();
    for (_, l) in &lines {
        writeln!(s, "      {l}").ok();
    }
    let times: Vec<Duration> = lines
        .iter()
        .map(|(t, _)| *t)
        .filter(|t| *t != Duration::MAX)
        .collect();
    if let (Some(a), Some(b)) = (times.iter().min(), times.iter().max()) {
        let margin = Duration::from_secs(3);
        for fe in faults {
            if fe.converged + margin >= *a && fe.start <= *b + margin {
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

fn answer_str(a: &Answer) -> String {
    match a {
        Answer::Ok => "OK".into(),
        Answer::Invalid(w) => format!("INVALID {w}"),
        Answer::NotApplied(w) => format!("NOT APPLIED {w}"),
        Answer::Unknown(w) => format!("UNKNOWN {w}"),
    }
}

pub(super) fn body_str(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 40 {
        format!("{}…({} bytes)", &s[..s.floor_char_boundary(40)], b.len())
    } else {
        s.into_owned()
    }
}
