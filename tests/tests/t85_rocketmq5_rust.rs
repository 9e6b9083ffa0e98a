//! The official RocketMQ 5 Rust client (crates.io `rocketmq` 5.0.0, unmodified: Producer and
//! SimpleConsumer, all that release has) against a real three-node raftmq broker group through
//! `apache.rocketmq.v2.MessagingService`.
//!
//! The client lives in a Cargo project of its own, `tests/rocketmq-rust-client` (binary
//! `rmq5-rust`), outside this workspace: it brings tonic 0.8/0.9 and prost 0.11, which must stay
//! out of the broker's dependency graph. This crate does not depend on it; the first test that
//! needs it builds it once per test run (`cargo build --manifest-path …`, several minutes the
//! first time: ring, opentelemetry, two tonic versions) and then runs it. Each run of the binary
//! is one scenario (`send`, `receive`, `send-loop`) printing one JSON object, asserted on here.
//! The client's log (standard error) is kept in the cluster's directory and its tail is shown
//! when a run fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raftmq_cli::local_cluster::log_tail;
use raftmq_tests::rocketmq5::{by_id, list, str_of, wait_for_progress};
use raftmq_tests::*;
use serde_json::Value;

/// The client project's directory.
fn project_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rocketmq-rust-client")
}

/// The `rmq5-rust` binary, built once per test run (debug profile, the project's own target dir
/// and its committed lock file).
fn client_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = project_dir();
        let target = dir.join("target");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        eprintln!(
            "building the rocketmq 5.0.0 client project ({}; the first build takes several \
             minutes)…",
            dir.display()
        );
        let status = std::process::Command::new(cargo)
            .arg("build")
            .arg("--locked")
            .arg("--manifest-path")
            .arg(dir.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .status()
            .expect("run cargo build of the rocketmq client project");
        assert!(
            status.success(),
            "cargo build of {} failed ({status})",
            dir.display()
        );
        let bin = target.join("debug").join("rmq5-rust");
        assert!(bin.exists(), "{} was not built", bin.display());
        eprintln!("built {}", bin.display());
        bin
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The access URL of the given nodes, as the crate takes it (`host:port,host:port`).
fn endpoints_of(c: &Cluster, ids: &[u64]) -> String {
    ids.iter()
        .map(|id| c.nodes[id].addr.clone())
        .collect::<Vec<_>>()
        .join(",")
}

/// Every node's address.
fn all_endpoints(c: &Cluster) -> String {
    c.addrs().join(",")
}

/// Where run `n` of the client logs (its standard error).
fn client_log(c: &Cluster, name: &str) -> PathBuf {
    c.dir.path().join(format!("rmq5-rust-{name}.log"))
}

/// The tail of a client run's log and of every node's log, for failure messages.
fn diagnostics(c: &Cluster, log: &Path) -> String {
    let mut s = format!(
        "--- rmq5-rust log {} (tail) ---\n{}\n",
        log.display(),
        log_tail(log, 40)
    );
    for id in c.nodes.keys() {
        s += &format!(
            "--- node {id} log (tail) ---\n{}\n",
            log_tail(&c.log_path(*id), 15)
        );
    }
    s
}

/// A started run of the client binary and where its log goes.
struct Run {
    name: String,
    log: PathBuf,
    child: tokio::process::Child,
}

/// Starts `rmq5-rust <cmd> args…`; `name` names its log file.
fn spawn_client(c: &Cluster, name: &str, cmd: &str, args: &[(&str, String)]) -> Run {
    let bin = client_bin();
    let log = client_log(c, name);
    let err = std::fs::File::create(&log).unwrap();
    let child = tokio::process::Command::new(bin)
        .arg(cmd)
        .args(args.iter().flat_map(|(k, v)| [format!("--{k}"), v.clone()]))
        .current_dir(c.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    Run {
        name: name.to_string(),
        log,
        child,
    }
}

/// Waits at most `limit` for `run` (killing it past that) and returns the JSON object it printed;
/// panics with its output and the logs when it printed none or a `fatal` one.
async fn finish(c: &Cluster, run: Run, limit: Duration) -> Value {
    let Run { name, log, child } = run;
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(out) => out.unwrap_or_else(|e| panic!("wait for rmq5-rust {name}: {e}")),
        Err(_) => panic!(
            "rmq5-rust {name} still ran after {limit:?} (killed)\n{}",
            diagnostics(c, &log)
        ),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
    let Some(v) = last.and_then(|l| serde_json::from_str::<Value>(l).ok()) else {
        panic!(
            "rmq5-rust {name} ({}) printed no JSON line.\nstdout:\n{stdout}\n{}",
            out.status,
            diagnostics(c, &log)
        );
    };
    if v.get("fatal").is_some() {
        panic!("rmq5-rust {name} failed: {v}\n{}", diagnostics(c, &log));
    }
    v
}

/// Runs one scenario to its end (at most `limit`).
async fn run_client(
    c: &Cluster,
    name: &str,
    cmd: &str,
    args: &[(&str, String)],
    limit: Duration,
) -> Value {
    let run = spawn_client(c, name, cmd, args);
    finish(c, run, limit).await
}

fn s(v: impl ToString) -> String {
    v.to_string()
}

/// Broker flags of every cluster here. The harness's nameserver expires a node silent for 3 s,
/// while a node re-registers only on a change of role, term, leader or topics, or every
/// `register_interval_ms` (30 s by default): without this, a topic's route disappears from the
/// nameserver 3 s after the last change and every later QueryRoute is TOPIC_NOT_FOUND ("no broker
/// group hosts it"), which the crate's start and its sends cannot get past.
const BROKER_ARGS: &[&str] = &["--register-interval-ms", "1000"];

/// A cluster of three nodes with topic `topic` of `queues` queues.
async fn cluster_with_topic(topic: &str, queues: u32) -> Cluster {
    // Built before any cluster runs: the build takes both cores for minutes.
    client_bin();
    let c = Cluster::start(3, BROKER_ARGS).await;
    c.create_topic(topic, queues).await;
    c
}

/// `send` of `count` messages with tags cycled from `tags` and keys `keys`, through every node's
/// address; returns what was sent (in order) after checking every send succeeded and the receipt
/// carries the message's own id.
async fn send(c: &Cluster, name: &str, topic: &str, count: usize, tags: &str) -> Vec<Value> {
    let out = run_client(
        c,
        name,
        "send",
        &[
            ("endpoints", all_endpoints(c)),
            ("topic", s(topic)),
            ("count", s(count)),
            ("tag", s(tags)),
            ("keys", format!("{name}-key")),
            ("prefix", s(name)),
        ],
        Duration::from_secs(120),
    )
    .await;
    assert!(
        list(&out, "errors").is_empty(),
        "sends failed: {}\n{}",
        out["errors"],
        diagnostics(c, &client_log(c, name))
    );
    let sent = list(&out, "sent").clone();
    assert_eq!(sent.len(), count, "{out}");
    for m in &sent {
        assert_eq!(
            m["receipt_id"], m["id"],
            "the send receipt names another message id"
        );
    }
    let ids: BTreeSet<&str> = sent.iter().map(|m| str_of(m, "id")).collect();
    assert_eq!(ids.len(), count, "a message id was used twice: {out}");
    sent
}

/// Options of one `receive` run.
struct Receive<'a> {
    group: &'a str,
    expr: &'a str,
    max: usize,
    quiet_secs: u32,
    wait_secs: u32,
    ack: bool,
    invisible_secs: u32,
    endpoints: Option<String>,
}

impl<'a> Receive<'a> {
    fn new(group: &'a str, max: usize) -> Self {
        Receive {
            group,
            expr: "*",
            max,
            quiet_secs: 3,
            wait_secs: 60,
            ack: true,
            invisible_secs: 15,
            endpoints: None,
        }
    }
}

/// Runs `receive` as `r` describes; returns its result after checking that no receive or ack
/// failed and the crate did not panic.
async fn receive(c: &Cluster, name: &str, topic: &str, r: Receive<'_>) -> Value {
    let out = receive_raw(c, name, topic, r).await;
    assert!(
        list(&out, "errors").is_empty()
            && list(&out, "ack_errors").is_empty()
            && list(&out, "panics").is_empty(),
        "receive or ack failed: errors {} ack_errors {} panics {}\n{}",
        out["errors"],
        out["ack_errors"],
        out["panics"],
        diagnostics(c, &client_log(c, name))
    );
    out
}

/// [`receive`] without the checks.
async fn receive_raw(c: &Cluster, name: &str, topic: &str, r: Receive<'_>) -> Value {
    run_client(
        c,
        name,
        "receive",
        &[
            ("endpoints", r.endpoints.unwrap_or_else(|| all_endpoints(c))),
            ("topic", s(topic)),
            ("group", s(r.group)),
            ("expr", s(r.expr)),
            ("max", s(r.max)),
            ("quiet-secs", s(r.quiet_secs)),
            ("wait-secs", s(r.wait_secs)),
            ("ack", s(r.ack)),
            ("invisible-secs", s(r.invisible_secs)),
            ("poll-secs", s(3)),
        ],
        Duration::from_secs(r.wait_secs as u64 + 60),
    )
    .await
}

/// Asserts that `got` (a delivery) carries exactly what `sent` was sent with: id, topic, body
/// byte for byte, tag, keys, user properties.
fn assert_same_message(sent: &Value, got: &Value, topic: &str) {
    let id = str_of(sent, "id");
    assert_eq!(got["id"], sent["id"], "message id");
    assert_eq!(got["topic"], topic, "topic of {id}");
    assert_eq!(got["body_hex"], sent["body_hex"], "body bytes of {id}");
    assert_eq!(got["body"], sent["body"], "body text of {id}");
    assert_eq!(got["tag"], sent["tag"], "tag of {id}");
    assert_eq!(got["keys"], sent["keys"], "keys of {id}");
    assert_eq!(
        got["properties"], sent["properties"],
        "user properties of {id}"
    );
}

/// 85.1. Twenty messages sent by the crate's Producer (tags TagA/TagB, two keys each, three user
/// properties with non-ASCII values, non-ASCII bodies) are received by its SimpleConsumer
/// (group R1, filter `*`) exactly as sent: the id `send` returned, tag, keys, properties and body
/// byte for byte; each once, on delivery attempt 1; every ack succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t85_1_producer_to_simple_consumer_byte_for_byte() {
    let topic = "rmq5rs-basic";
    let c = cluster_with_topic(topic, 4).await;
    let sent = send(&c, "basic-send", topic, 20, "TagA,TagB").await;

    let out = receive(&c, "basic-receive", topic, Receive::new("R1", sent.len())).await;
    let got = by_id(list(&out, "received"));
    let sent_ids: BTreeSet<&str> = sent.iter().map(|m| str_of(m, "id")).collect();
    let got_ids: BTreeSet<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(
        got_ids, sent_ids,
        "received ids differ from sent ids: {out}"
    );
    for m in &sent {
        let d = &got[str_of(m, "id")];
        assert_eq!(d.len(), 1, "delivered {} times: {d:?}", d.len());
        assert_same_message(m, d[0], topic);
        assert_eq!(d[0]["attempt"], 1, "first delivery attempt: {}", d[0]);
    }
    assert_eq!(out["acked"], sent.len(), "{out}");
}

