//! The gRPC `NameserverService` over a shared [`Registry`], its [`Gatekeeper`], and the expiry
//! task.
//!
//! API errors go back inside the reply's `error` field with their stable code, never as a gRPC
//! status: a transport-level status means the call itself failed. Auth refusals too: the
//! [`Gatekeeper`] interceptor puts a [`Caller`] on every call, each handler first asks
//! [`auth::authorize`], and a refused call touches nothing. Handlers stamp a registration with the
//! time it arrives; only the expiry task decides, on its own tick, what to remove. The registry
//! lock is a plain mutex held only for in-memory work, never across an `.await`.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use raftmq_proto::v1::nameserver_service_server::NameserverService;
use raftmq_proto::v1::{
    ClusterInfoRequest, ClusterInfoResponse, RegisterRequest, RegisterResponse, RouteRequest,
    RouteResponse, UnregisterRequest, UnregisterResponse,
};
use tonic::{Request, Response, Status};

use crate::auth::{self, Action, Caller, Gate};
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
    /// A service answering from `registry` and counting into `metrics`. Serve it behind a
    /// [`Gatekeeper`]: a call that did not pass one has no credentials and is refused.
    pub fn new(registry: SharedRegistry, metrics: Arc<Metrics>) -> Self {
        Nameserver { registry, metrics }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        lock(&self.registry)
    }

    /// Whether the call's caller (set by the [`Gatekeeper`]) may do `action`; a refusal is
    /// counted and logged here, and answered by the handler.
    fn admit<T>(&self, request: &Request<T>, action: Action) -> Result<(), Error> {
        let caller = request.extensions().get::<Caller>();
        self.count_refusal(request, action, auth::authorize(caller, action))
    }

    /// [`Self::admit`] for a registration or an unregistration of one node: a node certificate
    /// may name only itself.
    fn admit_node<T>(
        &self,
        request: &Request<T>,
        action: Action,
        cluster: &str,
        broker: &str,
        node_id: u64,
    ) -> Result<(), Error> {
        let caller = request.extensions().get::<Caller>();
        let result = auth::authorize_node(caller, action, cluster, broker, node_id);
        self.count_refusal(request, action, result)
    }

    /// Counts and logs a refusal; gives `result` back.
    fn count_refusal<T>(
        &self,
        request: &Request<T>,
        action: Action,
        result: Result<(), Error>,
    ) -> Result<(), Error> {
        if let Err(e) = &result {
            let label = match e {
                Error::Forbidden { .. } | Error::NotThisNode { .. } => "forbidden",
                _ => "unauthenticated",
            };
            self.metrics
                .refused_requests
                .with_label_values(&[label])
                .inc();
            let peer = request.remote_addr();
            if action.changes_registry() {
                tracing::warn!(?peer, call = action.as_str(), error = %e, "call refused");
            } else {
                tracing::debug!(?peer, call = action.as_str(), error = %e, "call refused");
            }
        }
        result
    }
}

/// The interceptor in front of the NameserverService: identifies each call by its verified
/// client certificate or its signature (see [`Gate::identify`]) and puts the [`Caller`] in the
/// request's extensions. It refuses nothing itself: refusals go in the reply's `error` field.
#[derive(Debug, Clone, Default)]
pub struct Gatekeeper(Option<Arc<Gate>>);

impl Gatekeeper {
    /// A gatekeeper for `gate`; `None` (auth off) marks every call [`Caller::Open`].
    pub fn new(gate: Option<Arc<Gate>>) -> Self {
        Gatekeeper(gate)
    }
}

impl tonic::service::Interceptor for Gatekeeper {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let caller = match &self.0 {
            None => Caller::Open,
            Some(gate) => {
                use raftmq_security::sign::{AUTHORIZATION, DATE_TIME, now_secs};
                let certs = request.peer_certs();
                let header = |name| request.metadata().get(name).and_then(|v| v.to_str().ok());
                gate.identify(
                    certs.as_deref().map(Vec::as_slice),
                    header(AUTHORIZATION),
                    header(DATE_TIME),
                    now_secs(),
                )
            }
        };
        request.extensions_mut().insert(caller);
        Ok(request)
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
        let r = request.get_ref();
        if let Err(e) =
            self.admit_node(&request, Action::Register, &r.cluster, &r.broker, r.node_id)
        {
            return Ok(Response::new(RegisterResponse {
                error: Some(e.to_proto()),
                expiry_secs: 0,
            }));
        }
        let by = caller_of(&request);
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
                        role = %out.role, %by, "node registered"
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
        let r = request.get_ref();
        if let Err(e) = self.admit_node(
            &request,
            Action::Unregister,
            &r.cluster,
            &r.broker,
            r.node_id,
        ) {
            return Ok(Response::new(UnregisterResponse {
                error: Some(e.to_proto()),
            }));
        }
        let by = caller_of(&request);
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
                        %by, "node unregistered"
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
        let admitted = self.admit(&request, Action::Route);
        let topic = request.into_inner().topic;
        if let Err(e) = admitted {
            return Ok(Response::new(RouteResponse {
                error: Some(e.to_proto()),
                topic,
                brokers: Vec::new(),
            }));
        }
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
        request: Request<ClusterInfoRequest>,
    ) -> Result<Response<ClusterInfoResponse>, Status> {
        if let Err(e) = self.admit(&request, Action::ClusterInfo) {
            return Ok(Response::new(ClusterInfoResponse {
                error: Some(e.to_proto()),
                clusters: Vec::new(),
            }));
        }
        let clusters = self.lock().cluster_info(Instant::now());
        self.metrics.cluster_info_requests.inc();
        Ok(Response::new(ClusterInfoResponse {
            error: None,
            clusters,
        }))
    }
}

/// Who made an admitted call, for the log.
fn caller_of<T>(request: &Request<T>) -> String {
    request
        .extensions()
        .get::<Caller>()
        .map_or_else(|| "unknown".into(), Caller::to_string)
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
