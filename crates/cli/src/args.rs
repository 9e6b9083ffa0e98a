//! The command line, as DESIGN.md's "Command line" contract states it. Parsing only.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use raftmq_proto::v1::TopicMessageType;

use crate::commands::bench::ProduceShape;

/// raftmq: a message broker whose broker groups are Raft groups.
#[derive(Debug, Parser)]
#[command(name = "raftmq", version, about, propagate_version = true)]
pub struct Cli {
    /// Nameserver addresses, `;`-separated.
    #[arg(
        long,
        env = "RAFTMQ_NAMESERVER",
        default_value = "127.0.0.1:9876",
        global = true
    )]
    pub nameserver: String,

    /// Machine-readable output: one JSON object (per line where output streams).
    #[arg(long, global = true)]
    pub json: bool,

    /// Log more to standard error: `-v` informational lines, `-vv` debug. Without it a client
    /// command logs warnings only (unless `RUST_LOG` asks for more). No colours when standard
    /// error is not a terminal or `NO_COLOR` is set.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(flatten)]
    pub security: SecurityArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// How commands reach a cluster that has TLS or authentication on (global options). They apply
/// to every command that talks to an existing cluster; commands that start their own local
/// cluster (`--local`, `demo`, `playground`) talk to it as it runs: in plaintext, or with the
/// bench flag `--secure` over TLS signed as its generated admin.
#[derive(Clone, Default, Args)]
pub struct SecurityArgs {
    /// TLS: connect over TLS only, trusting the CA certificates in this PEM bundle
    /// (`raftmq cert init` writes one: ca.pem).
    #[arg(long, env = "RAFTMQ_TLS_CA", value_name = "FILE", global = true)]
    pub tls_ca: Option<PathBuf>,

    /// TLS: present this client certificate (PEM; with --tls-key and --tls-ca).
    #[arg(long, env = "RAFTMQ_TLS_CERT", value_name = "FILE", global = true)]
    pub tls_cert: Option<PathBuf>,

    /// TLS: the private key of --tls-cert (PEM).
    #[arg(long, env = "RAFTMQ_TLS_KEY", value_name = "FILE", global = true)]
    pub tls_key: Option<PathBuf>,

    /// Sign every request as this user (with --secret-key).
    #[arg(long, env = "RAFTMQ_ACCESS_KEY", value_name = "AK", global = true)]
    pub access_key: Option<String>,

    /// The secret of --access-key. Prefer the environment variable: a command line is visible
    /// to other users of the machine.
    #[arg(
        long,
        env = "RAFTMQ_SECRET_KEY",
        value_name = "SK",
        global = true,
        hide_env_values = true
    )]
    pub secret_key: Option<String>,
}

/// Never shows the secret key, only whether one was given.
impl std::fmt::Debug for SecurityArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecurityArgs")
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("access_key", &self.access_key)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Cluster-wide views.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Create, list, route and delete topics.
    #[command(subcommand)]
    Topic(TopicCmd),
    /// Create, update, list and delete POP consumer groups.
    #[command(subcommand)]
    Group(GroupCmd),
    /// Send messages: `--count N --size BYTES` generated ones, or one per line of standard input.
    Produce(ProduceArgs),
    /// Read messages as a member of a consumer group.
    Consume(ConsumeArgs),
    /// Leadership of broker groups.
    #[command(subcommand)]
    Leader(LeaderCmd),
    /// Membership of broker groups.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Measure throughput, latency and failover.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// A local cluster, a scripted leader kill watched live, and a check that nothing
    /// acknowledged was lost.
    Demo(DemoArgs),
    /// A local cluster left running, with its addresses and commands to try.
    Playground(PlaygroundArgs),
    /// Find stored messages: by id, by key, or by store time.
    #[command(subcommand)]
    Msg(MsgCmd),
    /// A web page showing the cluster live: groups, nodes, elections, topics, consumer lag.
    Console(ConsoleArgs),
    /// Transactions of TRANSACTION topics: list the open ones, commit or roll one back.
    #[command(subcommand)]
    Txn(TxnCmd),
    /// Development certificates for TLS: a CA, one certificate per node, the nameserver's and a
    /// client's.
    #[command(subcommand)]
    Cert(CertCmd),
    /// Users (access key, secret, admin role), kept by every broker group: add, update, delete,
    /// list. Needs an admin's --access-key and --secret-key when auth is on.
    #[command(subcommand)]
    User(UserCmd),
    /// Users' rules: allow or deny actions on topics, groups or the cluster, on every broker
    /// group. Needs an admin's --access-key and --secret-key when auth is on.
    #[command(subcommand)]
    Acl(AclCmd),
    /// Runs a nameserver in this process (used by local clusters).
    #[command(hide = true)]
    RunNameserver(PassThrough),
    /// Runs a broker node in this process (used by local clusters).
    #[command(hide = true)]
    RunBrokerNode(PassThrough),
}

