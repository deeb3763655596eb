//! [`NodePool`]: kept-alive HTTP/1.1 connections to nodes, over mutual TLS
//! (or plain TCP under `--insecure-internal`).
//!
//! One pool per worker thread of the public listener (see
//! [`NodeHttp`](super::NodeHttp)), so a pool is used from one thread and
//! its connections are driven there: checking a connection out is popping
//! it from a short list under an uncontended lock. A connection goes back
//! to its list when the node's answer has been read to the end (the
//! answer's body, [`PooledBody`], does that), and is taken most recently
//! used first.
//!
//! This replaced hyper-util's pooled client on the proxy's hot path: for
//! every request that client built a connect future (a clone of the
//! connector) to race against the pool, and spawned a task to wait for the
//! connection to be ready again; when the race was close it opened
//! connections nobody needed. Here a request waits for an idle connection
//! only if one exists, and connects otherwise.
//!
//! - A connection idle for longer than [`IDLE_TIMEOUT`] is not used again
//!   (the node closes idle connections after 120 s; using one just as it
//!   is closed would look like an unreachable node).
//! - A request that could not even be written on a reused connection
//!   (the node had just closed it) is sent once more on a new one, as
//!   hyper-util did.

use super::HttpsConnector;
use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode, Uri};
use http_body::{Body as _, Frame, SizeHint};
use hyper::client::conn::http1;
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower_service::Service;
use warren_core::body::{Body, BoxError};

/// How long a connection may sit idle in the pool and still be used.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Most idle connections kept per node in one pool.
const MAX_IDLE_PER_NODE: usize = 1024;

/// Why a request to a node got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection: refused, unreachable, timed out, or the TLS
    /// handshake failed (wrong certificate).
    #[error("cannot connect: {0}")]
    Connect(#[source] BoxError),
    /// The connection failed while the request was sent or answered, or
    /// the request's own body failed ([`SendError::is_body`]).
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// The node's address does not make a URI.
    #[error("node address {0:?} is not host:port")]
    Endpoint(String),
}

impl SendError {
    /// The connection never came up: nothing was sent.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect(_))
    }

    /// The request's body failed (the client's side), not the node.
    pub fn is_body(&self) -> bool {
        matches!(self, SendError::Http(e) if e.is_user())
    }
}

/// Connections to nodes. Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct NodePool {
    inner: Arc<Inner>,
}

struct Inner {
    connector: Dialer,
    /// `https` or `http`, for the URIs the connector dials.
    scheme: &'static str,
    /// node endpoint (`host:port`) → idle connections, oldest first. The
    /// key is shared with every answer in flight (no copy per request).
    idle: Mutex<HashMap<Arc<str>, Node>>,
    /// Idle connections of the proxy's fast path (`proxy::fast`), which
    /// speaks HTTP/1.1 on them itself: by endpoint, newest last.
    raw: Mutex<HashMap<Box<str>, Vec<RawIdle>>>,
}

/// An idle fast-path connection and when it went idle.
type RawIdle = (DialedIo, Instant);

/// One node's idle connections.
struct Node {
    /// The map's key again, to hand out without a second lookup.
    key: Arc<str>,
    idle: Vec<Idle>,
}

struct Idle {
    sender: http1::SendRequest<Body>,
    since: Instant,
}

/// A connection to a node, as a [`Dial`] makes one.
pub type DialedIo = Box<dyn DialIo>;

/// What a [`Dial`]'s connection must be: a byte stream.
pub trait DialIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> DialIo for T {}

/// Opens a plain connection to a node's `host:port`: how the
/// deterministic simulation (`crates/sim`) dials nodes over its simulated
/// network ([`NodePool::with_dial`]). Gateways dial with TCP and TLS.
pub type Dial = Arc<
    dyn Fn(&str) -> futures_util::future::BoxFuture<'static, std::io::Result<DialedIo>>
        + Send
        + Sync,
>;

/// How a pool dials: TCP and (mutual) TLS, or the simulation's [`Dial`].
enum Dialer {
    Tls(HttpsConnector),
    Custom(Dial),
}

impl NodePool {
    /// A pool dialing with `connector` to `scheme://endpoint`.
    pub fn new(connector: HttpsConnector, scheme: &'static str) -> Self {
        Self::of(Dialer::Tls(connector), scheme)
    }

    /// A pool dialing plain HTTP over the connections `dial` opens (the
    /// simulation's network).
    pub fn with_dial(dial: Dial) -> Self {
        Self::of(Dialer::Custom(dial), "http")
    }

