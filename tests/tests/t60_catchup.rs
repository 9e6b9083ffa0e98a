//! A wiped or far-behind follower of a group with a gigabyte-sized log catches up completely,
//! without an election, idle and under produce load; a dead peer costs the leader neither log
//! lines nor CPU. Real processes, real fsync, logs of ≥ 1 GiB of ~128 KiB entries.
//!
//! Each catch-up must finish within a time derived from the rates the project promises (100 MB/s
//! idle, 50 MB/s under load), halved for this shared two-core machine: a follower that stalls (as
//! one did before: stuck at 543 of 11,747 entries) fails. Figures are printed (`FIGURES` lines).

use std::time::{Duration, Instant};

use raftmq_tests::biglog::{self, Acked, Load};
use raftmq_tests::{Cluster, metric, metrics, wait_for};

const GIB: u64 = 1 << 30;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Loss {
    /// SIGKILL, data directory deleted, restarted with the same command line.
    Wiped,
    /// SIGKILL, restarted on its data after the group wrote a gigabyte without it.
    FarBehind,
}

/// How long a catch-up of ~1 GiB may take: the promised rate halved, plus start-up.
fn deadline(under_load: bool) -> Duration {
    let mb = (GIB + (64 << 20)) as f64 / 1e6;
    let rate = if under_load { 25.0 } else { 50.0 };
    Duration::from_secs_f64(mb / rate + 15.0)
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The tests of this file take the machine's disk and cores: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs one catch-up scenario and checks it; see the module docs.
async fn catch_up(loss: Loss, under_load: bool) {
    let _one = ONE_AT_A_TIME.lock().await;
    // Retention by disk use stays out of the way (the local cluster's watermarks, 97 and 99 %):
    // these logs are gigabytes, and with the defaults, on a disk already three-quarters full of
    // build outputs, the clean watermark trimmed the oldest segment while the test read every
    // queue back from offset 0.
    let mut c = Cluster::start(3, &[]).await;
    // Three replicas of the fill, the load's sends and the log's segment slack.
    let fill = GIB + (64 << 20) + if under_load { 512 << 20 } else { 0 };
    biglog::require_free_disk(c.dir.path(), fill * 3 + fill / 4, "this catch-up");
    c.create_topic("big", biglog::QUEUES).await;
    let leader = c.leader().await;
    let term0 = biglog::max_term(&c).await;
    let f = *c.nodes.keys().find(|id| **id != leader).unwrap();
    let mut acked = Acked::default();
    match loss {
        Loss::Wiped => {
            // The log is built with every node up; then the follower loses everything.
            acked.merge(biglog::fill(c.addrs(), 100, GIB).await);
            c.kill(f);
            std::fs::remove_dir_all(c.data_dir(f)).unwrap();
        }
        Loss::FarBehind => {
            // Some log with every node up, then a gigabyte without the follower.
            acked.merge(biglog::fill(c.addrs(), 100, 64 << 20).await);
            c.kill(f);
            acked.merge(biglog::fill(c.addrs(), 200, GIB).await);
        }
    }
    assert_eq!(
        acked.failed, 0,
        "fill sends failed: {:?}",
        acked.first_error
    );
    let target = c.status(leader).await.expect("leader answers").committed;
    let held_before = biglog::dir_bytes(&c.data_dir(f).join("log"));

    // Under load: 4 producers of 16-message batches, their rate measured before the restart.
    let load = under_load.then(|| {
        Load::start(
            c.addrs(),
            "load",
            300,
            4,
            16,
            u64::MAX,
            Duration::from_secs(600),
        )
    });
    let before = match &load {
        Some(l) => Some(l.rate_over(Duration::from_secs(5)).await),
        None => None,
    };
    let load_at_restart = load.as_ref().map_or(0, |l| l.acked_bytes());
    c.spawn(f);
    let t0 = Instant::now();
    let (elapsed, term_during) = biglog::wait_caught_up(&c, f, target, deadline(under_load)).await;
    let during = load
        .as_ref()
        .map(|l| (l.acked_bytes() - load_at_restart) as f64 / t0.elapsed().as_secs_f64());
    let load_acked = match load {
        Some(l) => l.stop().await,
        None => Acked::default(),
    };
    let written = biglog::dir_bytes(&c.data_dir(f).join("log")).saturating_sub(held_before);
    let elapsed = elapsed.unwrap_or_else(|| {
        panic!(
            "{loss:?} follower {f} did not catch up to index {target} within {:?}:\n{}",
            deadline(under_load),
            tail(&c.node_log(f), 20)
        )
    });
    eprintln!(
        "FIGURES {loss:?} under_load={under_load}: caught up to index {target} in {:.1} s, {:.0} MB written, {:.0} MB/s; term {term0} -> {term_during}",
        elapsed.as_secs_f64(),
        written as f64 / 1e6,
        written as f64 / 1e6 / elapsed.as_secs_f64()
    );
    if let (Some(b), Some(d)) = (before, during) {
        eprintln!(
            "FIGURES {loss:?} load: {:.1} MB/s before the restart, {:.1} MB/s during the catch-up ({:.0} %)",
            b / 1e6,
            d / 1e6,
            d * 100.0 / b.max(1.0)
        );
    }
    assert_eq!(
        load_acked.failed, 0,
        "load sends failed: {:?}",
        load_acked.first_error
    );
    acked.merge(load_acked);

    // Fully caught up (with what the leader committed since) and ready.
    wait_for("the follower ready", Duration::from_secs(60), || async {
        c.status(f)
            .await
            .filter(|s| s.ready && s.catch_up.is_none())
            .map(|_| ())
    })
    .await;
    let term1 = biglog::max_term(&c).await;
    assert_eq!(
        term_during.max(term1),
        term0,
        "the {loss:?} follower's return changed the term: a healthy leader was deposed"
    );
    // Every replica holds every acknowledged message where it was acknowledged, and the same
    // queues (message counts and a digest of every offset and body).
    let replica = biglog::replicas_identical(&c, &acked).await;
    eprintln!(
        "FIGURES {loss:?}: {} acknowledged messages, every replica identical ({} messages each)",
        acked.keys.len(),
        replica.queues.values().map(|(n, _)| n).sum::<u64>()
    );
}

/// One catch-up test a (loss, load) case; each keeps its own name, so each runs and fails alone.
macro_rules! catch_up_test {
    ($($name:ident: $loss:expr, $load:expr;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            catch_up($loss, $load).await;
        }
    )*};
}

