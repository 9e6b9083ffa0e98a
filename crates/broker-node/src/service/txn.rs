//! Transactions of TRANSACTION topics (RocketMQ's transactional messages).
//!
//! A send to a TRANSACTION topic stores each message as a half message: a `Schedule` entry puts
//! it in the timer's half-message index ([`crate::timer`]) with its first check time (the store
//! time plus `limits.txn_check_interval_ms`), invisible to every consumer. Its transaction id is
//! the raftmq id the send returned (`BROKER-INDEX-POSITION`, where it was first stored).
//!
//! - `EndTransaction` commits (the leader reads the half message and proposes an `EndTxn` that
//!   stores it in its queue) or rolls back (an `EndTxn` that drops it). Apply ends it once: a
//!   repeat, or an end racing with a check-back, finds no half message where it looked and the
//!   leader looks again (the check-back moved it) or answers TRANSACTION_NOT_OPEN.
//! - Check-back: a RocketMQ 5 front with a producer of the topic connected claims the due
//!   transactions with `TakeTransactionChecks`. The leader counts each claimed one as checked by
//!   storing it again (a `Schedule` that replaces it: same transaction, one check more, next
//!   check an interval ahead), so two fronts never ask about the same one at once, and returns
//!   it; the front asks the producer (`RecoverOrphanedTransactionCommand`), whose answer is an
//!   `EndTransaction`. A transaction due once more after `limits.txn_checks_max` checks is
//!   rolled back. With no producer connected nobody claims it, and it waits.
//!
//! Everything that decides a transaction's fate is an entry; no node's clock ends one.

use raftmq_proto::v1::{
    EndTransactionRequest, EndTransactionResponse, ListTransactionsRequest,
    ListTransactionsResponse, OpenTransaction, StoredMessage, TakeTransactionChecksRequest,
    TakeTransactionChecksResponse,
};

use super::Broker;
use crate::command::{Command, Reply, StoredBody, msg_id};
use crate::config::check_name;
use crate::error::{Error, Internal, Refused, Result};
use crate::state::{ORIGIN_PROPERTY, TYPE_TRANSACTION};
use crate::timer::Waiting;

/// The property holding how often a half message's producer was asked about it.
pub const TXN_CHECKS_PROPERTY: &str = "__rmq.txn_checks";
/// The most transactions one `TakeTransactionChecks` or `ListTransactions` returns.
const TXNS_PER_CALL_MAX: usize = 1000;
/// How often an end looks the half message up again after a check-back moved it.
const END_TRIES: usize = 3;

/// `EndTxn`'s tag: every member must apply it before a TRANSACTION topic takes a send.
pub const END_TXN_TAG: u32 = 18;

const _: () = assert!(END_TXN_TAG < crate::command::COMMAND_TAGS);

