//! Where to send a request for a broker group, and the retry loop that gets it there.
//!
//! The router keeps a view of every broker group it has heard of — nodes, the current leader — fed
//! by nameserver routes and cluster info, by `NOT_LEADER` hints and by successful calls.
//! [`Router::call_leader`] sends a request to a group's leader and on failure:
//! - `NOT_LEADER` with a leader: follows the hint at once, unless that leader is suspect (below):
//!   then asks another node;
//! - `NOT_LEADER` without one (election in progress), `UNAVAILABLE`, `BUSY`: backs off and tries
//!   again, moving to another node when one keeps failing;
//! - a transport error (refused, reset: at once) or no answer within the short attempt timeout:
//!   marks the node suspect for every call for a while and asks another node of the group at
//!   once, which either is the new leader or names it — so a leader kill costs about one
//!   election, not an RPC timeout or a nameserver refresh;
//! - any other code: returns it, as retrying will not change it.
//!
//! Pauses end early when any call hears of a new leader, so one call's discovery serves them all.
//!
//! It gives up with [`Error::Timeout`] at the caller's deadline.
//!
//! The choice after each failure is a plain function, [`after_failure`] (failure kind, the node
//! asked, hints followed so far → marks on the node and the next step), and a backoff's length is
//! [`backoff_step`] of the time; the loop only carries them out. One change from the loop before
//! it: after `UNAVAILABLE` the node is no longer believed to lead from the start of the backoff,
//! not from its end.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::conn::Pool;
use crate::error::{Error, Result, is_retriable_code};
use crate::nameserver::{NameserverClient, TopicRoute};
use crate::security::{ClientSecurity, Conn};
use raftmq_proto::v1::{self, ErrorCode};
use tokio::time::Instant;

/// How the retry loops pace themselves.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// First pause after a retriable failure; doubles up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Longest a single attempt may take before another node is tried; doubles (up to eight
    /// times) with each attempt of the same call that runs out of it, so a slow but live leader
    /// still answers. Kept short: a node that died without closing its connections (a host or
    /// container gone) holds the attempt this long.
    pub attempt_timeout: Duration,
    /// Longest a connection attempt may take; a refused or reset connection fails at once.
    pub connect_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(200),
            attempt_timeout: Duration::from_millis(500),
            connect_timeout: Duration::from_millis(250),
        }
    }
}

/// Minimum pause between two cluster-info refreshes triggered by errors.
const GROUP_REFRESH_INTERVAL_MIN: Duration = Duration::from_millis(250);

/// How long a node that failed at the transport level (refused, reset, no answer) is avoided by
/// every call, unless it answers meanwhile. Followers keep naming a killed leader until their
/// election timeout runs out; their hints to it are not followed while it is suspect.
const SUSPECT_FOR: Duration = Duration::from_millis(1_000);

/// A reply carrying an `Error` field.
pub(crate) trait Reply {
    fn error(&self) -> Option<&v1::Error>;
}

macro_rules! impl_reply {
    ($($t:ty),* $(,)?) => {
        $(impl Reply for $t {
            fn error(&self) -> Option<&v1::Error> {
                self.error.as_ref()
            }
        })*
    };
}

impl_reply!(
    v1::TopicStatusResponse,
    v1::GroupStatusResponse,
    v1::ResetOffsetResponse,
    v1::RecallResponse,
    v1::FindMessagesResponse,
    v1::EndTransactionResponse,
    v1::ListTransactionsResponse,
    v1::SendResponse,
    v1::SendManyResponse,
    v1::PullResponse,
    v1::CommitOffsetResponse,
    v1::FetchOffsetResponse,
    v1::CreateTopicResponse,
    v1::DeleteTopicResponse,
    v1::ListTopicsResponse,
    v1::HeartbeatResponse,
    v1::LeaveGroupResponse,
    v1::TransferLeaderResponse,
    v1::AddLearnerResponse,
    v1::ChangeVotersResponse,
    v1::PutUserResponse,
    v1::DeleteUserResponse,
    v1::ChangeRuleResponse,
    v1::ListUsersResponse,
);

