//! warren's parts over turmoil's simulated network: listeners for the
//! shared server loop (`warren_core::server::Accept`), the scheduler
//! client's connector and the gateway's node dialer.

use futures_util::future::BoxFuture;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::task::{Context, Poll};
use turmoil::net::{TcpListener, TcpStream};

/// A simulated TCP listener; peers are their simulated addresses.
pub struct Listener(pub TcpListener);

impl warren_core::server::Accept for Listener {
    type Conn = TcpStream;
    type Io = TcpStream;
    type Peer = SocketAddr;

    async fn accept(&self) -> std::io::Result<(TcpStream, SocketAddr)> {
        self.0.accept().await
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

/// The same for the scheduler, whose handlers read the caller as a
/// `warren_trust::Peer` (no certificate: internal TLS is not simulated).
pub struct SchedulerListener(pub TcpListener);

impl warren_core::server::Accept for SchedulerListener {
    type Conn = TcpStream;
    type Io = TcpStream;
    type Peer = warren_trust::Peer;

    async fn accept(&self) -> std::io::Result<(TcpStream, warren_trust::Peer)> {
        let (s, addr) = self.0.accept().await?;
        Ok((
            s,
            warren_trust::Peer {
                addr,
                identity: None,
            },
        ))
    }

    fn handshake(
        &self,
        conn: TcpStream,
        peer: warren_trust::Peer,
    ) -> impl Future<Output = std::io::Result<(TcpStream, warren_trust::Peer)>> + Send + 'static
    {
        std::future::ready(Ok((conn, peer)))
    }

    fn peer_ip(peer: &warren_trust::Peer) -> Option<IpAddr> {
        Some(peer.addr.ip())
    }
}

/// Dials schedulers for `warren_proto::client::Scheduler::with_connector`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedulerConnector;

impl tower_service::Service<http::Uri> for SchedulerConnector {
    type Response = TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = BoxFuture<'static, std::io::Result<TokioIo<TcpStream>>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(80);
        Box::pin(async move {
            let s = TcpStream::connect(format!("{host}:{port}")).await?;
            Ok(TokioIo::new(s))
        })
    }
}

/// The gateway's node dialer over the simulated network.
pub fn node_dial() -> warren_gateway::node_client::Dial {
    std::sync::Arc::new(|endpoint: &str| {
        let endpoint = endpoint.to_string();
        Box::pin(async move {
            let s = TcpStream::connect(endpoint).await?;
            Ok(Box::new(s) as warren_gateway::node_client::DialedIo)
        })
    })
}
