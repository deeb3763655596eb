//! Request bodies that are still read after an early answer.
//!
//! When envd answers before it has read a request's whole body (a Connect
//! request over the size limit, a bad token), closing the connection at
//! once makes the sender's write fail — and the node, writing the body
//! through, would then report "failed to answer" (502) instead of envd's
//! answer. So the rest of the body is read and thrown away in the
//! background, bounded in bytes and time, while the answer goes out.

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use warren_core::server::Incoming;

/// At most this much of an unwanted body is read after an early answer;
/// past it the connection is closed.
const LIMIT: usize = 64 << 20;
/// For at most this long.
const TIME: Duration = Duration::from_secs(10);

/// Reads and discards what is left of `body` in the background (bounded).
pub fn discard(body: Incoming) {
    if body.is_end_stream() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut body = body;
        let mut seen = 0usize;
        let read = async {
            while let Some(Ok(frame)) = body.frame().await {
                seen += frame.data_ref().map_or(0, |d| d.len());
                if seen > LIMIT {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(TIME, read).await;
    });
}

/// A request body that, dropped before its end, [`discard`]s the rest.
#[derive(Debug)]
pub struct DrainOnDrop {
    /// `None` once dropped (moved into the discarding task).
    inner: Option<Incoming>,
}

impl DrainOnDrop {
    /// Wraps `body`.
    pub fn new(body: Incoming) -> DrainOnDrop {
        DrainOnDrop { inner: Some(body) }
    }
}

impl Body for DrainOnDrop {
    type Data = Bytes;
    type Error = warren_core::server::BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.inner.as_mut() {
            Some(body) => Pin::new(body).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

impl Drop for DrainOnDrop {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take() {
            discard(body);
        }
    }
}
