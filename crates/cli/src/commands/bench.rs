//! `raftmq bench produce|consume|failover` (and `pop`, in [`super::bench_pop`]): progress on stderr while running, then figures
//! (a table, or one JSON object with `--json`). Benchmarks measure; they assert nothing.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use raftmq_client::{Admin, Consumer, ErrorCode, Message, Producer, StartFrom};
use serde_json::json;
use tokio::time::Instant;

use crate::args::{BenchCmd, BenchTarget};
use crate::commands::bench_hops;
use crate::commands::produce::generated_body;
use crate::connect::Target;
use crate::load::{Load, verify};
use crate::local_cluster::{LocalCluster, LocalClusterOptions};
use crate::output::{json_line, table};
use crate::stats::{CpuTimes, LatencySummary, summarize, throughput};

/// The cluster of `--nameserver` with the security options, made when a bench uses it.
pub type Remote<'a> = &'a dyn Fn() -> Result<Target>;

pub async fn run(remote: Remote<'_>, json: bool, cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Produce {
            target,
            count,
            size,
            shape,
        } => {
            let (cluster, ns) = setup(remote, &target).await?;
            let many = match shape.topics > 1 {
                true => Some(make_topics(&ns, cluster.as_ref(), &target, shape.topics).await?),
                false => None,
            };
            // One at a time, the nodes' histograms split each send into its hops.
            let nodes = match (&cluster, shape.inflight) {
                (Some(c), 1) if !c.is_secure() => c.node_addrs(),
                _ => Vec::new(),
            };
            let before = bench_hops::scrape_all(&nodes).await;
            let r = produce(&ns, &target.topic, count, size, shape, true).await?;
            let t = throughput(r.acked, size, r.elapsed);
            let hops = match nodes.is_empty() {
                true => None,
                false => bench_hops::split(
                    &before,
                    &bench_hops::scrape_all(&nodes).await,
                    (r.latency.mean_ms * 1e3, r.latency.p50_ms * 1e3),
                ),
            };
            if json {
                let mut v = json!({
                    "bench": "produce", "size": size, "inflight": shape.inflight,
                    "keys": shape.keys, "topics": shape.topics.max(1),
                    "messages": t.messages, "failed": r.failed,
                    "seconds": t.seconds, "msgs_per_sec": t.msgs_per_sec,
                    "mb_per_sec": t.mb_per_sec, "latency_ms": r.latency,
                    "cpu_steal_pct": r.cpu_steal_pct,
                });
                if let Some(h) = &hops {
                    v["hops"] = h.json();
                }
                if let Some(m) = &many {
                    v["queues"] = json!(m.queues);
                    v["create_topics_seconds"] = json!(m.create_secs);
                    v["leader_rss_before_topics"] = json!(m.leader_rss.map(|r| r.0));
                    v["leader_rss_after_topics"] = json!(m.leader_rss.map(|r| r.1));
                    v["route_lookup_ms_one_topic"] = json!(m.route_before);
                    v["route_lookup_ms_all_topics"] = json!(m.route_after);
                    v["leader_rss_after_run"] = json!(m.leader_pid.and_then(rss_bytes));
                }
                println!("{}", json_line(&with_security(v, &ns)));
            } else {
                if let Some(m) = &many {
                    println!(
                        "{} topics, {} queues made in {:.1} s",
                        m.topics, m.queues, m.create_secs
                    );
                    if let Some((a, b)) = m.leader_rss {
                        println!(
                            "leader memory: {:.1} MB before, {:.1} MB after: {:.0} bytes per queue",
                            a as f64 / 1e6,
                            b as f64 / 1e6,
                            b.saturating_sub(a) as f64 / m.queues.max(1) as f64
                        );
                    }
                    println!(
                        "route lookup p50/p99: {:.2}/{:.2} ms for one topic, {:.2}/{:.2} ms over all {}",
                        m.route_before.p50_ms,
                        m.route_before.p99_ms,
                        m.route_after.p50_ms,
                        m.route_after.p99_ms,
                        m.topics
                    );
                    if let Some((rss, (_, before))) =
                        m.leader_pid.and_then(rss_bytes).zip(m.leader_rss)
                    {
                        println!(
                            "leader memory after the run: {:.1} MB ({:.0} bytes per message stored)",
                            rss as f64 / 1e6,
                            rss.saturating_sub(before) as f64 / t.messages.max(1) as f64
                        );
                    }
                }
                let keys = if shape.keys > 0 {
                    format!(", {} keys", shape.keys)
                } else {
                    String::new()
                };
                print_figures(
                    &format!(
                        "produce {size} B, {} in flight{keys} ({})",
                        shape.inflight,
                        ns.security_words()
                    ),
                    t.messages,
                    t.seconds,
                    t.msgs_per_sec,
                    t.mb_per_sec,
                    Some(&r.latency),
                );
                if let Some(steal) = r.cpu_steal_pct {
                    println!("{}", steal_line(steal));
                }
                if let Some(h) = &hops {
                    println!("{}", h.table());
                }
            }
            if r.failed > 0 {
                bail!(
                    "{} sends failed: {}",
                    r.failed,
                    r.first_error.unwrap_or_default()
                );
            }
            Ok(())
        }
        BenchCmd::Consume {
            target,
            count,
            size,
            group,
            timeout_ms,
        } => {
            let (_cluster, ns) = setup(remote, &target).await?;
            if target.local {
                eprintln!("producing {count} messages first");
                let shape = ProduceShape {
                    inflight: 256,
                    ..Default::default()
                };
                produce(&ns, &target.topic, count, size, shape, false).await?;
            }
            let group = group.unwrap_or_else(|| format!("bench-{:08x}", rand::random::<u32>()));
            consume(
                &ns,
                json,
                &target.topic,
                &group,
                count,
                timeout_ms,
                target.local,
            )
            .await
        }
        BenchCmd::Pop(args) => crate::commands::bench_pop::run(remote, json, args).await,
        BenchCmd::Lookup(args) => crate::commands::bench_lookup::run(remote, json, args).await,
        BenchCmd::Delay(args) => crate::commands::bench_delay::run(remote, json, args).await,
        BenchCmd::Failover {
            kills,
            senders,
            no_verify,
            stop,
            secure,
        } => failover(json, kills, senders, !no_verify, stop, secure).await,
        BenchCmd::Catchup {
            mode,
            mb,
            size,
            load,
            load_senders,
            baseline_secs,
            timeout_secs,
        } => {
            let args = crate::commands::catchup::CatchupArgs {
                mode,
                mb,
                size,
                load,
                load_senders,
                baseline_secs,
                timeout_secs,
            };
            crate::commands::catchup::run(json, args).await
        }
        BenchCmd::Restart {
            mb,
            size,
            cold,
            timeout_secs,
        } => {
            let args = crate::commands::restart_bench::RestartArgs {
                mb,
                size,
                cold,
                timeout_secs,
            };
            crate::commands::restart_bench::run(json, args).await
        }
    }
}

