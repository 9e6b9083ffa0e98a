//! The peer network, server side: the `RaftPeerService` that hands peer requests to openraft.
//! Requests from another cluster or broker group, or without the configured shared secret, are
//! refused before they reach Raft; undecodable payloads are refused with an error reply.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use futures::StreamExt;
use raftmq_proto::v1::raft_peer_service_server::RaftPeerService;
use raftmq_proto::v1::{PeerHeader, RaftReply, RaftRequest, SnapshotChunk};
use serde::Serialize;
use tonic::{Request, Response, Status, Streaming};

use crate::network::{Identity, decode, encode};
use crate::state_machine::{Adapter, Snapshot};
use crate::types::{Raft, SnapshotMeta, TypeConfig, Vote};
use openraft::raft::AppendEntriesRequest;

/// Admits a peer RPC only from a caller whose verified TLS certificate names a member of this
/// node's cluster and group (with TLS on): a stranger without a certificate, or a node of another
/// group, is refused before its request is read, let alone appended.
#[derive(Clone)]
pub struct PeerGuard {
    cluster: String,
    broker: String,
    require_cert: bool,
    last_warned: Arc<std::sync::Mutex<Option<Instant>>>,
}

impl PeerGuard {
    pub(crate) fn new(me: &Identity, require_cert: bool) -> Self {
        PeerGuard {
            cluster: me.cluster.clone(),
            broker: me.broker.clone(),
            require_cert,
            last_warned: Arc::default(),
        }
    }

    fn refuse(&self, status: Status) -> Status {
        // At most one line per 10 s: a stranger retrying must not flood the log.
        let mut last = self.last_warned.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() > std::time::Duration::from_secs(10)) {
            *last = Some(Instant::now());
            tracing::warn!("{}", status.message());
        }
        status
    }
}

impl tonic::service::Interceptor for PeerGuard {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        if !self.require_cert {
            return Ok(req);
        }
        let (cluster, broker) = (&self.cluster, &self.broker);
        match req.peer_certs() {
            None => Err(self.refuse(Status::unauthenticated(format!(
                "raft peer RPC refused: no client certificate (a member of {cluster}/{broker} \
                 presents its node certificate)"
            )))),
            Some(certs) if !raftmq_security::identity::names_member_of(&certs, cluster, broker) => {
                Err(self.refuse(Status::permission_denied(format!(
                    "raft peer RPC refused: the client certificate names no member of \
                     {cluster}/{broker}"
                ))))
            }
            Some(_) => Ok(req),
        }
    }
}

pub struct PeerServer<S: crate::StateMachine> {
    pub(crate) raft: Raft<Adapter<S>>,
    pub(crate) me: Identity,
    /// Milliseconds since `started` when the last AppendEntries arrived (0 = never).
    pub(crate) last_append_ms: Arc<AtomicU64>,
    /// The commit index the leader last sent (index + 1; 0 = none yet).
    pub(crate) leader_commit: Arc<AtomicU64>,
    pub(crate) started: Instant,
    /// Tells whether this member is repairing a log that lost entries it had stored.
    pub(crate) log: crate::log_store::LogReader,
}

