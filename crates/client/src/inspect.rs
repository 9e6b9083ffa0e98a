//! Operator views, asked of each broker group's leader through `raftmq.v1.InspectService`: a
//! topic's queues, a consumer group's progress, and messages found by id, key or store time.
//! A leader answers from its applied state, so no figure comes from a replica that is behind.

use std::collections::BTreeMap;
use std::time::Duration;

use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::inspect_service_client::InspectServiceClient;
use raftmq_proto::v1::{self, ErrorCode, find_messages_request::By};

use crate::admin::Admin;
use crate::conn::{each_attempt, request};
use crate::error::{Error, Result};
use crate::router::Reply;

/// One broker group's answer, with the leader that gave it.
#[derive(Debug, Clone)]
pub struct FromLeader<T> {
    pub broker: String,
    /// The answering leader's node id, when the nameservers list its address.
    pub leader_id: Option<u64>,
    pub leader: String,
    pub reply: T,
}

/// Where `Admin::reset_group` moves a group's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    /// Each queue's lowest offset still held.
    Earliest,
    /// Each queue's next offset: only messages stored from now on are read.
    Latest,
    /// Each queue's first offset stored at or after this time (ms since the epoch).
    Time(u64),
}

/// One queue's offset moved by `Admin::reset_group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reset {
    pub broker: String,
    pub queue: u32,
    /// The committed offset before (none: never committed).
    pub from: Option<u64>,
    pub to: u64,
}

/// Messages found in a topic, each with its broker group, oldest store time first.
#[derive(Debug, Clone, Default)]
pub struct Found {
    pub messages: Vec<(String, v1::StoredMessage)>,
    /// More matched than the limit asked for.
    pub truncated: bool,
}

impl Admin {
    /// Broker group → (node address → node id), and broker group → topics it hosts, as the
    /// nameservers know them.
    async fn broker_map(&self) -> Result<BTreeMap<String, (BTreeMap<String, u64>, Vec<String>)>> {
        let info = self.router.cluster_info().await?;
        let mut out: BTreeMap<String, (BTreeMap<String, u64>, Vec<String>)> = BTreeMap::new();
        for b in info.iter().flat_map(|c| &c.brokers) {
            let e = out.entry(b.name.clone()).or_default();
            e.0.extend(b.nodes.iter().map(|n| (n.address.clone(), n.node_id)));
            e.1.extend(b.topics.iter().map(|t| t.topic.clone()));
        }
        Ok(out)
    }

    /// The broker groups hosting `topic` (all of them for `None`), with their addresses' ids.
    async fn hosts(&self, topic: Option<&str>) -> Result<Vec<(String, BTreeMap<String, u64>)>> {
        let hosts: Vec<_> = self
            .broker_map()
            .await?
            .into_iter()
            .filter(|(_, (_, topics))| topic.is_none_or(|t| topics.iter().any(|x| x == t)))
            .map(|(b, (ids, _))| (b, ids))
            .collect();
        match topic {
            Some(t) if hosts.is_empty() => Err(Error::TopicNotFound {
                topic: t.to_string(),
            }),
            _ => Ok(hosts),
        }
    }

    /// Asks the leader of each of `hosts` with `call`, all at once.
    async fn ask_leaders<R, F, Fut>(
        &self,
        hosts: Vec<(String, BTreeMap<String, u64>)>,
        rpc: &'static str,
        call: F,
    ) -> Vec<Result<FromLeader<R>>>
    where
        R: Reply,
        F: Fn(InspectServiceClient<crate::security::Conn>, Duration) -> Fut + Clone,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, tonic::Status>>,
    {
        let deadline = self.deadline();
        let asks = hosts.into_iter().map(|(broker, ids)| {
            let call = call.clone();
            async move {
                let (reply, leader) = self
                    .router
                    .call_leader(&broker, rpc, deadline, |ch, attempt| {
                        call.clone()(InspectServiceClient::new(ch), attempt)
                    })
                    .await?;
                Ok(FromLeader {
                    leader_id: ids.get(&leader).copied(),
                    broker,
                    leader,
                    reply,
                })
            }
        });
        futures::future::join_all(asks).await
    }

