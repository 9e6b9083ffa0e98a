//! `raftmq cert init`: development certificates for a cluster with TLS on; `raftmq cert revoke`:
//! a certificate added to the CA's revocation list (`crl.pem`).
//!
//! Writes into `--dir` a CA (`ca.pem`, `ca.key`; kept and reused when the directory has one, so
//! certificates issued again chain to the CA nodes and clients already trust), a certificate per
//! node of each `--group` (`<group>-<id>.pem/.key`, naming the node's identity
//! `raftmq://<cluster>/<group>/<id>` and serving every `--host` plus its own name
//! `<group>-<id>`), the nameserver's (`nameserver.pem/.key`) and a client's (`client.pem/.key`).
//!
//! Prints each file written, one per line as `--dir` was given, then how to use them; with
//! `--json` one object instead (see [`written_json`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use raftmq_security::certgen::{self, Plan};
use serde_json::{Value, json};

use crate::args::{CertCmd, CertInitArgs};
use crate::output::json_line;

/// The broker groups when no `--group` is given.
const DEFAULT_GROUP: (&str, [u64; 3]) = ("broker-a", [1, 2, 3]);
/// The hosts when no `--host` is given.
const DEFAULT_HOSTS: [&str; 2] = ["localhost", "127.0.0.1"];

pub fn run(json: bool, cmd: CertCmd) -> Result<()> {
    match cmd {
        CertCmd::Init(args) => {
            let w = init(&args)?;
            if json {
                println!("{}", json_line(&written_json(&w)));
            } else {
                print!("{}", written_text(&w));
            }
            Ok(())
        }
        CertCmd::Revoke { dir, cert } => {
            let r = certgen::revoke(&dir, &cert)
                .with_context(|| format!("revoking {}", cert.display()))?;
            if json {
                println!("{}", json_line(&revoked_json(&r, &cert)));
            } else {
                print!("{}", revoked_text(&r, &cert));
            }
            Ok(())
        }
    }
}

/// What `cert revoke` did, and how the list takes effect.
pub fn revoked_text(r: &certgen::Revoked, cert: &Path) -> String {
    let crl = r.crl.display();
    let mut out = if r.newly {
        format!(
            "revoked {} (serial {}): {crl} now lists {} certificate(s)\n",
            cert.display(),
            r.serial,
            r.listed
        )
    } else {
        format!(
            "{} (serial {}) was revoked already: {crl} lists {} certificate(s)\n",
            cert.display(),
            r.serial,
            r.listed
        )
    };
    out.push_str(&format!(
        "nodes and nameservers with tls_crl = \"{crl}\" (or a copy of it) refuse it within their \
         tls_reload_ms; remove a revoked node from its group with `raftmq node remove`\n"
    ));
    out
}

/// `cert revoke --json`: `{"cert", "serial", "newly", "listed", "crl"}`.
pub fn revoked_json(r: &certgen::Revoked, cert: &Path) -> Value {
    json!({
        "cert": cert.display().to_string(),
        "serial": r.serial,
        "newly": r.newly,
        "listed": r.listed,
        "crl": r.crl.display().to_string(),
    })
}

/// What `cert init` did.
#[derive(Debug, Clone)]
pub struct Written {
    pub dir: PathBuf,
    pub plan: Plan,
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
    /// The directory had a CA, which issued the new certificates.
    pub ca_reused: bool,
}

/// The plan the flags ask for, checked.
pub fn plan(args: &CertInitArgs) -> Result<Plan> {
    raftmq_client::admin::check_name("cluster", &args.cluster)
        .map_err(|e| anyhow::anyhow!("--cluster {:?}: {e}", args.cluster))?;
    let groups = if args.groups.is_empty() {
        vec![(DEFAULT_GROUP.0.to_string(), DEFAULT_GROUP.1.to_vec())]
    } else {
        args.groups.clone()
    };
    for (i, (name, _)) in groups.iter().enumerate() {
        if groups[..i].iter().any(|(n, _)| n == name) {
            bail!("--group {name} is given twice: give each broker group once with all its ids");
        }
    }
    let mut hosts: Vec<String> = Vec::new();
    for h in &args.hosts {
        let h = h.trim();
        if h.is_empty() {
            bail!("--host is empty: give a host name or an IP address");
        }
        if !hosts.iter().any(|x| x == h) {
            hosts.push(h.to_string());
        }
    }
    if hosts.is_empty() {
        hosts = DEFAULT_HOSTS.iter().map(|h| h.to_string()).collect();
    }
    Ok(Plan {
        cluster: args.cluster.clone(),
        groups,
        hosts,
        per_node_hosts: true,
    })
}