/// Measures the CPU steal from its start.
pub(crate) struct StealMeter(Option<CpuTimes>);

impl StealMeter {
    pub(crate) fn start() -> StealMeter {
        StealMeter(CpuTimes::read())
    }

    /// Percent of the machine's CPU time stolen since the start (None without /proc/stat).
    pub(crate) fn pct(&self) -> Option<f64> {
        let start = self.0.as_ref()?;
        CpuTimes::read()?.steal_pct_since(start)
    }
}

/// The CPU steal of a run, in words: on a shared VM, runs with much steal are not comparable.
pub(crate) fn steal_line(pct: f64) -> String {
    let note = if pct >= 2.0 {
        " (the hypervisor ran other work: compare runs with little steal)"
    } else {
        ""
    };
    format!("cpu steal during the run: {pct:.1}% of this machine's CPU time{note}")
}

/// The JSON fields every bench reports on how its clients reached the cluster: `"tls"` (every
/// connection TLS) and `"signed"` (every request signed; a local `--secure` cluster checks it).
pub(crate) fn with_security(mut v: serde_json::Value, ns: &Target) -> serde_json::Value {
    if let Some(o) = v.as_object_mut() {
        o.insert("tls".into(), json!(ns.security.is_tls()));
        o.insert("signed".into(), json!(ns.security.is_signed()));
    }
    v
}

