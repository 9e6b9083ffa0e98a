//! The crate's one error type and its one mapping to the RocketMQ 5 wire (`Status{code, message}`).
//!
//! Business errors travel in each v2 response's `status`; gRPC statuses are kept for framework
//! failures (a Telemetry `Settings` without publishing or subscription). Every raftmq v1 error
//! code has one v2 code, in [`code_of_v1`]; the table is tested below.
//!
//! Codes the Rust client 5.0.0 does not know (40019-40021, 40404, 41302, 42901, 42902) are never
//! produced: that client unwraps the code's conversion and panics on an unknown one.

use raftmq_proto::v1::{self, ErrorCode};

use crate::pb::{self, Code};

/// Everything a v2 request can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The broker (this node or another) answered the v1 request with an error.
    #[error("{0}")]
    Broker(v1::Error),
    /// A v1 call to another node failed in transport (connection refused, deadline, reset).
    #[error("call to {address} failed: {}", .status.message())]
    Rpc {
        /// The node called.
        address: String,
        /// What tonic reported.
        status: tonic::Status,
    },
    /// This node's own broker service failed with a gRPC status (not a reply error).
    #[error("the local broker failed: {}", .0.message())]
    Local(tonic::Status),
    /// No broker group hosts the topic.
    #[error("topic {topic:?} not found: no broker group hosts it")]
    TopicNotFound {
        /// The topic asked for.
        topic: String,
    },
    /// No nameserver could be asked (every one failed in transport).
    #[error("no nameserver answered the route of {topic:?}: {reason}")]
    NoNameserver {
        /// The topic asked for.
        topic: String,
        /// The last failure.
        reason: String,
    },
    /// The request is refused before any broker is asked, with the v2 code that says why.
    #[error("{message}")]
    Refused {
        /// The v2 code (BAD_REQUEST, MESSAGE_BODY_TOO_LARGE, ILLEGAL_FILTER_EXPRESSION, ...).
        code: Code,
        /// What is wrong, in words a person can act on.
        message: String,
    },
}

impl Error {
    /// A request refused with `code`.
    pub fn refused(code: Code, message: impl Into<String>) -> Self {
        Error::Refused {
            code,
            message: message.into(),
        }
    }

    /// A BAD_REQUEST refusal.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Error::refused(Code::BadRequest, message)
    }

    /// The v2 code of this error.
    pub fn code(&self) -> Code {
        match self {
            Error::Broker(e) => code_of_v1(e.code),
            Error::Rpc { status, .. } | Error::Local(status) => code_of_transport(status.code()),
            Error::TopicNotFound { .. } => Code::TopicNotFound,
            Error::NoNameserver { .. } => Code::ProxyTimeout,
            Error::Refused { code, .. } => *code,
        }
    }

    /// The payload status of this error.
    pub fn status(&self) -> pb::Status {
        status(self.code(), self.to_string())
    }
}

/// A payload status.
pub fn status(code: Code, message: impl Into<String>) -> pb::Status {
    pb::Status {
        code: code as i32,
        message: message.into(),
    }
}

/// The OK status (code 20000).
pub fn ok() -> pb::Status {
    status(Code::Ok, "OK")
}

/// The v2 code of a raftmq v1 error code (its number, as carried in `Error.code`).
///
/// Transient failures that pass on retry (no leader yet, no quorum) are PROXY_TIMEOUT (50400): the
/// front already retried them for about three seconds before giving up. Failures that do not pass
/// soon (disk full, an internal defect) are INTERNAL_SERVER_ERROR (50001). An unknown (newer) code
/// is INTERNAL_SERVER_ERROR too.
pub fn code_of_v1(code: i32) -> Code {
    let Ok(code) = ErrorCode::try_from(code) else {
        return Code::InternalServerError;
    };
    match code {
        ErrorCode::Ok => Code::Ok,
        ErrorCode::NotLeader | ErrorCode::Unavailable => Code::ProxyTimeout,
        ErrorCode::TopicNotFound => Code::TopicNotFound,
        ErrorCode::InvalidArgument => Code::BadRequest,
        ErrorCode::MessageTooLarge => Code::MessageBodyTooLarge,
        // ILLEGAL_OFFSET (40019) is unknown to the Rust client 5.0.0.
        ErrorCode::OffsetOutOfRange => Code::BadRequest,
        ErrorCode::Busy => Code::TooManyRequests,
        ErrorCode::DiskFull | ErrorCode::Internal => Code::InternalServerError,
        ErrorCode::Unauthenticated => Code::Unauthorized,
        ErrorCode::TopicExists | ErrorCode::GroupExists => Code::BadRequest,
        ErrorCode::GroupNotFound => Code::ConsumerGroupNotFound,
        ErrorCode::InvalidReceiptHandle => Code::InvalidReceiptHandle,
        ErrorCode::IllegalDeliveryTime => Code::IllegalDeliveryTime,
        ErrorCode::NotScheduled => Code::BadRequest,
        ErrorCode::TransactionNotOpen => Code::InvalidTransactionId,
        ErrorCode::Forbidden => Code::Forbidden,
    }
}

