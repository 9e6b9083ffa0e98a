//! `raftmq console`: a web page showing the cluster live (issue 19).
//!
//! One process serves the page to any number of browsers:
//! - **Broker groups and nodes.** ONE background task asks [`Admin::cluster_status`] every
//!   [`POLL_EVERY`], however many browsers there are, and keeps the newest snapshot in a `watch`
//!   channel. `GET /api/cluster` answers from it; `GET /api/events` pushes each new one as a
//!   server-sent event, so a browser sees an election within one poll of the cluster showing it.
//! - **Election timeline.** The same task feeds each snapshot to a [`Timeline`], a pure
//!   structure (the time is passed in) recording per broker group "leader lost" when no node
//!   answers as leader and "leader elected" when one does again, with how long the group had no
//!   leader. It keeps the newest [`TIMELINE_EVENTS_MAX`] events in memory and starts empty with
//!   the console.
//! - **Topics, consumer groups, message lookup** are asked of the cluster when a browser asks,
//!   through the functions behind `topic status`, `group status` and `msg find`.
//! - **Leadership transfer** (`POST /api/leader/transfer`) only with `--allow-actions`.
//!
//! Every API answer is JSON. An error is `{"error": "..."}` with a 4xx status when the request is
//! wrong (a missing query parameter is named) and a 5xx status when the cluster did not answer;
//! the page shows the text in the section that asked. The assets (`console/index.html`,
//! `app.js`, `style.css`) are compiled into the binary, so the page needs nothing but this
//! process: no CDN, no fonts, no build step.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::Stream;
use raftmq_client::{Admin, BrokerView, ClusterStatus, ErrorCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::args::ConsoleArgs;
use crate::commands::msg::{self, By};
use crate::commands::{group, topic};
use crate::output::StatusJson;

/// How often the background task reads the cluster's status.
pub const POLL_EVERY: Duration = Duration::from_millis(250);
/// A status read still running after this is given up (a node that hangs costs its own 1 s
/// timeout inside; this bounds the nameserver lookup too). The snapshot then carries the error.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(3);
/// Leadership events kept, newest first.
pub const TIMELINE_EVENTS_MAX: usize = 200;
/// Messages a lookup returns at most.
pub const LOOKUP_MESSAGES_MAX: u32 = 32;
/// How soon a browser reconnects to the event stream after losing it.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

const INDEX_HTML: &str = include_str!("console/index.html");
const APP_JS: &str = include_str!("console/app.js");
const STYLE_CSS: &str = include_str!("console/style.css");

/// Serves the console on `args.listen` until the process is interrupted.
pub async fn run(target: &crate::connect::Target, args: ConsoleArgs) -> Result<()> {
    let admin = target.admin()?;
    let nameserver = &target.nameserver;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let poll = Poll::default();
    let (tx, rx) = watch::channel(poll.snapshot(&admin, args.allow_actions));
    let console = Arc::new(Console {
        admin,
        actions: args.allow_actions,
        cluster: rx,
    });
    tokio::spawn(poll_cluster(console.clone(), poll, tx));
    println!(
        "raftmq console on http://{addr}/ (nameserver {nameserver}; {})",
        if args.allow_actions {
            "actions allowed"
        } else {
            "read-only"
        }
    );
    // Ctrl-C or SIGTERM ends it at once with success: open event streams never finish, so a
    // graceful drain would wait for ever.
    tokio::select! {
        served = axum::serve(listener, app(console)) => served.context("serving the console"),
        _ = crate::signals::interrupted() => Ok(()),
    }
}

/// What every request handler shares.
struct Console {
    admin: Admin,
    /// `--allow-actions`: leadership transfer from the page.
    actions: bool,
    /// The newest `/api/cluster` answer, as JSON text.
    cluster: watch::Receiver<Arc<str>>,
}

type Shared = Arc<Console>;

fn app(console: Shared) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route("/api/cluster", get(api_cluster))
        .route("/api/events", get(api_events))
        .route("/api/topics", get(api_topics))
        .route("/api/topic", get(api_topic))
        .route("/api/groups", get(api_groups))
        .route("/api/group", get(api_group))
        .route("/api/msg", get(api_msg))
        .route("/api/leader/transfer", post(api_transfer))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .with_state(console)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

// ---------------------------------------------------------------------------------------------
// The background poll

/// The poller's state: the last status read, how the last read went, the timeline.
#[derive(Default)]
struct Poll {
    status: Option<ClusterStatus>,
    /// When `status` was read (ms since the epoch).
    updated_ms: Option<u64>,
    /// Why the last read failed; `None` when it succeeded.
    error: Option<String>,
    timeline: Timeline,
}

impl Poll {
    fn observe(&mut self, now_ms: u64, status: ClusterStatus) {
        let groups: Vec<Leadership> = status
            .clusters
            .iter()
            .flat_map(|c| c.brokers.iter())
            .map(leadership)
            .collect();
        self.timeline.observe(now_ms, &groups);
        self.status = Some(status);
        self.updated_ms = Some(now_ms);
        self.error = None;
    }

    /// The `/api/cluster` answer: `{"status": <cluster status --json>|null, "timeline": [...],
    /// "updated_ms", "error", "actions", "nameservers", "rates": [...]}`. `status` stays the last
    /// one read while `error` says why the newest read failed.
    fn snapshot(&self, admin: &Admin, actions: bool) -> Arc<str> {
        let rates: Vec<Value> = self
            .status
            .iter()
            .flat_map(|s| s.clusters.iter())
            .flat_map(|c| c.brokers.iter())
            .flat_map(|b| b.nodes.iter().map(move |n| (b, n)))
            .filter_map(|(b, n)| {
                let s = n.status.as_ref()?;
                Some(json!({
                    "broker": b.name,
                    "node_id": n.node_id,
                    "produce_msgs_per_sec": s.produce_msgs_per_sec,
                    "pull_msgs_per_sec": s.pull_msgs_per_sec,
                }))
            })
            .collect();
        json!({
            "status": self.status.as_ref().map(StatusJson::from),
            "timeline": self.timeline.events().collect::<Vec<_>>(),
            "updated_ms": self.updated_ms,
            "error": self.error,
            "actions": actions,
            "nameservers": admin.nameservers(),
            "rates": rates,
        })
        .to_string()
        .into()
    }
}

/// Reads the cluster every [`POLL_EVERY`] and publishes each snapshot; runs as long as the
/// process. A read that fails keeps the last status and says why.
async fn poll_cluster(console: Shared, mut poll: Poll, tx: watch::Sender<Arc<str>>) {
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Stamped when the read starts: the nodes answer within milliseconds of it, while a dead
        // node may hold the read's end back by its whole timeout.
        let started_ms = now_ms();
        match tokio::time::timeout(POLL_TIMEOUT, console.admin.cluster_status()).await {
            Ok(Ok(status)) => poll.observe(started_ms, status),
            Ok(Err(e)) => poll.error = Some(format!("cannot read the cluster status: {e}")),
            Err(_) => {
                poll.error = Some(format!(
                    "the cluster status did not come within {} ms",
                    POLL_TIMEOUT.as_millis()
                ))
            }
        }
        tx.send_replace(poll.snapshot(&console.admin, console.actions));
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

// ---------------------------------------------------------------------------------------------
// The election timeline (pure)

/// What one snapshot says of one broker group's leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    pub broker: String,
    /// The node answering as leader (the one with the highest term if several do); `None` when
    /// no node does: the old leader is down and no other has won an election yet.
    pub leader: Option<u64>,
    /// That leader's term, else the highest term any node of the group answered with.
    pub term: u64,
}

/// The leadership a broker group's live view shows. Only the nodes' own answers count: the
/// view's `leader_id` falls back to the nameservers' record, which names a dead leader until its
/// registration expires.
pub fn leadership(b: &BrokerView) -> Leadership {
    let leader = b
        .nodes
        .iter()
        .filter_map(|n| Some((n.node_id, n.status.as_ref()?)))
        .filter(|(_, s)| s.role == "leader")
        .max_by_key(|(_, s)| s.term);
    Leadership {
        broker: b.name.clone(),
        leader: leader.map(|(id, _)| id),
        term: leader.map_or(b.term, |(_, s)| s.term),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// No node answers as leader any more.
    Lost,
    /// A node answers as leader after none did, or another node (or a new term) leads.
    Elected,
}

/// One leadership change, as `/api/cluster` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaderEvent {
    /// When the snapshot showing the change was read (ms since the epoch).
    pub time_ms: u64,
    pub broker: String,
    pub kind: EventKind,
    /// The leader before: for `elected` after an outage, the one that led before it (`None` when
    /// the console never saw one).
    pub old_leader: Option<u64>,
    /// The leader after; `None` for `lost`.
    pub new_leader: Option<u64>,
    /// `lost`: the term of the leader lost; `elected`: the new leader's term.
    pub term: u64,
    /// `elected`: how long no node answered as leader, from the first snapshot without one to
    /// this one (exact to one poll); 0 when the leader changed between two snapshots.
    /// `lost`: `None`.
    pub gap_ms: Option<u64>,
}

/// Leadership changes per broker group, from a sequence of snapshots.
///
/// The first snapshot of a group records nothing (the console cannot know when its leader was
/// elected); a group without a leader then starts an outage. A group missing from a snapshot is
/// left as it was.
#[derive(Debug, Default)]
pub struct Timeline {
    groups: BTreeMap<String, Seen>,
    /// Newest first, at most [`TIMELINE_EVENTS_MAX`].
    events: VecDeque<LeaderEvent>,
}

/// A group's leadership as last seen.
#[derive(Debug, Clone, Copy)]
enum Seen {
    Led {
        leader: u64,
        term: u64,
    },
    Leaderless {
        since_ms: u64,
        previous: Option<u64>,
    },
}

impl Timeline {
    pub fn observe(&mut self, now_ms: u64, groups: &[Leadership]) {
        for g in groups {
            let seen = self.groups.get(&g.broker).copied();
            let event = |kind, old_leader, gap_ms| LeaderEvent {
                time_ms: now_ms,
                broker: g.broker.clone(),
                kind,
                old_leader,
                new_leader: g.leader,
                term: g.term,
                gap_ms,
            };
            let (next, event) = match (seen, g.leader) {
                (None, Some(leader)) => (
                    Seen::Led {
                        leader,
                        term: g.term,
                    },
                    None,
                ),
                (None, None) => (
                    Seen::Leaderless {
                        since_ms: now_ms,
                        previous: None,
                    },
                    None,
                ),
                (Some(Seen::Led { leader, term }), Some(new)) => {
                    let changed = new != leader || g.term > term;
                    (
                        Seen::Led {
                            leader: new,
                            term: g.term.max(term),
                        },
                        changed.then(|| event(EventKind::Elected, Some(leader), Some(0))),
                    )
                }
                (Some(Seen::Led { leader, term }), None) => (
                    Seen::Leaderless {
                        since_ms: now_ms,
                        previous: Some(leader),
                    },
                    Some(LeaderEvent {
                        term,
                        ..event(EventKind::Lost, Some(leader), None)
                    }),
                ),
                (Some(Seen::Leaderless { since_ms, previous }), Some(new)) => (
                    Seen::Led {
                        leader: new,
                        term: g.term,
                    },
                    Some(event(
                        EventKind::Elected,
                        previous,
                        Some(now_ms.saturating_sub(since_ms)),
                    )),
                ),
                (Some(leaderless), None) => (leaderless, None),
            };
            self.groups.insert(g.broker.clone(), next);
            if let Some(e) = event {
                self.events.push_front(e);
                self.events.truncate(TIMELINE_EVENTS_MAX);
            }
        }
    }

    /// The events, newest first.
    pub fn events(&self) -> impl Iterator<Item = &LeaderEvent> {
        self.events.iter()
    }
}

// ---------------------------------------------------------------------------------------------
// Requests and errors

/// An API error: its status and the `{"error": ...}` text.
#[derive(Debug, PartialEq, Eq)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

/// A failure of the cluster call behind a request: 404 for what does not exist, 400 for what
/// the cluster refused as invalid, 502 when the cluster did not answer as it should, 500 for the
/// rest. The text is the whole chain of causes.
impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> ApiError {
        use raftmq_client::Error as E;
        let client = e.chain().find_map(|c| c.downcast_ref::<E>());
        let status = match client {
            Some(E::InvalidArgument(_)) => StatusCode::BAD_REQUEST,
            Some(E::TopicNotFound { .. } | E::GroupNotFound { .. } | E::UnknownBroker { .. }) => {
                StatusCode::NOT_FOUND
            }
            Some(E::Server { code, .. }) => match code {
                ErrorCode::TopicNotFound | ErrorCode::GroupNotFound => StatusCode::NOT_FOUND,
                ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
                _ => StatusCode::BAD_GATEWAY,
            },
            Some(_) => StatusCode::BAD_GATEWAY,
            None => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            message: format!("{e:#}"),
        }
    }
}

