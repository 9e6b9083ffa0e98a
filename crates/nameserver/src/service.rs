//! The gRPC `NameserverService` over a shared [`Registry`], and the expiry task.
//!
//! API errors go back inside the reply's `error` field with their stable code, never as a gRPC
//! status: a transport-level status means the call itself failed. Handlers stamp a registration
//! with the time it arrives; only the expiry task decides, on its own tick, what to remove. The registry lock is a plain
//! mutex held only for in-memory work, never across an `.await`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use raftmq_proto::v1::nameserver_service_server::NameserverService;
use raftmq_proto::v1::{
    ClusterInfoRequest, ClusterInfoResponse, RegisterRequest, RegisterResponse, RouteRequest,
    RouteResponse, UnregisterRequest, UnregisterResponse,
};
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::metrics::Metrics;
use crate::registry::Registry;

/// The registry shared by the service handlers and the expiry task.
pub type SharedRegistry = Arc<Mutex<Registry>>;

/// Implementation of `raftmq.v1.NameserverService`.
#[derive(Debug, Clone)]
pub struct Nameserver {
    registry: SharedRegistry,
    metrics: Arc<Metrics>,
}

impl Nameserver {
    /// A service answering from `registry` and counting into `metrics`.
    pub fn new(registry: SharedRegistry, metrics: Arc<Metrics>) -> Self {
        Nameserver { registry, metrics }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        lock(&self.registry)
    }
}

/// Locks the registry. A panic while holding the lock cannot leave the registry half-updated
/// (every mutation validates first and then writes one map entry), so a poisoned lock is used as is.
fn lock(registry: &SharedRegistry) -> MutexGuard<'_, Registry> {
    registry
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[tonic::async_trait]
impl NameserverService for Nameserver {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> Result<Response<RegisterResponse>, Status> {
        let req = request.into_inner();
        let (result, expiry) = {
            let mut reg = self.lock();
            let result = reg.register(&req, Instant::now());
            self.metrics.observe(&reg);
            (result, reg.expiry())
        };
        let error = match result {
            Ok(out) => {
                self.metrics.registrations.with_label_values(&["ok"]).inc();
                if out.previous_role != Some(out.role) {
                    tracing::info!(
                        cluster = %req.cluster, broker = %req.broker, node_id = req.node_id,
                        address = %req.address, term = req.term,
                        previous_role = out.previous_role.map(|r| r.as_str()).unwrap_or("none"),
                        role = %out.role, "node registered"
                    );
                } else {
                    tracing::debug!(
                        cluster = %req.cluster, broker = %req.broker, node_id = req.node_id,
                        "registration refreshed"
                    );
                }
                None
            }
            Err(e) => {
                self.metrics
                    .registrations
                    .with_label_values(&["refused"])
                    .inc();
                tracing::warn!(
                    cluster = %req.cluster, broker = %req.broker, node_id = req.node_id,
                    address = %req.address, error = %e, "registration refused"
                );
                Some(e.to_proto())
            }
        };
        Ok(Response::new(RegisterResponse {
            error,
            expiry_secs: expiry.as_secs(),
        }))
    }

    async fn unregister(
        &self,
        request: Request<UnregisterRequest>,
    ) -> Result<Response<UnregisterResponse>, Status> {
        let req = request.into_inner();
        let result = {
            let mut reg = self.lock();
            let result = reg.unregister(&req.cluster, &req.broker, req.node_id);
            self.metrics.observe(&reg);
            result
        };
        let error = match result {
            Ok(removed) => {
                if removed {
                    self.metrics.unregistrations.inc();
                    tracing::info!(
                        cluster = %req.cluster, broker = %req.broker, node_id = req.node_id,
                        "node unregistered"
                    );
                }
                None
            }
            Err(e) => Some(e.to_proto()),
        };
        Ok(Response::new(UnregisterResponse { error }))
    }

    async fn route(
        &self,
        request: Request<RouteRequest>,
    ) -> Result<Response<RouteResponse>, Status> {
        let topic = request.into_inner().topic;
        let result = self.lock().route(&topic, Instant::now());
        let (label, reply) = match result {
            Ok(brokers) => (
                "ok",
                RouteResponse {
                    error: None,
                    topic,
                    brokers,
                },
            ),
            Err(e) => {
                let label = match e {
                    Error::TopicNotFound { .. } => "topic_not_found",
                    _ => "invalid_argument",
                };
                (
                    label,
                    RouteResponse {
                        error: Some(e.to_proto()),
                        topic,
                        brokers: Vec::new(),
                    },
                )
            }
        };
        self.metrics
            .route_requests
            .with_label_values(&[label])
            .inc();
        Ok(Response::new(reply))
    }

    async fn get_cluster_info(
        &self,
        _request: Request<ClusterInfoRequest>,
    ) -> Result<Response<ClusterInfoResponse>, Status> {
        let clusters = self.lock().cluster_info(Instant::now());
        self.metrics.cluster_info_requests.inc();
        Ok(Response::new(ClusterInfoResponse {
            error: None,
            clusters,
        }))
    }
}

/// The task that owns the clock for expiry: every `interval` it removes the nodes that have been
/// silent for the registry's expiry period, logs each, and updates the metrics. Runs until
/// dropped or aborted.
pub async fn run_expiry(registry: SharedRegistry, metrics: Arc<Metrics>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let expired = {
            let mut reg = lock(&registry);
            let expired = reg.expire(Instant::now());
            metrics.observe(&reg);
            expired
        };
        for n in &expired {
            tracing::info!(
                cluster = %n.cluster, broker = %n.broker, node_id = n.node_id, address = %n.address,
                silent_ms = u64::try_from(n.silent_for.as_millis()).unwrap_or(u64::MAX),
                "node expired"
            );
        }
        metrics.expirations.inc_by(expired.len() as u64);
    }
}
