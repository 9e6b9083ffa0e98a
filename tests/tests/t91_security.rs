//! Security against real three-node groups with TLS on every port and auth on (issue 17):
//! signed requests and per-user rules through the v1 API, the refusals of a wrong secret, a
//! replayed signature, a missing header, a user without the right — each with its code and
//! nothing stored — and strangers on the Raft peer path (no certificate, another group's
//! certificate, another CA's, plaintext) refused with the group's log unchanged.

use std::time::Duration;

use raftmq_proto::v1::raft_peer_service_client::RaftPeerServiceClient;
use raftmq_proto::v1::*;
use raftmq_security::sign::{self, Credentials};
use raftmq_security::tls::{Tls, TlsFiles};
use raftmq_tests::secure::{self, Conn};
use raftmq_tests::{Cluster, code, history, python, send_request, wait_for};
use tonic::transport::Endpoint;

const TOPIC: &str = "orders";

fn creds(ak: &str, sk: &str) -> Credentials {
    Credentials {
        access_key: ak.into(),
        secret: sk.into(),
    }
}

fn rule(effect: &str, actions: &str, resource: &str) -> Option<UserRule> {
    Some(UserRule {
        effect: effect.into(),
        actions: actions.into(),
        resource: resource.into(),
    })
}

/// Adds `ak` with `rules` through the leader's admin service, as the admin.
async fn add_user(c: &Cluster, ak: &str, sk: &str, rules: &[Option<UserRule>]) {
    let s = c.secure();
    let addr = c.nodes[&c.leader().await].addr.clone();
    let mut admin = s.admin_client(&addr, Some(&s.admin));
    let r = admin
        .put_user(PutUserRequest {
            access_key: ak.into(),
            secret_key: sk.into(),
            admin: false,
            create: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    for rule in rules {
        let r = admin
            .change_rule(ChangeRuleRequest {
                access_key: ak.into(),
                rule: rule.clone(),
                revoke: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    }
}

/// Messages stored in every queue of `topic`, as the leader's topic status says (admin).
async fn stored(c: &Cluster, topic: &str) -> u64 {
    let s = c.secure();
    let addr = c.nodes[&c.leader().await].addr.clone();
    let mut inspect =
        inspect_service_client::InspectServiceClient::new(s.conn(&addr, Some(&s.admin)));
    let r = inspect
        .topic_status(TopicStatusRequest {
            topic: topic.into(),
            at_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    r.queues.iter().map(|q| q.max_offset - q.min_offset).sum()
}

async fn send_as(
    client: &mut broker_service_client::BrokerServiceClient<Conn>,
    seq: u64,
) -> SendResponse {
    client
        .send(send_request(
            7,
            seq,
            TOPIC,
            0,
            vec![format!("m{seq}").into_bytes()],
        ))
        .await
        .unwrap()
        .into_inner()
}

/// A Send whose headers the test writes itself (a replay, a missing date).
async fn send_with_headers(
    addr: &str,
    c: &Cluster,
    headers: &[(&'static str, String)],
) -> SendResponse {
    let s = c.secure();
    let mut client = s.client(addr, None);
    let mut req = tonic::Request::new(send_request(8, 1, TOPIC, 0, vec![b"x".to_vec()]));
    for (k, v) in headers {
        req.metadata_mut().insert(*k, v.parse().unwrap());
    }
    client.send(req).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_1_signed_requests_and_per_user_rules() {
    let mut c = secure_cluster_with_users().await;
    let s = c.secure();
    let leader = c.leader().await;
    let addr = c.nodes[&leader].addr.clone();
    let alice = creds("alice", "alice-secret");
    let mut as_alice = s.client(&addr, Some(&alice));
    for seq in 1..=20 {
        let r = send_as(&mut as_alice, seq).await;
        assert_eq!(
            code(&r.error),
            ErrorCode::Ok,
            "alice's send {seq}: {:?}",
            r.error
        );
    }
    assert_eq!(stored(&c, TOPIC).await, 20);

    // A wrong secret.
    let mut wrong = s.client(&addr, Some(&creds("alice", "not-her-secret")));
    let r = send_as(&mut wrong, 100).await;
    assert_eq!(code(&r.error), ErrorCode::Unauthenticated, "{:?}", r.error);
    let msg = r.error.unwrap().message;
    assert!(
        msg.contains("signature does not match") && !msg.contains("secret\""),
        "{msg}"
    );
    // A signature replayed after the window (a captured header, 20 minutes old).
    let old = sign::format_date_time(sign::now_secs() - 20 * 60);
    let r = send_with_headers(
        &addr,
        &c,
        &[
            (sign::DATE_TIME, old.clone()),
            (
                sign::AUTHORIZATION,
                sign::authorization("alice", "alice-secret", &old),
            ),
        ],
    )
    .await;
    assert_eq!(code(&r.error), ErrorCode::Unauthenticated, "{:?}", r.error);
    assert!(r.error.unwrap().message.contains("expired or replayed"));
    // No authorization header; then a signature without its date header.
    let r = send_with_headers(&addr, &c, &[]).await;
    assert_eq!(code(&r.error), ErrorCode::Unauthenticated, "{:?}", r.error);
    let now = sign::format_date_time(sign::now_secs());
    let r = send_with_headers(
        &addr,
        &c,
        &[(
            sign::AUTHORIZATION,
            sign::authorization("alice", "alice-secret", &now),
        )],
    )
    .await;
    assert_eq!(code(&r.error), ErrorCode::Unauthenticated, "{:?}", r.error);
    assert!(r.error.unwrap().message.contains("x-mq-date-time"));
    // bob has no Pub on the topic, and no Create.
    let bob = creds("bob", "bob-secret-1");
    let mut as_bob = s.client(&addr, Some(&bob));
    let r = send_as(&mut as_bob, 200).await;
    assert_eq!(code(&r.error), ErrorCode::Forbidden, "{:?}", r.error);
    assert_eq!(
        r.error.unwrap().message,
        "forbidden: bob may not Pub on topic:orders"
    );
    let r = as_bob
        .create_topic(CreateTopicRequest {
            name: "orders-new".into(),
            queues: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Forbidden, "{:?}", r.error);
    assert!(
        r.error
            .unwrap()
            .message
            .contains("bob may not Create on topic:orders-new")
    );
    // bob may read what alice stored; nothing refused was stored.
    let r = as_bob
        .pull(PullRequest {
            topic: TOPIC.into(),
            queue: 0,
            offset: 0,
            max_messages: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    assert_eq!(r.messages.len(), 20);
    assert_eq!(
        stored(&c, TOPIC).await,
        20,
        "a refused send stored something"
    );
    // Users are replicated state: a new leader knows alice.
    c.kill(leader);
    let new_leader = wait_for("a new leader", Duration::from_secs(20), || async {
        let l = c.agreed_leader(Duration::from_secs(1)).await.ok()?;
        (l.node_id != leader).then_some(l.node_id)
    })
    .await;
    let addr = c.nodes[&new_leader].addr.clone();
    let mut as_alice = c.secure().client(&addr, Some(&alice));
    let r = send_as(&mut as_alice, 21).await;
    assert_eq!(
        code(&r.error),
        ErrorCode::Ok,
        "alice after failover: {:?}",
        r.error
    );
    let mut wrong = c
        .secure()
        .client(&addr, Some(&creds("alice", "not-her-secret")));
    assert_eq!(
        code(&send_as(&mut wrong, 101).await.error),
        ErrorCode::Unauthenticated
    );
}

/// A peer client over TLS with `identity` (cert, key) or none, trusting `ca`.
fn peer_client(
    addr: &str,
    ca: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> RaftPeerServiceClient<tonic::transport::Channel> {
    let tls = Tls::load(TlsFiles {
        ca: ca.to_path_buf(),
        cert: identity.map(|i| i.0.to_path_buf()),
        key: identity.map(|i| i.1.to_path_buf()),
        crl: None,
    })
    .unwrap();
    let ch = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls.client_config())
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(3))
        .connect_lazy();
    RaftPeerServiceClient::new(ch)
}

fn header() -> Option<PeerHeader> {
    Some(PeerHeader {
        cluster: "DefaultCluster".into(),
        broker: "broker-a".into(),
        from_node_id: 9,
        secret: String::new(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_2_strangers_on_the_peer_path_are_refused_and_the_log_is_unchanged() {
    let c = Cluster::start_secure(3, &[]).await;
    let s = c.secure();
    let leader = c.leader().await;
    let addr = c.nodes[&leader].addr.clone();
    // A history in the checker's format: 40 acknowledged sends over its 4 queues.
    let r = s
        .client(&addr, Some(&s.admin))
        .create_topic(CreateTopicRequest {
            name: history::TOPIC.into(),
            queues: history::QUEUES,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    let hist = history::History::default();
    let mut admin = s.client(&addr, Some(&s.admin));
    for seq in 1..=40u64 {
        let queue = (seq % u64::from(history::QUEUES)) as u32;
        let id = history::MsgId {
            producer: 7,
            seq,
            idx: 0,
        };
        let start = hist.now();
        let body = history::encode(id, 64);
        let r = admin
            .send(send_request(7, seq, history::TOPIC, queue, vec![body]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(&r.error), ErrorCode::Ok, "send {seq}: {:?}", r.error);
        hist.ops.lock().unwrap().push(history::Op {
            producer: 7,
            seq,
            queue,
            count: 1,
            len: 64,
            start,
            end: hist.now(),
            attempts: 1,
            outcome: history::Outcome::Acked {
                offsets: r.results.iter().map(|x| x.offset).collect(),
                by: addr.clone(),
                duplicate: r.duplicate,
            },
        });
    }
    let before = c.status(leader).await.unwrap();
    // Another CA, which issues a certificate naming broker-a's node 1 itself.
    let other = c.dir.path().join("other-ca");
    secure::make_certs(&other, &[("broker-a", 1)]);
    let ca = s.certs.join("ca.pem");
    let (b_cert, b_key) = (
        s.certs.join("broker-b-1.pem"),
        s.certs.join("broker-b-1.key"),
    );
    let (o_cert, o_key) = (other.join("broker-a-1.pem"), other.join("broker-a-1.key"));
    let term = before.term + 100;
    let vote = raftmq_raft_log::testkit::forged_vote(term, 9, term, before.last_log_index + 1000);
    let append = raftmq_raft_log::testkit::forged_append(
        term,
        9,
        before.term,
        before.last_log_index,
        b"forged".to_vec(),
    );
    for (id, node) in c.nodes.iter() {
        let a = &node.addr;
        // No client certificate: UNAUTHENTICATED before the request is read.
        let mut none = peer_client(a, &ca, None);
        for (what, st) in [
            (
                "vote",
                none.vote(RaftRequest {
                    header: header(),
                    payload: vote.clone(),
                })
                .await,
            ),
            (
                "append",
                none.append_entries(RaftRequest {
                    header: header(),
                    payload: append.clone(),
                })
                .await,
            ),
        ] {
            let st = st.expect_err(&format!(
                "node {id}: a {what} without a certificate was answered"
            ));
            assert_eq!(
                st.code(),
                tonic::Code::Unauthenticated,
                "node {id} {what}: {st:?}"
            );
        }
        // Another group's certificate from the same CA: PERMISSION_DENIED.
        let mut b = peer_client(a, &ca, Some((&b_cert, &b_key)));
        let st = b
            .vote(RaftRequest {
                header: header(),
                payload: vote.clone(),
            })
            .await
            .expect_err("a vote with broker-b's certificate was answered");
        assert_eq!(
            st.code(),
            tonic::Code::PermissionDenied,
            "node {id}: {st:?}"
        );
        assert!(
            st.message()
                .contains("names no member of DefaultCluster/broker-a"),
            "{st:?}"
        );
        // A certificate of another CA: the handshake fails, nothing is served.
        let mut o = peer_client(a, &other.join("ca.pem"), Some((&o_cert, &o_key)));
        let st = o
            .append_entries(RaftRequest {
                header: header(),
                payload: append.clone(),
            })
            .await
            .expect_err("an append over another CA's certificate was answered");
        assert!(
            matches!(st.code(), tonic::Code::Unavailable | tonic::Code::Cancelled),
            "node {id}: {st:?}"
        );
        // Plaintext: no answer either.
        let plain = Endpoint::from_shared(format!("http://{a}"))
            .unwrap()
            .timeout(Duration::from_secs(2))
            .connect_lazy();
        let st = RaftPeerServiceClient::new(plain)
            .vote(RaftRequest {
                header: header(),
                payload: vote.clone(),
            })
            .await
            .expect_err("a plaintext vote was answered");
        // The TLS port never served it (a served refusal would be UNAUTHENTICATED).
        assert!(
            !matches!(
                st.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ),
            "node {id}: {st:?}"
        );
        // Joining as a learner needs the admin: unsigned, and as a plain user, refused.
        let mut join = s.admin_client(a, None);
        let r = join
            .add_learner(AddLearnerRequest {
                node_id: 9,
                address: "127.0.0.1:1".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            code(&r.error),
            ErrorCode::Unauthenticated,
            "node {id}: {:?}",
            r.error
        );
    }
    // The plaintext health listener serves health and /metrics, and nothing else.
    for (id, h) in &s.health {
        let ch = Endpoint::from_shared(format!("http://{h}"))
            .unwrap()
            .connect_lazy();
        let st = tonic_health_check(ch.clone()).await;
        assert_eq!(st, Some(1), "node {id}: health on {h}");
        let page = raftmq_tests::metrics(h).await;
        assert!(
            page.contains("raftmq_"),
            "node {id}: /metrics on {h}: {page:.200}"
        );
        let st = broker_service_client::BrokerServiceClient::new(ch)
            .send(send_request(9, 1, TOPIC, 0, vec![b"x".to_vec()]))
            .await
            .expect_err("the health port served a send");
        assert_eq!(st.code(), tonic::Code::Unimplemented, "node {id}: {st:?}");
    }
    // A second certificate naming member 3 (a stolen copy): admitted until it is revoked, then
    // refused at the handshake by every node once it rereads its revocation list.
    let issuer = raftmq_security::certgen::Ca::from_dir(&s.certs).unwrap();
    let member_3 = raftmq_security::identity::NodeIdentity {
        cluster: "DefaultCluster".into(),
        broker: "broker-a".into(),
        node_id: 3,
    };
    let copy = issuer
        .issue_node(&member_3, &["localhost".into(), "127.0.0.1".into()])
        .unwrap();
    let (c_cert, c_key) = (s.certs.join("copy-3.pem"), s.certs.join("copy-3.key"));
    std::fs::write(&c_cert, &copy.cert).unwrap();
    std::fs::write(&c_key, &copy.key).unwrap();
    // A vote no one grants (an older term, an empty log): answered, and it changes nothing.
    let stale_vote =
        raftmq_raft_log::testkit::forged_vote(before.term.saturating_sub(1).max(1), 9, 0, 0);
    for (id, node) in c.nodes.iter() {
        peer_client(&node.addr, &ca, Some((&c_cert, &c_key)))
            .vote(RaftRequest {
                header: header(),
                payload: stale_vote.clone(),
            })
            .await
            .unwrap_or_else(|st| {
                panic!("node {id}: the copy was refused before it was revoked: {st:?}")
            });
    }
    raftmq_security::certgen::revoke(&s.certs, &c_cert).unwrap();
    for (id, node) in c.nodes.iter() {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let st = peer_client(&node.addr, &ca, Some((&c_cert, &c_key)))
                .vote(RaftRequest {
                    header: header(),
                    payload: stale_vote.clone(),
                })
                .await;
            match st {
                Err(st)
                    if matches!(st.code(), tonic::Code::Unavailable | tonic::Code::Cancelled) =>
                {
                    break;
                }
                other => assert!(
                    std::time::Instant::now() < deadline,
                    "node {id} still admits a revoked certificate: {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The group did not move: same leader, same term, the log holds exactly what was acked.
    let after = c.status(leader).await.unwrap();
    assert_eq!((after.role.as_str(), after.term), ("leader", before.term));
    assert_eq!(after.peers.len(), before.peers.len(), "membership changed");
    let mut reads = std::collections::BTreeMap::new();
    for (id, node) in c.nodes.iter() {
        let st = c.status(*id).await.unwrap();
        assert_eq!(st.term, before.term, "node {id} moved to another term");
        assert!(
            !st.config_json.contains(secure::ADMIN_SECRET),
            "node {id} shows the secret"
        );
        reads.insert(*id, read_secure(&c, &node.addr).await);
    }
    // The history checker: every acknowledged message on every node, nothing else, no divergence.
    let report = history::check::check(&hist, &reads, 0);
    assert!(report.is_ok(), "{report:?}");
    assert_eq!(report.acked_msgs, 40);
    // Distinct messages read; `missing` (in is_ok) counts one a node lacks.
    assert_eq!(report.read_msgs, 40, "{report:?}");
}

/// A secure group with `orders` (2 queues) and the users alice (Pub and Sub on orders*, Sub on
/// every group) and bob (Sub on orders and on groups g-*): returns the cluster.
async fn secure_cluster_with_users() -> Cluster {
    let c = Cluster::start_secure(3, &["--register-interval-ms", "500"]).await;
    c.wait_feature_levels(Duration::from_secs(20))
        .await
        .unwrap();
    let s = c.secure();
    let addr = c.nodes[&c.leader().await].addr.clone();
    let r = s
        .client(&addr, Some(&s.admin))
        .create_topic(CreateTopicRequest {
            name: TOPIC.into(),
            queues: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    add_user(
        &c,
        "alice",
        "alice-secret",
        &[
            rule("allow", "Pub,Sub", "topic:orders*"),
            rule("allow", "Sub", "group:*"),
        ],
    )
    .await;
    add_user(
        &c,
        "bob",
        "bob-secret-1",
        &[
            rule("allow", "Sub", "topic:orders"),
            rule("allow", "Sub", "group:g-*"),
        ],
    )
    .await;
    c
}

/// The raftmq client's security for `creds` on a secure cluster.
fn client_security(c: &Cluster, creds: &Credentials) -> raftmq_client::ClientSecurity {
    raftmq_client::ClientSecurity::default()
        .with_tls(c.secure().tls.clone())
        .with_credentials(creds.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_3_the_raftmq_client_produces_and_consumes_over_tls_signed() {
    let c = secure_cluster_with_users().await;
    let alice = creds("alice", "alice-secret");
    let producer = raftmq_client::Producer::builder(&c.nameserver)
        .security(client_security(&c, &alice))
        .build()
        .unwrap();
    let mut sent = Vec::new();
    for i in 0..50 {
        let body = format!("tls-{i}");
        producer
            .send(TOPIC, raftmq_client::Message::new(body.clone()))
            .await
            .unwrap_or_else(|e| panic!("alice's send {i}: {e}"));
        sent.push(body);
    }
    let mut consumer = raftmq_client::Consumer::builder(&c.nameserver, "g-alice", TOPIC)
        .security(client_security(&c, &alice))
        .build()
        .unwrap();
    let mut got = Vec::new();
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while got.len() < sent.len() && std::time::Instant::now() < end {
        for m in consumer.poll(100, Duration::from_secs(1)).await.unwrap() {
            got.push(String::from_utf8_lossy(&m.body).to_string());
        }
    }
    got.sort();
    sent.sort();
    assert_eq!(got, sent, "alice consumed what she produced");
    // bob may not produce: the client gets FORBIDDEN, and nothing is stored.
    let bob = creds("bob", "bob-secret-1");
    let as_bob = raftmq_client::Producer::builder(&c.nameserver)
        .security(client_security(&c, &bob))
        .send_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let e = as_bob
        .send(TOPIC, raftmq_client::Message::new("from bob"))
        .await
        .expect_err("bob's send was stored");
    assert!(
        e.to_string().contains("bob may not Pub on topic:orders"),
        "{e}"
    );
    // A wrong secret: UNAUTHENTICATED, at the nameserver already.
    let wrong = raftmq_client::Producer::builder(&c.nameserver)
        .security(client_security(&c, &creds("alice", "wrong-secret")))
        .send_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let e = wrong
        .send(TOPIC, raftmq_client::Message::new("x"))
        .await
        .expect_err("a wrong secret was taken");
    assert!(e.to_string().contains("signature does not match"), "{e}");
    assert_eq!(stored(&c, TOPIC).await, 50);
}

/// The official RocketMQ 5 Python client with `Credentials(ak, sk)` and `tls_enable=True`,
/// trusting the test CA through gRPC's roots file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t91_4_the_official_python_client_signs_and_speaks_tls() {
    let c = secure_cluster_with_users().await;
    let s = c.secure();
    let leader = c.leader().await;
    let follower = c.nodes.keys().copied().find(|id| *id != leader).unwrap();
    let endpoints = c.nodes[&follower].addr.clone();
    let home = c.dir.path().join("py-home");
    std::fs::create_dir_all(&home).unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/rocketmq5/secure.py");
    let child = tokio::process::Command::new(python())
        .arg(&script)
        .args([
            "--endpoints",
            &endpoints,
            "--topic",
            TOPIC,
            "--group",
            "g-alice",
        ])
        .args(["--access-key", "alice", "--secret-key", "alice-secret"])
        .args(["--reader-key", "bob", "--reader-secret", "bob-secret-1"])
        .args([
            "--reader-group",
            "other-group",
            "--count",
            "20",
            "--max-seconds",
            "60",
        ])
        .env("HOME", &home)
        .env("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", s.certs.join("ca.pem"))
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("secure.py ran past 120 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|_| {
        panic!(
            "secure.py printed no JSON\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(v.get("fatal").is_none(), "secure.py failed: {v}");
    let sent = v["sent"].as_array().unwrap();
    assert_eq!(sent.len(), 20, "alice's sends: {v}");
    let mut received: Vec<&str> = v["received"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x.as_str())
        .collect();
    let mut sent_ids: Vec<&str> = sent.iter().filter_map(|x| x.as_str()).collect();
    received.sort();
    sent_ids.sort();
    assert_eq!(received, sent_ids, "alice received what she sent: {v}");
    assert_eq!(v["acked"], 20);
    let text = |k: &str| {
        v[k]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{k} succeeded: {v}"))
            .to_string()
    };
    // The client refuses to send once its route query is answered UNAUTHORIZED (its exception
    // says only that the route failed; the status is in its log).
    let wrong = format!("{} {}", text("wrong_secret"), v["wrong_secret"]["log"]);
    assert!(
        wrong.contains("40100") && wrong.contains("signature does not match"),
        "{wrong}"
    );
    let no_pub = text("no_pub");
    assert!(
        no_pub.contains("40300") || no_pub.to_uppercase().contains("FORBIDDEN"),
        "{no_pub}"
    );
    let no_group = text("no_group");
    assert!(
        no_group.contains("40300") || no_group.to_uppercase().contains("FORBIDDEN"),
        "{no_group}"
    );
    // Only alice's 20 were stored.
    assert_eq!(stored(&c, TOPIC).await, 20);
}

/// grpc.health.v1 Check ("" = the whole server) over `ch`: the serving status number (1 =
/// SERVING), or None when it did not answer.
async fn tonic_health_check(ch: tonic::transport::Channel) -> Option<i32> {
    let r = tonic_health::pb::health_client::HealthClient::new(ch)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .ok()?;
    Some(r.into_inner().status)
}

/// What the node at `addr` holds in every queue of the history's topic, read over TLS as the
/// admin, in the history checker's form.
async fn read_secure(c: &Cluster, addr: &str) -> history::workload::NodeRead {
    let s = c.secure();
    let mut client = s.client(addr, Some(&s.admin));
    let mut read = history::workload::NodeRead::default();
    for queue in 0..history::QUEUES {
        let mut msgs = Vec::new();
        let mut offset = 0;
        loop {
            let r = client
                .pull(PullRequest {
                    topic: history::TOPIC.into(),
                    queue,
                    offset,
                    max_messages: 500,
                    ..Default::default()
                })
                .await;
            let r = match r {
                Ok(r) => r.into_inner(),
                Err(e) => {
                    read.errors.push(format!("q{queue}@{offset}: {e}"));
                    break;
                }
            };
            if code(&r.error) != ErrorCode::Ok {
                read.errors
                    .push(format!("q{queue}@{offset}: {:?}", r.error));
                break;
            }
            if r.messages.is_empty() {
                break;
            }
            for m in r.messages {
                offset = m.offset + 1;
                msgs.push((m.offset, m.body.to_vec()));
            }
        }
        read.queues.insert(queue, msgs);
    }
    read
}
