//! An intercepted connection, served as HTTP: every request is checked
//! (it must name the host the connection was made for), transformed by
//! the rules for that host (placeholders resolved now, for this request),
//! and sent on over a connection of its own to the real destination
//! (TLS checked against the host's roots, the protocol the sandbox chose:
//! h2 when it spoke h2, HTTP/1.1 otherwise); a WebSocket upgrade is
//! spliced once both sides switched.
//!
//! What the proxy answers itself (a placeholder that does not resolve, a
//! destination it cannot reach or whose certificate does not verify, a
//! request for another host) is a `4xx`/`5xx` with `x-warren-egress:
//! refused` and a one-line text body naming the cause: never a secret's
//! value, never sent on with a placeholder left in or an empty value.

use crate::{Dialer, ResolveError, SandboxProxy, Target, CONNECT_TIMEOUT};
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use warren_core::body::{self, Body};
use warren_core::network::rules::{pieces, Piece, Rule};

/// The header on every answer the proxy makes itself.
pub const REFUSED_HEADER: &str = "x-warren-egress";

/// How long a request head may take to arrive on an intercepted
/// HTTP/1.1 connection.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Where an intercepted connection's requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Onward {
    /// The host the connection named (resolved by the node's resolver),
    /// at the port the sandbox connected to.
    Named { host: String, port: u16 },
    /// The address the sandbox connected to.
    Addr(std::net::SocketAddr),
    /// The cluster's gateways ([`Target::Gateway`]), always over TLS.
    Gateway,
}

/// One intercepted connection's way on.
struct Upstream {
    proxy: Arc<SandboxProxy>,
    /// The host every request must name (lower-case).
    host: String,
    port: u16,
    https: bool,
    /// Its requests go to the gateways.
    gateway: bool,
    client: Client<hyper_rustls::HttpsConnector<Dial>, Incoming>,
}

/// Serves `io` (the sandbox's side, TLS already ended when `tls`) as h2
/// when `h2`, else HTTP/1.1 with upgrades, sending each request on to
/// `onward`.
pub(crate) async fn serve<I>(
    proxy: Arc<SandboxProxy>,
    io: I,
    h2: bool,
    host: String,
    port: u16,
    onward: Onward,
    https: bool,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let gateway = onward == Onward::Gateway;
    let https = https || gateway;
    let dial = Dial {
        dialer: proxy.dialer.clone(),
        onward,
    };
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((*proxy.settings.client).clone())
        .https_or_http();
    // The protocol the sandbox chose, on to the destination too: h2 may
    // fall back to HTTP/1.1 there; an HTTP/1.1 connection (which may
    // upgrade) stays HTTP/1.1.
    let connector = if h2 {
        builder.enable_http1().enable_http2().wrap_connector(dial)
    } else {
        builder.enable_http1().wrap_connector(dial)
    };
    let client = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector);
    let up = Arc::new(Upstream {
        proxy,
        host,
        port,
        https,
        gateway,
        client,
    });
    let service = hyper::service::service_fn(move |req| {
        let up = up.clone();
        async move { Ok::<_, Infallible>(up.handle(req).await) }
    });
    let io = TokioIo::new(io);
    let result = if h2 {
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(io, service)
            .await
    } else {
        hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(io, service)
            .with_upgrades()
            .await
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "egress proxy: intercepted connection ended");
    }
}

