//! The gRPC codec of every raftmq service: prost, with the encode buffer reserved up front.
//!
//! tonic-prost's encoder writes a message into a buffer that starts at 8 KiB and doubles as it
//! fills, copying what it holds at each step. A batch of messages or a replicated log entry is
//! often 100 KiB and more, so it was copied about twice before it reached the socket. This codec
//! reserves the message's encoded length first, then encodes it once. Decoding is tonic-prost's.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::ProstDecoder;

/// Prost codec whose encoder sizes the buffer for the whole message first.
#[derive(Debug, Clone, Copy)]
pub struct ReservingCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for ReservingCodec<T, U> {
    fn default() -> Self {
        ReservingCodec { _pd: PhantomData }
    }
}

impl<T, U> Codec for ReservingCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ReservingEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ReservingEncoder { _pd: PhantomData }
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::default()
    }
}

/// Encodes `T` into a buffer reserved for its whole encoded length.
#[derive(Debug, Clone, Copy)]
pub struct ReservingEncoder<T> {
    _pd: PhantomData<T>,
}

impl<T: Message> Encoder for ReservingEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
