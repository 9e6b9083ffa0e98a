//! Development certificates: a CA, node certificates that carry a node identity, and
//! certificates for nameservers and clients. `raftmq cert init` writes them; the tests and the
//! compose files use them. Keys are ECDSA P-256, made with ring.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose,
    RevocationReason, RevokedCertParams, SanType, SerialNumber,
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
    /// A file is not what it should be: not a PEM certificate, a certificate of another CA.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
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

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The start of the day (UTC) holding `secs`, as rcgen takes dates.
macro_rules! day {
    ($secs:expr) => {{
        let (y, m, d) = crate::sign::civil_from_days(($secs / 86_400) as i64);
        rcgen::date_time_ymd(y as i32, m as u8, d as u8)
    }};
}

fn validity(p: &mut CertificateParams) {
    let now = now_secs();
    p.not_before = day!(now.saturating_sub(86_400));
    p.not_after = day!(now + VALID_DAYS * 86_400);
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

    /// The CA that [`init`] keeps in `dir` (`ca.pem`, `ca.key`), to issue or revoke more.
    pub fn from_dir(dir: &Path) -> Result<Ca, CertError> {
        Ca::from_pem(
            &read_text(&dir.join("ca.pem"))?,
            &read_text(&dir.join("ca.key"))?,
        )
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

fn read_text(p: &Path) -> Result<String, CertError> {
    fs::read_to_string(p).map_err(|source| CertError::Io {
        what: "read",
        path: p.to_path_buf(),
        source,
    })
}

/// The DER of the first PEM item of `path`'s text.
fn pem_der(path: &Path, text: &str, what: &str) -> Result<Vec<u8>, CertError> {
    let invalid = |reason: String| CertError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(text.as_bytes())
        .map_err(|e| invalid(format!("not a PEM {what}: {e}")))?;
    Ok(pem.contents)
}

/// What [`revoke`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    /// The revoked certificate's serial number, hex.
    pub serial: String,
    /// False when the list held it already.
    pub newly: bool,
    /// How many certificates the list now holds.
    pub listed: usize,
    /// The list's file, `<dir>/crl.pem`.
    pub crl: PathBuf,
}

/// Adds the certificate in the file `cert` to the certificate revocation list `<dir>/crl.pem`,
/// signed by the CA of `dir` (`ca.pem`/`ca.key`, as [`init`] writes them), keeping what it listed
/// before. A node or nameserver whose `tls_crl` names that file refuses the certificate as a
/// client once it rereads its TLS files. Refuses a certificate the CA did not issue.
pub fn revoke(dir: &Path, cert: &Path) -> Result<Revoked, CertError> {
    let ca = Ca::from_dir(dir)?;
    let ca_cert = dir.join("ca.pem");
    let ca_der = pem_der(&ca_cert, &ca.cert_pem, "certificate")?;
    let leaf_der = pem_der(cert, &read_text(cert)?, "certificate")?;
    let invalid = |path: &Path, reason: String| CertError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let (_, ca_parsed) = x509_parser::parse_x509_certificate(&ca_der)
        .map_err(|e| invalid(&ca_cert, format!("not a certificate: {e}")))?;
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der)
        .map_err(|e| invalid(cert, format!("not a certificate: {e}")))?;
    // The CA's signature decides (two development CAs may carry the same name).
    if leaf.issuer().as_raw() != ca_parsed.subject().as_raw()
        || leaf.verify_signature(Some(ca_parsed.public_key())).is_err()
    {
        return Err(invalid(
            cert,
            format!(
                "issued by {}, not by the CA of {} ({})",
                leaf.issuer(),
                dir.display(),
                ca_parsed.subject()
            ),
        ));
    }
    let serial = leaf.raw_serial().to_vec();
    let crl_path = dir.join("crl.pem");
    // (serial, revocation time in seconds) of what the list holds now.
    let mut listed: Vec<(Vec<u8>, u64)> = Vec::new();
    if crl_path.exists() {
        let text = read_text(&crl_path)?;
        let der = pem_der(&crl_path, &text, "certificate revocation list")?;
        let (_, crl) = x509_parser::parse_x509_crl(&der)
            .map_err(|e| invalid(&crl_path, format!("not a revocation list: {e}")))?;
        if crl.issuer().as_raw() != ca_parsed.subject().as_raw()
            || crl.verify_signature(ca_parsed.public_key()).is_err()
        {
            return Err(invalid(
                &crl_path,
                format!(
                    "signed by {}, not by the CA of {}",
                    crl.issuer(),
                    dir.display()
                ),
            ));
        }
        listed.extend(crl.iter_revoked_certificates().map(|r| {
            (
                r.raw_serial().to_vec(),
                r.revocation_date.timestamp().max(0) as u64,
            )
        }));
    }
    let now = now_secs();
    let newly = !listed.iter().any(|(s, _)| *s == serial);
    if newly {
        listed.push((serial.clone(), now));
    }
    let params = CertificateRevocationListParams {
        this_update: day!(now.saturating_sub(86_400)),
        next_update: day!(now + VALID_DAYS * 86_400),
        // Increases with each list written (one a second at most is enough here).
        crl_number: SerialNumber::from(now),
        issuing_distribution_point: None,
        revoked_certs: listed
            .iter()
            .map(|(serial, at)| RevokedCertParams {
                serial_number: SerialNumber::from_slice(serial),
                revocation_time: day!(*at),
                reason_code: Some(RevocationReason::Unspecified),
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let crl = params.signed_by(&ca.issuer)?;
    write(&crl_path, &crl.pem()?, 0o644)?;
    Ok(Revoked {
        serial: serial.iter().map(|b| format!("{b:02x}")).collect(),
        newly,
        listed: listed.len(),
        crl: crl_path,
    })
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
        Ca::from_dir(dir)?
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
            crl: None,
        })
        .unwrap();
        assert!(tls.server_config().is_some());
        assert!(!tls.reload_if_changed().unwrap());
    }

    /// Whether a server with `tls`'s material completes a TLS handshake with a client presenting
    /// the pair `name` of `dir` (both sides over an in-memory stream).
    async fn server_accepts(tls: &crate::tls::Tls, dir: &Path, name: &str) -> bool {
        let read = |f: String| fs::read(dir.join(f)).unwrap();
        let chain: Vec<_> = CertificateDer::pem_slice_iter(&read(format!("{name}.pem")))
            .map(Result::unwrap)
            .collect();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(&read(format!("{name}.key"))).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(&read("ca.pem".into())).unwrap())
            .unwrap();
        #[allow(deprecated)]
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        let (a, b) = tokio::io::duplex(64 << 10);
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client));
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config().unwrap());
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (server, _client) = tokio::join!(acceptor.accept(a), connector.connect(name, b));
        server.is_ok()
    }

    #[tokio::test]
    async fn t2_a_revoked_certificate_is_refused_by_a_server_that_reads_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let plan = Plan {
            cluster: "C".into(),
            groups: vec![("broker-a".into(), vec![1, 2, 3])],
            hosts: vec!["localhost".into()],
            per_node_hosts: false,
        };
        init(d, &plan).unwrap();
        let crl = d.join("crl.pem");
        let tls = crate::tls::Tls::load(crate::tls::TlsFiles {
            ca: d.join("ca.pem"),
            cert: Some(d.join("broker-a-1.pem")),
            key: Some(d.join("broker-a-1.key")),
            crl: None,
        })
        .unwrap();
        assert!(server_accepts(&tls, d, "broker-a-3").await);

        let r = revoke(d, &d.join("broker-a-3.pem")).unwrap();
        assert!(r.newly && r.listed == 1 && r.crl == crl, "{r:?}");
        assert_eq!(r.serial.len() % 2, 0);
        // Again: nothing new, the list unchanged in what it holds.
        let again = revoke(d, &d.join("broker-a-3.pem")).unwrap();
        assert!(!again.newly && again.listed == 1 && again.serial == r.serial);
        assert_eq!(revoke(d, &d.join("client.pem")).unwrap().listed, 2);

        let tls = crate::tls::Tls::load(crate::tls::TlsFiles {
            ca: d.join("ca.pem"),
            cert: Some(d.join("broker-a-1.pem")),
            key: Some(d.join("broker-a-1.key")),
            crl: Some(crl.clone()),
        })
        .unwrap();
        assert!(!server_accepts(&tls, d, "broker-a-3").await, "revoked");
        assert!(!server_accepts(&tls, d, "client").await, "revoked");
        assert!(server_accepts(&tls, d, "broker-a-2").await, "not revoked");

        // A certificate of another CA is refused by name, and the list is left as it was.
        let other = tempfile::tempdir().unwrap();
        init(other.path(), &plan).unwrap();
        let before = fs::read(&crl).unwrap();
        let e = revoke(d, &other.path().join("broker-a-2.pem")).unwrap_err();
        assert!(
            matches!(&e, CertError::Invalid { path, reason }
                if path.ends_with("broker-a-2.pem") && reason.contains("not by the CA")),
            "{e}"
        );
        assert_eq!(fs::read(&crl).unwrap(), before);
        // Another CA's list (same name) in the directory is refused, not re-signed.
        revoke(other.path(), &other.path().join("broker-a-1.pem")).unwrap();
        fs::copy(other.path().join("crl.pem"), &crl).unwrap();
        let e = revoke(d, &d.join("broker-a-2.pem")).unwrap_err();
        assert!(
            matches!(&e, CertError::Invalid { path, reason }
                if path.ends_with("crl.pem") && reason.contains("not by the CA")),
            "{e}"
        );
        fs::write(&crl, &before).unwrap();

        // A list that does not parse keeps a reload from taking effect, naming the file.
        fs::write(
            &crl,
            "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
        )
        .unwrap();
        let e = tls.reload_if_changed().unwrap_err();
        assert!(e.to_string().contains("crl.pem"), "{e}");
        assert!(
            !server_accepts(&tls, d, "broker-a-3").await,
            "old list in force"
        );
    }
}
