//! The official RocketMQ 5 Python client (`rocketmq-python-client` 5.1.2, unmodified) against a
//! real three-node raftmq broker group through `apache.rocketmq.v2.MessagingService`.
//!
//! Each test starts its own cluster, runs one scenario script of `tests/python/rocketmq5/` with
//! the python of `scripts/python-env` (a venv in `target/py-venv`), and asserts on the JSON object
//! the script prints as its last line of standard output. The client's own log is kept in the
//! cluster's directory (`py-home/logs/rocketmq_python/`), and its tail is shown when a script
//! fails. Every script bounds its loops; every run here has a time limit on top.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use raftmq_cli::local_cluster::log_tail;
use raftmq_proto::v1::*;
use raftmq_tests::rocketmq5::{by_id, list, str_of, wait_for_progress};
use raftmq_tests::*;
use serde_json::Value;

fn script_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python/rocketmq5")
        .join(name)
}

/// Every node's client address, as the Python client takes them (`host:port;host:port`).
fn all_endpoints(c: &Cluster) -> String {
    c.addrs().join(";")
}

/// The access point the scenarios give the client: one running node that is not the leader (so
/// every write is forwarded, and a killed leader is not the client's way in). One address, not
/// all: see t89 for what several do.
async fn access_point(c: &Cluster) -> String {
    let leader = c.leader().await;
    let id = c
        .nodes
        .keys()
        .copied()
        .find(|id| *id != leader && c.is_up(*id))
        .expect("a running follower");
    c.nodes[&id].addr.clone()
}

/// The directory the scripts get as HOME (the client logs under it).
fn py_home(c: &Cluster) -> PathBuf {
    c.dir.path().join("py-home")
}

/// The tail of the Python client's log and of every node's log, for failure messages.
fn diagnostics(c: &Cluster) -> String {
    let mut s = format!(
        "--- python client log (tail) ---\n{}\n",
        log_tail(
            &py_home(c).join("logs/rocketmq_python/rocketmq_client.log"),
            40
        )
    );
    for id in c.nodes.keys() {
        s += &format!(
            "--- node {id} log (tail) ---\n{}\n",
            log_tail(&c.log_path(*id), 15)
        );
    }
    s
}

/// Starts `script` with `--endpoints endpoints` and `args`.
fn spawn_script(
    c: &Cluster,
    script: &str,
    endpoints: &str,
    args: &[String],
) -> tokio::process::Child {
    let home = py_home(c);
    std::fs::create_dir_all(&home).unwrap();
    tokio::process::Command::new(python())
        .arg(script_path(script))
        .arg("--endpoints")
        .arg(endpoints)
        .args(args)
        .env("HOME", &home)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {script}: {e}"))
}

/// Waits at most `limit` for a script started by [`spawn_script`] (killing it past that) and
/// returns the JSON object of its last line; panics with its output and the logs otherwise.
async fn finish_script(
    c: &Cluster,
    script: &str,
    child: tokio::process::Child,
    limit: Duration,
) -> Value {
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(out) => out.unwrap_or_else(|e| panic!("wait for {script}: {e}")),
        Err(_) => panic!(
            "{script} still ran after {limit:?} (killed)\n{}",
            diagnostics(c)
        ),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
    let Some(v) = last.and_then(|l| serde_json::from_str::<Value>(l).ok()) else {
        panic!(
            "{script} ({}) printed no JSON line.\nstdout:\n{stdout}\nstderr (tail):\n{}\n{}",
            out.status,
            tail(&stderr, 30),
            diagnostics(c)
        );
    };
    if let Some(fatal) = v.get("fatal") {
        panic!(
            "{script} failed: {fatal}\n{}\nstderr (tail):\n{}\n{}",
            v["traceback"].as_str().unwrap_or(""),
            tail(&stderr, 30),
            diagnostics(c)
        );
    }
    v
}

/// Runs `script` at the [`access_point`] to its end (at most `limit`); returns its JSON result.
async fn run_script(c: &Cluster, script: &str, args: &[String], limit: Duration) -> Value {
    let endpoints = access_point(c).await;
    let child = spawn_script(c, script, &endpoints, args);
    finish_script(c, script, child, limit).await
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `["--k", "v", ...]` from pairs.
fn args(pairs: &[(&str, &str)]) -> Vec<String> {
    pairs
        .iter()
        .flat_map(|(k, v)| [format!("--{k}"), v.to_string()])
        .collect()
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex {hex}");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The error text of a case that must have raised, or a panic saying it did not.
fn raised<'a>(case: &'a Value, what: &str) -> &'a Value {
    assert_eq!(
        case["raised"],
        Value::Bool(true),
        "{what}: the client call succeeded, an error was expected: {case}"
    );
    &case["error"]
}

/// How often the nodes register with the nameserver here: well within the test nameserver's
/// 3 s expiry (the node's default, 30 s, would let the topic vanish from routes after 3 s
/// without a topic or role change, and the v2 front answers QueryRoute from the nameserver).
const REGISTER_EVERY: [&str; 2] = ["--register-interval-ms", "500"];

/// A cluster of three nodes with topic `topic` of `queues` queues.
async fn cluster_with_topic(topic: &str, queues: u32, extra: &[&str]) -> Cluster {
    let args: Vec<&str> = REGISTER_EVERY.iter().chain(extra).copied().collect();
    let c = Cluster::start(3, &args).await;
    c.create_topic(topic, queues).await;
    c
}

