//! Watching a cluster from outside: the one polling loop ([`wait_for`]) and the one leader search
//! ([`find_leader`]) of every harness — the CLI's local cluster (demo, bench, catch-up bench), the
//! process-cluster tests and the container deploy tests.
//!
//! The leader search is a pure function of what the nodes said ([`RoleView`]s), so it is tested
//! here without a cluster; each harness only turns its status source (a node status RPC, the
//! nameserver's cluster view, `cluster status --json` in a container) into views.
//!
//! Contract of [`wait_for`]: it polls until the condition holds or the deadline passes, and on
//! failure names what it waited for and the last thing it saw ([`WaitTimeout`]). Nothing sleeps
//! for luck: every wait has a condition.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// What a condition said on one poll: `Ok` ends the wait; `Err` (or `None`) says why not yet.
pub trait Progress<T> {
    fn into_progress(self) -> Result<T, String>;
}

impl<T> Progress<T> for Result<T, String> {
    fn into_progress(self) -> Result<T, String> {
        self
    }
}

impl<T> Progress<T> for Option<T> {
    fn into_progress(self) -> Result<T, String> {
        self.ok_or_else(|| "not yet".to_owned())
    }
}

/// A condition that did not hold before its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitTimeout {
    pub what: String,
    pub timeout: Duration,
    /// The condition's last complaint.
    pub last: String,
}

impl fmt::Display for WaitTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}; last: {}",
            self.timeout, self.what, self.last
        )
    }
}

impl std::error::Error for WaitTimeout {}

/// Polls `probe` every `poll` until it succeeds, or fails after `timeout` naming `what` and the
/// probe's last complaint. The probe runs at least once, even with a zero timeout. A probe that
/// meets an error not worth waiting out returns it as its success (`Ok(Err(e))`), which ends the
/// wait at once.
pub async fn wait_for<T, P, F, Fut>(
    what: &str,
    timeout: Duration,
    poll: Duration,
    mut probe: F,
) -> Result<T, WaitTimeout>
where
    P: Progress<T>,
    F: FnMut() -> Fut,
    Fut: Future<Output = P>,
{
    let start = Instant::now();
    loop {
        match probe().await.into_progress() {
            Ok(v) => return Ok(v),
            Err(last) if start.elapsed() >= timeout => {
                return Err(WaitTimeout {
                    what: what.to_owned(),
                    timeout,
                    last,
                });
            }
            Err(_) => tokio::time::sleep(poll).await,
        }
    }
}

/// What one node says of itself, whatever the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleView {
    pub node_id: u64,
    /// `leader`, `follower`, `candidate`, … as the node status reports it.
    pub role: String,
    pub term: u64,
    /// The leader this node knows (its own id when it leads), if any.
    pub leader: Option<u64>,
}

impl RoleView {
    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }
}

impl From<&raftmq_client::NodeStatusResponse> for RoleView {
    fn from(s: &raftmq_client::NodeStatusResponse) -> RoleView {
        RoleView {
            node_id: s.node_id,
            role: s.role.clone(),
            term: s.term,
            leader: s.leader.as_ref().map(|l| l.node_id),
        }
    }
}

/// Which leader counts as found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderRule {
    /// Every running node answers, exactly one claims to lead, and every answer names it.
    Agreed,
    /// The highest-term node claiming to lead, among the nodes that answer (a deposed leader
    /// that has not heard of the new term may still claim it: the higher term wins).
    HighestTerm,
    /// As `HighestTerm`, and every running node answers.
    HighestTermAllAnswer,
}

/// The leader found: its node id and the term it leads in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leader {
    pub node_id: u64,
    pub term: u64,
}

