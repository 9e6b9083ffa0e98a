//! `raftmq node status NODE`: one node in depth, read from the node itself.

use anyhow::{Result, bail};
use raftmq_client::Admin;
use serde_json::{Value, json};

use crate::output::{age_ms, cell, table};

/// The address of `node` (an address, or a node id of `broker` or of the one group that has it).
async fn resolve(admin: &Admin, node: &str, broker: Option<&str>) -> Result<(String, String)> {
    let status = admin.cluster_status().await?;
    let nodes = status
        .clusters
        .iter()
        .flat_map(|c| &c.brokers)
        .flat_map(|b| {
            b.nodes
                .iter()
                .map(move |n| (b.name.clone(), n.node_id, n.address.clone()))
        });
    let matches: Vec<(String, u64, String)> = match node.parse::<u64>() {
        Ok(id) => nodes
            .filter(|(b, i, _)| *i == id && broker.is_none_or(|want| want == b))
            .collect(),
        Err(_) => nodes.filter(|(_, _, a)| a == node).collect(),
    };
    match matches.as_slice() {
        [(b, _, a)] => Ok((b.clone(), a.clone())),
        [] => bail!(
            "no node {node}{} is registered with the nameservers",
            broker.map_or(String::new(), |b| format!(" in {b}"))
        ),
        many => bail!(
            "node {node} is in several broker groups ({}); name one with --broker",
            many.iter()
                .map(|(b, _, _)| b.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `node status NODE --json` (README states the fields).
pub async fn status_value(admin: &Admin, node: &str, broker: Option<&str>) -> Result<Value> {
    let (broker, address) = resolve(admin, node, broker).await?;
    let s = admin.node_status(&address).await?;
    let config: Value = serde_json::from_str(&s.config_json).unwrap_or(Value::Null);
    let segments: Vec<Value> = s
        .segments
        .iter()
        .map(
            |g| json!({"first_index": g.first_index, "last_index": g.last_index, "bytes": g.bytes}),
        )
        .collect();
    let followers: Vec<Value> = s
        .peers
        .iter()
        .map(|p| {
            json!({
                "node_id": p.node_id,
                "address": p.address,
                "voter": p.voter,
                "matched_index": p.matched_index,
                "lag": p.lag,
                "last_ack_ms": p.last_ack_ms,
                "reachable": p.reachable,
                "bytes_per_sec": p.bytes_per_sec,
            })
        })
        .collect();
    Ok(json!({
        "broker": broker,
        "node_id": s.node_id,
        "address": s.address,
        "version": s.version,
        "uptime_ms": s.uptime_ms,
        "role": s.role,
        "term": s.term,
        "leader_id": s.leader.as_ref().map(|l| l.node_id),
        "ready": s.ready,
        "last_log_index": s.last_log_index,
        "committed": s.committed,
        "applied": s.applied,
        "snapshot_index": s.snapshot_index,
        "purged_index": s.purged_index,
        "flush_mode": s.flush_mode,
        "command_tags": s.command_tags,
        "group_command_tags": s.group_command_tags,
        "disk": {
            "log_bytes": s.log_disk_bytes,
            "used_pct": s.disk_used_pct,
            "clean_watermark_pct": s.clean_watermark_pct,
            "full_watermark_pct": s.full_watermark_pct,
            "full": s.disk_full,
        },
        "segments": segments,
        "followers": followers,
        "config": config,
    }))
}

/// `node status` for a person: the figures, the segments summed up, the followers as a table,
/// the config in effect.
pub fn status_text(v: &Value) -> String {
    let s = cell;
    let segs = v["segments"].as_array().cloned().unwrap_or_default();
    let seg_bytes: u64 = segs.iter().filter_map(|g| g["bytes"].as_u64()).sum();
    let seg_range = match (segs.first(), segs.last()) {
        (Some(a), Some(b)) => format!(
            ", entries {}..{}",
            s(&a["first_index"]),
            s(&b["last_index"])
        ),
        _ => String::new(),
    };
    let d = &v["disk"];
    let mut out = format!(
        "node {} of {} at {}: {} (term {}, leader {}), ready {}\n\
         version {}, up {}, flush {}, feature level {} (group {})\n\
         log: last {}, committed {}, applied {}; snapshot at {}, purged to {}\n\
         disk: log {} bytes; data disk {}% used (clean at {}%, full at {}%){}\n\
         sealed segments: {} ({} bytes{})\n",
        s(&v["node_id"]),
        s(&v["broker"]),
        s(&v["address"]),
        s(&v["role"]),
        s(&v["term"]),
        s(&v["leader_id"]),
        s(&v["ready"]),
        s(&v["version"]),
        age_ms(v["uptime_ms"].as_u64()),
        s(&v["flush_mode"]),
        s(&v["command_tags"]),
        s(&v["group_command_tags"]),
        s(&v["last_log_index"]),
        s(&v["committed"]),
        s(&v["applied"]),
        s(&v["snapshot_index"]),
        s(&v["purged_index"]),
        s(&d["log_bytes"]),
        d["used_pct"]
            .as_f64()
            .map_or("-".into(), |p| format!("{p:.1}")),
        s(&d["clean_watermark_pct"]),
        s(&d["full_watermark_pct"]),
        if d["full"] == true {
            ", FULL: sends refused"
        } else {
            ""
        },
        segs.len(),
        seg_bytes,
        seg_range,
    );
    let rows: Vec<Vec<String>> = v["followers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            vec![
                s(&p["node_id"]),
                s(&p["address"]),
                if p["voter"] == true {
                    "voter"
                } else {
                    "learner"
                }
                .into(),
                s(&p["matched_index"]),
                s(&p["lag"]),
                age_ms(p["last_ack_ms"].as_u64()),
                s(&p["reachable"]),
                s(&p["bytes_per_sec"]),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str("followers (as this leader sees them):\n");
        out.push_str(&table(
            &[
                "NODE",
                "ADDRESS",
                "KIND",
                "MATCHED",
                "LAG",
                "LAST_ACK",
                "REACHABLE",
                "BYTES/S",
            ],
            &rows,
        ));
    }
    out.push_str("config in effect:\n");
    out.push_str(&serde_json::to_string_pretty(&v["config"]).unwrap_or_default());
    out.push('\n');
    out
}
