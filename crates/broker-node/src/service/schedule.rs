//! Scheduled messages (DELAY topics): the send of a batch with delivery times (`Schedule`), the
//! leader's deliverer that moves due messages into their queues (`Deliver`), and recall (`Recall`).
//! What waits and what is due lives in [`crate::timer`], built by apply.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use raftmq_proto::v1::{SendRequest, SendResponse, SendResult, StoredMessage};
use raftmq_raft_log::Role;

use super::Broker;
use crate::command::{Command, CommandView, Reply, StoredBody, msg_id};
use crate::error::{Error, Internal, Refused, Result};
use crate::node::Node;
use crate::state::ORIGIN_PROPERTY;
use crate::timer::Waiting;
use raftmq_rocketmq_v2::convert::P_MSGID;

/// A message's delivery time, from its [`raftmq_proto::DELIVER_AT_PROPERTY`]: `None` when absent,
/// an error naming the message when it is not a number of milliseconds.
pub fn deliver_at(
    index: usize,
    properties: &std::collections::BTreeMap<String, String>,
) -> Result<Option<u64>, Refused> {
    let Some(v) = properties.get(raftmq_proto::DELIVER_AT_PROPERTY) else {
        return Ok(None);
    };
    v.trim()
        .parse::<u64>()
        .map(Some)
        .map_err(|_| Refused::IllegalDeliveryTime {
            reason: format!(
                "message {index}: property {} must be a delivery time in ms since the epoch, \
                 got {v:?}",
                raftmq_proto::DELIVER_AT_PROPERTY
            ),
        })
}

/// Checks the delivery times of a send to a topic of type `topic_type` at `now_ms`: per message
/// its time (a message without one is due at once), or the first broken rule. Only a DELAY topic
/// takes delivery times, at most `horizon_ms` ahead.
pub fn delivery_times(
    req: &SendRequest,
    topic_type: u32,
    now_ms: u64,
    horizon_ms: u64,
) -> Result<Option<Vec<u64>>, Refused> {
    // Only a DELAY topic keeps the times; any other is only checked (a `SendMany` asks this of
    // every part, one message each at 1,000 topics).
    let delay = topic_type == crate::state::TYPE_DELAY;
    let mut times = Vec::with_capacity(if delay { req.messages.len() } else { 0 });
    let mut any = false;
    for (i, m) in req.messages.iter().enumerate() {
        let at = deliver_at(i, &m.properties)?;
        if let Some(at) = at {
            any = true;
            if at > now_ms.saturating_add(horizon_ms) {
                return Err(Refused::IllegalDeliveryTime {
                    reason: format!(
                        "message {i}: delivery time {at} is {} s ahead, beyond the horizon of {} s \
                         (limits.delivery_horizon_ms)",
                        (at - now_ms) / 1000,
                        horizon_ms / 1000
                    ),
                });
            }
        }
        if delay {
            times.push(at.unwrap_or(now_ms));
        }
    }
    if !delay {
        return if any {
            Err(Refused::IllegalDeliveryTime {
                reason: format!(
                    "topic {} is of type {}: only a DELAY topic takes delivery times ({})",
                    req.topic,
                    crate::state::type_name(topic_type),
                    raftmq_proto::DELIVER_AT_PROPERTY
                ),
            })
        } else {
            Ok(None)
        };
    }
    Ok(Some(times))
}

/// Most messages one `Deliver` entry carries.
const DELIVER_BATCH_MAX: usize = 512;
/// Most bytes of bodies one `Deliver` entry carries.
const DELIVER_BYTES_MAX: usize = 4 << 20;
/// Most due messages the deliverer looks at per round.
const ROUND_MAX: usize = 8192;
/// The longest the leader's deliverer sleeps: it wakes at the earliest time waiting, or after
/// this to see new schedules.
const TICK: Duration = Duration::from_millis(100);

