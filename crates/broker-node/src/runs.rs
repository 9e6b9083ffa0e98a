//! A queue's runs ([`Run`]), oldest first, in chunks of [`CHUNK`] runs instead of one vector.
//!
//! A vector grows by doubling: it moves to a buffer twice its size, in fresh memory, and leaves the
//! old one behind. At 1,000 topics × 8 queues a part holds one message, so a queue gains a run per
//! message stored, and every replica's 8,000 vectors doubled in step: the fresh memory a replica
//! wrote to was about twice what it kept, and the kernel zeroes fresh memory (2 MiB at a time
//! where the allocator asks for huge pages) inside the write that first touches it. A chunk after
//! the first is allocated once, at its full size, and filled; the first grows as a vector does up
//! to its full size, so a queue of few runs holds no more than before. Trimming drops whole chunks
//! from the front.
//!
//! Every chunk but the first and the last holds exactly [`CHUNK`] runs (runs are added at the end
//! and dropped from the front), so a position is found by arithmetic and a search by a binary
//! search over the chunks, then within one. The last chunk, where runs are added, is held beside
//! the deque rather than in it, so adding a run touches the queue's state and that chunk only.

use std::collections::VecDeque;

use crate::state::Run;

/// Runs per chunk: 2,560 bytes, one allocation per 64 parts stored in a queue.
pub const CHUNK: usize = 64;
const _: () = assert!(CHUNK.is_power_of_two() && CHUNK * size_of::<Run>() <= 4096);

#[derive(Clone, Default)]
pub struct Runs {
    /// The chunks before the last, oldest first: none empty, all full ([`CHUNK`] runs) but the
    /// first, so the count of runs and any run's place follow from the first chunk's and the
    /// last chunk's lengths.
    sealed: VecDeque<Vec<Run>>,
    /// The last chunk, where runs are added; empty only when `sealed` is too. Held here rather
    /// than at the back of `sealed`, so adding a run reaches its place through the queue's state
    /// and the chunk itself: at 8,000 queues each of the deque's buffer and the chunk's header
    /// cost apply a cache miss per part stored.
    tail: Vec<Run>,
}

