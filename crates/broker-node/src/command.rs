//! The commands a broker group replicates through its Raft log, and the replies the state machine
//! gives back. Encoded with postcard; a message body is stored once, inside the `Send` entry.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBody {
    pub key: String,
    pub tag: String,
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    pub properties: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    CreateTopic {
        name: String,
        queues: u32,
        update: bool,
    },
    DeleteTopic {
        name: String,
    },
    Send {
        topic: String,
        queue: u32,
        producer_id: u64,
        sequence: u64,
        /// Set by the leader before proposing, so every replica stores the same timestamp.
        timestamp_ms: u64,
        messages: Vec<StoredBody>,
    },
    CommitOffset {
        group: String,
        topic: String,
        queue: u32,
        offset: u64,
    },
    /// Retention: every message stored at or below this log index is dropped from the queues; each
    /// node then purges its log up to it.
    Trim {
        upto_log_index: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    Sent {
        queue: u32,
        first_offset: u64,
        count: u32,
        log_index: u64,
        duplicate: bool,
    },
    TopicNotFound(String),
    TopicExists {
        queues: u32,
    },
    Invalid(String),
}

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("commands always encode")
    }
    pub fn decode(b: &[u8]) -> Result<Command, postcard::Error> {
        postcard::from_bytes(b)
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("replies always encode")
    }
    pub fn decode(b: &[u8]) -> Result<Reply, postcard::Error> {
        postcard::from_bytes(b)
    }
}

/// The id of a stored message: broker group, Raft index of its batch, position in the batch.
pub fn msg_id(broker: &str, log_index: u64, position: u32) -> String {
    format!("{broker}-{log_index:016X}-{position:04X}")
}
