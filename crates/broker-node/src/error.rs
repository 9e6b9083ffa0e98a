//! The one error type of the broker and admin services, and its one mapping to the wire.
//!
//! A service never answers with a gRPC status for a request it understood: the failure travels in
//! the reply's `error` field as a [`v1::Error`] with a stable [`ErrorCode`], built by
//! [`Error::to_proto`] and nowhere else. The variants are grouped by what the caller does next, as
//! openraft keeps API errors apart from fatal ones:
//!
//! - [`Error::NotLeader`]: send the request to the leader named in the hint (or wait for one).
//! - [`Refused`]: the request itself is wrong (a bad name, too large, an unknown topic, an offset
//!   outside the queue); retrying it unchanged gets the same answer.
//! - [`Unavailable`]: this node or group cannot do it now (no quorum, leadership lost, too many
//!   sends in flight, disk full); retry later or elsewhere. A send refused this way after it was
//!   proposed may or may not be stored, which the message says.
//! - [`Error::Stopped`]: this node's Raft member stopped for good (storage failed); go elsewhere.
//! - [`Internal`]: a defect or a log that cannot be read; nothing the caller can fix.
//!
//! The message of every variant is the text clients have always seen; tests pin it.

use raftmq_proto::v1::{self, ErrorCode, NodeRef};
use raftmq_raft_log::ProposeError;

use crate::command::Reply;

/// Every failure the broker and admin services answer with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// This node does not lead its group; `leader` is (node id, address) when one is known.
    #[error("{}", not_leader_message(leader))]
    NotLeader {
        /// The leader this node knows of, if any (none during an election).
        leader: Option<(u64, String)>,
    },
    /// The request is wrong as it stands.
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The node or its group cannot do it now.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// This node's Raft member stopped (openraft's fatal errors: storage failed, shut down).
    #[error("this node stopped: {reason}")]
    Stopped {
        /// What stopped it, as the member reported it.
        reason: String,
    },
    /// A defect, or a log entry that cannot be read.
    #[error(transparent)]
    Internal(#[from] Internal),
}