/// The one leader search. `views` holds every running node by id, `None` for a node that did not
/// answer. `Err` says what is missing, for [`wait_for`]'s message.
pub fn find_leader(views: &[(u64, Option<RoleView>)], rule: LeaderRule) -> Result<Leader, String> {
    let silent: Vec<u64> = views
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(id, _)| *id)
        .collect();
    let answers = views.iter().filter_map(|(_, v)| v.as_ref());
    let leaders: Vec<&RoleView> = answers.clone().filter(|v| v.is_leader()).collect();
    let all_answer = || {
        if silent.is_empty() {
            Ok(())
        } else {
            Err(format!("nodes {silent:?} do not answer"))
        }
    };
    match rule {
        LeaderRule::Agreed => {
            all_answer()?;
            let [one] = leaders.as_slice() else {
                let ids: Vec<u64> = leaders.iter().map(|v| v.node_id).collect();
                return Err(format!("{} nodes claim to lead: {ids:?}", ids.len()));
            };
            let disagree: Vec<String> = answers
                .filter(|v| v.leader != Some(one.node_id))
                .map(|v| format!("node {} names {:?}", v.node_id, v.leader))
                .collect();
            if !disagree.is_empty() {
                return Err(format!(
                    "node {} leads but {}",
                    one.node_id,
                    disagree.join(", ")
                ));
            }
            Ok(Leader {
                node_id: one.node_id,
                term: one.term,
            })
        }
        LeaderRule::HighestTerm | LeaderRule::HighestTermAllAnswer => {
            if rule == LeaderRule::HighestTermAllAnswer {
                all_answer()?;
            }
            leaders
                .iter()
                .max_by_key(|v| v.term)
                .map(|v| Leader {
                    node_id: v.node_id,
                    term: v.term,
                })
                .ok_or_else(|| "no node claims to lead".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64, role: &str, term: u64, leader: Option<u64>) -> (u64, Option<RoleView>) {
        (
            id,
            Some(RoleView {
                node_id: id,
                role: role.into(),
                term,
                leader,
            }),
        )
    }

    fn leader(node_id: u64, term: u64) -> Leader {
        Leader { node_id, term }
    }

    /// 1. A settled group: every rule finds the same leader.
    #[test]
    fn t1_settled_group() {
        let v = [
            view(1, "follower", 3, Some(2)),
            view(2, "leader", 3, Some(2)),
            view(3, "follower", 3, Some(2)),
        ];
        for rule in [
            LeaderRule::Agreed,
            LeaderRule::HighestTerm,
            LeaderRule::HighestTermAllAnswer,
        ] {
            assert_eq!(find_leader(&v, rule), Ok(leader(2, 3)), "{rule:?}");
        }
    }

    /// 2. A silent node: only `HighestTerm` looks past it.
    #[test]
    fn t2_silent_node() {
        let v = [
            view(1, "leader", 2, Some(1)),
            (2, None),
            view(3, "follower", 2, Some(1)),
        ];
        assert!(find_leader(&v, LeaderRule::Agreed).is_err());
        assert!(find_leader(&v, LeaderRule::HighestTermAllAnswer).is_err());
        assert_eq!(find_leader(&v, LeaderRule::HighestTerm), Ok(leader(1, 2)));
    }

    /// 3. A deposed leader still claiming its old term: not agreed; the higher term wins.
    #[test]
    fn t3_two_claimants() {
        let v = [
            view(1, "leader", 4, Some(1)),
            view(2, "leader", 5, Some(2)),
            view(3, "follower", 5, Some(2)),
        ];
        let e = find_leader(&v, LeaderRule::Agreed).unwrap_err();
        assert!(e.contains("2 nodes claim to lead"), "{e}");
        assert_eq!(find_leader(&v, LeaderRule::HighestTerm), Ok(leader(2, 5)));
    }

    /// 4. One leader that a follower does not know yet: not agreed.
    #[test]
    fn t4_follower_names_no_leader() {
        let v = [view(1, "leader", 6, Some(1)), view(2, "follower", 6, None)];
        let e = find_leader(&v, LeaderRule::Agreed).unwrap_err();
        assert!(e.contains("node 2 names None"), "{e}");
        assert_eq!(find_leader(&v, LeaderRule::HighestTerm), Ok(leader(1, 6)));
    }

    /// 5. No leader at all (an election in progress), or no node running.
    #[test]
    fn t5_no_leader() {
        let v = [view(1, "candidate", 7, None), view(2, "follower", 6, None)];
        for rule in [LeaderRule::Agreed, LeaderRule::HighestTerm] {
            assert!(find_leader(&v, rule).is_err(), "{rule:?}");
            assert!(find_leader(&[], rule).is_err(), "{rule:?}");
        }
    }

    /// 6. `wait_for` returns the first success, and on timeout names what it waited for and the
    /// last complaint.
    #[tokio::test]
    async fn t6_wait_for() {
        let mut n = 0;
        let got = wait_for(
            "three polls",
            Duration::from_secs(1),
            Duration::from_millis(10),
            || {
                n += 1;
                let now = n;
                async move { (now >= 3).then_some(now) }
            },
        )
        .await;
        assert_eq!(got, Ok(3));

        let e = wait_for(
            "the impossible",
            Duration::from_millis(100),
            Duration::from_millis(10),
            || async { Err::<(), _>("still impossible".to_owned()) },
        )
        .await
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "timed out after 100ms waiting for the impossible; last: still impossible"
        );
    }
}
