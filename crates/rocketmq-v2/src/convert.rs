//! Pure message conversion between the v2 wire (`apache.rocketmq.v2.Message`) and raftmq's v1
//! messages, plus the time and digest helpers the conversion needs.
//!
//! A v2 message is stored as one v1 [`v1::Message`]: `key` = its keys joined by a single space,
//! `tag` = its tag, `body`, and `properties` = the user properties plus reserved system
//! properties under the prefix [`RESERVED_PREFIX`] (a user property may not use it):
//!
//! | property | value |
//! |---|---|
//! | `__rmq.msgid` | the client's message id |
//! | `__rmq.born_ts` | born timestamp, ms since the epoch |
//! | `__rmq.born_host` | born host |
//! | `__rmq.enc` | `GZIP` when the body is gzip-encoded (absent = identity) |
//! | `__rmq.type` | the v2 message type number |
//! | `__rmq.keys` | the keys joined by `\u{1}`, only when a key contains a space |
//! | `__rmq.mgroup` | the message group (FIFO), when set |
//! | `__rmq.deliver_at` | the delivery time of a DELAY message, ms since the epoch (`raftmq_proto::DELIVER_AT_PROPERTY`: the broker schedules it) |
//!
//! Delivery ([`to_v2`]) reverses it; whatever is missing (messages sent through v1) takes the
//! store's values: the v1 message id, the store time and host.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use md5::{Digest as _, Md5};
use raftmq_proto::v1;

use crate::codes::Error;
use crate::pb::{self, Code, DigestType, Encoding, MessageType};

/// The prefix of the properties the front stores for itself.
pub const RESERVED_PREFIX: &str = "__rmq.";
/// The stored property holding the client's message id.
pub const P_MSGID: &str = "__rmq.msgid";
const P_BORN_TS: &str = "__rmq.born_ts";
const P_BORN_HOST: &str = "__rmq.born_host";
const P_ENC: &str = "__rmq.enc";
const P_TYPE: &str = "__rmq.type";
pub const P_KEYS: &str = "__rmq.keys";
const P_MGROUP: &str = raftmq_proto::MESSAGE_GROUP_PROPERTY;
/// Separator of `__rmq.keys` (a key may contain spaces, never this).
pub const KEYS_SEP: char = '\u{1}';

/// A v2 message as a v1 message to store. `body_bytes_max` is this node's body limit.
pub fn to_v1(m: &pb::Message, body_bytes_max: u64) -> Result<v1::Message, Error> {
    if m.body.is_empty() {
        return Err(Error::bad_request(
            "the message body is empty: RocketMQ messages need a body",
        ));
    }
    if m.body.len() as u64 > body_bytes_max {
        return Err(Error::refused(
            Code::MessageBodyTooLarge,
            format!(
                "the message body is {} bytes; the limit is {body_bytes_max}",
                m.body.len()
            ),
        ));
    }
    let mut properties = std::collections::BTreeMap::new();
    for (k, v) in &m.user_properties {
        if k.starts_with(RESERVED_PREFIX) {
            return Err(Error::refused(
                Code::IllegalMessagePropertyKey,
                format!("user property {k:?}: the prefix {RESERVED_PREFIX:?} is reserved"),
            ));
        }
        properties.insert(k.clone(), v.clone());
    }
    let default_sys = pb::SystemProperties::default();
    let sys = m.system_properties.as_ref().unwrap_or(&default_sys);
    if sys.keys.iter().any(|k| k.contains(KEYS_SEP)) {
        return Err(Error::refused(
            Code::IllegalMessageKey,
            "a message key contains the control character U+0001",
        ));
    }
    if !sys.message_id.is_empty() {
        properties.insert(P_MSGID.into(), sys.message_id.clone());
    }
    if let Some(ts) = &sys.born_timestamp {
        properties.insert(P_BORN_TS.into(), timestamp_ms(ts).to_string());
    }
    if !sys.born_host.is_empty() {
        properties.insert(P_BORN_HOST.into(), sys.born_host.clone());
    }
    if sys.body_encoding == Encoding::Gzip as i32 {
        properties.insert(P_ENC.into(), "GZIP".into());
    }
    properties.insert(P_TYPE.into(), sys.message_type.to_string());
    if sys.keys.iter().any(|k| k.contains(' ') || k.is_empty()) {
        let joined: Vec<&str> = sys.keys.iter().map(String::as_str).collect();
        properties.insert(P_KEYS.into(), joined.join(&KEYS_SEP.to_string()));
    }
    if let Some(g) = &sys.message_group {
        properties.insert(P_MGROUP.into(), g.clone());
    }
    if let Some(ts) = &sys.delivery_timestamp {
        properties.insert(
            raftmq_proto::DELIVER_AT_PROPERTY.into(),
            timestamp_ms(ts).to_string(),
        );
    }
    Ok(v1::Message {
        key: sys.keys.join(" "),
        tag: sys.tag.clone().unwrap_or_default(),
        body: m.body.clone().into(),
        properties,
    })
}

