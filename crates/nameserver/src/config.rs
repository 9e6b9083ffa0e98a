//! Configuration: defaults, a TOML file, environment variables and flags.
//!
//! Precedence, highest first: command-line flag, environment variable, `--config` file, default.
//! Every key of the file is also a flag (`expiry_secs` → `--expiry-secs`) and an environment
//! variable (`RAFTMQ_NS_EXPIRY_SECS`). `deploy/config/nameserver.toml` documents each key.
//! [`Config::validate`] refuses a bad value with an [`Error::Config`] naming the key, and start-up
//! stops there.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::Error;

/// Default gRPC/HTTP listen address (`listen`).
pub const LISTEN_DEFAULT: &str = "0.0.0.0:9876";
/// Default seconds before a silent node expires (`expiry_secs`).
pub const EXPIRY_SECS_DEFAULT: u64 = 120;
/// Default milliseconds between expiry scans (`scan_interval_ms`).
pub const SCAN_INTERVAL_MS_DEFAULT: u64 = 5_000;
/// Bounds of `expiry_secs`: at least one second, at most a day.
pub const EXPIRY_SECS_MIN: u64 = 1;
/// Upper bound of `expiry_secs`.
pub const EXPIRY_SECS_MAX: u64 = 86_400;
/// Lower bound of `scan_interval_ms`; a tighter loop only burns CPU.
pub const SCAN_INTERVAL_MS_MIN: u64 = 10;

// The default scan must run several times per expiry period, or expiry would lag by a whole scan.
const _: () = assert!(SCAN_INTERVAL_MS_DEFAULT * 4 <= EXPIRY_SECS_DEFAULT * 1_000);
const _: () =
    assert!(EXPIRY_SECS_MIN <= EXPIRY_SECS_DEFAULT && EXPIRY_SECS_DEFAULT <= EXPIRY_SECS_MAX);

/// The nameserver's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Address the gRPC services and `/metrics` are served on (one port).
    pub listen: SocketAddr,
    /// Seconds after which a node that has not re-registered is dropped from routes.
    pub expiry_secs: u64,
    /// Milliseconds between expiry scans.
    pub scan_interval_ms: u64,
    /// Logs as JSON lines instead of human-readable text.
    pub log_json: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 9876)),
            expiry_secs: EXPIRY_SECS_DEFAULT,
            scan_interval_ms: SCAN_INTERVAL_MS_DEFAULT,
            log_json: false,
        }
    }
}

impl Config {
    /// Checks every key; the error names the first bad one.
    pub fn validate(&self) -> Result<(), Error> {
        if !(EXPIRY_SECS_MIN..=EXPIRY_SECS_MAX).contains(&self.expiry_secs) {
            return Err(Error::Config {
                key: "expiry_secs",
                reason: format!(
                    "{} is out of range; expected {EXPIRY_SECS_MIN} to {EXPIRY_SECS_MAX} seconds",
                    self.expiry_secs
                ),
            });
        }
        if self.scan_interval_ms < SCAN_INTERVAL_MS_MIN {
            return Err(Error::Config {
                key: "scan_interval_ms",
                reason: format!(
                    "{} is too small; expected at least {SCAN_INTERVAL_MS_MIN} ms",
                    self.scan_interval_ms
                ),
            });
        }
        if self.scan_interval_ms > self.expiry_secs.saturating_mul(1_000) {
            return Err(Error::Config {
                key: "scan_interval_ms",
                reason: format!(
                    "{} ms is longer than expiry_secs ({} s); silent nodes would linger a whole scan",
                    self.scan_interval_ms, self.expiry_secs
                ),
            });
        }
        Ok(())
    }

    /// [`Config::expiry_secs`] as a duration.
    pub fn expiry(&self) -> Duration {
        Duration::from_secs(self.expiry_secs)
    }

    /// [`Config::scan_interval_ms`] as a duration.
    pub fn scan_interval(&self) -> Duration {
        Duration::from_millis(self.scan_interval_ms)
    }

    /// Reads a TOML file: every key optional, unknown keys refused.
    pub fn from_file(path: &Path) -> Result<Config, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ConfigRead {
            path: path.to_owned(),
            source,
        })?;
        let file: FileConfig = toml::from_str(&text).map_err(|source| Error::ConfigParse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let mut config = Config::default();
        file.apply(&mut config)?;
        Ok(config)
    }

    /// Builds the configuration from flags/environment (`args`), the file they name, and defaults,
    /// then validates it.
    pub fn load(args: &Args) -> Result<Config, Error> {
        let mut config = match &args.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        FileConfig {
            listen: args.listen.clone(),
            expiry_secs: args.expiry_secs,
            scan_interval_ms: args.scan_interval_ms,
            log_json: args.log_json,
        }
        .apply(&mut config)?;
        config.validate()?;
        Ok(config)
    }
}

/// The file's shape: every key optional so a file may set only what it changes.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    expiry_secs: Option<u64>,
    scan_interval_ms: Option<u64>,
    log_json: Option<bool>,
}

impl FileConfig {
    fn apply(self, config: &mut Config) -> Result<(), Error> {
        if let Some(listen) = self.listen {
            config.listen = parse_listen(&listen)?;
        }
        if let Some(v) = self.expiry_secs {
            config.expiry_secs = v;
        }
        if let Some(v) = self.scan_interval_ms {
            config.scan_interval_ms = v;
        }
        if let Some(v) = self.log_json {
            config.log_json = v;
        }
        Ok(())
    }
}