/// A request refused for what it asks: the same request gets the same answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refused {
    /// A request without a valid signature (auth on); the reason names what is wrong, never a
    /// secret.
    #[error("unauthenticated: {reason}")]
    Unauthenticated {
        /// Why the signature was not taken.
        reason: String,
    },
    /// A user whose rules do not allow the action on the resource.
    #[error("forbidden: {who} may not {action} on {resource}")]
    Forbidden {
        /// The access key.
        who: String,
        /// The action asked for (Pub, Sub, …).
        action: String,
        /// The resource (`topic:orders`, `group:g1`, `cluster`).
        resource: String,
    },
    /// A field is malformed (a name, or a rule the state machine checks); `reason` says which.
    #[error("{reason}")]
    InvalidArgument {
        /// The rule broken, naming the field, e.g. "topic name must be 1 to 127 characters…".
        reason: String,
    },
    /// A send without messages.
    #[error("a send carries at least one message")]
    EmptySend,
    /// A send with more messages than `batch_messages_max`.
    #[error("batch of {count} messages exceeds the limit of {max}")]
    TooManyMessages {
        /// Messages in the send.
        count: usize,
        /// The configured limit.
        max: usize,
    },
    /// One message's body is larger than `body_bytes_max`.
    #[error("message {index}: body of {bytes} bytes exceeds the limit of {max} bytes")]
    BodyTooLarge {
        /// The message's position in the batch.
        index: usize,
        /// Its body's size.
        bytes: usize,
        /// The configured limit.
        max: usize,
    },
    /// One message's properties (keys plus values) are larger than `properties_bytes_max`.
    #[error("message {index}: properties of {bytes} bytes exceed the limit of {max} bytes")]
    PropertiesTooLarge {
        /// The message's position in the batch.
        index: usize,
        /// Its properties' size, keys plus values.
        bytes: usize,
        /// The configured limit.
        max: usize,
    },
    /// The whole batch (bodies, properties, keys and tags) is larger than `batch_bytes_max`.
    #[error("batch of {bytes} bytes exceeds the limit of {max} bytes")]
    BatchTooLarge {
        /// The batch's size.
        bytes: usize,
        /// The configured limit.
        max: usize,
    },
    /// A topic creation asks for no queues or more than `queues_per_topic_max`.
    #[error("queues must be 1 to {max}, got {requested}")]
    QueueCount {
        /// The count asked for.
        requested: u32,
        /// The configured limit.
        max: u32,
    },
    /// A queue number past the topic's queues.
    #[error("queue {queue} is out of range: topic {topic} has {queues} queues")]
    QueueOutOfRange {
        /// The topic.
        topic: String,
        /// The queue asked for.
        queue: u32,
        /// How many queues the topic has.
        queues: usize,
    },
    /// A heartbeat's consumer id is empty or longer than 255 bytes.
    #[error("consumer_id must be 1 to 255 bytes")]
    ConsumerIdLength,
    /// An added learner lacks its node id or address.
    #[error("node_id and address are required")]
    LearnerIncomplete,
    /// The topic does not exist here; `broker` names the group when the service knows it (the
    /// state machine's own refusal does not).
    #[error("topic {topic:?} does not exist on {}", group_phrase(broker))]
    TopicNotFound {
        /// The topic asked for.
        topic: String,
        /// The broker group's name, when known.
        broker: Option<String>,
    },
    /// The topic was deleted while a pull waited on it.
    #[error("topic {topic:?} was deleted")]
    TopicDeleted {
        /// The topic.
        topic: String,
    },
    /// A topic creation without `update` for a topic that exists.
    #[error("topic exists with {queues} queues; pass update to change the count")]
    TopicExists {
        /// The existing topic's queue count.
        queues: u32,
    },
    /// A receipt handle that names no delivery in flight: acknowledged already, handed out again
    /// after its deadline, replaced by a change of invisibility, or not a handle of this group.
    #[error("receipt handle is stale or invalid: {reason}")]
    InvalidReceiptHandle {
        /// What the handle named, or why it is not one.
        reason: String,
    },
    /// The consumer group does not exist on this broker group.
    #[error("consumer group {group:?} does not exist on this broker group")]
    GroupNotFound {
        /// The group asked for.
        group: String,
    },
    /// A group creation without `update` for a group that exists with another config.
    #[error("consumer group {group:?} exists with another config; pass update to change it")]
    GroupExists {
        /// The group.
        group: String,
    },
    /// A delivery time that is not a number of ms, further ahead than the horizon, or on a topic
    /// that is not of type DELAY (the reason says which, and names the message).
    #[error("{reason}")]
    IllegalDeliveryTime {
        /// The rule broken, e.g. "message 2: delivery time … is beyond the horizon of 40 days".
        reason: String,
    },
    /// A recall of a message that does not wait for its time.
    #[error(
        "message {id} of topic {topic} is not waiting for its delivery time: it was delivered or \
         recalled already, or was never scheduled"
    )]
    NotScheduled {
        /// The message id asked for.
        id: String,
        /// The topic.
        topic: String,
    },
    /// An end of a transaction that is not open.
    #[error(
        "transaction {id} of topic {topic} is not open: it was committed or rolled back \
         already (a check-back's answer, or {checks} unanswered checks, may have ended it), or \
         it never began"
    )]
    TransactionNotOpen {
        /// The transaction id asked for.
        id: String,
        /// The topic.
        topic: String,
        /// Checks after which an unanswered transaction is rolled back.
        checks: u32,
    },
    /// A pull from an offset outside what the queue holds; the reply carries the range.
    #[error("offset {offset} is outside the queue's range [{min}, {max}]")]
    OffsetOutOfRange {
        /// The offset asked for.
        offset: u64,
        /// The queue's first held offset.
        min: u64,
        /// One past the queue's last offset.
        max: u64,
    },
}

