//! The scheduled-message workload (`ScenarioCfg::delay`, `soak --delay`, `t39`): beside the
//! producers, senders schedule messages on the DELAY topic [`DELAY_TOPIC`], each due 0 to
//! [`DelayCfg::max_delay_ms`] ahead, under the same faults, and record each send as acknowledged
//! (with the id the group returned), or unknown (no acknowledgement: it may or may not be stored).
//! After the heal the round waits until nothing is scheduled any more, reads [`DELAY_TOPIC`] from
//! every node and [`check_delay`] requires:
//!
//! - lost: an acknowledged message delivered on no node;
//! - duplicates: one message delivered twice (a payload at two offsets), acknowledged or not;
//! - early: a message stored in its queue before its delivery time (store time, stamped by the
//!   group, against the time it was sent with);
//! - unexpected: a payload nobody sent, or a delivery time other than the one it was sent with;
//! - divergent: two nodes holding different messages at one (queue, offset).
//!
//! Lateness (store time − delivery time) is printed per round; nothing asserts it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use raftmq_proto::v1::*;
use rand::{Rng, SeedableRng};

use super::pop::wall_ms;
use super::{History, lock};
use crate::{Cluster, SendOutcome, TestProducer, read_stored, send_until};

pub const DELAY_TOPIC: &str = "hist-delay";
/// Producer ids of the delay senders start here (apart from the workload's).
const DELAY_PRODUCER_BASE: u64 = 7_000_000;
/// Bound of the wait for every scheduled message to be delivered after the heal.
const DELIVERED_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Clone, Debug)]
pub struct DelayCfg {
    pub senders: u64,
    /// Each message is due between now and this far ahead.
    pub max_delay_ms: u64,
    /// Pause between two sends of one sender.
    pub interval: Duration,
}

impl Default for DelayCfg {
    fn default() -> Self {
        DelayCfg {
            senders: 2,
            max_delay_ms: 8_000,
            interval: Duration::from_millis(20),
        }
    }
}

/// One scheduled send: its payload, its delivery time, and the id the group returned (`None`:
/// not acknowledged, outcome unknown).
#[derive(Clone, Debug)]
pub struct DelaySend {
    pub payload: String,
    pub deliver_at_ms: u64,
    pub acked_id: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct DelayHistory {
    pub sends: Vec<DelaySend>,
    /// How long after the heal the last scheduled message was delivered.
    pub settled: Option<Duration>,
}

/// What [`check_delay`] found: figures, then problem counters (each must be zero).
#[derive(Clone, Debug, Default)]
pub struct DelayReport {
    pub sent: u64,
    pub acked: u64,
    pub unknown: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub early: u64,
    pub unexpected: u64,
    pub divergent: u64,
    /// Lateness of the deliveries (store time − delivery time): p50, p99, max, in ms.
    pub late_ms: (u64, u64, u64),
    pub settled: Option<Duration>,
}

impl DelayReport {
    pub fn problems(&self) -> u64 {
        self.lost + self.duplicates + self.early + self.unexpected + self.divergent
    }
    pub fn is_ok(&self) -> bool {
        self.problems() == 0
    }
}

impl std::fmt::Display for DelayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "delay: scheduled {} ({} acknowledged, {} unknown), delivered {}; lost {}, \
             duplicates {}, early {}, unexpected {}, divergent {}; lateness p50 {} ms, p99 {} \
             ms, max {} ms; all delivered {:.1} s after the heal",
            self.sent,
            self.acked,
            self.unknown,
            self.delivered,
            self.lost,
            self.duplicates,
            self.early,
            self.unexpected,
            self.divergent,
            self.late_ms.0,
            self.late_ms.1,
            self.late_ms.2,
            self.settled.map_or(f64::NAN, |d| d.as_secs_f64())
        )
    }
}

/// Creates [`DELAY_TOPIC`] (type DELAY) on the leader, retrying through elections.
pub async fn create_delay_topic(c: &Cluster) -> Result<(), String> {
    super::create_typed_topic(c, DELAY_TOPIC, TopicMessageType::Delay).await
}

/// One sender: schedules one message every `cfg.interval` until `stop` (or `until`), each sent
/// until acknowledged or its deadline passes (the same producer id and sequence on every attempt).
pub async fn delay_sender_loop(
    hist: Arc<History>,
    id: u64,
    addrs: Vec<String>,
    cfg: DelayCfg,
    seed: u64,
    stop: Arc<AtomicBool>,
    until: Instant,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (id << 40) ^ 0xDE1A);
    let mut p = TestProducer::new(DELAY_PRODUCER_BASE + id, addrs);
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        seq += 1;
        let payload = format!("delay|{id}|{seq}|");
        let at = wall_ms() + rng.random_range(0..=cfg.max_delay_ms);
        let mut m = Message {
            body: payload.clone().into_bytes().into(),
            ..Default::default()
        };
        m.properties
            .insert(raftmq_proto::DELIVER_AT_PROPERTY.into(), at.to_string());
        let req = SendRequest {
            topic: DELAY_TOPIC.into(),
            queue: (seq % super::QUEUES as u64) as u32,
            messages: vec![m],
            producer_id: p.producer_id,
            sequence: seq,
            dedup_property: String::new(),
        };
        let acked_id = match send_until(&mut p, &req, Duration::from_secs(10)).await {
            SendOutcome::Acked(r) => r.results.first().map(|r| r.msg_id.clone()),
            SendOutcome::Failed(_) => None,
        };
        lock(&hist.delay).sends.push(DelaySend {
            payload,
            deliver_at_ms: at,
            acked_id,
        });
        tokio::time::sleep(cfg.interval).await;
    }
}

