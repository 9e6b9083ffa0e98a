//! Folds openraft's commit notices into the append that follows them.
//!
//! When the leader's commit index moves and it has no new entry to send, openraft's pipelined
//! replication sends each follower an entry-less append that only carries the new commit index
//! (a *commit notice*). One message at a time, that is a second append per send: each follower
//! wakes, decodes it, runs it through Raft and answers, and the leader reads two more answers,
//! all on the cores the next send needs (strace of a leader one send at a time: 5.2 `writev` per
//! send, two of them commit notices written before the reply to the producer).
//!
//! With `raft.commit_notice_hold_us` above 0 (off by default), a notice is held that long at
//! most. If the next append of the stream follows from the same point under the same vote, it
//! carries a commit index at least as new, so the notice is dropped and the append goes alone;
//! a newer notice replaces a held one. When the hold runs out (the producer paused) the notice
//! goes out as it was. Nothing else is delayed: an
//! append with entries, and the first request of a stream (a probe, whose answer openraft waits
//! for), go out at once.
//!
//! Why dropping is safe: a notice's only content beyond the stream position is its commit index.
//! The answer to the later append acknowledges everything up to its last entry, and openraft's
//! in-flight queue drains every request at or below an acknowledged log id, so no answer is
//! missed. A follower learns a commit at most the hold later than before, which delays only
//! what it applies (reads it serves), never what the leader commits or answers: a client that
//! writes through the leader and at once reads a follower (a new user, a new topic) may find
//! the follower that much behind. Hence off by default.

use std::time::Duration;

use futures::stream::{Stream, StreamExt};
use openraft::raft::AppendEntriesRequest;
use tokio::time::Instant;

use crate::types::TypeConfig;

type Req = AppendEntriesRequest<TypeConfig>;

/// True when `later` makes the entry-less `held` redundant: same vote, same position, and a
/// commit index at least as new.
fn absorbs(later: &Req, held: &Req) -> bool {
    held.entries.is_empty()
        && later.vote == held.vote
        && later.prev_log_id == held.prev_log_id
        && later.leader_commit >= held.leader_commit
}

struct Fold<S> {
    input: S,
    hold: Duration,
    /// No request has come yet (the first one is never held).
    first: bool,
    /// A held notice and when its hold ends.
    held: Option<(Req, Instant)>,
    /// A request to send right after the held notice that could not be folded into it.
    ready: Option<Req>,
    /// The input ended.
    done: bool,
}

impl<S: Stream<Item = Req> + Unpin> Fold<S> {
    async fn next(&mut self) -> Option<Req> {
        if self.hold.is_zero() {
            return self.input.next().await;
        }
        if let Some(r) = self.ready.take() {
            return Some(r);
        }
        loop {
            if self.done {
                return self.held.take().map(|(r, _)| r);
            }
            let got = match &self.held {
                Some((_, until)) => tokio::select! {
                    r = self.input.next() => Some(r),
                    _ = tokio::time::sleep_until(*until) => None,
                },
                None => Some(self.input.next().await),
            };
            let req = match got {
                // The hold ran out: the notice goes as it is.
                None => return self.held.take().map(|(r, _)| r),
                Some(None) => {
                    self.done = true;
                    continue;
                }
                Some(Some(req)) => req,
            };
            let first = std::mem::replace(&mut self.first, false);
            match self.held.take() {
                Some((held, until)) if absorbs(&req, &held) => {
                    crate::metrics::note_commit_notice_folded();
                    if req.entries.is_empty() {
                        self.held = Some((req, until));
                        continue;
                    }
                    return Some(req);
                }
                Some((held, _)) => {
                    self.ready = Some(req);
                    return Some(held);
                }
                None if !first && req.entries.is_empty() => {
                    self.held = Some((req, Instant::now() + self.hold));
                }
                None => return Some(req),
            }
        }
    }
}

