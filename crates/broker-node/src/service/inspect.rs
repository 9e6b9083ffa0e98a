//! `InspectService`: the operator views of a broker group — a topic's queues, a consumer group's
//! progress, messages by id, key or store time. Answered by the leader only, from the applied
//! state and the indexes apply keeps (`state::Run`'s store times, [`crate::lookup`]), reading from
//! the log only the entries that may hold an asked-for message.

use std::collections::BTreeSet;
use std::time::Instant;

use raftmq_proto::v1::inspect_service_server::InspectService;
use raftmq_proto::v1::{
    FindMessagesRequest, FindMessagesResponse, GroupQueueStatus, GroupStatusRequest,
    GroupStatusResponse, QueueStats, StoredMessage, TopicStatusRequest, TopicStatusResponse,
    find_messages_request::By,
};
use raftmq_security::acl::Resource;
use tonic::{Request, Response, Status};

use super::{Broker, wall_ms};
use crate::config::check_name;
use crate::error::{Error, Refused, Result};
use crate::pop::dlq_topic;
use crate::state::{BrokerState, keys_of};

/// Messages a lookup answers with when the request names no limit, and at most.
pub const FIND_LIMIT_DEFAULT: u32 = 32;
pub const FIND_LIMIT_MAX: u32 = 1000;

