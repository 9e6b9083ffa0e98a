//! Where a v1 call goes, written once for every RPC the front forwards.
//!
//! A call for this node's broker group starts in-process on the node's own `BrokerService` (no
//! socket); a call for another group starts at one of that group's nodes. A `NOT_LEADER` reply
//! naming the leader is followed at once (over a cached channel, or back in-process when the
//! leader is this node). While the group has no leader (`NOT_LEADER` without an address,
//! `UNAVAILABLE`) or a node does not answer, the call is retried for up to [`RETRY_WINDOW`], so
//! an official client never sees a `NOT_LEADER` during an election.
//!
//! Sends are retried safely: the front sends them as an idempotent producer (see
//! `service::Front::send_message`), so a retry of a batch whose outcome was unknown is stored once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftmq_proto::eager_end::EagerEnd;
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::broker_service_server::BrokerService;
use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
use raftmq_proto::v1::{self, ErrorCode};
use raftmq_security::sign::Signer;
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// A channel to another node or a nameserver whose every request this node signs (with auth on),
/// each unary request ending with its message's frame ([`EagerEnd`]).
pub type Conn = InterceptedService<EagerEnd<Channel>, Signer>;
use tonic::{Request, Response, Status};

use crate::codes::Error;

/// How long a call keeps retrying while its group elects a leader or a node does not answer.
pub const RETRY_WINDOW: Duration = Duration::from_secs(3);
/// The pause between two retries.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// A node that has not accepted a connection in this long is treated as down.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// Every connection to another node is pinged this often, idle or not, and dropped when a ping
/// goes unanswered this long; the next call dials afresh and resolves the name again. Without
/// pings while idle, a connection to a node that vanished without a close (its task moved, a
/// partition) stayed cached, and every call through it waited out its timeout.
pub const NODE_PING_EVERY: Duration = Duration::from_secs(1);
pub const NODE_PING_TIMEOUT: Duration = Duration::from_secs(2);
const _: () = assert!(NODE_PING_EVERY.as_millis() >= 500 && NODE_PING_EVERY.as_secs() <= 5);
const _: () = assert!(NODE_PING_TIMEOUT.as_millis() >= NODE_PING_EVERY.as_millis());
/// Leader hints followed in a row before pausing (two nodes naming each other during a change).
const HOPS_MAX: u32 = 4;
/// Largest gRPC message to or from another node (a pop or pull of large messages).
const MESSAGE_BYTES_MAX: usize = raftmq_proto::limits::GRPC_MESSAGE_BYTES_MAX;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
type RpcResult<T> = Result<Response<T>, Status>;

/// A v1 request the front can send in-process or to another node.
pub trait V1Rpc: Clone + Send + Sync + 'static {
    /// The reply type.
    type Reply: Send + 'static;
    /// Calls this node's own service.
    fn local<B: BrokerService>(b: &B, req: Request<Self>) -> BoxFuture<'_, RpcResult<Self::Reply>>;
    /// Calls another node.
    fn remote(
        c: BrokerServiceClient<Conn>,
        req: Request<Self>,
    ) -> BoxFuture<'static, RpcResult<Self::Reply>>;
    /// The reply's error, if any.
    fn error(reply: &Self::Reply) -> Option<&v1::Error>;
}

macro_rules! v1_rpcs {
    ($($req:ident => $reply:ident, $method:ident;)*) => {$(
        impl V1Rpc for v1::$req {
            type Reply = v1::$reply;
            fn local<B: BrokerService>(
                b: &B,
                req: Request<Self>,
            ) -> BoxFuture<'_, RpcResult<Self::Reply>> {
                b.$method(req)
            }
            fn remote(
                mut c: BrokerServiceClient<Conn>,
                req: Request<Self>,
            ) -> BoxFuture<'static, RpcResult<Self::Reply>> {
                Box::pin(async move { c.$method(req).await })
            }
            fn error(reply: &Self::Reply) -> Option<&v1::Error> {
                reply.error.as_ref()
            }
        }
    )*};
}

