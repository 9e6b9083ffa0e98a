//! Where one send's time goes, for `bench produce --local`: the nodes' own histograms (`GET
//! /metrics`, read before and after the run) split the client's round trip into its hops. Each
//! figure is a mean over the run, so the parts add up; the histograms' buckets give a median of
//! each (interpolated within a bucket). Only meaningful one message at a time (`--inflight 1`):
//! with many in flight, appends overlap and a mean is no longer one send's path.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::output::table;

/// The histograms read (seconds): the leader's send handler, the log's fsync, a follower's
/// append and the leader's replication round trip.
const SEND: &str = "raftmq_send_seconds";
const FSYNC: &str = "raftmq_log_fsync_seconds";
const APPEND: &str = "raftmq_raft_append_seconds";
const REPLICATE: &str = "raftmq_raft_replicate_seconds";
const NAMES: [&str; 4] = [SEND, FSYNC, APPEND, REPLICATE];

/// One histogram as Prometheus exposes it: cumulative bucket counts by upper bound, sum, count.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Histo {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histo {
    /// What was observed between `earlier` and `self`.
    fn since(&self, earlier: &Histo) -> Histo {
        let before = |le: f64| {
            earlier
                .buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, n)| *n)
        };
        Histo {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, n)| (le, n - before(le)))
                .collect(),
            sum: self.sum - earlier.sum,
            count: self.count - earlier.count,
        }
    }

    fn mean_us(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count * 1e6)
    }

    /// The median in microseconds, interpolated linearly within its bucket.
    fn p50_us(&self) -> Option<f64> {
        if self.count <= 0.0 {
            return None;
        }
        let half = self.count / 2.0;
        let (mut lo, mut below) = (0.0, 0.0);
        for &(le, n) in &self.buckets {
            if n >= half {
                if !le.is_finite() {
                    return Some(lo * 1e6);
                }
                let within = (n - below).max(1.0);
                return Some((lo + (le - lo) * (half - below) / within) * 1e6);
            }
            (lo, below) = (le, n);
        }
        None
    }
}

/// The histograms of one node, by name.
pub(crate) type NodeHistos = BTreeMap<String, Histo>;

/// Parses the histograms of [`NAMES`] out of a Prometheus text exposition.
pub(crate) fn parse(text: &str) -> NodeHistos {
    let mut out = NodeHistos::new();
    for line in text.lines() {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        for name in NAMES {
            let Some(rest) = key.strip_prefix(name) else {
                continue;
            };
            let h = out.entry(name.to_string()).or_default();
            if rest == "_sum" {
                h.sum = value;
            } else if rest == "_count" {
                h.count = value;
            } else if let Some(le) = rest
                .strip_prefix("_bucket{le=\"")
                .and_then(|r| r.strip_suffix("\"}"))
            {
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                h.buckets.push((le, value));
            }
        }
    }
    out
}

/// The body of `GET /metrics` from a node's plaintext port (HTTP/1.1); None when it cannot be
/// read within 5 s.
pub async fn metrics_text(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let read = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.ok()?;
        Some(String::from_utf8_lossy(&out).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()
        .flatten()
}

/// Every node's histograms, by node id.
pub(crate) async fn scrape_all(nodes: &[(u64, String)]) -> BTreeMap<u64, NodeHistos> {
    let mut out = BTreeMap::new();
    for (id, addr) in nodes {
        if let Some(text) = metrics_text(addr).await {
            out.insert(*id, parse(&text));
        }
    }
    out
}

/// One send's time, split: means (and medians) in microseconds over a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hops {
    pub leader: u64,
    /// Of the followers, the one whose appends took the less time (the one commits wait for).
    pub follower: u64,
    client: (f64, f64),
    send: (f64, f64),
    replicate: (f64, f64),
    append: (f64, f64),
    follower_fsync: (f64, f64),
    leader_fsync: (f64, f64),
}

fn pair(h: &Histo) -> Option<(f64, f64)> {
    Some((h.mean_us()?, h.p50_us()?))
}

/// Splits the run between `before` and `after`, given the client's mean and median round trip in
/// microseconds. The leader is the node whose send histogram moved; the follower, of those whose
/// append histogram moved, the one whose appends took the less time. The leader keeps one
/// replication histogram for both followers, so the round trip (and the network share taken from
/// it) is its mean over both: more than the faster follower's alone, which is all a commit waits
/// for.
pub(crate) fn split(
    before: &BTreeMap<u64, NodeHistos>,
    after: &BTreeMap<u64, NodeHistos>,
    client: (f64, f64),
) -> Option<Hops> {
    let delta = |id: u64, name: &str| -> Option<Histo> {
        let a = after.get(&id)?.get(name)?;
        let empty = Histo::default();
        let b = before.get(&id).and_then(|h| h.get(name)).unwrap_or(&empty);
        Some(a.since(b)).filter(|d| d.count > 0.0)
    };
    let leader = *after.keys().find(|id| delta(**id, SEND).is_some())?;
    let follower = after
        .keys()
        .filter(|id| **id != leader)
        .filter_map(|id| Some((*id, pair(&delta(*id, APPEND)?)?)))
        .min_by(|a, b| a.1.0.total_cmp(&b.1.0))?
        .0;
    Some(Hops {
        leader,
        follower,
        client,
        send: pair(&delta(leader, SEND)?)?,
        replicate: pair(&delta(leader, REPLICATE)?)?,
        append: pair(&delta(follower, APPEND)?)?,
        follower_fsync: pair(&delta(follower, FSYNC)?)?,
        leader_fsync: pair(&delta(leader, FSYNC)?)?,
    })
}