/// Runs send.py: `count` messages with tags cycled from `tags`; returns what was sent (in order)
/// after checking every send succeeded.
async fn send(c: &Cluster, topic: &str, prefix: &str, count: usize, tags: &str) -> Vec<Value> {
    let n = count.to_string();
    let out = run_script(
        c,
        "send.py",
        &args(&[
            ("topic", topic),
            ("count", &n),
            ("prefix", prefix),
            ("tags", tags),
            ("max-seconds", "60"),
        ]),
        Duration::from_secs(120),
    )
    .await;
    assert!(
        list(&out, "errors").is_empty(),
        "sends failed: {}\n{}",
        out["errors"],
        diagnostics(c)
    );
    let sent = list(&out, "sent").clone();
    assert_eq!(sent.len(), count, "{out}");
    let ids: BTreeSet<&str> = sent.iter().map(|s| str_of(s, "id")).collect();
    assert_eq!(ids.len(), count, "send returned a message id twice: {out}");
    sent
}

/// Runs simple_consume.py as `group` with `filter` until `expect` distinct messages came, then
/// `quiet` seconds more; returns its result after checking no receive or ack failed.
async fn simple_consume(
    c: &Cluster,
    topic: &str,
    group: &str,
    filter: &str,
    expect: usize,
    quiet: u32,
) -> Value {
    simple_consume_tolerating(c, topic, group, filter, expect, quiet, None).await
}

/// As [`simple_consume`], except that receive errors naming `dead` (the address of a node killed
/// on purpose, which routes may still list) are allowed.
async fn simple_consume_tolerating(
    c: &Cluster,
    topic: &str,
    group: &str,
    filter: &str,
    expect: usize,
    quiet: u32,
    dead: Option<&str>,
) -> Value {
    let out = run_script(
        c,
        "simple_consume.py",
        &args(&[
            ("topic", topic),
            ("group", group),
            ("filter", filter),
            ("expect", &expect.to_string()),
            ("quiet-seconds", &quiet.to_string()),
            ("max-seconds", "90"),
        ]),
        Duration::from_secs(150),
    )
    .await;
    let unexpected: Vec<&Value> = list(&out, "errors")
        .iter()
        .filter(|e| dead.is_none_or(|d| !str_of(e, "text").contains(d)))
        .collect();
    assert!(
        unexpected.is_empty()
            && list(&out, "ack_errors").is_empty()
            && (dead.is_some() || out["errors_dropped"] == 0),
        "receive or ack failed ({} deliveries, expect reached: {}, errors not kept: {}): \
         errors {unexpected:?} ack_errors {}\n{}",
        list(&out, "received").len(),
        out["expect_reached"],
        out["errors_dropped"],
        out["ack_errors"],
        diagnostics(c)
    );
    out
}

/// Asserts that `got` (a received message) carries exactly what `sent` was sent with.
fn assert_same_message(sent: &Value, got: &Value) {
    let id = str_of(sent, "id");
    assert_eq!(got["id"], sent["id"], "message id");
    assert_eq!(
        hex_bytes(str_of(got, "body_hex")),
        hex_bytes(str_of(sent, "body_hex")),
        "body of {id}"
    );
    assert_eq!(got["tag"], sent["tag"], "tag of {id}");
    assert_eq!(got["keys"], sent["keys"], "keys of {id}");
    assert_eq!(got["props"], sent["props"], "user properties of {id}");
    assert_eq!(
        got["corrupted"],
        Value::Bool(false),
        "{id} failed its body digest"
    );
    assert_eq!(got["message_type"], 1, "{id} is not a NORMAL message");
    assert_eq!(
        got["has_receipt_handle"],
        Value::Bool(true),
        "{id} has no receipt handle"
    );
}

/// 81. Messages sent by the official Producer with a tag, two keys and three user properties are
/// received by a SimpleConsumer (group G1, filter `*`) exactly as sent: body byte for byte (not
/// UTF-8, with zero bytes), tag, keys, properties (non-ASCII values too), the message id `send`
/// returned; each once, on delivery attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t81_producer_to_simple_consumer_byte_for_byte() {
    let topic = "rmq5-basic";
    let c = cluster_with_topic(topic, 4, &[]).await;
    let sent = send(&c, topic, "basic", 20, "TagA,TagB,TagC").await;

    let out = simple_consume(&c, topic, "G1", "*", sent.len(), 3).await;
    let got = by_id(list(&out, "received"));
    let sent_ids: BTreeSet<&str> = sent.iter().map(|s| str_of(s, "id")).collect();
    let got_ids: BTreeSet<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(
        got_ids, sent_ids,
        "received ids differ from sent ids: {out}"
    );
    for s in &sent {
        let d = &got[str_of(s, "id")];
        assert_eq!(d.len(), 1, "delivered {} times: {d:?}", d.len());
        assert_same_message(s, d[0]);
        assert_eq!(d[0]["attempt"], 1, "first delivery attempt: {}", d[0]);
        assert_eq!(d[0]["topic"], topic);
    }
    assert_eq!(out["acked"], sent.len());
}

/// 82. A SimpleConsumer with FilterExpression("TagA||TagB") receives every TagA and TagB message
/// and no TagC one; another group filtering "TagC" receives exactly the TagC ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t82_tag_filter_selects_only_its_tags() {
    let topic = "rmq5-tags";
    let c = cluster_with_topic(topic, 4, &[]).await;
    let sent = send(&c, topic, "tags", 30, "TagA,TagB,TagC").await;
    let ids_with = |tags: &[&str]| -> BTreeSet<String> {
        sent.iter()
            .filter(|s| tags.contains(&str_of(s, "tag")))
            .map(|s| str_of(s, "id").to_string())
            .collect()
    };

    let ab = ids_with(&["TagA", "TagB"]);
    let out = simple_consume(&c, topic, "G2", "TagA||TagB", ab.len(), 4).await;
    let got = by_id(list(&out, "received"));
    let got_ids: BTreeSet<String> = got.keys().cloned().collect();
    assert_eq!(
        got_ids, ab,
        "TagA||TagB received other messages than sent: {out}"
    );
    for d in got.values().flatten() {
        assert!(
            d["tag"] == "TagA" || d["tag"] == "TagB",
            "a {} message passed the filter TagA||TagB: {d}",
            d["tag"]
        );
    }
    for s in sent.iter().filter(|s| ab.contains(str_of(s, "id"))) {
        assert_same_message(s, got[str_of(s, "id")][0]);
    }

    let only_c = ids_with(&["TagC"]);
    let out = simple_consume(&c, topic, "G2c", "TagC", only_c.len(), 3).await;
    let got_ids: BTreeSet<String> = by_id(list(&out, "received")).keys().cloned().collect();
    assert_eq!(
        got_ids, only_c,
        "TagC received other messages than sent: {out}"
    );
}

