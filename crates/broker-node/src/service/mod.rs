//! The public client service (`BrokerService`) and the admin service, served by one [`Broker`].
//!
//! - [`broker`]: the `BrokerService` handlers (send, pull, offsets, topics, consumer groups).
//! - [`send`]: the send path, and [`send::validate_send`], the pure check of a batch against the
//!   limits.
//! - [`reads`]: the pull path: messages read out of the log, and the read hint for the consumer.
//! - [`pop`]: the POP path (receive, ack, invisibility, dead letters, consumer groups).
//! - [`admin`]: the `AdminService` handlers (leadership transfer, membership changes).
//! - [`inspect`]: the `InspectService` handlers (topic and consumer-group status, message lookup).
//! - [`status`]: the node status reply.
//!
//! Failures travel in each reply's `error` field with a stable code: handlers return
//! [`crate::error::Error`], and [`crate::error::Error::to_proto`] is the one place that maps it to
//! the wire. This module holds what the handlers share: the leader checks and proposals.

/// Authorizes a handler's request before it does anything: on a refusal the handler answers
/// `$reply` with the refusal in its `error` field (UNAUTHENTICATED or FORBIDDEN) and the rest
/// default. `$res` are `raftmq_security::acl::Resource`s.
macro_rules! authorize {
    ($self:ident, $req:expr, $reply:ident, $action:ident, [$($res:expr),* $(,)?]) => {
        if let Err(refused) = crate::auth::authorize_ext(
            &$self.node.cfg,
            $req.extensions(),
            raftmq_security::acl::Action::$action,
            &[$($res),*],
        ) {
            // Some replies hold nothing but `error`.
            #[allow(clippy::needless_update)]
            let reply = $reply {
                error: Some(crate::error::Error::from(refused).into()),
                ..Default::default()
            };
            return Ok(tonic::Response::new(reply));
        }
    };
}

/// [`authorize!`] with the action as a value (`raftmq_security::acl::Action`).
macro_rules! authorize_action {
    ($self:ident, $req:expr, $reply:ident, $action:expr, [$($res:expr),* $(,)?]) => {
        if let Err(refused) =
            crate::auth::authorize_ext(&$self.node.cfg, $req.extensions(), $action, &[$($res),*])
        {
            // Some replies hold nothing but `error`.
            #[allow(clippy::needless_update)]
            let reply = $reply {
                error: Some(crate::error::Error::from(refused).into()),
                ..Default::default()
            };
            return Ok(tonic::Response::new(reply));
        }
    };
}

mod admin;
mod broker;
pub mod inspect;
mod pop;
pub mod reads;
pub mod schedule;
pub mod send;
mod status;
pub mod txn;
pub mod users;

use std::sync::Arc;
use std::time::Duration;

use raftmq_raft_log::Role;

use crate::command::{Command, Reply};
use crate::config::check_name;
use crate::error::{Error, Internal, Refused, Result, Unavailable};
use crate::node::Node;

pub use pop::{spawn_dead_letter_mover, wall_ms};
pub use schedule::spawn_deliverer;
pub use send::validate_send;

/// Serves both the broker and the admin service of one node.
#[derive(Clone)]
pub struct Broker {
    pub node: Arc<Node>,
}

/// Longest a send waits on a node that knows no leader (an election) for one to be elected.
const NO_LEADER_WAIT_MAX: Duration = Duration::from_millis(250);

