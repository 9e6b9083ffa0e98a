//! The running node: the Raft member, its configuration, load counters and the in-memory
//! consumer-group membership (kept on the leader, refreshed by heartbeats).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard};
use std::time::{Duration, Instant};

use raftmq_raft_log::Member;
use tokio::sync::Semaphore;

use crate::config::Config;
use crate::state::BrokerState;

/// How long a consumer stays a member of its group without a heartbeat.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);

/// A messages-per-second rate sampled once a second.
#[derive(Default)]
pub struct Rate {
    total: AtomicU64,
    per_sec_milli: AtomicU64,
}

impl Rate {
    pub fn add(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
    }
    pub fn per_sec(&self) -> f64 {
        self.per_sec_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
    fn sample(&self, last: &mut u64, dt: Duration) {
        let t = self.total();
        let r = (t - *last) as f64 / dt.as_secs_f64().max(1e-3);
        *last = t;
        self.per_sec_milli
            .store((r * 1000.0) as u64, Ordering::Relaxed);
    }
}

pub struct Node {
    pub cfg: Config,
    pub address: String,
    pub member: Member<BrokerState>,
    pub inflight: Arc<Semaphore>,
    pub produced: Rate,
    pub pulled: Rate,
    pub groups: Mutex<HashMap<String, BTreeMap<String, Instant>>>,
    /// Set by the retention task when the data disk is above the full watermark.
    pub disk_full: AtomicBool,
    /// Wakes the dead-letter mover (a receive found messages out of attempts).
    pub dead_letters: tokio::sync::Notify,
    /// Acks waiting to be folded into one `Ack` entry, per (group, topic).
    pub ack_lanes: Mutex<HashMap<(String, String), AckLane>>,
    /// Which commands every member of the group applies (a rolling upgrade).
    pub features: crate::features::Features,
    /// When this process made the node (its uptime).
    pub started: Instant,
    /// TLS material (None: plaintext): what the node serves and presents when it dials other
    /// nodes and the nameservers.
    pub tls: Option<Arc<raftmq_security::tls::Tls>>,
}

/// Handles of one ack request and where its per-handle results go.
pub type AckWaiter = (
    Vec<(u32, u64, u64)>,
    tokio::sync::oneshot::Sender<crate::error::Result<Vec<bool>>>,
);

/// The acks of one (group, topic) waiting for the entry in flight to commit.
#[derive(Default)]
pub struct AckLane {
    pub waiting: Vec<AckWaiter>,
    pub in_flight: bool,
}

impl Node {
    pub fn new(
        cfg: Config,
        address: String,
        member: Member<BrokerState>,
        tls: Option<Arc<raftmq_security::tls::Tls>>,
    ) -> Arc<Node> {
        let inflight = Arc::new(Semaphore::new(cfg.limits.inflight_sends_max));
        let features = crate::features::Features::load(&cfg.data_dir);
        let node = Arc::new(Node {
            cfg,
            address,
            member,
            inflight,
            produced: Rate::default(),
            pulled: Rate::default(),
            groups: Mutex::new(HashMap::new()),
            disk_full: AtomicBool::new(false),
            dead_letters: tokio::sync::Notify::new(),
            ack_lanes: Mutex::new(HashMap::new()),
            features,
            started: Instant::now(),
            tls,
        });
        let weak = Arc::downgrade(&node);
        tokio::spawn(async move {
            let (mut lp, mut lc) = (0, 0);
            let mut last = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(n) = weak.upgrade() else { break };
                let dt = last.elapsed();
                last = Instant::now();
                n.produced.sample(&mut lp, dt);
                n.pulled.sample(&mut lc, dt);
            }
        });
        node
    }

    /// An endpoint toward another node or a nameserver at `address`: TLS with this node's
    /// certificate when TLS is on.
    pub fn endpoint(&self, address: &str) -> Option<tonic::transport::Endpoint> {
        let uri = raftmq_security::tls::uri(address, self.tls.is_some());
        let ep = tonic::transport::Endpoint::from_shared(uri).ok()?;
        match &self.tls {
            Some(tls) => ep.tls_config(tls.client_config()).ok(),
            None => Some(ep),
        }
    }

    /// The interceptor that signs this node's own calls (with auth on, as the bootstrap admin).
    pub fn signer(&self) -> raftmq_security::sign::Signer {
        raftmq_security::sign::Signer(self.cfg.admin_credentials())
    }

    /// The applied state, read under its lock (a lock poisoned by a panicking writer still reads).
    pub fn state(&self) -> RwLockReadGuard<'_, BrokerState> {
        self.member
            .state()
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// One value of the applied state, or the type's default when the lock is poisoned.
    pub fn state_value<T: Default>(&self, f: impl FnOnce(&BrokerState) -> T) -> T {
        self.member
            .state()
            .read()
            .map(|s| f(&s))
            .unwrap_or_default()
    }

    /// Records a heartbeat and returns the live members of the group, sorted.
    pub fn heartbeat(&self, group: &str, consumer: &str, now: Instant) -> Vec<String> {
        let mut g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let members = g.entry(group.to_string()).or_default();
        members.insert(consumer.to_string(), now);
        members.retain(|_, seen| now.duration_since(*seen) < SESSION_TIMEOUT);
        members.keys().cloned().collect()
    }

    /// The members of `group` heard from within [`SESSION_TIMEOUT`], sorted.
    pub fn members(&self, group: &str, now: Instant) -> Vec<String> {
        let g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        g.get(group).map_or_else(Vec::new, |m| {
            m.iter()
                .filter(|(_, seen)| now.duration_since(**seen) < SESSION_TIMEOUT)
                .map(|(c, _)| c.clone())
                .collect()
        })
    }

    pub fn leave(&self, group: &str, consumer: &str) {
        let mut g = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = g.get_mut(group) {
            m.remove(consumer);
        }
    }

    pub fn election_timeout_ms(&self) -> u64 {
        self.cfg.raft.election_timeout_ms_max
    }
}