catch_up_test! {
    t01_wiped_follower_of_a_gigabyte_log_catches_up_on_an_idle_group: Loss::Wiped, false;
    t02_far_behind_follower_catches_up_a_gigabyte_on_an_idle_group: Loss::FarBehind, false;
    t03_wiped_follower_of_a_gigabyte_log_catches_up_under_produce_load: Loss::Wiped, true;
    t04_far_behind_follower_catches_up_a_gigabyte_under_produce_load: Loss::FarBehind, true;
}

/// CPU seconds (user + system) process `pid` has used.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// The log filter a broker node uses when RUST_LOG is not set (`crates/broker-node/src/lib.rs`).
const DEFAULT_LOG_FILTER: &str = "info,openraft=error";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t05_a_dead_peer_costs_the_leader_neither_log_lines_nor_cpu() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::start_with_env(3, &[], &[("RUST_LOG", DEFAULT_LOG_FILTER)]).await;
    let leader = c.leader().await;
    let f = *c.nodes.keys().find(|id| **id != leader).unwrap();
    let pid = c.pid(leader).unwrap();
    let addr = c.nodes[&leader].addr.clone();
    let term0 = biglog::max_term(&c).await;
    // The healthy group, idle, for 10 s.
    let (cpu0, t0) = (cpu_secs(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let healthy = (cpu_secs(pid) - cpu0) / t0.elapsed().as_secs_f64();
    let lines0 = c.node_log(leader).lines().count();

    // A follower down for 30 s.
    c.kill(f);
    let (cpu1, t1) = (cpu_secs(pid), Instant::now());
    let label = format!("raftmq_raft_peer_reachable{{node_id=\"{f}\"}}");
    let reachable_down = wait_for(
        "the dead peer's reachability metric at 0",
        Duration::from_secs(10),
        || async { (metric(&metrics(&addr).await, &label) == Some(0.0)).then_some(0.0) },
    )
    .await;
    let st = c.status(leader).await.unwrap();
    let peer = st.peers.iter().find(|p| p.node_id == f).unwrap();
    assert!(!peer.reachable, "{peer:?}");
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(t1.elapsed())).await;
    let down = (cpu_secs(pid) - cpu1) / t1.elapsed().as_secs_f64();
    let log = c.node_log(leader);
    let new_lines: Vec<&str> = log.lines().skip(lines0).collect();

    // It comes back: reachable again, logged once.
    c.spawn(f);
    wait_for(
        "the peer reachable again",
        Duration::from_secs(20),
        || async { (metric(&metrics(&addr).await, &label) == Some(1.0)).then_some(()) },
    )
    .await;
    let back = c.node_log(leader);
    let back_lines: Vec<&str> = back.lines().skip(lines0 + new_lines.len()).collect();
    eprintln!(
        "FIGURES dead peer: leader CPU {:.2} % of a core healthy, {:.2} % with a follower down 30 s ({:.2}x); {} log lines while it was down:\n{}",
        healthy * 100.0,
        down * 100.0,
        down / healthy.max(1e-9),
        new_lines.len(),
        new_lines.join("\n")
    );
    assert_eq!(reachable_down, 0.0);
    // A state change, maybe a summary, maybe a line from the broker about the peer: a handful.
    assert!(
        new_lines.len() <= 6,
        "{} lines logged by the leader while a follower was down 30 s",
        new_lines.len()
    );
    assert_eq!(
        new_lines
            .iter()
            .filter(|l| l.contains("unreachable:"))
            .count(),
        1,
        "the change to unreachable is logged once"
    );
    assert!(
        back_lines.iter().any(|l| l.contains("reachable again")),
        "the return is logged: {back_lines:?}"
    );
    // Retrying with backoff costs little: within a generous bound of the healthy group's CPU (the
    // loop without backoff took a whole core).
    assert!(
        down <= healthy * 2.0 + 0.02,
        "leader CPU {down:.3} with a follower down vs {healthy:.3} healthy"
    );
    assert_eq!(biglog::max_term(&c).await, term0, "no election");
}
