//! Soak: rounds of the fault-injection scenario (`raftmq_tests::history`) with random faults under
//! load, each round a fresh three-node group, until the duration is spent; then a summary table.
//!
//!     cargo build --release --bins -p raftmq-broker-node -p raftmq-nameserver
//!     cargo run --release -p raftmq-tests --bin soak -- --duration-secs 1200 --seed 42
//!
//! Round `r` uses seed `SEED + r`, so a failing round reruns alone with `--seed` set to the seed it
//! prints. Exit status 1 when any round lost, invented, duplicated, reordered or diverged anything,
//! or did not recover.
//!
//! Large-log mode (`--large-log-mb N`): each round first fills the group's log with N MiB in
//! 128 KiB entries (`--fill-producers` sends in flight; progress once a second), then runs the
//! load and faults drawn by default from `kill-follower`, `wipe-follower` and
//! `partition-follower-long` (60 s). After each follower fault the round waits for the follower
//! to catch up to the leader's commit index at the heal, within 60 s + N MiB at 20 MiB/s, and fails
//! if it does not. The fill is read back from every node and checked like the load (see
//! `raftmq_tests::history::LargeLogCfg`). The summary adds the catch-up times per kind and how
//! many follower faults raised the group's term.
//!
//!     target/debug/soak --duration-secs 240 --seed 7 --large-log-mb 1024 --faults-per-round 3
//!
//! POP mode (`--pop`): each round also runs three POP consumers of group `pop-hist` (3 attempts,
//! 1-3 s invisible) on the workload's topic under the same faults, drains them after the heal and
//! reads `%DLQ%pop-hist`; the POP counters (see `raftmq_tests::history::pop`) must all be zero.
//!
//!     target/debug/soak --duration-secs 300 --seed 1501 --pop

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use clap::Parser;
use raftmq_tests::history::{
    FaultEvent, FaultKind, FaultPlan, LargeLogCfg, PopCfg, PopReport, Report, ScenarioCfg,
    run_round,
};

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
    /// Fault kinds to draw from, comma-separated (default: every kind but
    /// partition-follower-long; with --large-log-mb: kill-follower, wipe-follower,
    /// partition-follower-long).
    #[arg(long, default_value = "")]
    kinds: String,
    /// Fault kinds left out, comma-separated (e.g. "wipe-follower,bit-flip").
    #[arg(long, default_value = "")]
    exclude: String,
    /// Large-log mode: fill each round's log with this many MiB before the load (0: off).
    #[arg(long, default_value_t = 0)]
    large_log_mb: u64,
    /// Large-log mode: concurrent fill producers (one 128 KiB send in flight each).
    #[arg(long, default_value_t = 8)]
    fill_producers: u64,
    /// POP mode: beside the producers, POP consumers of group `pop-hist` (3 attempts, 1-3 s
    /// invisible) receive the workload's topic and ack, change invisibility or let messages
    /// expire; after the heal they drain it and `%DLQ%pop-hist` is read. Fails a round on a
    /// message redelivered after an OK ack, lost, never settled, an attempt going backwards or
    /// handed out early, or a dead letter duplicated, early, corrupt or acknowledged before.
    #[arg(long)]
    pop: bool,
    /// Producers send every attempt of a batch as a new batch with message ids (as a RocketMQ 5
    /// client's retry through another node is), so the group's record of stored ids
    /// (`SendOnce`) must store each once.
    #[arg(long)]
    new_batch_per_attempt: bool,
    /// Delay mode: beside the producers, two senders schedule messages on a DELAY topic (due 0
    /// to 8 s ahead) under the same faults; after the heal each must be delivered once, never
    /// before its time, identically on every node.
    #[arg(long)]
    delay: bool,
    /// Transaction mode: beside the producers, two senders store half messages on a
    /// TRANSACTION topic and commit, roll back or leave them open under the same faults; after
    /// the heal the open ones are committed, and each committed one must be stored once, each
    /// rolled-back one never, identically on every node.
    #[arg(long)]
    txn: bool,
    /// FIFO mode (implies --pop): the POP group is FIFO and the producers' messages carry
    /// message groups (three per producer, each in one queue); fails a round on a message handed
    /// out before the one before it in its group was acknowledged or dead-lettered.
    #[arg(long)]
    fifo: bool,
    /// POP mode: concurrent POP consumers.
    #[arg(long, default_value_t = 3)]
    pop_consumers: u64,
}

