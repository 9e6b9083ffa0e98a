//! `raftmq produce`: generated messages (`--count N --size BYTES`) or one per line of stdin.
//!
//! Up to `--inflight` messages await acknowledgement at once; the producer batches them. Each
//! message retries through leader changes until `--timeout-ms`; the command fails (non-zero) if
//! any message could not be acknowledged.

use std::time::Duration;

use anyhow::{Result, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use raftmq_client::{Message, Producer};
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

pub async fn run(nameserver: &str, json: bool, args: ProduceArgs) -> Result<()> {
    let producer = Producer::builder(nameserver)
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
}
