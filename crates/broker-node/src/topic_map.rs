//! The topics of a broker group's state by name: a hash map for the lookups apply makes on every
//! stored part, listed and encoded in name order.
//!
//! A `BTreeMap<String, _>` lookup compares the name against a dozen or more keys, each behind its
//! own heap pointer: over 1,000 topics that was ~590 instructions per message on every replica
//! (`scripts/instructions`, `spread`), and a cache miss per key compared. One foldhash of the name
//! and one comparison replace them.
//!
//! Whatever shows the topics in a sequence (a snapshot, a listing, the status) takes them in name
//! order ([`TopicMap::sorted`]), so a snapshot holds the same bytes the B-tree gave (postcard
//! encodes a map as its length and its pairs) and a listing reads the same as before; only what
//! does not depend on the order (trimming every queue, metrics, a restart image's deltas, which
//! name their topic) walks the map as it lies ([`TopicMap::values_mut`], [`TopicMap::unordered`]).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::state::TopicState;

/// See the module docs. A fixed hasher: the map's layout is the same in every process, though
/// nothing may depend on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicMap(HashMap<String, TopicState, foldhash::fast::FixedState>);

impl TopicMap {
    pub fn get(&self, name: &str) -> Option<&TopicState> {
        self.0.get(name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut TopicState> {
        self.0.get_mut(name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn insert(&mut self, name: String, t: TopicState) -> Option<TopicState> {
        self.0.insert(name, t)
    }

    pub fn remove(&mut self, name: &str) -> Option<TopicState> {
        self.0.remove(name)
    }

    pub fn entry(&mut self, name: String) -> Entry<'_, String, TopicState> {
        self.0.entry(name)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The topics in name order.
    pub fn sorted(&self) -> Vec<(&String, &TopicState)> {
        let mut v: Vec<_> = self.0.iter().collect();
        v.sort_unstable_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// The topics in no particular order: only for what does not depend on it.
    pub fn unordered(&self) -> impl Iterator<Item = (&String, &TopicState)> {
        self.0.iter()
    }

    /// Every topic, to change, in no particular order: only for what does not depend on it.
    pub fn unordered_mut(&mut self) -> impl Iterator<Item = (&String, &mut TopicState)> {
        self.0.iter_mut()
    }

    /// Every topic's state, to change, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut TopicState> {
        self.0.values_mut()
    }
}

impl std::ops::Index<&str> for TopicMap {
    type Output = TopicState;

    fn index(&self, name: &str) -> &TopicState {
        &self.0[name]
    }
}

impl FromIterator<(String, TopicState)> for TopicMap {
    fn from_iter<I: IntoIterator<Item = (String, TopicState)>>(it: I) -> TopicMap {
        TopicMap(it.into_iter().collect())
    }
}

impl Serialize for TopicMap {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.sorted())
    }
}

impl<'de> Deserialize<'de> for TopicMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TopicMap, D::Error> {
        HashMap::deserialize(d).map(TopicMap)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn topic(queues: usize) -> TopicState {
        TopicState {
            queues: vec![Default::default(); queues],
        }
    }

    /// 1. Encoded as the B-tree was (the snapshot format does not change), whatever the order of
    ///    insertion, and decoded back to the same map; listed in name order.
    #[test]
    fn t1_encoded_and_listed_in_name_order() {
        let names: Vec<String> = (0..300)
            .map(|i| format!("t-{:03}", (i * 7919) % 300))
            .collect();
        let mut map = TopicMap::default();
        let mut tree = BTreeMap::new();
        for (i, n) in names.iter().enumerate() {
            map.insert(n.clone(), topic(1 + i % 4));
            tree.insert(n.clone(), topic(1 + i % 4));
        }
        let bytes = postcard::to_allocvec(&map).unwrap();
        assert_eq!(bytes, postcard::to_allocvec(&tree).unwrap());
        let back: TopicMap = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, map);
        let listed: Vec<&String> = map.sorted().into_iter().map(|(n, _)| n).collect();
        assert_eq!(listed, tree.keys().collect::<Vec<_>>());
        assert_eq!(map["t-005"].queues.len(), tree["t-005"].queues.len());
    }
}
