//! The proxy's fast path: plain HTTP/1.1 requests to a sandbox, forwarded
//! by the gateway itself rather than through hyper's server and client.
//!
//! It reads each public connection first (a [`Front`] of the server loop)
//! and takes the requests that are most of the traffic: HTTP/1.1 with a
//! small body already read, to a running sandbox whose route is cached
//! (the exact subset is in [`wire`]). Each is rewritten in one pass
//! (what `super::headers` does), sent over a connection of this worker's
//! node pool on which the gateway speaks HTTP/1.1 itself
//! (`NodePool::take_raw`), and its answer passed back as it comes: the
//! head cleaned of hop-by-hop and `x-warren-*` headers, the body copied
//! (a chunked one verbatim, followed to its end). That is a parse and a
//! copy per request, where hyper's path builds header maps and request
//! objects twice and hands each request between tasks.
//!
//! The first request it does not take (`Upgrade`, a chunked or large
//! body, h2c, HTTP/1.0, a paused sandbox, an unknown one, anything
//! unusual) hands the connection to hyper for good, with the bytes read
//! and not answered: hyper's path answers it exactly as it would have.
//! Nothing of a request is written to the client before that decision.
//!
//! Stale routes are handled as on hyper's path (see `super`): the node's
//! not-found marker or no answer at all ends the attempt, then one
//! uncached lookup decides; a replay-safe request (its body is here) is
//! sent once more to a moved sandbox. An idle pooled connection the node
//! closed shows as no answer at all: a replay-safe request is then sent
//! once on a new connection, and before any other request goes out on a
//! pooled connection the connection is checked open (no syscall: the
//! event loop already knows).
//!
//! A body cut off by the node ends the client's connection with a reset
//! (`Peer::abort`), as on hyper's path.
//!
//! `--proxy-fast-path false` turns it off (everything goes through hyper).

mod wire;

use super::{refetch, wrong_twice, Signal};
use crate::error::ApiError;
use crate::metrics::Plane;
use crate::node_client::DialedIo;
use crate::resolver::Route;
use crate::server::Peer;
use crate::state::App;
use bytes::BytesMut;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;
use warren_core::server::{Front, FrontConn, Handover};
use warren_proto::scheduler::v1::BindingState;
use wire::{Framing, Parsed, ParsedResponse};

/// The fast path, as the public listeners' [`Front`].
#[derive(Clone)]
pub(crate) struct FastPath {
    app: Arc<App>,
}

impl FastPath {
    pub(crate) fn new(app: Arc<App>) -> Self {
        FastPath { app }
    }
}

impl Front<Peer> for FastPath {
    fn serve<I>(
        &self,
        io: I,
        peer: Peer,
        conn: Arc<FrontConn>,
    ) -> impl Future<Output = (I, Handover)> + Send + 'static
    where
        I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        serve(self.app.clone(), io, peer, conn)
    }
}

/// How one request ended, for the connection.
enum Done {
    /// Answered; the connection may carry another request.
    KeepAlive,
    /// Answered (or the client left); the connection ends.
    Close,
    /// The answer broke off: the connection ends with a reset.
    Aborted,
    /// Not taken: hyper answers it (nothing was written).
    Hyper,
}

/// Buffers reused from request to request on a connection.
struct Scratch {
    /// The request as the node gets it.
    out: Vec<u8>,
    /// The answer's head as the client gets it (and the first of its body).
    head: Vec<u8>,
    /// What the node sent.
    answer: BytesMut,
}

