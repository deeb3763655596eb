//! The public listeners: HTTP/1.1 and h2c on one port (hyper-util's auto
//! builder, with upgrades for WebSocket), and the same over TLS on each
//! `--public-tls-listen` address (ALPN h2 or http/1.1; the handshake runs
//! on the connection's task under the header-read timeout); each request
//! sent to the control or data plane, and graceful draining at shutdown.
//!
//! A client connection can be made to end with a TCP reset instead of a
//! FIN ([`Abort`]): the proxy asks for it when a response it was streaming
//! over HTTP/1.1 broke off upstream (the sandbox was killed mid-stream).
//! A reset is how HTTP/1.1 says "this response is not complete" as plainly
//! as HTTP/2's stream reset does; clients (the e2b SDKs among them) then
//! see a broken connection rather than a malformed message, and ask the
//! sandbox's health to learn whether it is gone. Over TLS too: an aborted
//! connection sends no close_notify (which would read as a clean end),
//! only the reset.

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
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
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
    /// The connection came through a public TLS listener.
    pub tls: bool,
}

/// A public listener, plain or TLS (`--public-tls-listen`), its
/// connections able to end with a reset.
pub(crate) struct Public {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
}

impl Public {
    /// Plain HTTP (HTTP/1.1 and h2c) on `tcp`.
    pub(crate) fn plain(tcp: TcpListener) -> Public {
        Public { tcp, tls: None }
    }

    /// HTTPS on `tcp` with `config` (ALPN picks HTTP/1.1 or h2).
    pub(crate) fn tls(tcp: TcpListener, config: Arc<rustls::ServerConfig>) -> Public {
        Public {
            tcp,
            tls: Some(TlsAcceptor::from(config)),
        }
    }
}

/// A client connection's transport.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }
}

/// One client connection: a TCP stream, or TLS over one, that is reset,
/// not closed, when its [`Abort`] was set. Once set, the connection
/// refuses further writes and shutdown: a TLS close_notify (or a FIN)
/// would tell the client the response ended cleanly, which it did not.
pub(crate) struct ClientConn {
    stream: Stream,
    abort: Abort,
}

impl ClientConn {
    /// The error a write to an aborted connection gets.
    fn aborted() -> Poll<std::io::Result<()>> {
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the response was cut upstream; the connection is reset",
        )))
    }
}

impl warren_core::server::Accept for Public {
    type Conn = TcpStream;
    type Io = ClientConn;
    type Peer = Peer;

    async fn accept(&self) -> std::io::Result<(TcpStream, Peer)> {
        let (stream, addr) = warren_core::server::Accept::accept(&self.tcp).await?;
        Ok((
            stream,
            Peer {
                addr,
                abort: Abort::default(),
                tls: self.tls.is_some(),
            },
        ))
    }

    fn handshake(
        &self,
        stream: TcpStream,
        peer: Peer,
    ) -> impl Future<Output = std::io::Result<(ClientConn, Peer)>> + Send + 'static {
        let tls = self.tls.clone();
        async move {
            let stream = match tls {
                None => Stream::Plain(stream),
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(tls) => Stream::Tls(Box::new(tls)),
                    Err(e) => {
                        tracing::debug!(peer = %peer.addr, error = %e, "TLS handshake failed");
                        return Err(e);
                    }
                },
            };
            let conn = ClientConn {
                stream,
                abort: peer.abort.clone(),
            };
            Ok((conn, peer))
        }
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
            let _ = self.stream.tcp().set_zero_linger();
        }
    }
}

impl AsyncRead for ClientConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.abort.is_set() {
            return ClientConn::aborted().map_ok(|()| 0);
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.abort.is_set() {
            return ClientConn::aborted();
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.abort.is_set() {
            return ClientConn::aborted();
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.abort.is_set() {
            return ClientConn::aborted().map_ok(|()| 0);
        }
        match &mut this.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Answers one request on either plane and records its metrics.
async fn handle(app: Arc<App>, peer: Peer, mut req: Request<Incoming>) -> Response<Body> {
    let start = tokio::time::Instant::now();
    let (plane, resp) = match target::classify(&req, &app.settings.domain) {
        None => {
            if peer.tls {
                // Links the control plane makes (COPY uploads) use the
                // scheme the client came in with.
                req.headers_mut().insert(
                    http::header::HeaderName::from_static("x-forwarded-proto"),
                    http::HeaderValue::from_static("https"),
                );
            }
            (Plane::Control, control::handle(&app, req).await)
        }
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
    listener: Public,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) {
    let fast = app
        .settings
        .proxy_fast_path
        .then(|| crate::proxy::fast::FastPath::new(app.clone()));
    let handler = move |peer, req| handle(app.clone(), peer, req);
    match fast {
        Some(fast) => {
            warren_core::server::serve_on_front(
                workers, listener, fast, handler, shutdown, limits, metrics,
            )
            .await;
        }
        None => {
            warren_core::server::serve_on(workers, listener, handler, shutdown, limits, metrics)
                .await;
        }
    }
}

/// Serves `listener` on this runtime (no workers, no TLS, no reset on an
/// aborted response): the simulation's gateways (`crate::serve_plain`).
pub(crate) async fn serve_plain<L>(
    app: Arc<App>,
    listener: L,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) where
    L: warren_core::server::Accept<Peer = SocketAddr>,
{
    let handler = move |addr: SocketAddr, req| {
        let peer = Peer {
            addr,
            abort: Abort::default(),
            tls: false,
        };
        handle(app.clone(), peer, req)
    };
    warren_core::server::serve(listener, handler, shutdown, limits, metrics).await;
}
