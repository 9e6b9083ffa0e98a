//! Fault kinds, their injection into a running group and healing, and the waits for the group to
//! agree on a leader and converge again.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;

use super::{CONVERGE_TIMEOUT, CatchUpEvent, ELECTION_TIMEOUT_MS_MAX, FaultEvent, History, lock};
use crate::Cluster;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    KillLeader,
    KillFollower,
    KillTwo,
    KillAll,
    PauseLeader,
    WipeFollower,
    PowerLossOne,
    PowerLossAll,
    BitFlip,
    TruncateSegment,
    /// Mixed: the leader paused past the election timeout while a follower is killed.
    PauseLeaderKillFollower,
    /// The leader cut off from both followers (both directions); clients still reach it.
    PartitionLeader,
    /// One follower cut off from both other nodes.
    PartitionFollower,
    /// A partial partition: the leader and one follower cannot hear each other; the other
    /// follower hears both.
    PartitionPartial,
    /// One-way: nothing the leader sends arrives; what the followers send to it does.
    PartitionOneWay,
    /// One follower cut off from both other nodes for [`PARTITION_LONG`] while the load goes on:
    /// it falls far behind and must catch up after the heal.
    PartitionFollowerLong,
}

/// How long [`FaultKind::PartitionFollowerLong`] keeps its follower cut off.
pub const PARTITION_LONG: Duration = Duration::from_secs(60);

impl FaultKind {
    /// Every kind; new kinds are appended, so the index of an existing kind never changes.
    pub const ALL: [FaultKind; 16] = [
        FaultKind::KillLeader,
        FaultKind::KillFollower,
        FaultKind::KillTwo,
        FaultKind::KillAll,
        FaultKind::PauseLeader,
        FaultKind::WipeFollower,
        FaultKind::PowerLossOne,
        FaultKind::PowerLossAll,
        FaultKind::BitFlip,
        FaultKind::TruncateSegment,
        FaultKind::PauseLeaderKillFollower,
        FaultKind::PartitionLeader,
        FaultKind::PartitionFollower,
        FaultKind::PartitionPartial,
        FaultKind::PartitionOneWay,
        FaultKind::PartitionFollowerLong,
    ];

    /// The kinds the soak draws from by default (every kind but the 60 s partition), in the order
    /// of [`FaultKind::ALL`]: a seed draws the same faults from it as it did before that kind
    /// existed.
    pub const CLASSIC: [FaultKind; 15] = {
        // The 60 s partition is the last of ALL: the classic kinds are the ones before it.
        assert!(matches!(
            FaultKind::ALL[FaultKind::ALL.len() - 1],
            FaultKind::PartitionFollowerLong
        ));
        let mut kinds = [FaultKind::KillLeader; 15];
        let mut i = 0;
        while i < kinds.len() {
            kinds[i] = FaultKind::ALL[i];
            i += 1;
        }
        kinds
    };

    /// The kinds the soak draws from by default in large-log mode: a follower that must catch up
    /// on a large log.
    pub const LARGE_LOG: [FaultKind; 3] = [
        FaultKind::KillFollower,
        FaultKind::WipeFollower,
        FaultKind::PartitionFollowerLong,
    ];

    /// The fault hits one follower only: the leader keeps leading, and the group's term should
    /// not rise.
    pub fn leaves_leader(self) -> bool {
        matches!(
            self,
            FaultKind::KillFollower
                | FaultKind::WipeFollower
                | FaultKind::PartitionFollower
                | FaultKind::PartitionFollowerLong
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillFollower => "kill-follower",
            FaultKind::KillTwo => "kill-two",
            FaultKind::KillAll => "kill-all",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::WipeFollower => "wipe-follower",
            FaultKind::PowerLossOne => "power-loss-one",
            FaultKind::PowerLossAll => "power-loss-all",
            FaultKind::BitFlip => "bit-flip",
            FaultKind::TruncateSegment => "truncate-segment",
            FaultKind::PauseLeaderKillFollower => "pause-leader+kill-follower",
            FaultKind::PartitionLeader => "partition-leader",
            FaultKind::PartitionFollower => "partition-follower",
            FaultKind::PartitionPartial => "partition-partial",
            FaultKind::PartitionOneWay => "partition-one-way",
            FaultKind::PartitionFollowerLong => "partition-follower-long",
        }
    }
}
// ---------------------------------------------------------------------------------------------
// Cluster helpers

/// The leader every running node agrees on, or Err after `timeout`.
pub async fn find_leader(c: &Cluster, timeout: Duration) -> Result<u64, String> {
    find_leader_term(c, timeout).await.map(|(l, _)| l)
}

