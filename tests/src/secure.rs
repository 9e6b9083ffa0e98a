//! Clusters with TLS and authentication on, for the security tests: development certificates
//! made with `raftmq_security::certgen` in the test's directory, every node and the nameserver
//! serving TLS, auth on with a known bootstrap admin, and clients that dial over TLS and sign.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use raftmq_proto::v1::admin_service_client::AdminServiceClient;
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_security::certgen;
use raftmq_security::sign::{Credentials, Signer};
use raftmq_security::tls::{Tls, TlsFiles};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::Cluster;
use raftmq_cli::local_cluster::LocalCluster;

/// The bootstrap admin of every secure test cluster.
pub const ADMIN_KEY: &str = "admin";
/// Its secret (8 characters or more, as the config requires).
pub const ADMIN_SECRET: &str = "admin-secret-for-tests";

/// Users the nameserver of every secure test cluster lets read routes (its `[[users]]`): the
/// brokers learn them by `PutUser` in each test.
pub const READERS: [(&str, &str); 2] = [("alice", "alice-secret"), ("bob", "bob-secret-1")];

/// A channel that signs every request with the credentials it was made with (or none).
pub type Conn = InterceptedService<Channel, Signer>;

/// What a test needs to talk to a secure cluster.
pub struct Secure {
    /// The certificates: `ca.pem`, `broker-a-N.pem/.key`, `nameserver.pem/.key`, `client.*`.
    pub certs: PathBuf,
    /// TLS as a client trusting the test CA (no client certificate).
    pub tls: Arc<Tls>,
    /// The bootstrap admin.
    pub admin: Credentials,
    /// Each node's plaintext health and metrics listener (`--health-listen`), by node id.
    pub health: std::collections::BTreeMap<u64, String>,
}

impl Secure {
    /// A signed (or, with `None`, unsigned) broker client of the node at `addr`, over TLS.
    pub fn client(&self, addr: &str, creds: Option<&Credentials>) -> BrokerServiceClient<Conn> {
        BrokerServiceClient::new(self.conn(addr, creds)).max_decoding_message_size(64 << 20)
    }

    /// An admin-service client of the node at `addr`, over TLS.
    pub fn admin_client(
        &self,
        addr: &str,
        creds: Option<&Credentials>,
    ) -> AdminServiceClient<Conn> {
        AdminServiceClient::new(self.conn(addr, creds))
    }

    /// A lazily connected TLS channel to `addr` signing with `creds`.
    pub fn conn(&self, addr: &str, creds: Option<&Credentials>) -> Conn {
        channel(addr, &self.tls, creds)
    }

    /// Flags of the `raftmq` CLI for this cluster: TLS and the admin's credentials.
    pub fn cli_flags(&self) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.certs.join("ca.pem").display().to_string(),
            "--access-key".into(),
            self.admin.access_key.clone(),
            "--secret-key".into(),
            self.admin.secret.clone(),
        ]
    }
}

/// A lazily connected TLS channel to `addr` with `tls`, signing with `creds`.
pub fn channel(addr: &str, tls: &Tls, creds: Option<&Credentials>) -> Conn {
    let ch = Endpoint::from_shared(format!("https://{addr}"))
        .expect("address")
        .tls_config(tls.client_config())
        .expect("TLS config")
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    InterceptedService::new(ch, Signer(creds.cloned().map(Arc::new)))
}

/// Makes the development certificates of `groups` (broker name, node count) into `dir`.
pub fn make_certs(dir: &Path, groups: &[(&str, u64)]) {
    let plan = certgen::Plan {
        cluster: "DefaultCluster".into(),
        groups: groups
            .iter()
            .map(|(b, n)| (b.to_string(), (1..=*n).collect()))
            .collect(),
        hosts: vec!["localhost".into(), "127.0.0.1".into()],
        per_node_hosts: true,
    };
    certgen::init(dir, &plan).expect("make certificates");
}

impl Cluster {
    /// A nameserver and `n` nodes of `broker-a` with TLS everywhere (each node its own
    /// certificate) and auth on (bootstrap admin [`ADMIN_KEY`]/[`ADMIN_SECRET`]); waits for a
    /// leader through TLS and signed calls. The certificates are in `<dir>/certs`, made for
    /// `broker-a` and, for the tests of a stranger, `broker-b`.
    pub async fn start_secure(n: u64, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        make_certs(&certs, &[("broker-a", n), ("broker-b", 1)]);
        // A revocation list from the start, as an operator keeps one: it lists a retired
        // client's certificate.
        let ca = certgen::Ca::from_dir(&certs).unwrap();
        let retired = certs.join("retired.pem");
        std::fs::write(&retired, ca.issue_client("retired").unwrap().cert).unwrap();
        certgen::revoke(&certs, &retired).unwrap();
        let path = |f: &str| certs.join(f).display().to_string();
        let ns_config = dir.path().join("nameserver.toml");
        let users: String = READERS
            .iter()
            .map(|(ak, sk)| format!("[[users]]\naccess_key = \"{ak}\"\nsecret_key = \"{sk}\"\n"))
            .collect();
        std::fs::write(&ns_config, users).unwrap();
        let mut broker_args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        broker_args.extend([
            "--tls-ca".into(),
            path("ca.pem"),
            "--tls-crl".into(),
            path("crl.pem"),
            "--auth".into(),
        ]);
        let opts = Cluster::options(n, &[], &[("RAFTMQ_ADMIN_SECRET_KEY", ADMIN_SECRET)])
            .broker_args(&broker_args)
            .nameserver_args([
                "--config",
                &ns_config.display().to_string(),
                "--tls-ca",
                &path("ca.pem"),
                "--tls-cert",
                &path("nameserver.pem"),
                "--tls-key",
                &path("nameserver.key"),
                "--tls-crl",
                &path("crl.pem"),
                "--auth",
                "--admin-secret-key",
                ADMIN_SECRET,
            ])
            .dir(dir.path());
        let mut local = LocalCluster::create(opts).unwrap_or_else(|e| panic!("{e:#}"));
        let mut health = std::collections::BTreeMap::new();
        for id in 1..=n {
            let h = format!("127.0.0.1:{}", crate::free_port());
            local
                .set_node_args(
                    id,
                    [
                        "--tls-cert".to_string(),
                        path(&format!("broker-a-{id}.pem")),
                        "--tls-key".to_string(),
                        path(&format!("broker-a-{id}.key")),
                        "--health-listen".to_string(),
                        h.clone(),
                    ],
                )
                .unwrap();
            health.insert(id, h);
        }
        local.launch().unwrap_or_else(|e| panic!("{e:#}"));
        let tls = Tls::load(TlsFiles {
            ca: certs.join("ca.pem"),
            cert: None,
            key: None,
            crl: None,
        })
        .expect("load the test CA");
        let secure = Secure {
            certs,
            tls,
            admin: Credentials {
                access_key: ADMIN_KEY.into(),
                secret: ADMIN_SECRET.into(),
            },
            health,
        };
        let c = Cluster {
            local,
            dir,
            proxy: None,
            secure: Some(secure),
        };
        c.leader().await;
        c
    }

    /// The secure parts of a cluster started with [`Cluster::start_secure`].
    pub fn secure(&self) -> &Secure {
        self.secure
            .as_ref()
            .expect("a cluster started with start_secure")
    }
}
