//! Tests against a real local cluster (a nameserver and three broker-node processes), run one at
//! a time. Numbered by area, simple first:
//! - t10: every CLI command, its exit status and its JSON shape;
//! - t20: consumer groups of two and three members share queues without overlap, a leaving
//!   member hands its queues on, committed offsets resume in a new member;
//! - t30: a producer across leader kills stores every acknowledged message once, and committed
//!   offsets resume after a failover.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use raftmq_cli::load::{Load, verify};
use raftmq_cli::local_cluster::{LocalCluster, LocalClusterOptions};
use raftmq_client::{Admin, Consumer, Message, Producer, QueueId, StartFrom};
use serde_json::Value;
use tokio::time::Instant;

/// Clusters are heavy for a two-core machine: one test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs the `raftmq` binary against the cluster's nameserver.
fn raftmq(ns: &str, args: &[&str], stdin: Option<&str>) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_raftmq"))
        .args(args)
        .env("RAFTMQ_NAMESERVER", ns)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn raftmq");
    if let Some(input) = stdin {
        let mut s = child.stdin.take().expect("stdin");
        s.write_all(input.as_bytes()).expect("write stdin");
    }
    let o = child.wait_with_output().expect("raftmq output");
    let out = Out {
        ok: o.status.success(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    };
    assert!(
        out.ok || !out.stderr.is_empty(),
        "a failing command must say why: {args:?}"
    );
    out
}

fn ok(ns: &str, args: &[&str], stdin: Option<&str>) -> String {
    let o = raftmq(ns, args, stdin);
    assert!(o.ok, "raftmq {args:?} failed: {}", o.stderr);
    o.stdout
}

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

fn has_keys(v: &Value, keys: &[&str]) {
    for k in keys {
        assert!(v.get(*k).is_some(), "{k} missing in {v}");
    }
}