/// A local cluster, plaintext or with TLS and auth on (`secure`), started for one bench.
pub(crate) async fn start_local(secure: bool) -> Result<LocalCluster> {
    if secure {
        eprintln!("starting a local cluster with TLS and authentication on");
    } else {
        eprintln!("starting a local cluster");
    }
    LocalCluster::start(LocalClusterOptions::default().secure(secure)).await
}

/// A local cluster when asked (plaintext, or secure with `--secure`), else the cluster of
/// `--nameserver` (with the security options); and the topic (created when missing).
pub(crate) async fn setup(
    remote: Remote<'_>,
    target: &BenchTarget,
) -> Result<(Option<LocalCluster>, Target)> {
    let (cluster, ns) = if target.local {
        let c = start_local(target.secure).await?;
        let ns = Target::local(&c);
        (Some(c), ns)
    } else {
        (None, remote()?)
    };
    let admin = ns.admin()?;
    match admin.route(&target.topic).await {
        Ok(_) => {}
        Err(e) if e.code() == Some(ErrorCode::TopicNotFound) => {
            admin
                .create_topic(&target.topic, target.queues, None)
                .await
                .with_context(|| format!("creating topic {}", target.topic))?;
        }
        Err(e) => return Err(e.into()),
    }
    Ok((cluster, ns))
}

pub(crate) struct ProduceRun {
    pub(crate) acked: u64,
    pub(crate) failed: u64,
    pub(crate) first_error: Option<String>,
    pub(crate) elapsed: Duration,
    pub(crate) latency: LatencySummary,
    /// Percent of the machine's CPU time the hypervisor took during the run (Linux VMs).
    cpu_steal_pct: Option<f64>,
}

/// How the produce bench drives its producer (the `bench produce` flags).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct ProduceShape {
    /// Messages awaiting acknowledgement at once (1 = one message at a time).
    #[arg(long, default_value_t = 256)]
    pub(crate) inflight: usize,
    /// Producer linger in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) linger_ms: u64,
    /// Producer window: most batches in flight at once (default: the producer's).
    #[arg(long)]
    pub(crate) inflight_batches: Option<usize>,
    /// Producer window per broker group: most batches in flight to one group (default: the
    /// producer's).
    #[arg(long)]
    pub(crate) broker_inflight_batches: Option<usize>,
    /// Batches in flight at once per queue (messages without a key; default: the producer's).
    #[arg(long)]
    pub(crate) lanes: Option<usize>,
    /// Most messages in one batch (default: the producer's)
    #[arg(long)]
    pub(crate) batch_messages: Option<usize>,
    /// Give messages keys, cycling through this many (`key-0`, `key-1`, ...): each key's
    /// messages go to one queue, in order. 0: no keys.
    #[arg(long, default_value_t = 0)]
    pub(crate) keys: u64,
    /// Give each message a client message id (`__rmq.msgid` = `id-N`, as RocketMQ 5 clients
    /// set one), which broker groups index for `msg get`.
    #[arg(long)]
    pub(crate) ids: bool,
    /// Spread the sends round-robin over this many topics (`<topic>-0` … `<topic>-(N-1)`, each
    /// with --queues queues, created when missing) instead of the one --topic. Also reports the
    /// leader's memory per queue and route lookups before and after making them.
    #[arg(long, default_value_t = 1)]
    pub(crate) topics: u32,
}

