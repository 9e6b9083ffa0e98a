//! What the group's apply-time records cost, counted by a global allocator that counts:
//! - the client message ids stored lately (`SentIds`, for `SendOnce`): heap bytes per id, and
//!   snapshot bytes per id, with the record full (`SENT_IDS_MAX` ids);
//! - the consume-queue index and the lookup index of ids and keys (`msg get|find`): heap bytes
//!   per million messages, with and without ids and keys;
//! - the timer of scheduled messages (DELAY topics): heap bytes per million waiting.
//!
//! Prints the figures; bounds them loosely so a change that makes a record several times larger
//! fails. The tests share the counter, so they run one at a time.

// The one unsafe code in the workspace: a counting allocator that forwards every call to the
// system allocator, for this measurement only.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use raftmq_broker_node::command::{Command, StoredBody};
use raftmq_broker_node::state::{BrokerState, SENT_IDS_MAX};
use raftmq_raft_log::StateMachine;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// A group that stored `ids` messages through `SendOnce`, each with an id like the official
/// clients' (34 hex digits), in batches of 100. Bodies are not kept by the state (only runs).
fn state_with(ids: usize) -> BrokerState {
    let mut st = BrokerState::default();
    st.apply(
        1,
        1,
        &Command::CreateTopic {
            name: "t".into(),
            queues: 1,
            update: false,
        }
        .encode(),
    );
    for b in 0..ids.div_ceil(100) {
        let messages = (0..100.min(ids - b * 100))
            .map(|i| StoredBody {
                key: String::new(),
                tag: String::new(),
                body: bytes::Bytes::from_static(b"x"),
                properties: vec![(
                    "id".into(),
                    format!("01AA783AC5AD5859CF{:016X}", b * 100 + i),
                )],
            })
            .collect();
        let cmd = Command::SendOnce {
            topic: "t".into(),
            queue: 0,
            producer_id: 0,
            sequence: 0,
            timestamp_ms: 1,
            id_property: "id".into(),
            messages,
        };
        st.apply(2 + b as u64, 1, &cmd.encode());
    }
    st
}

/// The counter is global: one measurement at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn sent_ids_cost_per_id_in_memory_and_in_a_snapshot() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = SENT_IDS_MAX;
    // The same state without ids (plain sends) tells what the ids add.
    let before = LIVE.load(Ordering::Relaxed);
    let with_ids = state_with(n);
    let with = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(with_ids.sent_ids.len(), n);
    let snapshot = with_ids.snapshot();
    let count = with_ids.sent_ids.len();
    drop(with_ids);
    let before = LIVE.load(Ordering::Relaxed);
    let mut without = state_with(n);
    without.sent_ids = Default::default();
    let base = LIVE.load(Ordering::Relaxed) - before;
    let base_snapshot = without.snapshot().len();
    let per_id_heap = (with - base) as f64 / n as f64;
    let per_id_snapshot = (snapshot.len() - base_snapshot) as f64 / n as f64;
    println!(
        "SentIds with {count} ids: {:.1} MB heap ({per_id_heap:.1} B per id), {:.1} MB in a \
         snapshot ({per_id_snapshot:.1} B per id)",
        (with - base) as f64 / 1e6,
        (snapshot.len() - base_snapshot) as f64 / 1e6,
    );
    assert!(
        per_id_heap < 160.0,
        "{per_id_heap:.1} heap bytes per id (85 measured)"
    );
    assert!(
        per_id_snapshot < 40.0,
        "{per_id_snapshot:.1} snapshot bytes per id (22 measured)"
    );
}

/// A group that stored `n` messages by plain `Send`s of 100, each (when `labelled`) with a client
/// id in `__rmq.msgid` and a key shared by ten messages, as `raftmq bench lookup` stores them.
fn sent_plain(n: usize, labelled: bool) -> BrokerState {
    let mut st = state_with(0);
    for b in 0..n.div_ceil(100) {
        let messages = (0..100.min(n - b * 100))
            .map(|i| {
                let k = b * 100 + i;
                StoredBody {
                    key: if labelled {
                        format!("key-{}", k / 10)
                    } else {
                        String::new()
                    },
                    tag: String::new(),
                    body: bytes::Bytes::from_static(b"x"),
                    properties: if labelled {
                        vec![("__rmq.msgid".into(), format!("id-{k}"))]
                    } else {
                        vec![]
                    },
                }
            })
            .collect();
        let cmd = Command::Send {
            topic: "t".into(),
            queue: 0,
            producer_id: 0,
            sequence: 0,
            timestamp_ms: 1 + b as u64,
            messages,
        };
        st.apply(2 + b as u64, 1, &cmd.encode());
    }
    st
}

#[test]
fn indexes_cost_per_million_messages() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n = 1_000_000;
    let heap = |labelled: bool| {
        let before = LIVE.load(Ordering::Relaxed);
        let st = sent_plain(n, labelled);
        let used = LIVE.load(Ordering::Relaxed) - before;
        let q = st.queue("t", 0).expect("queue 0");
        (used as f64 / 1e6, q.ids.len() + q.keys.len())
    };
    let (plain, none) = heap(false);
    let (labelled, entries) = heap(true);
    assert_eq!(
        none, 0,
        "a message without id or key is not in the lookup index"
    );
    assert_eq!(entries, 2 * n, "one id and one key per message");
    println!(
        "per million messages in batches of 100: {plain:.1} MB of consume-queue index without ids \
         or keys; {labelled:.1} MB with an id and a key each ({:.1} B per message for the lookup \
         index)",
        (labelled - plain) * 1e6 / n as f64
    );
    assert!(
        plain < 5.0,
        "{plain:.1} MB for the runs of a million messages"
    );
    assert!(
        labelled - plain < 40.0,
        "{:.1} MB for a million ids and keys (16 by construction)",
        labelled - plain
    );
}

/// The timer of scheduled messages (DELAY topics): heap bytes per million waiting, scheduled in
/// batches of 100 with times spread over a day (so the index is not filled in order).
#[test]
fn scheduled_messages_cost_per_million() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let n: usize = 1_000_000;
    let before = LIVE.load(Ordering::Relaxed);
    let mut st = BrokerState::default();
    st.apply(
        1,
        1,
        &Command::ConfigureTopic {
            name: "d".into(),
            queues: 8,
            update: false,
            message_type: 2,
        }
        .encode(),
    );
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in 0..n.div_ceil(100) {
        let times: Vec<u64> = (0..100)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                1_800_000_000_000 + x % 86_400_000
            })
            .collect();
        let cmd = Command::Schedule {
            topic: "d".into(),
            queue: (b % 8) as u32,
            producer_id: 0,
            sequence: 0,
            timestamp_ms: 1_700_000_000_000,
            id_property: String::new(),
            deliver_at_ms: times,
            replaces: vec![],
            messages: vec![
                StoredBody {
                    key: String::new(),
                    tag: String::new(),
                    body: bytes::Bytes::from_static(b"x"),
                    properties: vec![],
                };
                100
            ],
        };
        st.apply(2 + b as u64, 1, &cmd.encode());
    }
    let used = LIVE.load(Ordering::Relaxed) - before;
    assert_eq!(st.timer.len(), n);
    let per = used as f64 / n as f64;
    println!(
        "timer with {n} scheduled messages: {:.1} MB heap ({per:.1} B per message)",
        used as f64 / 1e6
    );
    assert!(per < 100.0, "{per:.1} heap bytes per scheduled message");
}
