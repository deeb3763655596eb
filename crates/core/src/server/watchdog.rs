//! The per-connection clock: which phase a connection is in and when that
//! phase runs out.
//!
//! - **head**: from accept (any handshake included), and on a kept-alive
//!   HTTP/1.1 connection from the first byte of a later request, until a
//!   request's head has been parsed: `header_read_timeout`;
//! - **busy**: a request or its response is in flight: no deadline here
//!   (a stalled request body is the body's own timeout, see `body.rs`);
//! - **idle**: nothing in flight since the last response ended:
//!   `idle_timeout`.
//!
//! hyper's own HTTP/1.1 header timeout is not used: it also starts when a
//! kept-alive connection goes idle, which would make the idle timeout the
//! header timeout, and it does not cover the bytes before hyper knows the
//! protocol (hyper-util's HTTP/1-or-2 detection), where a connection that
//! sends nothing would otherwise wait forever.
//!
//! A phase change wakes nobody (it happens on every request, so it must
//! cost only a lock): the watchdog looks again at least every
//! [`ConnState::recheck`] — the shorter of the two timeouts — and every
//! phase's deadline lies at least that far after the phase began, so each
//! deadline is seen before it passes and then slept to exactly.

use super::admission::Slot;
use super::metrics::Timeout;
use super::Limits;
use bytes::Bytes;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    /// This many requests in flight (more than one on HTTP/2).
    Busy(usize),
    Idle,
}

/// One connection's phase, shared by its stream (bytes arriving), its
/// requests (start and end) and its watchdog (the deadline).
pub(crate) struct ConnState {
    phase: Mutex<(Phase, Instant)>,
    /// Mirrors `phase == Idle`, so the read path checks one atomic.
    idle: AtomicBool,
}

/// A request in flight; the connection goes idle when the last one ends.
pub(crate) struct Busy(Arc<ConnState>);

