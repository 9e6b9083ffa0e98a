//! The transaction workload (`ScenarioCfg::txn`, `soak --txn`, `t41`): beside the producers,
//! senders store half messages on the TRANSACTION topic [`TXN_TOPIC`] under the same faults, and
//! end each by the seeded draw: commit (most), roll back, or leave it open until after the heal.
//! Every send and every end is recorded with what its reply proves. After the heal the round
//! commits the transactions left open (a commit after the faults must find its half message),
//! asks again each end whose outcome was unknown, rolls back any half message of a send whose acknowledgement was lost (it has no id to end it
//! by), waits until the leader lists no open transaction, reads [`TXN_TOPIC`] from every node and
//! [`check_txn`] requires:
//!
//! - lost: a transaction whose commit was answered OK, stored on no node;
//! - not open: a transaction whose end (with no earlier attempt that may have applied) found it
//!   not open: its half message was lost (for one left open, a commit after the faults);
//! - rolled back stored: a transaction whose rollback was answered OK, stored anyway;
//! - duplicates: one payload stored twice; unexpected: a payload nobody sent;
//! - divergent: two nodes holding different messages at one (queue, offset).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use raftmq_proto::v1::*;
use rand::{Rng, SeedableRng};

use super::{History, lock};
use crate::{Cluster, SendOutcome, TestProducer, code, connect, read_stored, send_until};

pub const TXN_TOPIC: &str = "hist-txn";
/// Producer ids of the transaction senders start here (apart from the workload's).
const TXN_PRODUCER_BASE: u64 = 8_000_000;
/// Bound of one end (commit or rollback), retried through elections.
const END_DEADLINE: Duration = Duration::from_secs(8);
/// Bound of the wait for no open transaction after the heal.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct TxnCfg {
    pub senders: u64,
    /// Pause between two transactions of one sender.
    pub interval: Duration,
    /// Percent of transactions rolled back, and left open until after the heal.
    pub rollback_pct: u32,
    pub open_pct: u32,
}

impl Default for TxnCfg {
    fn default() -> Self {
        TxnCfg {
            senders: 2,
            interval: Duration::from_millis(20),
            rollback_pct: 30,
            open_pct: 15,
        }
    }
}

/// What an end's replies prove.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndOutcome {
    /// Answered OK: it ended as asked.
    Ok,
    /// Answered TRANSACTION_NOT_OPEN with no earlier attempt that may have applied.
    NotOpen,
    /// No answer, or NOT_OPEN after an attempt that may have applied.
    Unknown(String),
}

/// One transaction: its payload, the id its send returned (`None`: not acknowledged), what was
/// asked (`Some(true)` commit, `Some(false)` rollback, `None` left open) and how it ended.
#[derive(Clone, Debug)]
pub struct TxnRecord {
    pub payload: String,
    pub id: Option<String>,
    pub commit: Option<bool>,
    pub outcome: Option<EndOutcome>,
    /// Left open during the faults, committed after the heal.
    pub late: bool,
}

#[derive(Clone, Debug, Default)]
pub struct TxnHistory {
    pub records: Vec<TxnRecord>,
    /// Half messages of unacknowledged sends rolled back after the heal.
    pub orphans_rolled_back: u64,
    /// Ends whose outcome was unknown, asked again after the heal.
    pub asked_again: u64,
}

/// What [`check_txn`] found: figures, then problem counters (each must be zero).
#[derive(Clone, Debug, Default)]
pub struct TxnReport {
    pub sent: u64,
    pub acked: u64,
    pub committed: u64,
    pub rolled_back: u64,
    pub late: u64,
    pub ends_unknown: u64,
    pub stored: u64,
    pub orphans_rolled_back: u64,
    pub asked_again: u64,
    pub lost: u64,
    pub not_open: u64,
    pub rolled_back_stored: u64,
    pub duplicates: u64,
    pub unexpected: u64,
    pub divergent: u64,
}

impl TxnReport {
    pub fn problems(&self) -> u64 {
        self.lost
            + self.not_open
            + self.rolled_back_stored
            + self.duplicates
            + self.unexpected
            + self.divergent
    }
    pub fn is_ok(&self) -> bool {
        self.problems() == 0
    }
}

impl std::fmt::Display for TxnReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "txn: sent {} ({} acknowledged), committed {} (of them {} after the heal), rolled \
             back {}, ends unknown {} (asked again after the heal {}), stored {}, orphans rolled \
             back {}; lost {}, not open {}, rolled back stored {}, duplicates {}, unexpected {}, \
             divergent {}",
            self.sent,
            self.acked,
            self.committed,
            self.late,
            self.rolled_back,
            self.ends_unknown,
            self.asked_again,
            self.stored,
            self.orphans_rolled_back,
            self.lost,
            self.not_open,
            self.rolled_back_stored,
            self.duplicates,
            self.unexpected,
            self.divergent
        )
    }
}

/// Creates [`TXN_TOPIC`] (type TRANSACTION) on the leader, retrying through elections.
pub async fn create_txn_topic(c: &Cluster) -> Result<(), String> {
    super::create_typed_topic(c, TXN_TOPIC, TopicMessageType::Transaction).await
}