/// The proxy's own answer (see the module doc).
fn refuse(status: StatusCode, message: impl std::fmt::Display) -> Response<Body> {
    let mut r = Response::new(body::full(format!("warren egress proxy: {message}\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(REFUSED_HEADER, HeaderValue::from_static("refused"));
    r
}

/// Connection-level headers: never forwarded (RFC 9110 §7.6.1), but for
/// `connection`/`upgrade` on an upgrade.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut http::HeaderMap, keep_upgrade: bool) {
    // Headers the Connection header names are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|n| !(keep_upgrade && n == header::UPGRADE))
        .collect();
    for n in named {
        headers.remove(n);
    }
    for h in HOP_BY_HOP {
        if keep_upgrade && (*h == "connection" || *h == "upgrade") {
            continue;
        }
        headers.remove(*h);
    }
}

impl Upstream {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let r = self.answer(req).await;
        self.proxy
            .settings
            .note(if r.headers().get(REFUSED_HEADER).is_some() {
                crate::Event::Refused
            } else {
                crate::Event::Forwarded
            });
        r
    }

    async fn answer(&self, mut req: Request<Incoming>) -> Response<Body> {
        if req.method() == http::Method::CONNECT {
            return refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                "CONNECT is not forwarded on an intercepted connection",
            );
        }
        // Every request names the host the connection was made for: the
        // rules that matched it, and the destination it was dialed for,
        // are that host's.
        let asked = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .or_else(|| {
                req.headers()
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string)
            });
        if let Some(a) = asked {
            if crate::peek::host_of_authority(&a).as_deref() != Some(self.host.as_str()) {
                return refuse(
                    StatusCode::MISDIRECTED_REQUEST,
                    format!(
                        "this connection is for {}; a request for {a:?} needs a connection of its own",
                        self.host
                    ),
                );
            }
        }
        if let Err(r) = self.transform(&mut req).await {
            return r;
        }
        let upgrade = warren_core::upgrade::protocol(&req).is_some();
        strip_hop_by_hop(req.headers_mut(), upgrade);
        let scheme = if self.https { "https" } else { "http" };
        let path = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        // The port only where it is not the scheme's (the gateways route
        // by name: theirs never matters).
        let default = if self.https { 443 } else { 80 };
        let port = if self.port == default || self.gateway {
            String::new()
        } else {
            format!(":{}", self.port)
        };
        let uri: Uri = match format!("{scheme}://{host}{port}{path}").parse() {
            Ok(u) => u,
            Err(e) => return refuse(StatusCode::BAD_REQUEST, format!("bad request target: {e}")),
        };
        *req.uri_mut() = uri;
        // An h2 request goes on as HTTP/1.1 when the destination speaks
        // only that (hyper sets the version per connection).
        *req.version_mut() = http::Version::HTTP_11;
        let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let mut resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(e) => {
                let cause = chain(&e);
                let hint = if cause.contains("certificate") || cause.contains("Certificate") {
                    " (the destination's certificate does not verify against the host's roots \
                     and --egress-ca-file)"
                } else if cause.contains("refused") || cause.contains("not permitted") {
                    " (the sandbox's egress policy may forbid it)"
                } else {
                    ""
                };
                return refuse(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "cannot forward to {}:{}: {cause}{hint}",
                        self.host, self.port
                    ),
                );
            }
        };
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            if let Some(client) = client_upgrade {
                let upstream = hyper::upgrade::on(&mut resp);
                warren_core::upgrade::splice(client, upstream, self.proxy.sandbox_id.clone());
            }
        } else {
            strip_hop_by_hop(resp.headers_mut(), false);
        }
        resp.map(body::boxed)
    }

    /// Applies the current rules for the connection's host to `req`.
    async fn transform(&self, req: &mut Request<Incoming>) -> Result<(), Response<Body>> {
        let rules = self.proxy.rules();
        // No rules for it any more (replaced since the connection began):
        // sent on as it is.
        let Some((key, list)) = rules.for_host(&self.host) else {
            return Ok(());
        };
        let headers: Vec<(&String, &String)> = list
            .iter()
            .filter_map(|r: &Rule| r.transform.as_ref())
            .flat_map(|t| t.headers.iter())
            .collect();
        let mut names = BTreeSet::new();
        let mut parsed = Vec::with_capacity(headers.len());
        for (name, value) in &headers {
            // Checked when the rules were set; refused here too rather
            // than sent with a placeholder left in.
            let p = pieces(value).map_err(|why| {
                refuse(
                    StatusCode::BAD_GATEWAY,
                    format!("the rule for {key}, header {name}: {why}"),
                )
            })?;
            for piece in &p {
                if let Piece::Secret(n) = piece {
                    names.insert(n.clone());
                }
            }
            parsed.push((name, p));
        }
        let values = if names.is_empty() {
            Default::default()
        } else {
            let names: Vec<String> = names.into_iter().collect();
            self.proxy
                .resolver
                .resolve(&self.proxy.sandbox_id, self.proxy.generation, names)
                .await
                .map_err(|e| match e {
                    ResolveError::Missing(n) => refuse(
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "the rule for {key}: ${{e2b.secrets.{n}}} does not resolve: this \
                             sandbox's team has no secret named {n:?}; the request was not sent"
                        ),
                    ),
                    ResolveError::Unavailable(why) => refuse(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "the rule for {key}: secrets cannot be resolved now ({why}); the \
                             request was not sent, retry"
                        ),
                    ),
                })?
        };
        for (name, p) in parsed {
            let mut out = String::new();
            for piece in p {
                match piece {
                    Piece::Text(t) => out.push_str(t),
                    Piece::Secret(n) => match values.get(&n) {
                        Some(v) if !v.is_empty() => out.push_str(v),
                        _ => {
                            return Err(refuse(
                                StatusCode::BAD_GATEWAY,
                                format!(
                                    "the rule for {key}: ${{e2b.secrets.{n}}} does not resolve; \
                                     the request was not sent"
                                ),
                            ))
                        }
                    },
                }
            }
            let hn = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                refuse(
                    StatusCode::BAD_GATEWAY,
                    format!("the rule for {key}: {name:?} is not a header name"),
                )
            })?;
            let hv = HeaderValue::from_str(&out).map_err(|_| {
                refuse(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "the rule for {key}, header {name}: the value does not fit in a header; \
                         the request was not sent"
                    ),
                )
            })?;
            req.headers_mut().insert(hn, hv);
        }
        Ok(())
    }
}

