//! The replicated log of a raftmq broker group: openraft glue, our own segment log storage, the
//! state-machine seam and the peer network. Every openraft type stays inside this crate.
//!
//! - [`node`]: [`Member`], the public API: start, propose, read entries, status, leadership, membership.
//! - [`log_store`]: segment files of CRC'd records, group commit, recovery; metadata in sled.
//! - [`state_machine`]: the [`StateMachine`] trait the broker implements, and its openraft adapter.
//! - [`network`] / [`server`]: the peer gRPC client (one channel per peer, deadlines) and service;
//!   [`commit_notice`] folds a leader's entry-less commit notices into the append after them.
//! - [`config`]: [`RaftConfig`] with defaults and validation.
//! - [`types`]: the openraft type configuration.
//! - `testkit` (feature `testing`): a local group of members with abrupt kill, for tests and
//!   benchmarks.

mod append_wire;
pub mod catchup;
pub mod commit_notice;
pub mod config;
pub mod encoding;
pub mod error;
#[cfg(test)]
mod golden;
pub mod log_store;
mod metrics;
pub mod network;
pub mod node;
pub mod peers;
pub mod server;
pub mod state_machine;
#[cfg(feature = "testing")]
pub mod testkit;
pub mod types;

pub use catchup::CatchUp;
pub use config::{FlushMode, RaftConfig};
pub use error::{Error, ProposeError};
pub use node::{Member, MemberConfig, PeerProgress, Role, Status};
pub use state_machine::StateMachine;
