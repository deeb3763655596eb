//! Shared test harness: envd in-process on 127.0.0.1:0 (or a Unix socket)
//! over a temporary root, the generated Connect clients, and a plain HTTP
//! client for `/health` and `/files`.
#![allow(dead_code)]

use bytes::Bytes;
use connectrpc::client::{ClientConfig, HttpClient};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::path::{Path, PathBuf};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use warren_envd::{ApiListener, Settings};
use warren_envd_proto::filesystem::FilesystemClient;
use warren_envd_proto::process::process_event::{data_event, EndEvent, Event};
use warren_envd_proto::process::ProcessEvent;

/// The token tests use when they turn authentication on.
pub const TOKEN: &str = "s3cret-token";

/// An envd serving a temporary root; stopped when dropped.
pub struct TestEnvd {
    /// The sandbox root (a temp dir).
    pub root: tempfile::TempDir,
    /// `http://127.0.0.1:port` (or a placeholder for Unix sockets).
    pub base: http::Uri,
    /// The token clients send, when authentication is on.
    pub token: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestEnvd {
    /// envd with default settings and no token.
    pub async fn start() -> TestEnvd {
        TestEnvd::start_with(|s| s).await
    }

    /// envd with settings adjusted by `f` (its root is a fresh temp dir).
    pub async fn start_with(f: impl FnOnce(Settings) -> Settings) -> TestEnvd {
        let root = tempfile::tempdir().expect("temp root");
        let settings = f(Settings::new(root.path()).expect("settings"));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let token = settings.access_token.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(warren_envd::run(
            settings,
            ApiListener::Tcp(listener),
            None,
            async move {
                let _ = stopped.await;
            },
        ));
        let envd = TestEnvd {
            root,
            base: format!("http://{addr}").parse().expect("uri"),
            token,
            stop: Some(stop),
            task: Some(task),
        };
        // Serving means set up (the home exists), so tests may touch files.
        let (status, _, _) = envd.http("GET", "/health", &[], vec![]).await;
        assert_eq!(status, http::StatusCode::NO_CONTENT);
        envd
    }

    /// Connect client config (proto or JSON), with the token if any.
    pub fn config(&self, json: bool) -> ClientConfig {
        let mut config = ClientConfig::new(self.base.clone());
        config = if json { config.json() } else { config.proto() };
        if let Some(token) = &self.token {
            config = config.with_default_header("x-access-token", token.as_str());
        }
        config
    }

    /// A `process.Process` client.
    pub fn process(&self, json: bool) -> ProcessClient {
        ProcessClient::new(HttpClient::plaintext(), self.config(json))
    }

    /// A `filesystem.Filesystem` client.
    pub fn fs(&self, json: bool) -> FilesystemClient<HttpClient> {
        FilesystemClient::new(HttpClient::plaintext(), self.config(json))
    }

    /// The host path of a sandbox path.
    pub fn host(&self, sandbox_path: &str) -> PathBuf {
        std::fs::canonicalize(self.root.path())
            .expect("canonical root")
            .join(sandbox_path.trim_start_matches('/'))
    }

    /// A plain HTTP request to envd; returns status, headers and body.
    pub async fn http(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (http::StatusCode, http::HeaderMap, Vec<u8>) {
        http_request(&self.base, method, path_and_query, headers, body).await
    }

    /// Stops envd and waits for it to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("envd task").expect("envd result");
        }
    }
}

impl Drop for TestEnvd {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The generated process client over connectrpc's HTTP client.
pub type ProcessClient = warren_envd_proto::process::ProcessClient<HttpClient>;

/// A plain HTTP/1.1 request to `base`.
pub async fn http_request(
    base: &http::Uri,
    method: &str,
    path_and_query: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (http::StatusCode, http::HeaderMap, Vec<u8>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("{base}{}", path_and_query.trim_start_matches('/')));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let res = client.request(req).await.expect("http request");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes().to_vec();
    (parts.status, parts.headers, body)
}

/// What a process stream delivered, in order.
#[derive(Debug, Default)]
pub struct Output {
    /// The pid from the start event.
    pub pid: Option<u32>,
    /// stdout bytes.
    pub stdout: Vec<u8>,
    /// stderr bytes.
    pub stderr: Vec<u8>,
    /// stdout and stderr together, in the order received.
    pub all: Vec<u8>,
    /// The end event, if one came.
    pub end: Option<EndEvent>,
    /// How many data events came.
    pub data_events: usize,
    /// How many keepalive events came.
    pub keepalives: usize,
}

impl Output {
    /// Records one event.
    pub fn push(&mut self, event: Option<ProcessEvent>) {
        match event.and_then(|e| e.event) {
            Some(Event::Start(s)) => self.pid = Some(s.pid),
            Some(Event::Data(d)) => {
                self.data_events += 1;
                match d.output {
                    Some(data_event::Output::Stdout(b)) => {
                        self.stdout.extend_from_slice(&b);
                        self.all.extend_from_slice(&b);
                    }
                    Some(data_event::Output::Stderr(b)) => {
                        self.stderr.extend_from_slice(&b);
                        self.all.extend_from_slice(&b);
                    }
                    _ => {}
                }
            }
            Some(Event::End(e)) => self.end = Some(*e),
            Some(Event::Keepalive(_)) => self.keepalives += 1,
            None => {}
        }
    }
}

/// Reads a Start or Connect stream to its end into an [`Output`].
#[macro_export]
macro_rules! drain {
    ($stream:expr) => {{
        let mut out = $crate::common::Output::default();
        while let Some(msg) = $stream.message().await.expect("stream message") {
            out.push(msg.to_owned_message().event.into_option());
        }
        out
    }};
}

/// Reads a Start or Connect stream until `until(&output)` holds.
#[macro_export]
macro_rules! read_until {
    ($stream:expr, $out:expr, $until:expr) => {{
        while !$until(&$out) {
            match $stream.message().await.expect("stream message") {
                Some(msg) => $out.push(msg.to_owned_message().event.into_option()),
                None => panic!("stream ended early: {:?}", $out),
            }
        }
    }};
}

/// The error of a server-stream call, whether it fails the call itself or
/// arrives in the stream.
#[macro_export]
macro_rules! stream_error {
    ($call:expr) => {{
        match $call.await {
            Err(e) => e,
            Ok(mut s) => loop {
                match s.message().await {
                    Err(e) => break e,
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("the stream ended without an error"),
                }
            },
        }
    }};
}

/// Polls `cond` every 20 ms until it holds or 10 s pass.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whether `pid` is gone (or only a zombie waiting to be reaped).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// A file path under `dir` (helper for the tests' symlinks).
pub fn under(dir: &Path, rel: &str) -> PathBuf {
    dir.join(rel)
}