/// An error and its sources, one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        cur = s.source();
    }
    out
}

/// The connector under TLS: dials the connection's one destination
/// through the node's [`Dialer`], whatever host the URI names.
#[derive(Clone)]
pub(crate) struct Dial {
    dialer: Arc<dyn Dialer>,
    onward: Onward,
}

impl tower_service::Service<Uri> for Dial {
    type Response = TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let (dialer, onward) = (self.dialer.clone(), self.onward.clone());
        Box::pin(async move {
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect(dialer, onward))
                .await
                .map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("connect timed out after {CONNECT_TIMEOUT:?}"),
                    )
                })??;
            let _ = stream.set_nodelay(true);
            Ok(TokioIo::new(stream))
        })
    }
}

async fn connect(
    dialer: Arc<dyn Dialer>,
    onward: Onward,
) -> std::io::Result<tokio::net::TcpStream> {
    match onward {
        Onward::Gateway => dialer.dial(Target::Gateway).await,
        Onward::Addr(a) => dialer.dial(Target::Out(a)).await,
        Onward::Named { host, port } => {
            // The node's resolver, as the sandbox's own resolver (slirp's)
            // forwards to it.
            let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect();
            let mut last = std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{host} resolves to no address"),
            );
            for a in addrs {
                match dialer.dial(Target::Out(a)).await {
                    Ok(s) => return Ok(s),
                    Err(e) => last = std::io::Error::new(e.kind(), format!("{a}: {e}")),
                }
            }
            Err(last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_upgrades_keep_theirs() {
        let mut h = http::HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-private, upgrade"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("authorization", HeaderValue::from_static("kept"));
        let mut up = h.clone();
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1, "{h:?}");
        strip_hop_by_hop(&mut up, true);
        assert!(up.contains_key(header::UPGRADE) && up.contains_key(header::CONNECTION));
        assert!(!up.contains_key("x-private") && !up.contains_key("keep-alive"));
    }
}
