//! `raftmq group create|update|list|delete|status|reset`: consumer groups. POP groups are replicated
//! config of each broker group; `status` and `reset` serve pull groups too.

use anyhow::Result;
use raftmq_client::Admin;
use raftmq_client::admin::{GroupConfig, GroupInfo, MAX_ATTEMPTS_DEFAULT};
use raftmq_client::inspect::ResetTo;
use raftmq_client::queue::allocate_averagely;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

use crate::args::{GroupArgs, GroupCmd};
use crate::output::{age_ms, cell, each_queue, json_line, table, time_ms};

pub async fn run(target: &crate::connect::Target, json: bool, cmd: GroupCmd) -> Result<()> {
    let admin = target.admin()?;
    match cmd {
        GroupCmd::Create { name, config } => apply(&admin, json, name, config, false).await?,
        GroupCmd::Update { name, config } => apply(&admin, json, name, config, true).await?,
        GroupCmd::List => {
            let groups = admin.list_groups().await?;
            if json {
                let v: Vec<Value> = groups.iter().map(group_json).collect();
                println!("{}", json_line(&json!({ "groups": v })));
            } else {
                let rows: Vec<Vec<String>> = groups.iter().map(group_row).collect();
                print!(
                    "{}",
                    table(
                        &["GROUP", "MAX_ATTEMPTS", "RETRY", "FIFO", "BROKERS"],
                        &rows
                    )
                );
            }
        }
        GroupCmd::Status { name, topic } => {
            let v = status_value(&admin, &name, topic.as_deref()).await?;
            if json {
                println!("{}", json_line(&v));
            } else {
                print!("{}", status_table(&v));
            }
        }
        GroupCmd::Reset {
            name,
            topic,
            to,
            force,
        } => {
            let to = match to.as_str() {
                "earliest" => ResetTo::Earliest,
                "latest" => ResetTo::Latest,
                t => ResetTo::Time(crate::commands::msg::parse_time("--to", t)?),
            };
            let done = admin.reset_group(&name, &topic, to, force).await?;
            if json {
                let queues: Vec<Value> = done
                    .iter()
                    .map(|r| json!({"broker": r.broker, "queue": r.queue, "from": r.from, "to": r.to}))
                    .collect();
                println!(
                    "{}",
                    json_line(&json!({"group": name, "topic": topic, "queues": queues}))
                );
            } else {
                let rows: Vec<Vec<String>> = done
                    .iter()
                    .map(|r| {
                        vec![
                            r.broker.clone(),
                            r.queue.to_string(),
                            r.from.map_or("-".into(), |o| o.to_string()),
                            r.to.to_string(),
                        ]
                    })
                    .collect();
                println!("reset group {name} on topic {topic}");
                print!("{}", table(&["BROKER", "QUEUE", "FROM", "TO"], &rows));
            }
        }
        GroupCmd::Delete { name } => {
            let on = admin.delete_group(&name).await?;
            if json {
                println!("{}", json_line(&json!({"group": name, "brokers": on})));
            } else {
                println!("deleted group {name} on {}", on.join(", "));
            }
        }
    }
    Ok(())
}

async fn apply(
    admin: &Admin,
    json: bool,
    name: String,
    args: GroupArgs,
    update: bool,
) -> Result<()> {
    let cfg = GroupConfig {
        name,
        max_attempts: args.max_attempts.unwrap_or(0),
        retry_delays_ms: args.retry.unwrap_or_default(),
        fifo: args.fifo,
    };
    let on = admin
        .create_group(&cfg, update, args.brokers.as_deref())
        .await?;
    let info = GroupInfo {
        name: cfg.name.clone(),
        config: GroupConfig {
            max_attempts: max_attempts(&cfg),
            ..cfg
        },
        brokers: on,
    };
    if json {
        let mut v = group_json(&info);
        // `{"group": NAME, ...}` like `topic create`'s `{"topic": NAME, ...}`.
        if let Some(o) = v.as_object_mut() {
            o.remove("name");
            o.insert("group".into(), json!(info.name));
        }
        println!("{}", json_line(&v));
    } else {
        let verb = if update { "updated" } else { "created" };
        let c = &info.config;
        println!(
            "{verb} group {} (max attempts {}, retry {}{}) on {}",
            info.name,
            c.max_attempts,
            retry_words(&c.retry_delays_ms),
            if c.fifo { ", fifo" } else { "" },
            info.brokers.join(", ")
        );
    }
    Ok(())
}

