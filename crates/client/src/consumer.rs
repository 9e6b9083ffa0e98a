//! The consumer: group membership, queue assignment, pulls that follow the read hint, offsets.
//!
//! **Membership** lives in memory on each broker group's leader, fed by heartbeats (as RocketMQ's
//! broker consumer table): a coordinator task heartbeats `group` to the leader of every broker group
//! hosting the topic each `heartbeat_interval`; the union of the member lists they return is the
//! group. Every member sorts all `(broker, queue)` pairs and takes its share with
//! [`allocate_averagely`], so members agree without talking to each other, and rebalance when the
//! list changes. A failover costs at most one heartbeat of membership.
//!
//! **Pulls.** One puller task per assigned queue starts at the group's committed offset (or, with
//! none, where [`StartFrom`] says), long-polls, and follows each reply's read hint: the next pull of
//! that queue goes to the suggested node; any error falls back to the leader.
//!
//! **Offsets, at least once.** Messages returned by [`Consumer::poll`] count as processed when
//! `poll` is called again (or [`Consumer::commit`] / [`Consumer::close`]); processed offsets are
//! committed to the group's leader every `commit_interval`, when a queue is handed to another
//! member, and on close. A crash re-delivers at most what was processed but not yet committed.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::{self, ErrorCode};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::Bytes;
use crate::conn::{MESSAGE_BYTES_MAX, each_attempt, request};
use crate::error::{Error, Result};
use crate::nameserver::parse_nameservers;
use crate::queue::{QueueId, allocate_averagely};
use crate::router::{RetryPolicy, Router, is_transport_status};
use crate::security::ClientSecurity;

/// Where a queue with no committed offset for the group is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartFrom {
    /// The oldest retained message.
    #[default]
    Earliest,
    /// Only messages stored after the consumer first took the queue.
    Latest,
}

impl std::str::FromStr for StartFrom {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            other => Err(Error::InvalidArgument(format!(
                "start position {other:?} is neither earliest nor latest"
            ))),
        }
    }
}

/// A message read from a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMessage {
    pub topic: String,
    pub broker: String,
    pub queue: u32,
    pub offset: u64,
    pub msg_id: String,
    pub key: String,
    pub tag: String,
    /// The body as received: a slice of the pull reply, not copied ([`Bytes`] derefs to `[u8]`).
    pub body: Bytes,
    pub properties: std::collections::BTreeMap<String, String>,
    pub store_timestamp_ms: u64,
    /// The node that served the pull.
    pub served_by: Option<v1::NodeRef>,
}

/// Consumer settings; see [`ConsumerBuilder`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub start_from: StartFrom,
    pub heartbeat_interval: Duration,
    pub commit_interval: Duration,
    pub pull_batch_max: u32,
    pub pull_wait: Duration,
    /// Pull replies buffered ahead of `poll`.
    pub prefetch_batches: usize,
    pub route_refresh: Duration,
    /// Deadline of one heartbeat, commit or offset fetch, retries included.
    pub rpc_timeout: Duration,
    pub retry: RetryPolicy,
    /// TLS and request signing of every connection (default: plaintext, unsigned).
    pub security: ClientSecurity,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            start_from: StartFrom::Earliest,
            heartbeat_interval: Duration::from_secs(1),
            commit_interval: Duration::from_secs(1),
            pull_batch_max: 256,
            pull_wait: Duration::from_millis(500),
            prefetch_batches: 16,
            route_refresh: Duration::from_secs(10),
            rpc_timeout: Duration::from_secs(3),
            retry: RetryPolicy::default(),
            security: ClientSecurity::default(),
        }
    }
}

/// Builds a [`Consumer`].
#[derive(Debug, Clone)]
pub struct ConsumerBuilder {
    nameservers: Vec<String>,
    group: String,
    topic: String,
    consumer_id: Option<String>,
    config: ConsumerConfig,
}

impl ConsumerBuilder {
    /// Where to start in a queue the group has no committed offset for (default earliest).
    pub fn start_from(mut self, s: StartFrom) -> Self {
        self.config.start_from = s;
        self
    }