/// What a delivery adds to a stored message: set for POP receives, absent for pulls.
#[derive(Debug, Clone, Default)]
pub struct Delivery {
    /// The handle to ack or change the invisibility with.
    pub receipt_handle: String,
    /// 1 on the first delivery.
    pub attempt: u32,
    /// How long it stays invisible.
    pub invisible: Duration,
}

/// A stored v1 message as the v2 message delivered to a client. `topic` is echoed from the
/// request (namespace included); `store_host` is the node that served it.
pub fn to_v2(
    m: &v1::StoredMessage,
    topic: &pb::Resource,
    store_host: &str,
    delivery: Option<&Delivery>,
) -> pb::Message {
    let mut user_properties = HashMap::with_capacity(m.properties.len());
    for (k, v) in &m.properties {
        if !k.starts_with(RESERVED_PREFIX) {
            user_properties.insert(k.clone(), v.clone());
        }
    }
    let prop = |k: &str| m.properties.get(k).map(String::as_str);
    let keys: Vec<String> = match prop(P_KEYS) {
        Some(joined) => joined.split(KEYS_SEP).map(str::to_string).collect(),
        None => m
            .key
            .split(' ')
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect(),
    };
    let born_ms = prop(P_BORN_TS)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(m.store_timestamp_ms);
    let gzip = prop(P_ENC) == Some("GZIP");
    let message_type = prop(P_TYPE)
        .and_then(|v| v.parse::<i32>().ok())
        .filter(|t| MessageType::try_from(*t).is_ok() && *t != 0)
        .unwrap_or(MessageType::Normal as i32);
    let sys = pb::SystemProperties {
        tag: (!m.tag.is_empty()).then(|| m.tag.clone()),
        keys,
        message_id: prop(P_MSGID).unwrap_or(&m.msg_id).to_string(),
        body_digest: Some(pb::Digest {
            r#type: DigestType::Md5 as i32,
            checksum: md5_upper_hex(&m.body),
        }),
        body_encoding: if gzip {
            Encoding::Gzip
        } else {
            Encoding::Identity
        } as i32,
        message_type,
        born_timestamp: Some(ms_timestamp(born_ms)),
        born_host: prop(P_BORN_HOST).unwrap_or(store_host).to_string(),
        store_timestamp: Some(ms_timestamp(m.store_timestamp_ms)),
        store_host: store_host.to_string(),
        queue_id: m.queue as i32,
        queue_offset: Some(m.offset as i64),
        receipt_handle: delivery.map(|d| d.receipt_handle.clone()),
        delivery_attempt: Some(delivery.map_or(1, |d| d.attempt.max(1)) as i32),
        invisible_duration: delivery.map(|d| duration(d.invisible)),
        message_group: prop(P_MGROUP).map(str::to_string),
        delivery_timestamp: prop(raftmq_proto::DELIVER_AT_PROPERTY)
            .and_then(|v| v.parse::<u64>().ok())
            .map(ms_timestamp),
        ..Default::default()
    };
    pb::Message {
        topic: Some(topic.clone()),
        user_properties,
        system_properties: Some(sys),
        body: m.body.to_vec(),
    }
}

/// The v2 message type of a message (UNSPECIFIED when it has no system properties).
pub fn message_type(m: &pb::Message) -> i32 {
    m.system_properties.as_ref().map_or(0, |s| s.message_type)
}

