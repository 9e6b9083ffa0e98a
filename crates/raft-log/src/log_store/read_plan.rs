//! Read planning: which entries of a range come from the tail cache and which from which segment
//! file, decided under the log's lock; the file reads are done after the lock is released
//! ([`ReadPlan::run`]), so a read from disk never holds up appends.
//!
//! Rules: entries at or below the purge point are never returned; a range starting below the
//! first held index skips to it; a missing index above it (a hole, or the end of the log) ends
//! the plan there. With a byte budget the plan stops once the planned entries hold that many
//! bytes, but always holds at least one entry if any is present.

use std::io;

use super::segment::{Segment, SegmentRead};
use super::{Inner, payload_len_hint};
use crate::types::{EntryPayload, LogId};

/// Entries to read, in order: some already in memory, some still to read from segment files.
#[derive(Default)]
pub(super) struct ReadPlan {
    pieces: Vec<Piece>,
}

enum Piece {
    Cached(Vec<(LogId, EntryPayload)>),
    File(SegmentRead),
}

impl ReadPlan {
    pub(super) fn reads_files(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::File(_)))
    }

    /// Bytes the plan reads from files.
    pub(super) fn file_bytes(&self) -> u64 {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::File(r) => r.bytes(),
                Piece::Cached(_) => 0,
            })
            .sum()
    }

    fn push_cached(&mut self, id: LogId, payload: EntryPayload) {
        if let Some(Piece::Cached(v)) = self.pieces.last_mut() {
            v.push((id, payload));
        } else {
            self.pieces.push(Piece::Cached(vec![(id, payload)]));
        }
    }

    /// Does the file reads (call it without the log's lock) and returns the entries in order.
    pub(super) fn run(self) -> io::Result<Vec<(LogId, EntryPayload)>> {
        let mut out = Vec::new();
        for p in self.pieces {
            match p {
                Piece::Cached(mut v) => out.append(&mut v),
                Piece::File(r) => r.read(&mut out)?,
            }
        }
        Ok(out)
    }
}

impl Inner {
    fn segment_of(&self, index: u64) -> Option<&Segment> {
        let (_, s) = self.segments.range(..=index).next_back()?;
        (index < s.next_index()).then_some(s)
    }

    /// Plans reading entries `[start, end)`: those in the tail cache are taken at once, the rest
    /// become file reads that [`ReadPlan::run`] does after the caller released the lock (a read
    /// from disk must not hold up appends).
    pub(super) fn plan_range(&self, start: u64, end: u64) -> ReadPlan {
        self.plan_range_within(start, end, u64::MAX)
    }

