//! Fault injection under load with a history checker (see `raftmq_tests::history`): real
//! `broker-node` processes are killed, paused, wiped, power-cut and have their segment files
//! damaged while producers send; afterwards every node is read back and nothing acknowledged may be
//! lost, changed, duplicated, reordered or invented. Fixed seeds keep the run short and repeatable;
//! the `soak` binary runs the same scenarios with random faults for as long as asked.
//!
//! Bugs this checker found, each fixed with a regression test here or in raft-log: A (`t34`: a
//! wiped follower made the leader's Raft core panic), B and E (`t35`: a node whose log was cut by
//! CRC recovery or a power loss could not start, then led or voted with the cut log; the same
//! cause made power-loss rounds of the soak diverge, old bugs C and D). Partitions go through a
//! fault proxy between the nodes (`t36`).
//!
//! A failure prints the seed and the part of the history that shows it. Rerun one seed longer with
//! `cargo run --release -p raftmq-tests --bin soak -- --seed SEED --duration-secs 60`.

use std::time::Duration;

use raftmq_tests::history::{
    DelayCfg, FaultKind, FaultPlan, PopCfg, ScenarioCfg, TxnCfg, run_scenario,
};

/// The scenarios share two cores: run them one at a time so election timing stays realistic.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(seed: u64, plan: FaultPlan) {
    run_cfg(seed, plan, None).await;
}

/// As [`run`], with the POP consumers of `raftmq_tests::history::pop` beside the producers.
async fn run_pop(seed: u64, plan: FaultPlan) {
    let report = run_cfg(seed, plan, Some(PopCfg::default())).await;
    let pop = report
        .pop
        .as_ref()
        .expect("a POP round reports its consumers");
    assert!(
        pop.acked > 0 && pop.redelivered > 0,
        "the POP consumers acknowledged nothing or nothing came back:\n{report}"
    );
}

async fn run_cfg(seed: u64, plan: FaultPlan, pop: Option<PopCfg>) -> raftmq_tests::history::Report {
    let mut cfg = ScenarioCfg::new(seed, plan);
    cfg.pop = pop;
    run_scenario_cfg(cfg).await
}

async fn run_scenario_cfg(mut cfg: ScenarioCfg) -> raftmq_tests::history::Report {
    let _serial = SERIAL.lock().await;
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
    report
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
            kinds: FaultKind::ALL.to_vec(),
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

/// Regression (bugs B and E, found by this checker, soak seeds 7, 1013, 1061, 1073, 1092):
/// - B: after a flipped bit or a truncated segment, recovery cut the log but the persisted
///   committed index was past the cut, and the node could not start. Fixed: `read_committed` is
///   capped at the recovered log.
/// - E: a leader killed and restarted resumed leading in its old term (openraft's default
///   `enable_leader_restore`) with a log that had lost its tail (damaged, or unsynced at a power
///   loss), and proposed other entries under (term, index) ids its followers already held: the
///   same offset with different bytes on two nodes. Fixed: leader restore is off, and a node whose
///   recovery shows it had stored more than it now holds (`repair_floor`) grants no vote and does
///   not campaign until replication has brought it back.
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

/// POP consumption (receive, ack, change invisibility, dead letters) is replicated state: three
/// POP consumers of group `pop-hist` (3 attempts, 1-3 s invisible) receive the producers' messages
/// while the leader is killed, a follower is killed, the leader paused, every node loses power and
/// the leader is cut off by a partition. After healing and a drain, nothing acknowledged comes
/// back, nothing stored is lost (every message is acknowledged or dead-lettered once, after its
/// last attempt), attempts never go backwards and nothing is handed out before its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t37_pop_consumers_lose_nothing_under_faults() {
    run_pop(
        37,
        FaultPlan::Fixed(vec![
            FaultKind::KillLeader,
            FaultKind::KillFollower,
            FaultKind::PauseLeader,
            FaultKind::PowerLossAll,
            FaultKind::PartitionLeader,
        ]),
    )
    .await;
}

