//! `raftmq topic create|list|route|delete`.

use anyhow::Result;
use raftmq_client::admin::message_type_name;
use raftmq_client::{Admin, TopicInfo};
use serde_json::{Value, json};

use crate::args::TopicCmd;
use crate::connect::Target;
use crate::output::{RouteJson, cell, each_queue, json_line, table, time_ms};

pub async fn run(target: &Target, json: bool, cmd: TopicCmd) -> Result<()> {
    let admin = target.admin()?;
    match cmd {
        TopicCmd::Create {
            name,
            queues,
            brokers,
            message_type,
        } => {
            let ty = message_type.message_type();
            let on = admin
                .create_topic_typed(&name, queues, brokers.as_deref(), ty)
                .await?;
            let ty = message_type_name(ty);
            if json {
                println!(
                    "{}",
                    json_line(&json!({"topic": name, "type": ty, "queues": queues, "brokers": on}))
                );
            } else {
                println!(
                    "created {ty} topic {name} with {queues} queues on {}",
                    on.join(", ")
                );
            }
        }
        TopicCmd::List => {
            let topics = admin.list_topics().await?;
            if json {
                println!("{}", json_line(&list_json(&topics)));
            } else {
                let rows: Vec<Vec<String>> = topics
                    .iter()
                    .flat_map(|t| {
                        let ty = t.message_type.map_or("-", message_type_name);
                        t.brokers.iter().map(move |(b, q)| {
                            vec![t.name.clone(), ty.to_string(), b.clone(), q.to_string()]
                        })
                    })
                    .collect();
                print!("{}", table(&["TOPIC", "TYPE", "BROKER", "QUEUES"], &rows));
            }
        }
        TopicCmd::Route { name } => {
            let route = admin.route(&name).await?;
            if json {
                println!("{}", json_line(&RouteJson::from(&route)));
            } else {
                let mut rows = Vec::new();
                for b in &route.brokers {
                    for n in &b.nodes {
                        let leader = if b.leader_id == Some(n.node_id) {
                            "*"
                        } else {
                            ""
                        };
                        rows.push(vec![
                            b.name.clone(),
                            b.queues.to_string(),
                            n.node_id.to_string(),
                            n.address.clone(),
                            format!("{}{leader}", n.role),
                            n.term.to_string(),
                        ]);
                    }
                }
                println!("topic {}", route.topic);
                print!(
                    "{}",
                    table(
                        &["BROKER", "QUEUES", "NODE", "ADDRESS", "ROLE", "TERM"],
                        &rows
                    )
                );
            }
        }
        TopicCmd::Status { name } => {
            let v = status_value(&admin, &name).await?;
            if json {
                println!("{}", json_line(&v));
            } else {
                print!("{}", status_table(&v));
            }
        }
        TopicCmd::Delete { name } => {
            let on = admin.delete_topic(&name).await?;
            if json {
                println!("{}", json_line(&json!({"topic": name, "brokers": on})));
            } else {
                println!("deleted topic {name} on {}", on.join(", "));
            }
        }
    }
    Ok(())
}

/// `topic list --json`: `{"topics": [{"name", "type", "brokers": [{"name", "queues"}]}]}`.
pub(crate) fn list_json(topics: &[TopicInfo]) -> Value {
    let v: Vec<Value> = topics
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.message_type.map(message_type_name),
                "brokers": t.brokers.iter()
                    .map(|(b, q)| json!({"name": b, "queues": q}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "topics": v })
}

/// `topic status NAME --json`: per broker group and queue, offsets, messages, bytes and last store
/// time, with totals (DESIGN.md states the fields).
pub async fn status_value(admin: &Admin, topic: &str) -> Result<Value> {
    let answers = admin.topic_status(topic, None).await?;
    let (mut messages, mut bytes, mut scheduled) = (0, 0, 0);
    let mut next_delivery: Option<u64> = None;
    let mut brokers = Vec::new();
    for a in &answers {
        let r = &a.reply;
        let queues: Vec<Value> = r
            .queues
            .iter()
            .map(|q| {
                json!({
                    "queue": q.queue,
                    "min_offset": q.min_offset,
                    "max_offset": q.max_offset,
                    "messages": q.max_offset - q.min_offset,
                    "bytes": q.bytes,
                    "last_store_ms": q.last_store_ms,
                })
            })
            .collect();
        let m: u64 = r.queues.iter().map(|q| q.max_offset - q.min_offset).sum();
        let b: u64 = r.queues.iter().map(|q| q.bytes).sum();
        messages += m;
        bytes += b;
        scheduled += r.scheduled;
        if let Some(n) = r.next_delivery_ms {
            next_delivery = Some(next_delivery.map_or(n, |x| x.min(n)));
        }
        brokers.push(json!({
            "name": a.broker,
            "leader_id": a.leader_id,
            "leader": a.leader,
            "now_ms": r.now_ms,
            "queues": queues,
            "messages": m,
            "bytes": b,
            "scheduled": r.scheduled,
            "next_delivery_ms": r.next_delivery_ms,
        }));
    }
    let message_type = answers
        .first()
        .and_then(|a| raftmq_proto::v1::TopicMessageType::try_from(a.reply.message_type).ok())
        .map(message_type_name);
    Ok(json!({
        "topic": topic,
        "type": message_type,
        "brokers": brokers,
        "messages": messages,
        "bytes": bytes,
        "scheduled": scheduled,
        "next_delivery_ms": next_delivery,
    }))
}

/// `topic status` as a table: one row per queue, then the totals.
fn status_table(v: &Value) -> String {
    let mut rows = Vec::new();
    for (b, q) in each_queue(v) {
        rows.push(vec![
            b["name"].as_str().unwrap_or("-").to_string(),
            cell(&q["queue"]),
            cell(&b["leader_id"]),
            cell(&q["min_offset"]),
            cell(&q["max_offset"]),
            cell(&q["messages"]),
            cell(&q["bytes"]),
            time_ms(q["last_store_ms"].as_u64()),
        ]);
    }
    rows.push(vec![
        "total".into(),
        String::new(),
        String::new(),
        String::new(),
        String::new(),
        cell(&v["messages"]),
        cell(&v["bytes"]),
        String::new(),
    ]);
    let scheduled = match v["scheduled"].as_u64() {
        Some(n) if n > 0 => format!(
            "; {n} scheduled, the next due {}",
            time_ms(v["next_delivery_ms"].as_u64())
        ),
        _ => String::new(),
    };
    format!(
        "topic {} ({}{scheduled})\n{}",
        v["topic"].as_str().unwrap_or("-"),
        v["type"].as_str().unwrap_or("type unknown"),
        table(
            &[
                "BROKER",
                "QUEUE",
                "LEADER",
                "MIN",
                "MAX",
                "MESSAGES",
                "BYTES",
                "LAST_STORE"
            ],
            &rows
        )
    )
}
