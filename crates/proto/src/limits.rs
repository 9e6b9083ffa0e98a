//! The limits of the contract, in one place: the name rule, the queue cap and the message limits.
//!
//! Every program checks against these (the nameserver's registry, the broker's config defaults
//! and its send checks, the client before it sends). A broker's `[limits]` may set the message
//! limits lower or higher; it publishes what it enforces in its registration (`SendLimits`), and
//! a client uses that for the group it sends to, and these defaults while it does not know.
//!
//! How the limits relate is checked at compile time below, so changing one without the others
//! fails the build rather than a send.

use std::fmt;

use crate::v1;

/// Longest topic, consumer group, cluster or broker name, in bytes (names are ASCII).
pub const NAME_LEN_MAX: usize = 127;

/// Most queues a topic may have on one broker group.
pub const QUEUES_PER_TOPIC_MAX: u32 = 1_024;

/// Set on every sequence of a producer lane that has at most one batch in flight (the raftmq
/// client's lanes): a batch of sequence `s` then tells the broker that every lower sequence of its
/// producer id was answered or given up on, so its window keeps only the newest batch (a retry is
/// always that one) and a lower sequence is refused, not stored. Sequences without it (the
/// RocketMQ front's lanes, with many batches in flight each, and every log written before it)
/// keep a window of recent batches. No producer counting from 1 reaches it.
pub const SINGLE_FLIGHT_SEQUENCE: u64 = 1 << 63;

/// Default largest message body, in bytes.
pub const BODY_BYTES_MAX: usize = 4 << 20;
/// Default largest total of a message's property keys and values, in bytes.
pub const PROPERTIES_BYTES_MAX: usize = 32 << 10;
/// Default most messages in one batch (one `Send`).
pub const BATCH_MESSAGES_MAX: usize = 1_000;
/// Default largest batch, counting each message's body, properties, key and tag, in bytes.
pub const BATCH_BYTES_MAX: usize = 4 << 20;

/// The highest a broker may configure `limits.body_bytes_max` to.
pub const BODY_BYTES_CONFIG_MAX: usize = 64 << 20;

/// Largest gRPC message a client or broker sends or accepts on the public API (tonic's default is
/// 4 MiB, too small for a full batch with its framing, or a pull of large messages).
pub const GRPC_MESSAGE_BYTES_MAX: usize = 64 << 20;

/// Largest payload of one Raft log entry (raft-log's record cap; a `Send` is one entry). The
/// broker checks at compile time that raft-log's own constant is this value.
pub const LOG_PAYLOAD_BYTES_MAX: usize = 64 << 20;

/// An upper bound on the protobuf framing of one message in a `SendRequest` beyond the bytes
/// [`BATCH_BYTES_MAX`] counts: field tags and length prefixes of the message, its key, tag and
/// body (properties are framed within their own allowance, [`PROPERTIES_BYTES_MAX`]).
pub const MESSAGE_FRAMING_BYTES_MAX: usize = 64;
/// The bytes a message counts for against [`BATCH_BYTES_MAX`] (a group's `batch_bytes_max`):
/// body, key, tag, and every property's name and value.
pub fn message_bytes(m: &v1::Message) -> usize {
    m.body.len()
        + m.key.len()
        + m.tag.len()
        + m.properties
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
}

/// What each part of a `SendMany` counts against [`BATCH_BYTES_MAX`] beyond its messages and its
/// topic's name: the part's own framing (its length prefix, queue, producer id and sequence),
/// so a call of many one-message parts still fits in one gRPC message.
pub const SEND_PART_OVERHEAD_BYTES: usize = 40;
/// Room the client leaves in a batch for the request's own fields (topic, producer id, ...) and
/// the framing of properties: it closes a batch at `batch_bytes_max` minus this.
pub const BATCH_HEADROOM_BYTES: usize = 64 << 10;