/// As [`find_leader`], with the leader's term: the shared leader search
/// ([`Cluster::agreed_leader`]).
pub async fn find_leader_term(c: &Cluster, timeout: Duration) -> Result<(u64, u64), String> {
    c.agreed_leader(timeout)
        .await
        .map(|l| (l.node_id, l.term))
        .map_err(|e| e.to_string())
}

/// Waits for an agreed leader and for every node to have applied the leader's commit index.
pub async fn wait_converged(c: &Cluster, timeout: Duration) -> Result<u64, String> {
    wait_converged_term(c, timeout).await.map(|(l, _)| l)
}

/// As [`wait_converged`], with the highest term the nodes reported once they had converged.
pub async fn wait_converged_term(c: &Cluster, timeout: Duration) -> Result<(u64, u64), String> {
    let t = Instant::now();
    let leader = find_leader(c, timeout).await?;
    let target = c
        .status(leader)
        .await
        .ok_or("leader stopped answering")?
        .committed;
    let mut last = String::new();
    while t.elapsed() < timeout {
        let mut behind = Vec::new();
        let mut term = 0;
        for id in c.nodes.keys() {
            match c.status(*id).await {
                Some(st) if st.applied >= target => term = term.max(st.term),
                Some(st) => behind.push(format!("node {id} applied {}", st.applied)),
                None => behind.push(format!("node {id} silent")),
            }
        }
        if behind.is_empty() {
            return Ok((leader, term));
        }
        last = behind.join(", ");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Err(format!(
        "nodes did not apply commit index {target} of leader {leader} within {timeout:?}: {last}"
    ))
}

fn segments(data_dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data_dir.join("log"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The newest segment file of a stopped node that holds records, and the length of what was
/// written to it: the active segment is preallocated, and the zeros past its records are no
/// record a fault should land in.
fn last_segment(data_dir: &Path) -> Option<(PathBuf, u64)> {
    segments(data_dir)
        .into_iter()
        .rev()
        .filter_map(|p| written_len(&p).map(|len| (p, len)))
        .find(|(_, len)| *len > 0)
}

/// The length of a file up to its last byte that is not zero.
fn written_len(path: &Path) -> Option<u64> {
    let b = std::fs::read(path).ok()?;
    Some(b.iter().rposition(|x| *x != 0).map_or(0, |i| i as u64 + 1))
}

/// Flips one bit in the second half of the newest segment of a stopped node.
pub fn flip_bit(data_dir: &Path, rng: &mut StdRng) -> Result<String, String> {
    let (path, len) = last_segment(data_dir).ok_or("no segment to damage")?;
    let mut b = std::fs::read(&path).map_err(|e| e.to_string())?;
    let pos = rng.random_range(len / 2..len) as usize;
    let bit = rng.random_range(0..8u8);
    b[pos] ^= 1 << bit;
    std::fs::write(&path, b).map_err(|e| e.to_string())?;
    Ok(format!(
        "flipped bit {bit} at byte {pos} of {} ({len} bytes)",
        path.display()
    ))
}

/// Cuts the newest segment of a stopped node at a random length in its second half.
pub fn truncate_segment(data_dir: &Path, rng: &mut StdRng) -> Result<String, String> {
    let (path, len) = last_segment(data_dir).ok_or("no segment to damage")?;
    let to = rng.random_range(len / 2..len);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(to))
        .map_err(|e| e.to_string())?;
    Ok(format!(
        "truncated {} from {len} to {to} bytes",
        path.display()
    ))
}

fn power_loss(c: &Cluster, id: u64) -> Result<String, String> {
    // What the seam will see, per segment: file length and the recorded durable length.
    let mut before = Vec::new();
    for p in segments(&c.data_dir(id)) {
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        let record = p.with_extension("durable");
        let durable = match std::fs::read(&record) {
            Ok(b) => match <[u8; 8]>::try_from(b.as_slice()) {
                Ok(a) => u64::from_le_bytes(a).to_string(),
                Err(_) => {
                    // The seam writes its record whole (a temporary file, then a rename); any
                    // other length means the record is not the seam's, and the true durable
                    // length is unknown: dropping the segment would be more than a power loss
                    // does, so leave it whole and say so.
                    std::fs::write(&record, len.to_le_bytes()).map_err(|e| e.to_string())?;
                    format!("TORN record of {} bytes, segment left whole", b.len())
                }
            },
            Err(_) => "none".into(),
        };
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        before.push(format!(
            "{} len {len} durable {durable}",
            name.unwrap_or_default()
        ));
    }
    raftmq_raft_log::log_store::simulate_power_loss(&c.data_dir(id).join("log"))
        .map(|n| {
            format!(
                "node {id}: dropped {n} unsynced bytes [{}]",
                before.join(", ")
            )
        })
        .map_err(|e| format!("power loss on node {id}: {e}"))
}

/// How long a paused leader stays paused: past the followers' election timeout (so they elect
/// another leader), up to three timeouts.
fn leader_pause(rng: &mut StdRng) -> Duration {
    hold(
        rng,
        ELECTION_TIMEOUT_MS_MAX + 150,
        ELECTION_TIMEOUT_MS_MAX * 3,
    )
}

fn hold(rng: &mut StdRng, lo_ms: u64, hi_ms: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo_ms..=hi_ms))
}

