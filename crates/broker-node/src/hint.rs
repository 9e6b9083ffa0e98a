//! The read hint: which node a consumer should pull a queue from next time. Pure: it takes the
//! node's view as arguments and returns a decision, so it is tested without a cluster.

use crate::config::ReadHintConfig;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowerView {
    pub node_id: u64,
    pub address: String,
    /// Milliseconds since the leader last heard from it; None = never.
    pub last_ack_ms: Option<u64>,
    /// The highest log index it holds.
    pub matched: u64,
}

#[derive(Debug, Clone)]
pub enum NodeView {
    Leader {
        followers: Vec<FollowerView>,
        produce_msgs_per_sec: f64,
    },
    Follower {
        leader: Option<(u64, String)>,
        millis_since_leader_contact: Option<u64>,
        /// Committed entries this follower knows of but has not applied.
        apply_backlog: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hint {
    pub node_id: u64,
    pub address: String,
    pub reason: &'static str,
}

/// A consumer's position in one queue, as this node sees it.
#[derive(Debug, Clone)]
pub struct PullPosition<'a> {
    pub consumer_id: &'a str,
    pub queue: u32,
    pub next_offset: u64,
    /// One past the last applied offset of the queue on this node.
    pub max_offset: u64,
    /// The log index the follower needs to serve `next_offset` (the index of the entry holding it,
    /// or this node's applied index when the consumer is at the tail).
    pub needed_index: u64,
}

pub fn decide(
    me: (u64, &str),
    view: &NodeView,
    pos: &PullPosition<'_>,
    cfg: &ReadHintConfig,
    election_timeout_ms: u64,
) -> Hint {
    let stay = |reason| Hint {
        node_id: me.0,
        address: me.1.to_string(),
        reason,
    };
    match view {
        NodeView::Leader {
            followers,
            produce_msgs_per_sec,
        } => {
            let busy = *produce_msgs_per_sec > cfg.leader_busy_msgs_per_sec;
            let cold = pos.max_offset.saturating_sub(pos.next_offset) > cfg.cold_read_lag;
            if !busy && !cold {
                return stay("leader is not loaded");
            }
            let mut ok: Vec<&FollowerView> = followers
                .iter()
                .filter(|f| {
                    f.last_ack_ms.is_some_and(|ms| ms < election_timeout_ms)
                        && f.matched >= pos.needed_index
                })
                .collect();
            if ok.is_empty() {
                return stay("no follower is reachable and caught up");
            }
            ok.sort_by_key(|f| f.node_id);
            // Spread consumers across followers, the same follower for the same consumer and queue.
            let pick = ok[(stable_hash(pos.consumer_id, pos.queue) % ok.len() as u64) as usize];
            Hint {
                node_id: pick.node_id,
                address: pick.address.clone(),
                reason: if busy {
                    "leader is loaded"
                } else {
                    "cold read far behind the tail"
                },
            }
        }
        NodeView::Follower {
            leader,
            millis_since_leader_contact,
            apply_backlog,
        } => {
            let Some((lid, laddr)) = leader else {
                return stay("no leader known");
            };
            let to_leader = |reason| Hint {
                node_id: *lid,
                address: laddr.clone(),
                reason,
            };
            if millis_since_leader_contact.is_none_or(|ms| ms > election_timeout_ms) {
                return to_leader("follower lost contact with the leader");
            }
            if pos.next_offset >= pos.max_offset && *apply_backlog > cfg.follower_lag_redirect {
                return to_leader("consumer reached this follower's end and the leader is ahead");
            }
            stay("follower is caught up")
        }
    }
}

/// Adjusts the hint [`decide`] chose for a pull that served nothing because this node no longer
/// holds the entry the consumer needs (it was purged here, or lies before a snapshot this node
/// installed): the leader holds it, so the consumer goes there, if a leader is known. Otherwise, or
/// when something was served, the decided hint stands.
pub fn redirect_when_not_held(
    decided: Hint,
    not_held_here: bool,
    leader: Option<(u64, String)>,
) -> Hint {
    match leader {
        Some((node_id, address)) if not_held_here => Hint {
            node_id,
            address,
            reason: "entry not held here",
        },
        _ => decided,
    }
}

/// FNV-1a: stable across processes and releases, unlike std's hasher.
fn stable_hash(s: &str, q: u32) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.as_bytes().iter().chain(q.to_le_bytes().iter()) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(id: u64, ack: Option<u64>, matched: u64) -> FollowerView {
        FollowerView {
            node_id: id,
            address: format!("n{id}:1"),
            last_ack_ms: ack,
            matched,
        }
    }
    fn pos(next: u64, max: u64, needed: u64) -> PullPosition<'static> {
        PullPosition {
            consumer_id: "c1",
            queue: 0,
            next_offset: next,
            max_offset: max,
            needed_index: needed,
        }
    }
    const CFG: ReadHintConfig = ReadHintConfig {
        leader_busy_msgs_per_sec: 1000.0,
        cold_read_lag: 100,
        follower_lag_redirect: 50,
    };

    /// The node a leader (node 1) with these followers and this produce rate picks for a pull at
    /// offset 5 of 10 needing log index 50.
    fn leader_picks(followers: Vec<FollowerView>, produce_msgs_per_sec: f64) -> u64 {
        let v = NodeView::Leader {
            followers,
            produce_msgs_per_sec,
        };
        decide((1, "n1:1"), &v, &pos(5, 10, 50), &CFG, 500).node_id
    }

    #[test]
    fn idle_leader_keeps_its_consumers() {
        assert_eq!(leader_picks(vec![f(2, Some(10), 100)], 10.0), 1);
    }

    #[test]
    fn loaded_leader_sends_to_a_caught_up_reachable_follower_only() {
        let followers = vec![
            f(2, Some(10), 40),
            f(3, Some(900), 100),
            f(4, None, 100),
            f(5, Some(20), 100),
        ];
        // 2 lags (40 < 50), 3 is silent past the election timeout, 4 never answered: only 5 fits.
        assert_eq!(leader_picks(followers, 5000.0), 5);
    }

    #[test]
    fn cold_reads_go_to_followers_and_consumers_spread_stably() {
        let v = NodeView::Leader {
            followers: vec![f(2, Some(1), 100), f(3, Some(1), 100)],
            produce_msgs_per_sec: 0.0,
        };
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..20 {
            let id = format!("c{i}");
            let p = PullPosition {
                consumer_id: &id,
                queue: 0,
                next_offset: 0,
                max_offset: 1000,
                needed_index: 10,
            };
            let a = decide((1, "n1:1"), &v, &p, &CFG, 500);
            assert_eq!(a, decide((1, "n1:1"), &v, &p, &CFG, 500));
            seen.insert(a.node_id);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn follower_sends_back_to_leader_when_it_lags_or_lost_contact() {
        // (case, ms since the leader's last contact, apply backlog, next offset of 10, expected)
        let cases = [
            ("lagging at its end", 10, 500, 10, 1),
            // Not yet at its end: it still serves what it has.
            ("lagging not yet at its end", 10, 500, 5, 2),
            ("cut off from the leader", 5000, 0, 5, 1),
            ("fine at its end", 50, 0, 10, 2),
        ];
        for (name, contact_ms, apply_backlog, next, expected) in cases {
            let v = NodeView::Follower {
                leader: Some((1, "n1:1".into())),
                millis_since_leader_contact: Some(contact_ms),
                apply_backlog,
            };
            let got = decide((2, "n2:1"), &v, &pos(next, 10, 0), &CFG, 500).node_id;
            assert_eq!(got, expected, "{name}");
        }
    }

    fn stay_on(id: u64) -> Hint {
        Hint {
            node_id: id,
            address: format!("n{id}:1"),
            reason: "follower is caught up",
        }
    }

    /// A pull that found its entry missing here goes to the leader, whatever `decide` chose.
    #[test]
    fn entry_not_held_here_redirects_to_the_leader() {
        let h = redirect_when_not_held(stay_on(2), true, Some((1, "n1:1".into())));
        assert_eq!(
            h,
            Hint {
                node_id: 1,
                address: "n1:1".into(),
                reason: "entry not held here",
            }
        );
    }

    /// Without a known leader (an election), the decided hint stands: there is nowhere better.
    #[test]
    fn entry_not_held_without_a_leader_keeps_the_decision() {
        assert_eq!(redirect_when_not_held(stay_on(2), true, None), stay_on(2));
    }

    /// When the entry is held (or messages were served), the decided hint stands.
    #[test]
    fn entry_held_keeps_the_decision() {
        assert_eq!(
            redirect_when_not_held(stay_on(2), false, Some((1, "n1:1".into()))),
            stay_on(2)
        );
    }
}
