//! Users and their rules (`AdminService`: PutUser, DeleteUser, ChangeRule, ListUsers), admin
//! only. Each change is a replicated command, proposed once every member applies it (feature
//! level); the state machine decides whether it applies (a user that exists, a rule not there).

use raftmq_proto::v1::{
    ChangeRuleRequest, ChangeRuleResponse, DeleteUserRequest, DeleteUserResponse, ListUsersRequest,
    ListUsersResponse, PutUserRequest, PutUserResponse, UserInfo, UserRule,
};
use raftmq_security::acl::{self, Effect, Resource, Rule};
use tonic::{Request, Response, Status};

use super::Broker;
use crate::command::{Command, CommandOf};
use crate::error::{Error, Result, reply_field};

/// The tag of `PutUser`, the first user command: a group whose members all apply it applies
/// the three.
const PUT_USER_TAG: u32 = 19;
const _: () = assert!(PUT_USER_TAG + 3 <= crate::command::COMMAND_TAGS);

/// A rule as the wire carries it, parsed.
pub fn parse_rule(r: &UserRule) -> Result<Rule> {
    let effect = match r.effect.to_ascii_lowercase().as_str() {
        "allow" => Effect::Allow,
        "deny" => Effect::Deny,
        other => {
            return Err(Error::invalid(format!(
                "rule effect {other:?} is not allow or deny"
            )));
        }
    };
    Rule::parse(effect, &r.actions, &r.resource).map_err(|e| Error::invalid(e.to_string()))
}

/// A rule as the wire carries it.
pub fn wire_rule(r: &Rule) -> UserRule {
    UserRule {
        effect: match r.effect {
            Effect::Allow => "allow".into(),
            Effect::Deny => "deny".into(),
        },
        actions: r
            .actions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        resource: r.resource.to_string(),
    }
}

impl Broker {
    async fn propose_user_change(&self, cmd: Command) -> Result<()> {
        self.require_leader()?;
        self.require_tag(PUT_USER_TAG + 2).await?;
        self.propose_for_error(cmd).await
    }

    pub(super) async fn put_user_rpc(
        &self,
        req: Request<PutUserRequest>,
    ) -> std::result::Result<Response<PutUserResponse>, Status> {
        authorize!(self, req, PutUserResponse, Admin, [Resource::cluster()]);
        let r = req.into_inner();
        let outcome = async {
            acl::validate_user(&r.access_key, &r.secret_key)
                .map_err(|e| Error::invalid(e.to_string()))?;
            if r.access_key == self.node.cfg.admin_access_key {
                return Err(Error::invalid(format!(
                    "{:?} is the bootstrap admin of the nodes' config: change it there",
                    r.access_key
                )));
            }
            self.propose_user_change(CommandOf::PutUser {
                access_key: r.access_key,
                secret: r.secret_key,
                admin: r.admin,
                create: r.create,
            })
            .await
        };
        Ok(Response::new(PutUserResponse {
            error: reply_field(outcome.await),
        }))
    }

    pub(super) async fn delete_user_rpc(
        &self,
        req: Request<DeleteUserRequest>,
    ) -> std::result::Result<Response<DeleteUserResponse>, Status> {
        authorize!(self, req, DeleteUserResponse, Admin, [Resource::cluster()]);
        let access_key = req.into_inner().access_key;
        let outcome = self
            .propose_user_change(CommandOf::DeleteUser { access_key })
            .await;
        Ok(Response::new(DeleteUserResponse {
            error: reply_field(outcome),
        }))
    }

    pub(super) async fn change_rule_rpc(
        &self,
        req: Request<ChangeRuleRequest>,
    ) -> std::result::Result<Response<ChangeRuleResponse>, Status> {
        authorize!(self, req, ChangeRuleResponse, Admin, [Resource::cluster()]);
        let r = req.into_inner();
        let outcome = async {
            let rule = parse_rule(
                r.rule
                    .as_ref()
                    .ok_or_else(|| Error::invalid("a rule is required"))?,
            )?;
            self.propose_user_change(CommandOf::ChangeRule {
                access_key: r.access_key,
                rule,
                revoke: r.revoke,
            })
            .await
        };
        Ok(Response::new(ChangeRuleResponse {
            error: reply_field(outcome.await),
        }))
    }

    pub(super) async fn list_users_rpc(
        &self,
        req: Request<ListUsersRequest>,
    ) -> std::result::Result<Response<ListUsersResponse>, Status> {
        authorize!(self, req, ListUsersResponse, Admin, [Resource::cluster()]);
        if let Err(e) = self.require_leader() {
            return Ok(Response::new(ListUsersResponse {
                error: Some(e.into()),
                ..Default::default()
            }));
        }
        let cfg = &self.node.cfg;
        let mut users = Vec::new();
        if cfg.auth {
            users.push(UserInfo {
                access_key: cfg.admin_access_key.clone(),
                admin: true,
                rules: Vec::new(),
                from_config: true,
            });
        }
        users.extend(self.node.state().users.values().map(|u| UserInfo {
            access_key: u.access_key.clone(),
            admin: u.admin,
            rules: u.rules.iter().map(wire_rule).collect(),
            from_config: false,
        }));
        Ok(Response::new(ListUsersResponse { error: None, users }))
    }
}
