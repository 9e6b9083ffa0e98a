//! The node's configuration: a TOML file (`--config`), every top-level key also a flag and an
//! environment variable (`RAFTMQ_*`); precedence flag > environment > file > default. Nested
//! sections (`[raft]`, `[limits]`, `[read_hint]`) are set in the file. `validate()` names the bad key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use raftmq_proto::limits::{self, SendLimits};
use raftmq_raft_log::RaftConfig;
use serde::{Deserialize, Serialize};

/// Limits checked at the edge (DESIGN.md "Limits").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub body_bytes_max: usize,
    pub batch_messages_max: usize,
    pub batch_bytes_max: usize,
    pub properties_bytes_max: usize,
    pub queues_per_topic_max: u32,
    pub pull_messages_max: u32,
    pub pull_wait_ms_max: u32,
    /// Sends waiting for commit at once; past it a send gets BUSY.
    pub inflight_sends_max: usize,
    /// How far ahead a scheduled message's delivery time may be (DELAY topics), in ms.
    pub delivery_horizon_ms: u64,
    /// A transaction left open this long is checked with its producer (and again each time
    /// after as long), in ms.
    pub txn_check_interval_ms: u64,
    /// Checks left unanswered after which a transaction is rolled back.
    pub txn_checks_max: u32,
}

/// The default [`Limits::txn_check_interval_ms`]: 60 s, as RocketMQ's.
pub const TXN_CHECK_INTERVAL_MS_DEFAULT: u64 = 60_000;
/// The default [`Limits::txn_checks_max`]: 15, as RocketMQ's.
pub const TXN_CHECKS_MAX_DEFAULT: u32 = 15;

/// The default [`Limits::delivery_horizon_ms`]: 40 days, as RocketMQ's timer.
pub const DELIVERY_HORIZON_MS_DEFAULT: u64 = 40 * 24 * 3600 * 1000;

impl Default for Limits {
    /// The contract's limits (`raftmq_proto::limits`); a client that does not yet know a group's
    /// limits checks against these same values.
    fn default() -> Self {
        Limits {
            body_bytes_max: limits::BODY_BYTES_MAX,
            batch_messages_max: limits::BATCH_MESSAGES_MAX,
            batch_bytes_max: limits::BATCH_BYTES_MAX,
            properties_bytes_max: limits::PROPERTIES_BYTES_MAX,
            queues_per_topic_max: limits::QUEUES_PER_TOPIC_MAX,
            pull_messages_max: 1000,
            pull_wait_ms_max: 30_000,
            inflight_sends_max: 4096,
            delivery_horizon_ms: DELIVERY_HORIZON_MS_DEFAULT,
            txn_check_interval_ms: TXN_CHECK_INTERVAL_MS_DEFAULT,
            txn_checks_max: TXN_CHECKS_MAX_DEFAULT,
        }
    }
}

impl Limits {
    /// The send limits this node enforces, as it publishes them to the nameservers (and so to
    /// clients).
    pub fn send_limits(&self) -> SendLimits {
        SendLimits {
            body_bytes_max: self.body_bytes_max,
            properties_bytes_max: self.properties_bytes_max,
            batch_messages_max: self.batch_messages_max,
            batch_bytes_max: self.batch_bytes_max,
        }
    }
}

// raft-log caps one entry's payload at the contract's value: a `Send` the API accepts is storable.
const _: () = assert!(
    raftmq_raft_log::log_store::record::PAYLOAD_BYTES_MAX as usize == limits::LOG_PAYLOAD_BYTES_MAX
);

/// Thresholds of the read hint (DESIGN.md "The read hint").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadHintConfig {
    /// The leader counts as loaded above this many produced messages per second.
    pub leader_busy_msgs_per_sec: f64,
    /// A consumer this many messages behind the queue's tail reads cold data: send it to a follower.
    pub cold_read_lag: u64,
    /// A follower sends a consumer at its end back to the leader when it knows of this many more
    /// committed entries than it has applied.
    pub follower_lag_redirect: u64,
}

