//! The POP path (RocketMQ 5 receive / ack): the leader chooses what a receive hands out from the
//! applied state and the consume-queue index (tag hashes, so a filter reads no body), proposes it
//! as one `Pop` entry per receive, and answers with what apply granted. Acks, invisibility changes
//! and dead letters are entries too. The replicated rules are in [`crate::pop`]; this file gathers
//! inputs and reads messages.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use raftmq_proto::v1::{
    ChangeInvisibleRequest, ChangeInvisibleResponse, DeadLetterRequest, GroupConfig as GroupProto,
    PopAckRequest, PopAckResponse, PopAckResult, PopRequest, PopResponse, PoppedMessage,
    StoredMessage,
};
use raftmq_raft_log::Role;

use super::Broker;
use crate::command::{Command, Reply, StoredBody};
use crate::config::check_name;
use crate::error::{Error, Internal, Refused, Result};
use crate::node::{AckWaiter, Node};
use crate::pop::{self, TagFilter, dlq_topic, format_handle, parse_handle};

/// How many offsets past the cursor one receive looks at for messages matching its filter.
const FILTER_SCAN_MAX: u64 = 65_536;
/// How many offsets past the cursor a FIFO group's receive looks at: also how far past a held
/// message group's next message the other groups of its queue can go on.
const FIFO_SCAN_MAX: u64 = 8192;
/// Offsets a receive that found nothing to hand out moves its cursors over before it proposes
/// the move alone (it always does at the end of its wait).
const ADVANCE_ONLY_MIN: u64 = 4096;
/// A receive re-checks at least this often for deliveries whose deadline passed.
const RECHECK: Duration = Duration::from_millis(200);
/// Most handles one folded `Ack` entry carries.
const ACKS_PER_ENTRY: usize = 4096;
/// Dead letters moved per round of the mover.
const DEAD_LETTERS_PER_ROUND: usize = 64;

static ROTATE: AtomicUsize = AtomicUsize::new(0);

/// Milliseconds since the epoch by this node's clock: only ever stamped into an entry, which
/// apply then orders by the replicated clock.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What one receive proposes.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// (queue, offset, message-group hash: 0 unless the group is FIFO and the message has one).
    picks: Vec<(u32, u64, u32)>,
    advance: Vec<(u32, u64)>,
    /// The earliest deadline among the group's deliveries in flight, to wake up for.
    next_deadline: Option<u64>,
    /// Offsets the cursors move over (picked or not matching the filter).
    skipped: u64,
}

impl Plan {
    /// Whether to propose it: anything to hand out, or cursors to move far enough (or at the end
    /// of the wait) to be worth an entry. A group whose filter matches little would otherwise
    /// propose an entry for every apply that wakes its waiting receives.
    fn worth_proposing(&self, last_look: bool) -> bool {
        !self.picks.is_empty()
            || (!self.advance.is_empty() && (last_look || self.skipped >= ADVANCE_ONLY_MIN))
    }
}

fn check_group(group: &str) -> Result<()> {
    check_name("group", group).map_err(Error::invalid)?;
    check_name("the group's dead-letter topic", &dlq_topic(group)).map_err(Error::invalid)
}

fn handle(broker: &str, h: &str) -> Result<(u32, u64, u64)> {
    parse_handle(broker, h).map_err(|reason| Refused::InvalidReceiptHandle { reason }.into())
}