/// Bounds of [`inject_opts`].
#[derive(Clone, Debug)]
pub struct InjectOpts {
    /// Bound of the wait for a leader before the fault and for convergence after it.
    pub converge_timeout: Duration,
    /// After a fault that leaves the leader alone ([`FaultKind::leaves_leader`]): wait at most this
    /// long from the heal for the follower's last log index to reach the leader's commit index at
    /// heal time, and fail when it does not. None: no such wait (the convergence wait remains).
    pub catch_up_timeout: Option<Duration>,
}

impl Default for InjectOpts {
    fn default() -> Self {
        InjectOpts {
            converge_timeout: CONVERGE_TIMEOUT,
            catch_up_timeout: None,
        }
    }
}

/// Injects one fault under load, heals it, and waits for the group to converge.
pub async fn inject(
    c: &mut Cluster,
    hist: &History,
    kind: FaultKind,
    rng: &mut StdRng,
) -> Result<(), String> {
    inject_opts(c, hist, kind, rng, &InjectOpts::default()).await
}

/// As [`inject`], with the bounds and the catch-up wait of `opts`.
pub async fn inject_opts(
    c: &mut Cluster,
    hist: &History,
    kind: FaultKind,
    rng: &mut StdRng,
    opts: &InjectOpts,
) -> Result<(), String> {
    let (leader, term_before) = find_leader_term(c, opts.converge_timeout).await?;
    let ids: Vec<u64> = c.nodes.keys().copied().collect();
    let followers: Vec<u64> = ids.iter().copied().filter(|i| *i != leader).collect();
    let follower = followers[rng.random_range(0..followers.len())];
    let any = ids[rng.random_range(0..ids.len())];
    let start = hist.now();
    let mut note = String::new();
    // Each sleep below IS the fault: how long the node stays dead or frozen under load.
    let nodes = match kind {
        FaultKind::KillLeader | FaultKind::KillFollower => {
            let id = if kind == FaultKind::KillLeader {
                leader
            } else {
                follower
            };
            c.kill(id);
            tokio::time::sleep(hold(rng, 200, 1500)).await;
            c.spawn(id);
            vec![id]
        }
        FaultKind::KillTwo => {
            c.kill(leader);
            c.kill(follower);
            tokio::time::sleep(hold(rng, 200, 1000)).await;
            c.spawn(leader);
            c.spawn(follower);
            vec![leader, follower]
        }
        FaultKind::KillAll | FaultKind::PowerLossAll => {
            for id in &ids {
                c.kill(*id);
            }
            if kind == FaultKind::PowerLossAll {
                for id in &ids {
                    writeln!(note, "{}", power_loss(c, *id)?).ok();
                }
            }
            tokio::time::sleep(hold(rng, 50, 500)).await;
            for id in &ids {
                c.spawn(*id);
            }
            ids.clone()
        }
        FaultKind::PauseLeader => {
            c.pause(leader);
            tokio::time::sleep(leader_pause(rng)).await;
            c.resume(leader);
            vec![leader]
        }
        FaultKind::PauseLeaderKillFollower => {
            c.kill(follower);
            c.pause(leader);
            tokio::time::sleep(leader_pause(rng)).await;
            c.spawn(follower);
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.resume(leader);
            vec![leader, follower]
        }
        FaultKind::WipeFollower => {
            c.kill(follower);
            std::fs::remove_dir_all(c.data_dir(follower)).map_err(|e| e.to_string())?;
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.spawn(follower);
            vec![follower]
        }
        FaultKind::PowerLossOne => {
            c.kill(any);
            note = power_loss(c, any)?;
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.spawn(any);
            vec![any]
        }
        FaultKind::PartitionLeader
        | FaultKind::PartitionFollower
        | FaultKind::PartitionPartial
        | FaultKind::PartitionOneWay
        | FaultKind::PartitionFollowerLong => {
            let proxy = c
                .proxy
                .as_ref()
                .ok_or("a partition needs a cluster started with the fault proxy")?;
            let nodes = match kind {
                FaultKind::PartitionLeader => {
                    proxy.isolate(leader);
                    vec![leader]
                }
                FaultKind::PartitionFollower | FaultKind::PartitionFollowerLong => {
                    proxy.isolate(follower);
                    vec![follower]
                }
                FaultKind::PartitionPartial => {
                    proxy.cut_pair(leader, follower);
                    vec![leader, follower]
                }
                _ => {
                    for f in &followers {
                        proxy.set_link(leader, *f, true);
                    }
                    vec![leader]
                }
            };
            note = format!("cut links {:?}", proxy.cut_links());
            let d = if kind == FaultKind::PartitionFollowerLong {
                PARTITION_LONG
            } else {
                hold(rng, 300, 2500)
            };
            tokio::time::sleep(d).await;
            proxy.heal();
            nodes
        }
        FaultKind::BitFlip | FaultKind::TruncateSegment => {
            c.kill(any);
            note = if kind == FaultKind::BitFlip {
                flip_bit(&c.data_dir(any), rng)?
            } else {
                truncate_segment(&c.data_dir(any), rng)?
            };
            tokio::time::sleep(hold(rng, 0, 500)).await;
            c.spawn(any);
            vec![any]
        }
    };
    let healed = hist.now();
    let healed_at = Instant::now();
    tracing::info!(kind = kind.name(), ?nodes, note, "fault healed");
    let caught_node = nodes.first().copied();
    lock(&hist.faults).push(FaultEvent {
        kind,
        nodes,
        start,
        healed,
        converged: healed,
        note: note.trim().to_string(),
        term_before: Some(term_before),
        term_after: None,
        catch_up: None,
    });
    let mut r = Ok(());
    if let (Some(limit), Some(node)) = (opts.catch_up_timeout, caught_node)
        && kind.leaves_leader()
    {
        let (cu, failure) = wait_caught_up(c, node, leader, healed_at, limit).await;
        if let Some(fe) = lock(&hist.faults).last_mut() {
            fe.catch_up = Some(cu);
        }
        if let Some(e) = failure {
            r = Err(e);
        }
    }
    let r = match r {
        Ok(()) => wait_converged_term(c, opts.converge_timeout).await,
        Err(e) => Err(e),
    };
    if let Some(fe) = lock(&hist.faults).last_mut() {
        fe.converged = hist.now();
        fe.term_after = r.as_ref().ok().map(|(_, term)| *term);
    }
    r.map(|_| ())
        .map_err(|e| format!("after {}: {e}", kind.name()))
}

