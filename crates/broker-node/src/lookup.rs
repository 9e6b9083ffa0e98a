//! The lookup index of a queue: 32-bit fingerprints of its messages' ids (or keys), each with the
//! message's offset, kept at apply time so `raftmq msg get` and `msg find --key` find a message by
//! reading only the entries that may hold it, never by scanning the log.
//!
//! Offsets arrive in order. They go to an open chunk; once it spans [`CHUNK_OFFSETS`] offsets it is
//! sealed: sorted by fingerprint, so a lookup is one binary search per sealed chunk plus a walk of
//! the open one. Retention drops sealed chunks wholly below the queue's lowest offset. A
//! fingerprint names candidates only: the caller reads each candidate and compares the real id or
//! key, so a collision costs one read, never a wrong answer.
//!
//! Cost: 8 bytes per indexed id or key (a fingerprint and the offset's distance from its chunk's
//! start). A message with neither (raftmq's own messages without a key: their id names their
//! place) costs nothing. Like the consume-queue runs, the index is not in snapshots: apply rebuilds
//! it from the retained entries.

use std::collections::VecDeque;

/// Offsets one chunk spans before it is sealed.
pub const CHUNK_OFFSETS: u64 = 1 << 16;

// A distance from a chunk's start fits the entry's 32 bits.
const _: () = assert!(CHUNK_OFFSETS <= u32::MAX as u64);

/// The fingerprint of an id or key: FNV-1a over its bytes, 32 bits. Stable across builds and
/// processes (every replica builds the same index, and nothing depends on it but lookups).
pub fn fingerprint(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Sealed {
    /// First offset the chunk spans, and the one after its last.
    base: u64,
    end: u64,
    /// (fingerprint, offset - base), sorted.
    entries: Box<[(u32, u32)]>,
}

/// One queue's index of one kind (ids, or keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    sealed: VecDeque<Sealed>,
    open_base: u64,
    /// (fingerprint, offset - open_base), in offset order.
    open: Vec<(u32, u32)>,
}

impl Lookup {
    /// Indexes `text` at `offset` (offsets never go down from one call to the next).
    pub fn add(&mut self, offset: u64, text: &str) {
        self.add_fingerprint(offset, fingerprint(text));
    }

    /// Indexes a fingerprint at `offset` (as [`Lookup::add`]; a restart image holds them).
    pub fn add_fingerprint(&mut self, offset: u64, fp: u32) {
        if offset >= self.open_base + CHUNK_OFFSETS {
            self.seal(offset);
        }
        self.open.push((fp, (offset - self.open_base) as u32));
    }

    /// The (offset, fingerprint) pairs at or above `offset`, by offset: what a restart image
    /// holds of the messages indexed since its previous one.
    pub fn since(&self, offset: u64) -> Vec<(u64, u32)> {
        let mut out: Vec<(u64, u32)> = self
            .sealed
            .iter()
            .filter(|c| c.end > offset)
            .flat_map(|c| c.entries.iter().map(|&(f, rel)| (c.base + rel as u64, f)))
            .chain(
                self.open
                    .iter()
                    .map(|&(f, rel)| (self.open_base + rel as u64, f)),
            )
            .filter(|&(o, _)| o >= offset)
            .collect();
        out.sort_by_key(|&(o, _)| o);
        out
    }

    /// Seals the open chunk (when it holds anything) and opens one at `offset`.
    fn seal(&mut self, offset: u64) {
        if !self.open.is_empty() {
            let mut entries = std::mem::take(&mut self.open).into_boxed_slice();
            entries.sort_unstable();
            self.sealed.push_back(Sealed {
                base: self.open_base,
                end: offset,
                entries,
            });
        }
        self.open_base = offset;
    }

    /// The offsets at or above `min_offset` whose fingerprint is `text`'s, ascending and each
    /// once (a message may list the same key twice): candidates to read and compare.
    pub fn candidates(&self, text: &str, min_offset: u64) -> Vec<u64> {
        let fp = fingerprint(text);
        let mut out = Vec::new();
        for c in self.sealed.iter().filter(|c| c.end > min_offset) {
            let from = c.entries.partition_point(|&(f, _)| f < fp);
            out.extend(
                c.entries[from..]
                    .iter()
                    .take_while(|&&(f, _)| f == fp)
                    .map(|&(_, rel)| c.base + rel as u64)
                    .filter(|&o| o >= min_offset),
            );
        }
        out.extend(
            self.open
                .iter()
                .filter(|&&(f, _)| f == fp)
                .map(|&(_, rel)| self.open_base + rel as u64)
                .filter(|&o| o >= min_offset),
        );
        out.dedup();
        out
    }

