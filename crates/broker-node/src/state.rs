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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use raftmq_proto::limits::SINGLE_FLIGHT_SEQUENCE;
use raftmq_raft_log::encoding::postcard_extend;
use raftmq_raft_log::state_machine::format;

use crate::command::{BodyView, CommandView, Reply, SendPartView, check_command_format};
use crate::lookup::Lookup;
use crate::pop::{self, PopState, TAGS_MIXED};
use crate::runs::{Runs, RunsFrom};
use crate::timer::Timer;
use crate::topic_map::TopicMap;
use raftmq_rocketmq_v2::convert::P_MSGID;

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
///
/// Version 2 is the envelope, then the postcard encoding of
/// [`BrokerState`]: version 1's fields, then `topic_types` and `pop` (the POP consumer state,
/// [`crate::pop::PopState`]). A version-1 snapshot still restores (no typed topics, no POP state).
///
/// Version 3 is version 2's body followed by the postcard encoding of
/// [`SentIds`] (the client message ids stored lately, oldest first). A version-2 snapshot still
/// restores, with no ids remembered.
///
/// Version 4 (this build writes it) is version 3 followed by the postcard encoding of the FIFO
/// groups' order (`PopState::fifo`: per (group, topic, queue) a [`crate::pop::FifoQueue`]). A
/// version-3 snapshot still restores, with no message group held.
pub const BROKER_STATE_FORMAT_VERSION: u32 = 5;

/// How many recent batches per producer are remembered for de-duplication.
pub const PRODUCER_WINDOW: usize = 256;
/// The producer windows by producer id. foldhash rather than SipHash: every stored batch looks
/// its window up twice (a producer over 8,000 queues has a window per queue), and the map is
/// encoded in snapshots as its pairs, whatever the hasher.
type Producers = HashMap<u64, ProducerWindow, foldhash::fast::RandomState>;

/// How many producers are remembered (least recently used are forgotten first).
pub const PRODUCERS_MAX: usize = 10_000;

/// How many client message ids a group remembers for `SendOnce` (the oldest are forgotten first).
/// Measured (`tests/sent_ids_memory.rs`): 85 heap bytes per id, 8.5 MB per group when full, and 22
/// bytes per id in a snapshot (2.2 MB). They cover the last 100,000 messages sent with an id —
/// several seconds of the RocketMQ 5 front at its full rate here, longer than a client's retry.
pub const SENT_IDS_MAX: usize = 100_000;

/// The client message ids a group stored lately, each with where its message is (queue, offset).
/// Decided at apply time from the entries alone, so every replica remembers the same ids. In
/// snapshots from version 3, as its ids oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(from = "VecDeque<(u128, u32, u64)>")]
pub struct SentIds {
    order: VecDeque<(u128, u32, u64)>,
    at: HashMap<u128, (u32, u64)>,
}

impl From<VecDeque<(u128, u32, u64)>> for SentIds {
    fn from(order: VecDeque<(u128, u32, u64)>) -> SentIds {
        let at = order.iter().map(|&(k, q, o)| (k, (q, o))).collect();
        SentIds { order, at }
    }
}

impl Serialize for SentIds {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.order.serialize(s)
    }
}

impl SentIds {
    /// The key of a message id in a topic: 128-bit FNV-1a over the topic, a separator byte that
    /// no UTF-8 text holds, and the id (fixed here, so every build and replica agrees).
    pub fn key(topic: &str, id: &str) -> u128 {
        const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;
        let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
        for b in topic.bytes().chain([0xFF]).chain(id.bytes()) {
            h = (h ^ b as u128).wrapping_mul(PRIME);
        }
        h
    }

    /// Where the message with `key` was stored, if it was lately.
    pub fn get(&self, key: u128) -> Option<(u32, u64)> {
        self.at.get(&key).copied()
    }

    /// Remembers `key` at (`queue`, `offset`), forgetting the oldest beyond [`SENT_IDS_MAX`].
    fn insert(&mut self, key: u128, queue: u32, offset: u64) {
        self.at.insert(key, (queue, offset));
        self.order.push_back((key, queue, offset));
        while self.order.len() > SENT_IDS_MAX {
            if let Some((k, q, o)) = self.order.pop_front()
                && self.at.get(&k) == Some(&(q, o))
            {
                self.at.remove(&k);
            }
        }
    }

    /// Ids remembered.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

/// A run of a queue's offsets stored by one entry. Never in snapshots (rebuilt by apply); in
/// restart images ([`crate::restart`]): never reorder or change the fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    pub first_offset: u64,
    pub log_index: u64,
    pub count: u32,
    /// [`pop::tag_hash`] of the tag every message of the run has, or [`TAGS_MIXED`] (then
    /// `QueueState::mixed_tags` holds one hash per message).
    pub tag_hash: u32,
    /// Bytes of its messages (see [`message_bytes`]).
    pub bytes: u32,
    /// Store time of its messages: the entry's stamp, raised to the run before's so store times
    /// never go down along a queue (a new leader's clock may be behind): a lookup by time is a
    /// binary search.
    pub store_ms: u64,
    /// Where in its entry's messages the run's first message is: 0, but for a part of a
    /// `SendMany` after the first.
    pub position: u32,
}

/// The bytes a message counts for in `topic status`: key, tag, body, property names and values.
pub fn message_bytes(m: &BodyView) -> u64 {
    (m.key.len()
        + m.tag.len()
        + m.body.len()
        + m.properties
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()) as u64
}

/// How many keys of one message the key index takes (a message may carry many).
pub const KEYS_INDEXED_MAX: usize = 16;

/// The keys of a message, as `msg find --key` matches them: the RocketMQ 5 front's list
/// (`__rmq.keys`) when it stored one, else the key and, when it has spaces (the front joins a
/// message's keys with one), each word of it; empty ones left out, at most [`KEYS_INDEXED_MAX`].
/// Calls `f` with each, allocating nothing (apply runs it for every message).
pub fn for_each_key<'a>(
    key: &'a str,
    properties: &[(&'a str, &'a str)],
    mut f: impl FnMut(&'a str),
) {
    let listed = properties
        .iter()
        .find(|(k, _)| *k == raftmq_rocketmq_v2::convert::P_KEYS)
        .map(|(_, v)| *v);
    let mut taken = 0;
    let mut take = |k: &'a str| {
        if !k.is_empty() && taken < KEYS_INDEXED_MAX {
            taken += 1;
            f(k);
        }
    };
    match listed {
        Some(list) => list
            .split(raftmq_rocketmq_v2::convert::KEYS_SEP)
            .for_each(&mut take),
        None => {
            take(key);
            if key.contains(' ') {
                key.split(' ').for_each(&mut take);
            }
        }
    }
}

/// [`for_each_key`]'s keys, collected.
pub fn keys_of<'a>(key: &'a str, properties: &[(&'a str, &'a str)]) -> Vec<&'a str> {
    let mut keys = Vec::new();
    for_each_key(key, properties, |k| keys.push(k));
    keys
}

/// The tag hash of a run and, when its messages' tags differ, each message's.
fn run_tags(messages: &[BodyView]) -> (u32, Option<Box<[u32]>>) {
    let first = messages.first().map_or("", |m| m.tag);
    if messages.iter().all(|m| m.tag == first) {
        (pop::tag_hash(first), None)
    } else {
        let each = messages.iter().map(|m| pop::tag_hash(m.tag)).collect();
        (TAGS_MIXED, Some(each))
    }
}

/// Each message's group hash, when any message of the run has a group.
fn run_groups(messages: &[BodyView]) -> Option<Box<[u32]>> {
    let group = |m: &BodyView| {
        m.properties
            .iter()
            .find(|(k, _)| *k == raftmq_proto::MESSAGE_GROUP_PROPERTY)
            .map_or(0, |(_, g)| pop::group_hash(g))
    };
    let each: Box<[u32]> = messages.iter().map(group).collect();
    each.iter().any(|h| *h != 0).then_some(each)
}

/// In snapshots (format: [`BROKER_STATE_FORMAT_VERSION`]): never reorder or change the fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// The lowest offset still served (raised by retention).
    pub min_offset: u64,
    pub next_offset: u64,
    /// The consume-queue index. Not in snapshots: a snapshot is taken at a checkpoint at or below
    /// the retention point, and every retained entry after it is re-applied (on restart) or
    /// replicated (to a peer that installed it), which rebuilds the runs. In chunks ([`Runs`]).
    #[serde(skip)]
    pub runs: Runs,
    /// Per-message tag hashes of the runs marked [`TAGS_MIXED`], by their first offset. Not in
    /// snapshots, as `runs`.
    #[serde(skip)]
    pub mixed_tags: BTreeMap<u64, Box<[u32]>>,
    /// Bytes of the indexed messages (the sum over `runs`). Not in snapshots, as `runs`.
    #[serde(skip)]
    pub bytes: u64,
    /// The client message ids of the indexed messages ([`crate::lookup`]). Not in snapshots.
    #[serde(skip)]
    pub ids: Lookup,
    /// Their keys ([`keys_of`]). Not in snapshots.
    #[serde(skip)]
    pub keys: Lookup,
    /// Per-message message-group hashes ([`pop::group_hash`]) of the runs holding any message
    /// with a group, by their first offset: what a FIFO group's receive reads to keep each
    /// group in order without reading bodies. Not in snapshots, as `runs`.
    #[serde(skip)]
    pub groups: BTreeMap<u64, Box<[u32]>>,
}