impl Default for ReadHintConfig {
    fn default() -> Self {
        ReadHintConfig {
            leader_busy_msgs_per_sec: 20_000.0,
            cold_read_lag: 100_000,
            follower_lag_redirect: 1_000,
        }
    }
}

/// Retention by age and disk watermarks (DESIGN.md "Storage").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Retention {
    /// Sealed log segments older than this are deleted (with the messages in them).
    pub max_age_secs: u64,
    /// Above this share of the data disk in use, the oldest segments are deleted early.
    pub clean_watermark_pct: u8,
    /// Above this share, sends are refused with DISK_FULL.
    pub full_watermark_pct: u8,
    /// How often the leader checks.
    pub check_interval_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_age_secs: 72 * 3600,
            clean_watermark_pct: 75,
            full_watermark_pct: 90,
            check_interval_ms: 10_000,
        }
    }
}

/// The RocketMQ 5 front (`apache.rocketmq.v2`) and POP consumer groups (`[rocketmq]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RocketMq {
    /// A RocketMQ 5 client that names an unknown topic gets TOPIC_NOT_FOUND unless this is set
    /// (then the topic is created with 8 queues, type NORMAL).
    pub auto_create_topics: bool,
    /// A receive for a consumer group that does not exist creates it with the defaults (16
    /// attempts, RocketMQ's retry ladder) unless this is false (then CONSUMER_GROUP_NOT_FOUND).
    pub auto_create_groups: bool,
    /// The longest a receive waits for a message (RocketMQ's proxy caps it at 20 s too).
    pub receive_wait_ms_max: u32,
}

impl Default for RocketMq {
    fn default() -> Self {
        RocketMq {
            auto_create_topics: false,
            auto_create_groups: true,
            receive_wait_ms_max: 20_000,
        }
    }
}