#[derive(Debug, Default, Clone)]
struct GroupView {
    nodes: BTreeMap<u64, String>,
    leader: Option<u64>,
    /// Highest term a nameserver reported; hints do not carry one.
    term: u64,
}

struct CachedRoute {
    route: Arc<TopicRoute>,
    fetched: Instant,
}

/// Routes, group views and the leader-following retry loop, shared by producer, consumer, admin.
pub(crate) struct Router {
    pub(crate) pool: Pool,
    pub(crate) ns: NameserverClient,
    pub(crate) policy: RetryPolicy,
    groups: Mutex<HashMap<String, GroupView>>,
    /// Looked up on every send: hashed with foldhash (the keys are this client's own topics).
    routes: Mutex<HashMap<String, CachedRoute, foldhash::fast::RandomState>>,
    last_group_refresh: tokio::sync::Mutex<Option<Instant>>,
    rotate: AtomicUsize,
    /// Nodes that failed at the transport level, until when they are avoided.
    suspects: Mutex<HashMap<String, Instant>>,
    /// Bumped whenever a group's believed leader changes: wakes calls pausing for one.
    leader_changes: tokio::sync::watch::Sender<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Router {
    pub(crate) fn new(
        nameservers: Vec<String>,
        policy: RetryPolicy,
        security: ClientSecurity,
    ) -> Result<Arc<Self>> {
        let pool = Pool::new(policy.connect_timeout, security);
        let ns = NameserverClient::new(nameservers, pool.clone())?;
        Ok(Arc::new(Router {
            pool,
            ns,
            policy,
            groups: Mutex::default(),
            routes: Mutex::default(),
            last_group_refresh: tokio::sync::Mutex::new(None),
            rotate: AtomicUsize::new(0),
            suspects: Mutex::default(),
            leader_changes: tokio::sync::watch::Sender::new(0),
        }))
    }

    /// The topic's route, fetched again when the cached one is older than `max_age`.
    pub(crate) async fn route(&self, topic: &str, max_age: Duration) -> Result<Arc<TopicRoute>> {
        if let Some(r) = self.fresh_route(topic, max_age) {
            return Ok(r);
        }
        let route = Arc::new(self.ns.route(topic).await?);
        self.merge_route(&route);
        lock(&self.routes).insert(
            topic.to_string(),
            CachedRoute {
                route: route.clone(),
                fetched: Instant::now(),
            },
        );
        Ok(route)
    }

    /// The cached route if it is younger than `max_age`, without waiting.
    pub(crate) fn fresh_route(&self, topic: &str, max_age: Duration) -> Option<Arc<TopicRoute>> {
        lock(&self.routes)
            .get(topic)
            .filter(|c| c.fetched.elapsed() < max_age)
            .map(|c| c.route.clone())
    }

    /// Caches `route` as if a nameserver had just returned it (tests without a nameserver).
    #[cfg(test)]
    pub(crate) fn cache_route(&self, route: TopicRoute) {
        let route = Arc::new(route);
        self.merge_route(&route);
        lock(&self.routes).insert(
            route.topic.clone(),
            CachedRoute {
                route,
                fetched: Instant::now(),
            },
        );
    }

    /// Drops the cached route so the next use fetches it again.
    pub(crate) fn invalidate_route(&self, topic: &str) {
        lock(&self.routes).remove(topic);
    }

    /// The cached route, if any, however old.
    pub(crate) fn cached_route(&self, topic: &str) -> Option<Arc<TopicRoute>> {
        lock(&self.routes).get(topic).map(|c| c.route.clone())
    }

    fn merge_group(
        &self,
        name: &str,
        nodes: impl Iterator<Item = (u64, String)>,
        leader: Option<u64>,
        term: u64,
    ) {
        let mut groups = lock(&self.groups);
        let g = groups.entry(name.to_string()).or_default();
        for (id, addr) in nodes {
            g.nodes.insert(id, addr);
        }
        // A route never overrides a fresher hint of the same term.
        if leader.is_some() && (term > g.term || g.leader.is_none()) {
            if g.leader != leader {
                self.leader_changes.send_modify(|n| *n += 1);
            }
            g.leader = leader;
        }
        g.term = g.term.max(term);
    }

    fn merge_route(&self, route: &TopicRoute) {
        for b in &route.brokers {
            self.merge_group(
                &b.name,
                b.nodes.iter().map(|n| (n.node_id, n.address.clone())),
                b.leader_id,
                b.term,
            );
        }
    }

    pub(crate) fn merge_cluster_info(&self, clusters: &[v1::ClusterInfo]) {
        for c in clusters {
            for b in &c.brokers {
                self.merge_group(
                    &b.name,
                    b.nodes.iter().map(|n| (n.node_id, n.address.clone())),
                    b.leader_id,
                    b.term,
                );
            }
        }
    }

    /// Cluster info from the nameservers, merged into the group views.
    pub(crate) async fn cluster_info(&self) -> Result<Vec<v1::ClusterInfo>> {
        let info = self.ns.cluster_info().await?;
        self.merge_cluster_info(&info);
        *self.last_group_refresh.lock().await = Some(Instant::now());
        Ok(info)
    }

    /// Refreshes group views from the nameservers, at most every few hundred milliseconds.
    async fn refresh_groups(&self) {
        let mut last = self.last_group_refresh.lock().await;
        if last.is_some_and(|t| t.elapsed() < GROUP_REFRESH_INTERVAL_MIN) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        match self.ns.cluster_info().await {
            Ok(info) => self.merge_cluster_info(&info),
            Err(e) => tracing::debug!("cluster info refresh failed: {e}"),
        }
    }

    /// A node named by a `NOT_LEADER` reply leads the group.
    pub(crate) fn note_leader(&self, broker: &str, leader: &v1::NodeRef) {
        let mut groups = lock(&self.groups);
        let g = groups.entry(broker.to_string()).or_default();
        g.nodes.insert(leader.node_id, leader.address.clone());
        if g.leader != Some(leader.node_id) {
            g.leader = Some(leader.node_id);
            self.leader_changes.send_modify(|n| *n += 1);
        }
    }

    fn note_success(&self, broker: &str, address: &str) {
        self.clear_suspect(address);
        let mut groups = lock(&self.groups);
        if let Some(g) = groups.get_mut(broker)
            && let Some((&id, _)) = g.nodes.iter().find(|(_, a)| a.as_str() == address)
            && g.leader != Some(id)
        {
            g.leader = Some(id);
            self.leader_changes.send_modify(|n| *n += 1);
        }
    }

    /// A node failed at the transport level: every call avoids it for a while.
    fn suspect(&self, address: &str) {
        lock(&self.suspects).insert(address.to_string(), Instant::now() + SUSPECT_FOR);
    }

    fn clear_suspect(&self, address: &str) {
        let mut s = lock(&self.suspects);
        if !s.is_empty() {
            s.remove(address);
        }
    }

    fn is_suspect(&self, address: &str) -> bool {
        let mut s = lock(&self.suspects);
        match s.get(address) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                s.remove(address);
                false
            }
            None => false,
        }
    }

    fn forget_leader(&self, broker: &str, address: &str) {
        let mut groups = lock(&self.groups);
        if let Some(g) = groups.get_mut(broker)
            && let Some(id) = g.leader
            && g.nodes.get(&id).is_some_and(|a| a == address)
        {
            g.leader = None;
        }
    }

    /// The group's leader as currently believed: (node id, address).
    pub(crate) fn leader(&self, broker: &str) -> Option<(u64, String)> {
        let groups = lock(&self.groups);
        let g = groups.get(broker)?;
        let id = g.leader?;
        Some((id, g.nodes.get(&id)?.clone()))
    }

    /// Every known node of the group: (node id, address), by id.
    pub(crate) fn nodes(&self, broker: &str) -> Vec<(u64, String)> {
        lock(&self.groups)
            .get(broker)
            .map(|g| g.nodes.iter().map(|(i, a)| (*i, a.clone())).collect())
            .unwrap_or_default()
    }

    /// The leader unless avoided or suspect, else another node not avoided (rotating, to spread
    /// probes), suspect ones last.
    fn pick(&self, broker: &str, avoid: &HashSet<String>) -> Option<String> {
        if let Some((_, addr)) = self.leader(broker)
            && !avoid.contains(&addr)
            && !self.is_suspect(&addr)
        {
            return Some(addr);
        }
        let nodes = self.nodes(broker);
        let start = self.rotate.fetch_add(1, Ordering::Relaxed);
        let candidates: Vec<&String> = (0..nodes.len())
            .map(|i| &nodes[(start + i) % nodes.len()].1)
            .filter(|a| !avoid.contains(*a))
            .collect();
        if let Some(a) = candidates.iter().find(|a| !self.is_suspect(a)) {
            return Some((*a).clone());
        }
        // Suspect nodes only once the whole group is suspect (a restart of every node).
        if nodes.iter().all(|(_, a)| self.is_suspect(a)) {
            return candidates.first().map(|a| (*a).clone());
        }
        None
    }

    /// Sends a request to the leader of `broker`, following leader changes, until `deadline`.
    /// `call` gets a channel to the chosen node and the time this attempt may take. Returns the
    /// reply (whose error is absent or OK) and the address that answered.
    pub(crate) async fn call_leader<R, F, Fut>(
        &self,
        broker: &str,
        rpc: &'static str,
        deadline: Instant,
        call: F,
    ) -> Result<(R, String)>
    where
        R: Reply,
        F: FnMut(Conn, Duration) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        self.call_leader_timed(broker, rpc, deadline, self.policy.attempt_timeout, call)
            .await
    }

    /// [`Self::call_leader`] with its own first attempt timeout, for requests that may wait on
    /// the server on purpose (long-polling pulls).
    pub(crate) async fn call_leader_timed<R, F, Fut>(
        &self,
        broker: &str,
        rpc: &'static str,
        deadline: Instant,
        attempt_timeout: Duration,
        mut call: F,
    ) -> Result<(R, String)>
    where
        R: Reply,
        F: FnMut(Conn, Duration) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        let started = Instant::now();
        let mut backoff = self.policy.backoff_initial;
        let mut avoid: HashSet<String> = HashSet::new();
        let mut next: Option<String> = None;
        let mut hops = 0u32;
        let mut attempt_max = attempt_timeout;
        let mut last = String::from("no attempt");
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    op: format!("{rpc} to broker {broker}"),
                    waited: now - started,
                    last,
                });
            }
            let Some(addr) = next.take().or_else(|| self.pick(broker, &avoid)) else {
                if self.nodes(broker).is_empty() {
                    last = format!("broker group {broker} is not known to the nameservers");
                }
                let d = after_failure(&Failure::NoNodeLeft, "", hops);
                self.apply(broker, "", &d, &mut avoid);
                self.refresh_groups().await;
                self.pause(&mut backoff, deadline).await;
                continue;
            };
            let attempt = attempt_max.min(deadline - now);
            let channel = self.pool.channel(&addr)?;
            if last != "no attempt" {
                tracing::debug!("{rpc} to {broker}: retrying at {addr} after: {last}");
            }
            let failure = match tokio::time::timeout(attempt, call(channel, attempt)).await {
                Err(_) => {
                    last = format!("{addr}: no answer within {attempt:?}");
                    Failure::NoAnswer
                }
                Ok(Err(status)) => {
                    if !is_transport_status(&status) {
                        return Err(Error::Rpc {
                            address: addr,
                            rpc,
                            status: Box::new(status),
                        });
                    }
                    last = format!("{addr}: {}", status.message());
                    Failure::Transport {
                        unreachable: is_connection_status(&status),
                    }
                }
                Ok(Ok(resp)) => {
                    let resp = resp.into_inner();
                    let err = match resp.error() {
                        Some(e) if e.code() != ErrorCode::Ok => e.clone(),
                        _ => {
                            self.note_success(broker, &addr);
                            return Ok((resp, addr));
                        }
                    };
                    let code = err.code();
                    last = format!("{addr}: {err}");
                    if !is_retriable_code(code) {
                        return Err(Error::Server {
                            address: addr,
                            rpc,
                            code,
                            message: err.message,
                            leader: err.leader,
                        });
                    }
                    let hint = err.leader.map(|l| Hint {
                        suspect: self.is_suspect(&l.address),
                        leader: l,
                    });
                    Failure::Code { code, hint }
                }
            };
            let d = after_failure(&failure, &addr, hops);
            if d.longer_attempts {
                // A slow but live leader gets longer next time; a dead one is avoided.
                attempt_max = (attempt_max * 2).min(attempt_timeout * 8);
            }
            self.apply(broker, &addr, &d, &mut avoid);
            match d.next {
                Next::AnotherNode => {}
                Next::AnotherNodeOrBackoff => {
                    // Another node may answer at once; pause only once all were tried.
                    if self.pick(broker, &avoid).is_none() {
                        self.pause(&mut backoff, deadline).await;
                    }
                }
                Next::Hinted {
                    leader,
                    backoff_first,
                } => {
                    self.note_leader(broker, &leader);
                    hops += 1;
                    avoid.remove(&leader.address);
                    next = Some(leader.address);
                    if backoff_first {
                        self.pause(&mut backoff, deadline).await;
                    }
                }
                Next::Backoff => self.pause(&mut backoff, deadline).await,
                Next::RefreshAndBackoff => {
                    self.refresh_groups().await;
                    self.pause(&mut backoff, deadline).await;
                }
            }
        }
    }

    /// Carries out a decision's marks on the node that failed, and a refresh it asks for.
    fn apply(&self, broker: &str, addr: &str, d: &Decision, avoid: &mut HashSet<String>) {
        if d.suspect {
            self.suspect(addr);
        }
        if d.forget_leader {
            self.forget_leader(broker, addr);
        }
        if d.avoid {
            avoid.insert(addr.to_string());
        }
        if matches!(d.next, Next::RefreshAndBackoff) {
            // Every node was tried: start over after a pause and a fresh view.
            avoid.clear();
        }
    }

    /// Sleeps for the backoff (with jitter), or less when some call hears of a new leader.
    async fn pause(&self, backoff: &mut Duration, deadline: Instant) {
        let mut changes = self.leader_changes.subscribe();
        let jitter = rand::random_range(0.5..1.0);
        let (until, next) = backoff_step(
            *backoff,
            jitter,
            self.policy.backoff_max,
            Instant::now(),
            deadline,
        );
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = changes.changed() => {}
        }
        *backoff = next;
    }
}

