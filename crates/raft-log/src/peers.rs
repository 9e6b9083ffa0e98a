//! What the leader knows of the link to each peer: reachable or not (with exponential backoff
//! between attempts to a peer that does not answer), and how many bytes of appends it answered.
//!
//! openraft retries a failed replication at once, and its own backoff is consumed only when a
//! request is generated: a peer whose connection is refused was dialled ~33,000 times a second,
//! each attempt logged. Here every attempt to a failing peer first waits out its backoff (the
//! second failure in a row waits [`BACKOFF_FIRST`], doubling up to [`BACKOFF_MAX`]), a change of
//! state is logged once, and a peer that stays unreachable gets one summary line every
//! [`SUMMARY_EVERY`]. The registry is a plain structure that takes the current time, shared by
//! every client of the member's network factory.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Delay before the attempt after the second consecutive failure; doubled after each further one.
pub const BACKOFF_FIRST: Duration = Duration::from_millis(20);
/// The longest wait between two attempts to a failing peer.
pub const BACKOFF_MAX: Duration = Duration::from_millis(1000);
/// Consecutive failures after which a peer counts (and is logged) as unreachable.
pub const UNREACHABLE_AFTER: u32 = 3;
/// How often a peer that stays unreachable is logged again, with what happened meanwhile.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(30);

const _: () = assert!(BACKOFF_FIRST.as_millis() >= 10 && BACKOFF_FIRST.as_millis() < 100);
const _: () = assert!(BACKOFF_MAX.as_millis() >= 500 && BACKOFF_MAX.as_millis() <= 2000);
const _: () = assert!(UNREACHABLE_AFTER >= 2);

/// The link to one peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerLink {
    /// Failures since the last answer.
    pub failures: u32,
    /// When the current run of failures began (None while the peer answers).
    pub failing_since: Option<Instant>,
    /// No attempt before this instant.
    pub next_try: Option<Instant>,
    /// The last failure's reason.
    pub last_error: String,
    /// Bytes of appends the peer has answered, in all.
    pub acked_bytes: u64,
    /// Attempts made since the last summary line.
    attempts_since_summary: u64,
    last_summary: Option<Instant>,
}

impl PeerLink {
    fn new() -> PeerLink {
        PeerLink {
            failures: 0,
            failing_since: None,
            next_try: None,
            last_error: String::new(),
            acked_bytes: 0,
            attempts_since_summary: 0,
            last_summary: None,
        }
    }

    pub fn reachable(&self) -> bool {
        self.failures < UNREACHABLE_AFTER
    }
}

/// The backoff after `failures` consecutive failures: none after one (a single timeout is retried
/// at once), then [`BACKOFF_FIRST`] doubling up to [`BACKOFF_MAX`].
pub fn backoff_after(failures: u32) -> Duration {
    if failures < 2 {
        return Duration::ZERO;
    }
    let shift = (failures - 2).min(16);
    BACKOFF_FIRST.saturating_mul(1 << shift).min(BACKOFF_MAX)
}

/// A line to log, decided by the registry (kept out of it so it stays testable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Unreachable {
        peer: u64,
        error: String,
    },
    StillUnreachable {
        peer: u64,
        for_secs: u64,
        attempts: u64,
        error: String,
    },
    Reachable {
        peer: u64,
        after_ms: u64,
        attempts: u32,
    },
}

impl Event {
    pub fn log(&self) {
        match self {
            Event::Unreachable { peer, error } => tracing::warn!(
                peer,
                "peer {peer} unreachable: {error}; retrying with backoff up to {BACKOFF_MAX:?}"
            ),
            Event::StillUnreachable {
                peer,
                for_secs,
                attempts,
                error,
            } => tracing::warn!(
                peer,
                "peer {peer} still unreachable after {for_secs} s ({attempts} attempts since the last report): {error}"
            ),
            Event::Reachable {
                peer,
                after_ms,
                attempts,
            } => tracing::info!(
                peer,
                "peer {peer} reachable again after {:.1} s ({attempts} failed attempts)",
                *after_ms as f64 / 1000.0
            ),
        }
    }
}

/// Every peer's link.
#[derive(Debug, Default)]
pub struct Links {
    links: BTreeMap<u64, PeerLink>,
}

impl Links {
    fn link(&mut self, peer: u64) -> &mut PeerLink {
        self.links.entry(peer).or_insert_with(PeerLink::new)
    }

