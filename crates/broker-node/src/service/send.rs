//! The send path: a batch checked against the limits ([`validate_send`], pure), then refused early
//! when this leader cannot store it (disk full, cut off, too many in flight), then proposed and
//! answered once committed — or as soon as its fate is no longer this node's to tell.

use std::time::{Duration, Instant};

use raftmq_proto::v1::{SendManyRequest, SendManyResponse, SendRequest, SendResponse, SendResult};
use raftmq_raft_log::Role;

use super::Broker;
use crate::command::{Command, Reply, SendPart, StoredBody, msg_id};
use crate::config::Limits;
use crate::error::{Error, Internal, Refused, Result, Unavailable};
use crate::metrics;

/// Checks a send's batch against the limits: at least one message, at most `batch_messages_max`,
/// each body and each message's properties within their limits, and the whole batch (bodies,
/// properties, keys, tags) within `batch_bytes_max`. The first broken rule is the answer.
pub fn validate_send(req: &SendRequest, limits: &Limits) -> Result<(), Refused> {
    if req.messages.is_empty() {
        return Err(Refused::EmptySend);
    }
    if req.messages.len() > limits.batch_messages_max {
        return Err(Refused::TooManyMessages {
            count: req.messages.len(),
            max: limits.batch_messages_max,
        });
    }
    let mut total = 0usize;
    for (index, m) in req.messages.iter().enumerate() {
        if m.body.len() > limits.body_bytes_max {
            return Err(Refused::BodyTooLarge {
                index,
                bytes: m.body.len(),
                max: limits.body_bytes_max,
            });
        }
        let props: usize = m.properties.iter().map(|(k, v)| k.len() + v.len()).sum();
        if props > limits.properties_bytes_max {
            return Err(Refused::PropertiesTooLarge {
                index,
                bytes: props,
                max: limits.properties_bytes_max,
            });
        }
        total += m.body.len() + props + m.key.len() + m.tag.len();
    }
    if total > limits.batch_bytes_max {
        return Err(Refused::BatchTooLarge {
            bytes: total,
            max: limits.batch_bytes_max,
        });
    }
    Ok(())
}

