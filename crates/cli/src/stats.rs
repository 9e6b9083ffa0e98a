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

#[cfg(test)]
mod tests {
    use super::*;

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
