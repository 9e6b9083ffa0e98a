//! The public client service (`BrokerService`) and the admin service. Errors travel in each reply's
//! `error` field with a stable code; `to_error` is the one place that maps failures to codes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use raftmq_proto::v1::admin_service_server::AdminService;
use raftmq_proto::v1::broker_service_server::BrokerService;
use raftmq_proto::v1::*;
use raftmq_raft_log::{ProposeError, Role};
use tonic::{Request, Response, Status};

use crate::command::{Command, CommandView, Reply, StoredBody, msg_id};
use crate::config::check_name;
use crate::hint::{self, FollowerView, NodeView, PullPosition};
use crate::metrics;
use crate::node::{Node, SESSION_TIMEOUT};

#[derive(Clone)]
pub struct Broker {
    pub node: Arc<Node>,
}

fn e(code: ErrorCode, msg: impl Into<String>) -> Option<Error> {
    Some(Error::new(code, msg))
}

fn not_leader(leader: Option<(u64, String)>) -> Option<Error> {
    let mut err = Error::new(
        ErrorCode::NotLeader,
        match &leader {
            Some((id, a)) => format!("this node is not the leader; send to node {id} at {a}"),
            None => "this node is not the leader and no leader is known yet (election in progress); retry".into(),
        },
    );
    err.leader = leader.map(|(node_id, address)| NodeRef { node_id, address });
    Some(err)
}

/// Longest a send waits on a node that knows no leader (an election) for one to be elected.
const NO_LEADER_WAIT_MAX: Duration = Duration::from_millis(250);

