//! The peer network, client side: one lazily connected gRPC channel per peer, reused by every RPC
//! to it and reconnected by tonic after a failure. Every RPC is bounded by the deadline openraft
//! passes in its `RPCOption` (openraft itself does not time RPCs out). A member never dials itself.
//!
//! openraft's requests and replies travel as postcard bytes inside `RaftRequest`/`RaftReply`.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{BoxStream, Stream, StreamExt};
use openraft::OptionalSend;
use openraft::raft::StreamAppendResult;

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use raftmq_proto::v1::raft_peer_service_client::RaftPeerServiceClient;
use raftmq_proto::v1::{PeerHeader, RaftReply, RaftRequest, SnapshotChunk};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use crate::append_wire::{self, OutgoingAppend};
use crate::peers::Links;
use crate::state_machine::Snapshot;
use crate::types::{NodeId, TypeConfig, Vote};

const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// The largest peer request or reply either side of a peer connection takes.
pub(crate) const PEER_MESSAGE_BYTES_MAX: usize = 256 << 20;

/// How often a connection to a peer is pinged, idle or not, and how long a ping may go unanswered
/// before the connection is dropped (the next call dials afresh, resolving the peer's name again).
/// A follower's connection to a peer sits idle until it leads. When the peer's task moved (an
/// orchestrator gives a restarted task a new address) and the old connection never saw a close,
/// a new leader's appends went into that connection and timed out until a keep-alive noticed: a
/// roll on Swarm once saw a restarted follower get nothing for ~2 s after a hand-over. Pinging idle
/// connections drops such a one within `PEER_PING_EVERY + PEER_PING_TIMEOUT`.
pub const PEER_PING_EVERY: Duration = Duration::from_secs(1);
pub const PEER_PING_TIMEOUT: Duration = Duration::from_secs(2);

const _: () = assert!(PEER_PING_EVERY.as_millis() >= 500 && PEER_PING_EVERY.as_secs() <= 5);
const _: () = assert!(PEER_PING_TIMEOUT.as_millis() >= PEER_PING_EVERY.as_millis());

/// The slowest a follower may take in an append and still count as answering: an append of N bytes
/// gets openraft's deadline plus N bytes at this rate, counted from when the follower could start
/// on it (its send, or the answer to the one before it on the stream, whichever is later). A
/// 4 MiB append to a follower catching up from disk then gets ~0.5 s, not the 50 ms of a heartbeat
/// (which made a far-behind follower redo the same appends forever).
pub const APPEND_FLOOR_BYTES_PER_SEC: u64 = 8 << 20;

/// The deadline of an append of `bytes` bytes, given openraft's deadline `ttl`.
pub fn append_deadline(ttl: Duration, bytes: usize) -> Duration {
    ttl + Duration::from_micros(bytes as u64 * 1_000_000 / APPEND_FLOOR_BYTES_PER_SEC)
}

/// Who we are, stamped on every request so a peer can refuse requests from another group.
#[derive(Clone, Debug)]
pub struct Identity {
    pub cluster: String,
    pub broker: String,
    pub node_id: NodeId,
    pub secret: Option<String>,
}

impl Identity {
    fn header(&self) -> PeerHeader {
        PeerHeader {
            cluster: self.cluster.clone(),
            broker: self.broker.clone(),
            from_node_id: self.node_id,
            secret: self.secret.clone().unwrap_or_default(),
        }
    }
}

#[derive(Clone)]
pub struct NetworkFactory {
    me: Identity,
    /// Peer id → the address to dial instead of the membership's.
    routes: Arc<std::collections::BTreeMap<NodeId, String>>,
    channels: Arc<Mutex<HashMap<(NodeId, String), Channel>>>,
    pipeline: bool,
    /// How long a commit notice may wait for an append to ride on (zero: not held); see
    /// [`crate::commit_notice`].
    commit_notice_hold: Duration,
    links: Arc<Mutex<Links>>,
    /// TLS toward peers (this node's certificate as the client's).
    tls: Option<Arc<raftmq_security::tls::Tls>>,
}

impl NetworkFactory {
    pub fn new(
        me: Identity,
        routes: std::collections::BTreeMap<NodeId, String>,
        pipeline: bool,
        commit_notice_hold: Duration,
        tls: Option<Arc<raftmq_security::tls::Tls>>,
    ) -> NetworkFactory {
        NetworkFactory {
            me,
            routes: Arc::new(routes),
            channels: Arc::new(Mutex::new(HashMap::new())),
            pipeline,
            commit_notice_hold,
            links: Arc::default(),
            tls,
        }
    }