/// 83. A message received and not acknowledged comes back after its invisible duration (3 s),
/// with delivery attempt 2 and the same id and body; acknowledged then, it does not come again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t83_unacked_message_redelivered_with_attempt_2() {
    let topic = "rmq5-redeliver";
    let c = cluster_with_topic(topic, 1, &[]).await;
    let sent = send(&c, topic, "redeliver", 1, "TagA").await;
    let invisible = 3.0;

    let out = run_script(
        &c,
        "redeliver.py",
        &args(&[
            ("topic", topic),
            ("group", "G3"),
            ("invisible", "3"),
            ("quiet-seconds", "6"),
            ("max-seconds", "60"),
        ]),
        Duration::from_secs(120),
    )
    .await;
    let (first, second) = (&out["first"], &out["second"]);
    assert!(
        first.is_object(),
        "nothing received: {out}\n{}",
        diagnostics(&c)
    );
    assert_same_message(&sent[0], first);
    assert_eq!(first["attempt"], 1, "{out}");
    assert!(second.is_object(), "not redelivered within 60 s: {out}");
    assert_same_message(&sent[0], second);
    assert_eq!(second["attempt"], 2, "redelivery attempt: {out}");
    let after = second["since_first"].as_f64().unwrap();
    assert!(
        after >= invisible - 0.5,
        "redelivered {after} s after the first delivery, before its invisible time {invisible} s"
    );
    assert!(out["ack_error"].is_null(), "ack failed: {out}");
    let deliveries = list(&out, "deliveries");
    assert_eq!(
        deliveries.len(),
        2,
        "delivered again after the ack (or another message came): {out}"
    );
}

/// 84. change_invisible_duration extends a received message's invisibility (nothing comes past
/// the first deadline) and gives a new receipt handle; the ack with that new handle succeeds and
/// the message is not delivered again, watched past every deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t84_change_invisible_then_ack_with_new_handle_not_redelivered() {
    let topic = "rmq5-change";
    let c = cluster_with_topic(topic, 1, &[]).await;
    let sent = send(&c, topic, "change", 1, "TagA").await;
    let (extend, margin) = (8.0, 4.0);

    let out = run_script(
        &c,
        "change_invisible.py",
        &args(&[
            ("topic", topic),
            ("group", "G4"),
            ("invisible", "2"),
            ("extend", "8"),
            ("hold", "5"),
            ("margin", "4"),
            ("max-seconds", "60"),
        ]),
        Duration::from_secs(120),
    )
    .await;
    assert!(
        out["message"].is_object(),
        "nothing received: {out}\n{}",
        diagnostics(&c)
    );
    assert_same_message(&sent[0], &out["message"]);
    assert!(
        out["change_error"].is_null(),
        "change_invisible_duration failed: {out}"
    );
    assert_eq!(
        out["handle_changed"],
        Value::Bool(true),
        "no new receipt handle: {out}"
    );
    assert!(
        list(&out, "before_ack").is_empty(),
        "delivered again while its changed invisible time held: {out}"
    );
    assert!(
        out["ack_error"].is_null(),
        "ack with the new handle failed: {out}"
    );
    assert!(
        list(&out, "after_ack").is_empty(),
        "delivered again after the ack: {out}"
    );
    let watched = out["watched_until_s"].as_f64().unwrap();
    assert!(
        watched >= extend + margin - 1.0,
        "watched only {watched} s after the change: {out}"
    );
    assert!(list(&out, "errors").is_empty(), "{out}");
}

/// Creates consumer group `name` with `max_attempts` on the leader (v1 CreateGroup).
async fn create_group(c: &Cluster, name: &str, max_attempts: u32) {
    create_group_with(
        c,
        GroupConfig {
            name: name.into(),
            max_attempts,
            ..Default::default()
        },
    )
    .await
}

/// Creates the consumer group `cfg` on the leader (v1 CreateGroup).
async fn create_group_with(c: &Cluster, cfg: GroupConfig) {
    let name = cfg.name.clone();
    let leader = c.leader().await;
    let r = c
        .client(leader)
        .await
        .create_group(CreateGroupRequest {
            group: Some(cfg),
            update: false,
        })
        .await
        .unwrap_or_else(|s| panic!("CreateGroup {name}: {s}"))
        .into_inner();
    assert_eq!(
        code(&r.error),
        ErrorCode::Ok,
        "CreateGroup {name}: {:?}",
        r.error
    );
}

/// Every message of topic `topic` on node `id`, over all its queues: (queue, offset, body).
async fn read_topic(c: &Cluster, id: u64, topic: &str) -> Option<Vec<(u32, u64, Vec<u8>)>> {
    let st = c.status(id).await?;
    let queues: Vec<u32> = st
        .queues
        .iter()
        .filter(|q| q.topic == topic)
        .map(|q| q.queue)
        .collect();
    let mut out = Vec::new();
    for q in queues {
        for (off, body) in read_queue(&c.nodes[&id].addr, topic, q).await.ok()? {
            out.push((q, off, body));
        }
    }
    Some(out)
}

