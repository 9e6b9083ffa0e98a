//! `raftmq playground`: the demo's local cluster, left running until Ctrl-C.

use anyhow::Result;
use raftmq_client::Admin;

use crate::args::PlaygroundArgs;
use crate::local_cluster::{LocalCluster, LocalClusterOptions};
use crate::signals::interrupted;

pub async fn run(args: PlaygroundArgs) -> Result<()> {
    println!(
        "starting a nameserver and a {}-node broker group...",
        args.nodes
    );
    let interrupt = interrupted();
    tokio::pin!(interrupt);
    let start = LocalCluster::start(LocalClusterOptions {
        nodes: args.nodes.max(1),
        ..Default::default()
    });
    let cluster = tokio::select! {
        c = start => c?,
        _ = &mut interrupt => anyhow::bail!("interrupted while starting"),
    };
    let ns = &cluster.nameserver;
    if !args.topic.is_empty() {
        Admin::connect(ns)?
            .create_topic(&args.topic, 4, None)
            .await?;
    }
    println!("\nnameserver   {ns}");
    for n in cluster.nodes.values() {
        println!(
            "node {}       {}   (log {})",
            n.node_id,
            n.addr,
            n.log.display()
        );
    }
    println!("data         {}", cluster.dir().display());
    let t = if args.topic.is_empty() {
        "demo"
    } else {
        args.topic.as_str()
    };
    println!("\ntry, in another terminal:");
    println!("  export RAFTMQ_NAMESERVER={ns}");
    println!("  raftmq cluster status --watch");
    if args.topic.is_empty() {
        println!("  raftmq topic create {t} --queues 4");
    }
    println!("  raftmq produce --topic {t} --count 1000 --size 100");
    println!("  seq 5 | raftmq produce --topic {t} --json");
    println!("  raftmq consume --topic {t} --group g1 --from earliest --json");
    println!(
        "  raftmq leader transfer --broker {} --to 2",
        cluster.broker
    );
    println!("  raftmq bench produce --topic {t} --count 50000");
    println!("\nCtrl-C stops every process and removes the directory.");
    interrupt.await;
    println!("stopping");
    drop(cluster);
    Ok(())
}