/// Ends transaction `id` on whichever node leads, following NOT_LEADER, until `END_DEADLINE`.
pub async fn end(addrs: &[String], id: &str, commit: bool) -> EndOutcome {
    let t = Instant::now();
    let mut target = addrs[0].clone();
    let (mut rr, mut ambiguous, mut last) = (0, false, String::new());
    while t.elapsed() < END_DEADLINE {
        let req = EndTransactionRequest {
            topic: TXN_TOPIC.into(),
            transaction_id: id.to_string(),
            commit,
            from_check: false,
        };
        let r = tokio::time::timeout(
            Duration::from_secs(2),
            connect(&target).await.end_transaction(req),
        )
        .await;
        match r {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                match code(&r.error) {
                    ErrorCode::Ok => return EndOutcome::Ok,
                    ErrorCode::TransactionNotOpen if !ambiguous => return EndOutcome::NotOpen,
                    ErrorCode::TransactionNotOpen => {
                        return EndOutcome::Unknown("not open after an ambiguous attempt".into());
                    }
                    ErrorCode::NotLeader => {
                        if let Some(l) = r.error.as_ref().and_then(|e| e.leader.as_ref())
                            && l.address != target
                        {
                            target = l.address.clone();
                            continue;
                        }
                        last = "NOT_LEADER".into();
                    }
                    // UNAVAILABLE may come after the proposal was made.
                    _ => {
                        ambiguous = true;
                        last = format!("{:?}", r.error);
                    }
                }
            }
            Ok(Err(s)) => {
                if !super::workload::never_sent(&s) {
                    ambiguous = true;
                }
                last = s.to_string();
            }
            Err(_) => {
                ambiguous = true;
                last = "timeout".into();
            }
        }
        rr += 1;
        target = addrs[rr % addrs.len()].clone();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    EndOutcome::Unknown(format!("deadline passed: {last}"))
}

/// One sender: one half message at a time, each sent until acknowledged (same producer id and
/// sequence on every attempt), then ended by the seeded draw.
pub async fn txn_sender_loop(
    hist: Arc<History>,
    id: u64,
    addrs: Vec<String>,
    cfg: TxnCfg,
    seed: u64,
    stop: Arc<AtomicBool>,
    until: Instant,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (id << 40) ^ 0x7A7A);
    let mut p = TestProducer::new(TXN_PRODUCER_BASE + id, addrs.clone());
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        seq += 1;
        let payload = format!("txn|{id}|{seq}|");
        let req = SendRequest {
            topic: TXN_TOPIC.into(),
            queue: (seq % super::QUEUES as u64) as u32,
            messages: vec![Message {
                body: payload.clone().into_bytes().into(),
                ..Default::default()
            }],
            producer_id: p.producer_id,
            sequence: seq,
            dedup_property: String::new(),
        };
        let txn = match send_until(&mut p, &req, Duration::from_secs(10)).await {
            SendOutcome::Acked(r) => r.results.first().map(|r| r.msg_id.clone()),
            SendOutcome::Failed(_) => None,
        };
        let draw = rng.random_range(0..100u32);
        let commit = if draw < cfg.open_pct {
            None
        } else {
            Some(draw >= cfg.open_pct + cfg.rollback_pct)
        };
        let mut rec = TxnRecord {
            payload,
            id: txn.clone(),
            commit,
            outcome: None,
            late: commit.is_none(),
        };
        if let (Some(t), Some(c)) = (&txn, commit) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
            rec.outcome = Some(end(&addrs, t, c).await);
        }
        lock(&hist.txn).records.push(rec);
        tokio::time::sleep(cfg.interval).await;
    }
}

/// The leader's open transactions of [`TXN_TOPIC`].
async fn open_txns(c: &Cluster) -> Result<Vec<OpenTransaction>, String> {
    let leader = c.leader().await;
    let addr = c.node_address(leader).unwrap_or_default().to_string();
    let r = connect(&addr)
        .await
        .list_transactions(ListTransactionsRequest {
            topic: TXN_TOPIC.into(),
            limit: 0,
        })
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    match r.error {
        None => Ok(r.transactions),
        Some(e) => Err(format!("{e:?}")),
    }
}

