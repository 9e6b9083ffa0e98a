//! Membership changes against a real three-node group, through the `raftmq` command: a fourth
//! node started with no peers joins with `raftmq node add` (learner, caught up, promoted to voter),
//! holds every message, survives the old leader's death as a voter, and leaves with
//! `raftmq node remove`. Bad requests are refused with a reason and change nothing.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use raftmq_tests::*;

/// Runs `raftmq` against the cluster's nameserver; (success, stdout, stderr).
fn raftmq(ns: &str, args: &[&str]) -> (bool, String, String) {
    let o = Command::new(bin("raftmq"))
        .args(args)
        .env("RAFTMQ_NAMESERVER", ns)
        .stdin(Stdio::null())
        .output()
        .expect("run raftmq");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

async fn send_batches(
    p: &mut TestProducer,
    n: usize,
    acked: &mut BTreeMap<u64, Vec<u8>>,
    tag: &str,
) {
    for i in 0..n {
        let bodies: Vec<Vec<u8>> = (0..5)
            .map(|j| format!("{tag}-{i}-{j}").into_bytes())
            .collect();
        match p
            .send("members", 0, bodies.clone(), Duration::from_secs(20))
            .await
        {
            SendOutcome::Acked(r) => {
                assert_eq!(r.results.len(), bodies.len());
                for (res, b) in r.results.iter().zip(bodies) {
                    acked.insert(res.offset, b);
                }
            }
            SendOutcome::Failed(e) => panic!("send {tag}-{i} failed: {e}"),
        }
    }
}

/// Waits until the node at `addr` holds at least as many messages as were acknowledged, then
/// checks they are exactly the acknowledged ones, at their offsets.
async fn assert_holds(addr: &str, acked: &BTreeMap<u64, Vec<u8>>, who: &str) {
    let want: Vec<(u64, Vec<u8>)> = acked.iter().map(|(o, b)| (*o, b.clone())).collect();
    let got = wait_for(
        &format!("{who} to hold every acknowledged message"),
        Duration::from_secs(30),
        || async {
            read_queue(addr, "members", 0)
                .await
                .ok()
                .filter(|q| q.len() >= want.len())
        },
    )
    .await;
    assert_eq!(got, want, "{who}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t51_node_add_and_remove_through_the_command() {
    let mut c = Cluster::start(3, &[]).await;
    c.create_topic("members", 1).await;
    let mut p = TestProducer::new(51, c.addrs());
    let mut acked = BTreeMap::new();
    send_batches(&mut p, 40, &mut acked, "before").await;

    // Node 4: no peers, no data; it waits to be added.
    let addr4 = c.add_node(4).expect("start node 4");

    // Bad input first: removing a voter that is not there is refused with the reason.
    let (ok, _, err) = raftmq(
        &c.nameserver,
        &["node", "remove", "--broker", "broker-a", "--node-id", "9"],
    );
    assert!(!ok && err.contains("not a voter"), "{err}");

    let (ok, out, err) = raftmq(
        &c.nameserver,
        &[
            "node",
            "add",
            "--broker",
            "broker-a",
            "--node-id",
            "4",
            "--address",
            &addr4,
            "--json",
        ],
    );
    assert!(ok, "node add failed: {err}\n{}", c.node_log(4));
    let v = json(&out);
    assert_eq!(v["node_id"], 4);
    assert_eq!(v["role"], "voter");

    // Every node, node 4 included, sees four voters; node 4 holds every acknowledged message.
    let leader = c.leader().await;
    let st = c.status(leader).await.expect("leader status");
    let voters: Vec<u64> = st
        .peers
        .iter()
        .filter(|p| p.voter)
        .map(|p| p.node_id)
        .collect();
    assert!(voters.contains(&4), "voters {voters:?}");
    assert_holds(&addr4, &acked, "node 4").await;

    // As a voter it counts: with the leader dead, nodes 4 and two others elect and commit.
    c.kill(leader);
    send_batches(&mut p, 20, &mut acked, "after-kill").await;
    let new_leader = c.leader().await;
    assert_ne!(new_leader, leader);
    c.spawn(leader);
    c.leader().await;

    let (ok, out, err) = raftmq(
        &c.nameserver,
        &[
            "node",
            "remove",
            "--broker",
            "broker-a",
            "--node-id",
            "4",
            "--json",
        ],
    );
    assert!(ok, "node remove failed: {err}");
    let v = json(&out);
    assert_eq!(v["removed"], 4);
    assert_eq!(v["voters"], serde_json::json!([1, 2, 3]));
    // Out of the group it hears no leader any more (it may never learn its own removal): stop it.
    c.kill(4);
    let leader = c.leader().await;
    let st = c.status(leader).await.expect("leader status");
    assert!(
        !st.peers.iter().any(|p| p.node_id == 4 && p.voter),
        "node 4 is still a voter: {:?}",
        st.peers
    );
    // The group goes on without it, and nothing acknowledged was lost.
    send_batches(&mut p, 10, &mut acked, "after-remove").await;
    for id in [1u64, 2, 3] {
        assert_holds(&c.nodes[&id].addr, &acked, &format!("node {id}")).await;
    }
}