/// The deadline a gRPC client set (`grpc-timeout`: digits and a unit), if any.
fn grpc_timeout(md: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let v = md.get("grpc-timeout")?.to_str().ok()?;
    let (n, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

impl Broker {
    /// Leader check before doing work; followers answer NOT_LEADER with the leader.
    fn require_leader(&self) -> Result<()> {
        self.node.member.status_with(|st| {
            if st.role == Role::Leader {
                Ok(())
            } else {
                Err(Error::NotLeader {
                    leader: st.leader_address(),
                })
            }
        })
    }

    /// [`Self::require_leader`], but while this node knows no leader (an election is running) it
    /// waits for one — at most `NO_LEADER_WAIT_MAX` and half the caller's deadline — so the
    /// producer hears of the new leader the moment this node does instead of polling for it.
    async fn await_leader(&self, caller_timeout: Option<Duration>) -> Result<()> {
        match self.require_leader() {
            Err(Error::NotLeader { leader: None }) => {}
            other => return other,
        }
        let wait = caller_timeout.map_or(NO_LEADER_WAIT_MAX, |t| (t / 2).min(NO_LEADER_WAIT_MAX));
        let mut watch = self.node.member.watch();
        let _ = tokio::time::timeout(
            wait,
            watch.wait_for(|s| s.role == Role::Leader || s.leader.is_some()),
        )
        .await;
        self.require_leader()
    }

    /// The command tags every member of the group applies, as this node knows them.
    fn group_command_tags(&self) -> u32 {
        // The members first: no other lock is taken under the status borrow.
        let members: Vec<u64> = self.node.member.status_with(|st| st.members().collect());
        self.node.features.group(self.node.cfg.node_id, members).0
    }

    /// Replicates a command and returns its log index and the state machine's reply.
    async fn propose(&self, cmd: Command) -> Result<(u64, Reply)> {
        let encoded = cmd.encode();
        // A command newer than the first release waits until every member can apply it.
        if let Some(tag) = crate::features::tag_of(&encoded) {
            self.require_tag(tag).await?;
        }
        self.propose_encoded(encoded).await
    }

    /// Refuses (UNAVAILABLE, naming the member to upgrade) unless every member applies command
    /// tag `tag`; the first release's commands always pass.
    async fn require_tag(&self, tag: u32) -> Result<()> {
        if tag >= crate::features::FIRST_RELEASE_COMMAND_TAGS {
            let members: Vec<u64> = self.node.member.status_with(|st| st.members().collect());
            let me = self.node.cfg.node_id;
            let mut group = self.node.features.group(me, members.iter().copied());
            if tag >= group.0 {
                // Members never heard from (a group that just started) are asked once, now.
                let unknown: Vec<u64> = members
                    .iter()
                    .copied()
                    .filter(|m| *m != me && self.node.features.of(*m).is_none())
                    .collect();
                if !unknown.is_empty() {
                    crate::features::ask(&self.node, &unknown).await;
                    group = self.node.features.group(me, members.iter().copied());
                }
            }
            let (group, lowest) = group;
            if tag >= group {
                return Err(Unavailable::MemberBehind {
                    node: lowest.unwrap_or(self.node.cfg.node_id),
                    member_tags: group,
                    tag,
                }
                .into());
            }
        }
        Ok(())
    }

    async fn propose_encoded(&self, encoded: Vec<u8>) -> Result<(u64, Reply)> {
        let (index, bytes) = self.node.member.propose(encoded.into()).await?;
        let reply = Reply::decode(&bytes).map_err(|err| Internal::BadReply {
            reason: err.to_string(),
        })?;
        Ok((index, reply))
    }

    /// Proposes a command whose reply carries nothing but success or an error.
    async fn propose_for_error(&self, cmd: Command) -> Result<()> {
        let (_, reply) = self.propose(cmd).await?;
        Error::from_reply(&reply).map_or(Ok(()), Err)
    }

    /// The topic's name is valid, it exists on this node, and `queue` is one of its queues.
    fn check_topic(&self, topic: &str, queue: u32) -> Result<()> {
        self.check_topic_in(&self.node.state(), topic, queue)
    }

    /// [`Self::check_topic`] against a state the caller holds (one lock for many checks).
    fn check_topic_in(
        &self,
        st: &crate::state::BrokerState,
        topic: &str,
        queue: u32,
    ) -> Result<()> {
        check_name("topic", topic).map_err(Error::invalid)?;
        match st.topics.get(topic) {
            None => Err(Refused::TopicNotFound {
                topic: topic.to_string(),
                broker: Some(self.node.cfg.broker.clone()),
            }
            .into()),
            Some(t) if queue as usize >= t.queues.len() => Err(Refused::QueueOutOfRange {
                topic: topic.to_string(),
                queue,
                queues: t.queues.len(),
            }
            .into()),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert_eq!(grpc_timeout(&md), None);
        for (v, d) in [
            ("500m", Duration::from_millis(500)),
            ("3S", Duration::from_secs(3)),
            ("2M", Duration::from_secs(120)),
            ("750000u", Duration::from_millis(750)),
        ] {
            md.insert("grpc-timeout", v.parse().expect("ascii"));
            assert_eq!(grpc_timeout(&md), Some(d), "{v}");
        }
        md.insert("grpc-timeout", "x".parse().expect("ascii"));
        assert_eq!(grpc_timeout(&md), None);
    }
}
