//! `raftmq consume`: read as a member of a consumer group, print, commit on exit.
//!
//! Stops after `--max` messages or once nothing arrived for `--timeout-ms`; with `--follow` runs
//! until interrupted. Offsets of printed messages are committed on the way out.

use std::io::Write;
use std::time::Duration;

use anyhow::Result;
use raftmq_client::StartFrom;
use tokio::time::Instant;

use crate::args::{ConsumeArgs, From};
use crate::connect::Target;
use crate::output::{ConsumedJson, json_line};
use crate::signals::interrupted;

pub async fn run(target: &Target, json: bool, args: ConsumeArgs) -> Result<()> {
    let start = match args.from {
        From::Earliest => StartFrom::Earliest,
        From::Latest => StartFrom::Latest,
    };
    let mut consumer = target
        .consumer(&args.group, &args.topic)
        .start_from(start)
        .build()?;
    let idle = Duration::from_millis(args.timeout_ms);
    let mut last = Instant::now();
    let mut count = 0u64;
    let interrupt = interrupted();
    tokio::pin!(interrupt);
    loop {
        let want = match args.max {
            Some(max) if count >= max => break,
            Some(max) => (max - count).min(1024) as usize,
            None => 1024,
        };
        let wait = if args.follow {
            Duration::from_secs(1)
        } else {
            match idle.checked_sub(last.elapsed()) {
                Some(w) if !w.is_zero() => w,
                _ => break,
            }
        };
        let batch = tokio::select! {
            b = consumer.poll(want, wait) => b?,
            _ = &mut interrupt => break,
        };
        if batch.is_empty() {
            continue;
        }
        last = Instant::now();
        count += batch.len() as u64;
        let mut out = std::io::stdout().lock();
        for m in &batch {
            if json {
                writeln!(out, "{}", json_line(&ConsumedJson::from(m)))?;
            } else {
                writeln!(out, "{}", String::from_utf8_lossy(&m.body))?;
            }
        }
        out.flush()?;
    }
    consumer.close().await?;
    Ok(())
}
