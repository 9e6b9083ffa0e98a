//! The `raftmq` command line.
//!
//! Crate map:
//! - [`args`]: the clap definition of every command and flag (DESIGN.md "Command line").
//! - [`connect`]: the cluster a command talks to ([`connect::Target`]): nameservers, TLS and
//!   request signing from the global options, applied to every client a command makes.
//! - [`commands`]: one module per command family — `cluster`, `topic` (with `topic status`),
//!   `group` (with `group status|reset`), `msg` (`msg get|find`), `produce`, `consume`,
//!   `admin_ops` (leader transfer, node add/remove), `node_status`, `console` (the web page),
//!   `bench`, `demo`, `playground`, `cert` (`cert init`: development certificates), `users`
//!   (`user` and `acl`: users and their rules on every broker group).
//! - [`output`]: the JSON shapes scripts rely on, and plain tables.
//! - [`stats`]: percentiles and throughput for the benchmarks.
//! - [`load`]: background senders and the read-back loss check (demo, failover bench).
//! - [`local_cluster`]: starting and killing local nameserver and broker-node processes; the one
//!   place that spawns processes.
//! - [`probe`]: the one polling loop (`wait_for`) and the one leader search of every harness
//!   (local cluster, process-cluster tests, deploy tests).
//! - [`servers`]: the hidden `run-nameserver` / `run-broker-node` subcommands.
//! - [`signals`]: Ctrl-C / SIGTERM.
//!
//! [`main`] runs a parsed command and turns its outcome into an exit status: 0 on success,
//! 1 with a one-line reason on standard error on failure, 130 when interrupted.

pub mod args;
pub mod commands;
pub mod connect;
pub mod load;
pub mod local_cluster;
pub mod output;
pub mod probe;
pub mod servers;
pub mod signals;
pub mod stats;

use std::process::ExitCode;

use anyhow::Result;

use crate::args::{Cli, ClusterCmd, Command};
use crate::connect::Target;

/// Runs one parsed command line to completion.
pub async fn run(cli: Cli) -> Result<()> {
    let Cli {
        nameserver,
        json,
        security,
        command,
        ..
    } = cli;
    // The cluster of --nameserver, reached with the security options: built only by commands
    // that talk to it (a missing TLS file does not refuse `cert init` or `demo`).
    let target = || Target::new(&nameserver, &security);
    match command {
        Command::Cluster(ClusterCmd::Status { watch }) => {
            commands::cluster::status(&target()?, json, watch).await
        }
        Command::Topic(cmd) => commands::topic::run(&target()?, json, cmd).await,
        Command::Group(cmd) => commands::group::run(&target()?, json, cmd).await,
        Command::Produce(a) => commands::produce::run(&target()?, json, a).await,
        Command::Consume(a) => commands::consume::run(&target()?, json, a).await,
        Command::Leader(cmd) => commands::admin_ops::leader(&target()?, json, cmd).await,
        Command::Node(cmd) => commands::admin_ops::node(&target()?, json, cmd).await,
        // Each bench decides: its own local cluster (plaintext) or --nameserver's.
        Command::Bench(cmd) => commands::bench::run(&target, json, cmd).await,
        Command::Demo(a) => commands::demo::run(a).await,
        Command::Playground(a) => commands::playground::run(a).await,
        Command::Msg(cmd) => commands::msg::run(&target()?, json, cmd).await,
        Command::Console(a) => commands::console::run(&target()?, a).await,
        Command::Txn(cmd) => commands::txn::run(&target()?, json, cmd).await,
        Command::Cert(cmd) => commands::cert::run(json, cmd),
        Command::User(cmd) => commands::users::user(&target()?, json, cmd).await,
        Command::Acl(cmd) => commands::users::acl(&target()?, json, cmd).await,
        Command::RunNameserver(a) => servers::run_nameserver(a.args).await,
        Command::RunBrokerNode(a) => servers::run_broker_node(a.args).await,
    }
}

/// Whether log lines on standard error may carry colour codes: only on a terminal, and never
/// with `NO_COLOR` set (<https://no-color.org>).
pub fn log_colours() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The whole program: logging, runtime, interruption, exit status.
pub fn main(cli: Cli) -> ExitCode {
    let is_server = matches!(
        cli.command,
        Command::RunNameserver(_) | Command::RunBrokerNode(_)
    );
    if !is_server {
        // Servers set up their own logging (from RAFTMQ_LOG, which deploy files set, so a client
        // command run in a server's container stays quiet). The CLI logs warnings unless `-v`
        // or RUST_LOG asks for more.
        let level = match cli.verbose {
            0 => "warn",
            1 => "info",
            _ => "debug",
        };
        let filter = match std::env::var("RUST_LOG") {
            Ok(v) if !v.trim().is_empty() && cli.verbose == 0 => {
                tracing_subscriber::EnvFilter::new(v)
            }
            _ => tracing_subscriber::EnvFilter::new(level),
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(log_colours())
            .try_init();
    }
    // A client command keeps its tasks on one thread: a producer's send, its batcher, its RPC
    // and the connection task then hand work to each other without waking another thread
    // (measured: more sends per second, one at a time and 256 in flight). Its local cluster, if
    // any, runs in child processes. Servers use every core the machine gives them.
    let runtime = if is_server {
        tokio::runtime::Runtime::new()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("raftmq: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Commands that end normally on Ctrl-C (committing offsets, stopping a watch or the
    // playground) handle it themselves; servers install their own handlers.
    let handles_interrupt = is_server
        || matches!(
            cli.command,
            Command::Consume(_)
                | Command::Cluster(ClusterCmd::Status { watch: true })
                | Command::Playground(_)
                | Command::Console(_)
        );
    let outcome = runtime.block_on(async {
        if handles_interrupt {
            return Some(run(cli).await);
        }
        // Dropping the command's future on interruption drops any local cluster it owns, which
        // kills its processes. Commands that end normally on Ctrl-C handle it themselves first.
        tokio::select! {
            r = run(cli) => Some(r),
            _ = signals::interrupted() => None,
        }
    });
    match outcome {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(e)) => {
            let reason = format!("{e:#}").replace('\n', " ");
            eprintln!("raftmq: {reason}");
            ExitCode::FAILURE
        }
        None => {
            eprintln!("raftmq: interrupted");
            ExitCode::from(130)
        }
    }
}
