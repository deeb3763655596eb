//! Plain HTTP GETs for admin endpoints (`/metrics`, `/readyz`).

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// `GET http://{addr}{path}` on a fresh connection; the body as text, or an
/// error for a non-2xx status or no answer within 2 s.
pub async fn get_text(addr: &str, path: &str) -> anyhow::Result<String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http();
    let uri: http::Uri = format!("http://{addr}{path}").parse()?;
    let fut = async {
        let resp = client.get(uri).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::ensure!(status.is_success(), "{addr}{path}: {status}");
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .map_err(|_| anyhow::anyhow!("{addr}{path}: no answer within 2s"))?
}
