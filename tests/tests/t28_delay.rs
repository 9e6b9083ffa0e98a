//! Scheduled messages (DELAY topics) on a real three-node group, sent as a user sends them
//! (`raftmq produce --delay`, `--deliver-at`), recalled with `raftmq msg recall`, and read back
//! from every replica:
//!
//! - 28.1 bad input is refused with a clear message and stores nothing; a scheduled message is
//!   invisible until its time, then readable once; a recalled one never arrives.
//! - 28.2 the fault test: 10,000 messages scheduled over the next ~25 s while the leader is
//!   SIGKILLed and, later, every node loses power at once (SIGKILL of all, restart). Each
//!   acknowledged message is delivered exactly once, never before its time, and every replica
//!   holds the same queues. Lateness is printed as a table (no timed assertion).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use raftmq_tests::*;
use serde_json::Value;

use raftmq_tests::history::pop::wall_ms as now_ms;

/// Waits until `topic status` answers for every one of `topics` (created, and routed).
async fn wait_routed(ns: &str, topics: &[&str]) {
    wait_for(
        "the topics routed",
        Duration::from_secs(20),
        || async move {
            for t in topics {
                readable_and_scheduled(ns, t)?;
            }
            Ok::<(), String>(())
        },
    )
    .await;
}

/// `raftmq ARGS --json` against the cluster's nameserver: success, JSON lines, stderr.
fn raftmq(ns: &str, args: &[&str]) -> (bool, Vec<Value>, String) {
    raftmq_json(ns, args)
}

fn must(ns: &str, args: &[&str]) -> Vec<Value> {
    let (ok, lines, err) = raftmq(ns, args);
    assert!(ok, "{args:?} failed: {err}");
    lines
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// A delivered message as one replica holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    offset: u64,
    body: Vec<u8>,
    store_ms: u64,
    deliver_at_ms: Option<u64>,
    /// The id its send returned (kept in `__rmq.msgid` on delivery).
    sent_id: Option<String>,
}

/// Every message of a queue on one node, in offset order.
async fn read_all(addr: &str, topic: &str, queue: u32) -> Result<Vec<Held>, String> {
    Ok(read_stored(addr, topic, queue)
        .await?
        .into_iter()
        .map(|m| Held {
            offset: m.offset,
            body: m.body.to_vec(),
            store_ms: m.store_timestamp_ms,
            deliver_at_ms: m
                .properties
                .get(raftmq_proto::DELIVER_AT_PROPERTY)
                .and_then(|v| v.parse().ok()),
            sent_id: m.properties.get("__rmq.msgid").cloned(),
        })
        .collect())
}