/// Writes the certificates.
pub fn init(args: &CertInitArgs) -> Result<Written> {
    let plan = plan(args)?;
    // Half a CA would be replaced by a new one, and whatever trusts the old one would stop
    // trusting every certificate issued from now on: refuse instead.
    let (ca, ca_key) = (args.dir.join("ca.pem"), args.dir.join("ca.key"));
    if ca.exists() != ca_key.exists() {
        let (has, lacks) = if ca.exists() {
            (&ca, &ca_key)
        } else {
            (&ca_key, &ca)
        };
        bail!(
            "{} is there but {} is not: restore it, or move {} away to make a new CA",
            has.display(),
            lacks.display(),
            has.display()
        );
    }
    let files = certgen::init(&args.dir, &plan)
        .with_context(|| format!("writing certificates into {}", args.dir.display()))?;
    let ca_reused = !files.contains(&args.dir.join("ca.pem"));
    Ok(Written {
        dir: args.dir.clone(),
        plan,
        files,
        ca_reused,
    })
}

fn file(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// The files, one per line, then where the CA came from and how to use the files.
pub fn written_text(w: &Written) -> String {
    let mut out = String::new();
    for f in &w.files {
        out.push_str(&format!("{}\n", f.display()));
    }
    let (ca, ca_key) = (file(&w.dir, "ca.pem"), file(&w.dir, "ca.key"));
    out.push('\n');
    if w.ca_reused {
        out.push_str(&format!(
            "reused the CA already in {ca} (key {ca_key}): the new certificates chain to it, so \
             whatever trusts it needs no change\n"
        ));
    } else {
        out.push_str(&format!(
            "new CA in {ca}; keep {ca_key} private (running this again reuses it)\n"
        ));
    }
    out.push_str(&format!(
        "node and nameserver certificates serve {} (and each node its own name <group>-<id>)\n",
        w.plan.hosts.join(", ")
    ));
    out.push_str("\nto use them:\n");
    if let Some((broker, ids)) = w.plan.groups.first()
        && let Some(id) = ids.first()
    {
        let name = format!("{broker}-{id}");
        out.push_str(&format!(
            "  node {name} config:  tls_ca = \"{ca}\"  tls_cert = \"{}\"  tls_key = \"{}\"\n",
            file(&w.dir, &format!("{name}.pem")),
            file(&w.dir, &format!("{name}.key")),
        ));
        out.push_str("    (every node its own <group>-<id>.pem and .key)\n");
    }
    out.push_str(&format!(
        "  nameserver:  tls_ca = \"{ca}\"  tls_cert = \"{}\"  tls_key = \"{}\"\n",
        file(&w.dir, "nameserver.pem"),
        file(&w.dir, "nameserver.key"),
    ));
    out.push_str(&format!(
        "  clients:  raftmq --tls-ca {ca} cluster status   (or RAFTMQ_TLS_CA={ca}; a client \
         certificate: --tls-cert {} --tls-key {})\n",
        file(&w.dir, "client.pem"),
        file(&w.dir, "client.key"),
    ));
    out
}

/// `cert init --json`: `{"dir", "cluster", "hosts", "ca_reused", "ca": {"cert", "key"},
/// "nodes": [{"broker", "node_id", "cert", "key"}], "nameserver": {"cert", "key"},
/// "client": {"cert", "key"}, "files": [every file written]}`.
pub fn written_json(w: &Written) -> Value {
    let pair = |name: &str| {
        json!({
            "cert": file(&w.dir, &format!("{name}.pem")),
            "key": file(&w.dir, &format!("{name}.key")),
        })
    };
    let nodes: Vec<Value> = w
        .plan
        .groups
        .iter()
        .flat_map(|(broker, ids)| {
            ids.iter().map(move |id| {
                let name = format!("{broker}-{id}");
                json!({
                    "broker": broker,
                    "node_id": id,
                    "cert": file(&w.dir, &format!("{name}.pem")),
                    "key": file(&w.dir, &format!("{name}.key")),
                })
            })
        })
        .collect();
    json!({
        "dir": w.dir.display().to_string(),
        "cluster": w.plan.cluster,
        "hosts": w.plan.hosts,
        "ca_reused": w.ca_reused,
        "ca": pair("ca"),
        "nodes": nodes,
        "nameserver": pair("nameserver"),
        "client": pair("client"),
        "files": w.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    fn parse(args: &[&str]) -> Result<CertInitArgs, clap::Error> {
        let cli = Cli::try_parse_from(
            ["raftmq", "cert", "init"]
                .iter()
                .chain(args.iter())
                .copied(),
        )?;
        match cli.command {
            Command::Cert(CertCmd::Init(a)) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_are_one_group_of_three_on_localhost() {
        let a = parse(&["--dir", "certs"]).unwrap();
        let p = plan(&a).unwrap();
        assert_eq!(p.cluster, "DefaultCluster");
        assert_eq!(p.groups, vec![("broker-a".to_string(), vec![1, 2, 3])]);
        assert_eq!(p.hosts, vec!["localhost", "127.0.0.1"]);
        assert!(p.per_node_hosts);
        let a = parse(&[
            "--dir",
            "certs",
            "--cluster",
            "C",
            "--group",
            "broker-a=1,2,3",
            "--group",
            "broker-b=4, 5",
            "--host",
            "mq.example.com",
            "--host",
            "10.0.0.7",
        ])
        .unwrap();
        let p = plan(&a).unwrap();
        assert_eq!(
            p.groups,
            vec![
                ("broker-a".to_string(), vec![1, 2, 3]),
                ("broker-b".to_string(), vec![4, 5])
            ]
        );
        assert_eq!((p.cluster.as_str(), p.hosts.len()), ("C", 2));
    }

    #[test]
    fn a_bad_group_is_named_once_with_its_fault() {
        for (bad, why) in [
            ("grp", "like broker-a=1,2,3"),
            ("grp=1,x", "\"x\" is not a whole number"),
            ("grp=", "\"\" is not a whole number"),
            ("grp=0", "start at 1"),
            ("grp=1,1", "listed twice"),
            ("bad.name=1", "'.'"),
        ] {
            let e = parse(&["--dir", "d", "--group", bad])
                .unwrap_err()
                .to_string();
            assert_eq!(e.matches(bad).count(), 1, "{bad}: {e}");
            assert!(e.contains("--group"), "{bad}: {e}");
            assert!(e.contains(why), "{bad}: {e}");
        }
        let a = parse(&["--dir", "d", "--group", "b=1", "--group", "b=2"]).unwrap();
        let e = plan(&a).unwrap_err().to_string();
        assert!(e.contains("--group b is given twice"), "{e}");
        let a = parse(&["--dir", "d", "--cluster", "a/b"]).unwrap();
        assert!(plan(&a).unwrap_err().to_string().contains("--cluster"));
    }

    #[test]
    fn init_writes_every_file_and_a_second_run_reuses_the_ca() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        let dir_text = dir.display().to_string();
        let a = parse(&["--dir", &dir_text, "--group", "g=1,2"]).unwrap();
        let first = init(&a).unwrap();
        assert!(!first.ca_reused);
        assert_eq!(first.files.len(), 10);
        let text = written_text(&first);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], format!("{dir_text}/ca.pem"));
        assert!(
            lines.contains(&format!("{dir_text}/g-2.key").as_str()),
            "{text}"
        );
        assert!(text.contains("new CA"), "{text}");
        assert!(
            text.contains("tls_ca = ") && text.contains("--tls-ca"),
            "{text}"
        );
        let ca = std::fs::read(dir.join("ca.pem")).unwrap();

        let again = init(&a).unwrap();
        assert!(again.ca_reused);
        assert_eq!(again.files.len(), 8);
        assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), ca);
        assert!(written_text(&again).contains("reused the CA"));
        let v: Value = serde_json::from_str(&json_line(&written_json(&again))).unwrap();
        assert_eq!(v["ca_reused"], true);
        assert_eq!(v["ca"]["cert"], format!("{dir_text}/ca.pem"));
        assert_eq!(v["nodes"][1]["node_id"], 2);
        assert_eq!(v["nodes"][1]["cert"], format!("{dir_text}/g-2.pem"));
        assert_eq!(v["client"]["key"], format!("{dir_text}/client.key"));
        assert_eq!(v["files"].as_array().unwrap().len(), 8);

        // Half a CA is not replaced.
        std::fs::remove_file(dir.join("ca.key")).unwrap();
        let e = init(&a).unwrap_err().to_string();
        assert!(e.contains("ca.key is not"), "{e}");
        assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), ca);
    }

    #[test]
    fn revoke_lists_a_certificate_once_and_says_how_it_takes_effect() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("certs");
        let dir_text = dir.display().to_string();
        init(&parse(&["--dir", &dir_text, "--group", "g=1,2"]).unwrap()).unwrap();
        let cli = Cli::try_parse_from([
            "raftmq",
            "cert",
            "revoke",
            "--dir",
            &dir_text,
            "--cert",
            &format!("{dir_text}/g-2.pem"),
        ])
        .unwrap();
        let Command::Cert(CertCmd::Revoke { dir: d, cert }) = cli.command else {
            panic!("not cert revoke");
        };
        let first = certgen::revoke(&d, &cert).unwrap();
        let text = revoked_text(&first, &cert);
        assert!(
            text.starts_with(&format!("revoked {dir_text}/g-2.pem (serial ")),
            "{text}"
        );
        assert!(
            text.contains("now lists 1 certificate") && text.contains("tls_crl"),
            "{text}"
        );
        let again = certgen::revoke(&d, &cert).unwrap();
        assert!(revoked_text(&again, &cert).contains("was revoked already"));
        let v: Value = serde_json::from_str(&json_line(&revoked_json(&again, &cert))).unwrap();
        assert_eq!(v["newly"], false);
        assert_eq!(v["listed"], 1);
        assert_eq!(v["serial"], first.serial.as_str());
        assert_eq!(v["crl"], format!("{dir_text}/crl.pem"));
        // A file that is not a certificate is named.
        let e = certgen::revoke(&d, &d.join("g-2.key"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("g-2.key"), "{e}");
    }
}
