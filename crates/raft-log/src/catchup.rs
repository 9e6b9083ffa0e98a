//! Telling a member that is catching up from one that merely trails by an append or two, and how
//! fast it is catching up. Plain structures that take the current time.
//!
//! A replica *catches up* from the moment it is more than [`CATCH_UP_ENTER_ENTRIES`] entries
//! behind its target (the commit index its leader sent it, or on the leader the group's commit
//! index) until it holds the target. A replica catching up cannot win an election (it lacks
//! committed entries, which every majority holds), so it does not campaign; it is not ready.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Entries behind its target from which a replica counts as catching up. A healthy follower under
/// load trails by the entries in flight (a handful); a restarted or wiped one by thousands.
pub const CATCH_UP_ENTER_ENTRIES: u64 = 64;
/// The window over which a catch-up rate is measured.
pub const RATE_WINDOW: Duration = Duration::from_secs(3);

const _: () = assert!(CATCH_UP_ENTER_ENTRIES >= 8);

/// A catch-up in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatchUp {
    /// Last index held when it began.
    pub from: u64,
    /// Last index held now.
    pub at: u64,
    /// The index to reach.
    pub target: u64,
    /// Bytes a second the replica has been receiving lately (over [`RATE_WINDOW`]).
    pub bytes_per_sec: u64,
}

impl CatchUp {
    /// How far it has come, 0–100.
    pub fn progress_pct(&self) -> f64 {
        let span = self.target.saturating_sub(self.from);
        if span == 0 {
            return 100.0;
        }
        (self.at.saturating_sub(self.from) as f64 * 100.0 / span as f64).clamp(0.0, 100.0)
    }
}

/// A byte counter's rate over the last [`RATE_WINDOW`].
#[derive(Debug, Default, Clone)]
pub struct Rate {
    samples: VecDeque<(Instant, u64)>,
}

impl Rate {
    pub fn observe(&mut self, now: Instant, total: u64) {
        if self.samples.back().is_some_and(|(_, t)| total < *t) {
            // The counter went back (a purge shrank the log): start again.
            self.samples.clear();
        }
        self.samples.push_back((now, total));
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= RATE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    pub fn per_sec(&self) -> f64 {
        match (self.samples.front(), self.samples.back()) {
            (Some((t0, b0)), Some((t1, b1))) if t1 > t0 => {
                (b1 - b0) as f64 / t1.duration_since(*t0).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

/// Follows one replica: whether it is catching up, from where, and how fast.
#[derive(Debug, Default, Clone)]
pub struct Tracker {
    from: Option<u64>,
    rate: Rate,
}

impl Tracker {
    /// Bytes a second the replica has been receiving lately.
    pub fn rate(&self) -> f64 {
        self.rate.per_sec()
    }

    /// `last`: the last index the replica holds; `target`: the index it must reach; `bytes`: a
    /// counter of the bytes it has received. Returns the catch-up while one is in progress.
    pub fn observe(&mut self, now: Instant, last: u64, target: u64, bytes: u64) -> Option<CatchUp> {
        self.rate.observe(now, bytes);
        match self.from {
            None if target > last + CATCH_UP_ENTER_ENTRIES => self.from = Some(last),
            Some(_) if last >= target => self.from = None,
            _ => {}
        }
        let from = self.from?;
        Some(CatchUp {
            from,
            at: last,
            target,
            bytes_per_sec: self.rate.per_sec() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t01_a_replica_a_few_entries_behind_is_not_catching_up() {
        let mut t = Tracker::default();
        let now = Instant::now();
        assert_eq!(t.observe(now, 100, 104, 0), None);
        assert_eq!(t.observe(now, 100, 100 + CATCH_UP_ENTER_ENTRIES, 0), None);
    }

    #[test]
    fn t02_a_catch_up_lasts_until_the_target_is_reached_and_reports_progress_and_rate() {
        let mut t = Tracker::default();
        let t0 = Instant::now();
        let c = t.observe(t0, 0, 1000, 0).expect("catching up");
        assert_eq!(c.progress_pct(), 0.0);
        let c = t
            .observe(t0 + Duration::from_secs(1), 410, 1000, 100 << 20)
            .expect("still catching up");
        assert!((c.progress_pct() - 41.0).abs() < 1e-9);
        assert!(c.bytes_per_sec.abs_diff(100u64 << 20) <= 1);
        // Behind by fewer than the threshold is still catching up until the target is held.
        assert!(
            t.observe(t0 + Duration::from_secs(2), 990, 1000, 0)
                .is_some()
        );
        assert_eq!(t.observe(t0 + Duration::from_secs(3), 1000, 1000, 0), None);
        assert_eq!(t.observe(t0 + Duration::from_secs(3), 1000, 1010, 0), None);
    }

    #[test]
    fn t03_the_rate_forgets_samples_older_than_the_window() {
        let mut r = Rate::default();
        let t0 = Instant::now();
        r.observe(t0, 0);
        r.observe(t0 + Duration::from_secs(10), 1000);
        r.observe(t0 + Duration::from_secs(11), 1000);
        r.observe(t0 + Duration::from_secs(14), 1000);
        assert_eq!(r.per_sec(), 0.0);
        r.observe(t0 + Duration::from_secs(15), 2000);
        assert!(r.per_sec() > 0.0);
    }
}
