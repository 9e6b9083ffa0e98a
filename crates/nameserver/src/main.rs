//! The `nameserver` binary: parses arguments and calls [`raftmq_nameserver::run`].

use std::process::ExitCode;

use clap::Parser;

/// raftmq nameserver: registry of broker nodes and topic routes.
#[derive(Debug, Parser)]
#[command(name = "nameserver", version, about)]
struct Cli {
    #[command(flatten)]
    args: raftmq_nameserver::Args,
}

#[tokio::main]
async fn main() -> ExitCode {
    match raftmq_nameserver::run(Cli::parse().args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, the whole cause chain: "invalid nameserver configuration: invalid config key ...".
            eprintln!("nameserver: {e:#}");
            ExitCode::FAILURE
        }
    }
}
