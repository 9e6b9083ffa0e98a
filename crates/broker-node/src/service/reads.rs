//! The pull path: a long poll on the queue's tail, messages read out of the Raft log (the bodies
//! are slices of the entries read, never copied), and the read hint telling the consumer where to
//! pull next. What to suggest is decided by the pure [`crate::hint`]; this file gathers its inputs.

use std::time::{Duration, Instant};

use raftmq_proto::v1::{NodeRef, PullRequest, PullResponse, StoredMessage};
use raftmq_raft_log::Role;

use super::Broker;
use crate::command::{CommandView, msg_id};
use crate::error::{Error, Internal, Refused, Result};
use crate::hint::{self, FollowerView, NodeView, PullPosition};
use crate::metrics;

/// Appends to `msgs` (up to `max` in all) the messages of run `r` of `queue` from offset `from`,
/// read from its entry's bytes `data`: bodies are served as slices of the entry, never copied.
/// Public for the instruction-count bench (`examples/hot_paths.rs`).
pub fn run_messages(
    broker: &str,
    queue: u32,
    r: &crate::state::Run,
    data: &bytes::Bytes,
    from: u64,
    max: u32,
    msgs: &mut Vec<StoredMessage>,
) -> Result<()> {
    let view = CommandView::view(data);
    let Some((messages, timestamp_ms)) = view.as_ref().ok().and_then(|v| v.stored()) else {
        return Err(Error::from(Internal::NotASend { index: r.log_index }));
    };
    // The run's messages are `count` of the entry's from `position` (a `SendMany` holds several
    // queues' runs).
    let start = r.position as usize;
    let Some(run) = messages.get(start..start + r.count as usize) else {
        return Err(Error::from(Internal::NotASend { index: r.log_index }));
    };
    let skip = from.saturating_sub(r.first_offset) as usize;
    for (i, m) in run.iter().enumerate().skip(skip) {
        if msgs.len() as u32 >= max {
            break;
        }
        msgs.push(StoredMessage {
            queue,
            offset: r.first_offset + i as u64,
            msg_id: msg_id(broker, r.log_index, r.position + i as u32),
            key: m.key.to_string(),
            tag: m.tag.to_string(),
            body: data.slice_ref(m.body),
            properties: m
                .properties
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            store_timestamp_ms: timestamp_ms,
            log_index: r.log_index,
            scheduled: false,
        });
    }
    Ok(())
}

impl Broker {
    /// Answers a pull: the messages from the requested offset (waiting up to `max_wait_ms` at the
    /// tail for more) and the node to pull from next.
    pub(super) async fn pull_messages(&self, req: &PullRequest) -> Result<PullResponse> {
        self.check_topic(&req.topic, req.queue)?;
        let l = &self.node.cfg.limits;
        let max = req.max_messages.clamp(1, l.pull_messages_max);
        let deadline =
            Instant::now() + Duration::from_millis(req.max_wait_ms.min(l.pull_wait_ms_max) as u64);
        let mut watch = self.node.member.watch();
        loop {
            let (min_offset, max_offset) = {
                let st = self.node.state();
                match st.queue(&req.topic, req.queue) {
                    Some(q) => (q.min_offset, q.next_offset),
                    None => {
                        return Err(Refused::TopicDeleted {
                            topic: req.topic.clone(),
                        }
                        .into());
                    }
                }
            };
            if req.offset < min_offset || req.offset > max_offset {
                return Err(Refused::OffsetOutOfRange {
                    offset: req.offset,
                    min: min_offset,
                    max: max_offset,
                }
                .into());
            }
            if req.offset == max_offset && Instant::now() < deadline {
                // Long poll: wait for the next apply, then look again.
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = tokio::time::timeout(left, watch.changed()).await;
                continue;
            }
            let (messages, missing) = self.read_messages(&req.topic, req.queue, req.offset, max)?;
            let next_offset = messages.last().map(|m| m.offset + 1).unwrap_or(req.offset);
            let needed_index = messages
                .last()
                .map(|m| m.log_index)
                .unwrap_or_else(|| self.node.member.status_with(|st| st.applied));
            let decided = self.hint(
                &req.consumer_id,
                req.queue,
                next_offset,
                max_offset,
                needed_index,
            );
            // Nothing served because this node no longer holds the entry (it installed a snapshot
            // past it): the leader does. The status is read only then, off the common path.
            let not_held = missing && messages.is_empty();
            let leader = not_held
                .then(|| self.node.member.status().leader_address())
                .flatten();
            let h = hint::redirect_when_not_held(decided, not_held, leader);
            self.node.pulled.add(messages.len() as u64);
            metrics::observe_pull(messages.len() as u64, h.node_id != self.node.cfg.node_id);
            return Ok(PullResponse {
                error: None,
                messages,
                next_offset,
                min_offset,
                max_offset,
                served_by: None, // set by the caller, who answers failures too
                suggested: Some(NodeRef {
                    node_id: h.node_id,
                    address: h.address,
                }),
                suggest_reason: h.reason.into(),
            });
        }
    }

