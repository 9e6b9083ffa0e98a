//! Errors of the replicated log. Fatal start-up errors are apart from the errors of a proposal,
//! which callers react to (follow the leader, retry, give up).

use std::path::{Path, PathBuf};

/// Start-up and storage errors: the member cannot run.
///
/// Each names its subject (the path) once, and keeps its cause as a `#[source]` that its message
/// does not repeat: printed with its chain (`anyhow`'s `{:#}`, or [`Error::chain`]) it reads
/// `cannot create the data dir /x: No such file or directory (os error 2)`, the cause once.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or directory of the member could not be used.
    #[error("cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The metadata store (sled) could not be opened.
    #[error("cannot {what} {}", path.display())]
    Metadata {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    #[error(transparent)]
    InvalidConfig(#[from] crate::config::ConfigError),
    #[error("config: {0}")]
    Config(String),
    #[error("raft: {0}")]
    Raft(String),
}

impl Error {
    pub(crate) fn io(what: &'static str, path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn metadata(what: &'static str, path: &Path, source: sled::Error) -> Error {
        Error::Metadata {
            what,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The message followed by each cause, `: `-separated (for a caller without `anyhow`).
    pub fn chain(&self) -> String {
        let mut s = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            s.push_str(": ");
            s.push_str(&c.to_string());
            cause = c.source();
        }
        s
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: `broker-node --data-dir /proc/nope` printed `cannot start the Raft member:
    /// cannot create the data dir: No such file or directory (os error 2): No such file or
    /// directory (os error 2)`: no path, and the cause twice, because the message embedded its
    /// source and `{:#}` appended it again. The message now names the path and leaves the cause
    /// to the chain.
    #[test]
    fn t01_a_start_error_names_its_path_and_prints_its_cause_once() {
        let cause = std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = Error::io("create the data dir", Path::new("/proc/nope"), cause);
        assert_eq!(e.to_string(), "cannot create the data dir /proc/nope");
        assert_eq!(
            e.chain(),
            "cannot create the data dir /proc/nope: entity not found"
        );
    }
}
