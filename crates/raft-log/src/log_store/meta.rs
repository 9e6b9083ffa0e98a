//! Small metadata of the log in sled: vote, committed log id, last purged log id.
//!
//! Writes that something depends on (vote, purged) are flushed before they return. The committed
//! log id is written without a flush: losing its last value only makes a restarted member re-apply
//! fewer entries before it hears from the leader again.

use std::io;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::types::{LogId, Vote};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"purged";

#[derive(Clone)]
pub struct Meta {
    tree: sled::Tree,
}

fn sled_err(e: sled::Error) -> io::Error {
    io::Error::other(format!("metadata store: {e}"))
}

impl Meta {
    pub fn new(tree: sled::Tree) -> Meta {
        Meta { tree }
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
}