    /// How long an attempt to `peer` must wait first (zero when it may go now).
    pub fn wait_before_attempt(&mut self, peer: u64, now: Instant) -> Duration {
        let l = self.link(peer);
        l.attempts_since_summary += 1;
        l.next_try
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// The peer answered; returns a line to log when it was unreachable.
    pub fn on_success(&mut self, peer: u64, now: Instant) -> Option<Event> {
        let l = self.link(peer);
        let event = (!l.reachable()).then(|| Event::Reachable {
            peer,
            after_ms: l
                .failing_since
                .map_or(0, |t| now.saturating_duration_since(t).as_millis() as u64),
            attempts: l.failures,
        });
        l.failures = 0;
        l.failing_since = None;
        l.next_try = None;
        l.attempts_since_summary = 0;
        l.last_summary = None;
        event
    }

    /// An attempt to `peer` failed; returns a line to log on a change of state or when a summary is
    /// due.
    pub fn on_failure(&mut self, peer: u64, error: &str, now: Instant) -> Option<Event> {
        let l = self.link(peer);
        l.failures = l.failures.saturating_add(1);
        l.failing_since.get_or_insert(now);
        l.next_try = Some(now + backoff_after(l.failures));
        l.last_error = error.to_string();
        if l.failures == UNREACHABLE_AFTER {
            l.last_summary = Some(now);
            l.attempts_since_summary = 0;
            return Some(Event::Unreachable {
                peer,
                error: error.to_string(),
            });
        }
        let due = l
            .last_summary
            .is_some_and(|t| now.saturating_duration_since(t) >= SUMMARY_EVERY);
        if !l.reachable() && due {
            let event = Event::StillUnreachable {
                peer,
                for_secs: l
                    .failing_since
                    .map_or(0, |t| now.saturating_duration_since(t).as_secs()),
                attempts: l.attempts_since_summary,
                error: error.to_string(),
            };
            l.last_summary = Some(now);
            l.attempts_since_summary = 0;
            return Some(event);
        }
        None
    }

    pub fn add_acked_bytes(&mut self, peer: u64, bytes: u64) {
        let l = self.link(peer);
        l.acked_bytes = l.acked_bytes.saturating_add(bytes);
    }

    pub fn get(&self, peer: u64) -> Option<&PeerLink> {
        self.links.get(&peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t01_backoff_starts_after_the_second_failure_and_doubles_to_the_cap() {
        assert_eq!(backoff_after(0), Duration::ZERO);
        assert_eq!(backoff_after(1), Duration::ZERO);
        assert_eq!(backoff_after(2), Duration::from_millis(20));
        assert_eq!(backoff_after(3), Duration::from_millis(40));
        assert_eq!(backoff_after(7), Duration::from_millis(640));
        assert_eq!(backoff_after(8), BACKOFF_MAX);
        assert_eq!(backoff_after(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn t02_unreachable_is_reported_once_then_summarised_then_recovered() {
        let mut links = Links::default();
        let t0 = Instant::now();
        let mut events = Vec::new();
        // A dead peer retried for 65 s at the backoff the registry asks for.
        let mut now = t0;
        let mut attempts = 0;
        while now < t0 + Duration::from_secs(65) {
            now += links.wait_before_attempt(2, now);
            attempts += 1;
            events.extend(links.on_failure(2, "connection refused", now));
            now += Duration::from_millis(1);
        }
        // Backoff bounds the attempts: about one a second once at the cap.
        assert!(attempts < 80, "{attempts} attempts in 65 s");
        assert!(matches!(events[0], Event::Unreachable { peer: 2, .. }));
        let summaries = events
            .iter()
            .filter(|e| matches!(e, Event::StillUnreachable { .. }))
            .count();
        assert_eq!(summaries, 2, "{events:?}");
        assert_eq!(events.len(), 3);
        assert!(!links.get(2).unwrap().reachable());
        let back = links.on_success(2, now).unwrap();
        assert!(
            matches!(back, Event::Reachable { peer: 2, after_ms, .. } if after_ms >= 64_000),
            "{back:?}"
        );
        assert!(links.get(2).unwrap().reachable());
        assert_eq!(links.wait_before_attempt(2, now), Duration::ZERO);
        assert_eq!(links.on_success(2, now), None);
    }

    #[test]
    fn t03_a_single_failure_is_retried_at_once_and_not_logged() {
        let mut links = Links::default();
        let now = Instant::now();
        assert_eq!(links.on_failure(3, "timeout", now), None);
        assert_eq!(links.wait_before_attempt(3, now), Duration::ZERO);
        assert!(links.get(3).unwrap().reachable());
        assert_eq!(links.on_success(3, now), None);
    }

    #[test]
    fn t04_acked_bytes_add_up_per_peer() {
        let mut links = Links::default();
        links.add_acked_bytes(2, 10);
        links.add_acked_bytes(2, 5);
        links.add_acked_bytes(3, 1);
        assert_eq!(links.get(2).unwrap().acked_bytes, 15);
        assert_eq!(links.get(3).unwrap().acked_bytes, 1);
    }
}
