//! Recovery on open: first a plan, computed from what is on disk without changing anything, then
//! the plan applied.
//!
//! [`survey`] lists the segment files and checks each record by record ([`Segment::recover`]
//! reads only; a sealed segment with a good index file is opened from it instead,
//! [`Segment::open_indexed`]): its longest valid dense prefix, the bytes after it, the highest index seen.
//! [`plan`] is a pure function of that and of the stored metadata (purge point, committed index):
//! which tails to cut, which segments to delete, and the [`RecoveryReport`]. [`apply`] carries it
//! out in order and syncs the directory.
//!
//! The rules, in segment order:
//! - A torn tail (bytes after the valid prefix) is cut. In the last segment that is an unsynced
//!   write; in a sealed one it is damage, and every later segment is dropped, since nothing after
//!   a damaged record can be trusted to be dense.
//! - A segment that starts past the next expected index (a gap not covered by the purge point) or
//!   before it (an overlap) is dropped, and so is everything after it.
//! - A sealed segment that is empty, or wholly at or below the purge point, holds nothing to serve
//!   and is deleted.
//! - The repair floor is the highest index this member is known to have held: the committed
//!   index it persisted, the indexes seen in records past damage, the first index of each dropped
//!   segment. At or below the recovered last index it is 0 (nothing was lost).
//!
//! Crash safety of the apply step: every action removes data the plan already judged untrusted,
//! so a crash half-way leaves a state the next open plans to the same outcome (a cut sealed
//! segment then shows as a gap before the segments that should have been dropped).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use super::RecoveryReport;
use super::segment::Segment;

/// What open found in one segment file, before changing anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Found {
    /// The first index, from the file name.
    pub(super) first: u64,
    /// Records in the valid dense prefix.
    pub(super) count: u64,
    /// Bytes after the valid prefix (a torn or damaged tail).
    pub(super) cut: u64,
    /// The highest index known to have been held in it (also past a damaged record).
    pub(super) seen: u64,
}

/// One step of recovery, on the segment whose first index is `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Cut the `bytes` after the valid prefix; `sealed`: not the last segment (damage, not a
    /// torn unsynced write).
    Cut {
        first: u64,
        bytes: u64,
        sealed: bool,
    },
    /// Delete the segment: it follows a damaged record or a gap, or overlaps the one before.
    Drop { first: u64 },
    /// Delete the segment: sealed and empty, or wholly purged.
    Discard { first: u64 },
}

/// What recovery will do, and what it will have found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) actions: Vec<Action>,
    pub(super) report: RecoveryReport,
    /// The last index of the log once the plan is applied (the purge point if no entry is left).
    pub(super) last_index: u64,
}

/// Plans recovery of the segments `found` (sorted by first index), given the stored purge point
/// and committed index.
pub(super) fn plan(found: &[Found], purged: Option<u64>, committed: Option<u64>) -> Plan {
    let mut report = RecoveryReport::default();
    let mut actions = Vec::new();
    let mut expect_next: Option<u64> = None;
    let mut damaged = false;
    let mut last_held: Option<u64> = None;
    // Entries at or below the purge point are gone for good; a gap up to it is no hole.
    let purged_next = purged.map(|p| p + 1).unwrap_or(0);
    for (i, f) in found.iter().enumerate() {
        let gap = expect_next.is_some_and(|n| f.first > n && f.first > purged_next);
        if damaged || gap || expect_next.is_some_and(|n| f.first < n) {
            // It held entries from `first` on: this member once stored at least that far.
            report.repair_floor = report.repair_floor.max(f.first);
            actions.push(Action::Drop { first: f.first });
            report.dropped_segments += 1;
            damaged = true;
            continue;
        }
        let is_last = i + 1 == found.len();
        report.repair_floor = report.repair_floor.max(f.seen);
        if f.cut > 0 {
            report.truncated_bytes += f.cut;
            actions.push(Action::Cut {
                first: f.first,
                bytes: f.cut,
                sealed: !is_last,
            });
            damaged |= !is_last;
        }
        report.entries += f.count;
        let next = f.first + f.count;
        expect_next = Some(next);
        // A segment wholly at or below the purge point (kept while it was the active one), or
        // an empty sealed one, holds nothing to serve.
        let fully_purged = next <= purged_next && !is_last;
        if (f.count == 0 && !is_last && !damaged) || fully_purged {
            actions.push(Action::Discard { first: f.first });
            continue;
        }
        report.segments += 1;
        if f.count > 0 {
            last_held = Some(next - 1);
        }
    }
    let last_index = last_held.or(purged).unwrap_or(0);
    if let Some(c) = committed {
        report.repair_floor = report.repair_floor.max(c);
    }
    if report.repair_floor <= last_index {
        report.repair_floor = 0;
    }
    Plan {
        actions,
        report,
        last_index,
    }
}

