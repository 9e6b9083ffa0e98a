//! FIFO and TRANSACTION topics through raftmq's own API and command line.
//!
//! - A message without a message group is refused by a FIFO topic, naming the rule, and nothing
//!   is stored; `produce --message-group` puts one group's messages in one queue, in order.
//! - A TRANSACTION topic stores what is produced as half messages: `txn list` shows them,
//!   `txn commit` makes one readable, `txn rollback` drops one, a second end is refused by name,
//!   and a commit after the leader was killed still finds its half message.

use std::time::Duration;

use raftmq_tests::*;
use serde_json::Value;

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

fn messages(ns: &str, topic: &str) -> Result<u64, String> {
    match raftmq_json(ns, &["topic", "status", topic]) {
        (true, lines, _) if lines.len() == 1 => Ok(num(&lines[0], "messages")),
        (_, _, err) => Err(err),
    }
}

/// 29.1 A FIFO topic refuses a message without a message group and stores nothing; messages of
///      one group go to one queue, in the order sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t29_1_a_fifo_topic_needs_a_message_group_and_keeps_its_order() {
    let c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    let ns = c.nameserver.clone();
    let (ok, _, err) = raftmq_json(
        &ns,
        &["topic", "create", "f", "--type", "fifo", "--queues", "4"],
    );
    assert!(ok, "{err}");
    wait_for("the topic routed", Duration::from_secs(20), || {
        let ns = ns.clone();
        async move { messages(&ns, "f") }
    })
    .await;
    let (ok, _, err) = raftmq_json(
        &ns,
        &["produce", "--topic", "f", "--count", "2", "--size", "8"],
    );
    assert!(
        !ok && err.contains("is a FIFO topic, so each message needs a message group"),
        "{err}"
    );
    assert_eq!(messages(&ns, "f").unwrap(), 0, "nothing stored");

    let (ok, acks, err) = raftmq_json(
        &ns,
        &[
            "produce",
            "--topic",
            "f",
            "--count",
            "20",
            "--size",
            "16",
            "--message-group",
            "order-7",
            "--inflight",
            "1",
        ],
    );
    assert!(ok && acks.len() == 20, "{err}");
    let queues: std::collections::BTreeSet<u64> = acks.iter().map(|a| num(a, "queue")).collect();
    assert_eq!(queues.len(), 1, "one group, one queue: {queues:?}");
    let q = *queues.first().unwrap() as u32;
    let held = read_stored(&c.addrs()[0], "f", q).await.unwrap();
    let bodies: Vec<String> = held
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    let expected: Vec<String> = (0..20).map(|i| format!("msg-{i}-")).collect();
    assert_eq!(bodies.len(), 20);
    for (b, e) in bodies.iter().zip(&expected) {
        assert!(b.starts_with(e.as_str()), "{bodies:?}");
    }
    assert!(held.iter().all(|m| {
        m.properties
            .get(raftmq_proto::MESSAGE_GROUP_PROPERTY)
            .is_some_and(|g| g == "order-7")
    }));
}

/// 29.2 Transactions by hand: four half messages produced, none readable; `txn list` shows four;
///      one committed (readable at the offset the commit names), one rolled back, a second
///      commit refused as not open; the leader is SIGKILLed and the new leader commits a third
///      and still lists the fourth; nothing else becomes readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t29_2_transactions_committed_and_rolled_back_by_hand_across_a_leader_kill() {
    let mut c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    let ns = c.nameserver.clone();
    let (ok, _, err) = raftmq_json(
        &ns,
        &[
            "topic",
            "create",
            "tx",
            "--type",
            "transaction",
            "--queues",
            "2",
        ],
    );
    assert!(ok, "{err}");
    wait_for("the topic routed", Duration::from_secs(20), || {
        let ns = ns.clone();
        async move { messages(&ns, "tx") }
    })
    .await;
    let (ok, acks, err) = raftmq_json(
        &ns,
        &[
            "produce",
            "--topic",
            "tx",
            "--count",
            "4",
            "--size",
            "16",
            "--inflight",
            "1",
        ],
    );
    assert!(ok && acks.len() == 4, "{err}");
    let ids: Vec<String> = acks
        .iter()
        .map(|a| a["msg_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        messages(&ns, "tx").unwrap(),
        0,
        "half messages are not readable"
    );
    let open = |ns: &str| -> Vec<String> {
        let (ok, lines, err) = raftmq_json(ns, &["txn", "list", "--topic", "tx"]);
        assert!(ok, "{err}");
        lines
            .iter()
            .map(|l| l["transaction_id"].as_str().unwrap().to_string())
            .collect()
    };
    let mut listed = open(&ns);
    listed.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(listed, want);

    let (ok, done, err) = raftmq_json(&ns, &["txn", "commit", "--topic", "tx", "--id", &ids[0]]);
    assert!(ok && done[0]["committed"] == true, "{err}");
    let (q, off) = (num(&done[0], "queue") as u32, num(&done[0], "offset"));
    let (ok, _, err) = raftmq_json(&ns, &["txn", "rollback", "--topic", "tx", "--id", &ids[1]]);
    assert!(ok, "{err}");
    let (ok, _, err) = raftmq_json(&ns, &["txn", "commit", "--topic", "tx", "--id", &ids[0]]);
    assert!(
        !ok && err.contains("is not open"),
        "a second end is refused: {err}"
    );
    let held = read_stored(&c.addrs()[0], "tx", q).await.unwrap();
    assert!(
        held.iter().any(|m| m.offset == off),
        "committed at {q}/{off}: {held:?}"
    );

    // Every member has told the others which commands it applies (a member never heard from
    // counts as the first release, and the killed one would then hold transactions back).
    c.wait_feature_levels(Duration::from_secs(20))
        .await
        .expect("feature levels");
    let leader = c.leader().await;
    c.kill(leader);
    let (ok, _, err) = raftmq_json(&ns, &["txn", "commit", "--topic", "tx", "--id", &ids[2]]);
    assert!(ok, "a commit after the leader kill: {err}");
    assert_eq!(open(&ns), vec![ids[3].clone()], "the fourth is still open");
    wait_for("two messages readable", Duration::from_secs(20), || {
        let ns = ns.clone();
        async move {
            match messages(&ns, "tx")? {
                2 => Ok(()),
                n => Err(format!("{n} readable")),
            }
        }
    })
    .await;
}
