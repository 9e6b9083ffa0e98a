//! Integration tests of the nameserver over real sockets: gRPC registration and routes, health,
//! reflection, `/metrics`, robustness against garbage bytes, expiry, and the binary's start-up.

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
    let reply = c
        .unregister(UnregisterRequest {
            cluster: "DefaultCluster".into(),
            broker: "broker-a".into(),
            node_id: 3,
        })
        .await
        .unwrap()
        .into_inner();
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