/// The names `produce` sends to: `topic`, or `topic-0` … with `--topics N`.
fn topic_names(topic: &str, topics: u32) -> Vec<String> {
    if topics > 1 {
        (0..topics).map(|i| format!("{topic}-{i}")).collect()
    } else {
        vec![topic.to_string()]
    }
}

/// A process's resident memory in bytes (Linux), if it can be read.
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// What making many topics cost (`bench produce --topics N`).
struct ManyTopics {
    topics: u32,
    queues: u64,
    create_secs: f64,
    /// The leader's resident memory before and after making them (local clusters only).
    leader_rss: Option<(u64, u64)>,
    /// 200 route lookups of the one topic before, and over all of them after.
    route_before: LatencySummary,
    route_after: LatencySummary,
    leader_pid: Option<u32>,
}

/// Times 200 route lookups, cycling over `names` with a stride.
async fn route_lookups(admin: &Admin, names: &[String]) -> Result<LatencySummary> {
    let mut lat = Vec::with_capacity(200);
    for i in 0..200usize {
        let name = &names[(i * 7919) % names.len()];
        let t0 = Instant::now();
        admin
            .route(name)
            .await
            .with_context(|| format!("route of {name}"))?;
        lat.push(t0.elapsed());
    }
    Ok(crate::stats::summarize(&mut lat))
}

/// Makes the topics of `bench produce --topics N` (those missing), measuring what they cost.
async fn make_topics(
    ns: &Target,
    cluster: Option<&LocalCluster>,
    target: &BenchTarget,
    topics: u32,
) -> Result<ManyTopics> {
    let admin = ns.admin()?;
    let leader_pid = match cluster {
        Some(c) => live_leader(c, &admin).await.and_then(|(id, _)| c.pid(id)),
        None => None,
    };
    let route_before = route_lookups(&admin, std::slice::from_ref(&target.topic)).await?;
    let rss0 = leader_pid.and_then(rss_bytes);
    let names = topic_names(&target.topic, topics);
    let t0 = Instant::now();
    for (i, name) in names.iter().enumerate() {
        match admin.route(name).await {
            Ok(_) => continue,
            Err(e) if e.code() == Some(ErrorCode::TopicNotFound) => {}
            Err(e) => return Err(e.into()),
        }
        admin
            .create_topic(name, target.queues, None)
            .await
            .with_context(|| format!("creating topic {name}"))?;
        if (i + 1) % 100 == 0 {
            eprintln!("  made {} of {topics} topics", i + 1);
        }
    }
    let create_secs = t0.elapsed().as_secs_f64();
    let rss1 = leader_pid.and_then(rss_bytes);
    let route_after = route_lookups(&admin, &names).await?;
    Ok(ManyTopics {
        topics,
        queues: topics as u64 * target.queues as u64,
        create_secs,
        leader_rss: rss0.zip(rss1),
        route_before,
        route_after,
        leader_pid,
    })
}

/// The property RocketMQ 5 clients' message ids are stored in (the RocketMQ 5 front's name).
pub(crate) const CLIENT_ID_PROPERTY: &str = raftmq_rocketmq_v2::convert::P_MSGID;

