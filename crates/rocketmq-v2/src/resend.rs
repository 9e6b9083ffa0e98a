//! A client's retry of a send is stored once.
//!
//! An official client whose SendMessage call times out (3 s by default) sends the same message
//! again, with the same message id, as a new call — while this front may still be carrying the
//! first through an election, or after the first was stored and only its reply was lost. Per
//! client message id the front keeps the send under way, and then its outcome, for [`KEEP`]
//! (at most [`IDS_MAX`] ids): a retry waits for that same send and gets its offsets instead of
//! storing the message a second time. The send runs as a task of its own, so a caller that gives
//! up does not cancel it.
//!
//! A send that ended in an error is forgotten: the next retry sends again. The front's own
//! retries of a batch (same producer id and sequence, deduplicated by the broker's producer
//! window) cover an outcome that was unknown for up to `SEND_RETRY_WINDOW`; a retry sent to
//! another access point, or to a restarted node, is not seen here.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::time::Instant;

use crate::codes::Error;
use crate::pb::Code;

/// How long an id is remembered after its send started.
pub const KEEP: Duration = Duration::from_secs(60);
/// Most ids remembered (the oldest go first): about 150 bytes each, so 15 MB at most.
pub const IDS_MAX: usize = 100_000;

/// The offsets of the messages one send stored, in order.
pub type Offsets = Result<Vec<u64>, Error>;
type Send = Shared<BoxFuture<'static, Offsets>>;

/// The sends of one front, by client message id.
#[derive(Default)]
pub struct Memo {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Id → (the send carrying it, its place in that send, the generation that put it there).
    by_id: HashMap<Arc<str>, (Send, usize, u64)>,
    /// Ids in the order they were put, for expiry.
    order: VecDeque<(Instant, Arc<str>, u64)>,
    generation: u64,
}

impl State {
    fn forget_old(&mut self, now: Instant) {
        while let Some((at, id, g)) = self.order.front() {
            if self.order.len() <= IDS_MAX && now.duration_since(*at) < KEEP {
                break;
            }
            if self.by_id.get(id).is_some_and(|e| e.2 == *g) {
                self.by_id.remove(id);
            }
            self.order.pop_front();
        }
    }
}

