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
//! Half messages of TRANSACTION topics wait here too, apart (`half`): indexed by their next check
//! time, never delivered by time, only by an `EndTxn` that commits them (or dropped by one that
//! rolls them back). Each keeps the transaction id it was stored under (its first location),
//! so a commit finds it after the check-backs moved it.
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
    /// A half message's transaction: the (log index, position) it was first stored at.
    pub txn: Option<(u64, u32)>,
}

/// A half message in the index: (topic number, queue, transaction).
type Half = (u32, u32, (u64, u32));

#[derive(Debug, Default)]
pub struct Timer {
    /// (delivery time, location) → (topic number, queue).
    due: BTreeMap<(u64, Location), (u32, u32)>,
    /// Log index of a `Schedule` entry → its messages still waiting.
    entries: BTreeMap<u64, u32>,
    /// Topic numbers: names by number, and numbers by name.
    names: Vec<Arc<str>>,
    numbers: HashMap<Arc<str>, u32>,
    /// Messages waiting, by topic number (half messages too).
    counts: Vec<u64>,
    /// Half messages by (next check time, location).
    half: BTreeMap<(u64, Location), Half>,
    /// Transaction → (next check time, location) of its half message.
    txns: HashMap<(u64, u32), (u64, Location)>,
    /// A scheduled message stored again (rolled by retention): where it was first stored (its
    /// id) → (delivery time, location now), and back.
    moved: HashMap<(u64, u32), (u64, Location)>,
    origins: HashMap<Location, (u64, u32)>,
}

/// A [`Timer`] as a restart image holds it (`state::restart`): every field, topic names as
/// strings. Field order is the order on disk: never reorder or change the fields.
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TimerImage {
    due: BTreeMap<(u64, Location), (u32, u32)>,
    entries: BTreeMap<u64, u32>,
    names: Vec<String>,
    counts: Vec<u64>,
    half: BTreeMap<(u64, Location), Half>,
    txns: BTreeMap<(u64, u32), (u64, Location)>,
    moved: BTreeMap<(u64, u32), (u64, Location)>,
    origins: BTreeMap<Location, (u64, u32)>,
}

impl Timer {
    /// Everything the timer holds, for a restart image.
    pub fn image(&self) -> TimerImage {
        TimerImage {
            due: self.due.clone(),
            entries: self.entries.clone(),
            names: self.names.iter().map(|n| n.to_string()).collect(),
            counts: self.counts.clone(),
            half: self.half.clone(),
            txns: self.txns.iter().map(|(k, v)| (*k, *v)).collect(),
            moved: self.moved.iter().map(|(k, v)| (*k, *v)).collect(),
            origins: self.origins.iter().map(|(k, v)| (*k, *v)).collect(),
        }
    }

    /// The timer a restart image holds.
    pub fn from_image(i: TimerImage) -> Timer {
        let names: Vec<Arc<str>> = i.names.into_iter().map(Arc::from).collect();
        Timer {
            due: i.due,
            entries: i.entries,
            numbers: names
                .iter()
                .enumerate()
                .map(|(n, name)| (name.clone(), n as u32))
                .collect(),
            names,
            counts: i.counts,
            half: i.half,
            txns: i.txns.into_iter().collect(),
            moved: i.moved.into_iter().collect(),
            origins: i.origins.into_iter().collect(),
        }
    }

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

    /// Indexes a half message of transaction `txn` stored at (`log_index`, `position`) for
    /// `topic`/`queue`, next checked at `check_at_ms`.
    pub fn add_half(
        &mut self,
        check_at_ms: u64,
        (log_index, position): (u64, u32),
        (topic, queue): (&str, u32),
        txn: (u64, u32),
    ) {
        let n = self.number(topic);
        let loc = location(log_index, position);
        if self
            .half
            .insert((check_at_ms, loc), (n, queue, txn))
            .is_none()
        {
            *self.entries.entry(log_index).or_default() += 1;
            self.counts[n as usize] += 1;
        }
        self.txns.insert(txn, (check_at_ms, loc));
    }

