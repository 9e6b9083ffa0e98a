//! Soak: rounds of the fault-injection scenario (`raftmq_tests::history`) with random faults under
//! load, each round a fresh three-node group, until the duration is spent; then a summary table.
//!
//!     cargo build --release --bins -p raftmq-broker-node -p raftmq-nameserver
//!     cargo run --release -p raftmq-tests --bin soak -- --duration-secs 1200 --seed 42
//!
//! Round `r` uses seed `SEED + r`, so a failing round reruns alone with `--seed` set to the seed it
//! prints. Exit status 1 when any round lost, invented, duplicated, reordered or diverged anything,
//! or did not recover.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use raftmq_tests::history::{FaultKind, FaultPlan, ScenarioCfg, run_scenario};

#[derive(Parser, Debug)]
#[command(about = "Fault-injection soak of a three-node broker group with a history checker")]
struct Args {
    /// How long to keep starting rounds.
    #[arg(long, default_value_t = 1200)]
    duration_secs: u64,
    /// Seed of the first round; round r uses seed + r.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Faults injected per round (one after the other, each healed before the next).
    #[arg(long, default_value_t = 10)]
    faults_per_round: usize,
    /// Concurrent producers.
    #[arg(long, default_value_t = 3)]
    producers: u64,
    /// Fault kinds left out, comma-separated (e.g. "wipe-follower,bit-flip").
    #[arg(long, default_value = "")]
    exclude: String,
}

#[derive(Default)]
struct Totals {
    rounds: u64,
    ops: u64,
    acked_ops: u64,
    acked_msgs: u64,
    unknown_ops: u64,
    failed_ops: u64,
    read_msgs: u64,
    lost: u64,
    unexpected: u64,
    aborted: u64,
    misplaced: u64,
    duplicates: u64,
    divergent: u64,
    missing: u64,
    order: u64,
    offsets_backwards: u64,
    offset_commits: u64,
    read_errors: u64,
    /// kind → (count, longest without ack, longest from heal to first ack)
    faults: BTreeMap<&'static str, (u64, Duration, Duration)>,
    failures: Vec<String>,
}

fn main() {
    let args = Args::parse();
    let excluded: Vec<&str> = args.exclude.split(',').filter(|s| !s.is_empty()).collect();
    for e in &excluded {
        if !FaultKind::ALL.iter().any(|k| k.name() == *e) {
            eprintln!(
                "unknown fault kind {e:?}; kinds: {:?}",
                FaultKind::ALL.map(|k| k.name())
            );
            std::process::exit(2);
        }
    }
    let kinds: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|k| !excluded.contains(&k.name()))
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let t = Instant::now();
    let duration = Duration::from_secs(args.duration_secs);
    let mut tot = Totals::default();
    // Bounded by time (and, as a backstop, by a round count).
    for round in 0..100_000u64 {
        let left = duration.saturating_sub(t.elapsed());
        if left < Duration::from_secs(5) {
            break;
        }
        let seed = args.seed + round;
        let mut cfg = ScenarioCfg::new(
            seed,
            FaultPlan::Random {
                count: args.faults_per_round,
                kinds: kinds.clone(),
            },
        );
        cfg.workload.producers = args.producers;
        cfg.max_duration = left.min(Duration::from_secs(300));
        eprintln!(
            "round {round} seed {seed} ({:.0}s left)",
            left.as_secs_f64()
        );
        let res =
            rt.block_on(async move { tokio::spawn(async move { run_scenario(&cfg).await }).await });
        tot.rounds += 1;
        let report = match res {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                eprintln!("ROUND FAILED (no recovery), seed {seed}:\n{e}");
                tot.failures.push(format!(
                    "seed {seed}: did not recover: {}",
                    e.lines().next().unwrap_or("")
                ));
                continue;
            }
            Err(e) => {
                eprintln!("ROUND PANICKED, seed {seed}: {e}");
                tot.failures.push(format!("seed {seed}: panicked: {e}"));
                continue;
            }
        };
        eprint!("{report}");
        if !report.is_ok() {
            tot.failures.push(format!(
                "seed {seed}: lost {} unexpected {} divergent {} missing {} order {} duplicates {}",
                report.lost,
                report.unexpected,
                report.divergent,
                report.missing,
                report.order,
                report.duplicates
            ));
        }
        tot.ops += report.ops;
        tot.acked_ops += report.acked_ops;
        tot.acked_msgs += report.acked_msgs;
        tot.unknown_ops += report.unknown_ops;
        tot.failed_ops += report.failed_ops;
        tot.read_msgs += report.read_msgs;
        tot.lost += report.lost;
        tot.unexpected += report.unexpected;
        tot.aborted += report.aborted;
        tot.misplaced += report.misplaced;
        tot.duplicates += report.duplicates;
        tot.divergent += report.divergent;
        tot.missing += report.missing;
        tot.order += report.order;
        tot.offsets_backwards += report.offsets_backwards;
        tot.offset_commits += report.offset_commits;
        tot.read_errors += report.read_errors;
        for (fe, l) in report.faults.iter().zip(&report.liveness) {
            let e = tot.faults.entry(fe.kind.name()).or_default();
            e.0 += 1;
            e.1 = e.1.max(l.max_gap);
            e.2 = e.2.max(l.after_heal);
        }
    }
    print_summary(&tot, t.elapsed(), args.seed);
    if !tot.failures.is_empty() {
        std::process::exit(1);
    }
}

fn print_summary(t: &Totals, elapsed: Duration, seed: u64) {
    println!();
    println!(
        "soak summary: {} rounds in {:.0} s, first seed {seed}",
        t.rounds,
        elapsed.as_secs_f64()
    );
    println!("| figure | value |");
    println!("|---|---|");
    for (k, v) in [
        ("operations (sends)", t.ops),
        ("acknowledged sends", t.acked_ops),
        ("acknowledged messages", t.acked_msgs),
        ("unknown sends (timeout)", t.unknown_ops),
        ("failed sends", t.failed_ops),
        ("messages read back (per node)", t.read_msgs),
        ("consumer offset commits", t.offset_commits),
        ("lost", t.lost),
        ("misplaced", t.misplaced),
        ("unexpected", t.unexpected),
        ("aborted (read though failed)", t.aborted),
        ("duplicates", t.duplicates),
        ("divergent offsets", t.divergent),
        ("entries missing on a node", t.missing),
        ("out of order", t.order),
        ("consumer offsets backwards", t.offsets_backwards),
        ("read errors", t.read_errors),
    ] {
        println!("| {k} | {v} |");
    }
    println!();
    println!("| fault | injected | longest without ack | longest heal → first ack |");
    println!("|---|---|---|---|");
    for (k, (n, gap, heal)) in &t.faults {
        println!(
            "| {k} | {n} | {:.3} s | {:.3} s |",
            gap.as_secs_f64(),
            heal.as_secs_f64()
        );
    }
    if t.failures.is_empty() {
        println!("\nno failures");
    } else {
        println!("\nFAILURES:");
        for f in &t.failures {
            println!("  {f}");
        }
    }
}
