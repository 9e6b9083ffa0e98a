//! [`Front`]: the `apache.rocketmq.v2.MessagingService` implementation.
//!
//! Each RPC checks its request, asks [`Routes`] where the topic lives, translates to one or more
//! v1 calls sent through the [`Forwarder`], and translates the replies back. Business errors are
//! always answered in the payload `status` (see [`crate::codes`]); every response carries one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use raftmq_proto::v1::broker_service_server::BrokerService;
use raftmq_proto::v1::{self, ErrorCode, TopicMessageType};
use raftmq_security::acl::{Action, Resource};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::FrontConfig;
use crate::codes::{Error, code_of_v1, ok, status};
use crate::combine;
use crate::convert::{self, Delivery};
use crate::forward::{Forwarder, Pool, Target};
use crate::pb::{self, Code, messaging_service_server::MessagingService};
use crate::pb::{
    receive_message_response::Content as RecvContent, settings::PubSub,
    telemetry_command::Command as TelemetryCmd,
};
use crate::resend;
use crate::route::{self, Routes};
use crate::settings::{self, parse_grpc_timeout, poll_time};

/// Most messages in one SendMessage.
pub const SEND_MESSAGES_MAX: usize = 1024;
/// Most messages one receive or pull returns.
pub const RECEIVE_BATCH_MAX: i32 = 64;
/// Invisible time of a receive that names none (or asks the server to renew).
pub const INVISIBLE_DEFAULT: Duration = Duration::from_secs(30);
/// Queues of a topic created by `auto_create_topics` (RocketMQ's default).
pub const AUTO_CREATE_QUEUES: u32 = 8;
/// How long topic types and group configs are reused.
const CONFIG_TTL: Duration = Duration::from_secs(3);
/// Deadline of one forwarded unary call to another node.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Clients not heard from in this long are forgotten.
const CLIENT_IDLE_MAX: Duration = Duration::from_secs(300);
/// How long a batch whose outcome is unknown is sent again (same sequence) before its senders
/// get the error: longer than the official clients' three attempts of 3 s.
const SEND_RETRY_WINDOW: Duration = Duration::from_secs(12);
/// Idempotent-producer lanes of one front: a retried send must still be in its lane's window of
/// recent sequences (256 on the broker), so 16 lanes cover 4096 sends during one retry.
const PRODUCER_LANES: u64 = 16;

type FrameStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The v2 front of one broker node. Cheap to clone.
pub struct Front<B> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for Front<B> {
    fn clone(&self) -> Self {
        Front {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<B> {
    cfg: FrontConfig,
    fwd: Forwarder<B>,
    routes: Routes,
    /// Per broker group: the topics' message types.
    topic_types: Mutex<HashMap<String, Cached<HashMap<String, TopicMessageType>>>>,
    /// This group's consumer-group configs.
    groups: Mutex<Option<Cached<HashMap<String, v1::GroupConfig>>>>,
    /// Clients by `x-mq-client-id`, for liveness and the topics of consumer heartbeats.
    clients: Mutex<HashMap<String, ClientEntry>>,
    /// Producers with a telemetry stream open here, by client id: what the transaction checker
    /// asks about their topics' open transactions.
    producers: Mutex<HashMap<String, ProducerStream>>,
    /// The first idempotent producer id of this front (its lanes follow).
    producer_base: u64,
    sequence: AtomicU64,
    /// Folds concurrent sends to one queue.
    combiner: Arc<combine::Combiner>,
    /// Sends by client message id, so a client's retry is stored once.
    resends: resend::Memo,
    rotation: AtomicUsize,
}

type Cached<T> = (Instant, Arc<T>);

/// A producer's telemetry stream: the topics it publishes and where its commands go.
struct ProducerStream {
    topics: Vec<String>,
    tx: mpsc::Sender<Result<pb::TelemetryCommand, Status>>,
}

/// How often the front claims the due transactions of its producers' topics.
const TXN_CHECK_POLL: Duration = Duration::from_secs(1);
/// Transactions claimed per topic and broker group per poll.
const TXN_CHECKS_PER_POLL: u32 = 100;

#[derive(Debug, Clone)]
struct ClientEntry {
    group: Option<String>,
    topics: Vec<String>,
    last_seen: Instant,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn client_id<T>(req: &Request<T>) -> String {
    req.metadata()
        .get("x-mq-client-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

fn deadline<T>(req: &Request<T>) -> Option<Duration> {
    req.metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
}

fn name(r: &Option<pb::Resource>) -> &str {
    r.as_ref().map_or("", |r| r.name.as_str())
}

/// The topic of a message-queue field (`""` when unset).
fn queue_topic(q: &Option<pb::MessageQueue>) -> &str {
    q.as_ref().map_or("", |q| name(&q.topic))
}

/// Whether `tag` passes a TAG expression (`""`/`*` = all, `A`, `A||B`).
fn tag_matches(expression: &str, tag: &str) -> bool {
    let e = expression.trim();
    e.is_empty() || e == "*" || e.split("||").any(|t| t.trim() == tag)
}

/// The TAG expression of a filter; SQL92 is refused.
fn tag_expression(f: &Option<pb::FilterExpression>) -> Result<String, Error> {
    match f {
        Some(f) if f.r#type == pb::FilterType::Sql as i32 => Err(Error::refused(
            Code::IllegalFilterExpression,
            "SQL92 filtering is not supported; use a TAG expression (*, A, A||B)",
        )),
        Some(f) if !f.expression.trim().is_empty() => Ok(f.expression.trim().to_string()),
        _ => Ok("*".into()),
    }
}

/// Marks a send's "offset" that is in fact a scheduled message's place (it has no offset until
/// delivered): the bit, then `log_index << 16 | position`. The offsets travel through the
/// combiner and the resend record as plain numbers.
const SCHEDULED_BIT: u64 = 1 << 63;

/// A stored message's offset, or for a scheduled one its place under [`SCHEDULED_BIT`].
fn placed(r: &v1::SendResult) -> u64 {
    match raftmq_proto::split_msg_id(&r.msg_id) {
        Some((_, index, position)) if r.deliver_at_ms > 0 && index < 1 << 47 => {
            SCHEDULED_BIT | index << 16 | position as u64
        }
        _ => r.offset,
    }
}

/// The recall handle of a scheduled message: its raftmq id, which names the broker group.
fn recall_handle(broker: &str, placed: u64) -> String {
    let place = placed & !SCHEDULED_BIT;
    format!("{broker}-{:016X}-{:04X}", place >> 16, place & 0xFFFF)
}

/// A message's type against its topic's: a NORMAL topic also takes UNSPECIFIED.
pub fn check_type(
    topic: &str,
    topic_type: TopicMessageType,
    message_type: i32,
) -> Result<(), Error> {
    let want = route::message_type(topic_type);
    if message_type == want as i32
        || (topic_type == TopicMessageType::Normal
            && message_type == pb::MessageType::Unspecified as i32)
    {
        return Ok(());
    }
    let got = pb::MessageType::try_from(message_type).map_or_else(
        |_| message_type.to_string(),
        |t| t.as_str_name().to_string(),
    );
    Err(Error::refused(
        Code::MessagePropertyConflictWithType,
        format!(
            "topic {topic:?} accepts {} messages; this message is {got}",
            want.as_str_name()
        ),
    ))
}

impl<B: BrokerService> Front<B> {
    /// A front over this node's v1 service.
    pub fn new(local: Arc<B>, cfg: FrontConfig) -> Self {
        let pool = Pool::new(
            cfg.tls.clone(),
            raftmq_security::sign::Signer(cfg.credentials.clone()),
        );
        let base = (rand::random::<u64>() & !(PRODUCER_LANES - 1)).max(PRODUCER_LANES);
        let front = Front {
            inner: Arc::new(Inner {
                fwd: Forwarder::new(local, cfg.advertise.clone(), pool.clone()),
                routes: Routes::new(cfg.nameservers.clone(), pool),
                cfg,
                topic_types: Mutex::default(),
                groups: Mutex::default(),
                clients: Mutex::default(),
                producers: Mutex::default(),
                producer_base: base,
                sequence: AtomicU64::new(1),
                combiner: Arc::default(),
                resends: resend::Memo::default(),
                rotation: AtomicUsize::new(0),
            }),
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let inner = Arc::downgrade(&front.inner);
            rt.spawn(async move {
                loop {
                    tokio::time::sleep(TXN_CHECK_POLL).await;
                    let Some(inner) = inner.upgrade() else { break };
                    inner.check_transactions().await;
                }
            });
        }
        front
    }
}

impl<B: BrokerService> Inner<B> {
    /// One round of the transaction checker: for every topic a producer connected here
    /// publishes, claims its due transactions from each broker group holding it as a
    /// TRANSACTION topic, and asks a producer of the topic about each
    /// (`RecoverOrphanedTransactionCommand`); the producer answers with `EndTransaction`.
    async fn check_transactions(self: &Arc<Self>) {
        let mut by_topic: BTreeMap<String, Vec<mpsc::Sender<_>>> = BTreeMap::new();
        for p in lock(&self.producers).values() {
            for t in &p.topics {
                by_topic.entry(t.clone()).or_default().push(p.tx.clone());
            }
        }
        for (topic, streams) in by_topic {
            let Ok(route) = self.routes.route(&topic).await else {
                continue;
            };
            for g in &route.brokers {
                if self.topic_types(g).await.get(&topic) != Some(&TopicMessageType::Transaction) {
                    continue;
                }
                let take = v1::TakeTransactionChecksRequest {
                    topic: topic.clone(),
                    max: TXN_CHECKS_PER_POLL,
                };
                let target = self.target_of_route(g);
                let reply = match self.fwd.call_ok(&target, take, CALL_TIMEOUT).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!(%topic, error = %e, "transaction checks not claimed");
                        continue;
                    }
                };
                let resource = pb::Resource {
                    name: topic.clone(),
                    ..Default::default()
                };
                for (i, t) in reply.transactions.into_iter().enumerate() {
                    let Some(m) = &t.message else { continue };
                    let message = convert::to_v2(m, &resource, &self.cfg.advertise, None);
                    let cmd = pb::TelemetryCommand {
                        status: Some(ok()),
                        command: Some(TelemetryCmd::RecoverOrphanedTransactionCommand(
                            pb::RecoverOrphanedTransactionCommand {
                                message: Some(message),
                                transaction_id: t.transaction_id,
                            },
                        )),
                    };
                    // A stream that is full or gone misses this check; the next comes an
                    // interval later.
                    let _ = streams[i % streams.len()].try_send(Ok(cmd));
                }
            }
        }
    }

    /// The route without the nodes of this group its leader has not heard from for
    /// [`crate::forward::PEER_SILENT_MS`]: the nameservers list a dead node until its
    /// registration expires, and a client would keep trying it (the Rust 5.0.0 client panics when
    /// it cannot connect to a node a route names). Other groups' nodes are left as they are.
    async fn live(&self, route: &v1::RouteResponse) -> v1::RouteResponse {
        let mut route = route.clone();
        let silent = self
            .fwd
            .unreachable_peers(std::time::Duration::from_millis(300))
            .await;
        if silent.is_empty() {
            return route;
        }
        for g in route
            .brokers
            .iter_mut()
            .filter(|g| g.name == self.cfg.broker)
        {
            let kept: Vec<v1::RouteNode> = g
                .nodes
                .iter()
                .filter(|n| !silent.contains(&n.address))
                .cloned()
                .collect();
            if !kept.is_empty() {
                g.nodes = kept;
            }
        }
        route
    }

    /// Where calls for the group named `group` go (empty = this node's group).
    async fn target_of(&self, group: &str, topic: &str) -> Result<Target, Error> {
        if group.is_empty() || group == self.cfg.broker {
            return Ok(Target::Local);
        }
        let route = self.routes.route(topic).await?;
        let g = route
            .brokers
            .iter()
            .find(|b| b.name == group)
            .ok_or_else(|| {
                Error::bad_request(format!("broker {group:?} does not host topic {topic:?}"))
            })?;
        Ok(self.target_of_route(g))
    }

    fn target_of_route(&self, g: &v1::BrokerRoute) -> Target {
        let nodes = route::node_addresses(g);
        if g.name == self.cfg.broker || nodes.is_empty() {
            Target::Local
        } else {
            Target::Nodes(nodes)
        }
    }

    /// The topic's route; an unknown topic is created here when `auto_create_topics` is on.
    async fn route_or_create(&self, topic: &str) -> Result<Arc<v1::RouteResponse>, Error> {
        match self.routes.route(topic).await {
            Err(Error::TopicNotFound { .. }) if self.cfg.auto_create_topics => {}
            other => return other,
        }
        let created = self
            .fwd
            .call(
                &Target::Local,
                v1::CreateTopicRequest {
                    name: topic.to_string(),
                    queues: AUTO_CREATE_QUEUES,
                    update: false,
                    message_type: TopicMessageType::Normal as i32,
                },
                CALL_TIMEOUT,
            )
            .await?;
        let queues = match &created.error {
            Some(e) if e.code == ErrorCode::TopicExists as i32 => AUTO_CREATE_QUEUES,
            Some(e) => return Err(Error::Broker(e.clone())),
            None => created
                .topic
                .as_ref()
                .map_or(AUTO_CREATE_QUEUES, |t| t.queues),
        };
        tracing::info!(topic, queues, "created topic for a RocketMQ 5 client");
        // The nameservers learn of it at the group's next registration.
        for _ in 0..10 {
            self.routes.forget(topic);
            if let Ok(r) = self.routes.route(topic).await {
                return Ok(r);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(Arc::new(v1::RouteResponse {
            error: None,
            topic: topic.to_string(),
            brokers: vec![v1::BrokerRoute {
                name: self.cfg.broker.clone(),
                queues,
                nodes: vec![v1::RouteNode {
                    node_id: self.cfg.node_id,
                    address: self.cfg.advertise.clone(),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }))
    }

    /// The message types of the topics of group `g` (cached; empty when it cannot be asked).
    async fn topic_types(&self, g: &v1::BrokerRoute) -> Arc<HashMap<String, TopicMessageType>> {
        if let Some((at, t)) = lock(&self.topic_types).get(&g.name)
            && at.elapsed() < CONFIG_TTL
        {
            return t.clone();
        }
        let target = self.target_of_route(g);
        match self
            .fwd
            .call_ok(&target, v1::ListTopicsRequest {}, CALL_TIMEOUT)
            .await
        {
            Ok(reply) => {
                let types: HashMap<_, _> = reply
                    .topics
                    .iter()
                    .map(|t| (t.name.clone(), t.message_type()))
                    .collect();
                let types = Arc::new(types);
                lock(&self.topic_types).insert(g.name.clone(), (Instant::now(), types.clone()));
                types
            }
            Err(e) => {
                tracing::debug!(broker = %g.name, error = %e, "cannot list topics; assuming NORMAL");
                Arc::default()
            }
        }
    }

    /// The topic's type on each group of its route.
    async fn types_for(
        &self,
        route: &v1::RouteResponse,
        topic: &str,
    ) -> HashMap<String, TopicMessageType> {
        let mut out = HashMap::new();
        for g in &route.brokers {
            if let Some(t) = self.topic_types(g).await.get(topic) {
                out.insert(g.name.clone(), *t);
            }
        }
        out
    }

    /// A consumer group's config on this node's group (cached); `None` when unknown.
    async fn group_config(&self, group: &str) -> Option<v1::GroupConfig> {
        if let Some((at, gs)) = lock(&self.groups).as_ref()
            && at.elapsed() < CONFIG_TTL
        {
            return gs.get(group).cloned();
        }
        match self
            .fwd
            .call_ok(&Target::Local, v1::ListGroupsRequest {}, CALL_TIMEOUT)
            .await
        {
            Ok(reply) => {
                let gs: HashMap<_, _> = reply
                    .groups
                    .into_iter()
                    .map(|g| (g.name.clone(), g))
                    .collect();
                let found = gs.get(group).cloned();
                *lock(&self.groups) = Some((Instant::now(), Arc::new(gs)));
                found
            }
            Err(e) => {
                tracing::debug!(group, error = %e, "cannot list consumer groups");
                None
            }
        }
    }

    /// Notes that a client was heard from; `settings` refreshes its group and topics.
    fn remember(&self, client: &str, group: Option<&str>, settings: Option<&pb::Settings>) {
        if client.is_empty() {
            return;
        }
        let mut clients = lock(&self.clients);
        clients.retain(|_, c| c.last_seen.elapsed() < CLIENT_IDLE_MAX);
        let e = clients
            .entry(client.to_string())
            .or_insert_with(|| ClientEntry {
                group: None,
                topics: Vec::new(),
                last_seen: Instant::now(),
            });
        e.last_seen = Instant::now();
        if let Some(g) = group.filter(|g| !g.is_empty()) {
            e.group = Some(g.to_string());
        }
        match settings.and_then(|s| s.pub_sub.as_ref()) {
            Some(PubSub::Subscription(sub)) => {
                if let Some(g) = &sub.group {
                    e.group = Some(g.name.clone());
                }
                e.topics = sub
                    .subscriptions
                    .iter()
                    .map(|s| name(&s.topic).to_string())
                    .collect();
            }
            Some(PubSub::Publishing(p)) => {
                e.topics = p.topics.iter().map(|t| t.name.clone()).collect();
            }
            None => {}
        }
    }

    async fn send_message(
        self: &Arc<Self>,
        msgs: &[pb::Message],
    ) -> Result<Vec<pb::SendResultEntry>, Error> {
        if msgs.is_empty() {
            return Err(Error::bad_request("SendMessage carries no message"));
        }
        if msgs.len() > SEND_MESSAGES_MAX {
            return Err(Error::bad_request(format!(
                "SendMessage carries {} messages; the limit is {SEND_MESSAGES_MAX}",
                msgs.len()
            )));
        }
        let topic = name(&msgs[0].topic).to_string();
        if topic.is_empty() {
            return Err(Error::refused(
                Code::IllegalTopic,
                "the message has no topic",
            ));
        }
        if let Some(other) = msgs.iter().map(|m| name(&m.topic)).find(|t| *t != topic) {
            return Err(Error::bad_request(format!(
                "one SendMessage must have one topic: {topic:?} and {other:?}"
            )));
        }
        let route = self.route_or_create(&topic).await?;
        // This node's group when it hosts the topic (the client dialled one of its nodes), else
        // the groups in turn.
        let g = match route.brokers.iter().find(|b| b.name == self.cfg.broker) {
            Some(g) => g,
            None => {
                let n = self.rotation.fetch_add(1, Ordering::Relaxed);
                &route.brokers[n % route.brokers.len()]
            }
        };
        if g.queues == 0 {
            return Err(Error::TopicNotFound { topic });
        }
        let topic_type = self
            .topic_types(g)
            .await
            .get(&topic)
            .copied()
            .unwrap_or(TopicMessageType::Normal);
        let mut planned = Vec::with_capacity(msgs.len());
        for m in msgs {
            check_type(&topic, topic_type, convert::message_type(m))?;
            let stored = convert::to_v1(m, self.cfg.body_bytes_max)?;
            planned.push((self.choose_queue(m, g.queues), stored));
        }
        let target = self.target_of_route(g);
        let limits = combine::BatchLimits {
            messages: self.cfg.batch_messages_max.max(1),
            bytes: self.cfg.batch_bytes_max.max(1),
        };
        let ids: Vec<String> = msgs.iter().map(message_id).collect();
        let me = self.clone();
        let offsets = self
            .resends
            .send(&ids, move |fresh: Vec<usize>| {
                Box::pin(async move {
                    let mut by_queue: BTreeMap<u32, Vec<(usize, v1::Message)>> = BTreeMap::new();
                    let mut planned: Vec<Option<(u32, v1::Message)>> =
                        planned.into_iter().map(Some).collect();
                    for (k, &i) in fresh.iter().enumerate() {
                        let (queue, m) = planned[i].take().expect("each message sent once");
                        by_queue.entry(queue).or_default().push((k, m));
                    }
                    let mut offsets = vec![0u64; fresh.len()];
                    for (queue, items) in by_queue {
                        let (idx, messages): (Vec<usize>, Vec<v1::Message>) =
                            items.into_iter().unzip();
                        let send = me.batch_sender(target.clone(), topic.clone(), queue);
                        let got = me
                            .combiner
                            .send(&topic, queue, messages, limits, send)
                            .await?;
                        for (j, k) in idx.into_iter().enumerate() {
                            offsets[k] = got.get(j).copied().unwrap_or(u64::MAX);
                        }
                    }
                    Ok(offsets)
                })
            })
            .await?;
        Ok(msgs
            .iter()
            .zip(offsets)
            .map(|(m, o)| {
                let (offset, mut recall_handle) = match o {
                    u64::MAX => (-1, String::new()),
                    o if o & SCHEDULED_BIT != 0 => (0, recall_handle(&g.name, o)),
                    o => (o as i64, String::new()),
                };
                // A half message is named by its transaction id instead (its raftmq id).
                let mut transaction_id = String::new();
                if topic_type == TopicMessageType::Transaction {
                    transaction_id = std::mem::take(&mut recall_handle);
                }
                pb::SendResultEntry {
                    status: Some(ok()),
                    message_id: message_id(m),
                    offset,
                    recall_handle,
                    transaction_id,
                }
            })
            .collect())
    }

    /// Sends one folded batch to a queue as one idempotent v1 `Send` (retries reuse its
    /// sequence, so a batch is stored once); the offsets of its messages, in order.
    fn batch_sender(
        self: &Arc<Self>,
        target: Target,
        topic: String,
        queue: u32,
    ) -> combine::SendBatch {
        let me = self.clone();
        Arc::new(move |messages: Vec<v1::Message>| {
            let (me, target, topic) = (me.clone(), target.clone(), topic.clone());
            Box::pin(async move {
                let seq = me.sequence.fetch_add(1, Ordering::Relaxed);
                let req = v1::SendRequest {
                    topic,
                    queue,
                    messages,
                    producer_id: me.producer_base + seq % PRODUCER_LANES,
                    sequence: seq,
                    // A retry through another node's front is stored once too.
                    dedup_property: convert::P_MSGID.to_string(),
                };
                // An unknown outcome (no leader yet, a node that went away, a deadline) is
                // retried with the same sequence for longer than the forwarder's window: the
                // callers' own retries wait for this batch (see `resend`), not for a new one.
                let started = Instant::now();
                loop {
                    match me.fwd.call_ok(&target, req.clone(), CALL_TIMEOUT).await {
                        Ok(reply) => return Ok(reply.results.iter().map(placed).collect()),
                        Err(e)
                            if e.code() == Code::ProxyTimeout
                                && started.elapsed() < SEND_RETRY_WINDOW =>
                        {
                            tracing::debug!(error = %e, "send outcome unknown; sending again");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
            })
        })
    }

    /// The queue of a message: the client's `queue_id` when it names one of the group's queues
    /// (0 is also "unset" in proto3, and the Python client never sets it, so 0 rotates), the
    /// hash of its message group for FIFO messages, else the queues in turn.
    fn choose_queue(&self, m: &pb::Message, queues: u32) -> u32 {
        let sys = m.system_properties.as_ref();
        if let Some(q) = sys
            .map(|s| s.queue_id)
            .filter(|&q| q > 0 && (q as u32) < queues)
        {
            return q as u32;
        }
        if let Some(g) = sys.and_then(|s| s.message_group.as_deref()) {
            let h = g.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
            return (h % queues as u64) as u32;
        }
        (self.rotation.fetch_add(1, Ordering::Relaxed) % queues as usize) as u32
    }

    async fn receive(
        &self,
        req: pb::ReceiveMessageRequest,
        client: String,
        deadline: Option<Duration>,
    ) -> Result<Vec<pb::ReceiveMessageResponse>, Error> {
        let group = name(&req.group).to_string();
        if group.is_empty() {
            return Err(Error::refused(
                Code::IllegalConsumerGroup,
                "the request names no group",
            ));
        }
        let mq = req.message_queue.clone().unwrap_or_default();
        let topic_res = mq.topic.clone().unwrap_or_default();
        if topic_res.name.is_empty() {
            return Err(Error::refused(
                Code::IllegalTopic,
                "the request names no topic",
            ));
        }
        let tags = tag_expression(&req.filter_expression)?;
        let batch = if req.batch_size <= 0 {
            settings::RECEIVE_BATCH_SIZE
        } else {
            req.batch_size.min(RECEIVE_BATCH_MAX)
        };
        let invisible = match &req.invisible_duration {
            Some(d) if !req.auto_renew && !convert::std_duration(d).is_zero() => {
                convert::std_duration(d)
            }
            _ => INVISIBLE_DEFAULT,
        };
        let poll = poll_time(
            req.long_polling_timeout.as_ref().map(convert::std_duration),
            deadline,
        );
        let broker = mq.broker.as_ref().map_or("", |b| b.name.as_str());
        let target = self.target_of(broker, &topic_res.name).await?;
        // As RocketMQ's proxy does: the queue a receive names only chooses the broker group, and
        // the group receives from any of its queues. (Receiving from the one queue named would
        // make a simple consumer, which rotates over the route's queues, wait out a long poll on
        // each empty queue.) A FIFO group too: the broker group hands out a message group's next
        // message only once the one before it is acknowledged, whoever receives it.
        let pop = v1::PopRequest {
            group,
            topic: topic_res.name.clone(),
            queue: None,
            max_messages: batch as u32,
            invisible_ms: invisible.as_millis() as u64,
            max_wait_ms: poll.as_millis() as u32,
            tag_expression: tags,
            consumer_id: client,
        };
        let reply = self.fwd.call_ok(&target, pop, poll + CALL_TIMEOUT).await?;
        let mut frames = Vec::with_capacity(reply.messages.len() + 2);
        if reply.messages.is_empty() {
            frames.push(RecvContent::Status(status(
                Code::MessageNotFound,
                "no new message",
            )));
        } else {
            frames.push(RecvContent::Status(ok()));
        }
        for p in &reply.messages {
            let Some(m) = &p.message else { continue };
            let d = Delivery {
                receipt_handle: p.receipt_handle.clone(),
                attempt: p.delivery_attempt,
                invisible,
            };
            frames.push(RecvContent::Message(convert::to_v2(
                m,
                &topic_res,
                &self.cfg.advertise,
                Some(&d),
            )));
        }
        frames.push(RecvContent::DeliveryTimestamp(convert::now_timestamp()));
        Ok(frames
            .into_iter()
            .map(|c| pb::ReceiveMessageResponse { content: Some(c) })
            .collect())
    }

    async fn ack(&self, req: &pb::AckMessageRequest) -> pb::AckMessageResponse {
        let each = |st: &pb::Status| pb::AckMessageResponse {
            status: Some(st.clone()),
            entries: req
                .entries
                .iter()
                .map(|e| pb::AckMessageResultEntry {
                    message_id: e.message_id.clone(),
                    receipt_handle: e.receipt_handle.clone(),
                    status: Some(st.clone()),
                })
                .collect(),
        };
        if req.entries.is_empty() {
            return each(&status(Code::BadRequest, "AckMessage carries no entry"));
        }
        let ack = v1::PopAckRequest {
            group: name(&req.group).to_string(),
            topic: name(&req.topic).to_string(),
            receipt_handles: req
                .entries
                .iter()
                .map(|e| e.receipt_handle.clone())
                .collect(),
        };
        let reply = match self.fwd.call_ok(&Target::Local, ack, CALL_TIMEOUT).await {
            Ok(r) => r,
            Err(e) => return each(&e.status()),
        };
        let by_handle: HashMap<&str, &v1::PopAckResult> = reply
            .results
            .iter()
            .map(|r| (r.receipt_handle.as_str(), r))
            .collect();
        let mut codes = HashSet::new();
        let entries: Vec<_> = req
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let result = if reply.results.len() == req.entries.len() {
                    reply.results.get(i)
                } else {
                    by_handle.get(e.receipt_handle.as_str()).copied()
                };
                let st = match result.map(|r| &r.error) {
                    Some(None) => ok(),
                    Some(Some(err)) if err.code == ErrorCode::Ok as i32 => ok(),
                    Some(Some(err)) => status(code_of_v1(err.code), err.message.clone()),
                    None => status(
                        Code::InternalServerError,
                        "the broker gave no result for this handle",
                    ),
                };
                codes.insert(st.code);
                pb::AckMessageResultEntry {
                    message_id: e.message_id.clone(),
                    receipt_handle: e.receipt_handle.clone(),
                    status: Some(st),
                }
            })
            .collect();
        // As the Java proxy: the one code all entries share, else MULTIPLE_RESULTS.
        let overall = if codes.len() == 1 {
            entries[0].status.clone()
        } else {
            Some(status(
                Code::MultipleResults,
                "entries have different results",
            ))
        };
        pb::AckMessageResponse {
            status: overall,
            entries,
        }
    }

    async fn pull(
        &self,
        req: pb::PullMessageRequest,
        client: String,
        deadline: Option<Duration>,
    ) -> Result<Vec<pb::PullMessageResponse>, Error> {
        use pb::pull_message_response::Content;
        let mq = req.message_queue.clone().unwrap_or_default();
        let topic_res = mq.topic.clone().unwrap_or_default();
        if mq.id < 0 || req.offset < 0 {
            return Err(Error::bad_request(
                "PullMessage needs a queue id and an offset >= 0",
            ));
        }
        let tags = tag_expression(&req.filter_expression)?;
        let poll = poll_time(
            req.long_polling_timeout.as_ref().map(convert::std_duration),
            deadline,
        );
        let broker = mq.broker.as_ref().map_or("", |b| b.name.as_str());
        let target = self.target_of(broker, &topic_res.name).await?;
        let pull = v1::PullRequest {
            topic: topic_res.name.clone(),
            queue: mq.id as u32,
            offset: req.offset as u64,
            max_messages: req.batch_size.clamp(1, RECEIVE_BATCH_MAX) as u32,
            max_wait_ms: poll.as_millis() as u32,
            consumer_id: client,
        };
        let reply = self.fwd.call(&target, pull, poll + CALL_TIMEOUT).await?;
        let mut frames = Vec::new();
        match &reply.error {
            Some(e) if e.code == ErrorCode::OffsetOutOfRange as i32 => {
                frames.push(Content::Status(status(
                    code_of_v1(e.code),
                    e.message.clone(),
                )));
            }
            Some(e) if e.code != ErrorCode::Ok as i32 => return Err(Error::Broker(e.clone())),
            _ => {
                let kept: Vec<_> = reply
                    .messages
                    .iter()
                    .filter(|m| tag_matches(&tags, &m.tag))
                    .collect();
                frames.push(Content::Status(if kept.is_empty() {
                    status(Code::MessageNotFound, "no new message")
                } else {
                    ok()
                }));
                for m in kept {
                    frames.push(Content::Message(convert::to_v2(
                        m,
                        &topic_res,
                        &self.cfg.advertise,
                        None,
                    )));
                }
            }
        }
        frames.push(Content::NextOffset(reply.next_offset as i64));
        Ok(frames
            .into_iter()
            .map(|c| pb::PullMessageResponse { content: Some(c) })
            .collect())
    }

    async fn query_offset(&self, req: &pb::QueryOffsetRequest) -> Result<i64, Error> {
        let policy = pb::QueryOffsetPolicy::try_from(req.query_offset_policy)
            .map_err(|_| Error::bad_request("unknown query_offset_policy"))?;
        if policy == pb::QueryOffsetPolicy::Timestamp {
            return Err(Error::refused(
                Code::NotImplemented,
                "QueryOffset by TIMESTAMP is not implemented; use BEGINNING or END",
            ));
        }
        let mq = req.message_queue.clone().unwrap_or_default();
        if mq.id < 0 {
            return Err(Error::bad_request("QueryOffset needs a queue id >= 0"));
        }
        let topic = name(&mq.topic).to_string();
        let broker = mq.broker.as_ref().map_or("", |b| b.name.as_str());
        let target = self.target_of(broker, &topic).await?;
        let pull = v1::PullRequest {
            topic,
            queue: mq.id as u32,
            offset: 0,
            max_messages: 1,
            ..Default::default()
        };
        let reply = self.fwd.call(&target, pull, CALL_TIMEOUT).await?;
        if let Some(e) = &reply.error
            && e.code != ErrorCode::Ok as i32
            && e.code != ErrorCode::OffsetOutOfRange as i32
        {
            return Err(Error::Broker(e.clone()));
        }
        Ok(match policy {
            pb::QueryOffsetPolicy::Beginning => reply.min_offset as i64,
            _ => reply.max_offset as i64,
        })
    }
}

/// The id a send result names: the client's, else none.
fn message_id(m: &pb::Message) -> String {
    m.system_properties
        .as_ref()
        .map(|s| s.message_id.clone())
        .unwrap_or_default()
}

fn not_implemented(rpc: &str) -> pb::Status {
    status(
        Code::NotImplemented,
        format!("{rpc} is not implemented by raftmq"),
    )
}

impl<B: BrokerService> Front<B> {
    /// The v2 status refusing this request's caller `action` on `resources` (`None` action:
    /// authentication alone): UNAUTHORIZED (40100) without a valid signature, FORBIDDEN (40300)
    /// when the user's rules do not allow it; None when allowed or auth is off.
    fn denied<T>(
        &self,
        request: &Request<T>,
        action: Option<Action>,
        resources: &[Resource<'_>],
    ) -> Option<pb::Status> {
        if !self.inner.cfg.auth {
            return None;
        }
        let caller = request.extensions().get::<raftmq_security::Caller>();
        let outcome = match action {
            Some(a) => raftmq_security::authorize(caller, a, resources),
            None => raftmq_security::authenticated(caller),
        };
        outcome.err().map(|d| match d {
            raftmq_security::Denied::Unauthenticated(_) => {
                status(Code::Unauthorized, d.to_string())
            }
            raftmq_security::Denied::Forbidden { .. } => status(Code::Forbidden, d.to_string()),
        })
    }

    /// [`Self::denied`] for consuming `topic` in `group`: Sub on both.
    fn denied_sub<T>(&self, request: &Request<T>, topic: &str, group: &str) -> Option<pb::Status> {
        let resources = [Resource::topic(topic), Resource::group(group)];
        self.denied(request, Some(Action::Sub), &resources)
    }
}

#[tonic::async_trait]
impl<B: BrokerService> MessagingService for Front<B> {
    async fn query_route(
        &self,
        request: Request<pb::QueryRouteRequest>,
    ) -> Result<Response<pb::QueryRouteResponse>, Status> {
        let topic_name = name(&request.get_ref().topic).to_string();
        let refused = self
            .denied(&request, Some(Action::Pub), &[Resource::topic(&topic_name)])
            .and(self.denied(&request, Some(Action::Sub), &[Resource::topic(&topic_name)]));
        if let Some(st) = refused {
            return Ok(Response::new(pb::QueryRouteResponse {
                status: Some(st),
                message_queues: Vec::new(),
            }));
        }
        let me = &self.inner;
        let topic = request.into_inner().topic.unwrap_or_default();
        let reply = if topic.name.is_empty() {
            pb::QueryRouteResponse {
                status: Some(status(Code::IllegalTopic, "QueryRoute names no topic")),
                message_queues: Vec::new(),
            }
        } else {
            match me.route_or_create(&topic.name).await {
                Ok(route) => {
                    let route = me.live(&route).await;
                    let types = me.types_for(&route, &topic.name).await;
                    pb::QueryRouteResponse {
                        status: Some(ok()),
                        message_queues: route::route_queues(&topic, &route, &types),
                    }
                }
                Err(e) => pb::QueryRouteResponse {
                    status: Some(e.status()),
                    message_queues: Vec::new(),
                },
            }
        };
        Ok(Response::new(reply))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        if let Some(st) = self.denied(&request, None, &[]) {
            return Ok(Response::new(pb::HeartbeatResponse { status: Some(st) }));
        }
        let client = client_id(&request);
        let req = request.into_inner();
        let group = name(&req.group).to_string();
        self.inner.remember(&client, Some(&group), None);
        let consumer = matches!(
            pb::ClientType::try_from(req.client_type),
            Ok(pb::ClientType::PushConsumer
                | pb::ClientType::SimpleConsumer
                | pb::ClientType::PullConsumer
                | pb::ClientType::LitePushConsumer
                | pb::ClientType::LiteSimpleConsumer)
        );
        if consumer && !group.is_empty() && !client.is_empty() {
            // Membership on the leader: best effort, off the client's 3 s deadline.
            let topics = lock(&self.inner.clients)
                .get(&client)
                .map(|c| c.topics.clone())
                .unwrap_or_default();
            let inner = self.inner.clone();
            tokio::spawn(async move {
                let hb = v1::HeartbeatRequest {
                    group,
                    consumer_id: client,
                    topics,
                };
                if let Err(e) = inner.fwd.call_ok(&Target::Local, hb, CALL_TIMEOUT).await {
                    tracing::debug!(error = %e, "consumer heartbeat not recorded");
                }
            });
        }
        Ok(Response::new(pb::HeartbeatResponse { status: Some(ok()) }))
    }

    async fn send_message(
        &self,
        request: Request<pb::SendMessageRequest>,
    ) -> Result<Response<pb::SendMessageResponse>, Status> {
        let topics: Vec<String> = request
            .get_ref()
            .messages
            .iter()
            .map(|m| name(&m.topic).to_string())
            .collect();
        let resources: Vec<Resource<'_>> = topics.iter().map(|t| Resource::topic(t)).collect();
        if let Some(st) = self.denied(&request, Some(Action::Pub), &resources) {
            return Ok(Response::new(pb::SendMessageResponse {
                status: Some(st.clone()),
                entries: vec![pb::SendResultEntry {
                    status: Some(st),
                    ..Default::default()
                }],
            }));
        }
        let msgs = request.into_inner().messages;
        let reply = match self.inner.send_message(&msgs).await {
            Ok(entries) => pb::SendMessageResponse {
                status: Some(ok()),
                entries,
            },
            // One entry per message even on failure: the Rust client reads entries[0].
            Err(e) => {
                let st = e.status();
                let n = msgs.len().max(1);
                pb::SendMessageResponse {
                    status: Some(st.clone()),
                    entries: (0..n)
                        .map(|i| pb::SendResultEntry {
                            status: Some(st.clone()),
                            message_id: msgs.get(i).map(message_id).unwrap_or_default(),
                            ..Default::default()
                        })
                        .collect(),
                }
            }
        };
        Ok(Response::new(reply))
    }

    async fn query_assignment(
        &self,
        request: Request<pb::QueryAssignmentRequest>,
    ) -> Result<Response<pb::QueryAssignmentResponse>, Status> {
        if let Some(st) = self.denied_sub(
            &request,
            name(&request.get_ref().topic),
            name(&request.get_ref().group),
        ) {
            return Ok(Response::new(pb::QueryAssignmentResponse {
                status: Some(st),
                assignments: Vec::new(),
            }));
        }
        let me = &self.inner;
        let req = request.into_inner();
        let topic = req.topic.unwrap_or_default();
        let group = name(&req.group).to_string();
        let reply = match me.route_or_create(&topic.name).await {
            Ok(route) => {
                let route = me.live(&route).await;
                let types = me.types_for(&route, &topic.name).await;
                let fifo = me.group_config(&group).await.is_some_and(|g| g.fifo);
                pb::QueryAssignmentResponse {
                    status: Some(ok()),
                    assignments: route::assignments(&topic, &route, &types, fifo),
                }
            }
            Err(e) => pb::QueryAssignmentResponse {
                status: Some(e.status()),
                assignments: Vec::new(),
            },
        };
        Ok(Response::new(reply))
    }

    type ReceiveMessageStream = FrameStream<pb::ReceiveMessageResponse>;

    async fn receive_message(
        &self,
        request: Request<pb::ReceiveMessageRequest>,
    ) -> Result<Response<Self::ReceiveMessageStream>, Status> {
        let r = request.get_ref();
        if let Some(st) = self.denied_sub(&request, queue_topic(&r.message_queue), name(&r.group)) {
            let frame = pb::ReceiveMessageResponse {
                content: Some(RecvContent::Status(st)),
            };
            return Ok(Response::new(Box::pin(tokio_stream::iter([Ok(frame)]))));
        }
        let client = client_id(&request);
        let deadline = deadline(&request);
        let frames = self
            .inner
            .receive(request.into_inner(), client, deadline)
            .await
            .unwrap_or_else(|e| {
                vec![pb::ReceiveMessageResponse {
                    content: Some(RecvContent::Status(e.status())),
                }]
            });
        Ok(Response::new(Box::pin(tokio_stream::iter(
            frames.into_iter().map(Ok),
        ))))
    }

    async fn ack_message(
        &self,
        request: Request<pb::AckMessageRequest>,
    ) -> Result<Response<pb::AckMessageResponse>, Status> {
        if let Some(st) = self.denied_sub(
            &request,
            name(&request.get_ref().topic),
            name(&request.get_ref().group),
        ) {
            return Ok(Response::new(pb::AckMessageResponse {
                status: Some(st),
                ..Default::default()
            }));
        }
        Ok(Response::new(self.inner.ack(&request.into_inner()).await))
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<pb::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<pb::ForwardMessageToDeadLetterQueueResponse>, Status> {
        if let Some(st) = self.denied_sub(
            &request,
            name(&request.get_ref().topic),
            name(&request.get_ref().group),
        ) {
            return Ok(Response::new(pb::ForwardMessageToDeadLetterQueueResponse {
                status: Some(st),
            }));
        }
        let req = request.into_inner();
        let dl = v1::DeadLetterRequest {
            group: name(&req.group).to_string(),
            topic: name(&req.topic).to_string(),
            receipt_handle: req.receipt_handle,
        };
        let st = match self
            .inner
            .fwd
            .call_ok(&Target::Local, dl, CALL_TIMEOUT)
            .await
        {
            Ok(_) => ok(),
            Err(e) => e.status(),
        };
        Ok(Response::new(pb::ForwardMessageToDeadLetterQueueResponse {
            status: Some(st),
        }))
    }

    type PullMessageStream = FrameStream<pb::PullMessageResponse>;

    async fn pull_message(
        &self,
        request: Request<pb::PullMessageRequest>,
    ) -> Result<Response<Self::PullMessageStream>, Status> {
        let r = request.get_ref();
        if let Some(st) = self.denied_sub(&request, queue_topic(&r.message_queue), name(&r.group)) {
            let frame = pb::PullMessageResponse {
                content: Some(pb::pull_message_response::Content::Status(st)),
            };
            return Ok(Response::new(Box::pin(tokio_stream::iter([Ok(frame)]))));
        }
        let client = client_id(&request);
        let deadline = deadline(&request);
        let frames = self
            .inner
            .pull(request.into_inner(), client, deadline)
            .await
            .unwrap_or_else(|e| {
                vec![pb::PullMessageResponse {
                    content: Some(pb::pull_message_response::Content::Status(e.status())),
                }]
            });
        Ok(Response::new(Box::pin(tokio_stream::iter(
            frames.into_iter().map(Ok),
        ))))
    }

    async fn update_offset(
        &self,
        request: Request<pb::UpdateOffsetRequest>,
    ) -> Result<Response<pb::UpdateOffsetResponse>, Status> {
        if let Some(st) = self.denied_sub(
            &request,
            queue_topic(&request.get_ref().message_queue),
            name(&request.get_ref().group),
        ) {
            return Ok(Response::new(pb::UpdateOffsetResponse { status: Some(st) }));
        }
        let req = request.into_inner();
        let mq = req.message_queue.unwrap_or_default();
        let topic = name(&mq.topic).to_string();
        let outcome = async {
            if mq.id < 0 || req.offset < 0 {
                return Err(Error::bad_request(
                    "UpdateOffset needs a queue id and an offset >= 0",
                ));
            }
            let broker = mq.broker.as_ref().map_or("", |b| b.name.as_str());
            let target = self.inner.target_of(broker, &topic).await?;
            let commit = v1::CommitOffsetRequest {
                group: name(&req.group).to_string(),
                topic: topic.clone(),
                queue: mq.id as u32,
                offset: req.offset as u64,
            };
            self.inner.fwd.call_ok(&target, commit, CALL_TIMEOUT).await
        };
        let st = match outcome.await {
            Ok(_) => ok(),
            Err(e) => e.status(),
        };
        Ok(Response::new(pb::UpdateOffsetResponse { status: Some(st) }))
    }

    async fn get_offset(
        &self,
        request: Request<pb::GetOffsetRequest>,
    ) -> Result<Response<pb::GetOffsetResponse>, Status> {
        if let Some(st) = self.denied_sub(
            &request,
            queue_topic(&request.get_ref().message_queue),
            name(&request.get_ref().group),
        ) {
            return Ok(Response::new(pb::GetOffsetResponse {
                status: Some(st),
                offset: 0,
            }));
        }
        let req = request.into_inner();
        let mq = req.message_queue.unwrap_or_default();
        let topic = name(&mq.topic).to_string();
        let group = name(&req.group).to_string();
        let outcome = async {
            if mq.id < 0 {
                return Err(Error::bad_request("GetOffset needs a queue id >= 0"));
            }
            let broker = mq.broker.as_ref().map_or("", |b| b.name.as_str());
            let target = self.inner.target_of(broker, &topic).await?;
            let fetch = v1::FetchOffsetRequest {
                group: group.clone(),
                topic: topic.clone(),
                queue: mq.id as u32,
            };
            let reply = self.inner.fwd.call_ok(&target, fetch, CALL_TIMEOUT).await?;
            if !reply.found {
                // OFFSET_NOT_FOUND (40404) is unknown to the Rust client 5.0.0.
                return Err(Error::refused(
                    Code::NotFound,
                    format!(
                        "group {group:?} has no committed offset for {topic:?} queue {}",
                        mq.id
                    ),
                ));
            }
            Ok(reply.offset as i64)
        };
        let reply = match outcome.await {
            Ok(offset) => pb::GetOffsetResponse {
                status: Some(ok()),
                offset,
            },
            Err(e) => pb::GetOffsetResponse {
                status: Some(e.status()),
                offset: 0,
            },
        };
        Ok(Response::new(reply))
    }

    async fn query_offset(
        &self,
        request: Request<pb::QueryOffsetRequest>,
    ) -> Result<Response<pb::QueryOffsetResponse>, Status> {
        if let Some(st) = self.denied(
            &request,
            Some(Action::Sub),
            &[Resource::topic(queue_topic(
                &request.get_ref().message_queue,
            ))],
        ) {
            return Ok(Response::new(pb::QueryOffsetResponse {
                status: Some(st),
                offset: 0,
            }));
        }
        let reply = match self.inner.query_offset(&request.into_inner()).await {
            Ok(offset) => pb::QueryOffsetResponse {
                status: Some(ok()),
                offset,
            },
            Err(e) => pb::QueryOffsetResponse {
                status: Some(e.status()),
                offset: 0,
            },
        };
        Ok(Response::new(reply))
    }

    async fn end_transaction(
        &self,
        request: Request<pb::EndTransactionRequest>,
    ) -> Result<Response<pb::EndTransactionResponse>, Status> {
        if let Some(st) = self.denied(
            &request,
            Some(Action::Pub),
            &[Resource::topic(name(&request.get_ref().topic))],
        ) {
            return Ok(Response::new(pb::EndTransactionResponse {
                status: Some(st),
            }));
        }
        let req = request.into_inner();
        let topic = name(&req.topic).to_string();
        let outcome = async {
            let commit = match pb::TransactionResolution::try_from(req.resolution) {
                Ok(pb::TransactionResolution::Commit) => true,
                Ok(pb::TransactionResolution::Rollback) => false,
                _ => {
                    return Err(Error::bad_request(
                        "EndTransaction needs the resolution COMMIT or ROLLBACK (the \
                         transaction stays open and is checked again)",
                    ));
                }
            };
            let Some((broker, _, _)) = raftmq_proto::split_msg_id(&req.transaction_id) else {
                return Err(Error::refused(
                    Code::InvalidTransactionId,
                    format!(
                        "transaction id {:?} is not one the send of a transactional message \
                         returned",
                        req.transaction_id
                    ),
                ));
            };
            let target = self.inner.target_of(broker, &topic).await?;
            let end = v1::EndTransactionRequest {
                topic: topic.clone(),
                transaction_id: req.transaction_id.clone(),
                commit,
                from_check: req.source == pb::TransactionSource::SourceServerCheck as i32,
            };
            self.inner.fwd.call_ok(&target, end, CALL_TIMEOUT).await
        };
        let status = match outcome.await {
            Ok(_) => ok(),
            Err(e) => e.status(),
        };
        Ok(Response::new(pb::EndTransactionResponse {
            status: Some(status),
        }))
    }

    type TelemetryStream = FrameStream<pb::TelemetryCommand>;

    async fn telemetry(
        &self,
        request: Request<tonic::Streaming<pb::TelemetryCommand>>,
    ) -> Result<Response<Self::TelemetryStream>, Status> {
        if let Some(st) = self.denied(&request, None, &[]) {
            let frame = pb::TelemetryCommand {
                status: Some(st),
                command: None,
            };
            return Ok(Response::new(Box::pin(tokio_stream::iter([Ok(frame)]))));
        }
        let client = client_id(&request);
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            while let Some(Ok(cmd)) = inbound.next().await {
                let Some(TelemetryCmd::Settings(s)) = cmd.command else {
                    continue;
                };
                let group = match &s.pub_sub {
                    Some(PubSub::Subscription(sub)) => sub.group.as_ref().map(|g| g.name.clone()),
                    _ => None,
                };
                inner.remember(&client, group.as_deref(), Some(&s));
                if let Some(PubSub::Publishing(p)) = &s.pub_sub {
                    let topics = p.topics.iter().map(|t| t.name.clone()).collect();
                    let stream = ProducerStream {
                        topics,
                        tx: tx.clone(),
                    };
                    lock(&inner.producers).insert(client.clone(), stream);
                }
                let config = match &group {
                    Some(g) => inner.group_config(g).await,
                    None => None,
                };
                let answer = match settings::merge(&s, inner.cfg.body_bytes_max, config.as_ref()) {
                    Ok(merged) => Ok(pb::TelemetryCommand {
                        status: Some(ok()),
                        command: Some(TelemetryCmd::Settings(merged)),
                    }),
                    Err(settings::NoPubSub) => Err(Status::invalid_argument(
                        "Settings must carry publishing (producers) or subscription (consumers)",
                    )),
                };
                let last = answer.is_err();
                if tx.send(answer).await.is_err() || last {
                    break;
                }
            }
            let mut producers = lock(&inner.producers);
            if producers
                .get(&client)
                .is_some_and(|p| p.tx.same_channel(&tx))
            {
                producers.remove(&client);
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn notify_client_termination(
        &self,
        request: Request<pb::NotifyClientTerminationRequest>,
    ) -> Result<Response<pb::NotifyClientTerminationResponse>, Status> {
        if let Some(st) = self.denied(&request, None, &[]) {
            return Ok(Response::new(pb::NotifyClientTerminationResponse {
                status: Some(st),
            }));
        }
        let client = client_id(&request);
        let group = name(&request.get_ref().group).to_string();
        lock(&self.inner.clients).remove(&client);
        if !group.is_empty() && !client.is_empty() {
            let inner = self.inner.clone();
            tokio::spawn(async move {
                let leave = v1::LeaveGroupRequest {
                    group,
                    consumer_id: client,
                };
                if let Err(e) = inner.fwd.call_ok(&Target::Local, leave, CALL_TIMEOUT).await {
                    tracing::debug!(error = %e, "consumer leave not recorded");
                }
            });
        }
        Ok(Response::new(pb::NotifyClientTerminationResponse {
            status: Some(ok()),
        }))
    }

    async fn change_invisible_duration(
        &self,
        request: Request<pb::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<pb::ChangeInvisibleDurationResponse>, Status> {
        if let Some(st) = self.denied_sub(
            &request,
            name(&request.get_ref().topic),
            name(&request.get_ref().group),
        ) {
            return Ok(Response::new(pb::ChangeInvisibleDurationResponse {
                status: Some(st),
                receipt_handle: String::new(),
            }));
        }
        let req = request.into_inner();
        let outcome = async {
            let Some(d) = req.invisible_duration.as_ref() else {
                return Err(Error::refused(
                    Code::IllegalInvisibleTime,
                    "ChangeInvisibleDuration needs an invisible_duration",
                ));
            };
            let change = v1::ChangeInvisibleRequest {
                group: name(&req.group).to_string(),
                topic: name(&req.topic).to_string(),
                receipt_handle: req.receipt_handle.clone(),
                invisible_ms: convert::std_duration(d).as_millis() as u64,
            };
            self.inner
                .fwd
                .call_ok(&Target::Local, change, CALL_TIMEOUT)
                .await
        };
        let reply = match outcome.await {
            Ok(r) => pb::ChangeInvisibleDurationResponse {
                status: Some(ok()),
                receipt_handle: r.receipt_handle,
            },
            Err(e) => pb::ChangeInvisibleDurationResponse {
                status: Some(e.status()),
                receipt_handle: String::new(),
            },
        };
        Ok(Response::new(reply))
    }

    /// Cancels a scheduled message: the handle is the raftmq id its send returned, which names
    /// the broker group; that group's leader recalls it.
    async fn recall_message(
        &self,
        request: Request<pb::RecallMessageRequest>,
    ) -> Result<Response<pb::RecallMessageResponse>, Status> {
        if let Some(st) = self.denied(
            &request,
            Some(Action::Pub),
            &[Resource::topic(
                request
                    .get_ref()
                    .topic
                    .as_ref()
                    .map_or("", |t| t.name.as_str()),
            )],
        ) {
            return Ok(Response::new(pb::RecallMessageResponse {
                status: Some(st),
                message_id: String::new(),
            }));
        }
        let req = request.into_inner();
        let topic = req
            .topic
            .as_ref()
            .map_or("", |t| t.name.as_str())
            .to_string();
        let handle = req.recall_handle;
        let outcome = async {
            let Some((broker, _, _)) = raftmq_proto::split_msg_id(&handle) else {
                return Err(Error::bad_request(format!(
                    "recall handle {handle:?} is not one a send of a scheduled message returned"
                )));
            };
            let target = self.inner.target_of(broker, &topic).await?;
            let recall = v1::RecallRequest {
                topic: topic.clone(),
                msg_id: handle.clone(),
            };
            self.inner.fwd.call_ok(&target, recall, CALL_TIMEOUT).await
        };
        let (status, message_id) = match outcome.await {
            Ok(_) => (ok(), handle.clone()),
            Err(e) => (e.status(), String::new()),
        };
        Ok(Response::new(pb::RecallMessageResponse {
            status: Some(status),
            message_id,
        }))
    }

    async fn sync_lite_subscription(
        &self,
        _request: Request<pb::SyncLiteSubscriptionRequest>,
    ) -> Result<Response<pb::SyncLiteSubscriptionResponse>, Status> {
        Ok(Response::new(pb::SyncLiteSubscriptionResponse {
            status: Some(not_implemented("SyncLiteSubscription (lite topics)")),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t50_message_type_must_match_the_topic() {
        let n = pb::MessageType::Normal as i32;
        assert!(check_type("T", TopicMessageType::Normal, n).is_ok());
        assert!(check_type("T", TopicMessageType::Normal, 0).is_ok());
        let e = check_type("T", TopicMessageType::Fifo, n).unwrap_err();
        assert_eq!(e.code(), Code::MessagePropertyConflictWithType);
        assert!(
            e.to_string().contains("FIFO") && e.to_string().contains("NORMAL"),
            "{e}"
        );
        assert!(check_type("T", TopicMessageType::Fifo, 0).is_err());
        assert!(check_type("T", TopicMessageType::Delay, pb::MessageType::Delay as i32).is_ok());
    }

    #[test]
    fn t51_tag_filters() {
        assert!(tag_matches("*", "A"));
        assert!(tag_matches("", ""));
        assert!(tag_matches("A || B", "B"));
        assert!(!tag_matches("A||B", "C"));
        assert!(!tag_matches("A", ""));
        let sql = Some(pb::FilterExpression {
            r#type: pb::FilterType::Sql as i32,
            expression: "a > 1".into(),
        });
        assert_eq!(
            tag_expression(&sql).unwrap_err().code(),
            Code::IllegalFilterExpression
        );
        assert_eq!(tag_expression(&None).unwrap(), "*");
    }
}