impl Runs {
    pub fn len(&self) -> usize {
        match self.tail.len() {
            0 => 0,
            n => self.start_of(self.sealed.len()) + n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.tail.is_empty()
    }

    /// The chunks, `sealed` then the tail.
    fn chunks(&self) -> usize {
        self.sealed.len() + usize::from(!self.tail.is_empty())
    }

    /// Chunk `k` (of [`Runs::chunks`]).
    fn chunk(&self, k: usize) -> Option<&[Run]> {
        match k.cmp(&self.sealed.len()) {
            std::cmp::Ordering::Less => Some(&self.sealed[k]),
            std::cmp::Ordering::Equal if !self.tail.is_empty() => Some(&self.tail),
            _ => None,
        }
    }

    pub fn first(&self) -> Option<&Run> {
        self.chunk(0).and_then(|c| c.first())
    }

    pub fn last(&self) -> Option<&Run> {
        self.tail.last()
    }

    pub fn push(&mut self, run: Run) {
        if self.tail.len() == CHUNK {
            // The first chunk grew as a vector does; the others are allocated whole.
            let full = std::mem::replace(&mut self.tail, Vec::with_capacity(CHUNK));
            self.sealed.push_back(full);
        }
        self.tail.push(run);
    }

    /// Runs in the first chunk (the one chunk that may hold fewer than [`CHUNK`] but the last).
    fn first_len(&self) -> usize {
        self.chunk(0).map_or(0, <[Run]>::len)
    }

    /// Where the run at position `i` is: (chunk, place in it).
    fn locate(&self, i: usize) -> (usize, usize) {
        let head = self.first_len();
        if i < head {
            (0, i)
        } else {
            let j = i - head;
            (1 + j / CHUNK, j % CHUNK)
        }
    }

    /// The position of the first run of chunk `k`.
    fn start_of(&self, k: usize) -> usize {
        match k {
            0 => 0,
            _ => self.first_len() + (k - 1) * CHUNK,
        }
    }

    pub fn get(&self, i: usize) -> Option<&Run> {
        let (k, at) = self.locate(i);
        self.chunk(k)?.get(at)
    }

    /// As `slice::partition_point`: the position of the first run `pred` is false for, where
    /// `pred` is true for every run before it and false for every run from it on.
    pub fn partition_point(&self, pred: impl Fn(&Run) -> bool) -> usize {
        let k = self.sealed.partition_point(|c| c.last().is_some_and(&pred));
        let c = self.chunk(k).unwrap_or_default();
        self.start_of(k) + c.partition_point(pred)
    }

    /// The runs from position `from` on, in order.
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = &Run> + Clone {
        let (k, at) = self.locate(from);
        let head: &[Run] = self.chunk(k).and_then(|c| c.get(at..)).unwrap_or_default();
        let sealed = self.sealed.len();
        // The tail follows only a head taken from `sealed`.
        let tail: &[Run] = if k < sealed { &self.tail } else { &[] };
        head.iter()
            .chain(
                self.sealed
                    .range((k + 1).min(sealed)..)
                    .flat_map(|c| c.iter()),
            )
            .chain(tail.iter())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Run> + Clone {
        self.iter_from(0)
    }

    /// The position of the first run stored by an entry after `index`. Found from the end, a
    /// chunk at a time, then a run at a time: a restart image asks for the runs of the last few
    /// seconds of every queue and copies them, and at 8,000 queues a binary search (over each
    /// whole queue, later over the chunk) cost a cache miss per step per queue per image, where
    /// the walk back reads only the runs the image copies next, and one more.
    pub fn after(&self, index: u64) -> usize {
        let mut k = self.chunks();
        while k > 0 && self.chunk(k - 1).is_some_and(|c| c[0].log_index > index) {
            k -= 1;
        }
        match k {
            0 => 0,
            _ => {
                let c = self.chunk(k - 1).unwrap_or_default();
                let later = c.iter().rev().take_while(|r| r.log_index > index).count();
                self.start_of(k - 1) + c.len() - later
            }
        }
    }

    /// Drops the first `n` runs (all of them when there are fewer); returns their bytes.
    pub fn drop_front(&mut self, n: usize) -> u64 {
        let mut dropped = 0;
        let mut left = n.min(self.len());
        while left > 0 {
            match self.sealed.front_mut() {
                Some(c) if c.len() <= left => {
                    left -= c.len();
                    dropped += c.iter().map(|r| r.bytes as u64).sum::<u64>();
                    self.sealed.pop_front();
                }
                Some(c) => {
                    dropped += c.drain(..left).map(|r| r.bytes as u64).sum::<u64>();
                    left = 0;
                }
                None => {
                    dropped += self.tail.drain(..left).map(|r| r.bytes as u64).sum::<u64>();
                    left = 0;
                }
            }
        }
        if self.tail.is_empty() {
            // All gone: a queue trimmed empty holds no chunk.
            self.tail = Vec::new();
        }
        dropped
    }

    /// The runs from position `from` on.
    pub fn since(&self, from: usize) -> RunsFrom<'_> {
        RunsFrom {
            runs: self,
            from: from.min(self.len()),
        }
    }
}

impl FromIterator<Run> for Runs {
    fn from_iter<I: IntoIterator<Item = Run>>(iter: I) -> Runs {
        let mut runs = Runs::default();
        for r in iter {
            runs.push(r);
        }
        runs
    }
}

impl std::ops::Index<usize> for Runs {
    type Output = Run;
    fn index(&self, i: usize) -> &Run {
        self.get(i).expect("a run at that position")
    }
}

/// Equal when they hold the same runs, however chunked.
impl PartialEq for Runs {
    fn eq(&self, other: &Runs) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Runs {}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The runs of a queue from a position on ([`Runs::since`]).
#[derive(Clone, Copy)]
pub struct RunsFrom<'a> {
    runs: &'a Runs,
    from: usize,
}

impl<'a> RunsFrom<'a> {
    pub fn len(&self) -> usize {
        self.runs.len() - self.from
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn first(&self) -> Option<&'a Run> {
        self.runs.get(self.from)
    }

