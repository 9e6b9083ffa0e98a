//! The hidden `run-nameserver` / `run-broker-node` subcommands: the servers run inside this
//! executable, so a local cluster works from a single `raftmq` binary.
//!
//! Until the server crates export `Args` and `run`, these fail with a clear message and local
//! clusters need the `nameserver` and `broker-node` binaries next to `raftmq`.

use anyhow::{Result, bail};

/// Whether the servers are compiled into this executable.
pub const BUILT_IN: bool = false;

/// Runs a nameserver with `args` (its own command line, without the program name).
pub async fn run_nameserver(_args: Vec<String>) -> Result<()> {
    bail!(
        "this raftmq was built without the nameserver; build the `nameserver` binary \
         (cargo build -p raftmq-nameserver) and put it next to raftmq"
    )
}

/// Runs a broker node with `args` (its own command line, without the program name).
pub async fn run_broker_node(_args: Vec<String>) -> Result<()> {
    bail!(
        "this raftmq was built without the broker node; build the `broker-node` binary \
         (cargo build -p raftmq-broker-node) and put it next to raftmq"
    )
}
