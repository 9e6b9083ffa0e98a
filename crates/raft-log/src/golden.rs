//! Shared helpers of the golden-bytes tests (log records, snapshot files): the hex form the
//! frozen literals are written in, and the three-node membership they encode.

use std::collections::{BTreeMap, BTreeSet};

/// Lower-case hex of `b`, two digits a byte: the form of the golden literals.
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Nodes 1, 2 and 3 at `127.0.0.1:9001..9003`, with `voters` voting.
pub(crate) fn membership(voters: &[u64]) -> openraft::Membership<u64, openraft::BasicNode> {
    let nodes: BTreeMap<u64, openraft::BasicNode> = [1u64, 2, 3]
        .into_iter()
        .map(|id| {
            (
                id,
                openraft::BasicNode {
                    addr: format!("127.0.0.1:900{id}"),
                },
            )
        })
        .collect();
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    openraft::Membership::new(vec![voters], nodes).expect("valid membership")
}
