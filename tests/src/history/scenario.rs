//! A round: start a group, run the workload through the planned faults, read every node back and
//! check the history.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use raftmq_proto::v1::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::check::{check, check_pop};
use super::faults::{
    FaultKind, InjectOpts, PARTITION_LONG, find_leader, inject_opts, wait_converged,
};
use super::pop::{POP_MAX_ATTEMPTS, PopCfg, create_pop_group, drain, pop_consumer_loop, read_dlq};
use super::report::{FillReport, FillStats, Report};
use super::workload::{
    FILL_SEND_BYTES, FILL_TOPIC, LargeLogCfg, NodeRead, WorkloadCfg, committer_loop, fill_log,
    producer_loop, read_fill, read_node,
};
use super::{CONVERGE_TIMEOUT, FaultEvent, History, Op, QUEUES, TOPIC, lock};
use crate::{Cluster, code};

// ---------------------------------------------------------------------------------------------
// Scenarios

#[derive(Clone, Debug)]
pub enum FaultPlan {
    Fixed(Vec<FaultKind>),
    /// `count` faults drawn (with the scenario's seed) from `kinds`.
    Random {
        count: usize,
        kinds: Vec<FaultKind>,
    },
}

#[derive(Clone, Debug)]
pub struct ScenarioCfg {
    pub seed: u64,
    pub plan: FaultPlan,
    pub workload: WorkloadCfg,
    /// Acknowledged sends awaited before the first fault and between faults (bounded by `calm`).
    pub acks_between: u64,
    pub calm: Duration,
    /// Hard bound of the load phase (which starts after the fill in large-log mode).
    pub max_duration: Duration,
    /// Large-log mode: fill the log first, wait for followers to catch up after follower faults.
    pub large_log: Option<LargeLogCfg>,
    /// POP consumers of [`TOPIC`] beside the producers, then a drain and the dead-letter topic,
    /// checked by [`check_pop`] (see [`super::pop`]). None: the round is as before.
    pub pop: Option<PopCfg>,
    /// Scheduled-message senders beside the producers, then a wait until every one is
    /// delivered, checked by [`super::delay::check_delay`]. None: the round is as before.
    pub delay: Option<super::delay::DelayCfg>,
    /// Transaction senders beside the producers, then commits of the transactions left open
    /// and a wait until none is open, checked by [`super::txn::check_txn`].
    pub txn: Option<super::txn::TxnCfg>,
}

