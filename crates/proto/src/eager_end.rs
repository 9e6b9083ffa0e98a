//! A client channel whose requests say they have ended together with their last frame.
//!
//! tonic encodes a request as a stream that learns it is done only when polled once more after
//! its one message. hyper asks the body whether it has ended right after taking each frame, so
//! a unary call went out as three writes: the headers, the message's DATA frame, and an empty
//! DATA frame to end the stream (strace of a producer one send at a time: 3 `writev` per send).
//! [`EagerEnd`] looks one frame ahead as it hands a frame over, so the message's frame is the
//! one that ends the stream and the empty one is never sent (2 `writev` per send). Streaming
//! calls pass through unchanged in content and order: the frame looked ahead at is handed over
//! next, and a body not yet ready is simply polled again.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;

/// A tower service around a channel (`EagerEnd(channel)`) that wraps every request body in a
/// look-ahead (see the module docs).
#[derive(Debug, Clone)]
pub struct EagerEnd<S>(pub S);

impl<S> tower_service::Service<http::Request<Body>> for EagerEnd<S>
where
    S: tower_service::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        self.0.call(req.map(|body| Body::new(LookAhead::new(body))))
    }
}

/// A body that, handing over a frame, polls its inner body once more so that
/// [`HttpBody::is_end_stream`] is already true with the last frame.
struct LookAhead {
    inner: Body,
    /// What the look-ahead found: the next frame or error, handed over on the next poll.
    next: Option<Result<Frame<Bytes>, Status>>,
    /// The inner body has ended (it returned `None`).
    ended: bool,
}

impl LookAhead {
    fn new(inner: Body) -> Self {
        LookAhead {
            inner,
            next: None,
            ended: false,
        }
    }
}

impl HttpBody for LookAhead {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let current = match this.next.take() {
            Some(found) => found,
            None if this.ended => return Poll::Ready(None),
            None => match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(found) => found,
                None => {
                    this.ended = true;
                    return Poll::Ready(None);
                }
            },
        };
        if current.is_ok() && !this.ended {
            // Pending leaves nothing found: the inner body is polled again on the next call.
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(None) => this.ended = true,
                Poll::Ready(Some(found)) => this.next = Some(found),
                Poll::Pending => {}
            }
        }
        Poll::Ready(Some(current))
    }

    fn is_end_stream(&self) -> bool {
        self.next.is_none() && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let held = match &self.next {
            Some(Ok(frame)) => frame.data_ref().map_or(0, |d| d.len() as u64),
            _ => 0,
        };
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(held));
        }
        hint.set_lower(inner.lower().saturating_add(held));
        hint
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// A body that answers each poll with the next scripted step: `Some(bytes)` a DATA frame,
    /// `None` not ready yet. It ends when the script runs out, and never says so beforehand (as
    /// tonic's encoded streams do not).
    struct Scripted(VecDeque<Option<&'static str>>);

    impl HttpBody for Scripted {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            match self.0.pop_front() {
                None => Poll::Ready(None),
                Some(None) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
                Some(Some(s)) => {
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(s.as_bytes())))))
                }
            }
        }
    }

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Polls `body` until it ends; after each poll that hands over data, records the data and
    /// whether the body said it had ended.
    fn drain(script: &[Option<&'static str>]) -> Vec<(String, bool)> {
        let mut body = LookAhead::new(Body::new(Scripted(script.iter().copied().collect())));
        let waker = std::task::Waker::from(Arc::new(Count(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        let mut out = Vec::new();
        for _ in 0..100 {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(None) => return out,
                Poll::Ready(Some(frame)) => {
                    let data = frame.expect("no error scripted").into_data().expect("data");
                    let text = String::from_utf8(data.to_vec()).expect("utf-8");
                    out.push((text, body.is_end_stream()));
                }
                Poll::Pending => {}
            }
        }
        panic!("the body did not end within 100 polls: {out:?}");
    }

    #[test]
    fn t01_a_single_message_ends_the_stream_with_its_frame() {
        assert_eq!(drain(&[Some("m")]), [("m".to_string(), true)]);
    }

    #[test]
    fn t02_a_stream_keeps_its_frames_and_order_and_ends_with_the_last() {
        let got = drain(&[Some("a"), Some("b"), None, Some("c"), None, None, Some("d")]);
        let want = [("a", false), ("b", false), ("c", false), ("d", true)];
        assert_eq!(
            got,
            want.map(|(s, end)| (s.to_string(), end)).to_vec(),
            "frames out of order, lost, or the end reported early"
        );
    }

    #[test]
    fn t03_a_body_not_ready_after_its_last_frame_ends_on_the_next_poll() {
        // The look-ahead cannot tell yet, so the frame goes without the end, as before.
        assert_eq!(drain(&[Some("m"), None]), [("m".to_string(), false)]);
    }
}
