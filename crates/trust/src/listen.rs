//! A listener for internal traffic: plain TCP (`--insecure-internal`) or
//! mutual TLS. It plugs into the shared server loop
//! ([`warren_core::server::Accept`]): accepting is immediate, and the TLS
//! handshake runs on the connection's own task under the loop's
//! header-read timeout and connection limits, so a silent or slow client
//! holds up nobody; only authenticated connections reach a handler, which
//! learns the client's identity from the [`Peer`].

use crate::config::Trust;
use crate::identity::{Identity, Role};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Who is on the other end of an internal connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// What the client's certificate names; `None` under `--insecure-internal`.
    pub identity: Option<Identity>,
}

/// One connection, plain or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Plain or mutual-TLS connections from one TCP listener.
pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    what: &'static str,
    log: Arc<LogLimit>,
}

impl Listener {
    /// Serves `tcp` plainly when `trust` is `None`, else with mutual TLS
    /// accepting client certificates of the `accept` roles. `what` names
    /// the listener in log lines ("node", "scheduler").
    pub fn new(
        tcp: TcpListener,
        trust: Option<&Trust>,
        accept: &[Role],
        what: &'static str,
    ) -> Result<Listener, String> {
        let tls = match trust {
            Some(t) => Some(TlsAcceptor::from(t.server_config(accept)?)),
            None => None,
        };
        Ok(Listener {
            tcp,
            tls,
            what,
            log: Arc::new(LogLimit::default()),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Whether connections are mutual TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }
}

impl warren_core::server::Accept for Listener {
    type Conn = TcpStream;
    type Io = Stream;
    type Peer = Peer;

    async fn accept(&self) -> std::io::Result<(TcpStream, Peer)> {
        let (stream, addr) = self.tcp.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok((
            stream,
            Peer {
                addr,
                identity: None,
            },
        ))
    }

    fn handshake(
        &self,
        conn: TcpStream,
        peer: Peer,
    ) -> impl Future<Output = std::io::Result<(Stream, Peer)>> + Send + 'static {
        let tls = self.tls.clone();
        let (what, log) = (self.what, self.log.clone());
        async move {
            let Some(acceptor) = tls else {
                return Ok((Stream::Plain(conn), peer));
            };
            let tls = match acceptor.accept(conn).await {
                Ok(tls) => tls,
                Err(e) => {
                    log.warn(what, peer.addr, &format!("refused: {}", explain(&e)));
                    return Err(e);
                }
            };
            let identity = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| Identity::from_der(c).ok());
            let Some(identity) = identity else {
                // The verifier already required one; never serve without it.
                log.warn(what, peer.addr, "refused: no client identity");
                return Err(std::io::Error::other("no client identity"));
            };
            tracing::debug!(listener = what, addr = %peer.addr, peer = %identity, "internal connection");
            Ok((
                Stream::Tls(Box::new(tls)),
                Peer {
                    addr: peer.addr,
                    identity: Some(identity),
                },
            ))
        }
    }

    fn peer_ip(peer: &Peer) -> Option<IpAddr> {
        Some(peer.addr.ip())
    }

    fn rehome(conn: TcpStream) -> std::io::Result<TcpStream> {
        warren_core::server::rehome_tcp(conn)
    }
}

/// A handshake failure in words an operator can act on.
fn explain(e: &std::io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidMessage(_)) => format!(
            "the client does not speak TLS ({e}); internal listeners need mutual TLS \
             with a certificate from the cluster CA"
        ),
        Some(rustls::Error::NoCertificatesPresented) => {
            "the client presented no certificate; internal listeners need one from the cluster CA"
                .into()
        }
        _ => e.to_string(),
    }
}

/// Refusals are logged at WARN, at most 10 a second per listener (a flood
/// must not flood the log); the rest at DEBUG.
#[derive(Default)]
struct LogLimit {
    second: AtomicU64,
    count: AtomicU64,
}

impl LogLimit {
    fn warn(&self, what: &'static str, addr: SocketAddr, message: &str) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.count.store(0, Ordering::Relaxed);
        }
        if self.count.fetch_add(1, Ordering::Relaxed) < 10 {
            tracing::warn!(listener = what, peer = %addr, "internal connection {message}");
        } else {
            tracing::debug!(listener = what, peer = %addr, "internal connection {message}");
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
