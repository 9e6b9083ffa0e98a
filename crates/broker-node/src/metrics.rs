//! Prometheus metrics of a node, in the process-wide default registry (the log's fsync histogram
//! lives there too), sampled from the member's status once a second.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};
use raftmq_raft_log::Role;

use crate::node::Node;
use crate::service::inspect;
use crate::state::BrokerState;

struct M {
    role: IntGaugeVec,
    term: IntGauge,
    last_log: IntGauge,
    committed: IntGauge,
    applied: IntGauge,
    follower_lag: IntGaugeVec,
    elections: IntCounter,
    leader_changes: IntCounter,
    produced: IntCounter,
    pulled: IntCounterVec,
    send_seconds: Histogram,
    disk_bytes: IntGauge,
    checkpoint_bytes: IntGauge,
    state_bytes: IntGauge,
    checkpoints: IntCounter,
    peer_reachable: IntGaugeVec,
    peer_bytes_per_sec: IntGaugeVec,
    peer_catch_up_pct: IntGaugeVec,
    catch_up_pct: IntGauge,
    catch_up_bytes_per_sec: IntGauge,
    ready: IntGauge,
    consumer: Option<ConsumerGauges>,
}

/// Consumer-group and topic figures, exported by a group's leader only (a follower's could be
/// behind, and scraping every node would count them three times): a follower resets them.
struct ConsumerGauges {
    lag: IntGaugeVec,
    lag_seconds: IntGaugeVec,
    ready: IntGaugeVec,
    inflight: IntGaugeVec,
    retrying: IntGaugeVec,
    committed: IntGaugeVec,
    dead_lettered: IntGaugeVec,
    topic_end: IntGaugeVec,
    topic_bytes: IntGaugeVec,
    topic_scheduled: IntGaugeVec,
}

const QUEUE_LABELS: [&str; 3] = ["group", "topic", "queue"];

