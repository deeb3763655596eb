//! HTTP/1.1 upgrades (WebSocket) through a proxy: whether a request asks for
//! one, and splicing the two upgraded connections once both sides agreed.
//! The gateway (client → node) and the node (gateway → envd or a sandbox
//! port) both proxy upgrades this way.

use http::{header, HeaderValue, Request, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

/// The `Upgrade` protocol of an HTTP/1.1 upgrade request: only when
/// `Connection` names `upgrade` too (RFC 9110 §7.8); an `Upgrade` header
/// alone is a hop-by-hop leftover, not a request to switch.
pub fn protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let asks = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

/// Once both sides have switched protocols, copies bytes both ways until
/// either closes; `sandbox` names the connection in logs.
pub fn splice(client: OnUpgrade, upstream: OnUpgrade, sandbox: String) {
    tokio::spawn(async move {
        match tokio::try_join!(client, upstream) {
            Ok((client, upstream)) => {
                let mut client = TokioIo::new(client);
                let mut upstream = TokioIo::new(upstream);
                if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    tracing::debug!(sandbox = %sandbox, error = %e, "upgraded connection ended");
                }
            }
            Err(e) => tracing::debug!(sandbox = %sandbox, error = %e, "upgrade failed"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrade_needs_connection_upgrade_on_http_1_1() {
        let req = |conn: Option<&str>, version| {
            let mut b = Request::builder()
                .version(version)
                .header(header::UPGRADE, "websocket");
            if let Some(c) = conn {
                b = b.header(header::CONNECTION, c);
            }
            b.body(()).unwrap_or_default()
        };
        let ws = Some(HeaderValue::from_static("websocket"));
        assert_eq!(
            protocol(&req(Some("keep-alive, Upgrade"), Version::HTTP_11)),
            ws
        );
        assert_eq!(protocol(&req(None, Version::HTTP_11)), None);
        assert_eq!(protocol(&req(Some("upgrade"), Version::HTTP_2)), None);
    }
}
