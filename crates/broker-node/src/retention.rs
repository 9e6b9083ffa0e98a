//! Retention by age and by disk watermarks. The leader decides a trim point (a sealed segment's
//! last index) and replicates it as a `Trim` command; every node, once it has applied the trim,
//! snapshots its state and purges its log up to it. Above the full watermark a node refuses sends
//! with DISK_FULL until space is freed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use raftmq_raft_log::Role;

use crate::command::Command;
use crate::config::Retention;
use crate::node::Node;

/// The highest log index that may be trimmed now: every sealed segment older than the maximum age
/// (oldest first, stopping at the first young one), plus the oldest sealed segment when the disk is
/// above the clean watermark. Never past what has been applied. 0 = nothing to trim.
pub fn trim_point(
    sealed: &[(u64, u64, u64, Option<SystemTime>)],
    now: SystemTime,
    cfg: &Retention,
    disk_used_pct: f64,
    applied: u64,
) -> u64 {
    let mut upto = 0;
    for (_, last, _, mtime) in sealed {
        let old = mtime
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age.as_secs() >= cfg.max_age_secs);
        if !old {
            break;
        }
        upto = *last;
    }
    if disk_used_pct > cfg.clean_watermark_pct as f64
        && let Some((_, last, _, _)) = sealed.iter().find(|s| s.1 > upto)
    {
        upto = *last;
    }
    upto.min(applied)
}

/// Share of the data dir's file system in use, in percent.
pub fn disk_used_pct(path: &std::path::Path) -> Option<f64> {
    // As df computes it: used / (used + available to unprivileged users).
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = st.fragment_size() as f64;
    let used = (st.blocks() as f64 - st.blocks_free() as f64) * frag;
    let avail = st.blocks_available() as f64 * frag;
    (used + avail > 0.0).then(|| used / (used + avail) * 100.0)
}

pub fn spawn(node: Arc<Node>) {
    tokio::spawn(async move {
        let cfg = node.cfg.retention.clone();
        let mut tick = tokio::time::interval(Duration::from_millis(cfg.check_interval_ms));
        loop {
            tick.tick().await;
            let used = disk_used_pct(&node.cfg.data_dir).unwrap_or(0.0);
            node.disk_full
                .store(used > cfg.full_watermark_pct as f64, Ordering::Relaxed);
            let st = node.member.status();
            let trimmed = node.state_value(|s| s.trimmed_index);
            // Every node purges its own log once the trim is applied.
            if trimmed > st.purged
                && st.applied >= trimmed
                && let Err(e) = node.member.compact(trimmed).await
            {
                tracing::warn!(error = %e, trimmed, "log compaction failed; will retry");
            }
            if st.role != Role::Leader {
                continue;
            }
            let wanted = trim_point(
                &node.member.sealed_segments(),
                SystemTime::now(),
                &cfg,
                used,
                st.applied,
            );
            // Scheduled messages still waiting in entries retention would trim move to new
            // entries first (same times and ids); never past one still waiting (apply holds the
            // trim there too).
            if node
                .state_value(|s| s.timer.oldest_entry())
                .is_some_and(|o| o <= wanted)
            {
                let broker = crate::service::Broker { node: node.clone() };
                match broker.roll_upto(wanted).await {
                    Ok(n) if n > 0 => tracing::info!(
                        moved = n,
                        upto = wanted,
                        "scheduled messages moved ahead of the retention point"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "moving scheduled messages failed"),
                }
            }
            let held = node.state_value(|s| s.timer.oldest_entry().map(|o| o - 1));
            let upto = held.map_or(wanted, |h| h.min(wanted));
            if upto > trimmed {
                tracing::info!(upto, disk_used_pct = used, "retention trims the log");
                if let Err(e) = node
                    .member
                    .propose(
                        Command::Trim {
                            upto_log_index: upto,
                        }
                        .encode()
                        .into(),
                    )
                    .await
                {
                    tracing::warn!(error = %e, "retention trim not committed; will retry");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(
        first: u64,
        last: u64,
        age_secs: u64,
        now: SystemTime,
    ) -> (u64, u64, u64, Option<SystemTime>) {
        (
            first,
            last,
            1 << 20,
            Some(now - Duration::from_secs(age_secs)),
        )
    }

    #[test]
    fn trims_old_segments_in_order_and_early_above_the_clean_watermark() {
        let now = SystemTime::now();
        let cfg = Retention {
            max_age_secs: 100,
            clean_watermark_pct: 75,
            full_watermark_pct: 90,
            check_interval_ms: 1000,
        };
        let segs = vec![
            seg(1, 10, 500, now),
            seg(11, 20, 200, now),
            seg(21, 30, 50, now),
            seg(31, 40, 500, now),
        ];
        // The third is young: the (old) fourth is not trimmed past it.
        assert_eq!(trim_point(&segs, now, &cfg, 10.0, 100), 20);
        // Above the clean watermark, one more segment goes.
        assert_eq!(trim_point(&segs, now, &cfg, 80.0, 100), 30);
        // Never past the applied index.
        assert_eq!(trim_point(&segs, now, &cfg, 10.0, 15), 15);
        assert_eq!(trim_point(&[], now, &cfg, 99.0, 100), 0);
    }
}