fn parse_listen(s: &str) -> Result<SocketAddr, Error> {
    s.trim().parse().map_err(|_| Error::Config {
        key: "listen",
        reason: format!(
            "{s:?} is not an IP socket address; expected e.g. {LISTEN_DEFAULT} or 127.0.0.1:0"
        ),
    })
}

/// Command-line flags of the nameserver, each with an environment variable. `None` means "not
/// given": the file's value, then the default, applies.
///
/// Derives [`clap::Args`] so the `raftmq` binary can flatten it into a subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    /// TOML configuration file (see deploy/config/nameserver.toml).
    #[arg(long, env = "RAFTMQ_NS_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to serve gRPC and /metrics on [default: 0.0.0.0:9876].
    #[arg(long, env = "RAFTMQ_NS_LISTEN", value_name = "IP:PORT")]
    pub listen: Option<String>,
    /// Seconds after which a node that has not re-registered expires [default: 120].
    #[arg(long, env = "RAFTMQ_NS_EXPIRY_SECS", value_name = "SECS")]
    pub expiry_secs: Option<u64>,
    /// Milliseconds between expiry scans [default: 5000].
    #[arg(long, env = "RAFTMQ_NS_SCAN_INTERVAL_MS", value_name = "MS")]
    pub scan_interval_ms: Option<u64>,
    /// Log JSON lines instead of text (`--log-json` or `--log-json=false`) [default: false].
    #[arg(
        long,
        env = "RAFTMQ_NS_LOG_JSON",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub log_json: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// The error as the binary prints it: its message, then each cause once (`{:#}`).
    fn as_printed(e: Error) -> String {
        format!("{:#}", anyhow::Error::new(e))
    }

    fn key_of(e: Error) -> &'static str {
        match e {
            Error::Config { key, .. } => key,
            other => panic!("expected a config error, got {other}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::default();
        c.validate().unwrap();
        assert_eq!(c.listen.to_string(), LISTEN_DEFAULT);
        assert_eq!(
            (c.expiry_secs, c.scan_interval_ms, c.log_json),
            (120, 5000, false)
        );
        assert_eq!(Config::load(&Args::default()).unwrap(), c);
    }

    #[test]
    fn validate_names_the_key() {
        let bad = Config {
            expiry_secs: 0,
            ..Config::default()
        };
        assert_eq!(key_of(bad.validate().unwrap_err()), "expiry_secs");
        let bad = Config {
            scan_interval_ms: 1,
            ..Config::default()
        };
        assert_eq!(key_of(bad.validate().unwrap_err()), "scan_interval_ms");
        let bad = Config {
            expiry_secs: 2,
            scan_interval_ms: 5_000,
            ..Config::default()
        };
        let e = bad.validate().unwrap_err();
        assert!(e.to_string().contains("scan_interval_ms"), "{e}");
    }

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:7000\"\nexpiry_secs = 30\nlog_json = true\n",
        )
        .unwrap();
        let from_file = Config::from_file(&path).unwrap();
        assert_eq!(from_file.listen.to_string(), "127.0.0.1:7000");
        assert_eq!(
            (
                from_file.expiry_secs,
                from_file.scan_interval_ms,
                from_file.log_json
            ),
            (30, 5000, true)
        );

        // A flag beats the file; keys not given keep the file's value.
        let p = path.to_str().unwrap();
        let cli = Cli::try_parse_from([
            "ns",
            "--config",
            p,
            "--expiry-secs",
            "60",
            "--log-json=false",
        ])
        .unwrap();
        let c = Config::load(&cli.args).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:7000");
        assert_eq!((c.expiry_secs, c.log_json), (60, false));

        let cli = Cli::try_parse_from(["ns", "--log-json", "--listen", "127.0.0.1:0"]).unwrap();
        let c = Config::load(&cli.args).unwrap();
        assert!(c.log_json);
        assert_eq!(c.listen.port(), 0);
    }

    #[test]
    fn bad_files_are_refused_with_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.toml");
        std::fs::write(&path, "listen = \"nowhere\"\n").unwrap();
        assert_eq!(key_of(Config::from_file(&path).unwrap_err()), "listen");

        std::fs::write(&path, "expiry_sec = 3\n").unwrap();
        let e = Config::from_file(&path).unwrap_err();
        assert!(matches!(e, Error::ConfigParse { .. }), "{e}");
        let printed = as_printed(e);
        assert!(printed.contains("expiry_sec"), "{printed}");

        std::fs::write(&path, "expiry_secs = \"soon\"\n").unwrap();
        let printed = as_printed(Config::from_file(&path).unwrap_err());
        assert!(printed.contains("expiry_secs"), "{printed}");

        std::fs::write(&path, "expiry_secs = 0\n").unwrap();
        let args = Args {
            config: Some(path.clone()),
            ..Args::default()
        };
        assert_eq!(key_of(Config::load(&args).unwrap_err()), "expiry_secs");

        let missing = Args {
            config: Some(dir.path().join("absent.toml")),
            ..Args::default()
        };
        assert!(matches!(
            Config::load(&missing),
            Err(Error::ConfigRead { .. })
        ));
    }

    #[test]
    fn template_parses_to_the_defaults() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/config/nameserver.toml");
        assert_eq!(Config::from_file(&path).unwrap(), Config::default());
    }
}
