//! `raftmq bench restart`: how long a node holding a large log takes from start to ready, with
//! its restart images and without them.
//!
//! A local cluster's log is filled with `--mb` MiB of messages (each with a client message id,
//! as RocketMQ 5 clients send them, so the id index is part of what a restart must rebuild).
//! Once every node has applied it, a follower is SIGKILLed and started again twice:
//! 1. on its data as it is: it loads its restart images and re-applies only the log after the
//!    newest one;
//! 2. with its images deleted: it re-applies its whole retained log;
//! 3. with its images and its sealed segments' index files deleted: recovery also reads and
//!    checks every record first (what every restart did before either).
//!
//! Each time the bench waits until the node has applied everything the leader had committed and
//! is ready (the health service's readiness), printing its progress every half second, and
//! reports the time from the start of the process. With `--cold` it drops the OS page cache
//! before each start (root only), as after a reboot.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use raftmq_client::Admin;
use serde_json::json;
use tokio::time::Instant;

use crate::commands::bench::{StealMeter, live_leader, steal_line};
use crate::commands::catchup::{dir_bytes, fill_log, local_with_bench_topic, status_of};
use crate::local_cluster::LocalCluster;
use crate::output::{json_line, table};

pub struct RestartArgs {
    pub mb: u64,
    pub size: usize,
    pub cold: bool,
    pub timeout_secs: u64,
}

/// What the node's log says it loaded at start (the raft-log crate's line).
const LOADED: &str = "state loaded from restart images";

/// One start of the follower.
struct Start {
    how: &'static str,
    images_mb: f64,
    answered: Option<Duration>,
    ready: Option<Duration>,
    /// The node's own line on what it loaded, if it loaded images.
    loaded: Option<String>,
}

/// Drops the OS page cache (clean pages only, after a sync): the next reads come from the disk.
fn drop_page_cache() -> Result<()> {
    std::process::Command::new("sync")
        .status()
        .context("sync")?;
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .context("dropping the page cache (--cold needs root)")
}