    /// This member's id in the group (default: process id and a random suffix).
    pub fn consumer_id(mut self, id: impl Into<String>) -> Self {
        self.consumer_id = Some(id.into());
        self
    }

    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.config.heartbeat_interval = d;
        self
    }

    pub fn commit_interval(mut self, d: Duration) -> Self {
        self.config.commit_interval = d;
        self
    }

    /// Most messages per pull (default 256).
    pub fn pull_batch(mut self, n: u32) -> Self {
        self.config.pull_batch_max = n.max(1);
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

    /// Joins the group and starts pulling. Needs a Tokio runtime.
    pub fn build(self) -> Result<Consumer> {
        crate::admin::check_name("group", &self.group)?;
        crate::admin::check_name("topic", &self.topic)?;
        let router = Router::new(
            self.nameservers,
            self.config.retry.clone(),
            self.config.security.clone(),
        )?;
        let consumer_id = self
            .consumer_id
            .unwrap_or_else(|| format!("{}@{:08x}", std::process::id(), rand::random::<u32>()));
        let (tx, rx) = mpsc::channel(self.config.prefetch_batches.max(1));
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            router,
            group: self.group,
            topic: self.topic,
            consumer_id,
            config: self.config,
            state: Mutex::new(GroupState::default()),
            deliveries: tx,
        });
        let coordinator = tokio::spawn(Coordinator::run(shared.clone(), stop_rx));
        Ok(Consumer {
            shared,
            rx,
            buffer: VecDeque::new(),
            delivered: HashMap::new(),
            stop: stop_tx,
            coordinator: Some(coordinator),
        })
    }
}

/// A member of a consumer group reading one topic.
///
/// ```no_run
/// use std::time::Duration;
/// use raftmq_client::{Consumer, StartFrom};
///
/// # async fn example() -> raftmq_client::Result<()> {
/// let mut consumer = Consumer::builder("127.0.0.1:9876", "billing", "orders")
///     .start_from(StartFrom::Earliest)
///     .build()?;
/// loop {
///     let batch = consumer.poll(100, Duration::from_secs(1)).await?;
///     if batch.is_empty() {
///         break;
///     }
///     for m in &batch {
///         println!("{}/{}@{}: {}", m.broker, m.queue, m.offset, String::from_utf8_lossy(&m.body));
///     }
/// }
/// consumer.close().await?; // commits what was processed and leaves the group
/// # Ok(())
/// # }
/// ```
pub struct Consumer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Delivery>,
    buffer: VecDeque<(u64, ReceivedMessage)>,
    /// Per queue: (epoch, next offset) of what the last `poll` returned.
    delivered: HashMap<QueueId, (u64, u64)>,
    stop: watch::Sender<bool>,
    coordinator: Option<JoinHandle<()>>,
}

struct Shared {
    router: Arc<Router>,
    group: String,
    topic: String,
    consumer_id: String,
    config: ConsumerConfig,
    state: Mutex<GroupState>,
    deliveries: mpsc::Sender<Delivery>,
}

#[derive(Default)]
struct GroupState {
    members: Vec<String>,
    assigned: HashMap<QueueId, QueueState>,
    next_epoch: u64,
}

struct QueueState {
    /// Changes each time the queue is (re)assigned, so stale prefetched messages are dropped.
    epoch: u64,
    /// Next offset after what the application processed.
    consumed: Option<u64>,
    /// What the broker has as committed, as far as this member knows.
    committed: Option<u64>,
    puller: JoinHandle<()>,
}

