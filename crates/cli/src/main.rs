//! The `raftmq` binary: parses the command line and hands it to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    raftmq_cli::main(raftmq_cli::args::Cli::parse())
}
