//! Topic routes: which broker groups host a topic (asked of the nameservers, cached briefly), and
//! how a v1 route becomes the v2 `MessageQueue`s of QueryRoute and QueryAssignment.
//!
//! Each broker group is one v2 broker (`id` 0, the one clients write to), listed once per node of
//! the group, leader first: every queue appears with each node's endpoints. A client rotating
//! over the queues therefore spreads over every node and skips a dead one at its next attempt, and
//! the node it reaches forwards to the leader when it is not the leader itself.
//!
//! Why not one broker whose endpoints list every node: the official Python client (grpcio) dials
//! such endpoints as one channel `ipv4:a:p,b:p,c:p` and sends that whole list as the HTTP/2
//! `:authority`, which is not a valid authority; the server's HTTP/2 layer resets every such
//! stream (RST_STREAM PROTOCOL_ERROR) before any handler runs. One address per endpoints avoids it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftmq_proto::v1::{self, ErrorCode, TopicMessageType};

use crate::codes::Error;
use crate::forward::Pool;
use crate::pb::{self, AddressScheme, MessageType, Permission};

/// How long a route is reused before the nameservers are asked again.
pub const ROUTE_TTL: Duration = Duration::from_secs(3);
/// Deadline of one nameserver call.
const NAMESERVER_TIMEOUT: Duration = Duration::from_secs(2);

/// Routes from the nameservers, cached per topic for [`ROUTE_TTL`].
pub struct Routes {
    nameservers: Vec<String>,
    pool: Pool,
    cache: Mutex<HashMap<String, (Instant, Arc<v1::RouteResponse>)>>,
}

impl Routes {
    /// Routes asked of `nameservers` (`host:port` each), over `pool`'s channels.
    pub fn new(nameservers: Vec<String>, pool: Pool) -> Self {
        Routes {
            nameservers,
            pool,
            cache: Mutex::default(),
        }
    }

    /// The topic's route: every broker group hosting it. Each nameserver is asked in turn until
    /// one knows the topic (they are independent; one may not have a registration yet).
    pub async fn route(&self, topic: &str) -> Result<Arc<v1::RouteResponse>, Error> {
        if let Some((at, r)) = self.lock().get(topic)
            && at.elapsed() < ROUTE_TTL
        {
            return Ok(r.clone());
        }
        let mut last_failure = None;
        let mut not_found = false;
        for ns in &self.nameservers {
            let mut client = match self.pool.nameserver(ns) {
                Ok(c) => c,
                Err(e) => {
                    last_failure = Some(e.to_string());
                    continue;
                }
            };
            let mut req = tonic::Request::new(v1::RouteRequest {
                topic: topic.to_string(),
            });
            req.set_timeout(NAMESERVER_TIMEOUT);
            match client.route(req).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    match &reply.error {
                        None if !reply.brokers.is_empty() => {
                            let reply = Arc::new(reply);
                            self.lock()
                                .insert(topic.to_string(), (Instant::now(), reply.clone()));
                            return Ok(reply);
                        }
                        // A malformed topic name: every nameserver says the same.
                        Some(e) if e.code == ErrorCode::InvalidArgument as i32 => {
                            return Err(Error::Broker(e.clone()));
                        }
                        Some(e) if e.code != ErrorCode::TopicNotFound as i32 => {
                            last_failure = Some(format!("nameserver {ns}: {e}"));
                        }
                        _ => not_found = true,
                    }
                }
                Err(status) => {
                    last_failure = Some(format!("nameserver {ns}: {}", status.message()));
                }
            }
        }
        match last_failure {
            Some(reason) if !not_found => Err(Error::NoNameserver {
                topic: topic.to_string(),
                reason,
            }),
            _ => Err(Error::TopicNotFound {
                topic: topic.to_string(),
            }),
        }
    }

    /// Forgets the cached route of `topic` (after creating it).
    pub fn forget(&self, topic: &str) {
        self.lock().remove(topic);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Arc<v1::RouteResponse>)>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The group's node addresses, leader first (stale nodes last).
pub fn node_addresses(group: &v1::BrokerRoute) -> Vec<String> {
    let mut nodes: Vec<&v1::RouteNode> = group.nodes.iter().collect();
    nodes.sort_by_key(|n| (Some(n.node_id) != group.leader_id, n.stale, n.node_id));
    nodes.iter().map(|n| n.address.clone()).collect()
}

/// `host:port` (or `[v6]:port`) split; `None` without a valid port.
pub fn split_host_port(address: &str) -> Option<(String, i32)> {
    let address = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("https://"))
        .unwrap_or(address);
    let (host, port) = address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some((host.to_string(), port as i32))
}

