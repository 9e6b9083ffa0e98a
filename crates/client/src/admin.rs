//! Administration: topics, live cluster status, leadership transfer, membership.
//!
//! Topic changes go to the leader of each broker group (with the router's leader following);
//! brokers register topics with the nameservers themselves, so [`Admin::create_topic`] waits until
//! the route shows every target group. [`Admin::cluster_status`] takes the node list from a
//! nameserver and then asks every node directly, so the numbers are live and a node that does not
//! answer shows as down.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use raftmq_proto::v1::admin_service_client::AdminServiceClient;
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::{self, ErrorCode};
use tokio::time::Instant;

use crate::conn::{each_attempt, request};
use crate::error::{Error, Result};
use crate::nameserver::{TopicRoute, parse_nameservers};
use crate::router::{Reply, RetryPolicy, Router};

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
    router: Arc<Router>,
    timeout: Duration,
}

impl Admin {
    /// An admin client for nameservers given as `"host:port;host:port"`; connects lazily.
    pub fn connect(nameservers: &str) -> Result<Admin> {
        Ok(Admin {
            // Admin changes (membership, leadership transfer) may take seconds on a live leader.
            router: Router::new(
                parse_nameservers(nameservers),
                RetryPolicy {
                    attempt_timeout: Duration::from_secs(3),
                    ..RetryPolicy::default()
                },
            )?,
            timeout: Duration::from_secs(10),
        })
    }

    /// Deadline of each operation, retries and waits included (default 10 s).
    pub fn with_timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    fn deadline(&self) -> Instant {
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

    /// Creates `name` with `queues` queues on `brokers` (default: every known broker group), then
    /// waits until the nameservers route it to all of them. Returns the groups it was created on.
    pub async fn create_topic(
        &self,
        name: &str,
        queues: u32,
        brokers: Option<&[String]>,
    ) -> Result<Vec<String>> {
        check_name("topic", name)?;
        if queues == 0 || queues > QUEUES_MAX {
            return Err(Error::InvalidArgument(format!(
                "a topic has 1 to {QUEUES_MAX} queues, not {queues}"
            )));
        }
        let known = self.broker_names().await?;
        let targets: Vec<String> = match brokers {
            None => known.clone(),
            Some(list) => {
                for b in list {
                    if !known.contains(b) {
                        return Err(Error::UnknownBroker { broker: b.clone() });
                    }
                }
                list.to_vec()
            }
        };
        if targets.is_empty() {
            return Err(Error::InvalidArgument(
                "no broker group is registered with the nameservers".into(),
            ));
        }
        let deadline = self.deadline();
        for broker in &targets {
            let req = v1::CreateTopicRequest {
                name: name.to_string(),
                queues,
                update: false,
                message_type: v1::TopicMessageType::Normal as i32,
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

    /// Polls the route until it includes every broker in `brokers`.
    pub async fn wait_for_route(
        &self,
        topic: &str,
        brokers: &[String],
        deadline: Instant,
    ) -> Result<TopicRoute> {
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
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every topic the nameservers know, sorted by name.
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
        Ok(topics
            .into_iter()
            .map(|(name, brokers)| TopicInfo {
                name,
                brokers: brokers.into_iter().collect(),
            })
            .collect())
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
        F: FnMut(tonic::transport::Channel, tonic::Request<T>) -> Fut,
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
}
