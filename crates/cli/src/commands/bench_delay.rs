//! `raftmq bench delay`: how late scheduled messages arrive. Schedules `--count` messages on a
//! DELAY topic, due evenly over `--window` starting `--lead` from now, and, while they come due,
//! keeps a producer sending to a NORMAL topic as fast as acknowledgements allow (unless
//! `--no-load`). A consumer reads the DELAY topic; per message it records the lateness of its
//! delivery (store time − delivery time: both stamped by the group, so the consumer's own pace
//! plays no part) and of its receipt (when the consumer got it − delivery time). Prints both as
//! a table, the load's rate and the CPU steal.

use std::time::Duration;

use anyhow::{Result, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use raftmq_client::{Message, StartFrom};
use raftmq_proto::v1::TopicMessageType;
use serde_json::json;
use tokio::time::Instant;

use crate::args::BenchTarget;
use crate::commands::bench::{
    ProduceShape, Remote, StealMeter, produce, setup, steal_line, with_security,
};
use crate::output::{json_line, table};

#[derive(Debug, clap::Args)]
pub struct DelayBenchArgs {
    #[command(flatten)]
    pub target: BenchTarget,
    /// Messages to schedule.
    #[arg(long, default_value_t = 100_000)]
    pub count: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// The delivery times are spread evenly over this many seconds…
    #[arg(long, default_value_t = 60)]
    pub window_secs: u64,
    /// …starting this many seconds from now (scheduling them all takes a few seconds).
    #[arg(long, default_value_t = 10)]
    pub lead_secs: u64,
    /// No producer load on the NORMAL topic while the messages come due.
    #[arg(long)]
    pub no_load: bool,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

pub async fn run(remote: Remote<'_>, json: bool, a: DelayBenchArgs) -> Result<()> {
    if a.count == 0 || a.window_secs == 0 {
        bail!("--count and --window-secs must be at least 1");
    }
    // The load goes to the target topic (NORMAL); the scheduled messages to `<topic>-delay`.
    let (cluster, ns) = setup(remote, &a.target).await?;
    let delay_topic = format!("{}-delay", a.target.topic);
    let admin = ns.admin()?;
    if admin.route(&delay_topic).await.is_err() {
        admin
            .create_topic_typed(&delay_topic, a.target.queues, None, TopicMessageType::Delay)
            .await?;
    }
    let start = now_ms() + a.lead_secs * 1000;
    let window_ms = a.window_secs * 1000;
    eprintln!(
        "scheduling {} messages of {} B, due evenly over {} s from {} s from now",
        a.count, a.size, a.window_secs, a.lead_secs
    );
    let producer = ns.producer().build()?;
    let t0 = Instant::now();
    let mut pending = FuturesUnordered::new();
    let mut failed = 0u64;
    for i in 0..a.count {
        let at = start + window_ms * i / a.count;
        let mut body = format!("{at}|").into_bytes();
        body.resize(a.size.max(body.len()), b'x');
        pending.push(producer.send(&delay_topic, Message::new(body).deliver_at_ms(at)));
        while pending.len() >= 256 {
            if let Some(Err(_)) = pending.next().await {
                failed += 1;
            }
        }
    }
    while let Some(r) = pending.next().await {
        if r.is_err() {
            failed += 1;
        }
    }
    drop(pending);
    producer.close().await;
    let scheduled_secs = t0.elapsed().as_secs_f64();
    if failed > 0 {
        bail!(
            "{failed} of {} scheduled messages were not acknowledged",
            a.count
        );
    }
    eprintln!(
        "scheduled in {scheduled_secs:.1} s; {} s until the first is due",
        start.saturating_sub(now_ms()) / 1000
    );

    let steal = StealMeter::start();
    // The load: as fast as acknowledgements allow, until the last message is due.
    let load = (!a.no_load).then(|| {
        let (ns, topic, size) = (ns.clone(), a.target.topic.clone(), a.size);
        let until = start + window_ms;
        tokio::spawn(async move {
            let mut sent = 0u64;
            let t = Instant::now();
            while now_ms() < until {
                let chunk = 50_000;
                let shape = ProduceShape {
                    inflight: 256,
                    ..Default::default()
                };
                let r = produce(&ns, &topic, chunk, size, shape, false).await?;
                sent += r.acked;
            }
            anyhow::Ok((sent, t.elapsed().as_secs_f64()))
        })
    });

    let mut consumer = ns
        .consumer(&format!("bench-delay-{}", now_ms()), &delay_topic)
        .start_from(StartFrom::Earliest)
        .build()?;
    let (mut stored_late, mut received_late) = (Vec::new(), Vec::new());
    let mut early = 0u64;
    let deadline = start + window_ms + 60_000;
    let mut next_report = Instant::now() + Duration::from_secs(5);
    while (stored_late.len() as u64) < a.count && now_ms() < deadline {
        let batch = consumer.poll(1000, Duration::from_millis(500)).await?;
        let got = now_ms();
        for m in batch {
            let Some(at) = m
                .properties
                .get(raftmq_proto::DELIVER_AT_PROPERTY)
                .and_then(|v| v.parse::<u64>().ok())
            else {
                continue;
            };
            if m.store_timestamp_ms < at {
                early += 1;
            }
            stored_late.push(m.store_timestamp_ms.saturating_sub(at));
            received_late.push(got.saturating_sub(at));
        }
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(5);
            eprintln!("  {} of {} delivered", stored_late.len(), a.count);
        }
    }
    consumer.close().await?;
    let load = match load {
        Some(h) => Some(h.await??),
        None => None,
    };
    let cpu_steal_pct = steal.pct();
    drop(cluster);
    stored_late.sort_unstable();
    received_late.sort_unstable();
    let n = stored_late.len() as u64;
    let load_rate = load.map(|(sent, secs)| sent as f64 / secs.max(1e-9));
    if json {
        println!(
            "{}",
            json_line(&with_security(
                json!({
                    "bench": "delay", "scheduled": a.count, "delivered": n, "early": early,
                    "window_secs": a.window_secs, "scheduled_secs": scheduled_secs,
                    "stored_late_ms": {"p50": pct(&stored_late, 0.5),
                        "p99": pct(&stored_late, 0.99), "max": stored_late.last()},
                    "received_late_ms": {"p50": pct(&received_late, 0.5),
                        "p99": pct(&received_late, 0.99), "max": received_late.last()},
                    "load_msgs_per_sec": load_rate, "cpu_steal_pct": cpu_steal_pct,
                }),
                &ns
            ))
        );
    } else {
        println!(
            "{n} of {} scheduled messages delivered ({early} before their time); due over {} s{} \
             ({})",
            a.count,
            a.window_secs,
            load_rate.map_or(" with no other load".into(), |r| format!(
                " while a producer sent {r:.0} msg/s of {} B to {}",
                a.size, a.target.topic
            )),
            ns.security_words()
        );
        let row = |what: &str, v: &[u64]| {
            vec![
                what.to_string(),
                pct(v, 0.5).to_string(),
                pct(v, 0.99).to_string(),
                v.last().copied().unwrap_or(0).to_string(),
            ]
        };
        print!(
            "{}",
            table(
                &["LATENESS", "P50 MS", "P99 MS", "MAX MS"],
                &[
                    row("stored (store time - delivery time)", &stored_late),
                    row("received by the consumer", &received_late),
                ],
            )
        );
        if let Some(p) = cpu_steal_pct {
            println!("{}", steal_line(p));
        }
    }
    if n < a.count {
        bail!(
            "{} of {} scheduled messages were not delivered in time",
            a.count - n,
            a.count
        );
    }
    if early > 0 {
        bail!("{early} messages were delivered before their time");
    }
    Ok(())
}