/// 85. In a group created with max attempts 2, a message received twice without ack is moved to
/// `%DLQ%<group>`: it is there exactly once (same body), and the group never gets it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t85_max_attempts_moves_message_to_dead_letter_topic_once() {
    let topic = "rmq5-dlq";
    let group = "G5";
    let dlq = format!("%DLQ%{group}");
    let c = cluster_with_topic(topic, 1, &[]).await;
    create_group(&c, group, 2).await;
    let sent = send(&c, topic, "dlq", 1, "TagA").await;
    let body = hex_bytes(str_of(&sent[0], "body_hex"));

    let mut a = args(&[
        ("topic", topic),
        ("group", group),
        ("invisible", "2"),
        ("take", "2"),
        ("quiet-seconds", "8"),
        ("max-seconds", "60"),
    ]);
    a.push("--no-ack-last".into());
    let out = run_script(&c, "redeliver.py", &a, Duration::from_secs(120)).await;
    let deliveries = list(&out, "deliveries");
    let attempts: Vec<&Value> = deliveries.iter().map(|d| &d["attempt"]).collect();
    assert_eq!(
        attempts,
        [&Value::from(1), &Value::from(2)],
        "expected deliveries with attempts 1 and 2, then none: {out}"
    );
    for d in deliveries {
        assert_same_message(&sent[0], d);
    }

    let leader = c.leader().await;
    let in_dlq = wait_for(
        &format!("the message in {dlq} on node {leader}"),
        Duration::from_secs(30),
        || async {
            let msgs = read_topic(&c, leader, &dlq).await?;
            (!msgs.is_empty()).then_some(msgs)
        },
    )
    .await;
    // The group gets nothing more, and the dead-letter topic still holds it once.
    let later = simple_consume(&c, topic, group, "*", 0, 6).await;
    assert!(
        list(&later, "received").is_empty(),
        "delivered to {group} again after it went to {dlq}: {later}"
    );
    let in_dlq_after = read_topic(&c, leader, &dlq).await.unwrap();
    for msgs in [&in_dlq, &in_dlq_after] {
        assert_eq!(
            msgs.len(),
            1,
            "{dlq} holds {} messages: {msgs:?}",
            msgs.len()
        );
        assert_eq!(msgs[0].2, body, "{dlq} holds another body");
    }
}

/// 86. A PushConsumer whose MessageListener returns SUCCESS consumes every message sent, each
/// once with attempt 1, exactly as sent; the two messages its listener fails once come back with
/// attempt 2 and are then consumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t86_push_consumer_consumes_everything_and_retries_a_failure() {
    let topic = "rmq5-push";
    let c = cluster_with_topic(topic, 4, &[]).await;
    let sent = send(&c, topic, "push", 20, "TagA,TagB").await;
    let fail_idx = ["3", "7"];

    let out = run_script(
        &c,
        "push_consume.py",
        &args(&[
            ("topic", topic),
            ("group", "G6"),
            ("expect", &sent.len().to_string()),
            ("fail-idx", &fail_idx.join(",")),
            ("quiet-seconds", "4"),
            ("max-seconds", "90"),
        ]),
        Duration::from_secs(150),
    )
    .await;
    assert!(
        out["startup_error"].is_null(),
        "PushConsumer did not start: {out}\n{}",
        diagnostics(&c)
    );
    assert_eq!(
        out["expect_reached"],
        Value::Bool(true),
        "not everything consumed within 90 s: {out}\n{}",
        diagnostics(&c)
    );
    let calls = by_id(list(&out, "calls"));
    for s in &sent {
        let id = str_of(s, "id");
        let calls = calls
            .get(id)
            .unwrap_or_else(|| panic!("{id} never reached the listener: {out}"));
        for call in calls {
            assert_same_message(s, call);
        }
        let seen: Vec<(&Value, &Value)> = calls
            .iter()
            .map(|c| (&c["attempt"], &c["result"]))
            .collect();
        let idx = s["props"]["idx"].as_str().unwrap();
        let want: Vec<(Value, Value)> = if fail_idx.contains(&idx) {
            vec![(1.into(), "FAILURE".into()), (2.into(), "SUCCESS".into())]
        } else {
            vec![(1.into(), "SUCCESS".into())]
        };
        let want: Vec<(&Value, &Value)> = want.iter().map(|(a, r)| (a, r)).collect();
        assert_eq!(seen, want, "listener calls of message idx {idx} ({id})");
    }
    assert_eq!(
        calls.len(),
        sent.len(),
        "the listener got messages never sent: {out}"
    );
}