v1_rpcs! {
    SendRequest => SendResponse, send;
    PullRequest => PullResponse, pull;
    CommitOffsetRequest => CommitOffsetResponse, commit_offset;
    FetchOffsetRequest => FetchOffsetResponse, fetch_offset;
    CreateTopicRequest => CreateTopicResponse, create_topic;
    ListTopicsRequest => ListTopicsResponse, list_topics;
    HeartbeatRequest => HeartbeatResponse, heartbeat;
    LeaveGroupRequest => LeaveGroupResponse, leave_group;
    ListGroupsRequest => ListGroupsResponse, list_groups;
    PopRequest => PopResponse, pop;
    PopAckRequest => PopAckResponse, pop_ack;
    ChangeInvisibleRequest => ChangeInvisibleResponse, change_invisible;
    DeadLetterRequest => DeadLetterResponse, dead_letter;
    RecallRequest => RecallResponse, recall;
    EndTransactionRequest => EndTransactionResponse, end_transaction;
    TakeTransactionChecksRequest => TakeTransactionChecksResponse, take_transaction_checks;
}

/// A request to this node's own service, made by the front for a caller it has authorized.
pub fn internal<T>(msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.extensions_mut().insert(raftmq_security::Caller::Internal);
    r
}

/// A peer its leader has not heard from for this long is left out of routes.
pub const PEER_SILENT_MS: u64 = 2_000;

/// Where a call starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// This node's own broker group: in-process first.
    Local,
    /// Another broker group: its nodes' addresses (leader first when known); never empty.
    Nodes(Vec<String>),
}

/// One lazily connected channel per address, shared by every call: over TLS with this node's
/// certificate when `tls` is set, each request signed with `signer`'s credentials.
#[derive(Clone, Default)]
pub struct Pool {
    channels: Arc<Mutex<HashMap<String, Conn>>>,
    tls: Option<Arc<raftmq_security::tls::Tls>>,
    signer: Signer,
}

impl Pool {
    /// A pool dialling with `tls` (None: plaintext) and signing with `signer`.
    pub fn new(tls: Option<Arc<raftmq_security::tls::Tls>>, signer: Signer) -> Self {
        Pool {
            channels: Arc::default(),
            tls,
            signer,
        }
    }

    /// The channel to `address` (`host:port`), created on first use.
    pub fn channel(&self, address: &str) -> Result<Conn, Error> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(address) {
            return Ok(c.clone());
        }
        let uri = raftmq_security::tls::uri(address, self.tls.is_some());
        let bad = |e: &dyn std::fmt::Display| Error::Rpc {
            address: address.to_string(),
            status: Status::invalid_argument(format!("invalid address: {e}")),
        };
        let mut endpoint = Endpoint::from_shared(uri).map_err(|e| bad(&e))?;
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.client_config())
                .map_err(|e| bad(&e))?;
        }
        let endpoint = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(NODE_PING_EVERY)
            .keep_alive_timeout(NODE_PING_TIMEOUT)
            .keep_alive_while_idle(true);
        let channel =
            InterceptedService::new(EagerEnd(endpoint.connect_lazy()), self.signer.clone());
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    /// A broker client for `address`.
    pub fn broker(&self, address: &str) -> Result<BrokerServiceClient<Conn>, Error> {
        Ok(BrokerServiceClient::new(self.channel(address)?)
            .max_decoding_message_size(MESSAGE_BYTES_MAX)
            .max_encoding_message_size(MESSAGE_BYTES_MAX))
    }

    /// A nameserver client for `address`.
    pub fn nameserver(&self, address: &str) -> Result<NameserverServiceClient<Conn>, Error> {
        Ok(NameserverServiceClient::new(self.channel(address)?)
            .max_decoding_message_size(MESSAGE_BYTES_MAX))
    }
}

