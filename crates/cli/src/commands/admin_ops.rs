//! `raftmq leader transfer` and `raftmq node add|remove`.

use std::time::Duration;

use anyhow::{Result, bail};
use raftmq_client::Admin;
use serde_json::json;
use tokio::time::Instant;

use crate::args::{LeaderCmd, NodeCmd};
use crate::connect::Target;
use crate::output::json_line;

pub async fn leader(target: &Target, json: bool, cmd: LeaderCmd) -> Result<()> {
    let LeaderCmd::Transfer { broker, to } = cmd;
    let admin = target.admin()?;
    let started = Instant::now();
    admin.transfer_leader(&broker, to).await?;
    let ms = started.elapsed().as_millis();
    print_outcome(
        json,
        json!({"broker": broker, "leader_id": to, "millis": ms}),
        format!("node {to} now leads {broker} ({ms} ms)"),
    );
    Ok(())
}

pub async fn node(target: &Target, json: bool, cmd: NodeCmd) -> Result<()> {
    let admin = target.admin()?;
    match cmd {
        NodeCmd::Status { node, broker } => {
            let v = crate::commands::node_status::status_value(&admin, &node, broker.as_deref())
                .await?;
            if json {
                println!("{}", json_line(&v));
            } else {
                print!("{}", crate::commands::node_status::status_text(&v));
            }
        }
        NodeCmd::Add {
            broker,
            node_id,
            address,
            learner,
            catch_up_timeout_ms,
        } => {
            admin.add_learner(&broker, node_id, &address).await?;
            if !learner {
                wait_caught_up(&admin, &broker, node_id, catch_up_timeout_ms).await?;
                let mut voters = admin.voters(&broker).await?;
                if !voters.contains(&node_id) {
                    voters.push(node_id);
                    voters.sort_unstable();
                }
                admin.change_voters(&broker, voters).await?;
            }
            let role = if learner { "learner" } else { "voter" };
            print_outcome(
                json,
                json!({"broker": broker, "node_id": node_id, "address": address, "role": role}),
                format!("node {node_id} ({address}) added to {broker} as {role}"),
            );
        }
        NodeCmd::Remove { broker, node_id } => {
            let voters = admin.voters(&broker).await?;
            if !voters.contains(&node_id) {
                bail!("node {node_id} is not a voter of {broker} (voters: {voters:?})");
            }
            let rest: Vec<u64> = voters.into_iter().filter(|v| *v != node_id).collect();
            if rest.is_empty() {
                bail!("refusing to remove the last voter of {broker}");
            }
            admin.change_voters(&broker, rest.clone()).await?;
            print_outcome(
                json,
                json!({"broker": broker, "removed": node_id, "voters": rest}),
                format!("node {node_id} removed from {broker}; voters now {rest:?}"),
            );
        }
    }
    Ok(())
}

/// Waits until the leader reports the learner's log matched up to its commit index.
async fn wait_caught_up(admin: &Admin, broker: &str, node_id: u64, timeout_ms: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    loop {
        let s = admin.leader_status(broker).await?;
        if let Some(p) = s.peers.iter().find(|p| p.node_id == node_id)
            && p.matched_index >= s.committed
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "node {node_id} did not catch up with the leader of {broker} within {timeout_ms} ms"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Prints one command's outcome: the JSON object with `--json`, else the sentence.
fn print_outcome(json: bool, value: serde_json::Value, sentence: String) {
    if json {
        println!("{}", json_line(&value));
    } else {
        println!("{sentence}");
    }
}
