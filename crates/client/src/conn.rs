//! One lazily connected gRPC channel per address, shared by every task of a client.
//!
//! Channels reconnect by themselves after the peer restarts, so a cached channel stays valid; a
//! call on a dead peer fails quickly with a transport error that the retry loops handle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use raftmq_proto::v1::nameserver_service_client::NameserverServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};

/// Replies (pulls of large messages) may be far above tonic's 4 MiB default: the contract's cap.
pub(crate) const MESSAGE_BYTES_MAX: usize = raftmq_proto::limits::GRPC_MESSAGE_BYTES_MAX;

/// Channels by address.
#[derive(Clone)]
pub(crate) struct Pool {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// A local or LAN peer that has not accepted a connection in this long is treated as down.
    connect_timeout: Duration,
}

/// `host:port` → `http://host:port`; an address with a scheme is kept as is.
pub(crate) fn endpoint_uri(address: &str) -> String {
    if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

impl Pool {
    pub(crate) fn new(connect_timeout: Duration) -> Self {
        Pool {
            channels: Arc::default(),
            connect_timeout,
        }
    }

    pub(crate) fn channel(&self, address: &str) -> Result<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = channels.get(address) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(endpoint_uri(address))
            .map_err(|error| Error::InvalidAddress {
                address: address.to_string(),
                reason: error_chain(&error),
            })?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            // Pulls of many large messages: h2's 64 KiB default windows stall them.
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(16 << 20)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5));
        let channel = endpoint.connect_lazy();
        channels.insert(address.to_string(), channel.clone());
        Ok(channel)
    }

    pub(crate) fn nameserver(&self, address: &str) -> Result<NameserverServiceClient<Channel>> {
        Ok(NameserverServiceClient::new(self.channel(address)?)
            .max_decoding_message_size(MESSAGE_BYTES_MAX))
    }
}

/// A request with a deadline that the server sees too (`grpc-timeout`).
pub(crate) fn request<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

/// The `call` of `Router::call_leader`: every attempt sends `rpc` a copy of `msg` as a
/// [`request`] told the attempt's timeout.
pub(crate) fn each_attempt<T, F, Fut>(msg: &T, mut rpc: F) -> impl FnMut(Channel, Duration) -> Fut
where
    T: Clone,
    F: FnMut(Channel, tonic::Request<T>) -> Fut,
{
    move |ch, t| rpc(ch, request(msg.clone(), t))
}

/// An error and its causes on one line, outermost first (tonic's transport error says only
/// "transport error"; what was wrong is in its source).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(c) = cause {
        let next = c.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_get_a_scheme() {
        assert_eq!(endpoint_uri("127.0.0.1:9876"), "http://127.0.0.1:9876");
        assert_eq!(endpoint_uri("https://ns:9876"), "https://ns:9876");
    }

    #[test]
    fn an_invalid_address_names_the_address_and_its_cause_once() {
        let pool = Pool::new(Duration::from_secs(1));
        let err = pool.channel("bad host:1").unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("invalid address \"bad host:1\": "),
            "{text}"
        );
        assert!(
            text.contains("invalid uri character"),
            "the cause is shown: {text}"
        );
        assert!(std::error::Error::source(&err).is_none());
        let words: Vec<&str> = text.split(": ").collect();
        let mut unique = words.clone();
        unique.dedup();
        assert_eq!(words, unique, "a cause repeated: {text}");
    }
}
