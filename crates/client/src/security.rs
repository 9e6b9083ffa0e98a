//! How the client reaches nodes and nameservers safely: TLS and request signatures.
//!
//! A [`ClientSecurity`] travels with every client ([`crate::ProducerConfig::security`],
//! [`crate::ConsumerConfig::security`], [`crate::Admin::connect_with`], and through `Admin` the
//! inspect calls), and every connection the client opens is made through it:
//! - with [`ClientSecurity::tls`] set, addresses become `https://` URIs and each endpoint carries
//!   the TLS configuration (the CA bundle trusted, and a client certificate when one was given).
//!   Servers with TLS on speak nothing else, so TLS is all or nothing for a client;
//! - with [`ClientSecurity::credentials`] set, every request is signed (`x-mq-date-time` and
//!   `authorization: MQv2-HMAC-SHA1 …`) by a [`Signer`] wrapped around each channel: a [`Conn`].
//!
//! The default is plaintext and unsigned, which a cluster without TLS and without
//! authentication expects. `{:?}` of a `ClientSecurity` shows the TLS files and the access key,
//! never the secret.
//!
//! Channels already open keep the TLS material they were made with; [`Tls::spawn_reload`] makes
//! new material apply to channels made afterwards.
//!
//! ```no_run
//! use raftmq_client::{Admin, ClientSecurity, Credentials, Producer, TlsFiles};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let security = ClientSecurity::default()
//!     .with_tls_files(TlsFiles { ca: "certs/ca.pem".into(), cert: None, key: None, crl: None })?
//!     .with_credentials(Credentials { access_key: "app".into(), secret: "app-secret".into() });
//! let admin = Admin::connect_with("ns1:9876;ns2:9876", security.clone())?;
//! let producer = Producer::builder("ns1:9876;ns2:9876").security(security).build()?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use raftmq_proto::eager_end::EagerEnd;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};

pub use raftmq_security::sign::{Credentials, Signer};
pub use raftmq_security::tls::{Tls, TlsError, TlsFiles};

/// A channel whose every request passes through the [`Signer`] of a [`ClientSecurity`] (signed
/// when it has credentials, unchanged otherwise). Generated gRPC clients take it as their
/// transport: `BrokerServiceClient<Conn>`. Under the signer, [`EagerEnd`] ends each unary request
/// with its message's frame (one write fewer per call).
pub type Conn = InterceptedService<EagerEnd<Channel>, Signer>;

/// TLS and credentials for every connection a client makes. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ClientSecurity {
    /// TLS material: when set, every connection is TLS (`https://`), trusting its CA bundle and
    /// presenting its client certificate if it has one.
    pub tls: Option<Arc<Tls>>,
    /// When set, every request is signed with these credentials.
    pub credentials: Option<Arc<Credentials>>,
}

impl ClientSecurity {
    /// Plaintext and unsigned (the default).
    pub fn plaintext() -> Self {
        ClientSecurity::default()
    }

    /// The same, with TLS from `tls`.
    pub fn with_tls(mut self, tls: Arc<Tls>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The same, with TLS from the PEM files `files` (loaded now).
    pub fn with_tls_files(self, files: TlsFiles) -> std::result::Result<Self, TlsError> {
        Ok(self.with_tls(Tls::load(files)?))
    }

    /// The same, signing every request with `credentials`.
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(Arc::new(credentials));
        self
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Whether requests are signed.
    pub fn is_signed(&self) -> bool {
        self.credentials.is_some()
    }

    /// The URI of `address` (`host:port`): `https://host:port` with TLS, `http://host:port`
    /// without; an address that has a scheme is kept.
    pub fn uri(&self, address: &str) -> String {
        raftmq_security::tls::uri(address, self.is_tls())
    }

    /// The signer of every request (passes requests through without credentials).
    pub fn signer(&self) -> Signer {
        Signer(self.credentials.clone())
    }

    /// An endpoint for `address` with the right scheme and, with TLS, its TLS configuration.
    /// Connection tuning (timeouts, windows) is the caller's. An address whose scheme does not
    /// match (`http://` with TLS on, `https://` without) is refused here, rather than failing
    /// later with a less telling transport error.
    pub fn endpoint(&self, address: &str) -> Result<Endpoint> {
        let invalid = |reason: String| Error::InvalidAddress {
            address: address.to_string(),
            reason,
        };
        let uri = self.uri(address);
        match (&self.tls, uri.split_once("://").map(|(s, _)| s)) {
            (Some(_), Some("http")) => {
                return Err(invalid(
                    "TLS is on, so the address must be https:// or have no scheme".into(),
                ));
            }
            (None, Some("https")) => {
                return Err(invalid(
                    "an https:// address needs TLS, which is not configured (a CA bundle to \
                     trust)"
                        .into(),
                ));
            }
            _ => {}
        }
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|error| invalid(crate::conn::error_chain(&error)))?;
        match &self.tls {
            None => Ok(endpoint),
            Some(tls) => endpoint
                .tls_config(tls.client_config())
                .map_err(|error| Error::Tls {
                    address: address.to_string(),
                    reason: crate::conn::error_chain(&error),
                }),
        }
    }