/// The deadline a gRPC client set (`grpc-timeout`: digits and a unit), if any.
fn grpc_timeout(md: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn propose_error(pe: ProposeError) -> Option<Error> {
    match pe {
        ProposeError::NotLeader { leader } => not_leader(leader),
        ProposeError::Unavailable(m) => e(
            ErrorCode::Unavailable,
            format!("the group cannot commit now: {m}"),
        ),
        ProposeError::Invalid(m) => e(ErrorCode::InvalidArgument, m),
        ProposeError::Fatal(m) => e(ErrorCode::Unavailable, format!("this node stopped: {m}")),
    }
}

fn reply_error(r: &Reply) -> Option<Error> {
    match r {
        Reply::TopicNotFound(t) => e(
            ErrorCode::TopicNotFound,
            format!("topic {t:?} does not exist on this broker group"),
        ),
        Reply::Invalid(m) => e(ErrorCode::InvalidArgument, m.clone()),
        Reply::TopicExists { queues } => e(
            ErrorCode::TopicExists,
            format!("topic exists with {queues} queues; pass update to change the count"),
        ),
        _ => None,
    }
}

impl Broker {
    fn me(&self) -> NodeRef {
        NodeRef {
            node_id: self.node.cfg.node_id,
            address: self.node.address.clone(),
        }
    }

    /// Leader check before doing work; followers answer NOT_LEADER with the leader.
    fn require_leader(&self) -> Option<Error> {
        let st = self.node.member.status();
        if st.role == Role::Leader {
            None
        } else {
            not_leader(st.leader_address())
        }
    }

    /// [`Self::require_leader`], but while this node knows no leader (an election is running) it
    /// waits for one — at most `NO_LEADER_WAIT_MAX` and half the caller's deadline — so the
    /// producer hears of the new leader the moment this node does instead of polling for it.
    async fn await_leader(&self, caller_timeout: Option<Duration>) -> Option<Error> {
        let err = self.require_leader()?;
        if err.leader.is_some() {
            return Some(err);
        }
        let wait = caller_timeout.map_or(NO_LEADER_WAIT_MAX, |t| (t / 2).min(NO_LEADER_WAIT_MAX));
        let mut watch = self.node.member.watch();
        let _ = tokio::time::timeout(
            wait,
            watch.wait_for(|s| s.role == Role::Leader || s.leader.is_some()),
        )
        .await;
        self.require_leader()
    }

    async fn propose(&self, cmd: Command) -> Result<(u64, Reply), Option<Error>> {
        let (index, bytes) = self
            .node
            .member
            .propose(cmd.encode().into())
            .await
            .map_err(propose_error)?;
        let reply = Reply::decode(&bytes).map_err(|err| {
            e(
                ErrorCode::Internal,
                format!("bad state machine reply: {err}"),
            )
        })?;
        Ok((index, reply))
    }

    /// Proposes a command whose reply carries nothing but success or an error.
    async fn propose_for_error(&self, cmd: Command) -> Option<Error> {
        match self.propose(cmd).await {
            Ok((_, r)) => reply_error(&r),
            Err(err) => err,
        }
    }

    fn check_topic(&self, topic: &str, queue: u32) -> Option<Error> {
        if let Err(m) = check_name("topic", topic) {
            return e(ErrorCode::InvalidArgument, m);
        }
        let st = self
            .node
            .member
            .state()
            .read()
            .unwrap_or_else(|p| p.into_inner());
        match st.topics.get(topic) {
            None => e(
                ErrorCode::TopicNotFound,
                format!(
                    "topic {topic:?} does not exist on broker group {}",
                    self.node.cfg.broker
                ),
            ),
            Some(t) if queue as usize >= t.queues.len() => e(
                ErrorCode::InvalidArgument,
                format!(
                    "queue {queue} is out of range: topic {topic} has {} queues",
                    t.queues.len()
                ),
            ),
            Some(_) => None,
        }
    }

    fn check_send(&self, req: &SendRequest) -> Option<Error> {
        let l = &self.node.cfg.limits;
        if req.messages.is_empty() {
            return e(
                ErrorCode::InvalidArgument,
                "a send carries at least one message",
            );
        }
        if req.messages.len() > l.batch_messages_max {
            return e(
                ErrorCode::MessageTooLarge,
                format!(
                    "batch of {} messages exceeds the limit of {}",
                    req.messages.len(),
                    l.batch_messages_max
                ),
            );
        }
        let mut total = 0usize;
        for (i, m) in req.messages.iter().enumerate() {
            if m.body.len() > l.body_bytes_max {
                return e(
                    ErrorCode::MessageTooLarge,
                    format!(
                        "message {i}: body of {} bytes exceeds the limit of {} bytes",
                        m.body.len(),
                        l.body_bytes_max
                    ),
                );
            }
            let props: usize = m.properties.iter().map(|(k, v)| k.len() + v.len()).sum();
            if props > l.properties_bytes_max {
                return e(
                    ErrorCode::MessageTooLarge,
                    format!(
                        "message {i}: properties of {props} bytes exceed the limit of {} bytes",
                        l.properties_bytes_max
                    ),
                );
            }
            total += m.body.len() + props + m.key.len() + m.tag.len();
        }
        if total > l.batch_bytes_max {
            return e(
                ErrorCode::MessageTooLarge,
                format!(
                    "batch of {total} bytes exceeds the limit of {} bytes",
                    l.batch_bytes_max
                ),
            );
        }
        None
    }

    fn status_response(&self) -> NodeStatusResponse {
        let n = &self.node;
        let st = n.member.status();
        let state = n.member.state().read().unwrap_or_else(|p| p.into_inner());
        let queues = state
            .topics
            .iter()
            .flat_map(|(t, ts)| {
                ts.queues.iter().enumerate().map(move |(i, q)| QueueStatus {
                    topic: t.clone(),
                    queue: i as u32,
                    min_offset: q.min_offset,
                    max_offset: q.next_offset,
                })
            })
            .collect();
        let topics = state.topics.len() as u64;
        drop(state);
        NodeStatusResponse {
            cluster: n.cfg.cluster.clone(),
            broker: n.cfg.broker.clone(),
            node_id: n.cfg.node_id,
            address: n.address.clone(),
            role: st.role.as_str().into(),
            term: st.term,
            leader: st
                .leader_address()
                .map(|(node_id, address)| NodeRef { node_id, address }),
            last_log_index: st.last_log_index,
            committed: st.committed,
            applied: st.applied,
            peers: st
                .peers
                .iter()
                .map(|p| PeerStatus {
                    node_id: p.node_id,
                    address: p.address.clone(),
                    voter: p.voter,
                    matched_index: p.matched.unwrap_or(0),
                    lag: p.lag,
                    last_ack_ms: p.last_ack_ms,
                    reachable: p.reachable,
                    bytes_per_sec: p.bytes_per_sec,
                    catch_up: p.catch_up.as_ref().map(catch_up_status),
                })
                .collect(),
            read_hint: Some(raftmq_proto::v1::ReadHintConfig {
                leader_busy_msgs_per_sec: n.cfg.read_hint.leader_busy_msgs_per_sec,
                cold_read_lag: n.cfg.read_hint.cold_read_lag,
                follower_lag_redirect: n.cfg.read_hint.follower_lag_redirect,
                election_timeout_ms: n.election_timeout_ms(),
            }),
            produce_msgs_per_sec: n.produced.per_sec(),
            pull_msgs_per_sec: n.pulled.per_sec(),
            topics,
            millis_since_leader_contact: st.millis_since_leader_contact,
            queues,
            flush_mode: n.cfg.raft.flush_mode.as_str().into(),
            repairing_to: n.member.repairing().map(|(_, floor)| floor),
            catch_up: st.catch_up.as_ref().map(catch_up_status),
            ready: n.member.ready(),
        }
    }

    /// Reads up to `max` messages of a queue from `offset`, out of the log. Returns the messages and
    /// whether a needed entry was missing here (purged, or before a snapshot this node installed).
    fn read_messages(
        &self,
        topic: &str,
        queue: u32,
        offset: u64,
        max: u32,
    ) -> Result<(Vec<StoredMessage>, bool), Option<Error>> {
        let runs: Vec<crate::state::Run> = {
            let st = self
                .node
                .member
                .state()
                .read()
                .unwrap_or_else(|p| p.into_inner());
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
                .map_err(|err| {
                    e(
                        ErrorCode::Internal,
                        format!("reading log entry {}: {err}", r.log_index),
                    )
                })?;
            let Some((_, Some(data))) = entries.into_iter().next() else {
                return Ok((msgs, true));
            };
            // Bodies are served as slices of the entry read from the log: never copied here.
            let Ok(CommandView::Send {
                messages,
                timestamp_ms,
                ..
            }) = CommandView::view(&data)
            else {
                return Err(e(
                    ErrorCode::Internal,
                    format!("log entry {} is not a send", r.log_index),
                ));
            };
            let skip = (o - r.first_offset) as usize;
            for (i, m) in messages.into_iter().enumerate().skip(skip) {
                if msgs.len() as u32 >= max {
                    break;
                }
                msgs.push(StoredMessage {
                    queue,
                    offset: r.first_offset + i as u64,
                    msg_id: msg_id(&self.node.cfg.broker, r.log_index, i as u32),
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
                });
            }
            o = r.first_offset + r.count as u64;
        }
        Ok((msgs, false))
    }

    fn hint(
        &self,
        consumer: &str,
        queue: u32,
        next_offset: u64,
        max_offset: u64,
        needed_index: u64,
    ) -> hint::Hint {
        let n = &self.node;
        let st = n.member.status();
        let view = if st.role == Role::Leader {
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
        };
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

#[tonic::async_trait]
impl BrokerService for Broker {
    async fn send(&self, req: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        let t0 = Instant::now();
        let caller_timeout = grpc_timeout(req.metadata());
        let req = req.into_inner();
        let fail = |error| {
            Ok(Response::new(SendResponse {
                error,
                ..Default::default()
            }))
        };
        // Leadership first: a follower that has not yet applied a new topic must redirect the
        // producer, not tell it the topic does not exist.
        if let Some(err) = self
            .await_leader(caller_timeout)
            .await
            .or_else(|| self.check_topic(&req.topic, req.queue))
            .or_else(|| self.check_send(&req))
        {
            return fail(Some(err));
        }
        if self
            .node
            .disk_full
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return fail(e(
                ErrorCode::DiskFull,
                format!(
                    "the leader's data disk is above {}% full; sends resume once retention frees space",
                    self.node.cfg.retention.full_watermark_pct
                ),
            ));
        }
        // CheckQuorum: a leader cut off from a majority of its group cannot commit anything.
        // Refuse before proposing (so nothing is stored), and the producer turns to the other
        // nodes at once.
        let mut cut_off = self.node.member.cut_off();
        if *cut_off.borrow_and_update() {
            return fail(e(
                ErrorCode::Unavailable,
                "this leader has heard from no majority of its group for an election timeout; it \
                 cannot commit and a new leader is being elected",
            ));
        }
        let Ok(_permit) = self.node.inflight.clone().try_acquire_owned() else {
            return fail(e(
                ErrorCode::Busy,
                "too many sends are waiting for commit on this leader; retry shortly",
            ));
        };
        // The term this node leads as it proposes: the send's fate is no longer this node's to
        // tell once that leadership ends (stepped down, or a new term began).
        let mut leadership = self.node.member.leadership();
        let led_term = {
            let (role, term) = *leadership.borrow_and_update();
            (role == Role::Leader).then_some(term)
        };
        let count = req.messages.len() as u64;
        let cmd = Command::Send {
            topic: req.topic,
            queue: req.queue,
            producer_id: req.producer_id,
            sequence: req.sequence,
            timestamp_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            messages: req
                .messages
                .into_iter()
                .map(|m| StoredBody {
                    key: m.key,
                    tag: m.tag,
                    body: m.body,
                    properties: m.properties.into_iter().collect(),
                })
                .collect(),
        };
        // A leader cut off while the send waits cannot commit it, and one that stopped leading
        // cannot tell whether it will be: answer as soon as either shows (the outcome is then
        // unknown: the producer retries with the same id and sequence elsewhere, and the
        // producer window stores it once) instead of at the caller's timeout.
        let leadership_ended = async {
            match led_term {
                Some(term) => leadership
                    .wait_for(|&(role, t)| role != Role::Leader || t != term)
                    .await
                    .map(|_| ()),
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            r = self.propose(cmd) => r,
            Ok(_) = cut_off.wait_for(|c| *c) => Err(e(
                ErrorCode::Unavailable,
                "this leader lost contact with its group while the send awaited commit; it may \
                 or may not be stored: retry with the same producer id and sequence",
            )),
            Ok(()) = leadership_ended => Err(e(
                ErrorCode::Unavailable,
                "this node stopped leading while the send awaited commit; it may or may not be \
                 stored: retry with the same producer id and sequence",
            )),
        };
        let (_, reply) = match outcome {
            Ok(r) => r,
            Err(err) => return fail(err),
        };
        match reply {
            Reply::Sent {
                queue,
                first_offset,
                count: n,
                log_index,
                duplicate,
            } => {
                if !duplicate {
                    self.node.produced.add(count);
                }
                metrics::observe_send(t0.elapsed(), n as u64);
                let broker = &self.node.cfg.broker;
                Ok(Response::new(SendResponse {
                    error: None,
                    results: (0..n)
                        .map(|i| SendResult {
                            queue,
                            offset: first_offset + i as u64,
                            msg_id: msg_id(broker, log_index, i),
                        })
                        .collect(),
                    duplicate,
                    log_index,
                }))
            }
            other => fail(
                reply_error(&other)
                    .or_else(|| e(ErrorCode::Internal, format!("unexpected reply {other:?}"))),
            ),
        }
    }

    async fn pull(&self, req: Request<PullRequest>) -> Result<Response<PullResponse>, Status> {
        let req = req.into_inner();
        let me = self.me();
        let fail = |error: Option<Error>, suggested: Option<NodeRef>| {
            Ok(Response::new(PullResponse {
                error,
                served_by: Some(me.clone()),
                suggested,
                ..Default::default()
            }))
        };
        if let Some(err) = self.check_topic(&req.topic, req.queue) {
            return fail(Some(err), None);
        }
        let l = &self.node.cfg.limits;
        let max = req.max_messages.clamp(1, l.pull_messages_max);
        let deadline =
            Instant::now() + Duration::from_millis(req.max_wait_ms.min(l.pull_wait_ms_max) as u64);
        let mut watch = self.node.member.watch();
        loop {
            let (min_offset, max_offset) = {
                let st = self
                    .node
                    .member
                    .state()
                    .read()
                    .unwrap_or_else(|p| p.into_inner());
                match st.queue(&req.topic, req.queue) {
                    Some(q) => (q.min_offset, q.next_offset),
                    None => {
                        return fail(
                            e(
                                ErrorCode::TopicNotFound,
                                format!("topic {:?} was deleted", req.topic),
                            ),
                            None,
                        );
                    }
                }
            };
            if req.offset < min_offset || req.offset > max_offset {
                let err = e(
                    ErrorCode::OffsetOutOfRange,
                    format!(
                        "offset {} is outside the queue's range [{min_offset}, {max_offset}]",
                        req.offset
                    ),
                );
                return Ok(Response::new(PullResponse {
                    error: err,
                    min_offset,
                    max_offset,
                    next_offset: req.offset.clamp(min_offset, max_offset),
                    served_by: Some(me),
                    ..Default::default()
                }));
            }
            if req.offset == max_offset && Instant::now() < deadline {
                // Long poll: wait for the next apply, then look again.
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = tokio::time::timeout(left, watch.changed()).await;
                continue;
            }
            let (messages, missing) =
                match self.read_messages(&req.topic, req.queue, req.offset, max) {
                    Ok(r) => r,
                    Err(err) => return fail(err, None),
                };
            let next_offset = messages.last().map(|m| m.offset + 1).unwrap_or(req.offset);
            let needed_index = messages
                .last()
                .map(|m| m.log_index)
                .unwrap_or_else(|| self.node.member.status().applied);
            let mut h = self.hint(
                &req.consumer_id,
                req.queue,
                next_offset,
                max_offset,
                needed_index,
            );
            if missing && messages.is_empty() {
                // This node no longer holds the entry (it installed a snapshot past it): the leader does.
                if let Some((id, addr)) = self.node.member.status().leader_address() {
                    h = hint::Hint {
                        node_id: id,
                        address: addr,
                        reason: "entry not held here",
                    };
                }
            }
            self.node.pulled.add(messages.len() as u64);
            metrics::observe_pull(messages.len() as u64, h.node_id != self.node.cfg.node_id);
            return Ok(Response::new(PullResponse {
                error: None,
                messages,
                next_offset,
                min_offset,
                max_offset,
                served_by: Some(me),
                suggested: Some(NodeRef {
                    node_id: h.node_id,
                    address: h.address,
                }),
                suggest_reason: h.reason.into(),
            }));
        }
    }

    async fn commit_offset(
        &self,
        req: Request<CommitOffsetRequest>,
    ) -> Result<Response<CommitOffsetResponse>, Status> {
        let req = req.into_inner();
        let fail = |error| Ok(Response::new(CommitOffsetResponse { error }));
        if let Err(m) = check_name("group", &req.group) {
            return fail(e(ErrorCode::InvalidArgument, m));
        }
        if let Some(err) = self
            .require_leader()
            .or_else(|| self.check_topic(&req.topic, req.queue))
        {
            return fail(Some(err));
        }
        let cmd = Command::CommitOffset {
            group: req.group,
            topic: req.topic,
            queue: req.queue,
            offset: req.offset,
        };
        fail(self.propose_for_error(cmd).await)
    }

    async fn fetch_offset(
        &self,
        req: Request<FetchOffsetRequest>,
    ) -> Result<Response<FetchOffsetResponse>, Status> {
        let req = req.into_inner();
        if let Some(err) = self.check_topic(&req.topic, req.queue) {
            return Ok(Response::new(FetchOffsetResponse {
                error: Some(err),
                ..Default::default()
            }));
        }
        let st = self
            .node
            .member
            .state()
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let v = st.offsets.get(&(req.group, req.topic, req.queue)).copied();
        Ok(Response::new(FetchOffsetResponse {
            error: None,
            found: v.is_some(),
            offset: v.unwrap_or(0),
        }))
    }

    async fn create_topic(
        &self,
        req: Request<CreateTopicRequest>,
    ) -> Result<Response<CreateTopicResponse>, Status> {
        let req = req.into_inner();
        let fail = |error| Ok(Response::new(CreateTopicResponse { error, topic: None }));
        if let Err(m) = check_name("topic", &req.name) {
            return fail(e(ErrorCode::InvalidArgument, m));
        }
        let maxq = self.node.cfg.limits.queues_per_topic_max;
        if req.queues == 0 || req.queues > maxq {
            return fail(e(
                ErrorCode::InvalidArgument,
                format!("queues must be 1 to {maxq}, got {}", req.queues),
            ));
        }
        if let Some(err) = self.require_leader() {
            return fail(Some(err));
        }
        match self
            .propose(Command::CreateTopic {
                name: req.name.clone(),
                queues: req.queues,
                update: req.update,
            })
            .await
        {
            Ok((_, Reply::Ok)) => Ok(Response::new(CreateTopicResponse {
                error: None,
                topic: Some(TopicConfig {
                    name: req.name,
                    queues: req.queues,
                }),
            })),
            Ok((_, r)) => fail(reply_error(&r)),
            Err(err) => fail(err),
        }
    }

    async fn delete_topic(
        &self,
        req: Request<DeleteTopicRequest>,
    ) -> Result<Response<DeleteTopicResponse>, Status> {
        let req = req.into_inner();
        let fail = |error| Ok(Response::new(DeleteTopicResponse { error }));
        if let Err(m) = check_name("topic", &req.name) {
            return fail(e(ErrorCode::InvalidArgument, m));
        }
        if let Some(err) = self.require_leader() {
            return fail(Some(err));
        }
        fail(
            self.propose_for_error(Command::DeleteTopic { name: req.name })
                .await,
        )
    }

    async fn list_topics(
        &self,
        _req: Request<ListTopicsRequest>,
    ) -> Result<Response<ListTopicsResponse>, Status> {
        let st = self
            .node
            .member
            .state()
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let topics = st
            .topic_list()
            .into_iter()
            .map(|(name, queues)| TopicConfig { name, queues })
            .collect();
        Ok(Response::new(ListTopicsResponse {
            error: None,
            topics,
        }))
    }

    async fn node_status(
        &self,
        _req: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatusResponse>, Status> {
        Ok(Response::new(self.status_response()))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let req = req.into_inner();
        let fail = |error| {
            Ok(Response::new(HeartbeatResponse {
                error,
                ..Default::default()
            }))
        };
        if let Err(m) = check_name("group", &req.group) {
            return fail(e(ErrorCode::InvalidArgument, m));
        }
        if req.consumer_id.is_empty() || req.consumer_id.len() > 255 {
            return fail(e(
                ErrorCode::InvalidArgument,
                "consumer_id must be 1 to 255 bytes",
            ));
        }
        if let Some(err) = self.require_leader() {
            return fail(Some(err));
        }
        let members = self
            .node
            .heartbeat(&req.group, &req.consumer_id, Instant::now());
        Ok(Response::new(HeartbeatResponse {
            error: None,
            members,
            session_timeout_ms: SESSION_TIMEOUT.as_millis() as u64,
        }))
    }

    async fn leave_group(
        &self,
        req: Request<LeaveGroupRequest>,
    ) -> Result<Response<LeaveGroupResponse>, Status> {
        let req = req.into_inner();
        if let Some(err) = self.require_leader() {
            return Ok(Response::new(LeaveGroupResponse { error: Some(err) }));
        }
        self.node.leave(&req.group, &req.consumer_id);
        Ok(Response::new(LeaveGroupResponse { error: None }))
    }
}

#[tonic::async_trait]
impl AdminService for Broker {
    async fn transfer_leader(
        &self,
        req: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        let to = req.into_inner().to_node_id;
        let error = self
            .node
            .member
            .transfer_leader(to)
            .await
            .err()
            .and_then(propose_error);
        Ok(Response::new(TransferLeaderResponse { error }))
    }

    async fn add_learner(
        &self,
        req: Request<AddLearnerRequest>,
    ) -> Result<Response<AddLearnerResponse>, Status> {
        let req = req.into_inner();
        if req.node_id == 0 || req.address.is_empty() {
            return Ok(Response::new(AddLearnerResponse {
                error: e(
                    ErrorCode::InvalidArgument,
                    "node_id and address are required",
                ),
            }));
        }
        let error = self
            .node
            .member
            .add_learner(req.node_id, req.address)
            .await
            .err()
            .and_then(propose_error);
        Ok(Response::new(AddLearnerResponse { error }))
    }

    async fn change_voters(
        &self,
        req: Request<ChangeVotersRequest>,
    ) -> Result<Response<ChangeVotersResponse>, Status> {
        let voters = req.into_inner().voters.into_iter().collect();
        let error = self
            .node
            .member
            .change_voters(voters)
            .await
            .err()
            .and_then(propose_error);
        Ok(Response::new(ChangeVotersResponse { error }))
    }
}

fn catch_up_status(c: &raftmq_raft_log::CatchUp) -> raftmq_proto::v1::CatchUpStatus {
    raftmq_proto::v1::CatchUpStatus {
        from_index: c.from,
        at_index: c.at,
        target_index: c.target,
        progress_pct: c.progress_pct(),
        bytes_per_sec: c.bytes_per_sec,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(grpc_timeout(&md), None);
        for (v, d) in [
            ("500m", Duration::from_millis(500)),
            ("3S", Duration::from_secs(3)),
            ("2M", Duration::from_secs(120)),
            ("750000u", Duration::from_millis(750)),
        ] {
            md.insert("grpc-timeout", v.parse().expect("ascii"));
            assert_eq!(grpc_timeout(&md), Some(d), "{v}");
        }
        md.insert("grpc-timeout", "x".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), None);
    }
}