/// The v2 endpoints of one node address: the scheme IPv4 or IPv6 when the host is such an
/// address, DOMAIN_NAME otherwise (never UNSPECIFIED: the Python client then dials an empty
/// target). `None` for an address without a valid port.
pub fn endpoints(address: &str) -> Option<pb::Endpoints> {
    let (host, port) = split_host_port(address)?;
    let scheme = match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => AddressScheme::IPv4,
        Ok(IpAddr::V6(_)) => AddressScheme::IPv6,
        Err(_) => AddressScheme::DomainName,
    };
    Some(pb::Endpoints {
        scheme: scheme as i32,
        addresses: vec![pb::Address { host, port }],
    })
}

/// The v2 message type a topic of `t` accepts.
pub fn message_type(t: TopicMessageType) -> MessageType {
    match t {
        TopicMessageType::Normal => MessageType::Normal,
        TopicMessageType::Fifo => MessageType::Fifo,
        TopicMessageType::Delay => MessageType::Delay,
        TopicMessageType::Transaction => MessageType::Transaction,
    }
}

/// The v2 broker of a group, reached at one of its nodes.
fn broker(group: &v1::BrokerRoute, endpoints: pb::Endpoints) -> pb::Broker {
    pb::Broker {
        name: group.name.clone(),
        id: 0,
        endpoints: Some(endpoints),
    }
}

/// The group's nodes as v2 endpoints, leader first.
fn node_endpoints(group: &v1::BrokerRoute) -> Vec<pb::Endpoints> {
    node_addresses(group)
        .iter()
        .filter_map(|a| endpoints(a))
        .collect()
}

fn queue(
    topic: &pb::Resource,
    id: i32,
    group: &v1::BrokerRoute,
    endpoints: &pb::Endpoints,
    t: TopicMessageType,
) -> pb::MessageQueue {
    pb::MessageQueue {
        topic: Some(topic.clone()),
        id,
        permission: Permission::ReadWrite as i32,
        broker: Some(broker(group, endpoints.clone())),
        accept_message_types: vec![message_type(t) as i32],
    }
}

fn type_of(types: &HashMap<String, TopicMessageType>, group: &v1::BrokerRoute) -> TopicMessageType {
    types
        .get(&group.name)
        .copied()
        .unwrap_or(TopicMessageType::Normal)
}

/// QueryRoute's queues: each queue of each group hosting the topic, once per node of the group
/// (leader first), queue by queue. `types` gives the topic's type on each group (by group name; absent = NORMAL).
pub fn route_queues(
    topic: &pb::Resource,
    route: &v1::RouteResponse,
    types: &HashMap<String, TopicMessageType>,
) -> Vec<pb::MessageQueue> {
    let mut out = Vec::new();
    for g in &route.brokers {
        let t = type_of(types, g);
        // Queue by queue, each at every node in turn: a client that retries a failed send on the
        // next queue of the route (the Python client does) then tries another node.
        let nodes = node_endpoints(g);
        for id in 0..g.queues {
            for e in &nodes {
                out.push(queue(topic, id as i32, g, e, t));
            }
        }
    }
    out
}

