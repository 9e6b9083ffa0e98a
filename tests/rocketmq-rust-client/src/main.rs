//! `rmq5-rust`: scenarios of the official RocketMQ 5 Rust client (crates.io `rocketmq` 5.0.0,
//! unmodified) against a raftmq broker group, run by `tests/tests/t85_rocketmq5_rust.rs`.
//!
//! Each subcommand runs one scenario and prints exactly ONE JSON object on standard output (the
//! client's own log goes to standard error). Every loop is bounded by its arguments.
//!
//! ```text
//! rmq5-rust send      --endpoints A --topic T --count N [--tag X[,Y..]] [--keys K] [--prefix P]
//! rmq5-rust receive   --endpoints A --topic T --group G [--expr E] [--max N] [--wait-secs S]
//!                     [--ack true|false] [--invisible-secs S] [--quiet-secs Q] [--poll-secs P]
//!                     [--batch B]
//! rmq5-rust send-loop --endpoints A --topic T --duration-secs D [--pace-ms M] [--tag X]
//!                     [--prefix P] [--retries R] [--progress-file F]
//! rmq5-rust txn       --endpoints A --topic T --count N
//! ```
//!
//! `txn` sends `--count` transactional messages (bodies `txn-<i>`), one transaction each, commits
//! the even `i` and rolls back the odd.
//!
//! `--endpoints` is the client's access URL as the crate takes it: `host:port`, or several joined
//! with `,`. A call of the crate that panics (it unwraps in several places) is run on its own task,
//! so the panic is recorded in the output (`panics`) instead of ending the scenario.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rocketmq::conf::{ClientOption, ProducerOption, SimpleConsumerOption};
use rocketmq::error::ClientError;
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::{Message, MessageBuilder, MessageView};
use rocketmq::model::transaction::{Transaction, TransactionResolution};
use rocketmq::{Producer, SimpleConsumer};
use serde_json::{json, Value};

/// `--key value` arguments after the subcommand.
struct Args {
    map: HashMap<String, String>,
}

impl Args {
    fn parse(raw: &[String]) -> Result<Args, String> {
        let mut map = HashMap::new();
        let mut it = raw.iter();
        while let Some(k) = it.next() {
            let key = k
                .strip_prefix("--")
                .ok_or_else(|| format!("expected --option, got {k:?}"))?;
            let v = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            map.insert(key.to_string(), v.clone());
        }
        Ok(Args { map })
    }

    fn req(&self, key: &str) -> Result<String, String> {
        self.map
            .get(key)
            .cloned()
            .ok_or_else(|| format!("--{key} is required"))
    }

    fn opt(&self, key: &str, default: &str) -> String {
        self.map
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.to_string())
    }

    fn num<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, String> {
        match self.map.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{key} {v:?} is not a number")),
        }
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.map.get(key).map(String::as_str) {
            None => Ok(default),
            Some("true") => Ok(true),
            Some("false") => Ok(false),
            Some(v) => Err(format!("--{key} takes true or false, not {v:?}")),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A client error as JSON: the crate's kind, message, operation, context and source chain.
fn error_json(e: &ClientError) -> Value {
    let context: BTreeMap<&str, &str> = e.context().iter().map(|(k, v)| (*k, v.as_str())).collect();
    json!({
        "kind": format!("{:?}", e.kind()),
        "message": e.message(),
        "operation": e.operation(),
        "context": context,
        "source": e.source().map(|s| format!("{s:#}")),
        "text": format!("{e}: {}{}", e.message(), e.source().map(|s| format!(": {s:#}")).unwrap_or_default()),
    })
}

/// The text of a task's panic.
fn panic_text(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return format!("task ended: {e}");
    }
    let p = e.into_panic();
    let text = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into());
    // The crate's errors carry anyhow's backtrace when one is captured: keep the message only.
    match text.split_once("\n\nStack backtrace:") {
        Some((head, _)) => head.to_string(),
        None => text,
    }
}

