//! The Rust client library of raftmq.
//!
//! Crate map:
//! - [`producer`]: [`Producer`] — queue choice (round robin or key hash), batching with an
//!   in-flight window, leader-following retries, idempotent `(producer_id, sequence)` batches.
//! - [`consumer`]: [`Consumer`] — consumer-group membership by heartbeats, averaged queue
//!   assignment, pulls that follow the read hint, offsets committed periodically and on close.
//! - [`admin`]: [`Admin`] — topics, live cluster status, leader transfer, learners and voters.
//! - [`users`]: more of [`Admin`] — users and their rules on every broker group, with each
//!   group's outcome.
//! - [`queue`]: pure choices over queues (key hash, round robin, RocketMQ's averaged allocation).
//! - [`nameserver`]: the route model ([`TopicRoute`]) and the multi-nameserver client.
//! - `router` (internal): group views (nodes, leader) and the retry loop that follows leaders.
//! - `conn` (internal): one lazily connected gRPC channel per address.
//! - [`security`]: [`ClientSecurity`] — TLS and request signatures for every connection.
//! - [`error`]: the one [`Error`] enum.
//!
//! Every call is async and needs a Tokio runtime. Leader changes are hidden: a request to a
//! follower is redirected by its `NOT_LEADER` hint, a dead node is replaced by asking another node
//! of its group, and retries stop at the operation's deadline.
//!
//! ```no_run
//! use raftmq_client::{Admin, Message, Producer};
//!
//! # async fn example() -> raftmq_client::Result<()> {
//! let admin = Admin::connect("127.0.0.1:9876")?;
//! admin.create_topic("greetings", 4, None).await?;
//! let producer = Producer::builder("127.0.0.1:9876").build()?;
//! producer.send("greetings", Message::new("hello")).await?;
//! producer.close().await;
//! # Ok(())
//! # }
//! ```

pub mod admin;
mod conn;
pub mod consumer;
pub mod error;
pub mod inspect;
pub mod nameserver;
pub mod producer;
pub mod queue;
mod router;
pub mod security;
pub mod users;

pub use admin::{Admin, BrokerView, ClusterStatus, ClusterView, NodeView, TopicInfo};
pub use consumer::{Consumer, ConsumerBuilder, ConsumerConfig, ReceivedMessage, StartFrom};
pub use error::{Error, Result};
pub use nameserver::{BrokerRoute, RouteNode, TopicRoute, parse_nameservers};
pub use producer::{Message, Producer, ProducerBuilder, ProducerConfig, SendReceipt};
pub use queue::QueueId;
pub use raftmq_proto::v1::{CatchUpStatus, ErrorCode, NodeRef, NodeStatusResponse, PeerStatus};
pub use router::RetryPolicy;
pub use security::{ClientSecurity, Conn, Credentials, Tls, TlsFiles};
/// The type of a received message's body.
pub use tonic::codegen::Bytes;
pub use users::{BrokerOutcome, UserView};