/// Not now, or not here: the caller retries later or on another node.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unavailable {
    /// The group could not commit the proposal (no quorum, a membership change in progress…).
    #[error("the group cannot commit now: {reason}")]
    CannotCommit {
        /// The member's explanation.
        reason: String,
    },
    /// CheckQuorum: this leader heard from no majority for an election timeout; nothing proposed.
    #[error(
        "this leader has heard from no majority of its group for an election timeout; it cannot \
         commit and a new leader is being elected"
    )]
    CutOff,
    /// The leader was cut off while a send awaited commit: its outcome is unknown.
    #[error(
        "this leader lost contact with its group while the send awaited commit; it may or may not \
         be stored: retry with the same producer id and sequence"
    )]
    CutOffAwaitingCommit,
    /// The node stopped leading while a send awaited commit: its outcome is unknown.
    #[error(
        "this node stopped leading while the send awaited commit; it may or may not be stored: \
         retry with the same producer id and sequence"
    )]
    SteppedDownAwaitingCommit,
    /// Backpressure: `inflight_sends_max` sends already await commit (code BUSY).
    #[error("too many sends are waiting for commit on this leader; retry shortly")]
    Busy,
    /// The data disk is above the full watermark (code DISK_FULL).
    #[error(
        "the leader's data disk is above {watermark_pct}% full; sends resume once retention frees \
         space"
    )]
    DiskFull {
        /// The configured `full_watermark_pct`.
        watermark_pct: u8,
    },
    /// A rolling upgrade is not finished: a member's build cannot apply this command yet.
    #[error(
        "node {node} of this group runs a build that applies command tags 0..{member_tags} only, \
         and this request needs tag {tag}: finish upgrading every member first"
    )]
    MemberBehind {
        node: u64,
        member_tags: u32,
        tag: u32,
    },
}

/// Nothing the caller can fix: a defect, or a log entry this node cannot read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Internal {
    /// The state machine's reply did not decode.
    #[error("bad state machine reply: {reason}")]
    BadReply {
        /// The decoder's error.
        reason: String,
    },
    /// The state machine answered a command with a reply that does not fit it.
    #[error("unexpected reply {reply}")]
    UnexpectedReply {
        /// The reply, debug-formatted.
        reply: String,
    },
    /// Reading a log entry failed.
    #[error("reading log entry {index}: {reason}")]
    ReadLog {
        /// The entry's log index.
        index: u64,
        /// The I/O error.
        reason: String,
    },
    /// The consume-queue index points at an entry that is not a send.
    #[error("log entry {index} is not a send")]
    NotASend {
        /// The entry's log index.
        index: u64,
    },
}

fn not_leader_message(leader: &Option<(u64, String)>) -> String {
    match leader {
        Some((id, address)) => {
            format!("this node is not the leader; send to node {id} at {address}")
        }
        None => {
            "this node is not the leader and no leader is known yet (election in progress); retry"
                .into()
        }
    }
}

fn group_phrase(broker: &Option<String>) -> String {
    match broker {
        Some(b) => format!("broker group {b}"),
        None => "this broker group".into(),
    }
}