/// Sends v1 calls in-process, to the leader, or to another group.
pub struct Forwarder<B> {
    local: Arc<B>,
    /// This node's address, to recognise a leader hint naming this node.
    advertise: String,
    pool: Pool,
}

/// Where one attempt goes: `None` = in-process.
type At = Option<String>;

impl<B: BrokerService> Forwarder<B> {
    /// The addresses of this group's nodes its leader has not heard from lately (SIGKILLed,
    /// cut off): asked of this node, or of the leader when this node follows. Empty when no
    /// leader is known or it does not answer within `timeout`.
    pub async fn unreachable_peers(&self, timeout: Duration) -> Vec<String> {
        let Ok(me) = self
            .local
            .node_status(internal(v1::NodeStatusRequest {}))
            .await
        else {
            return Vec::new();
        };
        let me = me.into_inner();
        let leader = if me.role == "leader" {
            me
        } else {
            let Some(addr) = me.leader.map(|l| l.address) else {
                return Vec::new();
            };
            let Ok(ch) = self.pool.channel(&addr) else {
                return Vec::new();
            };
            let mut client = v1::broker_service_client::BrokerServiceClient::new(ch);
            let call = client.node_status(v1::NodeStatusRequest {});
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(r)) => r.into_inner(),
                _ => return Vec::new(),
            }
        };
        leader
            .peers
            .iter()
            .filter(|p| !p.reachable || p.last_ack_ms.is_none_or(|ms| ms > PEER_SILENT_MS))
            .map(|p| p.address.clone())
            .collect()
    }

    /// A forwarder over this node's service.
    pub fn new(local: Arc<B>, advertise: String, pool: Pool) -> Self {
        Forwarder {
            local,
            advertise,
            pool,
        }
    }

    /// Sends `req` to `target`, following leader hints and retrying through an election.
    ///
    /// Returns the reply even when it carries an error (a caller may need its other fields); a
    /// `NOT_LEADER` or `UNAVAILABLE` reply is returned only once [`RETRY_WINDOW`] is spent.
    /// `timeout` is each remote attempt's deadline (told to the node as `grpc-timeout`).
    pub async fn call<R: V1Rpc>(
        &self,
        target: &Target,
        req: R,
        timeout: Duration,
    ) -> Result<R::Reply, Error> {
        let start = Instant::now();
        let nodes: &[String] = match target {
            Target::Local => &[],
            Target::Nodes(n) => n,
        };
        let mut at: At = nodes.first().cloned();
        let mut next_node = 1;
        let mut hops = 0;
        loop {
            let outcome = self.attempt(&at, req.clone(), timeout).await;
            let spent = start.elapsed() >= RETRY_WINDOW;
            match outcome {
                Ok(reply) => {
                    let Some(err) = R::error(&reply) else {
                        return Ok(reply);
                    };
                    match err.code() {
                        ErrorCode::NotLeader => {
                            let hint = err
                                .leader
                                .as_ref()
                                .map(|l| l.address.clone())
                                .filter(|a| !a.is_empty());
                            if let Some(leader) = hint {
                                let dest = (leader != self.advertise).then_some(leader);
                                if dest != at && hops < HOPS_MAX {
                                    hops += 1;
                                    at = dest;
                                    continue;
                                }
                            }
                            if spent {
                                return Ok(reply);
                            }
                        }
                        ErrorCode::Unavailable if !spent => {}
                        _ => return Ok(reply),
                    }
                }
                Err(e) => {
                    let transient = matches!(
                        &e,
                        Error::Rpc { status, .. } if matches!(
                            status.code(),
                            tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
                        )
                    );
                    if spent || !transient {
                        return Err(e);
                    }
                    // Start over from the group's next node (or in-process): a fresh leader
                    // hint leads on from there.
                    at = if nodes.is_empty() {
                        None
                    } else {
                        next_node += 1;
                        Some(nodes[(next_node - 1) % nodes.len()].clone())
                    };
                }
            }
            hops = 0;
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// [`Forwarder::call`], with a reply error as [`Error::Broker`].
    pub async fn call_ok<R: V1Rpc>(
        &self,
        target: &Target,
        req: R,
        timeout: Duration,
    ) -> Result<R::Reply, Error> {
        let reply = self.call(target, req, timeout).await?;
        match R::error(&reply) {
            Some(e) if e.code != ErrorCode::Ok as i32 => Err(Error::Broker(e.clone())),
            _ => Ok(reply),
        }
    }

    async fn attempt<R: V1Rpc>(
        &self,
        at: &At,
        req: R,
        timeout: Duration,
    ) -> Result<R::Reply, Error> {
        match at {
            None => R::local(&*self.local, internal(req))
                .await
                .map(Response::into_inner)
                .map_err(Error::Local),
            Some(address) => {
                let client = self.pool.broker(address)?;
                let mut request = Request::new(req);
                request.set_timeout(timeout);
                R::remote(client, request)
                    .await
                    .map(Response::into_inner)
                    .map_err(|status| Error::Rpc {
                        address: address.clone(),
                        status,
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use raftmq_proto::v1::{
        ChangeInvisibleRequest, ChangeInvisibleResponse, CommitOffsetRequest, CommitOffsetResponse,
        CreateGroupRequest, CreateGroupResponse, CreateTopicRequest, CreateTopicResponse,
        DeadLetterRequest, DeadLetterResponse, DeleteGroupRequest, DeleteGroupResponse,
        DeleteTopicRequest, DeleteTopicResponse, EndTransactionRequest, EndTransactionResponse,
        FetchOffsetRequest, FetchOffsetResponse, HeartbeatRequest, HeartbeatResponse,
        LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
        ListTopicsRequest, ListTopicsResponse, ListTransactionsRequest, ListTransactionsResponse,
        NodeRef, NodeStatusRequest, NodeStatusResponse, PopAckRequest, PopAckResponse, PopRequest,
        PopResponse, PullRequest, PullResponse, RecallRequest, RecallResponse, ResetOffsetRequest,
        ResetOffsetResponse, SendManyRequest, SendManyResponse, SendRequest, SendResponse,
        SendResult, TakeTransactionChecksRequest, TakeTransactionChecksResponse,
    };

    use super::*;

    /// A broker that is not the leader for its first `not_leader` sends, naming the leader only
    /// when `leader` is set, and stores every later send.
    struct Fake {
        not_leader: u32,
        leader: Option<String>,
        calls: AtomicU32,
    }

    impl Fake {
        fn send_reply(&self, req: SendRequest) -> SendResponse {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if n < self.not_leader {
                let mut e = v1::Error::new(ErrorCode::NotLeader, "not the leader");
                e.leader = self.leader.clone().map(|address| NodeRef {
                    node_id: 1,
                    address,
                });
                return SendResponse {
                    error: Some(e),
                    ..Default::default()
                };
            }
            SendResponse {
                results: vec![SendResult {
                    queue: req.queue,
                    offset: 7,
                    msg_id: "m".into(),
                    deliver_at_ms: 0,
                }],
                ..Default::default()
            }
        }
    }

    /// The fake's service: `send` answers from `send_reply`, every other RPC is unimplemented.
    macro_rules! fake_service {
        ($($method:ident($req:ident) -> $reply:ident;)*) => {
            #[tonic::async_trait]
            impl BrokerService for Fake {
                async fn send(
                    &self,
                    req: Request<SendRequest>,
                ) -> Result<Response<SendResponse>, Status> {
                    Ok(Response::new(self.send_reply(req.into_inner())))
                }
                $(
                    async fn $method(
                        &self,
                        _: Request<$req>,
                    ) -> Result<Response<$reply>, Status> {
                        Err(Status::unimplemented(stringify!($method)))
                    }
                )*
            }
        };
    }

    fake_service! {
        heartbeat(HeartbeatRequest) -> HeartbeatResponse;
        leave_group(LeaveGroupRequest) -> LeaveGroupResponse;
        pull(PullRequest) -> PullResponse;
        commit_offset(CommitOffsetRequest) -> CommitOffsetResponse;
        fetch_offset(FetchOffsetRequest) -> FetchOffsetResponse;
        create_topic(CreateTopicRequest) -> CreateTopicResponse;
        delete_topic(DeleteTopicRequest) -> DeleteTopicResponse;
        list_topics(ListTopicsRequest) -> ListTopicsResponse;
        node_status(NodeStatusRequest) -> NodeStatusResponse;
        create_group(CreateGroupRequest) -> CreateGroupResponse;
        delete_group(DeleteGroupRequest) -> DeleteGroupResponse;
        list_groups(ListGroupsRequest) -> ListGroupsResponse;
        pop(PopRequest) -> PopResponse;
        pop_ack(PopAckRequest) -> PopAckResponse;
        change_invisible(ChangeInvisibleRequest) -> ChangeInvisibleResponse;
        dead_letter(DeadLetterRequest) -> DeadLetterResponse;
        reset_offset(ResetOffsetRequest) -> ResetOffsetResponse;
        recall(RecallRequest) -> RecallResponse;
        end_transaction(EndTransactionRequest) -> EndTransactionResponse;
        list_transactions(ListTransactionsRequest) -> ListTransactionsResponse;
        take_transaction_checks(TakeTransactionChecksRequest) -> TakeTransactionChecksResponse;
        send_many(SendManyRequest) -> SendManyResponse;
    }

    fn forwarder(not_leader: u32, leader: Option<&str>) -> Forwarder<Fake> {
        let fake = Fake {
            not_leader,
            leader: leader.map(str::to_string),
            calls: AtomicU32::new(0),
        };
        Forwarder::new(Arc::new(fake), "127.0.0.1:1".into(), Pool::default())
    }

    fn send() -> SendRequest {
        SendRequest {
            topic: "T".into(),
            queue: 2,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn t30_election_without_a_leader_is_retried_until_one_answers() {
        let f = forwarder(5, None);
        let reply = f
            .call_ok(&Target::Local, send(), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(reply.results[0].offset, 7);
        assert_eq!(f.local.calls.load(Ordering::SeqCst), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn t31_a_hint_naming_this_node_stays_in_process_and_gives_up_after_the_window() {
        // The hint names this node itself: no socket, just retries, then the window ends.
        let f = forwarder(u32::MAX, Some("127.0.0.1:1"));
        let err = f
            .call_ok(&Target::Local, send(), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), crate::pb::Code::ProxyTimeout);
        let calls = f.local.calls.load(Ordering::SeqCst);
        assert!((20..=40).contains(&calls), "{calls} attempts in 3 s");
    }

    #[tokio::test]
    async fn t32_a_hint_to_another_node_is_followed_over_the_network() {
        // The leader named is a closed port: the call leaves the process and fails in transport.
        let f = forwarder(u32::MAX, Some("127.0.0.1:9"));
        let err = f
            .call_ok(&Target::Local, send(), Duration::from_millis(200))
            .await
            .unwrap_err();
        match err {
            Error::Rpc { address, .. } => assert_eq!(address, "127.0.0.1:9"),
            other => panic!("expected a transport error, got {other}"),
        }
    }

    /// 33. A pooled connection to a node that goes silent without a close is dropped while
    ///     idle: the pool's side closes within the pings' bound.
    #[tokio::test]
    async fn t33_an_idle_connection_to_a_silent_node_is_dropped() {
        let peer = raftmq_proto::testing::SilentPeer::start().await;
        let pool = Pool::new(None, Signer::default());
        // One call opens the connection.
        let status = pool
            .broker(&peer.addr.to_string())
            .unwrap()
            .node_status(NodeStatusRequest::default())
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        let bound = NODE_PING_EVERY + NODE_PING_TIMEOUT + Duration::from_secs(3);
        let secs = peer.silence_until_closed(bound).await;
        println!("connection dropped {secs:.1} s after the node went silent");
    }
}
