//! POP consumption (RocketMQ 5's receive / ack) as replicated state of the broker group.
//!
//! A consumer group receives messages that become invisible to the group until they are
//! acknowledged or their deadline passes; then they are handed out again with the next delivery
//! attempt, and after the group's last attempt they move to the dead-letter topic `%DLQ%<group>`.
//! Everything here is decided at apply time from what the entry holds and from the replicated
//! clock (the highest `now_ms` any applied entry carried), never from a node's own clock, so every
//! replica agrees and a failover keeps what was handed out and what was acknowledged.
//!
//! Invariants (checked by the unit tests and the history checker's POP workload):
//! - A delivery is named by (queue, offset, issued): `issued` is the log index of the entry that
//!   handed it out (or changed its invisibility). Only the current delivery's handle acks it.
//! - An acknowledged message is never handed out again: it left `inflight`, and the group's
//!   cursor `next` is past it.
//! - A message is handed out again only once its deadline is at or before the replicated clock,
//!   with `attempt + 1`; attempts never go backwards.
//! - A message out of attempts waits in `dead_letters` until a `DeadLetter` entry stores it in
//!   `%DLQ%<group>`, once.
//! - The leader chooses what to hand out (it alone reads the tag index); apply only re-checks the
//!   choice against this state, so apply never depends on the consume-queue index (which is not in
//!   snapshots and differs between a replica that restarted and one that did not).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::command::Reply;

/// Deliveries of a message before it is dead-lettered, unless the group says otherwise.
pub const MAX_ATTEMPTS_DEFAULT: u32 = 16;
/// RocketMQ's retry ladder: the invisible time before retry N is entry N-1 (the last repeats).
pub const RETRY_LADDER_MS: [u64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];
/// The dead-letter topic of group `g` is `%DLQ%g`.
pub const DLQ_PREFIX: &str = "%DLQ%";
/// The longest a message may be made invisible for (RocketMQ caps it at 12 h too).
pub const INVISIBLE_MS_MAX: u64 = 12 * 3600 * 1000;

const _: () = assert!(RETRY_LADDER_MS[0] > 0 && MAX_ATTEMPTS_DEFAULT > 1);

/// The dead-letter topic of a group.
pub fn dlq_topic(group: &str) -> String {
    format!("{DLQ_PREFIX}{group}")
}

/// A consumer group's replicated config. In snapshots: never reorder or change the fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    /// 0 = [`MAX_ATTEMPTS_DEFAULT`].
    pub max_attempts: u32,
    /// Empty = [`RETRY_LADDER_MS`].
    pub retry_delays_ms: Vec<u64>,
    pub fifo: bool,
}

impl GroupConfig {
    pub fn max_attempts(&self) -> u32 {
        if self.max_attempts == 0 {
            MAX_ATTEMPTS_DEFAULT
        } else {
            self.max_attempts
        }
    }

    /// The invisible time before retry `n` (1 = the first redelivery).
    pub fn retry_delay_ms(&self, n: u32) -> u64 {
        let ladder: &[u64] = if self.retry_delays_ms.is_empty() {
            &RETRY_LADDER_MS
        } else {
            &self.retry_delays_ms
        };
        let i = (n.max(1) as usize - 1).min(ladder.len() - 1);
        ladder[i]
    }
}

/// One message handed out and not yet acknowledged. In snapshots: never reorder or change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inflight {
    /// Replicated-clock time at which it becomes visible again.
    pub deadline_ms: u64,
    /// 1 on the first delivery.
    pub attempt: u32,
    /// The log index of the entry that issued the current handle.
    pub issued: u64,
}

/// A group's progress on one queue. In snapshots: never reorder or change the fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PopQueue {
    /// Every offset below it was handed out (or skipped by the filter) once; from it on, new.
    pub next: u64,
    pub inflight: BTreeMap<u64, Inflight>,
}

/// (group, topic, queue).
pub type PopKey = (String, String, u32);

/// A FIFO group's order on one queue: the next message of a message group is handed out only
/// once the one before it is acknowledged or dead-lettered; other message groups of the queue go
/// on meanwhile. In snapshots from format 4 (after the sent ids): never reorder or change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FifoQueue {
    /// Message-group hash ([`group_hash`]) → the offset of its message in flight: one at most.
    pub holding: BTreeMap<u32, u64>,
    /// Offsets at or above the cursor that were handed out already (in flight or finished): the
    /// cursor stops at the first message whose group is held, and later groups' messages are
    /// handed out past it.
    pub ahead: BTreeSet<u64>,
}

