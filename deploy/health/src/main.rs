//! `raftmq-health`: one `grpc.health.v1.Health/Check` call against a raftmq server, or one
//! HTTP GET against the web console.
//!
//! The container image has no shell, so the compose health checks run this binary:
//!
//! ```text
//! raftmq-health [--addr HOST:PORT] [--service NAME] [--timeout-ms MS] [--tls-ca FILE]
//! raftmq-health --addr HOST:PORT --http PATH [--timeout-ms MS]
//! ```
//!
//! With `--tls-ca` (or the node's own `RAFTMQ_TLS_CA` in its environment) the check speaks TLS,
//! trusting that CA bundle; the health service needs no credentials.
//!
//! Exit status 0 when the server answers `SERVING` (with `--http`: status 200) within the
//! timeout; 1 otherwise, with a one-line reason on standard error. `--service` defaults to `""`,
//! the server's overall health.

use std::process::ExitCode;
use std::time::Duration;

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const USAGE: &str = "usage: raftmq-health [--addr HOST:PORT] [--service NAME] [--timeout-ms MS] [--tls-ca FILE]\n\
    \x20      raftmq-health --addr HOST:PORT --http PATH [--timeout-ms MS]\n\
    Checks grpc.health.v1 on a raftmq server (or GET PATH answers 200, for the web console);\n\
    exit 0 when SERVING, 1 otherwise.\n\
    Defaults: --addr 127.0.0.1:10911, --service \"\" (whole server), --timeout-ms 2000.";

#[derive(Debug, PartialEq, Eq)]
struct Args {
    addr: String,
    service: String,
    timeout: Duration,
    /// GET this path over HTTP/1.1 instead of the gRPC check.
    http: Option<String>,
    /// Speak TLS, trusting this CA bundle (PEM).
    tls_ca: Option<String>,
}

/// `Ok(None)` means `--help` was asked for.
fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut parsed = Args {
        addr: "127.0.0.1:10911".to_owned(),
        service: String::new(),
        timeout: Duration::from_millis(2_000),
        http: None,
        tls_ca: std::env::var("RAFTMQ_TLS_CA")
            .ok()
            .filter(|v| !v.is_empty()),
    };
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg, None),
        };
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--addr" => parsed.addr = value()?,
            "--service" => parsed.service = value()?,
            "--tls-ca" => parsed.tls_ca = Some(value()?),
            "--http" => {
                let path = value()?;
                if !path.starts_with('/') {
                    return Err(format!("--http {path:?} is not a path (it starts with /)"));
                }
                parsed.http = Some(path);
            }
            "--timeout-ms" => {
                let v = value()?;
                let ms: u64 = v
                    .parse()
                    .map_err(|_| format!("--timeout-ms {v:?} is not a number of milliseconds"))?;
                parsed.timeout = Duration::from_millis(ms.max(1));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(parsed))
}

/// `GET path` over HTTP/1.1: Ok when the status is 200.
async fn check_http(addr: &str, path: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| format!("cannot send to {addr}: {e}"))?;
    let mut head = [0u8; 64];
    let n = s
        .read(&mut head)
        .await
        .map_err(|e| format!("no answer from {addr}: {e}"))?;
    let status = String::from_utf8_lossy(&head[..n]);
    let line = status.lines().next().unwrap_or_default();
    if line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(format!("GET http://{addr}{path} answered {line:?}"))
    }
}

async fn check(args: &Args) -> Result<(), String> {
    if let Some(path) = &args.http {
        return check_http(&args.addr, path).await;
    }
    let scheme = if args.tls_ca.is_some() {
        "https"
    } else {
        "http"
    };
    let uri = if args.addr.contains("://") {
        args.addr.clone()
    } else {
        format!("{scheme}://{}", args.addr)
    };
    let mut endpoint = tonic::transport::Endpoint::from_shared(uri.clone())
        .map_err(|e| format!("bad address {:?}: {e}", args.addr))?;
    if let Some(ca) = &args.tls_ca {
        let pem = std::fs::read(ca).map_err(|e| format!("cannot read --tls-ca {ca}: {e}"))?;
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem));
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("TLS config: {}", chain(&e)))?;
    }
    let endpoint = endpoint.connect_timeout(args.timeout).timeout(args.timeout);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {uri}: {}", chain(&e)))?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: args.service.clone(),
        })
        .await
        .map_err(|s| {
            format!(
                "health check of {uri} failed: {}: {}",
                s.code(),
                s.message()
            )
        })?;
    let status = reply.into_inner().status();
    if status == ServingStatus::Serving {
        Ok(())
    } else {
        Err(format!(
            "{uri} service {:?} is {}",
            args.service,
            status.as_str_name()
        ))
    }
}

/// An error and its sources on one line ("transport error: dns error: ...").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("raftmq-health: {e}\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("raftmq-health: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The overall deadline covers name resolution too, which the endpoint timeouts do not.
    let outcome = runtime.block_on(async {
        tokio::time::timeout(args.timeout, check(&args))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no answer from {} within {:?}",
                    args.addr, args.timeout
                ))
            })
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("raftmq-health: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Option<Args>, String> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn defaults_and_flags() {
        let d = parse(&[]).unwrap().unwrap();
        assert_eq!(d.addr, "127.0.0.1:10911");
        assert_eq!(d.service, "");
        assert_eq!(d.timeout, Duration::from_secs(2));
        let a = parse(&[
            "--addr",
            "ns1:9876",
            "--service=raftmq.v1.X",
            "--timeout-ms",
            "500",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(a.addr, "ns1:9876");
        assert_eq!(a.service, "raftmq.v1.X");
        assert_eq!(a.timeout, Duration::from_millis(500));
        assert_eq!(a.http, None);
        let h = parse(&["--addr", "127.0.0.1:8080", "--http", "/api/cluster"])
            .unwrap()
            .unwrap();
        assert_eq!(h.http.as_deref(), Some("/api/cluster"));
    }

    #[test]
    fn errors_and_help() {
        assert!(parse(&["--help"]).unwrap().is_none());
        assert!(parse(&["--addr"]).is_err());
        assert!(parse(&["--timeout-ms", "soon"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--http", "api/cluster"]).is_err());
    }
}