/// 85.2. A SimpleConsumer filtering `TagA||TagB` receives every TagA and TagB message and no
/// TagC one; another group filtering `TagC` receives exactly the TagC ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t85_2_tag_filter_selects_only_its_tags() {
    let topic = "rmq5rs-tags";
    let c = cluster_with_topic(topic, 4).await;
    let sent = send(&c, "tags-send", topic, 30, "TagA,TagB,TagC").await;
    let ids_with = |tags: &[&str]| -> BTreeSet<String> {
        sent.iter()
            .filter(|m| tags.contains(&str_of(m, "tag")))
            .map(|m| str_of(m, "id").to_string())
            .collect()
    };

    let ab = ids_with(&["TagA", "TagB"]);
    let r = Receive {
        expr: "TagA||TagB",
        ..Receive::new("R2", ab.len())
    };
    let out = receive(&c, "tags-receive-ab", topic, r).await;
    let got = by_id(list(&out, "received"));
    let got_ids: BTreeSet<String> = got.keys().cloned().collect();
    assert_eq!(got_ids, ab, "TagA||TagB received other messages: {out}");
    for m in sent.iter().filter(|m| ab.contains(str_of(m, "id"))) {
        let d = &got[str_of(m, "id")];
        assert_eq!(d.len(), 1, "delivered {} times: {d:?}", d.len());
        assert_same_message(m, d[0], topic);
    }

    let only_c = ids_with(&["TagC"]);
    let r = Receive {
        expr: "TagC",
        ..Receive::new("R2c", only_c.len())
    };
    let out = receive(&c, "tags-receive-c", topic, r).await;
    let got_ids: BTreeSet<String> = by_id(list(&out, "received")).keys().cloned().collect();
    assert_eq!(got_ids, only_c, "TagC received other messages: {out}");
}