impl QueueState {
    /// The runs stored by entries after `index`, found from the end ([`Runs::after`]).
    pub fn runs_after(&self, index: u64) -> RunsFrom<'_> {
        self.runs.since(self.runs.after(index))
    }

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

    /// Walks the indexed offsets from `from` (up to `end`), calling `visit(offset)` for each whose
    /// tag hash `may_match` accepts, until `visit` returns false. A run of one tag that does not
    /// match is skipped whole; offsets no longer indexed are passed over. Returns the offset after
    /// the last one looked at (`end` when `visit` never stopped the walk).
    pub fn scan_tags(
        &self,
        from: u64,
        end: u64,
        may_match: impl Fn(u32) -> bool,
        mut visit: impl FnMut(u64) -> bool,
    ) -> u64 {
        let first = self
            .runs
            .partition_point(|r| r.first_offset + r.count as u64 <= from);
        let mut o = from;
        for r in self.runs.iter_from(first) {
            if o >= end {
                break;
            }
            o = o.max(r.first_offset);
            let run_end = (r.first_offset + r.count as u64).min(end);
            if r.tag_hash != TAGS_MIXED {
                if !may_match(r.tag_hash) {
                    o = run_end;
                    continue;
                }
                while o < run_end {
                    o += 1;
                    if !visit(o - 1) {
                        return o;
                    }
                }
            } else {
                let each = self.mixed_tags.get(&r.first_offset);
                while o < run_end {
                    let h = each.and_then(|e| e.get((o - r.first_offset) as usize));
                    o += 1;
                    if h.is_some_and(|h| may_match(*h)) && !visit(o - 1) {
                        return o;
                    }
                }
            }
        }
        end.max(from)
    }

    /// The message-group hash of the message at `offset` (0: no group, or no longer indexed).
    pub fn group_at(&self, offset: u64) -> u32 {
        match self.groups.range(..=offset).next_back() {
            Some((first, each)) => each.get((offset - first) as usize).copied().unwrap_or(0),
            None => 0,
        }
    }

    /// The first indexed offset stored at or after `ms` (`next_offset` when none is).
    pub fn offset_at_time(&self, ms: u64) -> u64 {
        let i = self.runs.partition_point(|r| r.store_ms < ms);
        self.runs
            .get(i)
            .map_or(self.next_offset, |r| r.first_offset.max(self.min_offset))
    }

    /// Appends a run of `messages` stored by entry `index` at `timestamp_ms`, indexing their ids
    /// (the property `id_property`) and keys; returns its first offset.
    fn append(
        &mut self,
        index: u64,
        timestamp_ms: u64,
        id_property: &str,
        messages: &[BodyView],
    ) -> u64 {
        self.append_at((index, 0), timestamp_ms, id_property, messages)
    }

    /// [`Self::append`] of messages that start at `position` of entry `index`'s messages.
    fn append_at(
        &mut self,
        (index, position): (u64, u32),
        timestamp_ms: u64,
        id_property: &str,
        messages: &[BodyView],
    ) -> u64 {
        let count = messages.len() as u32;
        let first = self.next_offset;
        let (tag_hash, each) = run_tags(messages);
        if let Some(each) = each {
            self.mixed_tags.insert(first, each);
        }
        if let Some(groups) = run_groups(messages) {
            self.groups.insert(first, groups);
        }
        let mut bytes = 0;
        for (i, m) in messages.iter().enumerate() {
            let offset = first + i as u64;
            bytes += message_bytes(m);
            if let Some((_, id)) = m
                .properties
                .iter()
                .find(|(k, v)| *k == id_property && !v.is_empty())
            {
                self.ids.add(offset, id);
            }
            for_each_key(m.key, &m.properties, |k| self.keys.add(offset, k));
        }
        self.bytes += bytes;
        let store_ms = self
            .runs
            .last()
            .map_or(timestamp_ms, |r| r.store_ms.max(timestamp_ms));
        self.runs.push(Run {
            first_offset: first,
            log_index: index,
            count,
            tag_hash,
            bytes: bytes.min(u32::MAX as u64) as u32,
            store_ms,
            position,
        });
        self.next_offset += count as u64;
        first
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
    /// The highest sequence ever recorded here (at or above every one in `recent`): a batch
    /// above it is new without a look through the window. Not in snapshots: set at restore.
    #[serde(skip)]
    max_sequence: u64,
}

/// In snapshots (format: [`BROKER_STATE_FORMAT_VERSION`]): never reorder or change the fields.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BrokerState {
    /// Encoded in name order, as the `BTreeMap` it was (see [`TopicMap`]).
    pub topics: TopicMap,
    /// (group, topic, queue) → next offset to consume.
    pub offsets: BTreeMap<(String, String, u32), u64>,
    producers: Producers,
    pub last_applied: u64,
    /// Bumped on every topic change, so registration can tell.
    pub topic_version: u64,
    pub messages_total: u64,
    /// Retention point: entries at or below it are dropped from the queues and purged from logs.
    pub trimmed_index: u64,
    /// Topic → message type (`raftmq.v1.TopicMessageType` number); absent = NORMAL (0).
    pub topic_types: BTreeMap<String, u32>,
    /// POP consumer groups: config, deliveries in flight, dead letters waiting.
    pub pop: PopState,
    /// Client message ids stored lately (`SendOnce`). In version-3 snapshots after the fields
    /// above, not inside this struct's encoding, so a version-2 body still decodes.
    #[serde(skip)]
    pub sent_ids: SentIds,
    /// The latest time stamped on an applied entry (a send's store time, a POP entry's clock).
    /// Not in snapshots: status only, never a decision.
    #[serde(skip)]
    pub stamped_ms: u64,
    /// (group, topic, queue) → `stamped_ms` when its offset was last committed. Not in
    /// snapshots: status only (`group status`), unknown for commits before this node's start.
    #[serde(skip)]
    pub offset_times: BTreeMap<(String, String, u32), u64>,
    /// Scheduled messages waiting for their time. Not in snapshots (see [`crate::timer`]).
    #[serde(skip)]
    pub timer: Timer,
    /// Users by access key, with their secrets and rules. In snapshots from format 5, after the
    /// FIFO state.
    #[serde(skip)]
    pub users: BTreeMap<String, raftmq_security::acl::User>,
    /// The producers by (last index, id): which one was idle the longest, for the forgetting
    /// `remember` does. Kept only from the first time the windows reach [`PRODUCERS_MAX`], when
    /// it is built from `producers` (what it holds is a function of the windows alone, so every
    /// replica builds the same): below the cap nothing is forgotten, and keeping it cost every
    /// stored batch a remove and an insert. Not in snapshots: a restore starts untracked.
    #[serde(skip)]
    producers_idle: Option<BTreeSet<(u64, u64)>>,
    /// The size of the last snapshot taken, so the next one is written into a buffer sized
    /// ahead: grown by doubling, a buffer of megabytes cost its copies and the kernel's zeroing
    /// of fresh pages, most of a snapshot's time at 1,000 topics (`perf`, issue 20). Not in
    /// snapshots.
    #[serde(skip)]
    snapshot_bytes: std::sync::atomic::AtomicUsize,
}

/// The offset a producer window or the id record holds for a message that waits in the timer (it
/// has no offset until delivered).
pub const SCHEDULED: u64 = u64::MAX;

/// `raftmq.v1.TopicMessageType.FIFO`.
pub const TYPE_FIFO: u32 = 1;
/// `raftmq.v1.TopicMessageType.DELAY`.
pub const TYPE_DELAY: u32 = 2;
/// `raftmq.v1.TopicMessageType.TRANSACTION`.
pub const TYPE_TRANSACTION: u32 = 3;

/// The property a waiting message stored again (by retention, or a half message by a
/// check-back) carries: `log_index.position` of where it was first stored, which its id (and a
/// half message's transaction) names.
pub const ORIGIN_PROPERTY: &str = "__rmq.origin";

/// Where a waiting message stored again was first stored ([`ORIGIN_PROPERTY`]).
fn origin_of(m: &BodyView) -> Option<(u64, u32)> {
    m.properties
        .iter()
        .find(|(k, _)| *k == ORIGIN_PROPERTY)
        .and_then(|(_, v)| parse_origin(v))
}

/// A [`ORIGIN_PROPERTY`] value: (log index, position).
pub fn parse_origin(v: &str) -> Option<(u64, u32)> {
    let (i, p) = v.split_once('.')?;
    Some((i.parse().ok()?, p.parse().ok()?))
}

/// Version 1 of the snapshot: [`BrokerState`]'s first fields, as earlier builds wrote them.
#[derive(Deserialize)]
struct BrokerStateV1 {
    topics: TopicMap,
    offsets: BTreeMap<(String, String, u32), u64>,
    producers: Producers,
    last_applied: u64,
    topic_version: u64,
    messages_total: u64,
    trimmed_index: u64,
}

impl From<BrokerStateV1> for BrokerState {
    fn from(v: BrokerStateV1) -> BrokerState {
        BrokerState {
            topics: v.topics,
            offsets: v.offsets,
            producers: v.producers,
            last_applied: v.last_applied,
            topic_version: v.topic_version,
            messages_total: v.messages_total,
            trimmed_index: v.trimmed_index,
            topic_types: BTreeMap::new(),
            pop: PopState::default(),
            sent_ids: SentIds::default(),
            stamped_ms: 0,
            offset_times: BTreeMap::new(),
            users: BTreeMap::new(),
            timer: Timer::default(),
            producers_idle: None,
            snapshot_bytes: Default::default(),
        }
    }
}

