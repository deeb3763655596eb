//! The one HTTP server loop every warren listener runs (gateway, node, envd,
//! every admin port): HTTP/1.1 and h2c on one listener, upgrades (WebSocket)
//! passed through, the same timeouts and limits everywhere, and graceful
//! draining at shutdown.
//!
//! It is generic over how connections arrive ([`Accept`]): TCP and Unix
//! listeners implement it here, and a simulated network can implement it
//! in a test, so the same loop runs on real sockets and in simulation.

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A source of connections: a listener, or a simulated one.
pub trait Accept: Send + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;
    /// Who is on the other end, handed to every request's handler.
    type Peer: std::fmt::Debug + Clone + Send + Sync + 'static;

    /// The next connection.
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Io, Self::Peer)>> + Send;
}

impl Accept for TcpListener {
    type Io = TcpStream;
    type Peer = SocketAddr;

    async fn accept(&self) -> std::io::Result<(TcpStream, SocketAddr)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        // Interactive streams (terminals, RPC streams) must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        Ok((stream, peer))
    }
}

impl Accept for UnixListener {
    type Io = UnixStream;
    /// Unix peers are unnamed; who may connect is decided by the socket's
    /// place in the file system.
    type Peer = ();

    async fn accept(&self) -> std::io::Result<(UnixStream, ())> {
        let (stream, _) = UnixListener::accept(self).await?;
        Ok((stream, ()))
    }
}

/// Timeouts and limits every listener gets.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a client may take to send a request's headers (HTTP/1.1),
    /// so a silent connection cannot hold a slot forever.
    pub header_read_timeout: Duration,
    /// How long in-flight requests may finish after shutdown; then the
    /// remaining connections are closed.
    pub drain: Duration,
}

impl Limits {
    /// The header-read timeout every listener uses.
    pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

    /// The standard limits with `drain` for the drain timeout.
    pub fn with_drain(drain: Duration) -> Self {
        Limits {
            header_read_timeout: Self::HEADER_READ_TIMEOUT,
            drain,
        }
    }
}

/// Serves connections from `listener` with `handler` until `shutdown`
/// resolves, then stops accepting (the listener is dropped) and lets
/// in-flight connections finish for up to `limits.drain`.
pub async fn serve<A, H, Fut, B>(
    listener: A,
    handler: H,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
) where
    A: Accept,
    H: Fn(A::Peer, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The timer is what lets hyper enforce the header-read timeout at all.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let handler = handler.clone();
        let who = peer.clone();
        let svc = hyper::service::service_fn(move |req| {
            let fut = handler(who.clone(), req);
            async move { Ok::<_, Infallible>(fut.await) }
        });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(io), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(?peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let drain = limits.drain;
    tracing::debug!(
        connections = graceful.count(),
        ?drain,
        "stopped accepting; draining in-flight requests"
    );
    tokio::select! {
        _ = graceful.shutdown() => tracing::debug!("drained"),
        _ = tokio::time::sleep(drain) => {
            tracing::warn!(?drain, "drain timeout reached; closing the remaining connections");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_client_that_never_sends_its_headers_is_disconnected() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let limits = Limits {
            header_read_timeout: Duration::from_millis(200),
            drain: Duration::from_secs(1),
        };
        let handler =
            |_peer, _req| async { Response::new(http_body_util::Empty::<bytes::Bytes>::new()) };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(
            listener,
            handler,
            async {
                let _ = stopped.await;
            },
            limits,
        ));
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
        // The server gives up on the headers and closes; the read ends
        // (with EOF or a 408) instead of hanging.
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut buf))
            .await
            .expect("the server closes a connection that never sends its headers")
            .ok();
        let text = String::from_utf8_lossy(&buf);
        assert!(buf.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
        let _ = stop.send(());
        server.await.expect("server ends");
    }
}