impl Broker {
    /// Stores a batch and answers with its offsets, or the reason it was not stored.
    pub(super) async fn send_batch(
        &self,
        req: SendRequest,
        caller_timeout: Option<Duration>,
    ) -> Result<SendResponse> {
        let t0 = Instant::now();
        // Leadership first: a follower that has not yet applied a new topic must redirect the
        // producer, not tell it the topic does not exist.
        self.await_leader(caller_timeout).await?;
        self.check_topic(&req.topic, req.queue)?;
        validate_send(&req, &self.node.cfg.limits)?;
        let (_permit, mut awaiting) = self.room_to_propose()?;
        let count = req.messages.len() as u64;
        let timestamp_ms = super::wall_ms();
        // A DELAY topic's batch waits in the timer (`Schedule`); a delivery time on any other
        // topic is refused.
        let topic_type = self.node.state_value(|s| s.topic_type(&req.topic));
        check_message_groups(&req, topic_type)?;
        let mut times = super::schedule::delivery_times(
            &req,
            topic_type,
            timestamp_ms,
            self.node.cfg.limits.delivery_horizon_ms,
        )?;
        if topic_type == crate::state::TYPE_TRANSACTION {
            // Half messages: stored, invisible until their transaction commits; first checked
            // with their producer an interval from now.
            self.require_tag(super::txn::END_TXN_TAG).await?;
            let at = timestamp_ms.saturating_add(self.node.cfg.limits.txn_check_interval_ms);
            times = Some(vec![at; req.messages.len()]);
        }
        if let Some(times) = times {
            let id_property = req.dedup_property.clone();
            let r = self
                .schedule_batch(req, times, timestamp_ms, id_property, &mut awaiting)
                .await?;
            if !r.duplicate {
                self.node.produced.add(count);
            }
            metrics::observe_send(t0.elapsed(), count);
            return Ok(r);
        }
        let messages = stored_bodies(req.messages);
        // A `SendOnce` (tag 12) only once every member applies it; until then every copy is
        // stored, as before.
        let id_property = (!req.dedup_property.is_empty()
            && self.group_command_tags() > SEND_ONCE_TAG)
            .then_some(req.dedup_property);
        let broker = &self.node.cfg.broker;
        let Some(id_property) = id_property else {
            let cmd = Command::Send {
                topic: req.topic,
                queue: req.queue,
                producer_id: req.producer_id,
                sequence: req.sequence,
                timestamp_ms,
                messages,
            };
            let (queue, first_offset, n, log_index, duplicate) =
                self.propose_send(cmd, &mut awaiting).await?.sent()?;
            if !duplicate {
                self.node.produced.add(count);
            }
            metrics::observe_send(t0.elapsed(), n as u64);
            return Ok(SendResponse {
                error: None,
                results: (0..n)
                    .map(|i| SendResult {
                        queue,
                        offset: first_offset + i as u64,
                        msg_id: msg_id(broker, log_index, i),
                        deliver_at_ms: 0,
                    })
                    .collect(),
                duplicate,
                log_index,
            });
        };
        // Per message: where it is, once known. A `SendOnce` that finds some of its ids stored
        // before stores nothing; the others are proposed again (same producer id and sequence:
        // nothing was stored under them), until each message is placed.
        let mut placed: Vec<Option<SendResult>> = vec![None; messages.len()];
        let mut duplicate = false;
        let mut log_index = 0;
        let mut stored = 0u64;
        loop {
            let rest: Vec<usize> = (0..placed.len()).filter(|&i| placed[i].is_none()).collect();
            if rest.is_empty() {
                break;
            }
            let cmd = Command::SendOnce {
                topic: req.topic.clone(),
                queue: req.queue,
                producer_id: req.producer_id,
                sequence: req.sequence,
                timestamp_ms,
                id_property: id_property.clone(),
                messages: rest.iter().map(|&i| messages[i].clone()).collect(),
            };
            match self.propose_send(cmd, &mut awaiting).await? {
                Reply::SentBefore(found) => {
                    duplicate = true;
                    for (&i, f) in rest.iter().zip(found) {
                        if let Some((queue, offset)) = f {
                            placed[i] = Some(SendResult {
                                queue,
                                offset,
                                msg_id: String::new(),
                                deliver_at_ms: 0,
                            });
                        }
                    }
                }
                reply => {
                    let (queue, first, n, li, dup) = reply.sent()?;
                    duplicate |= dup;
                    log_index = li;
                    if !dup {
                        stored += n as u64;
                    }
                    // Stored now: the messages of `rest`, in order. A copy from the producer
                    // window: the whole batch as first stored under this sequence. Either way
                    // every message is placed, so the loop ends.
                    let at = if dup {
                        (0..placed.len()).collect()
                    } else {
                        rest
                    };
                    for (k, i) in at.into_iter().enumerate() {
                        placed[i] = Some(if k < n as usize {
                            SendResult {
                                queue,
                                offset: first + k as u64,
                                msg_id: msg_id(broker, li, k as u32),
                                deliver_at_ms: 0,
                            }
                        } else {
                            SendResult::default()
                        });
                    }
                }
            }
        }
        self.node.produced.add(stored);
        metrics::observe_send(t0.elapsed(), count);
        Ok(SendResponse {
            error: None,
            results: placed.into_iter().map(Option::unwrap_or_default).collect(),
            duplicate,
            log_index,
        })
    }

