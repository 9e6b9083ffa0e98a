//! Configuration of a member's replicated log, with shared defaults and validation.

use serde::{Deserialize, Serialize};

/// When an append counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FlushMode {
    /// `fdatasync` before an entry counts as stored on this member (the default): an acknowledged
    /// message survives power loss of any minority.
    #[default]
    Fsync,
    /// UNSAFE: an entry counts as stored once it is in the page cache. Survives a process crash,
    /// but a power loss of a majority can lose acknowledged messages.
    UnsafeNoFsync,
}

impl FlushMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            FlushMode::Fsync => "fsync",
            FlushMode::UnsafeNoFsync => "unsafe-no-fsync",
        }
    }
}

pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 50;
pub const ELECTION_TIMEOUT_MS_MIN_DEFAULT: u64 = 200;
pub const ELECTION_TIMEOUT_MS_MAX_DEFAULT: u64 = 350;
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 64 << 20;
pub const PAGE_CACHE_WINDOW_BYTES_DEFAULT: u64 = 64 << 20;
pub const SNAPSHOT_TIMEOUT_MS_DEFAULT: u64 = 60_000;
pub const RPC_TIMEOUT_MS_DEFAULT: u64 = 2_000;
pub const MAX_PAYLOAD_ENTRIES_DEFAULT: u64 = 256;
pub const CHECKPOINT_EVERY_ENTRIES_DEFAULT: u64 = 1024;
pub const RESTART_IMAGE_BYTES_DEFAULT: u64 = 128 << 20;
pub const CATCH_UP_BYTES_PER_SEC_BUSY_DEFAULT: u64 = 64 << 20;
pub const APPEND_BYTES_MAX_DEFAULT: u64 = crate::log_store::APPEND_BYTES_MAX_DEFAULT;
/// The longest `commit_notice_hold_us`: well under a heartbeat and an election timeout.
pub const COMMIT_NOTICE_HOLD_US_MAX: u64 = 10_000;

/// Knobs of the replicated log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftConfig {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_ms_min: u64,
    pub election_timeout_ms_max: u64,
    pub pre_vote: bool,
    pub segment_bytes_max: u64,
    /// Bytes at the end of the active segment left in the OS page cache once fsynced; the pages
    /// before them, and sealed segments whole, are dropped from it (recent entries are read from
    /// the tail cache). Keeps the log from growing the page cache by every byte written, which
    /// costs more per write than the write itself on a VM. 0: leave the page cache to the kernel.
    pub page_cache_window_bytes: u64,
    pub flush_mode: FlushMode,
    /// Deadline of installing one streamed snapshot (openraft's 200 ms default is far too small).
    pub snapshot_timeout_ms: u64,
    /// Entries per append RPC.
    pub max_payload_entries: u64,
    /// Payload bytes per append RPC (at least one entry is sent whatever its size): a follower
    /// catching up gets the log in appends of bounded work, each with a deadline for its bytes.
    pub append_bytes_max: u64,
    /// Bytes a second a follower catching up from the leader's disk may take while clients write
    /// to the group (0: unpaced), and never less than `log_store::pacer::CATCH_UP_GAIN` times
    /// what they write; on an idle group catch-up runs unpaced.
    pub catch_up_bytes_per_sec_busy: u64,
    /// Optional shared secret that every peer request must carry.
    pub peer_secret: Option<String>,
    /// The state is checkpointed every this many entries (and with every restart image), but
    /// not before `state_machine::STATE_REWRITE_RATIO` times its size (at most 1 GiB) was
    /// applied since the last checkpoint; retention snapshots and purges at the newest
    /// checkpoint below its trim point.
    pub checkpoint_every_entries: u64,
    /// A restart image (the state and what apply built, `sm/restart/`) is written each time this
    /// many payload bytes were applied since the last one, and `STATE_REWRITE_RATIO` times the
    /// state's size (at most 1 GiB) if that is more, so a restart re-applies at most about the
    /// larger of the two of the log. 0: no images (a restart re-applies the whole retained log).
    pub restart_image_bytes: u64,
    /// Send appends to a follower without waiting for the previous one's answer (one ordered
    /// gRPC stream per follower). Off: one AppendEntries RPC at a time.
    pub pipeline_appends: bool,
    /// Microseconds a leader may hold a commit notice (an append carrying only a new commit
    /// index) for the next append to carry instead (`raft_log::commit_notice`); at most
    /// 10,000. 0 (the default): sent at once. 2,000 made one-at-a-time sends ~5 % faster on the
    /// project's VMs, at the price of followers applying (and serving) up to that much later
    /// whenever the producers pause.
    pub commit_notice_hold_us: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            heartbeat_interval_ms: HEARTBEAT_INTERVAL_MS_DEFAULT,
            election_timeout_ms_min: ELECTION_TIMEOUT_MS_MIN_DEFAULT,
            election_timeout_ms_max: ELECTION_TIMEOUT_MS_MAX_DEFAULT,
            pre_vote: true,
            segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            page_cache_window_bytes: PAGE_CACHE_WINDOW_BYTES_DEFAULT,
            flush_mode: FlushMode::Fsync,
            snapshot_timeout_ms: SNAPSHOT_TIMEOUT_MS_DEFAULT,
            max_payload_entries: MAX_PAYLOAD_ENTRIES_DEFAULT,
            append_bytes_max: APPEND_BYTES_MAX_DEFAULT,
            catch_up_bytes_per_sec_busy: CATCH_UP_BYTES_PER_SEC_BUSY_DEFAULT,
            peer_secret: None,
            checkpoint_every_entries: CHECKPOINT_EVERY_ENTRIES_DEFAULT,
            restart_image_bytes: RESTART_IMAGE_BYTES_DEFAULT,
            pipeline_appends: true,
            commit_notice_hold_us: 0,
        }
    }
}