    /// As [`Self::plan_range`], stopping once the planned records hold `budget` bytes (at least one
    /// entry is planned whatever its size).
    pub(super) fn plan_range_within(&self, start: u64, end: u64, budget: u64) -> ReadPlan {
        let mut plan = ReadPlan::default();
        let mut left = budget;
        let mut i = match self.purged {
            Some(p) => start.max(p + 1),
            None => start,
        };
        while i < end {
            if let Some(e) = self.tail.get(i) {
                let size = payload_len_hint(&e.payload) as u64;
                if size > left && !plan.pieces.is_empty() {
                    break;
                }
                left = left.saturating_sub(size);
                plan.push_cached(e.log_id, e.payload.clone());
                i += 1;
                continue;
            }
            let Some(seg) = self.segment_of(i) else {
                // Below the first held index (purged, or never written): skip to what is held.
                // A missing index above it is a hole: stop there rather than skip it.
                let floor = self.purged.map_or(0, |p| p + 1);
                let below_start = self
                    .segments
                    .range(..=i)
                    .all(|(_, s)| s.next_index() <= floor);
                match self.segments.range(i + 1..).next() {
                    Some((first, _)) if *first < end && below_start => {
                        i = *first;
                        continue;
                    }
                    _ => break,
                }
            };
            let mut stop = end.min(seg.next_index());
            if let Some(cached) = self.tail.first_held()
                && i < cached
            {
                stop = stop.min(cached);
            }
            let (stop, bytes) = seg.end_within(i, stop, left, plan.pieces.is_empty());
            if stop == i {
                break;
            }
            left = left.saturating_sub(bytes);
            plan.pieces.extend(seg.plan_read(i, stop).map(Piece::File));
            i = stop;
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;
    use crate::log_store::record;
    use crate::log_store::tail_cache::TailCache;
    use crate::types::{Entry, Payload, log_id};

    const PAYLOAD_BYTES: usize = 100;

    fn payload(i: u64) -> EntryPayload {
        EntryPayload::Normal(Payload(vec![i as u8; PAYLOAD_BYTES].into()))
    }

    /// A segment file holding `[first, next)`.
    fn segment(dir: &Path, first: u64, next: u64) -> Segment {
        let mut seg = Segment::create(dir, first, 0).unwrap();
        let (mut buf, mut idx) = (record::Records::default(), Vec::new());
        for i in first..next {
            idx.push((i, buf.len() as u64));
            buf.push(&log_id(1, 1, i), &payload(i)).unwrap();
        }
        seg.append(&buf, &idx).unwrap();
        seg
    }

    /// A log of the given segments (each `[first, next)`), purged up to `purged`, with the
    /// entries `cached` also in the tail cache.
    fn log(
        dir: &Path,
        segs: &[(u64, u64)],
        purged: Option<u64>,
        cached: std::ops::Range<u64>,
    ) -> Inner {
        let segments: BTreeMap<u64, Segment> = segs
            .iter()
            .map(|&(first, next)| (first, segment(dir, first, next)))
            .collect();
        let mut tail = TailCache::default();
        for i in cached {
            tail.push(Entry {
                log_id: log_id(1, 1, i),
                payload: payload(i),
            });
        }
        Inner {
            dir: dir.to_path_buf(),
            segments,
            last: None,
            purged,
            segment_bytes_max: u64::MAX,
            page_cache_window_bytes: 0,
            tail,
        }
    }

    fn indexes(plan: ReadPlan) -> Vec<u64> {
        let rows = plan.run().unwrap();
        for (id, p) in &rows {
            assert_eq!(*p, payload(id.index), "payload of {}", id.index);
        }
        rows.iter().map(|(id, _)| id.index).collect()
    }

    /// The kinds of the pieces: 'c' cached, 'f' file.
    fn shape(plan: &ReadPlan) -> String {
        plan.pieces
            .iter()
            .map(|p| match p {
                Piece::Cached(_) => 'c',
                Piece::File(_) => 'f',
            })
            .collect()
    }

    #[test]
    fn t01_reads_across_segments_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let g = log(dir.path(), &[(1, 5), (5, 9)], None, 0..0);
        let plan = g.plan_range(2, 8);
        assert_eq!(shape(&plan), "ff");
        assert!(plan.reads_files());
        assert_eq!(indexes(plan), vec![2, 3, 4, 5, 6, 7]);
        // Past the end of the log: what is held.
        assert_eq!(indexes(g.plan_range(6, 100)), vec![6, 7, 8]);
        assert_eq!(indexes(g.plan_range(9, 100)), Vec::<u64>::new());
        assert_eq!(indexes(g.plan_range(5, 5)), Vec::<u64>::new());
    }

    #[test]
    fn t02_cached_entries_come_from_memory() {
        let dir = tempfile::tempdir().unwrap();
        let g = log(dir.path(), &[(1, 10)], None, 6..10);
        let plan = g.plan_range(3, 10);
        // The file read stops where the cache begins.
        assert_eq!(shape(&plan), "fc");
        assert_eq!(indexes(plan), vec![3, 4, 5, 6, 7, 8, 9]);
        let plan = g.plan_range(7, 10);
        assert_eq!(shape(&plan), "c");
        assert!(!plan.reads_files());
        assert_eq!(plan.file_bytes(), 0);
        assert_eq!(indexes(plan), vec![7, 8, 9]);
    }

    #[test]
    fn t03_a_budget_cuts_the_plan_but_keeps_one_entry() {
        let dir = tempfile::tempdir().unwrap();
        let g = log(dir.path(), &[(1, 10)], None, 8..10);
        // From files: at least one entry, however small the budget.
        assert_eq!(indexes(g.plan_range_within(1, 10, 1)), vec![1]);
        let one = g.plan_range_within(1, 10, 1).file_bytes();
        assert!(one > PAYLOAD_BYTES as u64);
        // Room for three records: three.
        let plan = g.plan_range_within(1, 10, 3 * one);
        assert_eq!(plan.file_bytes(), 3 * one);
        assert_eq!(indexes(plan), vec![1, 2, 3]);
        // From the cache: also at least one.
        assert_eq!(indexes(g.plan_range_within(8, 10, 1)), vec![8]);
        // Unbounded: everything.
        assert_eq!(indexes(g.plan_range_within(1, 10, u64::MAX)).len(), 9);
    }

    #[test]
    fn t04_purged_entries_are_never_returned() {
        let dir = tempfile::tempdir().unwrap();
        // The segment of 1..6 stays while it is active, but 1..=3 are purged.
        let g = log(dir.path(), &[(1, 6)], Some(3), 0..0);
        assert_eq!(indexes(g.plan_range(0, 6)), vec![4, 5]);
        assert_eq!(indexes(g.plan_range(2, 3)), Vec::<u64>::new());
    }

    #[test]
    fn t05_below_the_first_held_index_skips_to_it() {
        let dir = tempfile::tempdir().unwrap();
        // Purged up to 4, the files begin at 5.
        let g = log(dir.path(), &[(5, 8)], Some(4), 0..0);
        assert_eq!(indexes(g.plan_range(1, 7)), vec![5, 6]);
        // Never written below 5 (the log began past a snapshot): the same.
        let dir = tempfile::tempdir().unwrap();
        let g = log(dir.path(), &[(5, 8)], None, 0..0);
        assert_eq!(indexes(g.plan_range(1, 7)), vec![5, 6]);
    }

    #[test]
    fn t06_a_hole_ends_the_plan() {
        let dir = tempfile::tempdir().unwrap();
        // 4..7 are missing and not purged: a read never skips over them.
        let g = log(dir.path(), &[(1, 4), (7, 9)], None, 0..0);
        assert_eq!(indexes(g.plan_range(1, 9)), vec![1, 2, 3]);
        assert_eq!(indexes(g.plan_range(5, 9)), Vec::<u64>::new());
    }
}
