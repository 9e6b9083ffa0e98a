//! `raftmq bench pop`: the RocketMQ 5 API (`apache.rocketmq.v2`) measured with raw gRPC, beside
//! raftmq.v1 in the same run on the same cluster:
//!
//! 1. v1 produce: `count` messages through the raftmq producer, `inflight` awaiting acks;
//! 2. v2 send: `count` messages with SendMessage, one message per call as the official clients
//!    send them, `inflight` calls at once, spread over every node of the group as the official
//!    clients' queue rotation spreads them (a follower forwards to the leader);
//! 3. v2 no-op calls: as many Heartbeats, the same way: the cost of one call per message alone;
//! 4. v2 receive + ack: `consumers` POP consumers of a new group, each ReceiveMessage of up to
//!    `batch` then one AckMessage with every handle, until all `2 × count` messages are acked.
//!
//! With `--fifo-groups N`: FIFO messages instead, on the FIFO topic `<topic>-fifo`: `count`
//! v2 sends spread over N message groups, then the receive + ack phase by a new FIFO consumer
//! group, which gets a group's next message only once the one before it is acknowledged.
//!
//! Progress on stderr each second; figures as a table (or one JSON object with `--json`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use raftmq_client::{Conn, ErrorCode};
use raftmq_proto::v1::{GroupConfig, TopicMessageType};
use raftmq_rocketmq_v2::pb;
use raftmq_rocketmq_v2::pb::messaging_service_client::MessagingServiceClient;
use serde_json::json;
use tokio::time::Instant;

use crate::args::BenchTarget;
use crate::commands::bench::{ProduceShape, Remote, StealMeter, setup, steal_line, with_security};
use crate::commands::produce::generated_body;
use crate::connect::Target;
use crate::output::{json_line, table};
use crate::stats::{LatencySummary, summarize, throughput};

/// `raftmq bench pop` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PopBenchArgs {
    #[command(flatten)]
    pub target: BenchTarget,
    /// Messages sent through each API (v1, then v2); the receive phase takes both.
    #[arg(long, default_value_t = 50_000)]
    pub count: u64,
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Sends awaiting acknowledgement at once, for both APIs.
    #[arg(long, default_value_t = 256)]
    pub inflight: usize,
    /// Concurrent POP consumers.
    #[arg(long, default_value_t = 8)]
    pub consumers: usize,
    /// Messages asked for per receive.
    #[arg(long, default_value_t = 32)]
    pub batch: i32,
    /// Give up the receive phase when nothing arrived for this long.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// FIFO mode: v2 sends over this many message groups on a FIFO topic, received by a FIFO
    /// consumer group (0: off).
    #[arg(long, default_value_t = 0)]
    pub fifo_groups: u64,
}

/// The figures of one phase.
struct Phase {
    name: &'static str,
    messages: u64,
    failed: u64,
    elapsed: Duration,
    /// Per call (a send of one message, or a receive followed by its ack).
    latency: LatencySummary,
}

/// The nodes the v2 calls go to, reached as every other connection of the run (TLS and signed
/// requests when the cluster asks for them: the RocketMQ 5 front checks the same signatures).
struct V2Nodes {
    target: Target,
    addresses: Vec<String>,
}

impl V2Nodes {
    fn len(&self) -> usize {
        self.addresses.len()
    }

    /// A client of node `i` (modulo their number).
    fn client(&self, i: usize) -> Result<MessagingServiceClient<Conn>> {
        let ch = self
            .target
            .channel(&self.addresses[i % self.addresses.len()], |e| {
                e.connect_timeout(Duration::from_secs(1))
                    .timeout(Duration::from_secs(30))
                    .tcp_nodelay(true)
            })?;
        Ok(MessagingServiceClient::new(ch).max_decoding_message_size(64 << 20))
    }
}

fn with_client_id<T>(msg: T, id: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Ok(v) = id.parse() {
        r.metadata_mut().insert("x-mq-client-id", v);
    }
    r
}

fn resource(name: &str) -> pb::Resource {
    pb::Resource {
        resource_namespace: String::new(),
        name: name.to_string(),
    }
}

fn is_ok(st: &Option<pb::Status>) -> bool {
    st.as_ref().is_some_and(|s| s.code == pb::Code::Ok as i32)
}

fn status_text(st: &Option<pb::Status>) -> String {
    st.as_ref()
        .map_or("no status".into(), |s| format!("{} {}", s.code, s.message))
}

/// Prints progress once a second while `done` grows.
fn progress(what: &'static str, done: Arc<AtomicU64>, total: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let t0 = Instant::now();
        let mut last = 0;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            let d = done.load(Ordering::Relaxed);
            eprintln!(
                "  {what:<16} {:>5.1} s  {d:>9}/{total}  {:>9.0} msg/s",
                t0.elapsed().as_secs_f64(),
                (d - last) as f64
            );
            last = d;
        }
    })
}