async fn serve<I>(app: Arc<App>, mut io: I, peer: Peer, conn: Arc<FrontConn>) -> (I, Handover)
where
    I: AsyncRead + AsyncWrite + Send + Unpin,
{
    let max_body = usize::try_from(app.settings.retry_max_body).unwrap_or(usize::MAX);
    let mut buf = BytesMut::with_capacity(4096);
    // Allocated by the first request (a connection may bring none).
    let mut scratch = Scratch {
        out: Vec::new(),
        head: Vec::new(),
        answer: BytesMut::new(),
    };
    loop {
        let req = loop {
            if !buf.is_empty() {
                match wire::parse_request(&buf, &app.settings.domain, peer.addr.ip(), max_body) {
                    Parsed::Request(req) => break req,
                    Parsed::Partial if buf.len() < wire::MAX_HEAD => {}
                    Parsed::Partial | Parsed::Hyper => {
                        app.metrics.fast_path_handovers.inc();
                        return (io, Handover::Hyper(buf.freeze()));
                    }
                }
            }
            match io.read_buf(&mut buf).await {
                Ok(0) if buf.is_empty() => return (io, Handover::Close),
                // A head cut short: hyper ends it as it would.
                Ok(0) => return (io, Handover::Hyper(buf.freeze())),
                Ok(_) => {}
                Err(_) => return (io, Handover::Close),
            }
        };
        let total = req.head_len + req.body_len;
        while buf.len() < total {
            match io.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return (io, Handover::Close),
                Ok(_) => {}
            }
        }
        let busy = conn.begin_request();
        let close = req.close || conn.draining();
        // The request apart from what follows it, so that bytes the client
        // sends meanwhile (a pipelined request) can join `buf`.
        let mut request = buf.split_to(total);
        let mut client = Client {
            io: &mut io,
            pending: &mut buf,
            close,
            start: Instant::now(),
        };
        let done = exchange(&app, &req, &request, &mut client, &mut scratch).await;
        drop(busy);
        if !matches!(done, Done::Hyper) {
            app.metrics.fast_path_requests.inc();
        }
        if scratch.answer.capacity() > 4 * ANSWER_BUFFER {
            // A large answer head: not kept by an idle connection.
            scratch.answer = BytesMut::new();
        }
        match done {
            Done::KeepAlive if !close && !conn.draining() => {}
            Done::KeepAlive | Done::Close => {
                let _ = io.shutdown().await;
                return (io, Handover::Close);
            }
            Done::Aborted => {
                peer.abort.set();
                return (io, Handover::Close);
            }
            Done::Hyper => {
                app.metrics.fast_path_handovers.inc();
                request.unsplit(buf);
                return (io, Handover::Hyper(request.freeze()));
            }
        }
    }
}

/// The client's side of an exchange: its connection, what it sent after
/// the request being answered, whether the connection ends with this
/// answer, and when the request came (for the latency histogram).
struct Client<'a, I> {
    io: &'a mut I,
    pending: &'a mut BytesMut,
    close: bool,
    start: Instant,
}

/// Why reading from the node stopped.
enum Wait {
    /// The node's bytes came (0 at its end), or its read failed.
    Node(std::io::Result<usize>),
    /// The client closed its connection (or it broke): its request is
    /// abandoned, and the node's connection with it, so the node (and the
    /// sandbox) see the client go, as on hyper's path.
    ClientGone,
}

/// Reads the node's next bytes into `answer`, and meanwhile notices the
/// client leaving (bytes it sends meanwhile are kept for after this
/// answer, up to a head's worth). Watching costs no syscall while the
/// client is quiet: its last read was short, so its socket is known
/// drained until the event loop says otherwise.
async fn read_node<I>(
    node: &mut DialedIo,
    answer: &mut BytesMut,
    client: &mut Client<'_, I>,
) -> Wait
where
    I: AsyncRead + Unpin,
{
    let read = node.read_buf(answer);
    tokio::pin!(read);
    loop {
        if client.pending.len() >= wire::MAX_HEAD {
            return Wait::Node(read.await);
        }
        tokio::select! {
            biased;
            n = &mut read => return Wait::Node(n),
            sent = client.io.read_buf(client.pending) => match sent {
                Ok(0) | Err(_) => return Wait::ClientGone,
                Ok(_) => {}
            },
        }
    }
}

/// One request: its route, up to two attempts (as `super::forward`), and
/// the answer written to `client`.
async fn exchange<I>(
    app: &App,
    req: &wire::Request,
    bytes: &[u8],
    client: &mut Client<'_, I>,
    scratch: &mut Scratch,
) -> Done
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let id = req.target.sandbox_id.as_str();
    let route = match app.resolver.resolve(id).await {
        Ok(route) if route.state != BindingState::Paused => route,
        // hyper's path wakes a paused sandbox (from the cache: no second
        // lookup).
        Ok(_) => return Done::Hyper,
        // Not found, node down, the scheduler away: answered here, as
        // hyper's path would, without asking the scheduler twice.
        Err(e) => return error(app, client, e.into(), id).await,
    };
    let body = &bytes[req.head_len..];
    let signal = match attempt(app, &route, req, body, client, scratch).await {
        Attempt::Done(done) => return done,
        Attempt::Stale(signal) => signal,
    };
    let fresh = match refetch(app, id, &route, signal).await {
        Ok(fresh) if req.replay_safe => fresh,
        Ok(_) => return error(app, client, ApiError::sandbox_moved(id), id).await,
        Err(e) => return error(app, client, e, id).await,
    };
    app.metrics.cache_retries.inc();
    match attempt(app, &fresh, req, body, client, scratch).await {
        Attempt::Done(done) => done,
        Attempt::Stale(signal) => {
            let e = wrong_twice(app, &fresh, signal, id).await;
            error(app, client, e, id).await
        }
    }
}