struct Delivery {
    queue: QueueId,
    epoch: u64,
    msgs: Vec<ReceivedMessage>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Consumer {
    /// A builder for consumer group `group` reading `topic`, nameservers as `"host:port;…"`.
    pub fn builder(nameservers: &str, group: &str, topic: &str) -> ConsumerBuilder {
        ConsumerBuilder {
            nameservers: parse_nameservers(nameservers),
            group: group.to_string(),
            topic: topic.to_string(),
            consumer_id: None,
            config: ConsumerConfig::default(),
        }
    }

    /// This member's id in the group.
    pub fn consumer_id(&self) -> &str {
        &self.shared.consumer_id
    }

    /// The queues this member reads now, sorted.
    pub fn assignment(&self) -> Vec<QueueId> {
        let mut q: Vec<QueueId> = lock(&self.shared.state).assigned.keys().cloned().collect();
        q.sort();
        q
    }

    /// The group's members as last heard from the brokers, sorted.
    pub fn members(&self) -> Vec<String> {
        lock(&self.shared.state).members.clone()
    }

    /// Up to `max` messages, waiting up to `timeout` for the first. Returns an empty batch when
    /// nothing arrived in time. Calling `poll` marks what the previous call returned as
    /// processed (it will be committed).
    pub async fn poll(&mut self, max: usize, timeout: Duration) -> Result<Vec<ReceivedMessage>> {
        self.mark_processed();
        let deadline = Instant::now() + timeout;
        while self.buffer.is_empty() {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Err(_) => break,
                Ok(None) => return Err(Error::Closed),
                Ok(Some(d)) => {
                    if self.is_current(&d.queue, d.epoch) {
                        self.buffer.extend(d.msgs.into_iter().map(|m| (d.epoch, m)));
                    }
                }
            }
        }
        let mut out = Vec::new();
        while out.len() < max {
            let Some((epoch, m)) = self.buffer.pop_front() else {
                break;
            };
            let q = QueueId::new(m.broker.clone(), m.queue);
            if !self.is_current(&q, epoch) {
                continue;
            }
            self.delivered.insert(q, (epoch, m.offset + 1));
            out.push(m);
        }
        Ok(out)
    }

    fn is_current(&self, q: &QueueId, epoch: u64) -> bool {
        lock(&self.shared.state)
            .assigned
            .get(q)
            .is_some_and(|s| s.epoch == epoch)
    }

    fn mark_processed(&mut self) {
        let mut state = lock(&self.shared.state);
        for (q, (epoch, next)) in self.delivered.drain() {
            if let Some(s) = state.assigned.get_mut(&q)
                && s.epoch == epoch
            {
                s.consumed = Some(s.consumed.map_or(next, |c| c.max(next)));
            }
        }
    }

    /// Marks everything returned so far as processed and commits it now.
    pub async fn commit(&mut self) -> Result<()> {
        self.mark_processed();
        commit_dirty(&self.shared, None).await
    }

    /// Commits what was processed, leaves the group and stops every task.
    pub async fn close(mut self) -> Result<()> {
        self.mark_processed();
        let _ = self.stop.send(true);
        if let Some(c) = self.coordinator.take() {
            let _ = c.await;
        }
        for s in lock(&self.shared.state).assigned.values() {
            s.puller.abort();
        }
        let committed = commit_dirty(&self.shared, None).await;
        leave_group(&self.shared).await;
        lock(&self.shared.state).assigned.clear();
        committed
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(c) = self.coordinator.take() {
            c.abort();
        }
        for s in lock(&self.shared.state).assigned.values() {
            s.puller.abort();
        }
    }
}

