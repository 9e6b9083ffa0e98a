//! The raftmq nameserver: an in-memory registry of broker nodes and topic routes.
//!
//! Broker nodes register with every nameserver (every 30 s and on any role change); clients ask
//! any nameserver for a topic's route. Nameservers are independent and keep nothing on disk.
//!
//! # Crate map
//! - [`registry`]: the pure core — registration, expiry, leader choice, routes, cluster info.
//!   Takes the current time as an argument; no I/O, no clock.
//! - [`auth`]: who may call what (auth on): the caller a call's certificate or signature makes,
//!   and the decision per call. Pure, like the registry.
//! - [`service`]: the gRPC `NameserverService` over a shared registry, the gate that identifies
//!   each call, and the expiry task that owns the clock.
//! - [`metrics`]: Prometheus counters and gauges, rendered at `GET /metrics`.
//! - [`config`]: [`Config`] (defaults, validation, TOML file) and the clap [`Args`].
//! - [`server`]: binds the one port and serves gRPC, health, reflection and `/metrics` on it, over
//!   TLS when configured; [`run`] is the binary's entry point, [`serve`] / [`Server`] the
//!   in-process one.
//! - [`error`]: the crate's single error type, with its stable wire codes.

pub mod auth;
pub mod config;
pub mod error;
pub mod metrics;
pub mod registry;
pub mod server;
pub mod service;

pub use config::{Args, Config};
pub use error::Error;
pub use registry::Registry;
pub use server::{Server, run, serve};