/// The message-group hash of a FIFO message: FNV-1a, 32 bits, never 0 (0 marks a message
/// without a group, which no order holds back). Two groups sharing a hash are ordered together:
/// slower, never out of order.
pub fn group_hash(group: &str) -> u32 {
    if group.is_empty() {
        return 0;
    }
    crate::lookup::fingerprint(group).max(1)
}

/// All POP state of a broker group. In snapshots: never reorder or change the fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PopState {
    /// The replicated clock: the highest `now_ms` an applied POP entry carried.
    pub clock_ms: u64,
    pub groups: BTreeMap<String, GroupConfig>,
    pub queues: BTreeMap<PopKey, PopQueue>,
    /// (group, topic, queue, offset) → attempts made: out of attempts, waiting to be stored in
    /// the dead-letter topic.
    pub dead_letters: BTreeMap<(String, String, u32, u64), u32>,
    /// Messages stored in a dead-letter topic so far.
    pub dead_lettered: u64,
    /// FIFO groups' order per queue ([`FifoQueue`]). In version-4 snapshots after the sent ids,
    /// not inside this struct's encoding, so a version-3 body still decodes.
    #[serde(skip)]
    pub fifo: BTreeMap<PopKey, FifoQueue>,
}

/// What every receive entry names: its index, group, topic, stamped clock, invisible time, and
/// whether it may create the group.
#[derive(Debug, Clone, Copy)]
pub struct PopReq<'a> {
    pub index: u64,
    pub group: &'a str,
    pub topic: &'a str,
    pub now_ms: u64,
    pub invisible_ms: u64,
    pub create_group: bool,
}

/// A queue's offsets as the topic holds them: (lowest still served, next to be written).
pub type Bounds = (u64, u64);

/// How a `DeadLetter` entry found its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterClaim {
    /// Waiting since it ran out of attempts, after this many.
    Waiting(u32),
    /// Handed out under the handle named, at this attempt.
    Handed(u32),
}

impl PopState {
    /// `ResetPop`: the group's cursor on (`topic`, `queue`) moves to `offset` held to the queue's
    /// `bounds`; its deliveries in flight and dead letters waiting there are dropped.
    pub fn reset(
        &mut self,
        group: &str,
        topic: &str,
        queue: u32,
        offset: u64,
        (min, next): Bounds,
    ) -> Reply {
        let key = (group.to_string(), topic.to_string(), queue);
        if !self.groups.contains_key(group) && !self.queues.contains_key(&key) {
            return Reply::GroupNotFound(group.to_string());
        }
        self.fifo.remove(&key);
        let q = self.queues.entry(key).or_default();
        q.next = offset.clamp(min, next);
        q.inflight.clear();
        self.dead_letters
            .retain(|(g, t, qq, _), _| !(g == group && t == topic && *qq == queue));
        Reply::Ok
    }

    fn tick(&mut self, now_ms: u64) {
        self.clock_ms = self.clock_ms.max(now_ms);
    }

    /// The group's config, created with defaults when `create` (else `GroupNotFound`).
    fn group(&mut self, group: &str, create: bool) -> Result<GroupConfig, Reply> {
        match self.groups.get(group) {
            Some(c) => Ok(c.clone()),
            None if create => {
                self.groups
                    .insert(group.to_string(), GroupConfig::default());
                Ok(GroupConfig::default())
            }
            None => Err(Reply::GroupNotFound(group.to_string())),
        }
    }

    /// The group's state on a queue, its cursor raised to the queue's lowest served offset.
    fn queue_mut(&mut self, group: &str, topic: &str, queue: u32, min: u64) -> &mut PopQueue {
        let pq = self
            .queues
            .entry((group.to_string(), topic.to_string(), queue))
            .or_insert_with(|| PopQueue {
                next: min,
                inflight: BTreeMap::new(),
            });
        pq.next = pq.next.max(min);
        pq
    }

    /// Applies a `Pop` (see [`crate::command::CommandOf::Pop`]). `bounds` gives each queue's
    /// offsets, `None` for a queue the topic does not have.
    #[allow(clippy::too_many_arguments)]
    pub fn pop(
        &mut self,
        index: u64,
        group: &str,
        topic: &str,
        now_ms: u64,
        invisible_ms: u64,
        create_group: bool,
        picks: &[(u32, u64)],
        advance: &[(u32, u64)],
        bounds: impl Fn(u32) -> Option<Bounds>,
    ) -> Reply {
        let picks: Vec<(u32, u64, Option<u32>)> =
            picks.iter().map(|&(q, o)| (q, o, None)).collect();
        let req = PopReq {
            index,
            group,
            topic,
            now_ms,
            invisible_ms,
            create_group,
        };
        self.hand_out(req, &picks, advance, bounds)
    }

