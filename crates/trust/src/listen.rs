//! A listener for internal traffic: plain TCP (`--insecure-internal`) or
//! mutual TLS, where handshakes run concurrently in the background (one
//! slow or silent client cannot hold up the others), are bounded in number
//! and time, and only authenticated connections reach the server loop.
//! It serves both the shared HTTP loop ([`warren_core::server::Accept`])
//! and tonic ([`Listener::into_stream`]).

use crate::config::Trust;
use crate::identity::{Identity, Role};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress at once; connections beyond are closed at once.
pub const MAX_HANDSHAKES: usize = 256;

/// Who is on the other end of an internal connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// What the client's certificate names; `None` under `--insecure-internal`.
    pub identity: Option<Identity>,
}

/// One accepted connection.
pub struct Conn {
    io: Io,
    peer: Peer,
}

enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    pub fn peer(&self) -> &Peer {
        &self.peer
    }
}

/// Plain or TLS connections from one TCP listener.
pub enum Listener {
    Plain(TcpListener),
    Tls(TlsIncoming),
}

/// Authenticated TLS connections, handshaken by a background task.
pub struct TlsIncoming {
    rx: Mutex<mpsc::Receiver<Conn>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        // Dropping the listener stops accepting, as for a plain listener.
        self.task.abort();
    }
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
        let Some(trust) = trust else {
            return Ok(Listener::Plain(tcp));
        };
        let acceptor = TlsAcceptor::from(trust.server_config(accept)?);
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(accept_loop(tcp, acceptor, tx, what));
        Ok(Listener::Tls(TlsIncoming {
            rx: Mutex::new(rx),
            task,
        }))
    }

    /// The connections as a stream, for tonic's `serve_with_incoming`.
    pub fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = std::io::Result<Conn>> + Send + 'static {
        futures_util::stream::unfold(self, |l| async move {
            let next = warren_core::server::Accept::accept(&l).await;
            Some((next.map(|(c, _)| c), l))
        })
    }
}

impl warren_core::server::Accept for Listener {
    type Io = Conn;
    type Peer = Peer;

    async fn accept(&self) -> std::io::Result<(Conn, Peer)> {
        match self {
            Listener::Plain(tcp) => {
                let (stream, addr) = tcp.accept().await?;
                let _ = stream.set_nodelay(true);
                let peer = Peer {
                    addr,
                    identity: None,
                };
                Ok((
                    Conn {
                        io: Io::Plain(stream),
                        peer: peer.clone(),
                    },
                    peer,
                ))
            }
            Listener::Tls(incoming) => {
                let conn =
                    incoming.rx.lock().await.recv().await.ok_or_else(|| {
                        std::io::Error::other("the TLS listener stopped accepting")
                    })?;
                let peer = conn.peer.clone();
                Ok((conn, peer))
            }
        }
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<Conn>,
    what: &'static str,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let limit = Arc::new(LogLimit::default());
    loop {
        let (stream, addr) = match tcp.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(listener = what, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Too many handshakes in flight: close this one at once.
            limit.warn(
                what,
                addr,
                "too many TLS handshakes in progress; connection closed",
            );
            continue;
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        let limit = limit.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    limit.warn(what, addr, &format!("refused: {}", explain(&e)));
                    return;
                }
                Err(_) => {
                    limit.warn(what, addr, "refused: no TLS handshake within 10s");
                    return;
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
                limit.warn(what, addr, "refused: no client identity");
                return;
            };
            tracing::debug!(listener = what, %addr, peer = %identity, "internal connection");
            let peer = Peer {
                addr,
                identity: Some(identity),
            };
            let _ = tx
                .send(Conn {
                    io: Io::Tls(Box::new(tls)),
                    peer,
                })
                .await;
        });
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

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