    /// Reads up to `max` messages of a queue from `offset`, out of the log. Returns the messages and
    /// whether a needed entry was missing here (purged, or before a snapshot this node installed).
    pub(super) fn read_messages(
        &self,
        topic: &str,
        queue: u32,
        offset: u64,
        max: u32,
    ) -> Result<(Vec<StoredMessage>, bool)> {
        let runs: Vec<crate::state::Run> = {
            let st = self.node.state();
            let Some(q) = st.queue(topic, queue) else {
                return Ok((Vec::new(), false));
            };
            let mut out = Vec::new();
            let mut want = max as u64;
            let mut o = offset;
            while want > 0 {
                let Some(r) = q.find(o) else { break };
                out.push(r);
                let end = r.first_offset + r.count as u64;
                want = want.saturating_sub(end - o);
                o = end;
            }
            // An offset below every indexed run was not replicated to this node (it installed a
            // snapshot past it): the leader holds it.
            if out.is_empty() && offset < q.next_offset {
                return Ok((Vec::new(), true));
            }
            out
        };
        let mut msgs = Vec::new();
        let mut o = offset;
        for r in runs {
            let entries = self
                .node
                .member
                .read_entries(r.log_index, r.log_index + 1)
                .map_err(|err| Internal::ReadLog {
                    index: r.log_index,
                    reason: err.to_string(),
                })?;
            let Some((_, Some(data))) = entries.into_iter().next() else {
                return Ok((msgs, true));
            };
            run_messages(&self.node.cfg.broker, queue, &r, &data, o, max, &mut msgs)?;
            o = r.first_offset + r.count as u64;
        }
        Ok((msgs, false))
    }

    /// The read hint for a consumer at `next_offset`: this node's view of itself and its group,
    /// handed to the pure [`hint::decide`].
    fn hint(
        &self,
        consumer: &str,
        queue: u32,
        next_offset: u64,
        max_offset: u64,
        needed_index: u64,
    ) -> hint::Hint {
        let n = &self.node;
        let view = n.member.status_with(|st| {
            if st.role == Role::Leader {
                NodeView::Leader {
                    followers: st
                        .peers
                        .iter()
                        .map(|p| FollowerView {
                            node_id: p.node_id,
                            address: p.address.clone(),
                            last_ack_ms: p.last_ack_ms,
                            matched: p.matched.unwrap_or(0),
                        })
                        .collect(),
                    produce_msgs_per_sec: n.produced.per_sec(),
                }
            } else {
                NodeView::Follower {
                    leader: st.leader_address(),
                    millis_since_leader_contact: st.millis_since_leader_contact,
                    apply_backlog: st.committed.saturating_sub(st.applied),
                }
            }
        });
        let pos = PullPosition {
            consumer_id: consumer,
            queue,
            next_offset,
            max_offset,
            needed_index,
        };
        hint::decide(
            (n.cfg.node_id, &n.address),
            &view,
            &pos,
            &n.cfg.read_hint,
            n.election_timeout_ms(),
        )
    }
}
