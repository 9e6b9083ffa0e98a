//! postcard encoding into a `Vec<u8>` that copies byte strings with `extend_from_slice`.
//!
//! postcard's own `to_extend` appends a byte string through `Extend<u8>` one byte at a time;
//! entry payloads are whole message batches, and that loop showed up at ~2% of a leader's CPU.
//! Snapshots and restart images use it too, into buffers sized ahead: a `Vec<u8>` field meant as
//! one byte string is marked `#[serde(with = "serde_bytes")]` (the same postcard bytes as a
//! sequence of `u8`, written with one copy instead of one push per byte).
//!
//! [`decode_shared`] decodes a value whose [`Payload`](crate::types::Payload)s are slices of the
//! buffer it decodes (a follower's append request, a segment's records read at once), where a
//! plain decode copies every payload out of it.

use std::cell::RefCell;
use std::fmt;

use bytes::{BufMut, Bytes};
use postcard::ser_flavors::Flavor;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// postcard appending to a `BufMut` (a `Vec<u8>`, gRPC's encode buffer), a byte string with one
/// copy.
pub(crate) struct BufFlavor<'a, B>(pub(crate) &'a mut B);

impl<B: BufMut> Flavor for BufFlavor<'_, B> {
    type Output = ();

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.put_slice(data);
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.put_u8(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends the postcard encoding of `v` to `out` and returns it: the bytes `postcard::to_extend`
/// would append.
pub fn postcard_extend<T: Serialize + ?Sized>(
    v: &T,
    mut out: Vec<u8>,
) -> postcard::Result<Vec<u8>> {
    postcard::serialize_with_flavor(v, BufFlavor(&mut out))?;
    Ok(out)
}

thread_local! {
    /// The buffer [`decode_shared`] is decoding on this thread, if any.
    static SHARED: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Decodes `T` from `buf` (postcard), every [`Payload`](crate::types::Payload) in it a slice of
/// `buf`: no payload is copied, and each keeps `buf`'s memory alive while it lives.
pub fn decode_shared<T: DeserializeOwned>(buf: &Bytes) -> postcard::Result<T> {
    /// Clears the buffer when the decode ends, or unwinds.
    struct Reset(Option<Bytes>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let prev = self.0.take();
            SHARED.with(|s| *s.borrow_mut() = prev);
        }
    }
    let _reset = Reset(SHARED.with(|s| s.borrow_mut().replace(buf.clone())));
    postcard::from_bytes(buf)
}

/// Deserializes a byte string as `Bytes`: a slice of the buffer [`decode_shared`] decodes when it
/// borrows from it, else a copy (as `Bytes`'s own `Deserialize` does).
pub(crate) struct SharedBytes;

impl<'de> serde::de::Visitor<'de> for SharedBytes {
    type Value = Bytes;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a byte string")
    }

    fn visit_borrowed_bytes<E: serde::de::Error>(self, v: &'de [u8]) -> Result<Bytes, E> {
        let shared = SHARED.with(|s| {
            s.borrow().as_ref().and_then(|buf| {
                let range = buf.as_ptr_range();
                let inside = range.start <= v.as_ptr() && v.as_ptr_range().end <= range.end;
                inside.then(|| buf.slice_ref(v))
            })
        });
        Ok(shared.unwrap_or_else(|| Bytes::copy_from_slice(v)))
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
        Ok(Bytes::copy_from_slice(v))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
        Ok(Bytes::from(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Bytes, E> {
        Ok(Bytes::copy_from_slice(v.as_bytes()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(Bytes::from(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_exactly_as_postcard_does() {
        let v = (
            7u64,
            "key",
            bytes::Bytes::from(vec![1u8, 2, 3, 250]),
            vec![9u32; 3],
        );
        let mine = postcard_extend(&v, vec![0xEE]).unwrap();
        let theirs = postcard::to_extend(&v, vec![0xEE]).unwrap();
        assert_eq!(mine, theirs);
    }

    /// Whether `inner` lies within `outer`'s memory.
    fn within(inner: &[u8], outer: &[u8]) -> bool {
        let o = outer.as_ptr_range();
        o.start <= inner.as_ptr() && inner.as_ptr_range().end <= o.end
    }

    #[test]
    fn a_shared_decode_slices_the_payloads_out_of_its_buffer() {
        use crate::types::{EntryPayload, Payload};
        let entries = vec![
            (
                7u64,
                EntryPayload::Normal(Payload(Bytes::from(vec![1u8; 300]))),
            ),
            (8u64, EntryPayload::Blank),
            (
                9u64,
                EntryPayload::Normal(Payload(Bytes::from_static(b"second"))),
            ),
        ];
        let buf = Bytes::from(postcard_extend(&entries, Vec::new()).unwrap());
        let shared: Vec<(u64, EntryPayload)> = decode_shared(&buf).unwrap();
        let copied: Vec<(u64, EntryPayload)> = postcard::from_bytes(&buf).unwrap();
        assert_eq!(shared, entries);
        assert_eq!(copied, entries);
        let payload = |v: &[(u64, EntryPayload)], i: usize| match &v[i].1 {
            EntryPayload::Normal(p) => p.0.clone(),
            other => panic!("entry {i} is {other:?}"),
        };
        for i in [0, 2] {
            assert!(within(&payload(&shared, i), &buf), "entry {i} copied");
            assert!(!within(&payload(&copied, i), &buf), "entry {i} shared");
        }
        // The buffer is forgotten once the decode ends: a later plain decode copies.
        let later: Vec<(u64, EntryPayload)> = postcard::from_bytes(&buf).unwrap();
        assert!(!within(&payload(&later, 0), &buf));
    }

    #[test]
    fn a_shared_decode_of_a_copy_elsewhere_copies_and_bad_bytes_are_an_error() {
        use crate::types::Payload;
        let buf =
            Bytes::from(postcard_extend(&Payload(Bytes::from_static(b"abc")), Vec::new()).unwrap());
        // A decode inside a shared decode of another buffer: its bytes lie outside that buffer.
        let other = Bytes::from(postcard_extend(&7u64, Vec::new()).unwrap());
        let _outer: u64 = decode_shared(&other).unwrap();
        let p: Payload = postcard::from_bytes(&buf).unwrap();
        assert_eq!(&p.0[..], b"abc");
        // A length past the end.
        let err = decode_shared::<Payload>(&Bytes::from_static(&[9, 1, 2])).unwrap_err();
        assert_eq!(err, postcard::Error::DeserializeUnexpectedEnd);
    }
}
