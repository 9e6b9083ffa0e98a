//! The operator commands against a real three-node group, run as a user runs them (the `raftmq`
//! binary, `--json`): `topic status`, `msg get|find` (by raftmq id, client id, key, store time),
//! `group status` and `group reset`, and the lag a group status reports while its leader is
//! killed. Each answer is checked against what the test itself sent and consumed.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raftmq_proto::v1::inspect_service_client::InspectServiceClient;
use raftmq_proto::v1::*;
use raftmq_tests::*;
use serde_json::Value;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `raftmq ARGS --json` against the cluster's nameserver: success, JSON lines, stderr.
fn raftmq(ns: &str, args: &[&str]) -> (bool, Vec<Value>, String) {
    raftmq_json(ns, args)
}

/// As [`raftmq`], which must succeed with exactly one JSON object.
fn one(ns: &str, args: &[&str]) -> Value {
    let (ok, mut lines, err) = raftmq(ns, args);
    assert!(ok && lines.len() == 1, "{args:?}: {lines:?} {err}");
    lines.remove(0)
}

/// A message with a client id (as the RocketMQ 5 front stores it) and keys, sent to the leader.
async fn send_with_id(c: &Cluster, queue: u32, id: &str, key: &str, body: &str) {
    let leader = c.leader().await;
    let mut m = Message {
        key: key.into(),
        body: body.as_bytes().to_vec().into(),
        ..Default::default()
    };
    m.properties.insert("__rmq.msgid".into(), id.into());
    let r = c
        .client(leader)
        .await
        .send(SendRequest {
            topic: "look".into(),
            queue,
            messages: vec![m],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
}

fn count_of(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// 26.1 `topic status` counts what was sent; `msg get` finds a message by its raftmq id and by a
///      client's id, `msg find` by key (a v1 key, and one of a v2 message's several keys) and by
///      store time. After the leader is killed the new leader answers the same (its indexes were
///      built by apply), and after every node restarts too (rebuilt from the log). A follower
///      refuses the views with NOT_LEADER; an unknown id fails naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t26_1_topic_status_and_message_lookup_survive_failover_and_restart() {
    let mut c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    c.create_topic("look", 2).await;
    let ns = c.nameserver.clone();
    let t0 = now_ms();
    let (ok, produced, err) = raftmq(
        &ns,
        &[
            "produce", "--topic", "look", "--key", "order-1", "--count", "3", "--size", "20",
        ],
    );
    assert!(ok && produced.len() == 3, "{produced:?} {err}");
    send_with_id(&c, 1, "CLIENT-ID-1", "alpha beta", "v2 body").await;
    let t1 = now_ms();

    let check = |ns: &str, when: &str| {
        let st = one(ns, &["topic", "status", "look"]);
        assert_eq!(count_of(&st, "messages"), 4, "{when}: {st}");
        assert!(count_of(&st, "bytes") >= 3 * 20 + 7, "{when}: {st}");
        let queues: Vec<&Value> = st["brokers"][0]["queues"]
            .as_array()
            .unwrap()
            .iter()
            .collect();
        assert_eq!(queues.len(), 2, "{st}");
        for q in &queues {
            if count_of(q, "messages") > 0 {
                let last = count_of(q, "last_store_ms");
                assert!((t0..=t1).contains(&last), "{when}: {t0} <= {last} <= {t1}");
            }
        }

        let first = &produced[0];
        let got = one(
            ns,
            &[
                "msg",
                "get",
                "--topic",
                "look",
                "--id",
                first["msg_id"].as_str().unwrap(),
            ],
        );
        assert_eq!(got["offset"], first["offset"], "{when}: {got}");
        assert_eq!(got["queue"], first["queue"], "{when}: {got}");
        assert_eq!(got["key"], "order-1");

        let got = one(
            ns,
            &["msg", "get", "--topic", "look", "--id", "CLIENT-ID-1"],
        );
        assert_eq!(got["body"], "v2 body", "{when}: {got}");
        assert_eq!(got["properties"]["__rmq.msgid"], "CLIENT-ID-1");

        let (ok, by_key, err) = raftmq(ns, &["msg", "find", "--topic", "look", "--key", "order-1"]);
        assert!(ok, "{err}");
        let offsets: Vec<&Value> = by_key.iter().map(|m| &m["offset"]).collect();
        let want: Vec<&Value> = produced.iter().map(|m| &m["offset"]).collect();
        assert_eq!(offsets, want, "{when}: the three keyed messages, in order");
        for key in ["beta", "alpha beta"] {
            let (ok, found, err) = raftmq(ns, &["msg", "find", "--topic", "look", "--key", key]);
            assert!(ok && found.len() == 1, "{when} {key}: {found:?} {err}");
            assert_eq!(found[0]["body"], "v2 body");
        }
        let (ok, none, _) = raftmq(ns, &["msg", "find", "--topic", "look", "--key", "order"]);
        assert!(ok && none.is_empty(), "{when}: no partial match: {none:?}");

        let (from, to) = (t0.to_string(), t1.to_string());
        let (ok, in_time, err) = raftmq(
            ns,
            &[
                "msg", "find", "--topic", "look", "--from", &from, "--to", &to,
            ],
        );
        assert!(ok && in_time.len() == 4, "{when}: {in_time:?} {err}");
        let later = (t1 + 3_600_000).to_string();
        let (ok, after, _) = raftmq(
            ns,
            &[
                "msg", "find", "--topic", "look", "--from", &later, "--to", &later,
            ],
        );
        assert!(ok && after.is_empty(), "{when}: {after:?}");

        let (ok, _, err) = raftmq(ns, &["msg", "get", "--topic", "look", "--id", "nope"]);
        assert!(!ok, "{when}");
        assert_eq!(
            err.matches("no message with id nope in topic look").count(),
            1,
            "{err}"
        );
    };
    check(&ns, "first leader");

    // A follower does not answer: its figures could be behind.
    let leader = c.leader().await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let addr = c.node_address(follower).unwrap().to_string();
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let r = InspectServiceClient::new(ch)
        .topic_status(TopicStatusRequest {
            topic: "look".into(),
            at_ms: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::NotLeader, "{r:?}");

    c.kill(leader);
    let next = c.new_leader_after(leader).await;
    wait_for(
        "the route to name the new leader",
        Duration::from_secs(15),
        || async {
            let (ok, _, _) = raftmq(&ns, &["topic", "status", "look"]);
            ok.then_some(())
        },
    )
    .await;
    check(
        &ns,
        &format!("after node {leader} was killed (node {next} leads)"),
    );

    c.kill_all();
    for id in 1..=3 {
        c.spawn(id);
    }
    c.leader().await;
    wait_for(
        "the group to answer after the restart",
        Duration::from_secs(20),
        || async {
            let (ok, v, _) = raftmq(&ns, &["topic", "status", "look"]);
            (ok && v.first().is_some_and(|v| v["messages"] == 4)).then_some(())
        },
    )
    .await;
    check(&ns, "after every node restarted");
}

/// A `raftmq consume --follow` member of `group`, killed on drop.
struct Member(Child);

impl Member {
    fn start(ns: &str, group: &str) -> Member {
        let child = Command::new(bin("raftmq"))
            .args(["consume", "--topic", "lag", "--group", group, "--follow"])
            .env("RAFTMQ_NAMESERVER", ns)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start consume");
        Member(child)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pull group "g" reads (and commits) the first 4 messages of topic "lag".
fn consume_four(ns: &str) {
    let (ok, got, err) = raftmq(
        ns,
        &[
            "consume",
            "--topic",
            "lag",
            "--group",
            "g",
            "--max",
            "4",
            "--timeout-ms",
            "5000",
        ],
    );
    assert!(ok && got.len() == 4, "{got:?} {err}");
}

/// Three messages of topic "lag" handed out to the POP group "gp" and left unacknowledged.
async fn pop_three(c: &Cluster, leader: u64) {
    let popped = c
        .client(leader)
        .await
        .pop(PopRequest {
            group: "gp".into(),
            topic: "lag".into(),
            max_messages: 3,
            invisible_ms: 600_000,
            consumer_id: "t26".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(popped.messages.len(), 3, "{:?}", popped.error);
}

fn queue0(st: &Value) -> &Value {
    &st["brokers"][0]["queues"][0]
}

/// 26.2 `group status` of a pull group: committed offset, lag in messages and age, last commit;
///      the member reading a queue while one runs; `group reset` refused while it runs (naming
///      it), done with `--force`, and to earliest, latest and a time. A POP group's deliveries
///      show as in flight and ready; its reset moves its cursor, drops what is in flight, and
///      holds after a leader kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t26_2_group_status_and_reset() {
    let mut c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    c.create_topic("lag", 1).await;
    let ns = c.nameserver.clone();
    let produce = |n: &str| {
        let (ok, v, err) = raftmq(
            &ns,
            &["produce", "--topic", "lag", "--count", n, "--size", "8"],
        );
        assert!(ok, "{v:?} {err}");
    };
    produce("10");
    consume_four(&ns);

    let st = wait_for("the commit of 4", Duration::from_secs(10), || async {
        let v = one(&ns, &["group", "status", "g"]);
        (queue0(&v)["committed_offset"] == 4).then_some(v)
    })
    .await;
    let q = queue0(&st);
    assert_eq!(count_of(q, "lag"), 6, "{st}");
    assert_eq!(count_of(&st, "lag"), 6);
    assert!(count_of(q, "lag_ms") < 120_000, "{st}");
    assert!(q["last_commit_ms"].as_u64().is_some(), "{st}");
    assert_eq!(st["pop"], false);

    let member = Member::start(&ns, "g");
    let st = wait_for("the member to show", Duration::from_secs(15), || async {
        let v = one(&ns, &["group", "status", "g", "--topic", "lag"]);
        (queue0(&v)["member"].is_string() && queue0(&v)["lag"] == 0).then_some(v)
    })
    .await;
    let id = queue0(&st)["member"].as_str().unwrap().to_string();
    assert_eq!(st["members"][0].as_str(), Some(id.as_str()), "{st}");
    let (ok, _, err) = raftmq(
        &ns,
        &["group", "reset", "g", "--topic", "lag", "--to", "earliest"],
    );
    assert!(!ok, "refused while a member is connected");
    assert!(err.contains(&id) && err.contains("--force"), "{err}");
    let r = one(
        &ns,
        &[
            "group", "reset", "g", "--topic", "lag", "--to", "latest", "--force",
        ],
    );
    assert_eq!(r["queues"][0]["to"], 10, "{r}");
    drop(member);

    // Earliest, latest, and a time between two batches: the second batch's first offset.
    wait_for("the member to leave", Duration::from_secs(15), || async {
        let (ok, _, _) = raftmq(
            &ns,
            &["group", "reset", "g", "--topic", "lag", "--to", "earliest"],
        );
        ok.then_some(())
    })
    .await;
    assert_eq!(
        count_of(queue0(&one(&ns, &["group", "status", "g"])), "lag"),
        10
    );
    let between = now_ms() + 1;
    wait_for("the clock to pass", Duration::from_secs(2), || async {
        (now_ms() > between).then_some(())
    })
    .await;
    produce("5");
    let r = one(
        &ns,
        &[
            "group",
            "reset",
            "g",
            "--topic",
            "lag",
            "--to",
            &between.to_string(),
        ],
    );
    assert_eq!(r["queues"][0]["to"], 10, "{r}");
    assert_eq!(
        count_of(queue0(&one(&ns, &["group", "status", "g"])), "lag"),
        5
    );
    let r = one(
        &ns,
        &["group", "reset", "g", "--topic", "lag", "--to", "latest"],
    );
    assert_eq!(r["queues"][0]["to"], 15, "{r}");
    assert_eq!(
        count_of(queue0(&one(&ns, &["group", "status", "g"])), "lag"),
        0
    );
    let (ok, _, err) = raftmq(
        &ns,
        &["group", "reset", "g", "--topic", "lag", "--to", "soon"],
    );
    assert!(!ok && err.contains("--to \"soon\" is not a time"), "{err}");

    // A POP group: 3 messages handed out and not acknowledged.
    let leader = c.leader().await;
    pop_three(&c, leader).await;
    let st = one(&ns, &["group", "status", "gp"]);
    let q = queue0(&st);
    assert_eq!(st["pop"], true, "{st}");
    assert_eq!(count_of(q, "inflight"), 3, "{st}");
    assert_eq!(count_of(q, "ready"), 12, "{st}");
    assert_eq!(count_of(q, "lag"), 15, "{st}");
    // A POP group's reset moves its cursor and drops what is in flight, on every replica.
    let r = one(
        &ns,
        &["group", "reset", "gp", "--topic", "lag", "--to", "latest"],
    );
    assert_eq!(
        r["queues"][0]["from"], 3,
        "the cursor was after 3 deliveries: {r}"
    );
    assert_eq!(r["queues"][0]["to"], 15, "{r}");
    let q = queue0(&one(&ns, &["group", "status", "gp"])).clone();
    assert_eq!(
        (count_of(&q, "inflight"), count_of(&q, "lag")),
        (0, 0),
        "{q}"
    );
    let r = one(
        &ns,
        &["group", "reset", "gp", "--topic", "lag", "--to", "earliest"],
    );
    assert_eq!(r["queues"][0]["to"], 0, "{r}");
    c.kill(leader);
    let st = wait_for(
        "the new leader to answer",
        Duration::from_secs(20),
        || async {
            let (ok, v, _) = raftmq(&ns, &["group", "status", "gp"]);
            v.into_iter()
                .next()
                .filter(|v| ok && v["brokers"][0]["leader_id"] != leader)
        },
    )
    .await;
    let q = queue0(&st);
    assert_eq!(
        (count_of(q, "pop_next"), count_of(q, "ready")),
        (0, 15),
        "{st}"
    );
    let (ok, _, err) = raftmq(&ns, &["group", "status", "nobody"]);
    assert!(!ok && err.contains("nobody"), "{err}");
}

/// 26.3 Lag under failover: while messages are produced and consumed, `group status` is read
///      every 100 ms and the leader is SIGKILLed. The reported end offset and committed offset
///      never go down (so lag never drops by more than what was consumed): no answer came from a
///      replica that was behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t26_3_reported_lag_never_goes_backwards_across_a_leader_kill() {
    let mut c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    c.create_topic("lag", 1).await;
    let ns = c.nameserver.clone();
    let producer = Command::new(bin("raftmq"))
        .args([
            "produce", "--topic", "lag", "--count", "100000", "--size", "64",
        ])
        .args(["--inflight", "1"])
        .env("RAFTMQ_NAMESERVER", &ns)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start produce");
    let producer = Member(producer);
    let member = Member::start(&ns, "g");
    wait_for("the group to commit", Duration::from_secs(20), || async {
        let (ok, v, _) = raftmq(&ns, &["group", "status", "g", "--topic", "lag"]);
        (ok && queue0(&v[0])["committed_offset"].as_u64() > Some(0)).then_some(())
    })
    .await;

    let mut samples: Vec<(u64, u64, u64)> = Vec::new(); // (ms, max, committed)
    let started = now_ms();
    let mut killed = None;
    while now_ms() - started < 12_000 {
        if killed.is_none() && now_ms() - started > 3_000 {
            let l = c.leader().await;
            c.kill(l);
            killed = Some(now_ms() - started);
        }
        let (ok, v, _) = raftmq(&ns, &["group", "status", "g", "--topic", "lag"]);
        if ok {
            let q = queue0(&v[0]);
            if let (Some(m), Some(o)) = (q["max_offset"].as_u64(), q["committed_offset"].as_u64()) {
                samples.push((now_ms() - started, m, o));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(member);
    drop(producer);
    let after_kill = samples
        .iter()
        .filter(|s| Some(s.0) > killed.map(|k| k + 500))
        .count();
    println!(
        "{} samples, {} after the kill at {:?} ms; first {:?}, last {:?}",
        samples.len(),
        after_kill,
        killed,
        samples.first(),
        samples.last()
    );
    assert!(samples.len() >= 20 && after_kill >= 10, "{samples:?}");
    for w in samples.windows(2) {
        let ((t1, m1, o1), (t2, m2, o2)) = (w[0], w[1]);
        assert!(
            m2 >= m1,
            "end offset went down {m1} -> {m2} ({t1} -> {t2} ms)"
        );
        assert!(
            o2 >= o1,
            "committed offset went down {o1} -> {o2} ({t1} -> {t2} ms)"
        );
    }
    assert!(
        samples.last().unwrap().1 > samples[0].1,
        "produce went on: {samples:?}"
    );
}

/// The metric names a Grafana dashboard's queries use (`raftmq_…`, a histogram's `_bucket`
/// series included), sorted.
fn dashboard_metrics() -> Vec<String> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/raftmq.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut names = std::collections::BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(i) = rest.find("raftmq_") {
                let name: String = rest[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[i + name.len()..];
                names.insert(name);
            }
        }
    }
    names.into_iter().collect()
}

/// Whether `text` (Prometheus exposition) has a sample of `name`.
fn has_sample(text: &str, name: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
}

/// 26.4 Every metric the Grafana dashboard (`deploy/grafana/raftmq.json`) queries is exported by a
///      live leader once a pull group and a POP group consume; the consumer-group figures match
///      `group status`, and a follower exports none of them (its figures could be behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t26_4_every_dashboard_metric_is_exported_and_lag_comes_from_the_leader() {
    let c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    c.create_topic("lag", 1).await;
    let ns = c.nameserver.clone();
    let (ok, _, err) = raftmq(
        &ns,
        &["produce", "--topic", "lag", "--count", "10", "--size", "8"],
    );
    assert!(ok, "{err}");
    consume_four(&ns);
    let leader = c.leader().await;
    pop_three(&c, leader).await;

    let names = dashboard_metrics();
    assert!(names.len() >= 15, "{names:?}");
    let addr = c.node_address(leader).unwrap().to_string();
    let text = wait_for(
        "the leader to export every metric",
        Duration::from_secs(15),
        || async {
            let text = metrics(&addr).await;
            let missing: Vec<&String> = names.iter().filter(|n| !has_sample(&text, n)).collect();
            if missing.is_empty() {
                Ok(text)
            } else {
                Err(format!("missing {missing:?}"))
            }
        },
    )
    .await;
    let line = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.to_string())
    };
    let st = one(&ns, &["group", "status", "g"]);
    assert_eq!(
        line("raftmq_group_lag_messages{group=\"g\",queue=\"0\",topic=\"lag\"}"),
        Some(queue0(&st)["lag"].to_string()),
        "{st}"
    );
    assert_eq!(
        line("raftmq_group_inflight_messages{group=\"gp\",queue=\"0\",topic=\"lag\"}").as_deref(),
        Some("3")
    );
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let ftext = metrics(c.node_address(follower).unwrap()).await;
    assert!(has_sample(&ftext, "raftmq_raft_term"), "{ftext}");
    assert!(
        !has_sample(&ftext, "raftmq_group_lag_messages"),
        "a follower exports no consumer lag"
    );
}

/// 26.5 `node status`: by node id and by address, the node's own figures — its version,
///      uptime, config in effect, log on disk — and on the leader each follower's replication
///      lag; an unknown node is named in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t26_5_node_status_shows_one_node_in_depth() {
    let c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    c.create_topic("lag", 1).await;
    let ns = c.nameserver.clone();
    let (ok, _, err) = raftmq(
        &ns,
        &[
            "produce", "--topic", "lag", "--count", "50", "--size", "100",
        ],
    );
    assert!(ok, "{err}");
    let leader = c.leader().await;
    let v = one(&ns, &["node", "status", &leader.to_string()]);
    assert_eq!(v["role"], "leader", "{v}");
    assert_eq!(v["node_id"], leader);
    assert_eq!(v["broker"], "broker-a");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(count_of(&v, "uptime_ms") > 0, "{v}");
    assert_eq!(
        v["config"]["broker"], "broker-a",
        "the config in effect: {v}"
    );
    assert_eq!(v["config"]["node_id"], leader);
    assert!(count_of(&v["disk"], "log_bytes") >= 50 * 100, "{v}");
    assert!(v["disk"]["used_pct"].as_f64().is_some(), "{v}");
    let followers = v["followers"].as_array().unwrap();
    assert_eq!(followers.len(), 2, "{v}");
    for f in followers {
        assert!(
            f["lag"].as_u64().is_some() && f["matched_index"].as_u64() > Some(0),
            "{f}"
        );
    }

    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let addr = c.node_address(follower).unwrap().to_string();
    let v = one(&ns, &["node", "status", &addr]);
    assert_eq!(v["node_id"], follower, "{v}");
    assert_eq!(v["role"], "follower");
    assert_eq!(v["leader_id"], leader);

    let (ok, _, err) = raftmq(&ns, &["node", "status", "9"]);
    assert!(!ok && err.contains("no node 9"), "{err}");
}
