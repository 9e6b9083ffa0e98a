//! A broker group as an orchestrator runs it (a Kubernetes StatefulSet, a Swarm service): every
//! node gets the same settings and differs only by its pod name, the nameservers are one DNS name,
//! and a node is stopped with SIGTERM. Real processes on loopback: the three nodes listen on
//! 127.0.0.10, .11 and .12 (all of 127/8 is loopback), so one `{ordinal}` template names them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use raftmq_cli::probe::{LeaderRule, RoleView, find_leader};
use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
use raftmq_proto::v1::{ClusterInfoRequest, NodeStatusRequest};
use raftmq_tests::{bin, free_port, wait_for};

struct Procs(Vec<Option<Child>>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn role(addr: &str) -> Option<RoleView> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .ok()?;
    raftmq_proto::v1::broker_service_client::BrokerServiceClient::new(ch)
        .node_status(NodeStatusRequest {})
        .await
        .ok()
        .map(|r| RoleView::from(&r.into_inner()))
}

/// 71. Three nodes started with only `RAFTMQ_POD_NAME` different find their ids, peers and
///     addresses, register through a `dns:` nameserver entry, and a leader stopped with SIGTERM
///     hands leadership to a follower before it exits (status 0, no election timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t71_pods_find_their_identity_and_a_stopping_leader_hands_over() {
    let dir = tempfile::tempdir().unwrap();
    let (ns_port, port) = (free_port(), free_port());
    let ns_log = std::fs::File::create(dir.path().join("nameserver.log")).unwrap();
    let nameserver = Command::new(bin("nameserver"))
        .args(["--listen", &format!("127.0.0.1:{ns_port}")])
        .args(["--expiry-secs", "3", "--scan-interval-ms", "500"])
        .stdout(Stdio::null())
        .stderr(ns_log)
        .spawn()
        .unwrap();
    let mut procs = Procs(vec![Some(nameserver)]);
    let template = format!("127.0.0.1{{ordinal}}:{port}");
    let addr = |ordinal: usize| format!("127.0.0.1{ordinal}:{port}");
    let log = |ordinal: usize| dir.path().join(format!("broker-a-{ordinal}.log"));
    for ordinal in 0..3 {
        let child = Command::new(bin("broker-node"))
            // The same settings for every pod but its name; the listen address is the one thing
            // a pod's network namespace would give it for free.
            .env("RAFTMQ_POD_NAME", format!("broker-a-{ordinal}"))
            .env("RAFTMQ_PEER_TEMPLATE", &template)
            .env("RAFTMQ_GROUP_SIZE", "3")
            .env("RAFTMQ_LISTEN", addr(ordinal))
            .env("RAFTMQ_NAMESERVERS", format!("dns:localhost:{ns_port}"))
            .env("RAFTMQ_REGISTER_INTERVAL_MS", "500")
            .env(
                "RAFTMQ_DATA_DIR",
                dir.path().join(format!("data-{ordinal}")),
            )
            .env("RUST_LOG", "info,openraft=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log(ordinal)).unwrap())
            .spawn()
            .unwrap();
        procs.0.push(Some(child));
    }
    let addrs: Vec<String> = (0..3).map(addr).collect();

    let views = |live: Vec<usize>| {
        let addrs = addrs.clone();
        async move {
            let mut v = Vec::new();
            for o in live {
                v.push((o as u64 + 1, role(&addrs[o]).await));
            }
            v
        }
    };
    let leader = wait_for(
        "a leader agreed by the three pods",
        Duration::from_secs(30),
        || {
            let v = views(vec![0, 1, 2]);
            async move { find_leader(&v.await, LeaderRule::Agreed) }
        },
    )
    .await;
    assert!((1..=3).contains(&leader.node_id), "ids are ordinal + 1");

    // Every node registered with the nameserver found through `dns:localhost:PORT`, each under
    // the address its template gives it.
    let mut ns = NameserverServiceClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{ns_port}"))
            .unwrap()
            .connect_lazy(),
    );
    let registered = wait_for(
        "the three pods registered through the dns: entry",
        Duration::from_secs(20),
        || {
            let mut ns = ns.clone();
            async move {
                let info = ns
                    .get_cluster_info(ClusterInfoRequest::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                let mut nodes: Vec<(u64, String)> = info
                    .clusters
                    .iter()
                    .flat_map(|c| &c.brokers)
                    .filter(|b| b.name == "broker-a")
                    .flat_map(|b| &b.nodes)
                    .map(|n| (n.node_id, n.address.clone()))
                    .collect();
                nodes.sort();
                if nodes.len() == 3 {
                    Ok(nodes)
                } else {
                    Err(format!("registered so far: {nodes:?}"))
                }
            }
        },
    )
    .await;
    let want: Vec<(u64, String)> = (0..3).map(|o| (o as u64 + 1, addr(o))).collect();
    assert_eq!(registered, want);
    let _ = ns.get_cluster_info(ClusterInfoRequest::default()).await;

    // SIGTERM the leader: it hands over, then exits cleanly.
    let old = (leader.node_id - 1) as usize;
    let pid = procs.0[old + 1].as_ref().unwrap().id();
    let t0 = Instant::now();
    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let survivors: Vec<usize> = (0..3).filter(|o| *o != old).collect();
    let next = wait_for(
        "a new leader among the other two",
        Duration::from_secs(10),
        || {
            let v = views(survivors.clone());
            async move { find_leader(&v.await, LeaderRule::HighestTerm) }
        },
    )
    .await;
    let took = t0.elapsed();
    assert_ne!(next.node_id, leader.node_id);
    let mut child = procs.0[old + 1].take().unwrap();
    let status = wait_for("the old leader to exit", Duration::from_secs(15), || {
        let s = child.try_wait();
        async move {
            match s {
                Ok(Some(s)) => Ok(s),
                Ok(None) => Err("still running".to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    let text = std::fs::read_to_string(log(old)).unwrap();
    assert!(status.success(), "exit status {status}; log:\n{text}");
    assert!(
        text.contains("leadership handed over"),
        "the old leader's log tells of the hand-over:\n{text}"
    );
    println!(
        "SIGTERM to node {} → node {} leads after {} ms",
        leader.node_id,
        next.node_id,
        took.as_millis()
    );
}