    /// Applies a `PopFifo` (see [`crate::command::CommandOf::PopFifo`]): as [`Self::pop`], each
    /// new pick with its message-group hash, handed out only while no message of its group is in
    /// flight on that queue; a pick may lie past `advance` (the cursor stops at a held group's
    /// message while later groups go on).
    pub fn pop_fifo(
        &mut self,
        req: PopReq,
        picks: &[(u32, u64, u32)],
        advance: &[(u32, u64)],
        bounds: impl Fn(u32) -> Option<Bounds>,
    ) -> Reply {
        let picks: Vec<(u32, u64, Option<u32>)> =
            picks.iter().map(|&(q, o, h)| (q, o, Some(h))).collect();
        self.hand_out(req, &picks, advance, bounds)
    }

    /// `pop` and `pop_fifo`: a pick's hash is `None` for an unordered pick.
    fn hand_out(
        &mut self,
        req: PopReq,
        picks: &[(u32, u64, Option<u32>)],
        advance: &[(u32, u64)],
        bounds: impl Fn(u32) -> Option<Bounds>,
    ) -> Reply {
        let PopReq {
            index,
            group,
            topic,
            now_ms,
            invisible_ms,
            create_group,
        } = req;
        self.tick(now_ms);
        let cfg = match self.group(group, create_group) {
            Ok(c) => c,
            Err(r) => return r,
        };
        let invisible = if invisible_ms == 0 {
            cfg.retry_delay_ms(1)
        } else {
            invisible_ms.min(INVISIBLE_MS_MAX)
        };
        let clock = self.clock_ms;
        let deadline = clock.saturating_add(invisible);
        let cursor_limit = |q: u32| {
            advance
                .iter()
                .find(|(aq, _)| *aq == q)
                .map(|(_, a)| *a)
                .unwrap_or(0)
        };
        let (mut delivered, mut dead) = (Vec::new(), Vec::new());
        for &(q, off, hash) in picks {
            let Some((min, end)) = bounds(q) else {
                continue;
            };
            let key = (group.to_string(), topic.to_string(), q);
            let pq = self.queue_mut(group, topic, q, min);
            if let Some(inf) = pq.inflight.get(&off).copied() {
                if inf.deadline_ms > clock {
                    continue; // still invisible: not handed out twice
                }
                if off < min || inf.attempt >= cfg.max_attempts() {
                    pq.inflight.remove(&off);
                    if off >= min {
                        self.dead_letters
                            .insert((group.to_string(), topic.to_string(), q, off), inf.attempt);
                        dead.push((q, off));
                    } // else trimmed by retention while in flight
                    self.release(&key, off);
                    continue;
                }
                let attempt = inf.attempt + 1;
                pq.inflight.insert(
                    off,
                    Inflight {
                        deadline_ms: deadline,
                        attempt,
                        issued: index,
                    },
                );
                delivered.push((q, off, attempt, deadline));
                continue;
            }
            let next = pq.next;
            let fq = self.fifo.get(&key);
            if off < next || off >= end || fq.is_some_and(|f| f.ahead.contains(&off)) {
                continue; // handed out before, or not stored
            }
            match hash {
                None if off >= cursor_limit(q) => continue,
                Some(h) if h != 0 && fq.is_some_and(|f| f.holding.contains_key(&h)) => {
                    continue; // its group's message before it is still in flight
                }
                _ => {}
            }
            if let Some(h) = hash {
                let f = self.fifo.entry(key.clone()).or_default();
                f.ahead.insert(off);
                if h != 0 {
                    f.holding.insert(h, off);
                }
            }
            let pq = self.queue_mut(group, topic, q, min);
            pq.inflight.insert(
                off,
                Inflight {
                    deadline_ms: deadline,
                    attempt: 1,
                    issued: index,
                },
            );
            delivered.push((q, off, 1, deadline));
        }
        for &(q, to) in advance {
            if let Some((min, end)) = bounds(q) {
                let pq = self.queue_mut(group, topic, q, min);
                pq.next = pq.next.max(to.min(end));
            }
        }
        for &(q, _, _) in picks {
            self.settle(&(group.to_string(), topic.to_string(), q));
        }
        for &(q, _) in advance {
            self.settle(&(group.to_string(), topic.to_string(), q));
        }
        Reply::Popped {
            issued: index,
            delivered,
            dead,
        }
    }

