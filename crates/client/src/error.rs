//! The one error type of the client library.
//!
//! Callers react to three families differently: a server's verdict on the request
//! ([`Error::Server`], e.g. `TOPIC_NOT_FOUND`, which retrying will not change), a deadline that
//! passed while the client kept retrying retriable failures ([`Error::Timeout`]), and local misuse
//! ([`Error::InvalidArgument`], [`Error::Closed`]).

use std::time::Duration;

use raftmq_proto::v1::{self, ErrorCode};

/// Everything that can go wrong in the client library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller passed something the client refuses before sending it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An address could not be turned into a gRPC endpoint. `reason` is the transport error with
    /// its causes, as text and not a `source()`, so a chain printer shows it once.
    #[error("invalid address {address:?}: {reason}")]
    InvalidAddress { address: String, reason: String },

    /// TLS could not be set up for a connection to `address` (the client's TLS material was
    /// refused). `reason` is the error with its causes, as text.
    #[error("TLS setup for {address:?} failed: {reason}")]
    Tls { address: String, reason: String },

    /// No nameserver answered; `last` is the last failure seen.
    #[error("no nameserver answered (tried {addresses}): {last}")]
    NameserverUnavailable { addresses: String, last: String },

    /// The nameservers know no route for the topic.
    #[error("topic {topic:?} not found on any nameserver")]
    TopicNotFound { topic: String },

    /// No broker group holds this consumer group.
    #[error("consumer group {group:?} not found on any broker group")]
    GroupNotFound { group: String },

    /// The nameserver view does not contain this broker group.
    #[error("broker group {broker:?} is not known to the nameservers")]
    UnknownBroker { broker: String },

    /// A gRPC call failed at the transport or gRPC level (connection refused, reset, timeout). The
    /// status is part of the message and not a `source()`, so a chain printer shows it once.
    #[error("{rpc} to {address} failed: {status}")]
    Rpc {
        address: String,
        rpc: &'static str,
        status: Box<tonic::Status>,
    },

    /// A node answered with an error code in its reply.
    #[error("{rpc} to {address}: {code}: {message}", code = code.as_str_name())]
    Server {
        address: String,
        rpc: &'static str,
        code: ErrorCode,
        message: String,
        leader: Option<v1::NodeRef>,
    },

    /// Retriable failures went on until the operation's deadline passed.
    #[error("{op} gave up after {waited:?}: {last}")]
    Timeout {
        op: String,
        waited: Duration,
        last: String,
    },

    /// The producer or consumer was closed while the operation waited.
    #[error("the client was closed")]
    Closed,
}

/// Short for `std::result::Result<T, raftmq_client::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The server's error code, when a node answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { code, .. } => Some(*code),
            Error::TopicNotFound { .. } => Some(ErrorCode::TopicNotFound),
            Error::GroupNotFound { .. } => Some(ErrorCode::GroupNotFound),
            _ => None,
        }
    }

    /// A copy for the other messages of a failed batch (transport errors are not `Clone`).
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::InvalidArgument(m) => Error::InvalidArgument(m.clone()),
            Error::InvalidAddress { address, reason } => Error::InvalidAddress {
                address: address.clone(),
                reason: reason.clone(),
            },
            Error::Tls { address, reason } => Error::Tls {
                address: address.clone(),
                reason: reason.clone(),
            },
            Error::NameserverUnavailable { addresses, last } => Error::NameserverUnavailable {
                addresses: addresses.clone(),
                last: last.clone(),
            },
            Error::TopicNotFound { topic } => Error::TopicNotFound {
                topic: topic.clone(),
            },
            Error::GroupNotFound { group } => Error::GroupNotFound {
                group: group.clone(),
            },
            Error::UnknownBroker { broker } => Error::UnknownBroker {
                broker: broker.clone(),
            },
            Error::Rpc {
                address,
                rpc,
                status,
            } => Error::Rpc {
                address: address.clone(),
                rpc,
                status: status.clone(),
            },
            Error::Server {
                address,
                rpc,
                code,
                message,
                leader,
            } => Error::Server {
                address: address.clone(),
                rpc,
                code: *code,
                message: message.clone(),
                leader: leader.clone(),
            },
            Error::Timeout { op, waited, last } => Error::Timeout {
                op: op.clone(),
                waited: *waited,
                last: last.clone(),
            },
            Error::Closed => Error::Closed,
        }
    }

    /// True for failures that a later attempt may not see: transport errors, no leader, no quorum,
    /// backpressure. Used by the retry loops; a [`Error::Timeout`] is final.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Rpc { .. } | Error::NameserverUnavailable { .. } => true,
            Error::Server { code, .. } => is_retriable_code(*code),
            _ => false,
        }
    }
}

/// Codes worth retrying (after following the leader hint or backing off).
pub(crate) fn is_retriable_code(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NotLeader | ErrorCode::Unavailable | ErrorCode::Busy
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_stays_small() {
        // Large error types make every `Result` in the crate expensive to move around.
        assert!(
            std::mem::size_of::<Error>() <= 128,
            "{}",
            std::mem::size_of::<Error>()
        );
    }

    #[test]
    fn server_error_display_names_the_code() {
        let e = Error::Server {
            address: "127.0.0.1:1".into(),
            rpc: "Send",
            code: ErrorCode::TopicNotFound,
            message: "no topic t".into(),
            leader: None,
        };
        assert_eq!(
            e.to_string(),
            "Send to 127.0.0.1:1: TOPIC_NOT_FOUND: no topic t"
        );
        assert!(!e.is_retriable());
    }
}