/// Waits until `node`'s last log index reaches the commit index the leader had when the fault
/// healed (`healed_at`), at most `limit` from the heal. Prints progress every 5 s. The second value
/// is the failure, when it did not catch up in time.
async fn wait_caught_up(
    c: &Cluster,
    node: u64,
    leader_hint: u64,
    healed_at: Instant,
    limit: Duration,
) -> (CatchUpEvent, Option<String>) {
    let deadline = healed_at + limit;
    let mut ev = CatchUpEvent {
        node,
        target: 0,
        reached: 0,
        took: Duration::ZERO,
        caught_up: false,
    };
    // The commit index of the node that leads now (the fault left the leader alone: the hint).
    let mut order = vec![leader_hint];
    order.extend(
        c.nodes
            .keys()
            .copied()
            .filter(|i| *i != leader_hint && *i != node),
    );
    let mut target = None;
    // Bounded by the deadline (and a count).
    for _ in 0..100_000u32 {
        for id in &order {
            if let Some(st) = c.status(*id).await
                && st.role == "leader"
            {
                target = Some(st.committed);
                break;
            }
        }
        if target.is_some() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let Some(target) = target else {
        ev.took = healed_at.elapsed();
        let e = format!(
            "CATCH-UP NOT MEASURED: no leader answered within {:.0} s of the heal",
            limit.as_secs_f64()
        );
        return (ev, Some(e));
    };
    ev.target = target;
    let mut last_print = Instant::now();
    let mut at_print = (Instant::now(), 0u64);
    // Bounded by the deadline (and a count).
    for _ in 0..10_000_000u32 {
        if let Some(st) = c.status(node).await {
            ev.reached = st.last_log_index;
            if st.last_log_index >= target {
                ev.took = healed_at.elapsed();
                ev.caught_up = true;
                return (ev, None);
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            let rate = ev.reached.saturating_sub(at_print.1) as f64
                / at_print.0.elapsed().as_secs_f64().max(1e-3);
            eprintln!(
                "  catch-up of node {node}: last log index {} of {target}, {rate:.0} entries/s, \
                 {:.0} s since the heal (limit {:.0} s)",
                ev.reached,
                healed_at.elapsed().as_secs_f64(),
                limit.as_secs_f64()
            );
            last_print = Instant::now();
            at_print = (Instant::now(), ev.reached);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ev.took = healed_at.elapsed();
    let e = format!(
        "CATCH-UP TIMEOUT: follower {node} reached last log index {} of {target} (the leader's \
         commit index at the heal) in {:.1} s; the limit is {:.0} s",
        ev.reached,
        ev.took.as_secs_f64(),
        limit.as_secs_f64()
    );
    (ev, Some(e))
}
