//! The broker group's replicated state machine: topics, queues with dense offsets, the consume-queue
//! index, consumer-group offsets and idempotent-producer windows.
//!
//! Invariants:
//! - Offsets of a queue are dense from its base offset; a `Send` entry takes the next `count`
//!   offsets in one run, so the consume-queue index is a list of runs `(first_offset, log_index,
//!   count)` and a lookup is a binary search.
//! - Apply is deterministic: the same entries give the same state and replies on every replica.
//! - A (producer id, sequence) seen in the producer's window is not stored again; the original
//!   offsets are returned.

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use raftmq_raft_log::state_machine::format;

use crate::command::{CommandView, Reply, check_command_format};

/// The format version of the broker-state snapshot this build writes and the newest it reads.
///
/// Version 1 is the postcard encoding of [`BrokerState`] with no header (as every earlier build
/// wrote it): its fields in declaration order, skipped fields left out; maps as a varint count then
/// key-value pairs, in key order for `BTreeMap`s and in hash order for the producers' `HashMap`
/// (so two equal states may encode differently, which nothing relies on). A later version begins
/// with the envelope of `raftmq_raft_log::state_machine::format`; restoring one newer than this
/// stops the member (the snapshot also travels alone to a peer that installs it, so it carries its
/// own version). Every struct here that is in a snapshot keeps its fields in order, never
/// reordered or changed; a change is a new version.
pub const BROKER_STATE_FORMAT_VERSION: u32 = 1;

/// How many recent batches per producer are remembered for de-duplication.
pub const PRODUCER_WINDOW: usize = 256;
/// How many producers are remembered (least recently used are forgotten first).
pub const PRODUCERS_MAX: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub first_offset: u64,
    pub log_index: u64,
    pub count: u32,
}

/// In snapshots (format: [`BROKER_STATE_FORMAT_VERSION`]): never reorder or change the fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// The lowest offset still served (raised by retention).
    pub min_offset: u64,
    pub next_offset: u64,
    /// The consume-queue index. Not in snapshots: a snapshot is taken at a checkpoint at or below
    /// the retention point, and every retained entry after it is re-applied (on restart) or
    /// replicated (to a peer that installed it), which rebuilds the runs.
    #[serde(skip)]
    pub runs: Vec<Run>,
}

impl QueueState {
    /// The run holding `offset`, if it is still indexed.
    pub fn find(&self, offset: u64) -> Option<Run> {
        let i = self
            .runs
            .partition_point(|r| r.first_offset + r.count as u64 <= offset);
        self.runs
            .get(i)
            .copied()
            .filter(|r| r.first_offset <= offset)
    }
}

/// In snapshots (format: [`BROKER_STATE_FORMAT_VERSION`]): never reorder or change the fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicState {
    pub queues: Vec<QueueState>,
}

/// In snapshots (format: [`BROKER_STATE_FORMAT_VERSION`]): never reorder or change the fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ProducerWindow {
    last_index: u64,
    /// (sequence, queue, first offset, count, log index), oldest first.
    recent: VecDeque<(u64, u32, u64, u32, u64)>,
}

/// In snapshots (format: [`BROKER_STATE_FORMAT_VERSION`]): never reorder or change the fields.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BrokerState {
    pub topics: BTreeMap<String, TopicState>,
    /// (group, topic, queue) → next offset to consume.
    pub offsets: BTreeMap<(String, String, u32), u64>,
    producers: HashMap<u64, ProducerWindow>,
    pub last_applied: u64,
    /// Bumped on every topic change, so registration can tell.
    pub topic_version: u64,
    pub messages_total: u64,
    /// Retention point: entries at or below it are dropped from the queues and purged from logs.
    pub trimmed_index: u64,
}

impl BrokerState {
    pub fn topic_list(&self) -> Vec<(String, u32)> {
        self.topics
            .iter()
            .map(|(n, t)| (n.clone(), t.queues.len() as u32))
            .collect()
    }

    pub fn queue(&self, topic: &str, queue: u32) -> Option<&QueueState> {
        self.topics.get(topic)?.queues.get(queue as usize)
    }

