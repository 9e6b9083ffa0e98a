//! The commands a broker group replicates through its Raft log, and the replies the state machine
//! gives back. Encoded with postcard; a message body is stored once, inside the `Send` entry.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBody {
    pub key: String,
    pub tag: String,
    /// Encoded as bytes (as `serde_bytes` would a `Vec<u8>`), so old and new entries read the same.
    pub body: bytes::Bytes,
    pub properties: Vec<(String, String)>,
}

/// A stored message as apply reads it: every field borrowed from the entry, nothing copied. Same
/// encoding as [`StoredBody`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BodyView<'a> {
    #[serde(borrow)]
    pub key: &'a str,
    #[serde(borrow)]
    pub tag: &'a str,
    #[serde(borrow)]
    pub body: &'a [u8],
    #[serde(borrow)]
    pub properties: Vec<(&'a str, &'a str)>,
}

/// A replicated command, generic over how its messages are held: owned ([`Command`], to build
/// and to serve pulls) or borrowed ([`CommandView`], for apply, which only counts them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandOf<B> {
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
        messages: Vec<B>,
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

pub type Command = CommandOf<StoredBody>;
pub type CommandView<'a> = CommandOf<BodyView<'a>>;

impl Command {
    pub fn encode(&self) -> Vec<u8> {
        // A send is sized up front: growing the buffer by doubling would copy every body again.
        let size = match self {
            CommandOf::Send { messages, .. } => messages
                .iter()
                .map(|m| {
                    m.body.len()
                        + m.key.len()
                        + m.tag.len()
                        + m.properties
                            .iter()
                            .map(|(k, v)| k.len() + v.len() + 10)
                            .sum::<usize>()
                        + 16
                })
                .sum::<usize>(),
            _ => 0,
        };
        postcard::to_extend(self, Vec::with_capacity(size + 128)).expect("commands always encode")
    }
    pub fn decode(b: &[u8]) -> Result<Command, postcard::Error> {
        postcard::from_bytes(b)
    }
}

impl<'a> CommandView<'a> {
    /// Decodes without copying message bodies, keys, tags or properties.
    pub fn view(b: &'a [u8]) -> Result<CommandView<'a>, postcard::Error> {
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
/// Formatted as `{broker}-{log_index:016X}-{position:04X}`, digit by digit: one is built for every
/// message a leader acknowledges, and `format!` cost a few percent of the leader's CPU.
pub fn msg_id(broker: &str, log_index: u64, position: u32) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let position_digits = (32 - position.leading_zeros()).div_ceil(4).max(4) as usize;
    let mut id = String::with_capacity(broker.len() + 18 + position_digits);
    id.push_str(broker);
    id.push('-');
    for shift in (0..16).rev() {
        id.push(HEX[(log_index >> (shift * 4)) as usize & 0xF] as char);
    }
    id.push('-');
    for shift in (0..position_digits).rev() {
        id.push(HEX[(position >> (shift * 4)) as usize & 0xF] as char);
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msg_id_matches_its_documented_format() {
        for (index, position) in [
            (0, 0),
            (1, 9),
            (0xABCDEF, 0x3E7),
            (u64::MAX, 0xFFFF),
            (42, 0x10000),
            (7, u32::MAX),
        ] {
            assert_eq!(
                msg_id("broker-a", index, position),
                format!("broker-a-{index:016X}-{position:04X}")
            );
        }
    }

    #[test]
    fn a_view_reads_what_the_owned_command_wrote() {
        let cmd = Command::Send {
            topic: "orders".into(),
            queue: 3,
            producer_id: 9,
            sequence: 4,
            timestamp_ms: 17,
            messages: vec![
                StoredBody {
                    key: "k1".into(),
                    tag: "t".into(),
                    body: vec![1, 2, 3].into(),
                    properties: vec![("a".into(), "b".into())],
                },
                StoredBody {
                    key: String::new(),
                    tag: String::new(),
                    body: vec![0; 1024].into(),
                    properties: vec![],
                },
            ],
        };
        let bytes = cmd.encode();
        let CommandView::Send {
            topic,
            queue,
            producer_id,
            sequence,
            timestamp_ms,
            messages,
        } = CommandView::view(&bytes).unwrap()
        else {
            panic!("not a send");
        };
        assert_eq!(
            (topic.as_str(), queue, producer_id, sequence, timestamp_ms),
            ("orders", 3, 9, 4, 17)
        );
        assert_eq!(messages.len(), 2);
        assert_eq!(
            (messages[0].key, messages[0].tag, messages[0].body),
            ("k1", "t", &[1u8, 2, 3][..])
        );
        assert_eq!(messages[0].properties, vec![("a", "b")]);
        assert_eq!(messages[1].body, &[0u8; 1024][..]);
        // The body is borrowed from the encoded entry, not copied.
        let range = bytes.as_ptr_range();
        assert!(range.contains(&messages[1].body.as_ptr()));
    }
}

#[cfg(test)]
mod golden;