/// One backoff as a plain function of time: with `jitter` in 0.5..1, pause until
/// `now + backoff * jitter` (never past `deadline`); the next backoff doubles, up to `max`.
pub(crate) fn backoff_step(
    backoff: Duration,
    jitter: f64,
    max: Duration,
    now: Instant,
    deadline: Instant,
) -> (Instant, Duration) {
    (
        (now + backoff.mul_f64(jitter)).min(deadline),
        (backoff * 2).min(max),
    )
}

/// What went wrong with one attempt of [`Router::call_leader`], as far as choosing the next step
/// needs to know.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Failure {
    /// No node of the group is left to ask: every known one was tried this round, or none is known.
    NoNodeLeft,
    /// The node did not answer within the attempt timeout.
    NoAnswer,
    /// A transport-level status; `unreachable` when it says the node itself is gone (refused,
    /// reset), not merely that this request failed.
    Transport { unreachable: bool },
    /// A reply with a retriable error code, and the leader it names if any.
    Code { code: ErrorCode, hint: Option<Hint> },
}

/// A leader named by a `NOT_LEADER` reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hint {
    pub(crate) leader: v1::NodeRef,
    /// The named leader failed at the transport level a moment ago (it is likely dead and the
    /// follower has not noticed yet).
    pub(crate) suspect: bool,
}

