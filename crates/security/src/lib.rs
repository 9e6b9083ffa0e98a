//! `raftmq-security`: what a node, a nameserver and a client need to talk safely.
//!
//! - [`tls`]: TLS material from PEM files (rustls with ring), reloaded when a file changes; the
//!   accept loop that hands tonic finished TLS streams.
//! - [`identity`]: a node's identity in its certificate (`raftmq://cluster/group/id`), which the
//!   Raft peer service checks.
//! - [`certgen`]: a development CA and node and client certificates (`raftmq cert init`).
//! - [`sign`]: request signatures as the RocketMQ 5 clients make them (`MQv2-HMAC-SHA1`).
//! - [`acl`]: users, rules and the one decision function.

pub mod acl;
pub mod certgen;
pub mod identity;
pub mod sign;
pub mod tls;
