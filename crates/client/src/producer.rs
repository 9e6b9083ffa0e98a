//! The producer: queue choice, batching, the in-flight window, retries, idempotence.
//!
//! [`Producer::send`] picks the message's target — the queue of its key's hash, or "any queue" for
//! messages without a key — and hands it to one batcher task. The batcher keeps an open batch per
//! target and dispatches a batch when it is full or has waited `linger`, as long as fewer than
//! `inflight_batches_max` batches are in flight in all, fewer than `broker_inflight_batches_max`
//! to the target's broker group, and a *lane* of its queue is free. Messages that arrive while the
//! window is full therefore gather into bigger batches by themselves, so a linger of zero (the
//! default) already batches under load without delaying a lone message. The window per broker
//! group is small (2) on purpose: a leader spends much of its time per batch rather than per
//! message (an RPC, a log entry, a replication round), so under load two big batches in flight
//! beat many small ones — on a local three-node group, 256 messages in flight went from 50-54k to
//! 54-62k msg/s and p99 from ~13 to ~8 ms in interleaved runs.
//!
//! A lane is a stream of batches to one queue with at most one batch in flight, its own producer
//! id (drawn at random) and its own sequences. Keyed messages use a single lane per queue, which
//! keeps each key's messages in order even across retries. Messages without a key promise no
//! order, so each queue has `unkeyed_lanes_per_queue` more lanes for them, and several of their
//! batches ride the same Raft commit. A batch carries `(producer_id, sequence)`; a retry reuses
//! both, so the broker stores it once. The broker remembers a bounded window of recent batches per
//! producer id, and with one batch in flight per lane a retry is always the newest batch of its id
//! — however many batches other lanes acknowledged while it waited out a failover with backoff (a
//! producer-wide id let a slow retry fall out of the window and be stored twice). Its sequences
//! say so (`raftmq_proto::limits::SINGLE_FLIGHT_SEQUENCE`), and the broker keeps only the newest
//! batch of such a lane: a producer over 8,000 queues no longer costs it 8,000 windows of 256.
//! Retries follow `NOT_LEADER` hints at once, move to another node at once on connection errors
//! and short attempt timeouts, and back off on unavailability (see the router) until the send
//! timeout; then every message of the batch fails with [`Error::Timeout`].
//!
//! Limits are the target broker group's: each group publishes the send limits it enforces (body,
//! properties, messages and bytes per batch) through the nameservers, and the route carries them
//! (the contract's defaults, `raftmq_proto::limits`, for a group that did not say). A message
//! above its group's body or properties limit is refused before it is sent; a message without a
//! key, which may go to any group of the topic, is held to the strictest of them. Batches are
//! closed at the smaller of this producer's limits and the group's.

use std::collections::{BTreeMap, HashMap as StdHashMap, HashSet as StdHashSet};
use std::sync::Arc;
use std::time::Duration;

use raftmq_proto::limits::{SEND_PART_OVERHEAD_BYTES, SINGLE_FLIGHT_SEQUENCE, SendLimits};
use raftmq_proto::v1;
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::conn::{MESSAGE_BYTES_MAX, request};
use crate::error::{Error, Result};
use crate::nameserver::{TopicRoute, parse_nameservers};
use crate::queue::{QueueId, QueueSelector, queue_for_key};
use crate::router::{RetryPolicy, Router};
use crate::security::ClientSecurity;

/// The batcher's maps, keyed by this producer's own topics and queues: hashed with foldhash
/// rather than SipHash, whose cost dominated a producer spreading over a thousand topics
/// (every message looks up its topic, queue and lane several times).
type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;
type HashSet<K> = StdHashSet<K, foldhash::fast::RandomState>;

/// The contract's default send limits (`raftmq_proto::limits`): what a broker group enforces
/// unless configured otherwise, and what the producer checks against until it knows the group's.
pub use raftmq_proto::limits::{BATCH_BYTES_MAX, BATCH_MESSAGES_MAX, BODY_BYTES_MAX};

/// A message to send.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// Messages with the same non-empty key go to the same queue, in order.
    pub key: String,
    pub tag: String,
    pub body: Vec<u8>,
    pub properties: std::collections::BTreeMap<String, String>,
}

impl Message {
    pub fn new(body: impl Into<Vec<u8>>) -> Self {
        Message {
            body: body.into(),
            ..Default::default()
        }
    }

    pub fn with_key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    pub fn with_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = tag.into();
        self
    }

    pub fn with_property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// The message's message group (a FIFO topic needs one): messages of one group go to one
    /// queue, in order. It is the routing key too, unless the message has a key.
    pub fn message_group(mut self, group: impl Into<String>) -> Self {
        let group = group.into();
        if self.key.is_empty() {
            self.key = group.clone();
        }
        self.with_property(raftmq_proto::MESSAGE_GROUP_PROPERTY, group)
    }

    /// Schedules the message (a DELAY topic): stored now, readable from `ms` since the epoch on.
    /// A time in the past is delivered at once.
    pub fn deliver_at_ms(self, ms: u64) -> Self {
        self.with_property(raftmq_proto::DELIVER_AT_PROPERTY, ms.to_string())
    }

    fn wire_bytes(&self) -> usize {
        self.key.len()
            + self.tag.len()
            + self.body.len()
            + self
                .properties
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>()
            + 16
    }
}

/// Where an acknowledged message was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReceipt {
    pub topic: String,
    pub broker: String,
    pub queue: u32,
    pub offset: u64,
    pub msg_id: String,
    /// The broker had stored this batch before (the reply to an idempotent retry).
    pub duplicate: bool,
    /// A scheduled message: when it becomes readable (ms since the epoch; its `offset` is 0
    /// until then). 0 for a message readable now.
    pub deliver_at_ms: u64,
}

/// Producer settings; see [`ProducerBuilder`] for what each one does.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    pub linger: Duration,
    pub batch_messages_max: usize,
    pub batch_bytes_max: usize,
    pub inflight_batches_max: usize,
    /// Batches in flight at once to one broker group (its leader).
    pub broker_inflight_batches_max: usize,
    /// Batches of messages without a key in flight at once per queue (each on its own lane).
    pub unkeyed_lanes_per_queue: usize,
    pub pending_messages_max: usize,
    pub send_timeout: Duration,
    pub route_refresh: Duration,
    pub retry: RetryPolicy,
    /// TLS and request signing of every connection (default: plaintext, unsigned).
    pub security: ClientSecurity,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            linger: Duration::ZERO,
            batch_messages_max: BATCH_MESSAGES_MAX,
            batch_bytes_max: BATCH_BYTES_MAX - raftmq_proto::limits::BATCH_HEADROOM_BYTES,
            inflight_batches_max: 64,
            broker_inflight_batches_max: 2,
            unkeyed_lanes_per_queue: 4,
            pending_messages_max: 10_000,
            send_timeout: Duration::from_secs(10),
            route_refresh: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            security: ClientSecurity::default(),
        }
    }
}

/// Builds a [`Producer`].
#[derive(Debug, Clone)]
pub struct ProducerBuilder {
    nameservers: Vec<String>,
    config: ProducerConfig,
}

