//! The one HTTP server loop every warren listener runs (gateway, node,
//! envd, scheduler, every admin port): HTTP/1.1 and h2c on one listener,
//! upgrades (WebSocket) passed through, the same timeouts and limits
//! everywhere, and graceful draining at shutdown.
//!
//! It is generic over how connections arrive ([`Accept`]): TCP and Unix
//! listeners implement it here, a TLS listener can (its handshake runs on
//! the connection's own task, under the header-read timeout), and a
//! simulated network can in a test, so the same loop runs everywhere.
//!
//! # Layout
//! - this file: [`Accept`], [`serve`] and one connection's task.
//! - [`limits`]: [`Limits`] (header-read, idle and body-progress timeouts,
//!   connection limits, drain), their defaults, the open-file limit.
//! - `admission`: the connection limits, refusing right after accept.
//! - `watchdog`: the per-connection clock (head, busy, idle).
//! - [`body`]: request bodies under the body-progress timeout
//!   ([`Incoming`], what every handler reads).
//! - [`metrics`]: what every listener counts.

pub mod body;
pub mod limits;
pub mod metrics;

mod admission;
mod watchdog;

pub use admission::{Admission, Slot};
pub use body::{BodyError, Incoming};
pub use limits::{raise_fd_limit, Limits};
pub use metrics::{ListenerMetrics, Metrics};

use body::Reply;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use watchdog::{ConnState, Watched};

/// A source of connections: a listener, a TLS listener over one, or a
/// simulated one.
pub trait Accept: Send + 'static {
    /// A connection as accepted, before any handshake.
    type Conn: Send + 'static;
    /// The stream HTTP is spoken on: the accepted connection itself, or,
    /// say, a TLS stream over it.
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;
    /// Who is on the other end, handed to every request's handler.
    type Peer: std::fmt::Debug + Clone + Send + Sync + 'static;

    /// The next connection. It must return quickly: anything slow (a
    /// handshake) belongs in [`Accept::handshake`].
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Conn, Self::Peer)>> + Send;

    /// Readies an accepted connection for HTTP (a TLS handshake, which may
    /// also learn who the peer is). It runs on the connection's own task
    /// and counts against the header-read timeout, so a silent handshake
    /// holds neither the accept loop nor its slot for long.
    fn handshake(
        &self,
        conn: Self::Conn,
        peer: Self::Peer,
    ) -> impl Future<Output = std::io::Result<(Self::Io, Self::Peer)>> + Send + 'static;

    /// The peer's address for the per-peer connection cap; `None` for
    /// peers without one (Unix sockets), capped only by the total.
    fn peer_ip(_peer: &Self::Peer) -> Option<IpAddr> {
        None
    }
}

impl Accept for TcpListener {
    type Conn = TcpStream;
    type Io = TcpStream;
    type Peer = SocketAddr;

    async fn accept(&self) -> std::io::Result<(TcpStream, SocketAddr)> {
        let (stream, peer) = TcpListener::accept(self).await?;
        // Interactive streams (terminals, RPC streams) must not wait for Nagle.
        let _ = stream.set_nodelay(true);
        Ok((stream, peer))
    }

    fn handshake(
        &self,
        conn: TcpStream,
        peer: SocketAddr,
    ) -> impl Future<Output = std::io::Result<(TcpStream, SocketAddr)>> + Send + 'static {
        std::future::ready(Ok((conn, peer)))
    }

    fn peer_ip(peer: &SocketAddr) -> Option<IpAddr> {
        Some(peer.ip())
    }
}

impl Accept for UnixListener {
    type Conn = UnixStream;
    type Io = UnixStream;
    /// Unix peers are unnamed; who may connect is decided by the socket's
    /// place in the file system.
    type Peer = ();

    async fn accept(&self) -> std::io::Result<(UnixStream, ())> {
        let (stream, _) = UnixListener::accept(self).await?;
        Ok((stream, ()))
    }

    fn handshake(
        &self,
        conn: UnixStream,
        peer: (),
    ) -> impl Future<Output = std::io::Result<(UnixStream, ())>> + Send + 'static {
        std::future::ready(Ok((conn, peer)))
    }
}

/// Where the server is in its life; every connection task follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Serving,
    /// Finish what is in flight, take nothing new (HTTP/2 GOAWAY, HTTP/1.1
    /// `Connection: close`).
    Draining,
    /// The drain timed out: close now.
    Closing,
}

