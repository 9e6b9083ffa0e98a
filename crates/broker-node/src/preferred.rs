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

/// The follower to hand leadership to before this leader stops: a caught-up voter that answered
/// within the election timeout (the most recently heard from first); `None` when not leading.
pub fn drain_target(st: &Status, election_timeout_ms: u64) -> Option<u64> {
    if st.role != Role::Leader {
        return None;
    }
    st.peers
        .iter()
        .filter(|p| p.node_id != st.node_id && st.voters.contains(&p.node_id))
        .filter(|p| p.lag == 0 && p.last_ack_ms.is_some_and(|ms| ms < election_timeout_ms))
        .min_by_key(|p| p.last_ack_ms)
        .map(|p| p.node_id)
}

/// Entries a voter may lack and still count toward the quorum a stopping leader leaves behind.
pub const DRAIN_LAG_MAX: u64 = 256;

/// Whether the voters other than this leader, on their own, form a majority of caught-up members
/// (each within [`DRAIN_LAG_MAX`] entries and heard from within the election timeout). Until
/// they do, the group could not commit right after this node stops: the new leader would first
/// have to bring a lagging voter up to date, and producers would wait for it.
pub fn quorum_without_me(st: &Status, election_timeout_ms: u64) -> bool {
    let ready = st
        .peers
        .iter()
        .filter(|p| p.node_id != st.node_id && st.voters.contains(&p.node_id))
        .filter(|p| {
            p.lag <= DRAIN_LAG_MAX && p.last_ack_ms.is_some_and(|ms| ms < election_timeout_ms)
        })
        .count();
    ready > st.voters.len() / 2
}

/// The voter furthest behind, for the log: (node id, lag).
fn laggard(st: &Status) -> Option<(u64, u64)> {
    st.peers
        .iter()
        .filter(|p| p.node_id != st.node_id && st.voters.contains(&p.node_id))
        .max_by_key(|p| p.lag)
        .map(|p| (p.node_id, p.lag))
}

/// On a graceful stop (SIGTERM): while this node leads, hands leadership to a caught-up follower
/// and waits until it no longer leads, for at most `max`. Clients then see a planned hand-over
/// (one redirect) rather than an election timeout. It first waits (still leading and serving,
/// for at most half of `max`) until the other voters alone form a caught-up majority
/// ([`quorum_without_me`]), so the new leader commits at once. A follower returns at once.
pub async fn drain(node: &Node, max: Duration) {
    if max.is_zero() || node.member.status().role != Role::Leader {
        return;
    }
    let t0 = std::time::Instant::now();
    tracing::info!(
        max_ms = max.as_millis() as u64,
        "stopping: handing leadership to a caught-up follower first"
    );
    let mut waited_logged = false;
    while t0.elapsed() < max {
        let st = node.member.status();
        if st.role == Role::Leader
            && t0.elapsed() < max / 2
            && !quorum_without_me(&st, node.election_timeout_ms())
        {
            if !waited_logged {
                waited_logged = true;
                tracing::info!(
                    laggard = ?laggard(&st),
                    "waiting for the other voters to catch up before handing over, so the group \
                     commits without this node at once"
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        if st.role != Role::Leader {
            tracing::info!(
                leader = ?st.leader,
                ms = t0.elapsed().as_millis() as u64,
                "leadership handed over; stopping"
            );
            return;
        }
        if let Some(to) = drain_target(&st, node.election_timeout_ms())
            && let Err(e) = node.member.transfer_leader(to).await
        {
            tracing::debug!(to, error = %e, "hand-over not done yet; retrying");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(
        ms = t0.elapsed().as_millis() as u64,
        "no follower took over leadership in time; stopping as leader"
    );
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
    fn a_stopping_leader_hands_over_to_a_caught_up_reachable_voter_only() {
        assert_eq!(
            drain_target(&status(Role::Leader, 1, 0, Some(10)), 300),
            Some(2)
        );
        assert_eq!(
            drain_target(&status(Role::Leader, 1, 3, Some(10)), 300),
            None
        );
        assert_eq!(
            drain_target(&status(Role::Leader, 1, 0, Some(900)), 300),
            None
        );
        assert_eq!(drain_target(&status(Role::Leader, 1, 0, None), 300), None);
        assert_eq!(
            drain_target(&status(Role::Follower, 1, 0, Some(10)), 300),
            None
        );
        let mut learner = status(Role::Leader, 1, 0, Some(10));
        learner.voters = [1, 3].into();
        assert_eq!(drain_target(&learner, 300), None);
    }

    #[test]
    fn a_stopping_leader_waits_until_the_others_alone_form_a_caught_up_majority() {
        let mut st = status(Role::Leader, 1, 0, Some(10));
        let mut other = st.peers[0].clone();
        other.node_id = 3;
        other.lag = DRAIN_LAG_MAX + 1;
        st.peers.push(other);
        // Of voters {1, 2, 3}, only 2 is caught up: 2 and 3 alone could not commit at once.
        assert!(!quorum_without_me(&st, 300));
        st.peers[1].lag = DRAIN_LAG_MAX;
        assert!(quorum_without_me(&st, 300));
        assert_eq!(laggard(&st), Some((3, DRAIN_LAG_MAX)));
        // A silent voter does not count.
        st.peers[1].last_ack_ms = Some(900);
        assert!(!quorum_without_me(&st, 300));
        // Five voters: three of the four others are enough.
        st.voters = [1, 2, 3, 4, 5].into();
        for id in [4, 5] {
            let mut p = st.peers[0].clone();
            p.node_id = id;
            st.peers.push(p);
        }
        assert!(quorum_without_me(&st, 300));
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
