//! Prometheus metrics of the log, registered in the process-wide default registry.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts};

static FSYNC_SECONDS: LazyLock<Option<Histogram>> = LazyLock::new(|| {
    let h = Histogram::with_opts(
        HistogramOpts::new(
            "raftmq_log_fsync_seconds",
            "fdatasync latency of the Raft log",
        )
        .buckets(vec![
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
        ]),
    )
    .ok()?;
    prometheus::register(Box::new(h.clone())).ok()?;
    Some(h)
});

pub(crate) fn observe_fsync(d: Duration) {
    if let Some(h) = FSYNC_SECONDS.as_ref() {
        h.observe(d.as_secs_f64());
    }
}