impl Hops {
    /// (what, mean µs, median µs or None for a difference of means, how it is measured).
    fn rows(&self) -> Vec<(&'static str, f64, Option<f64>, &'static str)> {
        let Hops {
            client,
            send,
            replicate,
            append,
            follower_fsync,
            leader_fsync,
            ..
        } = self;
        vec![
            ("client round trip", client.0, Some(client.1), "the bench"),
            (
                "  client <-> leader, gRPC both ways",
                client.0 - send.0,
                None,
                "round trip - leader's handler",
            ),
            (
                "  leader: send handler",
                send.0,
                Some(send.1),
                "raftmq_send_seconds",
            ),
            (
                "    leader outside replication",
                send.0 - replicate.0,
                None,
                "handler - replication",
            ),
            (
                "    replication round trip (both followers)",
                replicate.0,
                Some(replicate.1),
                "raftmq_raft_replicate_seconds",
            ),
            (
                "      leader <-> follower, both ways",
                replicate.0 - append.0,
                None,
                "replication - follower's append",
            ),
            (
                "      follower: append",
                append.0,
                Some(append.1),
                "raftmq_raft_append_seconds",
            ),
            (
                "        follower outside fsync",
                append.0 - follower_fsync.0,
                None,
                "append - fsync",
            ),
            (
                "        follower fsync",
                follower_fsync.0,
                Some(follower_fsync.1),
                "raftmq_log_fsync_seconds",
            ),
            (
                "    (leader fsync, alongside)",
                leader_fsync.0,
                Some(leader_fsync.1),
                "raftmq_log_fsync_seconds",
            ),
        ]
    }

    pub(crate) fn table(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .rows()
            .into_iter()
            .map(|(what, mean, p50, how)| {
                vec![
                    what.to_string(),
                    format!("{mean:.0}"),
                    p50.map_or_else(|| "-".into(), |p| format!("{p:.0}")),
                    how.to_string(),
                ]
            })
            .collect();
        format!(
            "where one send's time goes (leader {}, follower {}; microseconds):\n{}",
            self.leader,
            self.follower,
            table(&["STAGE", "MEAN", "P50", "FROM"], &rows)
        )
    }

    pub(crate) fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows()
            .into_iter()
            .map(|(what, mean, p50, how)| {
                json!({"stage": what.trim(), "mean_us": mean, "p50_us": p50, "from": how})
            })
            .collect();
        json!({"leader": self.leader, "follower": self.follower, "stages": rows})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(name: &str, buckets: &[(&str, u64)], sum: f64, count: u64) -> String {
        let mut s = format!("# HELP {name} x\n# TYPE {name} histogram\n");
        for (le, n) in buckets {
            s += &format!("{name}_bucket{{le=\"{le}\"}} {n}\n");
        }
        s + &format!("{name}_sum {sum}\n{name}_count {count}\n")
    }

    #[test]
    fn t01_parses_histograms_and_takes_the_median_within_its_bucket() {
        let text = exposition(
            FSYNC,
            &[("0.0001", 0), ("0.0002", 4), ("0.0004", 10), ("+Inf", 10)],
            0.0025,
            10,
        ) + "raftmq_other_total 3\n";
        let h = &parse(&text)[FSYNC];
        assert_eq!(h.count, 10.0);
        assert_eq!(h.buckets.len(), 4);
        assert_eq!(h.mean_us().map(|m| m.round()), Some(250.0));
        // 5 of 10 lies 1/6 of the way into (200 µs, 400 µs].
        let p50 = h.p50_us().unwrap();
        assert!((p50 - 233.3).abs() < 0.1, "{p50}");
        assert_eq!(parse(&text).len(), 1);
    }

    #[test]
    fn t02_splits_a_run_by_the_nodes_that_moved() {
        let node = |send: u64, append: (f64, u64), replicate: u64| {
            let syncs = send + append.1;
            let mut text = exposition(
                FSYNC,
                &[("0.001", syncs), ("+Inf", syncs)],
                0.0003 * syncs as f64,
                syncs,
            );
            text += &exposition(
                SEND,
                &[("0.001", send), ("+Inf", send)],
                0.0008 * send as f64,
                send,
            );
            text += &exposition(
                APPEND,
                &[("0.001", append.1), ("+Inf", append.1)],
                append.0 * append.1 as f64,
                append.1,
            );
            text += &exposition(
                REPLICATE,
                &[("0.001", replicate), ("+Inf", replicate)],
                0.0005 * replicate as f64,
                replicate,
            );
            parse(&text)
        };
        let before: BTreeMap<u64, NodeHistos> = [
            (1, node(0, (0.0, 0), 0)),
            (2, node(0, (0.0, 0), 0)),
            (3, node(0, (0.0, 0), 0)),
        ]
        .into();
        let after: BTreeMap<u64, NodeHistos> = [
            (1, node(0, (0.0004, 10), 0)),
            (2, node(10, (0.0, 0), 20)),
            (3, node(0, (0.0003, 10), 0)),
        ]
        .into();
        let hops = split(&before, &after, (1000.0, 950.0)).unwrap();
        assert_eq!((hops.leader, hops.follower), (2, 3));
        let rows = hops.rows();
        let mean = |what: &str| rows.iter().find(|r| r.0.trim() == what).unwrap().1.round();
        assert_eq!(mean("client <-> leader, gRPC both ways"), 200.0);
        assert_eq!(mean("leader outside replication"), 300.0);
        assert_eq!(mean("leader <-> follower, both ways"), 200.0);
        assert_eq!(mean("follower outside fsync"), 0.0);
        // Nothing moved between two readings: no split.
        assert_eq!(split(&after, &after, (1.0, 1.0)), None);
    }
}