    fn of(connector: Dialer, scheme: &'static str) -> Self {
        NodePool {
            inner: Arc::new(Inner {
                connector,
                scheme,
                idle: Mutex::new(HashMap::new()),
                raw: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Sends `req` (origin-form URI, `/path?query`) to the node at
    /// `endpoint`; a missing `Host` becomes the endpoint.
    pub async fn request(
        &self,
        endpoint: &str,
        mut req: Request<Body>,
    ) -> Result<Response<PooledBody>, SendError> {
        if !req.headers().contains_key(header::HOST) {
            let host = HeaderValue::from_str(endpoint)
                .map_err(|_| SendError::Endpoint(endpoint.to_string()))?;
            req.headers_mut().insert(header::HOST, host);
        }
        let (key, idle) = self.checkout(endpoint).await;
        let (mut sender, reused) = match idle {
            Some(sender) => (sender, true),
            None => (self.connect(endpoint).await?, false),
        };
        let resp = match sender.try_send_request(req).await {
            Ok(resp) => resp,
            // Not written at all on a reused connection: the node closed
            // it just now. Once more, on a new one.
            Err(mut e) if reused && e.message().is_some() => {
                let Some(req) = e.take_message() else {
                    return Err(e.into_error().into());
                };
                sender = self.connect(endpoint).await?;
                sender.send_request(req).await?
            }
            Err(e) => return Err(e.into_error().into()),
        };
        // An upgraded connection belongs to the upgrade from now on.
        let reuse = (resp.status() != StatusCode::SWITCHING_PROTOCOLS).then(|| Reuse {
            pool: Arc::downgrade(&self.inner),
            key,
            sender,
        });
        Ok(resp.map(|body| PooledBody::new(body, reuse)))
    }

    /// An idle connection to `endpoint` for the fast path, the most
    /// recently used first; those idle for [`IDLE_TIMEOUT`] are closed.
    pub fn take_raw(&self, endpoint: &str) -> Option<DialedIo> {
        let mut raw = lock(&self.inner.raw);
        let list = raw.get_mut(endpoint)?;
        while let Some((io, since)) = list.pop() {
            if since.elapsed() < IDLE_TIMEOUT {
                return Some(io);
            }
        }
        None
    }

    /// Keeps `io` (its last answer read in full) for the next request to
    /// `endpoint`, up to the same count per node as the hyper pool keeps.
    pub fn put_raw(&self, endpoint: &str, io: DialedIo) {
        let mut raw = lock(&self.inner.raw);
        let list = match raw.get_mut(endpoint) {
            Some(list) => list,
            None => raw.entry(Box::from(endpoint)).or_default(),
        };
        if list.len() >= MAX_IDLE_PER_NODE {
            list.retain(|(_, since)| since.elapsed() < IDLE_TIMEOUT);
            if list.len() >= MAX_IDLE_PER_NODE {
                return;
            }
        }
        list.push((io, Instant::now()));
    }

    /// A new connection to `endpoint` (TCP, and TLS when internal TLS is
    /// on), for the fast path to speak HTTP/1.1 on.
    pub async fn dial_raw(&self, endpoint: &str) -> Result<DialedIo, SendError> {
        match &self.inner.connector {
            Dialer::Tls(connector) => {
                let uri: Uri = format!("{}://{endpoint}/", self.inner.scheme)
                    .parse()
                    .map_err(|_| SendError::Endpoint(endpoint.to_string()))?;
                let io = connector
                    .clone()
                    .call(uri)
                    .await
                    .map_err(SendError::Connect)?;
                Ok(Box::new(hyper_util::rt::TokioIo::new(io)))
            }
            Dialer::Custom(dial) => dial(endpoint)
                .await
                .map_err(|e| SendError::Connect(e.into())),
        }
    }

    /// The pool's key for `endpoint`, and an idle connection to it that is
    /// open and ready, the most recently used first.
    async fn checkout(&self, endpoint: &str) -> (Arc<str>, Option<http1::SendRequest<Body>>) {
        loop {
            let (key, found) = {
                let mut idle = lock(&self.inner.idle);
                let Some(node) = idle.get_mut(endpoint) else {
                    let key: Arc<str> = Arc::from(endpoint);
                    idle.insert(
                        key.clone(),
                        Node {
                            key: key.clone(),
                            idle: Vec::new(),
                        },
                    );
                    return (key, None);
                };
                let mut found = None;
                while let Some(c) = node.idle.pop() {
                    if !c.sender.is_closed() && c.since.elapsed() < IDLE_TIMEOUT {
                        found = Some(c.sender);
                        break;
                    }
                }
                (node.key.clone(), found)
            };
            let Some(mut sender) = found else {
                return (key, None);
            };
            // Ready when it went back (see `Reuse::put_back`); this only
            // finds one the node closed meanwhile.
            if sender.ready().await.is_ok() {
                return (key, Some(sender));
            }
        }
    }

    async fn connect(&self, endpoint: &str) -> Result<http1::SendRequest<Body>, SendError> {
        let uri: Uri = format!("{}://{endpoint}/", self.inner.scheme)
            .parse()
            .map_err(|_| SendError::Endpoint(endpoint.to_string()))?;
        match &self.inner.connector {
            Dialer::Tls(connector) => {
                let io = connector
                    .clone()
                    .call(uri)
                    .await
                    .map_err(SendError::Connect)?;
                handshake(io, endpoint).await
            }
            Dialer::Custom(dial) => {
                let io = dial(endpoint)
                    .await
                    .map_err(|e| SendError::Connect(e.into()))?;
                handshake(hyper_util::rt::TokioIo::new(io), endpoint).await
            }
        }
    }
}

/// HTTP/1.1 over `io`, its connection driven on a task of this runtime (a
/// worker's connections are driven by that worker).
async fn handshake<I>(io: I, endpoint: &str) -> Result<http1::SendRequest<Body>, SendError>
where
    I: hyper::rt::Read + hyper::rt::Write + Send + Unpin + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .handshake(io)
        .await
        .map_err(|e| SendError::Connect(e.into()))?;
    let endpoint = endpoint.to_string();
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(node = %endpoint, error = %e, "node connection ended");
        }
    });
    Ok(sender)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What returns a connection to its pool.
struct Reuse {
    pool: Weak<Inner>,
    key: Arc<str>,
    sender: http1::SendRequest<Body>,
}

impl Reuse {
    /// Returns the connection once it can take another request: at once in
    /// the common case; a connection still sending its request's body (the
    /// node answered early) is waited for on a task of its own, so that
    /// nobody checks it out and then waits behind that body.
    fn put_back(mut self) {
        if self.sender.is_ready() {
            return self.insert();
        }
        if self.sender.is_closed() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if self.sender.ready().await.is_ok() {
                    self.insert();
                }
            });
        }
    }

    fn insert(self) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let mut idle = lock(&pool.idle);
        let key = self.key;
        let list = &mut idle
            .entry(key.clone())
            .or_insert_with(|| Node {
                key,
                idle: Vec::new(),
            })
            .idle;
        if list.len() >= MAX_IDLE_PER_NODE {
            // Closed and expired ones first; if still full, this one goes.
            list.retain(|c| !c.sender.is_closed() && c.since.elapsed() < IDLE_TIMEOUT);
            if list.len() >= MAX_IDLE_PER_NODE {
                return;
            }
        }
        list.push(Idle {
            sender: self.sender,
            since: Instant::now(),
        });
    }
}