/// Waits until the leader schedules nothing of [`DELAY_TOPIC`] and the last delivery time has
/// passed; records how long that took.
pub async fn wait_delivered(c: &Cluster, hist: &History) -> Result<(), String> {
    let last = lock(&hist.delay)
        .sends
        .iter()
        .map(|s| s.deliver_at_ms)
        .max()
        .unwrap_or(0);
    let t = Instant::now();
    let mut why = String::new();
    while t.elapsed() < DELIVERED_TIMEOUT {
        let leader = c.leader().await;
        let addr = c.node_address(leader).unwrap_or_default().to_string();
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_lazy();
        let mut inspect = raftmq_proto::v1::inspect_service_client::InspectServiceClient::new(ch);
        match inspect
            .topic_status(TopicStatusRequest {
                topic: DELAY_TOPIC.into(),
                at_ms: None,
            })
            .await
        {
            Ok(r) if r.get_ref().error.is_none() && r.get_ref().scheduled == 0 => {
                if wall_ms() > last {
                    lock(&hist.delay).settled = Some(t.elapsed());
                    return Ok(());
                }
                why = "the last delivery time has not come".into();
            }
            Ok(r) => why = format!("{} still scheduled", r.get_ref().scheduled),
            Err(e) => why = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "scheduled messages not all delivered {} s after the heal: {why}",
        DELIVERED_TIMEOUT.as_secs()
    ))
}

/// A delivered message as one node holds it: (queue, offset) → (payload, store time, delivery
/// time it carries).
pub type DelayRead = BTreeMap<(u32, u64), (String, u64, Option<u64>)>;

/// Reads every queue of [`DELAY_TOPIC`] from the node at `addr`.
pub async fn read_delay(addr: &str) -> Result<DelayRead, String> {
    let mut out = BTreeMap::new();
    for q in 0..super::QUEUES {
        for m in read_stored(addr, DELAY_TOPIC, q).await? {
            let at = m
                .properties
                .get(raftmq_proto::DELIVER_AT_PROPERTY)
                .and_then(|v| v.parse().ok());
            out.insert(
                (q, m.offset),
                (
                    String::from_utf8_lossy(&m.body).into_owned(),
                    m.store_timestamp_ms,
                    at,
                ),
            );
        }
    }
    Ok(out)
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Compares what every node holds of [`DELAY_TOPIC`] with the history (see the module doc).
pub fn check_delay(hist: &History, reads: &BTreeMap<u64, DelayRead>) -> DelayReport {
    let h = lock(&hist.delay).clone();
    let mut r = DelayReport {
        sent: h.sends.len() as u64,
        acked: h.sends.iter().filter(|s| s.acked_id.is_some()).count() as u64,
        settled: h.settled,
        ..Default::default()
    };
    r.unknown = r.sent - r.acked;
    let mut nodes = reads.values();
    let Some(first) = nodes.next() else {
        return r;
    };
    for other in nodes {
        let keys: std::collections::BTreeSet<&(u32, u64)> =
            first.keys().chain(other.keys()).collect();
        r.divergent += keys
            .into_iter()
            .filter(|k| first.get(k) != other.get(k))
            .count() as u64;
    }
    let sent: HashMap<&str, &DelaySend> = h.sends.iter().map(|s| (s.payload.as_str(), s)).collect();
    let mut seen: HashMap<&str, u64> = HashMap::new();
    let mut late = Vec::new();
    for (payload, store_ms, at) in first.values() {
        let Some(s) = sent.get(payload.as_str()) else {
            r.unexpected += 1;
            continue;
        };
        if *at != Some(s.deliver_at_ms) {
            r.unexpected += 1;
        }
        if *store_ms < s.deliver_at_ms {
            r.early += 1;
        }
        late.push(store_ms.saturating_sub(s.deliver_at_ms));
        *seen.entry(payload.as_str()).or_default() += 1;
    }
    r.delivered = seen.len() as u64;
    r.duplicates = seen.values().filter(|n| **n > 1).map(|n| n - 1).sum();
    r.lost = h
        .sends
        .iter()
        .filter(|s| s.acked_id.is_some() && !seen.contains_key(s.payload.as_str()))
        .count() as u64;
    late.sort_unstable();
    r.late_ms = (
        pct(&late, 0.5),
        pct(&late, 0.99),
        late.last().copied().unwrap_or(0),
    );
    r
}
