//! Two nameservers and a three-node broker group of real processes: routes follow an election.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
use raftmq_proto::v1::*;
use raftmq_tests::*;

struct Ns(std::process::Child);
impl Drop for Ns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn ns_client(addr: &str) -> NameserverServiceClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(2))
        .connect_lazy();
    NameserverServiceClient::new(ch)
}

/// (leader id, node id → role) of broker-a in a nameserver's route of `topic`.
async fn route(addr: &str, topic: &str) -> Option<(Option<u64>, Vec<(u64, String)>)> {
    let r = ns_client(addr)
        .await
        .route(RouteRequest {
            topic: topic.into(),
        })
        .await
        .ok()?
        .into_inner();
    let b = r.brokers.into_iter().find(|b| b.name == "broker-a")?;
    Some((
        b.leader_id,
        b.nodes.into_iter().map(|n| (n.node_id, n.role)).collect(),
    ))
}

/// Waits up to `secs` seconds until `accept` takes the route of "routed" that nameserver `ns`
/// gives (its leader, its nodes with their roles).
async fn wait_route<T>(
    ns: &str,
    what: &str,
    secs: u64,
    accept: impl Fn(Option<u64>, &[(u64, String)]) -> Option<T>,
) -> T {
    let accept = &accept;
    wait_for(what, Duration::from_secs(secs), || async move {
        let (l, nodes) = route(ns, "routed").await?;
        accept(l, &nodes)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t41_both_nameservers_route_to_the_new_leader_and_expire_the_dead_node() {
    let mut c = Cluster::start(3, &[]).await;
    let ns2_addr = format!("127.0.0.1:{}", free_port());
    let _ns2 = Ns(Command::new(bin("nameserver"))
        .args([
            "--listen",
            &ns2_addr,
            "--expiry-secs",
            "3",
            "--scan-interval-ms",
            "500",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    // Restart every node so that it registers with both nameservers.
    let ns1_addr = c.nameserver.clone();
    c.nameserver = format!("{ns1_addr};{ns2_addr}");
    for id in 1..=3 {
        c.kill(id);
        c.spawn(id);
    }
    // Create the topic on whichever node leads once the restarts have settled.
    let leader = wait_for(
        "a leader creates the topic",
        Duration::from_secs(20),
        || async {
            let leader = c.leader().await;
            let r = c
                .client(leader)
                .await
                .create_topic(CreateTopicRequest {
                    name: "routed".into(),
                    queues: 2,
                    update: false,
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner();
            (code(&r.error) == ErrorCode::Ok).then_some(leader)
        },
    )
    .await;
    for ns in [&ns1_addr, &ns2_addr] {
        wait_route(ns, "the route names the leader", 10, |l, nodes| {
            (l == Some(leader) && nodes.len() == 3).then_some(())
        })
        .await;
    }

    c.kill(leader);
    let t = Instant::now();
    let mut seen = Vec::new();
    for ns in [&ns1_addr, &ns2_addr] {
        let new = wait_for(
            "the route names a new leader",
            Duration::from_secs(10),
            || async {
                let (l, _) = route(ns, "routed").await?;
                l.filter(|l| *l != leader)
            },
        )
        .await;
        seen.push((new, t.elapsed()));
    }
    eprintln!("routes after leader SIGKILL: {seen:?}");
    assert_eq!(
        seen[0].0, seen[1].0,
        "both nameservers agree on the new leader"
    );
    let new_leader = c.leader().await;
    assert_eq!(seen[0].0, new_leader);

    // The killed node disappears after the expiry (3 s here).
    for ns in [&ns1_addr, &ns2_addr] {
        wait_route(ns, "the dead node expires", 15, |_, nodes| {
            (!nodes.iter().any(|(id, _)| *id == leader)).then_some(())
        })
        .await;
    }
    // Restarted, it is routed as a follower.
    c.spawn(leader);
    for ns in [&ns1_addr, &ns2_addr] {
        wait_route(
            ns,
            "the restarted node is routed as follower",
            15,
            |l, nodes| {
                (l == Some(new_leader)
                    && nodes
                        .iter()
                        .any(|(id, role)| *id == leader && role == "follower"))
                .then_some(())
            },
        )
        .await;
    }
}
