//! A local cluster of real processes: one nameserver and one broker group of N nodes, in a
//! temporary directory, on free ports of 127.0.0.1. Every process spawn of the CLI goes through
//! this module.
//!
//! Programs: the `nameserver` and `broker-node` binaries next to the running executable (cargo's
//! `target/debug` or `target/release`; `RAFTMQ_BIN_DIR` overrides the place), else this `raftmq`
//! executable re-run with the hidden `run-nameserver` / `run-broker-node` subcommands. When the
//! binaries found are older than this executable and it embeds the servers, it is used instead,
//! so `cargo run -p raftmq-cli -- demo` never runs stale servers.
//!
//! Contract: every child is SIGKILLed and reaped when the [`LocalCluster`] is dropped — on
//! success, on error, and on Ctrl-C (the CLI drops the running command's future on SIGINT or
//! SIGTERM). Readiness is observed (node status, nameserver view), never assumed after a sleep.
//! Each node's standard output and error go to `node-N.log` in the directory.
//!
//! With [`LocalClusterOptions::secure`], the cluster runs with TLS and authentication on:
//! `create` makes development certificates into `<dir>/certs` (a CA, `<broker>-<id>` per node,
//! the nameserver's) and a random secret for the bootstrap admin `admin`; every node serves TLS
//! with its own certificate and checks signatures (`--auth`), the nameserver too; and the
//! harness's own calls ([`LocalCluster::admin`], readiness) and [`LocalCluster::security`] reach
//! it over TLS, trusting the CA, signed as that admin. The secret reaches the servers through
//! their environment, never their command lines. Restarts keep all of it.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use raftmq_client::{Admin, ClientSecurity, Credentials, NodeStatusResponse, TlsFiles};
use raftmq_security::certgen;
use raftmq_security::identity::NodeIdentity;

use crate::probe::{Leader, LeaderRule, RoleView, find_leader, wait_for};

/// Whether this executable can run the servers itself (`run-nameserver`, `run-broker-node`).
pub const SERVERS_BUILT_IN: bool = crate::servers::BUILT_IN;

/// How long a fresh cluster may take to elect a leader and register it.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The disk watermarks of a local node (`env` may override them). Its data sits in a directory
/// of a disk shared with everything else on the machine (build outputs, images), so a share of
/// the whole disk says nothing about the cluster's own use: the defaults (75 % trims early, 90 %
/// refuses sends) made a demo or a test refuse every send with DISK_FULL on a machine whose disk
/// was already 90 % full of other things. A local cluster trims early only above 97 % and refuses
/// above 99 %.
pub const LOCAL_WATERMARKS: [(&str, &str); 2] = [
    ("RAFTMQ_CLEAN_WATERMARK_PCT", "97"),
    ("RAFTMQ_FULL_WATERMARK_PCT", LOCAL_FULL_WATERMARK_PCT),
];
/// The share of the disk in use above which a local node refuses sends (in [`LOCAL_WATERMARKS`]).
pub const LOCAL_FULL_WATERMARK_PCT: &str = "99";

/// How to start a [`LocalCluster`]: `LocalClusterOptions::new(3).broker_args(["--flag", "v"])…`.
/// `Default` is what the CLI's demo and benches run: three nodes of `broker-a`.
#[derive(Debug, Clone)]
pub struct LocalClusterOptions {
    pub nodes: u64,
    pub cluster: String,
    pub broker: String,
    /// Keep the directory (data, logs) after drop.
    pub keep_dir: bool,
    /// Put data and logs here (the caller owns the directory) instead of a new temporary one.
    pub dir: Option<PathBuf>,
    /// Run the `nameserver` and `broker-node` binaries of this directory, and nothing else.
    pub bin_dir: Option<PathBuf>,
    /// Extra flags of the nameserver.
    pub nameserver_args: Vec<String>,
    /// Extra flags of every broker node.
    pub broker_args: Vec<String>,
    /// Environment of every broker node (set after the defaults, so they override them).
    pub env: Vec<(String, String)>,
    /// Divide this machine's cores among the nodes (`TOKIO_WORKER_THREADS`, see
    /// `worker_threads`); off, each node starts the runtime's default number of workers.
    pub share_cores: bool,
    /// How the harness's own calls (readiness) reach the cluster: plaintext by default; TLS and
    /// signing when the nameserver and node flags turn them on. With `secure`, `create` replaces
    /// it with TLS trusting the cluster's CA and the bootstrap admin's credentials.
    pub security: ClientSecurity,
    /// TLS and authentication on (see the module docs).
    pub secure: bool,
}

impl Default for LocalClusterOptions {
    fn default() -> Self {
        LocalClusterOptions {
            nodes: 3,
            cluster: "DefaultCluster".into(),
            broker: "broker-a".into(),
            keep_dir: false,
            dir: None,
            bin_dir: None,
            nameserver_args: Vec::new(),
            broker_args: Vec::new(),
            env: Vec::new(),
            share_cores: true,
            security: ClientSecurity::default(),
            secure: false,
        }
    }
}

