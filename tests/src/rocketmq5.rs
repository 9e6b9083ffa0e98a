//! What the tests of the official RocketMQ 5 clients share (`t80_rocketmq5_python.rs`,
//! `t85_rocketmq5_rust.rs`): each client program prints one JSON object, read with these.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// The list `key` of a client's JSON output; panics naming the key and the output.
pub fn list<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no list {key:?} in {v}"))
}

/// The string `key` of a client's JSON output; panics naming the key and the output.
pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("no string {key:?} in {v}"))
}

/// Deliveries grouped by message id (`"id"`).
pub fn by_id(deliveries: &[Value]) -> BTreeMap<String, Vec<&Value>> {
    let mut m: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for d in deliveries {
        m.entry(str_of(d, "id").to_string()).or_default().push(d);
    }
    m
}

/// Waits at most `timeout` until a client's progress file (a count of successful sends it
/// rewrites as it goes) says at least `at_least`.
pub async fn wait_for_progress(file: &Path, at_least: u64, timeout: Duration) {
    let read = || {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    crate::wait_for(&format!("{at_least} successful sends"), timeout, || async {
        (read() >= at_least).then_some(())
    })
    .await;
}
