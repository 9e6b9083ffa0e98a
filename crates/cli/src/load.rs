//! Background load and the loss check shared by `demo` and `bench failover`.
//!
//! [`Load`] runs senders that each send one uniquely numbered message at a time and log every
//! acknowledgement with the instant its send started and ended. [`verify`] reads the topic from
//! the beginning with a fresh consumer group and reports which acknowledged messages it did not
//! find (lost), which it read twice, and which it read without their send having been
//! acknowledged (stored, but the client gave up or was stopped before the answer).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use raftmq_client::{Message, Producer, StartFrom};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::connect::Target;

#[derive(Debug, Clone)]
pub struct Ack {
    pub started: Instant,
    pub acked: Instant,
    pub body: String,
    /// Where the broker said it stored the message, and whether it had seen the batch before.
    pub queue: u32,
    pub offset: u64,
    pub duplicate: bool,
}

#[derive(Debug, Default)]
pub struct AckLog {
    pub acks: Vec<Ack>,
    pub failed: u64,
    pub first_error: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub struct Load {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    log: Arc<Mutex<AckLog>>,
}

impl Load {
    /// Starts `senders` tasks sending bodies `{prefix}-{sender}-{n}` padded to `size` bytes.
    pub fn start(
        producer: Arc<Producer>,
        topic: &str,
        prefix: &str,
        senders: usize,
        size: usize,
    ) -> Load {
        let (stop, stop_rx) = watch::channel(false);
        let log = Arc::new(Mutex::new(AckLog::default()));
        let tasks = (0..senders.max(1))
            .map(|s| {
                let (producer, log, stop_rx) = (producer.clone(), log.clone(), stop_rx.clone());
                let (topic, prefix) = (topic.to_string(), prefix.to_string());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !*stop_rx.borrow() {
                        let id = format!("{prefix}-{s}-{n}");
                        n += 1;
                        let mut body = id.clone().into_bytes();
                        body.push(b' ');
                        body.resize(size.max(body.len()), b'.');
                        let started = Instant::now();
                        match producer.send(&topic, Message::new(body)).await {
                            Ok(r) => lock(&log).acks.push(Ack {
                                started,
                                acked: Instant::now(),
                                body: id,
                                queue: r.queue,
                                offset: r.offset,
                                duplicate: r.duplicate,
                            }),
                            Err(e) => {
                                let mut l = lock(&log);
                                l.failed += 1;
                                l.first_error.get_or_insert_with(|| e.to_string());
                            }
                        }
                    }
                })
            })
            .collect();
        Load { stop, tasks, log }
    }

    pub fn acked(&self) -> usize {
        lock(&self.log).acks.len()
    }

    pub fn failed(&self) -> u64 {
        lock(&self.log).failed
    }

    /// When the first send that started at or after `t` was acknowledged.
    pub fn first_ack_started_after(&self, t: Instant) -> Option<Instant> {
        lock(&self.log)
            .acks
            .iter()
            .rev()
            .take_while(|a| a.acked >= t)
            .filter(|a| a.started >= t)
            .map(|a| a.acked)
            .min()
    }

    /// When the last acknowledgement arrived.
    pub fn last_ack(&self) -> Option<Instant> {
        lock(&self.log).acks.last().map(|a| a.acked)
    }

    /// Stops the senders (each finishes its current send) and returns the log.
    pub async fn stop(self) -> AckLog {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        std::mem::take(&mut *lock(&self.log))
    }
}

/// What reading the topic back found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    pub acked: usize,
    pub consumed: u64,
    pub unique: usize,
    pub duplicates: u64,
    /// Of the duplicates, how many were stored twice (two positions) rather than read twice.
    pub stored_twice: u64,
    pub lost: usize,
    /// Read, but their send was never acknowledged.
    pub unacknowledged_stored: usize,
    pub seconds: f64,
}