/// Starts node `id` and waits until it is ready with `target` applied.
async fn start_once(
    cluster: &mut LocalCluster,
    admin: &Admin,
    id: u64,
    target: u64,
    how: &'static str,
    cold: bool,
    timeout: Duration,
) -> Result<Start> {
    let images_mb = dir_bytes(&cluster.data_dir(id).join("sm/restart")) as f64 / 1e6;
    let log_before = std::fs::read_to_string(cluster.log_path(id)).unwrap_or_default();
    if cold {
        drop_page_cache()?;
    }
    eprintln!("starting node {id} ({how}); it must apply index {target}");
    let t0 = Instant::now();
    cluster.spawn(id)?;
    let mut answered = None;
    let mut ready = None;
    let mut next_line = t0;
    while t0.elapsed() < timeout {
        cluster.check_children()?;
        let st = status_of(admin, cluster, id).await;
        if st.is_some() && answered.is_none() {
            answered = Some(t0.elapsed());
        }
        let applied = st.as_ref().map_or(0, |s| s.applied);
        if st.as_ref().is_some_and(|s| s.ready && s.applied >= target) {
            ready = Some(t0.elapsed());
            break;
        }
        if Instant::now() >= next_line {
            eprintln!(
                "  {:>6.1} s  node {id} {}",
                t0.elapsed().as_secs_f64(),
                match &st {
                    None => "not answering yet (loading and re-applying)".to_string(),
                    Some(_) => format!(
                        "applied {applied} of {target} ({:.1} %)",
                        applied as f64 * 100.0 / target.max(1) as f64
                    ),
                }
            );
            next_line += Duration::from_millis(500);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = std::fs::read_to_string(cluster.log_path(id)).unwrap_or_default();
    let loaded = log
        .get(log_before.len()..)
        .unwrap_or_default()
        .lines()
        .find(|l| l.contains(LOADED))
        .map(|l| {
            // The fields after the message: images=… index=… bytes=… ms=…
            l.split(LOADED)
                .nth(1)
                .unwrap_or_default()
                .split_whitespace()
                .filter(|w| w.contains('='))
                .collect::<Vec<_>>()
                .join(" ")
        });
    Ok(Start {
        how,
        images_mb,
        answered,
        ready,
        loaded,
    })
}

pub async fn run(json: bool, args: RestartArgs) -> Result<()> {
    let (mut cluster, ns, admin) = local_with_bench_topic().await?;
    let steal = StealMeter::start();
    eprint!("filling the log: ");
    let fill = fill_log(&ns, args.mb, args.size, true).await?;
    let (leader, _) = live_leader(&cluster, &admin)
        .await
        .context("no leader in the local cluster")?;
    let target = status_of(&admin, &cluster, leader)
        .await
        .context("the leader stopped answering")?
        .committed;
    let follower = cluster
        .nodes
        .keys()
        .copied()
        .find(|id| *id != leader)
        .context("no follower")?;
    let data_dir = cluster.data_dir(follower);
    // Every node has applied the fill (and so written its images) before the first kill.
    let until = Instant::now() + Duration::from_secs(args.timeout_secs);
    loop {
        let st = cluster.statuses(&admin).await;
        if st
            .iter()
            .all(|(_, s)| s.as_ref().is_some_and(|s| s.applied >= target))
        {
            break;
        }
        if Instant::now() > until {
            bail!("the nodes did not all apply index {target}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The writer thread writes an image a moment after apply asks for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log_gb = dir_bytes(&data_dir.join("log")) as f64 / 1e9;
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut starts = Vec::new();
    // (how, delete the images, delete the sealed segments' index files): the last is every
    // restart as it was before either (recovery reads every record, then the log is re-applied).
    let ways = [
        ("from its restart images", false, false),
        ("images deleted: re-applying the whole log", true, false),
        ("images and segment index files deleted", true, true),
    ];
    let images = data_dir.join("sm/restart");
    for (how, no_images, no_index) in ways {
        cluster.kill(follower)?;
        if no_images && images.exists() {
            std::fs::remove_dir_all(&images)
                .with_context(|| format!("deleting {}", images.display()))?;
        }
        if no_index {
            for e in std::fs::read_dir(data_dir.join("log"))? {
                let p = e?.path();
                if p.extension().is_some_and(|x| x == "idx") {
                    std::fs::remove_file(&p)
                        .with_context(|| format!("deleting {}", p.display()))?;
                }
            }
        }
        let start = start_once(
            &mut cluster,
            &admin,
            follower,
            target,
            how,
            args.cold,
            timeout,
        );
        starts.push(start.await?);
    }
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    let cpu_steal_pct = steal.pct();
    if json {
        for s in &starts {
            println!(
                "{}",
                json_line(&json!({
                    "bench": "restart", "how": s.how, "mb": args.mb, "size": args.size,
                    "cold": args.cold, "log_gb": log_gb, "target_index": target,
                    "images_mb": s.images_mb,
                    "answered_seconds": secs(s.answered),
                    "ready_seconds": secs(s.ready),
                    "loaded": s.loaded,
                    "fill_msgs_per_sec": fill.acked as f64 / fill.elapsed.as_secs_f64(),
                    "cpu_steal_pct": cpu_steal_pct,
                }))
            );
        }
    } else {
        let rows: Vec<Vec<String>> = starts
            .iter()
            .map(|s| {
                vec![
                    s.how.to_string(),
                    format!("{log_gb:.2} GB"),
                    format!("{:.0} MB", s.images_mb),
                    s.answered
                        .map_or("no".into(), |d| format!("{:.2} s", d.as_secs_f64())),
                    s.ready
                        .map_or("NO".into(), |d| format!("{:.2} s", d.as_secs_f64())),
                    s.loaded.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        println!(
            "{}",
            table(
                &["start", "log", "images", "answers", "ready", "loaded"],
                &rows
            )
        );
        if let Some(steal) = cpu_steal_pct {
            println!("{}", steal_line(steal));
        }
    }
    if let Some(s) = starts.iter().find(|s| s.ready.is_none()) {
        bail!(
            "node {follower} was not ready within {} s ({})",
            args.timeout_secs,
            s.how
        );
    }
    Ok(())
}