/// 87. The leader is SIGKILLed in the middle of a Python producer's send loop: every send that
/// returned success is received exactly once afterwards (failed sends are allowed, counted and
/// printed), and sends succeed again after the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t87_leader_sigkill_during_send_loop_every_acked_send_received_once() {
    let topic = "rmq5-failover";
    let mut c = cluster_with_topic(topic, 4, &[]).await;
    let leader = c.leader().await;
    let progress = c.dir.path().join("send-loop.progress");
    let marker = c.dir.path().join("send-loop.killed");

    let access = access_point(&c).await;
    let child = spawn_script(
        &c,
        "send_loop.py",
        &access,
        &args(&[
            ("topic", topic),
            ("count", "400"),
            ("pace-ms", "20"),
            ("after-kill-ok", "30"),
            ("progress-file", progress.to_str().unwrap()),
            ("kill-marker", marker.to_str().unwrap()),
            ("max-seconds", "120"),
        ]),
    );
    wait_for_progress(&progress, 60, Duration::from_secs(90)).await;
    c.kill(leader);
    std::fs::write(&marker, b"killed").unwrap();
    let out = finish_script(&c, "send_loop.py", child, Duration::from_secs(180)).await;

    let sent = list(&out, "sent");
    let failed = list(&out, "failed");
    let ok_after = sent.iter().filter(|s| s["after_kill"] == true).count();
    let failed_after = failed.iter().filter(|s| s["after_kill"] == true).count();
    eprintln!(
        "send loop: {} sends succeeded ({ok_after} after the kill), {} failed ({failed_after} after \
         the kill)",
        sent.len(),
        failed.len()
    );
    for f in failed {
        eprintln!("  failed send {}: {}", f["index"], f["error"]);
    }
    assert!(
        ok_after > 0,
        "no send succeeded after the leader was killed: {out}\n{}",
        diagnostics(&c)
    );

    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);
    // Routes may list the killed node until the nameserver expires it: a receive from one of its
    // queues fails to connect, which is allowed here (and counted).
    let dead = c.nodes[&leader].addr.clone();
    let out2 = simple_consume_tolerating(&c, topic, "G7", "*", sent.len(), 5, Some(&dead)).await;
    eprintln!(
        "consume after the failover: {} receives failed on the killed node {dead}",
        list(&out2, "errors").len()
    );
    let mut times: BTreeMap<Vec<u8>, usize> = BTreeMap::new();
    for d in list(&out2, "received") {
        *times.entry(hex_bytes(str_of(d, "body_hex"))).or_default() += 1;
    }
    let failed_bodies: BTreeSet<Vec<u8>> = failed
        .iter()
        .map(|f| hex_bytes(str_of(f, "body_hex")))
        .collect();
    for s in sent {
        let body = hex_bytes(str_of(s, "body_hex"));
        let n = times.get(&body).copied().unwrap_or(0);
        assert_eq!(
            n, 1,
            "acknowledged send {} (id {}) received {n} times",
            s["index"], s["id"]
        );
    }
    let sent_bodies: BTreeSet<Vec<u8>> = sent
        .iter()
        .map(|s| hex_bytes(str_of(s, "body_hex")))
        .collect();
    for (body, n) in &times {
        assert!(
            sent_bodies.contains(body) || failed_bodies.contains(body),
            "received a body never sent: {}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(
            *n,
            1,
            "body {} received {n} times",
            String::from_utf8_lossy(body)
        );
    }
    let stored_failed = failed_bodies
        .iter()
        .filter(|b| times.contains_key(*b))
        .count();
    eprintln!("{stored_failed} of the failed sends were stored anyway (allowed)");
}

/// 88. Bad input gets a clear error each, and the node serves on: an unknown topic
/// (TOPIC_NOT_FOUND, 40402, in the route's status), an empty body, a body over the node's limit
/// (64 KiB here), a FIFO message (message_group set) on a NORMAL topic, a second ack with the
/// same receipt handle (INVALID_RECEIPT_HANDLE, 40013), a SQL92 filter (an error naming SQL).
/// Afterwards a message is sent and received as usual and no node has died.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t88_bad_input_gets_clear_errors_and_the_node_serves_on() {
    let topic = "rmq5-bad";
    let limit = 64 * 1024;
    let conf_dir = tempfile::tempdir().unwrap();
    let conf = conf_dir.path().join("broker-node.toml");
    std::fs::write(&conf, format!("[limits]\nbody_bytes_max = {limit}\n")).unwrap();
    let mut c = cluster_with_topic(topic, 2, &["--config", conf.to_str().unwrap()]).await;
    let leader = c.leader().await;

    let out = run_script(
        &c,
        "bad_input.py",
        &args(&[
            ("topic", topic),
            ("group", "G8"),
            ("body-limit", &limit.to_string()),
            ("max-seconds", "120"),
        ]),
        Duration::from_secs(180),
    )
    .await;
    let cases = &out["cases"];
    eprintln!("bad input, what each case met: {cases:#}");
    let text = |e: &Value| e["text"].as_str().unwrap_or("").to_lowercase();

    // Unknown topic: the send fails naming the topic, and the route says TOPIC_NOT_FOUND.
    let e = raised(&cases["unknown_topic"], "send to an unknown topic");
    assert!(text(e).contains("no-such-topic-rmq5"), "{e}");
    let route = &cases["raw_unknown_topic_route"];
    assert_eq!(
        route["status"]["code"], 40402,
        "QueryRoute of an unknown topic: {route}"
    );

    // Empty body: the client refuses it; the server, sent one anyway, too.
    let e = raised(&cases["empty_body"], "an empty body");
    assert!(text(e).contains("body"), "{e}");
    let raw = &cases["raw_empty_body"];
    let code = raw["status"]["code"].as_i64().unwrap_or(0);
    assert!(
        code == 41302 || code == 40000,
        "SendMessage with an empty body: want MESSAGE_BODY_EMPTY (41302) or BAD_REQUEST: {raw}"
    );

    // A body one byte over the node's limit: refused by the client (which learnt the limit from
    // the server's settings) or by the server (MESSAGE_BODY_TOO_LARGE).
    let e = raised(&cases["body_too_large"], "a body over the limit");
    assert!(
        e["code"] == 41301 || text(e).contains(&format!("max size={limit}")),
        "a body over the node's limit of {limit}: {e}"
    );
    let raw = &cases["raw_body_too_large"];
    let code = raw["status"]["code"].as_i64().unwrap_or(0);
    assert!(
        code == 41301 || code == 41300,
        "SendMessage with a body over the limit: want MESSAGE_BODY_TOO_LARGE (41301): {raw}"
    );

    // A FIFO message on a NORMAL topic.
    let e = raised(
        &cases["fifo_on_normal_topic"],
        "a FIFO message on a NORMAL topic",
    );
    assert!(
        text(e).contains("type") || text(e).contains("fifo"),
        "the error does not say what is wrong with the message type: {e}"
    );
    let raw = &cases["raw_fifo_on_normal_topic"];
    let code = raw["status"]["code"].as_i64().unwrap_or(0);
    assert!(
        code == 40014 || code == 40000,
        "SendMessage of a FIFO message to a NORMAL topic: want \
         MESSAGE_PROPERTY_CONFLICT_WITH_TYPE (40014) or BAD_REQUEST: {raw}"
    );

    // Stale receipt handle.
    let stale = &cases["stale_receipt_handle"];
    assert_eq!(stale["received"], Value::Bool(true), "{stale}");
    assert_eq!(
        stale["first_ack"]["raised"],
        Value::Bool(false),
        "first ack: {stale}"
    );
    let e = raised(&stale["second_ack"], "the second ack with the same handle");
    assert_eq!(e["code"], 40013, "want INVALID_RECEIPT_HANDLE: {e}");

    // SQL92 filter.
    let e = raised(&cases["sql92_filter"], "a receive with a SQL92 filter");
    assert!(text(e).contains("sql"), "the error does not name SQL: {e}");

    // The node serves on.
    let after = &out["after_ok"];
    assert_eq!(
        after["send"]["raised"],
        Value::Bool(false),
        "send after the bad input: {after}"
    );
    assert_eq!(
        after["received"]["id"], after["send"]["value"],
        "receive after the bad input: {after}"
    );
    c.check_children()
        .unwrap_or_else(|e| panic!("a process died: {e:#}"));
    assert_eq!(
        c.leader().await,
        leader,
        "the leader changed during the bad input"
    );
}