/// What to do after a failure: marks on the node that failed, then the next step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision {
    /// Every call avoids the node for a while.
    pub(crate) suspect: bool,
    /// The node is no longer believed to lead.
    pub(crate) forget_leader: bool,
    /// This call does not ask the node again this round.
    pub(crate) avoid: bool,
    /// The next attempts of this call may take twice as long (up to 8 times the first).
    pub(crate) longer_attempts: bool,
    pub(crate) next: Next,
}

/// The next step of a call after a failure. Giving up is not among them: a non-retriable answer
/// is returned before deciding, and the deadline ends the loop before each attempt.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Next {
    /// Ask another node of the group at once (or the same, if it is the only one not avoided).
    AnotherNode,
    /// Ask another node at once if one is left, else back off first.
    AnotherNodeOrBackoff,
    /// Ask the hinted leader, after a backoff when hints keep bouncing between nodes.
    Hinted {
        leader: v1::NodeRef,
        backoff_first: bool,
    },
    /// Back off, then pick again (the same node unless avoided).
    Backoff,
    /// Start a new round (no node avoided) from a fresh view of the group, after a backoff.
    RefreshAndBackoff,
}

/// Hints followed in one call beyond which following another one first backs off: nodes pointing
/// at each other during a leadership change.
const HOPS_BEFORE_BACKOFF: u32 = 3;

