//! A member's status as the broker reads it, and the pure mapping from openraft's metrics to it.
//!
//! [`from_metrics`] is a plain function of the metrics, what this member observed itself
//! ([`Local`]), the catch-up trackers carried from the previous reading and one reading of the
//! clock ([`Now`]). The status task in [`super`] owns the clock, the watch channels and the side
//! effects (allowing or forbidding campaigns); this module decides nothing on its own.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use openraft::{RaftMetrics, ServerState, TokioInstant};

use crate::catchup::{CatchUp, Tracker};
use crate::peers::Links;
use crate::types::TypeConfig;

/// A member's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
    Candidate,
    Learner,
    Shutdown,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Shutdown => "down",
        }
    }
}

impl From<ServerState> for Role {
    fn from(s: ServerState) -> Role {
        match s {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        }
    }
}

/// The replication progress of one peer, as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerProgress {
    pub node_id: u64,
    pub address: String,
    pub voter: bool,
    pub matched: Option<u64>,
    pub lag: u64,
    /// Milliseconds since the leader last heard from this peer.
    pub last_ack_ms: Option<u64>,
    /// False once appends to it failed several times in a row (it is then retried with backoff).
    pub reachable: bool,
    /// Bytes a second of appends it has answered lately.
    pub bytes_per_sec: u64,
    /// Set while it is far behind the group's commit index and catching up.
    pub catch_up: Option<CatchUp>,
}

/// A plain view of a member's Raft state; no openraft type leaks out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub node_id: u64,
    pub role: Role,
    pub term: u64,
    pub leader: Option<u64>,
    pub last_log_index: u64,
    pub committed: u64,
    pub applied: u64,
    pub purged: u64,
    /// Last log index covered by this member's snapshot (0 = none).
    pub snapshot: u64,
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    pub addresses: BTreeMap<u64, String>,
    /// Set on the leader: progress of every other member.
    pub peers: Vec<PeerProgress>,
    /// On a follower: milliseconds since the last AppendEntries from a leader (None = never).
    pub millis_since_leader_contact: Option<u64>,
    /// Set while this member is far behind the commit index its leader sent it: it receives the
    /// log, does not campaign and is not ready.
    pub catch_up: Option<CatchUp>,
}

impl Status {
    /// Every member of the group, voters then learners.
    pub fn members(&self) -> impl Iterator<Item = u64> + '_ {
        self.voters.iter().chain(&self.learners).copied()
    }

    pub fn leader_address(&self) -> Option<(u64, String)> {
        // No hint rather than an empty address when the membership does not name it (yet).
        let id = self.leader?;
        let addr = self.addresses.get(&id).filter(|a| !a.is_empty())?;
        Some((id, addr.clone()))
    }

    /// The status of a member that has not read its metrics yet.
    pub(crate) fn initial(node_id: u64) -> Status {
        Status {
            node_id,
            role: Role::Follower,
            term: 0,
            leader: None,
            last_log_index: 0,
            committed: 0,
            applied: 0,
            purged: 0,
            snapshot: 0,
            voters: BTreeSet::new(),
            learners: BTreeSet::new(),
            addresses: BTreeMap::new(),
            peers: Vec::new(),
            millis_since_leader_contact: None,
            catch_up: None,
        }
    }
}

/// One reading of the clock, in both clocks the status uses: std's (catch-up rates, leader
/// contact) and openraft's (the leader's heartbeat times).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    pub std: Instant,
    pub raft: TokioInstant,
}

impl Now {
    pub(crate) fn read() -> Now {
        Now {
            std: Instant::now(),
            raft: <TokioInstant as openraft::Instant>::now(),
        }
    }
}

/// What this member observed itself, beside openraft's metrics.
pub(crate) struct Local<'a> {
    /// The peer links (reachability, bytes each peer acknowledged); None if unreadable.
    pub links: Option<&'a Links>,
    /// The commit index the leader last sent this member (None = none yet).
    pub leader_commit: Option<u64>,
    /// When this member started, and the last AppendEntries from a leader in milliseconds since
    /// then, plus one (0 = none yet).
    pub started: Instant,
    pub last_append_ms: u64,
}

