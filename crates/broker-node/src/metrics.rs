//! Prometheus metrics of a node, in the process-wide default registry (the log's fsync histogram
//! lives there too), sampled from the member's status once a second.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};
use raftmq_raft_log::Role;

use crate::node::Node;

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
    peer_reachable: IntGaugeVec,
    peer_bytes_per_sec: IntGaugeVec,
    peer_catch_up_pct: IntGaugeVec,
    catch_up_pct: IntGauge,
    catch_up_bytes_per_sec: IntGauge,
    ready: IntGauge,
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
            HistogramOpts::new("raftmq_send_seconds", "send latency until commit").buckets(vec![
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
            ]),
        )
        .ok()?,
        disk_bytes: IntGauge::new("raftmq_log_disk_bytes", "bytes of log segments on disk").ok()?,
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
    reg(Box::new(m.peer_reachable.clone()));
    reg(Box::new(m.peer_bytes_per_sec.clone()));
    reg(Box::new(m.peer_catch_up_pct.clone()));
    reg(Box::new(m.catch_up_pct.clone()));
    reg(Box::new(m.catch_up_bytes_per_sec.clone()));
    reg(Box::new(m.ready.clone()));
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

/// Samples the member's status into the gauges until the node is dropped.
pub fn spawn_sampler(node: &Arc<Node>) {
    let weak = Arc::downgrade(node);
    let mut watch = node.member.watch();
    tokio::spawn(async move {
        let (mut term, mut leader) = (0u64, None);
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
            }
            term = st.term;
            leader = st.leader;
            drop(n);
            let _ = tokio::time::timeout(Duration::from_secs(1), watch.changed()).await;
        }
    });
}

pub fn render() -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    let _ = prometheus::TextEncoder::new().encode(&prometheus::gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}