/// Makes call `n` on a client; `Err` carries why it failed.
type Call = Box<
    dyn Fn(
        MessagingServiceClient<Conn>,
        u64,
    ) -> futures::future::BoxFuture<'static, std::result::Result<(), String>>,
>;

/// `count` calls made by `call`, `inflight` at once, spread over every node in turn.
async fn call_loop(
    name: &'static str,
    nodes: &V2Nodes,
    count: u64,
    inflight: usize,
    call: Call,
) -> Result<Phase> {
    let clients: Vec<_> = (0..nodes.len())
        .map(|i| nodes.client(i))
        .collect::<Result<_>>()?;
    let done = Arc::new(AtomicU64::new(0));
    let ticker = progress(name, done.clone(), count);
    let mut pending = FuturesUnordered::new();
    let (mut sent, mut failed) = (0u64, 0u64);
    let mut first_error = None;
    let mut lat = Vec::with_capacity(count as usize);
    let t0 = Instant::now();
    while done.load(Ordering::Relaxed) + failed < count {
        while sent < count && pending.len() < inflight.max(1) {
            let c = clients[sent as usize % clients.len()].clone();
            let fut = call(c, sent);
            sent += 1;
            pending.push(async move {
                let t = Instant::now();
                let r = fut.await;
                (t.elapsed(), r)
            });
        }
        let Some((d, r)) = pending.next().await else {
            break;
        };
        match r {
            Ok(()) => {
                done.fetch_add(1, Ordering::Relaxed);
                lat.push(d);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    ticker.abort();
    if let Some(e) = first_error {
        eprintln!("{name}: {failed} failed, first: {e}");
    }
    Ok(Phase {
        name,
        messages: done.load(Ordering::Relaxed),
        failed,
        elapsed: t0.elapsed(),
        latency: summarize(&mut lat),
    })
}

fn reply_status(
    r: std::result::Result<Option<pb::Status>, tonic::Status>,
) -> std::result::Result<(), String> {
    match r {
        Ok(st) if is_ok(&st) => Ok(()),
        Ok(st) => Err(status_text(&st)),
        Err(e) => Err(e.to_string()),
    }
}

/// `count` sends of one message; FIFO messages over `fifo_groups` message groups when not 0.
async fn v2_send(
    nodes: &V2Nodes,
    topic: &str,
    (count, size, inflight): (u64, usize, usize),
    fifo_groups: u64,
) -> Result<Phase> {
    let topic = topic.to_string();
    let call: Call = Box::new(move |mut c, n| {
        let (message_type, message_group) = match fifo_groups {
            0 => (pb::MessageType::Normal, None),
            g => (pb::MessageType::Fifo, Some(format!("g{}", n % g))),
        };
        let message = pb::Message {
            topic: Some(resource(&topic)),
            user_properties: Default::default(),
            system_properties: Some(pb::SystemProperties {
                message_id: format!("BENCH{n:016X}"),
                body_encoding: pb::Encoding::Identity as i32,
                message_type: message_type as i32,
                message_group,
                born_host: "bench".into(),
                ..Default::default()
            }),
            body: generated_body(1_000_000_000 + n, size),
        };
        Box::pin(async move {
            let req = with_client_id(
                pb::SendMessageRequest {
                    messages: vec![message],
                },
                "bench-producer",
            );
            reply_status(c.send_message(req).await.map(|r| r.into_inner().status))
        })
    });
    let name = if fifo_groups > 0 {
        "v2 FIFO send"
    } else {
        "v2 send (1 msg per call)"
    };
    call_loop(name, nodes, count, inflight, call).await
}

/// The same number of calls that do nothing (Heartbeat): what one call per message costs on this
/// machine, the ceiling of a client that sends one message per call.
async fn v2_noop(nodes: &V2Nodes, count: u64, inflight: usize) -> Result<Phase> {
    let call: Call = Box::new(|mut c, _| {
        Box::pin(async move {
            let req = with_client_id(
                pb::HeartbeatRequest {
                    group: None,
                    client_type: pb::ClientType::Producer as i32,
                },
                "bench-producer",
            );
            reply_status(c.heartbeat(req).await.map(|r| r.into_inner().status))
        })
    });
    call_loop("v2 no-op call (Heartbeat)", nodes, count, inflight, call).await
}

async fn v2_receive_ack(
    nodes: &V2Nodes,
    (topic, group): (&str, &str),
    args: &PopBenchArgs,
    total: u64,
) -> Result<Phase> {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let last_progress = Arc::new(std::sync::Mutex::new(Instant::now()));
    let ticker = progress("v2 receive+ack", done.clone(), total);
    let t0 = Instant::now();
    let idle = Duration::from_millis(args.timeout_ms);
    let mut tasks = Vec::new();
    for i in 0..args.consumers.max(1) {
        let mut c = nodes.client(i)?;
        let (done, failed, last) = (done.clone(), failed.clone(), last_progress.clone());
        let (group, topic, batch) = (group.to_string(), topic.to_string(), args.batch);
        let client_id = format!("bench-consumer-{i}");
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while done.load(Ordering::Relaxed) < total {
                if last.lock().map(|l| l.elapsed() > idle).unwrap_or(true) {
                    break;
                }
                let t = Instant::now();
                let req = pb::ReceiveMessageRequest {
                    group: Some(resource(&group)),
                    message_queue: Some(pb::MessageQueue {
                        topic: Some(resource(&topic)),
                        id: -1,
                        ..Default::default()
                    }),
                    filter_expression: Some(pb::FilterExpression {
                        r#type: pb::FilterType::Tag as i32,
                        expression: "*".into(),
                    }),
                    batch_size: batch,
                    invisible_duration: Some(prost_types::Duration {
                        seconds: 60,
                        nanos: 0,
                    }),
                    auto_renew: false,
                    long_polling_timeout: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    ..Default::default()
                };
                let mut entries = Vec::new();
                match c.receive_message(with_client_id(req, &client_id)).await {
                    Ok(stream) => {
                        let mut s = stream.into_inner();
                        while let Some(Ok(frame)) = s.next().await {
                            if let Some(pb::receive_message_response::Content::Message(m)) =
                                frame.content
                            {
                                let sp = m.system_properties.unwrap_or_default();
                                entries.push(pb::AckMessageEntry {
                                    message_id: sp.message_id,
                                    receipt_handle: sp.receipt_handle.unwrap_or_default(),
                                    ..Default::default()
                                });
                            }
                        }
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
                if entries.is_empty() {
                    continue;
                }
                let n = entries.len() as u64;
                let ack = pb::AckMessageRequest {
                    group: Some(resource(&group)),
                    topic: Some(resource(&topic)),
                    entries,
                };
                match c.ack_message(with_client_id(ack, &client_id)).await {
                    Ok(r) if is_ok(&r.get_ref().status) => {
                        done.fetch_add(n, Ordering::Relaxed);
                        lat.push(t.elapsed());
                        if let Ok(mut l) = last.lock() {
                            *l = Instant::now();
                        }
                    }
                    _ => {
                        failed.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap_or_default());
    }
    ticker.abort();
    let elapsed = last_progress
        .lock()
        .map(|l| l.duration_since(t0))
        .unwrap_or_else(|_| t0.elapsed());
    Ok(Phase {
        name: if args.fifo_groups > 0 {
            "v2 FIFO receive+ack"
        } else {
            "v2 receive+ack"
        },
        messages: done.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        elapsed,
        latency: summarize(&mut lat),
    })
}

pub async fn run(remote: Remote<'_>, json: bool, args: PopBenchArgs) -> Result<()> {
    let (_cluster, ns) = setup(remote, &args.target).await?;
    let topic = args.target.topic.clone();
    let admin = ns.admin()?;
    let route = admin.route(&topic).await?;
    let nodes = V2Nodes {
        addresses: route
            .brokers
            .iter()
            .flat_map(|b| b.nodes.iter().map(|n| n.address.clone()))
            .collect(),
        target: ns.clone(),
    };
    if nodes.addresses.is_empty() {
        bail!("the route of {topic} lists no node");
    }
    let steal = StealMeter::start();
    let group = format!("bench-pop-{:08x}", rand::random::<u32>());
    let shape = (args.count, args.size, args.inflight);
    let mut phases = Vec::new();
    if args.fifo_groups > 0 {
        let fifo_topic = format!("{topic}-fifo");
        match admin
            .create_topic_typed(
                &fifo_topic,
                args.target.queues,
                None,
                TopicMessageType::Fifo,
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.code() == Some(ErrorCode::TopicExists) => {}
            Err(e) => return Err(e).with_context(|| format!("creating topic {fifo_topic}")),
        }
        let cfg = GroupConfig {
            name: group.clone(),
            fifo: true,
            ..Default::default()
        };
        admin.create_group(&cfg, false, None).await?;
        eprintln!(
            "v2 FIFO send: {} messages over {} message groups",
            args.count, args.fifo_groups
        );
        let send = v2_send(&nodes, &fifo_topic, shape, args.fifo_groups).await?;
        eprintln!(
            "v2 FIFO receive+ack: {} messages, {} consumers, batch {}",
            send.messages, args.consumers, args.batch
        );
        let total = send.messages;
        let pop = v2_receive_ack(&nodes, (&fifo_topic, &group), &args, total).await?;
        phases.push(send);
        phases.push(pop);
    } else {
        phases = normal_phases(&ns, &nodes, (&topic, &group), &args).await?;
    }
    let cpu_steal_pct = steal.pct();
    // The ratios of the normal run: v2 send to v1 produce, and to the no-op call rate.
    let rate = |p: &Phase| throughput(p.messages, args.size, p.elapsed).msgs_per_sec;
    let ratios = match phases.as_slice() {
        [v1, v2, noop, _] => Some((
            rate(v2) / rate(v1).max(1e-9),
            rate(v2) / rate(noop).max(1e-9),
        )),
        _ => None,
    };
    if json {
        let v: Vec<_> = phases
            .iter()
            .map(|p| {
                let t = throughput(p.messages, args.size, p.elapsed);
                json!({
                    "phase": p.name, "messages": p.messages, "failed": p.failed,
                    "seconds": t.seconds, "msgs_per_sec": t.msgs_per_sec,
                    "mb_per_sec": t.mb_per_sec, "latency_ms": p.latency,
                })
            })
            .collect();
        println!(
            "{}",
            json_line(&with_security(
                json!({
                    "bench": "pop", "size": args.size, "inflight": args.inflight,
                    "consumers": args.consumers, "batch": args.batch, "phases": v,
                    "fifo_groups": args.fifo_groups,
                    "v2_send_vs_v1_produce": ratios.map(|r| r.0),
                    "cpu_steal_pct": cpu_steal_pct,
                }),
                &ns
            ))
        );
    } else {
        let rows: Vec<Vec<String>> = phases
            .iter()
            .map(|p| {
                let t = throughput(p.messages, args.size, p.elapsed);
                vec![
                    p.name.to_string(),
                    p.messages.to_string(),
                    p.failed.to_string(),
                    format!("{:.2}", t.seconds),
                    format!("{:.0}", t.msgs_per_sec),
                    format!("{:.2}", p.latency.p50_ms),
                    format!("{:.2}", p.latency.p99_ms),
                ]
            })
            .collect();
        println!(
            "{} B messages, {} in flight, {} consumers x batch {}{} ({})",
            args.size,
            args.inflight,
            args.consumers,
            args.batch,
            if args.fifo_groups > 0 {
                format!(", {} FIFO message groups", args.fifo_groups)
            } else {
                String::new()
            },
            ns.security_words()
        );
        print!(
            "{}",
            table(
                &[
                    "PHASE", "MESSAGES", "FAILED", "SECONDS", "MSG/S", "P50 MS", "P99 MS"
                ],
                &rows
            )
        );
        if let Some((to_v1, to_noop)) = ratios {
            println!("v2 send / v1 produce: {:.0}%", to_v1 * 100.0);
            println!(
                "v2 send / v2 no-op calls: {:.0}% (one call per message cannot beat the no-op \
                 rate)",
                to_noop * 100.0
            );
        }
        if let Some(pct) = cpu_steal_pct {
            println!("{}", steal_line(pct));
        }
    }
    let sent: u64 = phases[..phases.len() - 1]
        .iter()
        .filter(|p| !p.name.contains("no-op"))
        .map(|p| p.messages)
        .sum();
    let acked = phases.last().map_or(0, |p| p.messages);
    if acked < sent {
        bail!(
            "the receive phase acked {acked} of {sent} messages before {} ms without progress",
            args.timeout_ms
        );
    }
    Ok(())
}

/// The normal run: v1 produce, v2 send, v2 no-op calls, then v2 receive + ack of both sends.
async fn normal_phases(
    ns: &Target,
    nodes: &V2Nodes,
    (topic, group): (&str, &str),
    args: &PopBenchArgs,
) -> Result<Vec<Phase>> {
    let shape = ProduceShape {
        inflight: args.inflight,
        ..Default::default()
    };
    eprintln!("v1 produce: {} messages of {} B", args.count, args.size);
    let r = crate::commands::bench::produce(ns, topic, args.count, args.size, shape, true).await?;
    let v1 = Phase {
        name: "v1 produce",
        messages: r.acked,
        failed: r.failed,
        elapsed: r.elapsed,
        latency: r.latency,
    };
    eprintln!(
        "v2 send: {} messages over {} nodes",
        args.count,
        nodes.len()
    );
    let v2 = v2_send(nodes, topic, (args.count, args.size, args.inflight), 0).await?;
    eprintln!(
        "v2 no-op calls: {} Heartbeats, the ceiling of one call per message",
        args.count
    );
    let noop = v2_noop(nodes, args.count, args.inflight).await?;
    let total = v1.messages + v2.messages;
    eprintln!(
        "v2 receive+ack: {total} messages, {} consumers, batch {}",
        args.consumers, args.batch
    );
    let pop = v2_receive_ack(nodes, (topic, group), args, total).await?;
    Ok(vec![v1, v2, noop, pop])
}