/// Per fault kind.
#[derive(Default)]
struct FaultTotals {
    /// In every round (the two longest-times figures come from the rounds that were checked).
    injected: u64,
    max_gap: Duration,
    max_after_heal: Duration,
    /// Heal → caught up, of every follower that caught up (every round).
    catch_ups: Vec<Duration>,
    catch_up_timeouts: u64,
    /// Follower faults whose terms before and after are known, and those after which it rose.
    terms_known: u64,
    terms_rose: u64,
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
    faults: BTreeMap<&'static str, FaultTotals>,
    failures: Vec<String>,
    /// Large-log mode.
    fills: u64,
    fill_mib: f64,
    fill_secs: f64,
    fill_timeouts: u64,
    fill_msgs_read: u64,
    /// Problems found in the fill (also counted in the figures above).
    fill_problems: u64,
    fill_not_identical: u64,
    fill_read_max: Duration,
    /// POP mode: rounds checked, and the sum of their POP reports (longest drain and settle).
    pops: u64,
    pop: PopReport,
}

/// Fault kinds named in a comma-separated list; exits on an unknown name.
fn parse_kinds(list: &str) -> Vec<FaultKind> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|name| {
            FaultKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .unwrap_or_else(|| {
                    eprintln!(
                        "unknown fault kind {name:?}; kinds: {:?}",
                        FaultKind::ALL.map(|k| k.name())
                    );
                    std::process::exit(2);
                })
        })
        .collect()
}

fn main() {
    let args = Args::parse();
    let excluded = parse_kinds(&args.exclude);
    let chosen = parse_kinds(&args.kinds);
    let base: Vec<FaultKind> = if !chosen.is_empty() {
        chosen
    } else if args.large_log_mb > 0 {
        FaultKind::LARGE_LOG.to_vec()
    } else {
        // Not ALL: a seed then draws the faults it drew before partition-follower-long existed.
        FaultKind::CLASSIC.to_vec()
    };
    let kinds: Vec<FaultKind> = base.into_iter().filter(|k| !excluded.contains(k)).collect();
    if kinds.is_empty() && args.faults_per_round > 0 {
        eprintln!("no fault kind left to draw from");
        std::process::exit(2);
    }
    let large_log = (args.large_log_mb > 0).then(|| {
        let mut l = LargeLogCfg::new(args.large_log_mb);
        l.producers = args.fill_producers.max(1);
        l
    });
    if let Some(l) = &large_log {
        eprintln!(
            "large-log mode: {} MiB per round, {} fill producers, catch-up limit {:.0} s, kinds {:?}",
            l.mib,
            l.producers,
            l.catch_up_timeout.as_secs_f64(),
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>()
        );
    }
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
        cfg.workload.new_batch_per_attempt = args.new_batch_per_attempt;
        cfg.max_duration = left.min(Duration::from_secs(300));
        cfg.large_log = large_log.clone();
        if args.delay {
            cfg.delay = Some(raftmq_tests::history::DelayCfg::default());
        }
        if args.txn {
            cfg.txn = Some(raftmq_tests::history::TxnCfg::default());
        }
        if args.pop || args.fifo {
            cfg.pop = Some(PopCfg {
                consumers: args.pop_consumers.max(1),
                fifo: args.fifo,
                ..PopCfg::default()
            });
        }
        eprintln!(
            "round {round} seed {seed} ({:.0}s left)",
            left.as_secs_f64()
        );
        let res =
            rt.block_on(async move { tokio::spawn(async move { run_round(&cfg).await }).await });
        tot.rounds += 1;
        let outcome = match res {
            Ok(o) => o,
            Err(e) => {
                eprintln!("ROUND PANICKED, seed {seed}: {e}");
                tot.failures.push(format!("seed {seed}: panicked: {e}"));
                continue;
            }
        };
        // Catch-up and terms of every fault, whether or not the round recovered.
        for fe in &outcome.faults {
            add_fault(&mut tot, fe);
        }
        let report = match outcome.result {
            Ok(r) => r,
            Err(e) => {
                eprintln!("ROUND FAILED (no recovery), seed {seed}:\n{e}");
                tot.failures.push(format!(
                    "seed {seed}: did not recover: {}",
                    e.lines().next().unwrap_or("")
                ));
                continue;
            }
        };
        eprint!("{report}");
        if !report.is_ok() {
            let f = report.fill.as_ref().map(|f| &f.check);
            let n = |get: fn(&Report) -> u64| get(&report) + f.map(get).unwrap_or(0);
            tot.failures.push(format!(
                "seed {seed}: lost {} unexpected {} divergent {} missing {} order {} duplicates {}{}{}",
                n(|r| r.lost),
                n(|r| r.unexpected),
                n(|r| r.divergent),
                n(|r| r.missing),
                n(|r| r.order),
                n(|r| r.duplicates),
                match &report.fill {
                    Some(fr) if !fr.sums_identical => " (fill not identical on every node)",
                    _ => "",
                },
                match &report.pop {
                    Some(p) if !p.is_ok() => format!(" (pop: {})", pop_problem_text(p)),
                    _ => String::new(),
                },
            ));
            if let Some(d) = report.delay.as_ref().filter(|d| !d.is_ok()) {
                tot.failures
                    .push(format!("seed {seed}: {}", d.to_string().trim_end()));
            }
            if let Some(t) = report.txn.as_ref().filter(|t| !t.is_ok()) {
                tot.failures
                    .push(format!("seed {seed}: {}", t.to_string().trim_end()));
            }
        }
        add_report(&mut tot, &report);
        if let Some(fr) = &report.fill {
            add_report(&mut tot, &fr.check);
            tot.fills += 1;
            tot.fill_mib += fr.stats.acked_mib();
            tot.fill_secs += fr.stats.took.as_secs_f64();
            tot.fill_timeouts += fr.stats.timed_out as u64;
            tot.fill_msgs_read += fr.check.read_msgs;
            tot.fill_problems += problems(&fr.check);
            tot.fill_not_identical += !fr.sums_identical as u64;
            tot.fill_read_max = tot.fill_read_max.max(fr.read_took);
        }
        for (fe, l) in report.faults.iter().zip(&report.liveness) {
            let e = tot.faults.entry(fe.kind.name()).or_default();
            e.max_gap = e.max_gap.max(l.max_gap);
            e.max_after_heal = e.max_after_heal.max(l.after_heal);
        }
    }
    print_summary(&tot, t.elapsed(), args.seed, large_log.as_ref());
    if !tot.failures.is_empty() {
        std::process::exit(1);
    }
}