fn strings<S: AsRef<str>>(v: impl IntoIterator<Item = S>) -> Vec<String> {
    v.into_iter().map(|s| s.as_ref().to_owned()).collect()
}

impl LocalClusterOptions {
    /// `nodes` nodes, otherwise the defaults.
    pub fn new(nodes: u64) -> Self {
        LocalClusterOptions {
            nodes,
            ..Default::default()
        }
    }

    pub fn keep_dir(mut self, keep: bool) -> Self {
        self.keep_dir = keep;
        self
    }

    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    pub fn bin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.bin_dir = Some(dir.into());
        self
    }

    pub fn nameserver_args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.nameserver_args.extend(strings(args));
        self
    }

    pub fn broker_args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.broker_args.extend(strings(args));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn share_cores(mut self, share: bool) -> Self {
        self.share_cores = share;
        self
    }

    pub fn security(mut self, security: ClientSecurity) -> Self {
        self.security = security;
        self
    }

    pub fn secure(mut self, on: bool) -> Self {
        self.secure = on;
        self
    }
}

/// The access key of a secure local cluster's bootstrap admin (the servers' default).
pub const SECURE_ADMIN_KEY: &str = "admin";

/// What a secure local cluster's processes and clients share: the certificates and the
/// bootstrap admin.
struct Secured {
    /// `ca.pem`/`ca.key`, `<broker>-<id>.pem/.key`, `nameserver.pem/.key`, `client.pem/.key`.
    certs: PathBuf,
    admin: Credentials,
}

impl Secured {
    /// Certificates into `<root>/certs` for `cluster`/`broker` nodes `ids` (served as
    /// `<broker>-<id>`, `localhost` and `127.0.0.1`), and a new admin secret.
    fn create(root: &Path, cluster: &str, broker: &str, ids: Vec<u64>) -> Result<Secured> {
        let certs = root.join("certs");
        let plan = certgen::Plan {
            cluster: cluster.to_string(),
            groups: vec![(broker.to_string(), ids)],
            hosts: CERT_HOSTS.iter().map(|h| h.to_string()).collect(),
            per_node_hosts: true,
        };
        certgen::init(&certs, &plan)
            .with_context(|| format!("making development certificates in {}", certs.display()))?;
        Ok(Secured {
            certs,
            admin: Credentials {
                access_key: SECURE_ADMIN_KEY.into(),
                secret: raftmq_client::users::generate_secret(),
            },
        })
    }

    fn file(&self, name: &str) -> String {
        self.certs.join(name).display().to_string()
    }

    /// TLS trusting the cluster's CA, signed as the bootstrap admin.
    fn client_security(&self) -> Result<ClientSecurity> {
        let files = TlsFiles {
            ca: self.certs.join("ca.pem"),
            cert: None,
            key: None,
            crl: None,
        };
        Ok(ClientSecurity::default()
            .with_tls_files(files)
            .with_context(|| format!("loading {}", self.certs.join("ca.pem").display()))?
            .with_credentials(self.admin.clone()))
    }

    /// The nameserver's flags (its secret goes in [`Secured::nameserver_env`]).
    fn nameserver_args(&self) -> Vec<String> {
        strings([
            "--tls-ca",
            &self.file("ca.pem"),
            "--tls-cert",
            &self.file("nameserver.pem"),
            "--tls-key",
            &self.file("nameserver.key"),
            "--auth",
        ])
    }