    /// Forgets the sealed chunks wholly below `min_offset` (retention moved the queue's start).
    pub fn trim(&mut self, min_offset: u64) {
        while self.sealed.front().is_some_and(|c| c.end <= min_offset) {
            self.sealed.pop_front();
        }
    }

    /// Entries held (each costs 8 bytes, plus each sealed chunk's few words).
    pub fn len(&self) -> usize {
        self.open.len() + self.sealed.iter().map(|c| c.entries.len()).sum::<usize>()
    }

    /// Whether nothing is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1. Every offset indexed under a text is found, in order, across sealed chunks and the open
    ///    one; other texts are not returned (short of a fingerprint collision).
    #[test]
    fn t01_finds_every_offset_of_a_text_across_chunks() {
        let mut l = Lookup::default();
        let n = CHUNK_OFFSETS * 3 + 10;
        for o in 100..100 + n {
            l.add(o, &format!("k{}", o % 1000));
        }
        assert_eq!(l.len() as u64, n);
        let want: Vec<u64> = (100..100 + n).filter(|o| o % 1000 == 7).collect();
        assert_eq!(l.candidates("k7", 0), want);
        assert!(l.candidates("absent", 0).is_empty());
    }

    /// 2. Retention: offsets below the queue's start are neither returned nor kept once their
    ///    chunk is wholly below it.
    #[test]
    fn t02_trim_forgets_chunks_below_the_start() {
        let mut l = Lookup::default();
        for o in 0..CHUNK_OFFSETS * 2 + 5 {
            l.add(o, "same");
        }
        let before = l.len();
        l.trim(CHUNK_OFFSETS + 3);
        assert_eq!(before - l.len(), CHUNK_OFFSETS as usize);
        let c = l.candidates("same", CHUNK_OFFSETS + 3);
        assert_eq!(c.first(), Some(&(CHUNK_OFFSETS + 3)));
        assert_eq!(c.len() as u64, CHUNK_OFFSETS + 2);
    }

    /// 3. Sparse offsets (most messages without a key): a gap longer than a chunk seals the open
    ///    chunk and the offsets stay exact.
    #[test]
    fn t03_gaps_longer_than_a_chunk_keep_offsets_exact() {
        let mut l = Lookup::default();
        let at = [
            5,
            6,
            CHUNK_OFFSETS * 5 + 1,
            CHUNK_OFFSETS * 9,
            CHUNK_OFFSETS * 9 + 3,
        ];
        for o in at {
            l.add(o, "x");
        }
        assert_eq!(l.candidates("x", 0), at);
        assert_eq!(l.candidates("x", 7), &at[2..]);
    }

    /// 4. The fingerprint is the documented FNV-1a (fixed values, so a change shows).
    #[test]
    fn t05_what_since_returns_rebuilds_the_same_answers() {
        let mut l = Lookup::default();
        let n = CHUNK_OFFSETS * 2 + 100;
        for o in 0..n {
            l.add(o, &format!("id-{}", o % 1000));
            if o % 7 == 0 {
                l.add(o, "seven");
            }
        }
        let mid = CHUNK_OFFSETS + 17;
        let tail = l.since(mid);
        assert!(tail.windows(2).all(|w| w[0].0 <= w[1].0), "by offset");
        assert_eq!(tail.first().map(|p| p.0), Some(mid));
        // Rebuilt from an older part and the tail, in two steps as two images give them.
        let mut back = Lookup::default();
        for (o, f) in l.since(0).into_iter().filter(|(o, _)| *o < mid) {
            back.add_fingerprint(o, f);
        }
        for (o, f) in tail {
            back.add_fingerprint(o, f);
        }
        assert_eq!(back.len(), l.len());
        for text in ["id-5", "id-999", "seven", "absent"] {
            for min in [0, mid, n - 3] {
                assert_eq!(
                    back.candidates(text, min),
                    l.candidates(text, min),
                    "{text} {min}"
                );
            }
        }
    }

    #[test]
    fn t04_fingerprint_is_fnv1a_32() {
        assert_eq!(fingerprint(""), 0x811c_9dc5);
        assert_eq!(fingerprint("a"), 0xe40c_292c);
        assert_eq!(fingerprint("foobar"), 0xbf9c_f968);
    }
}
