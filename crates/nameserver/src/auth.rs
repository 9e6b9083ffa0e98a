//! Who may call the NameserverService: the pure decisions, with no I/O and no clock.
//!
//! With `auth` on, every call is identified once, by the [`Gate`], as a [`Caller`]:
//! - a client certificate that the TLS handshake verified against the CA bundle and that names a
//!   raftmq node (`raftmq://<cluster>/<group>/<id>`) makes a [`Caller::Node`], which may register
//!   and unregister only the nodes its certificate names ([`authorize_node`]);
//! - otherwise a signature (`authorization` and `x-mq-date-time`, as the RocketMQ 5 clients sign)
//!   by the admin makes a [`Caller::Admin`], by a configured user a [`Caller::User`];
//! - anything else is [`Caller::Unauthenticated`], with the reason.
//!
//! Then [`authorize`] decides per [`Action`]: nodes and the admin may do everything; users may
//! read routes and cluster info but not change the registry. With `auth` off every call is
//! [`Caller::Open`]. Health, reflection and `/metrics` are not NameserverService calls and stay
//! open.

use std::collections::HashMap;
use std::fmt;

use raftmq_security::identity::{self, NodeIdentity};
use raftmq_security::sign;
use tonic::transport::CertificateDer;

use crate::config::{Config, Secret};
use crate::error::Error;

/// Who made a call, as the [`Gate`] found it (a request extension).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Auth is off: everything is allowed.
    Open,
    /// A verified client certificate naming raftmq nodes: the identities it names.
    Node(Vec<NodeIdentity>),
    /// A signature by the admin's credentials.
    Admin,
    /// A signature by a configured user; the access key.
    User(String),
    /// No valid credentials; the reason, never a secret.
    Unauthenticated(String),
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Open => f.write_str("anyone (auth off)"),
            Caller::Node(ids) => write!(f, "the node certificate of {}", uris(ids)),
            Caller::Admin => f.write_str("the admin"),
            Caller::User(access_key) => write!(f, "user {access_key:?}"),
            Caller::Unauthenticated(_) => f.write_str("an unauthenticated caller"),
        }
    }
}

/// A NameserverService call, as far as permissions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `Register`: adds or refreshes a node.
    Register,
    /// `Unregister`: removes a node.
    Unregister,
    /// `Route`: reads a topic's route.
    Route,
    /// `GetClusterInfo`: reads every cluster's layout.
    ClusterInfo,
}

impl Action {
    /// The call in words, as a refusal names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Register => "register",
            Action::Unregister => "unregister",
            Action::Route => "route",
            Action::ClusterInfo => "get cluster info",
        }
    }

    /// Whether the call changes the registry (and so where clients are sent).
    pub fn changes_registry(self) -> bool {
        matches!(self, Action::Register | Action::Unregister)
    }
}

/// The reason given to a call that presents nothing at all.
pub const NO_CREDENTIALS: &str =
    "no credentials: sign the request (x-mq-date-time, authorization) or use a node certificate";

/// Whether `caller` may do `action`. A call with no caller did not pass the gate (code that calls
/// the service in-process without saying who it acts for): it has no credentials.
pub fn authorize(caller: Option<&Caller>, action: Action) -> Result<(), Error> {
    match caller {
        Some(Caller::Open | Caller::Node(_) | Caller::Admin) => Ok(()),
        Some(Caller::User(_)) if !action.changes_registry() => Ok(()),
        Some(Caller::User(access_key)) => Err(Error::Forbidden {
            action: action.as_str(),
            access_key: access_key.clone(),
        }),
        Some(Caller::Unauthenticated(reason)) => Err(Error::Unauthenticated {
            reason: reason.clone(),
        }),
        None => Err(Error::Unauthenticated {
            reason: NO_CREDENTIALS.into(),
        }),
    }
}

