//! The runtime: binds the one port, serves every service on it, and runs the expiry task.
//!
//! On the port: gRPC `raftmq.v1.NameserverService`, `grpc.health.v1.Health` (set serving),
//! gRPC reflection (v1 and v1alpha), and HTTP/1.1 or HTTP/2 `GET /metrics` (Prometheus text).
//! A connection that sends garbage is closed by the HTTP layer; other connections are unaffected.
//!
//! With `tls_ca`, `tls_cert` and `tls_key` the port speaks TLS only (`/metrics` too): handshakes
//! run off the accept loop, a client certificate is asked for but optional (verified against the
//! CA bundle when given), and the files are looked at every `tls_reload_ms` so certificates rotate
//! without a restart. With `auth` on, the NameserverService's calls pass the
//! [`service::Gatekeeper`]; health, reflection and `/metrics` stay open.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::routing::get;
use raftmq_proto::v1::nameserver_service_server::NameserverServiceServer;
use raftmq_security::tls::Tls;
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;

use crate::auth::Gate;
use crate::config::{Args, Config};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::service::{self, SharedRegistry};

/// A nameserver whose port is bound but which does not serve yet: [`Server::local_addr`] tells
/// the actual port when the config asked for port 0.
#[derive(Debug)]
pub struct Server {
    config: Config,
    listener: TcpListener,
    local_addr: SocketAddr,
    registry: SharedRegistry,
    metrics: Arc<Metrics>,
    tls: Option<Arc<Tls>>,
}

impl Server {
    /// Validates `config`, loads its TLS files, and binds its listen address.
    pub async fn bind(config: Config) -> Result<Server, Error> {
        config.validate()?;
        let tls = config
            .tls_files()
            .map(Tls::load)
            .transpose()
            .map_err(Error::Tls)?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: config.listen,
            source,
        })?;
        let registry = Arc::new(Mutex::new(Registry::new(config.expiry())));
        let metrics = Arc::new(Metrics::new()?);
        Ok(Server {
            config,
            listener,
            local_addr,
            registry,
            metrics,
            tls,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The registry the service answers from (for in-process inspection).
    pub fn registry(&self) -> SharedRegistry {
        Arc::clone(&self.registry)
    }

    /// Serves until `shutdown` completes, then stops accepting, lets in-flight calls finish and
    /// stops the expiry task.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
        let Server {
            config,
            listener,
            local_addr,
            registry,
            metrics,
            tls,
        } = self;

        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<NameserverServiceServer<service::Nameserver>>()
            .await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(raftmq_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(raftmq_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;

        let gate = Gate::new(&config).map(Arc::new);
        let nameserver = service::Nameserver::new(Arc::clone(&registry), Arc::clone(&metrics));
        let metrics_for_http = Arc::clone(&metrics);
        let router = Routes::new(NameserverServiceServer::with_interceptor(
            nameserver,
            service::Gatekeeper::new(gate.clone()),
        ))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .into_axum_router()
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics_for_http);
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        metrics.render(),
                    )
                }
            }),
        );

        let expiry_task = tokio::spawn(service::run_expiry(
            Arc::clone(&registry),
            Arc::clone(&metrics),
            config.scan_interval(),
        ));
        tracing::info!(
            expiry_secs = config.expiry_secs,
            scan_interval_ms = config.scan_interval_ms,
            "listening on {local_addr}"
        );
        warn_what_is_open(&config, local_addr, tls.as_deref(), gate.as_deref());

        let router = tonic::transport::Server::builder()
            .accept_http1(true)
            .add_routes(Routes::from(router));
        let result = match tls {
            Some(tls) => {
                tls.spawn_reload(config.tls_reload());
                router
                    .serve_with_incoming_shutdown(
                        raftmq_security::tls::incoming(listener, tls),
                        shutdown,
                    )
                    .await
            }
            None => {
                router
                    .serve_with_incoming_shutdown(
                        // tonic ignores tcp_nodelay for a stream of accepted sockets: set it on
                        // each.
                        TcpListenerStream::new(listener).map(|s| {
                            if let Ok(s) = &s {
                                let _ = s.set_nodelay(true);
                            }
                            s
                        }),
                        shutdown,
                    )
                    .await
            }
        };
        expiry_task.abort();
        tracing::info!("nameserver stopped");
        result.map_err(Error::from)
    }
}

/// Says at start what is protected: a loud warning for TLS off and for auth off, naming what that
/// exposes, else one line on what is on.
fn warn_what_is_open(config: &Config, addr: SocketAddr, tls: Option<&Tls>, gate: Option<&Gate>) {
    if let Some(tls) = tls {
        tracing::info!(
            ca = %tls.files().ca.display(),
            reload_ms = config.tls_reload_ms,
            "TLS is on: the port serves TLS only"
        );
    } else {
        tracing::warn!(
            "TLS is OFF: registrations, routes and cluster info cross the network in plaintext on \
             {addr}, readable and alterable by anyone on the path{}; set tls_ca, tls_cert and \
             tls_key",
            if gate.is_some() {
                ", and a captured signature can be replayed for signature_window_secs"
            } else {
                ""
            }
        );
    }
    match gate {
        Some(gate) => tracing::info!(
            admin = %config.admin_access_key,
            users = gate.user_count(),
            window_secs = config.signature_window_secs,
            "auth is on: register and unregister need a node certificate or the admin's \
             signature, route and cluster info a signature of the admin or a user"
        ),
        None => tracing::warn!(
            "auth is OFF: anyone who can reach {addr} can register or unregister broker nodes \
             (steering clients to any address) and read every route and the cluster's layout; \
             set auth = true and admin_secret_key"
        ),
    }
}

/// Binds `config.listen` and serves until `shutdown` completes.
pub async fn serve(config: Config, shutdown: impl Future<Output = ()> + Send) -> Result<(), Error> {
    Server::bind(config).await?.serve(shutdown).await
}

/// The binary's entry point: loads the configuration (flags > env > file > defaults), sets up
/// logging, serves until SIGINT or SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let config = Config::load(&args).context("invalid nameserver configuration")?;
    init_logging(config.log_json);
    let server = Server::bind(config)
        .await
        .context("nameserver start-up failed")?;
    // A plain line on stdout as well as the log, for scripts and tests that parse the port.
    println!("listening on {}", server.local_addr());
    server
        .serve(shutdown_signal())
        .await
        .context("nameserver failed")?;
    Ok(())
}

/// Installs the global tracing subscriber writing to stderr: level from `RAFTMQ_LOG` (what deploy
/// files set, so a client command in the same container does not inherit it), else `RUST_LOG`,
/// default `info`; colours only on a terminal and without `NO_COLOR`. Does nothing if one is
/// already installed (e.g. by the `raftmq` binary).
pub fn init_logging(json: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("RAFTMQ_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(
            std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .with_writer(std::io::stderr);
    let _already_installed = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Completes on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        () = term => tracing::info!("SIGTERM received, shutting down"),
    }
}