/// A full default batch, with the framing of every message and the request's headroom.
const FULL_BATCH_WIRE_BYTES: usize =
    BATCH_BYTES_MAX + BATCH_MESSAGES_MAX * MESSAGE_FRAMING_BYTES_MAX + BATCH_HEADROOM_BYTES;

// A message fits in a batch, and a batch has room for more than its headroom.
const _: () = assert!(BODY_BYTES_MAX <= BATCH_BYTES_MAX);
const _: () = assert!(BATCH_HEADROOM_BYTES < BATCH_BYTES_MAX / 2);
const _: () = assert!(PROPERTIES_BYTES_MAX < BATCH_HEADROOM_BYTES);
const _: () = assert!(BATCH_MESSAGES_MAX >= 1);
// A part's framing: tag and length (2 + 5), queue (1 + 5), producer id and sequence (2 x 11),
// the topic's tag and length (1 + 2).
const _: () = assert!(SEND_PART_OVERHEAD_BYTES >= 7 + 6 + 22 + 3);
// The configurable ceiling holds the default.
const _: () = assert!(BODY_BYTES_MAX <= BODY_BYTES_CONFIG_MAX);
// A full batch at the default limits fits in one gRPC message...
const _: () = assert!(FULL_BATCH_WIRE_BYTES <= GRPC_MESSAGE_BYTES_MAX);
// ...and one gRPC message fits in one log entry, so a send the API accepts can be stored.
const _: () = assert!(GRPC_MESSAGE_BYTES_MAX <= LOG_PAYLOAD_BYTES_MAX);
// A body at the configurable ceiling still fits in a gRPC message and a log entry.
const _: () = assert!(BODY_BYTES_CONFIG_MAX <= GRPC_MESSAGE_BYTES_MAX);
// Counts travel as u32 on the wire.
const _: () = assert!(QUEUES_PER_TOPIC_MAX as u64 <= u32::MAX as u64);
const _: () = assert!(NAME_LEN_MAX < 256);

/// Whether a name may hold `c`: the class `[A-Za-z0-9_%|-]`.
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '%' | '|' | '-')
}

/// What is wrong with a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameProblem {
    /// The name is empty.
    Empty,
    /// The name is longer than [`NAME_LEN_MAX`] bytes.
    TooLong { len: usize },
    /// The name holds a character outside `[A-Za-z0-9_%|-]`.
    BadChar { name: String, c: char },
}

impl NameProblem {
    /// The reason, without the subject: "is empty; ...".
    pub fn reason(&self) -> String {
        match self {
            NameProblem::Empty => {
                format!("is empty; a name is 1 to {NAME_LEN_MAX} of A-Z a-z 0-9 _ % | -")
            }
            NameProblem::TooLong { len } => {
                format!("is {len} characters long; at most {NAME_LEN_MAX} allowed")
            }
            NameProblem::BadChar { name, c } => {
                format!("{name:?} has the character {c:?}; allowed are A-Z a-z 0-9 _ % | -")
            }
        }
    }
}

/// A name that breaks the rule `^[A-Za-z0-9_%|-]{1,127}$`, with what kind of name it is
/// (`topic`, `group`, `cluster`, `broker`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameError {
    pub kind: String,
    pub problem: NameProblem,
}

impl fmt::Display for NameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} name {}", self.kind, self.problem.reason())
    }
}

impl std::error::Error for NameError {}

/// Checks a topic, consumer group, cluster or broker name against `^[A-Za-z0-9_%|-]{1,127}$`.
/// `kind` names the subject in the error ("topic name \"a.b\" has the character '.'; ...").
pub fn check_name(kind: &str, name: &str) -> Result<(), NameError> {
    let problem = if name.is_empty() {
        NameProblem::Empty
    } else if name.len() > NAME_LEN_MAX {
        NameProblem::TooLong { len: name.len() }
    } else if let Some(c) = name.chars().find(|&c| !is_name_char(c)) {
        NameProblem::BadChar {
            name: name.to_owned(),
            c,
        }
    } else {
        return Ok(());
    };
    Err(NameError {
        kind: kind.to_owned(),
        problem,
    })
}

