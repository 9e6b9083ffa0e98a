//! The per-message hot paths of a send and a pull, one stage at a time, for instruction counts
//! under callgrind (`scripts/instructions`, which runs each stage at two batch counts and divides
//! the difference by the messages: set-up cancels out). Counts of instructions, unlike times, are
//! the same from run to run on a shared machine.
//!
//! Usage: `hot_paths <stage> <batches>`; each batch is 64 messages of 256 bytes with a tag and a
//! client message id (as RocketMQ 5 clients send them). Stages, in the order a message meets them:
//! - `encode`: the client builds the `raftmq.v1.SendRequest` and encodes it (prost);
//! - `decode`: the leader decodes it, checks it (`validate_send`) and encodes the `Send` command
//!   (postcard), the entry's payload;
//! - `append`: the log store encodes the entry's record (header, CRC-32; the entry's bytes are
//!   written from where they lie) as an append does before its write (the write and fsync are
//!   system calls, not counted);
//! - `apply`: the state machine applies the entry (offsets, consume-queue run, tag hashes, id
//!   index, producer window);
//! - `pull`: a pull of the batch: the entry viewed, its messages built and the `PullResponse`
//!   encoded.
//!
//! Every stage also runs the ones before it that make its input, with `none` making them all
//! without the stage itself: `scripts/instructions` subtracts.
//!
//! Two more stages measure a producer spread over many queues, as `bench produce --topics 1000`
//! is: `spread` applies `SendMany` entries of 64 parts, one message each, to 64 consecutive
//! queues of 1,000 topics × 8 queues (each queue its own producer window, its sequence rising),
//! after a first round over every queue; `spread-none` makes the same first round and builds the
//! counted entries without applying them. `spread-follower` applies them as a follower does, with
//! no reply built (`StateMachine::try_apply_unanswered`: no proposer waits on a follower's).

use bytes::Bytes;
use prost::Message as _;
use raftmq_broker_node::command::{Command, SendPart};
use raftmq_broker_node::config::Limits;
use raftmq_broker_node::service::reads::run_messages;
use raftmq_broker_node::service::send::{stored_bodies, validate_send};
use raftmq_broker_node::state::BrokerState;
use raftmq_proto::v1::{Message, PullResponse, SendRequest};
use raftmq_raft_log::StateMachine;
use raftmq_raft_log::log_store::record;
use raftmq_raft_log::types::{EntryPayload, Payload, log_id};
use raftmq_rocketmq_v2::convert::P_MSGID;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BATCH: usize = 64;
const BODY: usize = 256;

fn request(batch: u64) -> SendRequest {
    SendRequest {
        topic: "bench".into(),
        queue: (batch % 8) as u32,
        producer_id: 7,
        sequence: batch,
        messages: (0..BATCH)
            .map(|i| Message {
                key: String::new(),
                tag: "TagA".into(),
                body: vec![b'x'; BODY].into(),
                properties: [(P_MSGID.to_string(), format!("id-{batch}-{i}"))].into(),
            })
            .collect(),
        ..Default::default()
    }
}

/// Topics and queues of the `spread` stages.
const SPREAD_TOPICS: u64 = 1000;
const SPREAD_QUEUES: u64 = 8;

/// How the `spread` stages treat the counted entries.
#[derive(Clone, Copy)]
enum Spread {
    /// Built, not applied.
    None,
    /// Applied with the reply a leader hands its proposer.
    Leader,
    /// Applied as a follower does: no reply.
    Follower,
}

