//! [`check`]: the history against what every node holds; a pure function of the recorded data.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use super::report::{FaultLiveness, Report, body_str, op_context};
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
