//! Configuration: defaults, a TOML file, environment variables and flags.
//!
//! Precedence, highest first: command-line flag, environment variable, `--config` file, default.
//! Every key of the file is also a flag (`expiry_secs` → `--expiry-secs`) and an environment
//! variable (`RAFTMQ_NS_EXPIRY_SECS`). `deploy/config/nameserver.toml` documents each key.
//! [`Config::validate`] refuses a bad value with an [`Error::Config`] naming the key, and start-up
//! stops there.
//!
//! Two keys are exceptions: `users` lives in the file only (a list of tables), and
//! `admin_secret_key` is best given by its environment variable or the file, since a flag shows in
//! the process list. No secret is ever printed: [`Secret`]'s `{:?}` is `<hidden>`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use raftmq_security::acl::{self, AclError};
use raftmq_security::tls::TlsFiles;
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
/// Default milliseconds between looks at the TLS files (`tls_reload_ms`).
pub const TLS_RELOAD_MS_DEFAULT: u64 = 5_000;
/// Lower bound of `tls_reload_ms`: each look reads the files' metadata.
pub const TLS_RELOAD_MS_MIN: u64 = 100;
/// Default access key of the admin (`admin_access_key`).
pub const ADMIN_ACCESS_KEY_DEFAULT: &str = "admin";
/// Default window, either side of the nameserver's clock, in which a signature's date is taken
/// (`signature_window_secs`): the RocketMQ clients' 15 minutes, as the broker nodes use.
pub const SIGNATURE_WINDOW_SECS_DEFAULT: u64 = raftmq_security::sign::WINDOW_SECS_DEFAULT;
/// Lower bound of `signature_window_secs`.
pub const SIGNATURE_WINDOW_SECS_MIN: u64 = 1;
/// Upper bound of `signature_window_secs`: a captured signature works for the whole window.
pub const SIGNATURE_WINDOW_SECS_MAX: u64 = 3_600;

// The default scan must run several times per expiry period, or expiry would lag by a whole scan.
const _: () = assert!(SCAN_INTERVAL_MS_DEFAULT * 4 <= EXPIRY_SECS_DEFAULT * 1_000);
const _: () =
    assert!(EXPIRY_SECS_MIN <= EXPIRY_SECS_DEFAULT && EXPIRY_SECS_DEFAULT <= EXPIRY_SECS_MAX);
const _: () = assert!(TLS_RELOAD_MS_MIN <= TLS_RELOAD_MS_DEFAULT);
const _: () = assert!(
    SIGNATURE_WINDOW_SECS_MIN <= SIGNATURE_WINDOW_SECS_DEFAULT
        && SIGNATURE_WINDOW_SECS_DEFAULT <= SIGNATURE_WINDOW_SECS_MAX
);

/// A secret key from the configuration. `{:?}` prints `<hidden>`, so neither [`Config`] nor
/// [`Args`] can leak it into a log line; [`Secret::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Secret(secret.into())
    }

    /// The secret itself, to check a signature with.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

/// Lets clap parse `--admin-secret-key` straight into a [`Secret`].
impl From<String> for Secret {
    fn from(secret: String) -> Self {
        Secret(secret)
    }
}

