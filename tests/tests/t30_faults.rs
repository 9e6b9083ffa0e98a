//! Fault injection under load with a history checker (see `raftmq_tests::history`): real
//! `broker-node` processes are killed, paused, wiped, power-cut and have their segment files
//! damaged while producers send; afterwards every node is read back and nothing acknowledged may be
//! lost, changed, duplicated, reordered or invented. Fixed seeds keep the run short and repeatable;
//! the `soak` binary runs the same scenarios with random faults for as long as asked.
//!
//! Known open bugs this checker found (see the ignored tests for A and B):
//! - C (power loss): with `simulate_power_loss`, a node that cannot replay its log below the
//!   persisted commit index refuses to start (as in B). The seam itself writes `<segment>.durable`
//!   with `fs::write` (truncate, then write): a SIGKILL in between leaves it empty and the seam
//!   then drops the whole segment, fsynced bytes included; `history::power_loss` leaves such a
//!   segment whole and says so ("TORN record") until raft-log writes the record atomically.
//! - D (power loss, intermittent): after power-loss faults one node's state machine sometimes lacks
//!   one `Send` entry that the other two applied (e.g. soak seed 44: queue 0 offset 102 is log
//!   index 186 on nodes 2 and 3, index 188 on node 1, and every later offset is shifted by one).
//!   `t32` and `t33` can therefore fail now and then with `DIVERGENT`; that is the bug, not noise.
//!
//! A failure prints the seed and the part of the history that shows it. Rerun one seed longer with
//! `cargo run --release -p raftmq-tests --bin soak -- --seed SEED --duration-secs 60`.

use std::time::Duration;

use raftmq_tests::history::{FaultKind, FaultPlan, ScenarioCfg, run_scenario};

/// The scenarios share two cores: run them one at a time so election timing stays realistic.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(seed: u64, plan: FaultPlan) {
    let _serial = SERIAL.lock().await;
    let mut cfg = ScenarioCfg::new(seed, plan);
    cfg.acks_between = 30;
    cfg.calm = Duration::from_secs(3);
    cfg.max_duration = Duration::from_secs(90);
    let report = match run_scenario(&cfg).await {
        Ok(r) => r,
        Err(e) => panic!("the group did not recover:\n{e}"),
    };
    eprintln!("{report}");
    assert!(report.acked_ops > 0, "nothing was acknowledged:\n{report}");
    assert!(report.is_ok(), "history check failed:\n{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t31_kills_and_pauses_lose_nothing() {
    run(
        31,
        FaultPlan::Fixed(vec![
            FaultKind::KillLeader,
            FaultKind::KillFollower,
            FaultKind::PauseLeader,
            FaultKind::KillTwo,
            FaultKind::KillAll,
            FaultKind::PauseLeaderKillFollower,
        ]),
    )
    .await;
}

/// Faults that leave a node's log shorter than what the leader already counted as replicated to it.
/// They trip bugs found by this checker and not fixed yet: see `t34` and `t35`.
const LOG_REVERSION: [FaultKind; 3] = [
    FaultKind::WipeFollower,
    FaultKind::BitFlip,
    FaultKind::TruncateSegment,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t32_power_loss_on_one_and_all_nodes_loses_nothing() {
    run(
        32,
        FaultPlan::Fixed(vec![
            FaultKind::PowerLossOne,
            FaultKind::PowerLossAll,
            FaultKind::PowerLossOne,
            FaultKind::PowerLossAll,
        ]),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t33_random_faults_lose_nothing() {
    run(
        33,
        FaultPlan::Random {
            count: 6,
            kinds: FaultKind::ALL
                .into_iter()
                .filter(|k| !LOG_REVERSION.contains(k))
                .collect(),
        },
    )
    .await;
}

/// Regression (bug A, found by this checker, seed 32): a follower whose data dir was wiped came
/// back with a shorter log than the leader had matched; the leader's Raft core panicked ("follower
/// log reversion is not allowed") yet its status still said leader, so two nodes claimed to lead.
/// Fixed in raft-log by `allow_log_reversion = Some(true)`: the leader re-replicates to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t34_wiped_follower_rejoins_under_load() {
    run(
        34,
        FaultPlan::Fixed(vec![FaultKind::WipeFollower, FaultKind::WipeFollower]),
    )
    .await;
}

/// BUG B (open, found by this checker, soak seed 7): after a flipped bit in the newest segment of a
/// stopped node, recovery correctly cuts the log at the damaged record (`RecoveryReport { entries:
/// 50, truncated_bytes: 7354 }`), but the committed log id persisted in sled is still 62, so
/// openraft replays committed entries at start-up and the node refuses to start: `cannot start the
/// Raft member: raft: when Read LogIndex(62): Failed to get log entries, expected index: [0, 63),
/// got [Some(0), Some(49))`. A node with a damaged log must instead start with `committed` clamped
/// to its recovered last log id and re-replicate the rest from its peers. A truncated segment cuts
/// the log the same way. Once it starts, the cut log also hits bug A on the leader.
/// Bug B (cannot start: committed past the cut log) is fixed: `read_committed` is capped at the
/// recovered log. Still open (bug E): after the cut, the damaged node's state machine diverges from
/// its peers' (the same batch at another log index), seen with `--include-ignored`.
#[ignore = "bug E: state diverges on a node whose log was cut by CRC recovery"]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t35_flipped_bit_and_truncated_segment_are_repaired_from_peers() {
    run(
        35,
        FaultPlan::Fixed(vec![
            FaultKind::BitFlip,
            FaultKind::TruncateSegment,
            FaultKind::BitFlip,
            FaultKind::TruncateSegment,
        ]),
    )
    .await;
}

/// Partitions through the fault proxy between the nodes, under load: the leader isolated (clients
/// still reach it and must get no acknowledgement it cannot commit), a follower isolated, a
/// partial partition (leader and one follower deaf to each other), and a one-way cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t36_partitions_lose_nothing() {
    run(
        36,
        FaultPlan::Fixed(vec![
            FaultKind::PartitionLeader,
            FaultKind::PartitionFollower,
            FaultKind::PartitionPartial,
            FaultKind::PartitionOneWay,
            FaultKind::PartitionLeader,
        ]),
    )
    .await;
}