/// The identities, as their URIs, comma separated.
fn uris(ids: &[NodeIdentity]) -> String {
    ids.iter()
        .map(NodeIdentity::uri)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `caller` may register or unregister (`action`) node `node_id` of `cluster`/`broker`:
/// what [`authorize`] allows, and a node certificate only for the nodes it names, so a node of
/// one group can neither take over another group's routes nor remove its nodes. The admin's
/// signature (an operator's) and auth off may name any node.
pub fn authorize_node(
    caller: Option<&Caller>,
    action: Action,
    cluster: &str,
    broker: &str,
    node_id: u64,
) -> Result<(), Error> {
    authorize(caller, action)?;
    let Some(Caller::Node(ids)) = caller else {
        return Ok(());
    };
    let named = ids
        .iter()
        .any(|i| i.cluster == cluster && i.broker == broker && i.node_id == node_id);
    if named {
        return Ok(());
    }
    Err(Error::NotThisNode {
        action: action.as_str(),
        certificate: uris(ids),
        node: NodeIdentity {
            cluster: cluster.into(),
            broker: broker.into(),
            node_id,
        }
        .uri(),
    })
}

/// The credentials the nameserver knows, from the config (auth on only).
#[derive(Debug, Clone)]
pub struct Gate {
    admin_access_key: String,
    admin_secret: Secret,
    users: HashMap<String, Secret>,
    window_secs: u64,
}

impl Gate {
    /// The gate of a validated config; `None` with auth off.
    pub fn new(config: &Config) -> Option<Gate> {
        if !config.auth {
            return None;
        }
        Some(Gate {
            admin_access_key: config.admin_access_key.clone(),
            // `validate` requires the secret with auth on.
            admin_secret: config.admin_secret_key.clone()?,
            users: config
                .users
                .iter()
                .map(|u| (u.access_key.clone(), u.secret_key.clone()))
                .collect(),
            window_secs: config.signature_window_secs,
        })
    }

    /// Number of users besides the admin.
    pub fn user_count(&self) -> usize {
        self.users.len()
    }

    /// Identifies one call from its verified peer certificates (leaf first), its `authorization`
    /// and `x-mq-date-time` headers, and the clock (`now_secs`, Unix seconds).
    pub fn identify(
        &self,
        peer_certs: Option<&[CertificateDer<'_>]>,
        authorization: Option<&str>,
        date_time: Option<&str>,
        now_secs: u64,
    ) -> Caller {
        if let Some(leaf) = peer_certs.and_then(<[_]>::first) {
            let ids = identity::node_identities(leaf);
            if !ids.is_empty() {
                return Caller::Node(ids);
            }
        }
        if authorization.is_none() && date_time.is_none() {
            return Caller::Unauthenticated(NO_CREDENTIALS.into());
        }
        let secret_of = |access_key: &str| {
            if access_key == self.admin_access_key {
                Some(self.admin_secret.expose().to_string())
            } else {
                self.users.get(access_key).map(|s| s.expose().to_string())
            }
        };
        match sign::check(
            authorization,
            date_time,
            now_secs,
            self.window_secs,
            secret_of,
        ) {
            Ok(access_key) if access_key == self.admin_access_key => Caller::Admin,
            Ok(access_key) => Caller::User(access_key.to_string()),
            Err(e) => Caller::Unauthenticated(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::User;
    use raftmq_proto::v1::ErrorCode;
    use raftmq_security::certgen::Ca;
    use raftmq_security::identity::NodeIdentity;
    use rustls_pki_types::pem::PemObject;

    const NOW: u64 = 1_796_451_020;
    const ADMIN_SECRET: &str = "admin-secret-1";
    const READER_SECRET: &str = "reader-secret-1";

    fn gate() -> Gate {
        let config = Config {
            auth: true,
            admin_secret_key: Some(Secret::new(ADMIN_SECRET)),
            users: vec![User {
                access_key: "reader".into(),
                secret_key: Secret::new(READER_SECRET),
            }],
            ..Config::default()
        };
        config.validate().unwrap();
        Gate::new(&config).expect("auth on")
    }

    /// The caller of a call signed by `access_key` with `secret` at `signed_at`, seen at `NOW`.
    fn signed(gate: &Gate, access_key: &str, secret: &str, signed_at: u64) -> Caller {
        let date = sign::format_date_time(signed_at);
        let auth = sign::authorization(access_key, secret, &date);
        gate.identify(None, Some(&auth), Some(&date), NOW)
    }

    fn code_of(result: Result<(), Error>) -> ErrorCode {
        result.expect_err("refused").code()
    }

    const ALL: [Action; 4] = [
        Action::Register,
        Action::Unregister,
        Action::Route,
        Action::ClusterInfo,
    ];

    #[test]
    fn t10_the_admin_signature_may_do_everything() {
        let g = gate();
        let caller = signed(&g, "admin", ADMIN_SECRET, NOW - 30);
        assert_eq!(caller, Caller::Admin);
        for action in ALL {
            authorize(Some(&caller), action).unwrap();
        }
    }

    #[test]
    fn t11_a_user_reads_routes_but_may_not_change_the_registry() {
        let g = gate();
        let caller = signed(&g, "reader", READER_SECRET, NOW + 30);
        assert_eq!(caller, Caller::User("reader".into()));
        authorize(Some(&caller), Action::Route).unwrap();
        authorize(Some(&caller), Action::ClusterInfo).unwrap();
        for action in [Action::Register, Action::Unregister] {
            let e = authorize(Some(&caller), action).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Forbidden);
            let text = e.to_string();
            assert!(
                text.contains("\"reader\"") && text.contains(action.as_str()),
                "{text}"
            );
        }
    }

    #[test]
    fn t12_bad_or_missing_credentials_are_unauthenticated_with_the_reason() {
        let g = gate();
        let cases = [
            (
                signed(&g, "reader", "not-the-secret", NOW),
                "does not match",
            ),
            (signed(&g, "admin", READER_SECRET, NOW), "does not match"),
            (
                signed(&g, "stranger", READER_SECRET, NOW),
                "unknown access key",
            ),
            (g.identify(None, None, None, NOW), "no credentials"),
            (
                g.identify(None, Some("Basic abc"), Some("20261205T061020Z"), NOW),
                "malformed",
            ),
            (
                g.identify(None, None, Some(&sign::format_date_time(NOW)), NOW),
                "no `authorization` header",
            ),
        ];
        for (caller, why) in cases {
            for action in ALL {
                let e = authorize(Some(&caller), action).unwrap_err();
                assert_eq!(e.code(), ErrorCode::Unauthenticated);
                assert!(e.to_string().contains(why), "{e} should say {why:?}");
                for secret in [ADMIN_SECRET, READER_SECRET] {
                    assert!(!e.to_string().contains(secret), "{e}");
                }
            }
        }
    }

    #[test]
    fn t13_a_stale_or_future_date_is_unauthenticated() {
        let g = gate();
        for signed_at in [NOW - 901, NOW + 901, NOW - 86_400] {
            let caller = signed(&g, "admin", ADMIN_SECRET, signed_at);
            let e = authorize(Some(&caller), Action::Route).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Unauthenticated);
            assert!(e.to_string().contains("expired or replayed"), "{e}");
        }
        // The window's edge is still inside.
        assert_eq!(signed(&g, "admin", ADMIN_SECRET, NOW - 900), Caller::Admin);
    }

    #[test]
    fn t14_a_node_certificate_may_register_a_plain_client_certificate_may_not() {
        let g = gate();
        let (ca, _) = Ca::generate("test CA").unwrap();
        let id = NodeIdentity {
            cluster: "C".into(),
            broker: "broker-a".into(),
            node_id: 1,
        };
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let node = der(&ca.issue_node(&id, &["localhost".into()]).unwrap().cert);
        let client = der(&ca.issue_client("client").unwrap().cert);

        let caller = g.identify(Some(std::slice::from_ref(&node)), None, None, NOW);
        assert_eq!(caller, Caller::Node(vec![id.clone()]));
        for action in ALL {
            authorize(Some(&caller), action).unwrap();
        }

        // Without an identity the certificate counts for nothing: the signature decides.
        let caller = g.identify(Some(std::slice::from_ref(&client)), None, None, NOW);
        assert_eq!(
            code_of(authorize(Some(&caller), Action::Register)),
            ErrorCode::Unauthenticated
        );
        let date = sign::format_date_time(NOW);
        let auth = sign::authorization("reader", READER_SECRET, &date);
        let caller = g.identify(Some(&[client]), Some(&auth), Some(&date), NOW);
        assert_eq!(caller, Caller::User("reader".into()));
        assert_eq!(
            code_of(authorize(Some(&caller), Action::Register)),
            ErrorCode::Forbidden
        );
    }

    #[test]
    fn t15_auth_off_is_open_and_a_call_that_skipped_the_gate_is_not() {
        assert!(Gate::new(&Config::default()).is_none());
        for action in ALL {
            authorize(Some(&Caller::Open), action).unwrap();
            let e = authorize(None, action).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Unauthenticated);
            assert!(e.to_string().starts_with("no credentials"), "{e}");
        }
    }

    #[test]
    fn t15_a_node_certificate_registers_only_the_nodes_it_names() {
        let id = |broker: &str, node_id| NodeIdentity {
            cluster: "C".into(),
            broker: broker.into(),
            node_id,
        };
        let node = Caller::Node(vec![id("broker-a", 1)]);
        for action in [Action::Register, Action::Unregister] {
            authorize_node(Some(&node), action, "C", "broker-a", 1).unwrap();
            for (cluster, broker, node_id) in [
                ("C", "broker-a", 2),
                ("C", "broker-b", 1),
                ("D", "broker-a", 1),
            ] {
                let e = authorize_node(Some(&node), action, cluster, broker, node_id).unwrap_err();
                assert_eq!(e.code(), ErrorCode::Forbidden);
                let text = e.to_string();
                let named = format!("raftmq://{cluster}/{broker}/{node_id}");
                assert!(
                    text.contains("raftmq://C/broker-a/1")
                        && text.contains(&named)
                        && text.contains(action.as_str()),
                    "{text}"
                );
            }
            // What `authorize` refuses stays refused.
            let user = Caller::User("reader".into());
            let e = authorize_node(Some(&user), action, "C", "broker-a", 1).unwrap_err();
            assert_eq!(e.code(), ErrorCode::Forbidden);
            // The admin's signature and auth off name any node.
            for caller in [Caller::Admin, Caller::Open] {
                authorize_node(Some(&caller), action, "C", "broker-b", 7).unwrap();
            }
        }
        // A certificate naming two nodes registers either.
        let both = Caller::Node(vec![id("broker-a", 1), id("broker-b", 3)]);
        authorize_node(Some(&both), Action::Register, "C", "broker-b", 3).unwrap();
    }
}