/// The v2 code of a failed gRPC call to a broker node: a node that is down or slow is transient.
fn code_of_transport(code: tonic::Code) -> Code {
    match code {
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            Code::ProxyTimeout
        }
        tonic::Code::InvalidArgument => Code::BadRequest,
        tonic::Code::ResourceExhausted => Code::TooManyRequests,
        tonic::Code::Unauthenticated => Code::Unauthorized,
        tonic::Code::PermissionDenied => Code::Forbidden,
        _ => Code::InternalServerError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes the Rust client 5.0.0 panics on.
    const UNKNOWN_TO_RUST_5_0_0: [i32; 7] = [40019, 40020, 40021, 40404, 41302, 42901, 42902];

    #[test]
    fn t1_every_v1_code_maps_to_its_v2_code() {
        let table = [
            (ErrorCode::Ok, Code::Ok),
            (ErrorCode::NotLeader, Code::ProxyTimeout),
            (ErrorCode::TopicNotFound, Code::TopicNotFound),
            (ErrorCode::InvalidArgument, Code::BadRequest),
            (ErrorCode::MessageTooLarge, Code::MessageBodyTooLarge),
            (ErrorCode::OffsetOutOfRange, Code::BadRequest),
            (ErrorCode::Busy, Code::TooManyRequests),
            (ErrorCode::DiskFull, Code::InternalServerError),
            (ErrorCode::Unavailable, Code::ProxyTimeout),
            (ErrorCode::Unauthenticated, Code::Unauthorized),
            (ErrorCode::Internal, Code::InternalServerError),
            (ErrorCode::TopicExists, Code::BadRequest),
            (ErrorCode::GroupNotFound, Code::ConsumerGroupNotFound),
            (ErrorCode::InvalidReceiptHandle, Code::InvalidReceiptHandle),
            (ErrorCode::GroupExists, Code::BadRequest),
            (ErrorCode::IllegalDeliveryTime, Code::IllegalDeliveryTime),
            (ErrorCode::NotScheduled, Code::BadRequest),
            (ErrorCode::TransactionNotOpen, Code::InvalidTransactionId),
            (ErrorCode::Forbidden, Code::Forbidden),
        ];
        for (v1, v2) in table {
            assert_eq!(code_of_v1(v1 as i32), v2, "{}", v1.as_str_name());
        }
        // Every v1 code is in the table (codes are dense from 0).
        let mut n = 0;
        while ErrorCode::try_from(n).is_ok() {
            n += 1;
        }
        assert_eq!(
            n as usize,
            table.len(),
            "a v1 code is missing from the table"
        );
        assert_eq!(code_of_v1(9999), Code::InternalServerError);
    }

    #[test]
    fn t2_numbers_and_codes_the_rust_client_knows() {
        assert_eq!(Code::Ok as i32, 20000);
        assert_eq!(Code::TopicNotFound as i32, 40402);
        assert_eq!(Code::MessageBodyTooLarge as i32, 41301);
        assert_eq!(Code::InvalidReceiptHandle as i32, 40013);
        assert_eq!(Code::ConsumerGroupNotFound as i32, 40403);
        assert_eq!(Code::TooManyRequests as i32, 42900);
        assert_eq!(Code::ProxyTimeout as i32, 50400);
        for n in 0..16 {
            let code = code_of_v1(n) as i32;
            assert!(!UNKNOWN_TO_RUST_5_0_0.contains(&code), "{n} -> {code}");
        }
        for c in [
            tonic::Code::Unavailable,
            tonic::Code::Internal,
            tonic::Code::InvalidArgument,
            tonic::Code::ResourceExhausted,
        ] {
            assert!(!UNKNOWN_TO_RUST_5_0_0.contains(&(code_of_transport(c) as i32)));
        }
    }

    #[test]
    fn t3_errors_carry_their_code_and_message() {
        let e = Error::Broker(v1::Error::new(ErrorCode::Busy, "too many sends in flight"));
        let s = e.status();
        assert_eq!(s.code, 42900);
        assert!(
            s.message.contains("too many sends in flight"),
            "{}",
            s.message
        );
        let e = Error::Rpc {
            address: "10.0.0.2:10911".into(),
            status: tonic::Status::unavailable("connection refused"),
        };
        assert_eq!(e.code(), Code::ProxyTimeout);
        assert_eq!(
            e.to_string(),
            "call to 10.0.0.2:10911 failed: connection refused"
        );
        let e = Error::TopicNotFound { topic: "T".into() };
        assert_eq!(e.status().code, 40402);
    }
}