    fn nameserver_env(&self) -> [(&'static str, String); 2] {
        [
            ("RAFTMQ_NS_ADMIN_ACCESS_KEY", self.admin.access_key.clone()),
            ("RAFTMQ_NS_ADMIN_SECRET_KEY", self.admin.secret.clone()),
        ]
    }

    /// Node `id`'s flags; its certificate is issued first when missing (a node added later).
    fn node_args(&self, cluster: &str, broker: &str, id: u64) -> Result<Vec<String>> {
        let name = format!("{broker}-{id}");
        let (cert, key) = (
            self.certs.join(format!("{name}.pem")),
            self.certs.join(format!("{name}.key")),
        );
        if !cert.is_file() || !key.is_file() {
            self.issue_node(cluster, broker, id, &cert, &key)
                .with_context(|| format!("issuing the certificate of node {id}"))?;
        }
        Ok(strings([
            "--tls-ca",
            &self.file("ca.pem"),
            "--tls-cert",
            &cert.display().to_string(),
            "--tls-key",
            &key.display().to_string(),
            "--auth",
        ]))
    }

    fn node_env(&self) -> [(&'static str, String); 2] {
        [
            ("RAFTMQ_ADMIN_ACCESS_KEY", self.admin.access_key.clone()),
            ("RAFTMQ_ADMIN_SECRET_KEY", self.admin.secret.clone()),
        ]
    }

    fn issue_node(
        &self,
        cluster: &str,
        broker: &str,
        id: u64,
        cert: &Path,
        key: &Path,
    ) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let ca = certgen::Ca::from_dir(&self.certs)?;
        let identity = NodeIdentity {
            cluster: cluster.to_string(),
            broker: broker.to_string(),
            node_id: id,
        };
        let mut hosts = vec![format!("{broker}-{id}")];
        hosts.extend(CERT_HOSTS.iter().map(|h| h.to_string()));
        let pem = ca.issue_node(&identity, &hosts)?;
        std::fs::write(cert, &pem.cert).with_context(|| format!("writing {}", cert.display()))?;
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(key)
            .with_context(|| format!("writing {}", key.display()))?;
        std::io::Write::write_all(&mut f, pem.key.as_bytes())
            .with_context(|| format!("writing {}", key.display()))
    }
}

/// The hosts every certificate of a secure local cluster serves: what its clients dial.
const CERT_HOSTS: [&str; 2] = ["localhost", "127.0.0.1"];

#[derive(Debug, Clone)]
enum Launcher {
    Binaries {
        nameserver: PathBuf,
        broker_node: PathBuf,
    },
    SelfExe(PathBuf),
}

impl Launcher {
    /// The binaries of `dir`, which must both be there.
    fn in_dir(dir: &Path) -> Result<Launcher> {
        let (nameserver, broker_node) = (dir.join("nameserver"), dir.join("broker-node"));
        for p in [&nameserver, &broker_node] {
            if !p.is_file() {
                bail!(
                    "{} is missing: build the binaries first with `cargo build --bins`",
                    p.display()
                );
            }
        }
        Ok(Launcher::Binaries {
            nameserver,
            broker_node,
        })
    }

    fn find() -> Result<Launcher> {
        let exe = std::env::current_exe().context("locating the running executable")?;
        let mut dirs = Vec::new();
        if let Some(d) = std::env::var_os("RAFTMQ_BIN_DIR") {
            dirs.push(PathBuf::from(d));
        }
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            // Test executables live in target/<profile>/deps.
            if let Some(p) = d.parent() {
                dirs.push(p.to_path_buf());
            }
        }
        let is_raftmq = exe.file_stem().is_some_and(|s| s == "raftmq");
        let raftmq = if is_raftmq {
            Some(exe.clone())
        } else {
            dirs.iter().map(|d| d.join("raftmq")).find(|p| p.is_file())
        };
        let binaries = dirs.iter().find_map(|d| {
            let (ns, bn) = (d.join("nameserver"), d.join("broker-node"));
            (ns.is_file() && bn.is_file()).then_some((ns, bn))
        });
        if let Some((nameserver, broker_node)) = binaries {
            // A raftmq built after the binaries runs newer server code than they do.
            let stale = SERVERS_BUILT_IN
                && raftmq
                    .as_deref()
                    .and_then(modified)
                    .zip(modified(&broker_node))
                    .is_some_and(|(r, b)| b < r);
            if !stale {
                return Ok(Launcher::Binaries {
                    nameserver,
                    broker_node,
                });
            }
        }
        match raftmq {
            Some(p) => Ok(Launcher::SelfExe(p)),
            None => bail!(
                "no nameserver/broker-node binaries next to {} and no raftmq executable: build them \
                 with `cargo build -p raftmq-nameserver -p raftmq-broker-node -p raftmq-cli`",
                exe.display()
            ),
        }
    }

    fn command(&self, server: &str) -> Command {
        match (self, server) {
            (Launcher::Binaries { nameserver, .. }, "nameserver") => Command::new(nameserver),
            (Launcher::Binaries { broker_node, .. }, _) => Command::new(broker_node),
            (Launcher::SelfExe(exe), _) => {
                let mut c = Command::new(exe);
                c.arg(format!("run-{server}"));
                c
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Launcher::Binaries { broker_node, .. } => format!(
                "binaries in {}",
                broker_node
                    .parent()
                    .map_or_else(String::new, |p| p.display().to_string())
            ),
            Launcher::SelfExe(p) => format!("{} run-*", p.display()),
        }
    }
}

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// One node of the local broker group.
#[derive(Debug)]
pub struct LocalNode {
    pub node_id: u64,
    /// Its client and Raft address, `127.0.0.1:<port>`.
    pub addr: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// Started without `--peers`: it waits to be added to the group.
    joining: bool,
    /// Flags of this node only (e.g. the fault proxy's `--peer-routes`).
    args: Vec<String>,
    child: Option<Child>,
    /// SIGSTOPped.
    stopped: bool,
}

impl LocalNode {
    fn data_dir_in(root: &Path, id: u64) -> PathBuf {
        root.join(format!("node-{id}"))
    }

    fn log_in(root: &Path, id: u64) -> PathBuf {
        root.join(format!("node-{id}.log"))
    }