impl BrokerState {
    pub fn topic_list(&self) -> Vec<(String, u32)> {
        self.topics
            .sorted()
            .into_iter()
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
            } => self.configure_topic(name, queues, update, None),
            CommandView::ConfigureTopic {
                name,
                queues,
                update,
                message_type,
            } => self.configure_topic(name, queues, update, Some(message_type)),
            CommandView::DeleteTopic { name } => {
                if self.topics.remove(&name).is_none() {
                    return Reply::TopicNotFound(name);
                }
                self.offsets.retain(|(_, t, _), _| *t != name);
                self.offset_times.retain(|(_, t, _), _| *t != name);
                self.topic_types.remove(&name);
                self.pop.drop_topic(&name);
                self.timer.drop_topic(&name);
                self.topic_version += 1;
                Reply::Ok
            }
            CommandView::Send {
                topic,
                queue,
                producer_id,
                sequence,
                timestamp_ms,
                messages,
            } => {
                self.stamp(timestamp_ms);
                self.producer_duplicate(producer_id, sequence)
                    .unwrap_or_else(|| {
                        self.store(
                            index,
                            (&topic, queue),
                            (producer_id, sequence),
                            (timestamp_ms, P_MSGID),
                            &messages,
                        )
                    })
            }
            CommandView::SendOnce {
                topic,
                queue,
                producer_id,
                sequence,
                id_property,
                messages,
                timestamp_ms,
            } => {
                self.stamp(timestamp_ms);
                if let Some(r) = self.producer_duplicate(producer_id, sequence) {
                    return r;
                }
                let keys: Vec<Option<u128>> = messages
                    .iter()
                    .map(|m| {
                        m.properties
                            .iter()
                            .find(|(k, v)| *k == id_property && !v.is_empty())
                            .map(|(_, id)| SentIds::key(&topic, id))
                    })
                    .collect();
                let found: Vec<Option<(u32, u64)>> = keys
                    .iter()
                    .map(|k| k.and_then(|k| self.sent_ids.get(k)))
                    .collect();
                if found.iter().any(Option::is_some) {
                    return Reply::SentBefore(found);
                }
                let reply = self.store(
                    index,
                    (&topic, queue),
                    (producer_id, sequence),
                    (timestamp_ms, &id_property),
                    &messages,
                );
                if let Reply::Sent {
                    queue,
                    first_offset,
                    ..
                } = reply
                {
                    for (i, k) in keys.iter().enumerate() {
                        if let Some(k) = k {
                            self.sent_ids.insert(*k, queue, first_offset + i as u64);
                        }
                    }
                }
                reply
            }
            CommandView::SendMany {
                timestamp_ms,
                parts,
                messages,
            } => {
                self.stamp(timestamp_ms);
                let total: u64 = parts.iter().map(|p| p.count as u64).sum();
                if total != messages.len() as u64 {
                    return Reply::Invalid(format!(
                        "a send to {} queues counts {total} messages but carries {}",
                        parts.len(),
                        messages.len()
                    ));
                }
                self.touch_parts(&parts);
                let mut at = 0usize;
                let mut replies = Vec::with_capacity(parts.len());
                for p in &parts {
                    let slice = &messages[at..at + p.count as usize];
                    let position = at as u32;
                    at += p.count as usize;
                    let reply = match self.producer_duplicate(p.producer_id, p.sequence) {
                        Some(r) => {
                            let first = self.first_position(p.topic, &r);
                            replies.push((r, first));
                            continue;
                        }
                        None if slice.is_empty() => {
                            Reply::Invalid("a part of a send carries no message".into())
                        }
                        None => self.store_at(
                            (index, position),
                            (p.topic, p.queue),
                            (p.producer_id, p.sequence),
                            (timestamp_ms, P_MSGID),
                            slice,
                        ),
                    };
                    replies.push((reply, position));
                }
                Reply::SentMany(replies)
            }
            CommandView::Trim { upto_log_index } => {
                // Never past an entry with a scheduled message still waiting: its body is there.
                let upto_log_index = self
                    .timer
                    .oldest_entry()
                    .map_or(upto_log_index, |o| upto_log_index.min(o - 1));
                if upto_log_index <= self.trimmed_index {
                    return Reply::Ok;
                }
                self.trimmed_index = upto_log_index;
                for t in self.topics.values_mut() {
                    for q in &mut t.queues {
                        let keep = q.runs.partition_point(|r| r.log_index <= upto_log_index);
                        q.bytes -= q.runs.drop_front(keep);
                        let first = q
                            .runs
                            .first()
                            .map(|r| r.first_offset)
                            .unwrap_or(q.next_offset);
                        q.mixed_tags = q.mixed_tags.split_off(&first);
                        q.groups = q.groups.split_off(&first);
                        q.min_offset = q.min_offset.max(first);
                        q.ids.trim(q.min_offset);
                        q.keys.trim(q.min_offset);
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
                if self.stamped_ms > 0 {
                    let at = (group.clone(), topic.clone(), queue);
                    self.offset_times.insert(at, self.stamped_ms);
                }
                self.offsets.insert((group, topic, queue), offset);
                Reply::Ok
            }
            CommandView::UpsertGroup {
                name,
                max_attempts,
                retry_delays_ms,
                fifo,
                update,
            } => {
                let cfg = pop::GroupConfig {
                    max_attempts,
                    retry_delays_ms,
                    fifo,
                };
                match self.pop.groups.get(&name) {
                    Some(have) if !update && *have != cfg => Reply::GroupExists(name),
                    _ => {
                        self.pop.groups.insert(name, cfg);
                        Reply::Ok
                    }
                }
            }
            CommandView::DeleteGroup { name } => {
                if self.pop.drop_group(&name) {
                    Reply::Ok
                } else {
                    Reply::GroupNotFound(name)
                }
            }
            CommandView::Pop {
                group,
                topic,
                now_ms,
                invisible_ms,
                create_group,
                picks,
                advance,
            } => self.receive(&topic, now_ms, |pop, bounds| {
                pop.pop(
                    index,
                    &group,
                    &topic,
                    now_ms,
                    invisible_ms,
                    create_group,
                    &picks,
                    &advance,
                    bounds,
                )
            }),
            CommandView::PopFifo {
                group,
                topic,
                now_ms,
                invisible_ms,
                create_group,
                picks,
                advance,
            } => self.receive(&topic, now_ms, |pop, bounds| {
                let req = pop::PopReq {
                    index,
                    group: &group,
                    topic: &topic,
                    now_ms,
                    invisible_ms,
                    create_group,
                };
                pop.pop_fifo(req, &picks, &advance, bounds)
            }),
            CommandView::Ack {
                group,
                topic,
                now_ms,
                handles,
            } => {
                self.stamp(now_ms);
                self.pop.ack(&group, &topic, now_ms, &handles)
            }
            CommandView::ChangeInvisible {
                group,
                topic,
                queue,
                offset,
                issued,
                invisible_ms,
                now_ms,
            } => {
                self.stamp(now_ms);
                self.pop.change_invisible(
                    index,
                    &group,
                    &topic,
                    queue,
                    offset,
                    issued,
                    invisible_ms,
                    now_ms,
                )
            }
            CommandView::ResetPop {
                group,
                topic,
                queue,
                offset,
            } => {
                let Some(q) = self.queue(&topic, queue) else {
                    return Reply::TopicNotFound(topic);
                };
                let bounds = (q.min_offset, q.next_offset);
                self.pop.reset(&group, &topic, queue, offset, bounds)
            }
            CommandView::Schedule {
                topic,
                queue,
                producer_id,
                sequence,
                timestamp_ms,
                id_property,
                deliver_at_ms,
                replaces,
                messages,
            } => {
                self.stamp(timestamp_ms);
                if let Some(r) = self.producer_duplicate(producer_id, sequence) {
                    return r;
                }
                self.schedule(
                    index,
                    (&topic, queue),
                    (producer_id, sequence),
                    &id_property,
                    (&deliver_at_ms, &replaces),
                    &messages,
                )
            }
            CommandView::Deliver {
                topic,
                queue,
                now_ms,
                due,
                messages,
            } => {
                self.stamp(now_ms);
                if due.is_empty() || due.len() != messages.len() {
                    return Reply::Invalid(format!(
                        "a delivery names {} messages and carries {}",
                        due.len(),
                        messages.len()
                    ));
                }
                if let Some(&(at, li, p)) = due.iter().find(|&&(at, li, p)| {
                    at > now_ms || !self.timer.holds(at, (li, p), &topic, queue)
                }) {
                    return Reply::NotScheduled(format!(
                        "message {li}/{p} does not wait for {topic} queue {queue} at {at} \
                         (delivered, recalled, or not due at {now_ms})"
                    ));
                }
                let Some(q) = self
                    .topics
                    .get_mut(&topic)
                    .and_then(|t| t.queues.get_mut(queue as usize))
                else {
                    return Reply::TopicNotFound(topic);
                };
                for &(at, li, p) in &due {
                    self.timer.remove(at, (li, p));
                }
                let count = messages.len() as u32;
                let first = q.append(index, now_ms, P_MSGID, &messages);
                self.messages_total += count as u64;
                Reply::Sent {
                    queue,
                    first_offset: first,
                    count,
                    log_index: index,
                    duplicate: false,
                }
            }
            CommandView::Recall {
                topic,
                queue,
                deliver_at_ms,
                log_index,
                position,
            } => {
                if self
                    .timer
                    .holds(deliver_at_ms, (log_index, position), &topic, queue)
                {
                    self.timer.remove(deliver_at_ms, (log_index, position));
                    Reply::Ok
                } else {
                    Reply::NotScheduled(format!(
                        "message {log_index}/{position} does not wait for {topic} queue {queue}"
                    ))
                }
            }
            CommandView::PutUser {
                access_key,
                secret,
                admin,
                create,
            } => match (self.users.get_mut(&access_key), create) {
                (Some(_), true) => Reply::Invalid(format!("user {access_key:?} exists")),
                (None, false) => Reply::Invalid(format!("no user {access_key:?}")),
                (Some(u), false) => {
                    u.secret = secret;
                    u.admin = admin;
                    Reply::Ok
                }
                (None, true) => {
                    let user = raftmq_security::acl::User {
                        access_key: access_key.clone(),
                        secret,
                        admin,
                        rules: Vec::new(),
                    };
                    self.users.insert(access_key, user);
                    Reply::Ok
                }
            },
            CommandView::DeleteUser { access_key } => match self.users.remove(&access_key) {
                Some(_) => Reply::Ok,
                None => Reply::Invalid(format!("no user {access_key:?}")),
            },
            CommandView::ChangeRule {
                access_key,
                rule,
                revoke,
            } => {
                let Some(u) = self.users.get_mut(&access_key) else {
                    return Reply::Invalid(format!("no user {access_key:?}"));
                };
                let at = u.rules.iter().position(|r| *r == rule);
                match (at, revoke) {
                    (Some(i), true) => {
                        u.rules.remove(i);
                    }
                    (None, true) => {
                        return Reply::Invalid(format!(
                            "user {access_key:?} has no rule \"{rule}\""
                        ));
                    }
                    (Some(_), false) => {}
                    (None, false) => u.rules.push(rule),
                }
                Reply::Ok
            }
            CommandView::EndTxn {
                topic,
                queue,
                now_ms,
                check_at_ms,
                log_index,
                position,
                commit,
                messages,
            } => {
                self.stamp(now_ms);
                if !self
                    .timer
                    .holds_half(check_at_ms, (log_index, position), &topic, queue)
                {
                    return Reply::NotScheduled(format!(
                        "no transaction is open with its half message at {log_index}/{position} \
                         of {topic} queue {queue} (committed, rolled back, or checked since)"
                    ));
                }
                if !commit {
                    self.timer.remove(check_at_ms, (log_index, position));
                    return Reply::Ok;
                }
                if messages.len() != 1 {
                    return Reply::Invalid(format!(
                        "a commit carries {} messages instead of its half message",
                        messages.len()
                    ));
                }
                let Some(q) = self
                    .topics
                    .get_mut(&topic)
                    .and_then(|t| t.queues.get_mut(queue as usize))
                else {
                    return Reply::TopicNotFound(topic);
                };
                self.timer.remove(check_at_ms, (log_index, position));
                let first = q.append(index, now_ms, P_MSGID, &messages);
                self.messages_total += 1;
                Reply::Sent {
                    queue,
                    first_offset: first,
                    count: 1,
                    log_index: index,
                    duplicate: false,
                }
            }
            CommandView::DeadLetter {
                group,
                topic,
                queue,
                offset,
                issued,
                messages,
                timestamp_ms,
            } => {
                self.stamp(timestamp_ms);
                if self
                    .pop
                    .claim_dead_letter(&group, &topic, queue, offset, issued)
                    .is_none()
                {
                    return Reply::InvalidHandle(format!(
                        "no message of group {group} at {topic} queue {queue} offset {offset} \
                         waits for the dead-letter topic under this handle"
                    ));
                }
                if messages.is_empty() {
                    return Reply::Ok; // no longer readable: dropped
                }
                let dlq = pop::dlq_topic(&group);
                if !self.topics.contains_key(&dlq) {
                    self.topic_version += 1;
                }
                let t = self.topics.entry(dlq).or_insert_with(|| TopicState {
                    queues: vec![QueueState::default()],
                });
                let Some(q) = t.queues.first_mut() else {
                    return Reply::Invalid("the dead-letter topic has no queue".into());
                };
                let count = messages.len() as u32;
                let first = q.append(index, timestamp_ms, P_MSGID, &messages);
                self.messages_total += count as u64;
                self.pop.dead_lettered += count as u64;
                Reply::Sent {
                    queue: 0,
                    first_offset: first,
                    count,
                    log_index: index,
                    duplicate: false,
                }
            }
        }
    }