impl From<raftmq_client::Error> for ApiError {
    fn from(e: raftmq_client::Error) -> ApiError {
        anyhow::Error::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, json!({ "error": self.message }).to_string())
    }
}

fn json_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
}

fn json_ok(v: &Value) -> Response {
    json_response(StatusCode::OK, v.to_string())
}

/// A request's query parameters, percent-decoded (`+` is a space, as forms encode it). A name
/// given twice keeps its first value; an empty value counts as absent.
#[derive(Debug)]
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(query: Option<&str>) -> Result<Params, ApiError> {
        let mut pairs = Vec::new();
        for part in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            let (Some(k), Some(v)) = (percent_decode(k), percent_decode(v)) else {
                return Err(ApiError::bad_request(format!(
                    "malformed query parameter {part:?} (bad percent-encoding or not UTF-8)"
                )));
            };
            pairs.push((k, v));
        }
        Ok(Params(pairs))
    }

    fn optional(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.optional(name)
            .ok_or_else(|| ApiError::bad_request(format!("missing query parameter {name:?}")))
    }
}

/// `s` with `+` as a space and `%XX` escapes decoded; `None` when an escape is malformed or the
/// bytes are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            _ => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// `/api/msg`'s query: `topic` and exactly one of `id` and `key`.
fn msg_query(p: &Params) -> Result<(String, By), ApiError> {
    let topic = p.required("topic")?.to_string();
    let by = match (p.optional("id"), p.optional("key")) {
        (Some(id), None) => By::Id(id.to_string()),
        (None, Some(key)) => By::Key(key.to_string()),
        (None, None) => {
            return Err(ApiError::bad_request(
                "missing query parameter \"id\" or \"key\"",
            ));
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give query parameter \"id\" or \"key\", not both",
            ));
        }
    };
    Ok((topic, by))
}

