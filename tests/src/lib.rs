//! Shared helpers of the integration tests: a local cluster of REAL processes (`nameserver` and
//! `broker-node` binaries from this workspace's target dir) on 127.0.0.1, killed with real signals.
//!
//! The binaries must be built first (`cargo build --bins`; the README's test command does it).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use raftmq_proto::v1::*;
use tonic::transport::Channel;

pub mod biglog;
pub mod history;
pub mod proxy;

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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits for `f` to return Some, polling; panics naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let t = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            t.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub struct NodeProc {
    pub id: u64,
    pub addr: String,
    pub child: Option<Child>,
    pub stopped: bool,
}

/// A nameserver and one broker group of real processes. Every process is SIGKILLed on drop.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub ns_addr: String,
    pub ns: Option<Child>,
    pub nodes: BTreeMap<u64, NodeProc>,
    pub extra: Vec<String>,
    /// Environment variables given to every broker-node (e.g. `RAFTMQ_TRACK_DURABLE=1`).
    pub env: Vec<(String, String)>,
    pub broker: String,
    /// The fault proxy every node's Raft traffic goes through, when started with one.
    pub proxy: Option<proxy::FaultProxy>,
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

    /// As `start_with_env`; with `proxied`, every Raft link between nodes goes through a
    /// [`proxy::FaultProxy`] (`Cluster::proxy`) that can cut it.
    pub async fn start_opts(
        n: u64,
        extra: &[&str],
        env: &[(&str, &str)],
        proxied: bool,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ns_addr = format!("127.0.0.1:{}", free_port());
        let ns = Command::new(bin("nameserver"))
            .args([
                "--listen",
                &ns_addr,
                "--expiry-secs",
                "3",
                "--scan-interval-ms",
                "500",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nameserver");
        let mut nodes = BTreeMap::new();
        for id in 1..=n {
            nodes.insert(
                id,
                NodeProc {
                    id,
                    addr: format!("127.0.0.1:{}", free_port()),
                    child: None,
                    stopped: false,
                },
            );
        }
        let mut c = Cluster {
            dir,
            ns_addr,
            ns: Some(ns),
            nodes,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            broker: "broker-a".into(),
            proxy: None,
        };
        if proxied {
            let addrs = c.nodes.values().map(|n| (n.id, n.addr.clone())).collect();
            c.proxy = Some(proxy::FaultProxy::start(&addrs).await);
        }
        for id in 1..=n {
            c.spawn(id);
        }
        c.leader().await;
        c
    }

    pub fn peers(&self) -> String {
        self.nodes
            .values()
            .map(|n| format!("{}={}", n.id, n.addr))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node{id}"))
    }

    /// Starts (or restarts) node `id` from its data dir.
    pub fn spawn(&mut self, id: u64) {
        let peers = self.peers();
        let routes = self.proxy.as_ref().map(|p| p.routes_of(id));
        let data = self.data_dir(id);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("node{id}.log")))
            .unwrap();
        let n = self.nodes.get_mut(&id).unwrap();
        let child = Command::new(bin("broker-node"))
            .args([
                "--broker",
                "broker-a",
                "--node-id",
                &id.to_string(),
                "--listen",
                &n.addr,
                "--peers",
                &peers,
            ])
            .args([
                "--nameservers",
                &self.ns_addr,
                "--data-dir",
                data.to_str().unwrap(),
            ])
            .args(&self.extra)
            .args(routes.iter().flat_map(|r| ["--peer-routes", r.as_str()]))
            .env("RUST_LOG", "info,openraft=warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start broker-node");
        n.child = Some(child);
        n.stopped = false;
    }

    pub fn signal(&self, id: u64, sig: Signal) {
        if let Some(c) = &self.nodes[&id].child {
            let _ = kill(Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// SIGKILL: no shutdown, sockets and unsynced state gone with the process.
    pub fn kill(&mut self, id: u64) {
        self.signal(id, Signal::SIGCONT);
        self.signal(id, Signal::SIGKILL);
        if let Some(mut c) = self.nodes.get_mut(&id).unwrap().child.take() {
            let _ = c.wait();
        }
    }

    pub fn pause(&mut self, id: u64) {
        self.signal(id, Signal::SIGSTOP);
        self.nodes.get_mut(&id).unwrap().stopped = true;
    }

    pub fn resume(&mut self, id: u64) {
        self.signal(id, Signal::SIGCONT);
        self.nodes.get_mut(&id).unwrap().stopped = false;
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[&id].child.is_some() && !self.nodes[&id].stopped
    }

    pub async fn client(&self, id: u64) -> BrokerServiceClient<Channel> {
        connect(&self.nodes[&id].addr).await
    }

    pub async fn status(&self, id: u64) -> Option<NodeStatusResponse> {
        if !self.is_up(id) {
            return None;
        }
        let ch =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.nodes[&id].addr))
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

    /// Waits until exactly one running node claims to lead and every running node agrees on it.
    pub async fn leader(&self) -> u64 {
        wait_for(
            "one leader agreed by every running node",
            Duration::from_secs(20),
            || async {
                let mut leaders = Vec::new();
                let mut seen = Vec::new();
                for id in self.nodes.keys() {
                    if !self.is_up(*id) {
                        continue;
                    }
                    let st = self.status(*id).await?;
                    if st.role == "leader" {
                        leaders.push(*id);
                    }
                    seen.push(st.leader.map(|l| l.node_id));
                }
                (leaders.len() == 1 && seen.iter().all(|l| *l == Some(leaders[0])))
                    .then(|| leaders[0])
            },
        )
        .await
    }

    /// The client addresses of every node.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.values().map(|n| n.addr.clone()).collect()
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
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(code(&r.error), ErrorCode::Ok, "{:?}", r.error);
    }

    pub fn node_log(&self, id: u64) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node{id}.log"))).unwrap_or_default()
    }
}