/// Reads `topic` of `target` from the earliest offset with a new group until every id in `acked`
/// was seen or nothing arrived for `idle`.
pub async fn verify(
    target: &Target,
    topic: &str,
    acked: &HashSet<String>,
    idle: Duration,
) -> Result<VerifyReport> {
    let started = Instant::now();
    let group = format!("verify-{:08x}", rand::random::<u32>());
    let mut consumer = target
        .consumer(&group, topic)
        .start_from(StartFrom::Earliest)
        .build()?;
    let mut seen: HashMap<String, u32> = HashMap::new();
    let mut first_at: HashMap<String, (String, u32, u64)> = HashMap::new();
    let mut stored_twice = 0u64;
    let mut twice = Vec::new();
    let mut consumed = 0u64;
    let mut found = 0usize;
    let mut last = Instant::now();
    while found < acked.len() && last.elapsed() < idle {
        let batch = consumer.poll(4096, Duration::from_millis(200)).await?;
        if !batch.is_empty() {
            last = Instant::now();
        }
        for m in batch {
            consumed += 1;
            let text = String::from_utf8_lossy(&m.body);
            let id = text.split(' ').next().unwrap_or_default().to_string();
            let pos = (m.broker.clone(), m.queue, m.offset);
            match first_at.get(&id) {
                Some(p) if *p != pos => {
                    stored_twice += 1;
                    tracing::warn!(
                        "{id} stored twice: at {p:?} and {pos:?} (this one served by {:?})",
                        m.served_by.as_ref().map(|n| n.node_id)
                    );
                    twice.push((p.clone(), pos.clone()));
                }
                Some(p) => tracing::warn!("{id} read twice at {p:?}"),
                None => {
                    first_at.insert(id.clone(), pos);
                }
            }
            let c = seen.entry(id.clone()).or_insert(0);
            *c += 1;
            if *c == 1 && acked.contains(&id) {
                found += 1;
            }
        }
    }
    let _ = consumer.close().await;
    for (a, b) in &twice {
        compare_nodes(target, topic, a, b).await;
    }
    let duplicates = seen.values().map(|c| u64::from(c - 1)).sum();
    Ok(VerifyReport {
        acked: acked.len(),
        consumed,
        unique: seen.len(),
        duplicates,
        stored_twice,
        lost: acked.len() - found,
        unacknowledged_stored: seen.keys().filter(|k| !acked.contains(*k)).count(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Logs what every node of the group holds at two positions that carried the same message, to
/// tell a producer-side duplicate (same on every node) from diverging replicas.
async fn compare_nodes(
    target: &Target,
    topic: &str,
    a: &(String, u32, u64),
    b: &(String, u32, u64),
) {
    use raftmq_proto::v1::{PullRequest, broker_service_client::BrokerServiceClient};
    let Ok(admin) = target.admin() else {
        return;
    };
    let Ok(status) = admin.cluster_status().await else {
        return;
    };
    for node in status
        .clusters
        .iter()
        .flat_map(|c| c.brokers.iter())
        .filter(|g| g.name == a.0)
        .flat_map(|g| g.nodes.iter())
    {
        let Ok(channel) = target.channel(&node.address, |e| e) else {
            continue;
        };
        let mut client = BrokerServiceClient::new(channel);
        let first = a.2.min(b.2);
        let req = PullRequest {
            topic: topic.to_string(),
            queue: a.1,
            offset: first,
            max_messages: (a.2.max(b.2) - first + 1) as u32,
            max_wait_ms: 0,
            consumer_id: "diagnose".into(),
        };
        match client.pull(req).await {
            Ok(r) => {
                let r = r.into_inner();
                let bodies: Vec<String> = r
                    .messages
                    .iter()
                    .map(|m| {
                        let t = String::from_utf8_lossy(&m.body);
                        format!("{}@{}", t.split(' ').next().unwrap_or_default(), m.offset)
                    })
                    .collect();
                tracing::warn!(
                    "node {} ({}) at {}/{} from {first}: {bodies:?}",
                    node.node_id,
                    node.role(),
                    a.0,
                    a.1
                );
            }
            Err(e) => tracing::warn!("node {}: {e}", node.node_id),
        }
    }
}