/// Commits every processed offset not yet committed; `only` restricts it to one queue.
async fn commit_dirty(shared: &Shared, only: Option<&QueueId>) -> Result<()> {
    let dirty: Vec<(QueueId, u64)> = lock(&shared.state)
        .assigned
        .iter()
        .filter(|(q, _)| only.is_none_or(|o| o == *q))
        .filter_map(|(q, s)| match s.consumed {
            Some(c) if s.committed != Some(c) => Some((q.clone(), c)),
            _ => None,
        })
        .collect();
    let mut first_err = None;
    for (q, offset) in dirty {
        match commit_offset(shared, &q, offset).await {
            Ok(()) => {
                if let Some(s) = lock(&shared.state).assigned.get_mut(&q) {
                    s.committed = Some(offset);
                }
            }
            Err(e) => {
                tracing::warn!(
                    "commit of {q} at {offset} for group {} failed: {e}",
                    shared.group
                );
                first_err.get_or_insert(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

async fn commit_offset(shared: &Shared, q: &QueueId, offset: u64) -> Result<()> {
    let req = v1::CommitOffsetRequest {
        group: shared.group.clone(),
        topic: shared.topic.clone(),
        queue: q.queue,
        offset,
    };
    let deadline = Instant::now() + shared.config.rpc_timeout;
    shared
        .router
        .call_leader(
            &q.broker,
            "CommitOffset",
            deadline,
            each_attempt(&req, |ch, r| async move {
                BrokerServiceClient::new(ch).commit_offset(r).await
            }),
        )
        .await?;
    Ok(())
}

async fn leave_group(shared: &Shared) {
    let Some(route) = shared.router.cached_route(&shared.topic) else {
        return;
    };
    let deadline = Instant::now() + shared.config.rpc_timeout;
    let calls = route.brokers.iter().map(|b| {
        let req = v1::LeaveGroupRequest {
            group: shared.group.clone(),
            consumer_id: shared.consumer_id.clone(),
        };
        let router = shared.router.clone();
        let broker = b.name.clone();
        async move {
            let r = router
                .call_leader(
                    &broker,
                    "LeaveGroup",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).leave_group(r).await
                    }),
                )
                .await;
            if let Err(e) = r {
                tracing::debug!("leave group on {broker}: {e}");
            }
        }
    });
    futures::future::join_all(calls).await;
}

/// Heartbeats, rebalancing and periodic commits.
struct Coordinator;

impl Coordinator {
    async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
        let mut last_commit = Instant::now();
        loop {
            if let Err(e) = Self::tick(&shared).await {
                tracing::debug!("consumer group {}: {e}", shared.group);
            }
            if last_commit.elapsed() >= shared.config.commit_interval {
                let _ = commit_dirty(&shared, None).await;
                last_commit = Instant::now();
            }
            tokio::select! {
                _ = tokio::time::sleep(shared.config.heartbeat_interval) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// One heartbeat round and, if the member list or route changed, a rebalance.
    async fn tick(shared: &Arc<Shared>) -> Result<()> {
        let route = shared
            .router
            .route(&shared.topic, shared.config.route_refresh)
            .await?;
        let deadline = Instant::now() + shared.config.rpc_timeout;
        let beats = route.brokers.iter().map(|b| {
            let req = v1::HeartbeatRequest {
                group: shared.group.clone(),
                consumer_id: shared.consumer_id.clone(),
                topics: vec![shared.topic.clone()],
            };
            let router = shared.router.clone();
            let broker = b.name.clone();
            async move {
                router
                    .call_leader(
                        &broker,
                        "Heartbeat",
                        deadline,
                        each_attempt(&req, |ch, r| async move {
                            BrokerServiceClient::new(ch).heartbeat(r).await
                        }),
                    )
                    .await
            }
        });
        let mut members: Vec<String> = Vec::new();
        let mut answered = 0;
        let mut last_err = None;
        for r in futures::future::join_all(beats).await {
            match r {
                Ok((resp, _)) => {
                    answered += 1;
                    members.extend(resp.members);
                }
                Err(e) => last_err = Some(e),
            }
        }
        if answered == 0 {
            return Err(last_err.unwrap_or(Error::TopicNotFound {
                topic: shared.topic.clone(),
            }));
        }
        if !members.contains(&shared.consumer_id) {
            members.push(shared.consumer_id.clone());
        }
        members.sort();
        members.dedup();
        let all = route.queues();
        let mine = allocate_averagely(&all, &members, &shared.consumer_id);
        Self::rebalance(shared, members, mine).await;
        Ok(())
    }

    async fn rebalance(shared: &Arc<Shared>, members: Vec<String>, mine: Vec<QueueId>) {
        let revoked: Vec<QueueId> = {
            let mut state = lock(&shared.state);
            if state.members != members {
                tracing::info!(
                    "group {}: members {:?}, this member ({}) reads {:?}",
                    shared.group,
                    members,
                    shared.consumer_id,
                    mine.iter().map(|q| q.to_string()).collect::<Vec<_>>()
                );
            }
            state.members = members;
            state
                .assigned
                .keys()
                .filter(|q| !mine.contains(q))
                .cloned()
                .collect()
        };
        for q in &revoked {
            // Hand the queue over with its processed offset committed.
            if let Some(s) = lock(&shared.state).assigned.get(q) {
                s.puller.abort();
            }
            let _ = commit_dirty(shared, Some(q)).await;
            lock(&shared.state).assigned.remove(q);
        }
        let mut state = lock(&shared.state);
        for q in mine {
            if state.assigned.contains_key(&q) {
                continue;
            }
            state.next_epoch += 1;
            let epoch = state.next_epoch;
            let puller = tokio::spawn(Puller::run(shared.clone(), q.clone(), epoch));
            state.assigned.insert(
                q,
                QueueState {
                    epoch,
                    consumed: None,
                    committed: None,
                    puller,
                },
            );
        }
    }
}

/// Reads one queue for as long as it is assigned.
struct Puller;

impl Puller {
    async fn run(shared: Arc<Shared>, q: QueueId, epoch: u64) {
        let mut offset = Self::start_offset(&shared, &q, epoch).await;
        let mut hint: Option<v1::NodeRef> = None;
        let mut backoff = shared.config.retry.backoff_initial;
        loop {
            let req = v1::PullRequest {
                topic: shared.topic.clone(),
                queue: q.queue,
                offset,
                max_messages: shared.config.pull_batch_max,
                max_wait_ms: shared.config.pull_wait.as_millis() as u32,
                consumer_id: shared.consumer_id.clone(),
            };
            let attempt = shared.config.pull_wait + shared.config.rpc_timeout;
            let resp = match hint.take() {
                Some(node) => match Self::pull_from(&shared, &node.address, req, attempt).await {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::debug!("pull {q} from hinted {}: {e}", node.address);
                        continue; // fall back to the leader
                    }
                },
                None => {
                    let deadline = Instant::now() + attempt * 2;
                    // The pull waits up to pull_wait on the server by design.
                    let first = shared.config.pull_wait + shared.config.retry.attempt_timeout;
                    let r = shared
                        .router
                        .call_leader_timed(&q.broker, "Pull", deadline, first, |ch, t| {
                            pull_on(ch, req.clone(), t)
                        })
                        .await;
                    match r {
                        Ok((r, _)) => r,
                        Err(e) if e.code() == Some(ErrorCode::OffsetOutOfRange) => {
                            if let Some((min, max)) = queue_bounds(&shared, &q).await {
                                offset = offset.clamp(min, max);
                            }
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(shared.config.retry.backoff_max * 5);
                            continue;
                        }
                        Err(e) => {
                            tracing::debug!("pull {q}: {e}");
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(shared.config.retry.backoff_max * 5);
                            continue;
                        }
                    }
                }
            };
            backoff = shared.config.retry.backoff_initial;
            if resp
                .suggested
                .as_ref()
                .is_some_and(|s| !s.address.is_empty())
            {
                hint = resp.suggested.clone();
            }
            let served_by = resp.served_by.clone();
            let mut next = offset;
            let msgs: Vec<ReceivedMessage> = resp
                .messages
                .into_iter()
                .filter(|m| m.offset >= offset)
                .map(|m| {
                    next = next.max(m.offset + 1);
                    ReceivedMessage {
                        topic: shared.topic.clone(),
                        broker: q.broker.clone(),
                        queue: q.queue,
                        offset: m.offset,
                        msg_id: m.msg_id,
                        key: m.key,
                        tag: m.tag,
                        body: m.body,
                        properties: m.properties,
                        store_timestamp_ms: m.store_timestamp_ms,
                        served_by: served_by.clone(),
                    }
                })
                .collect();
            if msgs.is_empty() {
                // Nothing new; a reply may still move us past a gap (e.g. retention).
                if resp.next_offset > offset {
                    offset = resp.next_offset;
                }
                continue;
            }
            offset = next.max(resp.next_offset);
            let delivery = Delivery {
                queue: q.clone(),
                epoch,
                msgs,
            };
            if shared.deliveries.send(delivery).await.is_err() {
                return; // the consumer is gone
            }
        }
    }

    async fn pull_from(
        shared: &Shared,
        address: &str,
        req: v1::PullRequest,
        timeout: Duration,
    ) -> Result<v1::PullResponse> {
        let ch = shared.router.pool.channel(address)?;
        let resp = tokio::time::timeout(timeout, pull_on(ch, req, timeout))
            .await
            .map_err(|_| Error::Timeout {
                op: format!("Pull from {address}"),
                waited: timeout,
                last: "no answer".into(),
            })?
            .map_err(|status| Error::Rpc {
                address: address.to_string(),
                rpc: "Pull",
                status: Box::new(status),
            })?
            .into_inner();
        match &resp.error {
            Some(e) if e.code() != ErrorCode::Ok => Err(Error::Server {
                address: address.to_string(),
                rpc: "Pull",
                code: e.code(),
                message: e.message.clone(),
                leader: e.leader.clone(),
            }),
            _ => Ok(resp),
        }
    }

    /// The group's committed offset, or the start position when there is none (recorded as
    /// processed so it is committed, and a later owner starts at the same place).
    async fn start_offset(shared: &Shared, q: &QueueId, epoch: u64) -> u64 {
        let mut backoff = shared.config.retry.backoff_initial;
        loop {
            match fetch_offset(shared, q).await {
                Ok(Some(o)) => {
                    if let Some(s) = lock(&shared.state).assigned.get_mut(q)
                        && s.epoch == epoch
                    {
                        s.committed = Some(o);
                        s.consumed.get_or_insert(o);
                    }
                    return o;
                }
                Ok(None) => {
                    let o = match shared.config.start_from {
                        StartFrom::Earliest => match queue_bounds(shared, q).await {
                            Some((min, _)) => min,
                            None => 0,
                        },
                        StartFrom::Latest => match queue_bounds(shared, q).await {
                            Some((_, max)) => max,
                            None => {
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(shared.config.retry.backoff_max);
                                continue;
                            }
                        },
                    };
                    if let Some(s) = lock(&shared.state).assigned.get_mut(q)
                        && s.epoch == epoch
                    {
                        s.consumed.get_or_insert(o);
                    }
                    return o;
                }
                Err(e) => {
                    tracing::debug!("fetch offset of {q}: {e}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(shared.config.retry.backoff_max);
                }
            }
        }
    }
}

/// One Pull on `ch`, the server told it has `timeout`; replies up to the message size limit.
async fn pull_on(
    ch: crate::security::Conn,
    req: v1::PullRequest,
    timeout: Duration,
) -> std::result::Result<tonic::Response<v1::PullResponse>, tonic::Status> {
    BrokerServiceClient::new(ch)
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .pull(request(req, timeout))
        .await
}

async fn fetch_offset(shared: &Shared, q: &QueueId) -> Result<Option<u64>> {
    let req = v1::FetchOffsetRequest {
        group: shared.group.clone(),
        topic: shared.topic.clone(),
        queue: q.queue,
    };
    let deadline = Instant::now() + shared.config.rpc_timeout;
    let r = shared
        .router
        .call_leader(
            &q.broker,
            "FetchOffset",
            deadline,
            each_attempt(&req, |ch, r| async move {
                BrokerServiceClient::new(ch).fetch_offset(r).await
            }),
        )
        .await;
    match r {
        Ok((resp, _)) => Ok(resp.found.then_some(resp.offset)),
        Err(e) if e.code() == Some(ErrorCode::GroupNotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The queue's (min, max) offsets: from a zero-wait pull at the minimum, else from node status.
async fn queue_bounds(shared: &Shared, q: &QueueId) -> Option<(u64, u64)> {
    let req = v1::PullRequest {
        topic: shared.topic.clone(),
        queue: q.queue,
        offset: 0,
        max_messages: 1,
        max_wait_ms: 0,
        consumer_id: shared.consumer_id.clone(),
    };
    let deadline = Instant::now() + shared.config.rpc_timeout;
    let r = shared
        .router
        .call_leader(&q.broker, "Pull", deadline, |ch, t| {
            pull_on(ch, req.clone(), t)
        })
        .await;
    if let Ok((resp, _)) = r {
        return Some((resp.min_offset, resp.max_offset));
    }
    // Offset 0 may be below the retained range: ask the leader's status instead.
    let (_, addr) = shared.router.leader(&q.broker)?;
    let ch = shared.router.pool.channel(&addr).ok()?;
    let status = BrokerServiceClient::new(ch)
        .node_status(request(v1::NodeStatusRequest {}, shared.config.rpc_timeout))
        .await
        .map_err(|s| {
            if is_transport_status(&s) {
                tracing::debug!("node status of {addr}: {s}");
            }
        })
        .ok()?
        .into_inner();
    status
        .queues
        .iter()
        .find(|s| s.topic == shared.topic && s.queue == q.queue)
        .map(|s| (s.min_offset, s.max_offset))
}
