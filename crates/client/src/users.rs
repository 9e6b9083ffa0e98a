//! Users and their rules: replicated state of every broker group, changed through each group's
//! leader with `raftmq.v1.AdminService` (PutUser, DeleteUser, ChangeRule, ListUsers), which only
//! an admin may call.
//!
//! Each broker group keeps its own copy of the users, so a change is sent to every group the
//! nameservers know, all at once, each to its group's leader (following `NOT_LEADER` hints and
//! elections like every admin call). The answer of each group comes back on its own as a
//! [`BrokerOutcome`]: a change that some groups took and others refused is visible as such
//! (which group, which code, why), and nothing is undone on the groups that took it. Running the
//! same change again is how a refusal is repaired once its cause is fixed; it reports the groups
//! that had it already (`user add` of a user that exists there, `acl revoke` of a rule gone).
//!
//! [`Admin::list_users`] returns each group's users; [`merge_users`] joins them into one view
//! that shows where groups disagree or lack a user.
//!
//! Secrets go to the leaders only (over TLS when the client has it), are never read back, and
//! nothing here prints one. Should an attempt's answer be lost after the leader applied it, the
//! retry is refused as a change already made (`user add`: the user exists).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use raftmq_proto::v1;
use raftmq_proto::v1::admin_service_client::AdminServiceClient;
pub use raftmq_proto::v1::{UserInfo, UserRule};
pub use raftmq_security::acl::{Effect, Rule};
use tokio::time::Instant;

use crate::admin::Admin;
use crate::conn::each_attempt;
use crate::error::{Error, Result};

/// Length of the secrets [`generate_secret`] makes.
pub const GENERATED_SECRET_CHARS: usize = 32;

/// A new random secret: [`GENERATED_SECRET_CHARS`] letters and digits (about 190 bits) from the
/// thread's cryptographically secure generator, seeded by the operating system.
pub fn generate_secret() -> String {
    use rand::Rng;
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(GENERATED_SECRET_CHARS)
        .map(char::from)
        .collect()
}

/// One broker group's answer to a user or rule operation.
#[derive(Debug)]
pub struct BrokerOutcome<T = ()> {
    /// The broker group.
    pub broker: String,
    /// What its leader answered (or why no leader answered before the deadline).
    pub result: Result<T>,
}

impl<T> BrokerOutcome<T> {
    /// Whether the group took the change (or answered the query).
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

/// The groups of `outcomes` that refused or did not answer, in order.
pub fn refusals<T>(outcomes: &[BrokerOutcome<T>]) -> Vec<(&str, &Error)> {
    outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err().map(|e| (o.broker.as_str(), e)))
        .collect()
}

/// A rule as the wire carries it: `effect` `allow`|`deny`, the actions comma-separated in their
/// fixed order, the resource pattern as written (`topic:orders*`).
pub fn wire_rule(rule: &Rule) -> UserRule {
    UserRule {
        effect: effect_name(rule.effect).into(),
        actions: rule
            .actions
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        resource: rule.resource.to_string(),
    }
}

/// `allow` or `deny`.
pub fn effect_name(e: Effect) -> &'static str {
    match e {
        Effect::Allow => "allow",
        Effect::Deny => "deny",
    }
}

/// Checks an access key as the nodes do (1 to 128 letters, digits or `-_.@`).
pub fn check_access_key(access_key: &str) -> Result<()> {
    // The one rule lives in `validate_user`, which checks a secret too: give it a valid one.
    raftmq_security::acl::validate_user(access_key, "a-valid-secret")
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// A user as the broker groups hold it: one entry per access key and distinct role and rules,
/// with the groups holding it that way. Groups that agree give one entry per user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserView {
    pub access_key: String,
    pub admin: bool,
    /// Sorted (by effect, actions, resource): the order of rules does not change a decision.
    pub rules: Vec<UserRule>,
    /// The bootstrap admin of the nodes' config (not replicated, not changeable with PutUser).
    pub from_config: bool,
    /// The groups holding the user like this, sorted.
    pub brokers: Vec<String>,
    /// The groups that answered without this user at all, sorted (the same for every entry of
    /// one access key). Groups that did not answer are in neither list.
    pub missing_on: Vec<String>,
}