/// Serves connections from `listener` with `handler` until `shutdown`
/// resolves, then stops accepting (the listener is dropped) and lets
/// in-flight connections finish for up to `limits.drain`.
///
/// Every connection gets the listener's [`Limits`]: past a connection
/// limit a new connection is closed right after accept; a connection
/// without a complete request head within the header-read timeout, or idle
/// for the idle timeout, is closed; a request whose body stalls gets `408`.
pub async fn serve<A, H, Fut, B>(
    listener: A,
    handler: H,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) where
    A: Accept,
    H: Fn(A::Peer, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    let limits = limits::fit_fd_limit(limits, metrics.name);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // The watchdog owns the header-read timeout (see `watchdog`); hyper's
    // own, on by default once a timer is set, would cut idle connections.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    // Pings find HTTP/2 peers that vanished while a stream was open.
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let admission = Admission::new(
        limits.max_connections,
        limits.max_connections_per_peer,
        metrics.clone(),
    );
    let (stage, staged) = watch::channel(Stage::Serving);
    // Every connection task holds a sender; `recv` returns `None` once the
    // last one has ended.
    let (alive, mut all_ended) = mpsc::channel::<()>(1);
    let mut accept_errors = 0u64;
    tokio::pin!(shutdown);
    loop {
        let (conn, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning, and
                    // say so once, not per attempt.
                    accept_errors += 1;
                    if accept_errors.is_power_of_two() {
                        tracing::warn!(listener = metrics.name, error = %e, failures = accept_errors, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Past a limit the connection is dropped here, before it costs
        // anything more than the accept.
        let Ok(slot) = admission.admit(A::peer_ip(&peer)) else {
            continue;
        };
        let accepted_at = tokio::time::Instant::now();
        let handshake = listener.handshake(conn, peer);
        let task = Connection {
            handler: handler.clone(),
            builder: builder.clone(),
            limits,
            metrics: metrics.clone(),
            stage: staged.clone(),
            _alive: alive.clone(),
        };
        tokio::spawn(task.run(handshake, slot, accepted_at));
    }
    drop(listener);
    drop(alive);
    let drain = limits.drain;
    tracing::debug!(
        listener = metrics.name,
        connections = admission.open(),
        ?drain,
        "stopped accepting; draining in-flight requests"
    );
    let _ = stage.send(Stage::Draining);
    if tokio::time::timeout(drain, all_ended.recv()).await.is_err() {
        tracing::warn!(
            listener = metrics.name,
            ?drain,
            "drain timeout reached; closing the remaining connections"
        );
        let _ = stage.send(Stage::Closing);
    }
}

/// One accepted connection's task and what it needs.
struct Connection<H> {
    handler: H,
    builder: auto::Builder<TokioExecutor>,
    limits: Limits,
    metrics: ListenerMetrics,
    stage: watch::Receiver<Stage>,
    _alive: mpsc::Sender<()>,
}

impl<H> Connection<H> {
    async fn run<Io, P, Fut, B>(
        mut self,
        handshake: impl Future<Output = std::io::Result<(Io, P)>>,
        slot: Slot,
        accepted_at: tokio::time::Instant,
    ) where
        Io: AsyncRead + AsyncWrite + Send + Unpin + 'static,
        P: std::fmt::Debug + Clone + Send + Sync + 'static,
        H: Fn(P, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Response<B>> + Send + 'static,
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<crate::body::BoxError>,
    {
        let limits = self.limits;
        let deadline = accepted_at + limits.header_read_timeout;
        let (io, peer) = match tokio::time::timeout_at(deadline, handshake).await {
            Ok(Ok(ready)) => ready,
            Ok(Err(e)) => {
                tracing::debug!(listener = self.metrics.name, error = %e, "handshake failed");
                return;
            }
            Err(_) => {
                self.metrics.timed_out(metrics::Timeout::HeaderRead);
                return;
            }
        };
        let state = ConnState::new(accepted_at);
        let io = Watched::new(io, state.clone(), slot);
        let svc = {
            let (handler, state, metrics, who) = (
                self.handler.clone(),
                state.clone(),
                self.metrics.clone(),
                peer.clone(),
            );
            hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let busy = state.begin_request();
                let (parts, body) = req.into_parts();
                let (body, watch) = Incoming::new(body, limits.body_progress_timeout);
                let answer = handler(who.clone(), Request::from_parts(parts, body));
                let metrics = metrics.clone();
                async move {
                    // A stalled body ends the request even if the handler
                    // would not notice (it may be waiting on something that
                    // waits on the body).
                    let resp = tokio::select! {
                        biased;
                        () = watch.stalled() => None,
                        resp = answer => Some(resp),
                    };
                    watch.answer();
                    let reply = match resp {
                        Some(resp) if !watch.is_stalled() => resp.map(|b| Reply::handler(b, busy)),
                        _ => {
                            metrics.timed_out(metrics::Timeout::BodyProgress);
                            stalled_body(limits.body_progress_timeout, busy)
                        }
                    };
                    Ok::<_, Infallible>(reply)
                }
            })
        };
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(io), svc)
            .into_owned();
        tokio::pin!(conn);
        let mut closing = false;
        loop {
            tokio::select! {
                ended = conn.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(?peer, error = %e, "connection ended with an error");
                    }
                    return;
                }
                timeout = state.expired(&limits), if !closing => {
                    self.metrics.timed_out(timeout);
                    match timeout {
                        // A head that never came: nothing to finish.
                        metrics::Timeout::HeaderRead => return,
                        // Idle: close gracefully, so a request that raced
                        // the timeout is still answered.
                        _ => {
                            conn.as_mut().graceful_shutdown();
                            closing = true;
                        }
                    }
                }
                changed = self.stage.changed() => {
                    let stage = *self.stage.borrow_and_update();
                    match (changed, stage) {
                        (Err(_), _) | (_, Stage::Closing) => return,
                        (_, Stage::Draining) if !closing => {
                            conn.as_mut().graceful_shutdown();
                            closing = true;
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// The answer to a request whose body stalled: E2B's JSON error shape.
fn stalled_body<B>(timeout: Duration, busy: watchdog::Busy) -> Response<Reply<B>> {
    let message =
        format!("the request body sent nothing for {timeout:?}; the request was abandoned");
    let json = serde_json::json!({ "code": 408, "message": message });
    let mut resp = Response::new(Reply::stalled(Bytes::from(json.to_string()), busy));
    *resp.status_mut() = StatusCode::REQUEST_TIMEOUT;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpSocket;

    /// Longest any test waits for something that must happen.
    const PATIENCE: Duration = Duration::from_secs(30);

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            body_progress_timeout: Duration::from_secs(30),
            ..Limits::new(100, Duration::from_secs(1))
        }
    }

    /// A server answering every request with the size of its body (read
    /// whole; a body that fails to read is a 400, as handlers answer).
    struct Server {
        addr: SocketAddr,
        registry: prometheus_client::registry::Registry,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Server {
        async fn start(limits: Limits) -> Server {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let handler = |_peer, req: Request<Incoming>| async move {
                let (status, text) = match req.into_body().collect().await {
                    Ok(b) => (StatusCode::OK, b.to_bytes().len().to_string()),
                    Err(e) => (StatusCode::BAD_REQUEST, e.to_string()),
                };
                let mut resp = Response::new(http_body_util::Full::new(Bytes::from(text)));
                *resp.status_mut() = status;
                resp
            };
            let mut registry = prometheus_client::registry::Registry::default();
            let metrics = Metrics::register(&mut registry);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(serve(
                listener,
                handler,
                async {
                    let _ = stopped.await;
                },
                limits,
                metrics.listener("test"),
            ));
            Server {
                addr,
                registry,
                stop: Some(stop),
                task,
            }
        }

        /// The sum of the listener metric lines that contain `what`.
        fn count(&self, what: &str) -> u64 {
            let mut text = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
            text.lines()
                .filter(|l| !l.starts_with('#') && l.contains(what))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .sum()
        }

        async fn stop(mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            let _ = tokio::time::timeout(PATIENCE, self.task).await;
        }
    }

    async fn connect_from(ip: [u8; 4], to: SocketAddr) -> TcpStream {
        let socket = TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((ip, 0)))
            .expect("bind the client");
        socket.connect(to).await.expect("connect")
    }

    /// Reads until the server closes; what it sent.
    async fn until_closed(conn: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        tokio::time::timeout(PATIENCE, conn.read_to_end(&mut buf))
            .await
            .expect("the server closes the connection")
            .ok();
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// One request on `conn`; the response head and body.
    async fn request(conn: &mut TcpStream, body: &str) -> String {
        let raw = format!(
            "POST / HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(raw.as_bytes()).await.expect("write");
        read_answer(conn).await
    }

    /// The next response on `conn`, head and body.
    async fn read_answer(conn: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let read = async {
            loop {
                let mut chunk = [0u8; 1024];
                let n = conn.read(&mut chunk).await.expect("read");
                assert!(
                    n > 0,
                    "closed before answering: {:?}",
                    String::from_utf8_lossy(&buf)
                );
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).into_owned();
                if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if rest.len() >= len {
                        return text;
                    }
                }
            }
        };
        tokio::time::timeout(PATIENCE, read)
            .await
            .expect("an answer")
    }

    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
        let server = Server::start(Limits {
            header_read_timeout: Duration::from_millis(200),
            ..limits()
        })
        .await;
        // Not a byte: hyper alone would wait forever here (it has not
        // even seen which HTTP version this is).
        let mut silent = TcpStream::connect(server.addr).await.expect("connect");
        assert_eq!(until_closed(&mut silent).await, "");
        // A head that trickles in forever is cut off too.
        let mut slow = TcpStream::connect(server.addr).await.expect("connect");
        slow.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
        let trickle = async {
            for _ in 0..1000 {
                if slow.write_all(b"x-a: b\r\n").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(PATIENCE, trickle)
            .await
            .expect("the trickling connection is closed");
        assert_eq!(server.count("header_read"), 2);
        server.stop().await;
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
        let server = Server::start(Limits {
            idle_timeout: Duration::from_millis(300),
            ..limits()
        })
        .await;
        let mut conn = TcpStream::connect(server.addr).await.expect("connect");
        let answer = request(&mut conn, "abc").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\n3"), "{answer}");
        assert_eq!(until_closed(&mut conn).await, "");
        assert_eq!(server.count("idle"), 1);
        assert_eq!(server.count("header_read"), 0);
        server.stop().await;
    }

    #[tokio::test]
    async fn a_stalled_request_body_is_answered_408() {
        let server = Server::start(Limits {
            body_progress_timeout: Duration::from_millis(200),
            ..limits()
        })
        .await;
        let mut conn = TcpStream::connect(server.addr).await.expect("connect");
        conn.write_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\nonly this")
            .await
            .expect("write");
        let answer = until_closed(&mut conn).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"code\":408"), "{answer}");
        assert!(answer.contains("sent nothing for"), "{answer}");
        assert_eq!(server.count("body_progress"), 1);
        server.stop().await;

        // A body that keeps coming, however slowly, is fine: it takes
        // longer than the timeout in all, but never stalls that long.
        let server = Server::start(Limits {
            body_progress_timeout: Duration::from_secs(1),
            ..limits()
        })
        .await;
        let mut slow = TcpStream::connect(server.addr).await.expect("connect");
        slow.write_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 8\r\n\r\n")
            .await
            .expect("write");
        for part in [b"ab", b"cd", b"ef", b"gh"] {
            tokio::time::sleep(Duration::from_millis(400)).await;
            slow.write_all(part).await.expect("write");
        }
        let slow_answer = read_answer(&mut slow).await;
        assert!(slow_answer.starts_with("HTTP/1.1 200"), "{slow_answer}");
        assert!(slow_answer.ends_with("\r\n\r\n8"), "{slow_answer}");
        assert_eq!(server.count("body_progress"), 0);
        server.stop().await;
    }

    #[tokio::test]
    async fn past_the_limits_new_connections_are_closed_and_established_ones_keep_working() {
        let server = Server::start(Limits {
            max_connections: 3,
            max_connections_per_peer: Some(2),
            ..limits()
        })
        .await;
        let mut a = connect_from([127, 0, 0, 1], server.addr).await;
        assert!(request(&mut a, "x").await.starts_with("HTTP/1.1 200"));
        let mut b = connect_from([127, 0, 0, 1], server.addr).await;
        assert!(request(&mut b, "x").await.starts_with("HTTP/1.1 200"));
        // A third from the same peer: closed without an answer.
        let mut c = connect_from([127, 0, 0, 1], server.addr).await;
        let _ = c.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n").await;
        assert_eq!(until_closed(&mut c).await, "");
        // Another peer still gets in, up to the total.
        let mut d = connect_from([127, 0, 0, 2], server.addr).await;
        assert!(request(&mut d, "x").await.starts_with("HTTP/1.1 200"));
        let mut e = connect_from([127, 0, 0, 3], server.addr).await;
        assert_eq!(until_closed(&mut e).await, "");
        assert_eq!(server.count("reason=\"max_connections_per_peer\""), 1);
        assert_eq!(server.count("reason=\"max_connections\""), 1);
        // Established connections keep working past the limit.
        for conn in [&mut a, &mut b, &mut d] {
            assert!(request(conn, "yy").await.ends_with("\r\n\r\n2"));
        }
        // A closed connection frees its place.
        drop(a);
        let mut f = wait_for_admission([127, 0, 0, 1], server.addr).await;
        assert!(request(&mut f, "x").await.starts_with("HTTP/1.1 200"));
        server.stop().await;
    }

    /// Connects until the server keeps the connection (its slot count
    /// drops asynchronously after a close).
    async fn wait_for_admission(ip: [u8; 4], to: SocketAddr) -> TcpStream {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let mut conn = connect_from(ip, to).await;
            let raw = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n";
            conn.write_all(raw).await.expect("write");
            let mut head = [0u8; 12];
            if conn.read_exact(&mut head).await.is_ok() {
                // Read the rest of that answer ("...content-length: 1\r\n\r\n0").
                let mut rest = Vec::new();
                while !rest.ends_with(b"\r\n\r\n0") {
                    let mut byte = [0u8; 1];
                    conn.read_exact(&mut byte)
                        .await
                        .expect("rest of the answer");
                    rest.push(byte[0]);
                }
                return conn;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never admitted again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
