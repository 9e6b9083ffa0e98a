//! [`check`]: the history against what every node holds; a pure function of the recorded data.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::pop::{Answer, Delivery, Fate, PopCallOutcome, PopHistory, PopKey};
use super::report::{FaultLiveness, PopReport, Report, body_str, op_context, pop_context};
use super::workload::NodeRead;
use super::{History, MsgId, Op, Outcome, QUEUES, decode, encode, lock};

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
                r.retried_ops += (o.attempts > 1) as u64;
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

/// Checks the POP workload's history ([`History::pop`]: the consumers' calls, the drain and the
/// dead-letter topic) against what the nodes hold of the topic, and sets [`Report::pop`]; its
/// excerpts join the report's. A pure function of the recorded data.
///
/// Every rule uses only what replies prove: a receive whose reply arrived was applied before it;
/// one that started after another's reply was applied after it; a receive, ack or change whose
/// outcome is unknown may or may not have applied, and no rule depends on it.
pub fn check_pop(hist: &History, reads: &BTreeMap<u64, NodeRead>, r: &mut Report) {
    let p = lock(&hist.pop).clone();
    let faults = lock(&hist.faults).clone();
    let max = p.max_attempts;
    let mut pr = PopReport::default();
    let ctx = |key: PopKey| pop_context(&p, &faults, key);

    // What the group had to consume: every (queue, offset) any node holds (all stored before the
    // drain: the load had stopped and the group converged).
    let mut stored: BTreeMap<PopKey, &Vec<u8>> = BTreeMap::new();
    for nr in reads.values() {
        for (q, msgs) in &nr.queues {
            for (off, body) in msgs {
                stored.entry((*q, *off)).or_insert(body);
            }
        }
    }
    pr.stored = stored.len() as u64;

    let mut by_key: BTreeMap<PopKey, Vec<&Delivery>> = BTreeMap::new();
    for d in &p.deliveries {
        by_key.entry(d.key).or_default().push(d);
    }
    for v in by_key.values_mut() {
        v.sort_by_key(|d| (d.start, d.attempt));
    }
    pr.calls = p.calls.len() as u64;
    let any_unknown_pop = p
        .calls
        .iter()
        .any(|c| matches!(c.outcome, PopCallOutcome::Unknown(_)));
    pr.calls_unknown = p
        .calls
        .iter()
        .filter(|c| matches!(c.outcome, PopCallOutcome::Unknown(_)))
        .count() as u64;
    pr.received = p.deliveries.len() as u64;
    pr.messages = by_key.len() as u64;
    pr.redelivered = p.deliveries.iter().filter(|d| d.attempt > 1).count() as u64;
    pr.ignored = p
        .deliveries
        .iter()
        .filter(|d| d.fate == Fate::Ignore)
        .count() as u64;
    for a in &p.acks {
        match a.answer {
            Answer::Ok => pr.acked += 1,
            Answer::Invalid(_) => pr.ack_invalid += 1,
            Answer::NotApplied(_) => pr.ack_not_applied += 1,
            Answer::Unknown(_) => pr.ack_unknown += 1,
        }
    }
    for c in &p.changes {
        match c.answer {
            Answer::Ok => pr.changed += 1,
            Answer::Invalid(_) | Answer::NotApplied(_) => pr.change_stale += 1,
            Answer::Unknown(_) => pr.change_unknown += 1,
        }
    }
    if let Some(d) = &p.drain {
        pr.drain_received = d.received;
        pr.drain_took = d.took;
        if d.timed_out {
            pr.drain_timeouts += 1;
            r.excerpt(format!(
                "POP DRAIN TIMED OUT after {:.1}s: messages were still coming or deadlines \
                 pending (the lost and unsettled counts may include messages not yet drained)",
                d.took.as_secs_f64()
            ));
        }
    }
    let empty = Default::default();
    let dlq = p.dlq.as_ref().unwrap_or(&empty);
    pr.dlq_waited = dlq.waited;
    for e in &dlq.errors {
        pr.dlq_errors += 1;
        r.excerpt(format!("POP DLQ READ ERROR: {e}"));
    }

    // Acknowledged, then received again: by a receive that started after the ack's OK arrived,
    // or with a later attempt (an ack applies only to the current delivery, and a message acked
    // is never handed out again, so a later attempt was handed out after the ack).
    let ok_acks: BTreeMap<PopKey, Vec<_>> =
        p.acks
            .iter()
            .filter(|a| a.answer == Answer::Ok)
            .fold(BTreeMap::new(), |mut m, a| {
                m.entry(a.key).or_insert_with(Vec::new).push(a);
                m
            });
    for (key, acks) in &ok_acks {
        let flagged = by_key.get(key).map_or(0, |ds| {
            ds.iter()
                .filter(|d| {
                    acks.iter()
                        .any(|a| d.attempt > a.attempt || d.start > a.end)
                })
                .count()
        });
        if flagged > 0 {
            pr.redelivered_after_ack += flagged as u64;
            r.excerpt(format!(
                "POP REDELIVERED AFTER ACK q{}@{}: acknowledged (OK), received again {flagged} \
                 time(s)\n{}",
                key.0,
                key.1,
                ctx(*key)
            ));
        }
    }

    // Attempts: within 1..=max; never the same attempt twice; never lower or equal after a
    // delivery whose reply had arrived before the receive started.
    for (key, ds) in &by_key {
        for d in ds {
            if d.attempt == 0 || d.attempt > max {
                pr.attempt_out_of_range += 1;
                r.excerpt(format!(
                    "POP ATTEMPT OUT OF RANGE q{}@{}: attempt {} (max_attempts {max})\n{}",
                    key.0,
                    key.1,
                    d.attempt,
                    ctx(*key)
                ));
            }
        }
        let mut bad = 0;
        for (j, dj) in ds.iter().enumerate() {
            if ds[..j].iter().any(|di| {
                di.attempt == dj.attempt || (dj.start > di.end && dj.attempt < di.attempt)
            }) {
                bad += 1;
            }
        }
        if bad > 0 {
            pr.attempt_backwards += bad;
            let seen: Vec<String> = ds
                .iter()
                .map(|d| format!("{} at {:.3}s", d.attempt, d.start.as_secs_f64()))
                .collect();
            r.excerpt(format!(
                "POP ATTEMPT BACKWARDS q{}@{}: attempts {}\n{}",
                key.0,
                key.1,
                seen.join(", "),
                ctx(*key)
            ));
        }
        // Handed out again before the deadline of the delivery before it (consecutive attempts,
        // so no unseen delivery in between), by the replicated clock the replies carry.
        let mut by_attempt: Vec<&&Delivery> = ds.iter().collect();
        by_attempt.sort_by_key(|d| d.attempt);
        for w in by_attempt.windows(2) {
            let (d1, d2) = (w[0], w[1]);
            if d2.attempt != d1.attempt + 1 {
                continue;
            }
            let changes: Vec<_> = p
                .changes
                .iter()
                .filter(|c| c.key == *key && c.attempt == d1.attempt)
                .collect();
            if changes
                .iter()
                .any(|c| matches!(c.answer, Answer::Unknown(_)))
            {
                continue;
            }
            let deadline = changes
                .iter()
                .filter(|c| c.answer == Answer::Ok)
                .max_by_key(|c| c.end)
                .and_then(|c| c.invisible_until_ms)
                .unwrap_or(d1.invisible_until_ms);
            if d2.clock_ms() < deadline {
                pr.redelivered_early += 1;
                r.excerpt(format!(
                    "POP REDELIVERED EARLY q{}@{}: attempt {} handed out at clock {} before \
                     attempt {}'s deadline {deadline}\n{}",
                    key.0,
                    key.1,
                    d2.attempt,
                    d2.clock_ms(),
                    d1.attempt,
                    ctx(*key)
                ));
            }
        }
    }

    // The dead-letter topic.
    let mut dead: BTreeMap<PopKey, u64> = BTreeMap::new();
    for e in &dlq.entries {
        let Some(key) = e.key() else {
            pr.dlq_corrupt += 1;
            r.excerpt(format!(
                "POP DLQ CORRUPT at offset {}: origin {:?} is no message of the topic",
                e.offset, e.origin
            ));
            continue;
        };
        *dead.entry(key).or_default() += 1;
        if stored.get(&key).is_none_or(|b| **b != e.body) {
            pr.dlq_corrupt += 1;
            r.excerpt(format!(
                "POP DLQ CORRUPT at offset {}: origin q{}@{} holds {:?}, the dead letter {:?}\n{}",
                e.offset,
                key.0,
                key.1,
                stored.get(&key).map(|b| body_str(b)),
                body_str(&e.body),
                ctx(key)
            ));
        }
        let attempts_ok = e.attempts.as_deref() == Some(max.to_string().as_str());
        let seen = by_key
            .get(&key)
            .and_then(|ds| ds.iter().map(|d| d.attempt).max())
            .unwrap_or(0);
        if !attempts_ok || (seen < max && !any_unknown_pop) {
            pr.dlq_early += 1;
            r.excerpt(format!(
                "POP DLQ EARLY q{}@{}: dead-lettered with attempts {:?}, highest attempt seen \
                 {seen} (max_attempts {max}, every receive answered: {})\n{}",
                key.0,
                key.1,
                e.attempts,
                !any_unknown_pop,
                ctx(key)
            ));
        }
        if ok_acks.contains_key(&key) {
            pr.acked_then_dlq += 1;
            r.excerpt(format!(
                "POP ACKED THEN DEAD-LETTERED q{}@{}\n{}",
                key.0,
                key.1,
                ctx(key)
            ));
        }
    }
    pr.dead_lettered = dlq.entries.len() as u64;
    for (key, n) in &dead {
        if *n > 1 {
            pr.dlq_duplicates += n - 1;
            r.excerpt(format!(
                "POP DLQ DUPLICATE q{}@{}: {n} times in the dead-letter topic\n{}",
                key.0,
                key.1,
                ctx(*key)
            ));
        }
    }

    // Every stored message received (or dead-lettered unseen) and, in the end, acknowledged or
    // dead-lettered.
    let settled: BTreeSet<PopKey> = p
        .acks
        .iter()
        .filter(|a| matches!(a.answer, Answer::Ok | Answer::Unknown(_)))
        .map(|a| a.key)
        .collect();
    for (key, body) in &stored {
        if dead.contains_key(key) {
            continue;
        }
        if !by_key.contains_key(key) {
            pr.lost += 1;
            r.excerpt(format!(
                "POP LOST q{}@{}: stored ({}), never received by {}, not dead-lettered",
                key.0,
                key.1,
                body_str(body),
                super::POP_GROUP
            ));
        } else if !settled.contains(key) {
            pr.unsettled += 1;
            r.excerpt(format!(
                "POP UNSETTLED q{}@{}: received, no ack answered OK (or left unknown), not \
                 dead-lettered{}\n{}",
                key.0,
                key.1,
                if dlq.expected_missing.contains(key) {
                    " (its last delivery was the last attempt)"
                } else {
                    ""
                },
                ctx(*key)
            ));
        }
    }
    // A delivery names a stored message and carries its body (the main check's rules cover the
    // topic's contents themselves).
    for (key, ds) in &by_key {
        let held = stored.get(key).map(|b| decode(b));
        if let Some(d) = ds.iter().find(|d| held != Some(d.id)) {
            r.unexpected += 1;
            r.excerpt(format!(
                "UNEXPECTED (pop) q{}@{}: received as {:?}, the nodes hold {:?}\n{}",
                key.0,
                key.1,
                d.id,
                stored.get(key).map(|b| body_str(b)),
                ctx(*key)
            ));
        }
    }
    if p.fifo {
        check_fifo_order(&p, &stored, &by_key, &dead, &mut pr, r);
    }
    r.pop = Some(Box::new(pr));
}