fn checks_of(m: &StoredBody) -> u32 {
    m.properties
        .iter()
        .find(|(k, _)| k == TXN_CHECKS_PROPERTY)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn unexpected(reply: Reply) -> Error {
    Error::from_reply(&reply).unwrap_or_else(|| {
        Internal::UnexpectedReply {
            reply: format!("{reply:?}"),
        }
        .into()
    })
}

impl Broker {
    /// Checks the topic, on a leader that has applied every acknowledged write (a new leader may
    /// not have applied the half message the previous one acknowledged yet).
    async fn check_txn_topic(&self, topic: &str) -> Result<()> {
        check_name("topic", topic).map_err(Error::invalid)?;
        self.require_leader()?;
        self.node.member.read_barrier().await?;
        self.check_topic(topic, 0)?;
        let ty = self.node.state_value(|s| s.topic_type(topic));
        if ty != TYPE_TRANSACTION {
            return Err(Error::invalid(format!(
                "topic {topic} is of type {}: transactions are on TRANSACTION topics",
                crate::state::type_name(ty)
            )));
        }
        Ok(())
    }

    /// The transaction as the API shows it: its id, its half message, next check and checks.
    fn open_transaction(&self, w: &Waiting, m: StoredBody) -> OpenTransaction {
        let (li, p) = w.txn.unwrap_or((w.log_index, w.position));
        let id = msg_id(&self.node.cfg.broker, li, p);
        OpenTransaction {
            checks: checks_of(&m),
            next_check_ms: w.deliver_at_ms,
            message: Some(StoredMessage {
                queue: w.queue,
                offset: 0,
                msg_id: id.clone(),
                key: m.key,
                tag: m.tag,
                body: m.body,
                properties: m.properties.into_iter().collect(),
                store_timestamp_ms: 0,
                log_index: w.log_index,
                scheduled: true,
            }),
            transaction_id: id,
        }
    }

    /// Commits or rolls back a transaction (see the module doc).
    pub(super) async fn end_transaction(
        &self,
        req: EndTransactionRequest,
    ) -> Result<EndTransactionResponse> {
        self.check_txn_topic(&req.topic).await?;
        let broker = &self.node.cfg.broker;
        let Some(txn) = super::inspect::parse_msg_id(broker, &req.transaction_id) else {
            return Err(Error::invalid(format!(
                "{:?} is not a transaction id of broker group {broker} ({broker}-INDEX-POSITION, \
                 as the send of its half message returned it)",
                req.transaction_id
            )));
        };
        let not_open = || Refused::TransactionNotOpen {
            id: req.transaction_id.clone(),
            topic: req.topic.clone(),
            checks: self.node.cfg.limits.txn_checks_max,
        };
        for _ in 0..END_TRIES {
            let w = self
                .node
                .state_value(|s| s.timer.txn(txn))
                .filter(|w| *w.topic == *req.topic)
                .ok_or_else(not_open)?;
            let mut messages = Vec::new();
            if req.commit {
                messages = self.read_waiting(std::slice::from_ref(&w))?;
                for m in &mut messages {
                    m.properties
                        .retain(|(k, _)| k != ORIGIN_PROPERTY && k != TXN_CHECKS_PROPERTY);
                }
            }
            let (_, reply) = self
                .propose(Command::EndTxn {
                    topic: req.topic.clone(),
                    queue: w.queue,
                    now_ms: super::wall_ms(),
                    check_at_ms: w.deliver_at_ms,
                    log_index: w.log_index,
                    position: w.position,
                    commit: req.commit,
                    messages,
                })
                .await?;
            let (queue, offset) = match reply {
                Reply::Sent {
                    queue,
                    first_offset,
                    ..
                } => (queue, first_offset),
                Reply::Ok => (w.queue, 0),
                // Moved by a check-back meanwhile (or ended by another call): look again.
                Reply::NotScheduled(_) => continue,
                reply => return Err(unexpected(reply)),
            };
            tracing::info!(
                topic = %req.topic,
                transaction = %req.transaction_id,
                commit = req.commit,
                from_check = req.from_check,
                "transaction ended"
            );
            return Ok(EndTransactionResponse {
                error: None,
                queue,
                offset,
            });
        }
        Err(not_open().into())
    }

    /// The topic's open transactions, by next check time.
    pub(super) async fn list_transactions(
        &self,
        req: ListTransactionsRequest,
    ) -> Result<ListTransactionsResponse> {
        self.check_txn_topic(&req.topic).await?;
        let limit = match req.limit as usize {
            0 => TXNS_PER_CALL_MAX,
            n => n.min(TXNS_PER_CALL_MAX),
        };
        let open = self
            .node
            .state_value(|s| s.timer.open_txns(&req.topic, limit));
        let bodies = self.read_waiting(&open)?;
        Ok(ListTransactionsResponse {
            error: None,
            transactions: open
                .iter()
                .zip(bodies)
                .map(|(w, m)| self.open_transaction(w, m))
                .collect(),
        })
    }

    /// Claims the topic's transactions due for a check-back (see the module doc).
    pub(super) async fn take_transaction_checks(
        &self,
        req: TakeTransactionChecksRequest,
    ) -> Result<TakeTransactionChecksResponse> {
        self.check_txn_topic(&req.topic).await?;
        let now = super::wall_ms();
        let max = (req.max as usize).clamp(1, TXNS_PER_CALL_MAX);
        let limits = &self.node.cfg.limits;
        let due: Vec<Waiting> = self
            .node
            .state_value(|s| s.timer.checks_due(&req.topic, now, max));
        let bodies = self.read_waiting(&due)?;
        let mut taken = Vec::new();
        for (w, mut m) in due.into_iter().zip(bodies) {
            let checks = checks_of(&m);
            if checks >= limits.txn_checks_max {
                let (_, reply) = self
                    .propose(Command::EndTxn {
                        topic: req.topic.clone(),
                        queue: w.queue,
                        now_ms: now,
                        check_at_ms: w.deliver_at_ms,
                        log_index: w.log_index,
                        position: w.position,
                        commit: false,
                        messages: Vec::new(),
                    })
                    .await?;
                if reply == Reply::Ok {
                    let (li, p) = w.txn.unwrap_or((w.log_index, w.position));
                    tracing::warn!(
                        topic = %req.topic,
                        transaction = %msg_id(&self.node.cfg.broker, li, p),
                        checks,
                        "transaction rolled back: its producer never answered"
                    );
                }
                continue;
            }
            m.properties.retain(|(k, _)| k != TXN_CHECKS_PROPERTY);
            m.properties
                .push((TXN_CHECKS_PROPERTY.into(), (checks + 1).to_string()));
            let next = now.saturating_add(limits.txn_check_interval_ms);
            let (_, reply) = self
                .propose(Command::Schedule {
                    topic: req.topic.clone(),
                    queue: w.queue,
                    producer_id: 0,
                    sequence: 0,
                    timestamp_ms: now,
                    id_property: String::new(),
                    deliver_at_ms: vec![next],
                    replaces: vec![(w.log_index, w.position)],
                    messages: vec![m.clone()],
                })
                .await?;
            match reply {
                Reply::Scheduled { log_index, .. } => {
                    let moved = Waiting {
                        deliver_at_ms: next,
                        log_index,
                        position: 0,
                        ..w.clone()
                    };
                    taken.push(self.open_transaction(&moved, m));
                }
                // Ended (or claimed) meanwhile.
                Reply::NotScheduled(_) => {}
                reply => return Err(unexpected(reply)),
            }
        }
        Ok(TakeTransactionChecksResponse {
            error: None,
            transactions: taken,
        })
    }
}