fn client_option(args: &Args) -> Result<ClientOption, String> {
    let mut co = ClientOption::default();
    co.set_access_url(args.req("endpoints")?);
    co.set_enable_tls(false);
    co.set_timeout(Duration::from_secs(args.num("timeout-secs", 3)?));
    Ok(co)
}

/// What one message of `send` or `send-loop` carries: body, tag, keys, user properties.
struct Outgoing {
    body: Vec<u8>,
    tag: String,
    keys: Vec<String>,
    props: HashMap<String, String>,
}

impl Outgoing {
    fn new(prefix: &str, index: usize, tag: &str, keys: Option<&str>) -> Outgoing {
        // Non-ASCII on purpose: the body and a property must come back byte for byte.
        let body = format!("{prefix}-{index} héllo wörld ✓ {}", "x".repeat(index % 7)).into_bytes();
        let keys = match keys {
            Some(k) => vec![k.to_string(), format!("{k}-{index}")],
            None => vec![format!("{prefix}-{index}")],
        };
        let props = HashMap::from([
            ("idx".to_string(), index.to_string()),
            ("client".to_string(), "rust-5.0.0".to_string()),
            ("note".to_string(), "ünïcødé ✓".to_string()),
        ]);
        Outgoing {
            body,
            tag: tag.to_string(),
            keys,
            props,
        }
    }

    /// A fresh message (a new message id each time) and that id.
    fn build(&self, topic: &str) -> Result<(String, impl Message), ClientError> {
        let mut m = MessageBuilder::builder()
            .set_topic(topic)
            .set_tag(self.tag.clone())
            .set_keys(self.keys.clone())
            .set_properties(self.props.clone())
            .set_body(self.body.clone())
            .build()?;
        Ok((m.take_message_id(), m))
    }

    fn json(&self) -> Value {
        json!({
            "tag": self.tag,
            "keys": self.keys,
            "properties": self.props,
            "body": String::from_utf8_lossy(&self.body),
            "body_hex": hex(&self.body),
        })
    }
}

async fn start_producer(args: &Args, topic: &str) -> Result<Producer, Value> {
    let co = client_option(args).map_err(|e| json!({ "fatal": e }))?;
    let mut po = ProducerOption::default();
    po.set_topics(vec![topic]);
    let mut p = Producer::new(po, co)
        .map_err(|e| json!({"fatal": "Producer::new", "error": error_json(&e)}))?;
    p.start()
        .await
        .map_err(|e| json!({"fatal": "Producer::start", "error": error_json(&e)}))?;
    Ok(p)
}

/// One send on its own task (a panic inside the crate is caught): the server's message id, or
/// the error as JSON (`{"panic": ...}` for a panic).
async fn send_one(
    producer: &Arc<Producer>,
    m: impl Message + Send + 'static,
) -> Result<String, Value> {
    let p = producer.clone();
    match tokio::spawn(async move { p.send(m).await }).await {
        Ok(Ok(receipt)) => Ok(receipt.message_id().to_string()),
        Ok(Err(e)) => Err(error_json(&e)),
        Err(j) => Err(json!({ "panic": panic_text(j) })),
    }
}