impl ConsumerGauges {
    fn build() -> Option<ConsumerGauges> {
        let q =
            |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &QUEUE_LABELS).ok();
        Some(ConsumerGauges {
            lag: q(
                "raftmq_group_lag_messages",
                "messages of a queue a consumer group has not consumed (leader only)",
            )?,
            lag_seconds: q(
                "raftmq_group_lag_seconds",
                "age of the oldest message a consumer group has not consumed (leader only)",
            )?,
            ready: q(
                "raftmq_group_ready_messages",
                "POP: messages ready to hand out (leader only)",
            )?,
            inflight: q(
                "raftmq_group_inflight_messages",
                "POP: messages handed out, invisible, not acknowledged (leader only)",
            )?,
            retrying: q(
                "raftmq_group_retrying_messages",
                "POP: messages handed out again after a timeout (leader only)",
            )?,
            committed: q(
                "raftmq_group_committed_offset",
                "pull: the committed next offset; rate() is the consume rate (leader only)",
            )?,
            dead_lettered: IntGaugeVec::new(
                Opts::new(
                    "raftmq_group_dead_lettered_messages",
                    "messages in a group's dead-letter topic (leader only)",
                ),
                &["group"],
            )
            .ok()?,
            topic_end: IntGaugeVec::new(
                Opts::new(
                    "raftmq_topic_end_offset",
                    "sum over a topic's queues of the next offset; rate() is the produce rate \
                     (leader only)",
                ),
                &["topic"],
            )
            .ok()?,
            topic_bytes: IntGaugeVec::new(
                Opts::new(
                    "raftmq_topic_bytes",
                    "bytes of the messages a topic holds (leader only)",
                ),
                &["topic"],
            )
            .ok()?,
            topic_scheduled: IntGaugeVec::new(
                Opts::new(
                    "raftmq_topic_scheduled_messages",
                    "messages of a DELAY topic waiting for their delivery time (leader only)",
                ),
                &["topic"],
            )
            .ok()?,
        })
    }

    fn all(&self) -> [&IntGaugeVec; 10] {
        [
            &self.lag,
            &self.lag_seconds,
            &self.ready,
            &self.inflight,
            &self.retrying,
            &self.committed,
            &self.dead_lettered,
            &self.topic_end,
            &self.topic_bytes,
            &self.topic_scheduled,
        ]
    }

    fn register(&self, reg: impl Fn(Box<dyn prometheus::core::Collector>) -> Option<()>) {
        for v in self.all() {
            reg(Box::new(v.clone()));
        }
    }

    fn reset(&self) {
        for v in self.all() {
            v.reset();
        }
    }

    /// Sets every figure from the applied state (`now_ms`: the leader's clock).
    fn sample(&self, st: &BrokerState, now_ms: u64) {
        self.reset();
        for (name, t) in st.topics.unordered() {
            let end: u64 = t.queues.iter().map(|q| q.next_offset).sum();
            let bytes: u64 = t.queues.iter().map(|q| q.bytes).sum();
            self.topic_end.with_label_values(&[name]).set(end as i64);
            self.topic_bytes
                .with_label_values(&[name])
                .set(bytes as i64);
            let scheduled = st.timer.count(name);
            if scheduled > 0 {
                self.topic_scheduled
                    .with_label_values(&[name])
                    .set(scheduled as i64);
            }
        }
        for group in inspect::groups(st) {
            self.dead_lettered
                .with_label_values(&[&group])
                .set(inspect::dead_lettered(st, &group) as i64);
            for (topic, queue) in inspect::group_queues(st, &group) {
                let Some(p) = inspect::queue_progress(st, &group, &topic, queue, now_ms) else {
                    continue;
                };
                let queue = queue.to_string();
                let l = [group.as_str(), topic.as_str(), queue.as_str()];
                self.lag.with_label_values(&l).set(p.lag as i64);
                let age_ms = p
                    .oldest_unconsumed_ms
                    .filter(|_| p.lag > 0)
                    .map_or(0, |at| now_ms.saturating_sub(at));
                self.lag_seconds
                    .with_label_values(&l)
                    .set((age_ms / 1000) as i64);
                if let Some(c) = p.committed_offset {
                    self.committed.with_label_values(&l).set(c as i64);
                }
                if p.pop_next.is_some() {
                    self.ready.with_label_values(&l).set(p.ready as i64);
                    self.inflight.with_label_values(&l).set(p.inflight as i64);
                    self.retrying.with_label_values(&l).set(p.retrying as i64);
                }
            }
        }
    }
}