    fn apply_command(&mut self, index: u64, cmd: CommandView) -> Reply {
        match cmd {
            CommandView::CreateTopic {
                name,
                queues,
                update,
            } => {
                if let Some(t) = self.topics.get_mut(&name) {
                    let have = t.queues.len() as u32;
                    if !update || queues == have {
                        return if queues == have {
                            Reply::Ok
                        } else {
                            Reply::TopicExists { queues: have }
                        };
                    }
                    if queues < have {
                        return Reply::Invalid(format!(
                            "topic {name} has {have} queues; the queue count can only grow"
                        ));
                    }
                    t.queues.resize(queues as usize, QueueState::default());
                } else {
                    self.topics.insert(
                        name,
                        TopicState {
                            queues: vec![QueueState::default(); queues as usize],
                        },
                    );
                }
                self.topic_version += 1;
                Reply::Ok
            }
            CommandView::DeleteTopic { name } => {
                if self.topics.remove(&name).is_none() {
                    return Reply::TopicNotFound(name);
                }
                self.offsets.retain(|(_, t, _), _| *t != name);
                self.topic_version += 1;
                Reply::Ok
            }
            CommandView::Send {
                topic,
                queue,
                producer_id,
                sequence,
                messages,
                ..
            } => {
                if producer_id != 0
                    && let Some(w) = self.producers.get(&producer_id)
                    && let Some(&(_, q, first, count, li)) =
                        w.recent.iter().find(|r| r.0 == sequence)
                {
                    return Reply::Sent {
                        queue: q,
                        first_offset: first,
                        count,
                        log_index: li,
                        duplicate: true,
                    };
                }
                let Some(t) = self.topics.get_mut(&topic) else {
                    return Reply::TopicNotFound(topic);
                };
                let Some(q) = t.queues.get_mut(queue as usize) else {
                    return Reply::Invalid(format!("topic {topic} has no queue {queue}"));
                };
                let count = messages.len() as u32;
                let first = q.next_offset;
                q.runs.push(Run {
                    first_offset: first,
                    log_index: index,
                    count,
                });
                q.next_offset += count as u64;
                self.messages_total += count as u64;
                if producer_id != 0 {
                    self.remember(producer_id, index, (sequence, queue, first, count, index));
                }
                Reply::Sent {
                    queue,
                    first_offset: first,
                    count,
                    log_index: index,
                    duplicate: false,
                }
            }
            CommandView::Trim { upto_log_index } => {
                if upto_log_index <= self.trimmed_index {
                    return Reply::Ok;
                }
                self.trimmed_index = upto_log_index;
                for t in self.topics.values_mut() {
                    for q in &mut t.queues {
                        let keep = q.runs.partition_point(|r| r.log_index <= upto_log_index);
                        q.runs.drain(..keep);
                        let first = q
                            .runs
                            .first()
                            .map(|r| r.first_offset)
                            .unwrap_or(q.next_offset);
                        q.min_offset = q.min_offset.max(first);
                    }
                }
                Reply::Ok
            }
            CommandView::CommitOffset {
                group,
                topic,
                queue,
                offset,
            } => {
                if !self.topics.contains_key(&topic) {
                    return Reply::TopicNotFound(topic);
                }
                self.offsets.insert((group, topic, queue), offset);
                Reply::Ok
            }
        }
    }

    fn remember(&mut self, producer_id: u64, index: u64, rec: (u64, u32, u64, u32, u64)) {
        if !self.producers.contains_key(&producer_id) && self.producers.len() >= PRODUCERS_MAX {
            // Forget the producer idle the longest; deterministic since ties break by id.
            if let Some(old) = self
                .producers
                .iter()
                .min_by_key(|(id, w)| (w.last_index, **id))
                .map(|(id, _)| *id)
            {
                self.producers.remove(&old);
            }
        }
        let w = self.producers.entry(producer_id).or_default();
        w.last_index = index;
        w.recent.push_back(rec);
        while w.recent.len() > PRODUCER_WINDOW {
            w.recent.pop_front();
        }
    }
}

impl raftmq_raft_log::StateMachine for BrokerState {
    fn apply(&mut self, index: u64, _term: u64, payload: &[u8]) -> Bytes {
        self.last_applied = index;
        let reply = match CommandView::view(payload) {
            Ok(cmd) => self.apply_command(index, cmd),
            Err(e) => Reply::Invalid(format!("undecodable command at index {index}: {e}")),
        };
        Bytes::from(reply.encode())
    }

    /// Stops the member on a command from a newer format instead of applying it as invalid, which
    /// would make this replica diverge from one that knows it.
    fn try_apply(&mut self, index: u64, term: u64, payload: &[u8]) -> std::io::Result<Bytes> {
        check_command_format(index, payload)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        Ok(self.apply(index, term, payload))
    }

    fn apply_empty(&mut self, index: u64) {
        self.last_applied = index;
    }

    fn snapshot(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("state always encodes")
    }

    fn restore(&mut self, data: &[u8]) -> std::io::Result<()> {
        let (_version, body) = format::versioned(
            || "the broker-state snapshot".to_string(),
            data,
            BROKER_STATE_FORMAT_VERSION,
        )?;
        let mut s: BrokerState = postcard::from_bytes(body)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        s.topic_version += 1;
        *self = s;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, StoredBody};
    use raftmq_raft_log::StateMachine;

    fn send(st: &mut BrokerState, index: u64, producer: u64, seq: u64, n: usize) -> Reply {
        let cmd = Command::Send {
            topic: "t".into(),
            queue: 1,
            producer_id: producer,
            sequence: seq,
            timestamp_ms: 1,
            messages: (0..n)
                .map(|i| StoredBody {
                    key: String::new(),
                    tag: String::new(),
                    body: vec![i as u8].into(),
                    properties: vec![],
                })
                .collect(),
        };
        Reply::decode(&st.apply(index, 1, &cmd.encode())).unwrap()
    }