/// A user who may read routes and cluster info (`[[users]]` in the file): signs its requests with
/// `access_key` and `secret_key`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    /// The access key the user signs with.
    pub access_key: String,
    /// The user's secret key.
    pub secret_key: Secret,
}

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
    /// CA bundle (PEM) trusted for client certificates; with `tls_cert` and `tls_key`, the port
    /// serves TLS only.
    pub tls_ca: Option<PathBuf>,
    /// The nameserver's certificate chain (PEM).
    pub tls_cert: Option<PathBuf>,
    /// The nameserver's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Certificate revocation lists (PEM; `raftmq cert revoke` writes one): a client certificate
    /// they list is refused, so a revoked node can no longer register. Needs TLS on.
    pub tls_crl: Option<PathBuf>,
    /// Milliseconds between looks at the TLS files; a changed file is loaded for new connections.
    pub tls_reload_ms: u64,
    /// Refuses NameserverService calls that are not signed or made with a node certificate.
    pub auth: bool,
    /// The admin's access key: may register and unregister nodes and read everything.
    pub admin_access_key: String,
    /// The admin's secret key; required with `auth` on.
    pub admin_secret_key: Option<Secret>,
    /// Seconds either side of the nameserver's clock in which a signature's date is taken.
    pub signature_window_secs: u64,
    /// Users who may read routes and cluster info (file only).
    pub users: Vec<User>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([0, 0, 0, 0], 9876)),
            expiry_secs: EXPIRY_SECS_DEFAULT,
            scan_interval_ms: SCAN_INTERVAL_MS_DEFAULT,
            log_json: false,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_crl: None,
            tls_reload_ms: TLS_RELOAD_MS_DEFAULT,
            auth: false,
            admin_access_key: ADMIN_ACCESS_KEY_DEFAULT.to_string(),
            admin_secret_key: None,
            signature_window_secs: SIGNATURE_WINDOW_SECS_DEFAULT,
            users: Vec::new(),
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
        self.validate_tls()?;
        self.validate_auth()
    }

    fn validate_tls(&self) -> Result<(), Error> {
        let given = [
            ("tls_ca", self.tls_ca.is_some()),
            ("tls_cert", self.tls_cert.is_some()),
            ("tls_key", self.tls_key.is_some()),
        ];
        if given.iter().any(|&(_, set)| set)
            && let Some(&(key, _)) = given.iter().find(|&&(_, set)| !set)
        {
            return Err(Error::Config {
                key,
                reason: "is missing: tls_ca, tls_cert and tls_key are given together (or none)"
                    .into(),
            });
        }
        if self.tls_crl.is_some() && self.tls_ca.is_none() {
            return Err(Error::Config {
                key: "tls_crl",
                reason: "needs TLS on (tls_ca, tls_cert and tls_key)".into(),
            });
        }
        if self.tls_reload_ms < TLS_RELOAD_MS_MIN {
            return Err(Error::Config {
                key: "tls_reload_ms",
                reason: format!(
                    "{} is too small; expected at least {TLS_RELOAD_MS_MIN} ms",
                    self.tls_reload_ms
                ),
            });
        }
        Ok(())
    }

    fn validate_auth(&self) -> Result<(), Error> {
        match &self.admin_secret_key {
            None if self.auth => {
                return Err(Error::Config {
                    key: "admin_secret_key",
                    reason: "is required with auth on (8 to 256 characters)".into(),
                });
            }
            None => {}
            Some(secret) => match acl::validate_user(&self.admin_access_key, secret.expose()) {
                Ok(()) => {}
                Err(e @ AclError::AccessKey) => {
                    return Err(Error::Config {
                        key: "admin_access_key",
                        reason: format!("{:?}: {e}", self.admin_access_key),
                    });
                }
                // The reason describes the rule, never the secret's text.
                Err(e) => {
                    return Err(Error::Config {
                        key: "admin_secret_key",
                        reason: e.to_string(),
                    });
                }
            },
        }
        if !(SIGNATURE_WINDOW_SECS_MIN..=SIGNATURE_WINDOW_SECS_MAX)
            .contains(&self.signature_window_secs)
        {
            return Err(Error::Config {
                key: "signature_window_secs",
                reason: format!(
                    "{} is out of range; expected {SIGNATURE_WINDOW_SECS_MIN} to \
                     {SIGNATURE_WINDOW_SECS_MAX} seconds",
                    self.signature_window_secs
                ),
            });
        }
        let mut seen = HashSet::new();
        for (i, user) in self.users.iter().enumerate() {
            let refused = |reason: String| Error::Config {
                key: "users",
                reason: format!("users[{i}] (access key {:?}) {reason}", user.access_key),
            };
            acl::validate_user(&user.access_key, user.secret_key.expose())
                .map_err(|e| refused(format!("is refused: {e}")))?;
            if user.access_key == self.admin_access_key {
                return Err(refused("is the admin's access key".into()));
            }
            if !seen.insert(user.access_key.as_str()) {
                return Err(refused("appears twice".into()));
            }
        }
        Ok(())
    }

    /// The TLS files, when all three are configured.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        let (Some(ca), Some(cert), Some(key)) = (&self.tls_ca, &self.tls_cert, &self.tls_key)
        else {
            return None;
        };
        Some(TlsFiles {
            ca: ca.clone(),
            cert: Some(cert.clone()),
            key: Some(key.clone()),
            crl: self.tls_crl.clone(),
        })
    }

    /// [`Config::tls_reload_ms`] as a duration.
    pub fn tls_reload(&self) -> Duration {
        Duration::from_millis(self.tls_reload_ms)
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
            tls_ca: args.tls_ca.clone(),
            tls_cert: args.tls_cert.clone(),
            tls_key: args.tls_key.clone(),
            tls_crl: args.tls_crl.clone(),
            tls_reload_ms: args.tls_reload_ms,
            auth: args.auth,
            admin_access_key: args.admin_access_key.clone(),
            admin_secret_key: args.admin_secret_key.clone(),
            signature_window_secs: args.signature_window_secs,
            // File only: a list of secrets has no place on a command line.
            users: None,
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
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_crl: Option<PathBuf>,
    tls_reload_ms: Option<u64>,
    auth: Option<bool>,
    admin_access_key: Option<String>,
    admin_secret_key: Option<Secret>,
    signature_window_secs: Option<u64>,
    users: Option<Vec<User>>,
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
        if let Some(v) = self.tls_ca {
            config.tls_ca = Some(v);
        }
        if let Some(v) = self.tls_cert {
            config.tls_cert = Some(v);
        }
        if let Some(v) = self.tls_key {
            config.tls_key = Some(v);
        }
        if let Some(v) = self.tls_crl {
            config.tls_crl = Some(v);
        }
        if let Some(v) = self.tls_reload_ms {
            config.tls_reload_ms = v;
        }
        if let Some(v) = self.auth {
            config.auth = v;
        }
        if let Some(v) = self.admin_access_key {
            config.admin_access_key = v;
        }
        if let Some(v) = self.admin_secret_key {
            config.admin_secret_key = Some(v);
        }
        if let Some(v) = self.signature_window_secs {
            config.signature_window_secs = v;
        }
        if let Some(v) = self.users {
            config.users = v;
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
    /// CA bundle (PEM) trusted for client certificates; with --tls-cert and --tls-key, TLS on.
    #[arg(long, env = "RAFTMQ_NS_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// The nameserver's certificate chain (PEM).
    #[arg(long, env = "RAFTMQ_NS_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The nameserver's private key (PEM).
    #[arg(long, env = "RAFTMQ_NS_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Certificate revocation lists (PEM): client certificates they list are refused.
    #[arg(long, env = "RAFTMQ_NS_TLS_CRL", value_name = "FILE")]
    pub tls_crl: Option<PathBuf>,
    /// Milliseconds between looks at the TLS files [default: 5000].
    #[arg(long, env = "RAFTMQ_NS_TLS_RELOAD_MS", value_name = "MS")]
    pub tls_reload_ms: Option<u64>,
    /// Refuse calls that are not signed or made with a node certificate (`--auth` or
    /// `--auth=false`) [default: false].
    #[arg(
        long,
        env = "RAFTMQ_NS_AUTH",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub auth: Option<bool>,
    /// The admin's access key [default: admin].
    #[arg(long, env = "RAFTMQ_NS_ADMIN_ACCESS_KEY", value_name = "KEY")]
    pub admin_access_key: Option<String>,
    /// The admin's secret key (prefer the environment variable: a flag shows in the process list).
    #[arg(
        long,
        env = "RAFTMQ_NS_ADMIN_SECRET_KEY",
        value_name = "SECRET",
        hide_env_values = true
    )]
    pub admin_secret_key: Option<Secret>,
    /// Seconds either side of the server's clock in which a signature is taken [default: 900].
    #[arg(long, env = "RAFTMQ_NS_SIGNATURE_WINDOW_SECS", value_name = "SECS")]
    pub signature_window_secs: Option<u64>,
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
    fn t01_defaults_are_valid() {
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
    fn t02_validate_names_the_key() {
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
    fn t03_file_then_flags() {
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
    fn t04_bad_files_are_refused_with_the_key() {
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
    fn t05_template_parses_to_the_defaults() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/config/nameserver.toml");
        assert_eq!(Config::from_file(&path).unwrap(), Config::default());
    }

    fn authed() -> Config {
        Config {
            auth: true,
            admin_secret_key: Some(Secret::new("admin-secret-1")),
            ..Config::default()
        }
    }

    fn user(access_key: &str, secret: &str) -> User {
        User {
            access_key: access_key.into(),
            secret_key: Secret::new(secret),
        }
    }

    #[test]
    fn t06_tls_files_come_together_and_reload_has_a_floor() {
        let tls = |ca: bool, cert: bool, key: bool| Config {
            tls_ca: ca.then(|| "ca.pem".into()),
            tls_cert: cert.then(|| "ns.pem".into()),
            tls_key: key.then(|| "ns.key".into()),
            ..Config::default()
        };
        let all = tls(true, true, true);
        all.validate().unwrap();
        let files = all.tls_files().expect("all three given");
        assert_eq!(files.ca, Path::new("ca.pem"));
        assert_eq!(files.key.as_deref(), Some(Path::new("ns.key")));
        assert_eq!(tls(false, false, false).tls_files(), None);
        // Some but not all: the error names the first one missing.
        for (bad, missing) in [
            (tls(false, true, true), "tls_ca"),
            (tls(true, false, true), "tls_cert"),
            (tls(true, true, false), "tls_key"),
            (tls(false, false, true), "tls_ca"),
        ] {
            let e = bad.validate().unwrap_err();
            assert!(e.to_string().contains("given together"), "{e}");
            assert_eq!(key_of(e), missing);
        }
        let hasty = Config {
            tls_reload_ms: TLS_RELOAD_MS_MIN - 1,
            ..all.clone()
        };
        assert_eq!(key_of(hasty.validate().unwrap_err()), "tls_reload_ms");
        assert_eq!(all.tls_reload(), Duration::from_millis(5_000));
    }

    #[test]
    fn t07_auth_needs_a_valid_admin_secret_and_window() {
        authed().validate().unwrap();
        let bad = |c: Config| key_of(c.validate().unwrap_err());
        assert_eq!(
            bad(Config {
                admin_secret_key: None,
                ..authed()
            }),
            "admin_secret_key"
        );
        for secret in ["short", &"x".repeat(257), "tab\tinside"] {
            let e = Config {
                admin_secret_key: Some(Secret::new(secret)),
                ..authed()
            }
            .validate()
            .unwrap_err();
            // The refusal names the key and never shows the secret.
            assert!(!e.to_string().contains(secret), "{e}");
            assert_eq!(key_of(e), "admin_secret_key");
        }
        // 8 and 256 characters are the bounds.
        for secret in ["12345678".to_string(), "y".repeat(256)] {
            Config {
                admin_secret_key: Some(Secret::new(secret)),
                ..authed()
            }
            .validate()
            .unwrap();
        }
        assert_eq!(
            bad(Config {
                admin_access_key: "no spaces".into(),
                ..authed()
            }),
            "admin_access_key"
        );
        for window in [0, SIGNATURE_WINDOW_SECS_MAX + 1] {
            assert_eq!(
                bad(Config {
                    signature_window_secs: window,
                    ..authed()
                }),
                "signature_window_secs"
            );
        }
        // Auth off: no secret needed, but one given must still be valid.
        Config::default().validate().unwrap();
        assert_eq!(
            bad(Config {
                admin_secret_key: Some(Secret::new("short")),
                ..Config::default()
            }),
            "admin_secret_key"
        );
    }

    #[test]
    fn t08_users_come_from_the_file_and_each_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.toml");
        std::fs::write(
            &path,
            "auth = true\nadmin_secret_key = \"admin-secret-1\"\n\
             [[users]]\naccess_key = \"app-orders\"\nsecret_key = \"orders-secret\"\n\
             [[users]]\naccess_key = \"app-pay\"\nsecret_key = \"pay-secret-1\"\n",
        )
        .unwrap();
        let c = Config::load(&Args {
            config: Some(path.clone()),
            ..Args::default()
        })
        .unwrap();
        assert_eq!(
            c.users,
            [
                user("app-orders", "orders-secret"),
                user("app-pay", "pay-secret-1")
            ]
        );
        assert_eq!(c.admin_secret_key, Some(Secret::new("admin-secret-1")));

        // A table with an unknown field is refused by the parser, naming it.
        std::fs::write(
            &path,
            "[[users]]\naccess_key = \"a\"\nsecret = \"orders-secret\"\n",
        )
        .unwrap();
        let printed = as_printed(Config::from_file(&path).unwrap_err());
        assert!(printed.contains("secret"), "{printed}");

        let with = |users: Vec<User>| Config { users, ..authed() };
        with(vec![user("a", "12345678"), user("b", "12345678")])
            .validate()
            .unwrap();
        for (users, why) in [
            (
                vec![user("a", "short")],
                "users[0] (access key \"a\") is refused",
            ),
            (vec![user("", "12345678")], "users[0]"),
            (
                vec![user("a", "12345678"), user("a b", "12345678")],
                "users[1]",
            ),
            (vec![user("admin", "12345678")], "the admin's access key"),
            (
                vec![user("a", "12345678"), user("a", "87654321")],
                "appears twice",
            ),
        ] {
            let e = with(users).validate().unwrap_err();
            let text = e.to_string();
            assert!(text.contains(why), "{text} should say {why:?}");
            assert!(
                !text.contains("12345678") && !text.contains("short"),
                "{text}"
            );
            assert_eq!(key_of(e), "users");
        }
    }

    #[test]
    fn t09_flags_set_the_new_keys_and_secrets_never_print() {
        let cli = Cli::try_parse_from([
            "ns",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "ns.pem",
            "--tls-key",
            "ns.key",
            "--tls-reload-ms",
            "250",
            "--auth",
            "--admin-access-key",
            "root",
            "--admin-secret-key",
            "s3cret-s3cret",
            "--signature-window-secs",
            "60",
        ])
        .unwrap();
        assert!(!format!("{:?}", cli.args).contains("s3cret"));
        let c = Config::load(&cli.args).unwrap();
        assert_eq!(c.tls_files().unwrap().ca, Path::new("ca.pem"));
        assert_eq!(
            (
                c.tls_reload_ms,
                c.auth,
                c.admin_access_key.as_str(),
                c.signature_window_secs
            ),
            (250, true, "root", 60)
        );
        assert_eq!(
            c.admin_secret_key.as_ref().map(Secret::expose),
            Some("s3cret-s3cret")
        );
        let c = Config {
            users: vec![user("reader", "reader-s3cret")],
            ..c
        };
        let debug = format!("{c:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
        assert!(
            debug.contains("<hidden>") && debug.contains("reader"),
            "{debug}"
        );

        let cli = Cli::try_parse_from(["ns", "--auth=false"]).unwrap();
        assert_eq!(cli.args.auth, Some(false));
        // Auth from a flag without a secret anywhere: refused, naming the key.
        let cli = Cli::try_parse_from(["ns", "--auth"]).unwrap();
        assert_eq!(
            key_of(Config::load(&cli.args).unwrap_err()),
            "admin_secret_key"
        );
    }

    #[test]
    fn t10_the_templates_commented_keys_are_valid() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/config/nameserver.toml");
        let template = std::fs::read_to_string(path).unwrap();
        // Uncomment every example `# key = value` and `# [[users]]` line, turn auth on.
        let text: String = template
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest)
                    if rest.starts_with("[[")
                        || rest
                            .split_once(" = ")
                            .is_some_and(|(k, _)| !k.contains(' ')) =>
                {
                    rest.to_string()
                }
                _ if l == "auth = false" => "auth = true".into(),
                _ => l.to_string(),
            })
            .map(|l| l + "\n")
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ns.toml");
        std::fs::write(&path, &text).unwrap();
        let c = Config::from_file(&path).unwrap();
        c.validate().unwrap();
        assert!(c.auth && c.tls_files().is_some(), "{text}");
        assert_eq!(c.users.len(), 1, "{text}");
    }
}