/// The retry policy of [`Router::call_leader`] as a plain function: after `failure` of the node at
/// `asked`, having followed `hops` leader hints so far in this call, what to mark and what to do.
pub(crate) fn after_failure(failure: &Failure, asked: &str, hops: u32) -> Decision {
    let mark = |suspect, forget_leader, avoid, next| Decision {
        suspect,
        forget_leader,
        avoid,
        longer_attempts: false,
        next,
    };
    match failure {
        Failure::NoNodeLeft => mark(false, false, false, Next::RefreshAndBackoff),
        // A slow but live leader gets longer next time; a dead one is avoided by every call.
        Failure::NoAnswer => Decision {
            longer_attempts: true,
            ..mark(true, true, true, Next::AnotherNode)
        },
        Failure::Transport { unreachable } => {
            mark(*unreachable, true, true, Next::AnotherNodeOrBackoff)
        }
        Failure::Code {
            code: ErrorCode::NotLeader,
            hint: Some(h),
        } if h.leader.address != asked => {
            if h.suspect {
                // A follower that has not yet noticed the leader died names it still: ask another
                // node (or, all asked, pause until a leader is heard of).
                mark(false, false, true, Next::AnotherNode)
            } else {
                mark(
                    false,
                    false,
                    false,
                    Next::Hinted {
                        leader: h.leader.clone(),
                        backoff_first: hops + 1 > HOPS_BEFORE_BACKOFF,
                    },
                )
            }
        }
        // An election is running (or the node names itself): no leader to follow yet.
        Failure::Code {
            code: ErrorCode::NotLeader,
            ..
        } => mark(false, true, true, Next::Backoff),
        // No quorum yet: another node may know better once this one has had a moment.
        Failure::Code {
            code: ErrorCode::Unavailable,
            ..
        } => mark(false, true, true, Next::Backoff),
        // BUSY, or another retriable code: the same node may recover.
        Failure::Code { .. } => mark(false, false, false, Next::Backoff),
    }
}