async fn start() -> LocalCluster {
    LocalCluster::start(LocalClusterOptions::default())
        .await
        .expect("local cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_every_command_against_a_local_cluster() {
    let _serial = SERIAL.lock().await;
    let cluster = start().await;
    let ns = cluster.nameserver.clone();
    tracing::info!("cluster status");
    let status = json_lines(&ok(&ns, &["cluster", "status", "--json"], None));
    let broker = &status[0]["clusters"][0]["brokers"][0];
    has_keys(broker, &["name", "leader_id", "term", "nodes"]);
    let nodes = broker["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3);
    for n in nodes {
        has_keys(
            n,
            &[
                "node_id",
                "address",
                "role",
                "term",
                "last_log_index",
                "committed",
                "applied",
                "lag",
            ],
        );
    }
    let leader = broker["leader_id"].as_u64().expect("leader id");
    assert_eq!(
        nodes.iter().filter(|n| n["role"] == "leader").count(),
        1,
        "{broker}"
    );
    assert!(ok(&ns, &["cluster", "status"], None).contains("leader"));

    tracing::info!("topics");
    ok(&ns, &["topic", "create", "t10", "--queues", "4"], None);
    let list = json_lines(&ok(&ns, &["topic", "list", "--json"], None));
    assert!(
        list[0]["topics"]
            .as_array()
            .expect("topics")
            .iter()
            .any(|t| t["name"] == "t10")
    );
    let route = json_lines(&ok(&ns, &["topic", "route", "t10", "--json"], None));
    assert_eq!(route[0]["topic"], "t10");
    let rb = &route[0]["brokers"][0];
    has_keys(rb, &["name", "leader_id", "queues", "nodes"]);
    assert_eq!(rb["queues"], 4);
    has_keys(&rb["nodes"][0], &["node_id", "address", "role"]);

    tracing::info!("produce");
    let produced = json_lines(&ok(
        &ns,
        &[
            "produce", "--topic", "t10", "--count", "50", "--size", "32", "--json",
        ],
        None,
    ));
    assert_eq!(produced.len(), 50);
    for p in &produced {
        has_keys(p, &["topic", "broker", "queue", "offset", "msg_id"]);
    }
    let keyed = json_lines(&ok(
        &ns,
        &[
            "produce", "--topic", "t10", "--key", "k", "--tag", "x", "--json",
        ],
        Some("a\nb\nc\n"),
    ));
    assert_eq!(keyed.len(), 3);
    assert!(
        keyed.iter().all(|p| p["queue"] == keyed[0]["queue"]),
        "one key, one queue"
    );
    let offs: Vec<u64> = keyed
        .iter()
        .map(|p| p["offset"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        offs.windows(2).all(|w| w[0] < w[1]),
        "one key keeps its order: {offs:?}"
    );

    tracing::info!("consume");
    let consumed = json_lines(&ok(
        &ns,
        &[
            "consume", "--topic", "t10", "--group", "g10", "--from", "earliest", "--max", "53",
            "--json",
        ],
        None,
    ));
    assert_eq!(consumed.len(), 53);
    for m in &consumed {
        has_keys(
            m,
            &[
                "topic",
                "broker",
                "queue",
                "offset",
                "msg_id",
                "key",
                "tag",
                "body",
                "served_by",
            ],
        );
    }
    let positions: HashSet<(u64, u64)> = consumed
        .iter()
        .map(|m| {
            (
                m["queue"].as_u64().unwrap_or(99),
                m["offset"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(positions.len(), 53, "no message twice");
    assert!(
        consumed
            .iter()
            .any(|m| m["body"] == "b" && m["key"] == "k" && m["tag"] == "x")
    );
    let again = ok(
        &ns,
        &[
            "consume",
            "--topic",
            "t10",
            "--group",
            "g10",
            "--timeout-ms",
            "1500",
        ],
        None,
    );
    assert_eq!(again.lines().count(), 0, "offsets were committed");

    tracing::info!("bench produce and consume");
    let bench = json_lines(&ok(
        &ns,
        &[
            "bench",
            "produce",
            "--topic",
            "t10-bench",
            "--count",
            "400",
            "--size",
            "64",
            "--inflight",
            "32",
            "--keys",
            "4",
            "--json",
        ],
        None,
    ));
    assert_eq!(bench.len(), 1, "one JSON object");
    has_keys(
        &bench[0],
        &[
            "bench",
            "messages",
            "failed",
            "msgs_per_sec",
            "mb_per_sec",
            "latency_ms",
        ],
    );
    assert_eq!(bench[0]["bench"], "produce");
    assert_eq!(bench[0]["keys"], 4);
    // Linux has /proc/stat: the hypervisor's share of the run's CPU time, a percentage.
    let steal = bench[0]["cpu_steal_pct"].as_f64();
    assert!(
        steal.is_some_and(|s| (0.0..=100.0).contains(&s)),
        "cpu_steal_pct: {}",
        bench[0]
    );
    assert_eq!(bench[0]["messages"], 400);
    assert_eq!(bench[0]["failed"], 0);
    has_keys(
        &bench[0]["latency_ms"],
        &["p50_ms", "p99_ms", "p999_ms", "max_ms"],
    );
    assert!(bench[0]["latency_ms"]["p50_ms"].as_f64().unwrap() > 0.0);
    let keyed = json_lines(&ok(
        &ns,
        &[
            "consume",
            "--topic",
            "t10-bench",
            "--group",
            "g10-bench",
            "--from",
            "earliest",
            "--timeout-ms",
            "1500",
            "--json",
        ],
        None,
    ));
    assert_eq!(keyed.len(), 400);
    // Each key's messages went to one queue.
    let mut queue_of_key: BTreeMap<String, (String, u64)> = BTreeMap::new();
    for m in &keyed {
        let key = m["key"].as_str().unwrap().to_string();
        let at = (
            m["broker"].as_str().unwrap().to_string(),
            m["queue"].as_u64().unwrap(),
        );
        assert_eq!(
            queue_of_key.entry(key.clone()).or_insert(at.clone()),
            &at,
            "{key}"
        );
    }
    assert_eq!(queue_of_key.len(), 4);
    let drained = json_lines(&ok(
        &ns,
        &[
            "bench",
            "consume",
            "--topic",
            "t10-bench",
            "--count",
            "400",
            "--json",
        ],
        None,
    ));
    assert_eq!(drained[0]["bench"], "consume");
    assert_eq!(drained[0]["messages"], 400);
    has_keys(
        &drained[0],
        &["msgs_per_sec", "mb_per_sec", "end_to_end_latency_ms"],
    );

    tracing::info!("leader transfer");
    let to = nodes
        .iter()
        .filter_map(|n| n["node_id"].as_u64())
        .find(|id| *id != leader)
        .expect("a follower");
    ok(
        &ns,
        &[
            "leader",
            "transfer",
            "--broker",
            "broker-a",
            "--to",
            &to.to_string(),
        ],
        None,
    );
    let status = json_lines(&ok(&ns, &["cluster", "status", "--json"], None));
    assert_eq!(status[0]["clusters"][0]["brokers"][0]["leader_id"], to);

    tracing::info!("delete and errors");
    ok(&ns, &["topic", "delete", "t10"], None);
    let bad = raftmq(
        &ns,
        &["consume", "--topic", "t10", "--group", "bad name"],
        None,
    );
    assert!(!bad.ok);
    assert_eq!(
        bad.stderr.trim().lines().count(),
        1,
        "one-line reason: {}",
        bad.stderr
    );
    let bad = raftmq("127.0.0.1:1", &["topic", "list"], None);
    assert!(
        !bad.ok && bad.stderr.starts_with("raftmq: "),
        "{}",
        bad.stderr
    );
}

/// Polls until the members' assignments are disjoint and cover `all` queues.
async fn wait_balanced(consumers: &[&Consumer], all: usize) -> Vec<Vec<QueueId>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let sets: Vec<Vec<QueueId>> = consumers.iter().map(|c| c.assignment()).collect();
        let union: HashSet<&QueueId> = sets.iter().flatten().collect();
        let total: usize = sets.iter().map(Vec::len).sum();
        if union.len() == all && total == all && sets.iter().all(|s| !s.is_empty()) {
            return sets;
        }
        assert!(Instant::now() < deadline, "not balanced: {sets:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads with every consumer until `n` messages arrived in total; returns (queue, offset) per
/// consumer.
async fn drain(consumers: &mut [Consumer], n: usize) -> Vec<Vec<(String, u32, u64)>> {
    let mut got: Vec<Vec<(String, u32, u64)>> = vec![Vec::new(); consumers.len()];
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.iter().map(Vec::len).sum::<usize>() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} read",
            got.iter().map(Vec::len).sum::<usize>()
        );
        for (i, c) in consumers.iter_mut().enumerate() {
            for m in c.poll(1000, Duration::from_millis(50)).await.expect("poll") {
                got[i].push((m.broker, m.queue, m.offset));
            }
        }
    }
    got
}

async fn produce_n(ns: &str, topic: &str, n: usize) {
    let p = Producer::builder(ns).build().expect("producer");
    let sends = (0..n).map(|i| p.send(topic, Message::new(format!("m{i}"))));
    for r in futures::future::join_all(sends).await {
        r.expect("acknowledged");
    }
    p.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_consumer_groups_share_hand_over_and_resume() {
    let _serial = SERIAL.lock().await;
    let cluster = start().await;
    let ns = cluster.nameserver.clone();
    Admin::connect(&ns)
        .expect("admin")
        .create_topic("t20", 6, None)
        .await
        .expect("topic");
    produce_n(&ns, "t20", 600).await;
    let member = |id: &str| {
        Consumer::builder(&ns, "g20", "t20")
            .consumer_id(id)
            .start_from(StartFrom::Earliest)
            .heartbeat_interval(Duration::from_millis(300))
            .build()
            .expect("consumer")
    };
    tracing::info!("three members");
    let mut cs = vec![member("c1"), member("c2"), member("c3")];
    let sets = wait_balanced(&cs.iter().collect::<Vec<_>>(), 6).await;
    assert!(sets.iter().all(|s| s.len() == 2), "{sets:?}");
    let got = drain(&mut cs, 600).await;
    let all: Vec<_> = got.iter().flatten().collect();
    assert_eq!(
        all.iter().collect::<HashSet<_>>().len(),
        600,
        "no overlap, nothing missing"
    );
    for (i, g) in got.iter().enumerate() {
        let mine: HashSet<QueueId> = sets[i].iter().cloned().collect();
        assert!(
            g.iter()
                .all(|(b, q, _)| mine.contains(&QueueId::new(b.clone(), *q)))
        );
    }

    // What was read is processed: commit it, so the hand-over below re-reads nothing (without
    // this, at-least-once allows re-reading what a member returned but had not committed).
    for c in cs.iter_mut() {
        c.commit().await.expect("commit");
    }

    tracing::info!("one leaves, two share");
    let c3 = cs.pop().expect("c3");
    c3.close().await.expect("close commits and leaves");
    let sets = wait_balanced(&cs.iter().collect::<Vec<_>>(), 6).await;
    assert!(sets.iter().all(|s| s.len() == 3), "{sets:?}");
    produce_n(&ns, "t20", 300).await;
    let got = drain(&mut cs, 300).await;
    let all: Vec<_> = got.iter().flatten().collect();
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 300);
    assert_eq!(all.len(), 300, "nothing read twice after the hand-over");
    for c in cs {
        c.close().await.expect("close");
    }

    tracing::info!("a new member resumes at the committed offsets");
    let mut c = member("c4");
    let batch = c.poll(1000, Duration::from_secs(3)).await.expect("poll");
    assert!(batch.is_empty(), "re-read {} messages", batch.len());
    c.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_producer_and_offsets_across_leader_kills() {
    let _serial = SERIAL.lock().await;
    let mut cluster = start().await;
    let ns = cluster.nameserver.clone();
    let admin = Admin::connect(&ns).expect("admin");
    admin.create_topic("t30", 4, None).await.expect("topic");
    let producer = Arc::new(Producer::builder(&ns).build().expect("producer"));
    let load = Load::start(producer.clone(), "t30", "t30", 4, 32);
    for round in 0..2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (leader, _) = admin
            .leader_of("broker-a")
            .await
            .expect("status")
            .expect("leader");
        tracing::info!("round {round}: kill leader {leader}");
        let killed = Instant::now();
        cluster.kill(leader).expect("kill");
        let deadline = killed + Duration::from_secs(15);
        while load.first_ack_started_after(killed).is_none() {
            assert!(
                Instant::now() < deadline,
                "no acknowledgement after the kill"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cluster.restart(leader).expect("restart");
        cluster
            .wait_ready(Duration::from_secs(20))
            .await
            .expect("ready");
    }
    let log = load.stop().await;
    assert_eq!(log.failed, 0, "{:?}", log.first_error);
    let acked: HashSet<String> = log.acks.iter().map(|a| a.body.clone()).collect();
    let report = verify(&ns, "t30", &acked, Duration::from_secs(10))
        .await
        .expect("verify");
    assert_eq!(report.lost, 0, "{report:?}");
    assert_eq!(report.duplicates, 0, "{report:?}");

    tracing::info!("offsets survive a failover");
    let total = report.consumed as usize;
    let member = || {
        Consumer::builder(&ns, "g30", "t30")
            .start_from(StartFrom::Earliest)
            .build()
            .expect("consumer")
    };
    let mut first = vec![member()];
    let half = drain(&mut first, total / 2).await;
    let read1: HashSet<_> = half[0].iter().cloned().collect();
    for c in first {
        c.close().await.expect("close commits");
    }
    let (leader, _) = admin
        .leader_of("broker-a")
        .await
        .expect("status")
        .expect("leader");
    cluster.kill(leader).expect("kill");
    let mut second = vec![member()];
    let rest = drain(&mut second, total - read1.len()).await;
    let read2: HashSet<_> = rest[0].iter().cloned().collect();
    assert!(read1.is_disjoint(&read2), "re-read after the failover");
    assert_eq!(read1.len() + read2.len(), total);
    for c in second {
        c.close().await.expect("close");
    }
}
