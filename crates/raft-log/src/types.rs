//! The openraft type configuration of a raftmq broker group. Every openraft type stays inside this
//! crate; the broker sees only byte payloads, log indexes and plain metrics.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// An opaque command or reply of the application state machine (the broker's encoding).
///
/// Decoded by [`crate::encoding::decode_shared`], a payload is a slice of the buffer it was decoded
/// from (no copy); decoded any other way, a copy. The encoding is `Bytes`'s either way.
#[derive(Clone, Default, PartialEq, Eq, Serialize)]
pub struct Payload(pub Bytes);

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Newtype;
        impl<'de> serde::de::Visitor<'de> for Newtype {
            type Value = Payload;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a payload")
            }
            fn visit_newtype_struct<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Payload, D::Error> {
                d.deserialize_bytes(crate::encoding::SharedBytes)
                    .map(Payload)
            }
        }
        d.deserialize_newtype_struct("Payload", Newtype)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

impl fmt::Display for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

openraft::declare_raft_types!(
    /// raftmq's openraft type configuration.
    pub TypeConfig:
        D = Payload,
        R = Payload,
        NodeId = u64,
        Node = openraft::BasicNode,
);

pub type NodeId = u64;
pub type LogId = openraft::LogId<openraft::impls::leader_id_adv::LeaderId<u64, u64>>;
pub type Entry = <TypeConfig as openraft::RaftTypeConfig>::Entry;
pub type EntryPayload = openraft::EntryPayload<Payload, u64, openraft::BasicNode>;
pub type Vote = <TypeConfig as openraft::RaftTypeConfig>::Vote;
pub type SnapshotMeta = openraft::storage::SnapshotMeta<
    openraft::impls::leader_id_adv::LeaderId<u64, u64>,
    u64,
    openraft::BasicNode,
>;
pub type StoredMembership = openraft::StoredMembership<
    openraft::impls::leader_id_adv::LeaderId<u64, u64>,
    u64,
    openraft::BasicNode,
>;
pub type Raft<SM> = openraft::Raft<TypeConfig, SM>;

/// Builds a log id from its parts.
pub fn log_id(term: u64, node_id: u64, index: u64) -> LogId {
    openraft::LogId::new(
        openraft::impls::leader_id_adv::LeaderId { term, node_id },
        index,
    )
}