    /// Moves a FIFO queue's cursor over the offsets handed out ahead of it, and forgets those
    /// below it.
    fn settle(&mut self, key: &PopKey) {
        let (Some(f), Some(pq)) = (self.fifo.get_mut(key), self.queues.get_mut(key)) else {
            return;
        };
        f.ahead = f.ahead.split_off(&pq.next);
        while f.ahead.first() == Some(&pq.next) {
            f.ahead.pop_first();
            pq.next += 1;
        }
    }

    /// A FIFO queue's message at `offset` is no longer in flight: its group goes on.
    fn release(&mut self, key: &PopKey, offset: u64) {
        if let Some(f) = self.fifo.get_mut(key) {
            f.holding.retain(|_, o| *o != offset);
        }
    }

    /// Applies an `Ack`: per handle, whether it named the current delivery of a message in flight.
    pub fn ack(
        &mut self,
        group: &str,
        topic: &str,
        now_ms: u64,
        handles: &[(u32, u64, u64)],
    ) -> Reply {
        self.tick(now_ms);
        let acked = handles
            .iter()
            .map(|&(q, off, issued)| {
                let key = (group.to_string(), topic.to_string(), q);
                match self.queues.get_mut(&key) {
                    Some(pq) if pq.inflight.get(&off).is_some_and(|i| i.issued == issued) => {
                        pq.inflight.remove(&off);
                        self.release(&key, off);
                        true
                    }
                    _ => false,
                }
            })
            .collect();
        Reply::Acked(acked)
    }

    /// Applies a `ChangeInvisible`.
    #[allow(clippy::too_many_arguments)]
    pub fn change_invisible(
        &mut self,
        index: u64,
        group: &str,
        topic: &str,
        queue: u32,
        offset: u64,
        issued: u64,
        invisible_ms: u64,
        now_ms: u64,
    ) -> Reply {
        self.tick(now_ms);
        let deadline = self
            .clock_ms
            .saturating_add(invisible_ms.min(INVISIBLE_MS_MAX));
        let key = (group.to_string(), topic.to_string(), queue);
        match self
            .queues
            .get_mut(&key)
            .and_then(|pq| pq.inflight.get_mut(&offset))
        {
            Some(inf) if inf.issued == issued => {
                inf.deadline_ms = deadline;
                inf.issued = index;
                Reply::Changed {
                    issued: index,
                    invisible_until_ms: deadline,
                }
            }
            _ => Reply::InvalidHandle(handle_text(queue, offset, issued)),
        }
    }

    /// Claims a message for a `DeadLetter` entry: removes it from what waits or is in flight.
    /// `None`: nothing to claim (stored already, acknowledged, or the handle is stale).
    pub fn claim_dead_letter(
        &mut self,
        group: &str,
        topic: &str,
        queue: u32,
        offset: u64,
        issued: u64,
    ) -> Option<DeadLetterClaim> {
        if issued == 0 {
            let key = (group.to_string(), topic.to_string(), queue, offset);
            return self.dead_letters.remove(&key).map(DeadLetterClaim::Waiting);
        }
        let key = (group.to_string(), topic.to_string(), queue);
        let pq = self.queues.get_mut(&key)?;
        let inf = pq.inflight.get(&offset).filter(|i| i.issued == issued)?;
        let attempt = inf.attempt;
        pq.inflight.remove(&offset);
        self.release(&key, offset);
        Some(DeadLetterClaim::Handed(attempt))
    }

    /// Forgets a deleted topic.
    pub fn drop_topic(&mut self, topic: &str) {
        self.queues.retain(|(_, t, _), _| t != topic);
        self.fifo.retain(|(_, t, _), _| t != topic);
        self.dead_letters.retain(|(_, t, _, _), _| t != topic);
    }

    /// Forgets a deleted group; `false` when it did not exist.
    pub fn drop_group(&mut self, group: &str) -> bool {
        self.queues.retain(|(g, _, _), _| g != group);
        self.fifo.retain(|(g, _, _), _| g != group);
        self.dead_letters.retain(|(g, _, _, _), _| g != group);
        self.groups.remove(group).is_some()
    }
}

