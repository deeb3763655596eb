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
//! - this file: [`Accept`], [`serve`] / [`serve_on`] and one connection's
//!   task.
//! - [`workers`]: [`Workers`], threads that own connections (`serve_on`).
//! - [`limits`]: [`Limits`] (header-read, idle and body-progress timeouts,
//!   connection limits, drain), their defaults, the open-file limit.
//! - `admission`: the connection limits, refusing right after accept.
//! - `watchdog`: the per-connection clock (head, busy, idle).
//! - [`body`]: request bodies under the body-progress timeout
//!   ([`Incoming`], what every handler reads).
//! - [`metrics`]: what every listener counts.

pub mod body;
pub mod front;
pub mod limits;
pub mod metrics;
pub mod workers;

mod admission;
mod stage;
mod watchdog;

pub use admission::{Admission, Slot};
pub use body::{BodyError, Incoming};
pub use front::{Front, FrontConn, Handover, NoFront, RequestGuard};
pub use limits::{raise_fd_limit, Limits};
pub use metrics::{ListenerMetrics, Metrics};
pub use workers::Workers;

use body::Reply;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use stage::{Stage, StageWatch, Stages};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;
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

    /// Moves an accepted connection to the runtime this is called on (a
    /// [`Workers`] thread's), so that its I/O wakes that thread. Called
    /// there, before [`Accept::handshake`]. The default keeps the
    /// connection where it was accepted, which works but wakes the
    /// accepting runtime for every read.
    fn rehome(conn: Self::Conn) -> std::io::Result<Self::Conn> {
        Ok(conn)
    }
}

/// Re-registers a Tokio TCP stream with the current runtime's reactor.
pub fn rehome_tcp(conn: TcpStream) -> std::io::Result<TcpStream> {
    TcpStream::from_std(conn.into_std()?)
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

    fn rehome(conn: TcpStream) -> std::io::Result<TcpStream> {
        rehome_tcp(conn)
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

    fn rehome(conn: UnixStream) -> std::io::Result<UnixStream> {
        UnixStream::from_std(conn.into_std()?)
    }
}

/// Serves connections from `listener` with `handler` until `shutdown`
/// resolves, then stops accepting (the listener is dropped) and lets
/// in-flight connections finish for up to `limits.drain`.
///
/// Every connection gets the listener's [`Limits`]: past a connection
/// limit a new connection is closed right after accept; a connection
/// without a complete request head within the header-read timeout, or idle
/// for the idle timeout, is closed; a request whose body stalls gets `408`.
/// Connections run as tasks of the runtime this is called on.
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
    let dispatch = |listener: &A, conn, peer, task: Connection<H, NoFront>, slot, accepted_at| {
        let handshake = listener.handshake(conn, peer);
        tokio::spawn(task.run(handshake, slot, accepted_at));
    };
    accept_loop::<A, _, _, _, _, _, _>(
        listener, dispatch, NoFront, handler, shutdown, limits, metrics,
    )
    .await;
}

/// [`serve`], with each connection run by one of `workers` (the one with
/// the fewest open connections) rather than on the calling runtime: for
/// listeners whose per-request cost matters, such as the gateway's proxy.
pub async fn serve_on<A, H, Fut, B>(
    workers: &Workers,
    listener: A,
    handler: H,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) where
    A: Accept + Sync,
    H: Fn(A::Peer, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    serve_on_front(
        workers, listener, NoFront, handler, shutdown, limits, metrics,
    )
    .await;
}

/// [`serve_on`], with `front` reading each connection first (see
/// [`front`]): what it hands over, hyper serves with `handler`.
pub async fn serve_on_front<A, F, H, Fut, B>(
    workers: &Workers,
    listener: A,
    front: F,
    handler: H,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) where
    A: Accept + Sync,
    F: Front<A::Peer>,
    H: Fn(A::Peer, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    let dispatch = |listener: &Arc<A>, conn, peer, task: Connection<H, F>, slot, accepted_at| {
        let listener = listener.clone();
        workers.spawn(async move {
            let conn = match A::rehome(conn) {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot move a connection to its worker");
                    return;
                }
            };
            let handshake = listener.handshake(conn, peer);
            // Only the accept loop keeps the listener open.
            drop(listener);
            task.run(handshake, slot, accepted_at).await;
        });
    };
    accept_loop::<A, _, _, _, _, _, _>(
        Arc::new(listener),
        dispatch,
        front,
        handler,
        shutdown,
        limits,
        metrics,
    )
    .await;
}

