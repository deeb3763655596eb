//! A small HTTP client for tests: JSON in, `(status, headers, JSON)` out.

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
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = match body {
            Some(v) => {
                req = req.header("content-type", "application/json");
                Full::new(Bytes::from(serde_json::to_vec(&v)?))
            }
            None => Full::new(Bytes::new()),
        };
        let fut = async {
            let resp = self.client.request(req.body(body)?).await?;
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
            })
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {:?}", self.timeout))?
    }
}