impl ProducerBuilder {
    /// How long a batch that is not full may wait for more messages (default 0: send as soon as
    /// the window allows; batches still form while the window is full).
    pub fn linger(mut self, d: Duration) -> Self {
        self.config.linger = d;
        self
    }

    /// Most batches awaiting acknowledgement at once (default 64).
    pub fn inflight_batches(mut self, n: usize) -> Self {
        self.config.inflight_batches_max = n.max(1);
        self
    }

    /// Most batches awaiting acknowledgement at once from one broker group (default 2). Messages
    /// sent meanwhile gather into the next batch, so a small window makes big batches under load.
    pub fn broker_inflight_batches(mut self, n: usize) -> Self {
        self.config.broker_inflight_batches_max = n.max(1);
        self
    }

    /// Most batches of messages without a key in flight at once per queue (default 4). Keyed
    /// messages always have at most one batch in flight per queue, which keeps them in order.
    pub fn unkeyed_lanes_per_queue(mut self, n: usize) -> Self {
        self.config.unkeyed_lanes_per_queue = n.max(1);
        self
    }

    /// Most messages per batch (default and maximum 1,000).
    pub fn batch_messages(mut self, n: usize) -> Self {
        self.config.batch_messages_max = n.clamp(1, BATCH_MESSAGES_MAX);
        self
    }

    /// How long a send may retry before it fails (default 10 s).
    pub fn send_timeout(mut self, d: Duration) -> Self {
        self.config.send_timeout = d;
        self
    }

    /// How often routes are fetched again from the nameservers (default 30 s; also on errors).
    pub fn route_refresh(mut self, d: Duration) -> Self {
        self.config.route_refresh = d;
        self
    }

    pub fn retry_policy(mut self, p: RetryPolicy) -> Self {
        self.config.retry = p;
        self
    }

    /// TLS and request signing for every connection, to nameservers and nodes (default:
    /// plaintext, unsigned).
    pub fn security(mut self, s: ClientSecurity) -> Self {
        self.config.security = s;
        self
    }

    /// Starts the producer. Needs a Tokio runtime; does not contact the cluster yet.
    pub fn build(self) -> Result<Producer> {
        let router = Router::new(
            self.nameservers,
            self.config.retry.clone(),
            self.config.security.clone(),
        )?;
        let (batcher, tx) = Batcher::new(router.clone(), self.config.clone());
        let task = tokio::spawn(batcher.run());
        Ok(Producer {
            tx,
            router,
            config: self.config,
            task,
        })
    }
}

/// Sends messages to topics; cheap to share behind an `Arc`, every method takes `&self`.
///
/// ```no_run
/// use raftmq_client::{Message, Producer};
///
/// # async fn example() -> raftmq_client::Result<()> {
/// let producer = Producer::builder("127.0.0.1:9876").build()?;
/// let receipt = producer
///     .send("orders", Message::new("hello").with_key("customer-7"))
///     .await?;
/// println!("stored at {}/{} offset {}", receipt.broker, receipt.queue, receipt.offset);
/// producer.close().await;
/// # Ok(())
/// # }
/// ```
pub struct Producer {
    tx: mpsc::Sender<Pending>,
    router: Arc<Router>,
    config: ProducerConfig,
    task: JoinHandle<()>,
}

impl Producer {
    /// A builder for nameservers given as `"host:port;host:port"`.
    pub fn builder(nameservers: &str) -> ProducerBuilder {
        ProducerBuilder {
            nameservers: parse_nameservers(nameservers),
            config: ProducerConfig::default(),
        }
    }

    /// Sends one message and waits for its acknowledgement (stored on a majority, on disk).
    /// Many `send` futures may be awaited concurrently; they are batched together.
    pub async fn send(&self, topic: &str, message: Message) -> Result<SendReceipt> {
        let deadline = Instant::now() + self.config.send_timeout;
        // Above what any group may be configured to accept: refused before a route is fetched.
        if message.body.len() > raftmq_proto::limits::BODY_BYTES_CONFIG_MAX {
            return Err(body_too_large(
                message.body.len(),
                raftmq_proto::limits::BODY_BYTES_CONFIG_MAX,
            ));
        }
        // The cached route without awaiting; fetching one is boxed, so the future of every send
        // stays small (a caller keeping hundreds in flight moves and stores each one).
        let route = match self.router.fresh_route(topic, self.config.route_refresh) {
            Some(r) => r,
            None => Box::pin(self.route(topic, deadline)).await?,
        };
        let target = if message.key.is_empty() {
            None
        } else {
            let queues = route.queues();
            let idx =
                queue_for_key(&message.key, queues.len()).ok_or_else(|| Error::TopicNotFound {
                    topic: topic.to_string(),
                })?;
            Some(queues[idx].clone())
        };
        check_message(&message, &target_limits(&route, target.as_ref()))?;
        let bytes = message.wire_bytes();
        let (reply, rx) = oneshot::channel();
        let pending = Pending {
            topic: topic.to_string(),
            route,
            target,
            bytes,
            deadline,
            message: v1::Message {
                key: message.key,
                tag: message.tag,
                body: message.body.into(),
                properties: message.properties,
            },
            reply,
        };
        self.tx.send(pending).await.map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    /// The topic's route: cached, refreshed when old; retried until the deadline while no
    /// nameserver answers.
    async fn route(&self, topic: &str, deadline: Instant) -> Result<Arc<TopicRoute>> {
        let mut backoff = self.config.retry.backoff_initial;
        loop {
            match self.router.route(topic, self.config.route_refresh).await {
                Ok(r) => return Ok(r),
                Err(e) => {
                    if let Some(r) = self.router.cached_route(topic) {
                        return Ok(r);
                    }
                    if !e.is_retriable() || Instant::now() + backoff >= deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.config.retry.backoff_max);
                }
            }
        }
    }

    /// Sends what is pending, waits for every acknowledgement, and stops.
    pub async fn close(self) {
        drop(self.tx);
        if let Err(e) = self.task.await {
            tracing::warn!("producer batcher ended abnormally: {e}");
        }
    }
}

fn body_too_large(len: usize, max: usize) -> Error {
    Error::InvalidArgument(format!(
        "message body of {len} bytes is above the limit of {max}"
    ))
}

/// Refuses a message its target group would refuse for its size.
fn check_message(m: &Message, limits: &SendLimits) -> Result<()> {
    if m.body.len() > limits.body_bytes_max {
        return Err(body_too_large(m.body.len(), limits.body_bytes_max));
    }
    let props: usize = m.properties.iter().map(|(k, v)| k.len() + v.len()).sum();
    if props > limits.properties_bytes_max {
        return Err(Error::InvalidArgument(format!(
            "message properties of {props} bytes are above the limit of {}",
            limits.properties_bytes_max
        )));
    }
    Ok(())
}

/// Most messages and bytes of one batch for `target` (`None`: any of the topic's groups): the
/// smaller of this producer's limits and the group's ([`target_limits`]).
fn batch_limits(
    config: &ProducerConfig,
    route: &TopicRoute,
    target: Option<&QueueId>,
) -> (usize, usize) {
    let group = target_limits(route, target);
    (
        config.batch_messages_max.min(group.batch_messages_max),
        config.batch_bytes_max.min(group.batch_bytes_max),
    )
}