/// How one attempt at a node went.
enum Attempt {
    /// The client has its answer (or the connection is done).
    Done(Done),
    /// The route was wrong; nothing was written to the client.
    Stale(Signal),
}

/// Why no answer head came from the node.
enum NoAnswer {
    /// Not a byte of an answer: the request may never have been read.
    Nothing,
    /// The node's bytes are not an answer the client can have.
    Bad(&'static str),
    /// The client left while it waited.
    ClientGone,
}

async fn attempt<I>(
    app: &App,
    route: &Route,
    req: &wire::Request,
    body: &[u8],
    client: &mut Client<'_, I>,
    scratch: &mut Scratch,
) -> Attempt
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let pool = app.http.here();
    let endpoint = route.endpoint.as_str();
    req.render(endpoint, route.generation, body, &mut scratch.out);
    let mut pooled = pool.take_raw(endpoint);
    if !req.replay_safe {
        // Sent at most once: never on a connection the node has closed.
        while let Some(io) = pooled.as_mut() {
            if still_open(io) {
                break;
            }
            pooled = pool.take_raw(endpoint);
        }
    }
    let mut reused = pooled.is_some();
    let mut node = match pooled {
        Some(io) => io,
        None => match dial(app, route).await {
            Some(io) => io,
            None => return Attempt::Stale(Signal::Unreachable),
        },
    };
    let head = loop {
        match send(&mut node, scratch, client, req.is_head).await {
            Ok(head) => break head,
            // An idle connection the node closed: once more on a new one.
            Err(NoAnswer::Nothing) if reused && req.replay_safe => {
                reused = false;
                node = match dial(app, route).await {
                    Some(io) => io,
                    None => return Attempt::Stale(Signal::Unreachable),
                };
            }
            Err(NoAnswer::Nothing) => return Attempt::Stale(Signal::Unreachable),
            Err(NoAnswer::ClientGone) => return Attempt::Done(Done::Close),
            Err(NoAnswer::Bad(why)) => {
                let e = ApiError::new(http::StatusCode::BAD_GATEWAY, "bad_upstream", why);
                let id = req.target.sandbox_id.as_str();
                return Attempt::Done(error(app, client, e, id).await);
            }
        }
    };
    if head.not_hosted {
        return Attempt::Stale(Signal::NotHosted);
    }
    app.metrics
        .observe(Plane::Data, head.status, client.start.elapsed());
    let done = match relay(&mut node, &head, client, scratch).await {
        Relayed::Reusable(done) => {
            pool.put_raw(endpoint, node);
            done
        }
        Relayed::Spent(done) => done,
    };
    Attempt::Done(done)
}

/// A new connection to the route's node, or `None` (logged) if it cannot
/// be had.
async fn dial(app: &App, route: &Route) -> Option<DialedIo> {
    match app.http.here().dial_raw(&route.endpoint).await {
        Ok(io) => Some(io),
        Err(e) => {
            tracing::debug!(sandbox = %route.sandbox_id, node = %route.node_id,
                endpoint = %route.endpoint, error = %e, "cannot reach the node");
            None
        }
    }
}

/// Whether a pooled connection is still open and quiet, from what the
/// event loop already knows (a closed one has reported itself readable).
fn still_open(io: &mut DialedIo) -> bool {
    let mut cx = Context::from_waker(futures_util::task::noop_waker_ref());
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    matches!(Pin::new(io).poll_read(&mut cx, &mut buf), Poll::Pending)
}