impl Memo {
    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }

    /// Whether no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The offsets of the messages whose client ids are `ids`, in order. A message whose id has
    /// a send under way, or one that stored it within [`KEEP`], gets that send's offset; the
    /// others (and every message without an id) are sent by `start`, given their places in
    /// `ids`, which returns their offsets in that order. `start`'s future runs as a task.
    pub async fn send<F>(&self, ids: &[String], start: F) -> Offsets
    where
        F: FnOnce(Vec<usize>) -> BoxFuture<'static, Offsets>,
    {
        let mut slots: Vec<Option<(Send, usize)>> = vec![None; ids.len()];
        let mut fresh = Vec::new();
        {
            let mut st = self.lock();
            st.forget_old(Instant::now());
            for (i, id) in ids.iter().enumerate() {
                let known = (!id.is_empty())
                    .then(|| st.by_id.get(id.as_str()))
                    .flatten()
                    .filter(|(send, _, _)| !matches!(send.peek(), Some(Err(_))));
                match known {
                    Some((send, at, _)) => slots[i] = Some((send.clone(), *at)),
                    None => fresh.push(i),
                }
            }
            if !fresh.is_empty() {
                let task = tokio::spawn(start(fresh.clone()));
                let send: Send = async move {
                    task.await.unwrap_or_else(|e| {
                        Err(Error::refused(
                            Code::InternalServerError,
                            format!("the send task failed: {e}"),
                        ))
                    })
                }
                .boxed()
                .shared();
                let now = Instant::now();
                for (k, &i) in fresh.iter().enumerate() {
                    slots[i] = Some((send.clone(), k));
                    if ids[i].is_empty() {
                        continue;
                    }
                    st.generation += 1;
                    let g = st.generation;
                    let id: Arc<str> = ids[i].as_str().into();
                    st.by_id.insert(id.clone(), (send.clone(), k, g));
                    st.order.push_back((now, id, g));
                }
                st.forget_old(now);
            }
        }
        let mut offsets = Vec::with_capacity(ids.len());
        for slot in slots {
            let (send, at) = slot.expect("every message has a send");
            let got = send.await?;
            offsets.push(got.get(at).copied().ok_or_else(|| {
                Error::refused(
                    Code::InternalServerError,
                    format!("a send returned {} offsets, not {}", got.len(), at + 1),
                )
            })?);
        }
        Ok(offsets)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A `start` that counts the messages it stores and gives them consecutive offsets after
    /// `delay`; fails instead when `fail` is set.
    fn storer(
        stored: Arc<AtomicUsize>,
        delay: Duration,
        fail: bool,
    ) -> impl FnOnce(Vec<usize>) -> BoxFuture<'static, Offsets> {
        move |idx: Vec<usize>| {
            async move {
                tokio::time::sleep(delay).await;
                if fail {
                    return Err(Error::refused(Code::ProxyTimeout, "no leader"));
                }
                let first = stored.fetch_add(idx.len(), Ordering::SeqCst) as u64;
                Ok((first..first + idx.len() as u64).collect())
            }
            .boxed()
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// 60. A retry that arrives while the first send is under way waits for it and gets the
    ///     same offset; the message is stored once. A caller that gives up does not cancel the
    ///     send.
    #[tokio::test]
    async fn t60_retry_during_the_send_gets_its_offset() {
        let memo = Arc::new(Memo::default());
        let stored = Arc::new(AtomicUsize::new(0));
        let m1 = memo.clone();
        let s1 = stored.clone();
        let first = tokio::spawn(async move {
            m1.send(
                &ids(&["A", "B"]),
                storer(s1, Duration::from_millis(200), false),
            )
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        first.abort(); // the client's deadline passed
        let again = memo
            .send(
                &ids(&["B", "A"]),
                storer(stored.clone(), Duration::ZERO, false),
            )
            .await
            .unwrap();
        assert_eq!(again, vec![1, 0], "each id its first send's offset");
        assert_eq!(stored.load(Ordering::SeqCst), 2, "stored once");
        assert_eq!(memo.len(), 2);
    }

    /// 61. A retry after the send stored the message (its reply lost) gets the stored offset; a
    ///     message with a new id, or with no id, is sent.
    #[tokio::test]
    async fn t61_retry_after_the_send_and_new_ids() {
        let memo = Memo::default();
        let stored = Arc::new(AtomicUsize::new(0));
        let s = || storer(stored.clone(), Duration::ZERO, false);
        assert_eq!(memo.send(&ids(&["A"]), s()).await.unwrap(), vec![0]);
        assert_eq!(
            memo.send(&ids(&["C", "A", ""]), s()).await.unwrap(),
            vec![1, 0, 2]
        );
        assert_eq!(memo.send(&ids(&[""]), s()).await.unwrap(), vec![3]);
        assert_eq!(stored.load(Ordering::SeqCst), 4);
    }

    /// 62. A send that failed is forgotten: the retry sends again.
    #[tokio::test]
    async fn t62_failed_send_is_sent_again() {
        let memo = Memo::default();
        let stored = Arc::new(AtomicUsize::new(0));
        let e = memo
            .send(&ids(&["A"]), storer(stored.clone(), Duration::ZERO, true))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::ProxyTimeout);
        let got = memo
            .send(&ids(&["A"]), storer(stored.clone(), Duration::ZERO, false))
            .await
            .unwrap();
        assert_eq!(got, vec![0]);
        assert_eq!(stored.load(Ordering::SeqCst), 1);
    }

    /// 63. Ids are forgotten after KEEP, and never more than IDS_MAX are kept.
    #[tokio::test(start_paused = true)]
    async fn t63_ids_expire_and_are_bounded() {
        let memo = Memo::default();
        let stored = Arc::new(AtomicUsize::new(0));
        let s = || storer(stored.clone(), Duration::ZERO, false);
        memo.send(&ids(&["A"]), s()).await.unwrap();
        tokio::time::advance(KEEP + Duration::from_secs(1)).await;
        assert_eq!(memo.send(&ids(&["A"]), s()).await.unwrap(), vec![1]);
        let many: Vec<String> = (0..IDS_MAX + 10).map(|i| format!("m{i}")).collect();
        memo.send(&many, s()).await.unwrap();
        assert_eq!(memo.len(), IDS_MAX);
    }
}
