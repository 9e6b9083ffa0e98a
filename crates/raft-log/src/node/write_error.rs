//! The one mapping of openraft's write errors (a proposal, adding a learner, changing the voters)
//! to [`ProposeError`], whose variants tell the caller what to do: follow the leader, retry later,
//! fix the request, or give up on this member.
//!
//! The class follows the error's meaning, not the call: an error that passes when retried (another
//! membership change still in flight, a leader that has not committed its first entry, an entry
//! lost to a leader change) is [`ProposeError::Unavailable`]; a request that can never succeed as
//! it is (an empty voter set, promoting a node that is not a learner) is [`ProposeError::Invalid`].
//! Each call meets only the errors its request can raise: a proposal never raises a membership
//! error.

use openraft::error::{ChangeMembershipError, ClientWriteError, ForwardToLeader, RaftError};

use crate::error::ProposeError;
use crate::types::TypeConfig;

/// The error of a write to the Raft group.
pub(crate) type WriteError = RaftError<TypeConfig, ClientWriteError<TypeConfig>>;

pub(crate) fn propose_error(e: WriteError) -> ProposeError {
    match e {
        RaftError::APIError(e) => match e {
            // Rejected before it was appended: safe to send to the leader.
            ClientWriteError::ForwardToLeader(f) => not_leader(f),
            // Appended here, then discarded by a new leader: it may still commit there, so it is
            // not a plain redirect; the caller retries (with its own deduplication).
            ClientWriteError::LogEntryDiscarded(_) => ProposeError::Unavailable(e.to_string()),
            ClientWriteError::ChangeMembershipError(c) => match c {
                ChangeMembershipError::InProgress(_)
                | ChangeMembershipError::UncommittedLeaderLog(_) => {
                    ProposeError::Unavailable(c.to_string())
                }
                ChangeMembershipError::EmptyMembership(_)
                | ChangeMembershipError::LearnerNotFound(_)
                | ChangeMembershipError::UnsupportedMembershipTransition(_)
                | ChangeMembershipError::NodeMetadataChanged(_) => {
                    ProposeError::Invalid(c.to_string())
                }
            },
            // raftmq attaches no preconditions; one that fails is the request's fault.
            ClientWriteError::PreconditionFailed(_) => ProposeError::Invalid(e.to_string()),
        },
        RaftError::Fatal(e) => ProposeError::Fatal(e.to_string()),
    }
}

fn not_leader(f: ForwardToLeader<TypeConfig>) -> ProposeError {
    ProposeError::NotLeader {
        leader: f
            .leader_id
            .map(|id| (id, f.leader_node.map(|n| n.addr).unwrap_or_default())),
    }
}

#[cfg(test)]
mod tests {
    use openraft::BasicNode;
    use openraft::error::{
        EmptyMembership, Fatal, InProgress, LearnerNotFound, NodeMetadataChanged,
        UncommittedLeaderLog,
    };
    use openraft::impls::leader_id_adv::LeaderId;

    use super::*;
    use crate::types::log_id;

    fn api(e: impl Into<ClientWriteError<TypeConfig>>) -> WriteError {
        RaftError::APIError(e.into())
    }

    fn membership(e: impl Into<ChangeMembershipError<LeaderId<u64, u64>, u64>>) -> WriteError {
        api(ClientWriteError::ChangeMembershipError(e.into()))
    }

    #[test]
    fn t01_a_redirect_names_the_leader_and_its_address_when_known() {
        let f = ForwardToLeader::new(2, BasicNode::new("127.0.0.1:9002"));
        assert_eq!(
            propose_error(api(f)),
            ProposeError::NotLeader {
                leader: Some((2, "127.0.0.1:9002".into()))
            }
        );
        assert_eq!(
            propose_error(api(ForwardToLeader::empty())),
            ProposeError::NotLeader { leader: None }
        );
        // A leader id without its node gives an empty address (the caller drops it as a hint).
        let f = ForwardToLeader::<TypeConfig> {
            leader_node: None,
            ..ForwardToLeader::new(3, BasicNode::default())
        };
        assert_eq!(
            propose_error(api(f)),
            ProposeError::NotLeader {
                leader: Some((3, String::new()))
            }
        );
    }

    #[test]
    fn t02_an_entry_discarded_by_a_leader_change_is_unavailable_not_a_redirect() {
        let e = api(ClientWriteError::LogEntryDiscarded(ForwardToLeader::new(
            2,
            BasicNode::default(),
        )));
        assert!(matches!(propose_error(e), ProposeError::Unavailable(_)));
    }

    #[test]
    fn t03_a_membership_change_that_passes_when_retried_is_unavailable() {
        let in_progress = InProgress {
            committed: Some(log_id(1, 1, 1)),
            membership_log_id: Some(log_id(1, 1, 5)),
        };
        let e = propose_error(membership(in_progress));
        assert!(
            matches!(&e, ProposeError::Unavailable(m) if m.contains("configuration change")),
            "{e:?}"
        );
        let uncommitted = UncommittedLeaderLog {
            committed: Some(log_id(1, 1, 4)),
            leader_log_id: log_id(2, 1, 5),
        };
        assert!(matches!(
            propose_error(membership(uncommitted)),
            ProposeError::Unavailable(_)
        ));
    }

    #[test]
    fn t04_a_membership_change_that_cannot_succeed_as_asked_is_invalid() {
        assert!(matches!(
            propose_error(membership(EmptyMembership {})),
            ProposeError::Invalid(_)
        ));
        assert!(matches!(
            propose_error(membership(LearnerNotFound { node_id: 7 })),
            ProposeError::Invalid(_)
        ));
        assert!(matches!(
            propose_error(membership(NodeMetadataChanged { node_id: 7 })),
            ProposeError::Invalid(_)
        ));
    }

    #[test]
    fn t05_a_stopped_member_is_fatal() {
        let e: WriteError = RaftError::Fatal(Fatal::Stopped);
        assert_eq!(propose_error(e), ProposeError::Fatal("raft stopped".into()));
    }
}