impl ConnState {
    /// A connection accepted at `since`, waiting for its first request head.
    pub(crate) fn new(since: Instant) -> Arc<Self> {
        Arc::new(ConnState {
            phase: Mutex::new((Phase::Head, since)),
            idle: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Phase, Instant)> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request's head was parsed.
    pub(crate) fn begin_request(self: &Arc<Self>) -> Busy {
        let mut p = self.lock();
        p.0 = match p.0 {
            Phase::Busy(n) => Phase::Busy(n + 1),
            Phase::Head | Phase::Idle => Phase::Busy(1),
        };
        self.idle.store(false, Ordering::Release);
        Busy(self.clone())
    }

    /// Bytes arrived on an HTTP/1.1 connection: if it was idle, a new
    /// request has begun and its head must arrive in time.
    /// Whether a request is in flight.
    pub(crate) fn is_busy(&self) -> bool {
        matches!(self.lock().0, Phase::Busy(_))
    }

    fn bytes_arrived(&self) {
        if !self.idle.load(Ordering::Acquire) {
            return;
        }
        let mut p = self.lock();
        if p.0 == Phase::Idle {
            *p = (Phase::Head, Instant::now());
            self.idle.store(false, Ordering::Release);
        }
    }

    fn deadline(&self, limits: &Limits) -> Option<(Instant, Timeout)> {
        let (phase, since) = *self.lock();
        match phase {
            Phase::Head => Some((since + limits.header_read_timeout, Timeout::HeaderRead)),
            Phase::Idle => Some((since + limits.idle_timeout, Timeout::Idle)),
            Phase::Busy(_) => None,
        }
    }

    /// The longest the watchdog may sleep without looking at the phase.
    pub(crate) fn recheck(limits: &Limits) -> Duration {
        limits.header_read_timeout.min(limits.idle_timeout)
    }

    /// Which timeout has run out now, or when to look again.
    pub(crate) fn check(&self, limits: &Limits) -> Result<Timeout, Instant> {
        let now = Instant::now();
        let again = now + Self::recheck(limits);
        match self.deadline(limits) {
            Some((at, timeout)) if now >= at => Ok(timeout),
            Some((at, _)) => Err(at.min(again)),
            None => Err(again),
        }
    }

    /// Resolves when the connection's current phase has run out, with
    /// which timeout it was.
    pub(crate) async fn expired(&self, limits: &Limits) -> Timeout {
        loop {
            match self.check(limits) {
                Ok(timeout) => return timeout,
                Err(at) => tokio::time::sleep_until(at).await,
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let state = &self.0;
        let mut p = state.lock();
        match p.0 {
            Phase::Busy(n) if n > 1 => p.0 = Phase::Busy(n - 1),
            _ => {
                *p = (Phase::Idle, Instant::now());
                state.idle.store(true, Ordering::Release);
            }
        }
    }
}

/// The HTTP/2 client preface starts with these bytes; no HTTP/1.1 request
/// line does.
const H2_START: &[u8; 4] = b"PRI ";

/// Which protocol the first bytes showed.
enum Sniff {
    /// Fewer than four bytes seen so far.
    Unknown([u8; 4], usize),
    Http1,
    /// Bytes on an idle HTTP/2 connection are pings and settings, not a
    /// new request: they do not start a head phase.
    Http2,
}

/// An accepted stream with its connection's clock and admission slot:
/// bytes arriving move the clock, and dropping the stream (also after an
/// upgrade, which takes it over) frees the slot. Bytes a listener's front
/// read and handed back ([`Watched::rewind`]) are read again first.
pub(crate) struct Watched<Io> {
    io: Io,
    state: Arc<ConnState>,
    sniff: Sniff,
    /// Read before `io` (already seen by the clock).
    prefix: Bytes,
    _slot: Slot,
}

impl<Io> Watched<Io> {
    pub(crate) fn new(io: Io, state: Arc<ConnState>, slot: Slot) -> Self {
        Watched {
            io,
            state,
            sniff: Sniff::Unknown([0; 4], 0),
            prefix: Bytes::new(),
            _slot: slot,
        }
    }

    /// `prefix` is read next, before the stream's own bytes.
    pub(crate) fn rewind(&mut self, prefix: Bytes) {
        self.prefix = prefix;
    }

    fn arrived(&mut self, bytes: &[u8]) {
        if let Sniff::Unknown(mut seen, mut n) = self.sniff {
            for &b in bytes.iter().take(4 - n) {
                seen[n] = b;
                n += 1;
            }
            self.sniff = if seen[..n] != H2_START[..n] {
                Sniff::Http1
            } else if n == 4 {
                Sniff::Http2
            } else {
                Sniff::Unknown(seen, n)
            };
        }
        if !matches!(self.sniff, Sniff::Http2) {
            self.state.bytes_arrived();
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Watched<Io> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            if let Some(new) = buf.filled().get(before..).filter(|b| !b.is_empty()) {
                this.arrived(new);
            }
        }
        polled
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Watched<Io> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_rewound_stream_reads_its_prefix_first() {
        let metrics = super::super::Metrics::register(&mut Default::default()).listener("test");
        let slot = super::super::Admission::new(1, None, metrics)
            .admit(None)
            .expect("a slot");
        let (mut a, b) = tokio::io::duplex(64);
        a.write_all(b" world").await.expect("write");
        drop(a);
        let mut w = Watched::new(b, ConnState::new(Instant::now()), slot);
        w.rewind(Bytes::from_static(b"hello"));
        let mut s = String::new();
        w.read_to_string(&mut s).await.expect("read");
        assert_eq!(s, "hello world");
    }

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(100),
            ..Limits::new(1, Duration::ZERO)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn phases_set_the_deadline() {
        let limits = limits();
        let start = Instant::now();
        let state = ConnState::new(start);
        // A silent connection: the header timeout.
        assert_eq!(state.expired(&limits).await, Timeout::HeaderRead);
        assert_eq!(Instant::now() - start, Duration::from_secs(10));

        // A request in flight has no deadline; when it ends, idle starts.
        let busy = state.begin_request();
        let waiter = {
            let state = state.clone();
            tokio::spawn(async move { (state.expired(&limits).await, Instant::now()) })
        };
        tokio::time::sleep(Duration::from_secs(500)).await;
        let ended = Instant::now();
        drop(busy);
        let (timeout, at) = waiter.await.expect("watchdog");
        assert_eq!(timeout, Timeout::Idle);
        assert_eq!(at - ended, Duration::from_secs(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_request_on_an_idle_connection_gets_the_header_timeout() {
        let limits = limits();
        let state = ConnState::new(Instant::now());
        drop(state.begin_request());
        tokio::time::sleep(Duration::from_secs(50)).await;
        let first_byte = Instant::now();
        state.bytes_arrived();
        assert_eq!(state.expired(&limits).await, Timeout::HeaderRead);
        assert_eq!(Instant::now() - first_byte, Duration::from_secs(10));
    }
}
