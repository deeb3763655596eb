//! warren's egress proxy: a sandbox's outbound connections to ports 80 and
//! 443, when it has egress rules (E2B's `network.rules`), pass through it;
//! for hosts the rules name it terminates TLS with a certificate from the
//! sandbox's own CA, applies the rules' header transforms (resolving
//! `${e2b.secrets.NAME}` at request time, so the sandbox never holds a
//! value and a secret updated now is used by the next request) and sends
//! the request on over TLS it checks against the host's roots; everything
//! else it splices through untouched, the sandbox's own TLS included
//! (docs/security.md, "Secrets and the egress proxy").
//!
//! The node owns the plumbing around it (`warren-node`'s
//! `runtime/egress/intercept.rs`): the listener inside the sandbox's
//! network namespace that its redirect rule sends those connections to,
//! and how the proxy dials on ([`Dialer`]): every onward connection is
//! judged by the sandbox's own egress policy, as its direct connections
//! are; and resolving placeholders ([`Resolver`]: the scheduler's).
//!
//! # Layout
//! - this file: [`SandboxProxy`], one per sandbox with rules: accepting,
//!   deciding per connection (intercept, splice, refuse) from what its
//!   first bytes name ([`peek`]).
//! - [`peek`]: the SNI of a TLS ClientHello, the `Host` of an HTTP head.
//! - [`tls`]: the leaves the proxy presents, the roots it checks with.
//! - [`forward`]: an intercepted connection served as HTTP/1.1 or h2,
//!   each request transformed and sent on; WebSocket upgrades spliced.

pub mod forward;
pub mod peek;
pub mod tls;

use futures_util::future::BoxFuture;
use peek::Hello;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use warren_core::network::rules::EgressRules;
use warren_trust::sandbox_ca::SandboxCa;

/// Most connections one sandbox may have open through the proxy at once;
/// past it new ones are closed at once (they cost the node, not the
/// sandbox).
pub const MAX_CONNECTIONS: usize = 1024;
/// How long the proxy waits for a connection's first bytes before
/// splicing it as it is (a protocol where the server speaks first).
pub const PEEK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an onward connect may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The slirp4netns network inside a sandbox (its gateway, resolver and
/// own address): never intercepted, never dialed on the host's network.
pub const SLIRP_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 0, 2, 0), 24);

/// Where an onward connection goes, as the proxy asks the node to dial it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Out of the host, judged by the sandbox's egress policy exactly as
    /// its own connections are (the node dials as the sandbox's host uid).
    Out(SocketAddr),
    /// The sandbox's own loopback (a connection to one of its own ports
    /// that the redirect caught): dialed inside its network namespace.
    Local(SocketAddr),
    /// The cluster's gateways, for a host under the sandbox domain: the
    /// address the node was given, when the sandbox's policy lets it reach
    /// the internet.
    Gateway,
}

/// How the node dials on for a sandbox.
pub trait Dialer: Send + Sync + 'static {
    fn dial(&self, target: Target) -> BoxFuture<'static, std::io::Result<TcpStream>>;
}

/// Why placeholders did not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// The sandbox's team has no secret of this name.
    Missing(String),
    /// They cannot be resolved now (the scheduler is unreachable).
    Unavailable(String),
}

/// How the node resolves secrets for a sandbox's requests.
pub trait Resolver: Send + Sync + 'static {
    /// The values of `names` (lower-case) for sandbox `sandbox_id` at
    /// `generation`.
    fn resolve(
        &self,
        sandbox_id: &str,
        generation: u64,
        names: Vec<String>,
    ) -> BoxFuture<'static, Result<BTreeMap<String, String>, ResolveError>>;
}

/// What became of a connection or a request, for the node's metrics
/// (`warren_node_egress_proxy_events_total{event}`): never a host, a
/// sandbox or a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A connection to a host with rules, its TLS (or HTTP) ended here.
    Intercepted,
    /// A connection to any other host, passed through untouched.
    Spliced,
    /// A request sent on (transformed) and answered by the destination.
    Forwarded,
    /// A request the proxy answered itself (a placeholder that does not
    /// resolve, a destination it cannot reach or verify, another host).
    Refused,
}

impl Event {
    pub fn label(self) -> &'static str {
        match self {
            Event::Intercepted => "intercepted",
            Event::Spliced => "spliced",
            Event::Forwarded => "forwarded",
            Event::Refused => "refused",
        }
    }
}

/// Told of every [`Event`].
pub type Observer = Arc<dyn Fn(Event) + Send + Sync>;