    /// Whether this leader can take a send now: its disk is not full, it is not cut off from its
    /// group, and a slot of `limits.inflight` is free (held by the returned permit while the
    /// send waits). Also returns what the proposed send watches while it waits.
    fn room_to_propose(&self) -> Result<(tokio::sync::OwnedSemaphorePermit, Awaiting)> {
        if self
            .node
            .disk_full
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(Unavailable::DiskFull {
                watermark_pct: self.node.cfg.retention.full_watermark_pct,
            }
            .into());
        }
        // CheckQuorum: a leader cut off from a majority of its group cannot commit anything.
        // Refuse before proposing (so nothing is stored), and the producer turns to the other
        // nodes at once.
        let mut cut_off = self.node.member.cut_off();
        if *cut_off.borrow_and_update() {
            return Err(Unavailable::CutOff.into());
        }
        let Ok(permit) = self.node.inflight.clone().try_acquire_owned() else {
            return Err(Unavailable::Busy.into());
        };
        // The term this node leads as it proposes: the send's fate is no longer this node's to
        // tell once that leadership ends (stepped down, or a new term began).
        let mut leadership = self.node.member.leadership();
        let led_term = {
            let (role, term) = *leadership.borrow_and_update();
            (role == Role::Leader).then_some(term)
        };
        Ok((
            permit,
            Awaiting {
                led_term,
                leadership,
                cut_off,
            },
        ))
    }

    /// Stores several queues' batches: in one entry (`SendMany`) once every member applies it,
    /// each part as the `Send` of its own otherwise. A part that is not a plain batch (a client
    /// id to deduplicate by, delivery times, a TRANSACTION topic) is sent on its own. A part's
    /// refusal is in its response; a refusal that a retry elsewhere may cure (not the leader,
    /// disk full, cut off, busy) is the whole call's, so the producer retries every part (each
    /// keeps its producer id and sequence, so none is stored twice).
    pub(super) async fn send_many(
        &self,
        req: SendManyRequest,
        caller_timeout: Option<Duration>,
    ) -> Result<SendManyResponse> {
        let t0 = Instant::now();
        self.await_leader(caller_timeout).await?;
        let limits = &self.node.cfg.limits;
        validate_send_many(&req, limits)?;
        let one_entry = self.require_tag(SEND_MANY_TAG).await.is_ok();
        let timestamp_ms = super::wall_ms();
        let mut out: Vec<SendResponse> = vec![SendResponse::default(); req.parts.len()];
        let mut together = Vec::new();
        let mut alone = Vec::new();
        // Each part's topic and type, read under one lock.
        let found: Vec<(Result<()>, u32)> = {
            let st = self.node.state();
            req.parts
                .iter()
                .map(|p| {
                    let checked = self.check_topic_in(&st, &p.topic, p.queue);
                    (checked, st.topic_type(&p.topic))
                })
                .collect()
        };
        for ((i, part), (checked, ty)) in req.parts.into_iter().enumerate().zip(found) {
            let plain = checked
                .and_then(|()| Ok(validate_send(&part, limits)?))
                .and_then(|()| {
                    check_message_groups(&part, ty)?;
                    let times = super::schedule::delivery_times(
                        &part,
                        ty,
                        timestamp_ms,
                        limits.delivery_horizon_ms,
                    )?;
                    Ok(times.is_none()
                        && ty != crate::state::TYPE_TRANSACTION
                        && part.dedup_property.is_empty())
                });
            match plain {
                Err(e) if e.is_retriable() => return Err(e),
                Err(e) => out[i].error = Some(e.into()),
                Ok(true) if one_entry => together.push((i, part)),
                Ok(_) => alone.push((i, part)),
            }
        }
        let alone = futures::future::join_all(
            alone
                .into_iter()
                .map(|(i, part)| async move { (i, self.send_batch(part, caller_timeout).await) }),
        );
        let together = async {
            if together.is_empty() {
                return Ok(0);
            }
            self.send_together(together, timestamp_ms, &mut out).await
        };
        let (alone, together) = tokio::join!(alone, together);
        let together = together?;
        if together > 0 {
            metrics::observe_send(t0.elapsed(), together);
        }
        for (i, r) in alone {
            match r {
                Ok(r) => out[i] = r,
                Err(e) if e.is_retriable() => return Err(e),
                Err(e) => out[i].error = Some(e.into()),
            }
        }
        Ok(SendManyResponse {
            error: None,
            parts: out,
        })
    }

    /// Proposes `parts` (each with its index in the call) as one `SendMany` and answers each
    /// into `out`. Returns how many messages the answers place.
    async fn send_together(
        &self,
        parts: Vec<(usize, SendRequest)>,
        timestamp_ms: u64,
        out: &mut [SendResponse],
    ) -> Result<u64> {
        let (_permit, mut awaiting) = self.room_to_propose()?;
        let mut at = Vec::with_capacity(parts.len());
        let mut send_parts = Vec::with_capacity(parts.len());
        let mut messages = Vec::new();
        for (i, p) in parts {
            at.push(i);
            send_parts.push(SendPart {
                topic: p.topic,
                queue: p.queue,
                producer_id: p.producer_id,
                sequence: p.sequence,
                count: p.messages.len() as u32,
            });
            // Into the one list directly: a list per part was an allocation per message at
            // 1,000 topics.
            messages.extend(p.messages.into_iter().map(stored_body));
        }
        let cmd = Command::SendMany {
            timestamp_ms,
            parts: send_parts,
            messages,
        };
        let Reply::SentMany(replies) = self.propose_send(cmd, &mut awaiting).await? else {
            return Err(Internal::UnexpectedReply {
                reply: "not a SendMany's reply".into(),
            }
            .into());
        };
        let broker = &self.node.cfg.broker;
        let mut placed = 0;
        for (i, (reply, position)) in at.into_iter().zip(replies) {
            out[i] = match reply.sent() {
                Ok((queue, first_offset, n, log_index, duplicate)) => {
                    if !duplicate {
                        self.node.produced.add(n as u64);
                    }
                    placed += n as u64;
                    SendResponse {
                        error: None,
                        results: (0..n)
                            .map(|k| SendResult {
                                queue,
                                offset: first_offset + k as u64,
                                msg_id: msg_id(broker, log_index, position + k),
                                deliver_at_ms: 0,
                            })
                            .collect(),
                        duplicate,
                        log_index,
                    }
                }
                Err(e) => SendResponse {
                    error: Some(e.into()),
                    ..Default::default()
                },
            };
        }
        Ok(placed)
    }

    /// Proposes a send and waits for its reply. A leader cut off while the send waits cannot
    /// commit it, and one that stopped leading cannot tell whether it will be: answer as soon as
    /// either shows (the outcome is then unknown: the producer retries with the same id and
    /// sequence elsewhere, and the producer window stores it once) instead of at the caller's
    /// timeout.
    pub(super) async fn propose_send(&self, cmd: Command, a: &mut Awaiting) -> Result<Reply> {
        let Awaiting {
            led_term,
            leadership,
            cut_off,
        } = a;
        let led_term = *led_term;
        let leadership_ended = async {
            match led_term {
                Some(term) => leadership
                    .wait_for(|&(role, t)| role != Role::Leader || t != term)
                    .await
                    .map(|_| ()),
                None => std::future::pending().await,
            }
        };
        let (_, reply) = tokio::select! {
            r = self.propose(cmd) => r?,
            Ok(_) = cut_off.wait_for(|c| *c) => {
                return Err(Unavailable::CutOffAwaitingCommit.into())
            }
            Ok(()) = leadership_ended => {
                return Err(Unavailable::SteppedDownAwaitingCommit.into())
            }
        };
        Ok(reply)
    }
}