/// `POST /api/leader/transfer`'s body.
#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferRequest {
    broker: String,
    to: u64,
}

/// Checks a transfer request: actions allowed, a JSON body naming the group and the node.
/// Requiring `Content-Type: application/json` keeps other web sites out: a browser sends that
/// type across origins only after a CORS preflight, which this server never grants.
fn transfer_request(
    actions: bool,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<TransferRequest, ApiError> {
    if !actions {
        return Err(ApiError {
            status: StatusCode::FORBIDDEN,
            message: "actions are disabled: this console is read-only (start it with \
                      --allow-actions to transfer leadership)"
                .into(),
        });
    }
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return Err(ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            message: "the request body must be JSON (Content-Type: application/json)".into(),
        });
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "invalid request body: {e} (expected {{\"broker\": NAME, \"to\": NODE_ID}})"
        ))
    })
}

// ---------------------------------------------------------------------------------------------
// Handlers

async fn api_cluster(State(c): State<Shared>) -> Response {
    let body = c.cluster.borrow().to_string();
    json_response(StatusCode::OK, body)
}

/// Every snapshot the poller publishes, as one `data:` event each, the current one first.
async fn api_events(State(c): State<Shared>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut rx = c.cluster.clone();
    rx.mark_changed();
    Sse::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let data = rx.borrow_and_update().clone();
        let event = Event::default().retry(RECONNECT_AFTER).data(&*data);
        Some((Ok(event), rx))
    }))
}