/// 85.3. A message received without ack (`receive_with` asking for an invisible time of 3 s)
/// comes back after that time with delivery attempt 2 and the same id and content; acknowledged
/// then, it does not come again (watched for 8 s, past another invisible time).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t85_3_unacked_message_redelivered_with_attempt_2() {
    let topic = "rmq5rs-redeliver";
    let c = cluster_with_topic(topic, 1).await;
    let sent = send(&c, "redeliver-send", topic, 1, "TagA").await;
    let invisible_ms = 3_000;

    let first = receive(
        &c,
        "redeliver-first",
        topic,
        Receive {
            ack: false,
            quiet_secs: 0,
            invisible_secs: 3,
            ..Receive::new("R3", 1)
        },
    )
    .await;
    let first = list(&first, "received");
    assert_eq!(first.len(), 1, "first receive: {first:?}");
    assert_same_message(&sent[0], &first[0], topic);
    assert_eq!(first[0]["attempt"], 1, "{}", first[0]);

    let second = receive(
        &c,
        "redeliver-second",
        topic,
        Receive {
            quiet_secs: 0,
            invisible_secs: 3,
            wait_secs: 30,
            ..Receive::new("R3", 1)
        },
    )
    .await;
    let second = list(&second, "received");
    assert_eq!(second.len(), 1, "not redelivered within 30 s: {second:?}");
    assert_same_message(&sent[0], &second[0], topic);
    assert_eq!(second[0]["attempt"], 2, "redelivery attempt: {}", second[0]);
    let after = second[0]["at_ms"].as_u64().unwrap() - first[0]["at_ms"].as_u64().unwrap();
    assert!(
        after + 500 >= invisible_ms,
        "redelivered {after} ms after the first delivery, before its invisible time"
    );
    eprintln!("redelivered {after} ms after the first delivery (invisible time {invisible_ms} ms)");

    let later = receive(
        &c,
        "redeliver-after-ack",
        topic,
        Receive {
            wait_secs: 8,
            ..Receive::new("R3", 1)
        },
    )
    .await;
    assert!(
        list(&later, "received").is_empty(),
        "delivered again after the ack: {later}"
    );
}