/// Writes the request in `scratch.out` to `node` and reads the answer's
/// head into `scratch.answer`, the client's head into `scratch.head`.
async fn send<I>(
    node: &mut DialedIo,
    scratch: &mut Scratch,
    client: &mut Client<'_, I>,
    is_head: bool,
) -> Result<wire::Response, NoAnswer>
where
    I: AsyncRead + Unpin,
{
    if node.write_all(&scratch.out).await.is_err() {
        return Err(NoAnswer::Nothing);
    }
    scratch.answer.clear();
    loop {
        scratch.answer.reserve(ANSWER_BUFFER / 2);
        match read_node(node, &mut scratch.answer, client).await {
            Wait::Node(Ok(n)) if n > 0 => {}
            Wait::ClientGone => return Err(NoAnswer::ClientGone),
            _ if scratch.answer.is_empty() => return Err(NoAnswer::Nothing),
            _ => return Err(NoAnswer::Bad("the node's answer broke off")),
        }
        match wire::parse_response(&scratch.answer, is_head, client.close, &mut scratch.head) {
            ParsedResponse::Partial => {}
            ParsedResponse::Bad(why) => return Err(NoAnswer::Bad(why)),
            ParsedResponse::Response(head) => return Ok(head),
        }
    }
}

/// Bytes read from the node at a time (about; the buffer is kept from
/// request to request).
const ANSWER_BUFFER: usize = 8 * 1024;

/// How relaying an answer left the node's connection.
enum Relayed {
    /// Read to the end of the answer and nothing more: back to the pool.
    Reusable(Done),
    /// Closed, broken or not at a message boundary: dropped.
    Spent(Done),
}

/// Passes the answer whose head is in `scratch` on to `client`: the head
/// and the body's first bytes in one write, then the rest as it comes.
async fn relay<I>(
    node: &mut DialedIo,
    head: &wire::Response,
    client: &mut Client<'_, I>,
    scratch: &mut Scratch,
) -> Relayed
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let mut reusable = head.reusable;
    let mut chunked = wire::Chunked::default();
    let mut left = match head.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let mut offset = head.head_len;
    let mut first = true;
    loop {
        let bytes = &scratch.answer[offset..];
        // How much of `bytes` is this answer's body, and whether it ended.
        let (take, ended) = match head.framing {
            Framing::Empty => (0, true),
            Framing::Length(_) => {
                let take = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
                left -= take as u64;
                (take, left == 0)
            }
            Framing::Chunked => match chunked.feed(bytes) {
                Ok(Some(n)) => (n, true),
                Ok(None) => (bytes.len(), false),
                Err(wire::BadChunk) => {
                    tracing::debug!("the node's chunked answer is malformed");
                    return Relayed::Spent(Done::Aborted);
                }
            },
            Framing::Close => (bytes.len(), false),
        };
        if take < bytes.len() {
            // More than one answer: this connection is out of step.
            reusable = false;
        }
        let written = if first {
            first = false;
            scratch.head.extend_from_slice(&bytes[..take]);
            client.io.write_all(&scratch.head).await
        } else if take > 0 {
            client.io.write_all(&bytes[..take]).await
        } else {
            Ok(())
        };
        if written.is_err() {
            return Relayed::Spent(Done::Close);
        }
        if ended {
            let done = if client.close {
                Done::Close
            } else {
                Done::KeepAlive
            };
            return if reusable {
                Relayed::Reusable(done)
            } else {
                Relayed::Spent(done)
            };
        }
        scratch.answer.clear();
        scratch.answer.reserve(ANSWER_BUFFER);
        offset = 0;
        match read_node(node, &mut scratch.answer, client).await {
            Wait::Node(Ok(n)) if n > 0 => {}
            Wait::ClientGone => return Relayed::Spent(Done::Close),
            // The end of a close-delimited body.
            _ if head.framing == Framing::Close => return Relayed::Spent(Done::Close),
            _ => return Relayed::Spent(Done::Aborted),
        }
    }
}

/// Writes `e` as hyper's path would answer it.
async fn error<I>(app: &App, client: &mut Client<'_, I>, e: ApiError, id: &str) -> Done
where
    I: AsyncWrite + Unpin,
{
    use http_body_util::BodyExt;
    let (parts, body) = e.on_data_plane(id).into_response().into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .status
            .canonical_reason()
            .unwrap_or("Unknown")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        if name != http::header::CONTENT_LENGTH {
            wire::push_header(&mut out, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    let mut n = itoa::Buffer::new();
    wire::push_header(&mut out, b"content-length", n.format(body.len()).as_bytes());
    if client.close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    app.metrics
        .observe(Plane::Data, parts.status.as_u16(), client.start.elapsed());
    match client.io.write_all(&out).await {
        Ok(()) if !client.close => Done::KeepAlive,
        _ => Done::Close,
    }
}
