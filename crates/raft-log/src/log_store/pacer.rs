//! Paces the replication reads that go to disk: the log of a follower catching up (wiped,
//! restarted, added) is read from the segment files, while healthy followers are served from the
//! tail cache. While clients are writing to this leader, such reads are held to a byte rate so the
//! catch-up leaves the producers most of the machine; on an idle group they run unpaced.
//!
//! "Clients are writing" is read from the log itself: this member appended more than
//! [`BUSY_APPEND_BYTES_PER_SEC`] over the last [`SAMPLE`]. Only a leader reads for replication, and
//! a leader's appends are its clients' writes.
//!
//! The rate is never below [`CATCH_UP_GAIN`] times what the clients append: a follower reading
//! no faster than the log grows would never catch up: with the configured 64 MiB/s alone, clients
//! writing that much would keep a wiped follower behind for good. At twice the append rate a
//! follower gains at least that rate, so under a steady load it catches up in no longer than it
//! was away. Measured (`bench catchup --mode wipe --mb 1024 --load --size 4096`): under 59 MB/s of
//! load the follower read at 114–143 MB/s and was ready 32 s after its restart.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Appended bytes a second from which the group counts as busy.
pub const BUSY_APPEND_BYTES_PER_SEC: u64 = 1 << 20;
/// How often the append rate is sampled.
pub const SAMPLE: Duration = Duration::from_millis(500);

/// While busy, reads run at least this many times the bytes a second appended (see the module
/// docs): above 1, or a catch-up need not end.
pub const CATCH_UP_GAIN: u64 = 2;

const _: () = assert!(SAMPLE.as_millis() >= 100 && SAMPLE.as_millis() <= 2000);
const _: () = assert!(CATCH_UP_GAIN >= 2);

#[derive(Debug)]
struct State {
    sampled_at: Instant,
    appended_then: u64,
    busy: bool,
    /// Bytes a second appended over the last sample.
    appended_per_sec: f64,
    /// The earliest instant the next paced read may start.
    next_free: Instant,
}

/// See the module docs. Shared by the log store (counting appends) and its readers (pacing).
#[derive(Debug)]
pub struct Pacer {
    appended: AtomicU64,
    /// Bytes a second of disk reads while busy (0: never paced).
    busy_rate: AtomicU64,
    state: Mutex<State>,
}

impl Pacer {
    pub fn new(now: Instant) -> Pacer {
        Pacer {
            appended: AtomicU64::new(0),
            busy_rate: AtomicU64::new(0),
            state: Mutex::new(State {
                sampled_at: now,
                appended_then: 0,
                busy: false,
                appended_per_sec: 0.0,
                next_free: now,
            }),
        }
    }

    pub fn set_busy_rate(&self, bytes_per_sec: u64) {
        self.busy_rate.store(bytes_per_sec, Ordering::Relaxed);
    }

    pub fn note_appended(&self, bytes: u64) {
        self.appended.fetch_add(bytes, Ordering::Relaxed);
    }

    /// How long a disk read of `bytes` must wait before it starts (zero when idle or unpaced).
    pub fn delay_for(&self, bytes: u64, now: Instant) -> Duration {
        let rate = self.busy_rate.load(Ordering::Relaxed);
        let appended = self.appended.load(Ordering::Relaxed);
        let Ok(mut s) = self.state.lock() else {
            return Duration::ZERO;
        };
        let dt = now.saturating_duration_since(s.sampled_at);
        if dt >= SAMPLE {
            let per_sec = (appended - s.appended_then) as f64 / dt.as_secs_f64();
            s.busy = per_sec > BUSY_APPEND_BYTES_PER_SEC as f64;
            s.appended_per_sec = per_sec;
            s.sampled_at = now;
            s.appended_then = appended;
        }
        if !s.busy || rate == 0 {
            s.next_free = now;
            return Duration::ZERO;
        }
        let rate = (rate as f64).max(s.appended_per_sec * CATCH_UP_GAIN as f64);
        let start = s.next_free.max(now);
        s.next_free = start + Duration::from_secs_f64(bytes as f64 / rate);
        start - now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pacer held to `rate` that saw `appended` bytes over its first sample, and the instant
    /// that sample ends; the read that takes the sample (4 MiB) went unpaced, as a first read does.
    fn busy_after_one_sample(rate: u64, appended: u64) -> (Pacer, Instant) {
        let t0 = Instant::now();
        let p = Pacer::new(t0);
        p.set_busy_rate(rate);
        p.note_appended(appended);
        let t1 = t0 + SAMPLE;
        assert_eq!(p.delay_for(4 << 20, t1), Duration::ZERO);
        (p, t1)
    }

    #[test]
    fn t01_an_idle_group_reads_unpaced() {
        let t0 = Instant::now();
        let p = Pacer::new(t0);
        p.set_busy_rate(1 << 20);
        for i in 0..10 {
            assert_eq!(
                p.delay_for(4 << 20, t0 + SAMPLE * i),
                Duration::ZERO,
                "read {i}"
            );
        }
    }

    #[test]
    fn t02_while_clients_write_reads_are_held_to_the_rate() {
        // 10 MiB appended in the first sample: busy from the next read on.
        let (p, t1) = busy_after_one_sample(64 << 20, 10 << 20);
        // Each 4 MiB read then takes 1/16 s of the budget.
        let d = p.delay_for(4 << 20, t1);
        assert_eq!(d, Duration::from_millis(62) + Duration::from_micros(500));
        let d = p.delay_for(4 << 20, t1);
        assert_eq!(d, Duration::from_millis(125));
        // Clients stop: the next sample finds the group idle again.
        let t2 = t1 + SAMPLE;
        assert_eq!(p.delay_for(4 << 20, t2), Duration::ZERO);
    }

    #[test]
    fn t03_a_rate_of_zero_never_paces() {
        let t0 = Instant::now();
        let p = Pacer::new(t0);
        p.note_appended(1 << 30);
        assert_eq!(p.delay_for(64 << 20, t0 + SAMPLE), Duration::ZERO);
        assert_eq!(p.delay_for(64 << 20, t0 + SAMPLE), Duration::ZERO);
    }

    #[test]
    fn t04_reads_outpace_appends_above_the_configured_rate() {
        // 64 MiB appended over one 500 ms sample: 128 MiB/s, so reads may take 256 MiB/s.
        let (p, t1) = busy_after_one_sample(64 << 20, 64 << 20);
        let d = p.delay_for(4 << 20, t1);
        assert_eq!(d, Duration::from_micros(15_625), "4 MiB at 256 MiB/s");
        // A slower load (16 MiB/s, doubled: 32) leaves the configured 64 MiB/s in force.
        p.note_appended(8 << 20);
        let t2 = t1 + SAMPLE;
        let first = p.delay_for(4 << 20, t2);
        let second = p.delay_for(4 << 20, t2);
        assert_eq!(
            second - first,
            Duration::from_micros(62_500),
            "4 MiB at 64 MiB/s"
        );
    }
}
