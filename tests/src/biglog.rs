//! Large logs for catch-up tests: fill a group's log with gigabytes of ~128 KiB entries through
//! real sends, keep a producer load running, and check afterwards that every replica holds the
//! same queues and every acknowledged message, read back through pulls.
//!
//! Every message body is `big|<producer>|<seq>|<i>|` padded with dots to [`BODY_BYTES`], so a read
//! tells which send it came from; a batch of [`BATCH_MESSAGES`] is one log entry of ~128 KiB.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use raftmq_proto::v1::{ErrorCode, PullRequest, SendRequest, SendResponse};

use raftmq_proto::v1::broker_service_client::BrokerServiceClient;
use tonic::transport::Channel;

use crate::{Cluster, SendOutcome, SendTarget, code, connect, send_request, send_until};

/// An idempotent producer on one connection per node, following NOT_LEADER hints; a batch is
/// retried with the same (producer, sequence) until it is acknowledged or its deadline passes.
struct Sender {
    producer_id: u64,
    seq: u64,
    target: usize,
    addrs: Vec<String>,
    clients: HashMap<usize, BrokerServiceClient<Channel>>,
}

impl Sender {
    fn new(producer_id: u64, addrs: Vec<String>) -> Sender {
        Sender {
            producer_id,
            seq: 0,
            target: producer_id as usize % addrs.len(),
            addrs,
            clients: HashMap::new(),
        }
    }

    async fn send(
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

impl SendTarget for Sender {
    async fn attempt(&mut self, req: &SendRequest) -> Result<SendResponse, String> {
        let addr = self.addrs[self.target].clone();
        let client = self
            .clients
            .entry(self.target)
            .or_insert_with(|| connect_lazy(&addr));
        let why = match tokio::time::timeout(Duration::from_secs(5), client.send(req.clone())).await
        {
            Ok(Ok(r)) => return Ok(r.into_inner()),
            Ok(Err(s)) => s.to_string(),
            Err(_) => "timeout".into(),
        };
        self.clients.remove(&self.target);
        Err(why)
    }

    fn follow(&mut self, leader: String) -> bool {
        match self.addrs.iter().position(|a| *a == leader) {
            Some(i) => {
                self.target = i;
                true
            }
            None => false,
        }
    }

    fn next(&mut self, _failures: usize) {
        self.target = (self.target + 1) % self.addrs.len();
    }
}

fn connect_lazy(addr: &str) -> BrokerServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("address")
        .connect_timeout(Duration::from_millis(300))
        .tcp_nodelay(true)
        .connect_lazy();
    BrokerServiceClient::new(ch).max_decoding_message_size(64 << 20)
}

pub const BODY_BYTES: usize = 1024;
pub const BATCH_MESSAGES: usize = 128;
pub const QUEUES: u32 = 8;

/// A message's identity: (producer, sequence, index in the batch).
pub type MsgKey = (u64, u64, u32);

pub fn body(key: MsgKey, len: usize) -> Vec<u8> {
    let mut b = format!("big|{}|{}|{}|", key.0, key.1, key.2).into_bytes();
    b.resize(len.max(b.len()), b'.');
    b
}

pub fn parse(body: &[u8]) -> Option<MsgKey> {
    let s = std::str::from_utf8(body.get(..body.len().min(64))?).ok()?;
    let mut it = s.strip_prefix("big|")?.split('|');
    Some((
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    ))
}

/// What the producers had acknowledged: every message key, and where it was stored.
#[derive(Default)]
pub struct Acked {
    pub keys: HashMap<MsgKey, (u32, u64)>,
    pub bytes: u64,
    pub failed: u64,
    pub first_error: Option<String>,
}

impl Acked {
    fn record(&mut self, producer: u64, seq: u64, queue: u32, outcome: SendOutcome, n: usize) {
        match outcome {
            SendOutcome::Acked(r) => {
                let base = r.results.first().map_or(0, |x| x.offset);
                for i in 0..n as u32 {
                    self.keys
                        .insert((producer, seq, i), (queue, base + u64::from(i)));
                }
                self.bytes += (n * BODY_BYTES) as u64;
            }
            SendOutcome::Failed(e) => {
                self.failed += 1;
                self.first_error.get_or_insert(e);
            }
        }
    }