/// The max attempts a config means (0: the default).
fn max_attempts(c: &GroupConfig) -> u32 {
    if c.max_attempts == 0 {
        MAX_ATTEMPTS_DEFAULT
    } else {
        c.max_attempts
    }
}

/// `group list --json`'s entry: `{"name","max_attempts","retry_delays_ms","fifo","brokers"}`
/// (`retry_delays_ms` empty: the default ladder).
/// One group as `group list --json` shows it.
pub(crate) fn group_json(g: &GroupInfo) -> Value {
    json!({
        "name": g.name,
        "max_attempts": max_attempts(&g.config),
        "retry_delays_ms": g.config.retry_delays_ms,
        "fifo": g.config.fifo,
        "brokers": g.brokers,
    })
}

fn group_row(g: &GroupInfo) -> Vec<String> {
    vec![
        g.name.clone(),
        max_attempts(&g.config).to_string(),
        retry_words(&g.config.retry_delays_ms),
        if g.config.fifo { "yes" } else { "no" }.to_string(),
        g.brokers.join(","),
    ]
}

/// `1s,5s,30s`, or `default` for the default ladder.
fn retry_words(delays_ms: &[u64]) -> String {
    if delays_ms.is_empty() {
        return "default".into();
    }
    delays_ms
        .iter()
        .map(|d| duration_words(*d))
        .collect::<Vec<_>>()
        .join(",")
}