    fn new(root: &Path, id: u64, port: u16, joining: bool) -> LocalNode {
        LocalNode {
            node_id: id,
            addr: format!("127.0.0.1:{port}"),
            data_dir: LocalNode::data_dir_in(root, id),
            log: LocalNode::log_in(root, id),
            joining,
            args: Vec::new(),
            child: None,
            stopped: false,
        }
    }
}

/// The nodes by id (read-only: nodes come and go through [`LocalCluster`]'s methods).
#[derive(Debug, Default)]
pub struct Nodes(BTreeMap<u64, LocalNode>);

impl std::ops::Deref for Nodes {
    type Target = BTreeMap<u64, LocalNode>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<'a> IntoIterator for &'a Nodes {
    type Item = (&'a u64, &'a LocalNode);
    type IntoIter = std::collections::btree_map::Iter<'a, u64, LocalNode>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// The environment variables of the CLI's global security options, kept from local nodes.
const CLIENT_SECURITY_ENV: [&str; 5] = [
    "RAFTMQ_TLS_CA",
    "RAFTMQ_TLS_CERT",
    "RAFTMQ_TLS_KEY",
    "RAFTMQ_ACCESS_KEY",
    "RAFTMQ_SECRET_KEY",
];

/// A nameserver and one broker group running as child processes. See the module docs.
pub struct LocalCluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    launcher: Launcher,
    opts: LocalClusterOptions,
    pub cluster: String,
    pub broker: String,
    /// The nameserver list given to nodes started from now on (`a;b` for several).
    pub nameserver: String,
    ns_log: PathBuf,
    ns: Option<Child>,
    pub nodes: Nodes,
    /// Certificates and the admin, when [`LocalClusterOptions::secure`].
    secured: Option<Secured>,
}

/// Free ports on 127.0.0.1, distinct, chosen below the kernel's ephemeral range and never handed
/// out twice by this process.
///
/// A port from the ephemeral range (what binding port 0 gives) is free only until the kernel hands
/// it to someone else: while a node of one cluster is killed, an outgoing connection or another
/// cluster's `bind(0)` may take its port, and on restart the node cannot listen — or, worse, a
/// status probe of its address reaches another cluster's node (seen as two nodes claiming to lead
/// under parallel tests). Ports below that range are never given out by the kernel, so a dead
/// node's port stays its own. When the range below is too small, falls back to `bind(0)`.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    use std::sync::Mutex;
    static GIVEN: Mutex<Option<std::collections::HashSet<u16>>> = Mutex::new(None);
    let (lo, hi) = (PORTS_FROM, ephemeral_low().saturating_sub(1));
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let given = given.get_or_insert_with(Default::default);
    if hi <= lo || usize::from(hi - lo) < 16 * n {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<_>>()
            .context("finding free ports on 127.0.0.1")?;
        return listeners
            .iter()
            .map(|l| Ok(l.local_addr()?.port()))
            .collect();
    }
    // A random start, so that test processes running side by side rarely try the same ports.
    let span = u32::from(hi - lo) + 1;
    let start = rand::random_range(0..span);
    let mut held = Vec::with_capacity(n);
    for k in 0..span {
        if held.len() == n {
            break;
        }
        let port = u16::try_from(u32::from(lo) + (start + k) % span).unwrap_or(lo);
        if given.contains(&port) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    anyhow::ensure!(
        held.len() == n,
        "finding {n} free ports on 127.0.0.1 in {lo}..={hi}: only {} free",
        held.len()
    );
    let ports: Vec<u16> = held
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect::<Result<_>>()?;
    given.extend(&ports);
    Ok(ports)
}

/// The lowest port local clusters use: above the well-known and common service ports.
const PORTS_FROM: u16 = 20_000;

/// The first port of the kernel's ephemeral range (`ip_local_port_range`; 32768 when unreadable).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Async worker threads per node when all the nodes share this machine: its cores divided among
/// them (at least one). Each node would otherwise start one worker per core, and on a small machine
/// the extra threads only add cross-thread wakeups (on 2 cores and 3 nodes, one worker per node
/// produced ~4% more msg/s at a lower p99). `TOKIO_WORKER_THREADS`, when set, wins.
fn worker_threads(nodes: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / nodes.max(1)).max(1)
}

fn log_file(path: &Path) -> Result<(Stdio, Stdio)> {
    let f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let f2 = f.try_clone()?;
    Ok((Stdio::from(f), Stdio::from(f2)))
}

/// The last `n` lines of a log file (for error messages).
pub fn log_tail(path: &Path, n: usize) -> String {
    let Ok(f) = File::open(path) else {
        return String::new();
    };
    let lines: Vec<String> = BufReader::new(f).lines().map_while(|l| l.ok()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl LocalCluster {
    /// Starts the processes and waits until a leader is elected and known to the nameserver.
    pub async fn start(opts: LocalClusterOptions) -> Result<LocalCluster> {
        let mut cluster = LocalCluster::create(opts)?;
        cluster.launch()?;
        if let Err(e) = cluster.wait_ready(READY_TIMEOUT).await {
            // Keep the logs for whoever has to find out why.
            if let Some(d) = cluster.dir.take() {
                let _ = d.keep();
            }
            return Err(e.context(format!("logs kept in {}", cluster.root.display())));
        }
        Ok(cluster)
    }

    /// Chooses ports, directories and programs; starts nothing (see [`LocalCluster::launch`]).
    pub fn create(opts: LocalClusterOptions) -> Result<LocalCluster> {
        let launcher = match &opts.bin_dir {
            Some(d) => Launcher::in_dir(d)?,
            None => Launcher::find()?,
        };
        let (dir, root) = match &opts.dir {
            Some(root) => (None, root.clone()),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("raftmq-local-")
                    .tempdir()
                    .context("creating a temporary directory")?;
                let root = dir.path().to_path_buf();
                (Some(dir), root)
            }
        };
        let ports = free_ports(1 + opts.nodes as usize)?;
        let nameserver = format!("127.0.0.1:{}", ports[0]);
        let nodes = (1..=opts.nodes)
            .map(|id| (id, LocalNode::new(&root, id, ports[id as usize], false)))
            .collect();
        let mut opts = opts;
        let secured = if opts.secure {
            let s = Secured::create(
                &root,
                &opts.cluster,
                &opts.broker,
                (1..=opts.nodes).collect(),
            )?;
            opts.security = s.client_security()?;
            Some(s)
        } else {
            None
        };
        let mut cluster = LocalCluster {
            dir,
            root: root.clone(),
            launcher,
            cluster: opts.cluster.clone(),
            broker: opts.broker.clone(),
            nameserver,
            ns_log: root.join("nameserver.log"),
            ns: None,
            nodes: Nodes(nodes),
            opts,
            secured,
        };
        if cluster.opts.keep_dir
            && let Some(d) = cluster.dir.take()
        {
            let _ = d.keep();
        }
        Ok(cluster)
    }

    /// Starts the nameserver and every node; waits for nothing.
    pub fn launch(&mut self) -> Result<()> {
        tracing::info!(
            "local cluster in {} using {}",
            self.root.display(),
            self.launcher.describe()
        );
        self.spawn_nameserver()?;
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            self.spawn(id)?;
        }
        Ok(())
    }

    /// The directory holding data and logs.
    pub fn dir(&self) -> &Path {
        &self.root
    }

    pub fn node_address(&self, id: u64) -> Option<&str> {
        self.node(id).map(|n| n.addr.as_str())
    }

    /// The client addresses of every node, by node id.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.values().map(|n| n.addr.clone()).collect()
    }