impl<S: crate::StateMachine> PeerServer<S> {
    /// Checks the header and decodes the payload of a unary peer request.
    fn admit<T: serde::de::DeserializeOwned>(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<T, String> {
        let req = req.into_inner();
        self.check(req.header.as_ref())?;
        decode(&req.payload)
    }

    /// As `admit`, for a request that elects: a member repairing a damaged log grants no vote
    /// and takes no leadership, since it may have acknowledged entries it no longer holds and its
    /// vote could elect a leader without them.
    fn admit_electing<T: serde::de::DeserializeOwned>(
        &self,
        req: Request<RaftRequest>,
        what: &str,
    ) -> Result<T, String> {
        let rpc = self.admit(req)?;
        match self.log.repairing() {
            Some((last, floor)) => Err(format!(
                "{what} refused: node {} is repairing its log (holds up to index {last}, had \
                 stored up to {floor})",
                self.me.node_id
            )),
            None => Ok(rpc),
        }
    }

    /// An election request (vote, pre-vote, leadership transfer): admitted as
    /// [`Self::admit_electing`] says, then answered by `call`; a refusal is the reply.
    async fn electing<T, R, E, Fut>(
        &self,
        req: Request<RaftRequest>,
        what: &str,
        call: impl FnOnce(T) -> Fut,
    ) -> Result<Response<RaftReply>, Status>
    where
        T: serde::de::DeserializeOwned,
        R: Serialize,
        E: std::fmt::Display,
        Fut: std::future::Future<Output = Result<R, E>>,
    {
        match self.admit_electing(req, what) {
            Ok(rpc) => reply(call(rpc).await),
            Err(e) => refused(e),
        }
    }

    fn check(&self, h: Option<&PeerHeader>) -> Result<(), String> {
        check_header(&self.me, h)
    }
}

fn check_header(me: &Identity, h: Option<&PeerHeader>) -> Result<(), String> {
    let h = h.ok_or("missing peer header")?;
    if h.cluster != me.cluster || h.broker != me.broker {
        return Err(format!(
            "request from {}/{} refused by a member of {}/{}",
            h.cluster, h.broker, me.cluster, me.broker
        ));
    }
    if let Some(secret) = &me.secret
        && &h.secret != secret
    {
        return Err("peer secret does not match".into());
    }
    Ok(())
}

/// Checks the requests of one append stream as they arrive.
struct AdmitAppends {
    me: Identity,
    last_append_ms: Arc<AtomicU64>,
    leader_commit: Arc<AtomicU64>,
    started: Instant,
    stopped: Arc<std::sync::Mutex<Option<String>>>,
    /// When each admitted request still unanswered arrived, if it carried entries (the stream
    /// answers in order): `raftmq_raft_append_seconds`.
    arrivals: Arc<std::sync::Mutex<VecDeque<Option<Instant>>>>,
}

impl AdmitAppends {
    /// The decoded request, or None (the reason stored in `stopped`) to end the stream. The first
    /// request must carry the peer header; a later one may repeat it.
    fn admit(
        &self,
        next: Option<Result<RaftRequest, Status>>,
        checked: bool,
    ) -> Option<AppendEntriesRequest<TypeConfig>> {
        let r = match next? {
            Err(status) => Err(format!("append stream broke: {status}")),
            Ok(req) => {
                let header = match (&req.header, checked) {
                    (None, true) => Ok(()),
                    (h, _) => check_header(&self.me, h.as_ref()),
                };
                header.and_then(|()| {
                    // prost copied the payload out of gRPC's buffer once, into a `Vec` of its
                    // size; the entries are slices of it. (Decoded as `Bytes`, the payload was a
                    // slice of gRPC's buffer itself, which then could not be reused: it was
                    // allocated afresh and grown by doubling for every request, and a
                    // follower's append took longer.)
                    crate::encoding::decode_shared(&bytes::Bytes::from(req.payload))
                        .map_err(|e| format!("decode: {e}"))
                })
            }
        };
        match r {
            Ok(rpc) => {
                note_append(&self.last_append_ms, self.started);
                note_commit(&self.leader_commit, &rpc);
                if let Ok(mut a) = self.arrivals.lock() {
                    a.push_back((!rpc.entries.is_empty()).then(Instant::now));
                }
                Some(rpc)
            }
            Err(e) => {
                if let Ok(mut s) = self.stopped.lock() {
                    *s = Some(e);
                }
                None
            }
        }
    }
}

/// Records the commit index a leader sent (it only grows; a new leader's may start lower).
fn note_commit(leader_commit: &AtomicU64, rpc: &AppendEntriesRequest<TypeConfig>) {
    if let Some(c) = &rpc.leader_commit {
        leader_commit.fetch_max(c.index + 1, Ordering::Relaxed);
    }
}

/// Records that an AppendEntries arrived now (milliseconds since `started`, 0 meaning never).
fn note_append(last_append_ms: &AtomicU64, started: Instant) {
    last_append_ms.store(started.elapsed().as_millis() as u64 + 1, Ordering::Relaxed);
}

fn reply<T: Serialize, E: std::fmt::Display>(
    r: Result<T, E>,
) -> Result<Response<RaftReply>, Status> {
    Ok(Response::new(raft_reply(r)))
}

/// openraft's answer as a peer reply: the encoded value, or the error as text.
fn raft_reply<T: Serialize, E: std::fmt::Display>(r: Result<T, E>) -> RaftReply {
    let encoded = r.map_err(|e| e.to_string()).and_then(|v| encode(&v));
    match encoded {
        Ok(payload) => RaftReply {
            error: String::new(),
            payload,
        },
        Err(error) => RaftReply {
            error,
            payload: Vec::new(),
        },
    }
}

fn refused(e: String) -> Result<Response<RaftReply>, Status> {
    Ok(Response::new(RaftReply {
        error: e,
        payload: Vec::new(),
    }))
}

#[tonic::async_trait]
impl<S: crate::StateMachine> RaftPeerService for PeerServer<S> {
    async fn append_entries(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc = match self.admit(req) {
            Ok(rpc) => rpc,
            Err(e) => return refused(e),
        };
        note_append(&self.last_append_ms, self.started);
        note_commit(&self.leader_commit, &rpc);
        let arrived = (!rpc.entries.is_empty()).then(Instant::now);
        let r = self.raft.append_entries(rpc).await;
        if let Some(at) = arrived {
            crate::metrics::observe_append(at.elapsed());
        }
        reply(r)
    }