/// 89. The client configured with every node's address (`h1:p1;h2:p2;h3:p3`, as the Python client
/// documents it) sends and receives like with one: grpcio dials such a list as one channel
/// `ipv4:h1:p1,h2:p2,h3:p3`, and the node must answer it.
///
/// Ignored for now: grpcio sends `h1:p1,h2:p2,h3:p3` as the HTTP/2 `:authority`, which the
/// node's HTTP/2 layer (hyper/h2) refuses as malformed and resets with RST_STREAM PROTOCOL_ERROR
/// before any handler runs, so every call of such a client fails (the routes avoid this by listing
/// one address per endpoints; the access point cannot). Run it with `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "grpcio's multi-address :authority is reset by the node's HTTP/2 layer"]
async fn t89_client_configured_with_every_node_address_works() {
    let topic = "rmq5-multi";
    let c = cluster_with_topic(topic, 2, &[]).await;
    let all = all_endpoints(&c);
    let out = finish_script(
        &c,
        "send.py",
        spawn_script(
            &c,
            "send.py",
            &all,
            &args(&[("topic", topic), ("count", "3"), ("max-seconds", "30")]),
        ),
        Duration::from_secs(60),
    )
    .await;
    assert!(
        list(&out, "errors").is_empty(),
        "sends with the access point {all:?} failed: {}\n{}",
        out["errors"],
        diagnostics(&c)
    );
    let sent = list(&out, "sent");
    let got = finish_script(
        &c,
        "simple_consume.py",
        spawn_script(
            &c,
            "simple_consume.py",
            &all,
            &args(&[
                ("topic", topic),
                ("group", "G9"),
                ("expect", &sent.len().to_string()),
                ("quiet-seconds", "2"),
                ("max-seconds", "30"),
            ]),
        ),
        Duration::from_secs(60),
    )
    .await;
    let ids: BTreeSet<&str> = list(&got, "received")
        .iter()
        .map(|d| str_of(d, "id"))
        .collect();
    let want: BTreeSet<&str> = sent.iter().map(|s| str_of(s, "id")).collect();
    assert_eq!(ids, want, "received with the access point {all:?}: {got}");
}

/// 80. Delay messages through the official Producer (`delivery_timestamp`, whole seconds): each
/// is acknowledged at once with a recall handle, reaches the SimpleConsumer not before its time
/// and once, as a DELAY message carrying its delivery time; two recalled by their handles never
/// arrive, and recalling one again fails. A delivery time on a NORMAL topic and one beyond the
/// 40-day horizon are refused with their RocketMQ codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t80_delay_messages_arrive_not_before_their_time_and_recall_works() {
    let c = cluster_with_topic("rmq5-normal", 2, &[]).await;
    create_typed_topic(&c, "rmq5-delay", TopicMessageType::Delay).await;
    let out = run_script(
        &c,
        "delay.py",
        &args(&[
            ("topic", "rmq5-delay"),
            ("normal-topic", "rmq5-normal"),
            ("count", "6"),
            ("recall", "2"),
            ("delay-seconds", "4"),
            ("max-seconds", "60"),
        ]),
        Duration::from_secs(120),
    )
    .await;
    assert!(
        list(&out, "errors").is_empty(),
        "errors: {}\n{}",
        out["errors"],
        diagnostics(&c)
    );
    let sent = list(&out, "sent");
    assert_eq!(sent.len(), 6, "{out}");
    for s in sent {
        assert!(
            str_of(s, "recall_handle").starts_with("broker-a-"),
            "a scheduled send returns a recall handle: {s}"
        );
    }
    let recalled: BTreeSet<&str> = list(&out, "recalled")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(recalled.len(), 2, "{out}");
    let again = raised(&out["recall_again"], "recalling a recalled message again");
    assert!(
        str_of(again, "text").contains("not waiting for its delivery time"),
        "{again}"
    );
    // The client checks the route's accepted types itself (a NORMAL queue); the front would
    // answer MESSAGE_PROPERTY_CONFLICT_WITH_TYPE (40014) to a client that does not.
    let normal = raised(&out["normal_topic"], "a delivery time on a NORMAL topic");
    let text = str_of(normal, "text");
    assert!(
        (text.contains("message_type:DELAY") && text.contains("NORMAL")) || normal["code"] == 40014,
        "{normal}"
    );
    let far = raised(&out["beyond_horizon"], "a delivery time beyond the horizon");
    assert_eq!(far["code"], 40012, "ILLEGAL_DELIVERY_TIME: {far}");
    assert!(str_of(far, "text").contains("beyond the horizon"), "{far}");

    let received = list(&out, "received");
    let due: BTreeMap<&str, u64> = sent
        .iter()
        .map(|s| (str_of(s, "id"), s["deliver_at_ms"].as_u64().unwrap()))
        .collect();
    let mut got: BTreeMap<&str, usize> = BTreeMap::new();
    let mut late = Vec::new();
    for m in received {
        let id = str_of(m, "id");
        *got.entry(id).or_default() += 1;
        let at = due[id];
        let seen = m["at_ms"].as_u64().unwrap();
        assert!(seen >= at, "{id} received at {seen}, before its time {at}");
        assert_eq!(m["delivery_timestamp_ms"].as_u64(), Some(at), "{m}");
        assert_eq!(m["message_type"], 3, "{id} is a DELAY message: {m}");
        late.push(seen - at);
    }
    let expected: BTreeSet<&str> = due
        .keys()
        .copied()
        .filter(|id| !recalled.contains(id))
        .collect();
    assert_eq!(
        got.keys().copied().collect::<BTreeSet<_>>(),
        expected,
        "{out}"
    );
    assert!(got.values().all(|n| *n == 1), "each once: {got:?}");
    late.sort_unstable();
    println!(
        "t80: {} delay messages received this many ms after their time: {late:?}",
        late.len()
    );
    println!("t80: refusals: {normal} / {far}");
}

