//! The cluster a command talks to, and how: its nameservers, TLS and request signing.
//!
//! Every command that reaches an existing cluster makes its clients here ([`Target::admin`],
//! [`Target::producer`], [`Target::consumer`], and [`Target::channel`] for raw gRPC calls), so
//! the global `--tls-*` and `--access-key`/`--secret-key` options apply to every connection it
//! opens, to nameservers and nodes alike. Commands that start their own local cluster talk to it
//! as it says ([`Target::local`]: plaintext, or TLS and the admin's signature when it is secure).
//!
//! The options are checked and the TLS files read only when a command needs them, so a command
//! that does not talk to a cluster (`cert init`, `demo`) is not refused for them.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use raftmq_client::{
    Admin, ClientSecurity, Conn, Consumer, ConsumerBuilder, Credentials, Producer, ProducerBuilder,
    TlsFiles,
};

use crate::args::SecurityArgs;

/// Nameservers and the security of every connection to the cluster they serve.
#[derive(Debug, Clone)]
pub struct Target {
    /// Nameserver addresses, `;`-separated.
    pub nameserver: String,
    pub security: ClientSecurity,
}

impl Target {
    /// The cluster of `--nameserver`, reached as the security options say.
    pub fn new(nameserver: &str, args: &SecurityArgs) -> Result<Target> {
        Ok(Target {
            nameserver: nameserver.to_string(),
            security: client_security(args)?,
        })
    }

    /// A cluster without TLS or authentication (a local cluster this process started).
    pub fn plaintext(nameserver: &str) -> Target {
        Target {
            nameserver: nameserver.to_string(),
            security: ClientSecurity::default(),
        }
    }

    /// A local cluster this process started, reached as it says (plaintext, or with TLS and its
    /// bootstrap admin's signature when it is secure).
    pub fn local(cluster: &crate::local_cluster::LocalCluster) -> Target {
        Target {
            nameserver: cluster.nameserver.clone(),
            security: cluster.security().clone(),
        }
    }

    /// How connections go, in words: `TLS, signed as admin`, `plaintext, unsigned`, ...
    pub fn security_words(&self) -> String {
        let wire = if self.security.is_tls() {
            "TLS"
        } else {
            "plaintext"
        };
        match &self.security.credentials {
            Some(c) => format!("{wire}, signed as {}", c.access_key),
            None => format!("{wire}, unsigned"),
        }
    }

    /// An admin client (admin, inspect and node status calls).
    pub fn admin(&self) -> raftmq_client::Result<Admin> {
        Admin::connect_with(&self.nameserver, self.security.clone())
    }

    /// A producer builder.
    pub fn producer(&self) -> ProducerBuilder {
        Producer::builder(&self.nameserver).security(self.security.clone())
    }

    /// A consumer builder for `group` reading `topic`.
    pub fn consumer(&self, group: &str, topic: &str) -> ConsumerBuilder {
        Consumer::builder(&self.nameserver, group, topic).security(self.security.clone())
    }

    /// A lazily connected channel to the node at `address` for raw gRPC calls, tuned by
    /// `tune`: TLS and signing as every other connection.
    pub fn channel(
        &self,
        address: &str,
        tune: impl FnOnce(tonic::transport::Endpoint) -> tonic::transport::Endpoint,
    ) -> Result<Conn> {
        let endpoint = self
            .security
            .endpoint(address)
            .with_context(|| format!("node address {address:?}"))?;
        Ok(self.security.intercept(tune(endpoint).connect_lazy()))
    }
}

/// A path option: absent when not given or empty (an empty environment variable).
fn given(p: &Option<PathBuf>) -> Option<PathBuf> {
    p.clone().filter(|p| !p.as_os_str().is_empty())
}

/// A text option: absent when not given or empty.
fn given_text(s: &Option<String>) -> Option<String> {
    s.clone().filter(|s| !s.is_empty())
}