impl Broker {
    /// Stores a batch of a DELAY topic with the delivery times `times` (one per message).
    pub(super) async fn schedule_batch(
        &self,
        req: SendRequest,
        times: Vec<u64>,
        timestamp_ms: u64,
        id_property: String,
        a: &mut super::send::Awaiting,
    ) -> Result<SendResponse> {
        let messages = super::send::stored_bodies(req.messages);
        let cmd = Command::Schedule {
            topic: req.topic,
            queue: req.queue,
            producer_id: req.producer_id,
            sequence: req.sequence,
            timestamp_ms,
            id_property,
            deliver_at_ms: times.clone(),
            replaces: Vec::new(),
            messages,
        };
        let broker = &self.node.cfg.broker;
        match self.propose_send(cmd, a).await? {
            Reply::Scheduled {
                queue,
                count: n,
                log_index,
                duplicate,
            } => Ok(SendResponse {
                error: None,
                results: (0..n)
                    .map(|i| SendResult {
                        queue,
                        offset: 0,
                        msg_id: msg_id(broker, log_index, i),
                        deliver_at_ms: times.get(i as usize).copied().unwrap_or(0),
                    })
                    .collect(),
                duplicate,
                log_index,
            }),
            Reply::SentBefore(found) => Ok(SendResponse {
                error: None,
                results: found
                    .into_iter()
                    .zip(&times)
                    .map(|(f, at)| {
                        let (queue, offset) = f.unwrap_or((0, 0));
                        SendResult {
                            queue,
                            offset: if offset == crate::state::SCHEDULED {
                                0
                            } else {
                                offset
                            },
                            msg_id: String::new(),
                            deliver_at_ms: *at,
                        }
                    })
                    .collect(),
                duplicate: true,
                log_index: 0,
            }),
            reply => Err(unexpected(reply)),
        }
    }

    /// Cancels a scheduled message not yet delivered, named by its raftmq message id.
    pub(super) async fn recall_scheduled(&self, topic: &str, id: &str) -> Result<u64> {
        self.require_leader()?;
        // A new leader may not have applied the schedule the previous one acknowledged yet.
        self.node.member.read_barrier().await?;
        let broker = &self.node.cfg.broker;
        let Some((log_index, position)) = super::inspect::parse_msg_id(broker, id) else {
            return Err(Error::invalid(format!(
                "{id:?} is not a message id of broker group {broker} \
                 ({broker}-INDEX-POSITION, as the send returned it)"
            )));
        };
        let not_waiting = || Refused::NotScheduled {
            id: id.to_string(),
            topic: topic.to_string(),
        };
        let (w, _, _) = self
            .scheduled(log_index, position, topic)?
            .ok_or_else(not_waiting)?;
        let (at, queue) = (w.deliver_at_ms, w.queue);
        // Where it waits now (retention may have moved it).
        let (log_index, position) = (w.log_index, w.position);
        let (_, reply) = self
            .propose(Command::Recall {
                topic: topic.to_string(),
                queue,
                deliver_at_ms: at,
                log_index,
                position,
            })
            .await?;
        match reply {
            Reply::Ok => Ok(at),
            Reply::NotScheduled(_) => Err(not_waiting().into()),
            reply => Err(unexpected(reply)),
        }
    }

    /// The scheduled message named by raftmq id `id` when it still waits in `topic`: as stored,
    /// with `scheduled` set, offset 0 and the time of the send that stored it.
    pub(super) fn scheduled_message(&self, topic: &str, id: &str) -> Result<Option<StoredMessage>> {
        let Some((log_index, position)) = super::inspect::parse_msg_id(&self.node.cfg.broker, id)
        else {
            return Ok(None);
        };
        let Some((w, stored_ms, data)) = self.scheduled(log_index, position, topic)? else {
            return Ok(None);
        };
        let m = self.body_of(&data, &w)?;
        Ok(Some(StoredMessage {
            queue: w.queue,
            offset: 0,
            msg_id: id.to_string(),
            key: m.key,
            tag: m.tag,
            body: m.body,
            properties: m.properties.into_iter().collect(),
            store_timestamp_ms: stored_ms,
            log_index,
            scheduled: true,
        }))
    }

    /// The message at (`log_index`, `position`) when it is a message of `topic` still waiting:
    /// where it waits, the store time of its `Schedule` entry, and that entry (read once).
    fn scheduled(
        &self,
        log_index: u64,
        position: u32,
        topic: &str,
    ) -> Result<Option<(Waiting, u64, bytes::Bytes)>> {
        // Rolled by retention: it waits where it was stored again.
        let (log_index, position) = self
            .node
            .state_value(|s| s.timer.moved((log_index, position)))
            .map_or((log_index, position), |w| (w.log_index, w.position));
        let Some(data) = self.read_entry(log_index)? else {
            return Ok(None);
        };
        let Ok(CommandView::Schedule {
            topic: t,
            queue,
            timestamp_ms,
            deliver_at_ms,
            ..
        }) = CommandView::view(&data)
        else {
            return Ok(None);
        };
        let Some(&at) = deliver_at_ms.get(position as usize) else {
            return Ok(None);
        };
        let waits = t == topic
            && self
                .node
                .state_value(|s| s.timer.holds(at, (log_index, position), topic, queue));
        let w = Waiting {
            deliver_at_ms: at,
            log_index,
            position,
            topic: Arc::from(topic),
            queue,
            txn: None,
        };
        Ok(waits.then_some((w, timestamp_ms, data)))
    }

