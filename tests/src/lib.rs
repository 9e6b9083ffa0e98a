//! Shared helpers of the integration tests: a local cluster of REAL processes (`nameserver` and
//! `broker-node` binaries from this workspace's target dir) on 127.0.0.1, killed with real signals.
//! The cluster is the CLI's [`LocalCluster`] (one process harness for the CLI and the tests), and
//! the polling and the leader search are the CLI's [`raftmq_cli::probe`].
//!
//! The binaries must be built first (`cargo build --bins`; the README's test command does it).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use raftmq_cli::local_cluster::{LocalCluster, LocalClusterOptions};
use raftmq_cli::probe::{self, Leader, LeaderRule, Progress, RoleView, WaitTimeout, find_leader};
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::*;
use tonic::transport::Channel;

pub mod biglog;
pub mod history;
pub mod proxy;
pub mod rocketmq5;
pub mod secure;

/// The directory holding this workspace's binaries (target/debug or target/release).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    if dir.file_name().is_some_and(|n| n == "deps") {
        // A test binary: target/<profile>/deps/<test-binary>.
        dir.parent().expect("target dir").to_path_buf()
    } else {
        // A binary of this package (the soak): target/<profile>/<binary>.
        dir.to_path_buf()
    }
}

pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build the binaries first with `cargo build --bins`",
        p.display()
    );
    p
}

/// A free port of 127.0.0.1 for a process the test starts itself: outside the kernel's ephemeral
/// range, so nothing takes it while that process is down ([`raftmq_cli::local_cluster::free_ports`]).
pub fn free_port() -> u16 {
    raftmq_cli::local_cluster::free_ports(1).unwrap()[0]
}

/// How often the tests poll a condition.
pub const POLL: Duration = Duration::from_millis(25);

/// The shared [`raftmq_cli::probe::wait_for`] polling every [`POLL`], panicking on timeout with
/// what it waited for. `f` returns `Some`/`Ok` when the condition holds (`Err` says why not yet).
pub async fn wait_for<T, P, F, Fut>(what: &str, timeout: Duration, f: F) -> T
where
    P: Progress<T>,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = P>,
{
    probe::wait_for(what, timeout, POLL, f)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A nameserver and one broker group of real processes: the CLI's [`LocalCluster`] (which it
/// dereferences to: `nodes`, `kill`, `spawn`, `data_dir`, `nameserver`, …) started from this
/// workspace's binaries, in a directory the test owns, plus the fault proxy when asked for.
/// Every process is SIGKILLed on drop; methods panic where the test cannot go on.
pub struct Cluster {
    /// The processes; declared first, so they die before their directory goes.
    pub local: LocalCluster,
    /// Data dirs (`node-N`) and logs (`node-N.log`, `nameserver.log`).
    pub dir: tempfile::TempDir,
    /// The fault proxy every node's Raft traffic goes through, when started with one.
    pub proxy: Option<proxy::FaultProxy>,
    /// TLS and the admin's credentials, for a cluster started with them on
    /// ([`Cluster::start_secure`]): the harness's own calls (status, leader search) use them.
    pub secure: Option<secure::Secure>,
}

impl std::ops::Deref for Cluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.local
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.local
    }
}

impl Cluster {
    /// Starts a nameserver and `n` nodes of `broker-a`, and waits for a leader.
    pub async fn start(n: u64, extra: &[&str]) -> Cluster {
        Cluster::start_with_env(n, extra, &[]).await
    }

    /// As `start`, with extra environment variables for every broker-node process.
    pub async fn start_with_env(n: u64, extra: &[&str], env: &[(&str, &str)]) -> Cluster {
        Cluster::start_opts(n, extra, env, false).await
    }

    /// The options of every test cluster: this workspace's binaries, a nameserver that expires
    /// a silent broker after 3 s, `RUST_LOG=info,openraft=warn` (which `env` may override).
    pub fn options(n: u64, extra: &[&str], env: &[(&str, &str)]) -> LocalClusterOptions {
        let opts = LocalClusterOptions::new(n)
            .bin_dir(bin_dir())
            .nameserver_args(["--expiry-secs", "3", "--scan-interval-ms", "500"])
            .broker_args(extra)
            .env("RUST_LOG", "info,openraft=warn")
            .share_cores(false);
        env.iter().fold(opts, |o, (k, v)| o.env(k, v))
    }