    #[test]
    fn offsets_are_dense_per_queue_and_retries_are_stored_once() {
        let mut st = BrokerState::default();
        let r = st.apply(
            1,
            1,
            &Command::CreateTopic {
                name: "t".into(),
                queues: 2,
                update: false,
            }
            .encode(),
        );
        assert_eq!(Reply::decode(&r).unwrap(), Reply::Ok);
        assert_eq!(
            send(&mut st, 2, 7, 1, 3),
            Reply::Sent {
                queue: 1,
                first_offset: 0,
                count: 3,
                log_index: 2,
                duplicate: false
            }
        );
        assert_eq!(
            send(&mut st, 3, 7, 2, 2),
            Reply::Sent {
                queue: 1,
                first_offset: 3,
                count: 2,
                log_index: 3,
                duplicate: false
            }
        );
        // The same (producer, sequence) again: not stored, answered with the first offsets.
        assert_eq!(
            send(&mut st, 4, 7, 1, 3),
            Reply::Sent {
                queue: 1,
                first_offset: 0,
                count: 3,
                log_index: 2,
                duplicate: true
            }
        );
        let q = st.queue("t", 1).unwrap();
        assert_eq!(q.next_offset, 5);
        assert_eq!(
            q.find(4),
            Some(Run {
                first_offset: 3,
                log_index: 3,
                count: 2
            })
        );
        assert_eq!(
            q.find(0),
            Some(Run {
                first_offset: 0,
                log_index: 2,
                count: 3
            })
        );
        assert_eq!(q.find(5), None);
    }

    #[test]
    fn unknown_topic_and_shrinking_queues_are_refused() {
        let mut st = BrokerState::default();
        assert_eq!(send(&mut st, 1, 0, 0, 1), Reply::TopicNotFound("t".into()));
        st.apply(
            2,
            1,
            &Command::CreateTopic {
                name: "t".into(),
                queues: 4,
                update: false,
            }
            .encode(),
        );
        let r = st.apply(
            3,
            1,
            &Command::CreateTopic {
                name: "t".into(),
                queues: 2,
                update: true,
            }
            .encode(),
        );
        assert!(matches!(Reply::decode(&r).unwrap(), Reply::Invalid(_)));
        let r = st.apply(
            4,
            1,
            &Command::CreateTopic {
                name: "t".into(),
                queues: 8,
                update: true,
            }
            .encode(),
        );
        assert_eq!(Reply::decode(&r).unwrap(), Reply::Ok);
        assert_eq!(st.topics["t"].queues.len(), 8);
    }

    #[test]
    fn snapshot_restores_topics_offsets_and_producer_windows() {
        let mut st = BrokerState::default();
        st.apply(
            1,
            1,
            &Command::CreateTopic {
                name: "t".into(),
                queues: 2,
                update: false,
            }
            .encode(),
        );
        send(&mut st, 2, 9, 5, 2);
        st.apply(
            3,
            1,
            &Command::CommitOffset {
                group: "g".into(),
                topic: "t".into(),
                queue: 1,
                offset: 1,
            }
            .encode(),
        );
        let snap = st.snapshot();
        let mut other = BrokerState::default();
        other.restore(&snap).unwrap();
        assert_eq!(other.offsets.get(&("g".into(), "t".into(), 1)), Some(&1));
        assert_eq!(other.queue("t", 1).unwrap().next_offset, 2);
        assert!(matches!(
            send(&mut other, 4, 9, 5, 2),
            Reply::Sent {
                duplicate: true,
                ..
            }
        ));
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;
    use crate::command::{Command, StoredBody};
    use raftmq_raft_log::StateMachine;

    #[test]
    fn trim_drops_runs_at_or_below_the_index_and_raises_min_offset() {
        let mut st = BrokerState::default();
        st.apply(
            1,
            1,
            &Command::CreateTopic {
                name: "t".into(),
                queues: 1,
                update: false,
            }
            .encode(),
        );
        for i in 2..=5u64 {
            let cmd = Command::Send {
                topic: "t".into(),
                queue: 0,
                producer_id: 0,
                sequence: 0,
                timestamp_ms: 0,
                messages: vec![
                    StoredBody {
                        key: String::new(),
                        tag: String::new(),
                        body: vec![1].into(),
                        properties: vec![]
                    };
                    2
                ],
            };
            st.apply(i, 1, &cmd.encode());
        }
        st.apply(6, 1, &Command::Trim { upto_log_index: 3 }.encode());
        let q = st.queue("t", 0).unwrap();
        assert_eq!((q.min_offset, q.next_offset), (4, 8));
        assert_eq!(q.find(3), None);
        assert_eq!(q.find(4).map(|r| r.log_index), Some(4));
        // An older trim point changes nothing.
        st.apply(7, 1, &Command::Trim { upto_log_index: 2 }.encode());
        assert_eq!(st.queue("t", 0).unwrap().min_offset, 4);
    }
}
