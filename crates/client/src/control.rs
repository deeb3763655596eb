//! The control plane (create, list, get, kill) and a data-plane health check,
//! each tried through the entry points in turn.

use crate::command::{Command, CommandOutput, CommandStream};
use crate::entry::{Entries, Entry};
use crate::error::{ApiError, ClientError};
use crate::headers;
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use warren_core::backoff::Backoff;

/// What to create (E2B's `NewSandbox`, the fields warren uses).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed.
    pub timeout: u64,
    pub metadata: HashMap<String, String>,
    #[serde(rename = "envVars")]
    pub env_vars: HashMap<String, String>,
}

impl NewSandbox {
    /// The `base` template with a timeout in seconds.
    pub fn base(timeout_secs: u64) -> NewSandbox {
        NewSandbox {
            template_id: "base".into(),
            timeout: timeout_secs,
            ..Default::default()
        }
    }
}

/// A sandbox as create, list and get describe it (fields they share).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
pub struct Sandbox {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The node it runs on.
    #[serde(rename = "clientID", default)]
    pub client_id: String,
    #[serde(rename = "templateID", default)]
    pub template_id: String,
    #[serde(rename = "envdAccessToken", default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub metadata: HashMap<String, String>,
    #[serde(default)]
    pub state: Option<String>,
    /// RFC 3339 (list and get).
    #[serde(rename = "startedAt", default)]
    pub started_at: Option<String>,
    /// RFC 3339: when the sandbox is killed unless its timeout is changed.
    #[serde(rename = "endAt", default)]
    pub end_at: Option<String>,
}

/// A create's result and how it got there.
#[derive(Debug, Clone)]
pub struct Created {
    pub sandbox: Sandbox,
    /// How many requests it took (1 when the first entry point answered).
    pub attempts: u32,
    /// The entry point that answered.
    pub entry: String,
}

/// What a kill did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Killed {
    /// This call removed it.
    Killed,
    /// An earlier attempt of this call, whose answer was lost, removed it.
    AlreadyGone,
}

/// What the data plane says about a sandbox (`GET /health` on its envd).
#[derive(Debug, Clone)]
pub enum Health {
    /// envd answered.
    Ok,
    /// Its node's lease expired: the sandbox is lost.
    NodeDown,
    /// The gateway cannot connect to its node (it may be dying or restarting).
    Unreachable,
    /// The scheduler does not know it.
    NotFound,
    /// Any other answer.
    Other(ApiError),
}

type HyperClient = hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>;

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    entries: Vec<String>,
    api_key: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    fresh_connections: bool,
    attempts: Option<u32>,
    backoff: Duration,
    stream_idle_timeout: Duration,
    resume_attempts: u32,
}

impl ClientBuilder {
    /// Entry points: `host:port` or `http://host:port` of gateways or balancers.
    pub fn new<S: AsRef<str>>(entries: &[S]) -> ClientBuilder {
        ClientBuilder {
            entries: entries.iter().map(|s| s.as_ref().to_string()).collect(),
            api_key: None,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
            fresh_connections: false,
            attempts: None,
            backoff: Duration::from_millis(200),
            stream_idle_timeout: Duration::from_secs(75),
            resume_attempts: 10,
        }
    }

    /// The API key (`X-API-Key`).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Per-request timeout for control-plane calls (default 30 s).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// TCP connect timeout (default 2 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Open a new connection for every control-plane request instead of
    /// reusing idle ones (what a fresh `curl` does; default off).
    pub fn fresh_connections(mut self, fresh: bool) -> Self {
        self.fresh_connections = fresh;
        self
    }

    /// Attempts per call across entry points (default: entry points + 2).
    pub fn attempts(mut self, n: u32) -> Self {
        self.attempts = Some(n.max(1));
        self
    }

    /// The first pause between attempts (default 200 ms); later pauses
    /// double, jittered (`warren_core::backoff`).
    pub fn backoff(mut self, d: Duration) -> Self {
        self.backoff = d;
        self
    }

    /// A command stream silent for this long counts as cut (envd sends
    /// keepalives every 30 s by default; default 75 s).
    pub fn stream_idle_timeout(mut self, d: Duration) -> Self {
        self.stream_idle_timeout = d;
        self
    }

    /// Reconnects a command stream may try in a row before it gives up
    /// (default 10). `0` turns resuming off: a cut stream is an error, as
    /// with a plain Connect client (for measuring single attempts).
    pub fn resume_attempts(mut self, n: u32) -> Self {
        self.resume_attempts = n;
        self
    }

    pub fn build(self) -> Result<Client, ClientError> {
        let entries = Entries::parse(&self.entries)?;
        if let Some(k) = &self.api_key {
            http::HeaderValue::from_str(k)
                .map_err(|_| ClientError::Invalid("the API key is not a valid header".into()))?;
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(self.connect_timeout));
        connector.set_nodelay(true);
        let mut http = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
        if self.fresh_connections {
            http.pool_max_idle_per_host(0);
        }
        let rpc = connectrpc::client::HttpClient::builder()
            .connect_timeout(self.connect_timeout)
            .plaintext();
        Ok(Client {
            inner: Arc::new(Inner {
                attempts: self.attempts.unwrap_or(entries.len() as u32 + 2),
                entries,
                api_key: self.api_key,
                timeout: self.timeout,
                backoff: self.backoff,
                stream_idle_timeout: self.stream_idle_timeout,
                resume_attempts: self.resume_attempts,
                http: http.build(connector),
                rpc,
            }),
        })
    }
}