/// QueryAssignment's assignments: one queue with id -1 (any queue) per node of each group for a
/// plain group, one per queue and node for a FIFO group.
pub fn assignments(
    topic: &pb::Resource,
    route: &v1::RouteResponse,
    types: &HashMap<String, TopicMessageType>,
    fifo: bool,
) -> Vec<pb::Assignment> {
    if fifo {
        return route_queues(topic, route, types)
            .into_iter()
            .map(|q| pb::Assignment {
                message_queue: Some(q),
            })
            .collect();
    }
    route
        .brokers
        .iter()
        .flat_map(|g| {
            let t = type_of(types, g);
            node_endpoints(g).into_iter().map(move |e| pb::Assignment {
                message_queue: Some(queue(topic, -1, g, &e, t)),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, address: &str) -> v1::RouteNode {
        v1::RouteNode {
            node_id: id,
            address: address.into(),
            role: if id == 2 { "leader" } else { "follower" }.into(),
            term: 3,
            stale: false,
        }
    }

    fn route() -> v1::RouteResponse {
        v1::RouteResponse {
            error: None,
            topic: "T".into(),
            brokers: vec![
                v1::BrokerRoute {
                    cluster: "C".into(),
                    name: "broker-a".into(),
                    leader_id: Some(2),
                    queues: 4,
                    nodes: vec![
                        node(1, "10.0.0.1:10911"),
                        node(2, "10.0.0.2:10911"),
                        node(3, "10.0.0.3:10911"),
                    ],
                    term: 3,
                    limits: None,
                },
                v1::BrokerRoute {
                    cluster: "C".into(),
                    name: "broker-b".into(),
                    leader_id: None,
                    queues: 2,
                    nodes: vec![node(1, "b1:10911"), node(4, "10.0.1.4:10911")],
                    term: 1,
                    limits: None,
                },
            ],
        }
    }

    fn topic() -> pb::Resource {
        pb::Resource {
            resource_namespace: "ns".into(),
            name: "T".into(),
        }
    }

    #[test]
    fn t40_query_route_lists_every_queue_of_every_group_at_every_node() {
        let types = HashMap::from([("broker-b".to_string(), TopicMessageType::Fifo)]);
        let qs = route_queues(&topic(), &route(), &types);
        assert_eq!(qs.len(), 3 * 4 + 2 * 2);
        let a: Vec<_> = qs
            .iter()
            .filter(|q| q.broker.as_ref().unwrap().name == "broker-a")
            .collect();
        assert_eq!(
            a.iter().map(|q| q.id).collect::<Vec<_>>(),
            [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
        );
        for q in &qs {
            assert_eq!(q.topic.as_ref(), Some(&topic()), "namespace echoed");
            assert_eq!(q.permission, Permission::ReadWrite as i32);
            let b = q.broker.as_ref().unwrap();
            assert_eq!(b.id, 0);
            let e = b.endpoints.as_ref().unwrap();
            assert_ne!(e.scheme, AddressScheme::Unspecified as i32);
            assert_eq!(e.addresses.len(), 1, "one address: a valid :authority");
        }
        let hosts: Vec<_> = a
            .iter()
            .take(3)
            .map(|q| {
                let e = q.broker.as_ref().unwrap().endpoints.as_ref().unwrap();
                assert_eq!(e.scheme, AddressScheme::IPv4 as i32);
                (e.addresses[0].host.as_str(), e.addresses[0].port)
            })
            .collect();
        assert_eq!(
            hosts,
            [
                ("10.0.0.2", 10911),
                ("10.0.0.1", 10911),
                ("10.0.0.3", 10911)
            ],
            "every node, leader first"
        );
        assert_eq!(a[0].accept_message_types, [MessageType::Normal as i32]);
        let b: Vec<_> = qs
            .iter()
            .filter(|q| q.broker.as_ref().unwrap().name == "broker-b")
            .collect();
        assert_eq!(b[0].accept_message_types, [MessageType::Fifo as i32]);
        let schemes: Vec<i32> = b
            .iter()
            .map(|q| {
                q.broker
                    .as_ref()
                    .unwrap()
                    .endpoints
                    .as_ref()
                    .unwrap()
                    .scheme
            })
            .collect();
        assert!(
            schemes.contains(&(AddressScheme::DomainName as i32)),
            "b1 is a name"
        );
    }

    #[test]
    fn t41_assignments_one_per_group_and_node_or_per_queue_when_fifo() {
        let types = HashMap::new();
        let a = assignments(&topic(), &route(), &types, false);
        assert_eq!(a.len(), 3 + 2);
        assert!(a.iter().all(|x| x.message_queue.as_ref().unwrap().id == -1));
        assert_eq!(assignments(&topic(), &route(), &types, true).len(), 16);
    }

    #[test]
    fn t42_host_port_splitting() {
        assert_eq!(split_host_port("a:1"), Some(("a".into(), 1)));
        assert_eq!(split_host_port("[::1]:10911"), Some(("::1".into(), 10911)));
        assert_eq!(split_host_port("http://h:2"), Some(("h".into(), 2)));
        assert_eq!(split_host_port("h"), None);
        assert_eq!(split_host_port(":5"), None);
        assert_eq!(split_host_port("h:99999"), None);
        assert_eq!(
            endpoints("[::1]:1").map(|e| e.scheme),
            Some(AddressScheme::IPv6 as i32)
        );
        assert_eq!(endpoints("nope"), None);
    }

    #[test]
    fn t43_type_mapping() {
        assert_eq!(message_type(TopicMessageType::Normal) as i32, 1);
        assert_eq!(message_type(TopicMessageType::Fifo) as i32, 2);
        assert_eq!(message_type(TopicMessageType::Delay) as i32, 3);
        assert_eq!(message_type(TopicMessageType::Transaction) as i32, 4);
    }
}