/// `topic status` of `topic`: (messages readable, scheduled).
fn readable_and_scheduled(ns: &str, topic: &str) -> Result<(u64, u64), String> {
    let (ok, lines, err) = raftmq(ns, &["topic", "status", topic]);
    if !ok || lines.len() != 1 {
        return Err(format!("topic status: {err}"));
    }
    Ok((num(&lines[0], "messages"), num(&lines[0], "scheduled")))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// 28.1 Bad input is refused, naming the problem, and stores nothing; a scheduled message is not
///      readable before its time and is readable once after it; a recall cancels one, and a
///      second recall says it no longer waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t28_1_schedule_refusals_visibility_and_recall() {
    let c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    let ns = c.nameserver.clone();
    must(
        &ns,
        &["topic", "create", "d", "--type", "delay", "--queues", "2"],
    );
    must(&ns, &["topic", "create", "n", "--queues", "1"]);
    wait_routed(&ns, &["d", "n"]).await;

    // A delivery time on a NORMAL topic; beyond the 40-day horizon; a malformed duration.
    let (ok, _, err) = raftmq(
        &ns,
        &[
            "produce", "--topic", "n", "--count", "1", "--size", "8", "--delay", "5s",
        ],
    );
    assert!(
        !ok && err.contains("only a DELAY topic takes delivery times"),
        "{err}"
    );
    let far = (now_ms() + 41 * 24 * 3600 * 1000).to_string();
    let (ok, _, err) = raftmq(
        &ns,
        &[
            "produce",
            "--topic",
            "d",
            "--count",
            "1",
            "--size",
            "8",
            "--deliver-at",
            &far,
        ],
    );
    assert!(
        !ok && err.contains("beyond the horizon of 3456000 s"),
        "{err}"
    );
    let (ok, _, err) = raftmq(
        &ns,
        &["produce", "--topic", "d", "--count", "1", "--delay", "5"],
    );
    assert!(
        !ok && err.contains("--delay \"5\" is not a duration"),
        "{err}"
    );
    assert_eq!(
        readable_and_scheduled(&ns, "n").unwrap(),
        (0, 0),
        "nothing stored"
    );
    assert_eq!(
        readable_and_scheduled(&ns, "d").unwrap(),
        (0, 0),
        "nothing stored"
    );

    // Scheduled 4 s ahead: acknowledged at once with its time and no offset.
    let t0 = now_ms();
    let acks = must(
        &ns,
        &[
            "produce", "--topic", "d", "--count", "20", "--size", "16", "--delay", "4s",
        ],
    );
    assert_eq!(acks.len(), 20);
    for a in &acks {
        let at = num(a, "deliver_at_ms");
        assert!(at >= t0 + 4000, "{a}");
        assert_eq!(num(a, "offset"), 0, "{a}");
    }
    let due = acks.iter().map(|a| num(a, "deliver_at_ms")).max().unwrap();
    // One more, far ahead, to recall.
    let late = must(
        &ns,
        &[
            "produce", "--topic", "d", "--count", "1", "--size", "16", "--delay", "1h",
        ],
    );
    let late_id = late[0]["msg_id"].as_str().unwrap().to_string();
    let st = must(&ns, &["topic", "status", "d"]);
    assert_eq!(
        (num(&st[0], "messages"), num(&st[0], "scheduled")),
        (0, 21),
        "{}",
        st[0]
    );
    // Nothing readable before its time, on any node.
    let addrs = c.addrs();
    if now_ms() + 500 < t0 + 4000 {
        for a in &addrs {
            for q in 0..2 {
                assert_eq!(
                    read_all(a, "d", q).await.unwrap(),
                    vec![],
                    "{a} queue {q} before the time"
                );
            }
        }
    }
    // `msg get` finds a scheduled message by its id before its time: waiting, no offset.
    let got = must(&ns, &["msg", "get", "--topic", "d", "--id", &late_id]);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["scheduled"], true, "{}", got[0]);
    assert_eq!(
        got[0]["deliver_at_ms"], late[0]["deliver_at_ms"],
        "{}",
        got[0]
    );
    assert_eq!(num(&got[0], "offset"), 0, "{}", got[0]);
    let r = must(&ns, &["msg", "recall", "--topic", "d", "--id", &late_id]);
    assert_eq!(r[0]["recalled"], true, "{}", r[0]);
    let (ok, _, err) = raftmq(&ns, &["msg", "recall", "--topic", "d", "--id", &late_id]);
    assert!(
        !ok && err.contains("is not waiting for its delivery time"),
        "{err}"
    );

    // After its time: all 20 readable once, on every node, none stored before its time.
    wait_for("20 delivered", Duration::from_secs(30), || {
        let ns = ns.clone();
        async move {
            match readable_and_scheduled(&ns, "d")? {
                (20, 0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let seen = now_ms();
    // Delivered, a message is found under the id its send returned, in its queue.
    let first_id = acks[0]["msg_id"].as_str().unwrap();
    let got = must(&ns, &["msg", "get", "--topic", "d", "--id", first_id]);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].get("scheduled").is_none(), "{}", got[0]);
    assert!(
        num(&got[0], "store_ms") >= num(&acks[0], "deliver_at_ms"),
        "{}",
        got[0]
    );
    // A recalled message is found no more.
    let (ok, _, err) = raftmq(&ns, &["msg", "get", "--topic", "d", "--id", &late_id]);
    assert!(!ok && err.contains("no message with id"), "{err}");
    for a in &addrs {
        let mut got = Vec::new();
        wait_for("a replica holds the 20", Duration::from_secs(20), || {
            let a = a.clone();
            async move {
                let mut all = read_all(&a, "d", 0).await?;
                all.extend(read_all(&a, "d", 1).await?);
                if all.len() == 20 {
                    Ok(all)
                } else {
                    Err(format!("{} of 20", all.len()))
                }
            }
        })
        .await
        .into_iter()
        .for_each(|h| got.push(h));
        for h in &got {
            let at = h.deliver_at_ms.expect("the delivery time is kept");
            assert!(
                h.store_ms >= at,
                "delivered at {} before its time {at}",
                h.store_ms
            );
        }
        let mut bodies: Vec<&[u8]> = got.iter().map(|h| h.body.as_slice()).collect();
        bodies.sort();
        bodies.dedup();
        assert_eq!(bodies.len(), 20, "{a}: each once");
    }
    println!(
        "DELAY 28.1: 20 messages due by {due}, all readable when checked at {seen} (+{} ms)",
        seen.saturating_sub(due)
    );
}

/// 28.2 10,000 messages scheduled over ~25 s; the leader is SIGKILLed while they wait, then
///      every node loses power at once. Each acknowledged message is delivered exactly once,
///      never before its time; every replica holds the same queues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t28_2_scheduled_messages_survive_leader_kill_and_power_loss() {
    const N: usize = 10_000;
    let mut c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    let ns = c.nameserver.clone();
    must(
        &ns,
        &[
            "topic", "create", "sched", "--type", "delay", "--queues", "4",
        ],
    );
    wait_routed(&ns, &["sched"]).await;
    let n = N.to_string();
    let t0 = now_ms();
    let acks = must(
        &ns,
        &[
            "produce",
            "--topic",
            "sched",
            "--count",
            &n,
            "--size",
            "64",
            "--delay",
            "6s",
            "--delay-spread",
            "20s",
        ],
    );
    assert_eq!(acks.len(), N, "every message acknowledged");
    // The id each send returned → its delivery time.
    let due: HashMap<String, u64> = acks
        .iter()
        .map(|a| {
            (
                a["msg_id"].as_str().unwrap().to_string(),
                num(a, "deliver_at_ms"),
            )
        })
        .collect();
    assert_eq!(due.len(), N, "ids are unique");
    println!("DELAY 28.2: {N} scheduled in {} ms", now_ms() - t0);

    // The leader dies while they are being delivered (due from +6 s to +26 s); it comes back
    // 3 s later.
    tokio::time::sleep(Duration::from_millis((t0 + 9_000).saturating_sub(now_ms()))).await;
    let leader = c.leader().await;
    let killed_at = now_ms();
    c.kill(leader);
    println!(
        "DELAY 28.2: killed leader {leader} at +{} ms",
        killed_at - t0
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    c.spawn(leader);
    // Mid-way through the deliveries, every node loses power at once.
    let power_at = t0 + 17_000;
    tokio::time::sleep(Duration::from_millis(power_at.saturating_sub(now_ms()))).await;
    let before_power = readable_and_scheduled(&ns, "sched").unwrap_or((0, 0));
    c.kill_all();
    println!(
        "DELAY 28.2: power loss at +{} ms with {} delivered, {} waiting",
        now_ms() - t0,
        before_power.0,
        before_power.1
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in 1..=3 {
        c.spawn(id);
    }
    let back_at = now_ms();
    c.leader().await;

    wait_for("every message delivered", Duration::from_secs(90), || {
        let ns = ns.clone();
        async move {
            match readable_and_scheduled(&ns, "sched")? {
                (m, 0) if m as usize >= N => Ok(()),
                other => Err(format!("{other:?} of {N}")),
            }
        }
    })
    .await;

    // Every replica: the same queues; each message once; none before its time.
    let mut replicas: Vec<BTreeMap<u32, Vec<Held>>> = Vec::new();
    for a in c.addrs() {
        let held = wait_for(
            "a replica holds every message",
            Duration::from_secs(30),
            || {
                let a = a.clone();
                async move {
                    let mut qs = BTreeMap::new();
                    let mut total = 0;
                    for q in 0..4 {
                        let h = read_all(&a, "sched", q).await?;
                        total += h.len();
                        qs.insert(q, h);
                    }
                    if total >= N {
                        Ok(qs)
                    } else {
                        Err(format!("{a}: {total} of {N}"))
                    }
                }
            },
        )
        .await;
        replicas.push(held);
    }
    for r in &replicas[1..] {
        assert!(r == &replicas[0], "replicas differ");
    }
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut bodies: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut lateness = Vec::new();
    let mut during_faults = Vec::new();
    for h in replicas[0].values().flatten() {
        let id = h.sent_id.clone().expect("the id its send returned");
        let at = *due
            .get(&id)
            .unwrap_or_else(|| panic!("a message nobody sent: {id}"));
        assert_eq!(h.deliver_at_ms, Some(at), "{id}: its time is kept");
        assert!(
            h.store_ms >= at,
            "{id} delivered at {} before its time {at}",
            h.store_ms
        );
        *seen.entry(id).or_default() += 1;
        *bodies.entry(h.body.clone()).or_default() += 1;
        let late = h.store_ms - at;
        // Due while a fault was being recovered from: counted apart.
        if (killed_at..killed_at + 4_000).contains(&at) || (power_at..back_at + 2_000).contains(&at)
        {
            during_faults.push(late);
        } else {
            lateness.push(late);
        }
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dups.is_empty(), "delivered twice: {:?}", dups.first());
    assert_eq!(seen.len(), N, "each acknowledged message delivered");
    assert_eq!(bodies.len(), N, "each body once");
    lateness.sort_unstable();
    during_faults.sort_unstable();
    println!("DELAY 28.2 lateness (store time − delivery time), ms:");
    println!(
        "  {:<26} {:>7} {:>7} {:>7} {:>7}",
        "messages", "count", "p50", "p99", "max"
    );
    for (name, v) in [
        ("due outside the faults", &lateness),
        ("due during a fault", &during_faults),
    ] {
        println!(
            "  {:<26} {:>7} {:>7} {:>7} {:>7}",
            name,
            v.len(),
            percentile(v, 0.5),
            percentile(v, 0.99),
            v.last().copied().unwrap_or(0)
        );
    }
}

/// 28.3 Retention trims past scheduled messages without losing them: with 1 MiB segments and a
///      one-second maximum age, messages due 20 s ahead are moved to new entries (same time, same
///      id) while a producer fills the log, every node purges the entries they were sent in, and
///      each is still found (`msg get`) and recalled by the id its send returned, or delivered
///      once at its time under that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t28_3_retention_moves_waiting_messages_instead_of_losing_them() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("node.toml");
    std::fs::write(
        &conf,
        "register_interval_ms = 500\n[raft]\nsegment_bytes_max = 1048576\ncheckpoint_every_entries = 4\n\
         [retention]\nmax_age_secs = 1\ncheck_interval_ms = 300\n",
    )
    .unwrap();
    let c = Cluster::start(3, &["--config", conf.to_str().unwrap()]).await;
    let ns = c.nameserver.clone();
    must(
        &ns,
        &[
            "topic", "create", "later", "--type", "delay", "--queues", "2",
        ],
    );
    must(&ns, &["topic", "create", "fill", "--queues", "2"]);
    wait_routed(&ns, &["later", "fill"]).await;
    let acks = must(
        &ns,
        &[
            "produce", "--topic", "later", "--count", "50", "--size", "100", "--delay", "20s",
        ],
    );
    assert_eq!(acks.len(), 50);
    let due: HashMap<String, u64> = acks
        .iter()
        .map(|a| {
            (
                a["msg_id"].as_str().unwrap().to_string(),
                num(a, "deliver_at_ms"),
            )
        })
        .collect();
    let sent_in = acks
        .iter()
        .filter_map(|a| raftmq_proto::split_msg_id(a["msg_id"].as_str()?).map(|(_, i, _)| i))
        .max()
        .unwrap();
    // Fill the log until every node purged the entries the scheduled messages were sent in.
    for id in 1..=3u64 {
        wait_for(
            "every node purges past the scheduled entries",
            Duration::from_secs(60),
            || {
                let ns = ns.clone();
                let c = &c;
                async move {
                    let st = c.status(id).await.ok_or("no status")?;
                    if st.purged_index > sent_in {
                        return Ok(());
                    }
                    raftmq(
                        &ns,
                        &[
                            "produce", "--topic", "fill", "--count", "200", "--size", "4000",
                        ],
                    );
                    Err(format!(
                        "node {id} purged to {} of {sent_in}",
                        st.purged_index
                    ))
                }
            },
        )
        .await;
    }
    assert_eq!(
        readable_and_scheduled(&ns, "later").unwrap().1,
        50,
        "still waiting"
    );
    // Moved, each is still found, and recalled, by the id its send returned.
    let recalled = acks[0]["msg_id"].as_str().unwrap().to_string();
    let found = must(&ns, &["msg", "get", "--topic", "later", "--id", &recalled]);
    assert_eq!(found[0]["scheduled"], true, "{found:?}");
    must(
        &ns,
        &["msg", "recall", "--topic", "later", "--id", &recalled],
    );
    wait_for("the 49 delivered", Duration::from_secs(60), || {
        let ns = ns.clone();
        async move {
            match readable_and_scheduled(&ns, "later")? {
                (49, 0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let mut got: HashMap<String, u32> = HashMap::new();
    for q in 0..2 {
        for h in read_all(&c.addrs()[0], "later", q).await.unwrap() {
            let id = h.sent_id.clone().expect("the id its send returned");
            let at = due[&id];
            assert_eq!(h.deliver_at_ms, Some(at));
            assert!(h.store_ms >= at, "{id} early");
            *got.entry(id).or_default() += 1;
        }
    }
    assert!(
        !got.contains_key(&recalled),
        "the recalled one never arrives"
    );
    assert_eq!(got.len(), 49, "each other delivered");
    assert!(got.values().all(|n| *n == 1), "each once");
    let moved = (1..=3)
        .filter(|&id| {
            c.node_log(id)
                .contains("scheduled messages moved ahead of the retention point")
        })
        .count();
    assert!(moved >= 1, "the leader logged the move");
}