/// Joins the answers of [`Admin::list_users`] into one entry per access key and distinct
/// (admin, rules, from_config), sorted by access key; groups that failed are left out.
pub fn merge_users(per_broker: &[BrokerOutcome<Vec<UserInfo>>]) -> Vec<UserView> {
    let answered: BTreeSet<&str> = per_broker
        .iter()
        .filter(|o| o.is_ok())
        .map(|o| o.broker.as_str())
        .collect();
    let mut by_key: BTreeMap<&str, Vec<UserView>> = BTreeMap::new();
    for o in per_broker {
        let Ok(users) = &o.result else { continue };
        for u in users {
            let mut rules = u.rules.clone();
            rules.sort_by(|a, b| {
                (&a.effect, &a.actions, &a.resource).cmp(&(&b.effect, &b.actions, &b.resource))
            });
            rules.dedup();
            let same = by_key.entry(u.access_key.as_str()).or_default();
            match same
                .iter_mut()
                .find(|v| v.admin == u.admin && v.from_config == u.from_config && v.rules == rules)
            {
                Some(v) => v.brokers.push(o.broker.clone()),
                None => same.push(UserView {
                    access_key: u.access_key.clone(),
                    admin: u.admin,
                    rules,
                    from_config: u.from_config,
                    brokers: vec![o.broker.clone()],
                    missing_on: Vec::new(),
                }),
            }
        }
    }
    let mut out = Vec::new();
    for views in by_key.into_values() {
        let holding: BTreeSet<&str> = views
            .iter()
            .flat_map(|v| v.brokers.iter().map(String::as_str))
            .collect();
        let missing: Vec<String> = answered
            .difference(&holding)
            .map(|b| b.to_string())
            .collect();
        for mut v in views {
            v.brokers.sort();
            v.brokers.dedup();
            v.missing_on = missing.clone();
            out.push(v);
        }
    }
    out
}

