//! The `raftmq` binary: parses the command line and hands it to the library.

use clap::Parser;

/// mimalloc, chosen by measurement: glibc's malloc and free were ~40 % of the instructions of the
/// per-message hot paths; with mimalloc they cost 29 % fewer in all (`scripts/instructions`,
/// ARCHITECTURE.md "Per-message cost").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    raftmq_cli::main(raftmq_cli::args::Cli::parse())
}