/// `{"topics": [{"name", "type", "brokers": [{"name", "queues"}]}]}`, as `topic list --json`.
async fn api_topics(State(c): State<Shared>) -> Result<Response, ApiError> {
    Ok(json_ok(&topic::list_json(&c.admin.list_topics().await?)))
}

/// `topic status NAME --json`.
async fn api_topic(State(c): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref())?;
    let name = p.required("name")?;
    Ok(json_ok(&topic::status_value(&c.admin, name).await?))
}

/// `{"groups": [{"name", "max_attempts", "retry_delays_ms", "fifo", "brokers"}]}`, as
/// `group list --json`.
async fn api_groups(State(c): State<Shared>) -> Result<Response, ApiError> {
    let groups: Vec<Value> = c
        .admin
        .list_groups()
        .await?
        .iter()
        .map(group::group_json)
        .collect();
    Ok(json_ok(&json!({ "groups": groups })))
}

/// `group status NAME [--topic T] --json`.
async fn api_group(State(c): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let p = Params::parse(q.as_deref())?;
    let name = p.required("name")?;
    let value = group::status_value(&c.admin, name, p.optional("topic")).await?;
    Ok(json_ok(&value))
}

/// `{"messages": [...]}`, each as `msg get --json` prints it.
async fn api_msg(State(c): State<Shared>, RawQuery(q): RawQuery) -> Result<Response, ApiError> {
    let (topic, by) = msg_query(&Params::parse(q.as_deref())?)?;
    let messages = msg::lookup(&c.admin, &topic, by, LOOKUP_MESSAGES_MAX).await?;
    Ok(json_ok(&json!({ "messages": messages })))
}