    /// As `start_with_env`; with `proxied`, every Raft link between nodes goes through a
    /// [`proxy::FaultProxy`] (`Cluster::proxy`) that can cut it.
    pub async fn start_opts(
        n: u64,
        extra: &[&str],
        env: &[(&str, &str)],
        proxied: bool,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let opts = Cluster::options(n, extra, env).dir(dir.path());
        let mut local = LocalCluster::create(opts).unwrap_or_else(|e| panic!("{e:#}"));
        let mut proxy = None;
        if proxied {
            let addrs = local
                .nodes
                .values()
                .map(|n| (n.node_id, n.addr.clone()))
                .collect();
            let p = proxy::FaultProxy::start(&addrs).await;
            for id in 1..=n {
                local
                    .set_node_args(id, ["--peer-routes", p.routes_of(id).as_str()])
                    .unwrap();
            }
            proxy = Some(p);
        }
        local.launch().unwrap_or_else(|e| panic!("{e:#}"));
        let c = Cluster {
            local,
            dir,
            proxy,
            secure: None,
        };
        c.leader().await;
        c
    }

    /// Starts (or restarts) node `id` from its data dir.
    pub fn spawn(&mut self, id: u64) {
        self.local
            .spawn(id)
            .unwrap_or_else(|e| panic!("start node {id}: {e:#}"));
    }

    /// SIGKILL: no shutdown, sockets and unsynced state gone with the process.
    pub fn kill(&mut self, id: u64) {
        self.local
            .kill(id)
            .unwrap_or_else(|e| panic!("kill node {id}: {e:#}"));
    }

    /// SIGKILLs every node.
    pub fn kill_all(&mut self) {
        self.local
            .kill_all()
            .unwrap_or_else(|e| panic!("kill the nodes: {e:#}"));
    }

    /// SIGSTOP (a node that does not run is left alone).
    pub fn pause(&mut self, id: u64) {
        if self.local.is_running(id) {
            self.local
                .stop(id)
                .unwrap_or_else(|e| panic!("pause node {id}: {e:#}"));
        }
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&mut self, id: u64) {
        if self.local.is_running(id) {
            self.local
                .resume(id)
                .unwrap_or_else(|e| panic!("resume node {id}: {e:#}"));
        }
    }

    pub async fn client(&self, id: u64) -> BrokerServiceClient<Channel> {
        connect(&self.nodes[&id].addr).await
    }

    pub async fn status(&self, id: u64) -> Option<NodeStatusResponse> {
        if !self.is_up(id) {
            return None;
        }
        let addr = &self.nodes[&id].addr;
        if let Some(s) = &self.secure {
            return s
                .client(addr, Some(&s.admin))
                .node_status(NodeStatusRequest {})
                .await
                .ok()
                .map(|r| r.into_inner());
        }
        node_status(addr).await
    }

    /// What every running, unpaused node says of its role (`None`: it did not answer).
    pub async fn role_views(&self) -> Vec<(u64, Option<RoleView>)> {
        let mut views = Vec::new();
        for id in self.nodes.keys().copied() {
            if self.is_up(id) {
                views.push((id, self.status(id).await.as_ref().map(RoleView::from)));
            }
        }
        views
    }

    /// Waits at most `timeout` until exactly one running node claims to lead and every running
    /// node answers and agrees on it.
    pub async fn agreed_leader(&self, timeout: Duration) -> Result<Leader, WaitTimeout> {
        probe::wait_for(
            "one leader agreed by every running node",
            timeout,
            POLL,
            || async { find_leader(&self.role_views().await, LeaderRule::Agreed) },
        )
        .await
    }

    /// The leader every running node agrees on once it is not `old` (killed or stepped down),
    /// within 10 s, or panics.
    pub async fn new_leader_after(&self, old: u64) -> u64 {
        wait_for("a new leader", Duration::from_secs(10), || async {
            self.agreed_leader(Duration::from_secs(1))
                .await
                .ok()
                .map(|l| l.node_id)
                .filter(|l| *l != old)
        })
        .await
    }

