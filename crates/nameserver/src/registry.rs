//! The registry: which nodes of which broker groups are alive, and which topics they host.
//!
//! This is the pure core of the nameserver. It does no I/O and never reads the clock: every
//! method that depends on time takes `now`, so tests drive time by hand and the service's single
//! clock-owning task decides when to expire.
//!
//! # Contract
//! - [`Registry::register`] takes a *full* registration of one node and replaces everything held
//!   for `(cluster, broker, node_id)`. A refused registration (see [`Registry::register`] for the
//!   rules) changes nothing: routes already held stay as they were.
//! - A node is *live* while `now - last_registration < expiry`. Queries ([`Registry::route`],
//!   [`Registry::cluster_info`]) ignore nodes that are no longer live even before
//!   [`Registry::expire`] has removed them, so answers never depend on when the scan last ran.
//! - **Leader of a group**: among live nodes claiming `role = "leader"`, the one with the highest
//!   term (ties, which Raft forbids and only a misreport can cause, go to the most recent
//!   registration). Every other node claiming to lead is reported as `stale` and with its role
//!   but never as the leader. The group's term is the highest term any live node reports.
//! - **Topics of a group**: when the group has a leader, exactly the topics the leader reports — a
//!   topic is created or deleted through the leader, so its report is the freshest committed view
//!   and a deletion takes effect as soon as the leader re-registers, even while followers still
//!   report the topic. Without a leader (an election is running), the union of what the live
//!   nodes report, the queue count taken from the node with the highest term.
//! - **Send limits of a group** (carried in each route, so clients check against the group they
//!   send to): the leader's report, since the leader checks sends; without a leader, or when the
//!   leader reported none, the strictest of the live nodes' reports, field by field (any of them
//!   may be the next leader). A field reported as 0 is unknown and takes no part; no report at all
//!   leaves the route's limits unset.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use raftmq_proto::v1::{
    BrokerInfo, BrokerRoute, ClusterInfo, NodeInfo, RegisterRequest, RouteNode, SendLimits,
    TopicQueues,
};

use crate::error::Error;

/// How long a node stays registered without refreshing, unless configured otherwise.
pub const EXPIRY_DEFAULT: Duration = Duration::from_secs(120);
/// Longest topic, cluster or broker name (the contract's, re-exported).
pub use raftmq_proto::limits::NAME_LEN_MAX;
/// Most queues a topic may have on one broker group (the contract's, re-exported).
pub use raftmq_proto::limits::QUEUES_PER_TOPIC_MAX;
/// Whether a name may hold a character (the contract's rule, re-exported).
pub use raftmq_proto::limits::is_name_char;
/// Most topics one registration may report (a bound on the memory one request can claim).
pub const TOPICS_PER_REGISTRATION_MAX: usize = 100_000;
/// Longest host part of an address (the DNS limit).
pub const HOST_LEN_MAX: usize = 253;

/// A node's Raft role, as it reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Takes writes for its group.
    Leader,
    /// Replicates and votes.
    Follower,
    /// Asking for votes.
    Candidate,
    /// Replicates without voting.
    Learner,
}

impl Role {
    /// Every role, in the order of [`Role::as_str`] names.
    pub const ALL: [Role; 4] = [Role::Leader, Role::Follower, Role::Candidate, Role::Learner];

    /// Parses the wire name (`leader`, `follower`, `candidate`, `learner`).
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a successful registration changed, for logging and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The node's role before this registration, `None` when it was not registered (or expired).
    pub previous_role: Option<Role>,
    /// The role it registered with.
    pub role: Role,
}

/// A node removed by [`Registry::expire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredNode {
    /// Its cluster.
    pub cluster: String,
    /// Its broker group.
    pub broker: String,
    /// Its id in the group.
    pub node_id: u64,
    /// The address it registered.
    pub address: String,
    /// How long it had been silent.
    pub silent_for: Duration,
}

/// What is held for one node: its last full registration.
#[derive(Debug, Clone)]
struct Node {
    address: String,
    role: Role,
    term: u64,
    leader_id: Option<u64>,
    last_log_index: u64,
    committed: u64,
    applied: u64,
    topics: BTreeMap<String, u32>,
    /// The send limits it reported, if any.
    limits: Option<SendLimits>,
    last_seen: Instant,
}

/// Key of a broker group: (cluster, broker).
type GroupKey = (String, String);

/// The nodes of one broker group, by id.
#[derive(Debug, Clone, Default)]
struct Group {
    nodes: BTreeMap<u64, Node>,
}

/// A group as queries see it at one instant: live nodes only, leader and topics decided.
struct GroupView<'a> {
    live: Vec<(u64, &'a Node)>,
    leader: Option<u64>,
    term: u64,
    stale: BTreeSet<u64>,
    topics: BTreeMap<&'a str, u32>,
    limits: Option<SendLimits>,
}

/// The in-memory registry of broker nodes and topic routes.
#[derive(Debug, Clone)]
pub struct Registry {
    expiry: Duration,
    groups: BTreeMap<GroupKey, Group>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new(EXPIRY_DEFAULT)
    }
}

impl Registry {
    /// An empty registry whose nodes expire after `expiry` without a registration.
    pub fn new(expiry: Duration) -> Self {
        Registry {
            expiry,
            groups: BTreeMap::new(),
        }
    }