/// A receipt handle as text: `{queue}.{offset}.{issued}.{broker}` (what v1 replies carry).
pub fn format_handle(broker: &str, queue: u32, offset: u64, issued: u64) -> String {
    format!("{queue}.{offset}.{issued}.{broker}")
}

fn handle_text(queue: u32, offset: u64, issued: u64) -> String {
    format!("queue {queue} offset {offset} issued at {issued}")
}

/// Parses a receipt handle of broker group `broker`: (queue, offset, issued).
pub fn parse_handle(broker: &str, handle: &str) -> Result<(u32, u64, u64), String> {
    let bad = || format!("{handle:?} is not a receipt handle of broker group {broker}");
    let mut it = handle.splitn(4, '.');
    let (Some(q), Some(o), Some(i), Some(b)) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    if b != broker {
        return Err(bad());
    }
    match (q.parse(), o.parse(), i.parse()) {
        (Ok(q), Ok(o), Ok(i)) if i > 0 => Ok((q, o, i)),
        _ => Err(bad()),
    }
}

/// FNV-1a, 32 bits ([`crate::lookup::fingerprint`]): the tag hash kept in the consume-queue
/// index so a tag filter reads no body. Never [`TAGS_MIXED`] (that value marks a batch of several
/// tags).
pub fn tag_hash(tag: &str) -> u32 {
    let h = crate::lookup::fingerprint(tag);
    if h == TAGS_MIXED { h - 1 } else { h }
}

/// The tag hash of a run whose messages do not all have the same tag.
pub const TAGS_MIXED: u32 = u32::MAX;

/// A tag filter: `*` (or empty) for every message, else tags joined by `||`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagFilter {
    All,
    Tags(Vec<(String, u32)>),
}

