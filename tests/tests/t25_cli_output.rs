//! What a client command prints besides its output: warnings only unless `-v` or `RUST_LOG` asks
//! for more, even inside a server's container (where deploy files set `RAFTMQ_LOG` for the
//! server); no colour codes when standard error is not a terminal, and none with `NO_COLOR`.
//! The `raftmq` binary runs as a user runs it, against a real node.

use std::process::{Command, Output, Stdio};

use raftmq_tests::*;

const ESC: char = '\u{1b}';

/// `raftmq ARGS` with the cluster's nameserver, `RAFTMQ_LOG=info` as in a server's container,
/// `RUST_LOG` and `NO_COLOR` unset unless `env` sets them.
fn raftmq(ns: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin("raftmq"));
    cmd.args(args)
        .env("RAFTMQ_NAMESERVER", ns)
        .env("RAFTMQ_LOG", "info")
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run raftmq")
}

/// The same run on a pseudo-terminal (`script`), as a person at a terminal runs it: what the
/// terminal shows (standard output and error together).
fn raftmq_on_a_terminal(ns: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let line = std::iter::once(bin("raftmq").display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .collect::<Vec<_>>()
        .join(" ");
    let mut cmd = Command::new("script");
    cmd.args(["-q", "-e", "-c", &line, "/dev/null"])
        .env("RAFTMQ_NAMESERVER", ns)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("run script");
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// 25. A consume (which logs its group's assignment at INFO) prints its messages and nothing
///     else by default; `-v` and `RUST_LOG` show the INFO line; off a terminal there is never a
///     colour code; on a terminal there are colours, unless `NO_COLOR` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t25_client_commands_log_warnings_only_and_colour_only_on_a_terminal() {
    // The test nameserver forgets a node silent for 3 s: register more often than that.
    let c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    c.create_topic("out", 1).await;
    let ns = c.nameserver.clone();
    let produced = raftmq(
        &ns,
        &["produce", "--topic", "out", "--count", "3", "--size", "16"],
        &[],
    );
    assert!(produced.status.success(), "{produced:?}");
    let consume = |group: &'static str| {
        [
            "consume",
            "--topic",
            "out",
            "--group",
            group,
            "--from",
            "earliest",
            "--timeout-ms",
            "3000",
            "--json",
        ]
    };

    let quiet = raftmq(&ns, &consume("g1"), &[]);
    assert!(quiet.status.success(), "{quiet:?}");
    assert_eq!(
        text(&quiet.stdout).lines().count(),
        3,
        "three messages: {quiet:?}"
    );
    let err = text(&quiet.stderr);
    assert!(
        !err.contains("INFO") && !err.contains(ESC),
        "nothing but warnings, no colour codes: {err:?}"
    );

    for (args, env, group) in [
        (vec!["-v"], vec![], "g2"),
        (vec![], vec![("RUST_LOG", "info")], "g3"),
    ] {
        let mut a = args.clone();
        a.extend(consume(group));
        let o = raftmq(&ns, &a, &env);
        let err = text(&o.stderr);
        assert!(
            o.status.success() && err.contains("INFO") && err.contains(&format!("group {group}")),
            "{args:?} {env:?} shows the INFO line: {o:?}"
        );
        assert!(!err.contains(ESC), "no colour codes in a pipe: {err:?}");
    }

    let mut a = vec!["-v"];
    a.extend(consume("g4"));
    let coloured = raftmq_on_a_terminal(&ns, &a, &[]);
    assert!(
        coloured.contains("INFO") && coloured.contains(ESC),
        "colours on a terminal: {coloured:?}"
    );
    let mut a = vec!["-v"];
    a.extend(consume("g5"));
    let plain = raftmq_on_a_terminal(&ns, &a, &[("NO_COLOR", "1")]);
    assert!(
        plain.contains("INFO") && !plain.contains(ESC),
        "NO_COLOR on a terminal: {plain:?}"
    );
}