/// A secret from the config: read from the file like a string, but `{:?}` and serialization (the
/// config as node status shows it) never show it.
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(if self.0.is_empty() { "" } else { "<hidden>" })
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "<unset>"
        } else {
            "<hidden>"
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub cluster: String,
    pub broker: String,
    pub node_id: u64,
    pub listen: SocketAddr,
    pub advertise: Option<String>,
    /// `id=host:port,...`, this node included.
    pub peers: String,
    /// `id=host:port,...`: where this node sends its Raft traffic for the given peers, in place of
    /// the address in the group's membership (a separate replication network, or a fault proxy).
    pub peer_routes: String,
    /// `host:port;host:port`.
    pub nameservers: String,
    pub data_dir: PathBuf,
    pub register_interval_ms: u64,
    pub log_json: bool,
    /// DLedger's preferredLeaderId: the leader hands leadership to this node whenever it is a
    /// caught-up, reachable voter. Unset: no preference.
    pub preferred_leader: Option<u64>,
    /// The pod's name under an orchestrator (`broker-a-2`): with `node_id` unset, the node id is
    /// its trailing ordinal + 1.
    pub pod_name: Option<String>,
    /// A `host:port` with `{ordinal}` in it (`broker-a-{ordinal}.broker-a:10911`): with `peers`
    /// empty, the peers are ids 1..=`group_size` at this template with ordinal = id − 1, and with
    /// `advertise` unset this node advertises the template at its own ordinal.
    pub peer_template: String,
    /// The number of members `peer_template` describes.
    pub group_size: u32,
    /// On SIGTERM a leader hands leadership to a caught-up follower and waits up to this long for
    /// it to take over before stopping (a follower stops at once). 0: no hand-over.
    pub shutdown_drain_ms: u64,
    /// TLS on the node's port (every service: client API, admin, Raft peers, RocketMQ 5,
    /// `/metrics`): the CA bundle, this node's certificate and key (PEM). All three or none;
    /// none: plaintext, said loudly at start.
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Certificate revocation lists (PEM; `raftmq cert revoke` writes one): a client certificate
    /// they list is refused, so a revoked node reaches no peer's Raft service. Reloaded with the
    /// other TLS files. Needs TLS on.
    pub tls_crl: Option<PathBuf>,
    /// How often the TLS files are looked at for a change (rotation without a restart).
    pub tls_reload_ms: u64,
    /// A second, plaintext listener serving only gRPC health and `/metrics` (no data, no
    /// writes): for probes and scrapers that cannot present TLS (the kubelet's gRPC probes).
    /// Unset: none; both stay on the main port.
    pub health_listen: Option<SocketAddr>,
    /// Requests must be signed by a user (MQv2-HMAC-SHA1) and allowed by the user's rules.
    pub auth: bool,
    /// The bootstrap admin (RocketMQ's initial authentication user): always an admin, on every
    /// node from its config, so a new cluster can be managed before any user exists. Nodes
    /// also sign their own calls to other nodes with it.
    pub admin_access_key: String,
    pub admin_secret_key: Secret,
    /// A signature's date is taken while it lies this close to the node's clock, in seconds.
    pub signature_window_secs: u64,
    pub raft: RaftConfig,
    pub limits: Limits,
    pub read_hint: ReadHintConfig,
    pub retention: Retention,
    pub rocketmq: RocketMq,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cluster: "DefaultCluster".into(),
            broker: "broker-a".into(),
            node_id: 0,
            listen: "0.0.0.0:10911".parse().expect("valid default address"),
            advertise: None,
            peers: String::new(),
            peer_routes: String::new(),
            nameservers: String::new(),
            data_dir: PathBuf::from("/var/lib/raftmq"),
            register_interval_ms: 30_000,
            log_json: false,
            preferred_leader: None,
            pod_name: None,
            peer_template: String::new(),
            group_size: 0,
            shutdown_drain_ms: 10_000,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_crl: None,
            tls_reload_ms: 5_000,
            health_listen: None,
            auth: false,
            admin_access_key: "admin".into(),
            admin_secret_key: Secret::default(),
            signature_window_secs: raftmq_security::sign::WINDOW_SECS_DEFAULT,
            raft: RaftConfig::default(),
            limits: Limits::default(),
            read_hint: ReadHintConfig::default(),
            retention: Retention::default(),
            rocketmq: RocketMq::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid config `{key}`: {reason}")]
    Invalid { key: String, reason: String },
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// Topic, group, cluster and broker names: `^[A-Za-z0-9_%|-]{1,127}$` (the contract's rule,
/// [`raftmq_proto::limits::check_name`]); the error is the sentence to show.
pub fn check_name(kind: &str, name: &str) -> Result<(), String> {
    limits::check_name(kind, name).map_err(|e| e.to_string())
}

impl Config {
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string(),
        })
    }

    /// Parses `--peers`: `1=host:port,2=host:port`.
    pub fn peer_map(&self) -> Result<BTreeMap<u64, String>, ConfigError> {
        parse_id_addrs("peers", &self.peers)
    }

    /// Parses `--peer-routes`, in the same form as `--peers`.
    pub fn peer_route_map(&self) -> Result<BTreeMap<u64, String>, ConfigError> {
        parse_id_addrs("peer_routes", &self.peer_routes)
    }

    /// The TLS material the config names, loaded (None: plaintext).
    pub fn tls(&self) -> anyhow::Result<Option<std::sync::Arc<raftmq_security::tls::Tls>>> {
        let (Some(ca), Some(cert), Some(key)) = (&self.tls_ca, &self.tls_cert, &self.tls_key)
        else {
            return Ok(None);
        };
        let files = raftmq_security::tls::TlsFiles {
            ca: ca.clone(),
            cert: Some(cert.clone()),
            key: Some(key.clone()),
            crl: self.tls_crl.clone(),
        };
        Ok(Some(raftmq_security::tls::Tls::load(files)?))
    }

    /// The bootstrap admin's credentials, with auth on: what this node signs its own calls to
    /// other nodes and to the nameservers with.
    pub fn admin_credentials(&self) -> Option<std::sync::Arc<raftmq_security::sign::Credentials>> {
        self.auth.then(|| {
            std::sync::Arc::new(raftmq_security::sign::Credentials {
                access_key: self.admin_access_key.clone(),
                secret: self.admin_secret_key.0.clone(),
            })
        })
    }

    pub fn nameserver_list(&self) -> Vec<String> {
        self.nameservers
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    /// Fills `node_id`, `peers` and `advertise` from `pod_name`, `peer_template` and `group_size`
    /// where they are unset (a StatefulSet's pods share one config and differ only by name).
    pub fn apply_pod_identity(&mut self) -> Result<(), ConfigError> {
        let ordinal = match &self.pod_name {
            Some(name) if !name.is_empty() => Some(
                name.rsplit_once('-')
                    .and_then(|(_, n)| n.parse::<u64>().ok())
                    .ok_or_else(|| {
                        invalid(
                            "pod_name",
                            format!("{name:?} does not end in -ORDINAL (as broker-a-0)"),
                        )
                    })?,
            ),
            _ => None,
        };
        if self.node_id == 0
            && let Some(o) = ordinal
        {
            self.node_id = o + 1;
        }
        if self.peer_template.is_empty() {
            return Ok(());
        }
        if !self.peer_template.contains("{ordinal}") {
            return Err(invalid(
                "peer_template",
                format!("{:?} has no {{ordinal}} in it", self.peer_template),
            ));
        }
        if self.group_size == 0 {
            return Err(invalid(
                "group_size",
                "must be 1 or more when peer_template is set",
            ));
        }
        let at = |ordinal: u64| {
            self.peer_template
                .replace("{ordinal}", &ordinal.to_string())
        };
        if self.peers.is_empty() {
            self.peers = (1..=u64::from(self.group_size))
                .map(|id| format!("{id}={}", at(id - 1)))
                .collect::<Vec<_>>()
                .join(",");
        }
        if self.advertise.is_none() && self.node_id > 0 {
            self.advertise = Some(at(self.node_id - 1));
        }
        Ok(())
    }

    /// The address peers and clients reach this node at.
    pub fn advertised(&self) -> String {
        if let Some(a) = &self.advertise {
            return a.clone();
        }
        if let Ok(m) = self.peer_map()
            && let Some(a) = m.get(&self.node_id)
        {
            return a.clone();
        }
        self.listen.to_string()
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_name("cluster", &self.cluster).map_err(|r| invalid("cluster", r))?;
        check_name("broker", &self.broker).map_err(|r| invalid("broker", r))?;
        if self.node_id == 0 {
            return Err(invalid(
                "node_id",
                "must be set to a number of 1 or more (--node-id)",
            ));
        }
        let peers = self.peer_map()?;
        self.peer_route_map()?;
        if !peers.is_empty() && !peers.contains_key(&self.node_id) {
            return Err(invalid(
                "peers",
                format!("must include this node ({})", self.node_id),
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must be set"));
        }
        if let Some(p) = self.preferred_leader
            && !peers.is_empty()
            && !peers.contains_key(&p)
        {
            return Err(invalid(
                "preferred_leader",
                format!("node {p} is not among the peers"),
            ));
        }
        if self.limits.txn_check_interval_ms < 100 {
            return Err(invalid(
                "limits.txn_check_interval_ms",
                "must be at least 100",
            ));
        }
        if self.limits.txn_checks_max == 0 {
            return Err(invalid("limits.txn_checks_max", "must be at least 1"));
        }
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (None, None, None) | (Some(_), Some(_), Some(_)) => {}
            _ => {
                return Err(invalid(
                    "tls_ca",
                    "tls_ca, tls_cert and tls_key are given together (or none of them)",
                ));
            }
        }
        if self.tls_crl.is_some() && self.tls_ca.is_none() {
            return Err(invalid(
                "tls_crl",
                "a revocation list needs TLS on (tls_ca, tls_cert and tls_key)",
            ));
        }
        if self.tls_reload_ms < 100 {
            return Err(invalid("tls_reload_ms", "must be at least 100"));
        }
        if self.auth {
            raftmq_security::acl::validate_user(&self.admin_access_key, &self.admin_secret_key.0)
                .map_err(|e| match e {
                raftmq_security::acl::AclError::Secret => invalid(
                    "admin_secret_key",
                    "must be set with auth on: 8 to 256 characters, no control characters",
                ),
                other => invalid("admin_access_key", other.to_string()),
            })?;
        }
        if self.signature_window_secs == 0 {
            return Err(invalid("signature_window_secs", "must be at least 1"));
        }
        if self.register_interval_ms < 100 {
            return Err(invalid("register_interval_ms", "must be at least 100"));
        }
        self.raft.validate().map_err(|e| invalid(e.key, e.reason))?;
        let l = &self.limits;
        if l.body_bytes_max == 0 || l.body_bytes_max > limits::BODY_BYTES_CONFIG_MAX {
            return Err(invalid(
                "limits.body_bytes_max",
                format!(
                    "must be 1 byte to {} MiB",
                    limits::BODY_BYTES_CONFIG_MAX >> 20
                ),
            ));
        }
        if l.batch_messages_max == 0 {
            return Err(invalid("limits.batch_messages_max", "must be at least 1"));
        }
        if l.batch_bytes_max < l.body_bytes_max {
            return Err(invalid(
                "limits.batch_bytes_max",
                "must be at least limits.body_bytes_max",
            ));
        }
        if l.queues_per_topic_max == 0 {
            return Err(invalid("limits.queues_per_topic_max", "must be at least 1"));
        }
        if l.inflight_sends_max == 0 {
            return Err(invalid("limits.inflight_sends_max", "must be at least 1"));
        }
        let r = &self.retention;
        if r.max_age_secs == 0 {
            return Err(invalid("retention.max_age_secs", "must be at least 1"));
        }
        if !(r.clean_watermark_pct < r.full_watermark_pct && r.full_watermark_pct <= 100) {
            return Err(invalid(
                "retention.full_watermark_pct",
                format!(
                    "must exceed clean_watermark_pct ({}) and be at most 100",
                    r.clean_watermark_pct
                ),
            ));
        }
        if r.check_interval_ms < 100 {
            return Err(invalid(
                "retention.check_interval_ms",
                "must be at least 100",
            ));
        }
        if self.read_hint.leader_busy_msgs_per_sec.is_nan()
            || self.read_hint.leader_busy_msgs_per_sec < 0.0
        {
            return Err(invalid(
                "read_hint.leader_busy_msgs_per_sec",
                "must be 0 or more",
            ));
        }
        Ok(())
    }
}

/// Command-line flags; each also reads an environment variable.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    /// TOML config file; flags and environment variables override its keys.
    #[arg(long, env = "RAFTMQ_CONFIG")]
    pub config: Option<PathBuf>,
    #[arg(long, env = "RAFTMQ_CLUSTER")]
    pub cluster: Option<String>,
    #[arg(long, env = "RAFTMQ_BROKER")]
    pub broker: Option<String>,
    #[arg(long, env = "RAFTMQ_NODE_ID")]
    pub node_id: Option<u64>,
    #[arg(long, env = "RAFTMQ_LISTEN")]
    pub listen: Option<SocketAddr>,
    #[arg(long, env = "RAFTMQ_ADVERTISE")]
    pub advertise: Option<String>,
    /// Initial members, this node included: "1=host1:10911,2=host2:10911,3=host3:10911".
    #[arg(long, env = "RAFTMQ_PEERS")]
    pub peers: Option<String>,
    /// Raft traffic to these peers goes to these addresses instead: "2=10.0.1.2:10911,...".
    #[arg(long, env = "RAFTMQ_PEER_ROUTES")]
    pub peer_routes: Option<String>,
    /// Nameservers: "ns1:9876;ns2:9876".
    #[arg(long, env = "RAFTMQ_NAMESERVERS")]
    pub nameservers: Option<String>,
    #[arg(long, env = "RAFTMQ_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[arg(long, env = "RAFTMQ_REGISTER_INTERVAL_MS")]
    pub register_interval_ms: Option<u64>,
    /// Log as JSON lines.
    #[arg(long, env = "RAFTMQ_LOG_JSON")]
    pub log_json: bool,
    /// Produced msgs/s above which the leader redirects reads to followers.
    #[arg(long, env = "RAFTMQ_LEADER_BUSY_MSGS_PER_SEC")]
    pub leader_busy_msgs_per_sec: Option<f64>,
    /// Hand leadership to this node whenever it is caught up (DLedger's preferredLeaderId).
    #[arg(long, env = "RAFTMQ_PREFERRED_LEADER")]
    pub preferred_leader: Option<u64>,
    /// The pod's name (`broker-a-2`): node id = its trailing ordinal + 1 when --node-id is unset.
    #[arg(long, env = "RAFTMQ_POD_NAME")]
    pub pod_name: Option<String>,
    /// Peers and advertised address from a template: "broker-a-{ordinal}.broker-a:10911".
    #[arg(long, env = "RAFTMQ_PEER_TEMPLATE")]
    pub peer_template: Option<String>,
    /// Members the peer template describes.
    #[arg(long, env = "RAFTMQ_GROUP_SIZE")]
    pub group_size: Option<u32>,
    /// Longest wait, on SIGTERM, for a follower to take over leadership (0: no hand-over).
    #[arg(long, env = "RAFTMQ_SHUTDOWN_DRAIN_MS")]
    pub shutdown_drain_ms: Option<u64>,
    /// CA bundle (PEM) trusted for peers and clients; with --tls-cert and --tls-key, TLS on.
    #[arg(long, env = "RAFTMQ_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This node's certificate chain (PEM).
    #[arg(long, env = "RAFTMQ_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, env = "RAFTMQ_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Certificate revocation lists (PEM): client certificates they list are refused.
    #[arg(long, env = "RAFTMQ_TLS_CRL")]
    pub tls_crl: Option<PathBuf>,
    /// A plaintext listener for gRPC health and /metrics only (probes that cannot speak TLS).
    #[arg(long, env = "RAFTMQ_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Require signed requests and check each user's rules.
    #[arg(long, env = "RAFTMQ_AUTH")]
    pub auth: bool,
    /// The bootstrap admin's access key (default "admin").
    #[arg(long, env = "RAFTMQ_ADMIN_ACCESS_KEY")]
    pub admin_access_key: Option<String>,
    /// The bootstrap admin's secret key (prefer the environment variable to the flag).
    #[arg(long, env = "RAFTMQ_ADMIN_SECRET_KEY", hide_env_values = true)]
    pub admin_secret_key: Option<String>,
    /// `retention.clean_watermark_pct`: above this share of the data disk in use, the oldest
    /// segments go early (default 75).
    #[arg(long, env = "RAFTMQ_CLEAN_WATERMARK_PCT")]
    pub clean_watermark_pct: Option<u8>,
    /// `retention.full_watermark_pct`: above this share, sends are refused with DISK_FULL
    /// (default 90).
    #[arg(long, env = "RAFTMQ_FULL_WATERMARK_PCT")]
    pub full_watermark_pct: Option<u8>,
    /// UNSAFE flush mode for benchmarks only: acknowledge before fsync (loses data on power loss).
    #[arg(long, env = "RAFTMQ_FLUSH_MODE")]
    pub flush_mode: Option<String>,
}