    /// [`Cluster::agreed_leader`] within 20 s, or panics.
    pub async fn leader(&self) -> u64 {
        self.agreed_leader(Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .node_id
    }

    /// Waits until every running node knows that every member applies all its commands (its
    /// status' group feature level equals its own): a fresh group learns it within a second.
    pub async fn wait_feature_levels(&self, timeout: Duration) -> Result<(), WaitTimeout> {
        probe::wait_for(
            "every node knows every member's build",
            timeout,
            POLL,
            || async {
                for id in self.nodes.keys().copied().filter(|id| self.is_up(*id)) {
                    let st = self
                        .status(id)
                        .await
                        .ok_or(format!("node {id}: no status"))?;
                    if st.group_command_tags != st.command_tags {
                        return Err(format!(
                            "node {id}: group level {} of {}",
                            st.group_command_tags, st.command_tags
                        ));
                    }
                }
                Ok(())
            },
        )
        .await
    }

    /// Creates a topic on the agreed leader; panics with the broker's error if it refuses.
    pub async fn create_topic(&self, name: &str, queues: u32) {
        let leader = self.leader().await;
        let r = self
            .client(leader)
            .await
            .create_topic(CreateTopicRequest {
                name: name.into(),
                queues,
                update: false,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    }

    pub fn node_log(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }
}

/// The node status of the node at `addr` over plaintext (None: it did not answer within half a
/// second).
pub async fn node_status(addr: &str) -> Option<NodeStatusResponse> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .ok()?;
    BrokerServiceClient::new(ch)
        .node_status(NodeStatusRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

pub async fn connect(addr: &str) -> BrokerServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    BrokerServiceClient::new(ch).max_decoding_message_size(64 << 20)
}

/// The body of `GET /metrics` from a node, over plain HTTP/1.1 (empty when it cannot be read).
pub async fn metrics(addr: &str) -> String {
    raftmq_cli::commands::bench_hops::metrics_text(addr)
        .await
        .unwrap_or_default()
}

/// The value of the first line of a `/metrics` page that starts with `line_start` (a metric's
/// name, with its labels when it has any).
pub fn metric(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The python of the test venv (made once by `scripts/python-env`), for the whole test binary.
pub fn python() -> &'static Path {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new(root.join("scripts/python-env"))
            .current_dir(&root)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run scripts/python-env");
        assert!(
            out.status.success(),
            "scripts/python-env failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).expect("python-env prints a path");
        let path = PathBuf::from(stdout.lines().last().expect("a path").trim());
        assert!(path.exists(), "python-env printed {}", path.display());
        path
    })
}

pub fn code(e: &Option<Error>) -> ErrorCode {
    e.as_ref().map(|e| e.code()).unwrap_or(ErrorCode::Ok)
}

/// A producer that follows NOT_LEADER hints and retries a batch with the same (producer, sequence)
/// until it is acknowledged or `deadline` passes.
pub struct TestProducer {
    pub producer_id: u64,
    pub seq: u64,
    pub target: String,
    pub addrs: Vec<String>,
}

pub enum SendOutcome {
    Acked(SendResponse),
    Failed(String),
}

/// What one send reply tells a retrying producer.
pub enum SendReply {
    /// Acknowledged, or refused for good: the send is over.
    Done(SendOutcome),
    /// Worth another attempt: at `leader` when the reply names one, else `why` is the last error.
    Retry { leader: Option<String>, why: String },
}

/// Judges one send reply: OK and the errors no retry helps end the send; NOT_LEADER (with the
/// leader's address when the hint has one), UNAVAILABLE and BUSY ask for another attempt.
pub fn send_reply(r: SendResponse) -> SendReply {
    match code(&r.error) {
        ErrorCode::Ok => SendReply::Done(SendOutcome::Acked(r)),
        ErrorCode::NotLeader => SendReply::Retry {
            leader: r
                .error
                .as_ref()
                .and_then(|e| e.leader.as_ref())
                .map(|l| l.address.clone())
                .filter(|a| !a.is_empty()),
            why: format!("{:?}", r.error),
        },
        ErrorCode::Unavailable | ErrorCode::Busy => SendReply::Retry {
            leader: None,
            why: format!("{:?}", r.error),
        },
        _ => SendReply::Done(SendOutcome::Failed(format!("{:?}", r.error))),
    }
}

/// The send of one batch of `bodies` as producer `producer_id`'s sequence `seq`.
pub fn send_request(
    producer_id: u64,
    seq: u64,
    topic: &str,
    queue: u32,
    bodies: Vec<Vec<u8>>,
) -> SendRequest {
    SendRequest {
        topic: topic.into(),
        queue,
        messages: bodies
            .into_iter()
            .map(|body| Message {
                body: body.into(),
                ..Default::default()
            })
            .collect(),
        producer_id,
        sequence: seq,
        dedup_property: String::new(),
    }
}

impl TestProducer {
    pub fn new(producer_id: u64, addrs: Vec<String>) -> TestProducer {
        TestProducer {
            producer_id,
            seq: 0,
            target: addrs[0].clone(),
            addrs,
        }
    }

    pub async fn send(
        &mut self,
        topic: &str,
        queue: u32,
        bodies: Vec<Vec<u8>>,
        deadline: Duration,
    ) -> SendOutcome {
        self.seq += 1;
        let req = send_request(self.producer_id, self.seq, topic, queue, bodies);
        send_until(self, &req, deadline).await
    }
}

impl SendTarget for TestProducer {
    async fn attempt(&mut self, req: &SendRequest) -> Result<SendResponse, String> {
        let mut c = connect(&self.target).await;
        match tokio::time::timeout(Duration::from_secs(2), c.send(req.clone())).await {
            Ok(r) => r.map(|r| r.into_inner()).map_err(|s| s.to_string()),
            Err(_) => Err("timeout".into()),
        }
    }

    fn follow(&mut self, leader: String) -> bool {
        self.target = leader;
        true
    }

    fn next(&mut self, failures: usize) {
        self.target = self.addrs[failures % self.addrs.len()].clone();
    }
}

/// Where a retrying producer sends one batch.
pub(crate) trait SendTarget {
    /// One attempt at the current node: its reply, or why there is none.
    async fn attempt(&mut self, req: &SendRequest) -> Result<SendResponse, String>;
    /// Moves to the hinted leader; false when it is no node this producer knows.
    fn follow(&mut self, leader: String) -> bool;
    /// Moves on after the `failures`-th failed attempt of this send (unknown leader or
    /// unreachable node).
    fn next(&mut self, failures: usize);
}

/// Sends `req` through `target` until it is acknowledged, refused for good, or `deadline` passes:
/// a NOT_LEADER hint is followed at once, any other retry waits 20 ms at the next node.
pub(crate) async fn send_until(
    target: &mut impl SendTarget,
    req: &SendRequest,
    deadline: Duration,
) -> SendOutcome {
    let t = Instant::now();
    let mut failures = 0usize;
    let mut last = String::new();
    while t.elapsed() < deadline {
        match target.attempt(req).await {
            Ok(r) => match send_reply(r) {
                SendReply::Done(outcome) => return outcome,
                SendReply::Retry { leader, why } => {
                    if leader.is_some_and(|l| target.follow(l)) {
                        continue;
                    }
                    last = why;
                }
            },
            Err(why) => last = why,
        }
        failures += 1;
        target.next(failures);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    SendOutcome::Failed(format!("deadline passed: {last}"))
}

/// Reads a whole queue from one node, every message as stored, in offset order.
pub async fn read_stored(
    addr: &str,
    topic: &str,
    queue: u32,
) -> Result<Vec<StoredMessage>, String> {
    let mut c = connect(addr).await;
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let r = c
            .pull(PullRequest {
                topic: topic.into(),
                queue,
                offset,
                max_messages: 500,
                ..Default::default()
            })
            .await
            .map_err(|s| s.to_string())?
            .into_inner();
        if code(&r.error) != ErrorCode::Ok {
            return Err(format!("{:?}", r.error));
        }
        if r.messages.is_empty() {
            return Ok(out);
        }
        for m in r.messages {
            if m.offset != offset {
                return Err(format!("offset {} where {offset} was due", m.offset));
            }
            offset += 1;
            out.push(m);
        }
    }
}

/// Reads a whole queue from one node: (offset, body) in order.
pub async fn read_queue(
    addr: &str,
    topic: &str,
    queue: u32,
) -> Result<Vec<(u64, Vec<u8>)>, String> {
    Ok(read_stored(addr, topic, queue)
        .await?
        .into_iter()
        .map(|m| (m.offset, m.body.to_vec()))
        .collect())
}

/// `raftmq ARGS --json` against the nameserver `ns`: whether it succeeded, its JSON lines, and
/// its standard error.
pub fn raftmq_json(ns: &str, args: &[&str]) -> (bool, Vec<serde_json::Value>, String) {
    let out = std::process::Command::new(bin("raftmq"))
        .args(args)
        .arg("--json")
        .env("RAFTMQ_NAMESERVER", ns)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run raftmq");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (
        out.status.success(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