pub(crate) async fn produce(
    ns: &Target,
    topic: &str,
    count: u64,
    size: usize,
    shape: ProduceShape,
    progress: bool,
) -> Result<ProduceRun> {
    let inflight = shape.inflight;
    let mut builder = ns.producer().linger(Duration::from_millis(shape.linger_ms));
    if let Some(n) = shape.inflight_batches {
        builder = builder.inflight_batches(n);
    }
    if let Some(n) = shape.broker_inflight_batches {
        builder = builder.broker_inflight_batches(n);
    }
    if let Some(n) = shape.lanes {
        builder = builder.unkeyed_lanes_per_queue(n);
    }
    if let Some(n) = shape.batch_messages {
        builder = builder.batch_messages(n);
    }
    let producer = builder.build()?;
    let topics = topic_names(topic, shape.topics);
    let mut lat = Vec::with_capacity(count as usize);
    let mut pending = FuturesUnordered::new();
    let (mut sent, mut acked, mut failed) = (0u64, 0u64, 0u64);
    let mut first_error = None;
    let started = Instant::now();
    let steal = StealMeter::start();
    let mut next_report = started + Duration::from_secs(1);
    let mut last_acked = 0u64;
    while acked + failed < count {
        while sent < count && pending.len() < inflight.max(1) {
            let body = generated_body(sent, size);
            let mut message = if shape.keys > 0 {
                Message::new(body).with_key(format!("key-{}", sent % shape.keys))
            } else {
                Message::new(body)
            };
            if shape.ids {
                message = message.with_property(CLIENT_ID_PROPERTY, format!("id-{sent}"));
            }
            let to = topics[(sent % topics.len() as u64) as usize].as_str();
            sent += 1;
            let p = &producer;
            pending.push(async move {
                let t0 = Instant::now();
                let r = p.send(to, message).await;
                (t0.elapsed(), r)
            });
        }
        let Some((d, r)) = pending.next().await else {
            break;
        };
        match r {
            Ok(_) => {
                acked += 1;
                lat.push(d);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
        if progress && Instant::now() >= next_report {
            eprintln!(
                "  {:>5.1} s  acked {acked:>9}  {:>9.0} msg/s",
                started.elapsed().as_secs_f64(),
                (acked - last_acked) as f64
            );
            last_acked = acked;
            next_report += Duration::from_secs(1);
        }
    }
    let elapsed = started.elapsed();
    let cpu_steal_pct = steal.pct();
    drop(pending);
    producer.close().await;
    Ok(ProduceRun {
        acked,
        failed,
        first_error,
        elapsed,
        latency: summarize(&mut lat),
        cpu_steal_pct,
    })
}

async fn consume(
    ns: &Target,
    json: bool,
    topic: &str,
    group: &str,
    count: u64,
    timeout_ms: u64,
    backlog: bool,
) -> Result<()> {
    // The clock runs from the consumer's start, group join and first pulls included: the
    // consumer prefetches while it joins, so timing from the first message polled counted
    // messages that had arrived before it.
    let started = Instant::now();
    let steal = StealMeter::start();
    let mut consumer = ns
        .consumer(group, topic)
        .start_from(StartFrom::Earliest)
        .build()?;
    let timeout = Duration::from_millis(timeout_ms);
    let drain = poll_n(&mut consumer, count, timeout, started, true).await?;
    let elapsed = drain
        .last
        .map_or(Duration::ZERO, |l| l.duration_since(started));
    let avg = drain.bytes.checked_div(drain.n).unwrap_or(0) as usize;
    let t = throughput(drain.n, avg, elapsed);
    let cpu_steal_pct = steal.pct();
    // Store → read of a backlog produced before is its age, not a latency: measure it on
    // messages produced while the consumer reads (at most 16 awaiting acknowledgement).
    let live = if backlog && drain.n >= count {
        let n = (count / 10).clamp(1_000, 20_000);
        let (ns, topic) = (ns.clone(), topic.to_string());
        let shape = ProduceShape {
            inflight: 16,
            ..Default::default()
        };
        let producing =
            tokio::spawn(async move { produce(&ns, &topic, n, avg, shape, false).await });
        let mut r = poll_n(&mut consumer, n, timeout, Instant::now(), false).await?;
        producing.await??;
        Some((r.n, summarize(&mut r.lat)))
    } else {
        None
    };
    consumer.close().await?;
    let mut lat = drain.lat;
    let drain_lat = (!backlog).then(|| summarize(&mut lat));
    if json {
        println!(
            "{}",
            json_line(&with_security(
                json!({
                    "bench": "consume", "group": group, "messages": drain.n, "seconds": t.seconds,
                    "msgs_per_sec": t.msgs_per_sec, "mb_per_sec": t.mb_per_sec,
                    "backlog": backlog,
                    "end_to_end_latency_ms": live.as_ref().map(|(_, l)| l).or(drain_lat.as_ref()),
                    "end_to_end_latency_messages": live.as_ref().map(|(n, _)| n),
                    "cpu_steal_pct": cpu_steal_pct,
                }),
                ns
            ))
        );
    } else {
        let what = if backlog {
            "consume a backlog produced first (latency: see below)"
        } else {
            "consume (latency: store → read)"
        };
        print_figures(
            &format!("{what} ({})", ns.security_words()),
            drain.n,
            t.seconds,
            t.msgs_per_sec,
            t.mb_per_sec,
            drain_lat.as_ref(),
        );
        if let Some(pct) = cpu_steal_pct {
            println!("{}", steal_line(pct));
        }
        if let Some((n, l)) = &live {
            println!(
                "store → read latency of {n} messages produced while consuming (16 in flight)"
            );
            print!(
                "{}",
                table(
                    &["MESSAGES", "P50 MS", "P99 MS", "P999 MS", "MAX MS"],
                    &[vec![
                        n.to_string(),
                        format!("{:.2}", l.p50_ms),
                        format!("{:.2}", l.p99_ms),
                        format!("{:.2}", l.p999_ms),
                        format!("{:.2}", l.max_ms),
                    ]],
                )
            );
        }
    }
    if drain.n < count {
        bail!(
            "consumed {} of {count} messages before {timeout_ms} ms passed without any",
            drain.n
        );
    }
    Ok(())
}

/// What [`poll_n`] read.
struct Polled {
    n: u64,
    bytes: u64,
    /// Store → read, millisecond resolution (the store time is the leader's clock, in ms).
    lat: Vec<Duration>,
    /// When the last message arrived.
    last: Option<Instant>,
}

/// Polls until `count` messages arrived or none did for `timeout`.
async fn poll_n(
    consumer: &mut Consumer,
    count: u64,
    timeout: Duration,
    started: Instant,
    progress: bool,
) -> Result<Polled> {
    let mut r = Polled {
        n: 0,
        bytes: 0,
        lat: Vec::new(),
        last: None,
    };
    let mut quiet_since = Instant::now();
    let mut next_report = started + Duration::from_secs(1);
    let mut last_n = 0;
    while r.n < count && quiet_since.elapsed() < timeout {
        let batch = consumer.poll(4096, Duration::from_millis(200)).await?;
        if batch.is_empty() {
            continue;
        }
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        quiet_since = Instant::now();
        r.last = Some(quiet_since);
        for m in &batch {
            r.n += 1;
            r.bytes += m.body.len() as u64;
            r.lat.push(Duration::from_millis(
                now_ms.saturating_sub(m.store_timestamp_ms),
            ));
        }
        if progress && Instant::now() >= next_report {
            eprintln!(
                "  {:>5.1} s  consumed {:>9}  {:>9.0} msg/s",
                started.elapsed().as_secs_f64(),
                r.n,
                (r.n - last_n) as f64
            );
            last_n = r.n;
            next_report += Duration::from_secs(1);
        }
    }
    Ok(r)
}

/// One table row of figures; latency columns show `-` when there is no latency to show.
fn print_figures(what: &str, n: u64, secs: f64, rate: f64, mb: f64, l: Option<&LatencySummary>) {
    let lat = |f: fn(&LatencySummary) -> f64| l.map_or("-".to_string(), |l| format!("{:.2}", f(l)));
    println!("{what}");
    print!(
        "{}",
        table(
            &[
                "MESSAGES", "SECONDS", "MSG/S", "MB/S", "P50 MS", "P99 MS", "P999 MS", "MAX MS"
            ],
            &[vec![
                n.to_string(),
                format!("{secs:.2}"),
                format!("{rate:.0}"),
                format!("{mb:.1}"),
                lat(|l| l.p50_ms),
                lat(|l| l.p99_ms),
                lat(|l| l.p999_ms),
                lat(|l| l.max_ms),
            ]],
        )
    );
}

/// One kill of the failover bench.
#[derive(Debug, Clone, serde::Serialize)]
struct KillResult {
    killed: u64,
    old_term: u64,
    new_leader: u64,
    new_term: u64,
    election_ms: f64,
    outage_ms: f64,
}

async fn failover(
    json: bool,
    kills: u32,
    senders: usize,
    check: bool,
    stop: bool,
    secure: bool,
) -> Result<()> {
    let mut cluster = start_local(secure).await?;
    let ns = Target::local(&cluster);
    let admin = ns.admin()?;
    let topic = "failover";
    admin.create_topic(topic, 4, None).await?;
    let producer = Arc::new(
        ns.producer()
            .send_timeout(Duration::from_secs(30))
            .build()?,
    );
    let load = Load::start(producer.clone(), topic, "f", senders, 128);
    let steal = StealMeter::start();
    let mut results = Vec::new();
    for k in 1..=kills {
        let settle = Instant::now();
        let (leader, old_term) = wait_stable(&mut cluster, &admin, &load).await?;
        tracing::info!(
            "settled in {:?} with {} acknowledged",
            settle.elapsed(),
            load.acked()
        );
        let killed_at = Instant::now();
        if stop {
            cluster.stop(leader)?;
        } else {
            cluster.kill(leader)?;
        }
        let (mut elected, mut first_ack) = (None, None);
        let deadline = killed_at + Duration::from_secs(30);
        while elected.is_none() || first_ack.is_none() {
            if Instant::now() > deadline {
                bail!("kill {k}: no new leader or no acknowledged send within 30 s");
            }
            if elected.is_none()
                && let Some((id, term)) = live_leader(&cluster, &admin).await
                && term > old_term
            {
                elected = Some((id, term, killed_at.elapsed()));
            }
            if first_ack.is_none() {
                first_ack = load
                    .first_ack_started_after(killed_at)
                    .map(|t| t.duration_since(killed_at));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (new_leader, new_term, election) = elected.unwrap_or_default();
        let outage = first_ack.unwrap_or_default();
        let r = KillResult {
            killed: leader,
            old_term,
            new_leader,
            new_term,
            election_ms: election.as_secs_f64() * 1000.0,
            outage_ms: outage.as_secs_f64() * 1000.0,
        };
        eprintln!(
            "  kill {k:>3}/{kills}: node {} (term {}) → node {} leads (term {}) after {:.0} ms; first ack after {:.0} ms; {} acknowledged so far",
            r.killed,
            r.old_term,
            r.new_leader,
            r.new_term,
            r.election_ms,
            r.outage_ms,
            load.acked()
        );
        results.push(r);
        cluster.restart(leader)?;
    }
    let log = load.stop().await;
    producer_close(producer).await;
    let report = if check {
        let acked: HashSet<String> = log.acks.iter().map(|a| a.body.clone()).collect();
        eprintln!("reading back {} acknowledged messages", acked.len());
        for a in log.acks.iter().filter(|a| a.duplicate) {
            tracing::info!(
                "{} acknowledged as a duplicate at {}@{}",
                a.body,
                a.queue,
                a.offset
            );
        }
        Some(verify(&ns, topic, &acked, Duration::from_secs(10)).await?)
    } else {
        None
    };
    let mut outages: Vec<Duration> = results
        .iter()
        .map(|r| Duration::from_secs_f64(r.outage_ms / 1000.0))
        .collect();
    let mut elections: Vec<Duration> = results
        .iter()
        .map(|r| Duration::from_secs_f64(r.election_ms / 1000.0))
        .collect();
    let (o, e) = (summarize(&mut outages), summarize(&mut elections));
    let cpu_steal_pct = steal.pct();
    if json {
        println!(
            "{}",
            json_line(&with_security(
                json!({
                    "bench": "failover", "kills": results.len(), "outage_ms": o,
                    "election_ms": e, "per_kill": results, "acked": log.acks.len(),
                    "failed_sends": log.failed,
                    "acked_as_duplicate": log.acks.iter().filter(|a| a.duplicate).count(),
                    "verify": report, "cpu_steal_pct": cpu_steal_pct,
                }),
                &ns
            ))
        );
    } else {
        let rows: Vec<Vec<String>> = [("outage (kill → first ack)", &o), ("election", &e)]
            .iter()
            .map(|(n, s)| {
                vec![
                    n.to_string(),
                    s.count.to_string(),
                    format!("{:.0}", s.p50_ms),
                    format!("{:.0}", s.p99_ms),
                    format!("{:.0}", s.max_ms),
                    format!("{:.0}", s.mean_ms),
                ]
            })
            .collect();
        println!(
            "failover: {} leader {} ({})",
            results.len(),
            if stop { "stops" } else { "kills" },
            ns.security_words()
        );
        print!(
            "{}",
            table(
                &["", "KILLS", "P50 MS", "P99 MS", "MAX MS", "MEAN MS"],
                &rows
            )
        );
        println!(
            "acknowledged {} messages, {} sends failed",
            log.acks.len(),
            log.failed
        );
        if let Some(pct) = cpu_steal_pct {
            println!("{}", steal_line(pct));
        }
        if let Some(r) = &report {
            println!(
                "read back: {} consumed, {} lost, {} duplicates",
                r.consumed, r.lost, r.duplicates
            );
        }
    }
    if let Some(r) = report
        && r.lost > 0
    {
        bail!("{} acknowledged messages were lost", r.lost);
    }
    Ok(())
}

async fn producer_close(p: Arc<Producer>) {
    if let Ok(p) = Arc::try_unwrap(p) {
        p.close().await;
    }
}

/// The leader with the highest term among the nodes that answer: (node id, term).
pub async fn live_leader(cluster: &LocalCluster, admin: &Admin) -> Option<(u64, u64)> {
    cluster
        .live_leader(admin)
        .await
        .map(|l| (l.node_id, l.term))
}

/// Waits until, for a full second, every node runs and answers, one leads, the others follow in
/// its term, have heard from it recently and applied nearly all it committed, and sends are
/// acknowledged — so each kill starts from a steady cluster. Returns (leader, term).
async fn wait_stable(cluster: &mut LocalCluster, admin: &Admin, load: &Load) -> Result<(u64, u64)> {
    const STEADY: Duration = Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut steady_since: Option<(Instant, u64, u64)> = None;
    loop {
        cluster.check_children()?;
        let statuses = cluster.statuses(admin).await;
        let live: Vec<_> = statuses.iter().filter_map(|(_, s)| s.as_ref()).collect();
        let leader = live
            .iter()
            .filter(|s| s.role == "leader")
            .max_by_key(|s| s.term);
        let ok = live.len() == statuses.len()
            && leader.is_some_and(|l| {
                live.iter().all(|s| {
                    s.node_id == l.node_id
                        || (s.role == "follower"
                            && s.term == l.term
                            && s.millis_since_leader_contact.is_some_and(|ms| ms < 500)
                            && s.applied + 64 >= l.committed)
                })
            })
            && load
                .last_ack()
                .is_some_and(|t| t.elapsed() < Duration::from_millis(200));
        match (ok, leader, steady_since) {
            (true, Some(l), Some((since, id, term))) if id == l.node_id && term == l.term => {
                if since.elapsed() >= STEADY {
                    return Ok((id, term));
                }
            }
            (true, Some(l), _) => steady_since = Some((Instant::now(), l.node_id, l.term)),
            _ => steady_since = None,
        }
        if Instant::now() > deadline {
            bail!("the cluster did not settle (all nodes up, followers caught up) within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
