//! Small metadata of the log in sled: vote, committed log id, last purged log id, and the format
//! version of the whole data dir.
//!
//! Writes that something depends on (vote, purged) are flushed before they return. The committed
//! log id is written without a flush: losing its last value only makes a restarted member re-apply
//! fewer entries before it hears from the leader again.
//!
//! ## Keys of the `raft` tree (data-dir format version 1)
//!
//! Every value is postcard-encoded:
//!
//! | key              | value                                                                     |
//! |------------------|---------------------------------------------------------------------------|
//! | `format_version` | `u32` varint: the data dir's format version ([`DATA_DIR_FORMAT_VERSION`]) |
//! | `vote`           | openraft's `Vote`: term, node id (varints), committed (`bool`)            |
//! | `committed`      | `Option<LogId>`: tag, then term, node id, index (varints)                 |
//! | `purged`         | `LogId`: term, node id, index (varints)                                   |
//!
//! The data-dir version covers everything under the data dir that has no version of its own: the
//! record layout of the segments (`record.rs`), the entry payloads in them, and these values. A log
//! record carries no version because a reader that cannot parse a record takes it for a torn tail
//! and cuts the log there: a new record layout must therefore be announced here, before any segment
//! is read. [`Meta::open`] reads the key (absent: a data dir of a build from before versioning, or a
//! new one, which is version 1) and writes it when absent; a data dir of a newer version stops the
//! member before it reads anything else.

use std::io;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::{LogId, Vote};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";
const FORMAT_VERSION: &[u8] = b"format_version";

/// The data-dir format version this build writes and the newest it reads.
pub const DATA_DIR_FORMAT_VERSION: u32 = 1;

#[derive(Clone)]
pub struct Meta {
    tree: sled::Tree,
}

fn sled_err(e: sled::Error) -> io::Error {
    io::Error::other(format!("metadata store: {e}"))
}

impl Meta {
    /// Wraps a tree without checking its format version (tests of the log store).
    pub fn new(tree: sled::Tree) -> Meta {
        Meta { tree }
    }

    /// Opens the metadata of a data dir: checks its format version and records version 1 when none
    /// is recorded yet. A newer version is an error (which the caller prefixes with the path), and
    /// the member must not start: it would misread the log.
    pub fn open(tree: sled::Tree) -> io::Result<Meta> {
        let meta = Meta { tree };
        match meta.get::<u32>(FORMAT_VERSION)? {
            Some(found) if found > DATA_DIR_FORMAT_VERSION => {
                return Err(crate::state_machine::format::NewerFormat {
                    what: "the data dir".to_string(),
                    found,
                    known: DATA_DIR_FORMAT_VERSION,
                }
                .into());
            }
            Some(_) => {}
            None => meta.put(FORMAT_VERSION, &DATA_DIR_FORMAT_VERSION, true)?,
        }
        Ok(meta)
    }

    /// The recorded format version of the data dir (absent: version 1).
    pub fn format_version(&self) -> io::Result<u32> {
        Ok(self.get(FORMAT_VERSION)?.unwrap_or(1))
    }

    fn get<T: DeserializeOwned>(&self, key: &[u8]) -> io::Result<Option<T>> {
        match self.tree.get(key).map_err(sled_err)? {
            None => Ok(None),
            Some(v) => postcard::from_bytes(&v)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        }
    }

    fn put<T: Serialize>(&self, key: &[u8], v: &T, flush: bool) -> io::Result<()> {
        let bytes = postcard::to_stdvec(v).map_err(io::Error::other)?;
        self.tree.insert(key, bytes).map_err(sled_err)?;
        if flush {
            self.tree.flush().map_err(sled_err)?;
        }
        Ok(())
    }

    pub fn vote(&self) -> io::Result<Option<Vote>> {
        self.get(VOTE)
    }
    pub fn save_vote(&self, v: &Vote) -> io::Result<()> {
        self.put(VOTE, v, true)
    }
    pub fn committed(&self) -> io::Result<Option<LogId>> {
        Ok(self.get::<Option<LogId>>(COMMITTED)?.flatten())
    }
    pub fn save_committed(&self, c: Option<LogId>) -> io::Result<()> {
        self.put(COMMITTED, &c, false)
    }
    pub fn purged(&self) -> io::Result<Option<LogId>> {
        self.get(PURGED)
    }
    pub fn save_purged(&self, p: &LogId) -> io::Result<()> {
        self.put(PURGED, p, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn temp_tree() -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        db.open_tree("raft").unwrap()
    }

    /// Golden bytes: the values of the store as today's code writes them, frozen before format
    /// versions were added. Never update a literal: a metadata store on disk would no longer read.
    #[test]
    fn values_are_stored_as_their_golden_bytes() {
        let tree = temp_tree();
        let meta = Meta::new(tree.clone());
        meta.save_vote(&Vote::new(7, 2)).unwrap();
        meta.save_committed(Some(crate::types::log_id(7, 2, 1000)))
            .unwrap();
        meta.save_purged(&crate::types::log_id(5, 1, 300)).unwrap();
        let stored = |k: &[u8]| hex(&tree.get(k).unwrap().unwrap());
        println!(
            "vote {}\ncommitted {}\npurged {}",
            stored(VOTE),
            stored(COMMITTED),
            stored(PURGED)
        );
        assert_eq!(stored(VOTE), "070200");
        assert_eq!(stored(COMMITTED), "010702e807");
        assert_eq!(stored(PURGED), "0501ac02");
        assert_eq!(meta.vote().unwrap(), Some(Vote::new(7, 2)));
        assert_eq!(
            meta.committed().unwrap(),
            Some(crate::types::log_id(7, 2, 1000))
        );
        assert_eq!(
            meta.purged().unwrap(),
            Some(crate::types::log_id(5, 1, 300))
        );
    }

    #[test]
    fn a_data_dir_without_a_version_is_version_1_and_gets_it_written() {
        let tree = temp_tree();
        // As a build from before versioning left it: values, no version key.
        Meta::new(tree.clone()).save_vote(&Vote::new(3, 1)).unwrap();
        assert_eq!(Meta::new(tree.clone()).format_version().unwrap(), 1);
        assert!(tree.get(FORMAT_VERSION).unwrap().is_none());
        let meta = Meta::open(tree.clone()).unwrap();
        assert_eq!(hex(&tree.get(FORMAT_VERSION).unwrap().unwrap()), "01");
        assert_eq!(meta.vote().unwrap(), Some(Vote::new(3, 1)));
        // Opening again reads it back.
        assert!(Meta::open(tree).is_ok());
    }

    #[test]
    fn a_data_dir_of_a_newer_format_is_refused_with_a_message_that_says_so() {
        let tree = temp_tree();
        Meta::new(tree.clone())
            .put(FORMAT_VERSION, &3u32, true)
            .unwrap();
        let Err(e) = Meta::open(tree.clone()) else {
            panic!("a newer data dir was opened");
        };
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            e.to_string(),
            "the data dir was written by format version 3; this broker-node reads up to \
             version 1: upgrade the binary"
        );
        // The refused data dir is left as it was.
        assert_eq!(Meta::new(tree).format_version().unwrap(), 3);
    }
}
