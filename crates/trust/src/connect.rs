//! Dialing other parts: an HTTPS connector that presents this part's
//! certificate and accepts only a server of the expected role, for the
//! gateway's pooled node client and the tonic channels to schedulers.

use crate::config::Trust;
use crate::identity::Role;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use std::time::Duration;

/// How long a peer may leave what was sent to it unacknowledged, or stay
/// silent to keepalive probes on an idle connection, before the connection
/// is dropped, where no flag sets it (the scheduler channels; the gateway's
/// node pool takes `--dead-node-timeout`).
pub const DEAD_PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// A TCP connector with `connect_timeout`, no Nagle, and `dead_peer` as the
/// bound on a peer that stopped answering: `TCP_USER_TIMEOUT` (data sent
/// and never acknowledged, as when the peer's host lost its network: a
/// request on a pooled connection fails then instead of waiting for the
/// kernel's ~15 minutes of retransmissions) and keepalive probes on idle
/// connections (a third of it idle, then three probes a ninth of it apart),
/// so a pooled connection to a vanished host is gone before it is reused.
pub fn tcp(connect_timeout: Duration, dead_peer: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http.enforce_http(false);
    http.set_tcp_user_timeout(Some(dead_peer));
    http.set_keepalive(Some((dead_peer / 3).max(Duration::from_secs(1))));
    http.set_keepalive_interval(Some((dead_peer / 9).max(Duration::from_secs(1))));
    http.set_keepalive_retries(Some(3));
    http
}

/// Dials `https://` URIs with mutual TLS to a `server`-role peer, over
/// [`tcp`] connections. With
/// `trust` `None` (`--insecure-internal`) it dials `http://` URIs plainly.
pub fn connector(
    trust: Option<&Trust>,
    server: Role,
    connect_timeout: Duration,
    dead_peer: Duration,
    http2: bool,
) -> Result<HttpsConnector<HttpConnector>, String> {
    let builder = match trust {
        Some(t) => HttpsConnectorBuilder::new()
            .with_tls_config(t.client_config(server)?)
            .https_only(),
        None => HttpsConnectorBuilder::new()
            .with_tls_config(insecure_placeholder()?)
            .https_or_http(),
    };
    let builder = builder.enable_http1();
    let connector = if http2 {
        builder
            .enable_http2()
            .wrap_connector(tcp(connect_timeout, dead_peer))
    } else {
        builder.wrap_connector(tcp(connect_timeout, dead_peer))
    };
    Ok(connector)
}

/// The URI scheme internal requests use: `https` with TLS, `http` without.
pub fn scheme(trust: Option<&Trust>) -> &'static str {
    if trust.is_some() {
        "https"
    } else {
        "http"
    }
}

/// A client configuration that trusts nothing: without TLS only `http://`
/// URIs are dialed, so it is never used for a handshake.
fn insecure_placeholder() -> Result<rustls::ClientConfig, String> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth())
}
