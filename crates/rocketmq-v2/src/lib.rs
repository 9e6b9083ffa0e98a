//! The RocketMQ 5 gRPC front of a raftmq broker node: `apache.rocketmq.v2.MessagingService`,
//! served on the node's own port as a translation layer over raftmq's `raftmq.v1.BrokerService`,
//! so the official RocketMQ 5 clients (Rust 5.0.0, Python 5.1.2) work unmodified.
//!
//! Mount it next to the node's other services:
//!
//! ```ignore
//! let v2 = raftmq_rocketmq_v2::service(broker.clone(), raftmq_rocketmq_v2::FrontConfig { .. });
//! router.add_service(v2)
//! ```
//!
//! # Where each RPC is served
//!
//! A v1 call for this node's broker group runs in-process on the node's `BrokerService`; when
//! this node is not the leader, the call goes on to the leader; a call about a queue of another
//! broker group goes to a node of that group (see [`forward`]).
//!
//! | v2 RPC | served by |
//! |---|---|
//! | QueryRoute | the nameservers' `Route` (cached 3 s); topic types from `ListTopics` of each group |
//! | QueryAssignment | as QueryRoute; one queue (id -1) per group, one per queue for FIFO groups |
//! | Heartbeat | remembered here; consumers also `Heartbeat` on this group's leader |
//! | Telemetry | here: each `Settings` is answered with the merged settings ([`settings`]); a producer's stream also carries transaction checks (`RecoverOrphanedTransactionCommand`, claimed each second with `TakeTransactionChecks`) |
//! | SendMessage | `Send` on the leader of the group chosen (this node's when it hosts the topic) |
//! | ReceiveMessage | `Pop` on the leader of the queue's group (any of its queues; a FIFO group's order is kept by the broker) |
//! | AckMessage / ChangeInvisibleDuration / ForwardMessageToDeadLetterQueue | `PopAck` / `ChangeInvisible` / `DeadLetter` on this group's leader |
//! | PullMessage | `Pull` on the queue's group (any node) |
//! | UpdateOffset / GetOffset / QueryOffset | `CommitOffset` / `FetchOffset` / `Pull`'s range |
//! | NotifyClientTermination | here; consumers also `LeaveGroup` |
//! | RecallMessage / EndTransaction | `Recall` / `EndTransaction` on the group the handle or transaction id names |
//! | SyncLiteSubscription | NOT_IMPLEMENTED in the payload |
//!
//! # Crate map
//! - [`pb`]: the generated v2 types and service stubs (`proto/apache/rocketmq/v2`).
//! - [`service`]: [`Front`], the `MessagingService` implementation.
//! - [`combine`]: folds concurrent sends to one queue into one v1 `Send` (one Raft entry).
//! - [`resend`]: a client's retry of a send (same message id) waits for the first, so it is
//!   stored once.
//! - [`forward`]: the one helper every forwarded v1 call goes through (in-process, leader, other
//!   group; retried through an election) and the channel pool.
//! - [`route`]: nameserver routes (cached) and the v2 queues built from them (pure).
//! - [`settings`]: the Settings merge, `grpc-timeout` parsing and the long-poll cap (pure).
//! - [`convert`]: v2 message ⇄ v1 message, the MD5 digest, time helpers (pure).
//! - [`codes`]: the crate's one error type and its one mapping to the v2 `Code`s.

pub mod codes;
pub mod combine;
pub mod convert;
pub mod forward;
pub mod resend;
pub mod route;
pub mod service;
pub mod settings;

use std::sync::Arc;

use raftmq_proto::v1::broker_service_server::BrokerService;

pub use codes::Error;
pub use service::Front;

/// Package `apache.rocketmq.v2`: messages and the `MessagingService` stubs.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("apache.rocketmq.v2");
}

/// What the front needs to know about its node.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// This node's broker group name.
    pub broker: String,
    /// This node's id in its group.
    pub node_id: u64,
    /// This node's `host:port` (the same port serves v2), as registered with the nameservers.
    pub advertise: String,
    /// `host:port` of every nameserver.
    pub nameservers: Vec<String>,
    /// Create an unknown topic on this group at its first route or send (default false: an
    /// unknown topic is TOPIC_NOT_FOUND).
    pub auto_create_topics: bool,
    /// The node's largest message body: Settings' `publishing.max_body_size` and the send check.
    pub body_bytes_max: u64,
    /// The node's batch limits (messages, bytes): concurrent sends to one queue are folded into
    /// one v1 `Send` within them.
    pub batch_messages_max: usize,
    pub batch_bytes_max: usize,
    /// Check each caller's rights (the node's `auth`): the node's gate puts a
    /// `raftmq_security::Caller` into every request, and the front refuses with UNAUTHORIZED
    /// (40100) or FORBIDDEN (40300) before it forwards anything.
    pub auth: bool,
    /// TLS toward other nodes and the nameservers (None: plaintext).
    pub tls: Option<Arc<raftmq_security::tls::Tls>>,
    /// What the front signs its calls to other nodes and the nameservers with (None: unsigned).
    pub credentials: Option<Arc<raftmq_security::sign::Credentials>>,
}

impl FrontConfig {
    /// A config with the defaults: no auto-creation, the contract's default body limit.
    pub fn new(broker: String, node_id: u64, advertise: String, nameservers: Vec<String>) -> Self {
        FrontConfig {
            broker,
            node_id,
            advertise,
            nameservers,
            auto_create_topics: false,
            body_bytes_max: raftmq_proto::limits::BODY_BYTES_MAX as u64,
            batch_messages_max: raftmq_proto::limits::BATCH_MESSAGES_MAX,
            batch_bytes_max: raftmq_proto::limits::BATCH_BYTES_MAX,
            auth: false,
            tls: None,
            credentials: None,
        }
    }
}

/// The v2 gRPC service over `local`, this node's v1 `BrokerService`, ready to add to a tonic
/// router. Its decoding limit is the contract's gRPC message cap.
pub fn service<B: BrokerService>(
    local: Arc<B>,
    cfg: FrontConfig,
) -> pb::messaging_service_server::MessagingServiceServer<Front<B>> {
    pb::messaging_service_server::MessagingServiceServer::new(Front::new(local, cfg))
        .max_decoding_message_size(raftmq_proto::limits::GRPC_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(raftmq_proto::limits::GRPC_MESSAGE_BYTES_MAX)
}