impl TagFilter {
    pub fn parse(expr: &str) -> Result<TagFilter, String> {
        let expr = expr.trim();
        if expr.is_empty() || expr == "*" {
            return Ok(TagFilter::All);
        }
        let tags: Vec<(String, u32)> = expr
            .split("||")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| (t.to_string(), tag_hash(t)))
            .collect();
        if tags.is_empty() {
            return Err(format!("tag expression {expr:?} names no tag"));
        }
        if tags.iter().any(|(t, _)| t == "*") {
            return Ok(TagFilter::All);
        }
        Ok(TagFilter::Tags(tags))
    }

    /// Whether a message with this tag hash may match (a hash is not the tag: compare the tag too).
    pub fn may_match(&self, hash: u32) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags(t) => t.iter().any(|(_, h)| *h == hash),
        }
    }

    pub fn matches(&self, tag: &str) -> bool {
        match self {
            TagFilter::All => true,
            TagFilter::Tags(t) => t.iter().any(|(x, _)| x == tag),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(_: u32) -> Option<Bounds> {
        Some((0, 100))
    }

    type Popped = (u64, Vec<(u32, u64, u32, u64)>, Vec<(u32, u64)>);

    fn popped(r: Reply) -> Popped {
        match r {
            Reply::Popped {
                issued,
                delivered,
                dead,
            } => (issued, delivered, dead),
            other => panic!("not popped: {other:?}"),
        }
    }

    /// 1. New messages are handed out once: a second pop of the same offsets (a stale or racing
    ///    proposal) hands out nothing, and the cursor never moves back.
    #[test]
    fn t1_new_offsets_are_handed_out_once() {
        let mut s = PopState::default();
        let r = s.pop(
            10,
            "g",
            "t",
            1000,
            5000,
            true,
            &[(0, 0), (0, 1)],
            &[(0, 2)],
            bounds,
        );
        assert_eq!(
            popped(r).1,
            vec![(0, 0, 1, 6000), (0, 1, 1, 6000)],
            "both delivered, attempt 1"
        );
        let r = s.pop(
            11,
            "g",
            "t",
            1000,
            5000,
            true,
            &[(0, 1), (0, 2)],
            &[(0, 3)],
            bounds,
        );
        assert_eq!(popped(r).1, vec![(0, 2, 1, 6000)]);
        s.pop(12, "g", "t", 1000, 5000, true, &[], &[(0, 1)], bounds);
        assert_eq!(s.queues[&("g".into(), "t".into(), 0)].next, 3);
    }

    /// 2. A message comes back only once its deadline is at or before the replicated clock, with
    ///    the next attempt and a new handle; the old handle no longer acks it.
    #[test]
    fn t2_redelivery_after_the_deadline_with_the_next_attempt() {
        let mut s = PopState::default();
        s.pop(10, "g", "t", 1000, 5000, true, &[(0, 0)], &[(0, 1)], bounds);
        let r = s.pop(11, "g", "t", 5999, 5000, true, &[(0, 0)], &[], bounds);
        assert!(popped(r).1.is_empty(), "not yet");
        let r = s.pop(12, "g", "t", 6000, 5000, true, &[(0, 0)], &[], bounds);
        assert_eq!(popped(r).1, vec![(0, 0, 2, 11000)]);
        assert_eq!(
            s.ack("g", "t", 6001, &[(0, 0, 10)]),
            Reply::Acked(vec![false])
        );
        assert_eq!(
            s.ack("g", "t", 6001, &[(0, 0, 12)]),
            Reply::Acked(vec![true])
        );
        // Acknowledged: never handed out again, even long after.
        let r = s.pop(13, "g", "t", 99_000, 5000, true, &[(0, 0)], &[], bounds);
        assert!(popped(r).1.is_empty());
    }

    /// 3. The clock is the highest stamp applied: an entry stamped earlier (a new leader whose
    ///    clock is behind) does not move it back.
    #[test]
    fn t3_the_replicated_clock_never_goes_back() {
        let mut s = PopState::default();
        s.pop(10, "g", "t", 1000, 5000, true, &[(0, 0)], &[(0, 1)], bounds);
        s.ack("g", "t", 7000, &[]);
        let r = s.pop(11, "g", "t", 500, 5000, true, &[(0, 0)], &[], bounds);
        assert_eq!(popped(r).1, vec![(0, 0, 2, 12000)], "due at clock 7000");
        assert_eq!(s.clock_ms, 7000);
    }

    /// 4. After the last attempt a message waits for the dead-letter topic instead of being handed
    ///    out, and is claimed for it once.
    #[test]
    fn t4_out_of_attempts_waits_for_the_dead_letter_topic_once() {
        let mut s = PopState::default();
        s.groups.insert(
            "g".into(),
            GroupConfig {
                max_attempts: 2,
                ..Default::default()
            },
        );
        s.pop(10, "g", "t", 0, 100, false, &[(0, 0)], &[(0, 1)], bounds);
        s.pop(11, "g", "t", 100, 100, false, &[(0, 0)], &[], bounds);
        let (_, delivered, dead) =
            popped(s.pop(12, "g", "t", 200, 100, false, &[(0, 0)], &[], bounds));
        assert!(delivered.is_empty());
        assert_eq!(dead, vec![(0, 0)]);
        assert_eq!(
            s.claim_dead_letter("g", "t", 0, 0, 0),
            Some(DeadLetterClaim::Waiting(2))
        );
        assert_eq!(s.claim_dead_letter("g", "t", 0, 0, 0), None, "once");
        let r = s.pop(13, "g", "t", 9999, 100, false, &[(0, 0)], &[], bounds);
        assert!(popped(r).1.is_empty(), "never delivered to the group again");
    }

    /// 5. Changing the invisibility gives a new handle and deadline; the old handle is stale.
    #[test]
    fn t5_change_invisible_replaces_the_handle() {
        let mut s = PopState::default();
        s.pop(10, "g", "t", 1000, 5000, true, &[(0, 0)], &[(0, 1)], bounds);
        assert_eq!(
            s.change_invisible(20, "g", "t", 0, 0, 10, 30_000, 2000),
            Reply::Changed {
                issued: 20,
                invisible_until_ms: 32_000
            }
        );
        assert!(matches!(
            s.change_invisible(21, "g", "t", 0, 0, 10, 1, 2000),
            Reply::InvalidHandle(_)
        ));
        let r = s.pop(22, "g", "t", 31_999, 5000, true, &[(0, 0)], &[], bounds);
        assert!(popped(r).1.is_empty(), "still invisible");
        assert_eq!(
            s.ack("g", "t", 2000, &[(0, 0, 20)]),
            Reply::Acked(vec![true])
        );
    }

    /// 6. A pick past the leader's advance, past the queue's end, or before the cursor is refused;
    ///    an unknown group is refused unless the entry may create it.
    #[test]
    fn t6_apply_rechecks_the_leaders_choice() {
        let mut s = PopState::default();
        let r = s.pop(1, "g", "t", 0, 10, false, &[(0, 0)], &[(0, 1)], bounds);
        assert_eq!(r, Reply::GroupNotFound("g".into()));
        let r = s.pop(
            2,
            "g",
            "t",
            0,
            10,
            true,
            &[(0, 5), (0, 200), (1, 3)],
            &[(0, 4)],
            |q| (q == 0).then_some((2, 100)),
        );
        assert!(popped(r).1.is_empty());
        assert_eq!(s.queues[&("g".into(), "t".into(), 0)].next, 4);
    }

    #[test]
    fn t7_handles_round_trip_and_name_their_broker() {
        let h = format_handle("broker-a.x", 3, 77, 12);
        assert_eq!(parse_handle("broker-a.x", &h), Ok((3, 77, 12)));
        assert!(parse_handle("broker-b", &h).is_err());
        assert!(
            parse_handle("b", "1.2.0.b").is_err(),
            "issued 0 is never a handle"
        );
        assert!(parse_handle("b", "nonsense").is_err());
    }

    #[test]
    fn t8_tag_filters() {
        assert_eq!(TagFilter::parse(" * "), Ok(TagFilter::All));
        assert_eq!(TagFilter::parse(""), Ok(TagFilter::All));
        let f = TagFilter::parse("TagA || TagB").unwrap();
        assert!(f.matches("TagA") && f.matches("TagB") && !f.matches("TagC") && !f.matches(""));
        assert!(f.may_match(tag_hash("TagB")) && !f.may_match(tag_hash("TagC")));
        assert!(TagFilter::parse("||").is_err());
        assert_ne!(tag_hash("a"), TAGS_MIXED);
    }

    #[test]
    fn t9_retry_ladder() {
        let d = GroupConfig::default();
        assert_eq!((d.retry_delay_ms(1), d.retry_delay_ms(2)), (1000, 5000));
        assert_eq!(d.retry_delay_ms(99), 7_200_000);
        assert_eq!(d.max_attempts(), 16);
        let c = GroupConfig {
            retry_delays_ms: vec![100, 200],
            ..Default::default()
        };
        assert_eq!((c.retry_delay_ms(1), c.retry_delay_ms(5)), (100, 200));
    }

    /// 10. A reset moves the cursor (held to the queue's bounds), drops the deliveries in flight
    ///     and dead letters waiting on that queue only, and refuses an unknown group; an ack of a
    ///     dropped delivery then names no delivery.
    #[test]
    fn t10_reset_moves_the_cursor_and_drops_what_is_in_flight() {
        let mut s = PopState::default();
        s.pop(
            10,
            "g",
            "t",
            1000,
            5000,
            true,
            &[(0, 0), (0, 1)],
            &[(0, 2)],
            bounds,
        );
        s.pop(11, "g", "t", 1000, 5000, true, &[(1, 0)], &[(1, 1)], bounds);
        s.dead_letters.insert(("g".into(), "t".into(), 0, 5), 16);
        assert_eq!(s.reset("g", "t", 0, 500, (0, 100)), Reply::Ok);
        let q0 = &s.queues[&("g".into(), "t".into(), 0)];
        assert_eq!(
            (q0.next, q0.inflight.len()),
            (100, 0),
            "held to the queue's end"
        );
        assert!(s.dead_letters.is_empty());
        let q1 = &s.queues[&("g".into(), "t".into(), 1)];
        assert_eq!(
            (q1.next, q1.inflight.len()),
            (1, 1),
            "another queue is left alone"
        );
        assert_eq!(
            s.ack("g", "t", 1000, &[(0, 0, 10)]),
            Reply::Acked(vec![false])
        );
        assert_eq!(s.reset("g", "t", 0, 0, (3, 100)), Reply::Ok);
        assert_eq!(
            s.queues[&("g".into(), "t".into(), 0)].next,
            3,
            "held to its start"
        );
        assert_eq!(
            s.reset("other", "t", 0, 0, (0, 100)),
            Reply::GroupNotFound("other".into())
        );
    }
    fn fifo(s: &mut PopState, index: u64, now: u64, picks: &[(u32, u64, u32)], to: u64) -> Popped {
        let req = PopReq {
            index,
            group: "g",
            topic: "t",
            now_ms: now,
            invisible_ms: 5000,
            create_group: true,
        };
        popped(s.pop_fifo(req, picks, &[(0, to)], bounds))
    }

    fn offsets(p: &Popped) -> Vec<u64> {
        p.1.iter().map(|d| d.1).collect()
    }

    /// 11. FIFO: a message group's next message is handed out only once the one before it is
    ///     acknowledged; another group of the queue goes on meanwhile, past the cursor, and the
    ///     cursor then passes over what was handed out ahead of it. A stale or racing proposal
    ///     hands out nothing out of order.
    #[test]
    fn t11_fifo_holds_a_group_until_its_message_is_acknowledged() {
        let (a, b) = (group_hash("A"), group_hash("B"));
        let mut s = PopState::default();
        // 0:A 1:A 2:B 3:B — the leader picks 0 and 2, and its cursor stops at 1 (A is held).
        let p = fifo(&mut s, 10, 1000, &[(0, 0, a), (0, 2, b)], 1);
        assert_eq!(offsets(&p), [0, 2]);
        let key = ("g".to_string(), "t".to_string(), 0);
        assert_eq!(s.queues[&key].next, 1, "stops at A's second message");
        assert_eq!(s.fifo[&key].ahead.iter().copied().collect::<Vec<_>>(), [2]);
        // A stale proposal picking A's and B's next messages while both are in flight: nothing.
        let p = fifo(&mut s, 11, 1000, &[(0, 1, a), (0, 3, b)], 1);
        assert!(p.1.is_empty(), "{p:?}");
        // A plain Pop of the same group cannot hand out what was handed out ahead either.
        let r = s.pop(12, "g", "t", 1000, 5000, true, &[(0, 2)], &[(0, 1)], bounds);
        assert!(popped(r).1.is_empty());
        // B acknowledged: B's next message goes; A still waits.
        assert_eq!(
            s.ack("g", "t", 1001, &[(0, 2, 10)]),
            Reply::Acked(vec![true])
        );
        let p = fifo(&mut s, 13, 1001, &[(0, 1, a), (0, 3, b)], 1);
        assert_eq!(offsets(&p), [3]);
        // A acknowledged: its second message goes, and the cursor passes everything handed out.
        assert_eq!(
            s.ack("g", "t", 1002, &[(0, 0, 10)]),
            Reply::Acked(vec![true])
        );
        let p = fifo(&mut s, 14, 1002, &[(0, 1, a)], 2);
        assert_eq!(offsets(&p), [1]);
        assert_eq!(s.queues[&key].next, 4);
        assert!(s.fifo[&key].ahead.is_empty());
        // Offset 0 was acknowledged: never handed out again.
        let p = fifo(&mut s, 15, 1003, &[(0, 0, a)], 4);
        assert!(p.1.is_empty());
    }

    /// 12. FIFO: a message redelivered after its deadline keeps its group held; a message out of
    ///     attempts (dead-lettered) releases it, as does a reset; a message without a group (hash
    ///     0) is never held back.
    #[test]
    fn t12_fifo_redelivery_dead_letters_and_messages_without_a_group() {
        let a = group_hash("A");
        let mut s = PopState::default();
        s.groups.insert(
            "g".into(),
            GroupConfig {
                max_attempts: 2,
                ..Default::default()
            },
        );
        let key = ("g".to_string(), "t".to_string(), 0);
        assert_eq!(offsets(&fifo(&mut s, 10, 1000, &[(0, 0, a)], 0)), [0]);
        // Past its deadline: the same message again (attempt 2); A's next still waits.
        let p = fifo(&mut s, 11, 6000, &[(0, 0, a), (0, 1, a)], 1);
        assert_eq!(p.1, vec![(0, 0, 2, 11000)]);
        assert_eq!(s.fifo[&key].holding[&a], 0);
        // Out of attempts: dead-lettered, and A's next message goes in the same entry.
        let p = fifo(&mut s, 12, 11000, &[(0, 0, a), (0, 1, a)], 1);
        assert_eq!((offsets(&p), p.2.clone()), (vec![1], vec![(0, 0)]));
        assert_eq!(s.fifo[&key].holding[&a], 1);
        // Messages without a group: all at once, held by nothing.
        let p = fifo(&mut s, 13, 11000, &[(0, 2, 0), (0, 3, 0)], 4);
        assert_eq!(offsets(&p), [2, 3]);
        // A reset forgets the group's order on that queue.
        assert_eq!(s.reset("g", "t", 0, 0, (0, 100)), Reply::Ok);
        assert!(!s.fifo.contains_key(&key));
        assert_eq!(offsets(&fifo(&mut s, 14, 11000, &[(0, 0, a)], 1)), [0]);
        // Deleting the topic forgets it too.
        s.drop_topic("t");
        assert!(s.fifo.is_empty());
    }
}