/// FIFO: per queue and message group ([`super::workload::fifo_group`] of the stored body), each
/// delivery of a message must come after the message before it was released: an ack of it
/// answered OK or left unknown had started before the delivery's reply arrived, or it is in the
/// dead-letter topic (dead-lettered by the receive that found it out of attempts).
fn check_fifo_order(
    p: &PopHistory,
    stored: &BTreeMap<PopKey, &Vec<u8>>,
    by_key: &BTreeMap<PopKey, Vec<&Delivery>>,
    dead: &BTreeMap<PopKey, u64>,
    pr: &mut PopReport,
    r: &mut Report,
) {
    // (queue, group) → its offsets in order.
    let mut groups: BTreeMap<(u32, String), Vec<u64>> = BTreeMap::new();
    for ((q, off), body) in stored {
        if let Some(id) = decode(body) {
            groups
                .entry((*q, super::workload::fifo_group(id)))
                .or_default()
                .push(*off);
        }
    }
    pr.fifo_groups = groups.len() as u64;
    let released_by = |key: PopKey| -> Option<Duration> {
        p.acks
            .iter()
            .filter(|a| a.key == key && matches!(a.answer, Answer::Ok | Answer::Unknown(_)))
            .map(|a| a.start)
            .min()
    };
    for ((q, g), offsets) in &groups {
        for w in offsets.windows(2) {
            let (before, key) = ((*q, w[0]), (*q, w[1]));
            let Some(ds) = by_key.get(&key) else {
                continue;
            };
            pr.fifo_pairs += 1;
            if dead.contains_key(&before) {
                continue;
            }
            let released = released_by(before);
            let early: Vec<&&Delivery> = ds
                .iter()
                .filter(|d| released.is_none_or(|t| d.end < t))
                .collect();
            if let Some(d) = early.first() {
                pr.fifo_out_of_order += early.len() as u64;
                r.excerpt(format!(
                    "POP FIFO OUT OF ORDER q{q} group {g}: offset {} (attempt {}) received at \
                     {:.3}s, before offset {} was released ({})",
                    key.1,
                    d.attempt,
                    d.end.as_secs_f64(),
                    before.1,
                    released.map_or("never acknowledged".to_string(), |t| format!(
                        "first ack sent at {:.3}s",
                        t.as_secs_f64()
                    ))
                ));
            }
        }
    }
}

