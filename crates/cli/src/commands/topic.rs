//! `raftmq topic create|list|route|delete`.

use anyhow::Result;
use raftmq_client::Admin;
use raftmq_client::admin::message_type_name;
use serde_json::json;

use crate::args::TopicCmd;
use crate::output::{RouteJson, json_line, table};

pub async fn run(nameserver: &str, json: bool, cmd: TopicCmd) -> Result<()> {
    let admin = Admin::connect(nameserver)?;
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
                let v: Vec<_> = topics
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
                println!("{}", json_line(&json!({ "topics": v })));
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