/// The send limits of one broker group, as it enforces them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendLimits {
    pub body_bytes_max: usize,
    pub properties_bytes_max: usize,
    pub batch_messages_max: usize,
    pub batch_bytes_max: usize,
}

impl SendLimits {
    /// The contract's defaults: what a broker enforces unless configured otherwise.
    pub const DEFAULT: SendLimits = SendLimits {
        body_bytes_max: BODY_BYTES_MAX,
        properties_bytes_max: PROPERTIES_BYTES_MAX,
        batch_messages_max: BATCH_MESSAGES_MAX,
        batch_bytes_max: BATCH_BYTES_MAX,
    };

    /// What a broker reported; a field it left at 0 (unknown) takes the default.
    pub fn from_wire(w: &v1::SendLimits) -> SendLimits {
        fn or(v: u64, default: usize) -> usize {
            match v {
                0 => default,
                v => usize::try_from(v).unwrap_or(usize::MAX),
            }
        }
        let d = SendLimits::DEFAULT;
        SendLimits {
            body_bytes_max: or(w.body_bytes_max, d.body_bytes_max),
            properties_bytes_max: or(w.properties_bytes_max, d.properties_bytes_max),
            batch_messages_max: or(w.batch_messages_max, d.batch_messages_max),
            batch_bytes_max: or(w.batch_bytes_max, d.batch_bytes_max),
        }
    }

    /// The wire form a broker publishes.
    pub fn to_wire(self) -> v1::SendLimits {
        v1::SendLimits {
            body_bytes_max: self.body_bytes_max as u64,
            properties_bytes_max: self.properties_bytes_max as u64,
            batch_messages_max: self.batch_messages_max as u64,
            batch_bytes_max: self.batch_bytes_max as u64,
        }
    }
}

impl Default for SendLimits {
    fn default() -> Self {
        SendLimits::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1. Names of 1 to 127 characters of the class pass; the boundaries are exact.
    #[test]
    fn t1_names_within_the_rule_pass() {
        for ok in [
            "a",
            "orders_2024-%|x",
            "Orders_v2|%-x",
            &"a".repeat(NAME_LEN_MAX),
        ] {
            assert_eq!(check_name("topic", ok), Ok(()), "{ok}");
        }
    }

    /// 2. Empty, too long, and each kind of bad character are refused, saying why.
    #[test]
    fn t2_names_outside_the_rule_fail_with_the_reason() {
        let e = check_name("topic", "").unwrap_err();
        assert_eq!(e.problem, NameProblem::Empty);
        let e = check_name("group", &"a".repeat(NAME_LEN_MAX + 1)).unwrap_err();
        assert_eq!(e.problem, NameProblem::TooLong { len: 128 });
        assert!(
            e.to_string()
                .starts_with("group name is 128 characters long")
        );
        for bad in ["a.b", "has space", "x/y", "é", "a\n"] {
            assert!(check_name("topic", bad).is_err(), "{bad:?}");
        }
        let e = check_name("topic", "a.b").unwrap_err();
        assert!(e.to_string().contains("'.'"), "{e}");
        assert!(e.to_string().starts_with("topic name \"a.b\""), "{e}");
    }

    /// 3. A broker's report with unknown (0) fields falls back to the defaults field by field.
    #[test]
    fn t3_limits_from_the_wire_default_per_field() {
        let w = v1::SendLimits {
            body_bytes_max: 1024,
            ..Default::default()
        };
        let l = SendLimits::from_wire(&w);
        assert_eq!(l.body_bytes_max, 1024);
        assert_eq!(l.batch_bytes_max, BATCH_BYTES_MAX);
        assert_eq!(
            SendLimits::from_wire(&SendLimits::DEFAULT.to_wire()),
            SendLimits::DEFAULT
        );
        assert_eq!(
            SendLimits::from_wire(&v1::SendLimits::default()),
            SendLimits::DEFAULT
        );
    }
}
