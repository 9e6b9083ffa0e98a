//! Generated code for raftmq's gRPC contract (`proto/raftmq/v1/*.proto`), plus small helpers.
//!
//! - [`v1`]: messages and the client/server stubs of `BrokerService`, `AdminService`,
//!   `NameserverService` and `RaftPeerService`.
//! - [`codec`]: the prost codec the stubs use, which sizes its encode buffer up front.
//! - [`limits`]: the contract's limits (name rule, queue cap, message limits) and how they relate.
//! - [`FILE_DESCRIPTOR_SET`]: the encoded descriptors, for gRPC reflection.

pub mod codec;
pub mod limits;

/// Package `raftmq.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("raftmq.v1");
}

/// The message property holding a scheduled message's delivery time, in ms since the epoch
/// (decimal). Only a topic of type DELAY takes it; the message is stored at once and readable from
/// that time on.
pub const DELIVER_AT_PROPERTY: &str = "__rmq.deliver_at";

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
