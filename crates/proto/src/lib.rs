//! Generated code for raftmq's gRPC contract (`proto/raftmq/v1/*.proto`), plus small helpers.
//!
//! - [`v1`]: messages and the client/server stubs of `BrokerService`, `AdminService`,
//!   `NameserverService` and `RaftPeerService`.
//! - [`codec`]: the prost codec the stubs use, which sizes its encode buffer up front.
//! - [`eager_end`]: a client channel whose unary requests go out without a trailing empty frame.
//! - [`limits`]: the contract's limits (name rule, queue cap, message limits) and how they relate.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for gRPC reflection.

pub mod codec;
pub mod eager_end;
pub mod limits;
#[cfg(feature = "testing")]
pub mod testing;

/// Package `raftmq.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("raftmq.v1");
}

/// The message property holding a scheduled message's delivery time, in ms since the epoch
/// (decimal). Only a topic of type DELAY takes it; the message is stored at once and readable from
/// that time on.
pub const DELIVER_AT_PROPERTY: &str = "__rmq.deliver_at";

/// The message property holding a message's message group (FIFO topics): every message sent to a
/// FIFO topic carries one; messages of one group go to one queue, in order.
pub const MESSAGE_GROUP_PROPERTY: &str = "__rmq.mgroup";

/// The parts of a raftmq message id, `{broker}-{log_index:016X}-{position:04X}`: the broker
/// group (which may itself hold dashes), the log index of its entry, and its position there.
pub fn split_msg_id(id: &str) -> Option<(&str, u64, u32)> {
    let mut parts = id.rsplitn(3, '-');
    let (position, index, broker) = (parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if broker.is_empty() || !hex(index, 16) || !hex(position, 4) {
        return None;
    }
    Some((
        broker,
        u64::from_str_radix(index, 16).ok()?,
        u32::from_str_radix(position, 16).ok()?,
    ))
}

/// Encoded `FileDescriptorSet` of every raftmq proto file, served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("raftmq_descriptor");

impl v1::Error {
    /// An error with a code and a message a person can act on.
    pub fn new(code: v1::ErrorCode, message: impl Into<String>) -> Self {
        v1::Error {
            code: code as i32,
            message: message.into(),
            leader: None,
        }
    }
}

impl std::fmt::Display for v1::Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code().as_str_name(), self.message)?;
        if let Some(l) = &self.leader {
            write!(f, " (leader: node {} at {})", l.node_id, l.address)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn message_ids_split_into_broker_index_and_position() {
        assert_eq!(
            super::split_msg_id("broker-a-00000000000000FF-0002"),
            Some(("broker-a", 255, 2))
        );
        assert_eq!(super::split_msg_id("broker-a-FF-0002"), None);
        assert_eq!(super::split_msg_id("00000000000000FF-0002"), None);
        assert_eq!(super::split_msg_id("-00000000000000FF-0002"), None);
        assert_eq!(
            super::split_msg_id("C0A8000100002A9F0000000000000001"),
            None
        );
    }
}