    /// The links to every peer this member has dialled (reachability, backoff, bytes answered).
    pub fn links(&self) -> Arc<Mutex<Links>> {
        self.links.clone()
    }

    fn channel(&self, target: NodeId, addr: &str) -> Result<Channel, String> {
        let mut g = self
            .channels
            .lock()
            .map_err(|_| "channel map poisoned".to_string())?;
        if let Some(c) = g.get(&(target, addr.to_string())) {
            return Ok(c.clone());
        }
        let uri = raftmq_security::tls::uri(addr, self.tls.is_some());
        let mut ep =
            Endpoint::from_shared(uri).map_err(|e| format!("bad peer address {addr:?}: {e}"))?;
        if let Some(tls) = &self.tls {
            // The material in force now: a reloaded certificate serves the next connection.
            ep = ep
                .tls_config(tls.client_config())
                .map_err(|e| format!("TLS toward peer {addr:?}: {e}"))?;
        }
        let ep = ep
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(PEER_PING_EVERY)
            .keep_alive_timeout(PEER_PING_TIMEOUT)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(16 << 20);
        let c = ep.connect_lazy();
        g.insert((target, addr.to_string()), c.clone());
        Ok(c)
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &openraft::BasicNode) -> PeerClient {
        let channel = if target == self.me.node_id {
            Err(format!(
                "node {target} is this node; a member never dials itself"
            ))
        } else {
            let addr = self.routes.get(&target).unwrap_or(&node.addr).clone();
            self.channel(target, &addr)
        };
        PeerClient {
            me: self.me.clone(),
            target,
            channel,
            pipeline: self.pipeline,
            commit_notice_hold: self.commit_notice_hold,
            links: self.links.clone(),
        }
    }
}

pub struct PeerClient {
    me: Identity,
    target: NodeId,
    channel: Result<Channel, String>,
    pipeline: bool,
    commit_notice_hold: Duration,
    links: Arc<Mutex<Links>>,
}

