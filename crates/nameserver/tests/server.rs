//! Integration tests of the nameserver over real sockets: gRPC registration and routes, health,
//! reflection, `/metrics`, robustness against garbage bytes, expiry, the binary's start-up, and
//! TLS with auth.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use raftmq_nameserver::{Config, Server};
use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
use raftmq_proto::v1::{
    ClusterInfoRequest, ClusterInfoResponse, ErrorCode, RegisterRequest, RouteRequest,
    RouteResponse, TopicQueues, UnregisterRequest,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

struct Running {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), raftmq_nameserver::Error>>,
}

async fn start(config: Config) -> Running {
    let server = Server::bind(config).await.expect("bind");
    let addr = server.local_addr();
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    Running { addr, stop, task }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops in time")
            .expect("server task")
            .expect("server result");
    }
}

fn local_config() -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..Config::default()
    }
}

async fn client(addr: SocketAddr) -> NameserverServiceClient<Channel> {
    NameserverServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

/// One `Route` call that must succeed at the transport level; the reply may carry an error.
async fn route_of(c: &mut NameserverServiceClient<Channel>, topic: &str) -> RouteResponse {
    c.route(RouteRequest {
        topic: topic.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// One `GetClusterInfo` call that must succeed at the transport level.
async fn cluster_info(c: &mut NameserverServiceClient<Channel>) -> ClusterInfoResponse {
    c.get_cluster_info(ClusterInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

fn registration(id: u64, role: &str, term: u64, topics: &[(&str, u32)]) -> RegisterRequest {
    RegisterRequest {
        cluster: "DefaultCluster".into(),
        broker: "broker-a".into(),
        node_id: id,
        address: format!("127.0.0.1:{}", 10910 + id),
        role: role.into(),
        term,
        leader_id: Some(1),
        last_log_index: 100,
        committed: 99,
        applied: 98,
        topics: topics
            .iter()
            .map(|&(t, q)| TopicQueues {
                topic: t.into(),
                queues: q,
            })
            .collect(),
        limits: None,
    }
}

/// Unregisters node `id` of DefaultCluster/broker-a.
fn unregistration(id: u64) -> UnregisterRequest {
    UnregisterRequest {
        cluster: "DefaultCluster".into(),
        broker: "broker-a".into(),
        node_id: id,
    }
}

/// A raw HTTP/1.1 GET over a fresh TCP connection; returns the whole response.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.expect("tcp connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("http response in time")
        .expect("read");
    String::from_utf8_lossy(&out).into_owned()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("series {series} missing from:\n{text}"))
        .trim()
        .parse()
        .expect("number")
}

#[tokio::test]
async fn t10_register_route_cluster_info_over_grpc() {
    let ns = start(local_config()).await;
    let mut c = client(ns.addr).await;

    tracing::info!("phase: register a three-node group");
    let topics = [("orders", 8)];
    for (id, role) in [(1, "leader"), (2, "follower"), (3, "follower")] {
        let reply = c
            .register(registration(id, role, 4, &topics))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.error, None);
        assert_eq!(reply.expiry_secs, 120);
    }

    tracing::info!("phase: route");
    let route = route_of(&mut c, "orders").await;
    assert_eq!(route.error, None);
    assert_eq!(route.topic, "orders");
    assert_eq!(route.brokers.len(), 1);
    let b = &route.brokers[0];
    assert_eq!(
        (b.name.as_str(), b.leader_id, b.queues, b.term),
        ("broker-a", Some(1), 8, 4)
    );
    assert_eq!(b.nodes.len(), 3);
    assert_eq!(b.nodes[2].address, "127.0.0.1:10913");

    let missing = route_of(&mut c, "nope").await;
    assert_eq!(
        missing.error.as_ref().map(|e| e.code()),
        Some(ErrorCode::TopicNotFound)
    );
    let invalid = route_of(&mut c, "no spaces").await;
    assert_eq!(
        invalid.error.as_ref().map(|e| e.code()),
        Some(ErrorCode::InvalidArgument)
    );

    tracing::info!("phase: refused registration leaves routes alone");
    let mut bad = registration(2, "leader", 9, &[]);
    bad.address = "somewhere-without-port".into();
    let reply = c.register(bad).await.unwrap().into_inner();
    let err = reply.error.expect("refused");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message.contains("address"), "{}", err.message);
    let again = route_of(&mut c, "orders").await;
    assert_eq!(again.brokers, route.brokers);

    tracing::info!("phase: cluster info");
    let info = cluster_info(&mut c).await;
    assert_eq!(info.error, None);
    assert_eq!(info.clusters.len(), 1);
    assert_eq!(info.clusters[0].name, "DefaultCluster");
    let broker = &info.clusters[0].brokers[0];
    assert_eq!(
        (broker.leader_id, broker.term, broker.nodes.len()),
        (Some(1), 4, 3)
    );
    assert_eq!(broker.nodes[0].committed, 99);
    assert_eq!(
        broker.topics,
        [TopicQueues {
            topic: "orders".into(),
            queues: 8
        }]
    );

    tracing::info!("phase: unregister");
    let reply = c.unregister(unregistration(3)).await.unwrap().into_inner();
    assert_eq!(reply.error, None);
    let route = route_of(&mut c, "orders").await;
    assert_eq!(route.brokers[0].nodes.len(), 2);

    tracing::info!("phase: metrics");
    let http = http_get(ns.addr, "/metrics").await;
    assert!(http.starts_with("HTTP/1.1 200"), "{http}");
    assert!(http.contains("text/plain"), "{http}");
    assert_eq!(metric(&http, "raftmq_nameserver_nodes"), 2.0);
    assert_eq!(metric(&http, "raftmq_nameserver_brokers"), 1.0);
    assert_eq!(
        metric(
            &http,
            "raftmq_nameserver_registrations_total{result=\"ok\"}"
        ),
        3.0
    );
    assert_eq!(
        metric(
            &http,
            "raftmq_nameserver_registrations_total{result=\"refused\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &http,
            "raftmq_nameserver_route_requests_total{result=\"ok\"}"
        ),
        3.0
    );
    assert_eq!(
        metric(
            &http,
            "raftmq_nameserver_route_requests_total{result=\"topic_not_found\"}"
        ),
        1.0
    );
    assert_eq!(metric(&http, "raftmq_nameserver_expirations_total"), 0.0);
    assert_eq!(
        metric(&http, "raftmq_nameserver_unregistrations_total"),
        1.0
    );

    ns.stop().await;
}

#[tokio::test]
async fn t20_health_and_reflection() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let ns = start(local_config()).await;
    let channel = Channel::from_shared(format!("http://{}", ns.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "raftmq.v1.NameserverService"] {
        let reply = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.status(),
            ServingStatus::Serving,
            "service {service:?}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let reply = replies.message().await.unwrap().expect("one reply");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("unexpected reflection reply {reply:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"raftmq.v1.NameserverService"), "{names:?}");

    ns.stop().await;
}

#[tokio::test]
async fn t30_garbage_bytes_do_not_hurt_the_server() {
    let ns = start(local_config()).await;
    let mut c = client(ns.addr).await;
    c.register(registration(1, "leader", 1, &[("orders", 4)]))
        .await
        .unwrap();

    tracing::info!("phase: garbage on fresh connections");
    let garbage: [&[u8]; 4] = [
        b"\x00\x01\x02\x03\xff\xfe\xfd garbage \r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"GET / HTTP/1.1\r\nHost: \xff\r\nContent-Length: -5\r\n\r\n",
        &[0xAB; 64 * 1024],
    ];
    for bytes in garbage {
        let mut s = TcpStream::connect(ns.addr).await.unwrap();
        // The server may close the connection mid-write; that is fine.
        let _ = s.write_all(bytes).await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
    }
    // A connection that says nothing and goes away.
    drop(TcpStream::connect(ns.addr).await.unwrap());

    tracing::info!("phase: the server still answers, on the old channel and a new one");
    let route = route_of(&mut c, "orders").await;
    assert_eq!(route.brokers[0].queues, 4);
    let mut fresh = client(ns.addr).await;
    let info = cluster_info(&mut fresh).await;
    assert_eq!(info.clusters[0].brokers[0].nodes.len(), 1);
    assert!(
        http_get(ns.addr, "/metrics")
            .await
            .starts_with("HTTP/1.1 200")
    );

    ns.stop().await;
}

#[tokio::test]
async fn t40_silent_nodes_expire() {
    let config = Config {
        expiry_secs: 1,
        scan_interval_ms: 50,
        ..local_config()
    };
    let ns = start(config).await;
    let mut c = client(ns.addr).await;
    let reply = c
        .register(registration(1, "leader", 1, &[("orders", 4)]))
        .await
        .unwrap();
    assert_eq!(reply.into_inner().expiry_secs, 1);

    // Wait (bounded) for the scan to remove the node; queries hide it from 1 s on regardless.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = http_get(ns.addr, "/metrics").await;
        if metric(&text, "raftmq_nameserver_expirations_total") == 1.0 {
            assert_eq!(metric(&text, "raftmq_nameserver_nodes"), 0.0);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node never expired:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let route = route_of(&mut c, "orders").await;
    assert_eq!(
        route.error.map(|e| e.code()),
        Some(ErrorCode::TopicNotFound)
    );
    let info = cluster_info(&mut c).await;
    assert!(info.clusters.is_empty());

    ns.stop().await;
}

#[tokio::test]
async fn t50_invalid_config_is_refused_at_bind() {
    let err = Server::bind(Config {
        scan_interval_ms: 0,
        ..local_config()
    })
    .await
    .unwrap_err();
    assert!(err.to_string().contains("scan_interval_ms"), "{err}");
}

#[tokio::test]
async fn t60_binary_prints_its_port_and_serves() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nameserver"))
        .env("RAFTMQ_NS_LISTEN", "127.0.0.1:0")
        .env("RAFTMQ_NS_LOG_JSON", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn nameserver");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let addr: SocketAddr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.split("listening on ").nth(1) {
                return rest.trim().parse().unwrap();
            }
        }
        panic!("nameserver exited without printing its address");
    })
    .await
    .expect("address printed in time");
    assert_ne!(addr.port(), 0);

    let mut c = client(addr).await;
    let route = route_of(&mut c, "orders").await;
    assert_eq!(
        route.error.map(|e| e.code()),
        Some(ErrorCode::TopicNotFound)
    );
    assert!(
        http_get(addr, "/metrics")
            .await
            .contains("raftmq_nameserver_nodes 0")
    );

    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

