//! `raftmq txn list|commit|rollback`: the open transactions of a TRANSACTION topic, and ending
//! one by hand (what an operator does for a producer that is gone for good).

use anyhow::Result;
use raftmq_client::Admin;
use serde_json::{Map, Value, json};

use crate::args::TxnCmd;
use crate::connect::Target;
use crate::output::{body_field, json_line, table, time_ms};

pub async fn run(target: &Target, json: bool, cmd: TxnCmd) -> Result<()> {
    let admin = target.admin()?;
    let (topic, id, commit) = match cmd {
        TxnCmd::List { topic, limit } => return list(&admin, json, &topic, limit).await,
        TxnCmd::Commit { topic, id } => (topic, id, true),
        TxnCmd::Rollback { topic, id } => (topic, id, false),
    };
    let (broker, queue, offset) = admin.end_transaction(&topic, &id, commit).await?;
    let action = if commit { "committed" } else { "rolled back" };
    if json {
        let mut v = json!({"topic": topic, "broker": broker, "transaction_id": id,
            "committed": commit});
        if commit {
            v["queue"] = json!(queue);
            v["offset"] = json!(offset);
        }
        println!("{}", json_line(&v));
    } else if commit {
        println!("{action} {id} of topic {topic} on {broker}: queue {queue}, offset {offset}");
    } else {
        println!("{action} {id} of topic {topic} on {broker}");
    }
    Ok(())
}

async fn list(admin: &Admin, json: bool, topic: &str, limit: u32) -> Result<()> {
    let groups = admin.list_transactions(topic, limit).await?;
    let mut rows = Vec::new();
    for (broker, txns) in &groups {
        for t in txns {
            let m = t.message.clone().unwrap_or_default();
            let (field, body) = body_field(&m.body);
            if json {
                let mut v = Map::new();
                v.insert("topic".into(), json!(topic));
                v.insert("broker".into(), json!(broker));
                v.insert("transaction_id".into(), json!(t.transaction_id));
                v.insert("queue".into(), json!(m.queue));
                v.insert("checks".into(), json!(t.checks));
                v.insert("next_check_ms".into(), json!(t.next_check_ms));
                v.insert("tag".into(), json!(m.tag));
                v.insert("key".into(), json!(m.key));
                v.insert(field.into(), json!(body));
                println!("{}", json_line(&Value::Object(v)));
            } else {
                rows.push(vec![
                    broker.clone(),
                    t.transaction_id.clone(),
                    m.queue.to_string(),
                    t.checks.to_string(),
                    time_ms(Some(t.next_check_ms)),
                    body.chars().take(40).collect(),
                ]);
            }
        }
    }
    if !json {
        let open: usize = groups.iter().map(|(_, t)| t.len()).sum();
        println!("{open} open transaction(s) in topic {topic}");
        if !rows.is_empty() {
            print!(
                "{}",
                table(
                    &[
                        "BROKER",
                        "TRANSACTION",
                        "QUEUE",
                        "CHECKS",
                        "NEXT CHECK",
                        "BODY"
                    ],
                    &rows
                )
            );
        }
    }
    Ok(())
}
