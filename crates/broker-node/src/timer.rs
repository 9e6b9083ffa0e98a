//! Scheduled messages of DELAY topics, waiting for their delivery time: replicated state that apply
//! builds from `Schedule`, `Deliver` and `Recall` entries (see `command.rs`).
//!
//! A scheduled message is stored once, in its `Schedule` entry, and indexed here by
//! (delivery time, log index, position). When it is due, the leader proposes a `Deliver` entry
//! that carries it into its queue; apply checks each message against this index at the entry's
//! stamped clock, so what is delivered is decided by the entries, never by a node's own clock, and
//! a message is delivered once however often a leader proposes it.
//!
//! Never in snapshots, like the consume-queue runs: the retention point is held below the oldest
//! entry with a message still waiting ([`Timer::oldest_entry`]), a snapshot is taken at or below
//! the retention point, and every retained entry after it is re-applied (on restart) or replicated
//! (to a peer that installed the snapshot), which rebuilds this index.
//!
//! Memory: one B-tree item of 24 bytes per waiting message (a 16-byte key, a topic number and a
//! queue), plus one item per `Schedule` entry with messages waiting. `cargo test -p
//! raftmq-broker-node --test timer_memory -- --nocapture` measures it per million.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Where a scheduled message is stored: its entry's log index and its position in the entry,
/// packed as `index << 16 | position` (a batch holds at most 65,536 messages).
pub type Location = u64;

/// Packs a log index and a position into a [`Location`].
pub const fn location(log_index: u64, position: u32) -> Location {
    (log_index << 16) | (position as u64 & 0xFFFF)
}

/// A [`Location`]'s log index and position.
pub const fn unpack(loc: Location) -> (u64, u32) {
    (loc >> 16, (loc & 0xFFFF) as u32)
}

/// The most messages one `Schedule` entry may hold: positions fit in 16 bits.
pub const POSITIONS: usize = 1 << 16;

/// A message waiting for its time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub deliver_at_ms: u64,
    pub log_index: u64,
    pub position: u32,
    pub topic: Arc<str>,
    pub queue: u32,
}

#[derive(Debug, Default)]
pub struct Timer {
    /// (delivery time, location) → (topic number, queue).
    due: BTreeMap<(u64, Location), (u32, u32)>,
    /// Log index of a `Schedule` entry → its messages still waiting.
    entries: BTreeMap<u64, u32>,
    /// Topic numbers: names by number, and numbers by name.
    names: Vec<Arc<str>>,
    numbers: HashMap<Arc<str>, u32>,
    /// Messages waiting, by topic number.
    counts: Vec<u64>,
}

impl Timer {
    fn number(&mut self, topic: &str) -> u32 {
        if let Some(&n) = self.numbers.get(topic) {
            return n;
        }
        let name: Arc<str> = Arc::from(topic);
        let n = self.names.len() as u32;
        self.names.push(name.clone());
        self.numbers.insert(name, n);
        self.counts.push(0);
        n
    }

    /// Indexes a message stored at (`log_index`, `position`) to be delivered to `topic`/`queue`
    /// at `deliver_at_ms`.
    pub fn add(
        &mut self,
        deliver_at_ms: u64,
        (log_index, position): (u64, u32),
        topic: &str,
        queue: u32,
    ) {
        let n = self.number(topic);
        if self
            .due
            .insert((deliver_at_ms, location(log_index, position)), (n, queue))
            .is_none()
        {
            *self.entries.entry(log_index).or_default() += 1;
            self.counts[n as usize] += 1;
        }
    }

    /// Whether the message at `at` waits, due at `deliver_at_ms`, for `topic`/`queue`.
    pub fn holds(
        &self,
        deliver_at_ms: u64,
        (log_index, position): (u64, u32),
        topic: &str,
        queue: u32,
    ) -> bool {
        let Some(&n) = self.numbers.get(topic) else {
            return false;
        };
        self.due
            .get(&(deliver_at_ms, location(log_index, position)))
            .is_some_and(|&v| v == (n, queue))
    }

    /// Drops a waiting message; whether it waited.
    pub fn remove(&mut self, deliver_at_ms: u64, (log_index, position): (u64, u32)) -> bool {
        let Some((n, _)) = self
            .due
            .remove(&(deliver_at_ms, location(log_index, position)))
        else {
            return false;
        };
        self.counts[n as usize] -= 1;
        if let Some(c) = self.entries.get_mut(&log_index) {
            *c -= 1;
            if *c == 0 {
                self.entries.remove(&log_index);
            }
        }
        true
    }

    /// Drops every message waiting for `topic` (deleted); how many.
    pub fn drop_topic(&mut self, topic: &str) -> usize {
        let Some(&n) = self.numbers.get(topic) else {
            return 0;
        };
        let gone: Vec<(u64, Location)> = self
            .due
            .iter()
            .filter(|(_, v)| v.0 == n)
            .map(|(k, _)| *k)
            .collect();
        for &(at, loc) in &gone {
            self.remove(at, unpack(loc));
        }
        gone.len()
    }