/// After the heal: commits the transactions left open, rolls back the half messages of
/// unacknowledged sends, and waits until the leader lists no open transaction.
pub async fn settle(c: &Cluster, hist: &History) -> Result<(), String> {
    let addrs: Vec<String> = c.nodes.values().map(|n| n.addr.clone()).collect();
    let late: Vec<(usize, String)> = lock(&hist.txn)
        .records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.late)
        .filter_map(|(i, r)| r.id.clone().map(|id| (i, id)))
        .collect();
    for (i, id) in late {
        let outcome = end(&addrs, &id, true).await;
        let mut h = lock(&hist.txn);
        h.records[i].commit = Some(true);
        h.records[i].outcome = Some(outcome);
    }
    // An end whose outcome is unknown is asked again: OK, or not open because the first
    // attempt applied (nothing else ends a transaction here: no producer answers checks), both
    // mean it ended as asked.
    let unknown: Vec<(usize, String, bool)> = lock(&hist.txn)
        .records
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r.outcome, Some(EndOutcome::Unknown(_))))
        .filter_map(|(i, r)| Some((i, r.id.clone()?, r.commit?)))
        .collect();
    for (i, id, commit) in unknown {
        if matches!(
            end(&addrs, &id, commit).await,
            EndOutcome::Ok | EndOutcome::NotOpen
        ) {
            let mut h = lock(&hist.txn);
            h.records[i].outcome = Some(EndOutcome::Ok);
            h.asked_again += 1;
        }
    }
    let unacked: BTreeSet<String> = lock(&hist.txn)
        .records
        .iter()
        .filter(|r| r.id.is_none())
        .map(|r| r.payload.clone())
        .collect();
    let t = Instant::now();
    let mut why = String::new();
    while t.elapsed() < SETTLE_TIMEOUT {
        match open_txns(c).await {
            Ok(open) if open.is_empty() => return Ok(()),
            Ok(open) => {
                let records: HashMap<String, TxnRecord> = lock(&hist.txn)
                    .records
                    .iter()
                    .map(|r| (r.payload.clone(), r.clone()))
                    .collect();
                let bodies: Vec<String> = open
                    .iter()
                    .map(|o| {
                        let m = o.message.clone().unwrap_or_default();
                        let body = String::from_utf8_lossy(&m.body).into_owned();
                        let rec = records.get(&body).map(|r| {
                            format!(
                                "sent as {:?}, asked {:?}, ended {:?}",
                                r.id, r.commit, r.outcome
                            )
                        });
                        format!(
                            "{} {body:?} ({})",
                            o.transaction_id,
                            rec.unwrap_or_default()
                        )
                    })
                    .collect();
                why = format!("{} still open: {}", open.len(), bodies.join(", "));
                for o in open {
                    let body = o.message.map(|m| m.body.to_vec()).unwrap_or_default();
                    let body = String::from_utf8_lossy(&body).into_owned();
                    if unacked.contains(&body)
                        && end(&addrs, &o.transaction_id, false).await == EndOutcome::Ok
                    {
                        lock(&hist.txn).orphans_rolled_back += 1;
                    }
                }
            }
            Err(e) => why = e,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!(
        "transactions still open {} s after the heal: {why}",
        SETTLE_TIMEOUT.as_secs()
    ))
}

/// What one node holds of [`TXN_TOPIC`]: (queue, offset) → payload.
pub type TxnRead = BTreeMap<(u32, u64), String>;

pub async fn read_txn(addr: &str) -> Result<TxnRead, String> {
    let mut out = BTreeMap::new();
    for q in 0..super::QUEUES {
        for m in read_stored(addr, TXN_TOPIC, q).await? {
            out.insert((q, m.offset), String::from_utf8_lossy(&m.body).into_owned());
        }
    }
    Ok(out)
}

/// Compares what every node holds of [`TXN_TOPIC`] with the history (see the module doc).
pub fn check_txn(hist: &History, reads: &BTreeMap<u64, TxnRead>) -> TxnReport {
    let h = lock(&hist.txn).clone();
    let mut r = TxnReport {
        sent: h.records.len() as u64,
        acked: h.records.iter().filter(|t| t.id.is_some()).count() as u64,
        late: h
            .records
            .iter()
            .filter(|t| t.late && t.id.is_some())
            .count() as u64,
        orphans_rolled_back: h.orphans_rolled_back,
        asked_again: h.asked_again,
        ..Default::default()
    };
    let mut nodes = reads.values();
    let Some(first) = nodes.next() else {
        return r;
    };
    for other in nodes {
        let keys: BTreeSet<&(u32, u64)> = first.keys().chain(other.keys()).collect();
        r.divergent += keys
            .into_iter()
            .filter(|k| first.get(k) != other.get(k))
            .count() as u64;
    }
    let mut seen: HashMap<&str, u64> = HashMap::new();
    for p in first.values() {
        *seen.entry(p.as_str()).or_default() += 1;
    }
    r.stored = first.len() as u64;
    r.duplicates = seen.values().filter(|n| **n > 1).map(|n| n - 1).sum();
    let sent: HashMap<&str, &TxnRecord> =
        h.records.iter().map(|t| (t.payload.as_str(), t)).collect();
    r.unexpected = seen.keys().filter(|p| !sent.contains_key(*p)).count() as u64;
    for t in &h.records {
        let stored = seen.contains_key(t.payload.as_str());
        match (&t.outcome, t.commit) {
            (Some(EndOutcome::Ok), Some(true)) => {
                r.committed += 1;
                r.lost += u64::from(!stored);
            }
            (Some(EndOutcome::Ok), Some(false)) => {
                r.rolled_back += 1;
                r.rolled_back_stored += u64::from(stored);
            }
            (Some(EndOutcome::NotOpen), _) => r.not_open += 1,
            (Some(EndOutcome::Unknown(_)), _) => r.ends_unknown += 1,
            _ => {}
        }
    }
    r
}