/// The limits a message for `target` must meet: its group's; for "any queue", the strictest of
/// the topic's groups, since the batcher may send it to any of them.
fn target_limits(route: &TopicRoute, target: Option<&QueueId>) -> SendLimits {
    if let Some(q) = target
        && let Some(b) = route.broker(&q.broker)
    {
        return b.limits;
    }
    route
        .brokers
        .iter()
        .map(|b| b.limits)
        .reduce(|a, b| SendLimits {
            body_bytes_max: a.body_bytes_max.min(b.body_bytes_max),
            properties_bytes_max: a.properties_bytes_max.min(b.properties_bytes_max),
            batch_messages_max: a.batch_messages_max.min(b.batch_messages_max),
            batch_bytes_max: a.batch_bytes_max.min(b.batch_bytes_max),
        })
        .unwrap_or_default()
}

struct Pending {
    topic: String,
    route: Arc<TopicRoute>,
    /// The keyed queue, or `None` for "any queue".
    target: Option<QueueId>,
    bytes: usize,
    deadline: Instant,
    message: v1::Message,
    reply: oneshot::Sender<Result<SendReceipt>>,
}

/// An open batch's topic, as its place in [`Batcher::topics`], and its keyed queue, or `None` for
/// "any queue". A number, not the name: a producer spreading over thousands of topics looked up
/// and compared names several times per message, each a cache miss or more.
type BatchKey = (u32, Option<QueueId>);

/// A stream of batches to one queue with at most one batch in flight, its own producer id and
/// sequences. Keyed messages use lane 0 only ([`KEYED_LANE`]); messages without a key use lanes
/// `1..=unkeyed_lanes_per_queue`. Named by its queue's block of lanes ([`LaneBlocks`]) and its
/// number there: copied, never allocated, and found without a lookup when its batch is answered
/// (a producer spreading over thousands of queues sends and finishes a lane per message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lane {
    block: u32,
    lane: usize,
}

const KEYED_LANE: usize = 0;

/// The lanes of every queue the batcher has known, a block per queue, for the producer's life:
/// a queue that leaves its topic's route keeps its block among the orphans, so its lanes'
/// sequences never restart under the same producer id.
#[derive(Default)]
struct LaneBlocks(Vec<Vec<LaneState>>);

impl LaneBlocks {
    /// A new block of `lanes` idle lanes.
    fn make(&mut self, lanes: usize) -> u32 {
        self.0.push(vec![LaneState::default(); lanes]);
        u32::try_from(self.0.len() - 1).expect("fewer than 2^32 queues")
    }

    fn block(&self, block: u32) -> &[LaneState] {
        &self.0[block as usize]
    }

    fn get_mut(&mut self, l: Lane) -> &mut LaneState {
        &mut self.0[l.block as usize][l.lane]
    }
}

struct OpenBatch {
    msgs: Vec<Pending>,
    first_at: Instant,
    /// Its place in [`Batcher::order`].
    seq: u64,
    /// The bytes of `msgs`.
    bytes: usize,
    /// The messages and bytes that make it ready without lingering: its limits
    /// ([`batch_limits`]) under the topic's newest route.
    full_at: (usize, usize),
}

/// A topic as the batcher knows it: its route and the lanes of its queues, found with one
/// lookup of the topic (a producer spreading over thousands of queues probes several lanes per
/// message, and maps keyed by whole lanes cost it a cache miss or more per probe).
struct TopicEntry {
    /// The newest route seen.
    route: Arc<TopicRoute>,
    /// Its queues, sorted.
    queues: Vec<QueueId>,
    /// Per queue of `queues`, its block of lanes: [`KEYED_LANE`], then the unkeyed ones.
    lanes: Vec<u32>,
    /// Round robin over `queues` for messages without a key.
    selector: QueueSelector,
    /// The name the topic's open batches share.
    name: Arc<str>,
}

#[derive(Debug, Clone, Copy, Default)]
struct LaneState {
    /// A batch of the lane is in flight.
    busy: bool,
    /// Its producer id and next sequence; (0, 0) before its first batch.
    ids: (u64, u64),
}

impl TopicEntry {
    /// `lanes`: lanes per queue, the keyed one included.
    fn new(
        route: Arc<TopicRoute>,
        name: Arc<str>,
        blocks: &mut LaneBlocks,
        lanes: usize,
    ) -> TopicEntry {
        let queues = route.queues();
        TopicEntry {
            lanes: queues.iter().map(|_| blocks.make(lanes)).collect(),
            route,
            queues,
            selector: QueueSelector::default(),
            name,
        }
    }

    /// Takes a newer route. The lanes (a batch in flight, the producer id and the sequence) of a
    /// queue the route no longer has move to `orphans`, and those of a queue it has again come
    /// back, so a lane's sequences never restart under the same producer id.
    fn update(
        &mut self,
        route: Arc<TopicRoute>,
        blocks: &mut LaneBlocks,
        lanes: usize,
        orphans: &mut Orphans,
    ) {
        let queues = route.queues();
        let old: Vec<(QueueId, u32)> = std::mem::take(&mut self.queues)
            .into_iter()
            .zip(std::mem::take(&mut self.lanes))
            .collect();
        let kept = queues
            .iter()
            .map(|q| match old.binary_search_by(|(o, _)| o.cmp(q)) {
                Ok(i) => old[i].1,
                Err(_) => orphans
                    .remove(&(self.name.clone(), q.clone()))
                    .unwrap_or_else(|| blocks.make(lanes)),
            })
            .collect();
        for (q, l) in old {
            if queues.binary_search(&q).is_err() {
                orphans.insert((self.name.clone(), q), l);
            }
        }
        (self.route, self.queues, self.lanes) = (route, queues, kept);
    }

    /// The block of lanes of `queue`, if the route has it.
    fn block(&self, queue: &QueueId) -> Option<u32> {
        let q = self.queues.binary_search(queue).ok()?;
        Some(self.lanes[q])
    }
}

/// The blocks of lanes of queues their topic's newest route does not have (a keyed batch may
/// still be open or in flight for one), by topic and queue.
type Orphans = HashMap<(Arc<str>, QueueId), u32>;

/// A call finished: its broker group and the lanes of its parts.
type Done = (String, Vec<Lane>);

struct Batcher {
    rx: mpsc::Receiver<Pending>,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    router: Arc<Router>,
    config: ProducerConfig,
    open: HashMap<BatchKey, OpenBatch>,
    /// The open batches in the order they opened (oldest first, the order they go in), by
    /// [`OpenBatch::seq`]: a round walks it and stops once nothing more can go, where sorting
    /// every open batch per round cost a producer over thousands of topics per message.
    order: BTreeMap<u64, BatchKey>,
    next_seq: u64,
    /// At or below the deadline of every message in an open batch (`None`: no message): until
    /// it passes, a round does not look for messages to fail.
    earliest_deadline: Option<Instant>,
    inflight: usize,
    /// Batches in flight per broker group.
    broker_inflight: HashMap<String, usize>,
    /// Per topic: the newest route seen and the lanes of its queues; named by its place here
    /// (a topic, once seen, stays for the producer's life, as its lanes do).
    topics: Vec<TopicEntry>,
    /// Each topic's place in `topics`, by name: looked up once per message.
    topic_ids: HashMap<String, u32>,
    blocks: LaneBlocks,
    orphans: Orphans,
    /// Every broker group of those routes.
    brokers: HashSet<String>,
}