    /// How long a registration stays valid without a refresh.
    pub fn expiry(&self) -> Duration {
        self.expiry
    }

    /// Number of nodes held (including any silent ones the next scan will remove).
    pub fn node_count(&self) -> usize {
        self.groups.values().map(|g| g.nodes.len()).sum()
    }

    /// Number of broker groups held.
    pub fn broker_count(&self) -> usize {
        self.groups.len()
    }

    /// Records a full registration of one node at `now`, replacing what was held for
    /// `(cluster, broker, node_id)`.
    ///
    /// Refused with [`Error::InvalidArgument`] naming the field, and without changing anything,
    /// when: `cluster` or `broker` is missing or not a valid name; `node_id` is 0; `address` is
    /// empty or not `host:port`; `role` is not one of leader, follower, candidate, learner; a topic
    /// name is invalid, repeated, or has 0 or more than [`QUEUES_PER_TOPIC_MAX`] queues; or the
    /// node id is held, in the same group and not yet expired, by a *different* address (two
    /// processes configured with one id — the second must not hijack the first's route).
    pub fn register(&mut self, req: &RegisterRequest, now: Instant) -> Result<Registered, Error> {
        check_name("cluster", &req.cluster)?;
        check_name("broker", &req.broker)?;
        if req.node_id == 0 {
            return Err(Error::invalid(
                "node_id",
                "must be a positive integer, got 0",
            ));
        }
        check_address(&req.address).map_err(|reason| Error::invalid("address", reason))?;
        let role = Role::parse(&req.role).ok_or_else(|| {
            Error::invalid(
                "role",
                format!(
                    "unknown role {:?}; expected leader, follower, candidate or learner",
                    req.role
                ),
            )
        })?;
        let topics = check_topics(&req.topics)?;

        let key = (req.cluster.clone(), req.broker.clone());
        let existing = self
            .groups
            .get(&key)
            .and_then(|g| g.nodes.get(&req.node_id));
        let previous_role = match existing {
            Some(old) if self.is_live(old, now) => {
                if old.address != req.address {
                    return Err(Error::invalid(
                        "node_id",
                        format!(
                            "node {} of {}/{} is already registered from address {} (last seen {} ms ago), \
                             not {}; give each node its own id, or unregister the old one (or wait {} s for it to expire)",
                            req.node_id,
                            req.cluster,
                            req.broker,
                            old.address,
                            now.saturating_duration_since(old.last_seen).as_millis(),
                            req.address,
                            self.expiry.as_secs()
                        ),
                    ));
                }
                Some(old.role)
            }
            _ => None,
        };

        let node = Node {
            address: req.address.clone(),
            role,
            term: req.term,
            leader_id: req.leader_id.filter(|&id| id != 0),
            last_log_index: req.last_log_index,
            committed: req.committed,
            applied: req.applied,
            topics,
            limits: req.limits,
            last_seen: now,
        };
        self.groups
            .entry(key)
            .or_default()
            .nodes
            .insert(req.node_id, node);
        Ok(Registered {
            previous_role,
            role,
        })
    }

    /// Forgets one node. Returns whether it was held; unregistering an unknown node is not an
    /// error, so a node shutting down may unregister from every nameserver without checking.
    pub fn unregister(&mut self, cluster: &str, broker: &str, node_id: u64) -> Result<bool, Error> {
        check_name("cluster", cluster)?;
        check_name("broker", broker)?;
        if node_id == 0 {
            return Err(Error::invalid(
                "node_id",
                "must be a positive integer, got 0",
            ));
        }
        let key = (cluster.to_owned(), broker.to_owned());
        let Some(group) = self.groups.get_mut(&key) else {
            return Ok(false);
        };
        let removed = group.nodes.remove(&node_id).is_some();
        if group.nodes.is_empty() {
            self.groups.remove(&key);
        }
        Ok(removed)
    }

    /// Removes every node silent for at least `expiry` at `now`, and groups left empty.
    pub fn expire(&mut self, now: Instant) -> Vec<ExpiredNode> {
        let expiry = self.expiry;
        let mut expired = Vec::new();
        self.groups.retain(|(cluster, broker), group| {
            group.nodes.retain(|&node_id, node| {
                let silent_for = now.saturating_duration_since(node.last_seen);
                if silent_for < expiry {
                    return true;
                }
                expired.push(ExpiredNode {
                    cluster: cluster.clone(),
                    broker: broker.clone(),
                    node_id,
                    address: node.address.clone(),
                    silent_for,
                });
                false
            });
            !group.nodes.is_empty()
        });
        expired
    }

    /// Every broker group with a live node hosting `topic`: its queue count, nodes and leader,
    /// ordered by (cluster, broker).
    ///
    /// [`Error::InvalidArgument`] for an invalid topic name, [`Error::TopicNotFound`] when no live
    /// group hosts it.
    pub fn route(&self, topic: &str, now: Instant) -> Result<Vec<BrokerRoute>, Error> {
        check_name("topic", topic)?;
        let mut routes = Vec::new();
        for ((cluster, broker), group) in &self.groups {
            let Some(view) = self.view(group, now) else {
                continue;
            };
            let Some(&queues) = view.topics.get(topic) else {
                continue;
            };
            routes.push(BrokerRoute {
                cluster: cluster.clone(),
                name: broker.clone(),
                leader_id: view.leader,
                queues,
                term: view.term,
                limits: view.limits,
                nodes: view
                    .live
                    .iter()
                    .map(|&(id, n)| RouteNode {
                        node_id: id,
                        address: n.address.clone(),
                        role: n.role.as_str().to_owned(),
                        term: n.term,
                        stale: view.stale.contains(&id),
                    })
                    .collect(),
            });
        }
        if routes.is_empty() {
            return Err(Error::TopicNotFound {
                topic: topic.to_owned(),
            });
        }
        Ok(routes)
    }

