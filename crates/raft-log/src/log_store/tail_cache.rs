//! The tail cache: the newest entries of the log, as appended, kept in memory.
//!
//! Replication to up-to-date followers and pulls of recent messages read these entries here
//! instead of reading and decoding the segment files again. The cache holds a dense run of indexes
//! `[first, first + len)` and at most [`TAIL_CACHE_BYTES`] of payload (plus per-entry overhead):
//! pushing past the bound forgets the oldest entries. It is an optimisation only: every entry in
//! it is also in a segment file, so losing it (a restart) loses nothing.

use std::collections::VecDeque;

use super::payload_len_hint;
use crate::types::Entry;

/// Payload bytes the tail cache holds at most.
pub(super) const TAIL_CACHE_BYTES: usize = 32 << 20;

/// A dense run of the newest entries `[first, first + entries.len())`, bounded in payload bytes.
#[derive(Default)]
pub(super) struct TailCache {
    first: u64,
    entries: VecDeque<Entry>,
    bytes: usize,
}

impl TailCache {
    fn size(e: &Entry) -> usize {
        payload_len_hint(&e.payload) + std::mem::size_of::<Entry>()
    }

    fn pop_front(&mut self) -> Option<Entry> {
        let e = self.entries.pop_front()?;
        self.bytes -= Self::size(&e);
        self.first += 1;
        Some(e)
    }

    /// Adds the entry after the newest one; any other index restarts the cache at `e`.
    pub(super) fn push(&mut self, e: Entry) {
        if self.entries.is_empty() || self.first + self.entries.len() as u64 != e.log_id.index {
            // Not the next index (the first append, or the log went on past a snapshot): restart.
            self.clear();
            self.first = e.log_id.index;
        }
        self.bytes += Self::size(&e);
        self.entries.push_back(e);
        while self.bytes > TAIL_CACHE_BYTES && self.pop_front().is_some() {}
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Forgets every entry from `index` on (the log was truncated there).
    pub(super) fn truncate_from(&mut self, index: u64) {
        while self.first + self.entries.len() as u64 > index {
            let Some(e) = self.entries.pop_back() else {
                break;
            };
            self.bytes -= Self::size(&e);
        }
    }

    /// Forgets every entry at or below `index` (purged).
    pub(super) fn purge_to(&mut self, index: u64) {
        while self.first <= index && self.pop_front().is_some() {}
    }

    pub(super) fn get(&self, index: u64) -> Option<&Entry> {
        self.entries.get(index.checked_sub(self.first)? as usize)
    }

    /// The oldest index held, if the cache holds any entry.
    pub(super) fn first_held(&self) -> Option<u64> {
        (!self.entries.is_empty()).then_some(self.first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EntryPayload, Payload, log_id};

    fn entry(index: u64, bytes: usize) -> Entry {
        Entry {
            log_id: log_id(1, 1, index),
            payload: EntryPayload::Normal(Payload(vec![index as u8; bytes].into())),
        }
    }

    fn held(c: &TailCache) -> Vec<u64> {
        c.entries.iter().map(|e| e.log_id.index).collect()
    }

    #[test]
    fn t01_dense_pushes_are_all_held() {
        let mut c = TailCache::default();
        assert_eq!(c.first_held(), None);
        for i in 5..10 {
            c.push(entry(i, 10));
        }
        assert_eq!(held(&c), vec![5, 6, 7, 8, 9]);
        assert_eq!(c.first_held(), Some(5));
        assert_eq!(c.get(7).map(|e| e.log_id.index), Some(7));
        assert!(c.get(4).is_none());
        assert!(c.get(10).is_none());
    }

    #[test]
    fn t02_a_non_consecutive_push_restarts_the_cache() {
        let mut c = TailCache::default();
        c.push(entry(1, 10));
        c.push(entry(2, 10));
        // The log went on past a snapshot: index 100 follows 2.
        c.push(entry(100, 10));
        assert_eq!(held(&c), vec![100]);
        assert_eq!(c.bytes, TailCache::size(&entry(100, 10)));
    }

    /// A cache holding entries 1 to 5 of 10 payload bytes each.
    fn small_entries_1_to_5() -> TailCache {
        let mut c = TailCache::default();
        for i in 1..=5 {
            c.push(entry(i, 10));
        }
        c
    }

    /// Holds no entry and counts no bytes.
    fn assert_empty(c: &TailCache) {
        assert_eq!(held(c), Vec::<u64>::new());
        assert_eq!(c.bytes, 0);
    }

    #[test]
    fn t03_the_byte_bound_forgets_the_oldest_entries() {
        let mut c = TailCache::default();
        let big = TAIL_CACHE_BYTES / 4;
        for i in 1..=6 {
            c.push(entry(i, big));
        }
        assert!(c.bytes <= TAIL_CACHE_BYTES);
        // Four payloads of a quarter each plus overhead exceed the bound: three remain.
        assert_eq!(held(&c), vec![4, 5, 6]);
        assert_eq!(c.first_held(), Some(4));
        // An entry larger than the bound on its own is not kept either.
        c.push(entry(7, TAIL_CACHE_BYTES + 1));
        assert_empty(&c);
    }

    /// A change to the cache in a step of a case.
    enum Step {
        Truncate(u64),
        Purge(u64),
        Push(u64),
    }

    /// A step and the indexes held after it.
    type Checked = (Step, &'static [u64]);

    #[test]
    fn t04_t05_truncate_forgets_from_the_index_on_and_purge_up_to_it() {
        use Step::*;
        // Each case starts from entries 1 to 5; after each step, the indexes held.
        let cases: [(&str, &[Checked]); 2] = [
            (
                "t04 truncate forgets from the index on; the log goes on from the cut, dense",
                &[
                    (Truncate(4), &[1, 2, 3]),
                    (Truncate(10), &[1, 2, 3]),
                    (Push(4), &[1, 2, 3, 4]),
                    (Truncate(0), &[]),
                ],
            ),
            (
                "t05 purge forgets up to the index",
                &[(Purge(2), &[3, 4, 5]), (Purge(9), &[])],
            ),
        ];
        for (name, steps) in cases {
            let mut c = small_entries_1_to_5();
            for (step, want) in steps {
                match *step {
                    Truncate(i) => c.truncate_from(i),
                    Purge(i) => c.purge_to(i),
                    Push(i) => c.push(entry(i, 10)),
                }
                assert_eq!(held(&c), *want, "{name}");
                for i in 0..12 {
                    assert_eq!(c.get(i).is_some(), want.contains(&i), "{name}: get({i})");
                }
                if want.is_empty() {
                    assert_empty(&c);
                }
            }
        }
    }
}