    type AppendStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<RaftReply, Status>> + Send + 'static>>;

    async fn append_stream(
        &self,
        req: Request<Streaming<RaftRequest>>,
    ) -> Result<Response<Self::AppendStreamStream>, Status> {
        let inbound = req.into_inner();
        // Why the requests stopped early (a refused header, an undecodable payload, a broken
        // stream): answered after the replies to the requests before it.
        let stopped: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let arrivals: Arc<std::sync::Mutex<VecDeque<Option<Instant>>>> = Arc::default();
        let admitted = AdmitAppends {
            me: self.me.clone(),
            last_append_ms: self.last_append_ms.clone(),
            leader_commit: self.leader_commit.clone(),
            started: self.started,
            stopped: stopped.clone(),
            arrivals: arrivals.clone(),
        };
        let requests =
            futures::stream::unfold(Some((inbound, admitted, false)), |state| async move {
                let (mut inbound, admitted, checked) = state?;
                let next = inbound.next().await;
                admitted
                    .admit(next, checked)
                    .map(|rpc| (rpc, Some((inbound, admitted, true))))
            });
        let replies = self.raft.stream_append(requests).map(move |r| {
            let arrived = arrivals
                .lock()
                .ok()
                .and_then(|mut a| a.pop_front())
                .flatten();
            if let Some(at) = arrived {
                crate::metrics::observe_append(at.elapsed());
            }
            Ok(raft_reply(r))
        });
        let last =
            futures::stream::once(async move { stopped.lock().ok().and_then(|mut s| s.take()) })
                .filter_map(|e| async move {
                    e.map(|error| {
                        Ok(RaftReply {
                            error,
                            payload: Vec::new(),
                        })
                    })
                });
        Ok(Response::new(Box::pin(replies.chain(last))))
    }

    async fn vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.electing(req, "vote", |rpc| self.raft.vote(rpc)).await
    }

    async fn pre_vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        self.electing(req, "pre-vote", |rpc| self.raft.pre_vote(rpc))
            .await
    }

    async fn transfer_leader(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        self.electing(req, "leadership transfer", |rpc| {
            self.raft.handle_transfer_leader(rpc)
        })
        .await
    }

    async fn install_snapshot(
        &self,
        req: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftReply>, Status> {
        let mut stream = req.into_inner();
        let Some(first) = stream.next().await else {
            return refused("empty snapshot stream".into());
        };
        let first = first?;
        if let Err(e) = self.check(first.header.as_ref()) {
            return refused(e);
        }
        let (vote, meta): (Vote, SnapshotMeta) = match decode(&first.meta) {
            Ok(m) => m,
            Err(e) => return refused(e),
        };
        let mut data = first.data;
        let mut done = first.done;
        while !done {
            match stream.next().await {
                Some(Ok(c)) => {
                    data.extend_from_slice(&c.data);
                    done = c.done;
                }
                Some(Err(s)) => return Err(s),
                None => return refused("snapshot stream ended before its last chunk".into()),
            }
        }
        let snapshot = Snapshot {
            meta,
            snapshot: data,
        };
        reply(self.raft.install_full_snapshot(vote, snapshot).await)
    }
}
