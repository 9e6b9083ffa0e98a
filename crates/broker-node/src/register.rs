//! Registration with every nameserver: at start, every `register_interval_ms`, and at once when the
//! role, term, leader or topics change (so routes follow an election within a second).
//!
//! A registration also carries the send limits this node enforces, which the nameservers hand to
//! clients in each route: a client checks a batch against the group it sends to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
use raftmq_proto::v1::{RegisterRequest, TopicQueues};
use tonic::transport::{Channel, Endpoint};

use crate::node::Node;

fn request(node: &Node) -> RegisterRequest {
    let st = node.member.status();
    let topics = {
        let s = node.state();
        s.topic_list()
            .into_iter()
            .map(|(topic, queues)| TopicQueues { topic, queues })
            .collect()
    };
    RegisterRequest {
        cluster: node.cfg.cluster.clone(),
        broker: node.cfg.broker.clone(),
        node_id: node.cfg.node_id,
        address: node.address.clone(),
        role: st.role.as_str().into(),
        term: st.term,
        leader_id: st.leader,
        last_log_index: st.last_log_index,
        committed: st.committed,
        applied: st.applied,
        topics,
        limits: Some(node.cfg.limits.send_limits().to_wire()),
    }
}

/// What, when it changes, calls for an immediate registration.
fn fingerprint(node: &Node) -> (String, u64, Option<u64>, u64) {
    let st = node.member.status();
    let tv = node.state_value(|s| s.topic_version);
    (st.role.as_str().to_string(), st.term, st.leader, tv)
}

pub fn spawn(node: Arc<Node>) {
    let channels: Vec<(String, Channel)> = node
        .cfg
        .nameserver_list()
        .into_iter()
        .filter_map(|ns| {
            let uri = if ns.starts_with("http") { ns.clone() } else { format!("http://{ns}") };
            match Endpoint::from_shared(uri) {
                Ok(ep) => Some((ns, ep.connect_timeout(Duration::from_millis(500)).timeout(Duration::from_secs(2)).connect_lazy())),
                Err(e) => {
                    tracing::error!(nameserver = %ns, error = %e, "bad nameserver address; not registering with it");
                    None
                }
            }
        })
        .collect();
    if channels.is_empty() {
        return;
    }
    let interval = Duration::from_millis(node.cfg.register_interval_ms);
    tokio::spawn(async move {
        let mut watch = node.member.watch();
        let mut last_fp = None;
        let mut last_sent = Instant::now() - interval;
        loop {
            let fp = fingerprint(&node);
            if Some(&fp) != last_fp.as_ref() || last_sent.elapsed() >= interval {
                let req = request(&node);
                let calls = channels.iter().map(|(ns, ch)| {
                    let mut c = NameserverServiceClient::new(ch.clone());
                    let req = req.clone();
                    async move {
                        match c.register(req).await {
                            Ok(r) => match r.into_inner().error {
                                Some(e) if e.code != 0 => {
                                    tracing::warn!(nameserver = %ns, error = %e, "registration refused");
                                    false
                                }
                                _ => true,
                            },
                            Err(s) => {
                                tracing::debug!(nameserver = %ns, status = %s, "registration failed");
                                false
                            }
                        }
                    }
                });
                let all_ok = futures::future::join_all(calls)
                    .await
                    .into_iter()
                    .all(|ok| ok);
                // A nameserver that missed this registration is retried on the next round.
                last_fp = all_ok.then_some(fp);
                last_sent = Instant::now();
            }
            // Wake on a status change, and at least every 200 ms to see topic changes.
            let _ = tokio::time::timeout(Duration::from_millis(200), watch.changed()).await;
        }
    });
}