impl ScenarioCfg {
    pub fn new(seed: u64, plan: FaultPlan) -> ScenarioCfg {
        ScenarioCfg {
            seed,
            plan,
            workload: WorkloadCfg::default(),
            acks_between: 50,
            calm: Duration::from_secs(5),
            max_duration: Duration::from_secs(600),
            large_log: None,
            pop: None,
            delay: None,
            txn: None,
        }
    }
}
/// Waits (bounded by `calm`) until `n` more sends have been acknowledged.
async fn calm(hist: &History, n: u64, calm: Duration) {
    let base = hist.acks.load(Ordering::Relaxed);
    let t = Instant::now();
    while t.elapsed() < calm && hist.acks.load(Ordering::Relaxed) < base + n {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn create_topic(c: &Cluster, name: &str) -> Result<(), String> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < CONVERGE_TIMEOUT {
        let leader = find_leader(c, CONVERGE_TIMEOUT).await?;
        match c
            .client(leader)
            .await
            .create_topic(CreateTopicRequest {
                name: name.into(),
                queues: QUEUES,
                update: false,
                ..Default::default()
            })
            .await
        {
            Ok(r) => {
                let r = r.into_inner();
                match code(&r.error) {
                    ErrorCode::Ok | ErrorCode::TopicExists => return Ok(()),
                    _ => last = format!("{:?}", r.error),
                }
            }
            Err(s) => last = s.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("create topic {name}: {last}"))
}

/// A round's outcome: the checked report (Err: the group did not converge or a follower did not
/// catch up within its bound), and the faults injected either way.
pub struct RoundOutcome {
    pub result: Result<Report, String>,
    pub faults: Vec<FaultEvent>,
}

/// Starts a three-node group with durable-length tracking (for power loss), runs the workload
/// through the planned faults, reads every node back and checks the history.
///
/// Err: the group did not converge within its bound (with the faults so far); the history check
/// itself is in the returned report.
pub async fn run_scenario(cfg: &ScenarioCfg) -> Result<Report, String> {
    run_round(cfg).await.result
}

/// As [`run_scenario`], with the faults of a round that failed too. The nodes' data dirs are
/// removed before it returns, unless the round failed and `RAFTMQ_KEEP_FAILED` is set (then the
/// report or the error names where they are).
pub async fn run_round(cfg: &ScenarioCfg) -> RoundOutcome {
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let plan: Vec<FaultKind> = match &cfg.plan {
        FaultPlan::Fixed(v) => v.clone(),
        FaultPlan::Random { count, kinds } => (0..*count)
            .map(|_| kinds[rng.random_range(0..kinds.len())])
            .collect(),
    };
    eprintln!(
        "seed {}: faults {:?}",
        cfg.seed,
        plan.iter().map(|k| k.name()).collect::<Vec<_>>()
    );
    let mut c = Cluster::start_opts(3, &[], &[("RAFTMQ_TRACK_DURABLE", "1")], true).await;
    let mut hist = None;
    let mut result = scenario(cfg, plan, &mut rng, &mut c, &mut hist).await;
    let faults = hist.map(|h| lock(&h.faults).clone()).unwrap_or_default();
    // Every node stops before its data dir goes (or is kept).
    c.kill_all();
    let failed = result.as_ref().map_or(true, |r| !r.is_ok());
    let keep = failed && std::env::var_os("RAFTMQ_KEEP_FAILED").is_some();
    match tempfile::tempdir() {
        Ok(fresh) => {
            let dir = std::mem::replace(&mut c.dir, fresh);
            let shown = dir.path().display().to_string();
            if keep {
                // The nodes' data dirs and logs, for a post-mortem.
                let kept = format!("data dirs and node logs kept in {}", dir.keep().display());
                match &mut result {
                    Ok(report) => report.excerpts.push(kept),
                    Err(e) => {
                        e.push('\n');
                        e.push_str(&kept);
                    }
                }
            } else if let Err(e) = dir.close() {
                eprintln!("WARNING: could not remove the round's data dirs {shown}: {e}");
            }
        }
        // The old dir is then removed when the cluster drops.
        Err(e) => eprintln!("WARNING: no temporary dir: {e}"),
    }
    RoundOutcome { result, faults }
}

/// The round on a started cluster; `hist_out` receives the workload's history once it exists.
async fn scenario(
    cfg: &ScenarioCfg,
    plan: Vec<FaultKind>,
    rng: &mut StdRng,
    c: &mut Cluster,
    hist_out: &mut Option<Arc<History>>,
) -> Result<Report, String> {
    create_topic(c, TOPIC).await?;
    if cfg.workload.new_batch_per_attempt {
        // Until then a leader stores every copy (it cannot know every member applies SendOnce).
        c.wait_feature_levels(Duration::from_secs(20))
            .await
            .map_err(|e| e.to_string())?;
    }
    let converge_timeout = cfg
        .large_log
        .as_ref()
        .map(|l| l.converge_timeout())
        .unwrap_or(CONVERGE_TIMEOUT);
    let opts = InjectOpts {
        converge_timeout,
        catch_up_timeout: cfg.large_log.as_ref().map(|l| l.catch_up_timeout),
    };
    let mut fill = None;
    if let Some(ll) = &cfg.large_log {
        create_topic(c, FILL_TOPIC).await?;
        let fill_hist = Arc::new(History::default());
        eprintln!(
            "seed {}: filling the log with {} MiB ({} producers, sends of {} KiB)",
            cfg.seed,
            ll.mib,
            ll.producers,
            FILL_SEND_BYTES >> 10
        );
        let mut stats = fill_log(c, fill_hist.clone(), ll).await;
        let t = Instant::now();
        if let Err(e) = wait_converged(c, converge_timeout).await {
            return Err(failure_text(
                cfg.seed,
                c,
                &[],
                &format!("after the fill of {} MiB: {e}", ll.mib),
            ));
        }
        stats.converged_after = t.elapsed();
        eprintln!(
            "seed {}: fill done: {:.0} MiB acknowledged in {:.1} s ({:.1} MiB/s){}, every node \
             applied it {:.1} s later",
            cfg.seed,
            stats.acked_mib(),
            stats.took.as_secs_f64(),
            stats.mib_per_sec(),
            if stats.timed_out {
                " FILL TIMED OUT"
            } else {
                ""
            },
            stats.converged_after.as_secs_f64()
        );
        fill = Some((fill_hist, stats));
    }
    let fifo = cfg.pop.as_ref().is_some_and(|p| p.fifo);
    if let Some(pc) = &cfg.pop {
        create_pop_group(c, pc.fifo).await?;
    }
    if fifo {
        // Until then a leader cannot propose the FIFO receive (PopFifo).
        c.wait_feature_levels(Duration::from_secs(20))
            .await
            .map_err(|e| e.to_string())?;
    }
    if cfg.delay.is_some() {
        super::delay::create_delay_topic(c).await?;
    }
    if cfg.txn.is_some() {
        // A TRANSACTION topic takes sends once every member applies EndTxn.
        c.wait_feature_levels(Duration::from_secs(20))
            .await
            .map_err(|e| e.to_string())?;
        super::txn::create_txn_topic(c).await?;
    }
    let addrs: Vec<String> = c.nodes.values().map(|n| n.addr.clone()).collect();
    let hist = Arc::new(History::default());
    lock(&hist.pop).max_attempts = POP_MAX_ATTEMPTS;
    lock(&hist.pop).fifo = fifo;
    let mut workload = cfg.workload.clone();
    workload.message_groups |= fifo;
    *hist_out = Some(hist.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + cfg.max_duration;
    let mut tasks = Vec::new();
    for p in 1..=cfg.workload.producers {
        tasks.push(tokio::spawn(producer_loop(
            hist.clone(),
            p,
            addrs.clone(),
            workload.clone(),
            cfg.seed,
            stop.clone(),
            until,
        )));
    }
    tasks.push(tokio::spawn(committer_loop(
        hist.clone(),
        addrs.clone(),
        stop.clone(),
        until,
    )));
    if let Some(pc) = &cfg.pop {
        for id in 1..=pc.consumers {
            tasks.push(tokio::spawn(pop_consumer_loop(
                hist.clone(),
                id,
                addrs.clone(),
                pc.clone(),
                cfg.seed,
                stop.clone(),
                until,
            )));
        }
    }

    if let Some(dc) = &cfg.delay {
        for id in 1..=dc.senders {
            tasks.push(tokio::spawn(super::delay::delay_sender_loop(
                hist.clone(),
                id,
                addrs.clone(),
                dc.clone(),
                cfg.seed,
                stop.clone(),
                until,
            )));
        }
    }

    if let Some(tc) = &cfg.txn {
        for id in 1..=tc.senders {
            tasks.push(tokio::spawn(super::txn::txn_sender_loop(
                hist.clone(),
                id,
                addrs.clone(),
                tc.clone(),
                cfg.seed,
                stop.clone(),
                until,
            )));
        }
    }

    calm(&hist, cfg.acks_between, cfg.calm).await;
    let mut result = Ok(());
    for kind in plan {
        if Instant::now() >= until {
            break;
        }
        // The long partition runs under load: not started when the load ends before it heals.
        if kind == FaultKind::PartitionFollowerLong
            && until.saturating_duration_since(Instant::now()) < PARTITION_LONG
        {
            eprintln!(
                "seed {}: {} skipped: the load ends within {} s",
                cfg.seed,
                kind.name(),
                PARTITION_LONG.as_secs()
            );
            continue;
        }
        if let Err(e) = inject_opts(c, &hist, kind, rng, &opts).await {
            result = Err(e);
            break;
        }
        calm(&hist, cfg.acks_between, cfg.calm).await;
    }
    stop.store(true, Ordering::Relaxed);
    *lock(&hist.load_end) = Some(hist.now());
    for t in tasks {
        // Each task ends within one op deadline of `stop`.
        let _ = t.await;
    }
    let converged = match result {
        Ok(()) => wait_converged(c, converge_timeout).await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = converged {
        let faults = lock(&hist.faults).clone();
        return Err(failure_text(cfg.seed, c, &faults, &e));
    }
    if let Some(pc) = &cfg.pop {
        let stats = drain(hist.clone(), addrs.clone(), pc, cfg.seed).await;
        eprintln!(
            "seed {}: pop drain {:.1} s, {} received{}",
            cfg.seed,
            stats.took.as_secs_f64(),
            stats.received,
            if stats.timed_out { " (TIMED OUT)" } else { "" }
        );
        lock(&hist.pop).drain = Some(stats);
        let snapshot = lock(&hist.pop).clone();
        let dlq = read_dlq(c, &snapshot).await;
        lock(&hist.pop).dlq = Some(dlq);
        // The drain wrote to the group's log: read back what every node applied.
        if let Err(e) = wait_converged(c, converge_timeout).await {
            let faults = lock(&hist.faults).clone();
            return Err(failure_text(
                cfg.seed,
                c,
                &faults,
                &format!("after the drain: {e}"),
            ));
        }
    }
    let mut delay_reads = BTreeMap::new();
    if cfg.delay.is_some() {
        let waited = match super::delay::wait_delivered(c, &hist).await {
            Ok(()) => wait_converged(c, converge_timeout).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = waited {
            let faults = lock(&hist.faults).clone();
            return Err(failure_text(cfg.seed, c, &faults, &e));
        }
        for (id, n) in &c.nodes {
            match super::delay::read_delay(&n.addr).await {
                Ok(r) => {
                    delay_reads.insert(*id, r);
                }
                Err(e) => {
                    let faults = lock(&hist.faults).clone();
                    return Err(failure_text(cfg.seed, c, &faults, &e));
                }
            }
        }
    }
    let mut txn_reads = BTreeMap::new();
    if cfg.txn.is_some() {
        let settled = match super::txn::settle(c, &hist).await {
            Ok(()) => wait_converged(c, converge_timeout).await.map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = settled {
            let faults = lock(&hist.faults).clone();
            return Err(failure_text(cfg.seed, c, &faults, &e));
        }
        for (id, n) in &c.nodes {
            match super::txn::read_txn(&n.addr).await {
                Ok(r) => {
                    txn_reads.insert(*id, r);
                }
                Err(e) => {
                    let faults = lock(&hist.faults).clone();
                    return Err(failure_text(cfg.seed, c, &faults, &e));
                }
            }
        }
    }
    let mut reads = BTreeMap::new();
    for (id, n) in &c.nodes {
        reads.insert(*id, read_node(&n.addr).await);
    }
    let mut report = check(&hist, &reads, cfg.seed);
    if cfg.pop.is_some() {
        check_pop(&hist, &reads, &mut report);
    }
    if cfg.delay.is_some() {
        report.delay = Some(Box::new(super::delay::check_delay(&hist, &delay_reads)));
    }
    if cfg.txn.is_some() {
        report.txn = Some(Box::new(super::txn::check_txn(&hist, &txn_reads)));
    }
    if let Some((fill_hist, stats)) = fill {
        report.fill = Some(Box::new(check_fill(c, &fill_hist, stats, cfg.seed).await));
    }
    Ok(report)
}

/// Reads the fill back from every node at once and checks it (see [`LargeLogCfg`]).
async fn check_fill(c: &Cluster, fill_hist: &History, stats: FillStats, seed: u64) -> FillReport {
    let t = Instant::now();
    let mut handles = Vec::new();
    for (id, n) in &c.nodes {
        let addr = n.addr.clone();
        handles.push((*id, tokio::spawn(async move { read_fill(&addr).await })));
    }
    let mut reads = BTreeMap::new();
    let mut sums = BTreeMap::new();
    for (id, h) in handles {
        match h.await {
            Ok((nr, s)) => {
                reads.insert(id, nr);
                sums.insert(id, s);
            }
            Err(e) => {
                let mut nr = NodeRead::default();
                nr.errors.push(format!("reading the fill failed: {e}"));
                reads.insert(id, nr);
            }
        }
    }
    let read_took = t.elapsed();
    let t = Instant::now();
    // The ops as the compacted bodies stand for them (see `read_fill`).
    let ops: Vec<Op> = lock(&fill_hist.ops)
        .iter()
        .map(|o| Op {
            len: 0,
            ..o.clone()
        })
        .collect();
    let compacted = History {
        t0: fill_hist.t0,
        ops: Mutex::new(ops),
        load_end: Mutex::new(Some(fill_hist.now())),
        ..History::default()
    };
    let check = check(&compacted, &reads, seed);
    let first = sums.values().next();
    let sums_identical = sums.len() == reads.len() && sums.values().all(|s| Some(s) == first);
    FillReport {
        stats,
        check,
        sums,
        sums_identical,
        read_took,
        check_took: t.elapsed(),
    }
}

/// The error of a round that did not converge: the faults so far, the first panic and the tail of
/// every node's log.
fn failure_text(seed: u64, c: &Cluster, faults: &[FaultEvent], e: &str) -> String {
    let mut s = format!("seed {seed}: {e}\nfaults:\n");
    for fe in faults {
        writeln!(s, "  {fe:?}").ok();
    }
    for id in c.nodes.keys() {
        // The first panic and the last lines that are not heartbeat or replication noise.
        let log = c.node_log(*id);
        let lines: Vec<&str> = log.lines().collect();
        if let Some(i) = lines.iter().position(|l| l.contains("panicked")) {
            writeln!(s, "node {id} panicked:").ok();
            for l in &lines[i..(i + 6).min(lines.len())] {
                writeln!(s, "  {l}").ok();
            }
        }
        let tail: Vec<&str> = lines
            .iter()
            .rev()
            .filter(|l| !l.contains("heartbeat") && !l.contains("RaftMsg"))
            .take(12)
            .copied()
            .collect();
        writeln!(s, "node {id} log tail:").ok();
        for l in tail.into_iter().rev() {
            writeln!(s, "  {l}").ok();
        }
    }
    s
}