/// gRPC statuses that mean "this node did not handle the request" rather than "the request is
/// wrong": connection refused or reset, the node shutting down, timeouts.
pub(crate) fn is_transport_status(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Internal
    )
}

/// Transport statuses that say the node is unreachable (refused, reset, gone), not merely that
/// this request failed.
fn is_connection_status(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> Arc<Router> {
        Router::new(
            vec!["127.0.0.1:1".into()],
            RetryPolicy::default(),
            ClientSecurity::default(),
        )
        .expect("router")
    }

    fn route(term: u64, leader: u64) -> TopicRoute {
        TopicRoute::from(v1::RouteResponse {
            error: None,
            topic: "t".into(),
            brokers: vec![v1::BrokerRoute {
                name: "b".into(),
                leader_id: Some(leader),
                term,
                queues: 1,
                nodes: (1..=3)
                    .map(|i| v1::RouteNode {
                        node_id: i,
                        address: format!("h:{i}"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
        })
    }

    #[test]
    fn hints_win_over_routes_of_the_same_term() {
        let r = router();
        r.merge_route(&route(5, 1));
        assert_eq!(r.leader("b"), Some((1, "h:1".into())));
        r.note_leader(
            "b",
            &v1::NodeRef {
                node_id: 2,
                address: "h:2".into(),
            },
        );
        r.merge_route(&route(5, 1));
        assert_eq!(r.leader("b"), Some((2, "h:2".into())));
        r.merge_route(&route(6, 3));
        assert_eq!(r.leader("b"), Some((3, "h:3".into())));
        r.forget_leader("b", "h:3");
        assert_eq!(r.leader("b"), None);
        let mut avoid = HashSet::new();
        avoid.insert("h:1".to_string());
        avoid.insert("h:2".to_string());
        assert_eq!(r.pick("b", &avoid), Some("h:3".into()));
        avoid.insert("h:3".to_string());
        assert_eq!(r.pick("b", &avoid), None);
    }

    #[test]
    fn suspect_nodes_are_picked_last() {
        let r = router();
        r.merge_route(&route(5, 1));
        let none = HashSet::new();
        r.suspect("h:1");
        // The believed leader is suspect: another node is asked.
        let p = r.pick("b", &none).expect("a node");
        assert_ne!(p, "h:1");
        r.suspect("h:2");
        assert_eq!(r.pick("b", &none), Some("h:3".into()));
        let mut avoid = HashSet::new();
        avoid.insert("h:3".to_string());
        // The only nodes left are suspect while another is not: none until a pause.
        assert_eq!(r.pick("b", &avoid), None);
        r.suspect("h:3");
        // Every node suspect (all restarting): they are tried anyway.
        assert!(r.pick("b", &avoid).is_some());
        // An answer clears the suspicion.
        r.note_success("b", "h:1");
        assert_eq!(r.pick("b", &none), Some("h:1".into()));
    }

    fn node(id: u64) -> v1::NodeRef {
        v1::NodeRef {
            node_id: id,
            address: format!("h:{id}"),
        }
    }

    fn not_leader(hint: Option<u64>, suspect: bool) -> Failure {
        Failure::Code {
            code: ErrorCode::NotLeader,
            hint: hint.map(|id| Hint {
                leader: node(id),
                suspect,
            }),
        }
    }

    /// (suspect, forget_leader, avoid, longer_attempts)
    fn marks(d: &Decision) -> (bool, bool, bool, bool) {
        (d.suspect, d.forget_leader, d.avoid, d.longer_attempts)
    }

    /// A first failure (no hint hops yet) of a request to `h:1` sets `want` marks and decides
    /// `next`.
    #[track_caller]
    fn expect_decision(failure: &Failure, want: (bool, bool, bool, bool), next: Next) {
        let d = after_failure(failure, "h:1", 0);
        assert_eq!(marks(&d), want, "marks after {failure:?}");
        assert_eq!(d.next, next, "next after {failure:?}");
    }

    #[test]
    fn r1_no_answer_avoids_the_node_everywhere_and_lengthens_attempts() {
        expect_decision(
            &Failure::NoAnswer,
            (true, true, true, true),
            Next::AnotherNode,
        );
    }

    #[test]
    fn r2_an_unreachable_node_is_suspect_a_failed_request_only_avoided() {
        expect_decision(
            &Failure::Transport { unreachable: true },
            (true, true, true, false),
            Next::AnotherNodeOrBackoff,
        );
        expect_decision(
            &Failure::Transport { unreachable: false },
            (false, true, true, false),
            Next::AnotherNodeOrBackoff,
        );
    }

    #[test]
    fn r3_a_hint_is_followed_at_once() {
        expect_decision(
            &not_leader(Some(2), false),
            (false, false, false, false),
            Next::Hinted {
                leader: node(2),
                backoff_first: false,
            },
        );
    }

    #[test]
    fn r4_hints_bouncing_between_nodes_back_off_after_three() {
        for (hops, backoff_first) in [(0, false), (2, false), (3, true), (10, true)] {
            let d = after_failure(&not_leader(Some(2), false), "h:1", hops);
            assert_eq!(
                d.next,
                Next::Hinted {
                    leader: node(2),
                    backoff_first
                },
                "hops {hops}"
            );
        }
    }

    #[test]
    fn r5_a_hint_to_a_suspect_leader_is_not_followed() {
        expect_decision(
            &not_leader(Some(2), true),
            (false, false, true, false),
            Next::AnotherNode,
        );
    }

    #[test]
    fn r6_no_leader_known_backs_off_and_avoids_the_node() {
        for f in [not_leader(None, false), not_leader(Some(1), false)] {
            // No hint, or the node names itself: an election is running.
            expect_decision(&f, (false, true, true, false), Next::Backoff);
        }
    }

    #[test]
    fn r7_unavailable_backs_off_and_moves_on_busy_stays() {
        let unavailable = Failure::Code {
            code: ErrorCode::Unavailable,
            hint: None,
        };
        expect_decision(&unavailable, (false, true, true, false), Next::Backoff);
        let busy = Failure::Code {
            code: ErrorCode::Busy,
            hint: None,
        };
        expect_decision(&busy, (false, false, false, false), Next::Backoff);
    }

    #[test]
    fn r8_every_node_tried_refreshes_and_backs_off() {
        let d = after_failure(&Failure::NoNodeLeft, "", 5);
        assert_eq!(marks(&d), (false, false, false, false));
        assert_eq!(d.next, Next::RefreshAndBackoff);
    }

    #[test]
    fn r9_backoff_is_jittered_doubles_and_stops_at_the_deadline() {
        let max = Duration::from_millis(200);
        let now = Instant::now();
        let far = now + Duration::from_secs(10);
        let (until, next) = backoff_step(Duration::from_millis(10), 0.5, max, now, far);
        assert_eq!(until - now, Duration::from_millis(5));
        assert_eq!(next, Duration::from_millis(20));
        let (_, next) = backoff_step(Duration::from_millis(150), 0.5, max, now, far);
        assert_eq!(next, max);
        let near = now + Duration::from_millis(1);
        let (until, _) = backoff_step(Duration::from_millis(150), 1.0, max, now, near);
        assert_eq!(until, near);
    }

    #[tokio::test(start_paused = true)]
    async fn r10_pauses_end_when_a_leader_is_heard_of() {
        let r = router();
        r.merge_route(&route(5, 1));
        let started = Instant::now();
        let r2 = r.clone();
        let pause = tokio::spawn(async move {
            let mut backoff = Duration::from_secs(10);
            r2.pause(&mut backoff, Instant::now() + Duration::from_secs(10))
                .await;
        });
        // Leaders change until the pause has ended (it hears of changes once it has started).
        // The clock is paused and this task never idles, so no time passes: a pause that did not
        // end on a change would still be waiting out its backoff of at least 5 s.
        let mut next = 2;
        for _ in 0..100 {
            if pause.is_finished() {
                break;
            }
            r.note_leader("b", &node(next));
            next = if next == 2 { 3 } else { 2 };
            tokio::task::yield_now().await;
        }
        assert!(
            pause.is_finished(),
            "the pause did not end on a leader change"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        pause.await.expect("pause");
    }

    #[tokio::test(start_paused = true)]
    async fn r11_without_news_a_pause_lasts_its_jittered_backoff() {
        let r = router();
        let started = Instant::now();
        let mut backoff = Duration::from_secs(10);
        r.pause(&mut backoff, started + Duration::from_secs(60))
            .await;
        let waited = started.elapsed();
        assert!(
            (Duration::from_secs(5)..=Duration::from_secs(10)).contains(&waited),
            "{waited:?}"
        );
        assert_eq!(backoff, RetryPolicy::default().backoff_max);
    }
}