#[tonic::async_trait]
impl InspectService for Broker {
    async fn topic_status(
        &self,
        req: Request<TopicStatusRequest>,
    ) -> Result<Response<TopicStatusResponse>, Status> {
        authorize!(
            self,
            req,
            TopicStatusResponse,
            Get,
            [Resource::topic(&req.get_ref().topic)]
        );
        let reply = self
            .topic_stats(req.get_ref().topic.as_str(), req.get_ref().at_ms)
            .unwrap_or_else(|err| TopicStatusResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }

    async fn group_status(
        &self,
        req: Request<GroupStatusRequest>,
    ) -> Result<Response<GroupStatusResponse>, Status> {
        authorize!(
            self,
            req,
            GroupStatusResponse,
            Get,
            [
                Resource::group(&req.get_ref().group),
                Resource::topic(&req.get_ref().topic)
            ]
        );
        let req = req.into_inner();
        let reply = self
            .group_progress(&req.group, &req.topic)
            .unwrap_or_else(|err| GroupStatusResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }

    async fn find_messages(
        &self,
        req: Request<FindMessagesRequest>,
    ) -> Result<Response<FindMessagesResponse>, Status> {
        authorize!(
            self,
            req,
            FindMessagesResponse,
            Get,
            [Resource::topic(&req.get_ref().topic)]
        );
        let reply = self
            .find(req.into_inner())
            .unwrap_or_else(|err| FindMessagesResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }
}

impl Broker {
    fn topic_stats(&self, topic: &str, at_ms: Option<u64>) -> Result<TopicStatusResponse> {
        check_name("topic", topic).map_err(Error::invalid)?;
        self.require_leader()?;
        let st = self.node.state();
        let t = st.topics.get(topic).ok_or_else(|| self.no_topic(topic))?;
        Ok(TopicStatusResponse {
            error: None,
            queues: t
                .queues
                .iter()
                .enumerate()
                .map(|(i, q)| QueueStats {
                    queue: i as u32,
                    min_offset: q.min_offset,
                    max_offset: q.next_offset,
                    bytes: q.bytes,
                    last_store_ms: q.runs.last().map(|r| r.store_ms),
                    offset_at: at_ms.map(|ms| q.offset_at_time(ms)),
                })
                .collect(),
            message_type: st.topic_type(topic) as i32,
            now_ms: wall_ms(),
            scheduled: st.timer.topic(topic).0,
            next_delivery_ms: st.timer.topic(topic).1,
        })
    }

    fn no_topic(&self, topic: &str) -> Error {
        Refused::TopicNotFound {
            topic: topic.to_string(),
            broker: Some(self.node.cfg.broker.clone()),
        }
        .into()
    }

    /// A consumer group's progress on every queue it has state for here, or on every queue of
    /// `topic` when one is named.
    fn group_progress(&self, group: &str, topic: &str) -> Result<GroupStatusResponse> {
        check_name("group", group).map_err(Error::invalid)?;
        if !topic.is_empty() {
            check_name("topic", topic).map_err(Error::invalid)?;
        }
        self.require_leader()?;
        let now = wall_ms();
        let members = self.node.members(group, Instant::now());
        let st = self.node.state();
        let mut queues: BTreeSet<(String, u32)> = BTreeSet::new();
        if topic.is_empty() {
            let of_group =
                |(g, t, q): &(String, String, u32)| (g == group).then(|| (t.clone(), *q));
            queues.extend(st.offsets.keys().filter_map(of_group));
            queues.extend(st.pop.queues.keys().filter_map(of_group));
        } else {
            let t = st.topics.get(topic).ok_or_else(|| self.no_topic(topic))?;
            queues.extend((0..t.queues.len() as u32).map(|q| (topic.to_string(), q)));
        }
        let pop = st.pop.groups.contains_key(group);
        if queues.is_empty() && members.is_empty() && !pop {
            return Err(Refused::GroupNotFound {
                group: group.to_string(),
            }
            .into());
        }
        let dead_lettered = dead_lettered(&st, group);
        Ok(GroupStatusResponse {
            error: None,
            queues: queues
                .into_iter()
                .filter_map(|(t, q)| queue_progress(&st, group, &t, q, now))
                .collect(),
            members,
            pop,
            dead_lettered,
            now_ms: now,
        })
    }

    fn find(&self, req: FindMessagesRequest) -> Result<FindMessagesResponse> {
        check_name("topic", &req.topic).map_err(Error::invalid)?;
        let by = req
            .by
            .ok_or_else(|| Error::invalid("name a message id, a key or a time range"))?;
        self.require_leader()?;
        let limit = match req.limit {
            0 => FIND_LIMIT_DEFAULT,
            n => n.min(FIND_LIMIT_MAX),
        } as usize;
        let topic = req.topic.as_str();
        let own_id_asked = match &by {
            By::MsgId(id) => parse_msg_id(&self.node.cfg.broker, id).map(|_| id.clone()),
            _ => None,
        };
        // Candidates (queue, offset, count): runs of offsets to read, each message checked once
        // read.
        type Check = Box<dyn Fn(&StoredMessage) -> bool + Send>;
        let (candidates, check): (Vec<(u32, u64, u32)>, Check) = {
            let st = self.node.state();
            let t = st.topics.get(topic).ok_or_else(|| self.no_topic(topic))?;
            let queues = t.queues.iter().enumerate().map(|(i, q)| (i as u32, q));
            match by {
                By::MsgId(id) => {
                    if let Some(at) = self.own_id(&st, topic, &id) {
                        (vec![(at.0, at.1, 1)], Box::new(|_: &StoredMessage| true))
                    } else {
                        let c = queues
                            .flat_map(|(i, q)| {
                                q.ids
                                    .candidates(&id, q.min_offset)
                                    .into_iter()
                                    .map(move |o| (i, o, 1))
                            })
                            .collect();
                        (
                            c,
                            Box::new(move |m: &StoredMessage| {
                                m.properties.values().any(|v| *v == id)
                            }),
                        )
                    }
                }
                By::Key(key) => {
                    if key.is_empty() {
                        return Err(Error::invalid("the key to find is empty"));
                    }
                    let c = queues
                        .flat_map(|(i, q)| {
                            q.keys
                                .candidates(&key, q.min_offset)
                                .into_iter()
                                .map(move |o| (i, o, 1))
                        })
                        .collect();
                    (
                        c,
                        Box::new(move |m: &StoredMessage| {
                            let props: Vec<(&str, &str)> = m
                                .properties
                                .iter()
                                .map(|(k, v)| (k.as_str(), v.as_str()))
                                .collect();
                            keys_of(&m.key, &props).contains(&key.as_str())
                        }),
                    )
                }
                By::Stored(r) => {
                    if r.from_ms > r.to_ms {
                        return Err(Error::invalid(format!(
                            "the time range ends ({}) before it starts ({})",
                            r.to_ms, r.from_ms
                        )));
                    }
                    // Per queue, the offsets from the first stored at `from`: the store times
                    // are checked as the messages are read (at most `limit` + 1 per queue).
                    let c = queues
                        .map(|(i, q)| (i, q.offset_at_time(r.from_ms), limit as u32 + 1))
                        .collect();
                    (
                        c,
                        Box::new(move |m: &StoredMessage| {
                            (r.from_ms..=r.to_ms).contains(&m.store_timestamp_ms)
                        }),
                    )
                }
            }
        };
        let mut found = Vec::new();
        let mut truncated = false;
        for (queue, offset, count) in candidates {
            let (msgs, _) = self.read_messages(topic, queue, offset, count)?;
            found.extend(msgs.into_iter().filter(|m| check(m)));
        }
        // A scheduled message's id, before it is delivered: it waits in the timer.
        if found.is_empty()
            && let Some(id) = &own_id_asked
            && let Some(m) = self.scheduled_message(topic, id)?
        {
            found.push(m);
        }
        found.sort_by_key(|m| (m.store_timestamp_ms, m.queue, m.offset));
        if found.len() > limit {
            found.truncate(limit);
            truncated = true;
        }
        Ok(FindMessagesResponse {
            error: None,
            messages: found,
            truncated,
        })
    }

    /// Where a raftmq message id of this broker group (`BROKER-INDEX-POSITION`) puts its message
    /// in `topic`: the run its entry stored, found by a binary search over each queue's runs.
    fn own_id(&self, st: &BrokerState, topic: &str, id: &str) -> Option<(u32, u64)> {
        let (index, position) = parse_msg_id(&self.node.cfg.broker, id)?;
        let t = st.topics.get(topic)?;
        // An entry of several queues (`SendMany`) holds a run of each: the one whose positions
        // take in `position`.
        t.queues.iter().enumerate().find_map(|(i, q)| {
            let at = q.runs.partition_point(|r| r.log_index < index);
            q.runs
                .get(at)
                .filter(|r| {
                    r.log_index == index && (r.position..r.position + r.count).contains(&position)
                })
                .map(|r| (i as u32, r.first_offset + (position - r.position) as u64))
        })
    }
}

/// The Raft index and position a raftmq message id of broker group `broker` names
/// (`crate::command::msg_id`'s format), or `None` for another group's id or a client's.
pub fn parse_msg_id(broker: &str, id: &str) -> Option<(u64, u32)> {
    let rest = id.strip_prefix(broker)?.strip_prefix('-')?;
    let (index, position) = rest.split_once('-')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if index.len() != 16 || !hex(index) || !hex(position) {
        return None;
    }
    Some((
        u64::from_str_radix(index, 16).ok()?,
        u32::from_str_radix(position, 16).ok()?,
    ))
}

/// The (topic, queue) pairs `group` has state for: a committed offset or POP progress.
pub fn group_queues(st: &BrokerState, group: &str) -> BTreeSet<(String, u32)> {
    let of_group = |(g, t, q): &(String, String, u32)| (g == group).then(|| (t.clone(), *q));
    let mut queues: BTreeSet<(String, u32)> = st.offsets.keys().filter_map(of_group).collect();
    queues.extend(st.pop.queues.keys().filter_map(of_group));
    queues
}

/// Every consumer group with state here (a committed offset, POP progress or a POP config).
pub fn groups(st: &BrokerState) -> BTreeSet<String> {
    let mut g: BTreeSet<String> = st.offsets.keys().map(|(g, _, _)| g.clone()).collect();
    g.extend(st.pop.queues.keys().map(|(g, _, _)| g.clone()));
    g.extend(st.pop.groups.keys().cloned());
    g
}

/// Messages held in `group`'s dead-letter topic.
pub fn dead_lettered(st: &BrokerState, group: &str) -> u64 {
    st.topics.get(&dlq_topic(group)).map_or(0, |t| {
        t.queues.iter().map(|q| q.next_offset - q.min_offset).sum()
    })
}

/// One queue's progress of `group`: its pull offset and POP deliveries, and the store time of its
/// oldest message not consumed. `None` when the topic or queue is gone.
pub fn queue_progress(
    st: &BrokerState,
    group: &str,
    topic: &str,
    queue: u32,
    now_ms: u64,
) -> Option<GroupQueueStatus> {
    let q = st.queue(topic, queue)?;
    let key = (group.to_string(), topic.to_string(), queue);
    let committed = st.offsets.get(&key).copied();
    let pop = st.pop.queues.get(&key);
    let waiting = st
        .pop
        .dead_letters
        .range((group.to_string(), topic.to_string(), queue, 0)..)
        .take_while(|((g, t, qq, _), _)| g == group && t == topic && *qq == queue)
        .count() as u64;
    let (mut inflight, mut retrying, mut visible_again) = (0, 0, 0);
    if let Some(p) = pop {
        for f in p.inflight.values() {
            if f.deadline_ms > now_ms {
                inflight += 1;
            } else {
                visible_again += 1;
            }
            if f.attempt > 1 {
                retrying += 1;
            }
        }
    }
    // The first offset not consumed: a pull group's commit; a POP group's oldest delivery not
    // acknowledged, else its cursor.
    let consumed_to = match (committed, pop) {
        (Some(c), _) => Some(c),
        (None, Some(p)) => Some(p.inflight.keys().next().copied().unwrap_or(p.next)),
        (None, None) => None,
    }
    .map(|o| o.max(q.min_offset));
    let oldest_unconsumed_ms = consumed_to
        .filter(|o| *o < q.next_offset)
        .and_then(|o| q.find(o))
        .map(|r| r.store_ms);
    let pop_next = pop.map(|p| p.next.max(q.min_offset));
    let ready = pop_next.map_or(0, |n| q.next_offset.saturating_sub(n)) + visible_again;
    let lag = match (committed, pop_next) {
        (Some(c), _) => q.next_offset.saturating_sub(c.max(q.min_offset)),
        (None, Some(_)) => ready + inflight,
        (None, None) => q.next_offset - q.min_offset,
    };
    Some(GroupQueueStatus {
        topic: topic.to_string(),
        queue,
        min_offset: q.min_offset,
        max_offset: q.next_offset,
        committed_offset: committed,
        last_commit_ms: st.offset_times.get(&key).copied(),
        oldest_unconsumed_ms,
        pop_next,
        inflight,
        retrying,
        dead_letter_waiting: waiting,
        ready,
        lag,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::msg_id;

    /// 1. A raftmq id parses back to its index and position, for this broker group only; a
    ///    client's id (or another group's) is not taken for one.
    #[test]
    fn t01_parse_msg_id_round_trips_own_ids_only() {
        for (index, pos) in [(1, 0), (0xABCDEF, 7), (u64::MAX, 0x1_0000)] {
            let id = msg_id("broker-a", index, pos);
            assert_eq!(parse_msg_id("broker-a", &id), Some((index, pos)), "{id}");
            assert_eq!(parse_msg_id("broker-b", &id), None);
            assert_eq!(parse_msg_id("broker", &id), None, "a prefix of the name");
        }
        for client in [
            "01A2B3C4D5E6F70000",
            "",
            "broker-a-12-3",
            "broker-a-000000000000000G-1",
        ] {
            assert_eq!(parse_msg_id("broker-a", client), None, "{client}");
        }
    }
}
