//! Latency statistics for the benchmarks: nearest-rank percentiles over recorded samples.

use std::time::Duration;

use serde::Serialize;

/// Summary of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencySummary {
    pub count: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// The nearest-rank `p` percentile (0 < p ≤ 100) of sorted samples; `None` when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Sorts the samples and summarises them; all zero when there are none.
pub fn summarize(samples: &mut [Duration]) -> LatencySummary {
    samples.sort_unstable();
    let at = |p| percentile(samples, p).map_or(0.0, ms);
    let total: Duration = samples.iter().sum();
    LatencySummary {
        count: samples.len(),
        mean_ms: if samples.is_empty() {
            0.0
        } else {
            ms(total) / samples.len() as f64
        },
        p50_ms: at(50.0),
        p99_ms: at(99.0),
        p999_ms: at(99.9),
        max_ms: samples.last().copied().map_or(0.0, ms),
    }
}

/// Throughput figures of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Throughput {
    pub messages: u64,
    pub seconds: f64,
    pub msgs_per_sec: f64,
    pub mb_per_sec: f64,
}

pub fn throughput(messages: u64, bytes_each: usize, elapsed: Duration) -> Throughput {
    let secs = elapsed.as_secs_f64().max(1e-9);
    Throughput {
        messages,
        seconds: secs,
        msgs_per_sec: messages as f64 / secs,
        mb_per_sec: (messages as f64 * bytes_each as f64) / secs / 1_000_000.0,
    }
}

/// The machine's CPU time counters (the `cpu` line of `/proc/stat`), to tell what share of a
/// run's CPU time the hypervisor gave to other guests (steal): on a shared VM the same build's
/// figures swing with it, so a benchmark reports it beside its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every state's ticks added up (user, nice, system, idle, iowait, irq, softirq, steal).
    pub total: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// Now; `None` where `/proc/stat` is missing or unreadable.
    pub fn read() -> Option<CpuTimes> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Parses the aggregate `cpu` line of a `/proc/stat` text.
    pub fn parse(proc_stat: &str) -> Option<CpuTimes> {
        let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
        let steal = *ticks.get(7)?;
        Some(CpuTimes {
            total: ticks.iter().take(8).sum(),
            steal,
        })
    }

    /// Percent of the CPU time since `earlier` that was stolen; `None` when no time passed.
    pub fn steal_pct_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        let steal = self.steal.saturating_sub(earlier.steal);
        Some(100.0 * steal as f64 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_steal_share_from_proc_stat() {
        let before = CpuTimes::parse(
            "cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\nintr 1 2 3\n",
        )
        .unwrap();
        assert_eq!(before.total, 1000);
        assert_eq!(before.steal, 35);
        let after = CpuTimes::parse("cpu  160 0 70 900 10 0 5 135 0 0\n").unwrap();
        let pct = after.steal_pct_since(&before).unwrap();
        assert!((pct - 100.0 * 100.0 / 280.0).abs() < 1e-9, "{pct}");
        assert_eq!(before.steal_pct_since(&before), None);
        assert_eq!(CpuTimes::parse("intr 1 2\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 x 4\n"), None);
    }

    fn ms_vec(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s = ms_vec(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&s, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&s, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&s, 99.9), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&s, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&s, 0.0), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 50.0), None);
        let one = ms_vec(&[7]);
        assert_eq!(percentile(&one, 99.9), Some(Duration::from_millis(7)));
    }

    #[test]
    fn summary_sorts_and_averages() {
        let mut s = ms_vec(&[30, 10, 20]);
        let sum = summarize(&mut s);
        assert_eq!(sum.count, 3);
        assert!((sum.mean_ms - 20.0).abs() < 1e-9);
        assert!((sum.p50_ms - 20.0).abs() < 1e-9);
        assert!((sum.max_ms - 30.0).abs() < 1e-9);
        assert_eq!(summarize(&mut []).p99_ms, 0.0);
    }

    #[test]
    fn throughput_in_mb() {
        let t = throughput(1000, 1000, Duration::from_secs(2));
        assert!((t.msgs_per_sec - 500.0).abs() < 1e-9);
        assert!((t.mb_per_sec - 0.5).abs() < 1e-9);
    }
}