    /// `channel` with every request passed through [`Self::signer`].
    pub fn intercept(&self, channel: Channel) -> Conn {
        InterceptedService::new(EagerEnd(channel), self.signer())
    }

    /// A lazily connected, signing channel to `address` with tonic's default tuning, for calls
    /// the client library does not make itself (the RocketMQ 5 API, a node's raw pulls).
    pub fn connect_lazy(&self, address: &str) -> Result<Conn> {
        Ok(self.intercept(self.endpoint(address)?.connect_lazy()))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use raftmq_security::sign;
    use tonic::service::Interceptor;

    /// A CA bundle in a temporary directory, and TLS that trusts it (no client certificate).
    pub(crate) fn test_tls() -> (tempfile::TempDir, Arc<Tls>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, pem) = raftmq_security::certgen::Ca::generate("test CA").expect("CA");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, pem.cert).expect("write CA");
        let tls = Tls::load(TlsFiles {
            ca,
            cert: None,
            key: None,
            crl: None,
        })
        .expect("TLS");
        (dir, tls)
    }

    #[test]
    fn s1_tls_makes_https_endpoints_plaintext_http() {
        let (_dir, tls) = test_tls();
        let secure = ClientSecurity::plaintext().with_tls(tls);
        assert_eq!(secure.uri("10.0.0.1:8081"), "https://10.0.0.1:8081");
        assert_eq!(
            secure.endpoint("10.0.0.1:8081").unwrap().uri().to_string(),
            "https://10.0.0.1:8081/"
        );
        assert_eq!(secure.uri("https://ns:9876"), "https://ns:9876");
        let plain = ClientSecurity::default();
        assert_eq!(plain.uri("10.0.0.1:8081"), "http://10.0.0.1:8081");
        assert_eq!(
            plain.endpoint("10.0.0.1:8081").unwrap().uri().to_string(),
            "http://10.0.0.1:8081/"
        );
    }

    #[test]
    fn s2_a_scheme_that_contradicts_the_tls_setting_is_refused_by_name() {
        let (_dir, tls) = test_tls();
        let secure = ClientSecurity::plaintext().with_tls(tls);
        let e = secure.endpoint("http://ns:9876").unwrap_err().to_string();
        assert!(
            e.contains("\"http://ns:9876\"") && e.contains("TLS is on"),
            "{e}"
        );
        let e = ClientSecurity::default()
            .endpoint("https://ns:9876")
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs TLS"), "{e}");
    }

    #[test]
    fn s3_the_signer_adds_headers_the_server_check_accepts() {
        let security = ClientSecurity::default().with_credentials(Credentials {
            access_key: "ak1".into(),
            secret: "the-secret".into(),
        });
        let signed = security.signer().call(tonic::Request::new(())).unwrap();
        let md = signed.metadata();
        let auth = md.get(sign::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let date = md.get(sign::DATE_TIME).and_then(|v| v.to_str().ok());
        let who = sign::check(auth, date, sign::now_secs(), 60, |ak| {
            (ak == "ak1").then(|| "the-secret".to_string())
        });
        assert_eq!(who, Ok("ak1"));
        // Without credentials nothing is added.
        let plain = ClientSecurity::default()
            .signer()
            .call(tonic::Request::new(()))
            .unwrap();
        assert!(plain.metadata().get(sign::AUTHORIZATION).is_none());
        assert!(plain.metadata().get(sign::DATE_TIME).is_none());
    }

    #[test]
    fn s4_debug_never_shows_the_secret() {
        let (_dir, tls) = test_tls();
        let security = ClientSecurity::default()
            .with_tls(tls)
            .with_credentials(Credentials {
                access_key: "ak1".into(),
                secret: "the-secret".into(),
            });
        let text = format!("{security:?}");
        assert!(text.contains("ak1") && text.contains("ca.pem"), "{text}");
        assert!(!text.contains("the-secret"), "{text}");
    }
}
