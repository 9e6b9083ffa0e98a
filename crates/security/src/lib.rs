//! `raftmq-security`: what a node, a nameserver and a client need to talk safely.
//!
//! - [`tls`]: TLS material from PEM files (rustls with ring), reloaded when a file changes; the
//!   accept loop that hands tonic finished TLS streams.
//! - [`identity`]: a node's identity in its certificate (`raftmq://cluster/group/id`), which the
//!   Raft peer service checks.
//! - [`certgen`]: a development CA and node and client certificates (`raftmq cert init`).
//! - [`sign`]: request signatures as the RocketMQ 5 clients make them (`MQv2-HMAC-SHA1`).
//! - [`acl`]: users, rules and the one decision function.

pub mod acl;
pub mod certgen;
pub mod identity;
pub mod sign;
pub mod tls;

/// Who made a request, as the server's gate found it (a request extension). Every request that
/// arrives over the network passes the gate, which sets one; a request without one was made
/// in-process by code that did not say who it acts for, and is treated as not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Authentication is off: everything is allowed.
    Open,
    /// A node of this cluster (its certificate's identity, or the cluster's admin signature on
    /// a node's own call): trusted like an admin.
    Node,
    /// The node's own code acting for a caller it has already authorized (the RocketMQ 5 front
    /// calling its broker in-process).
    Internal,
    /// A user whose signature checked out.
    User {
        /// The access key.
        access_key: String,
        /// The admin role (the config's bootstrap admin, or a user made admin).
        admin: bool,
        /// The user's rules when the request arrived.
        rules: std::sync::Arc<Vec<acl::Rule>>,
    },
    /// A request whose signature was missing or refused; the reason names why (never a secret).
    Unauthenticated(String),
}

/// Why [`authorize`] said no.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No valid signature; the reason names what is wrong (never a secret).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The user's rules do not allow the action on the resource.
    #[error("forbidden: {who} may not {action} on {resource}")]
    Forbidden {
        /// The access key.
        who: String,
        /// The action.
        action: acl::Action,
        /// The resource refused (`topic:orders`, `group:g1`, `cluster`).
        resource: String,
    },
}

/// Whether `caller` may do `action` on every one of `resources`; a refusal names the action and
/// the first resource refused. A request with no caller did not pass a gate: not authenticated.
pub fn authorize(
    caller: Option<&Caller>,
    action: acl::Action,
    resources: &[acl::Resource<'_>],
) -> Result<(), Denied> {
    match caller {
        Some(Caller::Open | Caller::Node | Caller::Internal) => Ok(()),
        Some(Caller::User {
            access_key,
            admin,
            rules,
        }) => {
            for r in resources {
                if acl::decide(*admin, rules, action, r) != acl::Decision::Allow {
                    return Err(Denied::Forbidden {
                        who: access_key.clone(),
                        action,
                        resource: r.to_string(),
                    });
                }
            }
            Ok(())
        }
        Some(Caller::Unauthenticated(reason)) => Err(Denied::Unauthenticated(reason.clone())),
        None => Err(Denied::Unauthenticated(
            "the request did not pass the node's gate".into(),
        )),
    }
}

/// Whether `caller` is authenticated at all (any user, a node, or auth off).
pub fn authenticated(caller: Option<&Caller>) -> Result<(), Denied> {
    authorize(caller, acl::Action::Get, &[])
}
