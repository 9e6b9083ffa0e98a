//! `raftmq msg get|find`: where a message is and what it holds, from the indexes a broker group
//! keeps at apply time (by message id, by key, by store time), asked of each group's leader.

use anyhow::{Result, bail};
use raftmq_client::Admin;
use raftmq_proto::v1::{StoredMessage, TimeRange, find_messages_request};
use serde_json::{Map, Value, json};

use crate::args::MsgCmd;
use crate::output::{body_field, cell, json_line, table, time_ms};

/// What to look a message up by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum By {
    Id(String),
    Key(String),
    /// Stored between the two times, milliseconds since the epoch, both included.
    Time {
        from_ms: u64,
        to_ms: u64,
    },
}

/// The messages of `topic` found `by`, at most `limit`, each as `msg get --json` prints it.
pub async fn lookup(admin: &Admin, topic: &str, by: By, limit: u32) -> Result<Vec<Value>> {
    let by = match by {
        By::Id(id) => find_messages_request::By::MsgId(id),
        By::Key(k) => find_messages_request::By::Key(k),
        By::Time { from_ms, to_ms } => {
            find_messages_request::By::Stored(TimeRange { from_ms, to_ms })
        }
    };
    let found = admin.find_messages(topic, by, limit).await?;
    Ok(found
        .messages
        .iter()
        .map(|(broker, m)| message_json(topic, broker, m))
        .collect())
}

/// A found message as JSON: where it is, what it holds (`body` as text, or `body_base64`).
pub fn message_json(topic: &str, broker: &str, m: &StoredMessage) -> Value {
    let properties: Map<String, Value> = m
        .properties
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let (body_key, body) = body_field(&m.body);
    let mut v = json!({
        "topic": topic,
        "broker": broker,
        "queue": m.queue,
        "offset": m.offset,
        "msg_id": m.msg_id,
        "key": m.key,
        "tag": m.tag,
        "properties": properties,
        "store_ms": m.store_timestamp_ms,
        "bytes": m.body.len(),
    });
    if m.scheduled
        && let Some(o) = v.as_object_mut()
    {
        // Not delivered yet: no offset; readable from deliver_at_ms on.
        o.insert("scheduled".into(), json!(true));
        o.insert(
            "deliver_at_ms".into(),
            json!(
                m.properties
                    .get(raftmq_proto::DELIVER_AT_PROPERTY)
                    .and_then(|v| v.parse::<u64>().ok())
            ),
        );
    }
    if let Some(o) = v.as_object_mut() {
        o.insert(body_key.into(), json!(body));
    }
    v
}

/// A time given on the command line: RFC 3339 (`2026-12-04T10:00:00Z`) or milliseconds since the
/// epoch. `flag` names it in the error.
pub fn parse_time(flag: &str, s: &str) -> Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    match chrono::DateTime::parse_from_rfc3339(s) {
        Ok(t) if t.timestamp_millis() >= 0 => Ok(t.timestamp_millis() as u64),
        Ok(_) => bail!("{flag} {s:?} is before 1970"),
        Err(e) => bail!(
            "{flag} {s:?} is not a time ({e}): give RFC 3339 (2026-12-04T10:00:00Z) or \
             milliseconds since the epoch"
        ),
    }
}

pub async fn run(target: &crate::connect::Target, json: bool, cmd: MsgCmd) -> Result<()> {
    let admin = target.admin()?;
    let (topic, found) = match cmd {
        MsgCmd::Recall { topic, id } => {
            let (broker, at) = admin.recall(&topic, &id).await?;
            if json {
                println!(
                    "{}",
                    json_line(&json!({"topic": topic, "broker": broker, "msg_id": id,
                        "recalled": true, "deliver_at_ms": at}))
                );
            } else {
                println!(
                    "recalled {id} of topic {topic} on {broker} (it was due at {})",
                    time_ms(Some(at))
                );
            }
            return Ok(());
        }
        MsgCmd::Get { topic, id } => {
            let found = lookup(&admin, &topic, By::Id(id.clone()), 1).await?;
            if found.is_empty() {
                bail!("no message with id {id} in topic {topic}");
            }
            (topic, found)
        }
        MsgCmd::Find {
            topic,
            key,
            from,
            to,
            limit,
        } => {
            let by = match (key, from, to) {
                (Some(k), _, _) => By::Key(k),
                (None, Some(f), Some(t)) => {
                    let (from_ms, to_ms) = (parse_time("--from", &f)?, parse_time("--to", &t)?);
                    if from_ms > to_ms {
                        bail!("--to {t} is before --from {f}");
                    }
                    By::Time { from_ms, to_ms }
                }
                _ => bail!("name --key, or --from and --to"),
            };
            let found = lookup(&admin, &topic, by, limit).await?;
            (topic, found)
        }
    };
    if json {
        for m in &found {
            println!("{}", json_line(m));
        }
        return Ok(());
    }
    let s = cell;
    let rows: Vec<Vec<String>> = found
        .iter()
        .map(|m| {
            let body = m.get("body").map_or_else(
                || format!("({} bytes, not text)", s(&m["bytes"])),
                |b| abbreviate(&s(b), 60),
            );
            vec![
                s(&m["broker"]),
                s(&m["queue"]),
                s(&m["offset"]),
                time_ms(m["store_ms"].as_u64()),
                s(&m["msg_id"]),
                s(&m["key"]),
                s(&m["tag"]),
                body,
            ]
        })
        .collect();
    println!("topic {topic}: {} message(s)", rows.len());
    print!(
        "{}",
        table(
            &[
                "BROKER", "QUEUE", "OFFSET", "STORED", "MSG_ID", "KEY", "TAG", "BODY"
            ],
            &rows
        )
    );
    Ok(())
}

/// At most `max` characters of `s` on one line, with `…` when cut.
fn abbreviate(s: &str, max: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= max {
        one_line
    } else {
        one_line.chars().take(max - 1).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1. Times: RFC 3339 with any offset, or epoch milliseconds; anything else named once.
    #[test]
    fn t01_parse_time_takes_rfc3339_and_millis() {
        assert_eq!(
            parse_time("--from", "1700000000123").unwrap(),
            1_700_000_000_123
        );
        assert_eq!(
            parse_time("--from", "2026-12-04T10:00:00.5Z").unwrap(),
            1_796_378_400_500
        );
        assert_eq!(
            parse_time("--from", "2026-12-04T11:00:00+01:00").unwrap(),
            1_796_378_400_000
        );
        let e = parse_time("--to", "yesterday").unwrap_err().to_string();
        assert!(e.starts_with("--to \"yesterday\" is not a time"), "{e}");
        assert_eq!(e.matches("--to").count(), 1, "{e}");
    }

    /// 2. A long or multi-line body is shown on one line, cut with an ellipsis.
    #[test]
    fn t02_abbreviate_keeps_one_line() {
        assert_eq!(abbreviate("a\nb", 10), "a b");
        assert_eq!(abbreviate("abcdef", 4), "abc…");
    }
}