impl Batcher {
    /// A batcher with nothing open or in flight, and the sender of its pending messages.
    fn new(router: Arc<Router>, config: ProducerConfig) -> (Batcher, mpsc::Sender<Pending>) {
        let (tx, rx) = mpsc::channel(config.pending_messages_max.max(1));
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let batcher = Batcher {
            rx,
            done_tx,
            done_rx,
            router,
            config,
            open: HashMap::default(),
            order: BTreeMap::new(),
            next_seq: 0,
            earliest_deadline: None,
            inflight: 0,
            broker_inflight: HashMap::default(),
            topics: Vec::new(),
            topic_ids: HashMap::default(),
            blocks: LaneBlocks::default(),
            orphans: Orphans::default(),
            brokers: HashSet::default(),
        };
        (batcher, tx)
    }

    async fn run(mut self) {
        let mut closing = false;
        loop {
            self.dispatch_ready(closing);
            if closing && self.open.is_empty() && self.inflight == 0 {
                return;
            }
            let linger_wake = if closing || self.config.linger.is_zero() {
                None
            } else {
                self.open
                    .values()
                    .map(|b| b.first_at + self.config.linger)
                    .filter(|t| *t > Instant::now())
                    .min()
            };
            tokio::select! {
                msg = self.rx.recv(), if !closing => match msg {
                    Some(p) => {
                        self.add(p);
                        while let Ok(p) = self.rx.try_recv() {
                            self.add(p);
                        }
                    }
                    None => closing = true,
                },
                Some(done) = self.done_rx.recv() => {
                    self.finish(done);
                    while let Ok(done) = self.done_rx.try_recv() {
                        self.finish(done);
                    }
                }
                _ = sleep_until_opt(linger_wake), if linger_wake.is_some() => {}
            }
        }
    }

    fn add(&mut self, p: Pending) {
        let lanes = self.lanes_per_queue();
        let (topic, new_route) = match self.topic_ids.get(&p.topic) {
            Some(&i) => {
                let t = &mut self.topics[i as usize];
                let new_route = !Arc::ptr_eq(&t.route, &p.route);
                if new_route {
                    t.update(p.route.clone(), &mut self.blocks, lanes, &mut self.orphans);
                }
                (i, new_route)
            }
            None => {
                let i = u32::try_from(self.topics.len()).expect("fewer than 2^32 topics");
                let name: Arc<str> = p.topic.as_str().into();
                let entry = TopicEntry::new(p.route.clone(), name, &mut self.blocks, lanes);
                self.topics.push(entry);
                self.topic_ids.insert(p.topic.clone(), i);
                (i, true)
            }
        };
        if new_route {
            for b in &p.route.brokers {
                if !self.brokers.contains(&b.name) {
                    self.brokers.insert(b.name.clone());
                }
            }
            // The open batches of the topic are full at its new route's limits.
            for (key, b) in self.open.iter_mut() {
                if key.0 == topic {
                    b.full_at = batch_limits(&self.config, &p.route, key.1.as_ref());
                }
            }
        }
        self.earliest_deadline = Some(
            self.earliest_deadline
                .map_or(p.deadline, |t| t.min(p.deadline)),
        );
        let key = (topic, p.target.clone());
        let b = match self.open.get_mut(&key) {
            Some(b) => b,
            None => {
                let full_at = batch_limits(&self.config, &p.route, p.target.as_ref());
                let seq = self.next_seq;
                self.next_seq += 1;
                self.order.insert(seq, key.clone());
                self.open.entry(key).or_insert(OpenBatch {
                    msgs: Vec::new(),
                    first_at: Instant::now(),
                    seq,
                    bytes: 0,
                    full_at,
                })
            }
        };
        b.bytes += p.bytes;
        b.msgs.push(p);
    }

    /// Drops an open batch with nothing left in it.
    fn close_batch(&mut self, key: &BatchKey) {
        if let Some(b) = self.open.remove(key) {
            self.order.remove(&b.seq);
        }
    }

    fn finish(&mut self, (broker, lanes): Done) {
        if let Some(n) = self.broker_inflight.get_mut(&broker) {
            *n = n.saturating_sub(1);
        }
        for lane in lanes {
            self.blocks.get_mut(lane).busy = false;
        }
        self.inflight = self.inflight.saturating_sub(1);
    }

    /// Lanes per queue: the keyed one and the unkeyed ones.
    fn lanes_per_queue(&self) -> usize {
        1 + self.config.unkeyed_lanes_per_queue.max(1)
    }

    /// The lanes of a queue of `topic` (in its route, or orphaned) if the batcher has seen them.
    #[cfg(test)]
    fn lanes(&self, topic: &str, queue: &QueueId) -> Option<&[LaneState]> {
        let t = &self.topics[*self.topic_ids.get(topic)? as usize];
        let block = t
            .block(queue)
            .or_else(|| self.orphans.get(&(t.name.clone(), queue.clone())).copied())?;
        Some(self.blocks.block(block))
    }

    /// The block of lanes of a queue of the topic `topic` (its place in `topics`): its route's,
    /// or an orphan's, made for a keyed queue its topic's route does not have (sent to anyway,
    /// as it was chosen by the route the message came with).
    fn lane_block(&mut self, topic: u32, queue: &QueueId) -> u32 {
        let t = &self.topics[topic as usize];
        if let Some(block) = t.block(queue) {
            return block;
        }
        let name = t.name.clone();
        let lanes = self.lanes_per_queue();
        let blocks = &mut self.blocks;
        *self
            .orphans
            .entry((name, queue.clone()))
            .or_insert_with(|| blocks.make(lanes))
    }

    /// The lanes with a batch in flight, as (topic, queue, lane) and as the batcher names them.
    #[cfg(test)]
    fn busy(&self) -> Vec<((String, QueueId, usize), Lane)> {
        let routed = self.topics.iter().flat_map(|t| {
            t.queues
                .iter()
                .zip(&t.lanes)
                .map(move |(q, &b)| (t.name.to_string(), q.clone(), b))
        });
        let orphaned = self
            .orphans
            .iter()
            .map(|((topic, q), &b)| (topic.to_string(), q.clone(), b));
        let mut busy = Vec::new();
        for (topic, q, block) in routed.chain(orphaned) {
            for (lane, s) in self.blocks.block(block).iter().enumerate() {
                if s.busy {
                    busy.push(((topic.clone(), q.clone(), lane), Lane { block, lane }));
                }
            }
        }
        busy
    }

    fn broker_has_room(&self, broker: &str) -> bool {
        has_room(
            &self.broker_inflight,
            self.config.broker_inflight_batches_max,
            broker,
        )
    }

    /// Whether a call may open: the window in all has room, and some group's has.
    fn may_open_any(&self) -> bool {
        self.inflight < self.config.inflight_batches_max
            && self.brokers.iter().any(|b| self.broker_has_room(b))
    }

