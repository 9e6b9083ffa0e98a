//! The web console (`raftmq console`) in a real browser, against a real three-node broker group:
//! Debian's Chromium, headless, driven by Playwright for Python (`tests/console/check_console.py`,
//! run with the python of `scripts/python-env`).
//!
//! The script waits until the page shows the group's three nodes and its leader and prints
//! `READY leader=N`; the test SIGKILLs node N and answers `KILLED N <unix ms>`. The script then
//! watches the page, never reloading it, until it shows another leader and the election in its
//! timeline, and fails if the new leader showed more than 2 s after the kill. It goes on to find
//! the test's message by key with the lookup box, opens a topic's and a group's queues, checks
//! the page at a phone's width and saves two screenshots: into `docs/` with
//! `RAFTMQ_SCREENSHOTS=1` (the pictures the docs show), else into the cluster's directory.
//! Last, on a second console started with `--allow-actions`, it hands the leadership to a
//! follower with the page's button. Its last line is a JSON object with its figures, asserted
//! here.
//!
//! Chromium must be installed (`apt-get install -y chromium`; `./scripts/test` does it on a
//! machine with apt-get): without it this test fails, it does not skip.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use raftmq_cli::local_cluster::log_tail;
use raftmq_cli::probe;
use raftmq_tests::*;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// The browser the script drives: Debian's package (Playwright's own download is not used).
const CHROMIUM: &str = "/usr/bin/chromium";
const TOPIC: &str = "console";
const GROUP: &str = "console-g";
const KEY: &str = "order-27";
const BODY: &str = "hello from t27";
/// Generated messages besides the keyed one, and how many of all the group consumes: the page
/// must show the difference as the group's lag.
const FILLER: u64 = 20;
const CONSUMED: u64 = 5;
/// The page must show the new leader within this long after the kill.
const NEW_LEADER_MS_MAX: u64 = 2000;

