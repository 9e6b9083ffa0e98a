//! Errors of the replicated log. Fatal start-up errors are apart from the errors of a proposal,
//! which callers react to (follow the leader, retry, give up).

/// Start-up and storage errors: the member cannot run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("storage: {0}")]
    Storage(String),
    #[error(transparent)]
    InvalidConfig(#[from] crate::config::ConfigError),
    #[error("config: {0}")]
    Config(String),
    #[error("raft: {0}")]
    Raft(String),
}

impl Error {
    pub(crate) fn io(what: &'static str, source: std::io::Error) -> Error {
        Error::Io { what, source }
    }
}

/// Why a proposal (or an admin change) was not done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This member does not lead; `leader` is (id, address) when known.
    #[error("not the leader{}", leader.as_ref().map(|(id, a)| format!(" (leader: node {id} at {a})")).unwrap_or_default())]
    NotLeader { leader: Option<(u64, String)> },
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("fatal: {0}")]
    Fatal(String),
}