    /// Most messages and bytes of a batch of `topic` to `broker`, under the topic's newest
    /// route ([`batch_limits`]).
    fn group_batch_limits(&self, topic: u32, broker: &QueueId) -> (usize, usize) {
        batch_limits(
            &self.config,
            &self.topics[topic as usize].route,
            Some(broker),
        )
    }

    fn is_ready(&self, b: &OpenBatch, closing: bool, now: Instant) -> bool {
        let (messages_max, bytes_max) = b.full_at;
        closing
            || b.msgs.len() >= messages_max
            || b.bytes >= bytes_max
            || now.saturating_duration_since(b.first_at) >= self.config.linger
    }

    /// Fails the messages of open batches whose deadline passed, when one may have
    /// (`earliest_deadline`), and sets that bound again.
    fn expire(&mut self, now: Instant) {
        if self.earliest_deadline.is_none_or(|t| t > now) {
            return;
        }
        let expired: Vec<BatchKey> = self
            .open
            .iter()
            .filter(|(_, b)| b.msgs.iter().any(|p| p.deadline <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in expired {
            self.fail_expired(&key, now);
        }
        self.earliest_deadline = self
            .open
            .values()
            .flat_map(|b| b.msgs.iter().map(|p| p.deadline))
            .min();
    }

    /// Sends the open batches that are ready, oldest first, as far as the windows allow. Batches
    /// to one broker group in the same round ride one call (`SendMany`, one log entry) while it
    /// has room within the group's batch limits: a producer spreading over thousands of queues
    /// has one message per queue at a time, and one entry per message would cost a leader far
    /// more.
    fn dispatch_ready(&mut self, closing: bool) {
        let now = Instant::now();
        // Messages past their deadline fail first, whether or not anything can go; while every
        // window is full (the common case under load) that is all a round does.
        self.expire(now);
        let mut may_open_any = self.may_open_any();
        if !may_open_any {
            return;
        }
        // The calls this round opens; per broker group, the one still taking parts.
        let mut calls: Vec<Call> = Vec::new();
        let mut taking: HashMap<String, usize> = HashMap::default();
        let mut next = 0u64;
        loop {
            // Nothing more goes once no call may open and this round's are full: the batches
            // left wait for the next round, unvisited.
            if !may_open_any && calls.iter().all(|c| !c.takes_more()) {
                break;
            }
            let Some((&seq, key)) = self.order.range(next..).next() else {
                break;
            };
            next = seq + 1;
            let key = key.clone();
            let Some(b) = self.open.get(&key) else {
                continue;
            };
            if !self.is_ready(b, closing, now) {
                continue;
            }
            let Some(first_bytes) = b.msgs.first().map(|p| p.bytes) else {
                continue;
            };
            let part_bytes = self.topics[key.0 as usize].name.len() + SEND_PART_OVERHEAD_BYTES;
            // Whether a group's open call of this round takes this batch's first message.
            let joinable = |broker: &str| {
                taking
                    .get(broker)
                    .is_some_and(|&i| calls[i].fits(1, part_bytes + first_bytes))
            };
            let may_open = self.inflight < self.config.inflight_batches_max;
            let (queue, lane) = match &key.1 {
                Some(q) => {
                    let can = joinable(&q.broker) || (may_open && self.broker_has_room(&q.broker));
                    if !can {
                        continue;
                    }
                    let block = self.lane_block(key.0, q);
                    if self.blocks.block(block)[KEYED_LANE].busy {
                        continue;
                    }
                    (
                        q.clone(),
                        Lane {
                            block,
                            lane: KEYED_LANE,
                        },
                    )
                }
                None => match self.pick_any(key.0, &joinable, may_open) {
                    Some(picked) => picked,
                    None => continue,
                },
            };
            let join = joinable(&queue.broker).then(|| taking[queue.broker.as_str()]);
            let (messages_left, bytes_left) = match join {
                Some(i) => calls[i].left(),
                None => self.group_batch_limits(key.0, &queue),
            };
            let Some(batch) =
                self.take_batch(&key, messages_left, bytes_left.saturating_sub(part_bytes))
            else {
                continue;
            };
            let i = match join {
                Some(i) => i,
                None => {
                    let broker = queue.broker.clone();
                    self.inflight += 1;
                    *slot(&mut self.broker_inflight, broker.as_str()) += 1;
                    may_open_any = self.may_open_any();
                    calls.push(Call {
                        broker: broker.clone(),
                        parts: Vec::new(),
                        messages_left,
                        bytes_left,
                    });
                    taking.insert(broker, calls.len() - 1);
                    calls.len() - 1
                }
            };
            let state = self.blocks.get_mut(lane);
            state.busy = true;
            if state.ids.1 == 0 {
                // A lane's first batch: a new producer id (0 disables idempotence on the
                // broker, so never use it) and sequences from 1, marked single-flight (one
                // batch in flight per lane: the broker keeps only the newest of the lane).
                state.ids = (rand::random::<u64>() | 1, SINGLE_FLIGHT_SEQUENCE | 1);
            }
            let (producer_id, sequence) = state.ids;
            state.ids.1 += 1;
            let call = &mut calls[i];
            call.messages_left -= batch.len();
            call.bytes_left = call
                .bytes_left
                .saturating_sub(part_bytes + batch.iter().map(|p| p.bytes).sum::<usize>());
            call.parts.push(SendJob {
                router: self.router.clone(),
                topic: self.topics[key.0 as usize].name.clone(),
                queue,
                lane,
                producer_id,
                sequence,
                msgs: batch,
            });
        }
        for call in calls {
            let done_tx = self.done_tx.clone();
            tokio::spawn(async move {
                let done = (
                    call.broker.clone(),
                    call.parts.iter().map(|p| p.lane).collect(),
                );
                call.run().await;
                let _ = done_tx.send(done);
            });
        }
    }

    /// Fails the messages of an open batch whose deadline passed before they could be sent.
    fn fail_expired(&mut self, key: &BatchKey, now: Instant) {
        let Some(b) = self.open.get_mut(key) else {
            return;
        };
        if b.msgs.iter().all(|p| p.deadline > now) {
            return;
        }
        let (expired, keep): (Vec<_>, Vec<_>) = b.msgs.drain(..).partition(|p| p.deadline <= now);
        b.msgs = keep;
        b.bytes = b.msgs.iter().map(|p| p.bytes).sum();
        let empty = b.msgs.is_empty();
        for p in expired {
            let _ = p.reply.send(Err(Error::Timeout {
                op: format!("send to {}", p.topic),
                waited: self.config.send_timeout,
                last: "no room in the in-flight window before the deadline".into(),
            }));
        }
        if empty {
            self.close_batch(key);
        }
    }

    /// A queue and lane for an unkeyed batch: round robin over the topic's queues, then over each
    /// queue's unkeyed lanes, skipping busy lanes and broker groups with a full window.
    /// A call of this round to its group still taking parts (`joinable`) counts as room, and a
    /// group with room in its window only while another call may open (`may_open`).
    fn pick_any(
        &mut self,
        topic: u32,
        joinable: &dyn Fn(&str) -> bool,
        may_open: bool,
    ) -> Option<(QueueId, Lane)> {
        let t = &mut self.topics[topic as usize];
        let n = t.queues.len();
        let broker_inflight = &self.broker_inflight;
        let broker_max = self.config.broker_inflight_batches_max;
        let blocks = &self.blocks;
        let (queues, lanes) = (&t.queues, &t.lanes);
        // Round robin over the queues; in a queue, its first free lane. Lanes past the first are
        // used only while the ones before are busy, so a producer spreading over thousands of
        // queues keeps one producer window per queue on the broker, not one per lane (a broker
        // remembers a bounded number of them).
        let free_lane = |q: usize| {
            let block = blocks.block(lanes[q]);
            (1..block.len()).find(|&l| !block[l].busy)
        };
        let q = t.selector.next_round_robin(n, |q| {
            let broker = &queues[q].broker;
            (joinable(broker) || (may_open && has_room(broker_inflight, broker_max, broker)))
                && free_lane(q).is_some()
        })?;
        let lane = free_lane(q)?;
        Some((
            queues[q].clone(),
            Lane {
                block: lanes[q],
                lane,
            },
        ))
    }

    /// Takes the first messages of an open batch, up to `messages_max` and `bytes_max` (the
    /// first message always: it fits in a batch of its own).
    fn take_batch(
        &mut self,
        key: &BatchKey,
        messages_max: usize,
        bytes_max: usize,
    ) -> Option<Vec<Pending>> {
        let b = self.open.get_mut(key)?;
        let mut n = 0;
        let mut bytes = 0;
        for p in &b.msgs {
            if n > 0 && (n >= messages_max || bytes + p.bytes > bytes_max) {
                break;
            }
            n += 1;
            bytes += p.bytes;
        }
        // All of it (a batch of one message, at thousands of topics): its buffer goes whole.
        let batch: Vec<Pending> = if n == b.msgs.len() {
            std::mem::take(&mut b.msgs)
        } else {
            b.msgs.drain(..n).collect()
        };
        b.bytes -= bytes;
        if b.msgs.is_empty() {
            self.close_batch(key);
        }
        (!batch.is_empty()).then_some(batch)
    }
}

/// The value of `key` in `map`, made (default) on first use; the key is copied only then.
fn slot<'m, K, Q, V>(map: &'m mut HashMap<K, V>, key: &Q) -> &'m mut V
where
    K: std::borrow::Borrow<Q> + std::hash::Hash + Eq,
    Q: ToOwned<Owned = K> + std::hash::Hash + Eq + ?Sized,
    V: Default,
{
    // Two lookups on a hit: returning `get_mut`'s borrow on one branch and inserting on the
    // other is what today's borrow checker refuses.
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// Whether `broker` has fewer than `max` batches in flight.
fn has_room(inflight: &HashMap<String, usize>, max: usize, broker: &str) -> bool {
    inflight.get(broker).copied().unwrap_or(0) < max
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// One call to a broker group on its way: the batches of one or more lanes.
struct Call {
    broker: String,
    parts: Vec<SendJob>,
    messages_left: usize,
    bytes_left: usize,
}

impl Call {
    /// Whether `messages` more messages of `bytes` (with their part's overhead) fit.
    fn fits(&self, messages: usize, bytes: usize) -> bool {
        messages <= self.messages_left && bytes <= self.bytes_left
    }

    fn left(&self) -> (usize, usize) {
        (self.messages_left, self.bytes_left)
    }

    /// Whether any part may still join: a message left, and bytes beyond a part's overhead.
    fn takes_more(&self) -> bool {
        self.messages_left > 0 && self.bytes_left > SEND_PART_OVERHEAD_BYTES
    }

    /// One batch goes as a `Send`; several as one `SendMany`, or each as a `Send` when the
    /// group's leader does not know `SendMany` (an older build during a rolling upgrade).
    async fn run(self) {
        let mut parts = self.parts;
        if parts.len() == 1 {
            let job = parts.pop().expect("one part");
            return job.run().await;
        }
        let deadline = parts
            .iter()
            .flat_map(|p| p.msgs.iter().map(|m| m.deadline))
            .max()
            .unwrap_or_else(Instant::now);
        let router = parts[0].router.clone();
        let req = v1::SendManyRequest {
            parts: parts.iter_mut().map(SendJob::request).collect(),
        };
        let result = router
            .call_leader(&self.broker, "SendMany", deadline, |ch, t| {
                let req = req.clone();
                async move {
                    BrokerServiceClient::new(ch)
                        .max_encoding_message_size(MESSAGE_BYTES_MAX)
                        .max_decoding_message_size(MESSAGE_BYTES_MAX)
                        .send_many(request(req, t))
                        .await
                }
            })
            .await;
        match result {
            Ok((resp, address)) if resp.parts.len() == parts.len() => {
                for (job, r) in parts.into_iter().zip(resp.parts) {
                    let r = match r.error {
                        Some(e) if e.code() != v1::ErrorCode::Ok => Err(Error::Server {
                            address: address.clone(),
                            rpc: "Send",
                            code: e.code(),
                            message: e.message,
                            leader: e.leader,
                        }),
                        _ => Ok((r, address.clone())),
                    };
                    job.answer(r);
                }
            }
            Ok((resp, address)) => {
                let e = Error::Server {
                    address: address.clone(),
                    rpc: "SendMany",
                    code: v1::ErrorCode::Internal,
                    message: format!(
                        "{address} answered a call of {} batches with {} answers",
                        parts.len(),
                        resp.parts.len()
                    ),
                    leader: None,
                };
                for job in parts {
                    job.answer(Err(e.duplicate()));
                }
            }
            Err(Error::Rpc { status, .. }) if status.code() == tonic::Code::Unimplemented => {
                for (job, r) in parts.iter_mut().zip(req.parts) {
                    for (p, m) in job.msgs.iter_mut().zip(r.messages) {
                        p.message = m;
                    }
                }
                futures::future::join_all(parts.into_iter().map(SendJob::run)).await;
            }
            Err(e) => {
                for job in parts {
                    job.answer(Err(e.duplicate()));
                }
            }
        }
    }
}

/// One batch on its way: sent, retried, and its messages answered.
struct SendJob {
    router: Arc<Router>,
    topic: Arc<str>,
    queue: QueueId,
    lane: Lane,
    producer_id: u64,
    sequence: u64,
    msgs: Vec<Pending>,
}

impl SendJob {
    /// The batch's request; its messages move into it.
    fn request(&mut self) -> v1::SendRequest {
        v1::SendRequest {
            topic: self.topic.to_string(),
            queue: self.queue.queue,
            messages: self
                .msgs
                .iter_mut()
                .map(|p| std::mem::take(&mut p.message))
                .collect(),
            producer_id: self.producer_id,
            sequence: self.sequence,
            // The producer window already stores a retried batch once.
            dedup_property: String::new(),
        }
    }

    async fn run(mut self) {
        let deadline = self
            .msgs
            .iter()
            .map(|p| p.deadline)
            .max()
            .unwrap_or_else(Instant::now);
        let req = self.request();
        let result = self
            .router
            .call_leader(&self.queue.broker, "Send", deadline, |ch, t| {
                let req = req.clone();
                async move {
                    BrokerServiceClient::new(ch)
                        .max_encoding_message_size(MESSAGE_BYTES_MAX)
                        .max_decoding_message_size(MESSAGE_BYTES_MAX)
                        .send(request(req, t))
                        .await
                }
            })
            .await;
        self.answer(result);
    }

    /// Answers each message of the batch from the call's result.
    fn answer(self, result: Result<(v1::SendResponse, String)>) {
        match result {
            Ok((resp, _)) if resp.results.len() == self.msgs.len() => {
                for (p, r) in self.msgs.into_iter().zip(resp.results) {
                    let _ = p.reply.send(Ok(SendReceipt {
                        topic: self.topic.to_string(),
                        broker: self.queue.broker.clone(),
                        queue: r.queue,
                        offset: r.offset,
                        msg_id: r.msg_id,
                        duplicate: resp.duplicate,
                        deliver_at_ms: r.deliver_at_ms,
                    }));
                }
            }
            Ok((resp, address)) => {
                let message = format!(
                    "{address} acknowledged a batch of {} messages with {} results",
                    self.msgs.len(),
                    resp.results.len()
                );
                for p in self.msgs {
                    let _ = p.reply.send(Err(Error::Server {
                        address: address.clone(),
                        rpc: "Send",
                        code: v1::ErrorCode::Internal,
                        message: message.clone(),
                        leader: None,
                    }));
                }
            }
            Err(e) => {
                if matches!(e.code(), Some(v1::ErrorCode::TopicNotFound)) || !e.is_retriable() {
                    // The route may be stale (topic deleted or moved): fetch it again next time.
                    self.router.invalidate_route(&self.topic);
                }
                for p in self.msgs {
                    let _ = p.reply.send(Err(e.duplicate()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nameserver::BrokerRoute;

    fn route(brokers: &[&str], queues: u32) -> Arc<TopicRoute> {
        Arc::new(TopicRoute {
            topic: "t".into(),
            brokers: brokers
                .iter()
                .map(|b| BrokerRoute {
                    cluster: "c".into(),
                    name: b.to_string(),
                    leader_id: None,
                    queues,
                    nodes: Vec::new(),
                    term: 0,
                    limits: SendLimits::DEFAULT,
                })
                .collect(),
        })
    }

    fn batcher(config: ProducerConfig) -> (Batcher, mpsc::Sender<Pending>) {
        // Nothing listens there: the dispatched jobs only retry in the background.
        let router = Router::new(
            vec!["127.0.0.1:1".into()],
            config.retry.clone(),
            config.security.clone(),
        )
        .unwrap();
        Batcher::new(router, config)
    }

    fn pending(
        route: &Arc<TopicRoute>,
        target: Option<QueueId>,
    ) -> (Pending, oneshot::Receiver<Result<SendReceipt>>) {
        let (reply, rx) = oneshot::channel();
        let p = Pending {
            topic: "t".into(),
            route: route.clone(),
            target,
            bytes: 100,
            deadline: Instant::now() + Duration::from_secs(60),
            message: v1::Message::default(),
            reply,
        };
        (p, rx)
    }

    /// The messages waiting in open batches.
    fn waiting(b: &Batcher) -> usize {
        b.open.values().map(|o| o.msgs.len()).sum()
    }

    /// The batcher dispatches at most one batch per open batch and wakeup; run it as often as
    /// its loop would.
    fn dispatch_until_stable(b: &mut Batcher) {
        for _ in 0..50 {
            b.dispatch_ready(false);
        }
    }

    #[tokio::test]
    async fn each_broker_group_gets_at_most_its_window_and_the_rest_waits_in_open_batches() {
        let config = ProducerConfig {
            batch_messages_max: 10,
            ..ProducerConfig::default()
        };
        let (mut b, _tx) = batcher(config);
        let r = route(&["broker-a", "broker-b"], 4);
        let mut replies = Vec::new();
        for _ in 0..300 {
            let (p, rx) = pending(&r, None);
            b.add(p);
            replies.push(rx);
        }
        let keyed = QueueId::new("broker-a", 3);
        for _ in 0..5 {
            let (p, rx) = pending(&r, Some(keyed.clone()));
            b.add(p);
            replies.push(rx);
        }
        dispatch_until_stable(&mut b);
        assert_eq!(b.broker_inflight.get("broker-a"), Some(&2));
        assert_eq!(b.broker_inflight.get("broker-b"), Some(&2));
        assert_eq!(b.inflight, 4);
        assert!(
            waiting(&b) > 0,
            "messages beyond the windows wait in open batches"
        );

        // A batch to broker-b finishes: exactly one more goes there, none to the full broker-a.
        let (_, lane) = b
            .busy()
            .into_iter()
            .find(|(l, _)| l.1.broker == "broker-b")
            .unwrap();
        b.finish(("broker-b".into(), vec![lane]));
        dispatch_until_stable(&mut b);
        assert_eq!(b.broker_inflight.get("broker-a"), Some(&2));
        assert_eq!(b.broker_inflight.get("broker-b"), Some(&2));
        assert_eq!(b.inflight, 4);
    }

    /// A lane keeps its producer id and sequences across routes: through a route without its
    /// queue (a keyed batch still goes there, on the lane it had) and back.
    #[tokio::test]
    async fn a_lane_keeps_its_producer_id_and_sequence_when_the_route_changes() {
        let (mut b, _tx) = batcher(ProducerConfig::default());
        let q1 = QueueId::new("broker-a", 1);
        let ids = |b: &Batcher| b.lanes("t", &q1).map(|l| l[KEYED_LANE].ids);
        let mut replies = Vec::new();
        let mut first_id = None;
        // Each step: a route, one keyed message to q1, its batch sent and finished.
        for (step, queues) in [2, 1, 2].into_iter().enumerate() {
            let r = route(&["broker-a"], queues);
            let (p, rx) = pending(&r, Some(q1.clone()));
            b.add(p);
            replies.push(rx);
            dispatch_until_stable(&mut b);
            assert_eq!(b.inflight, 1, "step {step}: the batch went");
            let busy: Vec<_> = b.busy().into_iter().map(|(l, _)| l).collect();
            assert_eq!(busy, vec![("t".to_string(), q1.clone(), KEYED_LANE)]);
            let (id, next) = ids(&b).expect("the lane is known");
            assert_eq!(
                next,
                SINGLE_FLIGHT_SEQUENCE | (step as u64 + 2),
                "step {step}: sequences go on"
            );
            assert_eq!(
                *first_id.get_or_insert(id),
                id,
                "step {step}: the same producer"
            );
            let lanes = b.busy().into_iter().map(|(_, l)| l).collect();
            b.finish(("broker-a".into(), lanes));
            assert!(b.busy().is_empty());
        }
        // With q1 out of the route its lanes wait aside, and the route's queues are its own.
        let r = route(&["broker-a"], 1);
        let (p, rx) = pending(&r, Some(QueueId::new("broker-a", 0)));
        b.add(p);
        replies.push(rx);
        assert_eq!(
            b.topics[b.topic_ids["t"] as usize].queues,
            vec![QueueId::new("broker-a", 0)]
        );
        assert_eq!(b.orphans.len(), 1);
        assert_eq!(ids(&b).map(|i| i.1), Some(SINGLE_FLIGHT_SEQUENCE | 4));
    }

    /// Messages spread over many topics (one message per queue at a time) ride a few calls: the
    /// batches ready in one round share their group's call, up to the group's batch limits.
    #[tokio::test]
    async fn batches_to_one_group_share_a_call_within_its_limits() {
        let config = ProducerConfig {
            batch_messages_max: 100,
            ..ProducerConfig::default()
        };
        let (mut b, _tx) = batcher(config);
        let mut replies = Vec::new();
        for t in 0..300 {
            let mut r = (*route(&["broker-a"], 8)).clone();
            r.topic = format!("topic-{t}");
            let r = Arc::new(r);
            let (mut p, rx) = pending(&r, None);
            p.topic = r.topic.clone();
            b.add(p);
            replies.push(rx);
        }
        dispatch_until_stable(&mut b);
        // Two calls (the group's window) of 100 messages each (its batch limit), one per topic.
        assert_eq!(b.broker_inflight.get("broker-a"), Some(&2));
        assert_eq!(b.inflight, 2);
        assert_eq!(b.busy().len(), 200);
        assert_eq!(waiting(&b), 100);
    }

    /// With every window full, messages past their deadline fail (and only they), even though a
    /// round no longer looks through the open batches until the earliest deadline has passed.
    #[tokio::test(start_paused = true)]
    async fn messages_waiting_past_their_deadline_fail_while_the_windows_are_full() {
        let config = ProducerConfig {
            batch_messages_max: 1,
            ..ProducerConfig::default()
        };
        let (mut b, _tx) = batcher(config);
        let r = route(&["broker-a"], 8);
        let mut early = Vec::new();
        for _ in 0..5 {
            let (mut p, rx) = pending(&r, None);
            p.deadline = Instant::now() + Duration::from_secs(1);
            b.add(p);
            early.push(rx);
        }
        dispatch_until_stable(&mut b);
        assert_eq!(b.inflight, 2, "the group's window is full");
        let (p, mut late) = pending(&r, None);
        b.add(p);
        tokio::time::advance(Duration::from_millis(999)).await;
        b.dispatch_ready(false);
        assert_eq!(waiting(&b), 4, "nothing is due yet");
        tokio::time::advance(Duration::from_millis(2)).await;
        b.dispatch_ready(false);
        // The two in flight are the router's to answer; the three waiting timed out.
        let timed_out = early
            .iter_mut()
            .map(|rx| rx.try_recv())
            .filter(|r| matches!(r, Ok(Err(Error::Timeout { .. }))))
            .count();
        assert_eq!(timed_out, 3);
        assert!(late.try_recv().is_err(), "the later message still waits");
        assert_eq!(waiting(&b), 1);
        assert_eq!(b.order.len(), 1);
    }

    #[tokio::test]
    async fn a_wider_broker_window_lets_more_batches_out() {
        let config = ProducerConfig {
            broker_inflight_batches_max: 5,
            batch_messages_max: 10,
            ..ProducerConfig::default()
        };
        let (mut b, _tx) = batcher(config);
        let r = route(&["broker-a"], 8);
        let mut replies = Vec::new();
        for _ in 0..100 {
            let (p, rx) = pending(&r, None);
            b.add(p);
            replies.push(rx);
        }
        dispatch_until_stable(&mut b);
        assert_eq!(b.broker_inflight.get("broker-a"), Some(&5));
        assert_eq!(b.inflight, 5);
    }

    /// A route of one group per name, each with its own limits.
    fn route_with_limits(groups: &[(&str, SendLimits)], queues: u32) -> Arc<TopicRoute> {
        let mut r = (*route(&[], queues)).clone();
        for (name, limits) in groups {
            let mut b = route(&[name], queues).brokers[0].clone();
            b.limits = *limits;
            r.brokers.push(b);
        }
        Arc::new(r)
    }

    fn small(body: usize, messages: usize, bytes: usize) -> SendLimits {
        SendLimits {
            body_bytes_max: body,
            batch_messages_max: messages,
            batch_bytes_max: bytes,
            ..SendLimits::DEFAULT
        }
    }

    /// A producer whose router already holds `route` (no nameserver is reachable).
    fn producer_with(route: &TopicRoute) -> Producer {
        let p = Producer::builder("127.0.0.1:1")
            .send_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        p.router.cache_route(route.clone());
        p
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_with_a_smaller_body_limit_makes_the_producer_refuse() {
        let r = route_with_limits(&[("broker-a", small(1024, 1000, 1 << 20))], 2);
        let p = producer_with(&r);
        let e = p
            .send("t", Message::new(vec![0u8; 2000]).with_key("k"))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("limit of 1024")),
            "{e}"
        );
        // Below the group's limit it is sent (and, with nothing listening, times out).
        let e = p
            .send("t", Message::new(vec![0u8; 1000]).with_key("k"))
            .await
            .unwrap_err();
        assert!(!matches!(e, Error::InvalidArgument(_)), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unkeyed_message_meets_the_strictest_group_of_its_topic() {
        let r = route_with_limits(
            &[
                ("broker-a", SendLimits::DEFAULT),
                ("broker-b", small(100, 1000, 1 << 20)),
            ],
            2,
        );
        let p = producer_with(&r);
        let e = p.send("t", Message::new(vec![0u8; 101])).await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        // Properties are held to the group's limit too.
        let big = "v".repeat(SendLimits::DEFAULT.properties_bytes_max);
        let e = p
            .send("t", Message::new("x").with_property("k", big))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.contains("properties")),
            "{e}"
        );
    }

    #[test]
    fn unknown_limits_fall_back_to_the_contract() {
        let r = route(&["broker-a"], 1);
        assert_eq!(target_limits(&r, None), SendLimits::DEFAULT);
        let empty = route(&[], 1);
        assert_eq!(target_limits(&empty, None), SendLimits::DEFAULT);
        let q = QueueId::new("broker-x", 0);
        assert_eq!(target_limits(&r, Some(&q)), SendLimits::DEFAULT);
    }

    #[tokio::test]
    async fn batches_are_split_at_the_target_groups_limits() {
        let (mut b, _tx) = batcher(ProducerConfig::default());
        // broker-a takes 3 messages a batch; broker-b 250 bytes (messages here are 100 bytes).
        let r = route_with_limits(
            &[
                ("broker-a", small(100, 3, 1 << 20)),
                ("broker-b", small(100, 1000, 250)),
            ],
            1,
        );
        let mut replies = Vec::new();
        for broker in ["broker-a", "broker-b"] {
            for _ in 0..10 {
                let (p, rx) = pending(&r, Some(QueueId::new(broker, 0)));
                b.add(p);
                replies.push(rx);
            }
        }
        // One keyed lane per queue: one batch in flight to each, the rest waits.
        dispatch_until_stable(&mut b);
        let waiting = |b: &Batcher, broker: &str| {
            b.open
                .iter()
                .filter(|(k, _)| k.1.as_ref().is_some_and(|q| q.broker == broker))
                .map(|(_, o)| o.msgs.len())
                .sum::<usize>()
        };
        assert_eq!(waiting(&b, "broker-a"), 7);
        assert_eq!(waiting(&b, "broker-b"), 8);
    }
}
