use clap::Parser;

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