/// Arguments handed to a server's own parser.
#[derive(Debug, Args)]
pub struct PassThrough {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum ClusterCmd {
    /// Every node's live role, term and log positions, like RocketMQ's clusterList.
    Status {
        /// Redraw every second (JSON: one object per line per second).
        #[arg(long)]
        watch: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum TopicCmd {
    /// Create a topic on every broker group (or those named).
    Create {
        name: String,
        /// Queues on each broker group.
        #[arg(long, default_value_t = 8)]
        queues: u32,
        /// Broker groups to host it, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        brokers: Option<Vec<String>>,
        /// The kind of messages it takes; fixed once created.
        #[arg(long = "type", value_enum, default_value_t = TopicType::Normal)]
        message_type: TopicType,
    },
    /// Every topic the nameservers know.
    List,
    /// The route clients use for a topic.
    Route { name: String },
    /// Delete a topic from every broker group hosting it.
    Delete { name: String },
    /// Per broker group and queue: offsets, messages, bytes, last store time; totals.
    Status { name: String },
}

#[derive(Debug, Subcommand)]
pub enum TxnCmd {
    /// The topic's open transactions on every broker group: id, queue, checks, next check.
    List {
        #[arg(long)]
        topic: String,
        /// At most this many per broker group (0: the node's cap, 1000).
        #[arg(long, default_value_t = 0)]
        limit: u32,
    },
    /// Commit a transaction: its message becomes readable. ID is what the send returned.
    Commit {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        id: String,
    },
    /// Roll a transaction back: its message is dropped.
    Rollback {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CertCmd {
    /// Write a development CA (kept and reused when DIR already has one) and certificates
    /// issued by it: `<group>-<id>.pem/.key` per node, `nameserver.pem/.key`, `client.pem/.key`.
    Init(CertInitArgs),
    /// Add a certificate to DIR/crl.pem, the revocation list signed by DIR's CA (kept: earlier
    /// revocations stay listed). Nodes and nameservers whose `tls_crl` names that file refuse the
    /// certificate within their `tls_reload_ms`.
    Revoke {
        /// The directory holding the CA (`ca.pem`, `ca.key`), as `cert init` wrote it.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The certificate to revoke (PEM), e.g. DIR/broker-a-3.pem.
        #[arg(long, value_name = "FILE")]
        cert: PathBuf,
    },
}

/// `cert init` flags.
#[derive(Debug, Args)]
pub struct CertInitArgs {
    /// Directory to write into (created when missing).
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// The cluster's name, in every node certificate's identity.
    #[arg(long, default_value = "DefaultCluster")]
    pub cluster: String,
    /// A broker group and its node ids, like `broker-a=1,2,3`; repeat for more groups
    /// (default: broker-a=1,2,3).
    #[arg(long = "group", value_name = "NAME=IDS", value_parser = parse_cert_group)]
    pub groups: Vec<(String, Vec<u64>)>,
    /// A host name or IP address that clients and peers dial, served by every node and
    /// nameserver certificate; repeat for more (default: localhost and 127.0.0.1). Each node's
    /// certificate also serves its own name `<group>-<id>`.
    #[arg(long = "host", value_name = "NAME_OR_IP")]
    pub hosts: Vec<String>,
}

/// `broker-a=1,2,3`: a broker group's name and its node ids (distinct, from 1). Clap names the
/// value in its error, so the message does not repeat it.
pub fn parse_cert_group(text: &str) -> Result<(String, Vec<u64>), String> {
    let (name, ids) = text
        .split_once('=')
        .ok_or("expected a broker group and its node ids, like broker-a=1,2,3")?;
    let name = name.trim();
    raftmq_client::admin::check_name("broker group", name).map_err(|e| match e {
        raftmq_client::Error::InvalidArgument(m) => m,
        other => other.to_string(),
    })?;
    let mut out: Vec<u64> = Vec::new();
    for id in ids.split(',').map(str::trim) {
        let n: u64 = id
            .parse()
            .map_err(|_| format!("node id {id:?} is not a whole number (like broker-a=1,2,3)"))?;
        if n == 0 {
            return Err("node ids start at 1".into());
        }
        if out.contains(&n) {
            return Err(format!("node id {n} is listed twice"));
        }
        out.push(n);
    }
    Ok((name.to_string(), out))
}

#[derive(Debug, Subcommand)]
pub enum UserCmd {
    /// Create a user on every broker group (no rules: it may do nothing until `acl allow`).
    /// Its secret comes from --secret-key-file, or --generate, or the environment variable
    /// RAFTMQ_NEW_USER_SECRET; it is never echoed (--generate prints the one it made, once).
    Add {
        /// The user's access key (its name).
        #[arg(id = "user_access_key", value_name = "ACCESS_KEY")]
        access_key: String,
        /// Give the user the admin role: every action on every resource.
        #[arg(long)]
        admin: bool,
        #[command(flatten)]
        secret: NewSecretArgs,
    },
    /// Give a user a new secret on every broker group (secrets are never read back, so one is
    /// always needed, from the same places as for `add`), and with --admin or --no-admin a new
    /// role; without either each group keeps the user's role.
    Update {
        /// The user's access key (its name).
        #[arg(id = "user_access_key", value_name = "ACCESS_KEY")]
        access_key: String,
        /// Give the user the admin role.
        #[arg(long, conflicts_with = "no_admin")]
        admin: bool,
        /// Take the admin role away (its rules apply again).
        #[arg(long)]
        no_admin: bool,
        #[command(flatten)]
        secret: NewSecretArgs,
    },
    /// Delete a user from every broker group.
    Delete {
        /// The user's access key.
        #[arg(id = "user_access_key", value_name = "ACCESS_KEY")]
        access_key: String,
    },
    /// Every user of every broker group: access key, role, rules, and the groups that lack it.
    List,
}

/// Where `user add|update` take the new secret from (else RAFTMQ_NEW_USER_SECRET).
#[derive(Debug, Args)]
pub struct NewSecretArgs {
    /// Read the new secret from this file: one line, 8 to 256 characters (a final line break
    /// is not part of it).
    #[arg(long, value_name = "FILE", conflicts_with = "generate")]
    pub secret_key_file: Option<PathBuf>,
    /// Make a random 32-character secret and print it once (keep it: it is never shown again).
    #[arg(long)]
    pub generate: bool,
}

#[derive(Debug, Subcommand)]
pub enum AclCmd {
    /// Add a rule allowing the user some actions on some resources, on every broker group.
    Allow(RuleArgs),
    /// Add a rule denying the user some actions on some resources (a matching deny wins over
    /// any allow), on every broker group.
    Deny(RuleArgs),
    /// Remove one of the user's rules, given as it was added, from every broker group.
    Revoke {
        #[command(flatten)]
        rule: RuleArgs,
        /// Which kind of rule to remove.
        #[arg(long, value_enum)]
        effect: RuleEffect,
    },
    /// The rules of every user (or of ACCESS_KEY), per broker group.
    List {
        /// Only this user's rules.
        #[arg(id = "user_access_key", value_name = "ACCESS_KEY")]
        access_key: Option<String>,
    },
}

/// The user and the rule of `acl allow|deny|revoke`.
#[derive(Debug, Args)]
pub struct RuleArgs {
    /// The user's access key. (Its id is not `access_key`: that is the global option's, and
    /// clap would merge the two.)
    #[arg(id = "user_access_key", value_name = "ACCESS_KEY")]
    pub access_key: String,
    /// Actions, comma-separated: Pub, Sub, Create, Update, Delete, Get, List, Admin; or `all`.
    #[arg(long, value_name = "ACTIONS")]
    pub actions: String,
    /// `*` (everything), `cluster`, `topic:NAME`, `topic:PREFIX*`, `group:NAME` or
    /// `group:PREFIX*`.
    #[arg(long, value_name = "RESOURCE")]
    pub resource: String,
}

/// `acl revoke --effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuleEffect {
    Allow,
    Deny,
}

#[derive(Debug, Subcommand)]
pub enum MsgCmd {
    /// One message by id: a raftmq id (`BROKER-INDEX-POSITION`) or a client's message id
    /// (RocketMQ 5 clients set their own).
    Get {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        id: String,
    },
    /// Messages by key, or stored between two times (RFC 3339 or milliseconds since the epoch).
    Find {
        #[arg(long)]
        topic: String,
        #[arg(long, conflicts_with_all = ["from", "to"], required_unless_present = "from")]
        key: Option<String>,
        #[arg(long, requires = "to")]
        from: Option<String>,
        #[arg(long)]
        to: Option<String>,
        /// At most this many messages.
        #[arg(long, default_value_t = 32)]
        limit: u32,
    },
    /// Cancel a scheduled message (DELAY topic) not yet delivered, by the id its send returned.
    Recall {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        id: String,
    },
}

#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// Address to serve the page on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Allow actions (leader transfer) from the page; read-only without it.
    #[arg(long)]
    pub allow_actions: bool,
}

/// `topic create --type`: raftmq.v1's `TopicMessageType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TopicType {
    Normal,
    Fifo,
    Delay,
    Transaction,
}

impl TopicType {
    pub fn message_type(self) -> TopicMessageType {
        match self {
            TopicType::Normal => TopicMessageType::Normal,
            TopicType::Fifo => TopicMessageType::Fifo,
            TopicType::Delay => TopicMessageType::Delay,
            TopicType::Transaction => TopicMessageType::Transaction,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum GroupCmd {
    /// Create a POP consumer group on every broker group (or those named).
    Create {
        name: String,
        #[command(flatten)]
        config: GroupArgs,
    },
    /// Replace a consumer group's config (flags left out return to their defaults).
    Update {
        name: String,
        #[command(flatten)]
        config: GroupArgs,
    },
    /// Every consumer group of every broker group, with its config.
    List,
    /// Delete a consumer group from every broker group holding it.
    Delete { name: String },
    /// Per queue: committed offset, lag in messages and age, the member reading it, last
    /// commit; for POP groups ready, in-flight, retrying and dead-lettered counts.
    Status {
        name: String,
        /// Only this topic's queues (all of them, consumed or not).
        #[arg(long)]
        topic: Option<String>,
    },
    /// Move a group on a topic: a pull group's committed offsets, a POP group's cursor (its
    /// deliveries in flight are dropped). Replicated; refused while pull members are connected,
    /// unless --force.
    Reset {
        name: String,
        #[arg(long)]
        topic: String,
        /// `earliest`, `latest`, or a time (RFC 3339, or milliseconds since the epoch): the first
        /// message stored at or after it.
        #[arg(long)]
        to: String,
        /// Reset even while members are connected (they may commit over it).
        #[arg(long)]
        force: bool,
    },
}

/// The config flags of `group create|update`.
#[derive(Debug, Args)]
pub struct GroupArgs {
    /// Deliveries of a message before it moves to the dead-letter topic `%DLQ%<group>`
    /// (default 16).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: Option<u32>,
    /// Invisible time before each retry, comma-separated, the last one repeating
    /// (e.g. `1s,5s,30s`; units ms, s, m, h). Default: 1s 5s 10s 30s 1m 2m ... 2h.
    #[arg(long, value_delimiter = ',', value_parser = parse_duration_ms, value_name = "DELAYS")]
    pub retry: Option<Vec<u64>>,
    /// Deliver the messages of one message group in order.
    #[arg(long)]
    pub fifo: bool,
    /// Broker groups to apply it on, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub brokers: Option<Vec<String>>,
}

/// A duration like `500ms`, `1s`, `2m` or `1h`, in milliseconds. Clap names the value in its
/// error, so the message does not repeat it.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(
                "expected a whole number and a unit: ms, s, m or h (like 500ms, 1s, 2m, 1h)".into(),
            );
        }
    };
    let n: u64 = number
        .parse()
        .map_err(|_| "expected a whole number before the unit (like 500ms, 1s, 2m, 1h)")?;
    match n.checked_mul(unit_ms) {
        Some(0) => Err("a retry delay must be longer than 0".into()),
        Some(ms) => Ok(ms),
        None => Err("too long".into()),
    }
}

#[derive(Debug, Args)]
pub struct ProduceArgs {
    #[arg(long)]
    pub topic: String,
    /// Message key: one key goes to one queue, in order.
    #[arg(long)]
    pub key: Option<String>,
    #[arg(long)]
    pub tag: Option<String>,
    /// Send N generated messages instead of reading standard input.
    #[arg(long)]
    pub count: Option<u64>,
    /// Body size of generated messages, in bytes.
    #[arg(long, default_value_t = 1024, requires = "count")]
    pub size: usize,
    /// Messages awaiting acknowledgement at once.
    #[arg(long, default_value_t = 256)]
    pub inflight: usize,
    /// How long one message may retry (leader changes included) before the command fails.
    #[arg(long, default_value_t = 30_000)]
    pub timeout_ms: u64,
    /// Schedule the messages (a DELAY topic): readable from this time on (RFC 3339 or ms since
    /// the epoch).
    #[arg(long, conflicts_with = "delay")]
    pub deliver_at: Option<String>,
    /// Schedule the messages (a DELAY topic): readable this long after each is sent, e.g. 30s,
    /// 500ms, 5m, 2h, 1d.
    #[arg(long)]
    pub delay: Option<String>,
    /// The messages' message group (a FIFO topic needs one): one group goes to one queue, in
    /// order (it is the key too, unless --key is given).
    #[arg(long)]
    pub message_group: Option<String>,
    /// With --delay: spread the delivery times evenly over this much more, message i of N at
    /// delay + spread × i / N (e.g. --delay 5s --delay-spread 30s).
    #[arg(long, requires = "delay")]
    pub delay_spread: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum From {
    Earliest,
    Latest,
}

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    #[arg(long)]
    pub topic: String,
    #[arg(long)]
    pub group: String,
    /// Where to start in queues the group has no committed offset for.
    #[arg(long, value_enum, default_value_t = From::Earliest)]
    pub from: From,
    /// Stop after this many messages.
    #[arg(long)]
    pub max: Option<u64>,
    /// Stop once no message has arrived for this long.
    #[arg(long, default_value_t = 5_000)]
    pub timeout_ms: u64,
    /// Run until interrupted.
    #[arg(long, conflicts_with = "max")]
    pub follow: bool,
}

#[derive(Debug, Subcommand)]
pub enum LeaderCmd {
    /// Hand leadership of a broker group to a caught-up node.
    Transfer {
        #[arg(long)]
        broker: String,
        #[arg(long)]
        to: u64,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// Add a node: first as a learner, then (unless --learner) as a voter once it caught up.
    Add {
        #[arg(long)]
        broker: String,
        #[arg(long)]
        node_id: u64,
        /// The new node's address (host:port); start it first with no --peers: it waits to be added.
        #[arg(long)]
        address: String,
        /// Leave it a learner.
        #[arg(long)]
        learner: bool,
        /// How long the learner may take to catch up before promotion.
        #[arg(long, default_value_t = 60_000)]
        catch_up_timeout_ms: u64,
    },
    /// Remove a node from the voters of its group.
    Remove {
        #[arg(long)]
        broker: String,
        #[arg(long)]
        node_id: u64,
    },
    /// One node in depth: version, uptime, config in effect, disk use and watermarks, log
    /// segments, snapshot, and (on a leader) each follower's replication lag.
    Status {
        /// A node id (with --broker when several broker groups have it) or an address host:port.
        node: String,
        #[arg(long)]
        broker: Option<String>,
    },
}

#[derive(Debug, Args, Clone)]
pub struct BenchTarget {
    /// Start a local cluster for this run instead of using --nameserver.
    #[arg(long)]
    pub local: bool,
    /// With --local: TLS and authentication on in the local cluster (development certificates
    /// and a generated admin secret); the bench's clients use TLS and sign as that admin.
    #[arg(long, requires = "local")]
    pub secure: bool,
    /// Topic to use (created when missing).
    #[arg(long, default_value = "bench")]
    pub topic: String,
    /// Queues per broker group when the topic is created.
    #[arg(long, default_value_t = 8)]
    pub queues: u32,
}

#[derive(Debug, Subcommand)]
pub enum BenchCmd {
    /// Produce as fast as acknowledgements allow.
    Produce {
        #[command(flatten)]
        target: BenchTarget,
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        #[command(flatten)]
        shape: ProduceShape,
    },
    /// Consume as fast as pulls allow (latency = now − store time).
    Consume {
        #[command(flatten)]
        target: BenchTarget,
        /// Messages to consume; with --local this many are produced first.
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Consumer group (default: a new one, reading from the earliest offset).
        #[arg(long)]
        group: Option<String>,
        /// Give up when no message arrived for this long.
        #[arg(long, default_value_t = 10_000)]
        timeout_ms: u64,
    },
    /// The RocketMQ 5 API with raw gRPC: v2 send beside v1 produce, then POP receive + ack.
    Pop(crate::commands::bench_pop::PopBenchArgs),
    /// Message lookup at scale: store --count messages with client ids and keys, then time
    /// `msg get` by id and `msg find --key` on random ones.
    Lookup(crate::commands::bench_lookup::LookupBenchArgs),
    /// Scheduled messages: --count due over --window-secs under a producer load; how late each
    /// is stored and received.
    Delay(crate::commands::bench_delay::DelayBenchArgs),
    /// SIGKILL the leader of a local cluster repeatedly; outage = kill → first acknowledged send.
    Failover {
        #[arg(long, default_value_t = 10)]
        kills: u32,
        /// Concurrent senders (each one message at a time).
        #[arg(long, default_value_t = 4)]
        senders: usize,
        /// Skip the final check that every acknowledged message is readable.
        #[arg(long)]
        no_verify: bool,
        /// SIGSTOP the leader instead of SIGKILL: like a host or container that vanished, its
        /// connections stay open and silent instead of being reset.
        #[arg(long)]
        stop: bool,
        /// TLS and authentication on in the local cluster; the senders use TLS and sign.
        #[arg(long)]
        secure: bool,
    },
    /// SIGKILL a follower of a local cluster (and wipe its data with --mode wipe), produce --mb
    /// megabytes without it, restart it; report its catch-up rate and the producers' rate meanwhile.
    Catchup {
        /// wipe: delete its data directory before restarting it; stop: restart it on its data.
        #[arg(long, value_enum, default_value_t = CatchupMode::Wipe)]
        mode: CatchupMode,
        /// Megabytes (MiB) of messages produced while it is down.
        #[arg(long, default_value_t = 1024)]
        mb: u64,
        /// Message size in bytes.
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// Keep senders producing throughout and compare their rate during the catch-up with
        /// their rate before the kill.
        #[arg(long)]
        load: bool,
        /// Senders of the load, each with one message in flight.
        #[arg(long, default_value_t = 64)]
        load_senders: usize,
        /// Seconds the load's rate is measured before the kill.
        #[arg(long, default_value_t = 8)]
        baseline_secs: u64,
        /// Give up when it has not caught up, or not become ready, this many seconds after its
        /// restart.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
    /// Fill a local cluster's log with --mb megabytes, then SIGKILL a follower and start it
    /// three times: from its restart images, with them deleted (re-applying its whole log), and
    /// without its segment index files too (reading every record first); report each start's
    /// time to ready.
    Restart {
        /// Megabytes (MiB) of messages in the log.
        #[arg(long, default_value_t = 10240)]
        mb: u64,
        /// Message size in bytes.
        #[arg(long, default_value_t = 4096)]
        size: usize,
        /// Drop the OS page cache before each start (needs root), as after a reboot.
        #[arg(long)]
        cold: bool,
        /// Give up on a start that is not ready after this many seconds.
        #[arg(long, default_value_t = 900)]
        timeout_secs: u64,
    },
}

/// How `bench catchup` takes the follower down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CatchupMode {
    Wipe,
    Stop,
}

impl CatchupMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            CatchupMode::Wipe => "wipe",
            CatchupMode::Stop => "stop",
        }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the temporary directory (data and node logs) after the demo.
    #[arg(long)]
    pub keep_dir: bool,
}

