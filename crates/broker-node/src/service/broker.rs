//! The public `BrokerService`: each handler answers failures in its reply's `error` field (never a
//! gRPC status), through [`crate::error::Error::to_proto`]. Sending lives in [`super::send`],
//! pulling in [`super::reads`]; consumer offsets, topics and group membership are here.

use std::time::Instant;

use raftmq_proto::v1::broker_service_server::BrokerService;
use raftmq_proto::v1::{
    ChangeInvisibleRequest, ChangeInvisibleResponse, CommitOffsetRequest, CommitOffsetResponse,
    CreateGroupRequest, CreateGroupResponse, CreateTopicRequest, CreateTopicResponse,
    DeadLetterRequest, DeadLetterResponse, DeleteGroupRequest, DeleteGroupResponse,
    DeleteTopicRequest, DeleteTopicResponse, EndTransactionRequest, EndTransactionResponse,
    FetchOffsetRequest, FetchOffsetResponse, HeartbeatRequest, HeartbeatResponse,
    LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest, ListGroupsResponse,
    ListTopicsRequest, ListTopicsResponse, ListTransactionsRequest, ListTransactionsResponse,
    NodeRef, NodeStatusRequest, NodeStatusResponse, PopAckRequest, PopAckResponse, PopRequest,
    PopResponse, PullRequest, PullResponse, RecallRequest, RecallResponse, ResetOffsetRequest,
    ResetOffsetResponse, SendManyRequest, SendManyResponse, SendRequest, SendResponse,
    TakeTransactionChecksRequest, TakeTransactionChecksResponse, TopicConfig,
};
use raftmq_security::acl::Action::{Create, Update};
use raftmq_security::acl::Resource;
use tonic::{Request, Response, Status};

use super::{Broker, grpc_timeout};
use crate::command::{Command, Reply};
use crate::config::check_name;
use crate::error::{Error, Internal, Refused, Result, reply_field};
use crate::node::SESSION_TIMEOUT;