/// A configuration value that cannot work, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid config `{key}`: {reason}")]
pub struct ConfigError {
    pub key: &'static str,
    pub reason: String,
}

impl RaftConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |key, reason: String| Err(ConfigError { key, reason });
        if self.heartbeat_interval_ms == 0 {
            return err("raft.heartbeat_interval_ms", "must be at least 1".into());
        }
        if self.election_timeout_ms_min <= self.heartbeat_interval_ms {
            return err(
                "raft.election_timeout_ms_min",
                format!(
                    "must exceed heartbeat_interval_ms ({})",
                    self.heartbeat_interval_ms
                ),
            );
        }
        if self.commit_notice_hold_us > COMMIT_NOTICE_HOLD_US_MAX {
            return err(
                "raft.commit_notice_hold_us",
                format!("must be at most {COMMIT_NOTICE_HOLD_US_MAX} (10 ms)"),
            );
        }
        if self.election_timeout_ms_max <= self.election_timeout_ms_min {
            return err(
                "raft.election_timeout_ms_max",
                format!(
                    "must exceed election_timeout_ms_min ({})",
                    self.election_timeout_ms_min
                ),
            );
        }
        if self.segment_bytes_max < (1 << 20) {
            return err("raft.segment_bytes_max", "must be at least 1 MiB".into());
        }
        if self.snapshot_timeout_ms < 1000 {
            return err("raft.snapshot_timeout_ms", "must be at least 1000".into());
        }
        if self.checkpoint_every_entries == 0 {
            return err("raft.checkpoint_every_entries", "must be at least 1".into());
        }
        if self.max_payload_entries == 0 {
            return err("raft.max_payload_entries", "must be at least 1".into());
        }
        if self.catch_up_bytes_per_sec_busy != 0 && self.catch_up_bytes_per_sec_busy < 1 << 20 {
            return err(
                "raft.catch_up_bytes_per_sec_busy",
                "must be 0 (unpaced) or at least 1048576 (1 MiB/s)".into(),
            );
        }
        if !(64 << 10..=64 << 20).contains(&self.append_bytes_max) {
            return err(
                "raft.append_bytes_max",
                "must be between 65536 (64 KiB) and 67108864 (64 MiB)".into(),
            );
        }
        Ok(())
    }

    pub(crate) fn to_openraft(&self, cluster: &str) -> Result<openraft::Config, ConfigError> {
        self.validate()?;
        let c = openraft::Config {
            cluster_name: cluster.to_string(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_ms_min,
            election_timeout_max: self.election_timeout_ms_max,
            enable_pre_vote: Some(self.pre_vote),
            install_snapshot_timeout: self.snapshot_timeout_ms,
            max_payload_entries: self.max_payload_entries,
            // Messages live in the log: openraft must never purge it on its own; retention decides.
            snapshot_policy: openraft::SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: u64::MAX,
            // A follower whose data dir was wiped comes back with a shorter log than the leader
            // last matched; without this the leader's Raft core panics on it.
            allow_log_reversion: Some(true),
            // A restarted leader must not resume leading in its old term: its log may have lost
            // an unsynced or damaged tail, and as leader of the same term it would write other
            // entries under log ids its followers already hold (found by the fault checker: the
            // same (term, index) with different bytes on two nodes). It rejoins as a follower.
            enable_leader_restore: Some(false),
            ..Default::default()
        };
        c.validate().map_err(|e| ConfigError {
            key: "raft",
            reason: e.to_string(),
        })
    }
}