fn build() -> Option<M> {
    let r = prometheus::default_registry();
    let reg = |c: Box<dyn prometheus::core::Collector>| r.register(c).ok();
    let m = M {
        role: IntGaugeVec::new(
            Opts::new("raftmq_node_role", "1 for this node's current Raft role"),
            &["role"],
        )
        .ok()?,
        term: IntGauge::new("raftmq_raft_term", "current Raft term").ok()?,
        last_log: IntGauge::new("raftmq_raft_last_log_index", "last log index").ok()?,
        committed: IntGauge::new("raftmq_raft_committed_index", "committed index").ok()?,
        applied: IntGauge::new("raftmq_raft_applied_index", "applied index").ok()?,
        follower_lag: IntGaugeVec::new(
            Opts::new(
                "raftmq_raft_follower_lag",
                "entries a follower lacks (leader only)",
            ),
            &["node_id"],
        )
        .ok()?,
        elections: IntCounter::new(
            "raftmq_raft_elections_total",
            "terms seen start (elections)",
        )
        .ok()?,
        leader_changes: IntCounter::new(
            "raftmq_raft_leader_changes_total",
            "changes of the known leader",
        )
        .ok()?,
        produced: IntCounter::new("raftmq_produced_messages_total", "messages acknowledged")
            .ok()?,
        pulled: IntCounterVec::new(
            Opts::new("raftmq_pulled_messages_total", "messages served by pulls"),
            &["redirected"],
        )
        .ok()?,
        send_seconds: Histogram::with_opts(
            // Fine below 1 ms, where one send at a time lands (`bench produce --inflight 1`
            // takes medians from these buckets).
            HistogramOpts::new("raftmq_send_seconds", "send latency until commit").buckets(vec![
                0.0002, 0.0003, 0.0004, 0.0005, 0.0006, 0.0007, 0.0008, 0.0009, 0.001, 0.0015,
                0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
            ]),
        )
        .ok()?,
        disk_bytes: IntGauge::new("raftmq_log_disk_bytes", "bytes of log segments on disk").ok()?,
        checkpoint_bytes: IntGauge::new(
            "raftmq_state_checkpoint_bytes",
            "bytes of state checkpoints held in memory for the next snapshot",
        )
        .ok()?,
        state_bytes: IntGauge::new(
            "raftmq_state_snapshot_bytes",
            "bytes of the state as last checkpointed (paces checkpoints and restart images)",
        )
        .ok()?,
        checkpoints: IntCounter::new(
            "raftmq_state_checkpoints_total",
            "checkpoints of the state taken by apply, restart images included",
        )
        .ok()?,
        peer_reachable: IntGaugeVec::new(
            Opts::new(
                "raftmq_raft_peer_reachable",
                "1 while appends to the peer succeed, 0 once several failed in a row (leader only)",
            ),
            &["node_id"],
        )
        .ok()?,
        peer_bytes_per_sec: IntGaugeVec::new(
            Opts::new(
                "raftmq_raft_peer_replicated_bytes_per_second",
                "bytes a second of appends the peer answered lately (leader only)",
            ),
            &["node_id"],
        )
        .ok()?,
        peer_catch_up_pct: IntGaugeVec::new(
            Opts::new(
                "raftmq_raft_peer_catch_up_percent",
                "progress of a peer catching up, 0-100; absent when it is not (leader only)",
            ),
            &["node_id"],
        )
        .ok()?,
        catch_up_pct: IntGauge::new(
            "raftmq_raft_catch_up_percent",
            "progress of this node catching up with its leader, 0-100 (100 when it is not)",
        )
        .ok()?,
        catch_up_bytes_per_sec: IntGauge::new(
            "raftmq_raft_catch_up_bytes_per_second",
            "bytes a second this node receives while catching up (0 when it is not)",
        )
        .ok()?,
        ready: IntGauge::new(
            "raftmq_node_ready",
            "1 while the node is ready (leads, or follows a live leader and has caught up)",
        )
        .ok()?,
        consumer: ConsumerGauges::build(),
    };
    reg(Box::new(m.role.clone()));
    reg(Box::new(m.term.clone()));
    reg(Box::new(m.last_log.clone()));
    reg(Box::new(m.committed.clone()));
    reg(Box::new(m.applied.clone()));
    reg(Box::new(m.follower_lag.clone()));
    reg(Box::new(m.elections.clone()));
    reg(Box::new(m.leader_changes.clone()));
    reg(Box::new(m.produced.clone()));
    reg(Box::new(m.pulled.clone()));
    reg(Box::new(m.send_seconds.clone()));
    reg(Box::new(m.disk_bytes.clone()));
    reg(Box::new(m.checkpoint_bytes.clone()));
    reg(Box::new(m.state_bytes.clone()));
    reg(Box::new(m.checkpoints.clone()));
    reg(Box::new(m.peer_reachable.clone()));
    reg(Box::new(m.peer_bytes_per_sec.clone()));
    reg(Box::new(m.peer_catch_up_pct.clone()));
    reg(Box::new(m.catch_up_pct.clone()));
    reg(Box::new(m.catch_up_bytes_per_sec.clone()));
    reg(Box::new(m.ready.clone()));
    if let Some(c) = &m.consumer {
        c.register(|b| reg(b).map(|_| ()));
    }
    Some(m)
}

static METRICS: LazyLock<Option<M>> = LazyLock::new(build);

pub fn observe_send(d: Duration, n: u64) {
    if let Some(m) = METRICS.as_ref() {
        m.send_seconds.observe(d.as_secs_f64());
        m.produced.inc_by(n);
    }
}