/// 39. Scheduled messages are replicated state: two senders schedule messages on a DELAY topic,
///     each due 0-8 s ahead, while the leader is killed, paused, a follower killed, every node
///     loses power and the leader is cut off. After the heal every acknowledged one is delivered,
///     none twice, none before its time, and every node holds the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t39_scheduled_messages_delivered_once_and_on_time_under_faults() {
    let mut cfg = ScenarioCfg::new(
        39,
        FaultPlan::Fixed(vec![
            FaultKind::KillLeader,
            FaultKind::PauseLeader,
            FaultKind::KillFollower,
            FaultKind::PowerLossAll,
            FaultKind::PartitionLeader,
        ]),
    );
    cfg.delay = Some(DelayCfg::default());
    let report = run_scenario_cfg(cfg).await;
    let d = report
        .delay
        .as_ref()
        .expect("a delay round reports its senders");
    assert!(
        d.acked > 100 && d.delivered >= d.acked,
        "too few scheduled messages to test anything:\n{report}"
    );
}

/// 40. FIFO consumer groups are replicated state: the producers' messages carry message groups
///     (three per producer, each in one queue) and the POP group is FIFO, while the leader is
///     killed, paused, a follower killed, every node loses power and the leader is cut off. No
///     message is handed out before the one before it in its group was acknowledged or
///     dead-lettered, none is lost, and the POP rules of t37 hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t40_fifo_groups_stay_in_order_under_faults() {
    let mut cfg = ScenarioCfg::new(
        40,
        FaultPlan::Fixed(vec![
            FaultKind::KillLeader,
            FaultKind::PauseLeader,
            FaultKind::KillFollower,
            FaultKind::PowerLossAll,
            FaultKind::PartitionLeader,
        ]),
    );
    cfg.pop = Some(PopCfg {
        fifo: true,
        ..PopCfg::default()
    });
    let report = run_scenario_cfg(cfg).await;
    let p = report
        .pop
        .as_ref()
        .expect("a FIFO round reports its POP group");
    assert!(
        p.fifo_pairs > 1000 && p.fifo_groups >= 9,
        "too few ordered pairs to test anything:\n{report}"
    );
}

/// 41. Transactions are replicated state: four senders store half messages on a TRANSACTION
///     topic and commit, roll back or leave them open while the leader is killed, paused, a
///     follower killed, every node loses power and the leader is cut off. After the heal the
///     ones left open are committed (each finds its half message), every committed one is
///     stored once, no rolled-back one is, and every node holds the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t41_transactions_end_once_under_faults() {
    let mut cfg = ScenarioCfg::new(
        41,
        FaultPlan::Fixed(vec![
            FaultKind::KillLeader,
            FaultKind::PauseLeader,
            FaultKind::KillFollower,
            FaultKind::PowerLossAll,
            FaultKind::PartitionLeader,
        ]),
    );
    cfg.txn = Some(TxnCfg {
        senders: 4,
        ..TxnCfg::default()
    });
    let report = run_scenario_cfg(cfg).await;
    let t = report
        .txn
        .as_ref()
        .expect("a transaction round reports its senders");
    assert!(
        t.committed > 50 && t.rolled_back > 10 && t.late > 3,
        "too few transactions to test anything:\n{report}"
    );
}

/// 38. Producers send every attempt of a batch as a new batch (a new sequence), as a RocketMQ 5
///     client's retry through another node is, with a message id in each message: the group's
///     replicated record of stored ids (`SendOnce`) must store each once while the leader is
///     killed, paused, a follower killed, every node loses power and the leader is cut off. The
///     checker counts a message stored twice as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t38_retries_sent_as_new_batches_are_stored_once_under_faults() {
    let mut cfg = ScenarioCfg::new(
        38,
        FaultPlan::Fixed(vec![
            FaultKind::KillLeader,
            FaultKind::PauseLeader,
            FaultKind::KillFollower,
            FaultKind::PowerLossAll,
            FaultKind::PartitionLeader,
            FaultKind::PauseLeaderKillFollower,
        ]),
    );
    cfg.workload.new_batch_per_attempt = true;
    let report = run_scenario_cfg(cfg).await;
    assert!(
        report.retried_ops > 0,
        "no send was retried, so nothing was tested:\n{report}"
    );
}