/// 85.4. The leader is SIGKILLed in the middle of a send loop (one message every 20 ms, each
/// failed send tried once more as a new message): every send reported successful is received
/// exactly once afterwards by a SimpleConsumer (with the old leader still down), nothing is
/// received that was never sent, and sends succeed again after the failover. Failures are
/// counted and printed, with the longest time without a successful send around the kill.
///
/// The crate (5.0.0) never refreshes a route it has and does not retry a send: the route of its
/// start lists every queue once per node, the leader first, so after the kill the dead node's
/// entries keep failing (fast: connection refused) for the producer's whole life — about one
/// message in six fails even after its retry here. A consumer whose route still lists the dead
/// node (before the nameserver expires it) `unwrap()`s the failed connection to it inside the
/// crate (`Client::receive_message`): `rmq5-rust` catches and counts such panics, and the test
/// allows panics of that kind only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t85_4_leader_sigkill_during_send_loop_every_acked_send_received_once() {
    let topic = "rmq5rs-failover";
    let mut c = cluster_with_topic(topic, 4).await;
    let leader = c.leader().await;
    let survivor = *c.nodes.keys().find(|id| **id != leader).unwrap();
    let progress = c.dir.path().join("send-loop.progress");

    let run = spawn_client(
        &c,
        "failover-send-loop",
        "send-loop",
        &[
            ("endpoints", endpoints_of(&c, &[survivor])),
            ("topic", s(topic)),
            ("duration-secs", s(15)),
            ("pace-ms", s(20)),
            ("retries", s(1)),
            ("progress-file", progress.to_str().unwrap().to_string()),
        ],
    );
    wait_for_progress(&progress, 60, Duration::from_secs(60)).await;
    let killed_at = now_ms();
    c.kill(leader);
    let out = finish(&c, run, Duration::from_secs(90)).await;
    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);

    let sent = list(&out, "sent");
    let failed = list(&out, "failed");
    let at = |v: &Value| v["at_ms"].as_u64().unwrap();
    let ok_after = sent.iter().filter(|m| at(m) > killed_at).count();
    let failed_after = failed.iter().filter(|m| at(m) > killed_at).count();
    let failed_messages: BTreeSet<u64> = failed
        .iter()
        .map(|f| f["index"].as_u64().unwrap())
        .filter(|i| !sent.iter().any(|m| m["index"].as_u64() == Some(*i)))
        .collect();
    // The longest time without a successful send, between the last success before the kill
    // and the first one after it.
    let before = sent.iter().map(at).filter(|t| *t <= killed_at).max();
    let after = sent.iter().map(at).filter(|t| *t > killed_at).min();
    let gap = before.zip(after).map(|(b, a)| a - b);
    let first_ok_after = after.map(|a| a - killed_at);
    eprintln!(
        "send loop: {} messages, {} sends succeeded ({ok_after} after the kill), {} attempts \
         failed ({failed_after} after the kill), {} messages failed after their retry; no \
         successful send for {gap:?} ms around the kill (first success {first_ok_after:?} ms \
         after it)",
        out["messages"],
        sent.len(),
        failed.len(),
        failed_messages.len(),
    );
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for f in failed {
        let e = &f["error"];
        let why = match e.get("panic") {
            Some(p) => format!("panic: {p}"),
            None => format!("{} {} / {}", e["message"], e["context"], e["source"]),
        };
        *reasons.entry(why).or_default() += 1;
    }
    for (why, n) in &reasons {
        eprintln!("  {n} x {why}");
    }
    assert!(
        ok_after > 0,
        "no send succeeded after the leader was killed: {out}\n{}",
        diagnostics(&c, &client_log(&c, "failover-send-loop"))
    );

    let r = Receive {
        endpoints: Some(endpoints_of(&c, &[survivor])),
        quiet_secs: 5,
        wait_secs: 120,
        ..Receive::new("R4", sent.len())
    };
    let got = receive_raw(&c, "failover-receive", topic, r).await;
    let dead = c.nodes[&leader].addr.clone();
    for p in list(&got, "panics") {
        let text = str_of(p, "panic");
        assert!(
            text.contains("failed to connect to peer") && text.contains(&dead),
            "the crate panicked other than on connecting to the killed node {dead}: {p}"
        );
    }
    eprintln!(
        "receive after the kill: {} deliveries in {} receives ({} empty), {} receives panicked \
         inside the crate on connecting to the killed node",
        list(&got, "received").len(),
        got["receives"],
        got["empty_receives"],
        list(&got, "panics").len()
    );
    assert!(
        list(&got, "errors").is_empty() && list(&got, "ack_errors").is_empty(),
        "receive or ack failed: errors {} ack_errors {}\n{}",
        got["errors"],
        got["ack_errors"],
        diagnostics(&c, &client_log(&c, "failover-receive"))
    );
    let times = by_id(list(&got, "received"));
    for m in sent {
        let id = str_of(m, "id");
        let n = times.get(id).map_or(0, Vec::len);
        assert_eq!(
            n, 1,
            "successful send {} (id {id}) received {n} times",
            m["index"]
        );
        assert_eq!(times[id][0]["body_hex"], m["body_hex"], "body of {id}");
    }
    let known: BTreeSet<&str> = sent
        .iter()
        .chain(failed.iter())
        .map(|m| str_of(m, "id"))
        .collect();
    let mut stored_failed = 0;
    for (id, ds) in &times {
        assert!(known.contains(id.as_str()), "received id {id} never sent");
        assert_eq!(ds.len(), 1, "{id} received {} times", ds.len());
        if !sent.iter().any(|m| m["id"] == id.as_str()) {
            stored_failed += 1;
        }
    }
    eprintln!("{stored_failed} of the failed send attempts were stored anyway (allowed)");
}