/// What every sandbox's proxy on a node shares.
pub struct Settings {
    /// The onward TLS client (roots: the host's plus the operator's).
    pub client: Arc<rustls::ClientConfig>,
    /// The gateways' host-routing domain (`<port>-<id>.<domain>`),
    /// lower-case: hosts under it go to [`Target::Gateway`].
    pub sandbox_domain: Option<String>,
    /// The node's metrics, if it keeps them.
    pub observe: Option<Observer>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("sandbox_domain", &self.sandbox_domain)
            .finish_non_exhaustive()
    }
}

impl Settings {
    fn note(&self, e: Event) {
        if let Some(o) = &self.observe {
            o(e);
        }
    }

    fn under_domain(&self, host: &str) -> bool {
        self.sandbox_domain.as_deref().is_some_and(|d| {
            host.strip_suffix(d)
                .is_some_and(|rest| rest.ends_with('.') && rest.len() > 1)
        })
    }
}

/// One sandbox's proxy (see the module doc).
pub struct SandboxProxy {
    pub sandbox_id: String,
    pub generation: u64,
    settings: Arc<Settings>,
    leaves: tls::Leaves,
    rules: RwLock<Arc<EgressRules>>,
    dialer: Arc<dyn Dialer>,
    resolver: Arc<dyn Resolver>,
    slots: Arc<tokio::sync::Semaphore>,
}

impl std::fmt::Debug for SandboxProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxProxy")
            .field("sandbox_id", &self.sandbox_id)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl SandboxProxy {
    pub fn new(
        sandbox_id: &str,
        generation: u64,
        settings: Arc<Settings>,
        ca: &SandboxCa,
        rules: EgressRules,
        dialer: Arc<dyn Dialer>,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Arc<SandboxProxy>, String> {
        Ok(Arc::new(SandboxProxy {
            sandbox_id: sandbox_id.to_string(),
            generation,
            settings,
            leaves: tls::Leaves::new(ca)?,
            rules: RwLock::new(Arc::new(rules.normalized())),
            dialer,
            resolver,
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
        }))
    }

    /// Replaces the rules: connections made from now on, and the next
    /// request of every intercepted one, follow them.
    pub fn set_rules(&self, rules: EgressRules) {
        let rules = Arc::new(rules.normalized());
        match self.rules.write() {
            Ok(mut r) => *r = rules,
            Err(p) => *p.into_inner() = rules,
        }
    }

    fn rules(&self) -> Arc<EgressRules> {
        match self.rules.read() {
            Ok(r) => r.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Accepts on `listener` (inside the sandbox's network namespace)
    /// until the task is aborted.
    pub fn serve(self: &Arc<Self>, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let own = listener.local_addr().ok();
            loop {
                let (stream, _) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // EMFILE and the like: the node's, not the sandbox's.
                        tracing::warn!(sandbox_id = %me.sandbox_id, error = %e, "egress proxy: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(slot) = me.slots.clone().try_acquire_owned() else {
                    tracing::debug!(sandbox_id = %me.sandbox_id, "egress proxy: connection limit reached; closed");
                    continue;
                };
                let me = me.clone();
                tokio::spawn(async move {
                    me.connection(stream, own).await;
                    drop(slot);
                });
            }
        })
    }

    async fn connection(self: Arc<Self>, stream: TcpStream, own: Option<SocketAddr>) {
        let _ = stream.set_nodelay(true);
        // Where the sandbox meant to go (its redirect rule rewrote it).
        let Some(orig) = original_dst(&stream) else {
            return;
        };
        // Not redirected (a direct connection to the listener).
        if Some(orig) == own {
            return;
        }
        self.handle(stream, orig).await;
    }

    /// One connection the sandbox made to `orig` (redirected here): see
    /// the module doc. The listener's loop calls it; tests too.
    pub async fn handle(self: Arc<Self>, stream: TcpStream, orig: SocketAddr) {
        // The sandbox's own slirp network: nothing to do on the host.
        if in_slirp_net(orig.ip()) {
            return;
        }
        let hello = peek_hello(&stream).await;
        let named = match &hello {
            Some(Hello::Tls(n)) | Some(Hello::Http(n)) => n.clone(),
            _ => None,
        };
        // A request without a name is matched by the address it went to.
        let host = named.clone().unwrap_or_else(|| orig.ip().to_string());
        let ruled = self.rules().for_host(&host).is_some();
        let gateway = named
            .as_deref()
            .is_some_and(|n| self.settings.under_domain(n));
        // Where a request goes on: over TLS, where the sandbox connected
        // (its policy judged that address; the certificate, checked for
        // the name, is what ties a secret to the host); in plain HTTP,
        // where the name resolves on the host (never an address the
        // sandbox picked, with a Host header it wrote).
        let onward = match &hello {
            _ if gateway => forward::Onward::Gateway,
            Some(Hello::Tls(_)) => forward::Onward::Addr(orig),
            _ => forward::Onward::Named {
                host: host.clone(),
                port: orig.port(),
            },
        };
        let intercepted = matches!(
            (&hello, ruled, gateway),
            (Some(Hello::Tls(_)), true, _)
                | (Some(Hello::Http(_)), true, _)
                | (Some(Hello::Http(_)), false, true)
        );
        self.settings.note(if intercepted {
            Event::Intercepted
        } else {
            Event::Spliced
        });
        let result = match (&hello, ruled, gateway) {
            (Some(Hello::Tls(_)), true, _) => self.intercept_tls(stream, &host, orig, onward).await,
            (Some(Hello::Http(_)), true, _) | (Some(Hello::Http(_)), false, true) => {
                forward::serve(
                    self.clone(),
                    stream,
                    false,
                    host.clone(),
                    orig.port(),
                    onward,
                    false,
                )
                .await;
                Ok(())
            }
            (Some(Hello::Tls(_)), false, true) => self.splice(stream, Target::Gateway).await,
            _ if orig.ip().is_loopback() => self.splice(stream, Target::Local(orig)).await,
            _ => self.splice(stream, Target::Out(orig)).await,
        };
        if let Err(e) = result {
            tracing::debug!(sandbox_id = %self.sandbox_id, host = %host, error = %e, "egress proxy: connection ended");
        }
    }

    async fn intercept_tls(
        self: &Arc<Self>,
        stream: TcpStream,
        host: &str,
        orig: SocketAddr,
        onward: forward::Onward,
    ) -> Result<(), String> {
        let cfg = self.leaves.config(host)?;
        let tls = tokio_rustls::TlsAcceptor::from(cfg)
            .accept(stream)
            .await
            .map_err(|e| format!("TLS with the sandbox: {e}"))?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        forward::serve(
            self.clone(),
            tls,
            h2,
            host.to_string(),
            orig.port(),
            onward,
            true,
        )
        .await;
        Ok(())
    }

    /// Copies bytes both ways between the sandbox's connection (whose
    /// first bytes were only peeked at) and `target`.
    async fn splice(&self, mut stream: TcpStream, target: Target) -> Result<(), String> {
        let mut up = tokio::time::timeout(CONNECT_TIMEOUT, self.dialer.dial(target))
            .await
            .map_err(|_| format!("connecting to {target:?} timed out"))?
            .map_err(|e| format!("connecting to {target:?}: {e}"))?;
        let _ = up.set_nodelay(true);
        tokio::io::copy_bidirectional(&mut stream, &mut up)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

fn in_slirp_net(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            let (net, len) = SLIRP_NET;
            let mask = u32::MAX << (32 - u32::from(len));
            u32::from(a) & mask == u32::from(net) & mask
        }
        IpAddr::V6(_) => false,
    }
}

/// The destination a redirected connection was made to (`SO_ORIGINAL_DST`).
fn original_dst(stream: &TcpStream) -> Option<SocketAddr> {
    let sa = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::OriginalDst).ok()?;
    let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
    Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sa.sin_port)))
}

