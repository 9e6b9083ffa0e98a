//! Three members on 127.0.0.1 with real files and real gRPC: election, replication, failover.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use raftmq_raft_log::{Member, MemberConfig, ProposeError, RaftConfig, Role, StateMachine};
use tokio::net::TcpListener;

/// A state machine that records every payload it applied, in order.
#[derive(Default)]
struct Recorder {
    applied: Vec<(u64, Vec<u8>)>,
}

impl StateMachine for Recorder {
    fn apply(&mut self, index: u64, _term: u64, payload: &[u8]) -> Bytes {
        self.applied.push((index, payload.to_vec()));
        Bytes::from(index.to_le_bytes().to_vec())
    }
    fn snapshot(&self) -> Vec<u8> {
        postcard::to_stdvec(&self.applied).unwrap()
    }
    fn restore(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.applied = postcard::from_bytes(data).map_err(std::io::Error::other)?;
        Ok(())
    }
}

/// A member with its own runtime: dropping the runtime ends every task and closes every socket
/// at once, as a killed process would.
struct Node {
    member: Member<Recorder>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Node {
    fn kill(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn start(
    id: u64,
    listener: Option<std::net::TcpListener>,
    addrs: &BTreeMap<u64, String>,
    dir: &std::path::Path,
) -> Node {
    let cfg = MemberConfig {
        cluster: "DefaultCluster".into(),
        broker: "broker-a".into(),
        node_id: id,
        initial_members: addrs.clone(),
        data_dir: dir.join(format!("n{id}")),
        raft: RaftConfig::default(),
    };
    let listener = match listener {
        Some(l) => l,
        None => std::net::TcpListener::bind(&addrs[&id]).unwrap(),
    };
    listener.set_nonblocking(true).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let member = rt
        .spawn(async move {
            let member = Member::start(cfg, Recorder::default()).await.unwrap();
            let svc = member.peer_service();
            let listener = TcpListener::from_std(listener).unwrap();
            tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await;
            });
            member
        })
        .await
        .unwrap();
    Node {
        member,
        rt: Some(rt),
    }
}

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

fn leader_of(nodes: &BTreeMap<u64, Node>) -> Option<u64> {
    let leaders: Vec<u64> = nodes
        .iter()
        .filter(|(_, n)| n.member.status().role == Role::Leader)
        .map(|(id, _)| *id)
        .collect();
    (leaders.len() == 1).then(|| leaders[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t10_elect_replicate_fail_over_and_rejoin() {
    let dir = tempfile::tempdir().unwrap();
    let mut listeners = BTreeMap::new();
    let mut addrs = BTreeMap::new();
    for id in 1..=3u64 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        addrs.insert(id, l.local_addr().unwrap().to_string());
        listeners.insert(id, l);
    }
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        nodes.insert(
            id,
            start(id, listeners.remove(&id), &addrs, dir.path()).await,
        );
    }
    let leader = wait_for("one leader", Duration::from_secs(10), || leader_of(&nodes)).await;

    // Propose on the leader; a follower refuses with the leader's id and address.
    let mut acked = Vec::new();
    for i in 0..50u32 {
        let (idx, reply) = nodes[&leader]
            .member
            .propose(Bytes::from(format!("m{i}")))
            .await
            .unwrap();
        assert_eq!(reply.as_ref(), idx.to_le_bytes());
        acked.push((idx, format!("m{i}").into_bytes()));
    }
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    match nodes[&follower]
        .member
        .propose(Bytes::from_static(b"x"))
        .await
    {
        Err(ProposeError::NotLeader {
            leader: Some((id, addr)),
        }) => {
            assert_eq!(id, leader);
            assert_eq!(addr, addrs[&leader]);
        }
        other => panic!("expected NotLeader from a follower, got {other:?}"),
    }
    let last = acked.last().unwrap().0;
    for (id, n) in &nodes {
        wait_for(
            &format!("node {id} applies {last}"),
            Duration::from_secs(10),
            || (n.member.status().applied >= last).then_some(()),
        )
        .await;
        let got = n.member.read_entries(acked[0].0, last + 1).unwrap();
        let got: Vec<(u64, Vec<u8>)> = got
            .into_iter()
            .filter_map(|(i, d)| d.map(|d| (i, d.to_vec())))
            .collect();
        assert_eq!(
            got, acked,
            "node {id} holds the same entries in the same order"
        );
    }

    // Kill the leader abruptly: stop its server and its Raft tasks with no hand-off.
    nodes.remove(&leader).unwrap().kill();
    let t = Instant::now();
    let new_leader = wait_for("a new leader", Duration::from_secs(10), || {
        leader_of(&nodes)
    })
    .await;
    assert_ne!(new_leader, leader);
    let (idx, _) = loop {
        match nodes[&new_leader]
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
    eprintln!(
        "failover: leader {leader} -> {new_leader}, next commit after {:?}",
        t.elapsed()
    );
    acked.push((idx, b"after".to_vec()));

    // Restart the old leader from its data dir: it rejoins as a follower and converges.
    let back = start(leader, None, &addrs, dir.path()).await;
    nodes.insert(leader, back);
    let last = acked.last().unwrap().0;
    wait_for("the old leader converges", Duration::from_secs(10), || {
        let st = nodes[&leader].member.status();
        (st.applied >= last && st.role == Role::Follower).then_some(())
    })
    .await;
    let got: Vec<(u64, Vec<u8>)> = nodes[&leader]
        .member
        .read_entries(acked[0].0, last + 1)
        .unwrap()
        .into_iter()
        .filter_map(|(i, d)| d.map(|d| (i, d.to_vec())))
        .collect();
    assert_eq!(got, acked);
    for n in nodes.into_values() {
        n.kill();
    }
}
