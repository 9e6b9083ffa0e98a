//! postcard encoding into a `Vec<u8>` that copies byte strings with `extend_from_slice`.
//!
//! postcard's own `to_extend` appends a byte string through `Extend<u8>` one byte at a time;
//! entry payloads are whole message batches, and that loop showed up at ~2% of a leader's CPU.
//! Snapshots and restart images use it too, into buffers sized ahead: a `Vec<u8>` field meant as
//! one byte string is marked `#[serde(with = "serde_bytes")]` (the same postcard bytes as a
//! sequence of `u8`, written with one copy instead of one push per byte).

use postcard::ser_flavors::Flavor;
use serde::Serialize;

struct VecFlavor(Vec<u8>);

impl Flavor for VecFlavor {
    type Output = Vec<u8>;

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.push(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

/// Appends the postcard encoding of `v` to `out` and returns it: the bytes `postcard::to_extend`
/// would append.
pub fn postcard_extend<T: Serialize + ?Sized>(v: &T, out: Vec<u8>) -> postcard::Result<Vec<u8>> {
    postcard::serialize_with_flavor(v, VecFlavor(out))
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
}