/// A client for warren's public API over several entry points. Cheap to
/// clone; clones share connections.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub entries: Entries,
    api_key: Option<String>,
    pub timeout: Duration,
    attempts: u32,
    pub backoff: Duration,
    pub stream_idle_timeout: Duration,
    pub resume_attempts: u32,
    http: HyperClient,
    /// The Connect transport for envd RPCs (pooled).
    pub rpc: connectrpc::client::HttpClient,
}

/// A successful answer: status, body, which entry point, after how many attempts.
struct Answer {
    status: StatusCode,
    body: Bytes,
    entry: String,
    attempts: u32,
}

impl Client {
    /// A client with default settings.
    pub fn new<S: AsRef<str>>(entries: &[S], api_key: &str) -> Result<Client, ClientError> {
        ClientBuilder::new(entries).api_key(api_key).build()
    }

    /// Creates a sandbox; retried with the same `idempotency_key` through the
    /// next entry point when an attempt gets no answer or a `502`/`503`, so
    /// at most one sandbox exists for the key however many attempts it takes.
    pub async fn create(
        &self,
        new: &NewSandbox,
        idempotency_key: &str,
    ) -> Result<Created, ClientError> {
        let body = serde_json::to_vec(new).map_err(|e| ClientError::Invalid(e.to_string()))?;
        let a = self
            .call(
                Method::POST,
                "/sandboxes",
                &[(headers::IDEMPOTENCY_KEY, idempotency_key)],
                Some(Bytes::from(body)),
            )
            .await?;
        let sandbox = parse::<Sandbox>(&a)?;
        Ok(Created {
            sandbox,
            attempts: a.attempts,
            entry: a.entry,
        })
    }

    /// Every running sandbox of the key's team (`GET /sandboxes`).
    pub async fn list(&self) -> Result<Vec<Sandbox>, ClientError> {
        let a = self.call(Method::GET, "/sandboxes", &[], None).await?;
        parse(&a)
    }

    /// One sandbox (`GET /sandboxes/{id}`).
    pub async fn get(&self, sandbox_id: &str) -> Result<Sandbox, ClientError> {
        let a = self
            .call(Method::GET, &format!("/sandboxes/{sandbox_id}"), &[], None)
            .await?;
        parse(&a)
    }

    /// Kills a sandbox (`DELETE /sandboxes/{id}`). A `404` after an attempt
    /// whose answer was lost means that attempt did it: [`Killed::AlreadyGone`].
    pub async fn kill(&self, sandbox_id: &str) -> Result<Killed, ClientError> {
        let a = self
            .call(
                Method::DELETE,
                &format!("/sandboxes/{sandbox_id}"),
                &[],
                None,
            )
            .await?;
        Ok(if a.status == StatusCode::NOT_FOUND {
            Killed::AlreadyGone
        } else {
            Killed::Killed
        })
    }

    /// `GET path` answered with JSON, retried like the other reads: for
    /// warren's own endpoints beyond E2B's (`/nodes`,
    /// `/_warren/v1/routes/{id}`).
    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value, ClientError> {
        let a = self.call(Method::GET, path, &[], None).await?;
        parse(&a)
    }

    /// `POST path` with a JSON body, answered with JSON (`null` for an
    /// empty answer); retried through the next entry point like every call
    /// (set [`ClientBuilder::attempts`] to 1 for one that must not repeat).
    pub async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, ClientError> {
        let body = serde_json::to_vec(body).map_err(|e| ClientError::Invalid(e.to_string()))?;
        let a = self
            .call(Method::POST, path, &[], Some(Bytes::from(body)))
            .await?;
        parse(&a)
    }

    /// `GET /health` on the sandbox's envd through the data plane: tells a
    /// lost node (`node_down`) from one that cannot be reached right now.
    pub async fn health(&self, sandbox: &Sandbox) -> Result<Health, ClientError> {
        let port = headers::ENVD_PORT.to_string();
        let mut hs = vec![
            (headers::E2B_SANDBOX_ID, sandbox.sandbox_id.as_str()),
            (headers::E2B_SANDBOX_PORT, port.as_str()),
        ];
        if let Some(t) = &sandbox.envd_access_token {
            hs.push((headers::ACCESS_TOKEN, t.as_str()));
        }
        match self.call(Method::GET, "/health", &hs, None).await {
            Ok(_) => Ok(Health::Ok),
            Err(e) => match e.api() {
                Some(a) if a.is_node_down() => Ok(Health::NodeDown),
                Some(a) if a.is_upstream_unreachable() => Ok(Health::Unreachable),
                Some(a) if a.status == StatusCode::NOT_FOUND || a.is_sandbox_not_found() => {
                    Ok(Health::NotFound)
                }
                Some(a) => Ok(Health::Other(a.clone())),
                None => Err(e),
            },
        }
    }