/// The `spread` stages.
fn spread(batches: u64, mode: Spread) -> usize {
    let mut state = BrokerState::default();
    for t in 0..SPREAD_TOPICS {
        state.apply(
            t + 1,
            1,
            &Command::CreateTopic {
                name: format!("bench-{t}"),
                queues: SPREAD_QUEUES as u32,
                update: false,
            }
            .encode(),
        );
    }
    let lanes = SPREAD_TOPICS * SPREAD_QUEUES;
    // A first round over every queue opens their producer windows (set-up, at every count).
    let warm_up = lanes / BATCH as u64;
    let mut sink = 0usize;
    for b in 0..warm_up + batches {
        let index = SPREAD_TOPICS + 1 + b;
        let parts = (0..BATCH as u64)
            .map(|i| {
                let lane = (b * BATCH as u64 + i) % lanes;
                SendPart {
                    topic: format!("bench-{}", lane / SPREAD_QUEUES),
                    queue: (lane % SPREAD_QUEUES) as u32,
                    producer_id: lane + 1,
                    sequence: b * BATCH as u64 / lanes + 1,
                    count: 1,
                }
            })
            .collect();
        let payload = Command::SendMany {
            timestamp_ms: 1_700_000_000_000 + b,
            parts,
            messages: stored_bodies(request(b).messages),
        }
        .encode();
        // The first round is applied as a leader does in every stage (set-up).
        sink += match mode {
            Spread::None if b >= warm_up => payload.len(),
            Spread::Follower if b >= warm_up => {
                state
                    .try_apply_unanswered(index, 1, &payload)
                    .expect("applies");
                state.last_applied as usize
            }
            _ => state.apply(index, 1, &payload).len(),
        };
    }
    sink
}

fn main() {
    let mut args = std::env::args().skip(1);
    let stage = args.next().unwrap_or_default();
    let batches: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100);
    if let Some(mode) = match stage.as_str() {
        "spread" => Some(Spread::Leader),
        "spread-follower" => Some(Spread::Follower),
        "spread-none" => Some(Spread::None),
        _ => None,
    } {
        let sink = spread(batches, mode);
        println!("{stage} {batches} batches: {sink} bytes");
        return;
    }
    let order = ["none", "encode", "decode", "append", "apply", "pull"];
    let Some(upto) = order.iter().position(|s| *s == stage) else {
        eprintln!(
            "usage: hot_paths <{}|spread-none|spread|spread-follower> <batches>",
            order.join("|")
        );
        std::process::exit(2);
    };
    let limits = Limits::default();
    let mut state = BrokerState::default();
    state.apply(
        1,
        1,
        &Command::CreateTopic {
            name: "bench".into(),
            queues: 8,
            update: false,
        }
        .encode(),
    );
    let mut records = record::Records::default();
    let mut sink = 0usize;
    for b in 0..batches {
        let index = b + 2;
        let req = request(b);
        if upto < 1 {
            sink += req.messages.len();
            continue;
        }
        // encode
        let wire = Bytes::from(req.encode_to_vec());
        if upto < 2 {
            sink += wire.len();
            continue;
        }
        // decode
        let req = SendRequest::decode(wire).expect("decodes");
        validate_send(&req, &limits).expect("valid");
        let payload = Bytes::from(
            Command::Send {
                topic: req.topic,
                queue: req.queue,
                producer_id: req.producer_id,
                sequence: req.sequence,
                timestamp_ms: 1_700_000_000_000 + b,
                messages: stored_bodies(req.messages),
            }
            .encode(),
        );
        if upto < 3 {
            sink += payload.len();
            continue;
        }
        // append
        records.clear();
        records
            .push(
                &log_id(1, 1, index),
                &EntryPayload::Normal(Payload(payload.clone())),
            )
            .expect("encodes");
        sink += records.slices().map(<[u8]>::len).sum::<usize>();
        if upto < 4 {
            continue;
        }
        // apply
        sink += state.apply(index, 1, &payload).len();
        if upto < 5 {
            continue;
        }
        // pull
        let q = state.queue("bench", (b % 8) as u32).expect("queue");
        let run = *q.runs.last().expect("a run");
        let mut messages = Vec::with_capacity(BATCH);
        run_messages(
            "broker-a",
            (b % 8) as u32,
            &run,
            &payload,
            run.first_offset,
            1000,
            &mut messages,
        )
        .expect("a send");
        let resp = PullResponse {
            next_offset: run.first_offset + run.count as u64,
            messages,
            ..Default::default()
        };
        sink += resp.encode_to_vec().len();
    }
    // Keeps the work from being optimised away; the script reads callgrind's totals.
    println!("{stage} {batches} batches: {sink} bytes");
}