/// `input` with its commit notices folded into the appends after them (see the module docs);
/// `input` as it is when `hold` is zero.
pub fn fold_commit_notices<S>(input: S, hold: Duration) -> impl Stream<Item = Req> + Send + Unpin
where
    S: Stream<Item = Req> + Send + Unpin + 'static,
{
    let fold = Fold {
        input,
        hold,
        first: true,
        held: None,
        ready: None,
        done: false,
    };
    Box::pin(futures::stream::unfold(fold, |mut f| async move {
        f.next().await.map(|r| (r, f))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Entry, EntryPayload, LogId, Vote};

    fn log_id(term: u64, index: u64) -> LogId {
        crate::types::log_id(term, 1, index)
    }

    /// An append from `prev` carrying `entries` new entries and commit index `commit`.
    fn append(term: u64, prev: u64, entries: u64, commit: u64) -> Req {
        AppendEntriesRequest {
            vote: Vote::new_committed(term, 1),
            prev_log_id: Some(log_id(term, prev)),
            leader_commit: Some(log_id(term, commit)),
            entries: (prev + 1..=prev + entries)
                .map(|i| Entry {
                    log_id: log_id(term, i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        }
    }

    /// (prev index, entries, commit index) of each request, to compare.
    fn shape(r: &Req) -> (u64, usize, u64) {
        (
            r.prev_log_id.map_or(0, |l| l.index),
            r.entries.len(),
            r.leader_commit.map_or(0, |l| l.index),
        )
    }

    /// Feeds `steps` (a request, or a pause) and collects what comes out, with when.
    async fn run(steps: Vec<Result<Req, Duration>>) -> Vec<((u64, usize, u64), Duration)> {
        run_with(HOLD, steps).await
    }

    async fn run_with(
        hold: Duration,
        steps: Vec<Result<Req, Duration>>,
    ) -> Vec<((u64, usize, u64), Duration)> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let out = fold_commit_notices(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            hold,
        );
        let t0 = Instant::now();
        let collect = tokio::spawn(async move {
            out.map(|r| (shape(&r), t0.elapsed()))
                .collect::<Vec<_>>()
                .await
        });
        for s in steps {
            match s {
                Ok(r) => tx.send(r).unwrap(),
                Err(d) => tokio::time::sleep(d).await,
            }
        }
        drop(tx);
        collect.await.unwrap()
    }

    const MS: Duration = Duration::from_millis(1);
    const HOLD: Duration = Duration::from_millis(2);

    #[tokio::test(start_paused = true)]
    async fn t01_a_notice_rides_on_the_next_append() {
        // (Paused time moves in whole milliseconds.)
        let out = run(vec![
            Ok(append(1, 0, 1, 0)),
            Ok(append(1, 1, 0, 1)), // the notice of entry 1
            Err(MS),
            Ok(append(1, 1, 1, 1)), // entry 2 carries commit 1
            Ok(append(1, 2, 0, 2)),
            Ok(append(1, 2, 0, 2)), // a newer notice replaces the held one
            Err(MS),
            Ok(append(1, 2, 1, 2)),
        ])
        .await;
        assert_eq!(
            out,
            vec![
                ((0, 1, 0), Duration::ZERO),
                // Appends with entries are not delayed.
                ((1, 1, 1), MS),
                ((2, 1, 2), MS * 2),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn t02_a_notice_goes_alone_once_its_hold_runs_out() {
        let out = run(vec![
            Ok(append(1, 0, 1, 0)),
            Ok(append(1, 1, 0, 1)),
            Err(MS * 10),
            Ok(append(1, 1, 1, 1)),
        ])
        .await;
        assert_eq!(
            out,
            vec![
                ((0, 1, 0), Duration::ZERO),
                ((1, 0, 1), HOLD),
                ((1, 1, 1), MS * 10),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn t03_the_first_request_and_unrelated_ones_are_never_held_or_dropped() {
        let out = run(vec![
            // A probe opens the stream: sent at once.
            Ok(append(1, 5, 0, 5)),
            Ok(append(1, 5, 0, 6)),
            // Another position: the held notice goes first, then this one, both now.
            Ok(append(1, 6, 1, 6)),
            Ok(append(1, 7, 0, 7)),
            // A new vote does not absorb a notice of the old one.
            Ok(Req {
                vote: Vote::new_committed(2, 1),
                ..append(1, 7, 1, 7)
            }),
        ])
        .await;
        let shapes: Vec<_> = out.iter().map(|o| (o.0, o.1)).collect();
        assert_eq!(
            shapes,
            vec![
                ((5, 0, 5), Duration::ZERO),
                ((5, 0, 6), Duration::ZERO),
                ((6, 1, 6), Duration::ZERO),
                ((7, 0, 7), Duration::ZERO),
                ((7, 1, 7), Duration::ZERO),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn t04_a_held_notice_is_sent_when_the_stream_ends() {
        let out = run(vec![Ok(append(1, 0, 1, 0)), Ok(append(1, 1, 0, 1))]).await;
        assert_eq!(
            out,
            vec![((0, 1, 0), Duration::ZERO), ((1, 0, 1), Duration::ZERO)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn t05_a_zero_hold_folds_nothing() {
        let out = run_with(
            Duration::ZERO,
            vec![
                Ok(append(1, 0, 1, 0)),
                Ok(append(1, 1, 0, 1)),
                Ok(append(1, 1, 1, 1)),
            ],
        )
        .await;
        let shapes: Vec<_> = out.iter().map(|o| o.0).collect();
        assert_eq!(shapes, vec![(0, 1, 0), (1, 0, 1), (1, 1, 1)]);
    }
}