/// The catch-up trackers a status carries from one reading to the next.
#[derive(Debug, Default)]
pub(crate) struct Trackers {
    /// This member's own, while it follows.
    own: Tracker,
    /// Each peer's, while this member leads.
    peers: BTreeMap<u64, Tracker>,
}

/// Builds the status from openraft's metrics. `disk_bytes` (the bytes of this member's log, its
/// catch-up counter) is read only while this member follows a leader that sent a commit index:
/// it takes the log's lock, which a leader's status, rebuilt on every commit, should not.
pub(crate) fn from_metrics(
    m: &RaftMetrics<TypeConfig>,
    local: &Local<'_>,
    trackers: &mut Trackers,
    now: Now,
    disk_bytes: impl FnOnce() -> u64,
) -> Status {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<u64> = membership.voter_ids().collect();
    let addresses: BTreeMap<u64, String> = membership
        .nodes()
        .map(|(id, n)| (*id, n.addr.clone()))
        .collect();
    let learners: BTreeSet<u64> = addresses
        .keys()
        .filter(|id| !voters.contains(id))
        .copied()
        .collect();
    let last_log_index = m.last_log_index.unwrap_or(0);
    let committed = m.local_committed.map(|l| l.index).unwrap_or(0);
    let role = Role::from(m.state);
    let mut peers = Vec::new();
    if let Some(rep) = &m.replication {
        for (id, matched) in rep.iter() {
            if *id == m.id {
                continue;
            }
            let matched = matched.as_ref().map(|l| l.index);
            let last_ack_ms = m
                .heartbeat
                .as_ref()
                .and_then(|h| h.get(id).cloned().flatten())
                .map(|t| (now.raft - *t).as_millis() as u64);
            let link = local.links.and_then(|l| l.get(*id));
            let tracker = trackers.peers.entry(*id).or_default();
            let catch_up = tracker.observe(
                now.std,
                matched.unwrap_or(0),
                committed,
                link.map_or(0, |l| l.acked_bytes),
            );
            peers.push(PeerProgress {
                node_id: *id,
                address: addresses.get(id).cloned().unwrap_or_default(),
                voter: voters.contains(id),
                matched,
                lag: last_log_index.saturating_sub(matched.unwrap_or(0)),
                last_ack_ms,
                reachable: link.is_none_or(|l| l.reachable()),
                bytes_per_sec: tracker.rate() as u64,
                catch_up,
            });
        }
    } else {
        trackers.peers.clear();
    }
    // A follower compares what it holds with the commit index its leader sent it.
    let catch_up = match (role, local.leader_commit) {
        (Role::Follower | Role::Learner, Some(c)) => {
            trackers
                .own
                .observe(now.std, last_log_index, c, disk_bytes())
        }
        _ => {
            trackers.own = Tracker::default();
            None
        }
    };
    let la = local.last_append_ms;
    let contact = (la > 0).then(|| {
        (now.std.saturating_duration_since(local.started).as_millis() as u64).saturating_sub(la - 1)
    });
    Status {
        node_id: m.id,
        role,
        term: m.current_term,
        leader: m.current_leader,
        last_log_index,
        committed,
        applied: m.last_applied.map(|l| l.index).unwrap_or(0),
        purged: m.purged.map(|l| l.index).unwrap_or(0),
        snapshot: m.snapshot.map(|l| l.index).unwrap_or(0),
        voters,
        learners,
        addresses,
        peers,
        millis_since_leader_contact: if role == Role::Leader {
            Some(0)
        } else {
            contact
        },
        catch_up,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::ServerState;

    use super::*;
    use crate::catchup::CATCH_UP_ENTER_ENTRIES;
    use crate::node::test_metrics::{lead, metrics};
    use crate::types::log_id;

    fn now() -> Now {
        Now::read()
    }

    fn local(started: Instant) -> Local<'static> {
        Local {
            links: None,
            leader_commit: None,
            started,
            last_append_ms: 0,
        }
    }

    /// Node 2 of three, following leader 1 in term 3, its log holding up to `last`.
    fn follower_of_1_holding(last: u64) -> RaftMetrics<TypeConfig> {
        let mut m = metrics(2, ServerState::Follower, 3, &[1, 2, 3], &[]);
        m.current_leader = Some(1);
        m.last_log_index = Some(last);
        m
    }

    /// The status `m` maps to now, for a member that started now with no trackers.
    fn status_now(m: &RaftMetrics<TypeConfig>) -> Status {
        let now = now();
        from_metrics(m, &local(now.std), &mut Trackers::default(), now, no_disk)
    }

    fn no_disk() -> u64 {
        panic!("the log's size is read only while following a leader's commit index")
    }

    #[test]
    fn t01_a_leader_reports_itself_and_every_other_member_with_its_progress() {
        let now = now();
        let mut m = metrics(1, ServerState::Leader, 3, &[1, 2, 3], &[4]);
        m.last_log_index = Some(100);
        m.local_committed = Some(log_id(3, 1, 98));
        m.last_applied = Some(log_id(3, 1, 97));
        lead(
            &mut m,
            &[
                (1, Some(100), None),
                (2, Some(100), Some(now.raft - Duration::from_millis(40))),
                (3, Some(90), None),
                (4, None, None),
            ],
        );
        let st = from_metrics(&m, &local(now.std), &mut Trackers::default(), now, no_disk);
        assert_eq!(st.role, Role::Leader);
        assert_eq!((st.node_id, st.term, st.leader), (1, 3, Some(1)));
        assert_eq!((st.last_log_index, st.committed, st.applied), (100, 98, 97));
        assert_eq!(st.millis_since_leader_contact, Some(0));
        assert_eq!(st.leader_address(), Some((1, "10.0.0.1:9000".into())));
        assert_eq!(st.voters, BTreeSet::from([1, 2, 3]));
        assert_eq!(st.learners, BTreeSet::from([4]));
        let ids: Vec<u64> = st.peers.iter().map(|p| p.node_id).collect();
        assert_eq!(ids, [2, 3, 4], "the leader is not its own peer");
        let p2 = &st.peers[0];
        assert_eq!(p2.address, "10.0.0.2:9000");
        assert!(p2.voter && p2.reachable);
        assert_eq!(
            (p2.matched, p2.lag, p2.last_ack_ms),
            (Some(100), 0, Some(40))
        );
        let p3 = &st.peers[1];
        assert_eq!((p3.matched, p3.lag, p3.last_ack_ms), (Some(90), 10, None));
        assert_eq!(p3.catch_up, None, "ten entries behind is not catching up");
        let p4 = &st.peers[2];
        assert!(!p4.voter);
        assert_eq!((p4.matched, p4.lag), (None, 100));
        assert!(
            p4.catch_up.is_some(),
            "a learner with nothing is catching up"
        );
    }

    #[test]
    fn t02_a_follower_reports_its_leader_and_the_time_since_its_last_append() {
        let now = now();
        let m = follower_of_1_holding(50);
        let started = now.std - Duration::from_millis(10_000);
        let local = Local {
            // Last append 9,700 ms after start (stored plus one).
            last_append_ms: 9_701,
            leader_commit: Some(50),
            ..local(started)
        };
        let mut disk_reads = 0;
        let st = from_metrics(&m, &local, &mut Trackers::default(), now, || {
            disk_reads += 1;
            0
        });
        assert_eq!(disk_reads, 1);
        assert_eq!(st.role, Role::Follower);
        assert_eq!(st.leader_address(), Some((1, "10.0.0.1:9000".into())));
        assert_eq!(st.millis_since_leader_contact, Some(300));
        assert!(st.peers.is_empty());
        assert_eq!(st.catch_up, None);
    }

    #[test]
    fn t03_a_follower_far_behind_the_commit_index_it_was_sent_is_catching_up_until_it_holds_it() {
        let now = now();
        let mut m = follower_of_1_holding(10);
        let target = 10 + CATCH_UP_ENTER_ENTRIES + 1;
        let local = Local {
            leader_commit: Some(target),
            last_append_ms: 1,
            ..local(now.std)
        };
        let mut trackers = Trackers::default();
        let st = from_metrics(&m, &local, &mut trackers, now, || 1 << 20);
        let c = st.catch_up.expect("catching up");
        assert_eq!((c.from, c.at, c.target), (10, 10, target));
        m.last_log_index = Some(target);
        let st = from_metrics(&m, &local, &mut trackers, now, || 2 << 20);
        assert_eq!(st.catch_up, None);
    }

    #[test]
    fn t04_a_candidate_has_no_leader_and_never_heard_from_one() {
        let m = metrics(3, ServerState::Candidate, 4, &[1, 2, 3], &[]);
        let st = status_now(&m);
        assert_eq!(st.role, Role::Candidate);
        assert_eq!((st.leader, st.leader_address()), (None, None));
        assert_eq!(st.millis_since_leader_contact, None);
        assert_eq!(st.catch_up, None);
    }

    #[test]
    fn t05_a_learner_is_listed_apart_from_the_voters() {
        let mut m = metrics(4, ServerState::Learner, 3, &[1, 2, 3], &[4]);
        m.current_leader = Some(1);
        let st = status_now(&m);
        assert_eq!(st.role, Role::Learner);
        assert!(!st.voters.contains(&4));
        assert_eq!(st.learners, BTreeSet::from([4]));
        assert_eq!(st.addresses.len(), 4);
    }

    #[test]
    fn t06_a_leader_unknown_or_missing_from_the_membership_gives_no_address_hint() {
        let mut m = metrics(2, ServerState::Follower, 3, &[1, 2, 3], &[]);
        let st = status_now(&m);
        assert_eq!((st.leader, st.leader_address()), (None, None));
        // Named by a heartbeat before this member learnt the membership that holds it.
        m.current_leader = Some(9);
        let st = status_now(&m);
        assert_eq!((st.leader, st.leader_address()), (Some(9), None));
    }

    #[test]
    fn t07_a_stopped_member_is_down() {
        let m = metrics(1, ServerState::Shutdown, 3, &[1, 2, 3], &[]);
        let st = status_now(&m);
        assert_eq!(st.role, Role::Shutdown);
        assert_eq!(st.role.as_str(), "down");
    }

    #[test]
    fn t08_peer_trackers_are_forgotten_once_this_member_stops_leading() {
        let now = now();
        let mut m = metrics(1, ServerState::Leader, 3, &[1, 2, 3], &[]);
        m.last_log_index = Some(1000);
        m.local_committed = Some(log_id(3, 1, 1000));
        lead(&mut m, &[(2, Some(1000), None), (3, Some(0), None)]);
        let mut trackers = Trackers::default();
        let st = from_metrics(&m, &local(now.std), &mut trackers, now, no_disk);
        assert_eq!(st.peers[1].catch_up.as_ref().map(|c| c.from), Some(0));
        assert_eq!(trackers.peers.len(), 2);
        let mut f = metrics(1, ServerState::Follower, 4, &[1, 2, 3], &[]);
        f.last_log_index = Some(1000);
        from_metrics(&f, &local(now.std), &mut trackers, now, no_disk);
        assert!(trackers.peers.is_empty());
    }

    #[test]
    fn t09_every_server_state_has_its_role() {
        for (s, r) in [
            (ServerState::Leader, Role::Leader),
            (ServerState::Follower, Role::Follower),
            (ServerState::Candidate, Role::Candidate),
            (ServerState::Learner, Role::Learner),
            (ServerState::Shutdown, Role::Shutdown),
        ] {
            assert_eq!(Role::from(s), r);
        }
    }
}