    /// The entry at `index`, if this node's log holds it.
    pub(super) fn read_entry(&self, index: u64) -> Result<Option<bytes::Bytes>> {
        let entries = self
            .node
            .member
            .read_entries(index, index + 1)
            .map_err(|err| Internal::ReadLog {
                index,
                reason: err.to_string(),
            })?;
        Ok(entries.into_iter().next().and_then(|(_, d)| d))
    }

    /// One round of the leader's deliverer: proposes a `Deliver` for every queue with messages
    /// due now. Returns how many messages it delivered.
    pub(super) async fn deliver_due(&self) -> Result<usize> {
        // Apply compares each time with this entry's clock, never a node's own.
        let now = super::wall_ms();
        let due: Vec<Waiting> = self
            .node
            .state_value(|s| s.timer.due(now, ROUND_MAX, |_| false));
        if due.is_empty() {
            return Ok(0);
        }
        let mut per_queue: BTreeMap<(Arc<str>, u32), Vec<Waiting>> = BTreeMap::new();
        for w in due {
            per_queue
                .entry((w.topic.clone(), w.queue))
                .or_default()
                .push(w);
        }
        let mut batches = Vec::new();
        for ((topic, queue), waiting) in per_queue {
            for chunk in waiting.chunks(DELIVER_BATCH_MAX) {
                batches.push((topic.clone(), queue, chunk.to_vec()));
            }
        }
        let mut delivered = 0;
        let jobs = batches
            .into_iter()
            .map(|(topic, queue, waiting)| async move {
                self.deliver_batch(&topic, queue, waiting, now).await
            });
        for r in futures::future::join_all(jobs).await {
            delivered += r?;
        }
        Ok(delivered)
    }

    /// The messages of `waiting`, read out of their `Schedule` entries (one read per entry).
    pub(super) fn read_waiting(&self, waiting: &[Waiting]) -> Result<Vec<StoredBody>> {
        let mut out = Vec::with_capacity(waiting.len());
        let mut cache: Option<(u64, bytes::Bytes)> = None;
        for w in waiting {
            let data = match &cache {
                Some((i, d)) if *i == w.log_index => d.clone(),
                _ => {
                    let d = self
                        .read_entry(w.log_index)?
                        .ok_or_else(|| Internal::ReadLog {
                            index: w.log_index,
                            reason: "a scheduled message's entry is not in the log".into(),
                        })?;
                    cache = Some((w.log_index, d.clone()));
                    d
                }
            };
            out.push(self.body_of(&data, w)?);
        }
        Ok(out)
    }

    /// The message `w` names in its `Schedule` entry `data`, with the id its send returned in
    /// `__rmq.msgid` (unless a client set its own), so a delivered or rolled message keeps it.
    fn body_of(&self, data: &bytes::Bytes, w: &Waiting) -> Result<StoredBody> {
        let Ok(CommandView::Schedule { messages: ms, .. }) = CommandView::view(data) else {
            return Err(Internal::NotASend { index: w.log_index }.into());
        };
        let Some(m) = ms.get(w.position as usize) else {
            return Err(Internal::NotASend { index: w.log_index }.into());
        };
        let mut properties: Vec<(String, String)> = m
            .properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if !properties.iter().any(|(k, _)| k == P_MSGID) {
            properties.push((
                P_MSGID.to_string(),
                msg_id(&self.node.cfg.broker, w.log_index, w.position),
            ));
        }
        // A half message keeps its transaction wherever it is stored again.
        if let Some(origin) = w.txn {
            set_origin(&mut properties, origin);
        }
        Ok(StoredBody {
            key: m.key.to_string(),
            tag: m.tag.to_string(),
            body: data.slice_ref(m.body),
            properties,
        })
    }

    /// Reads the messages of `waiting` and proposes one `Deliver` per [`DELIVER_BYTES_MAX`] of
    /// them.
    async fn deliver_batch(
        &self,
        topic: &str,
        queue: u32,
        waiting: Vec<Waiting>,
        now: u64,
    ) -> Result<usize> {
        let mut bodies = self.read_waiting(&waiting)?;
        for m in &mut bodies {
            m.properties.retain(|(k, _)| k != ORIGIN_PROPERTY);
        }
        let mut delivered = 0;
        for (ws, ms) in by_bytes(&waiting, bodies) {
            let due = ws
                .iter()
                .map(|w| (w.deliver_at_ms, w.log_index, w.position))
                .collect();
            delivered += self.propose_deliver(topic, queue, now, due, ms).await?;
        }
        Ok(delivered)
    }

