//! Talking to the nameservers, and the client's model of what they say.
//!
//! Nameservers are independent registries; each node registers with all of them. The client asks
//! them in turn, starting after the last one that answered, and takes the first answer. A topic is
//! "not found" only when every nameserver that answered says so.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use raftmq_proto::limits::SendLimits;
use raftmq_proto::v1::{self, ErrorCode};

use crate::conn::{Pool, request};
use crate::error::{Error, Result};

/// How long one nameserver call may take before the next nameserver is asked.
const NAMESERVER_TIMEOUT: Duration = Duration::from_secs(2);

/// One node of a broker group as the nameserver sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteNode {
    pub node_id: u64,
    pub address: String,
    /// `leader`, `follower`, `candidate` or `learner`, as last registered.
    pub role: String,
    pub term: u64,
}

/// One broker group hosting a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRoute {
    pub cluster: String,
    pub name: String,
    pub leader_id: Option<u64>,
    /// Queues `0..queues` of the topic live on this group.
    pub queues: u32,
    pub nodes: Vec<RouteNode>,
    pub term: u64,
    /// The send limits the group enforces, as its nodes published them; the contract's defaults
    /// for whatever the group did not report.
    pub limits: SendLimits,
}

impl BrokerRoute {
    /// The leader's address, if the nameserver knows a leader.
    pub fn leader_address(&self) -> Option<&str> {
        let id = self.leader_id?;
        self.nodes
            .iter()
            .find(|n| n.node_id == id)
            .map(|n| n.address.as_str())
    }
}

/// Where a topic lives: the route clients send and pull by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRoute {
    pub topic: String,
    /// Sorted by broker name.
    pub brokers: Vec<BrokerRoute>,
}

impl TopicRoute {
    /// Every (broker, queue) pair of the topic, sorted: the order every client agrees on.
    pub fn queues(&self) -> Vec<crate::QueueId> {
        let mut all: Vec<crate::QueueId> = self
            .brokers
            .iter()
            .flat_map(|b| (0..b.queues).map(|q| crate::QueueId::new(b.name.clone(), q)))
            .collect();
        all.sort();
        all
    }

    /// The route of one broker group.
    pub fn broker(&self, name: &str) -> Option<&BrokerRoute> {
        self.brokers.iter().find(|b| b.name == name)
    }
}

impl From<v1::RouteResponse> for TopicRoute {
    fn from(r: v1::RouteResponse) -> Self {
        let mut brokers: Vec<BrokerRoute> = r
            .brokers
            .into_iter()
            .map(|b| BrokerRoute {
                cluster: b.cluster,
                name: b.name,
                leader_id: b.leader_id,
                queues: b.queues,
                term: b.term,
                limits: b
                    .limits
                    .as_ref()
                    .map(SendLimits::from_wire)
                    .unwrap_or_default(),
                nodes: b
                    .nodes
                    .into_iter()
                    .map(|n| RouteNode {
                        node_id: n.node_id,
                        address: n.address,
                        role: n.role,
                        term: n.term,
                    })
                    .collect(),
            })
            .collect();
        brokers.sort_by(|a, b| a.name.cmp(&b.name));
        TopicRoute {
            topic: r.topic,
            brokers,
        }
    }
}

