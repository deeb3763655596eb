//! envd over a Unix socket (as the node reaches it) and the port relay.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

mod common;

use bytes::Bytes;
use connectrpc::client::{ClientBody, ClientConfig, ServiceTransport};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio::sync::oneshot;
use warren_envd::{ApiListener, Settings};
use warren_envd_proto::process::{ProcessClient, ProcessConfig, StartRequest};

/// envd on a Unix socket with a relay socket, in `dir`; stops when the
/// sender is dropped.
async fn envd_on_sockets(dir: &Path) -> (PathBuf, PathBuf, oneshot::Sender<()>) {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).expect("root");
    let api_path = dir.join("envd.sock");
    let relay_path = dir.join("relay.sock");
    let api = UnixListener::bind(&api_path).expect("bind api");
    let relay = UnixListener::bind(&relay_path).expect("bind relay");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(warren_envd::run(
        Settings::new(&root).expect("settings"),
        ApiListener::Unix(api, api_path.clone()),
        Some(relay),
        async move {
            let _ = stopped.await;
        },
    ));
    (api_path, relay_path, stop)
}

/// Connects every request to one Unix socket.
#[derive(Clone)]
struct UnixConnector(PathBuf);

impl tower_service::Service<http::Uri> for UnixConnector {
    type Response = TokioIo<UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let path = self.0.clone();
        Box::pin(async move { Ok(TokioIo::new(UnixStream::connect(path).await?)) })
    }
}

/// A hyper client whose every connection goes to the Unix socket `path`.
fn unix_client(path: &Path) -> Client<UnixConnector, ClientBody> {
    Client::builder(TokioExecutor::new()).build(UnixConnector(path.to_path_buf()))
}

#[tokio::test]
async fn api_serves_health_and_rpcs_over_a_unix_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (api, _relay, _stop) = envd_on_sockets(dir.path()).await;
    let http = unix_client(&api);

    let health = http::Request::get("http://envd/health")
        .body(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed(),
        )
        .expect("request");
    let res = http.request(health).await.expect("health over unix");
    assert_eq!(res.status(), http::StatusCode::NO_CONTENT);

    let process = ProcessClient::new(
        ServiceTransport::new(http),
        ClientConfig::new("http://envd".parse().expect("uri")),
    );
    let mut stream = process
        .start(StartRequest {
            process: ProcessConfig {
                cmd: "echo".into(),
                args: vec!["over unix".into()],
                ..Default::default()
            }
            .into(),
            ..Default::default()
        })
        .await
        .expect("start over unix");
    let out = drain!(stream);
    assert_eq!(out.stdout, b"over unix\n");
    assert_eq!(out.end.map(|e| e.exit_code), Some(0));
}

async fn relay_line(relay: &Path, line: &str) -> (String, BufReader<UnixStream>) {
    let mut conn = UnixStream::connect(relay).await.expect("connect relay");
    conn.write_all(line.as_bytes())
        .await
        .expect("write port line");
    let mut reader = BufReader::new(conn);
    let mut answer = String::new();
    reader.read_line(&mut answer).await.expect("read answer");
    (answer, reader)
}

#[tokio::test]
async fn relay_splices_bytes_both_ways_to_a_local_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_api, relay, _stop) = envd_on_sockets(dir.path()).await;
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("echo");
    let port = echo.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });

    let (answer, mut conn) = relay_line(&relay, &format!("{port}\n")).await;
    assert_eq!(answer, "OK\n");
    // Binary bytes, in two rounds: the splice is byte-level and stays open.
    for round in [&b"\x00\x01binary\xff"[..], b"GET / HTTP/1.1\r\n\r\n"] {
        conn.get_mut().write_all(round).await.expect("write");
        let mut back = vec![0u8; round.len()];
        conn.read_exact(&mut back).await.expect("read echo");
        assert_eq!(back, round);
    }
}

#[tokio::test]
async fn relay_refuses_closed_ports_and_bad_port_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_api, relay, _stop) = envd_on_sockets(dir.path()).await;
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);

    let (answer, mut conn) = relay_line(&relay, &format!("{port}\n")).await;
    assert!(
        answer.starts_with(&format!("ERR port {port} is not open")),
        "{answer:?}"
    );
    let mut rest = Vec::new();
    conn.read_to_end(&mut rest).await.expect("closed after ERR");
    assert!(rest.is_empty());

    for bad in ["http\n", "0\n", "70000\n"] {
        let (answer, _) = relay_line(&relay, bad).await;
        assert!(answer.starts_with("ERR "), "{bad:?} → {answer:?}");
    }
}
