//! `raftmq bench catchup`: how fast a follower of a local cluster catches up, and what it costs
//! the producers meanwhile.
//!
//! A follower is SIGKILLed (and with `--mode wipe` its data directory deleted), `--mb` megabytes
//! are produced without it, and it is started again with the same command line. Until it holds
//! everything the leader had committed when it restarted, the bench prints its progress every
//! half second; then it reports the catch-up time and rate (bytes of log the follower wrote over
//! the time), and the terms seen (a healthy leader must not be deposed). With `--load`, senders
//! keep producing throughout; their rate before the kill and during the catch-up is compared.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use raftmq_client::{Admin, NodeStatusResponse};
use serde_json::json;
use tokio::time::Instant;

use crate::args::CatchupMode;
use crate::commands::bench::{ProduceShape, StealMeter, live_leader, produce, steal_line};
use crate::connect::Target;
use crate::load::Load;
use crate::local_cluster::{LocalCluster, LocalClusterOptions};
use crate::output::{json_line, table};

pub struct CatchupArgs {
    pub mode: CatchupMode,
    pub mb: u64,
    pub size: usize,
    pub load: bool,
    pub load_senders: usize,
    pub baseline_secs: u64,
    pub timeout_secs: u64,
}

/// Bytes of the files under `dir` (0 when it does not exist); the integration tests measure what a
/// catch-up wrote with it too.
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The topic the local-cluster benches fill (8 queues).
pub const BENCH_TOPIC: &str = "bench";

/// A default local cluster with topic [`BENCH_TOPIC`] made: the cluster, its nameserver as a
/// target, and an admin client.
pub async fn local_with_bench_topic() -> Result<(LocalCluster, Target, Admin)> {
    eprintln!("starting a local cluster");
    let cluster = LocalCluster::start(LocalClusterOptions::default()).await?;
    let ns = Target::plaintext(&cluster.nameserver);
    let admin = ns.admin()?;
    admin
        .create_topic(BENCH_TOPIC, 8, None)
        .await
        .with_context(|| format!("creating topic {BENCH_TOPIC}"))?;
    Ok((cluster, ns, admin))
}

/// Produces `mb` MiB of `size`-byte messages (with client ids when `ids`) to [`BENCH_TOPIC`],
/// 256 in flight, with progress; an error when any send failed.
pub(crate) async fn fill_log(
    ns: &Target,
    mb: u64,
    size: usize,
    ids: bool,
) -> Result<crate::commands::bench::ProduceRun> {
    let count = (mb << 20) / size.max(1) as u64;
    eprintln!(
        "{mb} MiB ({count} messages of {size} B{})",
        if ids {
            ", each with a client message id"
        } else {
            ""
        }
    );
    let shape = ProduceShape {
        inflight: 256,
        ids,
        ..Default::default()
    };
    let fill = produce(ns, BENCH_TOPIC, count, size, shape, true).await?;
    if fill.failed > 0 {
        bail!(
            "{} sends failed while filling the log: {}",
            fill.failed,
            fill.first_error.unwrap_or_default()
        );
    }
    Ok(fill)
}

/// Node `id`'s status, if it answers.
pub(crate) async fn status_of(
    admin: &Admin,
    cluster: &LocalCluster,
    id: u64,
) -> Option<NodeStatusResponse> {
    cluster
        .statuses(admin)
        .await
        .into_iter()
        .find(|(n, _)| *n == id)
        .and_then(|(_, s)| s)
}

/// A progress line's note of the follower's catch-up (progress and rate), empty when it is not
/// catching up or did not answer.
fn catch_up_shown(st: Option<&NodeStatusResponse>) -> String {
    st.and_then(|s| s.catch_up.as_ref())
        .map_or_else(String::new, |c| {
            format!("  [{}]", crate::output::catch_up_words(c))
        })
}

/// Messages the load acknowledged over `d` from now.
async fn load_rate(load: &Load, d: Duration) -> f64 {
    let a0 = load.acked();
    let t0 = Instant::now();
    tokio::time::sleep(d).await;
    (load.acked() - a0) as f64 / t0.elapsed().as_secs_f64()
}

