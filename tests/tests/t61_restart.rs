//! Restart images (`crates/raft-log/src/state_machine/restart.rs`, `crates/broker-node/src/
//! restart.rs`): a restarted node loads what apply built from its images and re-applies only the
//! log after the newest one, and then serves exactly what it served before. Real processes,
//! SIGKILL, real fsync, a 256 MiB log of ~128 KiB entries, images every 8 MiB.
//!
//! Every node of the group is killed at once and started again: each must say it loaded its
//! images, and every replica must then hold every acknowledged message at the offset it was
//! acknowledged with, all three identical (message counts and a digest of every offset and body).
//! Then one node is restarted again without its images: it re-applies its whole log and must
//! end identical too. Times to ready are printed (`FIGURES` lines); `raftmq bench restart`
//! measures them at scale.

use std::time::{Duration, Instant};

use raftmq_tests::biglog;
use raftmq_tests::{Cluster, wait_for};

const LOADED: &str = "state loaded from restart images";

fn count(text: &str, what: &str) -> usize {
    text.matches(what).count()
}

/// Waits until node `id` is ready and has applied `target`; returns how long that took.
async fn ready(c: &Cluster, id: u64, target: u64) -> Duration {
    let t0 = Instant::now();
    wait_for(
        &format!("node {id} ready at index {target}"),
        Duration::from_secs(120),
        || async {
            c.status(id)
                .await
                .filter(|s| s.ready && s.applied >= target)
                .map(|_| ())
        },
    )
    .await;
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t01_a_killed_group_restarts_from_its_images_and_serves_every_message() {
    let conf_dir = tempfile::tempdir().unwrap();
    let conf = conf_dir.path().join("node.toml");
    std::fs::write(&conf, "[raft]\nrestart_image_bytes = 8388608\n").unwrap();
    let mut c = Cluster::start(3, &["--config", conf.to_str().unwrap()]).await;
    c.create_topic("big", biglog::QUEUES).await;
    let mut acked = biglog::fill(c.addrs(), 100, 256 << 20).await;
    assert_eq!(acked.failed, 0, "fill: {:?}", acked.first_error);
    let leader = c.leader().await;
    let target = c.status(leader).await.expect("leader answers").committed;
    for id in 1..=3 {
        ready(&c, id, target).await;
        let images = std::fs::read_dir(c.data_dir(id).join("sm/restart"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert!(images >= 2, "node {id} wrote {images} restart images");
        assert_eq!(count(&c.node_log(id), LOADED), 0, "node {id}");
    }

    c.kill_all();
    for id in 1..=3 {
        c.spawn(id);
    }
    for id in 1..=3 {
        let took = ready(&c, id, target).await;
        let log = c.node_log(id);
        assert_eq!(
            count(&log, LOADED),
            1,
            "node {id} did not load its images:\n{}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
        let line = log.lines().find(|l| l.contains(LOADED)).unwrap_or("");
        eprintln!("FIGURES node {id} ready at index {target} in {took:?} after SIGKILL: {line}");
    }
    // The group works on: more messages, then everything read back from every node.
    acked.merge(biglog::fill(c.addrs(), 200, 16 << 20).await);
    assert_eq!(acked.failed, 0, "fill after: {:?}", acked.first_error);
    biglog::replicas_identical(&c, &acked).await;

    // One node again, its images deleted: it re-applies its whole log and ends the same.
    let leader = c.leader().await;
    let target = c.status(leader).await.expect("leader answers").committed;
    let f = (1..=3).find(|id| *id != leader).unwrap();
    ready(&c, f, target).await;
    c.kill(f);
    std::fs::remove_dir_all(c.data_dir(f).join("sm/restart")).unwrap();
    c.spawn(f);
    let took = ready(&c, f, target).await;
    assert_eq!(count(&c.node_log(f), LOADED), 1, "node {f} had no images");
    eprintln!("FIGURES node {f} ready at index {target} in {took:?} re-applying its whole log");
    biglog::replicas_identical(&c, &acked).await;
}
