//! The write path: encoding appended entries into records and writing them to the active segment,
//! rolling to a new segment when it is full (or when the log goes on past a snapshot). Writes go
//! to the page cache only; what makes them durable is the flusher, given the returned targets.

use std::io;

use super::segment::Segment;
use super::{Inner, LogStore, SyncTarget, poisoned, record, sync_dir};
use crate::types::Entry;

impl LogStore {
    /// Writes `entries` (which must follow the last index) and returns the files to sync.
    pub(super) fn write_entries(&self, entries: Vec<Entry>) -> io::Result<Vec<SyncTarget>> {
        let mut g = self.inner.write().map_err(|_| poisoned())?;
        // The records' own bytes (headers, small payloads); large payloads are written from where
        // they lie (`record::Records`).
        let mut buf = record::Records::with_capacity(
            entries
                .iter()
                .map(|e| record::head_bytes_hint(&e.payload))
                .sum::<usize>()
                .min(g.segment_bytes_max as usize),
        );
        let mut files = Vec::new();
        let mut batch_first: Option<u64> = None;
        let mut idx_in_buf: Vec<(u64, u64)> = Vec::new(); // (index, offset in buf)
        for e in entries {
            let id = e.log_id;
            if let Some(last) = g.last
                && id.index != last.index + 1
            {
                return Err(io::Error::other(format!(
                    "log hole: appending index {} after {}",
                    id.index, last.index
                )));
            }
            let need_roll = match g.segments.values().next_back() {
                None => true,
                Some(s) => {
                    (s.len() + buf.len() as u64 >= g.segment_bytes_max
                        && (s.count() > 0 || !buf.is_empty()))
                        // After a snapshot install the log goes on past the active segment's end:
                        // start a new segment there, so a segment's indexes stay dense.
                        || (buf.is_empty() && s.next_index() != id.index)
                }
            };
            if need_roll {
                if !buf.is_empty() {
                    files.push(g.flush_buf(&mut buf, &mut idx_in_buf)?);
                }
                if let Some(sealed) = g.segments.values().next_back() {
                    sealed.seal()?;
                    // The segment being sealed leaves the page cache whole once it is on disk.
                    if g.page_cache_window_bytes > 0 {
                        files.push(sealed.sync_target(u64::MAX));
                    }
                    // Its index file: the next start opens it without reading it. Without one
                    // (a failed write) it is read whole, as before.
                    if sealed.count() > 0
                        && let Err(e) = sealed.write_index()
                    {
                        tracing::warn!(error = %e, "writing a sealed segment's index file");
                    }
                }
                let dir = g.dir.clone();
                let seg = Segment::create(&dir, id.index, g.segment_bytes_max)?;
                sync_dir(&dir)?;
                g.segments.insert(id.index, seg);
                batch_first = None;
            }
            batch_first.get_or_insert(id.index);
            idx_in_buf.push((id.index, buf.len() as u64));
            buf.push(&id, &e.payload)?;
            g.last = Some(id);
            g.tail.push(e);
        }
        if !buf.is_empty() {
            files.push(g.flush_buf(&mut buf, &mut idx_in_buf)?);
        }
        Ok(files)
    }
}

impl Inner {
    fn flush_buf(
        &mut self,
        buf: &mut record::Records,
        idx: &mut Vec<(u64, u64)>,
    ) -> io::Result<SyncTarget> {
        let seg = self
            .segments
            .values_mut()
            .next_back()
            .ok_or_else(|| io::Error::other("no active segment"))?;
        seg.append(buf, idx)?;
        buf.clear();
        idx.clear();
        let uncache_below = match self.page_cache_window_bytes {
            0 => 0,
            w => seg.len().saturating_sub(w),
        };
        Ok(seg.sync_target(uncache_below))
    }
}