/// Every message sent to a FIFO topic names its message group
/// ([`raftmq_proto::MESSAGE_GROUP_PROPERTY`]).
pub fn check_message_groups(req: &SendRequest, topic_type: u32) -> Result<(), Refused> {
    if topic_type != crate::state::TYPE_FIFO {
        return Ok(());
    }
    match req.messages.iter().position(|m| {
        m.properties
            .get(raftmq_proto::MESSAGE_GROUP_PROPERTY)
            .is_none_or(|g| g.is_empty())
    }) {
        None => Ok(()),
        Some(i) => Err(Refused::InvalidArgument {
            reason: format!(
                "message {i}: topic {} is a FIFO topic, so each message needs a message group \
                 (property {}; raftmq produce --message-group G)",
                req.topic,
                raftmq_proto::MESSAGE_GROUP_PROPERTY
            ),
        }),
    }
}

/// A request's messages as the command stores them (no body is copied).
pub fn stored_bodies(messages: Vec<raftmq_proto::v1::Message>) -> Vec<StoredBody> {
    messages.into_iter().map(stored_body).collect()
}

/// A message as the command stores it (its body not copied). Inlined: called, it cost the
/// leader's decode 127 instructions per message (`scripts/instructions`).
#[inline(always)]
pub fn stored_body(m: raftmq_proto::v1::Message) -> StoredBody {
    StoredBody {
        key: m.key,
        tag: m.tag,
        body: m.body,
        properties: m.properties.into_iter().collect(),
    }
}

