//! Queue identity and the pure choices made over queues: which queue a message goes to
//! ([`QueueSelector`]) and which queues a consumer-group member reads ([`allocate_averagely`]).
//!
//! Both are deterministic functions of their inputs, so every producer sends one key to the same
//! queue and every member of a group computes the same assignment from the same member list.

use std::fmt;

/// A queue of a topic on one broker group.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueId {
    pub broker: String,
    pub queue: u32,
}

impl QueueId {
    pub fn new(broker: impl Into<String>, queue: u32) -> Self {
        QueueId {
            broker: broker.into(),
            queue,
        }
    }
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.broker, self.queue)
    }
}

/// 64-bit FNV-1a: stable across processes, platforms and Rust versions (unlike `DefaultHasher`),
/// so a key maps to the same queue in every producer.
pub fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The queue for `key` among `queues_len` sorted queues (RocketMQ's SelectMessageQueueByHash).
pub fn queue_for_key(key: &str, queues_len: usize) -> Option<usize> {
    if queues_len == 0 {
        return None;
    }
    Some((key_hash(key) % queues_len as u64) as usize)
}

/// Round-robin choice that skips queues the caller marks unusable.
#[derive(Debug, Default)]
pub struct QueueSelector {
    next: usize,
}

impl QueueSelector {
    /// The next usable index in `0..len` in round-robin order, or `None` if none is usable.
    pub fn next_round_robin(
        &mut self,
        len: usize,
        usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        for i in 0..len {
            let idx = (self.next + i) % len;
            if usable(idx) {
                self.next = idx + 1;
                return Some(idx);
            }
        }
        None
    }
}

/// RocketMQ's AllocateMessageQueueAveragely: `all` (sorted) split into contiguous ranges among
/// `members` (sorted); the first `all.len() % members.len()` members get one more. Returns the
/// share of `me`, empty when `me` is not a member.
pub fn allocate_averagely<T: Clone>(all: &[T], members: &[String], me: &str) -> Vec<T> {
    let Some(index) = members.iter().position(|m| m == me) else {
        return Vec::new();
    };
    let (n, m) = (all.len(), members.len());
    let rem = n % m;
    let size = if n <= m {
        1
    } else if rem > 0 && index < rem {
        n / m + 1
    } else {
        n / m
    };
    let start = if rem > 0 && index < rem {
        index * size
    } else {
        index * size + rem
    };
    let take = size.min(n.saturating_sub(start));
    all.iter().skip(start).take(take).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn allocation_covers_every_queue_once() {
        for queues in 0..20usize {
            for m in 1..7usize {
                let all: Vec<usize> = (0..queues).collect();
                let ms = members(m);
                let mut seen = HashSet::new();
                let mut sizes = Vec::new();
                for me in &ms {
                    let mine = allocate_averagely(&all, &ms, me);
                    sizes.push(mine.len());
                    for q in mine {
                        assert!(
                            seen.insert(q),
                            "queue {q} assigned twice ({queues} q, {m} m)"
                        );
                    }
                }
                assert_eq!(seen.len(), queues);
                let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(max - min <= 1, "unbalanced {sizes:?}");
            }
        }
    }

    #[test]
    fn allocation_matches_rocketmq_example() {
        // 8 queues, 3 members: 3, 3, 2 contiguous.
        let all: Vec<usize> = (0..8).collect();
        let ms = members(3);
        assert_eq!(allocate_averagely(&all, &ms, "c0"), vec![0, 1, 2]);
        assert_eq!(allocate_averagely(&all, &ms, "c1"), vec![3, 4, 5]);
        assert_eq!(allocate_averagely(&all, &ms, "c2"), vec![6, 7]);
        assert!(allocate_averagely(&all, &ms, "stranger").is_empty());
    }

    #[test]
    fn key_hash_is_stable_and_spreads() {
        // Known FNV-1a values: a change here would move keys between queues across versions.
        assert_eq!(key_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(queue_for_key("order-42", 8), queue_for_key("order-42", 8));
        assert_eq!(queue_for_key("x", 0), None);
        let used: HashSet<usize> = (0..1000)
            .filter_map(|i| queue_for_key(&format!("k{i}"), 8))
            .collect();
        assert_eq!(used.len(), 8);
    }

    #[test]
    fn round_robin_skips_unusable() {
        let mut s = QueueSelector::default();
        assert_eq!(s.next_round_robin(3, |_| true), Some(0));
        assert_eq!(s.next_round_robin(3, |i| i != 1), Some(2));
        assert_eq!(s.next_round_robin(3, |_| true), Some(0));
        assert_eq!(s.next_round_robin(3, |_| false), None);
        assert_eq!(s.next_round_robin(0, |_| true), None);
    }
}