/// Lists the segment files of `dir` and checks each, changing nothing: the segments (each holding
/// its valid prefix) and what was found, in index order.
pub(super) fn survey(dir: &Path) -> io::Result<(Vec<Segment>, Vec<Found>)> {
    let mut firsts: Vec<(u64, std::path::PathBuf)> = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if let Some(stem) = name.strip_suffix(".log")
            && let Ok(first) = stem.parse::<u64>()
        {
            firsts.push((first, e.path()));
        }
    }
    firsts.sort();
    let mut segments = Vec::with_capacity(firsts.len());
    let mut found = Vec::with_capacity(firsts.len());
    let last = firsts.last().map(|(f, _)| *f);
    for (first, path) in firsts {
        // A sealed segment with a good index file is not read (its records are checked when
        // read); the last one, and any without a usable index, are read record by record.
        let indexed = match Some(first) == last {
            true => None,
            false => Segment::open_indexed(&path, first)?,
        };
        let (seg, cut, seen) = match indexed {
            Some(seg) => {
                let seen = seg.next_index() - 1;
                (seg, 0, seen)
            }
            None => Segment::recover(&path, first)?,
        };
        found.push(Found {
            first,
            count: seg.count(),
            cut,
            seen,
        });
        segments.push(seg);
    }
    Ok((segments, found))
}

