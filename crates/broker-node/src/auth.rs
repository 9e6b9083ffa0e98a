//! Authentication and authorization of every request that reaches the node's port.
//!
//! The [`Gate`] (a tonic interceptor in front of every public service) finds who is calling and
//! puts a [`Caller`] into the request's extensions; it refuses nothing itself, so each service
//! answers a refusal in its own terms (a v1 reply's `error` field with UNAUTHENTICATED or
//! FORBIDDEN; the RocketMQ 5 front's UNAUTHORIZED 40100 or FORBIDDEN 40300). A handler then asks
//! [`authorize`] whether the caller may do its action on its resources.
//!
//! With auth off every caller is [`Caller::Open`]. With auth on:
//! - a verified client certificate naming a node of this cluster is [`Caller::Node`];
//! - a request signed by the config's bootstrap admin, or by a user of the replicated state, is
//!   [`Caller::User`], with the user's rules;
//! - anything else is [`Caller::Unauthenticated`], with the reason.
//!
//! Secrets are read under the state's read lock and compared in constant time; no secret, and no
//! signature, reaches a log line, a reply or a metric.

use std::sync::Arc;

use raftmq_security::Caller;
use raftmq_security::acl::{self, Action, Resource};
use raftmq_security::sign;
use tonic::{Request, Status};

use crate::error::Refused;
use crate::node::Node;

/// The interceptor in front of every public service.
#[derive(Clone)]
pub struct Gate {
    node: Arc<Node>,
}

impl Gate {
    pub fn new(node: Arc<Node>) -> Self {
        Gate { node }
    }
}

/// A user as a request sees it: its role and a copy of its rules.
struct Found {
    secret: String,
    admin: bool,
    rules: Vec<acl::Rule>,
}

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let caller = caller_of(&self.node, &req);
        req.extensions_mut().insert(caller);
        Ok(req)
    }
}

fn caller_of<T>(node: &Node, req: &Request<T>) -> Caller {
    let cfg = &node.cfg;
    if !cfg.auth {
        return Caller::Open;
    }
    if let Some(certs) = req.peer_certs()
        && raftmq_security::identity::names_node_of(&certs, &cfg.cluster)
    {
        return Caller::Node;
    }
    let md = req.metadata();
    let header = |name: &str| md.get(name).and_then(|v| v.to_str().ok());
    let mut found = None;
    let checked = sign::check(
        header(sign::AUTHORIZATION),
        header(sign::DATE_TIME),
        sign::now_secs(),
        cfg.signature_window_secs,
        |ak| {
            let f = if ak == cfg.admin_access_key {
                Found {
                    secret: cfg.admin_secret_key.0.clone(),
                    admin: true,
                    rules: Vec::new(),
                }
            } else {
                let st = node.state();
                let u = st.users.get(ak)?;
                Found {
                    secret: u.secret.clone(),
                    admin: u.admin,
                    rules: u.rules.clone(),
                }
            };
            let secret = f.secret.clone();
            found = Some(f);
            Some(secret)
        },
    );
    match (checked, found) {
        (Ok(ak), Some(f)) => Caller::User {
            access_key: ak.to_string(),
            admin: f.admin,
            rules: Arc::new(f.rules),
        },
        (Err(e), _) => Caller::Unauthenticated(e.to_string()),
        (Ok(ak), None) => Caller::Unauthenticated(format!("unknown access key {ak:?}")),
    }
}

/// Whether `caller` may do `action` on every one of `resources` ([`raftmq_security::authorize`]),
/// as the node's error.
pub fn authorize(
    caller: Option<&Caller>,
    action: Action,
    resources: &[Resource<'_>],
) -> Result<(), Refused> {
    raftmq_security::authorize(caller, action, resources).map_err(|d| match d {
        raftmq_security::Denied::Unauthenticated(reason) => Refused::Unauthenticated { reason },
        raftmq_security::Denied::Forbidden {
            who,
            action,
            resource,
        } => Refused::Forbidden {
            who,
            action: action.to_string(),
            resource,
        },
    })
}

/// [`authorize`] with the caller a request's extensions hold. With auth off, a request with no
/// caller (made in-process) is allowed too.
pub fn authorize_ext(
    cfg: &crate::config::Config,
    ext: &tonic::Extensions,
    action: Action,
    resources: &[Resource<'_>],
) -> Result<(), Refused> {
    match ext.get::<Caller>() {
        None if !cfg.auth => Ok(()),
        caller => authorize(caller, action, resources),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t1_each_caller_gets_its_answer() {
        let rules = Arc::new(vec![
            acl::Rule::parse(acl::Effect::Allow, "Pub", "topic:orders").unwrap(),
        ]);
        let alice = Caller::User {
            access_key: "alice".into(),
            admin: false,
            rules,
        };
        let orders = [Resource::topic("orders")];
        assert_eq!(authorize(Some(&alice), Action::Pub, &orders), Ok(()));
        let e = authorize(Some(&alice), Action::Create, &orders).unwrap_err();
        assert_eq!(
            e.to_string(),
            "forbidden: alice may not Create on topic:orders"
        );
        let both = [Resource::topic("orders"), Resource::group("g")];
        let e = authorize(Some(&alice), Action::Pub, &both).unwrap_err();
        assert!(e.to_string().ends_with("on group:g"), "{e}");
        assert_eq!(authorize(Some(&Caller::Open), Action::Admin, &[]), Ok(()));
        assert!(matches!(
            authorize(None, Action::Get, &orders),
            Err(Refused::Unauthenticated { .. })
        ));
        let anon = Caller::Unauthenticated("no `authorization` header".into());
        let e = authorize(Some(&anon), Action::Get, &orders).unwrap_err();
        assert_eq!(e.to_string(), "unauthenticated: no `authorization` header");
    }
}