/// The tag of `Command::SendOnce`: a group applies it once every member's level is above it.
const SEND_ONCE_TAG: u32 = 12;
const _: () = assert!(SEND_ONCE_TAG < crate::command::COMMAND_TAGS);
/// The tag of `Command::SendMany`: a group stores a call's parts in one entry once every member
/// applies it, and each in an entry of its own until then.
const SEND_MANY_TAG: u32 = 22;
const _: () = assert!(SEND_MANY_TAG < crate::command::COMMAND_TAGS);

/// Checks a `SendMany` as a whole: at least one part, and all its parts together within one
/// batch's limits (`batch_messages_max` messages, `batch_bytes_max` bytes counting each part's
/// topic and `raftmq_proto::limits::SEND_PART_OVERHEAD_BYTES`). Each part is then checked as a send of its own.
pub fn validate_send_many(req: &SendManyRequest, limits: &Limits) -> Result<(), Refused> {
    if req.parts.is_empty() {
        return Err(Refused::EmptySend);
    }
    let count: usize = req.parts.iter().map(|p| p.messages.len()).sum();
    if count > limits.batch_messages_max {
        return Err(Refused::TooManyMessages {
            count,
            max: limits.batch_messages_max,
        });
    }
    let bytes: usize = req
        .parts
        .iter()
        .map(|p| {
            p.topic.len()
                + raftmq_proto::limits::SEND_PART_OVERHEAD_BYTES
                + p.messages
                    .iter()
                    .map(raftmq_proto::limits::message_bytes)
                    .sum::<usize>()
        })
        .sum();
    if bytes > limits.batch_bytes_max {
        return Err(Refused::BatchTooLarge {
            bytes,
            max: limits.batch_bytes_max,
        });
    }
    Ok(())
}

/// What a proposed send watches while it waits: the term this node led when it proposed, and
/// the watches that tell the send's fate is no longer this node's to tell.
pub(super) struct Awaiting {
    led_term: Option<u64>,
    leadership: tokio::sync::watch::Receiver<(Role, u64)>,
    cut_off: tokio::sync::watch::Receiver<bool>,
}

impl Reply {
    /// A `Sent` reply's (queue, first offset, count, log index, duplicate), else its error.
    fn sent(self) -> Result<(u32, u64, u32, u64, bool)> {
        match self {
            Reply::Sent {
                queue,
                first_offset,
                count,
                log_index,
                duplicate,
            } => Ok((queue, first_offset, count, log_index, duplicate)),
            reply => Err(Error::from_reply(&reply).unwrap_or_else(|| {
                Internal::UnexpectedReply {
                    reply: format!("{reply:?}"),
                }
                .into()
            })),
        }
    }
}

#[cfg(test)]
mod tests {

    use raftmq_proto::v1::Message;

    use super::*;