/// Milliseconds in the largest unit that divides them: `500ms`, `90s`, `2m`, `1h`.
fn duration_words(ms: u64) -> String {
    match ms {
        0 => "0ms".into(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1_000) => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

/// `group status GROUP --json`: per queue the committed offset, lag and who reads it (DESIGN.md
/// states the fields). Each figure comes from the leader of the queue's broker group.
pub async fn status_value(admin: &Admin, group: &str, topic: Option<&str>) -> Result<Value> {
    let answers = admin.group_status(group, topic).await?;
    let mut members: Vec<String> = answers
        .iter()
        .flat_map(|a| a.reply.members.iter().cloned())
        .collect();
    members.sort();
    members.dedup();
    let pop = answers.iter().any(|a| a.reply.pop);
    // Who reads which queue: the members' own averaged allocation over the topic's route.
    let mut reader: BTreeMap<(String, String, u32), String> = BTreeMap::new();
    if !members.is_empty() {
        let topics: BTreeSet<&str> = answers
            .iter()
            .flat_map(|a| a.reply.queues.iter().map(|q| q.topic.as_str()))
            .collect();
        for t in topics {
            let Ok(route) = admin.route(t).await else {
                continue;
            };
            let all = route.queues();
            for m in &members {
                for q in allocate_averagely(&all, &members, m) {
                    reader.insert((t.to_string(), q.broker, q.queue), m.clone());
                }
            }
        }
    }
    let mut total_lag = 0;
    let mut brokers = Vec::new();
    for a in &answers {
        let r = &a.reply;
        let queues: Vec<Value> = r
            .queues
            .iter()
            .map(|q| {
                let lag = q.lag;
                total_lag += lag;
                let lag_ms = q
                    .oldest_unconsumed_ms
                    .filter(|_| lag > 0)
                    .map(|at| r.now_ms.saturating_sub(at));
                let member = reader.get(&(q.topic.clone(), a.broker.clone(), q.queue));
                let mut v = json!({
                    "topic": q.topic,
                    "queue": q.queue,
                    "min_offset": q.min_offset,
                    "max_offset": q.max_offset,
                    "committed_offset": q.committed_offset,
                    "lag": lag,
                    "lag_ms": lag_ms,
                    "member": member,
                    "last_commit_ms": q.last_commit_ms,
                });
                if r.pop
                    && let Some(o) = v.as_object_mut()
                {
                    o.insert("pop_next".into(), json!(q.pop_next));
                    o.insert("ready".into(), json!(q.ready));
                    o.insert("inflight".into(), json!(q.inflight));
                    o.insert("retrying".into(), json!(q.retrying));
                    o.insert("dead_letter_waiting".into(), json!(q.dead_letter_waiting));
                }
                v
            })
            .collect();
        brokers.push(json!({
            "name": a.broker,
            "leader_id": a.leader_id,
            "leader": a.leader,
            "now_ms": r.now_ms,
            "queues": queues,
            "dead_lettered": r.dead_lettered,
        }));
    }
    Ok(json!({
        "group": group,
        "pop": pop,
        "members": members,
        "brokers": brokers,
        "lag": total_lag,
    }))
}

/// `group status` as a table: one row per queue, POP columns for a POP group.
fn status_table(v: &Value) -> String {
    let pop = v["pop"].as_bool().unwrap_or(false);
    let mut header = vec![
        "BROKER",
        "TOPIC",
        "QUEUE",
        "COMMITTED",
        "MAX",
        "LAG",
        "LAG_AGE",
        "MEMBER",
        "LAST_COMMIT",
    ];
    if pop {
        header.extend(["READY", "INFLIGHT", "RETRYING", "DLQ_WAIT"]);
    }
    let mut rows = Vec::new();
    for (b, q) in each_queue(v) {
        let mut row = vec![
            b["name"].as_str().unwrap_or("-").to_string(),
            q["topic"].as_str().unwrap_or("-").to_string(),
            cell(&q["queue"]),
            cell(&q["committed_offset"]),
            cell(&q["max_offset"]),
            cell(&q["lag"]),
            age_ms(q["lag_ms"].as_u64()),
            q["member"].as_str().unwrap_or("-").to_string(),
            time_ms(q["last_commit_ms"].as_u64()),
        ];
        if pop {
            row.extend(
                ["ready", "inflight", "retrying", "dead_letter_waiting"].map(|k| cell(&q[k])),
            );
        }
        rows.push(row);
    }
    let dlq: u64 = v["brokers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["dead_lettered"].as_u64())
        .sum();
    let members = v["members"].as_array().map_or(0, Vec::len);
    format!(
        "group {}{}: lag {}, {} member(s) connected, {} dead-lettered\n{}",
        v["group"].as_str().unwrap_or("-"),
        if pop { " (POP)" } else { "" },
        cell(&v["lag"]),
        members,
        dlq,
        table(&header, &rows)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::parse_duration_ms;

    #[test]
    fn durations_read_back_as_they_are_written() {
        for text in ["500ms", "1s", "90s", "2m", "1h", "25h", "1500ms"] {
            assert_eq!(duration_words(parse_duration_ms(text).unwrap()), text);
        }
        assert_eq!(retry_words(&[]), "default");
        assert_eq!(retry_words(&[1_000, 5_000, 60_000]), "1s,5s,1m");
    }

    #[test]
    fn group_json_and_row_shapes() {
        let g = GroupInfo {
            name: "g1".into(),
            config: GroupConfig {
                name: "g1".into(),
                max_attempts: 0,
                retry_delays_ms: vec![1_000, 30_000],
                fifo: true,
            },
            brokers: vec!["broker-a".into(), "broker-b".into()],
        };
        assert_eq!(
            group_json(&g),
            json!({
                "name": "g1",
                "max_attempts": 16,
                "retry_delays_ms": [1000, 30000],
                "fifo": true,
                "brokers": ["broker-a", "broker-b"],
            })
        );
        assert_eq!(
            group_row(&g),
            vec!["g1", "16", "1s,30s", "yes", "broker-a,broker-b"]
        );
    }
}