    /// Notes that the scheduled message waiting at (`deliver_at_ms`, `at`) was first stored at
    /// `origin`, so its id still finds it.
    pub fn moved_from(&mut self, origin: (u64, u32), deliver_at_ms: u64, at: (u64, u32)) {
        let loc = location(at.0, at.1);
        if origin != at && self.due.contains_key(&(deliver_at_ms, loc)) {
            self.moved.insert(origin, (deliver_at_ms, loc));
            self.origins.insert(loc, origin);
        }
    }

    /// The scheduled message first stored at `origin`, if it was moved and still waits.
    pub fn moved(&self, origin: (u64, u32)) -> Option<Waiting> {
        let &(at, loc) = self.moved.get(&origin)?;
        let v = self.due.get(&(at, loc))?;
        Some(self.waiting(&(at, loc), v))
    }

    /// Whether a half message waits at `at` with its check time, for `topic`/`queue`.
    pub fn holds_half(
        &self,
        check_at_ms: u64,
        (log_index, position): (u64, u32),
        topic: &str,
        queue: u32,
    ) -> bool {
        let place = (check_at_ms, location(log_index, position));
        self.held(&self.half, place, (topic, queue), |&(n, q, _)| (n, q))
    }

    /// Whether `index` holds `place` for `topic`/`queue` (`of` reads an item's topic number and
    /// queue).
    fn held<V>(
        &self,
        index: &BTreeMap<(u64, Location), V>,
        place: (u64, Location),
        (topic, queue): (&str, u32),
        of: impl Fn(&V) -> (u32, u32),
    ) -> bool {
        let Some(&n) = self.numbers.get(topic) else {
            return false;
        };
        index.get(&place).is_some_and(|v| of(v) == (n, queue))
    }

    /// The half message of transaction `txn`, if it is still open.
    pub fn txn(&self, txn: (u64, u32)) -> Option<Waiting> {
        let &(at, loc) = self.txns.get(&txn)?;
        let h = self.half.get(&(at, loc))?;
        Some(self.half_waiting(&(at, loc), h))
    }

    /// `topic`'s half messages whose check time is at or before `now_ms`, earliest first, at
    /// most `max`.
    pub fn checks_due(&self, topic: &str, now_ms: u64, max: usize) -> Vec<Waiting> {
        let Some(&n) = self.numbers.get(topic) else {
            return Vec::new();
        };
        self.half
            .range(..(now_ms.saturating_add(1), 0))
            .filter(|(_, v)| v.0 == n)
            .take(max)
            .map(|(k, v)| self.half_waiting(k, v))
            .collect()
    }

    /// A topic's open transactions (at most `max`), by next check time.
    pub fn open_txns(&self, topic: &str, max: usize) -> Vec<Waiting> {
        let Some(&n) = self.numbers.get(topic) else {
            return Vec::new();
        };
        self.half
            .iter()
            .filter(|(_, v)| v.0 == n)
            .take(max)
            .map(|(k, v)| self.half_waiting(k, v))
            .collect()
    }