    pub fn merge(&mut self, other: Acked) {
        self.keys.extend(other.keys);
        self.bytes += other.bytes;
        self.failed += other.failed;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Producers sending batches of `batch` messages, one batch in flight each, in the background.
pub struct Load {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Acked>>,
    progress: tokio::task::JoinHandle<()>,
}

impl Load {
    /// Starts `producers` producers (ids from `first_producer`) sending to the nodes at `addrs`
    /// until `bytes` are acknowledged, [`Load::stop`] is called or `deadline` passes. Prints
    /// progress once a second with `label`.
    pub fn start(
        addrs: Vec<String>,
        label: &str,
        first_producer: u64,
        producers: u64,
        batch: usize,
        bytes: u64,
        deadline: Duration,
    ) -> Load {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let tasks = (0..producers)
            .map(|p| {
                let (addrs, done, stop) = (addrs.clone(), done.clone(), stop.clone());
                let id = first_producer + p;
                tokio::spawn(async move {
                    let mut tp = Sender::new(id, addrs);
                    let mut acked = Acked::default();
                    let mut n = 0u64;
                    while done.load(Ordering::Relaxed) < bytes
                        && started.elapsed() < deadline
                        && !stop.load(Ordering::Relaxed)
                    {
                        n += 1;
                        let queue = ((id + n) % u64::from(QUEUES)) as u32;
                        let seq = tp.seq + 1;
                        let bodies = (0..batch as u32)
                            .map(|i| body((id, seq, i), BODY_BYTES))
                            .collect();
                        let out = tp.send("big", queue, bodies, Duration::from_secs(30)).await;
                        if matches!(out, SendOutcome::Acked(_)) {
                            done.fetch_add((batch * BODY_BYTES) as u64, Ordering::Relaxed);
                        }
                        acked.record(id, seq, queue, out, batch);
                    }
                    acked
                })
            })
            .collect();
        let progress = {
            let (done, label) = (done.clone(), label.to_string());
            tokio::spawn(async move {
                let mut last = 0;
                loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let d = done.load(Ordering::Relaxed);
                    eprintln!(
                        "  {label}: {:>6.1} s  {:>6} MiB acknowledged  {:>5.0} MiB/s",
                        started.elapsed().as_secs_f64(),
                        d >> 20,
                        (d - last) as f64 / f64::from(1 << 20)
                    );
                    last = d;
                }
            })
        };
        Load {
            done,
            stop,
            tasks,
            progress,
        }
    }

    /// Bytes acknowledged so far.
    pub fn acked_bytes(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Bytes a second acknowledged over the next `d`.
    pub async fn rate_over(&self, d: Duration) -> f64 {
        let (b0, t0) = (self.acked_bytes(), Instant::now());
        tokio::time::sleep(d).await;
        (self.acked_bytes() - b0) as f64 / t0.elapsed().as_secs_f64()
    }

    /// Waits for every producer to finish (its byte count or deadline reached).
    pub async fn finish(self) -> Acked {
        let mut all = Acked::default();
        for t in self.tasks {
            all.merge(t.await.expect("producer task"));
        }
        self.progress.abort();
        all
    }

    /// Stops the producers after their batch in flight and returns what they had acknowledged.
    pub async fn stop(self) -> Acked {
        self.stop.store(true, Ordering::Relaxed);
        self.finish().await
    }
}

/// Checks, before a test writes `bytes` into `dir`, that its file system has room: the data plus
/// the share a local node keeps free (it refuses sends above its full watermark,
/// [`raftmq_cli::local_cluster::LOCAL_FULL_WATERMARK_PCT`]). Prints the figures; panics naming them when
/// there is no room, so a machine short of disk fails at once with the reason, not after minutes
/// of refused sends.
pub fn require_free_disk(dir: &std::path::Path, bytes: u64, what: &str) {
    const GIB: f64 = (1u64 << 30) as f64;
    let st = nix::sys::statvfs::statvfs(dir).expect("statvfs of the test's data dir");
    let frag = st.fragment_size();
    let avail = st.blocks_available() * frag;
    let used = (st.blocks() - st.blocks_free()) * frag;
    let full_pct: u64 = raftmq_cli::local_cluster::LOCAL_FULL_WATERMARK_PCT
        .parse()
        .expect("the local full watermark is a number");
    let visible = used + avail;
    // What stays free once the test wrote its bytes must keep the disk below the watermark.
    let reserve = visible * (100 - full_pct) / 100;
    println!(
        "  disk: {what} writes ~{:.1} GiB; {} has {:.1} GiB free of {:.1} GiB, {:.1} GiB kept free below the {full_pct} % watermark",
        bytes as f64 / GIB,
        dir.display(),
        avail as f64 / GIB,
        visible as f64 / GIB,
        reserve as f64 / GIB,
    );
    assert!(
        avail >= bytes + reserve,
        "{what} needs ~{:.1} GiB free on the file system of {} ({:.1} GiB of data plus {:.1} GiB kept \
         free below the nodes' {full_pct} % full watermark); it has {:.1} GiB: free some (build \
         outputs, docker images) and run again",
        (bytes + reserve) as f64 / GIB,
        dir.display(),
        bytes as f64 / GIB,
        reserve as f64 / GIB,
        avail as f64 / GIB,
    );
}

/// Fills the log of the group at `addrs` with `bytes` of ~128 KiB entries from 16 producers.
pub async fn fill(addrs: Vec<String>, first_producer: u64, bytes: u64) -> Acked {
    Load::start(
        addrs,
        "fill",
        first_producer,
        16,
        BATCH_MESSAGES,
        bytes,
        Duration::from_secs(600),
    )
    .finish()
    .await
}

/// One replica's queues as read through pulls: per queue, the message count and a digest of
/// (offset, body); and where each message of this run sits.
#[derive(Debug, PartialEq, Eq)]
pub struct Replica {
    pub queues: BTreeMap<u32, (u64, u64)>,
    pub duplicates: u64,
    pub foreign: u64,
}

/// Reads every queue of topic `big` from `addr` and checks it against `acked`: every acknowledged
/// message at the offset it was acknowledged with. Returns the replica's digest, or what is wrong.
pub async fn read_replica(addr: &str, acked: &Acked) -> Result<Replica, String> {
    let mut c = connect(addr).await;
    let mut queues = BTreeMap::new();
    let mut seen: HashSet<MsgKey> = HashSet::with_capacity(acked.keys.len());
    let (mut duplicates, mut foreign) = (0, 0);
    let mut misplaced = Vec::new();
    for q in 0..QUEUES {
        let mut offset = 0;
        let mut digest = crc32fast::Hasher::new();
        loop {
            let r = c
                .pull(PullRequest {
                    topic: "big".into(),
                    queue: q,
                    offset,
                    max_messages: 1000,
                    ..Default::default()
                })
                .await
                .map_err(|s| format!("pull q{q}@{offset} from {addr}: {s}"))?
                .into_inner();
            if code(&r.error) != ErrorCode::Ok {
                return Err(format!("pull q{q}@{offset} from {addr}: {:?}", r.error));
            }
            if r.messages.is_empty() {
                break;
            }
            for m in r.messages {
                if m.offset != offset {
                    return Err(format!("{addr} q{q}: offset {} after {offset}", m.offset));
                }
                offset += 1;
                digest.update(&m.offset.to_le_bytes());
                digest.update(&m.body);
                match parse(&m.body) {
                    Some(k) => {
                        if !seen.insert(k) {
                            duplicates += 1;
                        }
                        if let Some(at) = acked.keys.get(&k)
                            && *at != (q, m.offset)
                            && misplaced.len() < 5
                        {
                            misplaced
                                .push(format!("{k:?} acked at {at:?}, read at q{q}@{}", m.offset));
                        }
                    }
                    None => foreign += 1,
                }
            }
        }
        queues.insert(q, (offset, u64::from(digest.finalize())));
    }
    let lost: Vec<_> = acked
        .keys
        .keys()
        .filter(|k| !seen.contains(k))
        .take(5)
        .collect();
    if !lost.is_empty() || !misplaced.is_empty() {
        return Err(format!(
            "{addr}: acknowledged messages lost (first {lost:?}) or misplaced ({misplaced:?})"
        ));
    }
    Ok(Replica {
        queues,
        duplicates,
        foreign,
    })
}

/// Reads every node's queues of topic `big` ([`read_replica`]) and checks that each holds every
/// acknowledged message where it was acknowledged, no duplicate and nothing foreign, and that all
/// are identical (message counts and a digest of every offset and body). Returns one of them.
pub async fn replicas_identical(c: &Cluster, acked: &Acked) -> Replica {
    let mut replicas = Vec::new();
    for (id, n) in &c.nodes {
        let r = read_replica(&n.addr, acked)
            .await
            .unwrap_or_else(|e| panic!("node {id}: {e}"));
        assert_eq!((r.duplicates, r.foreign), (0, 0), "node {id}");
        replicas.push((*id, r));
    }
    for (id, r) in &replicas[1..] {
        assert_eq!(
            r, &replicas[0].1,
            "node {id} differs from node {}",
            replicas[0].0
        );
    }
    replicas.swap_remove(0).1
}

/// Every running node's highest term seen in its status.
pub async fn max_term(c: &Cluster) -> u64 {
    let mut t = 0;
    for id in c.nodes.keys() {
        if let Some(s) = c.status(*id).await {
            t = t.max(s.term);
        }
    }
    t
}

/// Waits until node `id` holds index `target`, printing its progress every second; returns the
/// time it took, or None after `timeout`. Also returns the highest term any node showed meanwhile.
pub async fn wait_caught_up(
    c: &Cluster,
    id: u64,
    target: u64,
    timeout: Duration,
) -> (Option<Duration>, u64) {
    let t0 = Instant::now();
    let mut next = t0;
    let mut term = 0;
    while t0.elapsed() < timeout {
        term = term.max(max_term(c).await);
        let st = c.status(id).await;
        let at = st.as_ref().map_or(0, |s| s.last_log_index);
        if at >= target {
            return (Some(t0.elapsed()), term);
        }
        if Instant::now() >= next {
            let shown =
                st.as_ref()
                    .and_then(|s| s.catch_up.as_ref())
                    .map_or_else(String::new, |cu| {
                        format!(
                            " (catching up {:.0} %, {:.0} MB/s)",
                            cu.progress_pct,
                            cu.bytes_per_sec as f64 / 1e6
                        )
                    });
            eprintln!(
                "  {:>6.1} s  node {id} at {at} of {target}{shown}  term {term}",
                t0.elapsed().as_secs_f64()
            );
            next += Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (None, term)
}

/// Bytes of the files under `dir` (the CLI's `catchup` measures with the same function).
pub use raftmq_cli::commands::catchup::dir_bytes;
