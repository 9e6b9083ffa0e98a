//! A broker group as an orchestrator runs it (a Kubernetes StatefulSet, a Swarm service): every
//! node gets the same settings and differs only by its pod name, the nameservers are one DNS name,
//! and a node is stopped with SIGTERM. Real processes on loopback: the three nodes listen on
//! 127.0.0.10, .11 and .12 (all of 127/8 is loopback), so one `{ordinal}` template names them.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use raftmq_cli::probe::{LeaderRule, RoleView, find_leader};
use raftmq_proto::v1::ClusterInfoRequest;
use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
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

fn pod_log(dir: &std::path::Path, ordinal: usize) -> std::path::PathBuf {
    dir.join(format!("broker-a-{ordinal}.log"))
}

/// Starts pod `ordinal` of `broker-a`: every setting the same as its siblings' but its name (and
/// the listen address a pod's own network namespace would give it for free).
fn spawn_pod(
    dir: &std::path::Path,
    ordinal: usize,
    template: &str,
    port: u16,
    ns_port: u16,
) -> Child {
    Command::new(bin("broker-node"))
        .env("RAFTMQ_POD_NAME", format!("broker-a-{ordinal}"))
        .env("RAFTMQ_PEER_TEMPLATE", template)
        .env("RAFTMQ_GROUP_SIZE", "3")
        .env("RAFTMQ_LISTEN", format!("127.0.0.1{ordinal}:{port}"))
        .env("RAFTMQ_NAMESERVERS", format!("dns:localhost:{ns_port}"))
        .env("RAFTMQ_REGISTER_INTERVAL_MS", "500")
        .env("RAFTMQ_DATA_DIR", dir.join(format!("data-{ordinal}")))
        .env("RUST_LOG", "info,openraft=warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(pod_log(dir, ordinal)).unwrap())
        .spawn()
        .unwrap()
}

async fn role(addr: &str) -> Option<RoleView> {
    status(addr).await.as_ref().map(RoleView::from)
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
    let log = |ordinal: usize| pod_log(dir.path(), ordinal);
    for ordinal in 0..3 {
        procs.0.push(Some(spawn_pod(
            dir.path(),
            ordinal,
            &template,
            port,
            ns_port,
        )));
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

async fn status(addr: &str) -> Option<raftmq_proto::v1::NodeStatusResponse> {
    raftmq_tests::node_status(addr).await
}

/// 72. A rolling upgrade's guard: while one member of the group has never been heard from (as a
///     member still on an old build counts), a command newer than the first release (creating a
///     consumer group) is refused with UNAVAILABLE naming that member, and produce goes on; once
///     the member answers with its feature level, the same command is accepted, and every node's
///     status shows the group's level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t72_a_new_command_waits_until_every_member_can_apply_it() {
    use raftmq_proto::v1::{CreateGroupRequest, ErrorCode, GroupConfig};
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ns_port = free_port(); // no nameserver listens: registration is not under test here
    let template = format!("127.0.0.1{{ordinal}}:{port}");
    let addr = |ordinal: usize| format!("127.0.0.1{ordinal}:{port}");
    // Members 1 and 2 of a three-member group: a quorum, while member 3 has never started.
    let mut procs = Procs(
        (0..2)
            .map(|o| Some(spawn_pod(dir.path(), o, &template, port, ns_port)))
            .collect(),
    );
    let leader = wait_for(
        "a leader of members 1 and 2",
        Duration::from_secs(30),
        || async {
            let v = vec![(1, role(&addr(0)).await), (2, role(&addr(1)).await)];
            find_leader(&v, LeaderRule::Agreed)
        },
    )
    .await;
    let leader_addr = addr((leader.node_id - 1) as usize);
    let mut client = raftmq_tests::connect(&leader_addr).await;
    let create = || CreateGroupRequest {
        group: Some(GroupConfig {
            name: "orders".into(),
            ..Default::default()
        }),
        update: false,
    };
    let refused = client.create_group(create()).await.unwrap().into_inner();
    let e = refused
        .error
        .expect("refused while member 3 was never heard from");
    assert_eq!(e.code, ErrorCode::Unavailable as i32, "{e:?}");
    assert!(
        e.message.contains("node 3") && e.message.contains("upgrad"),
        "names the member to upgrade: {}",
        e.message
    );
    let st = status(&leader_addr).await.unwrap();
    assert_eq!(st.group_command_tags, 5, "the first release's level");
    assert!(st.command_tags > 5);
    // The first release's commands are not held back: a topic is created and written to.
    let t = client
        .create_topic(raftmq_proto::v1::CreateTopicRequest {
            name: "t".into(),
            queues: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(raftmq_tests::code(&t.error), ErrorCode::Ok, "{:?}", t.error);
    let sent = client
        .send(raftmq_tests::send_request(
            1,
            1,
            "t",
            0,
            vec![b"x".to_vec()],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        raftmq_tests::code(&sent.error),
        ErrorCode::Ok,
        "{:?}",
        sent.error
    );

    procs
        .0
        .push(Some(spawn_pod(dir.path(), 2, &template, port, ns_port)));
    let created = wait_for(
        "the group created once member 3 answers",
        Duration::from_secs(30),
        || {
            let mut c = client.clone();
            async move {
                let r = c
                    .create_group(create())
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                match r.error {
                    Some(e) if e.code != 0 => Err(e.message),
                    _ => Ok(r.group),
                }
            }
        },
    )
    .await;
    assert_eq!(created.map(|g| g.name).as_deref(), Some("orders"));
    for o in 0..3 {
        let a = addr(o);
        let st = wait_for(
            "every node knows every member's level",
            Duration::from_secs(15),
            || {
                let a = a.clone();
                async move {
                    let st = status(&a).await.ok_or("no answer")?;
                    if st.group_command_tags == st.command_tags {
                        Ok(st)
                    } else {
                        Err(format!(
                            "group level {} of {}",
                            st.group_command_tags, st.command_tags
                        ))
                    }
                }
            },
        )
        .await;
        assert!(st.command_tags > 5);
    }
    assert!(
        std::fs::read_to_string(dir.path().join("data-0/member-features"))
            .unwrap()
            .lines()
            .count()
            >= 2,
        "what node 1 learnt is kept for a later leader"
    );
}
