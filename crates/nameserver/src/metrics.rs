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
    /// NameserverService calls refused by auth, by `result` (`unauthenticated` or `forbidden`);
    /// a refused call is counted here only.
    pub refused_requests: IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Metrics, Error> {
        let registry = prometheus::Registry::new();
        let nodes = registered(
            &registry,
            IntGauge::new(
                "raftmq_nameserver_nodes",
                "Broker nodes currently registered",
            )?,
        )?;
        let brokers = registered(
            &registry,
            IntGauge::new(
                "raftmq_nameserver_brokers",
                "Broker groups currently registered",
            )?,
        )?;
        let registrations = by_result(
            &registry,
            "raftmq_nameserver_registrations_total",
            "Registrations received, by result",
            &["ok", "refused"],
        )?;
        let unregistrations = registered(
            &registry,
            IntCounter::new(
                "raftmq_nameserver_unregistrations_total",
                "Nodes removed by an unregister request",
            )?,
        )?;
        let expirations = registered(
            &registry,
            IntCounter::new(
                "raftmq_nameserver_expirations_total",
                "Nodes removed because they stopped registering",
            )?,
        )?;
        let route_requests = by_result(
            &registry,
            "raftmq_nameserver_route_requests_total",
            "Route requests, by result",
            &["ok", "topic_not_found", "invalid_argument"],
        )?;
        let cluster_info_requests = registered(
            &registry,
            IntCounter::new(
                "raftmq_nameserver_cluster_info_requests_total",
                "Cluster info requests",
            )?,
        )?;
        let refused_requests = by_result(
            &registry,
            "raftmq_nameserver_refused_requests_total",
            "NameserverService calls refused by auth, by result",
            &["unauthenticated", "forbidden"],
        )?;
        Ok(Metrics {
            registry,
            nodes,
            brokers,
            registrations,
            unregistrations,
            expirations,
            route_requests,
            cluster_info_requests,
            refused_requests,
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

/// Registers `metric` in `registry` and hands it back.
fn registered<M>(registry: &prometheus::Registry, metric: M) -> Result<M, Error>
where
    M: prometheus::core::Collector + Clone + 'static,
{
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

/// A registered counter labelled `result`, each of `results` visible at 0 before the first
/// request.
fn by_result(
    registry: &prometheus::Registry,
    name: &str,
    help: &str,
    results: &[&str],
) -> Result<IntCounterVec, Error> {
    let counter = registered(
        registry,
        IntCounterVec::new(Opts::new(name, help), &["result"])?,
    )?;
    for result in results {
        counter.with_label_values(&[*result]);
    }
    Ok(counter)
}
