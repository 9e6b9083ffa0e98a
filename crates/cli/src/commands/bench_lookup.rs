//! `raftmq bench lookup`: message lookup at the scale users keep. Stores `--count` messages, each
//! with a client message id (`id-N`, as RocketMQ 5 clients set one) and a key shared by
//! `--per-key` messages, then times `msg get --id` and `msg find --key` on random ones, end to
//! end through the client (nameserver, each group's leader, the index, the log reads). With
//! `--local` it also shows how much the nodes' resident memory grew while the messages were
//! stored, per million messages.

use anyhow::{Result, bail};
use raftmq_proto::v1::find_messages_request::By;
use serde_json::json;
use tokio::time::Instant;

use crate::args::BenchTarget;
use crate::commands::bench::{ProduceShape, Remote, produce, setup, steal_line, with_security};
use crate::output::{json_line, table};
use crate::stats::{CpuTimes, summarize};

#[derive(Debug, clap::Args)]
pub struct LookupBenchArgs {
    #[command(flatten)]
    pub target: BenchTarget,
    /// Messages stored before the lookups, each with a client id and a key.
    #[arg(long, default_value_t = 10_000_000)]
    pub count: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Messages sharing one key (`msg find --key` returns this many).
    #[arg(long, default_value_t = 10)]
    pub per_key: u64,
    /// Lookups of each kind, of random messages.
    #[arg(long, default_value_t = 200)]
    pub samples: u32,
    /// Do not store messages: the topic holds --count of them from an earlier run.
    #[arg(long)]
    pub no_produce: bool,
}

/// Resident memory of a process in bytes (Linux `/proc`), when it can be read.
fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

pub async fn run(remote: Remote<'_>, json: bool, a: LookupBenchArgs) -> Result<()> {
    if a.per_key == 0 || a.count == 0 {
        bail!("--count and --per-key must be at least 1");
    }
    let (cluster, ns) = setup(remote, &a.target).await?;
    let rss = || -> Vec<Option<u64>> {
        cluster.as_ref().map_or_else(Vec::new, |c| {
            (1..=3).map(|id| c.pid(id).and_then(rss_bytes)).collect()
        })
    };
    let keys = a.count.div_ceil(a.per_key);
    let rss_before = rss();
    let mut stored_secs = None;
    if !a.no_produce {
        eprintln!(
            "storing {} messages of {} B, each with a client id, {} per key",
            a.count, a.size, a.per_key
        );
        let shape = ProduceShape {
            inflight: 256,
            keys,
            ids: true,
            ..Default::default()
        };
        let r = produce(&ns, &a.target.topic, a.count, a.size, shape, true).await?;
        if r.failed > 0 {
            bail!(
                "{} of {} messages were not stored: {}",
                r.failed,
                a.count,
                r.first_error.unwrap_or_default()
            );
        }
        stored_secs = Some(r.elapsed.as_secs_f64());
    }
    let rss_after = rss();

    let admin = ns.admin()?;
    let steal = CpuTimes::read();
    let (mut by_id, mut by_key) = (Vec::new(), Vec::new());
    let mut wrong = 0u32;
    for _ in 0..a.samples {
        let n = rand::random::<u64>() % a.count;
        let t0 = Instant::now();
        let found = admin
            .find_messages(&a.target.topic, By::MsgId(format!("id-{n}")), 1)
            .await?;
        by_id.push(t0.elapsed());
        if found.messages.len() != 1 {
            wrong += 1;
        }
        let key = n % keys;
        let t0 = Instant::now();
        let found = admin
            .find_messages(&a.target.topic, By::Key(format!("key-{key}")), 0)
            .await?;
        by_key.push(t0.elapsed());
        let want = (a.count - key).div_ceil(keys) as usize;
        if found.messages.len() != want.min(32) {
            wrong += 1;
        }
    }
    let steal_pct = steal.and_then(|s| CpuTimes::read()?.steal_pct_since(&s));
    let (id, key) = (summarize(&mut by_id), summarize(&mut by_key));
    let grown: Vec<Option<f64>> = rss_before
        .iter()
        .zip(&rss_after)
        .map(|(b, a)| Some(a.as_ref()?.saturating_sub(*b.as_ref()?) as f64 / 1e6))
        .collect();
    let per_million: Vec<Option<f64>> = grown
        .iter()
        .map(|g| g.map(|mb| mb / (a.count as f64 / 1e6)))
        .collect();
    if json {
        println!(
            "{}",
            json_line(&with_security(
                json!({
                    "bench": "lookup", "messages": a.count, "per_key": a.per_key,
                    "samples": a.samples, "store_seconds": stored_secs, "wrong": wrong,
                    "get_by_id_ms": id, "find_by_key_ms": key,
                    "rss_growth_mb": grown, "rss_mb_per_million": per_million,
                    "cpu_steal_pct": steal_pct,
                }),
                &ns
            ))
        );
    } else {
        println!(
            "lookup in {} messages ({} per key){} ({})",
            a.count,
            a.per_key,
            stored_secs.map_or(String::new(), |s| format!(", stored in {s:.0} s")),
            ns.security_words()
        );
        let row = |what: &str, l: &crate::stats::LatencySummary| {
            vec![
                what.to_string(),
                l.count.to_string(),
                format!("{:.2}", l.p50_ms),
                format!("{:.2}", l.p99_ms),
                format!("{:.2}", l.max_ms),
            ]
        };
        print!(
            "{}",
            table(
                &["LOOKUP", "SAMPLES", "P50_MS", "P99_MS", "MAX_MS"],
                &[row("msg get --id", &id), row("msg find --key", &key)]
            )
        );
        println!("answers not as stored: {wrong}");
        for (i, (g, p)) in grown.iter().zip(&per_million).enumerate() {
            if let (Some(g), Some(p)) = (g, p) {
                println!(
                    "node {}: resident memory grew {g:.0} MB while storing ({p:.1} MB per million)",
                    i + 1
                );
            }
        }
        if let Some(s) = steal_pct {
            println!("{}", steal_line(s));
        }
    }
    if wrong > 0 {
        bail!("{wrong} lookups did not answer what was stored");
    }
    // A local cluster stops here, once the figures are out.
    drop(cluster);
    Ok(())
}
