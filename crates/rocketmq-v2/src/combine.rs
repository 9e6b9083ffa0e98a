//! Folds concurrent sends to one queue into one v1 `Send` (one Raft entry).
//!
//! The official clients send one message per SendMessage call, and a Raft entry per message costs
//! the group far more than a message in a shared entry. Per (topic, queue): the first send finds
//! nothing in flight and goes at once; sends that arrive while one is in flight wait and then go
//! together as the next batch, up to the batch limits. A lone send waits for nothing, so latency
//! at low load is unchanged. The batch is sent by a task of its own, so a caller that gives up
//! does not strand the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use raftmq_proto::v1;
use tokio::sync::oneshot;

use crate::codes::Error;
use crate::pb::Code;

/// Sends one batch of a queue: the messages, in order; the offsets of the stored messages.
pub type SendBatch = Arc<
    dyn Fn(Vec<v1::Message>) -> futures::future::BoxFuture<'static, Result<Vec<u64>, Error>>
        + Send
        + Sync,
>;

/// The limits a folded batch stays within.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub messages: usize,
    pub bytes: usize,
}

type Waiter = (Vec<v1::Message>, oneshot::Sender<Result<Vec<u64>, Error>>);

#[derive(Default)]
struct Lane {
    in_flight: bool,
    waiting: Vec<Waiter>,
}

/// The folding state of every queue this front sends to.
#[derive(Default)]
pub struct Combiner {
    lanes: Mutex<HashMap<(String, u32), Lane>>,
}

impl Combiner {
    /// Sends `messages` to (`topic`, `queue`) through `send`, folded with other sends to the same
    /// queue that are waiting; returns their offsets, in order.
    pub async fn send(
        self: &Arc<Self>,
        topic: &str,
        queue: u32,
        messages: Vec<v1::Message>,
        limits: BatchLimits,
        send: SendBatch,
    ) -> Result<Vec<u64>, Error> {
        let (tx, rx) = oneshot::channel();
        let key = (topic.to_string(), queue);
        let start = {
            let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            let lane = lanes.entry(key.clone()).or_default();
            lane.waiting.push((messages, tx));
            !std::mem::replace(&mut lane.in_flight, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(me.drain(key, limits, send));
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::refused(
                Code::InternalServerError,
                "the batch carrying this send was dropped",
            ))
        })
    }

    /// Sends the waiting batches of a lane one after the other until none waits.
    async fn drain(self: Arc<Self>, key: (String, u32), limits: BatchLimits, send: SendBatch) {
        loop {
            let batch = {
                let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
                let Some(lane) = lanes.get_mut(&key) else {
                    return;
                };
                if lane.waiting.is_empty() {
                    lane.in_flight = false;
                    lanes.remove(&key);
                    return;
                }
                take_batch(&mut lane.waiting, limits)
            };
            let messages: Vec<v1::Message> =
                batch.iter().flat_map(|(m, _)| m.iter().cloned()).collect();
            let outcome = send(messages).await;
            let mut at = 0;
            for (m, tx) in batch {
                let n = m.len();
                let mine = match &outcome {
                    Ok(offsets) => Ok(offsets
                        .get(at..at + n)
                        .map(<[u64]>::to_vec)
                        .unwrap_or_default()),
                    Err(e) => Err(e.clone()),
                };
                at += n;
                let _ = tx.send(mine);
            }
        }
    }
}

/// The first waiters that fit the limits together (always at least one).
fn take_batch(waiting: &mut Vec<Waiter>, limits: BatchLimits) -> Vec<Waiter> {
    let (mut count, mut bytes, mut take) = (0usize, 0usize, 0usize);
    for (m, _) in waiting.iter() {
        let b: usize = m.iter().map(raftmq_proto::limits::message_bytes).sum();
        if take > 0 && (count + m.len() > limits.messages || bytes + b > limits.bytes) {
            break;
        }
        count += m.len();
        bytes += b;
        take += 1;
    }
    waiting.drain(..take).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn msg(body: &str) -> v1::Message {
        v1::Message {
            body: body.as_bytes().to_vec().into(),
            ..Default::default()
        }
    }

    /// 50. Sends that arrive while one is in flight go together in the next batch, each caller
    ///     gets its own offsets in order, and the batch limits cut batches.
    #[tokio::test]
    async fn t50_concurrent_sends_fold_into_few_batches() {
        let c = Arc::new(Combiner::default());
        let next = Arc::new(AtomicUsize::new(0));
        let batches = Arc::new(Mutex::new(Vec::new()));
        let (n2, b2) = (next.clone(), batches.clone());
        let send: SendBatch = Arc::new(move |ms: Vec<v1::Message>| {
            let (next, batches) = (n2.clone(), b2.clone());
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                batches.lock().unwrap().push(ms.len());
                let first = next.fetch_add(ms.len(), Ordering::SeqCst) as u64;
                Ok((first..first + ms.len() as u64).collect())
            })
        });
        let limits = BatchLimits {
            messages: 10,
            bytes: 1 << 20,
        };
        let mut tasks = Vec::new();
        for i in 0..25 {
            let (c, send) = (c.clone(), send.clone());
            tasks.push(tokio::spawn(async move {
                c.send("t", 0, vec![msg(&format!("m{i}"))], limits, send)
                    .await
            }));
        }
        let mut offsets = Vec::new();
        for t in tasks {
            let o = t.await.unwrap().unwrap();
            assert_eq!(o.len(), 1);
            offsets.push(o[0]);
        }
        offsets.sort_unstable();
        assert_eq!(
            offsets,
            (0..25).collect::<Vec<u64>>(),
            "each send its own offset"
        );
        let b = batches.lock().unwrap().clone();
        assert!(
            b.len() < 25 && b.iter().all(|n| *n <= 10),
            "folded within limits: {b:?}"
        );
    }

    /// 51. A failed batch fails every send in it, and the lane sends again afterwards.
    #[tokio::test]
    async fn t51_a_failed_batch_fails_its_sends_only() {
        let c = Arc::new(Combiner::default());
        let fail: SendBatch = Arc::new(|_| {
            Box::pin(async { Err(Error::refused(Code::InternalServerError, "boom")) })
        });
        let limits = BatchLimits {
            messages: 10,
            bytes: 1 << 20,
        };
        assert!(c.send("t", 1, vec![msg("a")], limits, fail).await.is_err());
        let ok: SendBatch = Arc::new(|ms: Vec<v1::Message>| {
            Box::pin(async move { Ok((0..ms.len() as u64).collect()) })
        });
        assert_eq!(
            c.send("t", 1, vec![msg("b"), msg("c")], limits, ok)
                .await
                .unwrap(),
            vec![0, 1]
        );
    }
}
