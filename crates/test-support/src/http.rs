//! A small HTTP client for tests: JSON (or raw bytes) in, `(status, headers,
//! body, JSON)` out.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// An answer: status, headers, and the body parsed as JSON (`Null` when empty,
/// a JSON string when it is not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub json: serde_json::Value,
    /// The body as received.
    pub body: Bytes,
}

impl Answer {
    /// The JSON field `key` as a string, or "".
    pub fn str(&self, key: &str) -> String {
        self.json
            .get(key)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    }

    /// The body parsed as JSON; panics (naming status and body) when it is not JSON.
    pub fn expect_json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{} body is not JSON ({e}): {:?}", self.status, self.text()))
    }

    /// The body as (lossy) UTF-8 text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `message` of a JSON error body, or ""; panics when the body is not JSON.
    pub fn message(&self) -> String {
        self.expect_json()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The `error_code` of a JSON error body, or ""; panics when the body is not JSON.
    pub fn error_code(&self) -> String {
        self.expect_json()["error_code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// A pooled HTTP/1.1 client with a per-request timeout.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    /// Every request fails after this long.
    pub timeout: Duration,
}

impl Default for Http {
    fn default() -> Self {
        Http::new(Duration::from_secs(20))
    }
}

impl Http {
    pub fn new(timeout: Duration) -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            timeout,
        }
    }

    /// `method http://{addr}{path}` with `headers` and an optional JSON body.
    pub async fn send(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<Answer> {
        match body {
            Some(v) => {
                let mut with_type = headers.to_vec();
                with_type.push(("content-type", "application/json"));
                let bytes = Bytes::from(serde_json::to_vec(&v)?);
                self.send_raw(method, addr, path, &with_type, bytes).await
            }
            None => {
                self.send_raw(method, addr, path, headers, Bytes::new())
                    .await
            }
        }
    }

    /// `method http://{addr}{path}` with `headers` and `body` exactly as given
    /// (no content-type is added).
    pub async fn send_raw(
        &self,
        method: Method,
        addr: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Answer> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let fut = async {
            let resp = self.client.request(req.body(Full::new(body))?).await?;
            let (parts, body) = resp.into_parts();
            let bytes = body.collect().await?.to_bytes();
            let json = if bytes.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                    serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
                })
            };
            anyhow::Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                json,
                body: bytes,
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {:?}", self.timeout))?
    }
}

/// Creates a `base` sandbox through the gateway at `gateway` with `key`
/// (`POST /v2/sandboxes`, a 600 s timeout), retrying while the gateway
/// answers 503 (no node with room registered yet), for up to 30 s; any
/// other answer but 201 panics. Returns (sandbox id, envd access token, or
/// "" when the sandbox has none).
pub async fn create_sandbox(gateway: &str, key: &str) -> (String, String) {
    let sb = crate::wait_until(
        "a sandbox to be created",
        Duration::from_secs(30),
        || async {
            let r = Http::new(Duration::from_secs(30))
                .send(
                    Method::POST,
                    gateway,
                    "/v2/sandboxes",
                    &[("x-api-key", key)],
                    Some(serde_json::json!({"templateID": "base", "timeout": 600})),
                )
                .await
                .expect("the gateway answers");
            match r.status {
                StatusCode::CREATED => Some(r.expect_json()),
                StatusCode::SERVICE_UNAVAILABLE => None,
                other => panic!("create answered {other}: {}", r.text()),
            }
        },
    )
    .await;
    let id = sb["sandboxID"].as_str().expect("sandboxID").to_string();
    let token = sb["envdAccessToken"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (id, token)
}