/// The services' result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether another node, or this one a moment later, may store what this node refused (not
    /// the leader, cannot now, stopped): a `SendMany` then fails as a whole, so its producer
    /// retries every part. A [`Refused`] request gets the same answer anywhere.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            Error::NotLeader { .. } | Error::Unavailable(_) | Error::Stopped { .. }
        )
    }

    /// Shorthand for [`Refused::InvalidArgument`].
    pub fn invalid(reason: impl Into<String>) -> Self {
        Refused::InvalidArgument {
            reason: reason.into(),
        }
        .into()
    }

    /// The error a state-machine reply stands for, or `None` for a reply that reports success.
    pub fn from_reply(reply: &Reply) -> Option<Self> {
        Some(match reply {
            Reply::TopicNotFound(topic) => Refused::TopicNotFound {
                topic: topic.clone(),
                broker: None,
            }
            .into(),
            Reply::Invalid(reason) => Error::invalid(reason.clone()),
            Reply::TopicExists { queues } => Refused::TopicExists { queues: *queues }.into(),
            Reply::InvalidHandle(reason) => Refused::InvalidReceiptHandle {
                reason: reason.clone(),
            }
            .into(),
            Reply::GroupNotFound(group) => Refused::GroupNotFound {
                group: group.clone(),
            }
            .into(),
            Reply::GroupExists(group) => Refused::GroupExists {
                group: group.clone(),
            }
            .into(),
            Reply::NotScheduled(reason) => Error::invalid(reason.clone()),
            Reply::Ok
            | Reply::Sent { .. }
            | Reply::Scheduled { .. }
            | Reply::Popped { .. }
            | Reply::Acked(_)
            | Reply::Changed { .. }
            | Reply::SentBefore(_)
            | Reply::SentMany(_) => return None,
        })
    }

    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::NotLeader { .. } => ErrorCode::NotLeader,
            Error::Refused(r) => match r {
                Refused::InvalidArgument { .. }
                | Refused::EmptySend
                | Refused::QueueCount { .. }
                | Refused::QueueOutOfRange { .. }
                | Refused::ConsumerIdLength
                | Refused::LearnerIncomplete => ErrorCode::InvalidArgument,
                Refused::TooManyMessages { .. }
                | Refused::BodyTooLarge { .. }
                | Refused::PropertiesTooLarge { .. }
                | Refused::BatchTooLarge { .. } => ErrorCode::MessageTooLarge,
                Refused::TopicNotFound { .. } | Refused::TopicDeleted { .. } => {
                    ErrorCode::TopicNotFound
                }
                Refused::TopicExists { .. } => ErrorCode::TopicExists,
                Refused::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
                Refused::InvalidReceiptHandle { .. } => ErrorCode::InvalidReceiptHandle,
                Refused::GroupNotFound { .. } => ErrorCode::GroupNotFound,
                Refused::GroupExists { .. } => ErrorCode::GroupExists,
                Refused::IllegalDeliveryTime { .. } => ErrorCode::IllegalDeliveryTime,
                Refused::NotScheduled { .. } => ErrorCode::NotScheduled,
                Refused::TransactionNotOpen { .. } => ErrorCode::TransactionNotOpen,
                Refused::Unauthenticated { .. } => ErrorCode::Unauthenticated,
                Refused::Forbidden { .. } => ErrorCode::Forbidden,
            },
            Error::Unavailable(u) => match u {
                Unavailable::Busy => ErrorCode::Busy,
                Unavailable::DiskFull { .. } => ErrorCode::DiskFull,
                Unavailable::CannotCommit { .. }
                | Unavailable::MemberBehind { .. }
                | Unavailable::CutOff
                | Unavailable::CutOffAwaitingCommit
                | Unavailable::SteppedDownAwaitingCommit => ErrorCode::Unavailable,
            },
            Error::Stopped { .. } => ErrorCode::Unavailable,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The error as carried in a reply's `error` field: code, message and, for NOT_LEADER, the
    /// leader to turn to. The one mapping to the wire.
    pub fn to_proto(&self) -> v1::Error {
        let mut err = v1::Error::new(self.code(), self.to_string());
        if let Error::NotLeader {
            leader: Some((node_id, address)),
        } = self
        {
            err.leader = Some(NodeRef {
                node_id: *node_id,
                address: address.clone(),
            });
        }
        err
    }
}

impl From<Error> for v1::Error {
    fn from(err: Error) -> Self {
        err.to_proto()
    }
}

/// A reply's `error` field for a handler's outcome: `None` on success.
pub fn reply_field(outcome: Result<()>) -> Option<v1::Error> {
    outcome.err().map(v1::Error::from)
}