impl Args {
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        set(&mut c.cluster, self.cluster);
        set(&mut c.broker, self.broker);
        set(&mut c.node_id, self.node_id);
        set(&mut c.listen, self.listen);
        set(&mut c.advertise, self.advertise.map(Some));
        set(&mut c.peers, self.peers);
        set(&mut c.peer_routes, self.peer_routes);
        set(&mut c.nameservers, self.nameservers);
        set(&mut c.data_dir, self.data_dir);
        set(&mut c.register_interval_ms, self.register_interval_ms);
        set(&mut c.preferred_leader, self.preferred_leader.map(Some));
        set(&mut c.pod_name, self.pod_name.map(Some));
        set(&mut c.peer_template, self.peer_template);
        set(&mut c.group_size, self.group_size);
        set(&mut c.shutdown_drain_ms, self.shutdown_drain_ms);
        set(&mut c.tls_ca, self.tls_ca.map(Some));
        set(&mut c.tls_cert, self.tls_cert.map(Some));
        set(&mut c.tls_key, self.tls_key.map(Some));
        set(&mut c.tls_crl, self.tls_crl.map(Some));
        set(&mut c.health_listen, self.health_listen.map(Some));
        c.auth |= self.auth;
        set(&mut c.admin_access_key, self.admin_access_key);
        set(&mut c.admin_secret_key, self.admin_secret_key.map(Secret));
        set(
            &mut c.retention.clean_watermark_pct,
            self.clean_watermark_pct,
        );
        set(&mut c.retention.full_watermark_pct, self.full_watermark_pct);
        set(
            &mut c.read_hint.leader_busy_msgs_per_sec,
            self.leader_busy_msgs_per_sec,
        );
        if let Some(v) = self.flush_mode {
            c.raft.flush_mode = match v.as_str() {
                "fsync" => raftmq_raft_log::FlushMode::Fsync,
                "unsafe-no-fsync" => raftmq_raft_log::FlushMode::UnsafeNoFsync,
                other => {
                    return Err(invalid(
                        "raft.flush_mode",
                        format!("{other:?} is not fsync or unsafe-no-fsync"),
                    ));
                }
            };
        }
        c.log_json |= self.log_json;
        c.apply_pod_identity()?;
        c.validate()?;
        Ok(c)
    }
}