impl Cluster {
    /// SIGKILLs every node.
    pub fn kill_all(&mut self) {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            self.kill(id);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.kill_all();
        if let Some(mut ns) = self.ns.take() {
            let _ = ns.kill();
            let _ = ns.wait();
        }
    }
}

pub async fn connect(addr: &str) -> BrokerServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    BrokerServiceClient::new(ch).max_decoding_message_size(64 << 20)
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
        let t = Instant::now();
        let mut rr = 0usize;
        let mut last = String::new();
        while t.elapsed() < deadline {
            let mut c = connect(&self.target).await;
            match tokio::time::timeout(Duration::from_secs(2), c.send(req.clone())).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    match code(&r.error) {
                        ErrorCode::Ok => return SendOutcome::Acked(r),
                        ErrorCode::NotLeader => {
                            if let Some(l) = r.error.as_ref().and_then(|e| e.leader.clone())
                                && !l.address.is_empty()
                            {
                                self.target = l.address;
                                continue;
                            }
                            last = format!("{:?}", r.error);
                        }
                        ErrorCode::Unavailable | ErrorCode::Busy => last = format!("{:?}", r.error),
                        _ => return SendOutcome::Failed(format!("{:?}", r.error)),
                    }
                }
                Ok(Err(s)) => last = s.to_string(),
                Err(_) => last = "timeout".into(),
            }
            // Unknown leader or unreachable node: try the next node.
            rr += 1;
            self.target = self.addrs[rr % self.addrs.len()].clone();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        SendOutcome::Failed(format!("deadline passed: {last}"))
    }
}

/// Reads a whole queue from one node: (offset, body) in order.
pub async fn read_queue(
    addr: &str,
    topic: &str,
    queue: u32,
) -> Result<Vec<(u64, Vec<u8>)>, String> {
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
            assert_eq!(m.offset, offset, "offsets are dense");
            offset += 1;
            out.push((m.offset, m.body.to_vec()));
        }
    }
}