    /// Every queue of `topic` on every broker group hosting it, from each group's leader; with
    /// `at_ms`, each queue's first offset stored at or after that time too.
    pub async fn topic_status(
        &self,
        topic: &str,
        at_ms: Option<u64>,
    ) -> Result<Vec<FromLeader<v1::TopicStatusResponse>>> {
        crate::admin::check_name("topic", topic)?;
        let hosts = self.hosts(Some(topic)).await?;
        let req = v1::TopicStatusRequest {
            topic: topic.to_string(),
            at_ms,
        };
        let call = move |mut c: InspectServiceClient<_>, attempt| {
            let req = request(req.clone(), attempt);
            async move { c.topic_status(req).await }
        };
        self.ask_leaders(hosts, "TopicStatus", call)
            .await
            .into_iter()
            .collect()
    }

    /// A consumer group's progress on every broker group that knows it (on `topic`'s queues only
    /// when one is named). [`Error::GroupNotFound`] when no group does.
    pub async fn group_status(
        &self,
        group: &str,
        topic: Option<&str>,
    ) -> Result<Vec<FromLeader<v1::GroupStatusResponse>>> {
        crate::admin::check_name("group", group)?;
        let hosts = self.hosts(topic).await?;
        let req = v1::GroupStatusRequest {
            group: group.to_string(),
            topic: topic.unwrap_or_default().to_string(),
        };
        let call = move |mut c: InspectServiceClient<_>, attempt| {
            let req = request(req.clone(), attempt);
            async move { c.group_status(req).await }
        };
        let mut out = Vec::new();
        for r in self.ask_leaders(hosts, "GroupStatus", call).await {
            match r {
                Ok(a) => out.push(a),
                Err(e) if e.code() == Some(ErrorCode::GroupNotFound) => {}
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            return Err(Error::GroupNotFound {
                group: group.to_string(),
            });
        }
        Ok(out)
    }

    /// Messages of `topic` found `by` id, key or store time, at most `limit` (0: the node's
    /// default), asked of every broker group hosting the topic.
    pub async fn find_messages(&self, topic: &str, by: By, limit: u32) -> Result<Found> {
        crate::admin::check_name("topic", topic)?;
        let hosts = self.hosts(Some(topic)).await?;
        let req = v1::FindMessagesRequest {
            topic: topic.to_string(),
            by: Some(by),
            limit,
        };
        let call = move |mut c: InspectServiceClient<_>, attempt| {
            let req = request(req.clone(), attempt);
            async move { c.find_messages(req).await }
        };
        let mut found = Found::default();
        for r in self.ask_leaders(hosts, "FindMessages", call).await {
            let a = r?;
            found.truncated |= a.reply.truncated;
            let broker = a.broker;
            found
                .messages
                .extend(a.reply.messages.into_iter().map(|m| (broker.clone(), m)));
        }
        found.messages.sort_by(|(b1, m1), (b2, m2)| {
            (m1.store_timestamp_ms, b1, m1.queue, m1.offset).cmp(&(
                m2.store_timestamp_ms,
                b2,
                m2.queue,
                m2.offset,
            ))
        });
        if limit > 0 && found.messages.len() > limit as usize {
            found.messages.truncate(limit as usize);
            found.truncated = true;
        }
        Ok(found)
    }

    /// Moves consumer group `group` on every queue of `topic` (replicated, on each broker group's
    /// leader): a pull group's committed offsets, or a POP group's cursor (its deliveries in
    /// flight there are dropped). Refused while pull members of the group are connected (they
    /// would commit over it) unless `force`. RocketMQ 5 (POP) consumers do not heartbeat here, so
    /// their presence is not checked.
    pub async fn reset_group(
        &self,
        group: &str,
        topic: &str,
        to: ResetTo,
        force: bool,
    ) -> Result<Vec<Reset>> {
        crate::admin::check_name("group", group)?;
        let before = match self.group_status(group, Some(topic)).await {
            Ok(s) => s,
            Err(Error::GroupNotFound { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut members: Vec<&str> = before
            .iter()
            .flat_map(|a| a.reply.members.iter().map(String::as_str))
            .collect();
        members.sort();
        members.dedup();
        if !members.is_empty() && !force {
            return Err(Error::InvalidArgument(format!(
                "group {group} has {} member(s) connected ({}); stop them first, or pass --force \
                 (they may commit over the reset)",
                members.len(),
                members.join(", ")
            )));
        }
        let at_ms = match to {
            ResetTo::Time(ms) => Some(ms),
            _ => None,
        };
        // Where each queue was: the committed offset, or a POP group's cursor.
        let committed: BTreeMap<(String, u32), Option<u64>> = before
            .iter()
            .flat_map(|a| {
                a.reply.queues.iter().map(|q| {
                    let at = q.committed_offset.or(q.pop_next);
                    ((a.broker.clone(), q.queue), at)
                })
            })
            .collect();
        let deadline = self.deadline();
        let mut done = Vec::new();
        for a in self.topic_status(topic, at_ms).await? {
            for q in &a.reply.queues {
                let target = match to {
                    ResetTo::Earliest => q.min_offset,
                    ResetTo::Latest => q.max_offset,
                    ResetTo::Time(_) => q.offset_at.unwrap_or(q.max_offset),
                };
                let req = v1::ResetOffsetRequest {
                    group: group.to_string(),
                    topic: topic.to_string(),
                    queue: q.queue,
                    offset: target,
                };
                self.router
                    .call_leader(
                        &a.broker,
                        "ResetOffset",
                        deadline,
                        each_attempt(&req, |ch, r| async move {
                            BrokerServiceClient::new(ch).reset_offset(r).await
                        }),
                    )
                    .await?;
                done.push(Reset {
                    broker: a.broker.clone(),
                    queue: q.queue,
                    from: committed
                        .get(&(a.broker.clone(), q.queue))
                        .copied()
                        .flatten(),
                    to: target,
                });
            }
        }
        Ok(done)
    }

    /// Cancels a scheduled message (DELAY topic) not yet delivered, by the id its send returned
    /// (`BROKER-INDEX-POSITION`; the broker group is its prefix). Returns the group and the
    /// delivery time it had.
    pub async fn recall(&self, topic: &str, msg_id: &str) -> Result<(String, u64)> {
        crate::admin::check_name("topic", topic)?;
        let broker = broker_of(msg_id)?;
        let req = v1::RecallRequest {
            topic: topic.to_string(),
            msg_id: msg_id.to_string(),
        };
        let (reply, _) = self
            .router
            .call_leader(
                broker,
                "Recall",
                self.deadline(),
                each_attempt(&req, |ch, r| async move {
                    BrokerServiceClient::new(ch).recall(r).await
                }),
            )
            .await?;
        Ok((broker.to_string(), reply.deliver_at_ms))
    }

    /// Commits (or rolls back) transaction `id` of TRANSACTION topic `topic`: the raftmq id its
    /// half message's send returned. Returns the broker group and, for a commit, where the
    /// message is now readable (queue, offset).
    pub async fn end_transaction(
        &self,
        topic: &str,
        id: &str,
        commit: bool,
    ) -> Result<(String, u32, u64)> {
        crate::admin::check_name("topic", topic)?;
        let broker = broker_of(id)?;
        let req = v1::EndTransactionRequest {
            topic: topic.to_string(),
            transaction_id: id.to_string(),
            commit,
            from_check: false,
        };
        let (reply, _) = self
            .router
            .call_leader(
                broker,
                "EndTransaction",
                self.deadline(),
                each_attempt(&req, |ch, r| async move {
                    BrokerServiceClient::new(ch).end_transaction(r).await
                }),
            )
            .await?;
        Ok((broker.to_string(), reply.queue, reply.offset))
    }

    /// The open transactions of TRANSACTION topic `topic` on every broker group hosting it (at
    /// most `limit` per group; 0 = the node's cap), by next check time.
    pub async fn list_transactions(
        &self,
        topic: &str,
        limit: u32,
    ) -> Result<Vec<(String, Vec<v1::OpenTransaction>)>> {
        crate::admin::check_name("topic", topic)?;
        let req = v1::ListTransactionsRequest {
            topic: topic.to_string(),
            limit,
        };
        let mut out = Vec::new();
        for (broker, _) in self.hosts(Some(topic)).await? {
            let (reply, _) = self
                .router
                .call_leader(
                    &broker,
                    "ListTransactions",
                    self.deadline(),
                    each_attempt(&req, |ch, r| async move {
                        BrokerServiceClient::new(ch).list_transactions(r).await
                    }),
                )
                .await?;
            out.push((broker, reply.transactions));
        }
        Ok(out)
    }
}

/// The broker group a raftmq message id (`BROKER-INDEX-POSITION`) names.
fn broker_of(msg_id: &str) -> Result<&str> {
    let mut parts = msg_id.rsplitn(3, '-');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(_position), Some(_index), Some(broker)) => Ok(broker),
        _ => Err(Error::InvalidArgument(format!(
            "{msg_id:?} is not a raftmq message id (BROKER-INDEX-POSITION, as a send returns it)"
        ))),
    }
}
