//! Which sandbox and port a data-plane request is for.
//!
//! A request is data plane when it carries `E2b-Sandbox-Id` +
//! `E2b-Sandbox-Port` (what the e2b SDK sends with `E2B_SANDBOX_URL`), or
//! its host is `{port}-{sandboxId}.{domain}` (with or without `:port`);
//! everything else is the control plane. Ids and ports are validated here,
//! before anything is asked of the scheduler.

use crate::error::ApiError;
use http::header::HeaderName;
use http::Request;
use warren_core::headers::{E2B_SANDBOX_ID, E2B_SANDBOX_PORT};
use warren_core::id::validate_sandbox_id;

// Names, not strings: a `&str` name is parsed again at every lookup.
const H_E2B_SANDBOX_ID: HeaderName = HeaderName::from_static(E2B_SANDBOX_ID);
const H_E2B_SANDBOX_PORT: HeaderName = HeaderName::from_static(E2B_SANDBOX_PORT);

/// The sandbox and port a data-plane request is addressed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Validated sandbox id.
    pub sandbox_id: String,
    /// Port inside the sandbox (49983 is envd).
    pub port: u16,
}

/// `None` for a control-plane request; otherwise the target or a 400.
pub fn classify<B>(req: &Request<B>, domain: &str) -> Option<Result<Target, ApiError>> {
    let h = req.headers();
    fn text(v: Option<&http::HeaderValue>) -> Option<Result<&str, ()>> {
        v.map(|v| v.to_str().map_err(|_| ()))
    }
    let host = match req.uri().host() {
        Some(host) => Some(Ok(host.to_string())),
        None => h
            .get(http::header::HOST)
            .map(|v| v.to_str().map(strip_port).map_err(|_| ())),
    };
    from_parts(
        text(h.get(H_E2B_SANDBOX_ID)),
        text(h.get(H_E2B_SANDBOX_PORT)),
        host,
        domain,
    )
}

/// [`classify`] from a request's parts: the `E2b-Sandbox-Id` and
/// `E2b-Sandbox-Port` header values and the host (without its port), each
/// `Err` when not visible ASCII. The proxy's fast path, which has no
/// `Request`, asks this too, so both paths route alike.
pub fn from_parts<'a>(
    id: Option<Result<&'a str, ()>>,
    port: Option<Result<&'a str, ()>>,
    host: Option<Result<String, ()>>,
    domain: &str,
) -> Option<Result<Target, ApiError>> {
    if id.is_some() || port.is_some() {
        let text = |v: Option<Result<&'a str, ()>>, name: &str| -> Result<&'a str, ApiError> {
            let v = v.ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_sandbox_target",
                    format!(
                        "missing {name} header (E2b-Sandbox-Id and E2b-Sandbox-Port go together)"
                    ),
                )
            })?;
            v.map(str::trim).map_err(|()| {
                ApiError::bad_request("invalid_sandbox_target", format!("{name} is not ASCII"))
            })
        };
        return Some(
            text(id, "E2b-Sandbox-Id")
                .and_then(|id| Ok((id, text(port, "E2b-Sandbox-Port")?)))
                .and_then(|(id, port)| target(id, port)),
        );
    }
    let host = host?.ok()?.to_ascii_lowercase();
    let host = host.trim_end_matches('.');
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    // `{port}-{id}`: a leading run of digits then '-'. Anything else under
    // the domain (e.g. `api.{domain}`) is the control plane.
    let (port, id) = label.split_once('-')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(target(id, port))
}

/// `host` without its `:port`.
pub fn strip_port(host: &str) -> String {
    // `[v6]:port` keeps its brackets; `name:port` loses the port.
    match host.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h.to_string()
            } else {
                host.to_string()
            }
        }
        _ => host.to_string(),
    }
}

fn target(id: &str, port: &str) -> Result<Target, ApiError> {
    validate_sandbox_id(id).map_err(|e| {
        ApiError::bad_request("invalid_sandbox_id", format!("invalid sandbox id: {e}"))
    })?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| {
            let shown: String = port.chars().take(20).collect();
            ApiError::bad_request(
                "invalid_port",
                format!("invalid port {shown:?}: must be 1-65535"),
            )
        })?;
    Ok(Target {
        sandbox_id: id.to_string(),
        port,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req(host: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().uri("/x").header("host", host);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn by_host_and_headers() {
        let t = classify(&req("49983-abc123.localhost:3000", &[]), "localhost");
        assert_eq!(
            t.and_then(Result::ok),
            Some(Target {
                sandbox_id: "abc123".into(),
                port: 49983
            })
        );
        let t = classify(&req("8080-abc.sb.example.com", &[]), "sb.example.com");
        assert_eq!(t.and_then(Result::ok).map(|t| t.port), Some(8080));
        assert!(classify(&req("localhost:3000", &[]), "localhost").is_none());
        assert!(classify(&req("api.localhost", &[]), "localhost").is_none());
        assert!(classify(&req("evil-localhost", &[]), "localhost").is_none());
        let t = classify(
            &req(
                "localhost",
                &[("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "49983")],
            ),
            "localhost",
        );
        assert_eq!(
            t.and_then(Result::ok).map(|t| t.sandbox_id),
            Some("abc".into())
        );
    }

    #[test]
    fn rejects_bad_targets() {
        let e = classify(&req("49983-AB_C.localhost", &[]), "localhost")
            .and_then(Result::err)
            .map(|e| e.message);
        assert!(e.is_some_and(|m| m.starts_with("invalid sandbox id")));
        let e = classify(&req("99999-abc.localhost", &[]), "localhost").and_then(Result::err);
        assert!(e.is_some_and(|e| e.message.starts_with("invalid port")));
        let e = classify(&req("localhost", &[("e2b-sandbox-id", "abc")]), "localhost")
            .and_then(Result::err);
        assert!(e.is_some_and(|e| e.message.contains("E2b-Sandbox-Port")));
    }
}