/// `send`: `--count` messages, tags cycled from `--tag` (comma-separated), keys from `--keys`.
async fn cmd_send(args: &Args) -> Result<Value, Value> {
    let fatal = |e: String| json!({ "fatal": e });
    let topic = args.req("topic").map_err(fatal)?;
    let count: usize = args.num("count", 1).map_err(fatal)?;
    let tags: Vec<String> = args
        .opt("tag", "TagA")
        .split(',')
        .map(str::to_string)
        .collect();
    let keys = args.map.get("keys").cloned();
    let prefix = args.opt("prefix", "rust");
    let producer = Arc::new(start_producer(args, &topic).await?);
    let t0 = Instant::now();
    let mut sent = Vec::new();
    let mut errors = Vec::new();
    for i in 0..count {
        let out = Outgoing::new(&prefix, i, &tags[i % tags.len()], keys.as_deref());
        let (id, m) = out
            .build(&topic)
            .map_err(|e| json!({"fatal": "build", "error": error_json(&e)}))?;
        match send_one(&producer, m).await {
            Ok(server_id) => {
                let mut v = out.json();
                v["index"] = json!(i);
                v["id"] = json!(id);
                v["receipt_id"] = json!(server_id);
                sent.push(v);
            }
            Err(e) => errors.push(json!({"index": i, "id": id, "error": e})),
        }
    }
    let elapsed_ms = t0.elapsed().as_millis() as u64;
    let shutdown = shutdown_producer(producer).await;
    Ok(
        json!({"sent": sent, "errors": errors, "elapsed_ms": elapsed_ms, "shutdown_error": shutdown}),
    )
}

async fn shutdown_producer(p: Arc<Producer>) -> Value {
    match Arc::try_unwrap(p) {
        Ok(p) => match p.shutdown().await {
            Ok(()) => Value::Null,
            Err(e) => error_json(&e),
        },
        Err(_) => json!("the producer is still shared"),
    }
}

