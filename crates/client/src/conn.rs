//! One lazily connected gRPC channel per address, shared by every task of a client.
//!
//! Channels reconnect by themselves after the peer restarts, so a cached channel stays valid; a
//! call on a dead peer fails quickly with a transport error that the retry loops handle.
//!
//! Every channel is made through the client's [`ClientSecurity`]: TLS (`https://`) when it has
//! TLS material, and every request signed when it has credentials (a [`Conn`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
use tonic::transport::Endpoint;

use crate::error::Result;
use crate::security::{ClientSecurity, Conn};

/// Replies (pulls of large messages) may be far above tonic's 4 MiB default: the contract's cap.
pub(crate) const MESSAGE_BYTES_MAX: usize = raftmq_proto::limits::GRPC_MESSAGE_BYTES_MAX;

/// Channels by address.
#[derive(Clone)]
pub(crate) struct Pool {
    channels: Arc<Mutex<HashMap<String, Conn>>>,
    /// A local or LAN peer that has not accepted a connection in this long is treated as down.
    connect_timeout: Duration,
    /// TLS and signing of every channel.
    security: ClientSecurity,
}

impl Pool {
    pub(crate) fn new(connect_timeout: Duration, security: ClientSecurity) -> Self {
        Pool {
            channels: Arc::default(),
            connect_timeout,
            security,
        }
    }

    /// The endpoint of `address`: its scheme and TLS from the security, tuned for the client.
    pub(crate) fn endpoint(&self, address: &str) -> Result<Endpoint> {
        Ok(self
            .security
            .endpoint(address)?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            // Pulls of many large messages: h2's 64 KiB default windows stall them.
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(16 << 20)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5)))
    }

    /// The channel to `address`, made on first use, signing every request when the security has
    /// credentials.
    pub(crate) fn channel(&self, address: &str) -> Result<Conn> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(address) {
            return Ok(c.clone());
        }
        let channel = self
            .security
            .intercept(self.endpoint(address)?.connect_lazy());
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    pub(crate) fn nameserver(&self, address: &str) -> Result<NameserverServiceClient<Conn>> {
        Ok(NameserverServiceClient::new(self.channel(address)?)
            .max_decoding_message_size(MESSAGE_BYTES_MAX))
    }
}

/// A request with a deadline that the server sees too (`grpc-timeout`).
pub(crate) fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// The `call` of `Router::call_leader`: every attempt sends `rpc` a copy of `msg` as a
/// [`request`] told the attempt's timeout.
pub(crate) fn each_attempt<T, F, Fut>(msg: &T, mut rpc: F) -> impl FnMut(Conn, Duration) -> Fut
where
    T: Clone,
    F: FnMut(Conn, tonic::Request<T>) -> Fut,
{
    move |ch, t| rpc(ch, request(msg.clone(), t))
}