    /// Moves the messages still waiting in entries at or below `upto` to new `Schedule` entries
    /// (same times, same ids), so retention can trim past them. Returns how many moved.
    pub async fn roll_upto(&self, upto: u64) -> Result<usize> {
        let waiting = self
            .node
            .state_value(|s| s.timer.waiting_upto(upto, ROUND_MAX));
        let mut per_queue: BTreeMap<(Arc<str>, u32), Vec<Waiting>> = BTreeMap::new();
        for w in waiting {
            per_queue
                .entry((w.topic.clone(), w.queue))
                .or_default()
                .push(w);
        }
        let mut moved = 0;
        for ((topic, queue), waiting) in per_queue {
            for chunk in waiting.chunks(DELIVER_BATCH_MAX) {
                let mut bodies = self.read_waiting(chunk)?;
                // Stored again, each keeps where it was first stored: its id still finds it.
                for (w, m) in chunk.iter().zip(&mut bodies) {
                    set_origin(&mut m.properties, (w.log_index, w.position));
                }
                for (ws, ms) in by_bytes(chunk, bodies) {
                    let cmd = Command::Schedule {
                        topic: topic.to_string(),
                        queue,
                        producer_id: 0,
                        sequence: 0,
                        timestamp_ms: super::wall_ms(),
                        id_property: String::new(),
                        deliver_at_ms: ws.iter().map(|w| w.deliver_at_ms).collect(),
                        replaces: ws.iter().map(|w| (w.log_index, w.position)).collect(),
                        messages: ms,
                    };
                    match self.propose(cmd).await?.1 {
                        Reply::Scheduled { count, .. } => moved += count as usize,
                        // Delivered or recalled meanwhile: nothing to move.
                        Reply::NotScheduled(_) => {}
                        reply => return Err(unexpected(reply)),
                    }
                }
            }
        }
        Ok(moved)
    }

    async fn propose_deliver(
        &self,
        topic: &str,
        queue: u32,
        now_ms: u64,
        due: Vec<(u64, u64, u32)>,
        messages: Vec<StoredBody>,
    ) -> Result<usize> {
        let (_, reply) = self
            .propose(Command::Deliver {
                topic: topic.to_string(),
                queue,
                now_ms,
                due,
                messages,
            })
            .await?;
        match reply {
            Reply::Sent { count, .. } => Ok(count as usize),
            // Recalled or delivered in between: the next round proposes what still waits.
            Reply::NotScheduled(_) => Ok(0),
            reply => Err(unexpected(reply)),
        }
    }
}

/// `waiting` and their `bodies` in runs of at most [`DELIVER_BYTES_MAX`] bytes of bodies (at
/// least one message each).
fn by_bytes(waiting: &[Waiting], bodies: Vec<StoredBody>) -> Vec<(Vec<Waiting>, Vec<StoredBody>)> {
    let mut out: Vec<(Vec<Waiting>, Vec<StoredBody>)> = Vec::new();
    let mut bytes = usize::MAX;
    for (w, b) in waiting.iter().zip(bodies) {
        if bytes.saturating_add(b.body.len()) > DELIVER_BYTES_MAX {
            out.push((Vec::new(), Vec::new()));
            bytes = 0;
        }
        bytes += b.body.len();
        let last = out.last_mut().expect("a run was started");
        last.0.push(w.clone());
        last.1.push(b);
    }
    out
}

/// Sets [`ORIGIN_PROPERTY`] to `origin` unless the message carries one already (it was moved
/// before: the first place stays).
fn set_origin(properties: &mut Vec<(String, String)>, (li, p): (u64, u32)) {
    if !properties.iter().any(|(k, _)| k == ORIGIN_PROPERTY) {
        properties.push((ORIGIN_PROPERTY.to_string(), format!("{li}.{p}")));
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

/// On the leader, delivers scheduled messages when they are due: it sleeps until the earliest
/// time waiting, at most [`TICK`].
pub fn spawn_deliverer(node: Arc<Node>) {
    tokio::spawn(async move {
        let broker = Broker { node };
        loop {
            // Until the earliest time waiting (a new schedule is seen within one TICK).
            let next = broker.node.state_value(|s| s.timer.next_due_ms());
            let wait = next.map_or(TICK, |at| {
                Duration::from_millis(at.saturating_sub(super::wall_ms())).min(TICK)
            });
            tokio::time::sleep(wait.max(Duration::from_millis(2))).await;
            if broker.node.member.status().role != Role::Leader {
                tokio::time::sleep(TICK).await;
                continue;
            }
            loop {
                match broker.deliver_due().await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("delivering scheduled messages: {e}");
                        break;
                    }
                }
            }
            // Something due that could not be delivered now (an error, a race): not at once.
            let now = super::wall_ms();
            if broker
                .node
                .state_value(|s| s.timer.next_due_ms())
                .is_some_and(|at| at <= now)
            {
                tokio::time::sleep(TICK).await;
            }
        }
    });
}
