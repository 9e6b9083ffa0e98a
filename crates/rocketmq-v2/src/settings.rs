//! Pure decisions about client settings and timing: the server's answer to a client's
//! `Settings` on the Telemetry stream, and how long a receive may long-poll.
//!
//! Both official clients take the server's Settings reply as the truth: the Python producer
//! overwrites its body limit with `publishing.max_body_size` (an empty reply makes every send fail
//! with "max size=0"), and its push consumer takes `long_polling_timeout`, `fifo` and the backoff
//! from it. So every server-side field is always filled.

use std::time::Duration;

use raftmq_proto::v1;

use crate::convert::duration;
use crate::pb::{self, retry_policy::Strategy, settings::PubSub};

/// The longest a receive waits for a message (RocketMQ's proxy default).
pub const LONG_POLL_MAX: Duration = Duration::from_secs(20);
/// How much earlier than the client's deadline a long poll ends, so the empty answer arrives.
pub const DEADLINE_MARGIN: Duration = Duration::from_secs(1);
/// Messages a consumer is told to receive at once.
pub const RECEIVE_BATCH_SIZE: i32 = 32;
/// The request timeout when the client sends none.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Deliveries of a message before it is dead-lettered, when the group does not say.
pub const MAX_ATTEMPTS_DEFAULT: u32 = 16;
/// RocketMQ's retry ladder, in milliseconds: 1s 5s 10s 30s 1m 2m 3m ... 10m 20m 30m 1h 2h.
pub const RETRY_LADDER_MS: [u64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];

/// Settings with neither publishing nor subscription (the Java proxy refuses them the same way).
#[derive(Debug, PartialEq, Eq)]
pub struct NoPubSub;

/// The server's answer to a client's `Settings`: the client's own, with every server field set.
/// `group` is the consumer group's configuration when known (its fifo flag, attempts, delays).
pub fn merge(
    client: &pb::Settings,
    body_bytes_max: u64,
    group: Option<&v1::GroupConfig>,
) -> Result<pb::Settings, NoPubSub> {
    let mut s = client.clone();
    match s.pub_sub.as_mut() {
        Some(PubSub::Publishing(p)) => {
            p.max_body_size = body_bytes_max.min(i32::MAX as u64) as i32;
            p.validate_message_type = true;
            s.backoff_policy = Some(pb::RetryPolicy {
                max_attempts: 3,
                strategy: Some(Strategy::ExponentialBackoff(pb::ExponentialBackoff {
                    initial: Some(duration(Duration::from_millis(10))),
                    max: Some(duration(Duration::from_secs(1))),
                    multiplier: 2.0,
                })),
            });
        }
        Some(PubSub::Subscription(sub)) => {
            sub.receive_batch_size = Some(RECEIVE_BATCH_SIZE);
            sub.long_polling_timeout = Some(duration(LONG_POLL_MAX));
            sub.fifo = Some(group.is_some_and(|g| g.fifo));
            let max_attempts = group
                .map(|g| g.max_attempts)
                .filter(|&n| n > 0)
                .unwrap_or(MAX_ATTEMPTS_DEFAULT);
            let delays: Vec<u64> = match group {
                Some(g) if !g.retry_delays_ms.is_empty() => g.retry_delays_ms.clone(),
                _ => RETRY_LADDER_MS.to_vec(),
            };
            s.backoff_policy = Some(pb::RetryPolicy {
                max_attempts: max_attempts.min(i32::MAX as u32) as i32,
                strategy: Some(Strategy::CustomizedBackoff(pb::CustomizedBackoff {
                    next: delays
                        .into_iter()
                        .map(|ms| duration(Duration::from_millis(ms)))
                        .collect(),
                })),
            });
        }
        None => return Err(NoPubSub),
    }
    s.metric = Some(pb::Metric {
        on: false,
        endpoints: None,
    });
    if s.request_timeout.is_none() {
        s.request_timeout = Some(duration(REQUEST_TIMEOUT));
    }
    Ok(s)
}