/// Hands `broker`'s leadership to node `to` and answers once it leads.
async fn api_transfer(
    State(c): State<Shared>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let req = transfer_request(c.actions, &headers, &body)?;
    c.admin.transfer_leader(&req.broker, req.to).await?;
    Ok(json_ok(&json!({"broker": req.broker, "leader_id": req.to})))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no such page: {}", uri.path()),
    }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{method} is not allowed on {}", uri.path()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(broker: &str, leader: Option<u64>, term: u64) -> Leadership {
        Leadership {
            broker: broker.into(),
            leader,
            term,
        }
    }

    /// Feeds `(time, leader, term)` snapshots of broker-a; returns the events oldest first.
    fn feed(snapshots: &[(u64, Option<u64>, u64)]) -> Vec<LeaderEvent> {
        let mut t = Timeline::default();
        for &(at, leader, term) in snapshots {
            t.observe(at, &[led("broker-a", leader, term)]);
        }
        let mut events: Vec<LeaderEvent> = t.events().cloned().collect();
        events.reverse();
        events
    }

    fn event(
        time_ms: u64,
        kind: EventKind,
        old: Option<u64>,
        new: Option<u64>,
        term: u64,
        gap_ms: Option<u64>,
    ) -> LeaderEvent {
        LeaderEvent {
            time_ms,
            broker: "broker-a".into(),
            kind,
            old_leader: old,
            new_leader: new,
            term,
            gap_ms,
        }
    }

    #[test]
    fn t01_an_election_is_leader_lost_then_elected_with_the_outage() {
        let events = feed(&[
            (1_000, Some(1), 3),
            (1_250, Some(1), 3),
            (1_500, None, 3),
            (1_750, None, 4),
            (2_000, Some(2), 4),
            (2_250, Some(2), 4),
        ]);
        assert_eq!(
            events,
            vec![
                event(1_500, EventKind::Lost, Some(1), None, 3, None),
                event(2_000, EventKind::Elected, Some(1), Some(2), 4, Some(500)),
            ]
        );
    }

    #[test]
    fn t02_the_first_snapshot_records_nothing_and_a_first_leader_ends_an_outage() {
        assert_eq!(feed(&[(0, Some(1), 1), (250, Some(1), 1)]), vec![]);
        assert_eq!(
            feed(&[(0, None, 0), (250, None, 1), (500, Some(3), 1)]),
            vec![event(500, EventKind::Elected, None, Some(3), 1, Some(500))]
        );
    }

    #[test]
    fn t03_a_change_between_two_snapshots_is_an_election_without_a_gap() {
        // Another node (a transfer), then the same node in a new term.
        assert_eq!(
            feed(&[(0, Some(1), 2), (250, Some(2), 3), (500, Some(2), 4)]),
            vec![
                event(250, EventKind::Elected, Some(1), Some(2), 3, Some(0)),
                event(500, EventKind::Elected, Some(2), Some(2), 4, Some(0)),
            ]
        );
        // A stale lower term from the same leader is no change.
        assert_eq!(feed(&[(0, Some(1), 5), (250, Some(1), 4)]), vec![]);
    }

    #[test]
    fn t04_groups_are_followed_apart_and_a_missing_group_keeps_its_state() {
        let mut t = Timeline::default();
        t.observe(0, &[led("a", Some(1), 1), led("b", Some(4), 1)]);
        t.observe(100, &[led("a", None, 1), led("b", Some(4), 1)]);
        t.observe(200, &[led("b", Some(5), 2)]);
        t.observe(300, &[led("a", Some(2), 2)]);
        let seen: Vec<(u64, &str, EventKind, Option<u64>)> = t
            .events()
            .map(|e| (e.time_ms, e.broker.as_str(), e.kind, e.gap_ms))
            .collect();
        assert_eq!(
            seen,
            vec![
                (300, "a", EventKind::Elected, Some(200)),
                (200, "b", EventKind::Elected, Some(0)),
                (100, "a", EventKind::Lost, None),
            ]
        );
    }

    #[test]
    fn t05_the_timeline_keeps_the_newest_events() {
        let mut t = Timeline::default();
        for i in 0..=TIMELINE_EVENTS_MAX as u64 {
            t.observe(i, &[led("a", Some(i % 2 + 1), 1)]);
        }
        let times: Vec<u64> = t.events().map(|e| e.time_ms).collect();
        assert_eq!(times.len(), TIMELINE_EVENTS_MAX);
        assert_eq!(times[0], TIMELINE_EVENTS_MAX as u64);
        assert_eq!(times[TIMELINE_EVENTS_MAX - 1], 1);
    }

    #[test]
    fn t06_the_leader_is_the_node_answering_as_leader_not_the_nameservers_record() {
        use raftmq_client::{NodeStatusResponse, NodeView};
        let node = |id: u64, role: Option<&str>, term: u64| NodeView {
            node_id: id,
            address: format!("h:{id}"),
            status: role.map(|r| NodeStatusResponse {
                node_id: id,
                role: r.into(),
                term,
                ..Default::default()
            }),
            error: role.is_none().then(|| "refused".into()),
            lag: None,
        };
        let view = |nodes| BrokerView {
            name: "broker-a".into(),
            leader_id: Some(1),
            term: 3,
            nodes,
        };
        let dead_leader = view(vec![
            node(1, None, 0),
            node(2, Some("follower"), 3),
            node(3, Some("candidate"), 4),
        ]);
        assert_eq!(leadership(&dead_leader), led("broker-a", None, 3));
        let two_claim = view(vec![
            node(1, Some("leader"), 3),
            node(2, Some("leader"), 4),
            node(3, Some("follower"), 4),
        ]);
        assert_eq!(leadership(&two_claim), led("broker-a", Some(2), 4));
    }

    fn params(q: &str) -> Params {
        Params::parse(Some(q)).unwrap()
    }

    #[test]
    fn t07_query_parameters_decode_and_a_missing_one_is_named() {
        let p = params("name=a%7Cb+c&topic=&x");
        assert_eq!(p.required("name"), Ok("a|b c"));
        let missing = |e: Result<&str, ApiError>| e.unwrap_err();
        assert_eq!(
            missing(p.required("topic")),
            ApiError::bad_request("missing query parameter \"topic\"")
        );
        assert_eq!(
            missing(Params::parse(None).unwrap().required("name")).message,
            "missing query parameter \"name\""
        );
        for bad in ["name=%zz", "name=%4", "name=%ff"] {
            let e = Params::parse(Some(bad)).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(e.message.contains(bad), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn t08_a_lookup_takes_a_topic_and_exactly_one_of_id_and_key() {
        assert_eq!(
            msg_query(&params("topic=t&key=order-1")).unwrap(),
            ("t".to_string(), By::Key("order-1".into()))
        );
        assert_eq!(
            msg_query(&params("topic=t&id=AB12")).unwrap(),
            ("t".to_string(), By::Id("AB12".into()))
        );
        let err = |q| msg_query(&params(q)).unwrap_err().message;
        assert_eq!(err("key=k"), "missing query parameter \"topic\"");
        assert_eq!(err("topic=t"), "missing query parameter \"id\" or \"key\"");
        assert_eq!(
            err("topic=t&id=1&key=k"),
            "give query parameter \"id\" or \"key\", not both"
        );
    }

    #[test]
    fn t09_a_transfer_needs_actions_allowed_and_a_json_body() {
        let mut json_type = HeaderMap::new();
        json_type.insert(
            header::CONTENT_TYPE,
            "application/json; charset=utf-8".parse().unwrap(),
        );
        let body = br#"{"broker":"broker-a","to":2}"#;
        let refused = transfer_request(false, &json_type, body).unwrap_err();
        assert_eq!(refused.status, StatusCode::FORBIDDEN);
        assert!(refused.message.contains("--allow-actions"), "{refused:?}");
        assert_eq!(
            transfer_request(true, &HeaderMap::new(), body)
                .unwrap_err()
                .status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        assert_eq!(
            transfer_request(true, &json_type, body),
            Ok(TransferRequest {
                broker: "broker-a".into(),
                to: 2
            })
        );
        let bad = transfer_request(true, &json_type, br#"{"broker":"broker-a"}"#).unwrap_err();
        assert_eq!(bad.status, StatusCode::BAD_REQUEST);
        assert!(bad.message.contains("missing field `to`"), "{bad:?}");
    }

    #[test]
    fn t10_cluster_errors_map_to_statuses() {
        let status = |e: raftmq_client::Error| ApiError::from(e).status;
        assert_eq!(
            status(raftmq_client::Error::TopicNotFound { topic: "t".into() }),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(raftmq_client::Error::InvalidArgument("bad name".into())),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(raftmq_client::Error::Timeout {
                op: "x".into(),
                waited: Duration::from_secs(1),
                last: "y".into()
            }),
            StatusCode::BAD_GATEWAY
        );
        let wrapped = ApiError::from(
            anyhow::Error::from(raftmq_client::Error::GroupNotFound { group: "g".into() })
                .context("group status of g"),
        );
        assert_eq!(wrapped.status, StatusCode::NOT_FOUND);
        assert_eq!(
            wrapped.message,
            "group status of g: consumer group \"g\" not found on any broker group"
        );
        assert_eq!(
            ApiError::from(anyhow::anyhow!("something else")).status,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