    #[test]
    fn a_fifo_topic_needs_a_message_group_on_every_message() {
        let mut grouped = Message::default();
        grouped
            .properties
            .insert(raftmq_proto::MESSAGE_GROUP_PROPERTY.into(), "g".into());
        let req = |ms: Vec<Message>| SendRequest {
            topic: "f".into(),
            messages: ms,
            ..Default::default()
        };
        assert!(check_message_groups(&req(vec![grouped.clone()]), crate::state::TYPE_FIFO).is_ok());
        assert!(check_message_groups(&req(vec![Message::default()]), 0).is_ok());
        let e = check_message_groups(
            &req(vec![grouped, Message::default()]),
            crate::state::TYPE_FIFO,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "message 1: topic f is a FIFO topic, so each message needs a message group"
            ),
            "{e}"
        );
    }

    /// Small limits, so each boundary is cheap to reach.
    fn limits() -> Limits {
        Limits {
            body_bytes_max: 10,
            batch_messages_max: 3,
            batch_bytes_max: 30,
            properties_bytes_max: 6,
            ..Limits::default()
        }
    }

    fn msg(body: usize, props: &[(&str, &str)]) -> Message {
        Message {
            body: vec![b'x'; body].into(),
            properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn send(messages: Vec<Message>) -> SendRequest {
        SendRequest {
            topic: "t".into(),
            messages,
            ..Default::default()
        }
    }

    /// 1. A send without messages is an invalid argument.
    #[test]
    fn t1_empty_batch_is_refused() {
        assert_eq!(
            validate_send(&send(vec![]), &limits()),
            Err(Refused::EmptySend)
        );
    }

    /// 2. One message past `batch_messages_max` is too many; exactly the limit passes.
    #[test]
    fn t2_message_count_limit_is_inclusive() {
        assert_eq!(
            validate_send(&send(vec![msg(1, &[]); 4]), &limits()),
            Err(Refused::TooManyMessages { count: 4, max: 3 })
        );
        assert_eq!(
            validate_send(&send(vec![msg(1, &[]); 3]), &limits()),
            Ok(())
        );
    }

    /// 3. A body one byte past `body_bytes_max` is refused and names its message; exactly the
    ///    limit passes.
    #[test]
    fn t3_body_limit_is_inclusive_and_names_the_message() {
        assert_eq!(
            validate_send(&send(vec![msg(1, &[]), msg(11, &[])]), &limits()),
            Err(Refused::BodyTooLarge {
                index: 1,
                bytes: 11,
                max: 10
            })
        );
        assert_eq!(validate_send(&send(vec![msg(10, &[])]), &limits()), Ok(()));
    }

    /// 4. Properties count keys plus values; one byte past `properties_bytes_max` is refused,
    ///    exactly the limit passes.
    #[test]
    fn t4_properties_limit_counts_keys_and_values() {
        assert_eq!(
            validate_send(&send(vec![msg(1, &[("abc", "defg")])]), &limits()),
            Err(Refused::PropertiesTooLarge {
                index: 0,
                bytes: 7,
                max: 6
            })
        );
        assert_eq!(
            validate_send(&send(vec![msg(1, &[("abc", "def")])]), &limits()),
            Ok(())
        );
    }

    /// 5. The batch counts bodies, properties, keys and tags; one byte past `batch_bytes_max` is
    ///    refused even when every message is within its own limits, exactly the limit passes.
    #[test]
    fn t5_batch_bytes_limit_counts_every_part() {
        let mut tagged = msg(9, &[("k", "v")]);
        tagged.key = "kk".into();
        tagged.tag = "t".into(); // 9 + 2 + 2 + 1 = 14 bytes
        let at_limit = send(vec![tagged.clone(), tagged.clone(), msg(2, &[])]); // 14 + 14 + 2
        assert_eq!(validate_send(&at_limit, &limits()), Ok(()));
        let over = send(vec![tagged.clone(), tagged, msg(3, &[])]); // 31
        assert_eq!(
            validate_send(&over, &limits()),
            Err(Refused::BatchTooLarge { bytes: 31, max: 30 })
        );
    }

    /// 6. A valid batch passes, and the messages clients see keep their wording.
    #[test]
    fn t6_valid_batch_passes_and_refusals_keep_their_text() {
        assert_eq!(
            validate_send(&send(vec![msg(5, &[("a", "b")]), msg(0, &[])]), &limits()),
            Ok(())
        );
        let text = |r: Refused| Error::from(r).to_proto();
        let e = text(Refused::EmptySend);
        assert_eq!(e.code(), raftmq_proto::v1::ErrorCode::InvalidArgument);
        assert_eq!(e.message, "a send carries at least one message");
        let e = text(Refused::TooManyMessages { count: 4, max: 3 });
        assert_eq!(e.code(), raftmq_proto::v1::ErrorCode::MessageTooLarge);
        assert_eq!(e.message, "batch of 4 messages exceeds the limit of 3");
        assert_eq!(
            text(Refused::BodyTooLarge {
                index: 1,
                bytes: 11,
                max: 10
            })
            .message,
            "message 1: body of 11 bytes exceeds the limit of 10 bytes"
        );
        assert_eq!(
            text(Refused::PropertiesTooLarge {
                index: 0,
                bytes: 7,
                max: 6
            })
            .message,
            "message 0: properties of 7 bytes exceed the limit of 6 bytes"
        );
        assert_eq!(
            text(Refused::BatchTooLarge { bytes: 31, max: 30 }).message,
            "batch of 31 bytes exceeds the limit of 30 bytes"
        );
    }
}
