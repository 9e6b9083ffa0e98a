//! The `AdminService`: leadership transfer and membership changes, done by the Raft member. Its
//! refusals (not the leader, a change in progress, a bad voter set) map to codes like every other
//! service error.

use raftmq_proto::v1::admin_service_server::AdminService;
use raftmq_proto::v1::{
    AddLearnerRequest, AddLearnerResponse, ChangeRuleRequest, ChangeRuleResponse,
    ChangeVotersRequest, ChangeVotersResponse, DeleteUserRequest, DeleteUserResponse,
    ListUsersRequest, ListUsersResponse, PutUserRequest, PutUserResponse, TransferLeaderRequest,
    TransferLeaderResponse,
};
use raftmq_security::acl::Resource;
use tonic::{Request, Response, Status};

use super::Broker;
use crate::error::{Error, Refused, Result, reply_field};

#[tonic::async_trait]
impl AdminService for Broker {
    async fn transfer_leader(
        &self,
        req: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
        authorize!(
            self,
            req,
            TransferLeaderResponse,
            Admin,
            [Resource::cluster()]
        );
        let to = req.into_inner().to_node_id;
        let outcome = self.node.member.transfer_leader(to).await;
        Ok(Response::new(TransferLeaderResponse {
            error: reply_field(outcome.map_err(Error::from)),
        }))
    }

    async fn add_learner(
        &self,
        req: Request<AddLearnerRequest>,
    ) -> Result<Response<AddLearnerResponse>, Status> {
        authorize!(self, req, AddLearnerResponse, Admin, [Resource::cluster()]);
        let req = req.into_inner();
        let outcome = if req.node_id == 0 || req.address.is_empty() {
            Err(Refused::LearnerIncomplete.into())
        } else {
            (self.node.member.add_learner(req.node_id, req.address).await).map_err(Error::from)
        };
        Ok(Response::new(AddLearnerResponse {
            error: reply_field(outcome),
        }))
    }

    async fn change_voters(
        &self,
        req: Request<ChangeVotersRequest>,
    ) -> Result<Response<ChangeVotersResponse>, Status> {
        authorize!(
            self,
            req,
            ChangeVotersResponse,
            Admin,
            [Resource::cluster()]
        );
        let voters = req.into_inner().voters.into_iter().collect();
        let outcome = self.node.member.change_voters(voters).await;
        Ok(Response::new(ChangeVotersResponse {
            error: reply_field(outcome.map_err(Error::from)),
        }))
    }

    async fn put_user(
        &self,
        req: Request<PutUserRequest>,
    ) -> Result<Response<PutUserResponse>, Status> {
        self.put_user_rpc(req).await
    }

    async fn delete_user(
        &self,
        req: Request<DeleteUserRequest>,
    ) -> Result<Response<DeleteUserResponse>, Status> {
        self.delete_user_rpc(req).await
    }

    async fn change_rule(
        &self,
        req: Request<ChangeRuleRequest>,
    ) -> Result<Response<ChangeRuleResponse>, Status> {
        self.change_rule_rpc(req).await
    }

    async fn list_users(
        &self,
        req: Request<ListUsersRequest>,
    ) -> Result<Response<ListUsersResponse>, Status> {
        self.list_users_rpc(req).await
    }
}
