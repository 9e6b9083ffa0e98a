//! TLS material from files, picked up again when a file changes.
//!
//! A node's files are a CA bundle (every CA it trusts: during a rotation both the old and the
//! new), its certificate chain and its private key, all PEM. The server side asks a connecting
//! client for a certificate but does not require one: a client of the public API proves who it is
//! by signing its requests, while the Raft peer service admits only a certificate that chains to
//! the bundle and names a member of the node's own group (see [`crate::identity`]). The client
//! side (peer connections, registration, forwarding) presents the node's certificate.
//!
//! A certificate revocation list file (PEM, one CRL per CA; `raftmq cert revoke` writes one) makes
//! the server side refuse a client certificate it lists: a revoked node can then neither reach its
//! peers' Raft service nor register with a nameserver. Only the leaf is checked, and a certificate
//! of a CA the file has no CRL for is not refused (during a CA rotation only one CA may have one).
//!
//! [`Tls::reload_if_changed`] rereads the files when their size or time changed; a new connection
//! gets the new material, connections already open keep theirs. A file that does not parse leaves
//! the old material in force and is reported, so a half-written file never takes a node down.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use futures::Stream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// How long a client may take over its TLS handshake before its connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a node looks at its TLS files by default.
pub const RELOAD_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);

/// Where the PEM files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA bundle: every certificate in it is trusted.
    pub ca: PathBuf,
    /// This side's certificate chain (required to serve; optional for a client).
    pub cert: Option<PathBuf>,
    /// This side's private key (with `cert`).
    pub key: Option<PathBuf>,
    /// Certificate revocation lists (PEM) the server side checks client certificates against.
    pub crl: Option<PathBuf>,
}

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read TLS file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("TLS file {path} holds no {what}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
    /// rustls refused the material (a key that does not match the certificate, a bad CA).
    #[error("TLS material of {path} refused: {reason}")]
    Refused {
        /// The file most likely at fault.
        path: PathBuf,
        /// rustls's reason.
        reason: String,
    },
    /// A certificate without a key or a key without a certificate.
    #[error("a TLS certificate and its key must be given together")]
    Pair,
}

struct Loaded {
    stamp: Vec<Option<(SystemTime, u64)>>,
    server: Option<Arc<rustls::ServerConfig>>,
    client: ClientTlsConfig,
}

/// A node's or a client's TLS material, reloadable.
pub struct Tls {
    files: TlsFiles,
    loaded: RwLock<Arc<Loaded>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

impl Tls {
    /// Loads the files once.
    pub fn load(files: TlsFiles) -> Result<Arc<Tls>, TlsError> {
        if files.cert.is_some() != files.key.is_some() {
            return Err(TlsError::Pair);
        }
        let loaded = load(&files)?;
        Ok(Arc::new(Tls {
            files,
            loaded: RwLock::new(Arc::new(loaded)),
        }))
    }

    /// The files.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn current(&self) -> Arc<Loaded> {
        self.loaded
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The server configuration in force (None without a certificate).
    pub fn server_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.current().server.clone()
    }

    /// The configuration a new client connection uses.
    pub fn client_config(&self) -> ClientTlsConfig {
        self.current().client.clone()
    }

    /// Rereads the files if one changed; `Ok(true)` when new material is now in force. On an
    /// error the old material stays.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        if stamps(&self.files) == self.current().stamp {
            return Ok(false);
        }
        let fresh = load(&self.files)?;
        *self.loaded.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
        Ok(true)
    }

    /// Looks at the files every `every` until the process ends, logging each reload.
    pub fn spawn_reload(self: &Arc<Self>, every: Duration) {
        let tls = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(tls) = tls.upgrade() else { return };
                match tls.reload_if_changed() {
                    Ok(true) => {
                        tracing::info!(ca = %tls.files.ca.display(), "TLS files changed: new connections use the new certificates")
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(
                        "TLS files changed but cannot be used, keeping the old ones: {e}"
                    ),
                }
            }
        });
    }
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn stamps(files: &TlsFiles) -> Vec<Option<(SystemTime, u64)>> {
    [
        Some(&files.ca),
        files.cert.as_ref(),
        files.key.as_ref(),
        files.crl.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|p| stamp(p))
    .collect()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.to_path_buf(),
            what: "PEM certificate",
        });
    }
    Ok(certs)
}

/// ring, the one crypto provider (as tonic's `tls-ring`). rustls 0.23.48 marks ring's provider
/// deprecated for its lack of post-quantum key exchange; the project keeps ring by decision.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let stamp = stamps(files);
    let ca_pem = read(&files.ca)?;
    let ca = certs(&files.ca, &ca_pem)?;
    let mut roots = rustls::RootCertStore::empty();
    for c in ca {
        roots.add(c).map_err(|e| TlsError::Refused {
            path: files.ca.clone(),
            reason: e.to_string(),
        })?;
    }
    let mut client = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca_pem));
    let mut server = None;
    if let (Some(cert_path), Some(key_path)) = (&files.cert, &files.key) {
        let cert_pem = read(cert_path)?;
        let key_pem = read(key_path)?;
        let chain = certs(cert_path, &cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsError::Empty {
            path: key_path.clone(),
            what: "PEM private key",
        })?;
        let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated();
        if let Some(crl_path) = &files.crl {
            let crl_pem = read(crl_path)?;
            let crls: Vec<_> = CertificateRevocationListDer::pem_slice_iter(&crl_pem)
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::Refused {
                    path: crl_path.clone(),
                    reason: format!("not a PEM certificate revocation list: {e}"),
                })?;
            verifier = verifier
                .with_crls(crls)
                .only_check_end_entity_revocation()
                .allow_unknown_revocation_status();
        }
        let verifier = verifier.build().map_err(|e| TlsError::Refused {
            path: match (&e, &files.crl) {
                (rustls::server::VerifierBuilderError::InvalidCrl(_), Some(crl)) => crl.clone(),
                _ => files.ca.clone(),
            },
            reason: e.to_string(),
        })?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Refused {
                path: cert_path.clone(),
                reason: e.to_string(),
            })?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Refused {
                path: key_path.clone(),
                reason: e.to_string(),
            })?;
        // gRPC needs h2; `/metrics` and the console's HTTP/1.1 clients take http/1.1.
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        server = Some(Arc::new(cfg));
        client = client.identity(Identity::from_pem(&cert_pem, &key_pem));
    }
    Ok(Loaded {
        stamp,
        server,
        client,
    })
}

/// Accepts TCP connections and completes their TLS handshakes off the accept loop (a slow or
/// hostile client holds up no one else). A handshake that fails — a certificate from another CA,
/// a client that speaks plaintext — drops that connection only.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<Tls>,
) -> impl Stream<Item = io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let Some(cfg) = tls.server_config() else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let acceptor = TlsAcceptor::from(cfg);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake refused: {e}"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// `https://addr` with TLS, `http://addr` without (an address with a scheme is kept).
pub fn uri(address: &str, tls: bool) -> String {
    if address.contains("://") {
        address.to_string()
    } else if tls {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    }
}