/// Carries out `plan` on the surveyed `segments`; returns those kept, by first index.
pub(super) fn apply(
    dir: &Path,
    segments: Vec<Segment>,
    plan: &Plan,
) -> io::Result<BTreeMap<u64, Segment>> {
    let mut segments: BTreeMap<u64, Segment> =
        segments.into_iter().map(|s| (s.first_index(), s)).collect();
    for action in &plan.actions {
        match *action {
            Action::Cut {
                first,
                bytes,
                sealed,
            } => {
                let seg = segments
                    .get(&first)
                    .ok_or_else(|| io::Error::other(format!("no segment {first} to cut")))?;
                let path = Segment::path_for(dir, first);
                if sealed {
                    tracing::error!(path = %path.display(), cut = bytes, "damaged record inside a sealed log segment; later segments dropped");
                } else {
                    tracing::warn!(path = %path.display(), cut = bytes, "cut a torn tail from the log");
                }
                seg.cut_to_valid()?;
            }
            Action::Drop { first } => {
                let path = Segment::path_for(dir, first);
                // Everything after a damaged record, or after a gap, cannot be trusted to be dense.
                tracing::error!(path = %path.display(), "removing log segment after a damaged record or gap");
                if let Some(seg) = segments.remove(&first) {
                    seg.remove()?;
                }
            }
            Action::Discard { first } => {
                if let Some(seg) = segments.remove(&first) {
                    seg.remove()?;
                }
            }
        }
    }
    super::sync_dir(dir)?;
    if plan.report.repair_floor > 0 {
        tracing::error!(
            last_index = plan.last_index,
            held_before = plan.report.repair_floor,
            "the log lost entries this member had stored; it will not vote or campaign until \
             replication brings it back to index {}",
            plan.report.repair_floor
        );
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::Action::{Cut, Discard, Drop};
    use super::*;

    /// Writes the segment file of records `first..next` (blank entries), then `garbage`.
    fn write_segment(dir: &Path, first: u64, next: u64, garbage: &[u8]) {
        use crate::log_store::record;
        use crate::types::{EntryPayload, log_id};
        let mut buf = Vec::new();
        for i in first..next {
            record::encode(&mut buf, &log_id(1, 1, i), &EntryPayload::Blank).unwrap();
        }
        buf.extend_from_slice(garbage);
        std::fs::write(Segment::path_for(dir, first), buf).unwrap();
    }

    /// A segment from `first` holding `count` valid records, nothing else in it.
    fn seg(first: u64, count: u64) -> Found {
        Found {
            first,
            count,
            cut: 0,
            seen: (first + count).saturating_sub(1),
        }
    }

    fn torn(first: u64, count: u64, cut: u64) -> Found {
        Found {
            cut,
            ..seg(first, count)
        }
    }

    fn report(
        segments: usize,
        entries: u64,
        truncated_bytes: u64,
        dropped_segments: usize,
        repair_floor: u64,
    ) -> RecoveryReport {
        RecoveryReport {
            segments,
            entries,
            truncated_bytes,
            dropped_segments,
            repair_floor,
        }
    }

    #[test]
    fn t01_a_clean_log_is_kept_as_it_is() {
        let p = plan(&[seg(1, 10), seg(11, 5)], None, Some(15));
        assert_eq!(p.actions, vec![]);
        assert_eq!(p.report, report(2, 15, 0, 0, 0));
        assert_eq!(p.last_index, 15);
        // No files at all.
        let p = plan(&[], None, None);
        assert_eq!(
            (p.actions, p.report, p.last_index),
            (vec![], report(0, 0, 0, 0, 0), 0)
        );
    }

    #[test]
    fn t02_a_torn_tail_of_the_last_segment_is_cut() {
        let p = plan(&[seg(1, 10), torn(11, 3, 57)], None, Some(12));
        assert_eq!(
            p.actions,
            vec![Cut {
                first: 11,
                bytes: 57,
                sealed: false
            }]
        );
        assert_eq!(p.report, report(2, 13, 57, 0, 0));
        assert_eq!(p.last_index, 13);
    }

    #[test]
    fn t03_an_empty_last_segment_is_kept_an_empty_sealed_one_is_not() {
        // The active segment was just created (a roll) when the member stopped.
        let p = plan(&[seg(1, 10), seg(11, 0)], None, None);
        assert_eq!(p.actions, vec![]);
        assert_eq!(p.report, report(2, 10, 0, 0, 0));
        assert_eq!(p.last_index, 10);
        // Its only record was torn: cut, and the segment stays as the active one.
        let p = plan(&[seg(1, 10), torn(11, 0, 20)], None, None);
        assert_eq!(
            p.actions,
            vec![Cut {
                first: 11,
                bytes: 20,
                sealed: false
            }]
        );
        assert_eq!(p.report.segments, 2);
        // An empty segment before the last holds nothing: deleted (here the log went on past a
        // snapshot at 19, so 20 follows on).
        let p = plan(&[seg(1, 10), seg(11, 0), seg(20, 5)], Some(19), None);
        assert_eq!(p.actions, vec![Discard { first: 1 }, Discard { first: 11 }]);
        assert_eq!(p.report, report(1, 15, 0, 0, 0));
        assert_eq!(p.last_index, 24);
    }

    #[test]
    fn t04_a_gap_drops_every_later_segment() {
        // 16..20 are missing: 21.. cannot follow on, nor can anything after it.
        let p = plan(&[seg(1, 15), seg(21, 5), seg(26, 5)], None, None);
        assert_eq!(p.actions, vec![Drop { first: 21 }, Drop { first: 26 }]);
        // The member held at least up to index 26 once: it must repair to there.
        assert_eq!(p.report, report(1, 15, 0, 2, 26));
        assert_eq!(p.last_index, 15);
    }

    #[test]
    fn t05_an_overlapping_segment_is_dropped() {
        let p = plan(&[seg(1, 10), seg(8, 5)], None, None);
        assert_eq!(p.actions, vec![Drop { first: 8 }]);
        assert_eq!(p.report, report(1, 10, 0, 1, 0));
        assert_eq!(p.last_index, 10);
    }

    #[test]
    fn t06_damage_in_a_sealed_segment_drops_the_rest() {
        // A bad record at 6 in a sealed segment; records seen past it up to 9.
        let damaged = Found {
            first: 1,
            count: 5,
            cut: 400,
            seen: 9,
        };
        let p = plan(&[damaged, seg(11, 5), seg(16, 5)], None, Some(12));
        assert_eq!(
            p.actions,
            vec![
                Cut {
                    first: 1,
                    bytes: 400,
                    sealed: true
                },
                Drop { first: 11 },
                Drop { first: 16 },
            ]
        );
        assert_eq!(p.report, report(1, 5, 400, 2, 16));
        assert_eq!(p.last_index, 5);
        // Damage at the very first record of a sealed segment: it stays, empty, as the last.
        let p = plan(&[torn(1, 0, 100), seg(2, 5)], None, None);
        assert_eq!(
            p.actions,
            vec![
                Cut {
                    first: 1,
                    bytes: 100,
                    sealed: true
                },
                Drop { first: 2 },
            ]
        );
        assert_eq!(p.report, report(1, 0, 100, 1, 2));
        assert_eq!(p.last_index, 0);
    }

    #[test]
    fn t07_a_gap_up_to_the_purge_point_is_no_hole() {
        // Purged up to 20; the log went on from a snapshot at 20 in a new segment.
        let p = plan(&[seg(1, 5), seg(21, 5)], Some(20), Some(25));
        assert_eq!(p.actions, vec![Discard { first: 1 }]);
        assert_eq!(p.report, report(1, 10, 0, 0, 0));
        assert_eq!(p.last_index, 25);
        // A gap past the purge point still is one.
        let p = plan(&[seg(1, 5), seg(21, 5)], Some(10), None);
        assert_eq!(p.actions, vec![Discard { first: 1 }, Drop { first: 21 }]);
        assert_eq!(p.report, report(0, 5, 0, 1, 21));
        assert_eq!(p.last_index, 10);
    }

    #[test]
    fn t08_a_purge_beyond_the_files_keeps_only_the_last_segment() {
        // Purged up to 50 (a snapshot installed), no entry written after it yet.
        let p = plan(&[seg(1, 10), seg(11, 10)], Some(50), None);
        assert_eq!(p.actions, vec![Discard { first: 1 }]);
        // The active segment stays, even though wholly purged: its entries are never served.
        assert_eq!(p.report, report(1, 20, 0, 0, 0));
        assert_eq!(p.last_index, 20);
        // With no file at all, the log ends at the purge point.
        let p = plan(&[], Some(50), Some(50));
        assert_eq!(p.actions, vec![]);
        assert_eq!(p.report, report(0, 0, 0, 0, 0));
        assert_eq!(p.last_index, 50);
    }

    #[test]
    fn t09_a_committed_index_past_the_log_sets_the_repair_floor() {
        // The member had persisted commit index 30 but only 20 survived (a lost disk write).
        let p = plan(&[seg(1, 20)], None, Some(30));
        assert_eq!(p.report.repair_floor, 30);
        assert_eq!(p.last_index, 20);
        // At or below the last index nothing was lost.
        assert_eq!(plan(&[seg(1, 20)], None, Some(20)).report.repair_floor, 0);
    }

    #[test]
    fn t10_apply_cuts_and_deletes_as_planned() {
        let dir = tempfile::tempdir().unwrap();
        let write = |first, next, garbage: &[u8]| write_segment(dir.path(), first, next, garbage);
        write(1, 4, &[9; 13]); // damage at the end of a sealed segment
        write(4, 7, &[]);
        let len = |first| std::fs::metadata(Segment::path_for(dir.path(), first)).map(|m| m.len());
        let before = len(1).unwrap();
        let (segments, found) = survey(dir.path()).unwrap();
        assert_eq!(found, vec![torn(1, 3, 13), seg(4, 3)]);
        // The survey changed nothing.
        assert_eq!(len(1).unwrap(), before);
        let p = plan(&found, None, None);
        assert_eq!(
            p.actions,
            vec![
                Cut {
                    first: 1,
                    bytes: 13,
                    sealed: true
                },
                Drop { first: 4 },
            ]
        );
        let kept = apply(dir.path(), segments, &p).unwrap();
        assert_eq!(kept.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(len(1).unwrap(), before - 13);
        assert!(len(4).is_err());
        // A second survey finds a clean log.
        let (_, found) = survey(dir.path()).unwrap();
        assert_eq!(plan(&found, None, None).actions, vec![]);
    }

    /// A sealed segment with a good index file is opened from it; an index that no longer fits
    /// its file (a longer file, a changed byte, a damaged last record) is ignored and the segment
    /// read whole, as without one; a cut or a removal takes the index with it.
    #[test]
    fn t11_sealed_segments_open_from_their_index_file_only_when_it_fits() {
        let dir = tempfile::tempdir().unwrap();
        let write = |first, next, garbage: &[u8]| write_segment(dir.path(), first, next, garbage);
        let idx = |first| Segment::path_for(dir.path(), first).with_extension("idx");
        write(1, 4, &[]);
        write(4, 7, &[]);
        let (segments, found) = survey(dir.path()).unwrap();
        assert_eq!(found, vec![seg(1, 3), seg(4, 3)]);
        segments[0].write_index().unwrap();
        let opened = Segment::open_indexed(&Segment::path_for(dir.path(), 1), 1)
            .unwrap()
            .expect("a good index opens the segment");
        assert_eq!(
            (opened.count(), opened.len()),
            (segments[0].count(), segments[0].len())
        );
        let (_, found) = survey(dir.path()).unwrap();
        assert_eq!(found, vec![seg(1, 3), seg(4, 3)]);
        // The index of another segment, or one with a changed byte, opens nothing.
        assert!(
            Segment::open_indexed(&Segment::path_for(dir.path(), 1), 2)
                .unwrap()
                .is_none()
        );
        let good = std::fs::read(idx(1)).unwrap();
        for at in [0, 9, good.len() - 1] {
            let mut bad = good.clone();
            bad[at] ^= 1;
            std::fs::write(idx(1), bad).unwrap();
            assert!(
                Segment::open_indexed(&Segment::path_for(dir.path(), 1), 1)
                    .unwrap()
                    .is_none(),
                "byte {at}"
            );
        }
        // The file grew a torn tail after the index was written: read whole, the tail cut, and
        // the index goes with the cut.
        std::fs::write(idx(1), &good).unwrap();
        write(1, 4, &[9; 13]);
        assert!(
            Segment::open_indexed(&Segment::path_for(dir.path(), 1), 1)
                .unwrap()
                .is_none()
        );
        let (segments, found) = survey(dir.path()).unwrap();
        assert_eq!(found, vec![torn(1, 3, 13), seg(4, 3)]);
        let p = plan(&found, None, None);
        apply(dir.path(), segments, &p).unwrap();
        assert!(!idx(1).exists(), "the cut removed the index");
        // A damaged last record with an index of the right length: read whole.
        write(1, 4, &[]);
        write(4, 7, &[]);
        let (segments, _) = survey(dir.path()).unwrap();
        segments[0].write_index().unwrap();
        let mut b = std::fs::read(Segment::path_for(dir.path(), 1)).unwrap();
        let n = b.len();
        b[n - 1] ^= 0xFF;
        std::fs::write(Segment::path_for(dir.path(), 1), b).unwrap();
        let (_, found) = survey(dir.path()).unwrap();
        assert_eq!(found[0].count, 2, "{found:?}");
    }
}