impl PeerClient {
    /// Waits out the peer's backoff: an attempt to a peer that keeps failing is spaced out instead
    /// of retried at once (openraft's replication loop retries without pause).
    async fn backoff(&self) {
        let wait = self
            .links
            .lock()
            .map(|mut l| l.wait_before_attempt(self.target, Instant::now()))
            .unwrap_or_default();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    fn succeeded(&self, acked_bytes: u64) {
        note_success(&self.links, self.target, acked_bytes);
    }

    fn failed<E: std::fmt::Display>(&self, e: &E) {
        note_failure(&self.links, self.target, e);
    }
}

fn note_success(links: &Mutex<Links>, target: NodeId, acked_bytes: u64) {
    let event = links.lock().ok().and_then(|mut l| {
        l.add_acked_bytes(target, acked_bytes);
        l.on_success(target, Instant::now())
    });
    if let Some(e) = event {
        e.log();
    }
}

fn note_failure<E: std::fmt::Display>(links: &Mutex<Links>, target: NodeId, e: &E) {
    let event = links
        .lock()
        .ok()
        .and_then(|mut l| l.on_failure(target, &e.to_string(), Instant::now()));
    if let Some(e) = event {
        e.log();
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Msg(String);

fn unreachable<E>(m: impl Into<String>) -> E
where
    E: From<Unreachable<TypeConfig>>,
{
    Unreachable::<TypeConfig>::new(&Msg(m.into())).into()
}

fn network<E>(m: impl Into<String>) -> E
where
    E: From<NetworkError<TypeConfig>>,
{
    NetworkError::<TypeConfig>::new(&Msg(m.into())).into()
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    encode_sized(v, 0)
}

fn encode_sized<T: Serialize>(v: &T, capacity: usize) -> Result<Vec<u8>, String> {
    crate::encoding::postcard_extend(v, Vec::with_capacity(capacity))
        .map_err(|e| format!("encode: {e}"))
}

/// Encodes an append request into a buffer sized for its entries up front (a growing buffer
/// would copy every entry again at each doubling).
fn encode_append(req: &AppendEntriesRequest<TypeConfig>) -> Result<Vec<u8>, String> {
    let size = 128
        + req
            .entries
            .iter()
            .map(|e| crate::log_store::payload_len_hint(&e.payload) + 32)
            .sum::<usize>();
    encode_sized(req, size)
}

pub(crate) fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, String> {
    postcard::from_bytes(b).map_err(|e| format!("decode: {e}"))
}

enum Kind {
    Append,
    Vote,
    PreVote,
    Transfer,
}

impl PeerClient {
    /// The peer's channel, or why there is none (its address did not parse).
    fn channel(&self) -> Result<Channel, Unreachable<TypeConfig>> {
        self.channel.clone().map_err(unreachable)
    }

    fn client(&self) -> Result<RaftPeerServiceClient<Channel>, RPCError<TypeConfig>> {
        Ok(RaftPeerServiceClient::new(self.channel()?)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX))
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &mut self,
        kind: Kind,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let payload = encode(req).map_err(network::<RPCError<TypeConfig>>)?;
        self.call_encoded(kind, payload, option).await
    }

    async fn call_encoded<Resp: DeserializeOwned>(
        &mut self,
        kind: Kind,
        payload: Vec<u8>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        // A vote goes out at once: an election must not wait on a backoff.
        if !matches!(kind, Kind::Vote | Kind::PreVote) {
            self.backoff().await;
        }
        let mut client = self.client()?;
        let bytes = payload.len();
        let mut request = tonic::Request::new(RaftRequest {
            header: Some(self.me.header()),
            payload,
        });
        let ttl = match kind {
            Kind::Append => append_deadline(option.hard_ttl(), bytes),
            _ => option.hard_ttl(),
        };
        request.set_timeout(ttl);
        let fut = async {
            match kind {
                Kind::Append => client.append_entries(request).await,
                Kind::Vote => client.vote(request).await,
                Kind::PreVote => client.pre_vote(request).await,
                Kind::Transfer => client.transfer_leader(request).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, fut).await {
            Err(_) => {
                let e = network(format!(
                    "peer {} did not answer within {ttl:?}",
                    self.target
                ));
                self.failed(&e);
                return Err(e);
            }
            Ok(Err(status)) => {
                let e = status_to_rpc(self.target, status);
                self.failed(&e);
                return Err(e);
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        self.succeeded(if matches!(kind, Kind::Append) {
            bytes as u64
        } else {
            0
        });
        reply_payload(self.target, reply)
    }
}

/// The replies of a pipelined append stream, in request order.
type AppendReplies<'s> =
    BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

impl PeerClient {
    /// Opens the ordered `AppendStream` to the follower. Requests go out as openraft yields them,
    /// without waiting for earlier answers. A request unanswered for the RPC deadline ends the
    /// stream with an error (the follower is gone, paused or cut off); openraft then opens a new
    /// one from the last acknowledged entry.
    async fn open_append_stream<S>(
        &mut self,
        input: S,
        option: RPCOption,
    ) -> Result<AppendReplies<'static>, RPCError<TypeConfig>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        self.backoff().await;
        let channel = self.channel()?;
        let ttl = option.hard_ttl();
        let target = self.target;
        // When each request still unanswered was sent and its size, oldest first.
        let sent: Arc<Mutex<Sent>> = Arc::default();
        let header = Some(self.me.header());
        let sent_in = sent.clone();
        // The session is over once openraft drops the reply stream (an error, a timeout, a new
        // session). The request stream must then stop at once: openraft's request stream shares
        // its send position with the next session's, and a dead HTTP/2 stream still pulling
        // from it would take entries the new stream then never sends (the follower sees a gap,
        // and replication stalls until the dead stream is torn down).
        let (session_open, session_over) = tokio::sync::watch::channel(());
        let input = crate::commit_notice::fold_commit_notices(input, self.commit_notice_hold);
        let requests = futures::stream::unfold(
            (input, session_over, header),
            move |(mut input, mut session_over, mut header)| {
                let sent_in = sent_in.clone();
                async move {
                    let req = tokio::select! {
                        biased;
                        // Err: the reply stream (holding the sender) was dropped.
                        _ = session_over.changed() => None,
                        req = input.next() => req,
                    }?;
                    let request = OutgoingAppend::new(header.take(), req);
                    if let Ok(mut q) = sent_in.lock() {
                        q.requests.push_back(SentAppend {
                            at: Instant::now(),
                            bytes: request.payload_len(),
                            entries: request.has_entries(),
                        });
                    }
                    Some((request, (input, session_over, header)))
                }
            },
        );
        let replies =
            match tokio::time::timeout(ttl, append_wire::open_stream(channel, requests)).await {
                Err(_) => {
                    let e = network(format!(
                        "peer {target} did not open the append stream within {ttl:?}"
                    ));
                    self.failed(&e);
                    return Err(e);
                }
                Ok(Err(status)) => {
                    let e = status_to_rpc(target, status);
                    self.failed(&e);
                    return Err(e);
                }
                Ok(Ok(r)) => r.into_inner(),
            };
        if let Ok(mut q) = sent.lock() {
            q.answered_at = Some(Instant::now());
        }
        let links = self.links.clone();
        // The state holds `session_open`: when the reply stream ends or is dropped, so is it, and
        // the request stream stops.
        let strm = futures::stream::unfold(Some((replies, session_open)), move |state| {
            let sent = sent.clone();
            let links = links.clone();
            async move {
                let (mut replies, session_open) = state?;
                let item = next_append_reply(target, &mut replies, &sent, ttl).await;
                match &item {
                    Some(Ok((_, bytes))) => note_success(&links, target, *bytes as u64),
                    Some(Err(e)) => note_failure(&links, target, e),
                    None => {}
                }
                let item = item.map(|r| r.and_then(|(reply, _)| reply));
                match item {
                    Some(Ok(Ok(m))) => Some((Ok(Ok(m)), Some((replies, session_open)))),
                    Some(other) => Some((other, None)),
                    None => None,
                }
            }
        });
        Ok(Box::pin(strm))
    }
}

/// The requests of an append stream still unanswered, oldest first; and when the follower last
/// answered (or the stream opened).
#[derive(Default)]
struct Sent {
    requests: VecDeque<SentAppend>,
    answered_at: Option<Instant>,
}

/// One append of a stream: when it was sent, its encoded size, and whether it carried entries
/// (only those count toward `raftmq_raft_replicate_seconds`).
#[derive(Clone, Copy)]
struct SentAppend {
    at: Instant,
    bytes: usize,
    entries: bool,
}

impl Sent {
    /// When the oldest unanswered request must have been answered: the follower could start on
    /// it once it was sent and the one before it was answered; from then it gets
    /// [`append_deadline`] for its size.
    fn deadline(&self, ttl: Duration) -> Option<(Instant, Duration)> {
        let SentAppend {
            at: sent, bytes, ..
        } = *self.requests.front()?;
        let start = self.answered_at.map_or(sent, |a| a.max(sent));
        let allowed = append_deadline(ttl, bytes);
        Some((start + allowed, allowed))
    }
}

/// The reply to an append and the encoded size of the request it answers.
type AppendReply = (
    Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>,
    usize,
);

/// Waits for the next reply of an append stream, failing once the oldest unanswered request has
/// had its deadline ([`Sent::deadline`]). None: the follower closed the stream after answering
/// everything.
async fn next_append_reply(
    target: NodeId,
    replies: &mut tonic::Streaming<RaftReply>,
    sent: &Mutex<Sent>,
    ttl: Duration,
) -> Option<Result<AppendReply, RPCError<TypeConfig>>> {
    loop {
        let oldest = sent.lock().ok().and_then(|q| q.deadline(ttl));
        // With nothing outstanding there is nothing to time; look again after `ttl` in case a
        // request went out meanwhile. `message()` keeps its progress across a timeout.
        let deadline = oldest.map_or(Instant::now() + ttl, |(d, _)| d);
        match tokio::time::timeout_at(deadline.into(), replies.message()).await {
            Err(_) if oldest.is_some() => {
                let allowed = oldest.map(|(_, a)| a).unwrap_or(ttl);
                return Some(Err(network(format!(
                    "peer {target} did not answer an append within {allowed:?}"
                ))));
            }
            Err(_) => continue,
            Ok(Err(status)) => return Some(Err(status_to_rpc(target, status))),
            Ok(Ok(None)) => {
                let unanswered = sent.lock().map(|q| q.requests.len()).unwrap_or(0);
                return (unanswered > 0).then(|| {
                    Err(network(format!(
                        "peer {target} closed the append stream with {unanswered} appends unanswered"
                    )))
                });
            }
            Ok(Ok(Some(reply))) => {
                let now = Instant::now();
                let answered = sent.lock().ok().and_then(|mut q| {
                    q.answered_at = Some(now);
                    q.requests.pop_front()
                });
                if let Some(a) = answered.filter(|a| a.entries) {
                    crate::metrics::observe_replicate(now.saturating_duration_since(a.at));
                }
                let bytes = answered.map_or(0, |a| a.bytes);
                return Some(Ok((reply_payload(target, reply), bytes)));
            }
        }
    }
}

fn status_to_rpc(target: NodeId, status: tonic::Status) -> RPCError<TypeConfig> {
    let m = format!("peer {target}: {status}");
    if status.code() == tonic::Code::Unavailable {
        unreachable(m)
    } else {
        network(m)
    }
}

fn reply_payload<Resp: DeserializeOwned>(
    target: NodeId,
    reply: RaftReply,
) -> Result<Resp, RPCError<TypeConfig>> {
    if !reply.error.is_empty() {
        return Err(network(format!("peer {target} refused: {}", reply.error)));
    }
    decode(&reply.payload).map_err(network::<RPCError<TypeConfig>>)
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = Vec<u8>;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let payload = encode_append(&rpc).map_err(network::<RPCError<TypeConfig>>)?;
        let sent = (!rpc.entries.is_empty()).then(Instant::now);
        let r = self.call_encoded(Kind::Append, payload, &option).await;
        if let Some(at) = sent.filter(|_| r.is_ok()) {
            crate::metrics::observe_replicate(at.elapsed());
        }
        r
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<AppendReplies<'s>, RPCError<TypeConfig>>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        if !self.pipeline {
            return openraft::network::stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            let replies: AppendReplies<'s> = self.open_append_stream(input, option).await?;
            Ok(replies)
        })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Kind::Vote, &rpc, &option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Kind::PreVote, &rpc, &option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(Kind::Transfer, &req, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + openraft::OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let mut client = RaftPeerServiceClient::new(self.channel()?)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX);
        let meta = encode(&(vote, snapshot.meta.clone()))
            .map_err(network::<StreamingError<TypeConfig>>)?;
        let header = self.me.header();
        let data = snapshot.snapshot;
        let mut chunks = Vec::new();
        let mut first = true;
        let mut off = 0;
        loop {
            let end = (off + SNAPSHOT_CHUNK_BYTES).min(data.len());
            let done = end == data.len();
            chunks.push(SnapshotChunk {
                header: first.then(|| header.clone()),
                meta: if first { meta.clone() } else { Vec::new() },
                data: data[off..end].to_vec(),
                done,
            });
            first = false;
            off = end;
            if done {
                break;
            }
        }
        let ttl = option.hard_ttl();
        let mut request = tonic::Request::new(tokio_stream::iter(chunks));
        request.set_timeout(ttl);
        let target = self.target;
        let send = async move {
            match tokio::time::timeout(ttl, client.install_snapshot(request)).await {
                Err(_) => Err(network::<StreamingError<TypeConfig>>(format!(
                    "peer {target} did not take the snapshot within {ttl:?}"
                ))),
                Ok(Err(status)) => Err(network(format!("peer {target}: {status}"))),
                Ok(Ok(r)) => {
                    let reply = r.into_inner();
                    if !reply.error.is_empty() {
                        return Err(network(format!(
                            "peer {target} refused the snapshot: {}",
                            reply.error
                        )));
                    }
                    decode(&reply.payload).map_err(network::<StreamingError<TypeConfig>>)
                }
            }
        };
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            r = send => r,
        }
    }
}