    pub fn iter(&self) -> impl Iterator<Item = &'a Run> + Clone {
        self.runs.iter_from(self.from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(i: u64) -> Run {
        Run {
            first_offset: i * 2,
            log_index: 10 + i / 3,
            count: 2,
            tag_hash: i as u32,
            bytes: 1 + i as u32,
            store_ms: 1_000 + i,
            position: 0,
        }
    }

    /// A small deterministic generator (xorshift), so a failure names its seed.
    fn next(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    /// Every question asked of `runs` is answered as the vector `model` of the same runs would.
    fn check(runs: &Runs, model: &[Run], what: &str) {
        assert_eq!(runs.len(), model.len(), "{what}");
        assert_eq!(runs.is_empty(), model.is_empty(), "{what}");
        assert_eq!(runs.first(), model.first(), "{what}");
        assert_eq!(runs.last(), model.last(), "{what}");
        assert!(runs.iter().eq(model.iter()), "{what}");
        for i in 0..model.len() + 2 {
            assert_eq!(runs.get(i), model.get(i), "{what}: get {i}");
            let from = i.min(model.len());
            assert!(
                runs.iter_from(i).eq(model[from..].iter()),
                "{what}: from {i}"
            );
            assert_eq!(runs.since(i).len(), model.len() - from, "{what}: since {i}");
            assert_eq!(runs.since(i).first(), model.get(from), "{what}: since {i}");
        }
        let lo = model.first().map_or(0, |r| r.first_offset);
        let hi = model.last().map_or(0, |r| r.first_offset + 3);
        for o in lo.saturating_sub(1)..=hi {
            assert_eq!(
                runs.partition_point(|r| r.first_offset + r.count as u64 <= o),
                model.partition_point(|r| r.first_offset + r.count as u64 <= o),
                "{what}: partition at offset {o}"
            );
        }
        let (lo, hi) = (
            model.first().map_or(0, |r| r.log_index),
            model.last().map_or(0, |r| r.log_index),
        );
        for index in lo.saturating_sub(2)..=hi + 1 {
            assert_eq!(
                runs.after(index),
                model.partition_point(|r| r.log_index <= index),
                "{what}: after {index}"
            );
        }
    }

    /// 1. Pushes and drops from the front, in random sizes across chunk boundaries, keep every
    ///    answer the vector's: positions, searches, the runs from a position and their bytes
    ///    written.
    #[test]
    fn t1_runs_answer_as_the_vector_of_the_same_runs() {
        for seed in 1..=40u64 {
            let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut runs = Runs::default();
            let mut model: Vec<Run> = Vec::new();
            let mut n = 0u64;
            for step in 0..12 {
                for _ in 0..next(&mut s) % (3 * CHUNK as u64) {
                    runs.push(run(n));
                    model.push(run(n));
                    n += 1;
                }
                check(&runs, &model, &format!("seed {seed} step {step} pushed"));
                let k = (next(&mut s) % (model.len() as u64 + 2)) as usize;
                let gone = k.min(model.len());
                let want: u64 = model.drain(..gone).map(|r| r.bytes as u64).sum();
                assert_eq!(runs.drop_front(k), want, "seed {seed} step {step}: bytes");
                check(
                    &runs,
                    &model,
                    &format!("seed {seed} step {step} dropped {k}"),
                );
            }
        }
    }

    /// 2. Runs collected from a vector equal runs pushed and trimmed to the same list, though
    ///    chunked differently; and a run more makes them differ.
    #[test]
    fn t2_equal_is_the_same_runs_however_chunked() {
        let mut pushed = Runs::default();
        for i in 0..(3 * CHUNK as u64 + 5) {
            pushed.push(run(i));
        }
        pushed.drop_front(CHUNK + 7);
        let collected: Runs = (CHUNK as u64 + 7..3 * CHUNK as u64 + 5).map(run).collect();
        assert_eq!(pushed, collected);
        assert_ne!(
            pushed.chunk(0).map(<[Run]>::len),
            collected.chunk(0).map(<[Run]>::len),
            "chunked alike"
        );
        pushed.push(run(1_000));
        assert_ne!(pushed, collected);
    }

    /// 3. A chunk after the first is allocated at its full size, so pushing never moves a run
    ///    stored there; the first grows from a few runs, so a queue of one run holds no chunk of
    ///    64.
    #[test]
    fn t3_a_run_past_the_first_chunk_never_moves() {
        let mut runs = Runs::default();
        runs.push(run(0));
        assert!(runs.tail.capacity() < CHUNK);
        for i in 1..=(CHUNK as u64) {
            runs.push(run(i));
        }
        let at: *const Run = &runs[CHUNK];
        for i in CHUNK as u64 + 1..(4 * CHUNK as u64) {
            runs.push(run(i));
        }
        assert!(std::ptr::eq(at, &runs[CHUNK]));
        assert!(
            runs.sealed
                .iter()
                .chain([&runs.tail])
                .all(|c| c.capacity() == CHUNK)
        );
    }
}