    /// Every cluster, broker group and live node, ordered by name and id, with each node's role,
    /// term, indexes and the age of its last registration.
    pub fn cluster_info(&self, now: Instant) -> Vec<ClusterInfo> {
        let mut clusters: Vec<ClusterInfo> = Vec::new();
        for ((cluster, broker), group) in &self.groups {
            let Some(view) = self.view(group, now) else {
                continue;
            };
            let info = BrokerInfo {
                name: broker.clone(),
                leader_id: view.leader,
                term: view.term,
                nodes: view
                    .live
                    .iter()
                    .map(|&(id, n)| NodeInfo {
                        node_id: id,
                        address: n.address.clone(),
                        role: n.role.as_str().to_owned(),
                        term: n.term,
                        leader_id: n.leader_id,
                        last_log_index: n.last_log_index,
                        committed: n.committed,
                        applied: n.applied,
                        last_registration_age_ms: duration_ms(
                            now.saturating_duration_since(n.last_seen),
                        ),
                        stale: view.stale.contains(&id),
                    })
                    .collect(),
                topics: view
                    .topics
                    .iter()
                    .map(|(&t, &q)| TopicQueues {
                        topic: t.to_owned(),
                        queues: q,
                    })
                    .collect(),
            };
            // Groups iterate in (cluster, broker) order, so one cluster's groups are adjacent.
            match clusters.last_mut() {
                Some(c) if c.name == *cluster => c.brokers.push(info),
                _ => clusters.push(ClusterInfo {
                    name: cluster.clone(),
                    brokers: vec![info],
                }),
            }
        }
        clusters
    }

    fn is_live(&self, node: &Node, now: Instant) -> bool {
        now.saturating_duration_since(node.last_seen) < self.expiry
    }

    /// The group as seen at `now`; `None` when none of its nodes is live.
    fn view<'a>(&self, group: &'a Group, now: Instant) -> Option<GroupView<'a>> {
        let live: Vec<(u64, &Node)> = group
            .nodes
            .iter()
            .filter(|(_, n)| self.is_live(n, now))
            .map(|(&id, n)| (id, n))
            .collect();
        if live.is_empty() {
            return None;
        }
        let term = live.iter().map(|(_, n)| n.term).max().unwrap_or(0);
        let leader = live
            .iter()
            .filter(|(_, n)| n.role == Role::Leader)
            .max_by_key(|&&(id, n)| (n.term, n.last_seen, id))
            .map(|&(id, _)| id);
        let stale: BTreeSet<u64> = live
            .iter()
            .filter(|&&(id, n)| n.role == Role::Leader && Some(id) != leader)
            .map(|&(id, _)| id)
            .collect();
        let mut topics: BTreeMap<&str, u32> = BTreeMap::new();
        match leader.and_then(|id| live.iter().find(|(i, _)| *i == id)) {
            Some((_, l)) => topics.extend(l.topics.iter().map(|(t, &q)| (t.as_str(), q))),
            None => {
                // Ascending (term, last_seen): later inserts win, so the freshest report decides
                // the queue count of a topic several nodes report.
                let mut by_freshness: Vec<&Node> = live.iter().map(|&(_, n)| n).collect();
                by_freshness.sort_by_key(|n| (n.term, n.last_seen));
                for n in by_freshness {
                    topics.extend(n.topics.iter().map(|(t, &q)| (t.as_str(), q)));
                }
            }
        }
        let leader_limits = leader
            .and_then(|id| live.iter().find(|(i, _)| *i == id))
            .and_then(|(_, l)| l.limits);
        let limits = leader_limits.or_else(|| strictest(live.iter().filter_map(|(_, n)| n.limits)));
        Some(GroupView {
            live,
            leader,
            term,
            stale,
            limits,
            topics,
        })
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The field-by-field minimum of several nodes' limits, a 0 (unknown) field taking no part;
/// `None` for no report.
fn strictest(reports: impl Iterator<Item = SendLimits>) -> Option<SendLimits> {
    fn min_known(a: u64, b: u64) -> u64 {
        match (a, b) {
            (0, x) | (x, 0) => x,
            (a, b) => a.min(b),
        }
    }
    reports.reduce(|a, b| SendLimits {
        body_bytes_max: min_known(a.body_bytes_max, b.body_bytes_max),
        properties_bytes_max: min_known(a.properties_bytes_max, b.properties_bytes_max),
        batch_messages_max: min_known(a.batch_messages_max, b.batch_messages_max),
        batch_bytes_max: min_known(a.batch_bytes_max, b.batch_bytes_max),
    })
}

/// Checks a topic, cluster or broker name against the contract's rule
/// `^[A-Za-z0-9_%|-]{1,127}$` ([`raftmq_proto::limits::check_name`]), naming `field` in the error.
pub fn check_name(field: &str, name: &str) -> Result<(), Error> {
    raftmq_proto::limits::check_name(field, name)
        .map_err(|e| Error::invalid(field, e.problem.reason()))
}