/// An error and its causes on one line, outermost first (tonic's transport error says only
/// "transport error"; what was wrong is in its source).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_get_a_scheme() {
        let pool = Pool::new(Duration::from_secs(1), ClientSecurity::default());
        let uri = |a: &str| pool.endpoint(a).map(|e| e.uri().to_string());
        assert_eq!(uri("127.0.0.1:9876").unwrap(), "http://127.0.0.1:9876/");
        assert_eq!(uri("http://ns:9876").unwrap(), "http://ns:9876/");
    }

    #[tokio::test]
    async fn a_pool_with_tls_makes_https_channels() {
        let (_dir, tls) = crate::security::tests::test_tls();
        let pool = Pool::new(
            Duration::from_secs(1),
            ClientSecurity::default().with_tls(tls),
        );
        let uri = |a: &str| pool.endpoint(a).map(|e| e.uri().to_string());
        assert_eq!(uri("127.0.0.1:9876").unwrap(), "https://127.0.0.1:9876/");
        assert_eq!(uri("https://ns:9876").unwrap(), "https://ns:9876/");
        assert!(uri("http://ns:9876").is_err());
        pool.channel("127.0.0.1:9876").expect("a TLS channel");
    }

    #[test]
    fn an_invalid_address_names_the_address_and_its_cause_once() {
        let pool = Pool::new(Duration::from_secs(1), ClientSecurity::default());
        let err = pool.channel("bad host:1").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("invalid address \"bad host:1\": "),
            "{text}"
        );
        assert!(
            text.contains("invalid uri character"),
            "the cause is shown: {text}"
        );
        assert!(std::error::Error::source(&err).is_none());
        let words: Vec<&str> = text.split(": ").collect();
        let mut unique = words.clone();
        unique.dedup();
        assert_eq!(words, unique, "a cause repeated: {text}");
    }

    /// A nameserver in this process, serving TLS only and answering `GetClusterInfo` with one
    /// cluster named after the access key that signed the request (an unsigned request or a
    /// wrong signature is refused with the check's reason).
    mod served {
        use std::path::Path;

        use raftmq_proto::v1::nameserver_service_server::{
            NameserverService, NameserverServiceServer,
        };
        use raftmq_proto::v1::{self, ClusterInfo, ClusterInfoResponse};
        use raftmq_security::sign;
        use raftmq_security::tls::{Tls, TlsFiles};
        use tonic::{Request, Response, Status};

        use crate::nameserver::NameserverClient;
        use crate::security::{ClientSecurity, Credentials};

        use super::*;

        struct Ns;

        #[tonic::async_trait]
        impl NameserverService for Ns {
            async fn register(
                &self,
                _: Request<v1::RegisterRequest>,
            ) -> Result<Response<v1::RegisterResponse>, Status> {
                Err(Status::unimplemented("register"))
            }
            async fn unregister(
                &self,
                _: Request<v1::UnregisterRequest>,
            ) -> Result<Response<v1::UnregisterResponse>, Status> {
                Err(Status::unimplemented("unregister"))
            }
            async fn route(
                &self,
                _: Request<v1::RouteRequest>,
            ) -> Result<Response<v1::RouteResponse>, Status> {
                Err(Status::unimplemented("route"))
            }
            async fn get_cluster_info(
                &self,
                req: Request<v1::ClusterInfoRequest>,
            ) -> Result<Response<ClusterInfoResponse>, Status> {
                let md = req.metadata();
                let header = |name| md.get(name).and_then(|v| v.to_str().ok());
                let who = sign::check(
                    header(sign::AUTHORIZATION),
                    header(sign::DATE_TIME),
                    sign::now_secs(),
                    60,
                    |ak| (ak == "ak1").then(|| "sk1".to_string()),
                )
                .map_err(|e| Status::unauthenticated(e.to_string()))?;
                Ok(Response::new(ClusterInfoResponse {
                    error: None,
                    clusters: vec![ClusterInfo {
                        name: who.to_string(),
                        ..Default::default()
                    }],
                }))
            }
        }

        /// Development certificates in `dir`, and a TLS nameserver on a free local port.
        async fn serve(dir: &Path) -> String {
            let plan = raftmq_security::certgen::Plan {
                cluster: "C".into(),
                groups: vec![],
                hosts: vec!["localhost".into(), "127.0.0.1".into()],
                per_node_hosts: true,
            };
            raftmq_security::certgen::init(dir, &plan).expect("certificates");
            let tls = Tls::load(TlsFiles {
                ca: dir.join("ca.pem"),
                cert: Some(dir.join("nameserver.pem")),
                key: Some(dir.join("nameserver.key")),
                crl: None,
            })
            .expect("server TLS");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let address = listener.local_addr().expect("address").to_string();
            let incoming = raftmq_security::tls::incoming(listener, tls);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(NameserverServiceServer::new(Ns))
                    .serve_with_incoming(incoming),
            );
            address
        }

        fn client(address: &str, security: ClientSecurity) -> NameserverClient {
            NameserverClient::new(
                vec![address.to_string()],
                Pool::new(Duration::from_secs(2), security),
            )
            .expect("client")
        }

        fn trusting(dir: &Path, with_cert: bool) -> ClientSecurity {
            let files = TlsFiles {
                ca: dir.join("ca.pem"),
                cert: with_cert.then(|| dir.join("client.pem")),
                key: with_cert.then(|| dir.join("client.key")),
                crl: None,
            };
            ClientSecurity::default()
                .with_tls_files(files)
                .expect("client TLS")
        }

        fn credentials(secret: &str) -> Credentials {
            Credentials {
                access_key: "ak1".into(),
                secret: secret.into(),
            }
        }

        #[tokio::test]
        async fn c1_a_tls_client_signs_every_request() {
            let dir = tempfile::tempdir().expect("tempdir");
            let address = serve(dir.path()).await;
            for with_cert in [false, true] {
                let security = trusting(dir.path(), with_cert).with_credentials(credentials("sk1"));
                let info = client(&address, security)
                    .cluster_info()
                    .await
                    .unwrap_or_else(|e| panic!("client certificate {with_cert}: {e}"));
                assert_eq!(info[0].name, "ak1", "the request was signed by ak1");
            }
        }

        #[tokio::test]
        async fn c2_unsigned_wrongly_signed_and_plaintext_requests_fail_with_their_reason() {
            let dir = tempfile::tempdir().expect("tempdir");
            let address = serve(dir.path()).await;
            let unsigned = client(&address, trusting(dir.path(), false))
                .cluster_info()
                .await
                .unwrap_err()
                .to_string();
            assert!(unsigned.contains("not signed"), "{unsigned}");
            let wrong = client(
                &address,
                trusting(dir.path(), false).with_credentials(credentials("other")),
            )
            .cluster_info()
            .await
            .unwrap_err()
            .to_string();
            assert!(wrong.contains("does not match"), "{wrong}");
            assert!(!wrong.contains("other"), "no secret in errors: {wrong}");
            let plaintext = client(
                &address,
                ClientSecurity::default().with_credentials(credentials("sk1")),
            )
            .cluster_info()
            .await
            .unwrap_err()
            .to_string();
            assert!(plaintext.contains("no nameserver answered"), "{plaintext}");
        }

        #[tokio::test]
        async fn c3_a_server_from_another_ca_is_refused() {
            let dir = tempfile::tempdir().expect("tempdir");
            let address = serve(dir.path()).await;
            let other = tempfile::tempdir().expect("tempdir");
            let (_, pem) = raftmq_security::certgen::Ca::generate("other CA").expect("CA");
            std::fs::write(other.path().join("ca.pem"), pem.cert).expect("write");
            let e = client(&address, trusting(other.path(), false))
                .cluster_info()
                .await
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("no nameserver answered") && e.contains("certificate"),
                "{e}"
            );
        }
    }
}
