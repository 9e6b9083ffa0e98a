//! Administration: topics, POP consumer groups, live cluster status, leadership transfer,
//! membership.
//!
//! Topic and group changes go to the leader of each broker group (with the router's leader
//! following); brokers register topics with the nameservers themselves, so
//! [`Admin::create_topic`] waits until the route shows every target group. Consumer groups are
//! replicated configuration of each broker group and are not registered with the nameservers:
//! [`Admin::list_groups`] asks every broker group. [`Admin::cluster_status`] takes the node list from a
//! nameserver and then asks every node directly, so the numbers are live and a node that does not
//! answer shows as down.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use raftmq_proto::v1::admin_service_client::AdminServiceClient;
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::{self, ErrorCode};
pub use raftmq_proto::v1::{GroupConfig, TopicMessageType};
use tokio::time::Instant;

use crate::conn::{each_attempt, request};
use crate::error::{Error, Result};
use crate::nameserver::{TopicRoute, parse_nameservers};
use crate::router::{Reply, RetryPolicy, Router};
use crate::security::{ClientSecurity, Conn};

/// Deliveries of a message before it is dead-lettered when a group's `max_attempts` is 0.
pub const MAX_ATTEMPTS_DEFAULT: u32 = 16;

/// How long [`Admin::list_topics`] waits for the broker groups' answers on topic types before it
/// lists the topics it has with their type unknown.
const TOPIC_TYPES_WAIT: Duration = Duration::from_secs(3);

/// [`Admin::wait_for_route`]'s first pause between two looks at the route, doubled after each
/// up to [`ROUTE_POLL_MAX`]. With a fixed 100 ms, creating 1,000 topics one after another
/// (`bench produce --local --topics 1000`) took 41–46 s; now 6.1 s.
const ROUTE_POLL_FIRST: Duration = Duration::from_millis(5);
const ROUTE_POLL_MAX: Duration = Duration::from_millis(100);

const _: () = assert!(ROUTE_POLL_FIRST.as_millis() >= 1);
const _: () = assert!(ROUTE_POLL_MAX.as_millis() >= ROUTE_POLL_FIRST.as_millis());

// The group replies carry an `Error` like every other reply the router's retry loop reads.
impl Reply for v1::CreateGroupResponse {
    fn error(&self) -> Option<&v1::Error> {
        self.error.as_ref()
    }
}
impl Reply for v1::DeleteGroupResponse {
    fn error(&self) -> Option<&v1::Error> {
        self.error.as_ref()
    }
}
impl Reply for v1::ListGroupsResponse {
    fn error(&self) -> Option<&v1::Error> {
        self.error.as_ref()
    }
}

/// Longest topic or group name (the contract's, `raftmq_proto::limits`).
pub use raftmq_proto::limits::NAME_LEN_MAX as NAME_CHARS_MAX;
/// Most queues a topic may have on one broker group (the contract's).
pub use raftmq_proto::limits::QUEUES_PER_TOPIC_MAX as QUEUES_MAX;

/// Checks a topic or group name against the contract's rule `^[A-Za-z0-9_%|-]{1,127}$`.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    raftmq_proto::limits::check_name(what, name).map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// A topic and the broker groups hosting it, as the nameservers know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    /// (broker group, queues), sorted by group.
    pub brokers: Vec<(String, u32)>,
    /// The topic's message type, as the first hosting broker group (by name) that answered
    /// reports it; `None` when none answered.
    pub message_type: Option<TopicMessageType>,
}

/// A POP consumer group and the broker groups holding it with this config.
///
/// A group whose config differs between broker groups (created or updated on some of them only)
/// is listed once per distinct config.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupInfo {
    pub name: String,
    /// As the broker groups report it (`max_attempts` resolved; empty `retry_delays_ms`: the
    /// default ladder).
    pub config: GroupConfig,
    /// Sorted.
    pub brokers: Vec<String>,
}

/// The lowercase name of a topic message type, as the command line spells it: `normal`, `fifo`,
/// `delay`, `transaction`.
pub fn message_type_name(t: TopicMessageType) -> &'static str {
    match t {
        TopicMessageType::Normal => "normal",
        TopicMessageType::Fifo => "fifo",
        TopicMessageType::Delay => "delay",
        TopicMessageType::Transaction => "transaction",
    }
}