/// The MD5 of `body` in upper-case hex, as the clients check it.
pub fn md5_upper_hex(body: &[u8]) -> String {
    let digest = Md5::digest(body);
    let mut s = String::with_capacity(32);
    for b in digest {
        s.push_str(&format!("{b:02X}"));
    }
    s
}

/// Milliseconds since the epoch of a protobuf timestamp (0 before the epoch).
pub fn timestamp_ms(ts: &prost_types::Timestamp) -> u64 {
    if ts.seconds < 0 {
        return 0;
    }
    ts.seconds as u64 * 1000 + (ts.nanos.max(0) as u64) / 1_000_000
}

/// A protobuf timestamp from milliseconds since the epoch.
pub fn ms_timestamp(ms: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The protobuf timestamp of now.
pub fn now_timestamp() -> prost_types::Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    ms_timestamp(ms)
}

/// A protobuf duration.
pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A std duration from a protobuf one (negative = zero).
pub fn std_duration(d: &prost_types::Duration) -> Duration {
    if d.seconds < 0 || (d.seconds == 0 && d.nanos < 0) {
        return Duration::ZERO;
    }
    Duration::new(d.seconds as u64, d.nanos.max(0) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(keys: &[&str], gzip: bool) -> pb::Message {
        pb::Message {
            topic: Some(pb::Resource {
                resource_namespace: "ns".into(),
                name: "TopicTest".into(),
            }),
            user_properties: HashMap::from([
                ("color".to_string(), "red".to_string()),
                ("empty".to_string(), String::new()),
            ]),
            system_properties: Some(pb::SystemProperties {
                tag: Some("TagA".into()),
                keys: keys.iter().map(|k| k.to_string()).collect(),
                message_id: "01AA783AC5AD5859CF07d6a72000000001".into(),
                body_encoding: if gzip {
                    Encoding::Gzip
                } else {
                    Encoding::Identity
                } as i32,
                message_type: MessageType::Normal as i32,
                born_timestamp: Some(ms_timestamp(1_700_000_000_123)),
                born_host: "vm-7".into(),
                ..Default::default()
            }),
            body: b"hello \x00\xff world".to_vec(),
        }
    }

    /// Stores `m` as the broker would (queue 3, offset 42) and delivers it back.
    fn round_trip(m: &pb::Message) -> (v1::Message, pb::Message) {
        let stored = to_v1(m, 1 << 20).unwrap();
        let sm = v1::StoredMessage {
            queue: 3,
            offset: 42,
            msg_id: "v1-id".into(),
            key: stored.key.clone(),
            tag: stored.tag.clone(),
            body: stored.body.clone(),
            properties: stored.properties.clone(),
            store_timestamp_ms: 1_700_000_001_000,
            log_index: 9,
            scheduled: false,
        };
        let d = Delivery {
            receipt_handle: "rh-1".into(),
            attempt: 2,
            invisible: Duration::from_secs(30),
        };
        let back = to_v2(&sm, m.topic.as_ref().unwrap(), "10.0.0.1:10911", Some(&d));
        (stored, back)
    }

    #[test]
    fn t10_round_trip_keeps_every_field_byte_for_byte() {
        for (keys, gzip) in [
            (vec!["k1", "k2"], false),
            (vec!["with space", "k2"], true),
            (vec![], false),
            (vec!["only"], true),
        ] {
            let m = sample(&keys, gzip);
            let (stored, back) = round_trip(&m);
            assert_eq!(stored.tag, "TagA");
            assert_eq!(stored.key, keys.join(" "));
            assert_eq!(back.body, m.body);
            assert_eq!(back.topic, m.topic);
            assert_eq!(
                back.user_properties, m.user_properties,
                "reserved ones stripped"
            );
            let (s, o) = (
                back.system_properties.unwrap(),
                m.system_properties.clone().unwrap(),
            );
            assert_eq!(s.tag, o.tag);
            assert_eq!(s.keys, o.keys, "keys {keys:?}");
            assert_eq!(s.message_id, o.message_id);
            assert_eq!(s.born_timestamp, o.born_timestamp);
            assert_eq!(s.born_host, o.born_host);
            assert_eq!(s.body_encoding, o.body_encoding);
            assert_eq!(s.message_type, MessageType::Normal as i32);
            assert_eq!(s.store_host, "10.0.0.1:10911");
            assert_eq!(s.store_timestamp, Some(ms_timestamp(1_700_000_001_000)));
            assert_eq!(s.queue_id, 3);
            assert_eq!(s.queue_offset, Some(42));
            assert_eq!(s.receipt_handle.as_deref(), Some("rh-1"));
            assert_eq!(s.delivery_attempt, Some(2));
            assert_eq!(
                s.invisible_duration,
                Some(duration(Duration::from_secs(30)))
            );
            let digest = s.body_digest.unwrap();
            assert_eq!(digest.r#type, DigestType::Md5 as i32);
            assert_eq!(digest.checksum, md5_upper_hex(&m.body));
        }
    }

    #[test]
    fn t11_keys_with_spaces_are_kept_apart() {
        let (stored, _) = round_trip(&sample(&["a b", "c"], false));
        assert_eq!(stored.key, "a b c");
        assert_eq!(stored.properties[P_KEYS], "a b\u{1}c");
        let (stored, _) = round_trip(&sample(&["a", "c"], false));
        assert!(!stored.properties.contains_key(P_KEYS));
        assert!(!stored.properties.contains_key(P_ENC));
    }

    #[test]
    fn t12_a_v1_message_gets_the_stores_values() {
        let sm = v1::StoredMessage {
            queue: 1,
            offset: 7,
            msg_id: "v1-id".into(),
            key: "k1 k2".into(),
            tag: String::new(),
            body: b"x".to_vec().into(),
            properties: std::collections::BTreeMap::from([("a".to_string(), "b".to_string())]),
            store_timestamp_ms: 5_000,
            log_index: 1,
            scheduled: false,
        };
        let topic = pb::Resource {
            resource_namespace: String::new(),
            name: "T".into(),
        };
        let m = to_v2(&sm, &topic, "h:1", None);
        let s = m.system_properties.unwrap();
        assert_eq!(s.tag, None);
        assert_eq!(s.keys, ["k1", "k2"]);
        assert_eq!(s.message_id, "v1-id");
        assert_eq!(s.body_encoding, Encoding::Identity as i32);
        assert_eq!(s.message_type, MessageType::Normal as i32);
        assert_eq!(s.born_timestamp, Some(ms_timestamp(5_000)));
        assert_eq!(s.born_host, "h:1");
        assert_eq!(s.delivery_attempt, Some(1));
        assert_eq!(s.receipt_handle, None);
        assert_eq!(m.user_properties.len(), 1);
    }

    #[test]
    fn t13_md5_is_upper_hex() {
        assert_eq!(md5_upper_hex(b""), "D41D8CD98F00B204E9800998ECF8427E");
        assert_eq!(md5_upper_hex(b"hello"), "5D41402ABC4B2A76B9719D911017C592");
    }

    #[test]
    fn t14_refusals() {
        let mut m = sample(&["k"], false);
        m.user_properties.insert("__rmq.msgid".into(), "x".into());
        assert_eq!(
            to_v1(&m, 1 << 20).unwrap_err().code(),
            Code::IllegalMessagePropertyKey
        );
        let mut m = sample(&["k"], false);
        m.body.clear();
        let e = to_v1(&m, 1 << 20).unwrap_err();
        assert_eq!(e.code(), Code::BadRequest);
        assert!(e.to_string().contains("empty"));
        let m = sample(&["k"], false);
        let e = to_v1(&m, 4).unwrap_err();
        assert_eq!(e.code(), Code::MessageBodyTooLarge);
        assert!(e.to_string().contains("limit is 4"), "{e}");
    }

    #[test]
    fn t15_time_helpers() {
        let ts = ms_timestamp(1_234_567);
        assert_eq!(timestamp_ms(&ts), 1_234_567);
        let d = duration(Duration::from_millis(1500));
        assert_eq!(std_duration(&d), Duration::from_millis(1500));
        assert_eq!(
            std_duration(&prost_types::Duration {
                seconds: -1,
                nanos: 0
            }),
            Duration::ZERO
        );
    }
}