    fn half_waiting(&self, &(at, loc): &(u64, Location), &(n, queue, txn): &Half) -> Waiting {
        let (log_index, position) = unpack(loc);
        Waiting {
            deliver_at_ms: at,
            log_index,
            position,
            topic: self.names[n as usize].clone(),
            queue,
            txn: Some(txn),
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
        let place = (deliver_at_ms, location(log_index, position));
        self.held(&self.due, place, (topic, queue), |&v| v)
    }

    /// Drops a waiting message (or half message); whether it waited.
    pub fn remove(&mut self, deliver_at_ms: u64, (log_index, position): (u64, u32)) -> bool {
        let key = (deliver_at_ms, location(log_index, position));
        let n = match self.due.remove(&key) {
            Some((n, _)) => {
                if let Some(origin) = self.origins.remove(&key.1)
                    && self.moved.get(&origin) == Some(&key)
                {
                    self.moved.remove(&origin);
                }
                n
            }
            None => match self.half.remove(&key) {
                Some((n, _, txn)) => {
                    if self.txns.get(&txn) == Some(&key) {
                        self.txns.remove(&txn);
                    }
                    n
                }
                None => return false,
            },
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
            .chain(self.half.iter().filter(|(_, v)| v.0 == n).map(|(k, _)| *k))
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
            txn: None,
        }
    }

    /// Messages waiting (half messages too).
    pub fn len(&self) -> usize {
        self.due.len() + self.half.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let half = self
            .half
            .iter()
            .filter(|(k, _)| unpack(k.1).0 <= log_index)
            .map(|(k, v)| self.half_waiting(k, v));
        self.due
            .iter()
            .filter(|(k, _)| unpack(k.1).0 <= log_index)
            .map(|(k, v)| self.waiting(k, v))
            .chain(half)
            .take(max)
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
        let check = self.half.iter().find(|(_, v)| v.0 == n).map(|(k, _)| k.0);
        (count, next.into_iter().chain(check).min())
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

    /// 4. Half messages wait apart: never due by time, found by their transaction after a move
    ///    (a check-back stores them again elsewhere), dropped once.
    #[test]
    fn t4_half_messages_wait_apart_and_are_found_by_transaction() {
        let mut t = Timer::default();
        t.add(100, (5, 0), "d", 0);
        t.add_half(50, (6, 0), ("tx", 1), (6, 0));
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.due(1000, 10, |_| false).len(),
            1,
            "a half message is never due"
        );
        assert_eq!(t.next_due_ms(), Some(100));
        assert_eq!(t.checks_due("tx", 50, 10)[0].txn, Some((6, 0)));
        assert!(t.checks_due("tx", 49, 10).is_empty());
        assert!(t.checks_due("d", 50, 10).is_empty(), "another topic's");
        assert!(t.holds_half(50, (6, 0), "tx", 1) && !t.holds(50, (6, 0), "tx", 1));
        // A check-back moves it: entry 9, next check at 70; the transaction finds the move.
        assert!(t.remove(50, (6, 0)));
        t.add_half(70, (9, 0), ("tx", 1), (6, 0));
        let w = t.txn((6, 0)).unwrap();
        assert_eq!((w.deliver_at_ms, w.log_index, w.queue), (70, 9, 1));
        assert_eq!(t.topic("tx"), (1, Some(70)));
        assert_eq!(t.open_txns("tx", 10).len(), 1);
        assert_eq!(t.waiting_upto(9, 10).len(), 2);
        assert!(t.remove(70, (9, 0)));
        assert!(t.txn((6, 0)).is_none(), "resolved");
        assert_eq!(t.oldest_entry(), Some(5));
        t.add_half(80, (10, 0), ("tx", 0), (10, 0));
        assert_eq!(t.drop_topic("tx"), 1);
        assert!(t.txn((10, 0)).is_none());
    }

    /// 5. A scheduled message stored again (by retention) is found by where it was first
    ///    stored, until it no longer waits.
    #[test]
    fn t5_a_moved_message_is_found_by_its_first_place() {
        let mut t = Timer::default();
        t.add(100, (5, 0), "d", 1);
        assert!(t.moved((5, 0)).is_none(), "not moved");
        assert!(t.remove(100, (5, 0)));
        t.add(100, (9, 3), "d", 1);
        t.moved_from((5, 0), 100, (9, 3));
        let w = t.moved((5, 0)).unwrap();
        assert_eq!((w.log_index, w.position, w.deliver_at_ms), (9, 3, 100));
        // Moved again: the first place still finds it.
        assert!(t.remove(100, (9, 3)));
        t.add(100, (12, 0), "d", 1);
        t.moved_from((5, 0), 100, (12, 0));
        assert_eq!(t.moved((5, 0)).unwrap().log_index, 12);
        assert!(t.remove(100, (12, 0)));
        assert!(t.moved((5, 0)).is_none(), "delivered or recalled");
    }
}