#[tonic::async_trait]
impl BrokerService for Broker {
    async fn send(&self, req: Request<SendRequest>) -> Result<Response<SendResponse>, Status> {
        authorize!(
            self,
            req,
            SendResponse,
            Pub,
            [Resource::topic(&req.get_ref().topic)]
        );
        let caller_timeout = grpc_timeout(req.metadata());
        let reply = self
            .send_batch(req.into_inner(), caller_timeout)
            .await
            .unwrap_or_else(|err| SendResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }

    async fn send_many(
        &self,
        req: Request<SendManyRequest>,
    ) -> Result<Response<SendManyResponse>, Status> {
        // Pub on every topic the call names: one topic the caller may not publish to refuses the
        // whole call, and nothing of it is stored.
        let topics: std::collections::BTreeSet<&str> = req
            .get_ref()
            .parts
            .iter()
            .map(|p| p.topic.as_str())
            .collect();
        let resources: Vec<Resource> = topics.into_iter().map(Resource::topic).collect();
        if let Err(refused) = crate::auth::authorize_ext(
            &self.node.cfg,
            req.extensions(),
            raftmq_security::acl::Action::Pub,
            &resources,
        ) {
            return Ok(Response::new(SendManyResponse {
                error: Some(Error::from(refused).into()),
                ..Default::default()
            }));
        }
        drop(resources);
        let caller_timeout = grpc_timeout(req.metadata());
        let reply = self
            .send_many(req.into_inner(), caller_timeout)
            .await
            .unwrap_or_else(|err| SendManyResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }

    async fn pull(&self, req: Request<PullRequest>) -> Result<Response<PullResponse>, Status> {
        authorize!(
            self,
            req,
            PullResponse,
            Sub,
            [Resource::topic(&req.get_ref().topic)]
        );
        let req = req.into_inner();
        let me = NodeRef {
            node_id: self.node.cfg.node_id,
            address: self.node.address.clone(),
        };
        let reply = match self.pull_messages(&req).await {
            Ok(reply) => reply,
            // The range the queue holds, so the consumer can reset to an offset inside it.
            Err(Error::Refused(Refused::OffsetOutOfRange { offset, min, max })) => PullResponse {
                error: Some(Error::from(Refused::OffsetOutOfRange { offset, min, max }).into()),
                min_offset: min,
                max_offset: max,
                next_offset: offset.clamp(min, max),
                ..Default::default()
            },
            Err(err) => PullResponse {
                error: Some(err.into()),
                ..Default::default()
            },
        };
        Ok(Response::new(PullResponse {
            served_by: Some(me),
            ..reply
        }))
    }

    async fn commit_offset(
        &self,
        req: Request<CommitOffsetRequest>,
    ) -> Result<Response<CommitOffsetResponse>, Status> {
        authorize!(
            self,
            req,
            CommitOffsetResponse,
            Sub,
            [
                Resource::topic(&req.get_ref().topic),
                Resource::group(&req.get_ref().group)
            ]
        );
        let req = req.into_inner();
        let outcome = async {
            check_name("group", &req.group).map_err(Error::invalid)?;
            self.require_leader()?;
            self.check_topic(&req.topic, req.queue)?;
            self.propose_for_error(Command::CommitOffset {
                group: req.group,
                topic: req.topic,
                queue: req.queue,
                offset: req.offset,
            })
            .await
        };
        Ok(Response::new(CommitOffsetResponse {
            error: reply_field(outcome.await),
        }))
    }

    async fn fetch_offset(
        &self,
        req: Request<FetchOffsetRequest>,
    ) -> Result<Response<FetchOffsetResponse>, Status> {
        authorize!(
            self,
            req,
            FetchOffsetResponse,
            Sub,
            [
                Resource::topic(&req.get_ref().topic),
                Resource::group(&req.get_ref().group)
            ]
        );
        let req = req.into_inner();
        if let Err(err) = self.check_topic(&req.topic, req.queue) {
            return Ok(Response::new(FetchOffsetResponse {
                error: Some(err.into()),
                ..Default::default()
            }));
        }
        let st = self.node.state();
        let v = st.offsets.get(&(req.group, req.topic, req.queue)).copied();
        Ok(Response::new(FetchOffsetResponse {
            error: None,
            found: v.is_some(),
            offset: v.unwrap_or(0),
        }))
    }

    async fn create_topic(
        &self,
        req: Request<CreateTopicRequest>,
    ) -> Result<Response<CreateTopicResponse>, Status> {
        authorize!(
            self,
            req,
            CreateTopicResponse,
            Create,
            [Resource::topic(&req.get_ref().name)]
        );
        let req = req.into_inner();
        let outcome = async {
            check_name("topic", &req.name).map_err(Error::invalid)?;
            let max = self.node.cfg.limits.queues_per_topic_max;
            if req.queues == 0 || req.queues > max {
                return Err(Refused::QueueCount {
                    requested: req.queues,
                    max,
                }
                .into());
            }
            self.require_leader()?;
            // While a member still runs the first release (a roll in progress), a NORMAL topic
            // is created with that release's command, which every member applies.
            let cmd = if req.message_type == raftmq_proto::v1::TopicMessageType::Normal as i32
                && self.group_command_tags() <= crate::features::FIRST_RELEASE_COMMAND_TAGS
            {
                Command::CreateTopic {
                    name: req.name.clone(),
                    queues: req.queues,
                    update: req.update,
                }
            } else {
                Command::ConfigureTopic {
                    name: req.name.clone(),
                    queues: req.queues,
                    update: req.update,
                    message_type: req.message_type as u32,
                }
            };
            let (_, reply) = self.propose(cmd).await?;
            match reply {
                Reply::Ok => Ok(TopicConfig {
                    name: req.name,
                    queues: req.queues,
                    message_type: req.message_type,
                }),
                other => Err(Error::from_reply(&other).unwrap_or_else(|| {
                    Internal::UnexpectedReply {
                        reply: format!("{other:?}"),
                    }
                    .into()
                })),
            }
        };
        let reply = match outcome.await {
            Ok(topic) => CreateTopicResponse {
                error: None,
                topic: Some(topic),
            },
            Err(err) => CreateTopicResponse {
                error: Some(err.into()),
                topic: None,
            },
        };
        Ok(Response::new(reply))
    }

    async fn delete_topic(
        &self,
        req: Request<DeleteTopicRequest>,
    ) -> Result<Response<DeleteTopicResponse>, Status> {
        authorize!(
            self,
            req,
            DeleteTopicResponse,
            Delete,
            [Resource::topic(&req.get_ref().name)]
        );
        let req = req.into_inner();
        let outcome = async {
            check_name("topic", &req.name).map_err(Error::invalid)?;
            self.require_leader()?;
            self.propose_for_error(Command::DeleteTopic { name: req.name })
                .await
        };
        Ok(Response::new(DeleteTopicResponse {
            error: reply_field(outcome.await),
        }))
    }

    async fn list_topics(
        &self,
        req: Request<ListTopicsRequest>,
    ) -> Result<Response<ListTopicsResponse>, Status> {
        authorize!(self, req, ListTopicsResponse, List, [Resource::cluster()]);
        let st = self.node.state();
        let topics = st
            .topic_list()
            .into_iter()
            .map(|(name, queues)| TopicConfig {
                message_type: st.topic_type(&name) as i32,
                name,
                queues,
            })
            .collect();
        Ok(Response::new(ListTopicsResponse {
            error: None,
            topics,
        }))
    }

    async fn node_status(
        &self,
        req: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatusResponse>, Status> {
        // The reply has no error field: a refusal is the gRPC status.
        crate::auth::authorize_ext(
            &self.node.cfg,
            req.extensions(),
            raftmq_security::acl::Action::Get,
            &[Resource::cluster()],
        )
        .map_err(|r| match r {
            Refused::Forbidden { .. } => Status::permission_denied(r.to_string()),
            _ => Status::unauthenticated(r.to_string()),
        })?;
        Ok(Response::new(self.status_response()))
    }

    async fn heartbeat(
        &self,
        req: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        authorize!(
            self,
            req,
            HeartbeatResponse,
            Sub,
            [Resource::group(&req.get_ref().group)]
        );
        let req = req.into_inner();
        let outcome = (|| {
            check_name("group", &req.group).map_err(Error::invalid)?;
            if req.consumer_id.is_empty() || req.consumer_id.len() > 255 {
                return Err(Refused::ConsumerIdLength.into());
            }
            self.require_leader()
        })();
        if let Err(err) = outcome {
            return Ok(Response::new(HeartbeatResponse {
                error: Some(err.into()),
                ..Default::default()
            }));
        }
        let members = self
            .node
            .heartbeat(&req.group, &req.consumer_id, Instant::now());
        Ok(Response::new(HeartbeatResponse {
            error: None,
            members,
            session_timeout_ms: SESSION_TIMEOUT.as_millis() as u64,
        }))
    }

    async fn leave_group(
        &self,
        req: Request<LeaveGroupRequest>,
    ) -> Result<Response<LeaveGroupResponse>, Status> {
        authorize!(
            self,
            req,
            LeaveGroupResponse,
            Sub,
            [Resource::group(&req.get_ref().group)]
        );
        let req = req.into_inner();
        if let Err(err) = self.require_leader() {
            return Ok(Response::new(LeaveGroupResponse {
                error: Some(err.into()),
            }));
        }
        self.node.leave(&req.group, &req.consumer_id);
        Ok(Response::new(LeaveGroupResponse { error: None }))
    }

    async fn create_group(
        &self,
        req: Request<CreateGroupRequest>,
    ) -> Result<Response<CreateGroupResponse>, Status> {
        let name = req
            .get_ref()
            .group
            .as_ref()
            .map(|g| g.name.clone())
            .unwrap_or_default();
        let action = if req.get_ref().update { Update } else { Create };
        authorize_action!(
            self,
            req,
            CreateGroupResponse,
            action,
            [Resource::group(&name)]
        );
        let req = req.into_inner();
        let outcome = match req.group {
            Some(g) => self.upsert_group(g, req.update).await,
            None => Err(Error::invalid("group is required")),
        };
        Ok(Response::new(match outcome {
            Ok(g) => CreateGroupResponse {
                error: None,
                group: Some(g),
            },
            Err(err) => CreateGroupResponse {
                error: Some(err.into()),
                group: None,
            },
        }))
    }

    async fn delete_group(
        &self,
        req: Request<DeleteGroupRequest>,
    ) -> Result<Response<DeleteGroupResponse>, Status> {
        authorize!(
            self,
            req,
            DeleteGroupResponse,
            Delete,
            [Resource::group(&req.get_ref().name)]
        );
        let outcome = self.delete_group(req.into_inner().name).await;
        Ok(Response::new(DeleteGroupResponse {
            error: reply_field(outcome),
        }))
    }

    async fn list_groups(
        &self,
        req: Request<ListGroupsRequest>,
    ) -> Result<Response<ListGroupsResponse>, Status> {
        authorize!(self, req, ListGroupsResponse, List, [Resource::cluster()]);
        Ok(Response::new(ListGroupsResponse {
            error: None,
            groups: self.group_list(),
        }))
    }

    async fn pop(&self, req: Request<PopRequest>) -> Result<Response<PopResponse>, Status> {
        authorize!(
            self,
            req,
            PopResponse,
            Sub,
            [
                Resource::topic(&req.get_ref().topic),
                Resource::group(&req.get_ref().group)
            ]
        );
        let caller_timeout = grpc_timeout(req.metadata());
        let reply = self
            .pop_messages(req.into_inner(), caller_timeout)
            .await
            .unwrap_or_else(|err| PopResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }

    async fn pop_ack(
        &self,
        req: Request<PopAckRequest>,
    ) -> Result<Response<PopAckResponse>, Status> {
        authorize!(
            self,
            req,
            PopAckResponse,
            Sub,
            [
                Resource::topic(&req.get_ref().topic),
                Resource::group(&req.get_ref().group)
            ]
        );
        let reply = self
            .pop_ack(req.into_inner())
            .await
            .unwrap_or_else(|err| PopAckResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }

    async fn change_invisible(
        &self,
        req: Request<ChangeInvisibleRequest>,
    ) -> Result<Response<ChangeInvisibleResponse>, Status> {
        authorize!(
            self,
            req,
            ChangeInvisibleResponse,
            Sub,
            [
                Resource::topic(&req.get_ref().topic),
                Resource::group(&req.get_ref().group)
            ]
        );
        let reply = Broker::change_invisible(self, req.into_inner())
            .await
            .unwrap_or_else(|err| ChangeInvisibleResponse {
                error: Some(err.into()),
                ..Default::default()
            });
        Ok(Response::new(reply))
    }

    async fn dead_letter(
        &self,
        req: Request<DeadLetterRequest>,
    ) -> Result<Response<DeadLetterResponse>, Status> {
        authorize!(
            self,
            req,
            DeadLetterResponse,
            Sub,
            [
                Resource::topic(&req.get_ref().topic),
                Resource::group(&req.get_ref().group)
            ]
        );
        let outcome = self.dead_letter_now(req.into_inner()).await;
        Ok(Response::new(DeadLetterResponse {
            error: reply_field(outcome),
        }))
    }

    async fn reset_offset(
        &self,
        req: Request<ResetOffsetRequest>,
    ) -> Result<Response<ResetOffsetResponse>, Status> {
        authorize!(
            self,
            req,
            ResetOffsetResponse,
            Update,
            [
                Resource::topic(&req.get_ref().topic),
                Resource::group(&req.get_ref().group)
            ]
        );
        let req = req.into_inner();
        let outcome = async {
            check_name("group", &req.group).map_err(Error::invalid)?;
            self.require_leader()?;
            self.check_topic(&req.topic, req.queue)?;
            let pop = self.node.state_value(|st| {
                st.pop.groups.contains_key(&req.group)
                    || st.pop.queues.contains_key(&(
                        req.group.clone(),
                        req.topic.clone(),
                        req.queue,
                    ))
            });
            let cmd = if pop {
                Command::ResetPop {
                    group: req.group,
                    topic: req.topic,
                    queue: req.queue,
                    offset: req.offset,
                }
            } else {
                Command::CommitOffset {
                    group: req.group,
                    topic: req.topic,
                    queue: req.queue,
                    offset: req.offset,
                }
            };
            self.propose_for_error(cmd).await.map(|()| pop)
        };
        Ok(Response::new(match outcome.await {
            Ok(pop) => ResetOffsetResponse { error: None, pop },
            Err(e) => ResetOffsetResponse {
                error: Some(e.into()),
                pop: false,
            },
        }))
    }

    async fn recall(
        &self,
        req: Request<RecallRequest>,
    ) -> Result<Response<RecallResponse>, Status> {
        authorize!(
            self,
            req,
            RecallResponse,
            Pub,
            [Resource::topic(&req.get_ref().topic)]
        );
        let req = req.into_inner();
        let outcome = async {
            check_name("topic", &req.topic).map_err(Error::invalid)?;
            self.recall_scheduled(&req.topic, &req.msg_id).await
        };
        Ok(Response::new(match outcome.await {
            Ok(deliver_at_ms) => RecallResponse {
                error: None,
                deliver_at_ms,
            },
            Err(e) => RecallResponse {
                error: Some(e.into()),
                deliver_at_ms: 0,
            },
        }))
    }

    async fn end_transaction(
        &self,
        req: Request<EndTransactionRequest>,
    ) -> Result<Response<EndTransactionResponse>, Status> {
        authorize!(
            self,
            req,
            EndTransactionResponse,
            Pub,
            [Resource::topic(&req.get_ref().topic)]
        );
        Ok(Response::new(
            Broker::end_transaction(self, req.into_inner())
                .await
                .unwrap_or_else(|e| EndTransactionResponse {
                    error: Some(e.into()),
                    ..Default::default()
                }),
        ))
    }

    async fn list_transactions(
        &self,
        req: Request<ListTransactionsRequest>,
    ) -> Result<Response<ListTransactionsResponse>, Status> {
        authorize!(
            self,
            req,
            ListTransactionsResponse,
            Get,
            [Resource::topic(&req.get_ref().topic)]
        );
        Ok(Response::new(
            Broker::list_transactions(self, req.into_inner())
                .await
                .unwrap_or_else(|e| ListTransactionsResponse {
                    error: Some(e.into()),
                    ..Default::default()
                }),
        ))
    }

    async fn take_transaction_checks(
        &self,
        req: Request<TakeTransactionChecksRequest>,
    ) -> Result<Response<TakeTransactionChecksResponse>, Status> {
        authorize!(
            self,
            req,
            TakeTransactionChecksResponse,
            Pub,
            [Resource::topic(&req.get_ref().topic)]
        );
        Ok(Response::new(
            Broker::take_transaction_checks(self, req.into_inner())
                .await
                .unwrap_or_else(|e| TakeTransactionChecksResponse {
                    error: Some(e.into()),
                    ..Default::default()
                }),
        ))
    }
}
