//! Output: the JSON shapes of DESIGN.md's contract (scripts rely on them exactly) and plain tables.
//!
//! Numbers a node did not report (it is down) are `null` in JSON and `-` in tables.

use base64::Engine;
use raftmq_client::{ClusterStatus, ReceivedMessage, SendReceipt, TopicRoute};
use serde::Serialize;

/// `cluster status --json`.
#[derive(Debug, Serialize)]
pub struct StatusJson {
    pub clusters: Vec<ClusterJson>,
}

#[derive(Debug, Serialize)]
pub struct ClusterJson {
    pub name: String,
    pub brokers: Vec<BrokerJson>,
}

#[derive(Debug, Serialize)]
pub struct BrokerJson {
    pub name: String,
    pub leader_id: Option<u64>,
    pub term: u64,
    pub nodes: Vec<NodeJson>,
}

#[derive(Debug, Serialize)]
pub struct NodeJson {
    pub node_id: u64,
    pub address: String,
    /// leader | follower | candidate | learner | down
    pub role: String,
    pub term: Option<u64>,
    pub last_log_index: Option<u64>,
    pub committed: Option<u64>,
    pub applied: Option<u64>,
    pub lag: Option<u64>,
    /// Set while the node repairs a log that lost entries it had stored: the index it had stored
    /// up to (it neither votes nor campaigns until it is back there). Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repairing_to: Option<u64>,
    /// Set while the node is far behind the commit index its leader sent it and receives the log:
    /// progress and rate. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catching_up: Option<CatchUpJson>,
    /// Ready: it leads, or follows a live leader and has caught up. `null` when down.
    pub ready: Option<bool>,
    /// Its build's feature level: it applies command tags 0..command_tags (5 for builds before
    /// the level was reported). `null` when down.
    pub command_tags: Option<u32>,
    /// The level every member of its group applies, as it knows them (a leader proposes nothing
    /// above it: a rolling upgrade not finished). `null` when down.
    pub group_command_tags: Option<u32>,
}

/// A node's catch-up in `cluster status --json`.
#[derive(Debug, Serialize)]
pub struct CatchUpJson {
    pub from_index: u64,
    pub at_index: u64,
    pub target_index: u64,
    pub progress_pct: f64,
    pub bytes_per_sec: u64,
}

impl From<&raftmq_client::CatchUpStatus> for CatchUpJson {
    fn from(c: &raftmq_client::CatchUpStatus) -> Self {
        CatchUpJson {
            from_index: c.from_index,
            at_index: c.at_index,
            target_index: c.target_index,
            progress_pct: (c.progress_pct * 10.0).round() / 10.0,
            bytes_per_sec: c.bytes_per_sec,
        }
    }
}

/// `catching up 41 %, 95 MB/s`.
pub fn catch_up_words(c: &raftmq_client::CatchUpStatus) -> String {
    format!(
        "catching up {:.0} %, {:.0} MB/s",
        c.progress_pct.floor(),
        c.bytes_per_sec as f64 / 1e6
    )
}