/// FIFO message groups with the official client: 4 groups × 6 messages, interleaved, on a FIFO
/// topic of 2 queues; three SimpleConsumers of a FIFO consumer group receive concurrently, and
/// one consume fails (g0's message 2 is not acknowledged). Every message is acknowledged once, in
/// its group's order; a group's next message is handed out only after the one before it was
/// acknowledged (its receive returned after that ack was sent); g0 waits for the failed message's
/// redelivery (attempt 2) while the other groups go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t80_fifo_message_groups_in_order_while_one_waits_for_its_redelivery() {
    let c = Cluster::start(3, &REGISTER_EVERY).await;
    create_typed_topic(&c, "rmq5-fifo", TopicMessageType::Fifo).await;
    create_group_with(
        &c,
        GroupConfig {
            name: "rmq5-fifo-group".into(),
            fifo: true,
            ..Default::default()
        },
    )
    .await;
    let (groups, per_group) = (4usize, 6u64);
    let out = run_script(
        &c,
        "fifo.py",
        &args(&[
            ("topic", "rmq5-fifo"),
            ("group", "rmq5-fifo-group"),
            ("groups", &groups.to_string()),
            ("per-group", &per_group.to_string()),
            ("consumers", "3"),
            ("fail-seq", "2"),
            ("invisible-seconds", "3"),
            ("max-seconds", "90"),
        ]),
        Duration::from_secs(150),
    )
    .await;
    assert!(
        list(&out, "errors").is_empty(),
        "errors: {}\n{}",
        out["errors"],
        diagnostics(&c)
    );
    assert_eq!(
        list(&out, "sent").len(),
        groups * per_group as usize,
        "{out}"
    );
    assert_eq!(out["all_acked"], true, "{out}");
    let mut received: Vec<&Value> = list(&out, "received").iter().collect();
    received.sort_by_key(|e| e["at_ms"].as_u64());
    // Per message group: its events in time order.
    let mut by_group: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for e in &received {
        let g = e["group"]
            .as_str()
            .unwrap_or_else(|| panic!("no group: {e}"));
        assert!(str_of(e, "body").starts_with(&format!("{g}-")), "{e}");
        assert_eq!(e["message_type"], 2, "a FIFO message: {e}");
        by_group.entry(g).or_default().push(e);
    }
    assert_eq!(by_group.len(), groups);
    for (g, events) in &by_group {
        let acked: Vec<u64> = events
            .iter()
            .filter(|e| e["acked"] == true)
            .map(|e| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(
            acked,
            (0..per_group).collect::<Vec<_>>(),
            "{g}: every message acknowledged once, in order"
        );
        // Message k is received only after message k-1's ack was sent.
        let ack_of = |k: u64| {
            events
                .iter()
                .find(|e| e["seq"] == k && e["acked"] == true)
                .and_then(|e| e["ack_ms"].as_u64())
                .unwrap()
        };
        for e in events {
            let k = e["seq"].as_u64().unwrap();
            if k > 0 {
                let before = ack_of(k - 1);
                let at = e["at_ms"].as_u64().unwrap();
                assert!(
                    at >= before,
                    "{g}: message {k} received at {at}, before message {} was acknowledged at \
                     {before}:\n{}",
                    k - 1,
                    serde_json::to_string_pretty(events).unwrap()
                );
            }
        }
    }
    // The failed consume: g0-2 came again with attempt 2, and meanwhile the others went on.
    let g0 = &by_group["g0"];
    let failed = g0.iter().find(|e| e["failed_on_purpose"] == true).unwrap();
    let again = g0
        .iter()
        .find(|e| e["seq"] == 2 && e["acked"] == true)
        .unwrap();
    assert_eq!(again["attempt"], 2, "{again}");
    let (from, to) = (failed["at_ms"].as_u64(), again["at_ms"].as_u64());
    let others = received
        .iter()
        .filter(|e| e["group"] != "g0" && e["at_ms"].as_u64() > from && e["at_ms"].as_u64() < to)
        .count();
    assert!(
        others > 0,
        "no other group's message arrived while g0 waited for its redelivery"
    );
    println!(
        "fifo: {} receives; g0 waited {} ms for its redelivery while {others} other messages \
         arrived",
        received.len(),
        to.unwrap() - from.unwrap()
    );
}

