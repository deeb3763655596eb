//! A listener's own first reader of each connection ([`Front`]), ahead of
//! hyper: it serves what it recognises and hands the connection, with the
//! bytes it read but did not serve ([`Handover::Hyper`]), to hyper for
//! everything else, for good.
//!
//! The gateway's proxy uses one for the HTTP/1.1 requests it can forward
//! without hyper's per-request work (`warren_gateway::proxy::fast`). The
//! watchdog still runs the connection's clock (the front's reads are
//! watched; it marks each request busy with [`FrontConn::begin_request`]),
//! and a drain ends the connection after the request in flight
//! ([`FrontConn::draining`]).

use super::watchdog::{Busy, ConnState};
use bytes::Bytes;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// What a front decided about its connection.
#[derive(Debug)]
pub enum Handover {
    /// The connection is done (the client closed it, a response was cut
    /// off, or the listener is draining).
    Close,
    /// hyper serves the rest of the connection, starting with these bytes
    /// (read from the client, not yet answered), then the stream.
    Hyper(Bytes),
}

/// Reads a listener's connections before hyper does.
pub trait Front<P>: Clone + Send + Sync + 'static {
    /// Serves requests from `io` until it meets one it leaves to hyper, or
    /// the connection ends, and gives `io` back. It must not have written
    /// anything of a request it hands over.
    fn serve<I>(
        &self,
        io: I,
        peer: P,
        conn: Arc<FrontConn>,
    ) -> impl Future<Output = (I, Handover)> + Send + 'static
    where
        I: AsyncRead + AsyncWrite + Send + Unpin + 'static;
}

/// No front: hyper reads every connection from its first byte.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFront;

impl<P> Front<P> for NoFront {
    fn serve<I>(
        &self,
        io: I,
        _peer: P,
        _conn: Arc<FrontConn>,
    ) -> impl Future<Output = (I, Handover)> + Send + 'static
    where
        I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        std::future::ready((io, Handover::Hyper(Bytes::new())))
    }
}

/// What a front may know of its connection's lifecycle.
pub struct FrontConn {
    pub(super) state: Arc<ConnState>,
    pub(super) draining: AtomicBool,
}

/// Marks one request in flight until dropped (no idle timeout meanwhile).
pub struct RequestGuard(#[allow(dead_code)] Busy);

impl FrontConn {
    pub(super) fn new(state: Arc<ConnState>) -> Self {
        FrontConn {
            state,
            draining: AtomicBool::new(false),
        }
    }

    /// A request's head has arrived: the connection is busy until the
    /// guard drops (its response is written).
    pub fn begin_request(&self) -> RequestGuard {
        RequestGuard(self.state.begin_request())
    }

    /// The listener is draining: end the connection after this response
    /// (and say so with `Connection: close`).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}
