//! Development certificates: a CA, node certificates that carry a node identity, and
//! certificates for nameservers and clients. `raftmq cert init` writes them; the tests and the
//! compose files use them. Keys are ECDSA P-256, made with ring.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::identity::NodeIdentity;

/// How long a development certificate is valid, in days.
pub const VALID_DAYS: u64 = 3 * 365;

/// Why a certificate could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused (a host name that is not a DNS name, a broken CA file).
    #[error("cannot make the certificate: {0}")]
    Make(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("cannot {what} {path}")]
    Io {
        /// `read` or `write`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// The private key.
    pub key: String,
}

/// A CA that issues certificates.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM.
    pub cert_pem: String,
}

fn validity(p: &mut CertificateParams) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let day = |secs: u64| {
        let (y, m, d) = crate::sign::civil_from_days((secs / 86_400) as i64);
        rcgen::date_time_ymd(y as i32, m as u8, d as u8)
    };
    p.not_before = day(now.saturating_sub(86_400));
    p.not_after = day(now + VALID_DAYS * 86_400);
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn generate(name: &str) -> Result<(Ca, Pem), CertError> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn.push(DnType::OrganizationName, "raftmq");
        p.distinguished_name = dn;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut p);
        let cert = p.self_signed(&key)?;
        let pem = Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        };
        let ca = Ca {
            issuer: Issuer::new(p, key),
            cert_pem: pem.cert.clone(),
        };
        Ok((ca, pem))
    }

    /// A CA from its certificate and key (PEM), to issue more certificates.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca, CertError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(Ca {
            issuer: Issuer::from_ca_cert_pem(cert_pem, key)?,
            cert_pem: cert_pem.to_string(),
        })
    }

    fn issue(
        &self,
        common_name: &str,
        hosts: &[String],
        uri: Option<String>,
        usages: Vec<ExtendedKeyUsagePurpose>,
    ) -> Result<Pem, CertError> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(hosts.to_vec())?;
        if let Some(uri) = uri {
            p.subject_alt_names
                .push(SanType::URI(uri.as_str().try_into()?));
        }
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, "raftmq");
        p.distinguished_name = dn;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = usages;
        p.use_authority_key_identifier_extension = true;
        validity(&mut p);
        let cert = p.signed_by(&key, &self.issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// A node's certificate: serves `hosts` (DNS names or IP addresses) and identifies the node
    /// to its peers (server and client use).
    pub fn issue_node(&self, id: &NodeIdentity, hosts: &[String]) -> Result<Pem, CertError> {
        self.issue(
            &format!("{}-{}", id.broker, id.node_id),
            hosts,
            Some(id.uri()),
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A nameserver's (or a console's) certificate for `hosts`, with no node identity.
    pub fn issue_server(&self, name: &str, hosts: &[String]) -> Result<Pem, CertError> {
        self.issue(
            name,
            hosts,
            None,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A client certificate named `name` (client use only; no identity).
    pub fn issue_client(&self, name: &str) -> Result<Pem, CertError> {
        self.issue(name, &[], None, vec![ExtendedKeyUsagePurpose::ClientAuth])
    }
}

/// What `raftmq cert init` makes.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The cluster's name (in every node identity).
    pub cluster: String,
    /// Broker groups and their node ids.
    pub groups: Vec<(String, Vec<u64>)>,
    /// The names and addresses every node and nameserver certificate serves (the hosts clients
    /// dial: `localhost`, `127.0.0.1`, container names).
    pub hosts: Vec<String>,
    /// Extra host names per node, `broker-node_id` first: a node's own container name.
    pub per_node_hosts: bool,
}

/// The files of one certificate: `<name>.pem` and `<name>.key`.
fn write_pair(dir: &Path, name: &str, pem: &Pem, out: &mut Vec<PathBuf>) -> Result<(), CertError> {
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    write(&cert, &pem.cert, 0o644)?;
    write(&key, &pem.key, 0o600)?;
    out.push(cert);
    out.push(key);
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32) -> Result<(), CertError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| CertError::Io {
        what: "write",
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io)?;
    io::Write::write_all(&mut f, text.as_bytes()).map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}

/// Writes into `dir`: `ca.pem`/`ca.key` (kept and reused when present, so running it again
/// issues new certificates from the same CA), `<group>-<id>.pem/.key` per node,
/// `nameserver.pem/.key`, and `client.pem/.key`. Returns the files written.
pub fn init(dir: &Path, plan: &Plan) -> Result<Vec<PathBuf>, CertError> {
    fs::create_dir_all(dir).map_err(|source| CertError::Io {
        what: "write",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    let (ca_cert, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let ca = if ca_cert.exists() && ca_key.exists() {
        let read = |p: &Path| {
            fs::read_to_string(p).map_err(|source| CertError::Io {
                what: "read",
                path: p.to_path_buf(),
                source,
            })
        };
        Ca::from_pem(&read(&ca_cert)?, &read(&ca_key)?)?
    } else {
        let (ca, pem) = Ca::generate(&format!("raftmq {} development CA", plan.cluster))?;
        write_pair(dir, "ca", &pem, &mut out)?;
        ca
    };
    for (broker, ids) in &plan.groups {
        for &node_id in ids {
            let mut hosts = Vec::new();
            if plan.per_node_hosts {
                hosts.push(format!("{broker}-{node_id}"));
            }
            hosts.extend(plan.hosts.iter().cloned());
            let id = NodeIdentity {
                cluster: plan.cluster.clone(),
                broker: broker.clone(),
                node_id,
            };
            let pem = ca.issue_node(&id, &hosts)?;
            write_pair(dir, &format!("{broker}-{node_id}"), &pem, &mut out)?;
        }
    }
    let mut ns_hosts = vec!["nameserver".to_string()];
    ns_hosts.extend(plan.hosts.iter().cloned());
    write_pair(
        dir,
        "nameserver",
        &ca.issue_server("nameserver", &ns_hosts)?,
        &mut out,
    )?;
    write_pair(dir, "client", &ca.issue_client("client")?, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn t1_a_node_certificate_names_its_node_and_chains_to_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let plan = Plan {
            cluster: "C".into(),
            groups: vec![("broker-a".into(), vec![1, 2])],
            hosts: vec!["localhost".into(), "127.0.0.1".into()],
            per_node_hosts: true,
        };
        let files = init(dir.path(), &plan).unwrap();
        assert_eq!(files.len(), 10);
        let pem = fs::read(dir.path().join("broker-a-2.pem")).unwrap();
        let leaf = CertificateDer::from_pem_slice(&pem).unwrap();
        let ids = crate::identity::node_identities(&leaf);
        assert_eq!(ids.len(), 1);
        assert_eq!(ids[0].uri(), "raftmq://C/broker-a/2");
        assert!(crate::identity::names_member_of(
            std::slice::from_ref(&leaf),
            "C",
            "broker-a"
        ));
        assert!(!crate::identity::names_member_of(&[leaf], "C", "broker-b"));
        // A second run keeps the CA and issues from it.
        let ca_before = fs::read(dir.path().join("ca.pem")).unwrap();
        let again = init(dir.path(), &plan).unwrap();
        assert_eq!(again.len(), 8);
        assert_eq!(fs::read(dir.path().join("ca.pem")).unwrap(), ca_before);
        // The material loads as a server's.
        let tls = crate::tls::Tls::load(crate::tls::TlsFiles {
            ca: dir.path().join("ca.pem"),
            cert: Some(dir.path().join("broker-a-1.pem")),
            key: Some(dir.path().join("broker-a-1.key")),
        })
        .unwrap();
        assert!(tls.server_config().is_some());
        assert!(!tls.reload_if_changed().unwrap());
    }
}
