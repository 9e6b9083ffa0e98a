//! The crate's one error type.
//!
//! API errors ([`Error::InvalidArgument`], [`Error::TopicNotFound`], and with auth on
//! [`Error::Unauthenticated`] and [`Error::Forbidden`]) are answered to the caller inside the
//! reply's `error` field with a stable [`ErrorCode`]; the others stop start-up or the server and
//! reach the binary edge, where `anyhow` adds context.
//!
//! A message names its subject and leaves its cause to `#[source]`: the binary prints the chain
//! with `{:#}`, which appends each source once (a message that embedded its source as well
//! printed the cause twice).

use std::path::PathBuf;

use raftmq_proto::v1::{self, ErrorCode};

/// Everything that can go wrong in the nameserver.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is missing or malformed; `field` names it as in the proto.
    #[error("invalid {field}: {reason}")]
    InvalidArgument {
        /// The request field, e.g. `address` or `topics[2].name`.
        field: String,
        /// What is wrong with it, in words a person can act on.
        reason: String,
    },
    /// No live broker group hosts the topic.
    #[error("topic {topic:?} not found: no live broker group hosts it")]
    TopicNotFound {
        /// The topic asked for.
        topic: String,
    },
    /// With auth on, a call that carries no valid credentials: not signed, signed badly, too
    /// early or too late, or by an unknown access key, and made without a node certificate.
    #[error("{reason}")]
    Unauthenticated {
        /// What is wrong ("no credentials", or the signature check's reason); never a secret.
        reason: String,
    },
    /// With auth on, a user whose signature checks out but who may not do this.
    #[error(
        "access key {access_key:?} may not {action}: only the admin or a node certificate may change the registry"
    )]
    Forbidden {
        /// The call refused, e.g. `register`.
        action: &'static str,
        /// The user who asked.
        access_key: String,
    },
    /// With auth on, a node certificate used to register or unregister a node it does not name.
    #[error(
        "the node certificate of {certificate} may not {action} {node}: a node certificate registers only the nodes it names"
    )]
    NotThisNode {
        /// The call refused, e.g. `register`.
        action: &'static str,
        /// The identities the certificate names, as URIs.
        certificate: String,
        /// The node the call named, as a URI.
        node: String,
    },
    /// A configuration key has an invalid value; `key` is the TOML key (also the flag name).
    #[error("invalid config key `{key}`: {reason}")]
    Config {
        /// The TOML key, e.g. `listen`.
        key: &'static str,
        /// Why the value is refused.
        reason: String,
    },
    /// The configuration file could not be read.
    #[error("cannot read config file {path}")]
    ConfigRead {
        /// The file given with `--config`.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML or has unknown keys or wrong types.
    #[error("cannot parse config file {path}")]
    ConfigParse {
        /// The file given with `--config`.
        path: PathBuf,
        /// The parser's error, which names the key and line.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address from the config.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The TLS files could not be loaded at start-up.
    #[error("cannot load the TLS files")]
    Tls(#[source] raftmq_security::tls::TlsError),
    /// The gRPC/HTTP server failed while serving.
    #[error("the server failed")]
    Transport(#[from] tonic::transport::Error),
    /// The reflection service could not decode the embedded descriptors (a build defect).
    #[error("cannot build the gRPC reflection service")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The metrics registry refused a metric (a programming error, caught at start-up).
    #[error("the metrics registry refused a metric")]
    Metrics(#[from] prometheus::Error),
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::InvalidArgument { .. } => ErrorCode::InvalidArgument,
            Error::TopicNotFound { .. } => ErrorCode::TopicNotFound,
            Error::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            Error::Forbidden { .. } | Error::NotThisNode { .. } => ErrorCode::Forbidden,
            _ => ErrorCode::Internal,
        }
    }

    /// The error as carried in a reply's `error` field.
    pub fn to_proto(&self) -> v1::Error {
        v1::Error::new(self.code(), self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a port in use printed `nameserver: nameserver start-up failed: cannot listen
    /// on 127.0.0.1:7000: Address already in use (os error 98): Address already in use (os error
    /// 98)`, the cause twice: the message embedded its source and `{:#}` appended it again.
    #[test]
    fn t01_a_start_up_error_prints_its_cause_once() {
        let e = Error::Bind {
            addr: "127.0.0.1:7000".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(e.to_string(), "cannot listen on 127.0.0.1:7000");
        let printed = format!(
            "{:#}",
            anyhow::Error::new(e).context("nameserver start-up failed")
        );
        assert_eq!(
            printed,
            "nameserver start-up failed: cannot listen on 127.0.0.1:7000: address in use"
        );
    }

    #[test]
    fn t02_refusals_map_to_their_wire_codes() {
        let e = Error::Unauthenticated {
            reason: "no credentials".into(),
        };
        let wire = e.to_proto();
        assert_eq!(
            (wire.code(), wire.message.as_str()),
            (ErrorCode::Unauthenticated, "no credentials")
        );
        let e = Error::Forbidden {
            action: "register",
            access_key: "reader".into(),
        };
        let wire = e.to_proto();
        assert_eq!(wire.code(), ErrorCode::Forbidden);
        assert!(
            wire.message.contains("\"reader\" may not register"),
            "{}",
            wire.message
        );
    }
}
