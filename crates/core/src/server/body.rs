//! Request bodies under the body-progress timeout, and the response body
//! that tells the connection's clock when a request has ended.
//!
//! The clock runs only while the handler waits for body bytes (a poll that
//! finds none) and has not answered yet: a handler busy elsewhere, or a
//! stream whose answer is already flowing (interactive input), is not a
//! stalled client.

use super::watchdog::Busy;
use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The client sent nothing for this long while the body was awaited;
    /// the request is answered `408`.
    #[error("the request body sent nothing for {0:?}")]
    Stalled(Duration),
    /// The connection failed or the body was malformed.
    #[error(transparent)]
    Read(#[from] hyper::Error),
}

/// What a request's body and its server task share.
#[derive(Default)]
pub(crate) struct BodyWatch {
    /// The handler has produced its response: the clock stops for good.
    answered: AtomicBool,
    stalled: AtomicBool,
    /// Wakes the server task once the body has stalled (an atomic waker,
    /// not a `Notify`: the task polls this every time it runs).
    stall: AtomicWaker,
}

impl BodyWatch {
    pub(crate) fn answer(&self) {
        self.answered.store(true, Ordering::Release);
    }

    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// Resolves once the body has stalled.
    pub(crate) async fn stalled(&self) {
        std::future::poll_fn(|cx| {
            self.stall.register(cx.waker());
            if self.is_stalled() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

/// The body of a request on a warren listener: hyper's body, abandoned
/// with [`BodyError::Stalled`] when it makes no progress for the
/// listener's body-progress timeout while the handler waits for it.
pub struct Incoming {
    inner: hyper::body::Incoming,
    timeout: Duration,
    /// `None` for a body that was complete (empty) at the request head:
    /// it cannot stall.
    watch: Option<Arc<BodyWatch>>,
    /// Armed by the first poll that finds no bytes; disarmed by bytes.
    clock: Option<Pin<Box<Sleep>>>,
    waiting: bool,
}

impl Incoming {
    pub(crate) fn new(inner: hyper::body::Incoming, timeout: Duration) -> (Self, Arc<BodyWatch>) {
        let watch = Arc::new(BodyWatch::default());
        let body = Incoming {
            inner,
            timeout,
            watch: Some(watch.clone()),
            clock: None,
            waiting: false,
        };
        (body, watch)
    }

    /// A body that is already complete (empty at the request head): no
    /// clock and nothing shared with the server task.
    pub(crate) fn ended(inner: hyper::body::Incoming, timeout: Duration) -> Self {
        Incoming {
            inner,
            timeout,
            watch: None,
            clock: None,
            waiting: false,
        }
    }
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("inner", &self.inner)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Body for Incoming {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let Some(watch) = this.watch.as_ref() else {
            return Pin::new(&mut this.inner)
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map_err(BodyError::Read)));
        };
        if watch.is_stalled() {
            return Poll::Ready(Some(Err(BodyError::Stalled(this.timeout))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.waiting = false;
                return Poll::Ready(frame.map(|f| f.map_err(BodyError::Read)));
            }
            Poll::Pending => {}
        }
        if watch.answered.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        let deadline = Instant::now() + this.timeout;
        let clock = match &mut this.clock {
            Some(clock) => {
                if !this.waiting {
                    clock.as_mut().reset(deadline);
                }
                clock
            }
            None => this
                .clock
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        this.waiting = true;
        if clock.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        watch.stalled.store(true, Ordering::Release);
        watch.stall.wake();
        Poll::Ready(Some(Err(BodyError::Stalled(this.timeout))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body as sent: the handler's, or the `408` that replaced it;
/// it holds its request's [`Busy`] mark until it is finished or dropped.
pub(crate) struct Reply<B> {
    body: Either<B>,
    _busy: Busy,
}

enum Either<B> {
    Handler(B),
    Stalled(http_body_util::Full<Bytes>),
}

impl<B> Reply<B> {
    pub(crate) fn handler(body: B, busy: Busy) -> Self {
        Reply {
            body: Either::Handler(body),
            _busy: busy,
        }
    }

    pub(crate) fn stalled(body: Bytes, busy: Busy) -> Self {
        Reply {
            body: Either::Stalled(http_body_util::Full::new(body)),
            _busy: busy,
        }
    }
}

impl<B> Body for Reply<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<crate::body::BoxError>,
{
    type Data = Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.get_mut().body {
            Either::Handler(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Into::into))),
            Either::Stalled(b) => Pin::new(b)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|never| match never {}))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Either::Handler(b) => b.is_end_stream(),
            Either::Stalled(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.body {
            Either::Handler(b) => b.size_hint(),
            Either::Stalled(b) => b.size_hint(),
        }
    }
}
