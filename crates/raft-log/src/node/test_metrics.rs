//! Hand-made openraft metrics for the unit tests of the pure mappings.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use openraft::metrics::SerdeInstant;
use openraft::{BasicNode, Membership, RaftMetrics, ServerState, StoredMembership, TokioInstant};

use crate::types::{TypeConfig, log_id};

/// Metrics of node `id` in `state` at `term`, in a group of `voters` plus `learners`; node `n`
/// listens at `10.0.0.n:9000`.
pub(crate) fn metrics(
    id: u64,
    state: ServerState,
    term: u64,
    voters: &[u64],
    learners: &[u64],
) -> RaftMetrics<TypeConfig> {
    let nodes: BTreeMap<u64, BasicNode> = voters
        .iter()
        .chain(learners)
        .map(|n| (*n, BasicNode::new(format!("10.0.0.{n}:9000"))))
        .collect();
    let config = vec![voters.iter().copied().collect::<BTreeSet<u64>>()];
    let membership = Membership::new(config, nodes).expect("valid membership");
    let mut m = RaftMetrics::new_initial(id);
    m.state = state;
    m.current_term = term;
    m.membership_config = Arc::new(StoredMembership::new(Some(log_id(1, 1, 1)), membership));
    m
}

/// Sets the leader's view of its peers: node → (matched index, heard from at).
pub(crate) fn lead(
    m: &mut RaftMetrics<TypeConfig>,
    peers: &[(u64, Option<u64>, Option<TokioInstant>)],
) {
    m.current_leader = Some(m.id);
    m.replication = Some(
        peers
            .iter()
            .map(|(n, matched, _)| (*n, matched.map(|i| log_id(m.current_term, m.id, i))))
            .collect(),
    );
    m.heartbeat = Some(
        peers
            .iter()
            .map(|(n, _, heard)| (*n, heard.map(SerdeInstant::new)))
            .collect(),
    );
}