/// The live state of one node; `status` is `None` when it did not answer.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub node_id: u64,
    pub address: String,
    pub status: Option<v1::NodeStatusResponse>,
    /// Why the node counts as down.
    pub error: Option<String>,
    /// How far this node's applied index is behind the highest commit index in its group.
    pub lag: Option<u64>,
}

impl NodeView {
    /// `leader`, `follower`, `candidate`, `learner`, or `down`.
    pub fn role(&self) -> &str {
        self.status.as_ref().map_or("down", |s| s.role.as_str())
    }
}

/// One broker group, live.
#[derive(Debug, Clone)]
pub struct BrokerView {
    pub name: String,
    /// The node that answered as leader with the highest term (else the nameserver's view).
    pub leader_id: Option<u64>,
    pub term: u64,
    /// Sorted by node id.
    pub nodes: Vec<NodeView>,
}

/// One cluster, live.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub name: String,
    pub brokers: Vec<BrokerView>,
}

/// Every cluster the nameservers know, with numbers read from the nodes.
#[derive(Debug, Clone, Default)]
pub struct ClusterStatus {
    pub clusters: Vec<ClusterView>,
}

/// Administration client.
///
/// ```no_run
/// use raftmq_client::Admin;
///
/// # async fn example() -> raftmq_client::Result<()> {
/// let admin = Admin::connect("127.0.0.1:9876")?;
/// admin.create_topic("orders", 8, None).await?;
/// for cluster in admin.cluster_status().await?.clusters {
///     for broker in cluster.brokers {
///         println!("{} leader {:?} term {}", broker.name, broker.leader_id, broker.term);
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub struct Admin {
    pub(crate) router: Arc<Router>,
    timeout: Duration,
}

impl Admin {
    /// An admin client for nameservers given as `"host:port;host:port"`; connects lazily, in
    /// plaintext and unsigned.
    pub fn connect(nameservers: &str) -> Result<Admin> {
        Admin::connect_with(nameservers, ClientSecurity::default())
    }

    /// [`Admin::connect`] with TLS and request signing for every connection (to nameservers and
    /// nodes: admin, inspect and node status calls alike).
    pub fn connect_with(nameservers: &str, security: ClientSecurity) -> Result<Admin> {
        Ok(Admin {
            // Admin changes (membership, leadership transfer) may take seconds on a live leader.
            router: Router::new(
                parse_nameservers(nameservers),
                RetryPolicy {
                    attempt_timeout: Duration::from_secs(3),
                    ..RetryPolicy::default()
                },
                security,
            )?,
            timeout: Duration::from_secs(10),
        })
    }

    /// Deadline of each operation, retries and waits included (default 10 s).
    pub fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// The nameserver addresses in use.
    pub fn nameservers(&self) -> &[String] {
        self.router.ns.addresses()
    }

    /// Names of every broker group the nameservers know, sorted.
    pub async fn broker_names(&self) -> Result<Vec<String>> {
        let info = self.router.cluster_info().await?;
        let names: BTreeSet<String> = info
            .iter()
            .flat_map(|c| c.brokers.iter().map(|b| b.name.clone()))
            .collect();
        Ok(names.into_iter().collect())
    }

    /// Creates the NORMAL topic `name` with `queues` queues on `brokers` (default: every known
    /// broker group), then waits until the nameservers route it to all of them. Returns the groups
    /// it was created on.
    pub async fn create_topic(
        &self,
        name: &str,
        queues: u32,
        brokers: Option<&[String]>,
    ) -> Result<Vec<String>> {
        self.create_topic_typed(name, queues, brokers, TopicMessageType::Normal)
            .await
    }