/// Accepted connections with Nagle's algorithm off. tonic ignores `tcp_nodelay` when it is given
/// a stream of accepted sockets, and with Nagle on every small reply waits for the peer's delayed
/// ACK (~40 ms): that alone made batch sends and commits take 40-90 ms.
pub fn incoming_nodelay(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use futures::StreamExt;
    tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            let _ = s.set_nodelay(true);
        }
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1. A connection to a peer that goes silent without a close is dropped while idle, so the
    ///    next call dials afresh (what a new leader needs when a peer's task moved): the member's
    ///    channel must close its side within the keep-alive's bound.
    #[tokio::test]
    async fn t1_an_idle_connection_to_a_silent_peer_is_dropped() {
        let peer = raftmq_proto::testing::SilentPeer::start().await;
        let me = Identity {
            cluster: "c".into(),
            broker: "b".into(),
            node_id: 1,
            secret: None,
        };
        let factory = NetworkFactory::new(me, Default::default(), true, Duration::ZERO, None);
        let channel = factory.channel(2, &peer.addr.to_string()).unwrap();
        // One call opens the connection (the peer knows no service: UNIMPLEMENTED).
        let status = RaftPeerServiceClient::new(channel)
            .vote(RaftRequest::default())
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        let bound = PEER_PING_EVERY + PEER_PING_TIMEOUT + Duration::from_secs(3);
        let secs = peer.silence_until_closed(bound).await;
        println!("connection dropped {secs:.1} s after the peer went silent");
    }
}