/// 85.5. Transactional messages with the Rust crate's transaction producer: six half messages on
/// a TRANSACTION topic, the even ones committed and the odd ones rolled back by the producer;
/// a SimpleConsumer receives exactly the committed ones, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t85_5_transactions_committed_arrive_rolled_back_do_not() {
    let topic = "rmq5rs-txn";
    client_bin();
    let c = Cluster::start(3, BROKER_ARGS).await;
    let leader = c.leader().await;
    let r = c
        .client(leader)
        .await
        .create_topic(raftmq_proto::v1::CreateTopicRequest {
            name: topic.into(),
            queues: 2,
            update: false,
            message_type: raftmq_proto::v1::TopicMessageType::Transaction as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none(), "{:?}", r.error);
    let out = run_client(
        &c,
        "txn",
        "txn",
        &[
            ("endpoints", all_endpoints(&c)),
            ("topic", s(topic)),
            ("count", s(6)),
        ],
        Duration::from_secs(120),
    )
    .await;
    assert!(list(&out, "errors").is_empty(), "{out}");
    let sent = list(&out, "sent");
    assert_eq!(sent.len(), 6, "{out}");
    for t in sent {
        assert!(
            str_of(t, "transaction_id").starts_with("broker-a-"),
            "the transaction id is the half message's raftmq id: {t}"
        );
    }
    let committed: BTreeSet<&str> = sent
        .iter()
        .filter(|t| t["action"] == "commit")
        .map(|t| str_of(t, "id"))
        .collect();
    let got = receive(
        &c,
        "txn-receive",
        topic,
        Receive::new("TX1", committed.len()),
    )
    .await;
    let received = by_id(list(&got, "received"));
    let ids: BTreeSet<&str> = received.keys().map(String::as_str).collect();
    assert_eq!(ids, committed, "exactly the committed ones: {got}");
    assert!(received.values().all(|d| d.len() == 1), "each once: {got}");
}