/// Overrides a config value with a command-line one, when given.
fn set<T>(dst: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *dst = v;
    }
}

/// Parses `id=host:port,...` for the config key `key`.
fn parse_id_addrs(key: &'static str, list: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut m = BTreeMap::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| invalid(key, format!("{part:?} is not id=host:port")))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| invalid(key, format!("{id:?} is not a node id")))?;
        let addr = addr.trim();
        if id == 0 {
            return Err(invalid(key, "node ids start at 1"));
        }
        if addr
            .rsplit_once(':')
            .and_then(|(h, p)| (!h.is_empty()).then(|| p.parse::<u16>().ok()).flatten())
            .is_none()
        {
            return Err(invalid(key, format!("{addr:?} is not host:port")));
        }
        if m.insert(id, addr.to_string()).is_some() {
            return Err(invalid(key, format!("node {id} is listed twice")));
        }
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_contract() {
        assert!(check_name("topic", "Orders_v2|%-x").is_ok());
        assert!(check_name("topic", "").is_err());
        assert!(check_name("topic", &"a".repeat(128)).is_err());
        assert!(check_name("topic", "a.b").unwrap_err().contains("'.'"));
    }

    #[test]
    fn bad_config_names_the_key() {
        let mut c = Config {
            node_id: 1,
            peers: "1=a:1,2=b:2".into(),
            ..Config::default()
        };
        assert!(c.validate().is_ok());
        c.peers = "1=a:1,x=b:2".into();
        assert!(c.validate().unwrap_err().to_string().contains("`peers`"));
        c.peers = "2=b:2".into();
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("must include this node")
        );
        c.peers = String::new();
        c.raft.election_timeout_ms_max = 10;
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .contains("raft.election_timeout_ms_max")
        );
    }

    #[test]
    fn security_keys_are_checked_and_the_secret_never_shows() {
        let mut c = Config {
            node_id: 1,
            ..Config::default()
        };
        c.tls_ca = Some("ca.pem".into());
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("`tls_ca`") && e.contains("together"), "{e}");
        c.tls_cert = Some("n.pem".into());
        c.tls_key = Some("n.key".into());
        assert!(c.validate().is_ok());
        c.auth = true;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("`admin_secret_key`"), "{e}");
        c.admin_secret_key = Secret("a-long-secret".into());
        assert!(c.validate().is_ok());
        assert!(!format!("{c:?}").contains("a-long-secret"));
        let json = serde_json::to_string(&c).unwrap();
        assert!(
            !json.contains("a-long-secret") && json.contains("<hidden>"),
            "{json}"
        );
        let back: Config = toml::from_str("admin_secret_key = \"from-a-file\"").unwrap();
        assert_eq!(back.admin_secret_key.0, "from-a-file");
    }

    #[test]
    fn watermark_flags_override_the_file_and_a_bad_pair_names_the_key() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        std::fs::write(&file, "[retention]\nclean_watermark_pct = 60\n").unwrap();
        let parse = |extra: &[&str]| {
            let mut argv = vec!["node", "--node-id", "1", "--config", file.to_str().unwrap()];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).unwrap().args.into_config()
        };
        let r = parse(&[]).unwrap().retention;
        assert_eq!((r.clean_watermark_pct, r.full_watermark_pct), (60, 90));
        let r = parse(&["--clean-watermark-pct", "97", "--full-watermark-pct", "99"])
            .unwrap()
            .retention;
        assert_eq!((r.clean_watermark_pct, r.full_watermark_pct), (97, 99));
        let e = parse(&["--clean-watermark-pct", "95", "--full-watermark-pct", "90"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("retention.full_watermark_pct"), "{e}");
    }

    #[test]
    fn the_documented_template_parses_to_the_defaults() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy/config/broker-node.toml");
        let c = Config::from_file(&path).unwrap();
        assert_eq!(c.raft, RaftConfig::default());
        assert_eq!(c.limits, Limits::default());
        assert_eq!(c.read_hint, ReadHintConfig::default());
        assert_eq!(c.retention, Retention::default());
    }

    #[test]
    fn a_statefulset_pod_finds_its_id_peers_and_address_from_its_name() {
        let mut c = Config {
            pod_name: Some("broker-a-2".into()),
            peer_template: "broker-a-{ordinal}.broker-a.ns.svc:10911".into(),
            group_size: 3,
            ..Config::default()
        };
        c.apply_pod_identity().unwrap();
        assert_eq!(c.node_id, 3);
        assert_eq!(
            c.peers,
            "1=broker-a-0.broker-a.ns.svc:10911,2=broker-a-1.broker-a.ns.svc:10911,\
             3=broker-a-2.broker-a.ns.svc:10911"
        );
        assert_eq!(c.advertised(), "broker-a-2.broker-a.ns.svc:10911");
        c.validate().unwrap();

        // What is set explicitly wins.
        let mut c = Config {
            node_id: 7,
            pod_name: Some("broker-a-0".into()),
            peers: "7=x:1".into(),
            advertise: Some("y:2".into()),
            peer_template: "b-{ordinal}:1".into(),
            group_size: 3,
            ..Config::default()
        };
        c.apply_pod_identity().unwrap();
        assert_eq!((c.node_id, c.peers.as_str()), (7, "7=x:1"));
        assert_eq!(c.advertised(), "y:2");

        for (pod, template, size, key) in [
            ("broker", "", 0, "`pod_name`"),
            ("broker-a-0", "no-ordinal:1", 3, "`peer_template`"),
            ("broker-a-0", "b-{ordinal}:1", 0, "`group_size`"),
        ] {
            let mut c = Config {
                pod_name: Some(pod.into()),
                peer_template: template.into(),
                group_size: size,
                ..Config::default()
            };
            let e = c.apply_pod_identity().unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }
}