/// `send-loop`: one message every `--pace-ms` for `--duration-secs`; a failed send is tried again
/// (as a new message: the crate gives each built message its own id) at most `--retries` times.
/// Every attempt is recorded. With `--progress-file`, the number of successful sends so far is
/// written there after each one (the test kills the leader once enough succeeded).
async fn cmd_send_loop(args: &Args) -> Result<Value, Value> {
    let fatal = |e: String| json!({ "fatal": e });
    let topic = args.req("topic").map_err(fatal)?;
    let duration = Duration::from_secs_f64(args.num("duration-secs", 10.0).map_err(fatal)?);
    let pace = Duration::from_millis(args.num("pace-ms", 20).map_err(fatal)?);
    let retries: usize = args.num("retries", 1).map_err(fatal)?;
    let tag = args.opt("tag", "TagLoop");
    let prefix = args.opt("prefix", "loop");
    let progress = args.map.get("progress-file").cloned();
    let producer = Arc::new(start_producer(args, &topic).await?);
    let t0 = Instant::now();
    let (mut sent, mut failed, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
    let mut index = 0usize;
    while t0.elapsed() < duration {
        let out = Outgoing::new(&prefix, index, &tag, None);
        let mut ok = false;
        for attempt in 0..=retries {
            let (id, m) = out
                .build(&topic)
                .map_err(|e| json!({"fatal": "build", "error": error_json(&e)}))?;
            let started = now_ms();
            let t = Instant::now();
            let r = send_one(&producer, m).await;
            let took_ms = t.elapsed().as_millis() as u64;
            let mut rec = json!({
                "index": index, "attempt": attempt, "id": id, "started_ms": started,
                "at_ms": now_ms(), "took_ms": took_ms, "body_hex": hex(&out.body),
            });
            match r {
                Ok(server_id) => {
                    rec["receipt_id"] = json!(server_id);
                    attempts.push(rec.clone());
                    sent.push(rec);
                    ok = true;
                    break;
                }
                Err(e) => {
                    rec["error"] = e;
                    attempts.push(rec.clone());
                    failed.push(rec);
                }
            }
        }
        if ok {
            if let Some(f) = &progress {
                let _ = std::fs::write(f, sent.len().to_string());
            }
        }
        index += 1;
        tokio::time::sleep(pace).await;
    }
    let elapsed_ms = t0.elapsed().as_millis() as u64;
    let shutdown = shutdown_producer(producer).await;
    Ok(json!({
        "messages": index, "sent": sent, "failed": failed, "attempts": attempts.len(),
        "elapsed_ms": elapsed_ms, "shutdown_error": shutdown,
    }))
}

/// `txn`: transactional messages committed (even) or rolled back (odd) by the producer.
async fn cmd_txn(args: &Args) -> Result<Value, Value> {
    let fatal = |e: String| json!({ "fatal": e });
    let topic = args.req("topic").map_err(fatal)?;
    let count: usize = args.num("count", 4).map_err(fatal)?;
    let co = client_option(args).map_err(|e| json!({ "fatal": e }))?;
    let mut po = ProducerOption::default();
    po.set_topics(vec![topic.clone()]);
    // Checks are not expected here (every transaction is ended at once): answer ROLLBACK.
    let mut p = Producer::new_transaction_producer(
        po,
        co,
        Box::new(|_, _| TransactionResolution::ROLLBACK),
    )
    .map_err(|e| json!({"fatal": "Producer::new_transaction_producer", "error": error_json(&e)}))?;
    p.start()
        .await
        .map_err(|e| json!({"fatal": "Producer::start", "error": error_json(&e)}))?;
    let (mut sent, mut errors) = (Vec::new(), Vec::new());
    for i in 0..count {
        let m =
            MessageBuilder::transaction_message_builder(&topic, format!("txn-{i}").into_bytes())
                .build()
                .map_err(|e| json!({"fatal": "build", "error": error_json(&e)}))?;
        let txn = match p.send_transaction_message(m).await {
            Ok(t) => t,
            Err(e) => {
                errors.push(json!({"index": i, "step": "send", "error": error_json(&e)}));
                continue;
            }
        };
        let (id, txn_id) = (
            txn.message_id().to_string(),
            txn.transaction_id().to_string(),
        );
        let commit = i % 2 == 0;
        let ended = if commit {
            txn.commit().await
        } else {
            txn.rollback().await
        };
        if let Err(e) = ended {
            errors.push(json!({"index": i, "step": "end", "error": error_json(&e)}));
        }
        sent.push(json!({"index": i, "id": id, "transaction_id": txn_id,
            "action": if commit { "commit" } else { "rollback" }}));
    }
    let shutdown = p.shutdown().await.err().map(|e| error_json(&e));
    Ok(json!({"sent": sent, "errors": errors, "shutdown_error": shutdown}))
}

fn view_json(v: &MessageView, at_ms: u64) -> Value {
    let props: BTreeMap<&String, &String> = v.properties().iter().collect();
    json!({
        "id": v.message_id(),
        "topic": v.topic(),
        "tag": v.tag(),
        "keys": v.keys(),
        "properties": props,
        "body": String::from_utf8_lossy(v.body()),
        "body_hex": hex(v.body()),
        "attempt": v.delivery_attempt(),
        "born_host": v.born_host(),
        "born_timestamp": v.born_timestamp(),
        "at_ms": at_ms,
    })
}

/// `receive`: a SimpleConsumer of `--group` receives with filter `--expr` until `--max`
/// deliveries came (repeats count) and `--quiet-secs` more passed, or `--wait-secs` in all;
/// each delivery is acknowledged with `--ack true`. Receives ask for `--invisible-secs` and
/// long-poll at most `--poll-secs` (also the crate's deadline for the call: the server ends its
/// poll a margin before it).
async fn cmd_receive(args: &Args) -> Result<Value, Value> {
    let fatal = |e: String| json!({ "fatal": e });
    let topic = args.req("topic").map_err(fatal)?;
    let group = args.req("group").map_err(fatal)?;
    let expr = args.opt("expr", "*");
    let max: usize = args.num("max", 1).map_err(fatal)?;
    let wait = Duration::from_secs_f64(args.num("wait-secs", 30.0).map_err(fatal)?);
    let quiet = Duration::from_secs_f64(args.num("quiet-secs", 0.0).map_err(fatal)?);
    let ack = args.flag("ack", true).map_err(fatal)?;
    let invisible = Duration::from_secs_f64(args.num("invisible-secs", 15.0).map_err(fatal)?);
    let poll = Duration::from_secs_f64(args.num("poll-secs", 3.0).map_err(fatal)?);
    let batch: i32 = args.num("batch", 32).map_err(fatal)?;

    let mut co = client_option(args).map_err(fatal)?;
    co.set_long_polling_timeout(poll);
    let mut so = SimpleConsumerOption::default();
    so.set_topics(vec![topic.clone()]);
    so.set_consumer_group(group);
    let mut consumer = SimpleConsumer::new(so, co)
        .map_err(|e| json!({"fatal": "SimpleConsumer::new", "error": error_json(&e)}))?;
    consumer
        .start()
        .await
        .map_err(|e| json!({"fatal": "SimpleConsumer::start", "error": error_json(&e)}))?;
    let consumer = Arc::new(consumer);
    let filter = Arc::new(FilterExpression::new(FilterType::Tag, expr));

    let t0 = Instant::now();
    let (mut received, mut errors, mut panics, mut ack_errors) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut receives, mut empty, mut acked) = (0usize, 0usize, 0usize);
    let mut reached: Option<Instant> = None;
    loop {
        if t0.elapsed() >= wait || reached.is_some_and(|t| t.elapsed() >= quiet) {
            break;
        }
        receives += 1;
        let (c, f, tp) = (consumer.clone(), filter.clone(), topic.clone());
        let started = Instant::now();
        let r = tokio::spawn(async move { c.receive_with(tp, &f, batch, invisible).await }).await;
        let views = match r {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                let mut j = error_json(&e);
                j["after_ms"] = json!(started.elapsed().as_millis() as u64);
                errors.push(j);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(j) => {
                panics.push(json!({"call": "receive", "panic": panic_text(j)}));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if views.is_empty() {
            empty += 1;
        }
        let at = now_ms();
        for v in views {
            received.push(view_json(&v, at));
            if ack {
                let c = consumer.clone();
                match tokio::spawn(async move { c.ack(&v).await.map(|_| v) }).await {
                    Ok(Ok(_)) => acked += 1,
                    Ok(Err(e)) => ack_errors.push(error_json(&e)),
                    Err(j) => panics.push(json!({"call": "ack", "panic": panic_text(j)})),
                }
            }
        }
        if reached.is_none() && received.len() >= max {
            reached = Some(Instant::now());
        }
    }
    let elapsed_ms = t0.elapsed().as_millis() as u64;
    let shutdown = match Arc::try_unwrap(consumer) {
        Ok(c) => c.shutdown().await.err().map(|e| error_json(&e)),
        Err(_) => Some(json!("the consumer is still shared")),
    };
    Ok(json!({
        "received": received, "acked": acked, "ack_errors": ack_errors, "errors": errors,
        "panics": panics, "receives": receives, "empty_receives": empty,
        "max_reached": reached.is_some(), "elapsed_ms": elapsed_ms, "shutdown_error": shutdown,
    }))
}

async fn run(argv: Vec<String>) -> Value {
    let Some(cmd) = argv.first() else {
        return json!({"fatal": "usage: rmq5-rust send|receive|send-loop|txn --option value ..."});
    };
    let args = match Args::parse(&argv[1..]) {
        Ok(a) => a,
        Err(e) => return json!({ "fatal": e }),
    };
    let r = match cmd.as_str() {
        "send" => cmd_send(&args).await,
        "receive" => cmd_receive(&args).await,
        "send-loop" => cmd_send_loop(&args).await,
        "txn" => cmd_txn(&args).await,
        other => Err(json!({ "fatal": format!("unknown subcommand {other:?}") })),
    };
    r.unwrap_or_else(|e| e)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let out = run(argv).await;
    println!("{out}");
    let fatal = out.get("fatal").is_some();
    // The crate's log drains run on their own threads; leave without waiting for them.
    std::process::exit(if fatal { 1 } else { 0 });
}
