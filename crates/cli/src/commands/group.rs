//! `raftmq group create|update|list|delete`: POP consumer groups, replicated config of each broker
//! group.

use anyhow::Result;
use raftmq_client::Admin;
use raftmq_client::admin::{GroupConfig, GroupInfo, MAX_ATTEMPTS_DEFAULT};
use serde_json::{Value, json};

use crate::args::{GroupArgs, GroupCmd};
use crate::output::{json_line, table};

pub async fn run(nameserver: &str, json: bool, cmd: GroupCmd) -> Result<()> {
    let admin = Admin::connect(nameserver)?;
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
fn group_json(g: &GroupInfo) -> Value {
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