    /// An index item as a [`Waiting`].
    fn waiting(&self, &(at, loc): &(u64, Location), &(n, queue): &(u32, u32)) -> Waiting {
        let (log_index, position) = unpack(loc);
        Waiting {
            deliver_at_ms: at,
            log_index,
            position,
            topic: self.names[n as usize].clone(),
            queue,
        }
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// The log index of the oldest entry with a message still waiting: retention keeps it.
    pub fn oldest_entry(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    /// Messages waiting whose entry is at or below `log_index` (at most `max`): what retention
    /// must move before it can trim there. A scan, done only when retention is held back.
    pub fn waiting_upto(&self, log_index: u64, max: usize) -> Vec<Waiting> {
        if self.oldest_entry().is_none_or(|o| o > log_index) {
            return Vec::new();
        }
        self.due
            .iter()
            .filter(|(k, _)| unpack(k.1).0 <= log_index)
            .take(max)
            .map(|(k, v)| self.waiting(k, v))
            .collect()
    }

    /// The earliest delivery time waiting.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.due.keys().next().map(|k| k.0)
    }

    /// Messages due at or before `now_ms`, earliest first, at most `max`, skipping those `skip`
    /// says are being delivered already.
    pub fn due(&self, now_ms: u64, max: usize, skip: impl Fn(Location) -> bool) -> Vec<Waiting> {
        self.due
            .range(..(now_ms.saturating_add(1), 0))
            .filter(|(k, _)| !skip(k.1))
            .take(max)
            .map(|(k, v)| self.waiting(k, v))
            .collect()
    }

    /// A topic's messages waiting.
    pub fn count(&self, topic: &str) -> u64 {
        self.numbers
            .get(topic)
            .map_or(0, |&n| self.counts[n as usize])
    }

    /// A topic's messages waiting and the earliest delivery time among them.
    pub fn topic(&self, topic: &str) -> (u64, Option<u64>) {
        let Some(&n) = self.numbers.get(topic) else {
            return (0, None);
        };
        let count = self.counts[n as usize];
        if count == 0 {
            return (0, None);
        }
        let next = self.due.iter().find(|(_, v)| v.0 == n).map(|(k, _)| k.0);
        (count, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t1_due_in_time_order_and_removed_once() {
        let mut t = Timer::default();
        t.add(300, (10, 0), "a", 1);
        t.add(100, (11, 0), "b", 0);
        t.add(100, (11, 1), "b", 0);
        t.add(200, (10, 1), "a", 2);
        assert_eq!(t.len(), 4);
        assert_eq!(t.next_due_ms(), Some(100));
        assert_eq!(t.oldest_entry(), Some(10));
        assert_eq!(t.topic("a"), (2, Some(200)));
        let due = t.due(200, 10, |_| false);
        let at: Vec<(u64, u64, u32)> = due
            .iter()
            .map(|w| (w.deliver_at_ms, w.log_index, w.position))
            .collect();
        assert_eq!(at, [(100, 11, 0), (100, 11, 1), (200, 10, 1)]);
        assert_eq!(&*due[2].topic, "a");
        assert_eq!(due[2].queue, 2);
        // Nothing due before its time.
        assert!(t.due(99, 10, |_| false).is_empty());
        // A location being delivered is skipped; `max` holds.
        assert_eq!(t.due(300, 1, |l| l == location(11, 0))[0].position, 1);
        assert!(t.holds(200, (10, 1), "a", 2));
        assert!(!t.holds(200, (10, 1), "a", 1), "another queue");
        assert!(!t.holds(201, (10, 1), "a", 2), "another time");
        assert!(t.remove(200, (10, 1)));
        assert!(!t.remove(200, (10, 1)), "removed once");
        assert_eq!(t.waiting_upto(10, 10).len(), 1);
        assert_eq!(t.waiting_upto(9, 10), vec![]);
        assert!(t.remove(300, (10, 0)));
        assert_eq!(t.oldest_entry(), Some(11), "entry 10 has nothing waiting");
    }

    #[test]
    fn t2_a_deleted_topic_takes_its_messages() {
        let mut t = Timer::default();
        t.add(5, (1, 0), "a", 0);
        t.add(6, (1, 1), "b", 0);
        t.add(7, (2, 0), "a", 0);
        assert_eq!(t.drop_topic("a"), 2);
        assert_eq!(t.len(), 1);
        assert_eq!(t.oldest_entry(), Some(1));
        assert_eq!(t.topic("b"), (1, Some(6)));
        assert_eq!(t.topic("a"), (0, None));
        assert_eq!(t.drop_topic("nope"), 0);
    }

    #[test]
    fn t3_location_round_trips() {
        for (i, p) in [(0, 0), (1, 65_535), (1 << 40, 7)] {
            assert_eq!(unpack(location(i, p)), (i, p));
        }
    }
}
