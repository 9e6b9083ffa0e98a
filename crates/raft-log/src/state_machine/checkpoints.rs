//! The state checkpoints apply keeps in memory until a snapshot is built from one (issue 20).
//!
//! A snapshot is the newest checkpoint at or below the compaction target, so the more checkpoints
//! are kept, the closer a purge comes to the retention point. But each holds the whole state: at
//! 1,000 topics the producer windows made one 12–16 MB, and retention may trim only once a day. So
//! the checkpoints are bounded by count and by bytes. Past either bound the interior checkpoint
//! whose neighbours are closest together is dropped: the kept ones stay about evenly spaced over
//! the log since the last snapshot, the oldest (which covers the widest range of targets) and the
//! newest are never dropped. The last one dropped is kept as a spare buffer for the next one to be
//! written into, so whatever the state's size, at most three copies of it are held.

use std::collections::BTreeMap;

/// Checkpoints kept at most.
pub const CHECKPOINTS_MAX: usize = 256;
/// Bytes of checkpoint data kept at most (beyond the oldest and the newest, always kept).
pub const CHECKPOINTS_BYTES_MAX: u64 = 64 << 20;

const _: () = assert!(CHECKPOINTS_MAX >= 8);
const _: () = assert!(CHECKPOINTS_BYTES_MAX >= 1 << 20 && CHECKPOINTS_BYTES_MAX <= 1 << 30);

/// What a checkpoint's size is counted by.
pub trait Measured {
    fn bytes(&self) -> u64;
}

/// Checkpoints by log index.
pub struct Checkpoints<T> {
    map: BTreeMap<u64, T>,
    bytes: u64,
    /// The last checkpoint dropped by thinning (not counted in `bytes`).
    spare: Option<T>,
    count_max: usize,
    bytes_max: u64,
}

impl<T: Measured> Checkpoints<T> {
    pub fn new(count_max: usize, bytes_max: u64) -> Checkpoints<T> {
        Checkpoints {
            map: BTreeMap::new(),
            bytes: 0,
            spare: None,
            count_max: count_max.max(2),
            bytes_max,
        }
    }

    /// Bytes of the checkpoints held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    #[cfg(test)]
    pub fn indexes(&self) -> impl Iterator<Item = u64> + '_ {
        self.map.keys().copied()
    }

    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &T)> {
        self.map.iter()
    }

    /// Keeps `cp`, the checkpoint of entry `index`, then thins the others back within bounds,
    /// keeping the last one dropped as the spare.
    pub fn insert(&mut self, index: u64, cp: T) {
        self.bytes += cp.bytes();
        if let Some(old) = self.map.insert(index, cp) {
            self.bytes -= old.bytes();
            self.spare = Some(old);
        }
        while self.map.len() > 2 && (self.map.len() > self.count_max || self.bytes > self.bytes_max)
        {
            if let Some(cp) = self.drop_closest() {
                self.spare = Some(cp);
            }
        }
    }

    /// The last checkpoint dropped, if any since the last call: its buffer can serve the next one.
    pub fn take_spare(&mut self) -> Option<T> {
        self.spare.take()
    }

    /// Drops the interior checkpoint whose neighbours are closest together (the oldest such).
    fn drop_closest(&mut self) -> Option<T> {
        let keys: Vec<u64> = self.map.keys().copied().collect();
        let victim = keys
            .windows(3)
            .min_by_key(|w| (w[2] - w[0], w[1]))
            .map(|w| w[1])?;
        let cp = self.map.remove(&victim)?;
        self.bytes -= cp.bytes();
        Some(cp)
    }

    /// The newest checkpoint at or below `target`, with every older one dropped (of no further
    /// use once it is the snapshot). None when none is that old.
    pub fn take_upto(&mut self, target: u64) -> Option<&T> {
        let key = *self.map.range(..=target).next_back()?.0;
        let keep = self.map.split_off(&key);
        self.bytes = keep.values().map(Measured::bytes).sum();
        self.map = keep;
        self.map.get(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Measured for u64 {
        fn bytes(&self) -> u64 {
            *self
        }
    }

    fn keys(c: &Checkpoints<u64>) -> Vec<u64> {
        c.indexes().collect()
    }

    /// 1. Within both bounds every checkpoint is kept; the bytes are their sum.
    #[test]
    fn t1_within_bounds_every_checkpoint_is_kept() {
        let mut c = Checkpoints::new(8, 1000);
        for i in 1..=8 {
            c.insert(i * 10, 100);
        }
        assert_eq!(keys(&c), [10, 20, 30, 40, 50, 60, 70, 80]);
        assert_eq!(c.bytes(), 800);
        // The same index again replaces its checkpoint.
        c.insert(80, 50);
        assert_eq!((c.map.len(), c.bytes()), (8, 750));
    }

    /// 2. Past the count the checkpoints stay evenly spaced, the oldest and the newest kept.
    #[test]
    fn t2_past_the_count_the_kept_ones_stay_evenly_spaced() {
        let mut c = Checkpoints::new(5, u64::MAX);
        for i in 1..=17 {
            c.insert(i, 1);
        }
        let k = keys(&c);
        assert_eq!(k.len(), 5);
        assert_eq!((k[0], k[4]), (1, 17));
        let gaps: Vec<u64> = k.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().max().unwrap() <= &(2 * gaps.iter().min().unwrap()),
            "uneven spacing {k:?}"
        );
        assert_eq!(c.bytes(), 5);
    }

    /// 3. Past the bytes the same: 12 MB checkpoints under a 64 MiB bound (1,000 topics' state).
    #[test]
    fn t3_past_the_bytes_large_checkpoints_are_thinned() {
        let mut c = Checkpoints::new(CHECKPOINTS_MAX, CHECKPOINTS_BYTES_MAX);
        let each = 12_000_000;
        for i in 1..=1000 {
            c.insert(i * 1024, each);
            assert!(c.bytes() <= CHECKPOINTS_BYTES_MAX, "{} bytes", c.bytes());
        }
        let k = keys(&c);
        assert_eq!(k.len(), 5);
        assert_eq!((k[0], k[4]), (1024, 1_024_000));
        // The oldest and the newest stay even when each alone is past the bound.
        let mut c = Checkpoints::new(CHECKPOINTS_MAX, 10);
        for i in 1..=5 {
            c.insert(i, 100);
        }
        assert_eq!(keys(&c), [1, 5]);
        assert_eq!(c.bytes(), 200);
        // What goes is handed back (its buffer serves the next checkpoint).
        c.insert(6, 70);
        assert_eq!(c.take_spare(), Some(100));
        assert_eq!(c.take_spare(), None);
        assert_eq!((keys(&c), c.bytes()), (vec![1, 6], 170));
    }

    /// 4. A snapshot takes the newest checkpoint at or below its target and drops the older ones.
    #[test]
    fn t4_a_snapshot_takes_the_newest_at_or_below_the_target() {
        let mut c = Checkpoints::new(8, u64::MAX);
        for i in 1..=5 {
            c.insert(i * 10, i);
        }
        assert_eq!(c.take_upto(5), None);
        assert_eq!(keys(&c), [10, 20, 30, 40, 50]);
        assert_eq!(c.take_upto(35), Some(&3));
        assert_eq!(keys(&c), [30, 40, 50]);
        assert_eq!(c.bytes(), 3 + 4 + 5);
        assert_eq!(c.take_upto(1000), Some(&5));
        assert_eq!((keys(&c), c.bytes()), (vec![50], 5));
    }
}
