//! A leader's append requests on the wire, encoded once.
//!
//! An append travels as a `RaftRequest` whose `payload` is the postcard encoding of openraft's
//! `AppendEntriesRequest`. Built the plain way, each entry's bytes were copied twice per follower
//! on the leader: into the postcard `Vec`, then by prost into gRPC's buffer. [`AppendCodec`]
//! writes the `RaftRequest` fields itself and postcard-encodes the request straight into gRPC's
//! buffer, sized ahead: one copy. The bytes are the ones prost writes for the same `RaftRequest`
//! (t1), so the follower's side is unchanged.

use bytes::BufMut;
use futures::Stream;
use openraft::raft::AppendEntriesRequest;
use prost::Message as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use raftmq_proto::codec::ReservingCodec;
use raftmq_proto::v1::{PeerHeader, RaftReply, RaftRequest};
use tonic::codec::{Codec, EncodeBuf, Encoder, Streaming};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{GrpcMethod, Response, Status};

use crate::encoding::BufFlavor;
use crate::network::PEER_MESSAGE_BYTES_MAX;
use crate::types::TypeConfig;

/// `RaftRequest`'s field numbers (`proto/raftmq/v1/raft.proto`).
const HEADER_FIELD: u32 = 1;
const PAYLOAD_FIELD: u32 = 2;

/// An append request as it goes out: the peer header (on a stream's first request) and openraft's
/// request, with the length of the request's postcard encoding.
pub(crate) struct OutgoingAppend {
    header: Option<PeerHeader>,
    req: AppendEntriesRequest<TypeConfig>,
    /// The payload's length; 0 when the request could not be measured (never seen): it then goes
    /// out with an empty payload, which the follower refuses, ending the stream with an error.
    payload_len: usize,
}

impl OutgoingAppend {
    pub(crate) fn new(header: Option<PeerHeader>, req: AppendEntriesRequest<TypeConfig>) -> Self {
        let payload_len = postcard::experimental::serialized_size(&req).unwrap_or(0);
        OutgoingAppend {
            header,
            req,
            payload_len,
        }
    }

    /// The length of the request's postcard encoding (the `RaftRequest`'s payload).
    pub(crate) fn payload_len(&self) -> usize {
        self.payload_len
    }

    /// Whether the request carries entries.
    pub(crate) fn has_entries(&self) -> bool {
        !self.req.entries.is_empty()
    }

    /// The `RaftRequest` encoding's length.
    fn encoded_len(&self) -> usize {
        let header = self.header.as_ref().map_or(0, |h| {
            let n = h.encoded_len();
            key_len(HEADER_FIELD) + encoded_len_varint(n as u64) + n
        });
        let payload = match self.payload_len {
            0 => 0,
            n => key_len(PAYLOAD_FIELD) + encoded_len_varint(n as u64) + n,
        };
        header + payload
    }

    /// Writes the `RaftRequest` encoding into `buf`.
    fn encode(&self, buf: &mut impl BufMut) -> postcard::Result<()> {
        if let Some(h) = &self.header {
            prost::encoding::message::encode(HEADER_FIELD, h, buf);
        }
        if self.payload_len > 0 {
            encode_key(PAYLOAD_FIELD, WireType::LengthDelimited, buf);
            encode_varint(self.payload_len as u64, buf);
            postcard::serialize_with_flavor(&self.req, BufFlavor(buf))?;
        }
        Ok(())
    }
}

/// The length of a field's key (its number and wire type).
fn key_len(field: u32) -> usize {
    encoded_len_varint(u64::from(field << 3))
}

/// The codec of a leader's append stream: [`OutgoingAppend`]s out, `RaftReply`s in (decoded as
/// every other reply is).
#[derive(Default)]
pub(crate) struct AppendCodec;

impl Codec for AppendCodec {
    type Encode = OutgoingAppend;
    type Decode = RaftReply;
    type Encoder = AppendEncoder;
    type Decoder = <ReservingCodec<RaftRequest, RaftReply> as Codec>::Decoder;

    fn encoder(&mut self) -> AppendEncoder {
        AppendEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        ReservingCodec::<RaftRequest, RaftReply>::default().decoder()
    }
}

pub(crate) struct AppendEncoder;

impl Encoder for AppendEncoder {
    type Item = OutgoingAppend;
    type Error = Status;

    fn encode(&mut self, item: OutgoingAppend, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding an append: {e}")))
    }
}

/// Opens a follower's `AppendStream` (what the generated client's `append_stream` does, with
/// [`AppendCodec`]).
pub(crate) async fn open_stream(
    channel: Channel,
    requests: impl Stream<Item = OutgoingAppend> + Send + 'static,
) -> Result<Response<Streaming<RaftReply>>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(format!("peer channel not ready: {e}")))?;
    let mut req = tonic::Request::new(requests);
    req.extensions_mut()
        .insert(GrpcMethod::new("raftmq.v1.RaftPeerService", "AppendStream"));
    let path = PathAndQuery::from_static("/raftmq.v1.RaftPeerService/AppendStream");
    grpc.streaming(req, path, AppendCodec).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{EntryPayload, Payload, log_id};

    fn request(entries: usize) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: openraft::impls::Vote::new_committed(3, 1),
            prev_log_id: Some(log_id(3, 1, 41)),
            entries: (0..entries as u64)
                .map(|i| openraft::Entry {
                    log_id: log_id(3, 1, 42 + i),
                    payload: EntryPayload::Normal(Payload(vec![i as u8; 200 << i].into())),
                })
                .collect(),
            leader_commit: Some(log_id(3, 1, 40)),
        }
    }

    /// t1: the bytes are prost's for the `RaftRequest` the plain way builds, with a header or
    /// without, with entries or without (a heartbeat), and the length is the one written.
    #[test]
    fn t1_encodes_the_raft_request_prost_would() {
        let header = PeerHeader {
            cluster: "c".into(),
            broker: "broker-a".into(),
            from_node_id: 1,
            secret: String::new(),
        };
        for (header, entries) in [
            (Some(header.clone()), 3),
            (None, 3),
            (None, 0),
            (Some(header), 0),
        ] {
            let req = request(entries);
            let payload = postcard::to_stdvec(&req).unwrap();
            let out = OutgoingAppend::new(header.clone(), req);
            assert_eq!(out.payload_len(), payload.len());
            assert_eq!(out.has_entries(), entries > 0);
            let plain = RaftRequest { header, payload }.encode_to_vec();
            let mut mine = Vec::new();
            out.encode(&mut mine).unwrap();
            assert_eq!(mine.len(), out.encoded_len());
            assert_eq!(mine, plain, "entries {entries}");
        }
    }
}
