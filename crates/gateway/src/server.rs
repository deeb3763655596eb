//! The public listener: HTTP/1.1 and h2c on one port (hyper-util's auto
//! builder, with upgrades for WebSocket), each request sent to the control
//! or data plane, and graceful draining at shutdown.
//!
//! A client connection can be made to end with a TCP reset instead of a
//! FIN ([`Abort`]): the proxy asks for it when a response it was streaming
//! over HTTP/1.1 broke off upstream (the sandbox was killed mid-stream).
//! A reset is how HTTP/1.1 says "this response is not complete" as plainly
//! as HTTP/2's stream reset does; clients (the e2b SDKs among them) then
//! see a broken connection rather than a malformed message, and ask the
//! sandbox's health to learn whether it is gone.

use crate::metrics::Plane;
use crate::state::App;
use crate::{control, proxy, target};
use http::{Request, Response};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use warren_core::body::Body;
use warren_core::server::{Incoming, Limits, ListenerMetrics, Workers};

/// A switch that makes a client connection end with a TCP reset.
#[derive(Debug, Clone, Default)]
pub struct Abort(Arc<AtomicBool>);

impl Abort {
    /// The connection is to be reset when it closes.
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Who is on the other end of a public connection.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The client's address (`X-Forwarded-For`).
    pub addr: SocketAddr,
    /// Resets the connection when it closes.
    pub abort: Abort,
}

/// The public TCP listener, its connections able to end with a reset.
struct Public(TcpListener);

/// One client connection: a TCP stream that is reset, not closed, when its
/// [`Abort`] was set.
struct ClientConn {
    stream: TcpStream,
    abort: Abort,
}

impl warren_core::server::Accept for Public {
    type Conn = TcpStream;
    type Io = ClientConn;
    type Peer = Peer;

    async fn accept(&self) -> std::io::Result<(TcpStream, Peer)> {
        let (stream, addr) = warren_core::server::Accept::accept(&self.0).await?;
        Ok((
            stream,
            Peer {
                addr,
                abort: Abort::default(),
            },
        ))
    }

    fn handshake(
        &self,
        stream: TcpStream,
        peer: Peer,
    ) -> impl Future<Output = std::io::Result<(ClientConn, Peer)>> + Send + 'static {
        let conn = ClientConn {
            stream,
            abort: peer.abort.clone(),
        };
        std::future::ready(Ok((conn, peer)))
    }

    fn peer_ip(peer: &Peer) -> Option<IpAddr> {
        Some(peer.addr.ip())
    }

    fn rehome(conn: TcpStream) -> std::io::Result<TcpStream> {
        warren_core::server::rehome_tcp(conn)
    }
}

impl Drop for ClientConn {
    fn drop(&mut self) {
        if self.abort.is_set() {
            // SO_LINGER 0: the close below sends RST.
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for ClientConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Answers one request on either plane and records its metrics.
async fn handle(app: Arc<App>, peer: Peer, req: Request<Incoming>) -> Response<Body> {
    let start = tokio::time::Instant::now();
    let (plane, resp) = match target::classify(&req, &app.settings.domain) {
        None => (Plane::Control, control::handle(&app, req).await),
        Some(Err(e)) => (Plane::Data, e.into_response()),
        Some(Ok(t)) => (Plane::Data, proxy::handle(&app, t, &peer, req).await),
    };
    app.metrics
        .observe(plane, resp.status().as_u16(), start.elapsed());
    resp
}

/// Accepts connections under `limits`, each served by one of `workers`,
/// until `shutdown` resolves, then
/// stops accepting and lets in-flight requests finish for up to
/// `limits.drain`.
pub async fn serve(
    app: Arc<App>,
    workers: &Workers,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) {
    let handler = move |peer, req| handle(app.clone(), peer, req);
    warren_core::server::serve_on(
        workers,
        Public(listener),
        handler,
        shutdown,
        limits,
        metrics,
    )
    .await;
}
