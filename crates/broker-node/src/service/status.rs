//! The node status reply: this node's role, log, peers, queues and readiness, as `raftmq cluster
//! status` shows them.

use raftmq_proto::v1::{
    CatchUpStatus, LogSegment, NodeRef, NodeStatusResponse, PeerStatus, QueueStatus, ReadHintConfig,
};

use super::Broker;

impl Broker {
    pub(super) fn status_response(&self) -> NodeStatusResponse {
        let n = &self.node;
        let st = n.member.status();
        let state = n.state();
        let queues = state
            .topics
            .sorted()
            .into_iter()
            .flat_map(|(t, ts)| {
                ts.queues.iter().enumerate().map(move |(i, q)| QueueStatus {
                    topic: t.clone(),
                    queue: i as u32,
                    min_offset: q.min_offset,
                    max_offset: q.next_offset,
                })
            })
            .collect();
        let topics = state.topics.len() as u64;
        drop(state);
        NodeStatusResponse {
            cluster: n.cfg.cluster.clone(),
            broker: n.cfg.broker.clone(),
            node_id: n.cfg.node_id,
            address: n.address.clone(),
            role: st.role.as_str().into(),
            term: st.term,
            leader: st
                .leader_address()
                .map(|(node_id, address)| NodeRef { node_id, address }),
            last_log_index: st.last_log_index,
            committed: st.committed,
            applied: st.applied,
            peers: st
                .peers
                .iter()
                .map(|p| PeerStatus {
                    node_id: p.node_id,
                    address: p.address.clone(),
                    voter: p.voter,
                    matched_index: p.matched.unwrap_or(0),
                    lag: p.lag,
                    last_ack_ms: p.last_ack_ms,
                    reachable: p.reachable,
                    bytes_per_sec: p.bytes_per_sec,
                    catch_up: p.catch_up.as_ref().map(catch_up_status),
                    command_tags: n.features.of(p.node_id),
                })
                .collect(),
            read_hint: Some(ReadHintConfig {
                leader_busy_msgs_per_sec: n.cfg.read_hint.leader_busy_msgs_per_sec,
                cold_read_lag: n.cfg.read_hint.cold_read_lag,
                follower_lag_redirect: n.cfg.read_hint.follower_lag_redirect,
                election_timeout_ms: n.election_timeout_ms(),
            }),
            produce_msgs_per_sec: n.produced.per_sec(),
            pull_msgs_per_sec: n.pulled.per_sec(),
            topics,
            millis_since_leader_contact: st.millis_since_leader_contact,
            queues,
            flush_mode: n.cfg.raft.flush_mode.as_str().into(),
            repairing_to: n.member.repairing().map(|(_, floor)| floor),
            catch_up: st.catch_up.as_ref().map(catch_up_status),
            ready: n.member.ready(),
            command_tags: crate::command::COMMAND_TAGS,
            group_command_tags: n.features.group(n.cfg.node_id, st.members()).0,
            version: env!("CARGO_PKG_VERSION").into(),
            uptime_ms: n.started.elapsed().as_millis() as u64,
            config_json: serde_json::to_string(&n.cfg).unwrap_or_default(),
            log_disk_bytes: n.member.disk_bytes(),
            disk_used_pct: crate::retention::disk_used_pct(&n.cfg.data_dir),
            clean_watermark_pct: n.cfg.retention.clean_watermark_pct.into(),
            full_watermark_pct: n.cfg.retention.full_watermark_pct.into(),
            disk_full: n.disk_full.load(std::sync::atomic::Ordering::Relaxed),
            segments: n
                .member
                .sealed_segments()
                .into_iter()
                .map(|(first_index, last_index, bytes, _)| LogSegment {
                    first_index,
                    last_index,
                    bytes,
                })
                .collect(),
            snapshot_index: st.snapshot,
            purged_index: st.purged,
        }
    }
}

fn catch_up_status(c: &raftmq_raft_log::CatchUp) -> CatchUpStatus {
    CatchUpStatus {
        from_index: c.from,
        at_index: c.at,
        target_index: c.target,
        progress_pct: c.progress_pct(),
        bytes_per_sec: c.bytes_per_sec,
    }
}