pub fn observe_pull(n: u64, redirected: bool) {
    if let Some(m) = METRICS.as_ref() {
        m.pulled
            .with_label_values(&[if redirected { "true" } else { "false" }])
            .inc_by(n);
    }
}

/// How often the sampler copies the member's status into the gauges (and at once on a change of
/// role or term). Not on every status change: the status changes with every commit, and a sample
/// (label lookups, resets of the per-peer gauges) on each cost a leader under a 1,000-topic load
/// 4 % of its CPU (`perf`, issue 20). A scrape comes every few seconds at the most.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Samples the member's status into the gauges until the node is dropped.
pub fn spawn_sampler(node: &Arc<Node>) {
    let weak = Arc::downgrade(node);
    let mut leadership = node.member.leadership();
    tokio::spawn(async move {
        let (mut term, mut leader) = (0u64, None);
        // The consumer figures walk every group and queue: once a second at most, though the
        // loop also wakes on every change of role or term.
        let mut consumers_sampled: Option<std::time::Instant> = None;
        loop {
            let Some(n) = weak.upgrade() else { break };
            let st = n.member.status();
            if let Some(m) = METRICS.as_ref() {
                for r in [
                    Role::Leader,
                    Role::Follower,
                    Role::Candidate,
                    Role::Learner,
                    Role::Shutdown,
                ] {
                    m.role
                        .with_label_values(&[r.as_str()])
                        .set((st.role == r) as i64);
                }
                if st.term > term {
                    m.elections
                        .inc_by(if term == 0 { 0 } else { st.term - term });
                }
                if st.leader != leader && leader.is_some() {
                    m.leader_changes.inc();
                }
                m.term.set(st.term as i64);
                m.last_log.set(st.last_log_index as i64);
                m.committed.set(st.committed as i64);
                m.applied.set(st.applied as i64);
                m.follower_lag.reset();
                m.peer_reachable.reset();
                m.peer_bytes_per_sec.reset();
                m.peer_catch_up_pct.reset();
                for p in &st.peers {
                    let id = p.node_id.to_string();
                    m.follower_lag.with_label_values(&[&id]).set(p.lag as i64);
                    m.peer_reachable
                        .with_label_values(&[&id])
                        .set(p.reachable as i64);
                    m.peer_bytes_per_sec
                        .with_label_values(&[&id])
                        .set(p.bytes_per_sec as i64);
                    if let Some(c) = &p.catch_up {
                        m.peer_catch_up_pct
                            .with_label_values(&[&id])
                            .set(c.progress_pct() as i64);
                    }
                }
                m.catch_up_pct.set(
                    st.catch_up
                        .as_ref()
                        .map_or(100, |c| c.progress_pct() as i64),
                );
                m.catch_up_bytes_per_sec
                    .set(st.catch_up.as_ref().map_or(0, |c| c.bytes_per_sec as i64));
                m.ready.set(n.member.ready() as i64);
                m.disk_bytes.set(n.member.disk_bytes() as i64);
                m.checkpoint_bytes.set(n.member.checkpoint_bytes() as i64);
                let (state_bytes, taken) = n.member.checkpoint_stats();
                m.state_bytes.set(state_bytes as i64);
                m.checkpoints
                    .inc_by(taken.saturating_sub(m.checkpoints.get()));
                if let Some(c) = &m.consumer
                    && consumers_sampled.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
                {
                    consumers_sampled = Some(std::time::Instant::now());
                    if st.role == Role::Leader {
                        c.sample(&n.state(), crate::service::wall_ms());
                    } else {
                        c.reset();
                    }
                }
            }
            term = st.term;
            leader = st.leader;
            drop(n);
            if let Ok(Err(_)) = tokio::time::timeout(SAMPLE_EVERY, leadership.changed()).await {
                // The member stopped: sample on the clock alone until the node is dropped.
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        }
    });
}

pub fn render() -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&prometheus::gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}