    /// Writes `data` to `path` in `sandbox` through its envd (`POST /files`,
    /// `application/octet-stream`), the file and any directory made for it
    /// belonging to `user`. Parent directories are made; a file there is
    /// replaced.
    pub async fn write_file(
        &self,
        sandbox: &Sandbox,
        path: &str,
        user: &str,
        data: Bytes,
    ) -> Result<(), ClientError> {
        let port = headers::ENVD_PORT.to_string();
        let mut hs = vec![
            (headers::E2B_SANDBOX_ID, sandbox.sandbox_id.as_str()),
            (headers::E2B_SANDBOX_PORT, port.as_str()),
            ("content-type", "application/octet-stream"),
        ];
        if let Some(t) = &sandbox.envd_access_token {
            hs.push((headers::ACCESS_TOKEN, t.as_str()));
        }
        let query = format!("/files?path={}&username={}", encode(path), encode(user));
        self.call(Method::POST, &query, &hs, Some(data)).await?;
        Ok(())
    }

    /// Starts `command` in `sandbox`; the stream resumes across entry points.
    pub async fn run(
        &self,
        sandbox: &Sandbox,
        command: Command,
    ) -> Result<CommandStream, ClientError> {
        CommandStream::start(self.clone(), sandbox.clone(), command).await
    }

    /// Runs `command` to its end and returns everything it printed.
    pub async fn run_to_end(
        &self,
        sandbox: &Sandbox,
        command: Command,
    ) -> Result<CommandOutput, ClientError> {
        self.run(sandbox, command).await?.collect().await
    }

    /// One request through the entry points in turn, retried while the
    /// failure is one another entry point may not have.
    async fn call(
        &self,
        method: Method,
        path: &str,
        hs: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Answer, ClientError> {
        let inner = &self.inner;
        let start = inner.entries.start();
        let mut earlier_unknown = false;
        let mut last = None;
        let mut backoff = Backoff::new(inner.backoff, warren_core::backoff::MAX);
        for attempt in 0..inner.attempts {
            if attempt > 0 {
                tokio::time::sleep(backoff.next_pause()).await;
            }
            let entry = inner.entries.get(start + attempt as usize);
            match self.send(entry, &method, path, hs, body.clone()).await {
                Ok((status, bytes)) if status.is_success() => {
                    return Ok(Answer {
                        status,
                        body: bytes,
                        entry: entry.label.clone(),
                        attempts: attempt + 1,
                    })
                }
                Ok((status, bytes)) => {
                    let error = ApiError::from_body(status, &bytes);
                    // A DELETE whose earlier attempt may have worked: gone now is done.
                    if method == Method::DELETE
                        && earlier_unknown
                        && status == StatusCode::NOT_FOUND
                    {
                        return Ok(Answer {
                            status,
                            body: bytes,
                            entry: entry.label.clone(),
                            attempts: attempt + 1,
                        });
                    }
                    let err = ClientError::Api {
                        entry: entry.label.clone(),
                        error,
                    };
                    if !err.is_retryable() {
                        return Err(err);
                    }
                    last = Some(err);
                }
                Err(err) => {
                    earlier_unknown |= err.outcome_unknown();
                    if !err.is_retryable() {
                        return Err(err);
                    }
                    last = Some(err);
                }
            }
        }
        let last = last.unwrap_or_else(|| ClientError::Invalid("no attempts allowed".into()));
        if inner.attempts == 1 {
            return Err(last);
        }
        Err(ClientError::Exhausted {
            attempts: inner.attempts,
            unknown: earlier_unknown,
            last: Box::new(last),
        })
    }

    async fn send(
        &self,
        entry: &Entry,
        method: &Method,
        path: &str,
        hs: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let inner = &self.inner;
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", entry.base));
        if let Some(k) = &inner.api_key {
            req = req.header(headers::API_KEY, k);
        }
        for (k, v) in hs {
            req = req.header(*k, *v);
        }
        if body.is_some()
            && !hs
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| ClientError::Invalid(e.to_string()))?;
        let transport = |e: &dyn std::fmt::Display| ClientError::Transport {
            entry: entry.label.clone(),
            message: e.to_string(),
        };
        let fut = async {
            let resp = inner.http.request(req).await.map_err(|e| {
                // hyper-util's Display is terse; the source says what broke.
                let detail = std::error::Error::source(&e)
                    .map(|s| format!("{e}: {s}"))
                    .unwrap_or_else(|| e.to_string());
                transport(&detail)
            })?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| transport(&e))?
                .to_bytes();
            Ok((status, bytes))
        };
        match tokio::time::timeout(inner.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout {
                entry: entry.label.clone(),
                timeout: inner.timeout,
            }),
        }
    }
}

/// `s` percent-encoded for a query value (all but RFC 3986's unreserved
/// characters and `/`).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn parse<T: serde::de::DeserializeOwned>(a: &Answer) -> Result<T, ClientError> {
    serde_json::from_slice(&a.body).map_err(|e| ClientError::Protocol {
        entry: a.entry.clone(),
        message: format!("{e}"),
    })
}