impl Broker {
    /// The leader's choice for a receive: deliveries past their deadline first, then new
    /// messages that may match the filter, up to `max`. For a FIFO group (`fifo`), a new message
    /// only when no message of its group is in flight or picked before it in this plan; the
    /// cursor then moves only up to the first message held back.
    #[allow(clippy::too_many_arguments)]
    fn plan_pop(
        &self,
        group: &str,
        topic: &str,
        queue: Option<u32>,
        max: usize,
        filter: &TagFilter,
        now: u64,
        fifo: bool,
    ) -> Result<Plan> {
        let st = self.node.state();
        let Some(t) = st.topics.get(topic) else {
            return Err(Refused::TopicNotFound {
                topic: topic.to_string(),
                broker: Some(self.node.cfg.broker.clone()),
            }
            .into());
        };
        let n = t.queues.len();
        let queues: Vec<u32> = match queue {
            Some(q) => vec![q],
            None => {
                let start = ROTATE.fetch_add(1, Ordering::Relaxed);
                (0..n).map(|i| ((start + i) % n) as u32).collect()
            }
        };
        let clock = now.max(st.pop.clock_ms);
        let mut plan = Plan::default();
        for q in queues {
            let Some(qs) = t.queues.get(q as usize) else {
                continue;
            };
            let key = (group.to_string(), topic.to_string(), q);
            let pq = st.pop.queues.get(&key);
            let fq = st.pop.fifo.get(&key).filter(|_| fifo);
            if let Some(pq) = pq {
                for (off, inf) in &pq.inflight {
                    if inf.deadline_ms <= clock {
                        if plan.picks.len() < max {
                            plan.picks.push((q, *off, 0));
                        }
                    } else {
                        plan.next_deadline = Some(
                            plan.next_deadline
                                .map_or(inf.deadline_ms, |d| d.min(inf.deadline_ms)),
                        );
                    }
                }
            }
            let next = pq.map_or(qs.min_offset, |p| p.next).max(qs.min_offset);
            if plan.picks.len() >= max {
                continue;
            }
            // An offset this node no longer indexes cannot be read here either: passed over.
            let scan = if fifo { FIFO_SCAN_MAX } else { FILTER_SCAN_MAX };
            let end = qs.next_offset.min(next + scan);
            let mut held: HashSet<u32> = fq
                .map(|f| f.holding.keys().copied().collect())
                .unwrap_or_default();
            let mut first_held = None;
            let o = qs.scan_tags(
                next,
                end,
                |h| filter.may_match(h),
                |o| {
                    let mut hash = 0;
                    if fifo {
                        if fq.is_some_and(|f| f.ahead.contains(&o)) {
                            return true; // handed out past the cursor before
                        }
                        hash = qs.group_at(o);
                        if hash != 0 && !held.insert(hash) {
                            first_held.get_or_insert(o);
                            return true; // its group's message before it is not done
                        }
                    }
                    plan.picks.push((q, o, hash));
                    plan.picks.len() < max
                },
            );
            let o = first_held.unwrap_or(o);
            if o > next {
                plan.advance.push((q, o));
                plan.skipped += o - next;
            }
        }
        Ok(plan)
    }

    /// Answers a receive: waits (long poll) until something can be handed out, proposes one `Pop`
    /// and returns the messages apply granted.
    pub(super) async fn pop_messages(
        &self,
        req: PopRequest,
        caller_timeout: Option<Duration>,
    ) -> Result<PopResponse> {
        check_group(&req.group)?;
        check_name("topic", &req.topic).map_err(Error::invalid)?;
        let filter = TagFilter::parse(&req.tag_expression).map_err(Error::invalid)?;
        self.await_leader(caller_timeout).await?;
        self.check_topic(&req.topic, req.queue.unwrap_or(0))?;
        let rmq = &self.node.cfg.rocketmq;
        let exists = self
            .node
            .state_value(|s| s.pop.groups.contains_key(&req.group));
        if !exists && !rmq.auto_create_groups {
            return Err(Refused::GroupNotFound { group: req.group }.into());
        }
        let max = req
            .max_messages
            .clamp(1, self.node.cfg.limits.pull_messages_max) as usize;
        let mut wait = Duration::from_millis(req.max_wait_ms.min(rmq.receive_wait_ms_max) as u64);
        if let Some(t) = caller_timeout {
            // Answer before the caller gives up, with time for the reply to travel.
            wait = wait.min(t.saturating_sub(Duration::from_millis(300)));
        }
        let deadline = Instant::now() + wait;
        let mut watch = self.node.member.watch();
        loop {
            let now = wall_ms();
            let fifo = self
                .node
                .state_value(|s| s.pop.groups.get(&req.group).is_some_and(|g| g.fifo));
            let plan = self.plan_pop(&req.group, &req.topic, req.queue, max, &filter, now, fifo)?;
            let last_look = Instant::now() >= deadline;
            if plan.worth_proposing(last_look) {
                let (group, topic) = (req.group.clone(), req.topic.clone());
                let (create_group, invisible_ms) = (rmq.auto_create_groups, req.invisible_ms);
                let cmd = if fifo {
                    Command::PopFifo {
                        group,
                        topic,
                        now_ms: now,
                        invisible_ms,
                        create_group,
                        picks: plan.picks,
                        advance: plan.advance,
                    }
                } else {
                    Command::Pop {
                        group,
                        topic,
                        now_ms: now,
                        invisible_ms,
                        create_group,
                        picks: plan.picks.iter().map(|&(q, o, _)| (q, o)).collect(),
                        advance: plan.advance,
                    }
                };
                let (_, reply) = self.propose(cmd).await?;
                let Reply::Popped {
                    issued,
                    delivered,
                    dead,
                } = reply
                else {
                    return Err(unexpected(reply));
                };
                if !dead.is_empty() {
                    self.node.dead_letters.notify_one();
                }
                let messages = self
                    .deliver(&req.group, &req.topic, &filter, issued, delivered)
                    .await?;
                if !messages.is_empty() || last_look {
                    return Ok(PopResponse {
                        error: None,
                        messages,
                    });
                }
                continue; // what it found was taken by a racing receive or filtered out
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(PopResponse::default());
            }
            let until_due = plan
                .next_deadline
                .map(|d| Duration::from_millis(d.saturating_sub(now)))
                .unwrap_or(RECHECK);
            let nap = left.min(until_due.clamp(Duration::from_millis(5), RECHECK));
            let _ = tokio::time::timeout(nap, watch.changed()).await;
            self.require_leader()?;
        }
    }