impl Admin {
    /// Runs `op` for every broker group the nameservers know, all at once, with one deadline;
    /// returns each group's outcome, by group name. Fails as a whole only when the nameservers
    /// do not answer or know no group.
    async fn on_every_broker<'a, T, F, Fut>(&'a self, op: F) -> Result<Vec<BrokerOutcome<T>>>
    where
        F: Fn(&'a Admin, String, Instant) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let brokers = self.broker_names().await?;
        if brokers.is_empty() {
            return Err(Error::InvalidArgument(
                "no broker group is registered with the nameservers".into(),
            ));
        }
        let deadline = self.deadline();
        let results =
            futures::future::join_all(brokers.iter().map(|b| op(self, b.clone(), deadline))).await;
        Ok(brokers
            .into_iter()
            .zip(results)
            .map(|(broker, result)| BrokerOutcome { broker, result })
            .collect())
    }

    /// Creates (`create`) or updates the user `access_key` on every broker group, with the
    /// secret `secret` and the admin role as `admin` says. A group refuses with
    /// `INVALID_ARGUMENT` to create a user it has, or to update one it has not.
    ///
    /// `admin: None` means "not admin" for a new user, and "as it is" for an update: each
    /// group's leader is asked for the user's role just before the update, so every group keeps
    /// its own.
    pub async fn put_user(
        &self,
        access_key: &str,
        secret: &str,
        admin: Option<bool>,
        create: bool,
    ) -> Result<Vec<BrokerOutcome>> {
        raftmq_security::acl::validate_user(access_key, secret)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.on_every_broker(|this, broker, deadline| async move {
            let admin = match (admin, create) {
                (Some(a), _) => a,
                (None, true) => false,
                (None, false) => this
                    .users_of(&broker, deadline)
                    .await?
                    .iter()
                    .find(|u| u.access_key == access_key)
                    // A user the group lacks: its leader refuses the update itself.
                    .is_some_and(|u| u.admin),
            };
            let req = v1::PutUserRequest {
                access_key: access_key.to_string(),
                secret_key: secret.to_string(),
                admin,
                create,
            };
            this.router
                .call_leader(
                    &broker,
                    "PutUser",
                    deadline,
                    each_attempt(&req, |ch, r| async move {
                        AdminServiceClient::new(ch).put_user(r).await
                    }),
                )
                .await
                .map(|_| ())
        })
        .await
    }

    /// Deletes the user `access_key` from every broker group. A group that has no such user
    /// refuses with `INVALID_ARGUMENT`.
    pub async fn delete_user(&self, access_key: &str) -> Result<Vec<BrokerOutcome>> {
        check_access_key(access_key)?;
        let req = v1::DeleteUserRequest {
            access_key: access_key.to_string(),
        };
        let req = &req;
        self.on_every_broker(|this, broker, deadline| async move {
            this.router
                .call_leader(
                    &broker,
                    "DeleteUser",
                    deadline,
                    each_attempt(req, |ch, r| async move {
                        AdminServiceClient::new(ch).delete_user(r).await
                    }),
                )
                .await
                .map(|_| ())
        })
        .await
    }

    /// Adds `rule` to the user's rules on every broker group (nothing changes where the user has
    /// it already), or with `revoke` removes it (a group where the user has no such rule
    /// refuses with `INVALID_ARGUMENT`, as does a group without the user).
    pub async fn change_rule(
        &self,
        access_key: &str,
        rule: &Rule,
        revoke: bool,
    ) -> Result<Vec<BrokerOutcome>> {
        check_access_key(access_key)?;
        let req = v1::ChangeRuleRequest {
            access_key: access_key.to_string(),
            rule: Some(wire_rule(rule)),
            revoke,
        };
        let req = &req;
        self.on_every_broker(|this, broker, deadline| async move {
            this.router
                .call_leader(
                    &broker,
                    "ChangeRule",
                    deadline,
                    each_attempt(req, |ch, r| async move {
                        AdminServiceClient::new(ch).change_rule(r).await
                    }),
                )
                .await
                .map(|_| ())
        })
        .await
    }

    /// The users of every broker group, as each group's leader lists them (the bootstrap admin
    /// of the nodes' config first when auth is on, then the replicated users by access key).
    /// [`merge_users`] joins them.
    pub async fn list_users(&self) -> Result<Vec<BrokerOutcome<Vec<UserInfo>>>> {
        self.on_every_broker(|this, broker, deadline| async move {
            this.users_of(&broker, deadline).await
        })
        .await
    }

    /// The users of one broker group, from its leader.
    async fn users_of(&self, broker: &str, deadline: Instant) -> Result<Vec<UserInfo>> {
        let req = v1::ListUsersRequest {};
        self.router
            .call_leader(
                broker,
                "ListUsers",
                deadline,
                each_attempt(&req, |ch, r| async move {
                    AdminServiceClient::new(ch).list_users(r).await
                }),
            )
            .await
            .map(|(reply, _)| reply.users)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raftmq_proto::v1::ErrorCode;

    fn rule(effect: &str, actions: &str, resource: &str) -> UserRule {
        UserRule {
            effect: effect.into(),
            actions: actions.into(),
            resource: resource.into(),
        }
    }

    fn user(ak: &str, admin: bool, rules: Vec<UserRule>) -> UserInfo {
        UserInfo {
            access_key: ak.into(),
            admin,
            rules,
            from_config: false,
        }
    }

    fn ok(broker: &str, users: Vec<UserInfo>) -> BrokerOutcome<Vec<UserInfo>> {
        BrokerOutcome {
            broker: broker.into(),
            result: Ok(users),
        }
    }

    fn refused(broker: &str) -> BrokerOutcome<Vec<UserInfo>> {
        BrokerOutcome {
            broker: broker.into(),
            result: Err(Error::Server {
                address: "127.0.0.1:1".into(),
                rpc: "ListUsers",
                code: ErrorCode::Forbidden,
                message: "forbidden: bob may not Admin on cluster".into(),
                leader: None,
            }),
        }
    }

    #[test]
    fn u1_rules_go_on_the_wire_as_the_nodes_parse_them() {
        let r = Rule::parse(Effect::Deny, "sub, Pub", "topic:orders*").unwrap();
        let w = wire_rule(&r);
        assert_eq!(w, rule("deny", "Pub,Sub", "topic:orders*"));
        // What the nodes do with it: the same rule back.
        let effect = if w.effect == "allow" {
            Effect::Allow
        } else {
            Effect::Deny
        };
        assert_eq!(Rule::parse(effect, &w.actions, &w.resource).unwrap(), r);
        let all = wire_rule(&Rule::parse(Effect::Allow, "all", "*").unwrap());
        assert_eq!(all.actions, "Pub,Sub,Create,Update,Delete,Get,List,Admin");
        assert_eq!(all.resource, "*");
    }

    #[test]
    fn u2_groups_that_agree_give_one_entry_and_disagreements_show() {
        let a_rules = vec![
            rule("allow", "Sub", "group:*"),
            rule("allow", "Pub,Sub", "topic:orders*"),
        ];
        // The same rules in another order are the same user.
        let b_rules = vec![a_rules[1].clone(), a_rules[0].clone()];
        let mut boot = user("admin", true, vec![]);
        boot.from_config = true;
        let got = merge_users(&[
            ok(
                "broker-b",
                vec![
                    boot.clone(),
                    user("alice", false, b_rules),
                    user("carol", true, vec![]),
                ],
            ),
            ok(
                "broker-a",
                vec![
                    boot,
                    user("alice", false, a_rules.clone()),
                    user("carol", false, vec![]),
                ],
            ),
            refused("broker-c"),
            ok("broker-d", vec![]),
        ]);
        let summary: Vec<String> = got
            .iter()
            .map(|v| {
                format!(
                    "{} admin={} rules={} on={} missing={}",
                    v.access_key,
                    v.admin,
                    v.rules.len(),
                    v.brokers.join(","),
                    v.missing_on.join(",")
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                "admin admin=true rules=0 on=broker-a,broker-b missing=broker-d",
                "alice admin=false rules=2 on=broker-a,broker-b missing=broker-d",
                // carol's role differs between the groups: one entry each.
                "carol admin=true rules=0 on=broker-b missing=broker-d",
                "carol admin=false rules=0 on=broker-a missing=broker-d",
            ]
        );
        assert!(got[0].from_config && !got[1].from_config);
        // Rules come sorted.
        assert_eq!(got[1].rules[0], rule("allow", "Pub,Sub", "topic:orders*"));
        assert!(merge_users(&[refused("broker-a")]).is_empty());
    }

    #[test]
    fn u3_refusals_name_the_groups_and_codes() {
        let outcomes = vec![
            BrokerOutcome {
                broker: "broker-a".into(),
                result: Ok(()),
            },
            BrokerOutcome {
                broker: "broker-b".into(),
                result: Err(Error::Server {
                    address: "127.0.0.1:2".into(),
                    rpc: "PutUser",
                    code: ErrorCode::InvalidArgument,
                    message: "user \"alice\" exists".into(),
                    leader: None,
                }),
            },
        ];
        let r = refusals(&outcomes);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, "broker-b");
        assert_eq!(r[0].1.code(), Some(ErrorCode::InvalidArgument));
        assert!(outcomes[0].is_ok() && !outcomes[1].is_ok());
    }

    #[test]
    fn u4_generated_secrets_are_long_random_and_valid() {
        let (a, b) = (generate_secret(), generate_secret());
        assert_eq!(a.len(), GENERATED_SECRET_CHARS);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()), "{a}");
        assert_ne!(a, b);
        assert!(raftmq_security::acl::validate_user("alice", &a).is_ok());
    }

    #[test]
    fn u5_access_keys_are_checked_before_anything_is_sent() {
        assert!(check_access_key("alice.o-k_1@x").is_ok());
        for bad in ["", "has space", "semi;colon", &"a".repeat(129)] {
            let e = check_access_key(bad).unwrap_err();
            assert!(e.to_string().contains("invalid access key"), "{bad:?}: {e}");
        }
    }

    /// Without a reachable nameserver nothing is sent and the whole call fails; a bad secret or
    /// access key is refused before that, naming the problem and never the secret.
    #[tokio::test]
    async fn u6_local_checks_come_first_and_an_unreachable_cluster_fails_whole() {
        let admin = Admin::connect("127.0.0.1:1")
            .unwrap()
            .with_timeout(std::time::Duration::from_millis(300));
        let e = admin
            .put_user("alice", "short", None, true)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("invalid secret key"), "{e}");
        assert!(!e.to_string().contains("short"), "{e}");
        let e = admin.delete_user("no spaces").await.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        let r = Rule::parse(Effect::Allow, "Pub", "topic:t").unwrap();
        let e = admin.change_rule("alice", &r, false).await.unwrap_err();
        assert!(matches!(e, Error::NameserverUnavailable { .. }), "{e}");
        let e = admin.list_users().await.unwrap_err();
        assert!(matches!(e, Error::NameserverUnavailable { .. }), "{e}");
    }
}
