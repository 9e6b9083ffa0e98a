//! A node's identity in its certificate: the URI subject alternative name
//! `raftmq://<cluster>/<broker group>/<node id>`. The Raft peer service admits a caller only when
//! its verified certificate holds the identity of a node of the same cluster and group.

use rustls::pki_types::CertificateDer;

/// The scheme of a node identity.
pub const SCHEME: &str = "raftmq://";

/// A node of a broker group, as its certificate names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    /// The cluster's name.
    pub cluster: String,
    /// The broker group's name.
    pub broker: String,
    /// The node's id in the group.
    pub node_id: u64,
}

impl NodeIdentity {
    /// The URI the certificate carries.
    pub fn uri(&self) -> String {
        format!("{SCHEME}{}/{}/{}", self.cluster, self.broker, self.node_id)
    }

    /// Parses `raftmq://cluster/broker/id`.
    pub fn parse(uri: &str) -> Option<NodeIdentity> {
        let rest = uri.strip_prefix(SCHEME)?;
        let mut parts = rest.split('/');
        let (cluster, broker, id) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || cluster.is_empty() || broker.is_empty() {
            return None;
        }
        Some(NodeIdentity {
            cluster: cluster.into(),
            broker: broker.into(),
            node_id: id.parse().ok()?,
        })
    }
}

/// The node identities an end-entity certificate (DER) names; empty when it names none or does
/// not parse. The chain was verified by the TLS handshake already.
pub fn node_identities(cert: &CertificateDer<'_>) -> Vec<NodeIdentity> {
    use x509_parser::extensions::GeneralName;
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => NodeIdentity::parse(u),
            _ => None,
        })
        .collect()
}

/// Whether a verified certificate chain (leaf first) names a node of `cluster`/`broker`.
pub fn names_member_of(certs: &[CertificateDer<'_>], cluster: &str, broker: &str) -> bool {
    certs.first().is_some_and(|leaf| {
        node_identities(leaf)
            .iter()
            .any(|i| i.cluster == cluster && i.broker == broker)
    })
}

/// Whether a verified certificate chain (leaf first) names any node of `cluster`.
pub fn names_node_of(certs: &[CertificateDer<'_>], cluster: &str) -> bool {
    certs
        .first()
        .is_some_and(|leaf| node_identities(leaf).iter().any(|i| i.cluster == cluster))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t1_identity_uri_round_trip() {
        let i = NodeIdentity {
            cluster: "C".into(),
            broker: "broker-a".into(),
            node_id: 3,
        };
        assert_eq!(i.uri(), "raftmq://C/broker-a/3");
        assert_eq!(NodeIdentity::parse(&i.uri()), Some(i));
        for bad in [
            "raftmq://C/b",
            "raftmq://C/b/x",
            "raftmq:///b/1",
            "https://C/b/1",
            "raftmq://C/b/1/2",
        ] {
            assert_eq!(NodeIdentity::parse(bad), None, "{bad}");
        }
    }
}