impl From<&ClusterStatus> for StatusJson {
    fn from(s: &ClusterStatus) -> Self {
        StatusJson {
            clusters: s
                .clusters
                .iter()
                .map(|c| ClusterJson {
                    name: c.name.clone(),
                    brokers: c
                        .brokers
                        .iter()
                        .map(|b| BrokerJson {
                            name: b.name.clone(),
                            leader_id: b.leader_id,
                            term: b.term,
                            nodes: b
                                .nodes
                                .iter()
                                .map(|n| NodeJson {
                                    node_id: n.node_id,
                                    address: n.address.clone(),
                                    role: n.role().to_string(),
                                    term: n.status.as_ref().map(|s| s.term),
                                    last_log_index: n.status.as_ref().map(|s| s.last_log_index),
                                    committed: n.status.as_ref().map(|s| s.committed),
                                    applied: n.status.as_ref().map(|s| s.applied),
                                    lag: n.lag,
                                    repairing_to: n.status.as_ref().and_then(|s| s.repairing_to),
                                    catching_up: n
                                        .status
                                        .as_ref()
                                        .and_then(|s| s.catch_up.as_ref())
                                        .map(CatchUpJson::from),
                                    ready: n.status.as_ref().map(|s| s.ready),
                                    command_tags: n.status.as_ref().map(feature_level),
                                    group_command_tags: n
                                        .status
                                        .as_ref()
                                        .map(|s| s.group_command_tags.max(FIRST_RELEASE_LEVEL)),
                                })
                                .collect(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// `topic route NAME --json`.
#[derive(Debug, Serialize)]
pub struct RouteJson {
    pub topic: String,
    pub brokers: Vec<RouteBrokerJson>,
}

#[derive(Debug, Serialize)]
pub struct RouteBrokerJson {
    pub name: String,
    pub leader_id: Option<u64>,
    pub queues: u32,
    pub nodes: Vec<RouteNodeJson>,
}

#[derive(Debug, Serialize)]
pub struct RouteNodeJson {
    pub node_id: u64,
    pub address: String,
    pub role: String,
}

impl From<&TopicRoute> for RouteJson {
    fn from(r: &TopicRoute) -> Self {
        RouteJson {
            topic: r.topic.clone(),
            brokers: r
                .brokers
                .iter()
                .map(|b| RouteBrokerJson {
                    name: b.name.clone(),
                    leader_id: b.leader_id,
                    queues: b.queues,
                    nodes: b
                        .nodes
                        .iter()
                        .map(|n| RouteNodeJson {
                            node_id: n.node_id,
                            address: n.address.clone(),
                            role: n.role.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// `produce --json`, one per acknowledged message.
#[derive(Debug, Serialize)]
pub struct ProducedJson {
    pub topic: String,
    pub broker: String,
    pub queue: u32,
    pub offset: u64,
    pub msg_id: String,
    /// A scheduled message (DELAY topic): when it becomes readable, ms since the epoch (its
    /// offset is 0 until then). Absent for a message readable now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_at_ms: Option<u64>,
}

impl From<&SendReceipt> for ProducedJson {
    fn from(r: &SendReceipt) -> Self {
        ProducedJson {
            topic: r.topic.clone(),
            broker: r.broker.clone(),
            queue: r.queue,
            offset: r.offset,
            msg_id: r.msg_id.clone(),
            deliver_at_ms: (r.deliver_at_ms > 0).then_some(r.deliver_at_ms),
        }
    }
}

/// `consume --json`, one per message. `body` when the body is UTF-8, else `body_base64`;
/// `served_by` is the id of the node that served the pull.
#[derive(Debug, Serialize)]
pub struct ConsumedJson {
    pub topic: String,
    pub broker: String,
    pub queue: u32,
    pub offset: u64,
    pub msg_id: String,
    pub key: String,
    pub tag: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    pub served_by: Option<u64>,
    /// Store time (the leader's stamp; for a scheduled message, when it was delivered), ms.
    pub store_ms: u64,
    /// A scheduled message's delivery time, ms since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliver_at_ms: Option<u64>,
}

impl From<&ReceivedMessage> for ConsumedJson {
    fn from(m: &ReceivedMessage) -> Self {
        let (body, body_base64) = match std::str::from_utf8(&m.body) {
            Ok(s) => (Some(s.to_string()), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&m.body)),
            ),
        };
        ConsumedJson {
            topic: m.topic.clone(),
            broker: m.broker.clone(),
            queue: m.queue,
            offset: m.offset,
            msg_id: m.msg_id.clone(),
            key: m.key.clone(),
            tag: m.tag.clone(),
            body,
            body_base64,
            served_by: m.served_by.as_ref().map(|n| n.node_id),
            store_ms: m.store_timestamp_ms,
            deliver_at_ms: m
                .properties
                .get(raftmq_proto::DELIVER_AT_PROPERTY)
                .and_then(|v| v.parse().ok()),
        }
    }
}

/// One JSON object on one line.
pub fn json_line<T: Serialize>(v: &T) -> String {
    // Serializing these plain structs cannot fail (string keys, no maps with other keys).
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// A plain text table: a header row and left-aligned columns two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// The feature level of the first release's builds, which do not report one.
const FIRST_RELEASE_LEVEL: u32 = 5;

/// A node's feature level (command tags it applies); a build before the field reports 0.
fn feature_level(s: &raftmq_client::NodeStatusResponse) -> u32 {
    if s.command_tags == 0 {
        FIRST_RELEASE_LEVEL
    } else {
        s.command_tags
    }
}

/// `cluster status` as a table in the spirit of RocketMQ's `clusterList`.
pub fn status_table(s: &ClusterStatus) -> String {
    let dash = || "-".to_string();
    let mut rows = Vec::new();
    for c in &s.clusters {
        for b in &c.brokers {
            for n in &b.nodes {
                let st = n.status.as_ref();
                let num = |f: fn(&raftmq_client::NodeStatusResponse) -> u64| {
                    st.map_or_else(dash, |s| f(s).to_string())
                };
                let rate = |f: fn(&raftmq_client::NodeStatusResponse) -> f64| {
                    st.map_or_else(dash, |s| format!("{:.0}", f(s)))
                };
                let mut role = n.role().to_string();
                if b.leader_id == Some(n.node_id) && role == "leader" {
                    role = "leader *".into();
                }
                if let Some(to) = st.and_then(|s| s.repairing_to) {
                    role = format!("{role} (repairing to {to})");
                } else if let Some(c) = st.and_then(|s| s.catch_up.as_ref()) {
                    role = format!("{role} ({})", catch_up_words(c));
                }
                rows.push(vec![
                    c.name.clone(),
                    b.name.clone(),
                    n.node_id.to_string(),
                    n.address.clone(),
                    role,
                    num(|s| s.term),
                    num(|s| s.last_log_index),
                    num(|s| s.committed),
                    num(|s| s.applied),
                    n.lag.map_or_else(dash, |l| l.to_string()),
                    rate(|s| s.produce_msgs_per_sec),
                    rate(|s| s.pull_msgs_per_sec),
                    st.map_or_else(dash, |s| {
                        let mine = feature_level(s);
                        let group = s.group_command_tags.max(FIRST_RELEASE_LEVEL);
                        if group < mine {
                            format!("{mine} (group {group})")
                        } else {
                            mine.to_string()
                        }
                    }),
                ]);
            }
        }
    }
    table(
        &[
            "CLUSTER",
            "BROKER",
            "NODE",
            "ADDRESS",
            "ROLE",
            "TERM",
            "LAST_LOG",
            "COMMITTED",
            "APPLIED",
            "LAG",
            "PRODUCE/S",
            "PULL/S",
            "FEATURES",
        ],
        &rows,
    )
}

/// A JSON value as a table cell: text as it is, `-` for null, anything else as JSON.
pub fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".into(),
        v => v.to_string(),
    }
}

/// Every (broker, queue) pair of a `topic status` or `group status` JSON value, in order.
pub fn each_queue(
    v: &serde_json::Value,
) -> impl Iterator<Item = (&serde_json::Value, &serde_json::Value)> {
    v["brokers"].as_array().into_iter().flatten().flat_map(|b| {
        b["queues"]
            .as_array()
            .into_iter()
            .flatten()
            .map(move |q| (b, q))
    })
}

/// A time in milliseconds since the epoch as RFC 3339 UTC with milliseconds
/// (`2026-12-04T20:51:07.123Z`); `-` for none.
pub fn time_ms(ms: Option<u64>) -> String {
    ms.and_then(|ms| chrono::DateTime::from_timestamp_millis(ms as i64))
        .map_or_else(
            || "-".to_string(),
            |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )
}

/// A duration in milliseconds, short: `850ms`, `12.3s`, `4m05s`, `3h02m`; `-` for none.
pub fn age_ms(ms: Option<u64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 1000 => format!("{ms}ms"),
        Some(ms) if ms < 60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        Some(ms) if ms < 3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        Some(ms) => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// A message body for JSON: `("body", text)` when it is UTF-8, else `("body_base64", …)`.
pub fn body_field(body: &[u8]) -> (&'static str, String) {
    match std::str::from_utf8(body) {
        Ok(s) => ("body", s.to_string()),
        Err(_) => (
            "body_base64",
            base64::engine::general_purpose::STANDARD.encode(body),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raftmq_client::{BrokerRoute, BrokerView, ClusterView, NodeView, RouteNode};
    use raftmq_proto::v1;
    use serde_json::Value;

    fn sample_status() -> ClusterStatus {
        let live = NodeView {
            node_id: 1,
            address: "127.0.0.1:10911".into(),
            status: Some(v1::NodeStatusResponse {
                node_id: 1,
                role: "leader".into(),
                term: 3,
                last_log_index: 10,
                committed: 10,
                applied: 9,
                produce_msgs_per_sec: 12.4,
                ..Default::default()
            }),
            error: None,
            lag: Some(1),
        };
        let down = NodeView {
            node_id: 2,
            address: "127.0.0.1:10912".into(),
            status: None,
            error: Some("connection refused".into()),
            lag: None,
        };
        ClusterStatus {
            clusters: vec![ClusterView {
                name: "DefaultCluster".into(),
                brokers: vec![BrokerView {
                    name: "broker-a".into(),
                    leader_id: Some(1),
                    term: 3,
                    nodes: vec![live, down],
                }],
            }],
        }
    }

    fn keys(v: &Value) -> Vec<String> {
        let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        k.sort();
        k
    }

    #[test]
    fn status_json_has_the_contract_shape() {
        let v: Value = serde_json::from_str(&json_line(&StatusJson::from(&sample_status())))
            .expect("valid json");
        let b = &v["clusters"][0]["brokers"][0];
        assert_eq!(v["clusters"][0]["name"], "DefaultCluster");
        assert_eq!(keys(b), vec!["leader_id", "name", "nodes", "term"]);
        assert_eq!(
            (b["leader_id"].as_u64(), b["term"].as_u64()),
            (Some(1), Some(3))
        );
        let n = &b["nodes"][0];
        assert_eq!(
            keys(n),
            vec![
                "address",
                "applied",
                "command_tags",
                "committed",
                "group_command_tags",
                "lag",
                "last_log_index",
                "node_id",
                "ready",
                "role",
                "term"
            ]
        );
        assert_eq!(n["role"], "leader");
        assert_eq!(n["applied"], 9);
        // A build before feature levels reports none: the first release's five commands.
        assert_eq!(n["command_tags"], 5);
        assert_eq!(b["nodes"][1]["role"], "down");
        assert!(b["nodes"][1]["command_tags"].is_null());
        assert!(b["nodes"][1]["term"].is_null());
    }

    #[test]
    fn status_table_shows_down_nodes() {
        let t = status_table(&sample_status());
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("CLUSTER"));
        assert!(lines[1].contains("leader *") && lines[1].contains("12"));
        assert!(lines[2].contains("down"));
    }

    #[test]
    fn a_node_repairing_its_log_says_so_in_the_table_and_the_json() {
        let mut s = sample_status();
        let node = &mut s.clusters[0].brokers[0].nodes[0];
        if let Some(st) = node.status.as_mut() {
            st.role = "follower".into();
            st.repairing_to = Some(1234);
        }
        let t = status_table(&s);
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .contains("follower (repairing to 1234)"),
            "{t}"
        );
        let v: Value = serde_json::from_str(&json_line(&StatusJson::from(&s))).unwrap();
        let nodes = &v["clusters"][0]["brokers"][0]["nodes"];
        assert_eq!(nodes[0]["repairing_to"], 1234);
        assert!(nodes[1].get("repairing_to").is_none());
    }

    #[test]
    fn a_node_catching_up_shows_progress_and_rate_in_the_table_and_the_json() {
        let mut s = sample_status();
        let node = &mut s.clusters[0].brokers[0].nodes[0];
        if let Some(st) = node.status.as_mut() {
            st.role = "follower".into();
            st.catch_up = Some(raftmq_client::CatchUpStatus {
                from_index: 0,
                at_index: 4100,
                target_index: 10_000,
                progress_pct: 41.0,
                bytes_per_sec: 95_000_000,
            });
        }
        let t = status_table(&s);
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .contains("follower (catching up 41 %, 95 MB/s)"),
            "{t}"
        );
        let v: Value = serde_json::from_str(&json_line(&StatusJson::from(&s))).unwrap();
        let nodes = &v["clusters"][0]["brokers"][0]["nodes"];
        assert_eq!(nodes[0]["catching_up"]["progress_pct"], 41.0);
        assert_eq!(nodes[0]["catching_up"]["bytes_per_sec"], 95_000_000);
        assert_eq!(nodes[0]["catching_up"]["target_index"], 10_000);
        assert!(nodes[1].get("catching_up").is_none());
        assert_eq!(nodes[1]["ready"], Value::Null);
    }

    #[test]
    fn route_json_has_the_contract_shape() {
        let r = TopicRoute {
            topic: "t".into(),
            brokers: vec![BrokerRoute {
                cluster: "c".into(),
                name: "broker-a".into(),
                leader_id: Some(2),
                queues: 8,
                term: 4,
                limits: Default::default(),
                nodes: vec![RouteNode {
                    node_id: 2,
                    address: "h:2".into(),
                    role: "leader".into(),
                    term: 4,
                }],
            }],
        };
        let v: Value = serde_json::from_str(&json_line(&RouteJson::from(&r))).expect("json");
        assert_eq!(keys(&v), vec!["brokers", "topic"]);
        assert_eq!(
            keys(&v["brokers"][0]),
            vec!["leader_id", "name", "nodes", "queues"]
        );
        assert_eq!(
            keys(&v["brokers"][0]["nodes"][0]),
            vec!["address", "node_id", "role"]
        );
        assert_eq!(v["brokers"][0]["queues"], 8);
    }

    #[test]
    fn produce_and_consume_json_shapes() {
        let r = SendReceipt {
            topic: "t".into(),
            broker: "broker-a".into(),
            queue: 1,
            offset: 7,
            msg_id: "m".into(),
            duplicate: false,
            deliver_at_ms: 0,
        };
        let v: Value = serde_json::from_str(&json_line(&ProducedJson::from(&r))).expect("json");
        assert_eq!(
            keys(&v),
            vec!["broker", "msg_id", "offset", "queue", "topic"]
        );

        let mut m = ReceivedMessage {
            topic: "t".into(),
            broker: "broker-a".into(),
            queue: 1,
            offset: 7,
            msg_id: "m".into(),
            key: "k".into(),
            tag: "x".into(),
            body: b"hello".to_vec().into(),
            properties: Default::default(),
            store_timestamp_ms: 0,
            served_by: Some(v1::NodeRef {
                node_id: 3,
                address: "h:3".into(),
            }),
        };
        let v: Value = serde_json::from_str(&json_line(&ConsumedJson::from(&m))).expect("json");
        assert_eq!(
            keys(&v),
            vec![
                "body",
                "broker",
                "key",
                "msg_id",
                "offset",
                "queue",
                "served_by",
                "store_ms",
                "tag",
                "topic"
            ]
        );
        assert_eq!(v["body"], "hello");
        assert_eq!(v["served_by"], 3);
        m.body = vec![0xff, 0x00].into();
        let v: Value = serde_json::from_str(&json_line(&ConsumedJson::from(&m))).expect("json");
        assert_eq!(v["body_base64"], "/wA=");
        assert!(v.get("body").is_none());
    }
}
