//! The preferred leader (DLedger's `preferredLeaderId`): while another node leads, the leader hands
//! leadership to the preferred node as soon as it is a voter that has caught up with the leader's
//! log and answered within the election timeout. Checked on the leader twice a second.

use std::sync::Arc;
use std::time::Duration;

use raftmq_raft_log::{Role, Status};

use crate::node::Node;

/// Whether the leader should hand over to `preferred` now.
pub fn should_transfer(st: &Status, preferred: u64, election_timeout_ms: u64) -> bool {
    st.role == Role::Leader
        && st.node_id != preferred
        && st.voters.contains(&preferred)
        && st.peers.iter().any(|p| {
            p.node_id == preferred
                && p.lag == 0
                && p.last_ack_ms.is_some_and(|ms| ms < election_timeout_ms)
        })
}

pub fn spawn(node: Arc<Node>) {
    let Some(preferred) = node.cfg.preferred_leader else {
        return;
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tick.tick().await;
            let st = node.member.status();
            if should_transfer(&st, preferred, node.election_timeout_ms()) {
                tracing::info!(to = preferred, "handing leadership to the preferred leader");
                if let Err(e) = node.member.transfer_leader(preferred).await {
                    tracing::debug!(error = %e, "preferred-leader transfer not done; will retry");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use raftmq_raft_log::PeerProgress;

    fn status(role: Role, me: u64, lag: u64, ack: Option<u64>) -> Status {
        Status {
            node_id: me,
            role,
            term: 3,
            leader: Some(me),
            last_log_index: 10,
            committed: 10,
            applied: 10,
            purged: 0,
            snapshot: 0,
            voters: [1, 2, 3].into(),
            learners: Default::default(),
            addresses: Default::default(),
            peers: vec![PeerProgress {
                node_id: 2,
                address: String::new(),
                voter: true,
                matched: Some(10 - lag),
                lag,
                last_ack_ms: ack,
                reachable: true,
                bytes_per_sec: 0,
                catch_up: None,
            }],
            millis_since_leader_contact: Some(0),
            catch_up: None,
        }
    }

    #[test]
    fn hands_over_only_to_a_caught_up_reachable_preferred_voter() {
        let cases = [
            ("caught up", status(Role::Leader, 1, 0, Some(20)), 2, true),
            ("lagging", status(Role::Leader, 1, 5, Some(20)), 2, false),
            ("silent", status(Role::Leader, 1, 0, Some(900)), 2, false),
            ("never answered", status(Role::Leader, 1, 0, None), 2, false),
            (
                "not the leader",
                status(Role::Follower, 1, 0, Some(20)),
                2,
                false,
            ),
            (
                "already preferred",
                status(Role::Leader, 2, 0, Some(20)),
                2,
                false,
            ),
            (
                "not a voter",
                status(Role::Leader, 1, 0, Some(20)),
                4,
                false,
            ),
        ];
        for (name, st, preferred, expected) in cases {
            assert_eq!(should_transfer(&st, preferred, 350), expected, "{name}");
        }
    }
}