impl From<ProposeError> for Error {
    fn from(err: ProposeError) -> Self {
        match err {
            ProposeError::NotLeader { leader } => Error::NotLeader { leader },
            ProposeError::Unavailable(reason) => Unavailable::CannotCommit { reason }.into(),
            ProposeError::Invalid(reason) => Error::invalid(reason),
            ProposeError::Fatal(reason) => Error::Stopped { reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(err: impl Into<Error>) -> (ErrorCode, String, Option<NodeRef>) {
        let e = err.into().to_proto();
        (e.code(), e.message, e.leader)
    }

    /// 1. NOT_LEADER carries the leader in the hint and names it in the message.
    #[test]
    fn t1_not_leader_with_a_known_leader_carries_the_hint() {
        let (code, msg, leader) = wire(Error::NotLeader {
            leader: Some((3, "n3:9876".into())),
        });
        assert_eq!(code, ErrorCode::NotLeader);
        assert_eq!(
            msg,
            "this node is not the leader; send to node 3 at n3:9876"
        );
        assert_eq!(
            leader,
            Some(NodeRef {
                node_id: 3,
                address: "n3:9876".into()
            })
        );
    }

    /// 2. During an election NOT_LEADER has no hint and says to retry.
    #[test]
    fn t2_not_leader_during_an_election_has_no_hint() {
        let (code, msg, leader) = wire(Error::NotLeader { leader: None });
        assert_eq!(code, ErrorCode::NotLeader);
        assert_eq!(
            msg,
            "this node is not the leader and no leader is known yet (election in progress); retry"
        );
        assert_eq!(leader, None);
    }

    /// 3. The member's proposal errors keep their codes and texts.
    #[test]
    fn t3_propose_errors_map_to_their_codes() {
        let cases = [
            (
                ProposeError::NotLeader {
                    leader: Some((2, "a:1".into())),
                },
                ErrorCode::NotLeader,
                "this node is not the leader; send to node 2 at a:1",
            ),
            (
                ProposeError::Unavailable("no quorum".into()),
                ErrorCode::Unavailable,
                "the group cannot commit now: no quorum",
            ),
            (
                ProposeError::Invalid("voters must not be empty".into()),
                ErrorCode::InvalidArgument,
                "voters must not be empty",
            ),
            (
                ProposeError::Fatal("storage failed".into()),
                ErrorCode::Unavailable,
                "this node stopped: storage failed",
            ),
        ];
        for (pe, code, msg) in cases {
            assert_eq!(
                wire(Error::from(pe)),
                (code, msg.to_string(), wire_leader(code))
            );
        }
    }

    fn wire_leader(code: ErrorCode) -> Option<NodeRef> {
        (code == ErrorCode::NotLeader).then(|| NodeRef {
            node_id: 2,
            address: "a:1".into(),
        })
    }

    /// 4. State-machine replies: errors keep their texts, successes are no error.
    #[test]
    fn t4_replies_map_to_errors_or_none() {
        let e = |r: Reply| Error::from_reply(&r).map(|e| (e.code(), e.to_string()));
        assert_eq!(
            e(Reply::TopicNotFound("t".into())),
            Some((
                ErrorCode::TopicNotFound,
                "topic \"t\" does not exist on this broker group".into()
            ))
        );
        assert_eq!(
            e(Reply::TopicExists { queues: 4 }),
            Some((
                ErrorCode::TopicExists,
                "topic exists with 4 queues; pass update to change the count".into()
            ))
        );
        assert_eq!(
            e(Reply::Invalid("bad".into())),
            Some((ErrorCode::InvalidArgument, "bad".into()))
        );
        assert_eq!(e(Reply::Ok), None);
    }

    /// 5. Codes of the refusals, unavailabilities and internal errors, with a few pinned texts.
    #[test]
    fn t5_each_group_has_its_codes() {
        assert_eq!(
            wire(Refused::TopicNotFound {
                topic: "t".into(),
                broker: Some("broker-a".into())
            })
            .1,
            "topic \"t\" does not exist on broker group broker-a"
        );
        assert_eq!(
            wire(Refused::OffsetOutOfRange {
                offset: 9,
                min: 0,
                max: 5
            }),
            (
                ErrorCode::OffsetOutOfRange,
                "offset 9 is outside the queue's range [0, 5]".into(),
                None
            )
        );
        assert_eq!(wire(Unavailable::Busy).0, ErrorCode::Busy);
        assert_eq!(
            wire(Unavailable::DiskFull { watermark_pct: 90 }),
            (
                ErrorCode::DiskFull,
                "the leader's data disk is above 90% full; sends resume once retention frees space"
                    .into(),
                None
            )
        );
        assert_eq!(wire(Unavailable::CutOff).0, ErrorCode::Unavailable);
        assert_eq!(wire(Internal::NotASend { index: 7 }).0, ErrorCode::Internal);
        assert_eq!(
            wire(Refused::BodyTooLarge {
                index: 1,
                bytes: 11,
                max: 10
            })
            .0,
            ErrorCode::MessageTooLarge
        );
    }
}
