//! The admin listener every component serves on its own port:
//! `GET /metrics` (Prometheus text), `GET /healthz` (the process is alive),
//! `GET /readyz` (200 while the component wants traffic; 503 once shutdown
//! has begun, so load balancers drain it first).

use crate::server::{self, Incoming, Limits};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use tokio::net::TcpListener;

/// Shared state behind the admin endpoints.
#[derive(Clone)]
pub struct Admin {
    /// Metrics rendered at `/metrics`; components register into it at start.
    pub registry: Arc<RwLock<Registry>>,
    /// What `/readyz` reports; flipped to false when shutdown begins.
    pub ready: Arc<AtomicBool>,
    /// The listener metrics (open connections, refusals, timeouts) of
    /// every listener of the component, registered in [`Admin::registry`].
    pub listeners: server::Metrics,
}

impl Admin {
    /// A fresh registry with the given metric name prefix (e.g. `warren_gateway`).
    pub fn new(prefix: &str) -> Self {
        let mut registry = Registry::with_prefix(prefix);
        let listeners = server::Metrics::register(&mut registry);
        Admin {
            registry: Arc::new(RwLock::new(registry)),
            ready: Arc::new(AtomicBool::new(false)),
            listeners,
        }
    }

    /// Marks the component ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Renders the registry as Prometheus text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Ok(reg) = self.registry.read() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        }
        out
    }

    fn respond(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let text = |status: StatusCode, body: String, ctype: &'static str| {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = status;
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static(ctype),
            );
            r
        };
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET and HEAD\n".into(),
                "text/plain",
            );
        }
        match req.uri().path() {
            "/metrics" => text(
                StatusCode::OK,
                self.render(),
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            ),
            "/healthz" => text(StatusCode::OK, "ok\n".into(), "text/plain"),
            "/readyz" if self.ready.load(Ordering::SeqCst) => {
                text(StatusCode::OK, "ready\n".into(), "text/plain")
            }
            "/readyz" => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready\n".into(),
                "text/plain",
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                "admin endpoints: /metrics /healthz /readyz\n".into(),
                "text/plain",
            ),
        }
    }

    /// Serves the admin endpoints on `listener` until `shutdown` resolves,
    /// under `limits` (the part's timeouts, its `--admin-max-connections`),
    /// counted as listener `admin`.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
        limits: Limits,
    ) {
        let metrics = self.listeners.listener("admin");
        let handler = move |_peer, req: Request<Incoming>| {
            let resp = self.respond(&req);
            async move { resp }
        };
        server::serve(listener, handler, shutdown, limits, metrics).await;
    }
}