#[tokio::test]
async fn t61_binary_refuses_bad_config_naming_the_key() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nameserver"))
        .args(["--listen", "127.0.0.1:0", "--expiry-secs", "0"])
        .output()
        .await
        .expect("run nameserver");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("expiry_secs"), "{stderr}");
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "one-line reason: {stderr}"
    );
}

#[tokio::test]
async fn t62_binary_refuses_auth_without_a_secret_and_never_shows_one() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nameserver"))
        .args(["--listen", "127.0.0.1:0"])
        .env("RAFTMQ_NS_AUTH", "true")
        .output()
        .await
        .expect("run nameserver");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("admin_secret_key"), "{stderr}");

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_nameserver"))
        .arg("--help")
        .env("RAFTMQ_NS_ADMIN_SECRET_KEY", "do-not-show-me")
        .output()
        .await
        .expect("run nameserver");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("RAFTMQ_NS_ADMIN_SECRET_KEY"), "{help}");
    assert!(!help.contains("do-not-show-me"), "{help}");
}

mod tls_auth {
    use std::path::{Path, PathBuf};

    use raftmq_security::certgen::{Ca, Pem};
    use raftmq_security::identity::NodeIdentity;
    use raftmq_security::sign::Credentials;
    use raftmq_security::tls::{Tls, TlsFiles};
    use tonic::Request;
    use tonic::transport::Endpoint;