    /// A receive entry (`Pop`, `PopFifo`) on `topic`: `hand_out` gets the POP state and each
    /// queue's offsets (`None` for a queue the topic does not have).
    fn receive(
        &mut self,
        topic: &str,
        now_ms: u64,
        hand_out: impl FnOnce(&mut PopState, &dyn Fn(u32) -> Option<pop::Bounds>) -> Reply,
    ) -> Reply {
        self.stamp(now_ms);
        let Some(t) = self.topics.get(topic) else {
            return Reply::TopicNotFound(topic.to_string());
        };
        let bounds = |q: u32| {
            t.queues
                .get(q as usize)
                .map(|q| (q.min_offset, q.next_offset))
        };
        hand_out(&mut self.pop, &bounds)
    }

    /// `CreateTopic` (`message_type` None: an entry of an earlier build, which keeps a type set
    /// before) and `ConfigureTopic`.
    fn configure_topic(
        &mut self,
        name: String,
        queues: u32,
        update: bool,
        message_type: Option<u32>,
    ) -> Reply {
        if let Some(t) = self.topics.get_mut(&name) {
            let have = t.queues.len() as u32;
            let have_type = self.topic_types.get(&name).copied().unwrap_or(0);
            if let Some(want) = message_type
                && want != have_type
            {
                return Reply::Invalid(format!(
                    "topic {name} holds messages of type {}; its type cannot change to {}",
                    type_name(have_type),
                    type_name(want)
                ));
            }
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
            if let Some(ty) = message_type.filter(|t| *t != 0) {
                self.topic_types.insert(name.clone(), ty);
            }
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

    /// The message type of a topic (`raftmq.v1.TopicMessageType` number).
    pub fn topic_type(&self, topic: &str) -> u32 {
        self.topic_types.get(topic).copied().unwrap_or(0)
    }

    /// Reads, for every part of a `SendMany`, what applying the part reaches first: its producer's
    /// window, its queue and the queue's newest run. Nothing is decided here (a later part may
    /// find a window an earlier one changed); the point is the order of the reads. Part by part,
    /// each lookup waited on its own cache misses (at 1,000 topics × 8 queues, a part per message:
    /// `producer_duplicate` alone was ~9 % of a leader's samples, on the two loads of a hash-table
    /// probe); these reads do not depend on one another, so the processor overlaps their misses,
    /// and the parts then find them in the cache.
    fn touch_parts(&self, parts: &[SendPartView]) {
        for p in parts {
            let window = self.producers.get(&p.producer_id).map(|w| w.max_sequence);
            let queue = self
                .topics
                .get(p.topic)
                .and_then(|t| t.queues.get(p.queue as usize))
                .map(|q| (q.next_offset, q.runs.last().map(|r| r.store_ms)));
            std::hint::black_box((window, queue));
        }
    }

    /// The first store's reply when (`producer_id`, `sequence`) is in the producer's window; a
    /// refusal for a single-flight sequence ([`SINGLE_FLIGHT_SEQUENCE`]) below its lane's newest.
    fn producer_duplicate(&self, producer_id: u64, sequence: u64) -> Option<Reply> {
        if producer_id == 0 {
            return None;
        }
        let w = self.producers.get(&producer_id)?;
        if sequence > w.max_sequence {
            return None;
        }
        if sequence & SINGLE_FLIGHT_SEQUENCE != 0 && sequence < w.max_sequence {
            // Its lane sent a later batch, so this one was answered or given up on (a request
            // held somewhere past its client's deadline): refused, never stored a second time.
            return Some(Reply::Invalid(format!(
                "batch {} of producer {producer_id} is older than the newest stored ({}): a \
                 lane with one batch in flight sends no older batch again; not stored",
                sequence & !SINGLE_FLIGHT_SEQUENCE,
                w.max_sequence & !SINGLE_FLIGHT_SEQUENCE
            )));
        }
        let &(_, queue, first_offset, count, log_index) =
            w.recent.iter().rev().find(|r| r.0 == sequence)?;
        if first_offset == SCHEDULED {
            return Some(Reply::Scheduled {
                queue,
                count,
                log_index,
                duplicate: true,
            });
        }
        Some(Reply::Sent {
            queue,
            first_offset,
            count,
            log_index,
            duplicate: true,
        })
    }

    /// Where in its entry the first message of a `Sent` reply (a producer-window repeat) is:
    /// read off the run still indexed at its first offset, else 0.
    fn first_position(&self, topic: &str, reply: &Reply) -> u32 {
        let Reply::Sent {
            queue,
            first_offset,
            ..
        } = reply
        else {
            return 0;
        };
        self.queue(topic, *queue)
            .and_then(|q| q.find(*first_offset))
            .map_or(0, |r| r.position + (first_offset - r.first_offset) as u32)
    }

    /// Raises the stamped clock ([`BrokerState::stamped_ms`]) to an entry's stamp.
    fn stamp(&mut self, ms: u64) {
        self.stamped_ms = self.stamped_ms.max(ms);
    }

    /// Stores a batch in a queue (entry `index`, stamped `timestamp_ms`, client ids in the
    /// property `id_property`) and remembers it in its producer's window.
    fn store(
        &mut self,
        index: u64,
        (topic, queue): (&str, u32),
        (producer_id, sequence): (u64, u64),
        (timestamp_ms, id_property): (u64, &str),
        messages: &[BodyView],
    ) -> Reply {
        self.store_at(
            (index, 0),
            (topic, queue),
            (producer_id, sequence),
            (timestamp_ms, id_property),
            messages,
        )
    }

    /// [`Self::store`] of messages that start at `position` of entry `index`'s messages.
    fn store_at(
        &mut self,
        (index, position): (u64, u32),
        (topic, queue): (&str, u32),
        (producer_id, sequence): (u64, u64),
        (timestamp_ms, id_property): (u64, &str),
        messages: &[BodyView],
    ) -> Reply {
        let Some(t) = self.topics.get_mut(topic) else {
            return Reply::TopicNotFound(topic.to_string());
        };
        let Some(q) = t.queues.get_mut(queue as usize) else {
            return Reply::Invalid(format!("topic {topic} has no queue {queue}"));
        };
        let count = messages.len() as u32;
        let first = q.append_at((index, position), timestamp_ms, id_property, messages);
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

    /// Applies a `Schedule` (see [`crate::command::CommandOf::Schedule`]).
    fn schedule(
        &mut self,
        index: u64,
        (topic, queue): (&str, u32),
        (producer_id, sequence): (u64, u64),
        id_property: &str,
        (times, replaces): (&[u64], &[(u64, u32)]),
        messages: &[BodyView],
    ) -> Reply {
        let Some(t) = self.topics.get(topic) else {
            return Reply::TopicNotFound(topic.to_string());
        };
        if queue as usize >= t.queues.len() {
            return Reply::Invalid(format!("topic {topic} has no queue {queue}"));
        }
        let ty = self.topic_type(topic);
        if ty != TYPE_DELAY && ty != TYPE_TRANSACTION {
            return Reply::Invalid(format!(
                "topic {topic} is of type {}: only a DELAY topic takes delivery times",
                type_name(ty)
            ));
        }
        if times.len() != messages.len()
            || (!replaces.is_empty() && replaces.len() != messages.len())
            || messages.len() > crate::timer::POSITIONS
        {
            return Reply::Invalid(format!(
                "a schedule of {} messages with {} delivery times and {} replaced",
                messages.len(),
                times.len(),
                replaces.len()
            ));
        }
        let mut keys: Vec<Option<u128>> = Vec::new();
        if replaces.is_empty() {
            if !id_property.is_empty() {
                keys = messages
                    .iter()
                    .map(|m| {
                        m.properties
                            .iter()
                            .find(|(k, v)| *k == id_property && !v.is_empty())
                            .map(|(_, id)| SentIds::key(topic, id))
                    })
                    .collect();
                let found: Vec<Option<(u32, u64)>> = keys
                    .iter()
                    .map(|k| k.and_then(|k| self.sent_ids.get(k)))
                    .collect();
                if found.iter().any(Option::is_some) {
                    return Reply::SentBefore(found);
                }
            }
        } else {
            // Where each replaced message waits now: a scheduled message at its (unchanged)
            // time; a half message, found by its transaction, at its check time.
            let mut found = Vec::with_capacity(replaces.len());
            for (i, (&(li, p), &at)) in replaces.iter().zip(times).enumerate() {
                let now_at = if ty == TYPE_TRANSACTION {
                    let txn = origin_of(&messages[i]).unwrap_or((li, p));
                    self.timer
                        .txn(txn)
                        .filter(|w| {
                            (w.log_index, w.position, w.queue) == (li, p, queue)
                                && *w.topic == *topic
                        })
                        .map(|w| w.deliver_at_ms)
                } else {
                    self.timer.holds(at, (li, p), topic, queue).then_some(at)
                };
                let Some(now_at) = now_at else {
                    return Reply::NotScheduled(format!(
                        "message {li}/{p} does not wait for {topic} queue {queue}"
                    ));
                };
                found.push((now_at, (li, p)));
            }
            for (at, place) in found {
                self.timer.remove(at, place);
            }
        }
        for (i, &at) in times.iter().enumerate() {
            if ty == TYPE_TRANSACTION {
                // A half message: its transaction is where it was first stored.
                let txn = origin_of(&messages[i]).unwrap_or((index, i as u32));
                self.timer
                    .add_half(at, (index, i as u32), (topic, queue), txn);
            } else {
                self.timer.add(at, (index, i as u32), topic, queue);
                if let Some(origin) = origin_of(&messages[i]) {
                    self.timer.moved_from(origin, at, (index, i as u32));
                }
            }
        }
        for k in keys.into_iter().flatten() {
            self.sent_ids.insert(k, queue, SCHEDULED);
        }
        let count = messages.len() as u32;
        if producer_id != 0 {
            self.remember(
                producer_id,
                index,
                (sequence, queue, SCHEDULED, count, index),
            );
        }
        Reply::Scheduled {
            queue,
            count,
            log_index: index,
            duplicate: false,
        }
    }

    fn remember(&mut self, producer_id: u64, index: u64, rec: (u64, u32, u64, u32, u64)) {
        if !self.producers.contains_key(&producer_id) && self.producers.len() >= PRODUCERS_MAX {
            // Forget the producer idle the longest; deterministic since ties break by id. (A
            // producer spreading over thousands of queues has a window per lane: a scan of every
            // window here, per new one, cost a leader more than the sends.)
            let producers = &self.producers;
            let idle = self.producers_idle.get_or_insert_with(|| {
                producers
                    .iter()
                    .map(|(id, w)| (w.last_index, *id))
                    .collect()
            });
            if let Some((_, old)) = idle.pop_first() {
                self.producers.remove(&old);
            }
        }
        let w = self.producers.entry(producer_id).or_default();
        if let Some(idle) = &mut self.producers_idle {
            idle.remove(&(w.last_index, producer_id));
            idle.insert((index, producer_id));
        }
        w.last_index = index;
        w.max_sequence = w.max_sequence.max(rec.0);
        if rec.0 & SINGLE_FLIGHT_SEQUENCE != 0 {
            // A lane with one batch in flight: no retry can name an older batch. At 8,000
            // queues the full windows were 65 MB of records and most of every snapshot.
            w.recent.clear();
        }
        w.recent.push_back(rec);
        while w.recent.len() > PRODUCER_WINDOW {
            w.recent.pop_front();
        }
    }
}

impl BrokerState {
    /// Stops the member on a command from a newer format instead of applying it as invalid, which
    /// would make this replica diverge from one that knows it.
    fn check_format(index: u64, payload: &[u8]) -> std::io::Result<()> {
        check_command_format(index, payload)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// What [`raftmq_raft_log::StateMachine::apply`] does, up to its reply, before encoding it.
    fn apply_entry(&mut self, index: u64, payload: &[u8]) -> Reply {
        self.last_applied = index;
        match CommandView::view(payload) {
            Ok(cmd) => self.apply_command(index, cmd),
            Err(e) => Reply::Invalid(format!("undecodable command at index {index}: {e}")),
        }
    }
}

impl raftmq_raft_log::StateMachine for BrokerState {
    fn apply(&mut self, index: u64, _term: u64, payload: &[u8]) -> Bytes {
        Bytes::from(self.apply_entry(index, payload).encode())
    }

    /// [`Self::apply`] after [`BrokerState::check_format`].
    fn try_apply(&mut self, index: u64, term: u64, payload: &[u8]) -> std::io::Result<Bytes> {
        Self::check_format(index, payload)?;
        Ok(self.apply(index, term, payload))
    }

    /// The same change as [`Self::try_apply`], without encoding the reply: a follower's. At
    /// 1,000 topics a `SendMany` answers each part, and encoding that reply was ~270
    /// instructions per message (`scripts/instructions`) that no one read.
    fn try_apply_unanswered(
        &mut self,
        index: u64,
        _term: u64,
        payload: &[u8],
    ) -> std::io::Result<()> {
        Self::check_format(index, payload)?;
        self.apply_entry(index, payload);
        Ok(())
    }

    fn apply_empty(&mut self, index: u64) {
        self.last_applied = index;
    }

    fn snapshot(&self) -> Vec<u8> {
        self.snapshot_into(Vec::new())
    }

    fn snapshot_into(&self, buf: Vec<u8>) -> Vec<u8> {
        use std::sync::atomic::Ordering::Relaxed;
        let last = self.snapshot_bytes.load(Relaxed);
        let mut out =
            format::envelope_to_fill_in(buf, BROKER_STATE_FORMAT_VERSION, last + last / 8);
        out = postcard_extend(self, out).expect("state always encodes");
        out = postcard_extend(&self.sent_ids, out).expect("ids always encode");
        out = postcard_extend(&self.pop.fifo, out).expect("FIFO state always encodes");
        out = postcard_extend(&self.users, out).expect("users always encode");
        self.snapshot_bytes.store(out.len(), Relaxed);
        out
    }

    fn restore(&mut self, data: &[u8]) -> std::io::Result<()> {
        let (version, body) = format::versioned(
            || "the broker-state snapshot".to_string(),
            data,
            BROKER_STATE_FORMAT_VERSION,
        )?;
        let bad = |e: postcard::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let mut s: BrokerState = if version == 1 {
            postcard::from_bytes::<BrokerStateV1>(body)
                .map_err(bad)?
                .into()
        } else if version == 2 {
            postcard::from_bytes(body).map_err(bad)?
        } else if version == 3 {
            let (mut s, rest) = postcard::take_from_bytes::<BrokerState>(body).map_err(bad)?;
            s.sent_ids = postcard::from_bytes(rest).map_err(bad)?;
            s
        } else if version == 4 {
            let (mut s, rest) = postcard::take_from_bytes::<BrokerState>(body).map_err(bad)?;
            let (ids, rest) = postcard::take_from_bytes(rest).map_err(bad)?;
            s.sent_ids = ids;
            s.pop.fifo = postcard::from_bytes(rest).map_err(bad)?;
            s
        } else {
            let (mut s, rest) = postcard::take_from_bytes::<BrokerState>(body).map_err(bad)?;
            let (ids, rest) = postcard::take_from_bytes(rest).map_err(bad)?;
            s.sent_ids = ids;
            let (fifo, rest) = postcard::take_from_bytes(rest).map_err(bad)?;
            s.pop.fifo = fifo;
            s.users = postcard::from_bytes(rest).map_err(bad)?;
            s
        };
        s.topic_version += 1;
        s.producers_idle = None;
        for w in s.producers.values_mut() {
            w.max_sequence = w.recent.iter().map(|r| r.0).max().unwrap_or(0);
        }
        s.snapshot_bytes = data.len().into();
        *self = s;
        Ok(())
    }

    fn restart_image(&self, since: u64) -> Option<raftmq_raft_log::state_machine::ImageEncoder> {
        let taken = crate::restart::take(self, since);
        Some(Box::new(move |snapshot: &[u8]| taken.encode(snapshot)))
    }

    fn load_restart_images(&mut self, images: &[Vec<u8>]) -> std::io::Result<()> {
        *self = crate::restart::load(images)?;
        Ok(())
    }
}

/// The name of a `raftmq.v1.TopicMessageType` number.
pub fn type_name(t: u32) -> &'static str {
    match t {
        0 => "NORMAL",
        1 => "FIFO",
        2 => "DELAY",
        3 => "TRANSACTION",
        _ => "UNKNOWN",
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
                count: 2,
                tag_hash: pop::tag_hash(""),
                bytes: 2,
                store_ms: 1,
                position: 0,
            })
        );
        assert_eq!(
            q.find(0),
            Some(Run {
                first_offset: 0,
                log_index: 2,
                count: 3,
                tag_hash: pop::tag_hash(""),
                bytes: 3,
                store_ms: 1,
                position: 0,
            })
        );
        assert_eq!(q.find(5), None);
    }