/// The `grpc-timeout` header's value (`digits` + unit `H M S m u n`), or `None` if malformed.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// How long a receive long-polls: what the client asked (or the maximum), at most
/// [`LONG_POLL_MAX`], and ending [`DEADLINE_MARGIN`] before the call's deadline.
pub fn poll_time(requested: Option<Duration>, deadline: Option<Duration>) -> Duration {
    let mut t = requested.unwrap_or(LONG_POLL_MAX).min(LONG_POLL_MAX);
    if let Some(d) = deadline {
        t = t.min(d.saturating_sub(DEADLINE_MARGIN));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn producer() -> pb::Settings {
        pb::Settings {
            client_type: Some(pb::ClientType::Producer as i32),
            pub_sub: Some(PubSub::Publishing(pb::Publishing {
                topics: vec![pb::Resource {
                    resource_namespace: String::new(),
                    name: "T".into(),
                }],
                max_body_size: 128 << 20,
                validate_message_type: true,
            })),
            user_agent: Some(pb::Ua {
                language: pb::Language::Python as i32,
                version: "5.1.2".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn consumer() -> pb::Settings {
        pb::Settings {
            client_type: Some(pb::ClientType::PushConsumer as i32),
            request_timeout: Some(duration(Duration::from_secs(5))),
            pub_sub: Some(PubSub::Subscription(pb::Subscription {
                group: Some(pb::Resource {
                    resource_namespace: String::new(),
                    name: "G".into(),
                }),
                long_polling_timeout: Some(duration(Duration::from_secs(40))),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn t20_producer_settings_get_every_server_field() {
        let s = merge(&producer(), 4 << 20, None).unwrap();
        let Some(PubSub::Publishing(p)) = &s.pub_sub else {
            panic!("publishing lost")
        };
        assert_eq!(p.max_body_size, 4 << 20);
        assert!(p.validate_message_type);
        assert_eq!(p.topics.len(), 1, "the client's topics are kept");
        let b = s.backoff_policy.unwrap();
        assert_eq!(b.max_attempts, 3);
        let Some(Strategy::ExponentialBackoff(e)) = b.strategy else {
            panic!("not exponential")
        };
        assert_eq!(e.initial, Some(duration(Duration::from_millis(10))));
        assert_eq!(e.max, Some(duration(Duration::from_secs(1))));
        assert_eq!(e.multiplier, 2.0);
        assert_eq!(s.metric.map(|m| m.on), Some(false));
        assert_eq!(s.request_timeout, Some(duration(REQUEST_TIMEOUT)));
        assert_eq!(s.user_agent.unwrap().version, "5.1.2");
    }

    #[test]
    fn t21_consumer_settings_default_and_from_the_group() {
        let s = merge(&consumer(), 4 << 20, None).unwrap();
        let Some(PubSub::Subscription(sub)) = &s.pub_sub else {
            panic!("subscription lost")
        };
        assert_eq!(sub.receive_batch_size, Some(32));
        assert_eq!(sub.long_polling_timeout, Some(duration(LONG_POLL_MAX)));
        assert_eq!(sub.fifo, Some(false));
        assert_eq!(sub.group.as_ref().unwrap().name, "G");
        let b = s.backoff_policy.clone().unwrap();
        assert_eq!(b.max_attempts, 16);
        let Some(Strategy::CustomizedBackoff(c)) = b.strategy else {
            panic!("not customized")
        };
        assert_eq!(c.next.len(), 18);
        assert_eq!(c.next[0], duration(Duration::from_secs(1)));
        assert_eq!(c.next[17], duration(Duration::from_secs(7200)));
        assert_eq!(s.metric.map(|m| m.on), Some(false));
        assert_eq!(s.request_timeout, Some(duration(Duration::from_secs(5))));

        let g = v1::GroupConfig {
            name: "G".into(),
            max_attempts: 3,
            retry_delays_ms: vec![100, 200],
            fifo: true,
        };
        let s = merge(&consumer(), 4 << 20, Some(&g)).unwrap();
        let Some(PubSub::Subscription(sub)) = &s.pub_sub else {
            panic!()
        };
        assert_eq!(sub.fifo, Some(true));
        let b = s.backoff_policy.unwrap();
        assert_eq!(b.max_attempts, 3);
        let Some(Strategy::CustomizedBackoff(c)) = b.strategy else {
            panic!()
        };
        assert_eq!(
            c.next,
            [
                duration(Duration::from_millis(100)),
                duration(Duration::from_millis(200))
            ]
        );
    }

    #[test]
    fn t22_settings_without_pub_sub_are_refused() {
        let s = pb::Settings::default();
        assert_eq!(merge(&s, 1, None), Err(NoPubSub));
    }

    #[test]
    fn t23_grpc_timeout_parsing() {
        assert_eq!(parse_grpc_timeout("40S"), Some(Duration::from_secs(40)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("23000m"), Some(Duration::from_secs(23)));
        assert_eq!(
            parse_grpc_timeout("1500u"),
            Some(Duration::from_micros(1500))
        );
        assert_eq!(parse_grpc_timeout("99n"), Some(Duration::from_nanos(99)));
        for bad in ["", "S", "10", "10x", "-1S", "1.5S", "123456789S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn t24_poll_time_is_capped_by_maximum_and_deadline() {
        let s = Duration::from_secs;
        // Rust 5.0.0: asks 40 s with a 40 s deadline.
        assert_eq!(poll_time(Some(s(40)), Some(s(40))), s(20));
        // Python: 20 s with a 23 s deadline.
        assert_eq!(poll_time(Some(s(20)), Some(s(23))), s(20));
        // A short deadline wins, with the margin.
        assert_eq!(poll_time(Some(s(20)), Some(s(5))), s(4));
        assert_eq!(
            poll_time(Some(s(20)), Some(Duration::from_millis(500))),
            s(0)
        );
        assert_eq!(poll_time(None, None), s(20));
        assert_eq!(poll_time(Some(s(3)), None), s(3));
    }
}