/// Creates `name` as a topic of type `ty` with 2 queues on the leader.
async fn create_typed_topic(c: &Cluster, name: &str, ty: TopicMessageType) {
    let leader = c.leader().await;
    let r = c
        .client(leader)
        .await
        .create_topic(CreateTopicRequest {
            name: name.into(),
            queues: 2,
            update: false,
            message_type: ty as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code(&r.error), ErrorCode::Ok, "{name}: {:?}", r.error);
}

/// Transactional messages with the official client. Six half messages: the even ones committed,
/// the odd ones rolled back; only the committed arrive, once, as TRANSACTION messages, and a
/// second commit of one is INVALID_TRANSACTION_ID (40008). Then a producer "crashes" with four
/// transactions open; a new producer of the topic is asked about each (the check interval is
/// 2 s here) and answers COMMIT for the even ones, ROLLBACK for the odd: exactly those arrive,
/// and no transaction is left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t80_transactions_commit_rollback_and_check_back() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("txn.toml");
    std::fs::write(&conf, "[limits]\ntxn_check_interval_ms = 2000\n").unwrap();
    let mut extra: Vec<&str> = REGISTER_EVERY.to_vec();
    extra.extend(["--config", conf.to_str().unwrap()]);
    let c = Cluster::start(3, &extra).await;
    create_typed_topic(&c, "rmq5-txn", TopicMessageType::Transaction).await;
    let out = run_script(
        &c,
        "transaction.py",
        &args(&[
            ("mode", "commit-rollback"),
            ("topic", "rmq5-txn"),
            ("group", "rmq5-txn-group"),
            ("count", "6"),
            ("max-seconds", "60"),
        ]),
        Duration::from_secs(120),
    )
    .await;
    assert!(
        list(&out, "errors").is_empty(),
        "errors: {}\n{}",
        out["errors"],
        diagnostics(&c)
    );
    let sent = list(&out, "sent");
    assert_eq!(sent.len(), 6, "{out}");
    for s in sent {
        assert!(
            str_of(s, "transaction_id").starts_with("broker-a-"),
            "a half message's send returns its transaction id: {s}"
        );
    }
    let again = raised(
        &out["commit_again"],
        "committing a committed transaction again",
    );
    assert_eq!(again["code"], 40008, "INVALID_TRANSACTION_ID: {again}");
    assert!(str_of(again, "text").contains("is not open"), "{again}");
    let committed: BTreeSet<&str> = sent
        .iter()
        .filter(|s| s["action"] == "commit")
        .map(|s| str_of(s, "id"))
        .collect();
    assert_eq!(committed.len(), 3, "{out}");
    let received = list(&out, "received");
    let got: Vec<&str> = received.iter().map(|m| str_of(m, "id")).collect();
    assert_eq!(
        got.iter().copied().collect::<BTreeSet<_>>(),
        committed,
        "exactly the committed ones arrive: {out}"
    );
    assert_eq!(got.len(), committed.len(), "each once: {out}");
    for m in received {
        assert_eq!(m["message_type"], 4, "a TRANSACTION message: {m}");
    }

    // A producer crashes with four transactions open; a new one answers the checks.
    let orphan = run_script(
        &c,
        "transaction.py",
        &args(&[
            ("mode", "orphan"),
            ("topic", "rmq5-txn"),
            ("count", "4"),
            ("max-seconds", "30"),
        ])
        .into_iter()
        .chain(["--crash".to_string()])
        .collect::<Vec<_>>(),
        Duration::from_secs(60),
    )
    .await;
    assert!(list(&orphan, "errors").is_empty(), "{orphan}");
    let open: BTreeMap<&str, &Value> = list(&orphan, "sent")
        .iter()
        .map(|s| (str_of(s, "id"), s))
        .collect();
    assert_eq!(open.len(), 4, "{orphan}");
    let checker = run_script(
        &c,
        "transaction.py",
        &args(&[
            ("mode", "checker"),
            ("topic", "rmq5-txn"),
            ("group", "rmq5-txn-group"),
            ("stay-seconds", "40"),
            ("expect-checks", "4"),
            ("max-seconds", "60"),
        ]),
        Duration::from_secs(120),
    )
    .await;
    assert!(list(&checker, "errors").is_empty(), "{checker}");
    let checks = list(&checker, "checks");
    let asked: BTreeSet<&str> = checks.iter().map(|k| str_of(k, "id")).collect();
    assert_eq!(
        asked,
        open.keys().copied().collect::<BTreeSet<_>>(),
        "every orphaned transaction is checked: {checker}"
    );
    let want: BTreeSet<&str> = checks
        .iter()
        .filter(|k| k["answer"] == "COMMIT")
        .map(|k| str_of(k, "id"))
        .collect();
    assert_eq!(want.len(), 2, "{checker}");
    let got: Vec<&str> = list(&checker, "received")
        .iter()
        .map(|m| str_of(m, "id"))
        .collect();
    assert_eq!(
        got.iter().copied().collect::<BTreeSet<_>>(),
        want,
        "exactly the ones the checker committed arrive: {checker}"
    );
    assert_eq!(got.len(), want.len(), "each once: {checker}");
    // Nothing is left open.
    let leader = c.leader().await;
    let r = c
        .client(leader)
        .await
        .list_transactions(ListTransactionsRequest {
            topic: "rmq5-txn".into(),
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.error.is_none() && r.transactions.is_empty(), "{r:?}");
}