    /// A `SendOnce` of messages with ids `ids` ("" = no id) to queue `queue` of topic "t".
    fn send_once(
        st: &mut BrokerState,
        index: u64,
        producer: u64,
        queue: u32,
        ids: &[&str],
    ) -> Reply {
        let cmd = Command::SendOnce {
            topic: "t".into(),
            queue,
            producer_id: producer,
            sequence: index,
            timestamp_ms: 1,
            id_property: "id".into(),
            messages: ids
                .iter()
                .map(|id| StoredBody {
                    key: String::new(),
                    tag: String::new(),
                    body: id.as_bytes().to_vec().into(),
                    properties: if id.is_empty() {
                        vec![("other".into(), "x".into())]
                    } else {
                        vec![("id".into(), id.to_string())]
                    },
                })
                .collect(),
        };
        Reply::decode(&st.apply(index, 1, &cmd.encode())).unwrap()
    }

    fn topic_t(queues: u32) -> BrokerState {
        let mut st = BrokerState::default();
        st.apply(
            1,
            1,
            &Command::CreateTopic {
                name: "t".into(),
                queues,
                update: false,
            }
            .encode(),
        );
        st
    }

    /// 70. A message id stored lately is not stored again, from any producer into any queue:
    ///     a batch holding one stores nothing and names where each copy is; its new messages
    ///     go again alone. Messages without an id are never copies.
    #[test]
    fn t70_send_once_stores_a_message_id_once() {
        let mut st = topic_t(4);
        let sent = |queue, first_offset, count, log_index| Reply::Sent {
            queue,
            first_offset,
            count,
            log_index,
            duplicate: false,
        };
        assert_eq!(
            send_once(&mut st, 2, 1, 0, &["A", "B", ""]),
            sent(0, 0, 3, 2)
        );
        // A retry through another front: another producer, another queue.
        assert_eq!(
            send_once(&mut st, 3, 2, 1, &["B"]),
            Reply::SentBefore(vec![Some((0, 1))])
        );
        assert_eq!(
            send_once(&mut st, 4, 2, 1, &["C", "A", ""]),
            Reply::SentBefore(vec![None, Some((0, 0)), None])
        );
        assert_eq!(st.queue("t", 1).unwrap().next_offset, 0, "nothing stored");
        assert_eq!(send_once(&mut st, 5, 2, 1, &["C", ""]), sent(1, 0, 2, 5));
        assert_eq!(send_once(&mut st, 6, 3, 2, &["", ""]), sent(2, 0, 2, 6));
        assert_eq!(st.messages_total, 7);
        // The same id in another topic is another message.
        let mut other = topic_t(1);
        assert_eq!(send_once(&mut other, 2, 1, 0, &["A"]), sent(0, 0, 1, 2));
    }

    /// 71. The ids are replicated state: two replicas applying the same entries remember the
    ///     same ids, forget the same oldest ones past SENT_IDS_MAX, and a snapshot keeps them.
    #[test]
    fn t71_sent_ids_are_bounded_and_kept_by_snapshots() {
        let mut a = topic_t(1);
        let mut b = topic_t(1);
        let ids: Vec<String> = (0..SENT_IDS_MAX + 5).map(|i| format!("m{i}")).collect();
        for (k, chunk) in ids.chunks(1000).enumerate() {
            let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
            for st in [&mut a, &mut b] {
                assert!(matches!(
                    send_once(st, 2 + k as u64, 1, 0, &chunk),
                    Reply::Sent { .. }
                ));
            }
        }
        assert_eq!(a.sent_ids.len(), SENT_IDS_MAX);
        assert_eq!(a.sent_ids, b.sent_ids);
        assert_eq!(
            a.sent_ids.get(SentIds::key("t", "m0")),
            None,
            "the oldest forgotten"
        );
        let last = SENT_IDS_MAX + 4;
        assert_eq!(
            a.sent_ids.get(SentIds::key("t", &format!("m{last}"))),
            Some((0, last as u64))
        );
        let mut back = BrokerState::default();
        back.restore(&a.snapshot()).unwrap();
        assert_eq!(back.sent_ids, a.sent_ids);
        assert_eq!(
            send_once(&mut back, 500, 9, 0, &["m7", "m3"]),
            Reply::SentBefore(vec![Some((0, 7)), None])
        );
    }

    /// A `Send` of one message per (key, id, timestamp) to queue 0 of topic "t".
    fn send_stamped(st: &mut BrokerState, index: u64, msgs: &[(&str, &str, u64)]) {
        for (i, (key, id, ms)) in msgs.iter().enumerate() {
            let cmd = Command::Send {
                topic: "t".into(),
                queue: 0,
                producer_id: 0,
                sequence: 0,
                timestamp_ms: *ms,
                messages: vec![StoredBody {
                    key: key.to_string(),
                    tag: String::new(),
                    body: b"body".to_vec().into(),
                    properties: vec![(P_MSGID.into(), id.to_string())],
                }],
            };
            st.apply(index + i as u64, 1, &cmd.encode());
        }
    }