/// The connection's first bytes, parsed (see [`peek`]); `None` when the
/// sandbox sent nothing within [`PEEK_TIMEOUT`] or closed.
async fn peek_hello(stream: &TcpStream) -> Option<Hello> {
    let mut buf = vec![0u8; peek::MAX_PEEK];
    let deadline = tokio::time::Instant::now() + PEEK_TIMEOUT;
    let mut last = 0;
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        if let Some(h) = peek::parse(&buf[..n]) {
            return Some(h);
        }
        if n >= buf.len() {
            return Some(Hello::Other);
        }
        // More is coming (a hello split across segments): peek returns at
        // once while bytes wait, so pause before looking again.
        if n == last {
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        last = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_domain_covers_names_under_it() {
        let s = Settings {
            client: Arc::new(
                tls::client_config(Arc::new(rustls::RootCertStore::empty()))
                    .unwrap_or_else(|e| panic!("{e}")),
            ),
            sandbox_domain: Some("warren.localhost".into()),
            observe: None,
        };
        assert!(s.under_domain("8080-abc.warren.localhost"));
        assert!(!s.under_domain("warren.localhost"));
        assert!(!s.under_domain("evilwarren.localhost"));
        assert!(!s.under_domain(".warren.localhost"));
        assert!(in_slirp_net(
            "10.0.2.3"
                .parse()
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        ));
        assert!(!in_slirp_net(
            "10.0.3.3"
                .parse()
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        ));
    }
}
