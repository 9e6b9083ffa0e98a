//! Prometheus metrics of the log, registered in the process-wide default registry. Besides the
//! fsync latency, the two ends of one replication step: what the follower spends on an append
//! (receipt to answer, its fsync included) and the round trip the leader sees. Together with the
//! broker's send latency they split one send's time into its hops (`bench produce --local`
//! prints that split).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounter};

/// Bucket bounds in seconds, fine below a millisecond where one fsync and one hop fall.
const BUCKETS: [f64; 15] = [
    0.00005, 0.0001, 0.00015, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0025, 0.005, 0.01,
    0.05, 0.1, 0.5,
];

const _: () = {
    let mut i = 1;
    while i < BUCKETS.len() {
        assert!(BUCKETS[i - 1] < BUCKETS[i], "buckets must increase");
        i += 1;
    }
};

fn histogram(name: &str, help: &str) -> Option<Histogram> {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec())).ok()?;
    prometheus::register(Box::new(h.clone())).ok()?;
    Some(h)
}

static FSYNC_SECONDS: LazyLock<Option<Histogram>> = LazyLock::new(|| {
    histogram(
        "raftmq_log_fsync_seconds",
        "fdatasync latency of the Raft log",
    )
});

static APPEND_SECONDS: LazyLock<Option<Histogram>> = LazyLock::new(|| {
    histogram(
        "raftmq_raft_append_seconds",
        "follower: an append carrying entries, from its arrival to its answer (fsync included)",
    )
});

static REPLICATE_SECONDS: LazyLock<Option<Histogram>> = LazyLock::new(|| {
    histogram(
        "raftmq_raft_replicate_seconds",
        "leader: an append carrying entries, from sending it to a follower to its answer",
    )
});

/// Bucket bounds in seconds of a checkpoint of the state: milliseconds to seconds.
const CHECKPOINT_BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

const _: () = {
    let mut i = 1;
    while i < CHECKPOINT_BUCKETS.len() {
        assert!(
            CHECKPOINT_BUCKETS[i - 1] < CHECKPOINT_BUCKETS[i],
            "buckets must increase"
        );
        i += 1;
    }
};

static CHECKPOINT_SECONDS: LazyLock<Option<HistogramVec>> = LazyLock::new(|| {
    let h = HistogramVec::new(
        HistogramOpts::new(
            "raftmq_state_checkpoint_seconds",
            "apply held up by a checkpoint of the state (kind: checkpoint, or image when it also \
             built a restart image)",
        )
        .buckets(CHECKPOINT_BUCKETS.to_vec()),
        &["kind"],
    )
    .ok()?;
    prometheus::register(Box::new(h.clone())).ok()?;
    Some(h)
});

/// A checkpoint of the state took `d` of apply's time; `image`: it also built a restart image.
pub(crate) fn observe_checkpoint(image: bool, d: Duration) {
    if let Some(h) = CHECKPOINT_SECONDS.as_ref() {
        h.with_label_values(&[if image { "image" } else { "checkpoint" }])
            .observe(d.as_secs_f64());
    }
}

fn observe(h: &LazyLock<Option<Histogram>>, d: Duration) {
    if let Some(h) = h.as_ref() {
        h.observe(d.as_secs_f64());
    }
}

pub(crate) fn observe_fsync(d: Duration) {
    observe(&FSYNC_SECONDS, d);
}

pub(crate) fn observe_append(d: Duration) {
    observe(&APPEND_SECONDS, d);
}

pub(crate) fn observe_replicate(d: Duration) {
    observe(&REPLICATE_SECONDS, d);
}

fn counter(name: &str, help: &str) -> Option<IntCounter> {
    let c = IntCounter::new(name, help).ok()?;
    prometheus::register(Box::new(c.clone())).ok()?;
    Some(c)
}

fn inc(c: &LazyLock<Option<IntCounter>>) {
    if let Some(c) = c.as_ref() {
        c.inc();
    }
}

static COMMIT_NOTICES_FOLDED: LazyLock<Option<IntCounter>> = LazyLock::new(|| {
    counter(
        "raftmq_raft_commit_notices_folded_total",
        "leader: entry-less commit notices dropped because the next append carried their commit",
    )
});

pub(crate) fn note_commit_notice_folded() {
    inc(&COMMIT_NOTICES_FOLDED);
}

static INLINE_ROUNDS: LazyLock<Option<IntCounter>> = LazyLock::new(|| {
    counter(
        "raftmq_log_inline_flush_rounds_total",
        "follower: lone appends made durable on the Raft task itself, without the flusher thread",
    )
});

pub(crate) fn note_inline_round() {
    inc(&INLINE_ROUNDS);
}