/// The workspace's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `raftmq --nameserver NS ARGS` with `stdin` as its input; panics unless it succeeds.
fn raftmq(ns: &str, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(bin("raftmq"))
        .arg("--nameserver")
        .arg(ns)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start raftmq");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "raftmq {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The consoles' logs and every node's, for failure messages.
fn diagnostics(c: &Cluster, console_logs: &[&Path]) -> String {
    let mut s = String::new();
    for log in console_logs {
        s += &format!("--- {} (tail) ---\n{}\n", log.display(), log_tail(log, 20));
    }
    for id in c.nodes.keys() {
        s += &format!(
            "--- node {id} log (tail) ---\n{}\n",
            log_tail(&c.log_path(*id), 10)
        );
    }
    s
}

/// Starts `raftmq console` with `args` on a free port of 127.0.0.1, logging to `name.log` in the
/// cluster's directory, and waits until it accepts connections: (the process, its address, its
/// log). The process is SIGKILLed when dropped, a failed test's too.
async fn start_console(
    c: &Cluster,
    name: &str,
    args: &[&str],
) -> (tokio::process::Child, String, PathBuf) {
    let addr = format!("127.0.0.1:{}", free_port());
    let log_path = c.dir.path().join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut console = tokio::process::Command::new(bin("raftmq"))
        .args(["--nameserver", &c.nameserver, "console", "--listen", &addr])
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start raftmq console");
    let up = probe::wait_for(
        "the console to accept connections",
        Duration::from_secs(20),
        POLL,
        || async {
            tokio::net::TcpStream::connect(&addr)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        },
    )
    .await;
    if let Err(e) = up {
        panic!(
            "{e} (console exited: {:?})\n{}",
            console.try_wait(),
            diagnostics(c, &[&log_path])
        );
    }
    (console, addr, log_path)
}

/// 27. The console shows a leader kill as it happens (new leader within 2 s, the election in its
///     timeline, no reload), finds a message by key, fits a phone's width, refuses actions
///     unless allowed and, allowed, transfers the leadership from the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t27_console_shows_an_election_live_and_finds_a_message() {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: the console test drives Debian's Chromium \
         (`apt-get install -y chromium`; ./scripts/test installs it where apt-get exists)"
    );
    let python = python();
    // The test nameserver forgets a node silent for 3 s: register more often than that.
    let mut c = Cluster::start(3, &["--register-interval-ms", "500"]).await;
    c.create_topic(TOPIC, 2).await;
    let ns = c.nameserver.clone();
    raftmq(&ns, &["group", "create", GROUP], "");
    raftmq(
        &ns,
        &["produce", "--topic", TOPIC, "--key", KEY],
        &format!("{BODY}\n"),
    );
    let filler = FILLER.to_string();
    raftmq(
        &ns,
        &[
            "produce", "--topic", TOPIC, "--count", &filler, "--size", "64",
        ],
        "",
    );
    let consumed = CONSUMED.to_string();
    raftmq(
        &ns,
        &[
            "consume", "--topic", TOPIC, "--group", GROUP, "--max", &consumed,
        ],
        "",
    );

    tracing::info!("start a read-only console and one allowing actions");
    let (console, addr, console_log) = start_console(&c, "console", &[]).await;
    let (actions, actions_addr, actions_log) =
        start_console(&c, "console-actions", &["--allow-actions"]).await;
    let logs = [console_log.as_path(), actions_log.as_path()];

    tracing::info!("run the browser");
    let shots = if std::env::var("RAFTMQ_SCREENSHOTS").as_deref() == Ok("1") {
        root().join("docs")
    } else {
        c.dir.path().to_path_buf()
    };
    let lag = (FILLER + 1 - CONSUMED).to_string();
    let mut script = tokio::process::Command::new(python)
        .arg(root().join("tests/console/check_console.py"))
        .args(["--url", &format!("http://{addr}/")])
        .args(["--actions-url", &format!("http://{actions_addr}/")])
        .args(["--topic", TOPIC, "--key", KEY, "--body", BODY])
        .args(["--group", GROUP, "--group-lag", &lag])
        .args(["--max-new-leader-ms", &NEW_LEADER_MS_MAX.to_string()])
        .args(["--chromium", CHROMIUM])
        .arg("--screenshots")
        .arg(&shots)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start check_console.py");
    let mut stdin = script.stdin.take().unwrap();
    let mut stdout = BufReader::new(script.stdout.take().unwrap()).lines();
    let mut stderr = script.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });

    // Every line the script prints, until it ends; `READY` is answered with the kill.
    let mut last = String::new();
    let mut killed = None;
    let run = tokio::time::timeout(Duration::from_secs(180), async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            println!("check_console.py: {line}");
            if let Some(id) = line.strip_prefix("READY leader=") {
                let id: u64 = id.trim().parse().expect("READY names a node id");
                assert_eq!(
                    id,
                    c.leader().await,
                    "the page shows another leader than the nodes"
                );
                let kill_ms = unix_ms();
                c.kill(id);
                tracing::info!("killed leader {id}");
                killed = Some(id);
                stdin
                    .write_all(format!("KILLED {id} {kill_ms}\n").as_bytes())
                    .await
                    .unwrap();
                stdin.flush().await.unwrap();
            }
            if !line.trim().is_empty() {
                last = line;
            }
        }
    })
    .await;
    let stderr = match run {
        Ok(()) => stderr.await.unwrap(),
        Err(_) => {
            let _ = script.kill().await;
            panic!(
                "check_console.py still ran after 180 s (killed); last line: {last}\n{}",
                diagnostics(&c, &logs)
            )
        }
    };
    let status = script.wait().await.unwrap();
    let v: Value = serde_json::from_str(&last).unwrap_or_else(|_| {
        panic!(
            "check_console.py ({status}) ended without a JSON line; last: {last}\nstderr:\n{stderr}\n{}",
            diagnostics(&c, &logs)
        )
    });
    assert!(
        v["ok"] == true,
        "check_console.py failed: {}\n{}\nstderr:\n{stderr}\n{}",
        v["error"],
        v["traceback"].as_str().unwrap_or(""),
        diagnostics(&c, &logs)
    );
    assert!(status.success(), "check_console.py exited {status}");

    let old = killed.expect("the script said READY");
    assert_eq!(v["old_leader"], old, "{v}");
    assert_ne!(v["new_leader"], old, "{v}");
    assert_eq!(
        v["transfer_to"],
        c.leader().await,
        "the page's leader transfer did not happen: {v}"
    );
    let new_leader_ms = v["new_leader_ms"].as_u64().expect("new_leader_ms");
    assert!(
        new_leader_ms <= NEW_LEADER_MS_MAX,
        "the page showed the new leader {new_leader_ms} ms after the kill: {v}"
    );
    println!(
        "console figures: new leader shown {new_leader_ms} ms after the kill, election in the \
         timeline after {} ms, outage the console measured {} ms, lookup {} ms, leader transfer \
         from the page {} ms; screenshots in {}",
        v["timeline_ms"],
        v["gap_ms"],
        v["lookup_ms"],
        v["transfer_ms"],
        shots.display()
    );
    drop((console, actions));
}
