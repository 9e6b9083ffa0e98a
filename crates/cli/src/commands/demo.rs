//! `raftmq demo`: a local cluster as real processes, continuous produce, a SIGKILL of the leader
//! with the election watched live, the old leader restarted and rejoining as follower, everything
//! read back, and a summary. Exit status 0 only if nothing acknowledged was lost.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use raftmq_client::{Admin, Producer};
use tokio::time::Instant;

use crate::args::DemoArgs;
use crate::commands::bench::live_leader;
use crate::connect::Target;
use crate::load::{Load, verify};
use crate::local_cluster::{LocalCluster, LocalClusterOptions};
use crate::output::{status_table, table};

const TOPIC: &str = "demo";

/// Prints a line prefixed by the seconds since the demo started.
struct Narrator {
    start: Instant,
}

impl Narrator {
    fn say(&self, text: &str) {
        println!("[{:>5.1}s] {text}", self.start.elapsed().as_secs_f64());
    }

    async fn table(&self, admin: &Admin) {
        match admin.cluster_status().await {
            Ok(s) => println!("\n{}", status_table(&s)),
            Err(e) => self.say(&format!("(cannot read the cluster status: {e})")),
        }
    }
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let n = Narrator {
        start: Instant::now(),
    };
    n.say("starting a nameserver and a three-node broker group as real processes");
    let mut cluster = LocalCluster::start(LocalClusterOptions {
        keep_dir: args.keep_dir,
        ..Default::default()
    })
    .await?;
    let ns = cluster.nameserver.clone();
    n.say(&format!(
        "nameserver {ns}; nodes {}; data and logs in {}",
        cluster
            .nodes
            .values()
            .map(|x| format!("{}={}", x.node_id, x.addr))
            .collect::<Vec<_>>()
            .join(" "),
        cluster.dir().display()
    ));
    let admin = Admin::connect(&ns)?;
    admin.create_topic(TOPIC, 4, None).await?;
    n.say("created topic demo (4 queues); producing continuously with 4 senders");

    let producer = Arc::new(
        Producer::builder(&ns)
            .send_timeout(Duration::from_secs(20))
            .build()?,
    );
    let load = Load::start(producer.clone(), TOPIC, "demo", 4, 64);
    tokio::time::sleep(Duration::from_secs(2)).await;
    n.say(&format!("{} messages acknowledged so far", load.acked()));
    n.table(&admin).await;

    let Some((leader, old_term)) = live_leader(&cluster, &admin).await else {
        bail!("no leader to kill");
    };
    let before: HashMap<u64, (String, u64)> = cluster
        .statuses(&admin)
        .await
        .into_iter()
        .map(|(id, s)| (id, s.map_or(("down".into(), 0), |s| (s.role, s.term))))
        .collect();
    n.say(&format!(
        "SIGKILL the leader, node {leader} (term {old_term})"
    ));
    let killed_at = Instant::now();
    cluster.kill(leader)?;
    let (election, outage) =
        watch_election(&n, &cluster, &admin, &load, (killed_at, old_term), before).await?;
    n.table(&admin).await;

    n.say(&format!("restarting node {leader} on its data directory"));
    let restarted_at = Instant::now();
    cluster.restart(leader)?;
    let rejoin = watch_rejoin(&n, &mut cluster, &admin, leader, restarted_at).await?;
    n.table(&admin).await;

    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = load.stop().await;
    if let Ok(p) = Arc::try_unwrap(producer) {
        p.close().await;
    }
    n.say(&format!(
        "stopped producing: {} acknowledged, {} failed{}",
        log.acks.len(),
        log.failed,
        log.first_error
            .as_ref()
            .map_or(String::new(), |e| format!(" (first failure: {e})"))
    ));
    n.say("reading everything back with a fresh consumer group");
    let acked: HashSet<String> = log.acks.iter().map(|a| a.body.clone()).collect();
    let report = verify(
        &Target::plaintext(&ns),
        TOPIC,
        &acked,
        Duration::from_secs(10),
    )
    .await?;

    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let rows = vec![
        vec!["election time (kill → new leader)".into(), ms(election)],
        vec!["outage (kill → first acknowledged send)".into(), ms(outage)],
        vec!["rejoin (restart → caught-up follower)".into(), ms(rejoin)],
        vec!["messages acknowledged".into(), report.acked.to_string()],
        vec!["sends failed".into(), log.failed.to_string()],
        vec!["messages consumed".into(), report.consumed.to_string()],
        vec!["duplicates read".into(), report.duplicates.to_string()],
        vec![
            "stored without acknowledgement".into(),
            report.unacknowledged_stored.to_string(),
        ],
        vec!["acknowledged but lost".into(), report.lost.to_string()],
        vec![
            "total time".into(),
            format!("{:.1} s", n.start.elapsed().as_secs_f64()),
        ],
    ];
    println!("\nsummary\n{}", table(&["WHAT", "VALUE"], &rows));
    drop(cluster);
    if report.lost > 0 {
        bail!("{} acknowledged messages were lost", report.lost);
    }
    println!("nothing acknowledged was lost.");
    Ok(())
}

