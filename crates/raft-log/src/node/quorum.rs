//! CheckQuorum (as etcd's): is this leader cut off from a majority of its voters?
//!
//! openraft keeps a cut-off leader in its role until it hears a higher term; the broker watches
//! the decision made here to refuse sends at once instead of letting them wait for a commit that
//! cannot come. The decision is a plain function of what the leader last heard from each voter,
//! when its leadership began, the window and the current time; [`CheckQuorum`] only remembers when
//! the current leadership began. The task in [`super`] owns the clock and reads the metrics.
//!
//! The time type is generic so that the runtime passes openraft's instants (the clock its
//! heartbeat times are read on) and the tests plain `std` ones.

use std::ops::Sub;
use std::time::Duration;

use openraft::{RaftMetrics, ServerState, TokioInstant};

use crate::types::TypeConfig;

/// What the leader knows of one voter at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard<I> {
    /// The leader itself: always in contact.
    Me,
    /// Last heard from at this instant, in the current term.
    At(I),
    /// Not heard from in the current term (yet).
    Never,
}

/// True if the leader has heard from no majority of `voters` within `window` of `now`.
/// `leading_since` is when this leadership (this term) began: a voter not heard from yet counts
/// as in contact only while the leadership is younger than the window. A leader cut off right
/// after its election (say, just after a whole-group restart) must still notice, or its sends
/// wait for nothing.
pub(crate) fn is_cut_off<I>(voters: &[Heard<I>], leading_since: I, window: Duration, now: I) -> bool
where
    I: Copy + Ord + Sub<Output = Duration>,
{
    let age = |t: I| if t >= now { Duration::ZERO } else { now - t };
    let young = age(leading_since) <= window;
    let heard = voters
        .iter()
        .filter(|v| match v {
            Heard::Me => true,
            Heard::At(t) => age(*t) <= window,
            Heard::Never => young,
        })
        .count();
    heard * 2 <= voters.len()
}

/// Reads CheckQuorum's inputs from the metrics: the term while this member leads, and what it
/// heard from each voter (learners do not count).
pub(crate) fn read_metrics(m: &RaftMetrics<TypeConfig>) -> (Option<u64>, Vec<Heard<TokioInstant>>) {
    if m.state != ServerState::Leader {
        return (None, Vec::new());
    }
    let voters = m
        .membership_config
        .membership()
        .voter_ids()
        .map(|id| {
            if id == m.id {
                return Heard::Me;
            }
            match m.heartbeat.as_ref().and_then(|h| h.get(&id).cloned()) {
                Some(Some(t)) => Heard::At(*t),
                _ => Heard::Never,
            }
        })
        .collect();
    (Some(m.current_term), voters)
}

/// The state CheckQuorum keeps from one tick to the next: the term this member leads and when it
/// was first seen leading it.
#[derive(Debug)]
pub(crate) struct CheckQuorum<I> {
    window: Duration,
    leading: Option<(u64, I)>,
}