/// The accept loop both [`serve`] and [`serve_on`] run; `dispatch` starts
/// each admitted connection's task.
async fn accept_loop<A, L, D, F, H, Fut, B>(
    listener: L,
    mut dispatch: D,
    front: F,
    handler: H,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) where
    A: Accept,
    L: std::borrow::Borrow<A>,
    D: FnMut(&L, A::Conn, A::Peer, Connection<H, F>, Slot, tokio::time::Instant),
    F: Clone,
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
    let stages = Arc::new(Stages::default());
    // Every connection task holds a sender; `recv` returns `None` once the
    // last one has ended.
    let (alive, mut all_ended) = mpsc::channel::<()>(1);
    let mut accept_errors = 0u64;
    tokio::pin!(shutdown);
    loop {
        let (conn, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.borrow().accept() => match accepted {
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
        let task = Connection {
            handler: handler.clone(),
            front: front.clone(),
            builder: builder.clone(),
            limits,
            metrics: metrics.clone(),
            stage: stages.watch(),
            _alive: alive.clone(),
        };
        dispatch(&listener, conn, peer, task, slot, accepted_at);
    }
    drop(dispatch);
    drop(listener);
    drop(alive);
    let drain = limits.drain;
    tracing::debug!(
        listener = metrics.name,
        connections = admission.open(),
        ?drain,
        "stopped accepting; draining in-flight requests"
    );
    stages.set(Stage::Draining);
    if tokio::time::timeout(drain, all_ended.recv()).await.is_err() {
        tracing::warn!(
            listener = metrics.name,
            ?drain,
            "drain timeout reached; closing the remaining connections"
        );
        stages.set(Stage::Closing);
    }
}

/// One accepted connection's task and what it needs.
struct Connection<H, F> {
    handler: H,
    front: F,
    builder: auto::Builder<TokioExecutor>,
    limits: Limits,
    metrics: ListenerMetrics,
    stage: StageWatch,
    _alive: mpsc::Sender<()>,
}

impl<H, F> Connection<H, F> {
    async fn run<Io, P, Fut, B>(
        mut self,
        handshake: impl Future<Output = std::io::Result<(Io, P)>>,
        slot: Slot,
        accepted_at: tokio::time::Instant,
    ) where
        Io: AsyncRead + AsyncWrite + Send + Unpin + 'static,
        P: std::fmt::Debug + Clone + Send + Sync + 'static,
        F: Front<P>,
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
        let (mut io, prefix, draining) = match self.front(io, &peer, &state).await {
            Some((io, Handover::Hyper(prefix), draining)) => (io, prefix, draining),
            Some((_, Handover::Close, _)) | None => return,
        };
        io.rewind(prefix);
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
                // A request without a body cannot stall: no watch, no race.
                // (Most proxied requests: they are read, answered and gone
                // without the body-progress clock ever running.)
                let (body, watch) = if http_body::Body::is_end_stream(&body) {
                    (Incoming::ended(body, limits.body_progress_timeout), None)
                } else {
                    let (body, watch) = Incoming::new(body, limits.body_progress_timeout);
                    (body, Some(watch))
                };
                // Boxed here, so the handler's future (kilobytes for a
                // proxy) is moved as a pointer from now on, not copied at
                // every hand-over inside hyper.
                let answer = Box::pin(handler(who.clone(), Request::from_parts(parts, body)));
                let metrics = watch.is_some().then(|| metrics.clone());
                async move {
                    let (Some(watch), Some(metrics)) = (watch, metrics) else {
                        let resp = answer.await;
                        return Ok::<_, Infallible>(resp.map(|b| Reply::handler(b, busy)));
                    };
                    // A stalled body ends the request even if the handler
                    // would not notice (it may be waiting on something that
                    // waits on the body).
                    let resp = tokio::select! {
                        biased;
                        resp = answer => Some(resp),
                        () = watch.stalled() => None,
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
        // A drain the front saw: hyper answers the request handed over, then closes.
        let mut closing = draining;
        if draining {
            conn.as_mut().graceful_shutdown();
        }
        loop {
            tokio::select! {
                // The connection first: it is what runs on every wake-up.
                biased;
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
                stage = self.stage.changed() => {
                    match stage {
                        Stage::Closing => return,
                        Stage::Draining if !closing => {
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

impl<H, F> Connection<H, F> {
    /// Runs the front on `io` under the connection's clock and the
    /// listener's stage: a timeout or a close ends the connection; a drain
    /// ends it at once between requests, after the response in flight
    /// otherwise. `None` when the connection ended under the front.
    async fn front<I, P>(
        &mut self,
        io: I,
        peer: &P,
        state: &Arc<ConnState>,
    ) -> Option<(I, Handover, bool)>
    where
        I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
        P: Clone,
        F: Front<P>,
    {
        let conn = Arc::new(front::FrontConn::new(state.clone()));
        let limits = self.limits;
        let served = self.front.serve(io, peer.clone(), conn.clone());
        tokio::pin!(served);
        loop {
            tokio::select! {
                biased;
                (io, handover) = served.as_mut() => return Some((io, handover, conn.draining())),
                timeout = state.expired(&limits) => {
                    // Head or idle: no request is in flight to finish.
                    self.metrics.timed_out(timeout);
                    return None;
                }
                stage = self.stage.changed() => match stage {
                    Stage::Closing => return None,
                    Stage::Draining => {
                        if !state.is_busy() {
                            return None;
                        }
                        conn.draining.store(true, std::sync::atomic::Ordering::Release);
                    }
                    Stage::Serving => {}
                },
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
mod tests;
