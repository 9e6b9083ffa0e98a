//! Three members on 127.0.0.1 with real files and real gRPC: election, replication, failover.

use std::time::{Duration, Instant};

use bytes::Bytes;
use raftmq_raft_log::testkit::LocalGroup;
use raftmq_raft_log::{ProposeError, RaftConfig, Role};

async fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn payloads(rows: Vec<(u64, Option<Bytes>)>) -> Vec<(u64, Vec<u8>)> {
    rows.into_iter()
        .filter_map(|(i, d)| d.map(|d| (i, d.to_vec())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t10_elect_replicate_fail_over_and_rejoin() {
    elect_replicate_fail_over_and_rejoin(RaftConfig::default()).await;
}

/// The same with `pipeline_appends = false`: one AppendEntries RPC at a time instead of the
/// ordered stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t13_unpipelined_appends_elect_replicate_fail_over_and_rejoin() {
    elect_replicate_fail_over_and_rejoin(RaftConfig {
        pipeline_appends: false,
        ..RaftConfig::default()
    })
    .await;
}

async fn elect_replicate_fail_over_and_rejoin(cfg: RaftConfig) {
    let dir = tempfile::tempdir().unwrap();
    let mut g = LocalGroup::start(3, dir.path(), cfg, false).await;
    // Propose on the leader; a follower refuses with the leader's id and address.
    let mut acked = Vec::new();
    let mut leader = 0;
    for i in 0..50u32 {
        let (l, idx, reply) = g
            .propose(Bytes::from(format!("m{i}")), Duration::from_secs(10))
            .await
            .unwrap();
        leader = l;
        assert_eq!(reply.as_ref(), idx.to_le_bytes());
        acked.push((idx, format!("m{i}").into_bytes()));
    }
    let follower = *g.members.keys().find(|id| **id != leader).unwrap();
    match g.members[&follower]
        .member
        .propose(Bytes::from_static(b"x"))
        .await
    {
        Err(ProposeError::NotLeader {
            leader: Some((id, addr)),
        }) => {
            assert_eq!(id, leader);
            assert_eq!(addr, g.addrs[&leader]);
        }
        other => panic!("expected NotLeader from a follower, got {other:?}"),
    }
    let last = acked.last().unwrap().0;
    for (id, m) in &g.members {
        wait_for(
            &format!("node {id} applies {last}"),
            Duration::from_secs(10),
            || (m.member.status().applied >= last).then_some(()),
        )
        .await;
        assert_eq!(
            payloads(m.member.read_entries(acked[0].0, last + 1).unwrap()),
            acked,
            "node {id} holds the same entries in order"
        );
    }

    // Kill the leader abruptly; a new leader commits.
    g.kill(leader);
    let t = Instant::now();
    let new_leader = g
        .wait_leader(Duration::from_secs(10))
        .await
        .expect("a new leader");
    assert_ne!(new_leader, leader);
    let (idx, _) = loop {
        match g.members[&new_leader]
            .member
            .propose(Bytes::from_static(b"after"))
            .await
        {
            Ok(r) => break r,
            Err(e) => {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "no commit after failover: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    acked.push((idx, b"after".to_vec()));

    // The old leader restarts from its data dir, rejoins as a follower and converges.
    g.spawn(leader, None).await;
    let last = acked.last().unwrap().0;
    wait_for("the old leader converges", Duration::from_secs(10), || {
        let st = g.members[&leader].member.status();
        (st.applied >= last && st.role == Role::Follower).then_some(())
    })
    .await;
    assert_eq!(
        payloads(
            g.members[&leader]
                .member
                .read_entries(acked[0].0, last + 1)
                .unwrap()
        ),
        acked
    );
    g.kill_all();
}

/// A partitioned minority commits nothing: with two of three members gone, the last one cannot
/// commit, and once a peer is back the group commits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t11_minority_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = LocalGroup::start(3, dir.path(), RaftConfig::default(), false).await;
    let (leader, _, _) = g
        .propose(Bytes::from_static(b"x"), Duration::from_secs(10))
        .await
        .unwrap();
    let others: Vec<u64> = g
        .members
        .keys()
        .copied()
        .filter(|id| *id != leader)
        .collect();
    for id in &others {
        g.kill(*id);
    }
    let r = tokio::time::timeout(
        Duration::from_secs(2),
        g.members[&leader]
            .member
            .propose(Bytes::from_static(b"lost")),
    )
    .await;
    assert!(
        !matches!(r, Ok(Ok(_))),
        "a lone member must not commit: {r:?}"
    );
    g.spawn(others[0], None).await;
    let t = Instant::now();
    loop {
        let Some(l) = g.leader() else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        if let Ok(Ok(_)) = tokio::time::timeout(
            Duration::from_secs(2),
            g.members[&l].member.propose(Bytes::from_static(b"back")),
        )
        .await
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the healed majority never committed"
        );
    }
    g.kill_all();
}

/// Leadership transfer to a named, caught-up member.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t12_transfer_leadership_to_a_named_member() {
    let dir = tempfile::tempdir().unwrap();
    let g = LocalGroup::start(3, dir.path(), RaftConfig::default(), false).await;
    let (leader, _, _) = g
        .propose(Bytes::from_static(b"x"), Duration::from_secs(10))
        .await
        .unwrap();
    let to = *g.members.keys().find(|id| **id != leader).unwrap();
    // A transfer is a request, not a guarantee: on a loaded machine another member can win the
    // election it starts. Ask whoever leads again until the named member leads (bounded).
    let t = Instant::now();
    let mut asked: Option<(u64, Instant)> = None;
    loop {
        let now_leader = g.leader();
        if now_leader == Some(to) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "node {to} does not lead after 15 s of transfer requests (leader: {now_leader:?})"
        );
        if let Some(l) = now_leader
            && asked.is_none_or(|(who, at)| who != l || at.elapsed() > Duration::from_secs(2))
        {
            match g.members[&l].member.transfer_leader(to).await {
                Ok(()) => asked = Some((l, Instant::now())),
                Err(e) => assert!(
                    t.elapsed() < Duration::from_secs(5),
                    "transfer refused: {e}"
                ),
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut g = g;
    g.kill_all();
}