    /// Reads the granted messages; one whose tag only shared its hash with the filter's is
    /// acknowledged at once instead of delivered.
    async fn deliver(
        &self,
        group: &str,
        topic: &str,
        filter: &TagFilter,
        issued: u64,
        mut granted: Vec<(u32, u64, u32, u64)>,
    ) -> Result<Vec<PoppedMessage>> {
        granted.sort_unstable();
        let broker = self.node.cfg.broker.clone();
        let mut out = Vec::with_capacity(granted.len());
        let mut collisions = Vec::new();
        let mut i = 0;
        while i < granted.len() {
            // A run of consecutive offsets of one queue is read in one go.
            let (q, first) = (granted[i].0, granted[i].1);
            let mut j = i + 1;
            while j < granted.len() && granted[j].0 == q && granted[j].1 == first + (j - i) as u64 {
                j += 1;
            }
            let (msgs, _) = self.read_messages(topic, q, first, (j - i) as u32)?;
            let by_offset: BTreeMap<u64, StoredMessage> =
                msgs.into_iter().map(|m| (m.offset, m)).collect();
            for &(q, off, attempt, until) in &granted[i..j] {
                match by_offset.get(&off) {
                    Some(m) if filter.matches(&m.tag) => out.push(PoppedMessage {
                        message: Some(m.clone()),
                        receipt_handle: format_handle(&broker, q, off, issued),
                        delivery_attempt: attempt,
                        invisible_until_ms: until,
                    }),
                    // A hash collision, or no longer readable here: never delivered to this group.
                    _ => collisions.push((q, off, issued)),
                }
            }
            i = j;
        }
        if !collisions.is_empty() {
            self.propose(Command::Ack {
                group: group.to_string(),
                topic: topic.to_string(),
                now_ms: wall_ms(),
                handles: collisions,
            })
            .await?;
        }
        Ok(out)
    }

    /// Acknowledges deliveries: one result per handle, in order.
    pub(super) async fn pop_ack(&self, req: PopAckRequest) -> Result<PopAckResponse> {
        check_group(&req.group)?;
        check_name("topic", &req.topic).map_err(Error::invalid)?;
        self.require_leader()?;
        let broker = &self.node.cfg.broker;
        let parsed: Vec<Result<(u32, u64, u64)>> = req
            .receipt_handles
            .iter()
            .map(|h| handle(broker, h))
            .collect();
        let handles: Vec<(u32, u64, u64)> = parsed.iter().filter_map(|p| p.clone().ok()).collect();
        let mut acked = Vec::new().into_iter();
        if !handles.is_empty() {
            acked = self
                .fold_ack(req.group.clone(), req.topic.clone(), handles)
                .await?
                .into_iter();
        }
        let results = req
            .receipt_handles
            .into_iter()
            .zip(parsed)
            .map(|(h, p)| {
                let error = match p {
                    Err(e) => Some(e.into()),
                    Ok((q, o, i)) if !acked.next().unwrap_or(false) => Some(
                        Error::from(Refused::InvalidReceiptHandle {
                            reason: format!(
                                "no delivery of queue {q} offset {o} issued at {i} is in flight \
                                 (acknowledged already, handed out again, or replaced)"
                            ),
                        })
                        .into(),
                    ),
                    Ok(_) => None,
                };
                PopAckResult {
                    receipt_handle: h,
                    error,
                }
            })
            .collect();
        Ok(PopAckResponse {
            error: None,
            results,
        })
    }