#[derive(Debug, Args)]
pub struct PlaygroundArgs {
    /// Nodes in the broker group.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// A topic to create at start (empty: none).
    #[arg(long, default_value = "playground")]
    pub topic: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("raftmq").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn contract_commands_parse() {
        let c = parse(&[
            "--nameserver",
            "a:1;b:2",
            "cluster",
            "status",
            "--watch",
            "--json",
        ]);
        assert_eq!(c.nameserver, "a:1;b:2");
        assert!(c.json);
        assert!(matches!(
            c.command,
            Command::Cluster(ClusterCmd::Status { watch: true })
        ));

        let c = parse(&[
            "topic",
            "create",
            "t",
            "--queues",
            "4",
            "--brokers",
            "broker-a,broker-b",
        ]);
        match c.command {
            Command::Topic(TopicCmd::Create {
                name,
                queues,
                brokers,
                message_type,
            }) => {
                assert_eq!((name.as_str(), queues), ("t", 4));
                assert_eq!(brokers.unwrap_or_default(), vec!["broker-a", "broker-b"]);
                assert_eq!(message_type, TopicType::Normal);
            }
            other => panic!("{other:?}"),
        }
        for (word, want) in [
            ("normal", TopicMessageType::Normal),
            ("fifo", TopicMessageType::Fifo),
            ("delay", TopicMessageType::Delay),
            ("transaction", TopicMessageType::Transaction),
        ] {
            match parse(&["topic", "create", "t", "--type", word]).command {
                Command::Topic(TopicCmd::Create {
                    message_type,
                    queues: 8,
                    ..
                }) => assert_eq!(message_type.message_type(), want),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            parse(&["topic", "list"]).command,
            Command::Topic(TopicCmd::List)
        ));
        assert!(matches!(
            parse(&["topic", "route", "t", "--json"]).command,
            Command::Topic(TopicCmd::Route { .. })
        ));
        assert!(matches!(
            parse(&["topic", "delete", "t"]).command,
            Command::Topic(TopicCmd::Delete { .. })
        ));

        let c = parse(&[
            "produce", "--topic", "t", "--key", "k", "--tag", "x", "--count", "10", "--size",
            "100", "--json",
        ]);
        match c.command {
            Command::Produce(p) => {
                assert_eq!(
                    (p.count, p.size, p.key.as_deref()),
                    (Some(10), 100, Some("k"))
                );
            }
            other => panic!("{other:?}"),
        }

        let c = parse(&[
            "consume",
            "--topic",
            "t",
            "--group",
            "g",
            "--from",
            "latest",
            "--max",
            "5",
            "--timeout-ms",
            "100",
            "--json",
        ]);
        match c.command {
            Command::Consume(a) => {
                assert_eq!(
                    (a.from, a.max, a.timeout_ms, a.follow),
                    (From::Latest, Some(5), 100, false)
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["leader", "transfer", "--broker", "broker-a", "--to", "2"]).command,
            Command::Leader(LeaderCmd::Transfer { to: 2, .. })
        ));
        assert!(matches!(
            parse(&[
                "node",
                "add",
                "--broker",
                "b",
                "--node-id",
                "4",
                "--address",
                "h:1"
            ])
            .command,
            Command::Node(NodeCmd::Add { node_id: 4, .. })
        ));
        assert!(matches!(
            parse(&["node", "remove", "--broker", "b", "--node-id", "4"]).command,
            Command::Node(NodeCmd::Remove { node_id: 4, .. })
        ));
        assert!(matches!(
            parse(&["bench", "failover", "--kills", "20", "--json"]).command,
            Command::Bench(BenchCmd::Failover { kills: 20, .. })
        ));
        assert!(matches!(
            parse(&["bench", "catchup", "--mode", "stop", "--mb", "64", "--load"]).command,
            Command::Bench(BenchCmd::Catchup {
                mode: CatchupMode::Stop,
                mb: 64,
                load: true,
                ..
            })
        ));
        assert!(matches!(parse(&["demo"]).command, Command::Demo(_)));
        assert!(matches!(
            parse(&["playground"]).command,
            Command::Playground(_)
        ));
        let c = parse(&["run-broker-node", "--node-id", "1", "--peers", "1=a:1"]);
        match c.command {
            Command::RunBrokerNode(p) => {
                assert_eq!(p.args, vec!["--node-id", "1", "--peers", "1=a:1"])
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn group_commands_parse() {
        let c = parse(&[
            "group",
            "create",
            "g1",
            "--max-attempts",
            "3",
            "--retry",
            "500ms,1s,2m,1h",
            "--fifo",
            "--brokers",
            "broker-a,broker-b",
            "--json",
        ]);
        assert!(c.json);
        match c.command {
            Command::Group(GroupCmd::Create { name, config }) => {
                assert_eq!(name, "g1");
                assert_eq!(config.max_attempts, Some(3));
                assert_eq!(config.retry, Some(vec![500, 1_000, 120_000, 3_600_000]));
                assert!(config.fifo);
                assert_eq!(
                    config.brokers.unwrap_or_default(),
                    vec!["broker-a", "broker-b"]
                );
            }
            other => panic!("{other:?}"),
        }
        match parse(&["group", "create", "g1"]).command {
            Command::Group(GroupCmd::Create { config, .. }) => {
                assert_eq!(
                    (
                        config.max_attempts,
                        config.retry,
                        config.fifo,
                        config.brokers
                    ),
                    (None, None, false, None)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["group", "update", "g1", "--max-attempts", "5"]).command,
            Command::Group(GroupCmd::Update { ref name, ref config })
                if name == "g1" && config.max_attempts == Some(5)
        ));
        assert!(matches!(
            parse(&["group", "list", "--json"]).command,
            Command::Group(GroupCmd::List)
        ));
        assert!(matches!(
            parse(&["group", "delete", "g1"]).command,
            Command::Group(GroupCmd::Delete { ref name }) if name == "g1"
        ));
    }

    #[test]
    fn security_options_are_global_and_the_secret_is_never_shown() {
        let c = parse(&[
            "topic",
            "list",
            "--tls-ca",
            "certs/ca.pem",
            "--tls-cert",
            "certs/client.pem",
            "--tls-key",
            "certs/client.key",
            "--access-key",
            "ak1",
            "--secret-key",
            "s3cr3t-value",
        ]);
        assert_eq!(c.security.tls_ca, Some(PathBuf::from("certs/ca.pem")));
        assert_eq!(c.security.tls_key, Some(PathBuf::from("certs/client.key")));
        assert_eq!(c.security.access_key.as_deref(), Some("ak1"));
        assert_eq!(c.security.secret_key.as_deref(), Some("s3cr3t-value"));
        let debug = format!("{c:?}");
        assert!(
            debug.contains("ak1") && debug.contains("<hidden>"),
            "{debug}"
        );
        assert!(!debug.contains("s3cr3t-value"), "{debug}");
        // Before the subcommand too.
        let c = parse(&["--tls-ca", "ca.pem", "cluster", "status"]);
        assert_eq!(c.security.tls_ca, Some(PathBuf::from("ca.pem")));
        // The help never prints the secret's environment value.
        let cmd = Cli::command();
        let secret = cmd
            .get_arguments()
            .find(|a| a.get_id() == "secret_key")
            .expect("--secret-key");
        assert!(secret.is_hide_env_values_set());
        // A clap error about the option names it, not its value.
        let e = Cli::try_parse_from(["raftmq", "--secret-key", "s3cr3t-value", "nope"])
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cr3t-value"), "{e}");
    }

    /// The user named by `user`/`acl` commands and the caller's global `--access-key` are two
    /// arguments (they once shared clap's id `access_key`, and the command signed as the user
    /// it was about to create).
    #[test]
    fn user_and_acl_commands_parse_apart_from_the_callers_credentials() {
        let c = parse(&[
            "--access-key",
            "admin",
            "user",
            "add",
            "alice",
            "--admin",
            "--generate",
            "--json",
        ]);
        assert_eq!(c.security.access_key.as_deref(), Some("admin"));
        match c.command {
            Command::User(UserCmd::Add {
                access_key,
                admin,
                secret,
            }) => {
                assert_eq!(access_key, "alice");
                assert!(admin && secret.generate && secret.secret_key_file.is_none());
            }
            other => panic!("{other:?}"),
        }
        let c = parse(&[
            "user",
            "update",
            "alice",
            "--secret-key-file",
            "s.txt",
            "--no-admin",
        ]);
        assert!(c.security.access_key.is_none());
        match c.command {
            Command::User(UserCmd::Update {
                access_key,
                admin,
                no_admin,
                secret,
            }) => {
                assert_eq!(access_key, "alice");
                assert!(!admin && no_admin);
                assert_eq!(secret.secret_key_file, Some(PathBuf::from("s.txt")));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["user", "delete", "alice", "--access-key", "root"]).command,
            Command::User(UserCmd::Delete { ref access_key }) if access_key == "alice"
        ));
        assert!(matches!(
            parse(&["user", "list", "--json"]).command,
            Command::User(UserCmd::List)
        ));
        let c = parse(&[
            "acl",
            "allow",
            "alice",
            "--actions",
            "Pub,Sub",
            "--resource",
            "topic:orders*",
            "--access-key",
            "admin",
        ]);
        assert_eq!(c.security.access_key.as_deref(), Some("admin"));
        match c.command {
            Command::Acl(AclCmd::Allow(r)) => assert_eq!(
                (
                    r.access_key.as_str(),
                    r.actions.as_str(),
                    r.resource.as_str()
                ),
                ("alice", "Pub,Sub", "topic:orders*")
            ),
            other => panic!("{other:?}"),
        }
        match parse(&[
            "acl",
            "revoke",
            "alice",
            "--effect",
            "deny",
            "--actions",
            "Pub",
            "--resource",
            "*",
        ])
        .command
        {
            Command::Acl(AclCmd::Revoke { rule, effect }) => {
                assert_eq!(
                    (rule.access_key.as_str(), effect),
                    ("alice", RuleEffect::Deny)
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(&["acl", "list", "alice"]).command,
            Command::Acl(AclCmd::List { access_key: Some(ref a) }) if a == "alice"
        ));
        assert!(matches!(
            parse(&["acl", "list"]).command,
            Command::Acl(AclCmd::List { access_key: None })
        ));
        for bad in [
            &["user", "add"][..],
            &["user", "add", "a", "--generate", "--secret-key-file", "f"],
            &["user", "update", "a", "--admin", "--no-admin"],
            &["acl", "allow", "a", "--actions", "Pub"],
            &["acl", "revoke", "a", "--actions", "Pub", "--resource", "*"],
            &[
                "acl",
                "revoke",
                "a",
                "--effect",
                "maybe",
                "--actions",
                "Pub",
                "--resource",
                "*",
            ],
            &["bench", "produce", "--secure"],
        ] {
            assert!(
                Cli::try_parse_from(std::iter::once("raftmq").chain(bad.iter().copied())).is_err(),
                "{bad:?} should not parse"
            );
        }
        assert!(matches!(
            parse(&["bench", "produce", "--local", "--secure"]).command,
            Command::Bench(BenchCmd::Produce { ref target, .. }) if target.local && target.secure
        ));
        assert!(matches!(
            parse(&["bench", "failover", "--secure"]).command,
            Command::Bench(BenchCmd::Failover { secure: true, .. })
        ));
    }

    #[test]
    fn server_flags_pass_through_even_where_they_share_a_client_name() {
        let server = [
            "--listen",
            "127.0.0.1:1",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "n.pem",
            "--tls-key",
            "n.key",
            "--json",
            "--access-key",
            "a",
            "--secret-key",
            "s",
        ];
        for sub in ["run-nameserver", "run-broker-node"] {
            let c = parse(&[&[sub][..], &server[..]].concat());
            match c.command {
                Command::RunNameserver(p) | Command::RunBrokerNode(p) => {
                    assert_eq!(p.args, server, "{sub}")
                }
                other => panic!("{other:?}"),
            }
            assert!(c.security.tls_ca.is_none() && !c.json, "{sub}");
        }
    }

    #[test]
    fn cert_init_parses() {
        let c = parse(&[
            "cert",
            "init",
            "--dir",
            "certs",
            "--group",
            "broker-a=1,2",
            "--host",
            "mq",
            "--json",
        ]);
        match c.command {
            Command::Cert(CertCmd::Init(a)) => {
                assert_eq!(a.dir, PathBuf::from("certs"));
                assert_eq!(a.groups, vec![("broker-a".to_string(), vec![1, 2])]);
                assert_eq!(a.hosts, vec!["mq"]);
                assert_eq!(a.cluster, "DefaultCluster");
            }
            other => panic!("{other:?}"),
        }
        assert!(c.json);
        assert!(Cli::try_parse_from(["raftmq", "cert", "init"]).is_err());
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("1s"), Ok(1_000));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        for bad in [
            "",
            "5",
            "s",
            "1.5s",
            "-1s",
            "1d",
            "1 s",
            "0s",
            "99999999999999999h",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn a_bad_retry_delay_is_named_once() {
        let e = Cli::try_parse_from(["raftmq", "group", "create", "g", "--retry", "1s,5x"])
            .unwrap_err()
            .to_string();
        assert_eq!(e.matches("5x").count(), 1, "{e}");
        assert!(e.contains("--retry"), "{e}");
        assert!(!e.contains("1s,5x"), "{e}");
    }

    #[test]
    fn bad_arguments_are_refused() {
        let bad: &[&[&str]] = &[
            &["consume", "--topic", "t"],
            &[
                "consume", "--topic", "t", "--group", "g", "--from", "middle",
            ],
            &[
                "consume", "--topic", "t", "--group", "g", "--follow", "--max", "3",
            ],
            &["produce", "--topic", "t", "--size", "10"],
            &["topic", "create"],
            &["topic", "create", "t", "--type", "batch"],
            &["group", "create"],
            &["group", "create", "g", "--max-attempts", "0"],
            &["group", "create", "g", "--retry", "10"],
            &["group", "delete"],
        ];
        for args in bad {
            assert!(
                Cli::try_parse_from(std::iter::once("raftmq").chain(args.iter().copied())).is_err(),
                "{args:?} should not parse"
            );
        }
    }
}
