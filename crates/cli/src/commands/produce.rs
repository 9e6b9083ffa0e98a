//! `raftmq produce`: generated messages (`--count N --size BYTES`) or one per line of stdin.
//!
//! Up to `--inflight` messages await acknowledgement at once; the producer batches them. Each
//! message retries through leader changes until `--timeout-ms`; the command fails (non-zero) if
//! any message could not be acknowledged.

use std::time::Duration;

use anyhow::{Result, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use raftmq_client::Message;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::args::ProduceArgs;
use crate::output::{ProducedJson, json_line};

/// A generated body of exactly `size` bytes starting with `msg-{i}` (readable and unique).
pub fn generated_body(i: u64, size: usize) -> Vec<u8> {
    let mut b = format!("msg-{i}-").into_bytes();
    b.resize(size.max(b.len()), b'x');
    b.truncate(size);
    b
}

/// A duration on the command line: a number and a unit (`ms`, `s`, `m`, `h`, `d`), e.g. `30s`.
pub fn parse_duration_ms(flag: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(split);
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => 0,
    };
    match n.parse::<u64>() {
        Ok(n) if unit_ms > 0 => Ok(n.saturating_mul(unit_ms)),
        _ => bail!(
            "{flag} {s:?} is not a duration: give a number and a unit, e.g. 30s, 500ms, 5m, 2h, 1d"
        ),
    }
}

/// When message `i` of `n` is to be delivered, from the schedule flags; `None`: at once.
struct Schedule {
    at: Option<u64>,
    delay_ms: Option<u64>,
    spread_ms: u64,
}

impl Schedule {
    fn from_args(args: &ProduceArgs) -> Result<Schedule> {
        Ok(Schedule {
            at: match &args.deliver_at {
                Some(t) => Some(crate::commands::msg::parse_time("--deliver-at", t)?),
                None => None,
            },
            delay_ms: match &args.delay {
                Some(d) => Some(parse_duration_ms("--delay", d)?),
                None => None,
            },
            spread_ms: match &args.delay_spread {
                Some(d) => parse_duration_ms("--delay-spread", d)?,
                None => 0,
            },
        })
    }

    fn deliver_at(&self, i: u64, n: u64) -> Option<u64> {
        if let Some(at) = self.at {
            return Some(at);
        }
        let delay = self.delay_ms?;
        let spread = (self.spread_ms as u128 * i as u128 / n.max(1) as u128) as u64;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Some(now + delay + spread)
    }
}

pub async fn run(target: &crate::connect::Target, json: bool, args: ProduceArgs) -> Result<()> {
    let schedule = Schedule::from_args(&args)?;
    let producer = target
        .producer()
        .send_timeout(Duration::from_millis(args.timeout_ms))
        .build()?;
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(1024);
    let source = match args.count {
        Some(n) => {
            let size = args.size;
            tokio::spawn(async move {
                for i in 0..n {
                    if tx.send(generated_body(i, size)).await.is_err() {
                        break;
                    }
                }
                Ok(())
            })
        }
        None => tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Some(line) = lines.next_line().await? {
                if tx.send(line.into_bytes()).await.is_err() {
                    break;
                }
            }
            Ok::<(), std::io::Error>(())
        }),
    };
    let started = Instant::now();
    let mut inflight = FuturesUnordered::new();
    let (mut acked, mut failed, mut total) = (0u64, 0u64, 0u64);
    let mut first_error: Option<String> = None;
    let mut source_done = false;
    loop {
        tokio::select! {
            body = rx.recv(), if !source_done && inflight.len() < args.inflight.max(1) => {
                match body {
                    Some(body) => {
                        total += 1;
                        let mut m = Message::new(body);
                        if let Some(k) = &args.key {
                            m = m.with_key(k.clone());
                        }
                        if let Some(t) = &args.tag {
                            m = m.with_tag(t.clone());
                        }
                        if let Some(g) = &args.message_group {
                            m = m.message_group(g.clone());
                        }
                        if let Some(at) = schedule.deliver_at(total - 1, args.count.unwrap_or(1)) {
                            m = m.deliver_at_ms(at);
                        }
                        inflight.push(producer.send(&args.topic, m));
                    }
                    None => source_done = true,
                }
            }
            Some(r) = inflight.next(), if !inflight.is_empty() => match r {
                Ok(receipt) => {
                    acked += 1;
                    if json {
                        println!("{}", json_line(&ProducedJson::from(&receipt)));
                    }
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| e.to_string());
                }
            },
            else => break,
        }
        if source_done && inflight.is_empty() {
            break;
        }
    }
    drop(inflight);
    producer.close().await;
    match source.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => bail!("reading standard input: {e}"),
        Err(e) => bail!("message source failed: {e}"),
    }
    if failed > 0 {
        bail!(
            "{failed} of {total} messages were not acknowledged: {}",
            first_error.unwrap_or_default()
        );
    }
    if !json {
        let secs = started.elapsed().as_secs_f64();
        println!(
            "acknowledged {acked} messages to {} in {secs:.2} s ({:.0} msg/s)",
            args.topic,
            acked as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_bodies_have_the_requested_size() {
        assert_eq!(generated_body(7, 16), b"msg-7-xxxxxxxxxx".to_vec());
        assert_eq!(generated_body(12345, 4), b"msg-".to_vec());
        assert_eq!(generated_body(1, 1024).len(), 1024);
    }

    #[test]
    fn durations_parse_with_their_unit() {
        assert_eq!(parse_duration_ms("--delay", "30s").unwrap(), 30_000);
        assert_eq!(parse_duration_ms("--delay", "500ms").unwrap(), 500);
        assert_eq!(parse_duration_ms("--delay", "2h").unwrap(), 7_200_000);
        assert_eq!(parse_duration_ms("--delay", "1d").unwrap(), 86_400_000);
        let e = parse_duration_ms("--delay", "30").unwrap_err().to_string();
        assert!(e.contains("--delay \"30\" is not a duration"), "{e}");
        assert!(parse_duration_ms("--delay", "s").is_err());
    }
}
