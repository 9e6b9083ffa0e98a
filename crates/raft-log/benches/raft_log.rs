//! Benchmark of the replicated log: three members on 127.0.0.1 with real files, fsync on.
//! Prints figures; asserts nothing. Run: `cargo bench -p raftmq-raft-log --bench raft_log`
//! (`-- --quick` for a short run).
//!
//! - throughput: concurrent proposers, each entry a batch of 1 KiB messages (64 KiB per entry);
//! - latency: one proposal of 1 KiB in flight at a time, p50/p99/p999;
//! - failover: the leader killed abruptly (its runtime dropped) N times, time to the next commit.

use std::time::{Duration, Instant};

use bytes::Bytes;
use raftmq_raft_log::RaftConfig;
use raftmq_raft_log::testkit::LocalGroup;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(quick));
}

async fn run(quick: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut g = LocalGroup::start(3, dir.path(), RaftConfig::default(), true).await;
    g.propose(Bytes::from_static(b"warm-up"), Duration::from_secs(10))
        .await
        .expect("a leader commits");

    // Throughput.
    let secs = if quick { 3 } else { 10 };
    let entry = Bytes::from(vec![7u8; 64 * 1024]);
    let proposers = 32;
    let (leader, _, _) = g
        .propose(entry.clone(), Duration::from_secs(5))
        .await
        .expect("commit");
    eprintln!("throughput: {proposers} proposers, 64 KiB entries (64 x 1 KiB), {secs} s ...");
    let t0 = Instant::now();
    let stop = t0 + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    let gref = &g;
    for _ in 0..proposers {
        let e = entry.clone();
        tasks.push(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                if gref.members[&leader]
                    .member
                    .propose(e.clone())
                    .await
                    .is_ok()
                {
                    n += 1;
                }
            }
            n
        });
    }
    let done: u64 = futures::future::join_all(tasks).await.into_iter().sum();
    let el = t0.elapsed().as_secs_f64();
    let mb = done as f64 * 64.0 / 1024.0 / el;
    println!("| committed entries/s | {:.0} |", done as f64 / el);
    println!(
        "| committed messages/s (1 KiB) | {:.0} |",
        done as f64 * 64.0 / el
    );
    println!("| committed MB/s | {mb:.1} |");

    // Latency, one in flight.
    let n = if quick { 300 } else { 2000 };
    eprintln!("latency: {n} proposals of 1 KiB, one in flight ...");
    let small = Bytes::from(vec![1u8; 1024]);
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        if g.members[&leader]
            .member
            .propose(small.clone())
            .await
            .is_ok()
        {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    println!("| commit latency p50 | {} |", ms(pct(&lat, 0.5)));
    println!("| commit latency p99 | {} |", ms(pct(&lat, 0.99)));
    println!("| commit latency p999 | {} |", ms(pct(&lat, 0.999)));

    // Failover.
    let kills = if quick { 3 } else { 10 };
    let mut outages = Vec::new();
    for k in 0..kills {
        let (leader, _, _) = g
            .propose(small.clone(), Duration::from_secs(10))
            .await
            .expect("commit before kill");
        g.kill(leader);
        let t = Instant::now();
        match g.propose(small.clone(), Duration::from_secs(10)).await {
            Ok(_) => outages.push(t.elapsed()),
            Err(e) => eprintln!("kill {k}: no commit within 10 s: {e}"),
        }
        eprintln!(
            "kill {}/{kills}: leader {leader} -> next commit after {}",
            k + 1,
            ms(*outages.last().unwrap_or(&Duration::ZERO))
        );
        g.spawn(leader, None).await;
        // Let the restarted member catch up before the next kill.
        let target = g
            .members
            .values()
            .map(|m| m.member.status().committed)
            .max()
            .unwrap_or(0);
        let t = Instant::now();
        while g.members[&leader].member.status().applied < target
            && t.elapsed() < Duration::from_secs(10)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    outages.sort();
    println!("| failover kills | {} |", outages.len());
    println!("| failover p50 | {} |", ms(pct(&outages, 0.5)));
    println!(
        "| failover max | {} |",
        ms(*outages.last().unwrap_or(&Duration::ZERO))
    );
    g.kill_all();
}