    /// Acknowledges `handles` in one `Ack` entry shared with the other acks of the same group and
    /// topic waiting meanwhile: the official clients ack one message per call, and one entry per
    /// message would cost the group an entry each. The first ack goes at once; those arriving
    /// while it is in flight go together next (at most [`ACKS_PER_ENTRY`] handles per entry). A
    /// batch is proposed by a task of its own, so a caller that gives up strands no one.
    async fn fold_ack(
        &self,
        group: String,
        topic: String,
        handles: Vec<(u32, u64, u64)>,
    ) -> Result<Vec<bool>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let key = (group, topic);
        let start = {
            let mut lanes = self
                .node
                .ack_lanes
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let lane = lanes.entry(key.clone()).or_default();
            lane.waiting.push((handles, tx));
            !std::mem::replace(&mut lane.in_flight, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.drain_acks(key).await });
        }
        rx.await.unwrap_or_else(|_| {
            Err(Internal::UnexpectedReply {
                reply: "the ack batch carrying these handles was dropped".into(),
            }
            .into())
        })
    }

    async fn drain_acks(&self, key: (String, String)) {
        loop {
            let batch: Vec<AckWaiter> = {
                let mut lanes = self
                    .node
                    .ack_lanes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                let Some(lane) = lanes.get_mut(&key) else {
                    return;
                };
                if lane.waiting.is_empty() {
                    lanes.remove(&key);
                    return;
                }
                let mut n = 0;
                let take = lane
                    .waiting
                    .iter()
                    .take_while(|(h, _)| {
                        n += h.len();
                        n <= ACKS_PER_ENTRY || n == h.len()
                    })
                    .count()
                    .max(1);
                lane.waiting.drain(..take).collect()
            };
            let handles: Vec<(u32, u64, u64)> =
                batch.iter().flat_map(|(h, _)| h.iter().copied()).collect();
            let outcome = self
                .propose(Command::Ack {
                    group: key.0.clone(),
                    topic: key.1.clone(),
                    now_ms: wall_ms(),
                    handles,
                })
                .await
                .and_then(|(_, reply)| match reply {
                    Reply::Acked(a) => Ok(a),
                    other => Err(unexpected(other)),
                });
            let mut at = 0;
            for (h, tx) in batch {
                let mine = match &outcome {
                    Ok(a) => Ok(a
                        .get(at..at + h.len())
                        .map(<[bool]>::to_vec)
                        .unwrap_or_default()),
                    Err(e) => Err(e.clone()),
                };
                at += h.len();
                let _ = tx.send(mine);
            }
        }
    }

    pub(super) async fn change_invisible(
        &self,
        req: ChangeInvisibleRequest,
    ) -> Result<ChangeInvisibleResponse> {
        check_group(&req.group)?;
        check_name("topic", &req.topic).map_err(Error::invalid)?;
        let (queue, offset, issued) = handle(&self.node.cfg.broker, &req.receipt_handle)?;
        self.require_leader()?;
        let (_, reply) = self
            .propose(Command::ChangeInvisible {
                group: req.group,
                topic: req.topic,
                queue,
                offset,
                issued,
                invisible_ms: req.invisible_ms,
                now_ms: wall_ms(),
            })
            .await?;
        match reply {
            Reply::Changed {
                issued,
                invisible_until_ms,
            } => Ok(ChangeInvisibleResponse {
                error: None,
                receipt_handle: format_handle(&self.node.cfg.broker, queue, offset, issued),
                invisible_until_ms,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Moves a delivery to the dead-letter topic now (a push consumer out of attempts).
    pub(super) async fn dead_letter_now(&self, req: DeadLetterRequest) -> Result<()> {
        check_group(&req.group)?;
        check_name("topic", &req.topic).map_err(Error::invalid)?;
        let (queue, offset, issued) = handle(&self.node.cfg.broker, &req.receipt_handle)?;
        self.require_leader()?;
        let messages = self.dead_letter_body(&req.topic, queue, offset, None)?;
        let (_, reply) = self
            .propose(Command::DeadLetter {
                group: req.group,
                topic: req.topic,
                queue,
                offset,
                issued,
                timestamp_ms: wall_ms(),
                messages,
            })
            .await?;
        match Error::from_reply(&reply) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The message to store in a dead-letter topic: the original, with where it came from.
    fn dead_letter_body(
        &self,
        topic: &str,
        queue: u32,
        offset: u64,
        attempts: Option<u32>,
    ) -> Result<Vec<StoredBody>> {
        let (msgs, _) = self.read_messages(topic, queue, offset, 1)?;
        Ok(msgs
            .into_iter()
            .filter(|m| m.offset == offset)
            .map(|m| {
                let mut properties: Vec<(String, String)> = m.properties.into_iter().collect();
                properties.sort();
                properties.push((
                    "__rmq.dlq.origin".into(),
                    format!("{topic}/{queue}/{offset}"),
                ));
                properties.push(("__rmq.dlq.origin_msg_id".into(), m.msg_id));
                if let Some(a) = attempts {
                    properties.push(("__rmq.dlq.attempts".into(), a.to_string()));
                }
                StoredBody {
                    key: m.key,
                    tag: m.tag,
                    body: m.body,
                    properties,
                }
            })
            .collect())
    }

    /// One round of the dead-letter mover: stores messages out of attempts in their group's
    /// dead-letter topic. Returns how many it proposed.
    async fn move_dead_letters(&self) -> Result<usize> {
        let waiting: Vec<((String, String, u32, u64), u32)> = self.node.state_value(|s| {
            s.pop
                .dead_letters
                .iter()
                .take(DEAD_LETTERS_PER_ROUND)
                .map(|(k, v)| (k.clone(), *v))
                .collect()
        });
        for ((group, topic, queue, offset), attempts) in &waiting {
            let messages = self
                .dead_letter_body(topic, *queue, *offset, Some(*attempts))
                .unwrap_or_default();
            self.propose(Command::DeadLetter {
                group: group.clone(),
                topic: topic.clone(),
                queue: *queue,
                offset: *offset,
                issued: 0,
                timestamp_ms: wall_ms(),
                messages,
            })
            .await?;
        }
        Ok(waiting.len())
    }

    pub(super) fn group_list(&self) -> Vec<GroupProto> {
        self.node.state_value(|s| {
            s.pop
                .groups
                .iter()
                .map(|(name, c)| GroupProto {
                    name: name.clone(),
                    max_attempts: c.max_attempts(),
                    retry_delays_ms: c.retry_delays_ms.clone(),
                    fifo: c.fifo,
                })
                .collect()
        })
    }

    pub(super) async fn upsert_group(&self, g: GroupProto, update: bool) -> Result<GroupProto> {
        check_group(&g.name)?;
        if g.max_attempts > 1000 {
            return Err(Error::invalid(format!(
                "max_attempts must be 0 (the default, {}) to 1000, got {}",
                pop::MAX_ATTEMPTS_DEFAULT,
                g.max_attempts
            )));
        }
        if let Some(bad) = g
            .retry_delays_ms
            .iter()
            .find(|d| **d == 0 || **d > pop::INVISIBLE_MS_MAX)
        {
            return Err(Error::invalid(format!(
                "retry delays must be 1 ms to {} ms, got {bad}",
                pop::INVISIBLE_MS_MAX
            )));
        }
        self.require_leader()?;
        self.propose_for_error(Command::UpsertGroup {
            name: g.name.clone(),
            max_attempts: g.max_attempts,
            retry_delays_ms: g.retry_delays_ms.clone(),
            fifo: g.fifo,
            update,
        })
        .await?;
        Ok(self
            .group_list()
            .into_iter()
            .find(|x| x.name == g.name)
            .unwrap_or(g))
    }

    pub(super) async fn delete_group(&self, name: String) -> Result<()> {
        check_group(&name)?;
        self.require_leader()?;
        self.propose_for_error(Command::DeleteGroup { name }).await
    }
}

fn unexpected(reply: Reply) -> Error {
    Error::from_reply(&reply).unwrap_or_else(|| {
        Internal::UnexpectedReply {
            reply: format!("{reply:?}"),
        }
        .into()
    })
}

/// On the leader, moves messages out of attempts to their dead-letter topics: woken by a receive
/// that found some, and every second in case a new leader inherited them.
pub fn spawn_dead_letter_mover(node: Arc<Node>) {
    tokio::spawn(async move {
        let broker = Broker { node };
        loop {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), broker.node.dead_letters.notified())
                    .await;
            if broker.node.member.status().role != Role::Leader {
                continue;
            }
            loop {
                match broker.move_dead_letters().await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("moving dead letters: {e}");
                        break;
                    }
                }
            }
        }
    });
}
