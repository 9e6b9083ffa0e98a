//! Prometheus metrics of the nameserver, rendered as text at `GET /metrics`.

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, TextEncoder};

use crate::error::Error;
use crate::registry::Registry;

/// The nameserver's metrics, in their own Prometheus registry (no global state, so several
/// nameservers can run in one test process).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: prometheus::Registry,
    /// Nodes currently registered.
    pub nodes: IntGauge,
    /// Broker groups currently registered.
    pub brokers: IntGauge,
    /// Registrations received, by `result` (`ok` or `refused`).
    pub registrations: IntCounterVec,
    /// Nodes that unregistered.
    pub unregistrations: IntCounter,
    /// Nodes dropped because they stopped registering.
    pub expirations: IntCounter,
    /// Route requests, by `result` (`ok`, `topic_not_found`, `invalid_argument`).
    pub route_requests: IntCounterVec,
    /// Cluster-info requests.
    pub cluster_info_requests: IntCounter,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Metrics, Error> {
        let registry = prometheus::Registry::new();
        let nodes = IntGauge::new(
            "raftmq_nameserver_nodes",
            "Broker nodes currently registered",
        )?;
        let brokers = IntGauge::new(
            "raftmq_nameserver_brokers",
            "Broker groups currently registered",
        )?;
        let registrations = IntCounterVec::new(
            Opts::new(
                "raftmq_nameserver_registrations_total",
                "Registrations received, by result",
            ),
            &["result"],
        )?;
        let unregistrations = IntCounter::new(
            "raftmq_nameserver_unregistrations_total",
            "Nodes removed by an unregister request",
        )?;
        let expirations = IntCounter::new(
            "raftmq_nameserver_expirations_total",
            "Nodes removed because they stopped registering",
        )?;
        let route_requests = IntCounterVec::new(
            Opts::new(
                "raftmq_nameserver_route_requests_total",
                "Route requests, by result",
            ),
            &["result"],
        )?;
        let cluster_info_requests = IntCounter::new(
            "raftmq_nameserver_cluster_info_requests_total",
            "Cluster info requests",
        )?;
        registry.register(Box::new(nodes.clone()))?;
        registry.register(Box::new(brokers.clone()))?;
        registry.register(Box::new(registrations.clone()))?;
        registry.register(Box::new(unregistrations.clone()))?;
        registry.register(Box::new(expirations.clone()))?;
        registry.register(Box::new(route_requests.clone()))?;
        registry.register(Box::new(cluster_info_requests.clone()))?;
        // Make the labelled series visible at 0 before the first request.
        for result in ["ok", "refused"] {
            registrations.with_label_values(&[result]);
        }
        for result in ["ok", "topic_not_found", "invalid_argument"] {
            route_requests.with_label_values(&[result]);
        }
        Ok(Metrics {
            registry,
            nodes,
            brokers,
            registrations,
            unregistrations,
            expirations,
            route_requests,
            cluster_info_requests,
        })
    }

    /// Updates the gauges from the registry's current size.
    pub fn observe(&self, registry: &Registry) {
        self.nodes
            .set(i64::try_from(registry.node_count()).unwrap_or(i64::MAX));
        self.brokers
            .set(i64::try_from(registry.broker_count()).unwrap_or(i64::MAX));
    }

    /// Every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec fails only on a malformed metric family, which `new` rules out.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}