    /// Every node's id and client address.
    pub fn node_addrs(&self) -> Vec<(u64, String)> {
        self.nodes
            .iter()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }

    fn node(&self, id: u64) -> Option<&LocalNode> {
        self.nodes.get(&id)
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut LocalNode> {
        self.nodes
            .0
            .get_mut(&id)
            .ok_or_else(|| anyhow!("no local node {id}"))
    }

    /// The data directory of node `id` (also of a node not created yet).
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.node(id).map_or_else(
            || LocalNode::data_dir_in(&self.root, id),
            |n| n.data_dir.clone(),
        )
    }

    /// Node `id`'s log (standard output and error).
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.node(id)
            .map_or_else(|| LocalNode::log_in(&self.root, id), |n| n.log.clone())
    }

    /// The process id of node `id`, while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.node(id)?.child.as_ref().map(Child::id)
    }

    /// Flags for node `id` alone, used from its next start on.
    pub fn set_node_args<S: AsRef<str>>(
        &mut self,
        id: u64,
        args: impl IntoIterator<Item = S>,
    ) -> Result<()> {
        self.node_mut(id)?.args = strings(args);
        Ok(())
    }

    /// Starts a new node `id` on a free port with no peers: it waits to be added to the group
    /// (`raftmq node add`). Returns its address.
    pub fn add_node(&mut self, id: u64) -> Result<String> {
        if self.nodes.contains_key(&id) {
            bail!("local node {id} exists");
        }
        let port = free_ports(1)?[0];
        let node = LocalNode::new(&self.root, id, port, true);
        let addr = node.addr.clone();
        self.nodes.0.insert(id, node);
        self.spawn(id)?;
        Ok(addr)
    }

    /// `id=address,…` of every node (the `--peers` flag).
    pub fn peers(&self) -> String {
        self.nodes
            .values()
            .map(|n| format!("{}={}", n.node_id, n.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn_nameserver(&mut self) -> Result<()> {
        let (out, err) = log_file(&self.ns_log)?;
        let mut cmd = self.launcher.command("nameserver");
        // `--listen` first: `raftmq run-nameserver` passes on everything from its first unknown
        // flag, and `--tls-*` are also the CLI's own (global) flags.
        cmd.args(["--listen", &self.nameserver]);
        if let Some(s) = &self.secured {
            cmd.args(s.nameserver_args()).envs(s.nameserver_env());
        }
        let child = cmd
            .args(&self.opts.nameserver_args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .context("starting the nameserver")?;
        self.ns = Some(child);
        Ok(())
    }

    /// Starts node `id` (again) on its data directory. It must not be running.
    pub fn spawn(&mut self, id: u64) -> Result<()> {
        let peers = self.peers();
        let mut cmd = self.launcher.command("broker-node");
        if self.opts.share_cores && std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
            cmd.env(
                "TOKIO_WORKER_THREADS",
                worker_threads(self.nodes.len()).to_string(),
            );
        }
        // The client's security variables of this shell (`RAFTMQ_TLS_CA` is also a broker
        // node's) are not the local cluster's: it runs as its flags and `env` say.
        for k in CLIENT_SECURITY_ENV {
            cmd.env_remove(k);
        }
        // `--cluster` first: `raftmq run-broker-node` passes on everything from its first
        // unknown flag, and `--tls-*` are also the CLI's own (global) flags.
        cmd.args(["--cluster", &self.cluster, "--broker", &self.broker])
            .args(["--nameservers", &self.nameserver]);
        if let Some(s) = &self.secured {
            cmd.args(s.node_args(&self.cluster, &self.broker, id)?)
                .envs(s.node_env());
        }
        cmd.envs(LOCAL_WATERMARKS)
            .args(&self.opts.broker_args)
            .envs(self.opts.env.iter().map(|(k, v)| (k, v)));
        let node = self.node_mut(id)?;
        if node.child.is_some() {
            bail!("local node {id} is running");
        }
        std::fs::create_dir_all(&node.data_dir)
            .with_context(|| format!("creating {}", node.data_dir.display()))?;
        let (out, err) = log_file(&node.log)?;
        if !node.joining {
            cmd.args(["--peers", &peers]);
        }
        let child = cmd
            .args(["--node-id", &id.to_string(), "--listen", &node.addr])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(&node.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting broker node {id}"))?;
        node.child = Some(child);
        node.stopped = false;
        Ok(())
    }

    /// SIGKILLs node `id` and reaps it (also when it is stopped; nothing when it is not running).
    pub fn kill(&mut self, id: u64) -> Result<()> {
        let node = self.node_mut(id)?;
        node.stopped = false;
        if let Some(mut c) = node.child.take() {
            // `Child::kill` sends SIGKILL on Unix, which also ends a stopped process.
            c.kill().with_context(|| format!("killing node {id}"))?;
            c.wait().with_context(|| format!("reaping node {id}"))?;
        }
        Ok(())
    }

    /// SIGKILLs every node (not the nameserver).
    pub fn kill_all(&mut self) -> Result<()> {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            self.kill(id)?;
        }
        Ok(())
    }

    fn signal(&mut self, id: u64, sig: &str) -> Result<()> {
        let pid = self
            .pid(id)
            .ok_or_else(|| anyhow!("local node {id} is not running"))?;
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .with_context(|| format!("kill {sig} node {id}"))?;
        if !status.success() {
            bail!("kill {sig} {pid} (node {id}) failed: {status}");
        }
        Ok(())
    }

    /// SIGSTOPs node `id`: it keeps its connections open but answers nothing (`resume`,
    /// `restart` or `kill` end that).
    pub fn stop(&mut self, id: u64) -> Result<()> {
        self.signal(id, "-STOP")?;
        self.node_mut(id)?.stopped = true;
        Ok(())
    }

    /// SIGCONTs node `id` after [`LocalCluster::stop`].
    pub fn resume(&mut self, id: u64) -> Result<()> {
        self.signal(id, "-CONT")?;
        self.node_mut(id)?.stopped = false;
        Ok(())
    }

    /// Starts node `id` again on its data directory.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.kill(id)?;
        self.spawn(id)
    }

    /// Whether node `id` has a process (stopped or not).
    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).is_some_and(|n| n.child.is_some())
    }

    /// Whether node `id` runs and is not stopped: it should answer.
    pub fn is_up(&self, id: u64) -> bool {
        self.node(id)
            .is_some_and(|n| n.child.is_some() && !n.stopped)
    }

    /// Fails with the log tail of any child that exited on its own.
    pub fn check_children(&mut self) -> Result<()> {
        if let Some(c) = self.ns.as_mut()
            && let Some(status) = c.try_wait()?
        {
            self.ns = None;
            bail!(
                "the nameserver exited ({status}): {}",
                log_tail(&self.ns_log, 1)
            );
        }
        for n in self.nodes.0.values_mut() {
            if let Some(c) = n.child.as_mut()
                && let Some(status) = c.try_wait()?
            {
                n.child = None;
                bail!(
                    "broker node {} exited ({status}): {}",
                    n.node_id,
                    log_tail(&n.log, 1)
                );
            }
        }
        Ok(())
    }

    /// The live status of every node (`None`: not answering), by node id.
    pub async fn statuses(&self, admin: &Admin) -> Vec<(u64, Option<NodeStatusResponse>)> {
        let calls = self.nodes.values().map(|n| async move {
            if n.child.is_none() {
                return (n.node_id, None);
            }
            (n.node_id, admin.node_status(&n.addr).await.ok())
        });
        futures::future::join_all(calls).await
    }

    /// The views of the running nodes for [`find_leader`] (`None`: running, not answering).
    pub async fn role_views(&self, admin: &Admin) -> Vec<(u64, Option<RoleView>)> {
        self.statuses(admin)
            .await
            .into_iter()
            .filter(|(id, _)| self.is_running(*id))
            .map(|(id, s)| (id, s.as_ref().map(RoleView::from)))
            .collect()
    }

    /// The leader with the highest term among the nodes that answer.
    pub async fn live_leader(&self, admin: &Admin) -> Option<Leader> {
        find_leader(&self.role_views(admin).await, LeaderRule::HighestTerm).ok()
    }

    /// How clients reach this cluster: [`LocalClusterOptions::security`], which for a secure
    /// cluster is TLS trusting its CA, signed as its bootstrap admin.
    pub fn security(&self) -> &ClientSecurity {
        &self.opts.security
    }

    /// Whether TLS and authentication are on ([`LocalClusterOptions::secure`]).
    pub fn is_secure(&self) -> bool {
        self.secured.is_some()
    }

    /// The development certificates of a secure cluster (`ca.pem`, `<broker>-<id>.pem/.key`,
    /// `nameserver.pem/.key`, `client.pem/.key`).
    pub fn certs_dir(&self) -> Option<&Path> {
        self.secured.as_ref().map(|s| s.certs.as_path())
    }

    /// The bootstrap admin of a secure cluster (access key and secret).
    pub fn admin_credentials(&self) -> Option<&Credentials> {
        self.secured.as_ref().map(|s| &s.admin)
    }

    /// An admin client of this cluster, reaching it as [`LocalCluster::security`] says.
    pub fn admin(&self) -> Result<Admin> {
        Ok(Admin::connect_with(
            &self.nameserver,
            self.opts.security.clone(),
        )?)
    }

    /// Waits until every running node answers, one leads, and the nameserver knows that leader.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(u64, String)> {
        let admin = self.admin()?;
        // The probe checks the children (which needs `&mut`) on every poll.
        let this = tokio::sync::Mutex::new(self);
        let waited = wait_for(
            "the local cluster to be ready",
            timeout,
            Duration::from_millis(50),
            || async {
                let mut this = this.lock().await;
                if let Err(e) = this.check_children() {
                    return Ok::<Result<(u64, String)>, String>(Err(e));
                }
                let this = &*this;
                let views = this.role_views(&admin).await;
                let leader = find_leader(&views, LeaderRule::HighestTermAllAnswer)
                    .map_err(|e| format!("{e} (of {} running nodes)", views.len()))?
                    .node_id;
                match admin.leader_of(&this.broker).await {
                    Ok(Some((id, addr))) if id == leader => {
                        let registered = admin
                            .broker_names()
                            .await
                            .is_ok_and(|b| b.contains(&this.broker));
                        if registered {
                            return Ok(Ok((id, addr)));
                        }
                        Err("the broker group is not registered yet".into())
                    }
                    Ok(_) => Err(format!(
                        "node {leader} leads; the nameserver does not know yet"
                    )),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
        match waited {
            Ok(ready) => ready,
            Err(e) => bail!("local cluster not ready: {e}"),
        }
    }

    /// Kills every child. Also done on drop.
    pub fn shutdown(&mut self) {
        for n in self.nodes.0.values_mut() {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if let Some(mut c) = self.ns.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_distinct() {
        let p = free_ports(4).expect("ports");
        let set: std::collections::HashSet<u16> = p.iter().copied().collect();
        assert_eq!(set.len(), 4);
        // Never handed out twice, and outside the range the kernel gives to `bind(0)` and to
        // outgoing connections.
        let q = free_ports(4).expect("ports");
        assert!(q.iter().all(|x| !set.contains(x)), "{p:?} then {q:?}");
        assert!(q.iter().all(|&x| x < ephemeral_low()), "{q:?}");
    }

    #[test]
    fn a_missing_binary_is_named() {
        let bins = tempfile::tempdir().expect("dir");
        let opts = LocalClusterOptions::new(2).bin_dir(bins.path());
        let e = LocalCluster::create(opts).err().expect("no binaries");
        assert!(e.to_string().contains("nameserver is missing"), "{e}");
    }

    /// `create` lays the cluster out (ports, directories, peers) and starts nothing.
    #[test]
    fn create_lays_out_the_nodes_without_starting_them() {
        let bins = tempfile::tempdir().expect("dir");
        for b in ["nameserver", "broker-node"] {
            std::fs::write(bins.path().join(b), "").expect("write");
        }
        let root = tempfile::tempdir().expect("dir");
        let opts = LocalClusterOptions::new(3)
            .bin_dir(bins.path())
            .dir(root.path())
            .broker_args(["--flag", "v"])
            .env("K", "V");
        assert_eq!(opts.broker_args, ["--flag", "v"]);
        assert_eq!(opts.env, [("K".to_owned(), "V".to_owned())]);
        let mut c = LocalCluster::create(opts).expect("create");
        assert_eq!(c.dir(), root.path());
        assert_eq!(c.nodes.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(c.data_dir(2), root.path().join("node-2"));
        assert_eq!(c.log_path(2), root.path().join("node-2.log"));
        assert_eq!(c.peers().split(',').count(), 3);
        assert!(c.peers().starts_with("1=127.0.0.1:"));
        assert!((1..=3).all(|id| !c.is_running(id) && !c.is_up(id) && c.pid(id).is_none()));
        assert!(c.set_node_args(9, ["--x"]).is_err());
        assert!(
            c.stop(1).is_err(),
            "a node that does not run cannot be stopped"
        );
        c.kill(1)
            .expect("killing a node that does not run is a no-op");
    }

    /// A secure cluster's layout: certificates in `<dir>/certs`, TLS and signing for its clients,
    /// every server's TLS and auth flags, the secret in the environment only, and a certificate
    /// issued for a node added later.
    #[test]
    fn secure_create_makes_certificates_and_the_admin() {
        let bins = tempfile::tempdir().expect("dir");
        for b in ["nameserver", "broker-node"] {
            std::fs::write(bins.path().join(b), "").expect("write");
        }
        let root = tempfile::tempdir().expect("dir");
        let opts = LocalClusterOptions::new(3)
            .bin_dir(bins.path())
            .dir(root.path())
            .secure(true);
        let c = LocalCluster::create(opts).expect("create");
        assert!(c.is_secure());
        let certs = root.path().join("certs");
        assert_eq!(c.certs_dir(), Some(certs.as_path()));
        for f in [
            "ca.pem",
            "broker-a-3.key",
            "nameserver.pem",
            "nameserver.key",
        ] {
            assert!(certs.join(f).is_file(), "{f}");
        }
        assert!(c.security().is_tls() && c.security().is_signed());
        let admin = c.admin_credentials().expect("admin");
        assert_eq!(admin.access_key, SECURE_ADMIN_KEY);
        assert_eq!(admin.secret.len(), 32);
        let s = c.secured.as_ref().expect("secured");
        let ns = s.nameserver_args();
        assert_eq!(ns[0], "--tls-ca");
        assert!(ns.contains(&"--auth".to_string()));
        assert!(ns[3].ends_with("nameserver.pem"), "{ns:?}");
        let node = s.node_args("DefaultCluster", "broker-a", 2).expect("args");
        assert!(node[3].ends_with("broker-a-2.pem") && node[5].ends_with("broker-a-2.key"));
        assert!(node.contains(&"--auth".to_string()));
        for args in [&ns, &node] {
            assert!(!args.iter().any(|a| a.contains(&admin.secret)), "{args:?}");
        }
        assert!(
            s.node_env()
                .iter()
                .any(|(k, v)| *k == "RAFTMQ_ADMIN_SECRET_KEY" && v == &admin.secret)
        );
        assert!(
            s.nameserver_env()
                .iter()
                .any(|(k, v)| *k == "RAFTMQ_NS_ADMIN_SECRET_KEY" && v == &admin.secret)
        );
        // A node beyond the first ones gets a certificate naming it, from the same CA.
        s.node_args("DefaultCluster", "broker-a", 4)
            .expect("args of node 4");
        let pem = std::fs::read(certs.join("broker-a-4.pem")).expect("node 4's certificate");
        use rustls_pki_types::pem::PemObject;
        let leaf = rustls_pki_types::CertificateDer::from_pem_slice(&pem).expect("PEM");
        let ids = raftmq_security::identity::node_identities(&leaf);
        assert_eq!(ids.len(), 1);
        assert_eq!(ids[0].uri(), "raftmq://DefaultCluster/broker-a/4");
        // A plain cluster has none of it.
        let plain_root = tempfile::tempdir().expect("dir");
        let plain = LocalCluster::create(
            LocalClusterOptions::new(1)
                .bin_dir(bins.path())
                .dir(plain_root.path()),
        )
        .expect("create");
        assert!(!plain.is_secure() && !plain.security().is_tls() && plain.certs_dir().is_none());
    }

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("x.log");
        std::fs::write(&p, "a\nb\nc\n").expect("write");
        assert_eq!(log_tail(&p, 2), "b\nc");
        assert_eq!(log_tail(&dir.path().join("missing"), 2), "");
    }
}