/// Prints every role or term change until a new leader is elected and a send started after the
/// kill is acknowledged. Returns (election time, outage).
async fn watch_election(
    n: &Narrator,
    cluster: &LocalCluster,
    admin: &Admin,
    load: &Load,
    (killed_at, old_term): (Instant, u64),
    mut seen: HashMap<u64, (String, u64)>,
) -> Result<(Duration, Duration)> {
    let (mut election, mut outage) = (None, None);
    let deadline = killed_at + Duration::from_secs(20);
    while election.is_none() || outage.is_none() {
        if Instant::now() > deadline {
            bail!("no new leader and acknowledged send within 20 s of the kill");
        }
        let at = killed_at.elapsed();
        for (id, s) in cluster.statuses(admin).await {
            let now = s
                .as_ref()
                .map_or(("down".to_string(), 0), |s| (s.role.clone(), s.term));
            if seen.get(&id) != Some(&now) {
                let before = seen.get(&id).map_or("-".to_string(), |b| b.0.clone());
                let term = if now.0 == "down" {
                    String::new()
                } else {
                    format!(" (term {})", now.1)
                };
                n.say(&format!(
                    "  +{:>4} ms  node {id}: {before} → {}{term}",
                    at.as_millis(),
                    now.0
                ));
                if election.is_none() && now.0 == "leader" && now.1 > old_term {
                    election = Some(at);
                }
                seen.insert(id, now);
            }
        }
        if outage.is_none()
            && let Some(t) = load.first_ack_started_after(killed_at)
        {
            let d = t.duration_since(killed_at);
            n.say(&format!(
                "  +{:>4} ms  first send after the kill acknowledged",
                d.as_millis()
            ));
            outage = Some(d);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((election.unwrap_or_default(), outage.unwrap_or_default()))
}

/// Waits until the restarted node follows the current leader (same term) and has applied all
/// the leader had committed when the node came back, printing its state changes. Returns the
/// time since the restart.
async fn watch_rejoin(
    n: &Narrator,
    cluster: &mut LocalCluster,
    admin: &Admin,
    node: u64,
    restarted_at: Instant,
) -> Result<Duration> {
    let mut last: Option<String> = Some("down".into());
    let deadline = restarted_at + Duration::from_secs(30);
    // The leader's commit index when the node came back: what it must have to be caught up (the
    // commit index itself moves on while the demo produces).
    let mut target: Option<u64> = None;
    loop {
        cluster.check_children()?;
        let statuses = cluster.statuses(admin).await;
        let leader = statuses
            .iter()
            .filter_map(|(_, s)| s.as_ref())
            .filter(|s| s.role == "leader")
            .map(|s| (s.term, s.committed))
            .max();
        if target.is_none() {
            target = leader.map(|(_, committed)| committed);
        }
        if let Some((_, Some(s))) = statuses.iter().find(|(id, _)| *id == node) {
            let state = format!("{} (term {})", s.role, s.term);
            if last.as_deref() != Some(state.as_str()) {
                n.say(&format!(
                    "  +{:>4} ms  node {node}: {} → {state}, applied {}",
                    restarted_at.elapsed().as_millis(),
                    last.as_deref().unwrap_or("-"),
                    s.applied
                ));
                last = Some(state);
            }
            if s.role == "follower"
                && let Some((leader_term, _)) = leader
                && s.term == leader_term
                && let Some(t) = target
                && s.applied >= t
            {
                let d = restarted_at.elapsed();
                n.say(&format!(
                    "  +{:>4} ms  node {node} caught up: follows the term-{leader_term} leader, \
                     applied {} (the leader had committed {t} when node {node} restarted)",
                    d.as_millis(),
                    s.applied
                ));
                return Ok(d);
            }
        }
        if Instant::now() > deadline {
            bail!("node {node} did not rejoin as a caught-up follower within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
