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
    use crate::history::{FaultEvent, FaultKind, History, MsgId, OffsetEvent, Op, Outcome, encode};

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
}
