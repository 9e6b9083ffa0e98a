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
fn fingerprint(node: &Node) -> (&'static str, u64, Option<u64>, u64) {
    let (role, term, leader) = node
        .member
        .status_with(|st| (st.role.as_str(), st.term, st.leader));
    let tv = node.state_value(|s| s.topic_version);
    (role, term, leader, tv)
}

/// How often `dns:` nameserver entries are resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(5);

/// A channel to the nameserver at `addr`; over TLS when `tls` is set, checking the nameserver's
/// certificate for `domain` (the `dns:` name an address was resolved from) or else `addr`'s host.
fn channel(
    addr: &str,
    tls: Option<&Arc<raftmq_security::tls::Tls>>,
    domain: Option<&str>,
) -> Option<Channel> {
    let uri = raftmq_security::tls::uri(addr, tls.is_some());
    let ep = Endpoint::from_shared(uri).and_then(|ep| match tls {
        Some(t) => {
            let mut cfg = t.client_config();
            if let Some(d) = domain {
                cfg = cfg.domain_name(d);
            }
            ep.tls_config(cfg)
        }
        None => Ok(ep),
    });
    match ep {
        Ok(ep) => Some(
            ep.connect_timeout(Duration::from_millis(500))
                .timeout(Duration::from_secs(2))
                .connect_lazy(),
        ),
        Err(e) => {
            tracing::error!(nameserver = %addr, error = %e, "bad nameserver address; not registering with it");
            None
        }
    }
}

/// The nameservers to register with: fixed `host:port` entries, and `dns:NAME:PORT` entries that
/// stand for every address NAME resolves to (a Kubernetes headless Service in front of a
/// Deployment of nameservers), resolved again every few seconds.
struct Nameservers {
    tls: Option<Arc<raftmq_security::tls::Tls>>,
    fixed: Vec<(String, Channel)>,
    dns: Vec<String>,
    resolved: std::collections::BTreeMap<String, Channel>,
    resolved_at: Option<Instant>,
}

impl Nameservers {
    fn new(list: Vec<String>, tls: Option<Arc<raftmq_security::tls::Tls>>) -> Self {
        let (dns, fixed): (Vec<_>, Vec<_>) =
            list.into_iter().partition(|ns| ns.starts_with("dns:"));
        Nameservers {
            fixed: fixed
                .into_iter()
                .filter_map(|ns| channel(&ns, tls.as_ref(), None).map(|c| (ns, c)))
                .collect(),
            tls,
            dns: dns
                .into_iter()
                .map(|d| d.trim_start_matches("dns:").to_string())
                .collect(),
            resolved: Default::default(),
            resolved_at: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.fixed.is_empty() && self.dns.is_empty()
    }

    /// Resolves the `dns:` entries when due; true when the set of addresses changed.
    async fn refresh(&mut self) -> bool {
        if self.dns.is_empty()
            || self
                .resolved_at
                .is_some_and(|t| t.elapsed() < RESOLVE_EVERY)
        {
            return false;
        }
        self.resolved_at = Some(Instant::now());
        let mut now = std::collections::BTreeMap::new();
        for name in &self.dns {
            let host = name.rsplit_once(':').map_or(name.as_str(), |(h, _)| h);
            match tokio::net::lookup_host(name.as_str()).await {
                Ok(addrs) => now.extend(addrs.map(|a| (a.to_string(), host.to_string()))),
                Err(e) => tracing::debug!(nameserver = %name, error = %e, "cannot resolve"),
            }
        }
        let before: std::collections::BTreeSet<_> = self.resolved.keys().cloned().collect();
        if before == now.keys().cloned().collect() {
            return false;
        }
        tracing::info!(nameservers = ?now.keys(), "nameserver addresses resolved");
        self.resolved.retain(|a, _| now.contains_key(a));
        for (a, host) in now {
            if !self.resolved.contains_key(&a)
                && let Some(c) = channel(&a, self.tls.as_ref(), Some(&host))
            {
                self.resolved.insert(a, c);
            }
        }
        true
    }

    fn all(&self) -> impl Iterator<Item = (&String, &Channel)> {
        self.fixed
            .iter()
            .map(|(a, c)| (a, c))
            .chain(self.resolved.iter())
    }
}

pub fn spawn(node: Arc<Node>) {
    let mut nameservers = Nameservers::new(node.cfg.nameserver_list(), node.tls.clone());
    if nameservers.is_empty() {
        return;
    }
    let interval = Duration::from_millis(node.cfg.register_interval_ms);
    tokio::spawn(async move {
        let mut watch = node.member.watch();
        let mut last_fp = None;
        let mut last_sent = Instant::now() - interval;
        loop {
            // A stopping node registers no more (the nameservers expire it; they refuse the
            // role "down" anyway).
            if node.member.status_with(|st| st.role) == raftmq_raft_log::Role::Shutdown {
                return;
            }
            if nameservers.refresh().await {
                last_fp = None;
            }
            let fp = fingerprint(&node);
            if Some(&fp) != last_fp.as_ref() || last_sent.elapsed() >= interval {
                let req = request(&node);
                let calls = nameservers.all().map(|(ns, ch)| {
                    let mut c = NameserverServiceClient::with_interceptor(ch.clone(), node.signer());
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