/// Splits `"ns1:9876;ns2:9876"` (also accepting `,` and blanks) into addresses.
pub fn parse_nameservers(list: &str) -> Vec<String> {
    list.split([';', ',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// A client of several independent nameservers.
pub(crate) struct NameserverClient {
    addresses: Vec<String>,
    pool: Pool,
    /// Index of the nameserver to ask first: the last one that answered.
    preferred: AtomicUsize,
}

impl NameserverClient {
    pub(crate) fn new(addresses: Vec<String>, pool: Pool) -> Result<Self> {
        if addresses.is_empty() {
            return Err(Error::InvalidArgument("no nameserver address given".into()));
        }
        Ok(NameserverClient {
            addresses,
            pool,
            preferred: AtomicUsize::new(0),
        })
    }

    pub(crate) fn addresses(&self) -> &[String] {
        &self.addresses
    }

    fn order(&self) -> impl Iterator<Item = (usize, &String)> {
        let n = self.addresses.len();
        let start = self.preferred.load(Ordering::Relaxed) % n;
        (0..n).map(move |i| {
            let idx = (start + i) % n;
            (idx, &self.addresses[idx])
        })
    }

    fn unavailable(&self, last: String) -> Error {
        Error::NameserverUnavailable {
            addresses: self.addresses.join(";"),
            last,
        }
    }

    /// The route of `topic`.
    pub(crate) async fn route(&self, topic: &str) -> Result<TopicRoute> {
        let mut last = String::from("no attempt");
        let mut not_found = false;
        for (idx, addr) in self.order() {
            let mut client = self.pool.nameserver(addr)?;
            let req = v1::RouteRequest {
                topic: topic.to_string(),
            };
            match client.route(request(req, NAMESERVER_TIMEOUT)).await {
                Ok(resp) => {
                    let resp = resp.into_inner();
                    match resp.error.as_ref().map(|e| e.code()) {
                        None | Some(ErrorCode::Ok) if !resp.brokers.is_empty() => {
                            self.preferred.store(idx, Ordering::Relaxed);
                            return Ok(resp.into());
                        }
                        None | Some(ErrorCode::Ok) | Some(ErrorCode::TopicNotFound) => {
                            not_found = true;
                            last = format!("{addr}: topic {topic} not found");
                        }
                        Some(_) => last = format!("{addr}: {}", resp.error.unwrap_or_default()),
                    }
                }
                Err(status) => last = format!("{addr}: {}", status.message()),
            }
        }
        if not_found {
            Err(Error::TopicNotFound {
                topic: topic.to_string(),
            })
        } else {
            Err(self.unavailable(last))
        }
    }

    /// Every cluster, broker group and node the nameserver knows.
    pub(crate) async fn cluster_info(&self) -> Result<Vec<v1::ClusterInfo>> {
        let mut last = String::from("no attempt");
        for (idx, addr) in self.order() {
            let mut client = self.pool.nameserver(addr)?;
            match client
                .get_cluster_info(request(v1::ClusterInfoRequest {}, NAMESERVER_TIMEOUT))
                .await
            {
                Ok(resp) => {
                    let resp = resp.into_inner();
                    match resp.error {
                        Some(e) if e.code() != ErrorCode::Ok => last = format!("{addr}: {e}"),
                        _ => {
                            self.preferred.store(idx, Ordering::Relaxed);
                            return Ok(resp.clusters);
                        }
                    }
                }
                Err(status) => last = format!("{addr}: {}", status.message()),
            }
        }
        Err(self.unavailable(last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameserver_lists_split_on_semicolons() {
        assert_eq!(
            parse_nameservers("ns1:9876; ns2:9876;"),
            vec!["ns1:9876".to_string(), "ns2:9876".to_string()]
        );
        assert!(parse_nameservers(" ; ").is_empty());
    }

    #[test]
    fn route_conversion_sorts_brokers_and_finds_leader() {
        let resp = v1::RouteResponse {
            error: None,
            topic: "t".into(),
            brokers: vec![
                v1::BrokerRoute {
                    name: "broker-b".into(),
                    queues: 2,
                    ..Default::default()
                },
                v1::BrokerRoute {
                    name: "broker-a".into(),
                    queues: 1,
                    leader_id: Some(2),
                    limits: Some(v1::SendLimits {
                        body_bytes_max: 1000,
                        ..Default::default()
                    }),
                    nodes: vec![v1::RouteNode {
                        node_id: 2,
                        address: "h:2".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
        };
        let route = TopicRoute::from(resp);
        assert_eq!(route.brokers[0].name, "broker-a");
        assert_eq!(route.brokers[0].leader_address(), Some("h:2"));
        // Limits as reported, the defaults for what was not.
        assert_eq!(route.brokers[0].limits.body_bytes_max, 1000);
        assert_eq!(
            route.brokers[0].limits.batch_bytes_max,
            SendLimits::DEFAULT.batch_bytes_max
        );
        assert_eq!(route.brokers[1].limits, SendLimits::DEFAULT);
        let qs: Vec<String> = route.queues().iter().map(|q| q.to_string()).collect();
        assert_eq!(qs, vec!["broker-a/0", "broker-b/0", "broker-b/1"]);
    }
}
