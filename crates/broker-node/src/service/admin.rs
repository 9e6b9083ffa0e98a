//! The `AdminService`: leadership transfer and membership changes, done by the Raft member. Its
//! refusals (not the leader, a change in progress, a bad voter set) map to codes like every other
//! service error.

use raftmq_proto::v1::admin_service_server::AdminService;
use raftmq_proto::v1::{
    AddLearnerRequest, AddLearnerResponse, ChangeVotersRequest, ChangeVotersResponse,
    TransferLeaderRequest, TransferLeaderResponse,
};
use tonic::{Request, Response, Status};

use super::Broker;
use crate::error::{Error, Refused, Result, reply_field};

#[tonic::async_trait]
impl AdminService for Broker {
    async fn transfer_leader(
        &self,
        req: Request<TransferLeaderRequest>,
    ) -> Result<Response<TransferLeaderResponse>, Status> {
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
        let voters = req.into_inner().voters.into_iter().collect();
        let outcome = self.node.member.change_voters(voters).await;
        Ok(Response::new(ChangeVotersResponse {
            error: reply_field(outcome.map_err(Error::from)),
        }))
    }
}
