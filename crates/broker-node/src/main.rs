use clap::Parser;

/// mimalloc, chosen by measurement: glibc's malloc and free were ~40 % of the instructions of the
/// per-message hot paths; with mimalloc they cost 29 % fewer in all (`scripts/instructions`,
/// ARCHITECTURE.md "Per-message cost").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One replica of a raftmq broker group.
#[derive(Parser)]
#[command(name = "broker-node", version)]
struct Cli {
    #[command(flatten)]
    args: raftmq_broker_node::Args,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = raftmq_broker_node::run(cli.args).await {
        eprintln!("broker-node: {}", raftmq_broker_node::error_report(&e));
        std::process::exit(1);
    }
}