/// The client security the options ask for: TLS with `--tls-ca` (and a client certificate with
/// `--tls-cert` and `--tls-key`), signatures with `--access-key` and `--secret-key`. Errors name
/// the options, never a secret.
pub fn client_security(args: &SecurityArgs) -> Result<ClientSecurity> {
    let mut security = ClientSecurity::default();
    let (ca, cert, key) = (
        given(&args.tls_ca),
        given(&args.tls_cert),
        given(&args.tls_key),
    );
    if cert.is_some() != key.is_some() {
        bail!(
            "--tls-cert and --tls-key (RAFTMQ_TLS_CERT, RAFTMQ_TLS_KEY) go together: give both or \
             neither"
        );
    }
    match ca {
        Some(ca) => {
            let files = TlsFiles {
                ca,
                cert,
                key,
                crl: None,
            };
            security = security
                .with_tls_files(files)
                .context("cannot load the TLS files of --tls-ca/--tls-cert/--tls-key")?;
        }
        None if cert.is_some() => bail!(
            "--tls-cert and --tls-key need --tls-ca (RAFTMQ_TLS_CA): the CA bundle that signed \
             the servers' certificates"
        ),
        None => {}
    }
    match (given_text(&args.access_key), given_text(&args.secret_key)) {
        (Some(access_key), Some(secret)) => {
            security = security.with_credentials(Credentials { access_key, secret });
        }
        (None, None) => {}
        _ => bail!(
            "--access-key and --secret-key (RAFTMQ_ACCESS_KEY, RAFTMQ_SECRET_KEY) go together: \
             give both or neither"
        ),
    }
    Ok(security)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut SecurityArgs)) -> SecurityArgs {
        let mut a = SecurityArgs::default();
        f(&mut a);
        a
    }

    #[test]
    fn no_options_is_plaintext_and_unsigned() {
        let s = client_security(&SecurityArgs::default()).unwrap();
        assert!(!s.is_tls() && !s.is_signed());
        // Empty values (an empty environment variable) count as not given.
        let s = client_security(&args(|a| {
            a.tls_ca = Some(PathBuf::new());
            a.access_key = Some(String::new());
            a.secret_key = Some(String::new());
        }))
        .unwrap();
        assert!(!s.is_tls() && !s.is_signed());
    }

    #[test]
    fn halves_of_a_pair_are_refused_by_name_without_the_secret() {
        let e = client_security(&args(|a| a.secret_key = Some("s3cr3t-value".into())))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--access-key and --secret-key"), "{e}");
        assert!(!e.contains("s3cr3t-value"), "{e}");
        let e = client_security(&args(|a| a.access_key = Some("ak".into())))
            .unwrap_err()
            .to_string();
        assert!(e.contains("give both or neither"), "{e}");
        let e = client_security(&args(|a| {
            a.tls_ca = Some("ca.pem".into());
            a.tls_cert = Some("client.pem".into());
        }))
        .unwrap_err()
        .to_string();
        assert!(e.contains("--tls-cert and --tls-key"), "{e}");
        let e = client_security(&args(|a| {
            a.tls_cert = Some("client.pem".into());
            a.tls_key = Some("client.key".into());
        }))
        .unwrap_err()
        .to_string();
        assert!(e.contains("need --tls-ca"), "{e}");
    }

    #[test]
    fn credentials_sign_and_a_missing_ca_file_is_named() {
        let s = client_security(&args(|a| {
            a.access_key = Some("ak".into());
            a.secret_key = Some("sk".into());
        }))
        .unwrap();
        assert!(s.is_signed() && !s.is_tls());
        let e = client_security(&args(|a| a.tls_ca = Some("no/such/ca.pem".into()))).unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.contains("--tls-ca") && text.contains("no/such/ca.pem"),
            "{text}"
        );
    }

    #[test]
    fn tls_files_from_cert_init_load_and_make_https_channels() {
        let dir = tempfile::tempdir().unwrap();
        let plan = raftmq_security::certgen::Plan {
            cluster: "C".into(),
            groups: vec![],
            hosts: vec!["localhost".into()],
            per_node_hosts: true,
        };
        raftmq_security::certgen::init(dir.path(), &plan).unwrap();
        let t = Target::new(
            "localhost:9876",
            &args(|a| {
                a.tls_ca = Some(dir.path().join("ca.pem"));
                a.tls_cert = Some(dir.path().join("client.pem"));
                a.tls_key = Some(dir.path().join("client.key"));
            }),
        )
        .unwrap();
        assert!(t.security.is_tls());
        assert_eq!(t.security_words(), "TLS, unsigned");
        assert_eq!(
            Target::plaintext("h:1").security_words(),
            "plaintext, unsigned"
        );
        assert_eq!(t.security.uri("localhost:8081"), "https://localhost:8081");
        assert!(t.admin().is_ok());
    }
}