/// A node's answer body; once read to the end, its connection goes back to
/// the pool. Dropped earlier, the connection is closed instead (hyper
/// cannot reuse a connection with an unread answer on it).
pub struct PooledBody {
    inner: hyper::body::Incoming,
    reuse: Option<Reuse>,
}

impl PooledBody {
    fn new(inner: hyper::body::Incoming, reuse: Option<Reuse>) -> Self {
        let mut body = PooledBody { inner, reuse };
        if body.inner.is_end_stream() {
            body.done();
        }
        body
    }

    fn done(&mut self) {
        if let Some(reuse) = self.reuse.take() {
            reuse.put_back();
        }
    }
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.done(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.done(),
            Poll::Ready(Some(Err(_))) => this.reuse = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    /// A plain HTTP/1.1 server counting the connections it accepted.
    async fn server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(
                        |req: Request<hyper::body::Incoming>| async move {
                            let text = format!("{} {}", req.method(), req.uri());
                            Ok::<_, std::convert::Infallible>(Response::new(
                                warren_core::body::full(text),
                            ))
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    fn pool() -> NodePool {
        let connector = warren_trust::connect::connector(
            None,
            warren_trust::Role::Node,
            Duration::from_secs(5),
            Duration::from_secs(10),
            false,
        )
        .unwrap();
        NodePool::new(connector, "http")
    }

    async fn get(pool: &NodePool, endpoint: &str, path: &str) -> String {
        let req = Request::get(path).body(warren_core::body::empty()).unwrap();
        let resp = pool.request(endpoint, req).await.unwrap();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn answers_read_to_the_end_reuse_their_connection() {
        let (addr, accepted) = server().await;
        let pool = pool();
        for i in 0..5 {
            assert_eq!(
                get(&pool, &addr, &format!("/x?i={i}")).await,
                format!("GET /x?i={i}")
            );
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for five requests in a row"
        );

        // Two at once need two connections; both are kept.
        let (a, b) = tokio::join!(get(&pool, &addr, "/a"), get(&pool, &addr, "/b"));
        assert_eq!((a.as_str(), b.as_str()), ("GET /a", "GET /b"));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        let (a, b) = tokio::join!(get(&pool, &addr, "/a"), get(&pool, &addr, "/b"));
        assert_eq!((a.as_str(), b.as_str()), ("GET /a", "GET /b"));
        assert_eq!(accepted.load(Ordering::SeqCst), 2, "both reused");

        // An answer dropped unread closes its connection instead.
        let req = Request::get("/c").body(warren_core::body::empty()).unwrap();
        let resp = pool.request(&addr, req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        drop(resp);
        get(&pool, &addr, "/d").await;
        get(&pool, &addr, "/e").await;
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "the other idle connection serves"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let req = Request::get("/").body(warren_core::body::empty()).unwrap();
        let err = pool()
            .request(&format!("127.0.0.1:{port}"), req)
            .await
            .unwrap_err();
        assert!(err.is_connect(), "{err}");
        let req = Request::get("/").body(warren_core::body::empty()).unwrap();
        let err = pool().request("not an address", req).await.unwrap_err();
        assert!(matches!(err, SendError::Endpoint(_)), "{err}");
    }
}