    /// 72. Apply keeps, per queue, store times that never go down (a new leader's clock behind
    ///     the old one's is raised), the bytes held, and the id and key indexes; a `Trim` takes
    ///     the dropped messages out of all three. Two replicas agree; a commit takes the stamped
    ///     clock as its time.
    #[test]
    fn t72_store_times_bytes_and_lookup_indexes_follow_apply_and_trim() {
        let mut a = topic_t(1);
        let mut b = topic_t(1);
        let msgs = [
            ("k1", "id-1", 1000),
            ("k2 k3", "id-2", 2000),
            ("k1", "id-3", 1500), // a clock behind: stored at 2000
            ("", "id-4", 3000),
        ];
        send_stamped(&mut a, 10, &msgs);
        send_stamped(&mut b, 10, &msgs);
        let q = a.queue("t", 0).unwrap();
        assert_eq!(q, b.queue("t", 0).unwrap());
        let times: Vec<u64> = q.runs.iter().map(|r| r.store_ms).collect();
        assert_eq!(times, [1000, 2000, 2000, 3000]);
        assert_eq!(q.offset_at_time(0), 0);
        assert_eq!(q.offset_at_time(1001), 1);
        assert_eq!(q.offset_at_time(2500), 3);
        assert_eq!(
            q.offset_at_time(3001),
            4,
            "none stored after: the next offset"
        );
        let one = message_bytes(&BodyView {
            key: "k1",
            tag: "",
            body: b"body",
            properties: vec![(P_MSGID, "id-1")],
        });
        assert_eq!(q.bytes, 4 * one + 3 - 2, "keys of 2, 5, 2 and 0 bytes");
        assert_eq!(q.keys.candidates("k1", 0), [0, 2]);
        assert_eq!(q.keys.candidates("k3", 0), [1]);
        assert_eq!(q.keys.candidates("k2 k3", 0), [1]);
        assert_eq!(q.ids.candidates("id-4", 0), [3]);

        a.apply(20, 1, &Command::Trim { upto_log_index: 11 }.encode());
        let q = a.queue("t", 0).unwrap();
        assert_eq!(q.min_offset, 2);
        assert_eq!(q.bytes, 2 * one - 2);
        assert_eq!(q.keys.candidates("k1", q.min_offset), [2]);
        assert!(q.ids.candidates("id-1", q.min_offset).is_empty());

        a.apply(
            21,
            1,
            &Command::CommitOffset {
                group: "g".into(),
                topic: "t".into(),
                queue: 0,
                offset: 3,
            }
            .encode(),
        );
        assert_eq!(
            a.offset_times.get(&("g".into(), "t".into(), 0)),
            Some(&3000)
        );
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
        // Written into a used buffer (a dropped checkpoint's), the same bytes.
        assert_eq!(st.snapshot_into(vec![0xEE; snap.len() * 2]), snap);
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
mod scan_tests {
    use super::*;

    fn body(tag: &'static str) -> BodyView<'static> {
        BodyView {
            key: "",
            tag,
            body: b"x",
            properties: vec![],
        }
    }

    /// A queue of runs: [A A] [B B B] [A B] (offsets 0-1, 2-4, 5-6), the first trimmed away.
    fn queue(trim_first: bool) -> QueueState {
        let mut q = QueueState::default();
        q.append(1, 0, P_MSGID, &[body("A"), body("A")]);
        q.append(2, 0, P_MSGID, &[body("B"), body("B"), body("B")]);
        q.append(3, 0, P_MSGID, &[body("A"), body("B")]);
        if trim_first {
            q.runs.drop_front(1);
        }
        q
    }

    fn scan(q: &QueueState, from: u64, end: u64, tag: &str, max: usize) -> (Vec<u64>, u64) {
        let want = pop::tag_hash(tag);
        let mut got = Vec::new();
        let next = q.scan_tags(
            from,
            end,
            |h| h == want,
            |o| {
                got.push(o);
                got.len() < max
            },
        );
        (got, next)
    }

    /// The tag index finds exactly the offsets of a tag in uniform and mixed runs, stops where the
    /// visitor says (the cursor just past the last pick), and passes over what is not indexed.
    #[test]
    fn scan_tags_finds_a_tags_offsets_and_stops_where_asked() {
        let q = queue(false);
        assert_eq!(scan(&q, 0, 7, "A", 10), (vec![0, 1, 5], 7));
        assert_eq!(scan(&q, 0, 7, "B", 10), (vec![2, 3, 4, 6], 7));
        assert_eq!(scan(&q, 0, 7, "B", 2), (vec![2, 3], 4));
        assert_eq!(scan(&q, 3, 6, "B", 10), (vec![3, 4], 6));
        assert_eq!(scan(&q, 0, 7, "C", 10), (vec![], 7));
        assert_eq!(scan(&q, 7, 7, "A", 10), (vec![], 7));
        assert_eq!(scan(&queue(true), 0, 7, "A", 10), (vec![5], 7));
    }

    /// `runs_after` finds the same runs as a binary search over the whole queue: for queues of 0
    /// to 200 runs (over three chunks) whose entries repeat (several parts of one `SendMany`) and
    /// skip, and every index from before the first entry to past the last.
    #[test]
    fn runs_after_an_index_are_the_binary_searchs() {
        for len in 0..200u64 {
            let mut q = QueueState::default();
            let mut index = 3;
            for i in 0..len {
                // Steps of 0, 1 and 2 entries.
                index += i % 3;
                q.append(index, 0, P_MSGID, &[body("A")]);
            }
            let all: Vec<Run> = q.runs.iter().copied().collect();
            for since in 0..index + 3 {
                let want = all.partition_point(|r| r.log_index <= since);
                assert!(
                    q.runs_after(since).iter().eq(&all[want..]),
                    "{len} runs, after {since}"
                );
            }
        }
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

#[cfg(test)]
mod schedule_tests {
    use super::*;
    use crate::command::{Command, StoredBody};
    use raftmq_raft_log::StateMachine;

    fn apply(st: &mut BrokerState, index: u64, cmd: Command) -> Reply {
        Reply::decode(&st.apply(index, 1, &cmd.encode())).unwrap()
    }

    fn msg(id: &str) -> StoredBody {
        StoredBody {
            key: String::new(),
            tag: String::new(),
            body: id.as_bytes().to_vec().into(),
            properties: vec![(P_MSGID.into(), id.into())],
        }
    }

    fn topic(st: &mut BrokerState, index: u64, name: &str, message_type: u32) {
        let r = apply(
            st,
            index,
            Command::ConfigureTopic {
                name: name.into(),
                queues: 2,
                update: false,
                message_type,
            },
        );
        assert_eq!(r, Reply::Ok);
    }

    fn schedule(index: u64, producer: (u64, u64), times: &[u64], ids: &[&str]) -> Command {
        Command::Schedule {
            topic: "d".into(),
            queue: 1,
            producer_id: producer.0,
            sequence: producer.1,
            timestamp_ms: 1_000 + index,
            id_property: P_MSGID.into(),
            deliver_at_ms: times.to_vec(),
            replaces: vec![],
            messages: ids.iter().map(|i| msg(i)).collect(),
        }
    }

    fn deliver(now_ms: u64, due: &[(u64, u64, u32)], ids: &[&str]) -> Command {
        Command::Deliver {
            topic: "d".into(),
            queue: 1,
            now_ms,
            due: due.to_vec(),
            messages: ids.iter().map(|i| msg(i)).collect(),
        }
    }

    /// 1. A schedule waits in the timer (no offset, nothing readable); a delivery before its time,
    ///    or of a message that no longer waits, stores nothing; one at its time stores it once.
    #[test]
    fn t1_scheduled_messages_are_delivered_once_and_never_early() {
        let mut st = BrokerState::default();
        topic(&mut st, 1, "d", TYPE_DELAY);
        let r = apply(
            &mut st,
            2,
            schedule(2, (7, 1), &[5_000, 9_000], &["a", "b"]),
        );
        assert_eq!(
            r,
            Reply::Scheduled {
                queue: 1,
                count: 2,
                log_index: 2,
                duplicate: false
            }
        );
        assert_eq!(
            st.queue("d", 1).unwrap().next_offset,
            0,
            "nothing readable yet"
        );
        assert_eq!(st.timer.len(), 2);
        assert_eq!(st.timer.topic("d"), (2, Some(5_000)));
        // The producer window and the id record answer a retry without storing it again.
        let again = apply(
            &mut st,
            3,
            schedule(3, (7, 1), &[5_000, 9_000], &["a", "b"]),
        );
        assert!(matches!(
            again,
            Reply::Scheduled {
                duplicate: true,
                log_index: 2,
                ..
            }
        ));
        let copy = apply(&mut st, 4, schedule(4, (8, 1), &[5_000], &["a"]));
        assert_eq!(copy, Reply::SentBefore(vec![Some((1, SCHEDULED))]));
        assert_eq!(st.timer.len(), 2);
        // Early: refused, nothing stored.
        let early = apply(&mut st, 5, deliver(4_999, &[(5_000, 2, 0)], &["a"]));
        assert!(matches!(early, Reply::NotScheduled(_)), "{early:?}");
        assert_eq!(st.queue("d", 1).unwrap().next_offset, 0);
        // On time.
        let r = apply(&mut st, 6, deliver(5_001, &[(5_000, 2, 0)], &["a"]));
        assert!(
            matches!(
                r,
                Reply::Sent {
                    queue: 1,
                    first_offset: 0,
                    count: 1,
                    ..
                }
            ),
            "{r:?}"
        );
        let q = st.queue("d", 1).unwrap();
        assert_eq!(q.next_offset, 1);
        assert_eq!(q.runs[0].store_ms, 5_001, "stored at the delivery's clock");
        // A repeat of the same delivery (a new leader proposing it again) stores nothing.
        let r = apply(&mut st, 7, deliver(5_002, &[(5_000, 2, 0)], &["a"]));
        assert!(matches!(r, Reply::NotScheduled(_)));
        // All or nothing: one stale message in a delivery keeps the other waiting.
        let r = apply(
            &mut st,
            8,
            deliver(9_500, &[(9_000, 2, 1), (5_000, 2, 0)], &["b", "a"]),
        );
        assert!(matches!(r, Reply::NotScheduled(_)));
        assert_eq!(st.timer.len(), 1);
        assert_eq!(st.queue("d", 1).unwrap().next_offset, 1);
        // A delivery to another queue than the one scheduled stores nothing.
        let mut other = deliver(9_500, &[(9_000, 2, 1)], &["b"]);
        if let Command::Deliver { queue, .. } = &mut other {
            *queue = 0;
        }
        assert!(matches!(apply(&mut st, 9, other), Reply::NotScheduled(_)));
        assert_eq!(st.messages_total, 1);
    }

    /// 2. Recall drops a waiting message once; a recalled message is never delivered.
    #[test]
    fn t2_recall_cancels_a_waiting_message() {
        let mut st = BrokerState::default();
        topic(&mut st, 1, "d", TYPE_DELAY);
        apply(&mut st, 2, schedule(2, (0, 0), &[5_000], &["a"]));
        let recall = || Command::Recall {
            topic: "d".into(),
            queue: 1,
            deliver_at_ms: 5_000,
            log_index: 2,
            position: 0,
        };
        assert_eq!(apply(&mut st, 3, recall()), Reply::Ok);
        assert!(matches!(
            apply(&mut st, 4, recall()),
            Reply::NotScheduled(_)
        ));
        let r = apply(&mut st, 5, deliver(6_000, &[(5_000, 2, 0)], &["a"]));
        assert!(matches!(r, Reply::NotScheduled(_)));
        assert!(st.timer.is_empty());
        assert_eq!(st.timer.oldest_entry(), None);
    }

    /// 3. A NORMAL topic refuses a schedule; retention never trims an entry whose message waits;
    ///    deleting the topic drops its waiting messages.
    #[test]
    fn t3_type_retention_and_delete() {
        let mut st = BrokerState::default();
        topic(&mut st, 1, "n", 0);
        let mut cmd = schedule(2, (0, 0), &[5_000], &["a"]);
        if let Command::Schedule { topic, .. } = &mut cmd {
            *topic = "n".into();
        }
        let r = apply(&mut st, 2, cmd);
        assert!(
            matches!(&r, Reply::Invalid(m) if m.contains("only a DELAY topic")),
            "{r:?}"
        );
        topic(&mut st, 3, "d", TYPE_DELAY);
        apply(&mut st, 4, schedule(4, (0, 0), &[5_000], &["a"]));
        apply(&mut st, 5, schedule(5, (0, 0), &[9_000], &["b"]));
        assert_eq!(
            apply(&mut st, 6, Command::Trim { upto_log_index: 5 }),
            Reply::Ok
        );
        assert_eq!(st.trimmed_index, 3, "held below entry 4");
        apply(&mut st, 7, deliver(6_000, &[(5_000, 4, 0)], &["a"]));
        apply(&mut st, 8, Command::Trim { upto_log_index: 7 });
        assert_eq!(st.trimmed_index, 4, "entry 5 still waits");
        assert_eq!(
            apply(&mut st, 9, Command::DeleteTopic { name: "d".into() }),
            Reply::Ok
        );
        assert!(st.timer.is_empty());
        apply(&mut st, 10, Command::Trim { upto_log_index: 9 });
        assert_eq!(st.trimmed_index, 9);
    }

    /// 4. A roll moves a waiting message to a new entry with its time; a roll of a message that
    ///    no longer waits stores nothing.
    #[test]
    fn t4_a_roll_moves_a_waiting_message() {
        let mut st = BrokerState::default();
        topic(&mut st, 1, "d", TYPE_DELAY);
        apply(&mut st, 2, schedule(2, (0, 0), &[50_000], &["a"]));
        let mut roll = schedule(3, (0, 0), &[50_000], &["a"]);
        if let Command::Schedule { replaces, .. } = &mut roll {
            *replaces = vec![(2, 0)];
        }
        let r = apply(&mut st, 3, roll.clone());
        assert!(matches!(r, Reply::Scheduled { log_index: 3, .. }), "{r:?}");
        assert_eq!(st.timer.oldest_entry(), Some(3));
        assert_eq!(st.timer.len(), 1);
        assert!(matches!(apply(&mut st, 4, roll), Reply::NotScheduled(_)));
        let r = apply(&mut st, 5, deliver(50_000, &[(50_000, 3, 0)], &["a"]));
        assert!(matches!(r, Reply::Sent { count: 1, .. }));
    }

    /// 5. Two replicas applying the same entries agree (their own clocks play no part). One
    ///    restored from a snapshot taken at the retention point, then fed the retained entries
    ///    after it (as a restart or a snapshot install does), rebuilds the same timer.
    #[test]
    fn t5_replicas_agree_and_a_restored_one_rebuilds_the_timer() {
        let mut log: Vec<Command> = vec![Command::ConfigureTopic {
            name: "d".into(),
            queues: 2,
            update: false,
            message_type: TYPE_DELAY,
        }];
        for i in 0..20u64 {
            let id = format!("x{i}");
            log.push(schedule(i + 2, (0, 0), &[1_000 * (i % 5)], &[&id]));
        }
        // Entry 22: held at 1 (entry 2 waits). 23 delivers entries 2..4; 24 trims up to 4.
        log.push(Command::Trim { upto_log_index: 15 });
        log.push(deliver(
            2_500,
            &[(0, 2, 0), (1_000, 3, 0), (2_000, 4, 0)],
            &["x0", "x1", "x2"],
        ));
        log.push(Command::Trim { upto_log_index: 15 });
        let encoded: Vec<Vec<u8>> = log.iter().map(Command::encode).collect();
        let mut a = BrokerState::default();
        let mut b = BrokerState::default();
        for (i, c) in encoded.iter().enumerate() {
            let i = i as u64 + 1;
            assert_eq!(a.apply(i, 1, c), b.apply(i, 1, c), "entry {i}");
        }
        assert_eq!(a.trimmed_index, 4);
        assert_eq!(a.timer.len(), 17);
        // The snapshot at the retention point: entries 1..=4 applied.
        let mut early = BrokerState::default();
        for (i, c) in encoded.iter().enumerate().take(4) {
            early.apply(i as u64 + 1, 1, c);
        }
        let mut restored = BrokerState::default();
        restored.restore(&early.snapshot()).unwrap();
        for (i, c) in encoded.iter().enumerate().skip(4) {
            restored.apply(i as u64 + 1, 1, c);
        }
        for st in [&b, &restored] {
            assert_eq!(st.timer.len(), a.timer.len());
            assert_eq!(st.timer.topic("d"), a.timer.topic("d"));
            assert_eq!(st.timer.oldest_entry(), Some(5));
            assert_eq!(
                st.timer.due(3_000, 100, |_| false),
                a.timer.due(3_000, 100, |_| false)
            );
        }
    }
    fn end_txn(check_at: u64, at: (u64, u32), commit: bool, id: &str) -> Command {
        Command::EndTxn {
            topic: "x".into(),
            queue: 1,
            now_ms: 5_000,
            check_at_ms: check_at,
            log_index: at.0,
            position: at.1,
            commit,
            messages: if commit { vec![msg(id)] } else { vec![] },
        }
    }

    /// 6. A TRANSACTION topic's messages wait as half messages: never delivered by time, stored
    ///    by a commit once (a repeat finds nothing), dropped by a rollback; a check-back moves
    ///    one (same transaction), after which only its new place ends it.
    #[test]
    fn t6_half_messages_end_once_by_commit_or_rollback() {
        let mut st = BrokerState::default();
        topic(&mut st, 1, "x", TYPE_TRANSACTION);
        let mut half = schedule(2, (7, 1), &[60_000, 60_000, 60_000], &["a", "b", "c"]);
        if let Command::Schedule { topic, .. } = &mut half {
            *topic = "x".into();
        }
        assert!(matches!(
            apply(&mut st, 2, half),
            Reply::Scheduled { count: 3, .. }
        ));
        assert_eq!(st.timer.count("x"), 3);
        assert!(
            st.timer.due(u64::MAX, 10, |_| false).is_empty(),
            "never due by time"
        );
        // A Deliver cannot carry a half message out.
        let mut d = deliver(70_000, &[(60_000, 2, 0)], &["a"]);
        if let Command::Deliver { topic, .. } = &mut d {
            *topic = "x".into();
        }
        assert!(matches!(apply(&mut st, 3, d), Reply::NotScheduled(_)));
        // Commit a: stored once.
        let r = apply(&mut st, 4, end_txn(60_000, (2, 0), true, "a"));
        assert!(
            matches!(
                r,
                Reply::Sent {
                    first_offset: 0,
                    count: 1,
                    ..
                }
            ),
            "{r:?}"
        );
        let r = apply(&mut st, 5, end_txn(60_000, (2, 0), true, "a"));
        assert!(matches!(r, Reply::NotScheduled(_)), "{r:?}");
        assert_eq!(st.queue("x", 1).unwrap().next_offset, 1);
        // Roll back b.
        assert_eq!(
            apply(&mut st, 6, end_txn(60_000, (2, 1), false, "")),
            Reply::Ok
        );
        assert!(st.timer.txn((2, 1)).is_none());
        // A check-back moves c to entry 7 (next check at 120 s), keeping its transaction.
        let mut c = msg("c");
        c.properties.push((ORIGIN_PROPERTY.into(), "2.2".into()));
        let roll = Command::Schedule {
            topic: "x".into(),
            queue: 1,
            producer_id: 0,
            sequence: 0,
            timestamp_ms: 60_001,
            id_property: String::new(),
            deliver_at_ms: vec![120_000],
            replaces: vec![(2, 2)],
            messages: vec![c],
        };
        let r = apply(&mut st, 7, roll);
        assert!(matches!(r, Reply::Scheduled { .. }), "{r:?}");
        let w = st.timer.txn((2, 2)).unwrap();
        assert_eq!((w.log_index, w.deliver_at_ms), (7, 120_000));
        let r = apply(&mut st, 8, end_txn(60_000, (2, 2), true, "c"));
        assert!(matches!(r, Reply::NotScheduled(_)), "the old place: {r:?}");
        let r = apply(&mut st, 9, end_txn(120_000, (7, 0), true, "c"));
        assert!(
            matches!(
                r,
                Reply::Sent {
                    first_offset: 1,
                    ..
                }
            ),
            "{r:?}"
        );
        assert_eq!(st.timer.count("x"), 0);
        assert_eq!(
            st.timer.oldest_entry(),
            None,
            "retention may pass every entry"
        );
    }
}

#[cfg(test)]
mod send_many_tests {
    use super::*;
    use crate::command::{Command, SendPart, StoredBody};
    use raftmq_raft_log::StateMachine;

    fn apply(st: &mut BrokerState, index: u64, cmd: &Command) -> Reply {
        Reply::decode(&st.apply(index, 1, &cmd.encode())).unwrap()
    }

    fn body(b: &str, tag: &str) -> StoredBody {
        StoredBody {
            key: String::new(),
            tag: tag.into(),
            body: b.as_bytes().to_vec().into(),
            properties: vec![(P_MSGID.into(), format!("id-{b}"))],
        }
    }

    fn part(topic: &str, queue: u32, producer_id: u64, sequence: u64, count: u32) -> SendPart {
        SendPart {
            topic: topic.into(),
            queue,
            producer_id,
            sequence,
            count,
        }
    }

    /// Two topics of two queues; a `SendMany` at index 3 of: a, b → t/1; c → u/0; d → "gone"
    /// (no such topic); e, f → t/1 again (a second run of the same queue in one entry).
    fn state() -> (BrokerState, Command) {
        let mut st = BrokerState::default();
        for (i, t) in ["t", "u"].into_iter().enumerate() {
            let create = Command::ConfigureTopic {
                name: t.into(),
                queues: 2,
                update: false,
                message_type: 0,
            };
            assert_eq!(apply(&mut st, 1 + i as u64, &create), Reply::Ok);
        }
        let many = Command::SendMany {
            timestamp_ms: 50,
            parts: vec![
                part("t", 1, 7, 1, 2),
                part("u", 0, 8, 1, 1),
                part("gone", 0, 9, 1, 1),
                part("t", 1, 10, 1, 2),
            ],
            messages: vec![
                body("a", "x"),
                body("b", "y"),
                body("c", "x"),
                body("d", "x"),
                body("e", "x"),
                body("f", "x"),
            ],
        };
        (st, many)
    }

    fn sent(queue: u32, first_offset: u64, count: u32, log_index: u64, dup: bool) -> Reply {
        Reply::Sent {
            queue,
            first_offset,
            count,
            log_index,
            duplicate: dup,
        }
    }

    /// A `SendMany` of one message to t/0 from (`producer_id`, `sequence`), applied at `index`.
    fn send_one(st: &mut BrokerState, index: u64, producer_id: u64, sequence: u64) -> Reply {
        let many = Command::SendMany {
            timestamp_ms: 1,
            parts: vec![part("t", 0, producer_id, sequence, 1)],
            messages: vec![body("a", "")],
        };
        apply(st, index, &many)
    }

    /// 1. Each part is stored as its own `Send` would be, one refused part refusing only itself;
    ///    each run knows where in the entry its messages start, so reads and ids find them.
    #[test]
    fn t1_each_part_is_a_run_at_its_position_in_the_entry() {
        let (mut st, many) = state();
        let reply = apply(&mut st, 3, &many);
        assert_eq!(
            reply,
            Reply::SentMany(vec![
                (sent(1, 0, 2, 3, false), 0),
                (sent(0, 0, 1, 3, false), 2),
                (Reply::TopicNotFound("gone".into()), 3),
                (sent(1, 2, 2, 3, false), 4),
            ])
        );
        assert_eq!(st.messages_total, 5);
        let t1 = st.queue("t", 1).unwrap();
        assert_eq!(
            t1.runs
                .iter()
                .map(|r| (r.log_index, r.position, r.count))
                .collect::<Vec<_>>(),
            vec![(3, 0, 2), (3, 4, 2)]
        );
        // The first run has two tags, the second one.
        assert_eq!(t1.runs[0].tag_hash, TAGS_MIXED);
        assert_eq!(t1.runs[1].tag_hash, pop::tag_hash("x"));
        assert_eq!(t1.ids.candidates("id-e", 0), vec![2]);
        assert_eq!(st.queue("u", 0).unwrap().runs[0].position, 2);

        // What a pull of t/1 from offset 1 serves: b (position 1), e, f (positions 4, 5).
        let data = Bytes::from(many.encode());
        let mut out = Vec::new();
        for r in t1.runs.iter() {
            let from = 1u64.max(r.first_offset);
            crate::service::reads::run_messages("B", 1, r, &data, from, 10, &mut out).unwrap();
        }
        let got: Vec<(u64, &[u8], &str)> = out
            .iter()
            .map(|m| (m.offset, &m.body[..], m.msg_id.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, &b"b"[..], "B-0000000000000003-0001"),
                (2, &b"e"[..], "B-0000000000000003-0004"),
                (3, &b"f"[..], "B-0000000000000003-0005"),
            ]
        );
    }

    /// 2. A retried `SendMany` stores nothing twice: each part already stored is answered from
    ///    its producer window with the position its messages have in the first entry, and a part
    ///    refused the first time is tried again.
    #[test]
    fn t2_a_repeat_is_answered_part_by_part_from_the_producer_windows() {
        let (mut st, many) = state();
        apply(&mut st, 3, &many);
        let again = apply(&mut st, 4, &many);
        assert_eq!(
            again,
            Reply::SentMany(vec![
                (sent(1, 0, 2, 3, true), 0),
                (sent(0, 0, 1, 3, true), 2),
                (Reply::TopicNotFound("gone".into()), 3),
                (sent(1, 2, 2, 3, true), 4),
            ])
        );
        assert_eq!(st.messages_total, 5);
        assert_eq!(st.queue("t", 1).unwrap().next_offset, 4);
    }

    /// 4. Past `PRODUCERS_MAX` windows the one idle the longest is forgotten (the lowest id among
    ///    equals), the same after a snapshot is restored, and the same again once the idle order
    ///    is kept (it is built when the windows first reach the cap).
    #[test]
    fn t4_the_producer_idle_the_longest_is_forgotten_first() {
        let (mut st, _) = state();
        let send = send_one;
        for p in 1..=PRODUCERS_MAX as u64 {
            send(&mut st, 10 + p, p, 1);
        }
        // Producer 1 sends again: producer 2 is now the one idle the longest.
        send(&mut st, 20_000, 1, 2);
        let mut restored = BrokerState::default();
        restored.restore(&st.snapshot()).unwrap();
        for st in [&mut st, &mut restored] {
            send(st, 20_001, 1_000_000, 1);
            assert_eq!(st.producers.len(), PRODUCERS_MAX);
            assert!(st.producers.contains_key(&1));
            assert!(!st.producers.contains_key(&2));
            assert!(st.producers.contains_key(&3));
            // Producer 1's window still answers its first batch as a repeat.
            let again = send(st, 20_002, 1, 1);
            assert!(
                matches!(&again, Reply::SentMany(r) if matches!(r[0].0, Reply::Sent { duplicate: true, .. })),
                "{again:?}"
            );
            // From the cap on, the idle order is kept batch by batch: producer 3 sends again, so
            // the next new one forgets producer 4, not 3.
            send(st, 20_003, 3, 2);
            send(st, 20_004, 1_000_001, 1);
            assert!(st.producers.contains_key(&3));
            assert!(!st.producers.contains_key(&4));
            assert!(st.producers.contains_key(&5));
        }
    }

    /// 6. A single-flight lane (`SINGLE_FLIGHT_SEQUENCE` on its sequences) keeps only its newest
    ///    batch: a repeat of it is answered from the window, an older batch is refused and stores
    ///    nothing, and a snapshot keeps both. A lane without the mark keeps its recent batches.
    #[test]
    fn t6_a_single_flight_lane_keeps_only_its_newest_batch() {
        const S: u64 = SINGLE_FLIGHT_SEQUENCE;
        let (mut st, _) = state();
        // The answer of the entry's one part.
        let send = |st: &mut BrokerState, index: u64, producer_id: u64, sequence: u64| {
            let Reply::SentMany(mut parts) = send_one(st, index, producer_id, sequence) else {
                panic!("a SendMany is answered part by part");
            };
            parts.remove(0).0
        };
        for seq in 1..=5 {
            send(&mut st, 10 + seq, 1, S | seq);
            send(&mut st, 20 + seq, 2, seq);
        }
        assert_eq!(st.producers[&1].recent.len(), 1);
        assert_eq!(st.producers[&2].recent.len(), 5);
        let mut restored = BrokerState::default();
        restored.restore(&st.snapshot()).unwrap();
        for st in [&mut st, &mut restored] {
            let stored = st.messages_total;
            assert_eq!(send(st, 30, 1, S | 5), sent(0, 8, 1, 15, true));
            let older = send(st, 31, 1, S | 4);
            let Reply::Invalid(why) = &older else {
                panic!("an older batch is refused: {older:?}");
            };
            assert!(
                why.contains("batch 4 of producer 1 is older than the newest stored (5)"),
                "{why}"
            );
            // The unmarked lane still answers an older batch from its window.
            assert_eq!(send(st, 32, 2, 2), sent(0, 3, 1, 22, true));
            assert_eq!(st.messages_total, stored, "nothing stored again");
            // Its next batch is stored, and is then the one kept.
            assert_eq!(send(st, 33, 1, S | 6), sent(0, 10, 1, 33, false));
            assert_eq!(st.producers[&1].recent.len(), 1);
        }
    }

    /// 3. Parts that do not add up to the entry's messages store nothing.
    #[test]
    fn t3_parts_that_miscount_the_messages_store_nothing() {
        let (mut st, mut many) = state();
        if let Command::SendMany { parts, .. } = &mut many {
            parts[0].count = 3;
        }
        let reply = apply(&mut st, 3, &many);
        assert!(
            matches!(&reply, Reply::Invalid(r) if r == "a send to 4 queues counts 7 messages but carries 6"),
            "{reply:?}"
        );
        assert_eq!(st.messages_total, 0);
    }

    /// 5. An entry no proposer waits on (a follower's: `try_apply_unanswered`, which builds no
    ///    reply) changes the state exactly as an answered one: stores, repeats answered from the
    ///    producer windows, ids sent before, a miscounted entry, a deleted topic, a retention trim.
    #[test]
    fn t5_an_unanswered_entry_changes_the_state_as_an_answered_one() {
        use raftmq_raft_log::StateMachine as _;
        let (_, many) = state();
        let mut miscounted = many.clone();
        if let Command::SendMany { parts, .. } = &mut miscounted {
            parts[0].count = 3;
        }
        let once = |sequence: u64, ids: [&str; 2]| Command::SendOnce {
            topic: "u".into(),
            queue: 1,
            producer_id: 40,
            sequence,
            timestamp_ms: 70,
            id_property: P_MSGID.into(),
            messages: ids.iter().map(|b| body(b, "x")).collect(),
        };
        let history = [
            many.clone(),
            many.clone(),
            miscounted,
            once(1, ["a", "z"]),
            once(2, ["z", "y"]),
            Command::DeleteTopic { name: "u".into() },
            many,
            Command::Trim { upto_log_index: 4 },
        ];
        let (mut answered, _) = state();
        let (mut unanswered, _) = state();
        for (i, cmd) in history.iter().enumerate() {
            let index = 3 + i as u64;
            let payload = cmd.encode();
            answered.try_apply(index, 1, &payload).unwrap();
            unanswered.try_apply_unanswered(index, 1, &payload).unwrap();
            // Field by field: the producer windows encode in their map's hash order, which
            // differs between two equal states.
            let at = format!("after entry {index}");
            assert_eq!(unanswered.topics, answered.topics, "{at}");
            assert_eq!(unanswered.producers, answered.producers, "{at}");
            assert_eq!(unanswered.sent_ids, answered.sent_ids, "{at}");
            assert_eq!(
                (unanswered.messages_total, unanswered.trimmed_index),
                (answered.messages_total, answered.trimmed_index),
                "{at}"
            );
            assert_eq!(unanswered.topic_version, answered.topic_version, "{at}");
            assert_eq!(unanswered.last_applied, index, "{at}");
        }
        // Stored: the first `SendMany`'s 5 and the first `SendOnce`'s 2; the rest were repeats,
        // ids sent before, miscounted or to a deleted topic.
        assert_eq!(answered.messages_total, 7);
    }
}