/// [`check`] on hand-made histories. Each bad history is the good one of [`baseline`] with one
/// defect added, and its test asserts that exactly the counters of that defect are raised (every
/// other problem counter stays zero), so a rule that misses its defect, or flags a good history,
/// fails a test.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::check;
    use crate::history::report::Report;
    use crate::history::workload::NodeRead;
    use crate::history::{
        FaultEvent, FaultKind, History, MsgId, OffsetEvent, Op, Outcome, decode, encode,
    };

    const LEN: usize = 40;
    const NODES: [u64; 3] = [1, 2, 3];

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// The body of message `idx` of send `seq` of `producer`, as the workload sends it.
    fn body(producer: u64, seq: u64, idx: u32) -> Vec<u8> {
        encode(MsgId { producer, seq, idx }, LEN)
    }

    /// A send of `count` messages to `queue`, ended at `seq` seconds.
    fn op(producer: u64, seq: u64, queue: u32, count: u32, outcome: Outcome) -> Op {
        Op {
            producer,
            seq,
            queue,
            count,
            len: LEN,
            start: secs(seq as f64 - 0.5),
            end: secs(seq as f64),
            attempts: 1,
            outcome,
        }
    }

    fn acked(producer: u64, seq: u64, queue: u32, offsets: &[u64]) -> Op {
        let outcome = Outcome::Acked {
            offsets: offsets.to_vec(),
            by: "n1".into(),
            duplicate: false,
        };
        op(producer, seq, queue, offsets.len() as u32, outcome)
    }

    fn commit(queue: u32, committed: u64, fetched: Option<u64>) -> OffsetEvent {
        OffsetEvent {
            queue,
            committed,
            by: "n1".into(),
            at: secs(1.0),
            fetched,
        }
    }

    /// A history as the workload records it; the load ended at 20 s.
    struct Case {
        ops: Vec<Op>,
        commits: Vec<OffsetEvent>,
        faults: Vec<FaultEvent>,
        /// (queue, offset, body) every node holds, unless a test changes one node.
        entries: Vec<(u32, u64, Vec<u8>)>,
        /// The group's offset per queue every node holds at the end.
        group_offsets: Vec<(u32, Option<u64>)>,
    }

    /// A good history: two producers, acknowledged sends of one and two messages in two queues,
    /// an ambiguous send that was stored, an ambiguous one that was not, a refused one that was
    /// not, and one acknowledged offset commit.
    fn baseline() -> Case {
        Case {
            ops: vec![
                acked(1, 1, 0, &[0, 1]),
                acked(1, 2, 1, &[0]),
                op(1, 3, 0, 1, Outcome::Unknown("attempt timeout".into())),
                op(1, 4, 1, 1, Outcome::Failed("BUSY".into())),
                op(1, 5, 2, 1, Outcome::Unknown("attempt timeout".into())),
                acked(2, 1, 0, &[3]),
            ],
            commits: vec![commit(0, 2, Some(2))],
            faults: Vec::new(),
            entries: vec![
                (0, 0, body(1, 1, 0)),
                (0, 1, body(1, 1, 1)),
                (0, 2, body(1, 3, 0)),
                (0, 3, body(2, 1, 0)),
                (1, 0, body(1, 2, 0)),
            ],
            group_offsets: vec![(0, Some(2))],
        }
    }

    impl Case {
        fn history(&self) -> History {
            History {
                ops: Mutex::new(self.ops.clone()),
                faults: Mutex::new(self.faults.clone()),
                offsets: Mutex::new(self.commits.clone()),
                load_end: Mutex::new(Some(secs(20.0))),
                ..History::default()
            }
        }

        /// What every node serves: `entries` in (queue, offset) order, and `group_offsets`.
        fn reads(&self) -> BTreeMap<u64, NodeRead> {
            let mut sorted = self.entries.clone();
            sorted.sort();
            let mut nr = NodeRead::default();
            for (q, off, b) in sorted {
                nr.queues.entry(q).or_default().push((off, b));
                nr.log_index.insert((q, off), off + 1);
            }
            nr.offsets = self.group_offsets.iter().copied().collect();
            NODES
                .iter()
                .map(|id| {
                    let copy = NodeRead {
                        queues: nr.queues.clone(),
                        offsets: nr.offsets.clone(),
                        log_index: nr.log_index.clone(),
                        errors: Vec::new(),
                    };
                    (*id, copy)
                })
                .collect()
        }

        fn check(&self) -> Report {
            self.check_reads(&self.reads())
        }

        fn check_reads(&self, reads: &BTreeMap<u64, NodeRead>) -> Report {
            check(&self.history(), reads, 7)
        }
    }

    /// Every problem counter of `r`.
    fn problems(r: &Report) -> BTreeMap<&'static str, u64> {
        BTreeMap::from([
            ("lost", r.lost),
            ("lost_prefix", r.lost_prefix),
            ("lost_middle", r.lost_middle),
            ("lost_suffix", r.lost_suffix),
            ("misplaced", r.misplaced),
            ("unexpected", r.unexpected),
            ("aborted", r.aborted),
            ("divergent", r.divergent),
            ("missing", r.missing),
            ("order", r.order),
            ("duplicates", r.duplicates),
            ("offsets_backwards", r.offsets_backwards),
            ("read_errors", r.read_errors),
        ])
    }

    /// Every problem counter zero but those named.
    fn only(raised: &[(&'static str, u64)]) -> BTreeMap<&'static str, u64> {
        let mut m = problems(&Report::default());
        for (k, v) in raised {
            assert!(m.contains_key(k), "no counter {k}");
            m.insert(k, *v);
        }
        m
    }

    /// Asserts the problem counters of `r`, that it fails, and that an excerpt starts with `tag`.
    /// The baseline changed by `change` raises exactly `raised`, with `tag` in its report.
    fn flagged_after(change: impl FnOnce(&mut Case), raised: &[(&'static str, u64)], tag: &str) {
        let mut c = baseline();
        change(&mut c);
        assert_flagged(&c.check(), raised, tag);
    }

    fn assert_flagged(r: &Report, raised: &[(&'static str, u64)], tag: &str) {
        assert_eq!(problems(r), only(raised), "{r}");
        assert!(!r.is_ok(), "{r}");
        assert!(
            r.excerpts.iter().any(|e| e.starts_with(tag)),
            "no excerpt {tag}: {r}"
        );
    }

    #[test]
    fn t01_good_history_passes_with_every_count_zero() {
        let r = baseline().check();
        assert_eq!(problems(&r), only(&[]), "{r}");
        assert!(r.is_ok(), "{r}");
        assert!(r.excerpts.is_empty(), "{r}");
        assert_eq!(
            (
                r.ops,
                r.acked_ops,
                r.acked_msgs,
                r.failed_ops,
                r.unknown_ops
            ),
            (6, 3, 4, 1, 2)
        );
        assert_eq!((r.read_msgs, r.offset_commits, r.seed), (5, 1, 7));
    }

    #[test]
    fn t02_acknowledged_send_never_read_is_lost() {
        flagged_after(
            |c| {
                // Acknowledged at q1@1 after producer 1's last send that was read: a lost suffix.
                c.ops.push(acked(1, 6, 1, &[1]));
            },
            &[("lost", 1), ("lost_suffix", 1)],
            "LOST (suffix)",
        );
    }

    #[test]
    fn t03_acknowledged_message_missing_from_a_read_send_is_lost_in_the_middle() {
        flagged_after(
            |c| {
                // The second message of producer 1's first send (acknowledged at q0@1) is on no node;
                // the producer's sends before and after it are read: the middle of its run.
                c.entries.retain(|(q, off, _)| (*q, *off) != (0, 1));
            },
            &[("lost", 1), ("lost_middle", 1)],
            "LOST (middle)",
        );
    }

    #[test]
    fn t04_message_sent_once_and_stored_twice_is_a_duplicate() {
        flagged_after(
            |c| {
                // Producer 1's second send (acknowledged at q1@0) also stored at q1@1: a retry applied
                // twice. Within one queue a repeat also comes after the producer's later position, so
                // the order rule counts it too.
                c.entries.push((1, 1, body(1, 2, 0)));
            },
            &[("duplicates", 1), ("order", 1)],
            "DUPLICATE",
        );
    }

    #[test]
    fn t05_two_nodes_with_different_values_at_one_offset_diverge() {
        let c = baseline();
        let mut reads = c.reads();
        // Node 3 holds another value at q0@1; the two others agree on the acknowledged one.
        let q0 = reads.get_mut(&3).unwrap().queues.get_mut(&0).unwrap();
        q0[1].1 = body(9, 1, 0);
        let r = c.check_reads(&reads);
        assert_flagged(&r, &[("divergent", 1)], "DIVERGENT q0@1");
    }

    #[test]
    fn t06_node_lacking_an_entry_others_hold_is_missing() {
        let c = baseline();
        let mut reads = c.reads();
        // Node 2 lacks q0's last entry (all nodes have applied the same commit index when read).
        reads.get_mut(&2).unwrap().queues.get_mut(&0).unwrap().pop();
        let r = c.check_reads(&reads);
        assert_flagged(&r, &[("missing", 1)], "MISSING q0@3 on node 2");
    }

    #[test]
    fn t07_committed_offset_read_back_lower_goes_backwards() {
        flagged_after(
            |c| {
                // Offset 2 acknowledged, and the node that acknowledged it then answers 1.
                c.commits = vec![commit(0, 2, Some(1))];
            },
            &[("offsets_backwards", 1)],
            "OFFSET BACKWARDS q0",
        );
    }

    #[test]
    fn t08_node_holding_less_than_the_acknowledged_offset_at_the_end_goes_backwards() {
        let c = baseline();
        let mut reads = c.reads();
        reads.get_mut(&1).unwrap().offsets.insert(0, Some(1));
        // A node that lost the commit altogether counts too.
        reads.get_mut(&3).unwrap().offsets.insert(0, None);
        let r = c.check_reads(&reads);
        assert_flagged(
            &r,
            &[("offsets_backwards", 2)],
            "OFFSET BACKWARDS at the end: node 1 q0 holds Some(1), 2 was acknowledged",
        );
    }

    #[test]
    fn t09_payload_read_but_never_sent_is_unexpected() {
        flagged_after(
            |c| {
                // Producer 3 never sent anything.
                c.entries.push((2, 0, body(3, 1, 0)));
            },
            &[("unexpected", 1)],
            "UNEXPECTED q2@0",
        );
    }

    #[test]
    fn t10_bytes_that_are_no_payload_are_unexpected() {
        flagged_after(
            |c| {
                c.entries
                    .push((2, 0, b"hist|1|5|0|not-the-padding".to_vec()));
            },
            &[("unexpected", 1)],
            "UNEXPECTED q2@0",
        );
    }

    #[test]
    fn t11_payload_in_another_queue_than_its_send_is_unexpected() {
        flagged_after(
            |c| {
                // Producer 1's ambiguous fifth send went to q2, but is read in q3.
                c.entries.push((3, 0, body(1, 5, 0)));
            },
            &[("unexpected", 1)],
            "UNEXPECTED q3@0",
        );
    }

    #[test]
    fn t12_refused_send_read_back_is_aborted() {
        flagged_after(
            |c| {
                // Producer 1's fourth send to q1 was refused on every attempt, yet it is stored.
                c.entries.push((1, 1, body(1, 4, 0)));
            },
            &[("aborted", 1)],
            "ABORTED q1@1",
        );
    }

    #[test]
    fn t13_producer_messages_out_of_send_order_in_a_queue() {
        flagged_after(
            |c| {
                // An ambiguous seventh send of producer 1 stored before its ambiguous third one.
                c.ops
                    .push(op(1, 7, 0, 1, Outcome::Unknown("attempt timeout".into())));
                c.entries.retain(|(q, off, _)| (*q, *off) != (0, 2));
                c.entries.push((0, 2, body(1, 7, 0)));
                c.entries.push((0, 4, body(1, 3, 0)));
            },
            &[("order", 1)],
            "ORDER q0",
        );
    }

    #[test]
    fn t14_acknowledged_message_read_at_another_offset_is_misplaced() {
        flagged_after(
            |c| {
                // Producer 2's message was acknowledged at q0@3 but is read at q0@4: q0@3 holds producer
                // 1's ambiguous fifth send (sent to q0 here).
                c.ops[4].queue = 0;
                c.entries.retain(|(q, off, _)| (*q, *off) != (0, 3));
                c.entries.push((0, 3, body(1, 5, 0)));
                c.entries.push((0, 4, body(2, 1, 0)));
            },
            &[("misplaced", 1)],
            "MISPLACED",
        );
    }

    #[test]
    fn t15_read_error_fails_the_check() {
        let c = baseline();
        let mut reads = c.reads();
        reads
            .get_mut(&2)
            .unwrap()
            .errors
            .push("pull q0@4: UNAVAILABLE".into());
        let r = c.check_reads(&reads);
        assert_flagged(&r, &[("read_errors", 1)], "read error on node 2");
    }

    #[test]
    fn t16_liveness_is_the_longest_gap_between_acknowledgements_per_fault() {
        let mut c = baseline();
        // Acknowledgements end at 1 s and 2 s (producer 1) and 1 s (producer 2); one more at 9 s.
        c.ops.push(acked(2, 9, 1, &[1]));
        c.entries.push((1, 1, body(2, 9, 0)));
        let fault = |kind, start: f64, healed: f64| FaultEvent {
            kind,
            nodes: vec![1],
            start: secs(start),
            healed: secs(healed),
            converged: secs(healed + 0.1),
            note: String::new(),
            term_before: Some(1),
            term_after: Some(2),
            catch_up: None,
        };
        // The first fault's window ends where the second starts, the second's at the load end.
        c.faults = vec![
            fault(FaultKind::KillLeader, 1.5, 3.0),
            fault(FaultKind::PauseLeader, 12.0, 13.0),
        ];
        let r = c.check();
        assert_eq!(problems(&r), only(&[]), "{r}");
        assert_eq!(r.liveness.len(), 2);
        // 1.5 s..2 s..9 s: 7 s without an acknowledgement; first one 6 s after the heal at 3 s.
        assert_eq!(r.liveness[0].kind, Some(FaultKind::KillLeader));
        assert_eq!(r.liveness[0].max_gap, secs(7.0));
        assert_eq!(r.liveness[0].after_heal, secs(6.0));
        // No acknowledgement from 12 s to the load end at 20 s.
        assert_eq!(r.liveness[1].max_gap, secs(8.0));
        assert_eq!(r.liveness[1].after_heal, secs(7.0));
    }

    // -----------------------------------------------------------------------------------------
    // The POP workload

    use crate::history::pop::{
        AckEvent, Answer, ChangeEvent, Delivery, DlqEntry, DlqRead, DrainStats, Fate, PopCall,
        PopCallOutcome, PopHistory,
    };
    use crate::history::report::PopReport;

    /// A delivery of `key` at `attempt`, received over [start, start + 0.1 s], applied at
    /// replicated clock `clock` ms with 2 s of invisibility.
    fn delivery(key: (u32, u64), attempt: u32, start: f64, clock: u64, fate: Fate) -> Delivery {
        Delivery {
            consumer: 1,
            key,
            id: None,
            attempt,
            handle: format!("{}.{}.{}.broker-a", key.0, key.1, clock),
            invisible_ms: 2000,
            invisible_until_ms: clock + 2000,
            start: secs(start),
            end: secs(start + 0.1),
            drain: false,
            fate,
        }
    }

    fn ack(key: (u32, u64), attempt: u32, end: f64, answer: Answer) -> AckEvent {
        AckEvent {
            consumer: 1,
            key,
            attempt,
            handle: "h".into(),
            start: secs(end - 0.05),
            end: secs(end),
            answer,
        }
    }

    fn dead_letter(key: (u32, u64), attempts: &str, body: Vec<u8>) -> DlqEntry {
        DlqEntry {
            offset: 0,
            origin: Some(format!("hist/{}/{}", key.0, key.1)),
            attempts: Some(attempts.into()),
            body,
        }
    }

    /// A good POP history of the baseline's topic: q0@0 acknowledged at once; q0@1 left to expire
    /// once, then acknowledged; q0@2 left to expire three times and dead-lettered; q0@3 made
    /// invisible again and acknowledged under the new handle; q1@0 acknowledged with no answer.
    fn pop_baseline(c: &Case) -> PopHistory {
        let body_at = |q: u32, off: u64| {
            c.entries
                .iter()
                .find(|(eq, eo, _)| (*eq, *eo) == (q, off))
                .map(|e| e.2.clone())
                .unwrap()
        };
        let mut deliveries = vec![
            delivery((0, 0), 1, 1.0, 10_000, Fate::Ack),
            delivery((0, 1), 1, 1.0, 10_000, Fate::Ignore),
            delivery((0, 1), 2, 3.0, 12_000, Fate::Ack),
            delivery((0, 2), 1, 1.0, 10_000, Fate::Ignore),
            delivery((0, 2), 2, 3.0, 12_000, Fate::Ignore),
            delivery((0, 2), 3, 5.0, 14_000, Fate::Ignore),
            delivery((0, 3), 1, 1.0, 10_000, Fate::ChangeThenAck),
            delivery((1, 0), 1, 1.0, 10_000, Fate::Ack),
        ];
        for d in &mut deliveries {
            d.id = decode(&body_at(d.key.0, d.key.1));
        }
        PopHistory {
            max_attempts: 3,
            fifo: false,
            calls: vec![PopCall {
                consumer: 1,
                by: "n1".into(),
                invisible_ms: 2000,
                start: secs(1.0),
                end: secs(1.1),
                start_wall_ms: 10_000,
                end_wall_ms: 10_100,
                drain: false,
                outcome: PopCallOutcome::Received(5),
            }],
            deliveries,
            acks: vec![
                ack((0, 0), 1, 1.2, Answer::Ok),
                ack((0, 1), 2, 3.2, Answer::Ok),
                ack((0, 3), 1, 1.3, Answer::Ok),
                ack((1, 0), 1, 1.2, Answer::Unknown("timeout".into())),
            ],
            changes: vec![ChangeEvent {
                consumer: 1,
                key: (0, 3),
                attempt: 1,
                handle: "h".into(),
                invisible_ms: 3000,
                start: secs(1.15),
                end: secs(1.2),
                end_wall_ms: 10_200,
                answer: Answer::Ok,
                new_handle: Some("h2".into()),
                invisible_until_ms: Some(13_200),
            }],
            drain: Some(DrainStats {
                took: secs(6.0),
                timed_out: false,
                received: 0,
            }),
            dlq: Some(DlqRead {
                entries: vec![dead_letter((0, 2), "3", body_at(0, 2))],
                ..Default::default()
            }),
        }
    }

    fn pop_problems(p: &PopReport) -> BTreeMap<&'static str, u64> {
        BTreeMap::from([
            ("redelivered_after_ack", p.redelivered_after_ack),
            ("lost", p.lost),
            ("unsettled", p.unsettled),
            ("attempt_backwards", p.attempt_backwards),
            ("attempt_out_of_range", p.attempt_out_of_range),
            ("redelivered_early", p.redelivered_early),
            ("dlq_duplicates", p.dlq_duplicates),
            ("dlq_early", p.dlq_early),
            ("dlq_corrupt", p.dlq_corrupt),
            ("acked_then_dlq", p.acked_then_dlq),
            ("drain_timeouts", p.drain_timeouts),
            ("dlq_errors", p.dlq_errors),
            ("fifo_out_of_order", p.fifo_out_of_order),
        ])
    }

    /// The baseline with `change` applied to its POP history, checked.
    fn pop_check(change: impl FnOnce(&mut PopHistory)) -> Report {
        let c = baseline();
        let mut p = pop_baseline(&c);
        change(&mut p);
        // Deliveries a test adds carry the payload of the message they name.
        for d in p.deliveries.iter_mut().filter(|d| d.id.is_none()) {
            d.id = c
                .entries
                .iter()
                .find(|(q, off, _)| (*q, *off) == d.key)
                .and_then(|e| decode(&e.2));
        }
        let h = c.history();
        *h.pop.lock().unwrap() = p;
        let reads = c.reads();
        let mut r = check(&h, &reads, 7);
        super::check_pop(&h, &reads, &mut r);
        r
    }

    /// The POP history changed by `change` raises exactly `raised` (and nothing in the main
    /// check), with an excerpt starting with `tag`.
    fn pop_flagged(
        change: impl FnOnce(&mut PopHistory),
        raised: &[(&'static str, u64)],
        tag: &str,
    ) {
        let r = pop_check(change);
        let p = r.pop.as_deref().unwrap();
        let mut want = pop_problems(&PopReport::default());
        for (k, v) in raised {
            assert!(want.contains_key(k), "no counter {k}");
            want.insert(k, *v);
        }
        assert_eq!(pop_problems(p), want, "{r}");
        assert_eq!(problems(&r), only(&[]), "{r}");
        assert!(!r.is_ok(), "{r}");
        assert!(
            r.excerpts.iter().any(|e| e.starts_with(tag)),
            "no excerpt {tag}: {r}"
        );
    }

    #[test]
    fn t17_good_pop_history_passes() {
        let r = pop_check(|_| {});
        let p = r.pop.as_deref().unwrap();
        assert_eq!(p.problems(), 0, "{r}");
        assert!(r.is_ok(), "{r}");
        assert!(r.excerpts.is_empty(), "{r}");
        assert_eq!(
            (p.received, p.messages, p.stored, p.redelivered, p.ignored),
            (8, 5, 5, 3, 4)
        );
        assert_eq!(
            (p.acked, p.ack_unknown, p.changed, p.dead_lettered),
            (3, 1, 1, 1)
        );
    }

    #[test]
    fn t18_pop_message_received_after_its_ack_was_answered() {
        pop_flagged(
            |p| {
                p.deliveries
                    .push(delivery((0, 0), 2, 4.0, 13_000, Fate::Ack))
            },
            &[("redelivered_after_ack", 1)],
            "POP REDELIVERED AFTER ACK q0@0",
        );
    }

    #[test]
    fn t19_pop_stored_message_never_received_nor_dead_lettered_is_lost() {
        pop_flagged(
            |p| {
                p.deliveries.retain(|d| d.key != (1, 0));
                p.acks.retain(|a| a.key != (1, 0));
            },
            &[("lost", 1)],
            "POP LOST q1@0",
        );
    }

    #[test]
    fn t20_pop_message_received_but_never_acknowledged_nor_dead_lettered() {
        pop_flagged(
            |p| p.acks[3].answer = Answer::Invalid("INVALID_RECEIPT_HANDLE".into()),
            &[("unsettled", 1)],
            "POP UNSETTLED q1@0",
        );
    }

    #[test]
    fn t21_pop_attempt_repeated_after_an_answered_receive_goes_backwards() {
        pop_flagged(
            |p| p.deliveries[2].attempt = 1,
            &[("attempt_backwards", 1)],
            "POP ATTEMPT BACKWARDS q0@1",
        );
    }

    #[test]
    fn t22_pop_redelivery_before_the_deadline_is_early() {
        // Attempt 1 of q0@1 is invisible until clock 12000; attempt 2 applied at 11500.
        pop_flagged(
            |p| {
                p.deliveries[2].invisible_until_ms = 13_500;
            },
            &[("redelivered_early", 1)],
            "POP REDELIVERED EARLY q0@1",
        );
        // A change answered OK moves the deadline: q0@3 is invisible until 13200 after it.
        pop_flagged(
            |p| {
                p.deliveries
                    .push(delivery((0, 3), 2, 2.0, 12_000, Fate::Ack));
                p.acks.retain(|a| a.key != (0, 3));
                p.acks.push(ack((0, 3), 2, 2.2, Answer::Ok));
            },
            &[("redelivered_early", 1)],
            "POP REDELIVERED EARLY q0@3",
        );
    }

    #[test]
    fn t23_pop_dead_letter_twice_or_early_or_after_an_ack() {
        pop_flagged(
            |p| {
                let e = p.dlq.as_ref().unwrap().entries[0].clone();
                p.dlq.as_mut().unwrap().entries.push(e);
            },
            &[("dlq_duplicates", 1)],
            "POP DLQ DUPLICATE q0@2",
        );
        pop_flagged(
            |p| p.dlq.as_mut().unwrap().entries[0].attempts = Some("2".into()),
            &[("dlq_early", 1)],
            "POP DLQ EARLY q0@2",
        );
        // q0@0 was acknowledged at its first attempt, yet it is dead-lettered as well (which is
        // early too: one attempt seen, every receive answered).
        pop_flagged(
            |p| {
                let body = p.dlq.as_ref().unwrap().entries[0].body.clone();
                let mut e = dead_letter((0, 0), "3", body);
                e.body = super::encode(
                    MsgId {
                        producer: 1,
                        seq: 1,
                        idx: 0,
                    },
                    LEN,
                );
                p.dlq.as_mut().unwrap().entries.push(e);
            },
            &[("acked_then_dlq", 1), ("dlq_early", 1)],
            "POP ACKED THEN DEAD-LETTERED q0@0",
        );
    }

    #[test]
    fn t24_pop_drain_that_timed_out_fails() {
        pop_flagged(
            |p| p.drain.as_mut().unwrap().timed_out = true,
            &[("drain_timeouts", 1)],
            "POP DRAIN TIMED OUT",
        );
    }

    /// FIFO: queue 0 holds two messages of group mg1-1 (offsets 0 and 1); the baseline hands out
    /// offset 1 at 1.0 s, before offset 0's ack was sent (1.2 s).
    #[test]
    fn t25_pop_fifo_message_handed_out_before_the_one_before_it_was_released() {
        pop_flagged(
            |p| p.fifo = true,
            &[("fifo_out_of_order", 1)],
            "POP FIFO OUT OF ORDER q0 group mg1-1: offset 1 (attempt 1)",
        );
    }

    /// FIFO: without that delivery, offset 1 comes (attempt 2, 3.0 s) after offset 0's ack.
    #[test]
    fn t26_pop_fifo_in_order_passes() {
        let r = pop_check(|p| {
            p.fifo = true;
            p.deliveries
                .retain(|d| !(d.key == (0, 1) && d.attempt == 1));
        });
        let p = r.pop.as_deref().unwrap();
        assert_eq!(p.problems(), 0, "{r}");
        assert_eq!((p.fifo_groups, p.fifo_pairs), (4, 1), "{r}");
    }
}