/// Checks that `address` is `host:port` with a non-zero port: an IPv4 or bracketed IPv6 socket
/// address, or a DNS name. Returns the reason when it is not.
pub fn check_address(address: &str) -> Result<(), String> {
    if address.is_empty() {
        return Err("is missing (empty); expected host:port".to_owned());
    }
    if let Ok(sa) = address.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err(format!(
                "{address:?} has port 0; expected the port the node serves on"
            ));
        }
        return Ok(());
    }
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("{address:?} has no port; expected host:port"));
    };
    match port.parse::<u16>() {
        Ok(0) => {
            return Err(format!(
                "{address:?} has port 0; expected the port the node serves on"
            ));
        }
        Ok(_) => {}
        Err(_) => {
            return Err(format!(
                "{address:?} has an invalid port {port:?}; expected 1-65535"
            ));
        }
    }
    let host_ok = !host.is_empty()
        && host.len() <= HOST_LEN_MAX
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && !host.starts_with(['.', '-'])
        && !host.ends_with('-');
    if !host_ok {
        return Err(format!(
            "{address:?} has an invalid host {host:?}; expected a DNS name, an IPv4 address or [IPv6]"
        ));
    }
    Ok(())
}

fn check_topics(topics: &[TopicQueues]) -> Result<BTreeMap<String, u32>, Error> {
    if topics.len() > TOPICS_PER_REGISTRATION_MAX {
        return Err(Error::invalid(
            "topics",
            format!(
                "{} topics reported; at most {TOPICS_PER_REGISTRATION_MAX}",
                topics.len()
            ),
        ));
    }
    let mut out = BTreeMap::new();
    for (i, t) in topics.iter().enumerate() {
        check_name(&format!("topics[{i}].topic"), &t.topic)?;
        if t.queues == 0 || t.queues > QUEUES_PER_TOPIC_MAX {
            return Err(Error::invalid(
                format!("topics[{i}].queues"),
                format!(
                    "topic {:?} has {} queues; expected 1 to {QUEUES_PER_TOPIC_MAX}",
                    t.topic, t.queues
                ),
            ));
        }
        if out.insert(t.topic.clone(), t.queues).is_some() {
            return Err(Error::invalid(
                format!("topics[{i}].topic"),
                format!("topic {:?} is reported twice", t.topic),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use raftmq_proto::v1::ErrorCode;

    const EXPIRY: Duration = Duration::from_secs(120);

    /// A change that makes a good registration bad.
    type Mutation = Box<dyn Fn(&mut RegisterRequest)>;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn reg(
        broker: &str,
        id: u64,
        role: &str,
        term: u64,
        topics: &[(&str, u32)],
    ) -> RegisterRequest {
        RegisterRequest {
            cluster: "DefaultCluster".into(),
            broker: broker.into(),
            node_id: id,
            address: format!("10.0.0.{id}:10911"),
            role: role.into(),
            term,
            leader_id: None,
            last_log_index: 10 * id,
            committed: 9 * id,
            applied: 8 * id,
            topics: topics
                .iter()
                .map(|&(t, q)| TopicQueues {
                    topic: t.into(),
                    queues: q,
                })
                .collect(),
            limits: None,
        }
    }

    /// A three-node group `broker` with node 1 leading at `term` and hosting `topics`.
    fn group(r: &mut Registry, broker: &str, term: u64, topics: &[(&str, u32)], now: Instant) {
        r.register(&reg(broker, 1, "leader", term, topics), now)
            .unwrap();
        r.register(&reg(broker, 2, "follower", term, topics), now)
            .unwrap();
        r.register(&reg(broker, 3, "follower", term, topics), now)
            .unwrap();
    }

    fn invalid_field(e: Error) -> String {
        assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
        match e {
            Error::InvalidArgument { field, .. } => field,
            other => panic!("expected InvalidArgument, got {other}"),
        }
    }

    #[test]
    fn t10_register_and_route() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 3, &[("orders", 8)], t0);
        let routes = r.route("orders", t0).unwrap();
        assert_eq!(routes.len(), 1);
        let b = &routes[0];
        assert_eq!(
            (b.cluster.as_str(), b.name.as_str()),
            ("DefaultCluster", "broker-a")
        );
        assert_eq!(b.leader_id, Some(1));
        assert_eq!(b.queues, 8);
        assert_eq!(b.term, 3);
        let nodes: Vec<_> = b
            .nodes
            .iter()
            .map(|n| (n.node_id, n.role.as_str(), n.stale))
            .collect();
        assert_eq!(
            nodes,
            [
                (1, "leader", false),
                (2, "follower", false),
                (3, "follower", false)
            ]
        );
        assert_eq!(b.nodes[1].address, "10.0.0.2:10911");
        assert_eq!((r.node_count(), r.broker_count()), (3, 1));
    }

    #[test]
    fn t11_route_spans_broker_groups_hosting_the_topic() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8), ("logs", 2)], t0);
        group(&mut r, "broker-b", 1, &[("orders", 4)], t0);
        let routes = r.route("orders", t0).unwrap();
        let got: Vec<_> = routes.iter().map(|b| (b.name.as_str(), b.queues)).collect();
        assert_eq!(got, [("broker-a", 8), ("broker-b", 4)]);
        let logs = r.route("logs", t0).unwrap();
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].name, "broker-a");
    }

    #[test]
    fn t12_unknown_topic_and_invalid_topic_name() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        assert_eq!(
            r.route("missing", t0).unwrap_err().code(),
            ErrorCode::TopicNotFound
        );
        assert_eq!(invalid_field(r.route("", t0).unwrap_err()), "topic");
        assert_eq!(
            invalid_field(r.route("bad topic", t0).unwrap_err()),
            "topic"
        );
        assert_eq!(
            invalid_field(r.route(&"x".repeat(128), t0).unwrap_err()),
            "topic"
        );
        assert!(
            r.route(&"x".repeat(127), t0)
                .is_err_and(|e| e.code() == ErrorCode::TopicNotFound)
        );
    }

    #[test]
    fn t20_expiry_removes_silent_nodes() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        // Nodes 1 and 2 refresh at t0+60s; node 3 stays silent.
        r.register(
            &reg("broker-a", 1, "leader", 1, &[("orders", 8)]),
            t0 + secs(60),
        )
        .unwrap();
        r.register(
            &reg("broker-a", 2, "follower", 1, &[("orders", 8)]),
            t0 + secs(60),
        )
        .unwrap();

        // Just before the deadline node 3 is still live.
        let before = t0 + EXPIRY - Duration::from_millis(1);
        assert!(r.expire(before).is_empty());
        assert_eq!(r.route("orders", before).unwrap()[0].nodes.len(), 3);

        // At the deadline it is hidden from queries even before a scan...
        let at = t0 + EXPIRY;
        assert_eq!(r.route("orders", at).unwrap()[0].nodes.len(), 2);
        assert_eq!(r.node_count(), 3);
        // ...and the scan removes it.
        let expired = r.expire(at);
        assert_eq!(expired.len(), 1);
        assert_eq!((expired[0].node_id, expired[0].silent_for), (3, EXPIRY));
        assert_eq!(r.node_count(), 2);

        // When everyone is silent the group and its topics are gone.
        let later = t0 + secs(60) + EXPIRY;
        assert_eq!(
            r.route("orders", later).unwrap_err().code(),
            ErrorCode::TopicNotFound
        );
        assert!(r.cluster_info(later).is_empty());
        assert_eq!(r.expire(later).len(), 2);
        assert_eq!((r.node_count(), r.broker_count()), (0, 0));
    }

    #[test]
    fn t21_configurable_expiry() {
        let t0 = Instant::now();
        let mut r = Registry::new(secs(5));
        assert_eq!(r.expiry(), secs(5));
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        assert!(r.expire(t0 + secs(4)).is_empty());
        assert_eq!(r.expire(t0 + secs(5)).len(), 3);
        assert_eq!(Registry::default().expiry(), EXPIRY_DEFAULT);
    }

    #[test]
    fn t22_reregistration_replaces_everything_and_refreshes() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        let mut again = reg("broker-a", 2, "follower", 1, &[("orders", 8)]);
        again.last_log_index = 500;
        again.committed = 490;
        again.applied = 480;
        again.leader_id = Some(1);
        let out = r.register(&again, t0 + secs(100)).unwrap();
        assert_eq!(
            out,
            Registered {
                previous_role: Some(Role::Follower),
                role: Role::Follower
            }
        );

        let now = t0 + secs(130);
        let info = r.cluster_info(now);
        let nodes = &info[0].brokers[0].nodes;
        // Nodes 1 and 3 expired (not yet scanned), node 2 was refreshed.
        assert_eq!(nodes.len(), 1);
        let n = &nodes[0];
        assert_eq!(
            (n.node_id, n.last_log_index, n.committed, n.applied),
            (2, 500, 490, 480)
        );
        assert_eq!(n.leader_id, Some(1));
        assert_eq!(n.last_registration_age_ms, 30_000);
        assert_eq!(r.node_count(), 3, "a re-registration adds no node");
    }

    #[test]
    fn t23_expired_node_id_may_come_back_with_another_address() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        r.register(&reg("broker-a", 1, "leader", 1, &[("orders", 8)]), t0)
            .unwrap();
        let mut moved = reg("broker-a", 1, "leader", 2, &[("orders", 8)]);
        moved.address = "node1.example:10911".into();
        // Still live: refused.
        assert_eq!(
            invalid_field(r.register(&moved, t0 + secs(10)).unwrap_err()),
            "node_id"
        );
        // After expiry (even before a scan) the id is free again.
        let out = r.register(&moved, t0 + EXPIRY).unwrap();
        assert_eq!(out.previous_role, None);
        assert_eq!(
            r.route("orders", t0 + EXPIRY).unwrap()[0].nodes[0].address,
            "node1.example:10911"
        );
    }

    #[test]
    fn t30_leader_change_by_term() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        // Node 2 wins the election at term 2 and registers at once; node 1 has not re-registered.
        let t1 = t0 + secs(1);
        r.register(&reg("broker-a", 2, "leader", 2, &[("orders", 8)]), t1)
            .unwrap();
        let b = &r.route("orders", t1).unwrap()[0];
        assert_eq!((b.leader_id, b.term), (Some(2), 2));
        let n1 = &b.nodes[0];
        assert_eq!(
            (n1.node_id, n1.role.as_str(), n1.stale),
            (1, "leader", true)
        );
        assert!(!b.nodes[1].stale);

        // The old leader learns of the new term and registers as follower: nothing is stale.
        let t2 = t0 + secs(2);
        r.register(&reg("broker-a", 1, "follower", 2, &[("orders", 8)]), t2)
            .unwrap();
        let b = &r.route("orders", t2).unwrap()[0];
        assert_eq!(b.leader_id, Some(2));
        assert!(b.nodes.iter().all(|n| !n.stale));
        let roles: Vec<_> = b.nodes.iter().map(|n| n.role.as_str()).collect();
        assert_eq!(roles, ["follower", "leader", "follower"]);
    }

    #[test]
    fn t31_two_conflicting_leaders_higher_term_wins_regardless_of_order() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        // The newer leader (term 5) registers *before* the deposed one (term 4) refreshes.
        r.register(&reg("broker-a", 3, "leader", 5, &[("orders", 8)]), t0)
            .unwrap();
        r.register(
            &reg("broker-a", 1, "leader", 4, &[("orders", 8)]),
            t0 + secs(1),
        )
        .unwrap();
        let now = t0 + secs(1);
        let b = &r.route("orders", now).unwrap()[0];
        assert_eq!((b.leader_id, b.term), (Some(3), 5));
        let stale: Vec<_> = b
            .nodes
            .iter()
            .filter(|n| n.stale)
            .map(|n| n.node_id)
            .collect();
        assert_eq!(stale, [1]);
        let info = &r.cluster_info(now)[0].brokers[0];
        assert_eq!(info.leader_id, Some(3));
        assert!(info.nodes.iter().find(|n| n.node_id == 1).unwrap().stale);

        // If the winner expires, the remaining claimant leads again (nobody better is known).
        let later = t0 + EXPIRY;
        let b = &r.route("orders", later).unwrap()[0];
        assert_eq!(
            (b.leader_id, b.nodes.len(), b.nodes[0].stale),
            (Some(1), 1, false)
        );
    }

    #[test]
    fn t32_same_term_leaders_most_recent_wins() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        r.register(
            &reg("broker-a", 2, "leader", 7, &[("orders", 8)]),
            t0 + secs(1),
        )
        .unwrap();
        r.register(&reg("broker-a", 1, "leader", 7, &[("orders", 8)]), t0)
            .unwrap();
        let b = &r.route("orders", t0 + secs(1)).unwrap()[0];
        assert_eq!(b.leader_id, Some(2));
        assert_eq!(b.nodes.iter().filter(|n| n.stale).count(), 1);
    }

    #[test]
    fn t33_no_leader_during_election() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        r.register(&reg("broker-a", 1, "candidate", 9, &[("orders", 8)]), t0)
            .unwrap();
        r.register(&reg("broker-a", 2, "follower", 8, &[("orders", 8)]), t0)
            .unwrap();
        let b = &r.route("orders", t0).unwrap()[0];
        assert_eq!((b.leader_id, b.term), (None, 9));
        assert!(b.nodes.iter().all(|n| !n.stale));
    }

    #[test]
    fn t40_topic_added_and_removed() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        assert_eq!(
            r.route("payments", t0).unwrap_err().code(),
            ErrorCode::TopicNotFound
        );

        // The leader reports the new topic first: it is routable at once.
        let t1 = t0 + secs(1);
        r.register(
            &reg(
                "broker-a",
                1,
                "leader",
                1,
                &[("orders", 8), ("payments", 4)],
            ),
            t1,
        )
        .unwrap();
        assert_eq!(r.route("payments", t1).unwrap()[0].queues, 4);

        // The leader reports it deleted: gone, although followers still report it.
        let t2 = t0 + secs(2);
        r.register(
            &reg(
                "broker-a",
                2,
                "follower",
                1,
                &[("orders", 8), ("payments", 4)],
            ),
            t2,
        )
        .unwrap();
        r.register(&reg("broker-a", 1, "leader", 1, &[("orders", 8)]), t2)
            .unwrap();
        assert_eq!(
            r.route("payments", t2).unwrap_err().code(),
            ErrorCode::TopicNotFound
        );
        let topics: Vec<_> = r.cluster_info(t2)[0].brokers[0]
            .topics
            .iter()
            .map(|t| t.topic.clone())
            .collect();
        assert_eq!(topics, ["orders"]);

        // A queue-count change reported by the leader wins over the followers' older count.
        r.register(&reg("broker-a", 1, "leader", 1, &[("orders", 16)]), t2)
            .unwrap();
        assert_eq!(r.route("orders", t2).unwrap()[0].queues, 16);
    }

    #[test]
    fn t41_without_leader_topics_are_the_union_of_live_reports() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        r.register(
            &reg("broker-a", 1, "follower", 2, &[("a", 1), ("b", 2)]),
            t0,
        )
        .unwrap();
        r.register(
            &reg("broker-a", 2, "candidate", 3, &[("b", 3), ("c", 4)]),
            t0,
        )
        .unwrap();
        let info = &r.cluster_info(t0)[0].brokers[0];
        let topics: Vec<_> = info
            .topics
            .iter()
            .map(|t| (t.topic.as_str(), t.queues))
            .collect();
        // "b" takes the count of the higher-term node.
        assert_eq!(topics, [("a", 1), ("b", 3), ("c", 4)]);
        assert_eq!(r.route("a", t0).unwrap()[0].leader_id, None);

        // A silent node's topics drop out of the union.
        r.register(
            &reg("broker-a", 2, "candidate", 3, &[("b", 3), ("c", 4)]),
            t0 + secs(100),
        )
        .unwrap();
        assert_eq!(
            r.route("a", t0 + EXPIRY).unwrap_err().code(),
            ErrorCode::TopicNotFound
        );
    }

    #[test]
    fn t50_node_moving_between_roles() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        let mut t = t0;
        let steps = [
            ("learner", 1),
            ("follower", 1),
            ("candidate", 2),
            ("leader", 2),
            ("follower", 3),
        ];
        let mut previous = None;
        for (role, term) in steps {
            t += secs(1);
            let out = r
                .register(&reg("broker-a", 4, role, term, &[("orders", 8)]), t)
                .unwrap();
            assert_eq!(out.previous_role, previous);
            assert_eq!(out.role.as_str(), role);
            previous = Some(out.role);
            let b = &r.route("orders", t).unwrap()[0];
            assert_eq!(b.nodes[0].role, role);
            assert_eq!(b.leader_id, (role == "leader").then_some(4));
        }
        assert_eq!(r.node_count(), 1);
    }

    #[test]
    fn t60_bad_registrations_are_refused_without_disturbing_routes() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        let before = r.route("orders", t0).unwrap();
        let info_before = r.cluster_info(t0);

        let good = || reg("broker-a", 1, "leader", 9, &[("other", 1)]);
        let cases: Vec<(&str, Mutation)> = vec![
            ("cluster", Box::new(|q| q.cluster.clear())),
            ("cluster", Box::new(|q| q.cluster = "has space".into())),
            ("broker", Box::new(|q| q.broker.clear())),
            ("node_id", Box::new(|q| q.node_id = 0)),
            ("address", Box::new(|q| q.address.clear())),
            ("address", Box::new(|q| q.address = "10.0.0.1".into())),
            (
                "address",
                Box::new(|q| q.address = "10.0.0.1:notaport".into()),
            ),
            ("address", Box::new(|q| q.address = "10.0.0.1:0".into())),
            ("address", Box::new(|q| q.address = "10.0.0.1:70000".into())),
            ("address", Box::new(|q| q.address = ":10911".into())),
            ("address", Box::new(|q| q.address = "bad host:10911".into())),
            ("address", Box::new(|q| q.address = "::1:10911".into())),
            ("role", Box::new(|q| q.role = "master".into())),
            ("role", Box::new(|q| q.role.clear())),
            (
                "topics[0].topic",
                Box::new(|q| q.topics[0].topic = "no/slash".into()),
            ),
            ("topics[0].queues", Box::new(|q| q.topics[0].queues = 0)),
            (
                "topics[0].queues",
                Box::new(|q| q.topics[0].queues = QUEUES_PER_TOPIC_MAX + 1),
            ),
            (
                "topics[1].topic",
                Box::new(|q| {
                    q.topics.push(TopicQueues {
                        topic: "other".into(),
                        queues: 2,
                    })
                }),
            ),
            // Node 1 is live at 10.0.0.1:10911: another process may not take its id.
            (
                "node_id",
                Box::new(|q| q.address = "10.0.0.99:10911".into()),
            ),
        ];
        for (field, mutate) in &cases {
            let mut q = good();
            mutate(&mut q);
            let err = r.register(&q, t0 + secs(1)).unwrap_err();
            let msg = err.to_string();
            assert_eq!(invalid_field(err), *field, "request {q:?}");
            assert!(msg.contains(field), "message {msg:?} should name {field}");
            assert_eq!(
                r.route("orders", t0).unwrap(),
                before,
                "after refusing {q:?}"
            );
            assert_eq!(r.cluster_info(t0), info_before);
        }
        // A refused registration did not refresh the node either.
        assert_eq!(
            r.route("orders", t0 + EXPIRY).unwrap_err().code(),
            ErrorCode::TopicNotFound
        );
    }

    #[test]
    fn t61_good_addresses() {
        for a in [
            "10.0.0.1:10911",
            "[::1]:9876",
            "node-1.raftmq.svc:10911",
            "localhost:1",
            "broker_a:65535",
        ] {
            assert_eq!(check_address(a), Ok(()), "{a}");
        }
    }

    #[test]
    fn t62_name_rule() {
        for ok in [
            "a",
            "DefaultCluster",
            "broker-a",
            "T_%|-9",
            &"z".repeat(127),
        ] {
            assert!(check_name("topic", ok).is_ok(), "{ok}");
        }
        for bad in ["", "a.b", "a b", "é", "a\n", &"z".repeat(128)] {
            assert!(check_name("topic", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn t70_unregister() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-a", 1, &[("orders", 8)], t0);
        assert!(r.unregister("DefaultCluster", "broker-a", 1).unwrap());
        assert!(!r.unregister("DefaultCluster", "broker-a", 1).unwrap());
        assert!(!r.unregister("Nope", "broker-a", 1).unwrap());
        assert_eq!(
            invalid_field(r.unregister("DefaultCluster", "broker-a", 0).unwrap_err()),
            "node_id"
        );
        assert_eq!(
            invalid_field(r.unregister("", "broker-a", 1).unwrap_err()),
            "cluster"
        );
        // Without the leader, the followers' union still routes the topic, leaderless.
        let b = &r.route("orders", t0).unwrap()[0];
        assert_eq!((b.leader_id, b.nodes.len()), (None, 2));
        r.unregister("DefaultCluster", "broker-a", 2).unwrap();
        r.unregister("DefaultCluster", "broker-a", 3).unwrap();
        assert_eq!((r.node_count(), r.broker_count()), (0, 0));
        assert_eq!(
            r.route("orders", t0).unwrap_err().code(),
            ErrorCode::TopicNotFound
        );
    }

    #[test]
    fn t80_cluster_info_groups_by_cluster() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        group(&mut r, "broker-b", 2, &[("orders", 8)], t0);
        group(&mut r, "broker-a", 1, &[], t0);
        let mut other = reg("broker-x", 1, "leader", 1, &[]);
        other.cluster = "Other".into();
        r.register(&other, t0).unwrap();
        let info = r.cluster_info(t0 + Duration::from_millis(1500));
        let shape: Vec<_> = info
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.brokers
                        .iter()
                        .map(|b| b.name.as_str())
                        .collect::<Vec<_>>(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            [
                ("DefaultCluster", vec!["broker-a", "broker-b"]),
                ("Other", vec!["broker-x"])
            ]
        );
        let b = &info[0].brokers[1];
        assert_eq!((b.leader_id, b.term), (Some(1), 2));
        assert_eq!(
            b.topics,
            [TopicQueues {
                topic: "orders".into(),
                queues: 8
            }]
        );
        let n = &b.nodes[2];
        assert_eq!((n.node_id, n.role.as_str(), n.term), (3, "follower", 2));
        assert_eq!((n.last_log_index, n.committed, n.applied), (30, 27, 24));
        assert_eq!(n.last_registration_age_ms, 1500);
    }

    #[test]
    fn t81_same_broker_name_in_two_clusters_are_distinct_groups() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        r.register(&reg("broker-a", 1, "leader", 1, &[("orders", 8)]), t0)
            .unwrap();
        let mut other = reg("broker-a", 1, "leader", 1, &[("orders", 2)]);
        other.cluster = "Other".into();
        other.address = "192.168.0.1:10911".into();
        r.register(&other, t0).unwrap();
        let routes = r.route("orders", t0).unwrap();
        let got: Vec<_> = routes
            .iter()
            .map(|b| (b.cluster.as_str(), b.queues))
            .collect();
        assert_eq!(got, [("DefaultCluster", 8), ("Other", 2)]);
    }

    fn limits(body: u64, batch_bytes: u64) -> SendLimits {
        SendLimits {
            body_bytes_max: body,
            properties_bytes_max: 1024,
            batch_messages_max: 10,
            batch_bytes_max: batch_bytes,
        }
    }

    /// Registers node `id` of `broker-a` reporting `l`.
    fn with_limits(r: &mut Registry, id: u64, role: &str, l: Option<SendLimits>, now: Instant) {
        let mut q = reg("broker-a", id, role, 2, &[("orders", 4)]);
        q.limits = l;
        r.register(&q, now).unwrap();
    }

    #[test]
    fn t90_route_carries_the_limits_the_leader_reports() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        with_limits(&mut r, 1, "leader", Some(limits(4096, 1 << 20)), t0);
        with_limits(&mut r, 2, "follower", Some(limits(100, 200)), t0);
        let route = &r.route("orders", t0).unwrap()[0];
        assert_eq!(route.limits, Some(limits(4096, 1 << 20)));
        // A new registration replaces what the node reported before.
        with_limits(
            &mut r,
            1,
            "leader",
            Some(limits(512, 1 << 20)),
            t0 + secs(1),
        );
        let route = &r.route("orders", t0 + secs(1)).unwrap()[0];
        assert_eq!(route.limits.map(|l| l.body_bytes_max), Some(512));
    }

    #[test]
    fn t91_without_a_leader_the_strictest_report_per_field() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        with_limits(&mut r, 1, "follower", Some(limits(4096, 1 << 20)), t0);
        with_limits(&mut r, 2, "candidate", Some(limits(8192, 1000)), t0);
        // 0 is unknown: it takes no part in the minimum.
        with_limits(&mut r, 3, "follower", Some(limits(0, 0)), t0);
        let route = &r.route("orders", t0).unwrap()[0];
        assert_eq!(route.leader_id, None);
        assert_eq!(route.limits, Some(limits(4096, 1000)));
        // A leader that reports none does not hide its followers' reports.
        with_limits(&mut r, 3, "leader", None, t0);
        let route = &r.route("orders", t0).unwrap()[0];
        assert_eq!(route.leader_id, Some(3));
        assert_eq!(route.limits, Some(limits(4096, 1000)));
    }

    #[test]
    fn t92_no_report_leaves_the_limits_unset_and_expired_reports_go() {
        let t0 = Instant::now();
        let mut r = Registry::new(EXPIRY);
        with_limits(&mut r, 1, "leader", None, t0);
        assert_eq!(r.route("orders", t0).unwrap()[0].limits, None);
        with_limits(&mut r, 2, "follower", Some(limits(10, 10)), t0);
        with_limits(&mut r, 1, "leader", None, t0 + secs(100));
        assert_eq!(
            r.route("orders", t0 + secs(100)).unwrap()[0].limits,
            Some(limits(10, 10))
        );
        // Node 2 expires: its report no longer counts.
        assert_eq!(r.route("orders", t0 + EXPIRY).unwrap()[0].limits, None);
    }
}