    use super::*;
    use raftmq_nameserver::config::{Secret, User};

    const ADMIN_SECRET: &str = "admin-secret-1";
    const READER_SECRET: &str = "reader-secret-1";

    /// Writes `<name>.pem` and `<name>.key` into `dir`; returns the certificate and key paths.
    fn write_pair(dir: &Path, name: &str, pem: &Pem) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &pem.cert).unwrap();
        std::fs::write(&key, &pem.key).unwrap();
        (cert, key)
    }

    /// The trust of `ca` plus, when given, a client certificate and key.
    fn files(ca: &Path, pair: Option<&(PathBuf, PathBuf)>) -> TlsFiles {
        TlsFiles {
            ca: ca.to_path_buf(),
            cert: pair.map(|p| p.0.clone()),
            key: pair.map(|p| p.1.clone()),
            crl: None,
        }
    }

    /// A channel over TLS to `addr` with `files`' trust and client certificate.
    async fn tls_channel(addr: SocketAddr, files: TlsFiles) -> Result<Channel, String> {
        let tls = Tls::load(files).map_err(|e| e.to_string())?;
        let endpoint = Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .tls_config(tls.client_config())
            .unwrap();
        let channel = tokio::time::timeout(Duration::from_secs(10), endpoint.connect())
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| format!("{e:?}"))?;
        // Connecting may succeed before the server has checked a client certificate; a call
        // shows whether the connection is usable.
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
        tokio::time::timeout(
            Duration::from_secs(10),
            health.check(tonic_health::pb::HealthCheckRequest::default()),
        )
        .await
        .map_err(|_| "health check timed out".to_string())?
        .map_err(|e| format!("{e:?}"))?;
        Ok(channel)
    }

    fn signed<T>(message: T, access_key: &str, secret: &str) -> Request<T> {
        let mut request = Request::new(message);
        Credentials {
            access_key: access_key.into(),
            secret: secret.into(),
        }
        .sign_request(&mut request);
        request
    }

    fn route_request(topic: &str) -> RouteRequest {
        RouteRequest {
            topic: topic.into(),
        }
    }

    /// `GET path` over an established (TLS) channel; returns the status and the body.
    async fn get_over(channel: &Channel, addr: SocketAddr, path: &str) -> (u16, String) {
        use tonic::codegen::{Body as _, Service as _, http};
        let mut channel = channel.clone();
        std::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .unwrap();
        let request = http::Request::get(format!("https://{addr}{path}"))
            .body(tonic::body::Body::default())
            .unwrap();
        let response = channel.call(request).await.unwrap();
        let status = response.status().as_u16();
        let mut body = std::pin::pin!(response.into_body());
        let mut bytes = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            if let Ok(data) = frame.unwrap().into_data() {
                bytes.extend_from_slice(&data);
            }
        }
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn t70_tls_and_auth_over_real_connections() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (ca, ca_pem) = Ca::generate("test CA").unwrap();
        std::fs::write(d.join("ca.pem"), &ca_pem.cert).unwrap();
        let ca_file = d.join("ca.pem");
        let hosts = ["localhost".to_string(), "127.0.0.1".to_string()];
        let server = write_pair(
            d,
            "nameserver",
            &ca.issue_server("nameserver", &hosts).unwrap(),
        );
        let node_id = NodeIdentity {
            cluster: "DefaultCluster".into(),
            broker: "broker-a".into(),
            node_id: 1,
        };
        let node = write_pair(d, "node", &ca.issue_node(&node_id, &hosts).unwrap());
        let client_cert = write_pair(d, "client", &ca.issue_client("client").unwrap());
        // A revocation list from the start (it lists a retired client's certificate).
        std::fs::write(d.join("ca.key"), &ca_pem.key).unwrap();
        let retired = write_pair(d, "retired", &ca.issue_client("retired").unwrap());
        let crl = raftmq_security::certgen::revoke(d, &retired.0).unwrap().crl;

        let ns = start(Config {
            tls_ca: Some(ca_file.clone()),
            tls_cert: Some(server.0.clone()),
            tls_key: Some(server.1.clone()),
            tls_crl: Some(crl.clone()),
            tls_reload_ms: 100,
            auth: true,
            admin_secret_key: Some(Secret::new(ADMIN_SECRET)),
            users: vec![User {
                access_key: "reader".into(),
                secret_key: Secret::new(READER_SECRET),
            }],
            ..local_config()
        })
        .await;

        tracing::info!("phase: a node certificate registers");
        let node_channel = tls_channel(ns.addr, files(&ca_file, Some(&node)))
            .await
            .expect("node connects over TLS");
        let mut as_node = NameserverServiceClient::new(node_channel.clone());
        let reply = as_node
            .register(registration(1, "leader", 4, &[("orders", 8)]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.error, None);
        assert_eq!(reply.expiry_secs, 120);

        tracing::info!("phase: a node certificate registers and unregisters only itself");
        let other_group = RegisterRequest {
            broker: "broker-b".into(),
            ..registration(1, "leader", 4, &[("orders", 8), ("payments", 2)])
        };
        let other_node = registration(2, "leader", 5, &[("orders", 8)]);
        let mut refusals = Vec::new();
        for request in [other_group, other_node] {
            let named = format!("{}/{}/{}", request.cluster, request.broker, request.node_id);
            let reply = as_node.register(request).await.unwrap().into_inner();
            refusals.push((named, reply.error));
        }
        let reply = as_node.unregister(unregistration(2)).await.unwrap();
        refusals.push(("DefaultCluster/broker-a/2".into(), reply.into_inner().error));
        for (named, error) in refusals {
            let e = error.unwrap_or_else(|| panic!("{named}: not refused"));
            assert_eq!(e.code(), ErrorCode::Forbidden, "{}", e.message);
            assert!(
                e.message.contains("raftmq://DefaultCluster/broker-a/1")
                    && e.message.contains(&named),
                "{}",
                e.message
            );
        }

        tracing::info!("phase: a user's signature reads routes, no signature does not");
        let anonymous = tls_channel(ns.addr, files(&ca_file, None))
            .await
            .expect("a client without a certificate connects over TLS");
        let mut c = NameserverServiceClient::new(anonymous.clone());
        let route = c
            .route(signed(route_request("orders"), "reader", READER_SECRET))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(route.error, None);
        assert_eq!(route.brokers.len(), 1);
        assert_eq!(route.brokers[0].nodes.len(), 1);
        let info = c
            .get_cluster_info(signed(ClusterInfoRequest {}, "reader", READER_SECRET))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((info.error, info.clusters.len()), (None, 1));

        let unsigned = route_of(&mut c, "orders").await;
        let err = unsigned.error.expect("refused");
        assert_eq!(err.code(), ErrorCode::Unauthenticated);
        assert!(err.message.contains("no credentials"), "{}", err.message);
        assert!(unsigned.brokers.is_empty());
        let info = cluster_info(&mut c).await;
        assert_eq!(
            info.error.map(|e| e.code()),
            Some(ErrorCode::Unauthenticated)
        );
        assert!(info.clusters.is_empty());
        let forged = c
            .route(signed(route_request("orders"), "reader", "not-the-secret"))
            .await
            .unwrap()
            .into_inner();
        let err = forged.error.expect("refused");
        assert_eq!(err.code(), ErrorCode::Unauthenticated);
        assert!(!err.message.contains("not-the-secret"), "{}", err.message);

        tracing::info!("phase: a user may not register; nothing is stored");
        let reply = c
            .register(signed(
                registration(2, "leader", 9, &[("orders", 8)]),
                "reader",
                READER_SECRET,
            ))
            .await
            .unwrap()
            .into_inner();
        let err = reply.error.expect("refused");
        assert_eq!(err.code(), ErrorCode::Forbidden);
        assert!(
            err.message.contains("\"reader\"") && err.message.contains("register"),
            "{}",
            err.message
        );
        let reply = c
            .unregister(signed(unregistration(1), "reader", READER_SECRET))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.error.map(|e| e.code()), Some(ErrorCode::Forbidden));
        let reply = c
            .register(registration(3, "follower", 4, &[]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.error.map(|e| e.code()),
            Some(ErrorCode::Unauthenticated)
        );
        let route = as_node
            .route(route_request("orders"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(route.error, None);
        let b = &route.brokers[0];
        assert_eq!((b.nodes.len(), b.term, b.leader_id), (1, 4, Some(1)));

        tracing::info!("phase: a client certificate without a node identity is no node");
        let mut as_client = NameserverServiceClient::new(
            tls_channel(ns.addr, files(&ca_file, Some(&client_cert)))
                .await
                .expect("a client certificate from the CA is accepted"),
        );
        let reply = as_client
            .register(registration(3, "follower", 4, &[]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            reply.error.map(|e| e.code()),
            Some(ErrorCode::Unauthenticated)
        );

        tracing::info!("phase: the admin's signature registers");
        let reply = c
            .register(signed(
                registration(2, "follower", 4, &[("orders", 8)]),
                "admin",
                ADMIN_SECRET,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.error, None);
        let route = c
            .route(signed(route_request("orders"), "admin", ADMIN_SECRET))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(route.brokers[0].nodes.len(), 2);

        tracing::info!("phase: /metrics over TLS, on the same port, without credentials");
        let (status, text) = get_over(&anonymous, ns.addr, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(metric(&text, "raftmq_nameserver_nodes"), 2.0);
        assert_eq!(
            metric(
                &text,
                "raftmq_nameserver_refused_requests_total{result=\"forbidden\"}"
            ),
            // The user's two, and the node certificate's three for nodes it does not name.
            5.0
        );
        assert_eq!(
            metric(
                &text,
                "raftmq_nameserver_refused_requests_total{result=\"unauthenticated\"}"
            ),
            5.0
        );

        tracing::info!("phase: plaintext and foreign certificates get nowhere");
        let plaintext = tokio::time::timeout(Duration::from_secs(10), async {
            match NameserverServiceClient::connect(format!("http://{}", ns.addr)).await {
                Err(_) => true,
                Ok(mut c) => c.route(route_request("orders")).await.is_err(),
            }
        })
        .await
        .expect("the plaintext attempt ends in time");
        assert!(plaintext, "a plaintext client talked to the TLS port");
        let raw = http_get(ns.addr, "/metrics").await;
        assert!(!raw.starts_with("HTTP/"), "{raw}");
        let (other_ca, _) = Ca::generate("another CA").unwrap();
        let foreign = write_pair(
            d,
            "foreign",
            &other_ca.issue_node(&node_id, &hosts).unwrap(),
        );
        assert!(
            tls_channel(ns.addr, files(&ca_file, Some(&foreign)))
                .await
                .is_err(),
            "a certificate from another CA was accepted"
        );

        tracing::info!("phase: a node certificate revoked while the nameserver runs is refused");
        assert!(
            tls_channel(ns.addr, files(&ca_file, Some(&retired)))
                .await
                .is_err(),
            "a certificate revoked at start was accepted"
        );
        raftmq_security::certgen::revoke(d, &node.0).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tls_channel(ns.addr, files(&ca_file, Some(&node)))
            .await
            .is_ok()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the revoked node certificate still connects"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let node_2 = NodeIdentity {
            node_id: 2,
            ..node_id.clone()
        };
        let sibling = write_pair(d, "node-2", &ca.issue_node(&node_2, &hosts).unwrap());
        let mut as_sibling = NameserverServiceClient::new(
            tls_channel(ns.addr, files(&ca_file, Some(&sibling)))
                .await
                .expect("a certificate not listed still connects"),
        );
        let reply = as_sibling
            .register(registration(2, "follower", 4, &[("orders", 8)]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(reply.error, None);

        tracing::info!("phase: a new server certificate is picked up without a restart");
        let (new_ca, new_ca_pem) = Ca::generate("rotated CA").unwrap();
        std::fs::write(d.join("new-ca.pem"), &new_ca_pem.cert).unwrap();
        let new_trust = files(&d.join("new-ca.pem"), None);
        assert!(tls_channel(ns.addr, new_trust.clone()).await.is_err());
        let rotated = new_ca.issue_server("nameserver", &hosts).unwrap();
        std::fs::write(&server.1, &rotated.key).unwrap();
        std::fs::write(&server.0, &rotated.cert).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let fresh = loop {
            match tls_channel(ns.addr, new_trust.clone()).await {
                Ok(channel) => break channel,
                Err(e) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "the rotated certificate was never served: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let route = NameserverServiceClient::new(fresh)
            .route(signed(route_request("orders"), "reader", READER_SECRET))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(route.error, None);
        // The connection opened before the rotation keeps working.
        let route = as_node
            .route(route_request("orders"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(route.error, None);

        ns.stop().await;
    }
}