impl<I> CheckQuorum<I>
where
    I: Copy + Ord + Sub<Output = Duration>,
{
    /// `window`: how long a majority may stay silent before the leader counts as cut off.
    pub(crate) fn new(window: Duration) -> Self {
        CheckQuorum {
            window,
            leading: None,
        }
    }

    /// One tick. `leading_term` is the term while this member leads (None otherwise); `voters` is
    /// what it heard from each voter (unused when it does not lead). Returns whether it is cut off.
    pub(crate) fn tick(&mut self, leading_term: Option<u64>, voters: &[Heard<I>], now: I) -> bool {
        let Some(term) = leading_term else {
            self.leading = None;
            return false;
        };
        let since = match self.leading {
            Some((t, since)) if t == term => since,
            _ => {
                self.leading = Some((term, now));
                now
            }
        };
        is_cut_off(voters, since, self.window, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    const WINDOW: Duration = Duration::from_millis(1000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// When the leader last heard from a voter, in milliseconds before the instant judged
    /// (`Ago`) or before the leadership began (`Before`).
    #[derive(Clone, Copy)]
    enum V {
        Me,
        Ago(u64),
        Before(u64),
        Never,
    }

    /// [`WINDOW`] in milliseconds.
    const W: u64 = 1000;

    #[test]
    fn t01_t02_t04_a_leader_is_cut_off_when_its_majority_was_last_heard_past_the_window() {
        use V::*;
        assert_eq!(WINDOW, ms(W));
        // Each case: its name, how long after the leadership began it is judged, what the
        // leader heard from each voter, and the verdict.
        let cases: [(&str, u64, [V; 3], bool); 4] = [
            (
                "t01 itself and one of two peers, recently: 2 of 3",
                10_000,
                [Me, Ago(100), Ago(5_000)],
                false,
            ),
            (
                "t02 a majority silent past the window",
                10_000,
                [Me, Ago(W + 1), Ago(5_000)],
                true,
            ),
            (
                "t02 exactly at the window still counts as heard",
                10_000,
                [Me, Ago(W), Never],
                false,
            ),
            // A time from before this leadership (a stale reading) is judged by its age.
            (
                "t04 a young leadership excuses no voter heard long ago",
                100,
                [Me, Before(5_000), Before(5_000)],
                true,
            ),
        ];
        for (name, age, voters, cut_off) in cases {
            let t0 = Instant::now();
            let now = t0 + ms(age);
            let voters = voters.map(|v| match v {
                Me => Heard::Me,
                Ago(n) => Heard::At(now - ms(n)),
                Before(n) => Heard::At(t0 - ms(n)),
                Never => Heard::Never,
            });
            assert_eq!(is_cut_off(&voters, t0, WINDOW, now), cut_off, "{name}");
        }
    }

    #[test]
    fn t03_a_leadership_younger_than_the_window_counts_unheard_voters_as_in_contact() {
        let t0 = Instant::now();
        let voters = [Heard::Me, Heard::Never, Heard::Never];
        assert!(!is_cut_off(&voters, t0, WINDOW, t0 + ms(500)));
        assert!(!is_cut_off(&voters, t0, WINDOW, t0 + WINDOW));
        // Once it is older, voters never heard from in this term count as silent.
        assert!(is_cut_off(&voters, t0, WINDOW, t0 + WINDOW + ms(1)));
    }

    #[test]
    fn t05_a_single_voter_group_is_never_cut_off() {
        let t0 = Instant::now();
        assert!(!is_cut_off(&[Heard::Me], t0, WINDOW, t0 + ms(60_000)));
    }

    #[test]
    fn t06_in_a_two_voter_group_the_leader_alone_is_no_majority() {
        let t0 = Instant::now();
        let now = t0 + ms(10_000);
        assert!(is_cut_off(&[Heard::Me, Heard::Never], t0, WINDOW, now));
        assert!(!is_cut_off(&[Heard::Me, Heard::At(now)], t0, WINDOW, now));
    }

    #[test]
    fn t07_a_leader_outside_the_voters_needs_a_majority_of_them() {
        // While a membership change removes it, the leader is not among the voters it counts.
        let t0 = Instant::now();
        let now = t0 + ms(10_000);
        let voters = [Heard::At(now), Heard::At(now), Heard::Never];
        assert!(!is_cut_off(&voters, t0, WINDOW, now));
        let voters = [Heard::At(now), Heard::Never, Heard::Never];
        assert!(is_cut_off(&voters, t0, WINDOW, now));
    }

    #[test]
    fn t08_the_tracker_is_not_cut_off_while_it_does_not_lead() {
        let t0 = Instant::now();
        let mut q = CheckQuorum::new(WINDOW);
        let silent = [Heard::Me, Heard::Never, Heard::Never];
        assert!(!q.tick(None, &silent, t0));
        assert!(!q.tick(None, &silent, t0 + ms(60_000)));
    }

    #[test]
    fn t09_the_tracker_dates_a_leadership_from_the_first_tick_that_sees_it() {
        let t0 = Instant::now();
        let mut q = CheckQuorum::new(WINDOW);
        let silent = [Heard::Me, Heard::Never, Heard::Never];
        assert!(!q.tick(Some(3), &silent, t0));
        assert!(!q.tick(Some(3), &silent, t0 + WINDOW));
        assert!(q.tick(Some(3), &silent, t0 + WINDOW + ms(1)));
        // A new term is a new leadership: young again.
        assert!(!q.tick(Some(4), &silent, t0 + ms(5_000)));
        assert!(q.tick(Some(4), &silent, t0 + ms(6_001)));
        // Losing the lead forgets it: the next leadership starts afresh.
        assert!(!q.tick(None, &silent, t0 + ms(7_000)));
        assert!(!q.tick(Some(5), &silent, t0 + ms(7_100)));
    }

    #[test]
    fn t10_the_tracker_recovers_once_a_majority_answers_again() {
        let t0 = Instant::now();
        let mut q = CheckQuorum::new(WINDOW);
        let now = t0 + ms(5_000);
        assert!(!q.tick(Some(2), &[Heard::Me, Heard::Never, Heard::Never], t0));
        assert!(q.tick(Some(2), &[Heard::Me, Heard::At(t0), Heard::Never], now));
        assert!(!q.tick(Some(2), &[Heard::Me, Heard::At(now), Heard::Never], now));
    }

    #[test]
    fn t11_only_a_leader_reads_its_voters_and_learners_do_not_count() {
        use openraft::Instant as _;

        use crate::node::test_metrics::{lead, metrics};

        let m = metrics(1, ServerState::Follower, 3, &[1, 2, 3], &[4]);
        assert_eq!(read_metrics(&m), (None, Vec::new()));
        let now = TokioInstant::now();
        let mut m = metrics(1, ServerState::Leader, 3, &[1, 2, 3], &[4, 5]);
        lead(
            &mut m,
            &[
                (2, Some(1), Some(now)),
                (3, None, None),
                (4, Some(1), Some(now)),
                (5, None, None),
            ],
        );
        let (term, voters) = read_metrics(&m);
        assert_eq!(term, Some(3));
        assert_eq!(voters, [Heard::Me, Heard::At(now), Heard::Never]);
        // Two learners answering do not make up for two silent voters.
        let mut m = metrics(1, ServerState::Leader, 3, &[1, 2, 3], &[4, 5]);
        lead(
            &mut m,
            &[
                (2, None, None),
                (3, None, None),
                (4, Some(1), Some(now)),
                (5, Some(1), Some(now)),
            ],
        );
        let (_, voters) = read_metrics(&m);
        assert!(is_cut_off(&voters, now, WINDOW, now + WINDOW + ms(1)));
    }
}