pub async fn run(json: bool, args: CatchupArgs) -> Result<()> {
    let mode = args.mode.as_str();
    let (mut cluster, ns, admin) = local_with_bench_topic().await?;
    let topic = BENCH_TOPIC;
    let steal = StealMeter::start();
    let (leader, term_before) = live_leader(&cluster, &admin)
        .await
        .context("no leader in the local cluster")?;
    let follower = cluster
        .nodes
        .keys()
        .copied()
        .find(|id| *id != leader)
        .context("no follower")?;
    let data_dir = cluster.data_dir(follower);

    let load_producer = Arc::new(ns.producer().build()?);
    let load = args.load.then(|| {
        Load::start(
            load_producer.clone(),
            topic,
            "load",
            args.load_senders,
            args.size,
        )
    });
    let baseline = match &load {
        Some(l) => {
            eprintln!(
                "load: {} senders of {} B; measuring their rate for {} s with every node up",
                args.load_senders, args.size, args.baseline_secs
            );
            Some(load_rate(l, Duration::from_secs(args.baseline_secs)).await)
        }
        None => None,
    };

    eprintln!("node {follower} (a follower of leader {leader}) SIGKILLed");
    cluster.kill(follower)?;
    if args.mode == CatchupMode::Wipe {
        std::fs::remove_dir_all(&data_dir)
            .with_context(|| format!("wiping {}", data_dir.display()))?;
        eprintln!("node {follower}'s data directory deleted");
    }
    eprint!("producing without it: ");
    let fill = fill_log(&ns, args.mb, args.size, false).await?;
    let leader_st = status_of(&admin, &cluster, leader)
        .await
        .context("the leader stopped answering")?;
    let target = leader_st.committed;
    let bytes_before = dir_bytes(&data_dir.join("log"));
    eprintln!("restarting node {follower}; it must reach index {target}");
    let acked_before = load.as_ref().map_or(0, |l| l.acked());
    let t0 = Instant::now();
    cluster.restart(follower)?;
    let deadline = t0 + Duration::from_secs(args.timeout_secs);
    let mut max_term = term_before;
    let mut leaders = std::collections::BTreeSet::from([leader]);
    let mut caught_up = None;
    let mut next_line = t0;
    let mut timeline = Vec::new();
    loop {
        cluster.check_children()?;
        for (_, s) in cluster.statuses(&admin).await {
            if let Some(s) = s {
                max_term = max_term.max(s.term);
                if s.role == "leader" {
                    leaders.insert(s.node_id);
                }
            }
        }
        let st = status_of(&admin, &cluster, follower).await;
        let at = st.as_ref().map_or(0, |s| s.last_log_index);
        if at >= target {
            caught_up = Some(t0.elapsed());
            break;
        }
        if Instant::now() >= next_line {
            let secs = t0.elapsed().as_secs_f64();
            let mb = dir_bytes(&data_dir.join("log")).saturating_sub(bytes_before) as f64 / 1e6;
            let shown = catch_up_shown(st.as_ref());
            eprintln!(
                "  {secs:>6.1} s  node {follower} at {at:>7} of {target} ({:>5.1} %)  {mb:>8.0} MB written  term {max_term}{shown}",
                at as f64 * 100.0 / target.max(1) as f64,
            );
            timeline.push((secs, at, mb));
            next_line += Duration::from_millis(500);
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = caught_up.unwrap_or_else(|| t0.elapsed());
    let acked_during = load.as_ref().map_or(0, |l| l.acked()) - acked_before;
    let bytes = dir_bytes(&data_dir.join("log")).saturating_sub(bytes_before);
    // Ready: the health service's readiness (leader known, caught up with what it commits now).
    // Under a load the leader's commit index moves on while the follower closes the gap, so this
    // can come well after it held the index it was restarted for; wait for it within the same
    // timeout, showing how far the follower is from what the leader commits now.
    let ready_at = if caught_up.is_some() {
        let mut next_line = Instant::now() + Duration::from_secs(1);
        loop {
            let st = status_of(&admin, &cluster, follower).await;
            if st.as_ref().is_some_and(|s| s.ready) {
                break Some(t0.elapsed());
            }
            if Instant::now() > deadline {
                break None;
            }
            if Instant::now() >= next_line {
                let shown = catch_up_shown(st.as_ref());
                eprintln!(
                    "  {:>6.1} s  node {follower} at {:>7}, not ready yet{shown}",
                    t0.elapsed().as_secs_f64(),
                    st.as_ref().map_or(0, |s| s.last_log_index),
                );
                next_line += Duration::from_secs(1);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    } else {
        None
    };
    let load_log = match load {
        Some(l) => Some(l.stop().await),
        None => None,
    };
    if let Ok(p) = Arc::try_unwrap(load_producer) {
        p.close().await;
    }
    let secs = elapsed.as_secs_f64();
    let mb_per_sec = bytes as f64 / 1e6 / secs.max(1e-9);
    let during = (load_log.is_some()).then(|| acked_during as f64 / secs.max(1e-9));
    let ratio = baseline.zip(during).map(|(b, d)| d / b.max(1e-9));
    let cpu_steal_pct = steal.pct();
    if json {
        println!(
            "{}",
            json_line(&json!({
                "bench": "catchup", "mode": mode, "mb": args.mb, "size": args.size,
                "follower": follower, "target_index": target,
                "caught_up": caught_up.is_some(), "seconds": secs,
                "bytes": bytes, "mb_per_sec": mb_per_sec,
                "ready_seconds": ready_at.map(|d| d.as_secs_f64()),
                "term_before": term_before, "term_after": max_term,
                "leaders_seen": leaders.iter().collect::<Vec<_>>(),
                "fill_msgs_per_sec": fill.acked as f64 / fill.elapsed.as_secs_f64(),
                "load_baseline_msgs_per_sec": baseline,
                "load_during_msgs_per_sec": during,
                "load_ratio": ratio,
                "load_failed": load_log.as_ref().map(|l| l.failed),
                "cpu_steal_pct": cpu_steal_pct,
            }))
        );
    } else {
        let mut rows = vec![
            vec!["mode".into(), mode.to_string()],
            vec![
                "caught up".into(),
                match caught_up {
                    Some(d) => format!("{:.1} s (index {target})", d.as_secs_f64()),
                    None => format!("NO, after {secs:.1} s"),
                },
            ],
            vec![
                "written by the follower".into(),
                format!("{:.0} MB, {mb_per_sec:.0} MB/s", bytes as f64 / 1e6),
            ],
            vec![
                "ready".into(),
                ready_at.map_or_else(
                    || format!("NO within {} s", args.timeout_secs),
                    |d| format!("{:.1} s", d.as_secs_f64()),
                ),
            ],
            vec![
                "term".into(),
                format!(
                    "{term_before} -> {max_term}{}",
                    if max_term == term_before {
                        " (no election)"
                    } else {
                        " (ELECTION)"
                    }
                ),
            ],
        ];
        if let (Some(b), Some(d), Some(r)) = (baseline, during, ratio) {
            rows.push(vec![
                "load".into(),
                format!(
                    "{b:.0} msg/s before, {d:.0} msg/s during the catch-up ({:.0} %)",
                    r * 100.0
                ),
            ]);
        }
        println!("{}", table(&["catch-up", "figure"], &rows));
        if let Some(steal) = cpu_steal_pct {
            println!("{}", steal_line(steal));
        }
    }
    if let Some(l) = &load_log
        && l.failed > 0
    {
        bail!(
            "{} load sends failed: {}",
            l.failed,
            l.first_error.clone().unwrap_or_default()
        );
    }
    if caught_up.is_none() {
        bail!(
            "node {follower} did not catch up within {} s",
            args.timeout_secs
        );
    }
    Ok(())
}