fn problems(r: &Report) -> u64 {
    r.lost
        + r.misplaced
        + r.unexpected
        + r.aborted
        + r.divergent
        + r.missing
        + r.order
        + r.duplicates
        + r.offsets_backwards
        + r.read_errors
        + r.pop.as_ref().map_or(0, |p| p.problems())
}

/// The POP problem counters that are not zero.
fn pop_problem_text(p: &PopReport) -> String {
    pop_problem_rows(p)
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every POP problem counter, named as in the summary.
fn pop_problem_rows(p: &PopReport) -> [(&'static str, u64); 12] {
    [
        ("pop: redelivered after an OK ack", p.redelivered_after_ack),
        ("pop: lost (never received, not dead-lettered)", p.lost),
        (
            "pop: unsettled (never acked, not dead-lettered)",
            p.unsettled,
        ),
        ("pop: attempt backwards", p.attempt_backwards),
        ("pop: attempt out of range", p.attempt_out_of_range),
        ("pop: redelivered before its deadline", p.redelivered_early),
        ("pop: dead-letter duplicates", p.dlq_duplicates),
        ("pop: dead-lettered early", p.dlq_early),
        ("pop: dead letter corrupt", p.dlq_corrupt),
        ("pop: acked, then dead-lettered", p.acked_then_dlq),
        ("pop: drain timeouts", p.drain_timeouts),
        ("pop: dead-letter read errors", p.dlq_errors),
    ]
}

/// Adds one round's POP report to the totals.
fn add_pop(t: &mut PopReport, p: &PopReport) {
    t.calls += p.calls;
    t.calls_unknown += p.calls_unknown;
    t.received += p.received;
    t.messages += p.messages;
    t.stored += p.stored;
    t.redelivered += p.redelivered;
    t.ignored += p.ignored;
    t.acked += p.acked;
    t.ack_invalid += p.ack_invalid;
    t.ack_not_applied += p.ack_not_applied;
    t.ack_unknown += p.ack_unknown;
    t.changed += p.changed;
    t.change_stale += p.change_stale;
    t.change_unknown += p.change_unknown;
    t.dead_lettered += p.dead_lettered;
    t.drain_received += p.drain_received;
    t.drain_took = t.drain_took.max(p.drain_took);
    t.dlq_waited = t.dlq_waited.max(p.dlq_waited);
    t.redelivered_after_ack += p.redelivered_after_ack;
    t.lost += p.lost;
    t.unsettled += p.unsettled;
    t.attempt_backwards += p.attempt_backwards;
    t.attempt_out_of_range += p.attempt_out_of_range;
    t.redelivered_early += p.redelivered_early;
    t.dlq_duplicates += p.dlq_duplicates;
    t.dlq_early += p.dlq_early;
    t.dlq_corrupt += p.dlq_corrupt;
    t.acked_then_dlq += p.acked_then_dlq;
    t.drain_timeouts += p.drain_timeouts;
    t.dlq_errors += p.dlq_errors;
}

/// Catch-up and term figures of one fault.
fn add_fault(tot: &mut Totals, fe: &FaultEvent) {
    let e = tot.faults.entry(fe.kind.name()).or_default();
    e.injected += 1;
    if let Some(cu) = &fe.catch_up {
        if cu.caught_up {
            e.catch_ups.push(cu.took);
        } else {
            e.catch_up_timeouts += 1;
        }
    }
    if fe.kind.leaves_leader()
        && let Some(rose) = fe.term_rose()
    {
        e.terms_known += 1;
        e.terms_rose += rose as u64;
    }
}

fn add_report(tot: &mut Totals, report: &Report) {
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
    if let Some(p) = &report.pop {
        tot.pops += 1;
        add_pop(&mut tot.pop, p);
    }
}

/// "p50 / max (n)" of catch-up times, with the timeouts.
fn catch_up_cell(f: &FaultTotals) -> String {
    let mut v = f.catch_ups.clone();
    v.sort();
    let mut s = match (v.get(v.len().saturating_sub(1) / 2), v.last()) {
        (Some(p50), Some(max)) => format!(
            "{:.1} s / {:.1} s ({})",
            p50.as_secs_f64(),
            max.as_secs_f64(),
            v.len()
        ),
        _ => "-".to_string(),
    };
    if f.catch_up_timeouts > 0 {
        s.push_str(&format!(", {} TIMED OUT", f.catch_up_timeouts));
    }
    s
}

fn print_summary(t: &Totals, elapsed: Duration, seed: u64, large_log: Option<&LargeLogCfg>) {
    println!();
    println!(
        "soak summary: {} rounds in {:.0} s, first seed {seed}{}",
        t.rounds,
        elapsed.as_secs_f64(),
        match large_log {
            Some(l) => format!(", large-log mode {} MiB", l.mib),
            None => String::new(),
        }
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
    if t.pops > 0 {
        let p = &t.pop;
        for (k, v) in [
            ("pop: rounds checked", t.pops),
            ("pop: receives", p.calls),
            ("pop: receives of unknown outcome", p.calls_unknown),
            ("pop: deliveries received", p.received),
            ("pop: distinct messages received", p.messages),
            ("pop: messages stored", p.stored),
            ("pop: acks answered OK", p.acked),
            ("pop: acks answered INVALID", p.ack_invalid),
            ("pop: acks of unknown outcome", p.ack_unknown),
            ("pop: acks never applied", p.ack_not_applied),
            ("pop: deliveries left to expire", p.ignored),
            ("pop: expired and redelivered (attempt > 1)", p.redelivered),
            ("pop: invisibility changed (OK)", p.changed),
            ("pop: dead-lettered", p.dead_lettered),
            ("pop: received by the drains", p.drain_received),
        ] {
            println!("| {k} | {v} |");
        }
        println!(
            "| pop: longest drain, longest dead-letter settle | {:.1} s, {:.1} s |",
            p.drain_took.as_secs_f64(),
            p.dlq_waited.as_secs_f64()
        );
        for (k, v) in pop_problem_rows(p) {
            println!("| {k} | {v} |");
        }
    }
    let (known, rose) = t
        .faults
        .values()
        .fold((0, 0), |(k, r), f| (k + f.terms_known, r + f.terms_rose));
    println!("| terms changed by follower faults | {rose} of {known} |");
    if large_log.is_some() {
        println!(
            "| fill: rounds filled (timed out) | {} ({}) |",
            t.fills, t.fill_timeouts
        );
        println!(
            "| fill: MiB acknowledged, MiB/s | {:.0}, {:.1} |",
            t.fill_mib,
            t.fill_mib / t.fill_secs.max(1e-3)
        );
        println!(
            "| fill: messages read back (per node) | {} |",
            t.fill_msgs_read
        );
        println!(
            "| fill: problems (counted above too) | {} |",
            t.fill_problems
        );
        println!(
            "| fill: rounds not identical on every node | {} |",
            t.fill_not_identical
        );
        println!(
            "| fill: longest read-back (3 nodes) | {:.1} s |",
            t.fill_read_max.as_secs_f64()
        );
    }
    println!();
    println!(
        "| fault | injected | longest without ack | longest heal → first ack | heal → caught up \
         p50 / max (n) | term rose |"
    );
    println!("|---|---|---|---|---|---|");
    for (k, f) in &t.faults {
        let terms = if f.terms_known > 0 {
            format!("{} of {}", f.terms_rose, f.terms_known)
        } else {
            "-".to_string()
        };
        println!(
            "| {k} | {} | {:.3} s | {:.3} s | {} | {terms} |",
            f.injected,
            f.max_gap.as_secs_f64(),
            f.max_after_heal.as_secs_f64(),
            catch_up_cell(f)
        );
    }
    println!();
    println!(
        "{}TERMS CHANGED BY FOLLOWER FAULTS: {rose} of {known} follower faults were followed by a \
         higher term",
        if rose > 0 { "!!! " } else { "" }
    );
    if t.failures.is_empty() {
        println!("\nno failures");
    } else {
        println!("\nFAILURES:");
        for f in &t.failures {
            println!("  {f}");
        }
    }
}