    /// [`Self::create_topic`] for a topic of `message_type`. The type is fixed at creation: a
    /// broker group already holding the topic with another type refuses with `INVALID_ARGUMENT`.
    pub async fn create_topic_typed(
        &self,
        name: &str,
        queues: u32,
        brokers: Option<&[String]>,
        message_type: TopicMessageType,
    ) -> Result<Vec<String>> {
        check_name("topic", name)?;
        if queues == 0 || queues > QUEUES_MAX {
            return Err(Error::InvalidArgument(format!(
                "a topic has 1 to {QUEUES_MAX} queues, not {queues}"
            )));
        }
        let targets = target_brokers(&self.broker_names().await?, brokers)?;
        let deadline = self.deadline();
        for broker in &targets {
            let req = v1::CreateTopicRequest {
                name: name.to_string(),
                queues,
                update: false,
                message_type: message_type as i32,
            };
            self.router
                .call_leader(
                    broker,
                    "CreateTopic",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).create_topic(r).await
                    }),
                )
                .await?;
        }
        self.wait_for_route(name, &targets, deadline).await?;
        Ok(targets)
    }

    /// Polls the route until it includes every broker in `brokers`: soon after the change at
    /// first (a broker group registers a new topic as soon as it commits it, within
    /// milliseconds), then less often, up to every [`ROUTE_POLL_MAX`].
    pub async fn wait_for_route(
        &self,
        topic: &str,
        brokers: &[String],
        deadline: Instant,
    ) -> Result<TopicRoute> {
        let mut pause = ROUTE_POLL_FIRST;
        loop {
            let last = match self.router.ns.route(topic).await {
                Ok(route) if brokers.iter().all(|b| route.broker(b).is_some()) => return Ok(route),
                Ok(route) => format!(
                    "route lists {:?}",
                    route.brokers.iter().map(|b| &b.name).collect::<Vec<_>>()
                ),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    op: format!("waiting for the route of {topic}"),
                    waited: self.timeout,
                    last,
                });
            }
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(ROUTE_POLL_MAX);
        }
    }

    /// Every topic the nameservers know, sorted by name, with its message type from the broker
    /// groups hosting it (unknown when none of them answered within a few seconds).
    pub async fn list_topics(&self) -> Result<Vec<TopicInfo>> {
        let info = self.router.cluster_info().await?;
        let mut topics: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        for c in &info {
            for b in &c.brokers {
                for t in &b.topics {
                    topics
                        .entry(t.topic.clone())
                        .or_default()
                        .insert(b.name.clone(), t.queues);
                }
            }
        }
        let hosting: BTreeSet<&String> = topics.values().flat_map(|b| b.keys()).collect();
        let deadline = Instant::now() + self.timeout.min(TOPIC_TYPES_WAIT);
        let answers = futures::future::join_all(hosting.into_iter().map(|broker| async move {
            let req = v1::ListTopicsRequest {};
            let r = self
                .router
                .call_leader(
                    broker,
                    "ListTopics",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).list_topics(r).await
                    }),
                )
                .await;
            match r {
                Ok((reply, _)) => Some((broker.clone(), reply.topics)),
                Err(e) => {
                    tracing::warn!("topic types of broker group {broker} unknown: {e}");
                    None
                }
            }
        }))
        .await;
        let types: BTreeMap<String, Vec<v1::TopicConfig>> = answers.into_iter().flatten().collect();
        Ok(topic_infos(topics, &types))
    }

    /// The topic's route as the nameservers give it to clients.
    pub async fn route(&self, topic: &str) -> Result<TopicRoute> {
        check_name("topic", topic)?;
        self.router.ns.route(topic).await
    }

    /// Deletes the topic on every broker group hosting it. Returns those groups.
    pub async fn delete_topic(&self, name: &str) -> Result<Vec<String>> {
        check_name("topic", name)?;
        let route = self.router.route(name, Duration::ZERO).await?;
        let deadline = self.deadline();
        let mut done = Vec::new();
        for b in &route.brokers {
            let req = v1::DeleteTopicRequest {
                name: name.to_string(),
            };
            let r = self
                .router
                .call_leader(
                    &b.name,
                    "DeleteTopic",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).delete_topic(r).await
                    }),
                )
                .await;
            match r {
                Ok(_) => done.push(b.name.clone()),
                // Already gone there: the nameserver view was behind.
                Err(e) if e.code() == Some(ErrorCode::TopicNotFound) => done.push(b.name.clone()),
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Creates the POP consumer group `cfg.name` on `brokers` (default: every known broker
    /// group); with `update`, replaces the config of a group that exists. Without it, a group that
    /// exists with another config is refused (`GROUP_EXISTS`). Returns the groups it was applied
    /// on.
    pub async fn create_group(
        &self,
        cfg: &GroupConfig,
        update: bool,
        brokers: Option<&[String]>,
    ) -> Result<Vec<String>> {
        check_name("group", &cfg.name)?;
        if let Some(i) = cfg.retry_delays_ms.iter().position(|d| *d == 0) {
            return Err(Error::InvalidArgument(format!(
                "retry delay {} of group {} is 0; a delay is at least 1 ms",
                i + 1,
                cfg.name
            )));
        }
        let targets = target_brokers(&self.broker_names().await?, brokers)?;
        let deadline = self.deadline();
        let req = v1::CreateGroupRequest {
            group: Some(cfg.clone()),
            update,
        };
        for broker in &targets {
            self.router
                .call_leader(
                    broker,
                    "CreateGroup",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).create_group(r).await
                    }),
                )
                .await?;
        }
        Ok(targets)
    }

    /// Deletes the consumer group `name` from every broker group holding it. Returns those groups;
    /// [`Error::GroupNotFound`] when none does.
    pub async fn delete_group(&self, name: &str) -> Result<Vec<String>> {
        check_name("group", name)?;
        let deadline = self.deadline();
        let req = v1::DeleteGroupRequest {
            name: name.to_string(),
        };
        let mut done = Vec::new();
        for broker in self.broker_names().await? {
            let r = self
                .router
                .call_leader(
                    &broker,
                    "DeleteGroup",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).delete_group(r).await
                    }),
                )
                .await;
            match r {
                Ok(_) => done.push(broker),
                Err(e) if e.code() == Some(ErrorCode::GroupNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        if done.is_empty() {
            return Err(Error::GroupNotFound {
                group: name.to_string(),
            });
        }
        Ok(done)
    }

    /// Every consumer group of every broker group, sorted by name, asked of each group's leader.
    /// Fails when a broker group does not answer, as its groups would be missing.
    pub async fn list_groups(&self) -> Result<Vec<GroupInfo>> {
        let brokers = self.broker_names().await?;
        let deadline = self.deadline();
        let answers = futures::future::join_all(brokers.iter().map(|broker| async move {
            let req = v1::ListGroupsRequest {};
            self.router
                .call_leader(
                    broker,
                    "ListGroups",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).list_groups(r).await
                    }),
                )
                .await
                .map(|(reply, _)| (broker.clone(), reply.groups))
        }))
        .await;
        let per_broker = answers.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(group_infos(per_broker))
    }

    /// The live status of one node.
    pub async fn node_status(&self, address: &str) -> Result<v1::NodeStatusResponse> {
        let ch = self.router.pool.channel(address)?;
        let timeout = Duration::from_secs(1);
        let r = tokio::time::timeout(
            timeout,
            BrokerServiceClient::new(ch).node_status(request(v1::NodeStatusRequest {}, timeout)),
        )
        .await
        .map_err(|_| Error::Timeout {
            op: format!("NodeStatus of {address}"),
            waited: timeout,
            last: "no answer".into(),
        })?;
        r.map(|r| r.into_inner()).map_err(|status| Error::Rpc {
            address: address.to_string(),
            rpc: "NodeStatus",
            status: Box::new(status),
        })
    }

    /// Every node the nameservers know (and every peer those nodes name), asked directly.
    pub async fn cluster_status(&self) -> Result<ClusterStatus> {
        let info = self.router.cluster_info().await?;
        let mut out = ClusterStatus::default();
        for c in &info {
            let mut cluster = ClusterView {
                name: c.name.clone(),
                brokers: Vec::new(),
            };
            for b in &c.brokers {
                let mut addrs: BTreeMap<u64, String> = b
                    .nodes
                    .iter()
                    .map(|n| (n.node_id, n.address.clone()))
                    .collect();
                let mut views = self.ask_nodes(&addrs).await;
                // Peers a live node knows but the nameserver does not (e.g. registration expired).
                let extra: BTreeMap<u64, String> = views
                    .iter()
                    .filter_map(|v| v.status.as_ref())
                    .flat_map(|s| s.peers.iter())
                    .filter(|p| !addrs.contains_key(&p.node_id) && !p.address.is_empty())
                    .map(|p| (p.node_id, p.address.clone()))
                    .collect();
                if !extra.is_empty() {
                    views.extend(self.ask_nodes(&extra).await);
                    addrs.extend(extra);
                }
                cluster.brokers.push(broker_view(b, views));
            }
            cluster.brokers.sort_by(|a, b| a.name.cmp(&b.name));
            out.clusters.push(cluster);
        }
        out.clusters.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn ask_nodes(&self, addrs: &BTreeMap<u64, String>) -> Vec<NodeView> {
        let calls = addrs.iter().map(|(id, addr)| async move {
            match self.node_status(addr).await {
                Ok(s) => NodeView {
                    node_id: *id,
                    address: addr.clone(),
                    status: Some(s),
                    error: None,
                    lag: None,
                },
                Err(e) => NodeView {
                    node_id: *id,
                    address: addr.clone(),
                    status: None,
                    error: Some(e.to_string()),
                    lag: None,
                },
            }
        });
        futures::future::join_all(calls).await
    }

    /// The live leader of `broker`: (node id, address), asking the nodes themselves.
    pub async fn leader_of(&self, broker: &str) -> Result<Option<(u64, String)>> {
        let status = self.cluster_status().await?;
        Ok(status
            .clusters
            .iter()
            .flat_map(|c| c.brokers.iter())
            .find(|b| b.name == broker)
            .and_then(|b| {
                let id = b.leader_id?;
                let n = b.nodes.iter().find(|n| n.node_id == id)?;
                Some((id, n.address.clone()))
            }))
    }

    /// Asks the leader of `broker` to hand leadership to node `to`, then waits until it has.
    pub async fn transfer_leader(&self, broker: &str, to: u64) -> Result<()> {
        self.router.cluster_info().await?;
        let deadline = self.deadline();
        let req = v1::TransferLeaderRequest { to_node_id: to };
        self.router
            .call_leader(broker, "TransferLeader", deadline, |ch, t| async move {
                AdminServiceClient::new(ch)
                    .transfer_leader(request(req, t))
                    .await
            })
            .await?;
        loop {
            if let Ok(Some((id, _))) = self.leader_of(broker).await
                && id == to
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    op: format!("leader transfer of {broker} to node {to}"),
                    waited: self.timeout,
                    last: "the node did not become leader".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Adds node `node_id` at `address` to `broker` as a learner (replicates, does not vote).
    pub async fn add_learner(&self, broker: &str, node_id: u64, address: &str) -> Result<()> {
        let req = v1::AddLearnerRequest {
            node_id,
            address: address.to_string(),
        };
        self.membership_change(broker, "AddLearner", req, |ch, r| async move {
            AdminServiceClient::new(ch).add_learner(r).await
        })
        .await
    }

    /// Sets the voters of `broker` (promoting learners, removing nodes) by joint consensus.
    pub async fn change_voters(&self, broker: &str, voters: Vec<u64>) -> Result<()> {
        let req = v1::ChangeVotersRequest { voters };
        self.membership_change(broker, "ChangeVoters", req, |ch, r| async move {
            AdminServiceClient::new(ch).change_voters(r).await
        })
        .await
    }

    /// Refreshes the cluster view, then has `broker`'s leader apply the membership change `req`
    /// through `call` (the RPC named `rpc`).
    async fn membership_change<T, R, F, Fut>(
        &self,
        broker: &str,
        rpc: &'static str,
        req: T,
        call: F,
    ) -> Result<()>
    where
        T: Clone,
        R: Reply,
        F: FnMut(Conn, tonic::Request<T>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        self.router.cluster_info().await?;
        self.router
            .call_leader(broker, rpc, self.deadline(), each_attempt(&req, call))
            .await?;
        Ok(())
    }

    /// The leader's status of `broker`, read from the leader itself.
    pub async fn leader_status(&self, broker: &str) -> Result<v1::NodeStatusResponse> {
        let (_, addr) = self
            .leader_of(broker)
            .await?
            .ok_or_else(|| Error::Timeout {
                op: format!("finding the leader of {broker}"),
                waited: Duration::ZERO,
                last: "no node answered as leader".into(),
            })?;
        self.node_status(&addr).await
    }

    /// The current voters of `broker`, from its leader.
    pub async fn voters(&self, broker: &str) -> Result<Vec<u64>> {
        let s = self.leader_status(broker).await?;
        Ok(voters_of(&s))
    }
}

/// The broker groups an operation applies to: the ones named (each must be known), else every
/// known one.
fn target_brokers(known: &[String], named: Option<&[String]>) -> Result<Vec<String>> {
    let targets: Vec<String> = match named {
        None => known.to_vec(),
        Some(list) => {
            if let Some(b) = list.iter().find(|b| !known.contains(b)) {
                return Err(Error::UnknownBroker { broker: b.clone() });
            }
            let mut seen = BTreeSet::new();
            list.iter()
                .filter(|b| seen.insert(b.as_str()))
                .cloned()
                .collect()
        }
    };
    if targets.is_empty() {
        return Err(Error::InvalidArgument(
            "no broker group is registered with the nameservers".into(),
        ));
    }
    Ok(targets)
}

/// Joins the nameservers' topics (topic → broker group → queues) with the topic lists the broker
/// groups gave (broker group → topics): the type comes from the first group, by name, that
/// reports the topic.
fn topic_infos(
    topics: BTreeMap<String, BTreeMap<String, u32>>,
    types: &BTreeMap<String, Vec<v1::TopicConfig>>,
) -> Vec<TopicInfo> {
    topics
        .into_iter()
        .map(|(name, brokers)| {
            let message_type = brokers
                .keys()
                .filter_map(|b| types.get(b))
                .find_map(|list| list.iter().find(|t| t.name == name))
                .and_then(|t| TopicMessageType::try_from(t.message_type).ok());
            TopicInfo {
                name,
                brokers: brokers.into_iter().collect(),
                message_type,
            }
        })
        .collect()
}

/// Merges the group lists of the broker groups: one entry per group name and distinct config,
/// sorted by name, with the broker groups holding it sorted.
fn group_infos(per_broker: Vec<(String, Vec<GroupConfig>)>) -> Vec<GroupInfo> {
    let mut by_name: BTreeMap<String, Vec<GroupInfo>> = BTreeMap::new();
    for (broker, groups) in per_broker {
        for config in groups {
            let same = by_name.entry(config.name.clone()).or_default();
            match same.iter_mut().find(|g| g.config == config) {
                Some(g) => g.brokers.push(broker.clone()),
                None => same.push(GroupInfo {
                    name: config.name.clone(),
                    config,
                    brokers: vec![broker.clone()],
                }),
            }
        }
    }
    let mut out: Vec<GroupInfo> = by_name.into_values().flatten().collect();
    for g in &mut out {
        g.brokers.sort();
        g.brokers.dedup();
    }
    out
}

/// Voters named by a leader's status: its voting peers plus itself.
pub fn voters_of(s: &v1::NodeStatusResponse) -> Vec<u64> {
    let mut v: BTreeSet<u64> = s
        .peers
        .iter()
        .filter(|p| p.voter)
        .map(|p| p.node_id)
        .collect();
    if s.role == "leader" {
        v.insert(s.node_id);
    }
    v.into_iter().collect()
}

/// Joins the nameserver's view of a group with the nodes' answers.
fn broker_view(b: &v1::BrokerInfo, mut nodes: Vec<NodeView>) -> BrokerView {
    nodes.sort_by_key(|n| n.node_id);
    let live = || nodes.iter().filter_map(|n| n.status.as_ref());
    let term = live().map(|s| s.term).max().unwrap_or(b.term);
    let leader_id = live()
        .filter(|s| s.role == "leader")
        .max_by_key(|s| s.term)
        .map(|s| s.node_id)
        .or(b.leader_id);
    let committed = live().map(|s| s.committed).max().unwrap_or(0);
    for n in &mut nodes {
        n.lag = n
            .status
            .as_ref()
            .map(|s| committed.saturating_sub(s.applied));
    }
    BrokerView {
        name: b.name.clone(),
        leader_id,
        term,
        nodes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_design_limits() {
        assert!(check_name("topic", "orders_2024-%|x").is_ok());
        assert!(check_name("topic", "").is_err());
        assert!(check_name("topic", "has space").is_err());
        assert!(check_name("topic", "dot.ted").is_err());
        assert!(check_name("topic", &"a".repeat(127)).is_ok());
        assert!(check_name("topic", &"a".repeat(128)).is_err());
    }

    fn status(id: u64, role: &str, term: u64, committed: u64, applied: u64) -> NodeView {
        NodeView {
            node_id: id,
            address: format!("h:{id}"),
            status: Some(v1::NodeStatusResponse {
                node_id: id,
                role: role.into(),
                term,
                committed,
                applied,
                ..Default::default()
            }),
            error: None,
            lag: None,
        }
    }

    #[test]
    fn broker_view_takes_the_newest_leader_and_computes_lag() {
        let info = v1::BrokerInfo {
            name: "broker-a".into(),
            leader_id: Some(1),
            term: 3,
            ..Default::default()
        };
        let down = NodeView {
            node_id: 1,
            address: "h:1".into(),
            status: None,
            error: Some("refused".into()),
            lag: None,
        };
        let v = broker_view(
            &info,
            vec![
                status(3, "follower", 4, 90, 80),
                down,
                status(2, "leader", 4, 100, 100),
            ],
        );
        assert_eq!(v.leader_id, Some(2));
        assert_eq!(v.term, 4);
        assert_eq!(
            v.nodes
                .iter()
                .map(|n| (n.node_id, n.role().to_string(), n.lag))
                .collect::<Vec<_>>(),
            vec![
                (1, "down".to_string(), None),
                (2, "leader".to_string(), Some(0)),
                (3, "follower".to_string(), Some(20)),
            ]
        );
    }

    #[test]
    fn voters_include_the_leader() {
        let s = v1::NodeStatusResponse {
            node_id: 1,
            role: "leader".into(),
            peers: vec![
                v1::PeerStatus {
                    node_id: 2,
                    voter: true,
                    ..Default::default()
                },
                v1::PeerStatus {
                    node_id: 4,
                    voter: false,
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(voters_of(&s), vec![1, 2]);
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn targets_are_every_known_group_or_the_named_ones() {
        let known = names(&["broker-a", "broker-b"]);
        assert_eq!(target_brokers(&known, None).unwrap(), known);
        let named = names(&["broker-b", "broker-b"]);
        assert_eq!(
            target_brokers(&known, Some(&named)).unwrap(),
            names(&["broker-b"])
        );
        let e = target_brokers(&known, Some(&names(&["broker-a", "broker-x"]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "broker group \"broker-x\" is not known to the nameservers"
        );
        assert!(matches!(
            target_brokers(&[], None),
            Err(Error::InvalidArgument(_))
        ));
    }

    fn topic(name: &str, t: TopicMessageType) -> v1::TopicConfig {
        v1::TopicConfig {
            name: name.into(),
            queues: 4,
            message_type: t as i32,
        }
    }

    #[test]
    fn topic_types_come_from_the_groups_that_answered() {
        let mut topics: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
        topics
            .entry("orders".into())
            .or_default()
            .extend([("broker-a".to_string(), 4), ("broker-b".to_string(), 4)]);
        topics
            .entry("plain".into())
            .or_default()
            .insert("broker-a".into(), 8);
        topics
            .entry("far".into())
            .or_default()
            .insert("broker-c".into(), 2);
        // broker-a did not answer; broker-c answered without the topic (its list was behind).
        let types = BTreeMap::from([
            (
                "broker-b".to_string(),
                vec![
                    topic("orders", TopicMessageType::Fifo),
                    topic("plain", TopicMessageType::Delay),
                ],
            ),
            ("broker-c".to_string(), vec![]),
        ]);
        let got = topic_infos(topics, &types);
        assert_eq!(
            got.iter()
                .map(|t| (t.name.as_str(), t.message_type))
                .collect::<Vec<_>>(),
            vec![
                ("far", None),
                ("orders", Some(TopicMessageType::Fifo)),
                ("plain", None),
            ]
        );
        assert_eq!(
            got[1].brokers,
            vec![("broker-a".to_string(), 4), ("broker-b".to_string(), 4)]
        );
        assert_eq!(
            message_type_name(TopicMessageType::Transaction),
            "transaction"
        );
    }

    fn group(name: &str, max_attempts: u32, retry: &[u64]) -> GroupConfig {
        GroupConfig {
            name: name.into(),
            max_attempts,
            retry_delays_ms: retry.to_vec(),
            fifo: false,
        }
    }

    #[test]
    fn groups_merge_by_name_and_config() {
        let got = group_infos(vec![
            (
                "broker-a".into(),
                vec![group("g2", 16, &[]), group("g1", 3, &[1000])],
            ),
            (
                "broker-b".into(),
                vec![group("g1", 3, &[1000]), group("g2", 5, &[])],
            ),
            ("broker-c".into(), vec![group("g1", 3, &[1000])]),
        ]);
        assert_eq!(
            got,
            vec![
                GroupInfo {
                    name: "g1".into(),
                    config: group("g1", 3, &[1000]),
                    brokers: names(&["broker-a", "broker-b", "broker-c"]),
                },
                GroupInfo {
                    name: "g2".into(),
                    config: group("g2", 16, &[]),
                    brokers: names(&["broker-a"]),
                },
                GroupInfo {
                    name: "g2".into(),
                    config: group("g2", 5, &[]),
                    brokers: names(&["broker-b"]),
                },
            ]
        );
        assert!(group_infos(vec![("broker-a".into(), vec![])]).is_empty());
    }
}
