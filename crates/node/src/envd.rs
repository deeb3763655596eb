//! Talking to a sandbox's envd over its Unix sockets (docs/internals.md
//! "envd" and "Relay socket protocol"): the API socket, the relay handshake,
//! the `/health` probe used while a sandbox starts and on adoption, and
//! waiting for the template's start command to be ready.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::path::Path;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;

/// A connection to a sandbox's envd: its Unix socket, or, in the
/// deterministic simulation (`crates/sim`), an in-memory pipe to the
/// simulated sandbox ([`simulate_envd`]).
pub enum EnvdStream {
    Unix(UnixStream),
    Simulated(tokio::io::DuplexStream),
}

/// What the simulation answers for a socket path: `None` for a path it
/// does not simulate (dialed for real).
pub type SimulatedDial = fn(&Path) -> Option<std::io::Result<tokio::io::DuplexStream>>;

/// The simulation's envd dialer, when one was installed.
static SIMULATED: OnceLock<SimulatedDial> = OnceLock::new();

/// Makes every envd dial ask `dial` first, for the rest of the process:
/// for the simulation only (its test process), never set by a node.
#[doc(hidden)]
pub fn simulate_envd(dial: SimulatedDial) -> bool {
    SIMULATED.set(dial).is_ok()
}

async fn dial(sock: &Path) -> std::io::Result<EnvdStream> {
    if let Some(r) = SIMULATED.get().and_then(|d| d(sock)) {
        return r.map(EnvdStream::Simulated);
    }
    UnixStream::connect(sock).await.map(EnvdStream::Unix)
}

impl AsyncRead for EnvdStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            EnvdStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            EnvdStream::Simulated(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for EnvdStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            EnvdStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            EnvdStream::Simulated(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            EnvdStream::Unix(s) => Pin::new(s).poll_flush(cx),
            EnvdStream::Simulated(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            EnvdStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            EnvdStream::Simulated(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            EnvdStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            EnvdStream::Simulated(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            EnvdStream::Unix(s) => s.is_write_vectored(),
            EnvdStream::Simulated(s) => s.is_write_vectored(),
        }
    }
}

/// Why a relay connection to a sandbox port failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// envd answered `ERR ...`: nothing listens on that port.
    #[error("port {port} is not open: {reason}")]
    PortClosed { port: u16, reason: String },
    #[error("envd relay socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("envd relay answered {0:?}, not OK or ERR")]
    Protocol(String),
}

/// Opens a connection to envd's API socket.
pub async fn connect_api(sock: &Path) -> std::io::Result<EnvdStream> {
    dial(sock).await
}

/// Opens a relayed connection to `127.0.0.1:<port>` inside the sandbox.
pub async fn connect_relay(sock: &Path, port: u16) -> Result<EnvdStream, RelayError> {
    let mut s = dial(sock).await?;
    s.write_all(format!("{port}\n").as_bytes()).await?;
    // Read the answer a byte at a time: whatever follows `OK\n` belongs to
    // the relayed stream and must not be swallowed here.
    let mut line = Vec::with_capacity(32);
    let read = async {
        loop {
            let mut b = [0u8; 1];
            if s.read(&mut b).await? == 0 {
                break;
            }
            if b[0] == b'\n' || line.len() > 512 {
                break;
            }
            line.push(b[0]);
        }
        Ok::<_, std::io::Error>(())
    };
    // envd itself gives up connecting after 2 s; allow for that plus slack.
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| RelayError::Protocol("no answer within 5s".into()))??;
    let line = String::from_utf8_lossy(&line).into_owned();
    if line == "OK" {
        Ok(s)
    } else if let Some(reason) = line.strip_prefix("ERR") {
        Err(RelayError::PortClosed {
            port,
            reason: reason.trim().to_string(),
        })
    } else {
        Err(RelayError::Protocol(line))
    }
}

/// One `GET path` on envd's socket (with the access token, if any): its
/// status and body (at most 64 KiB).
async fn get(
    sock: &Path,
    path: &str,
    token: Option<&str>,
) -> Result<(http::StatusCode, Bytes), String> {
    get_bounded(sock, path, token, 64 << 10).await
}

/// [`get`] with an answer of at most `max` bytes.
pub async fn get_bounded(
    sock: &Path,
    path: &str,
    token: Option<&str>,
    max: usize,
) -> Result<(http::StatusCode, Bytes), String> {
    let stream = connect_api(sock)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", sock.display()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with envd failed: {e}"))?;
    let conn = tokio::spawn(conn);
    let mut req = http::Request::get(path).header(http::header::HOST, "localhost");
    if let Some(t) = token {
        req = req.header("x-access-token", t);
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("envd {path} failed: {e}"))?;
        let status = resp.status();
        let body = http_body_util::Limited::new(resp.into_body(), max)
            .collect()
            .await
            .map_err(|e| format!("envd {path}: reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    conn.abort();
    result
}

/// One `GET /health` on envd's socket: Ok when it answers 2xx.
pub async fn health(sock: &Path) -> Result<(), String> {
    match get(sock, "/health", None).await? {
        (s, _) if s.is_success() => Ok(()),
        (s, _) => Err(format!("envd /health answered {s}")),
    }
}

/// Where envd says the template's start command is (`GET /warren/start`).
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
enum StartState {
    None,
    Starting {
        #[serde(default)]
        last_check: Option<String>,
    },
    Ready {},
    Failed {
        message: String,
    },
}

/// Asks envd until the template's start command is ready (Ok), has failed
/// (the reason), or `within` passes.
pub async fn wait_started(
    sock: &Path,
    token: Option<&str>,
    within: Duration,
) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    let mut last = "envd never answered".to_string();
    loop {
        let answer = tokio::time::timeout_at(deadline, get(sock, "/warren/start", token)).await;
        match answer {
            Ok(Ok((status, body))) if status.is_success() => {
                match serde_json::from_slice::<StartState>(&body) {
                    Ok(StartState::Ready {} | StartState::None) => return Ok(()),
                    Ok(StartState::Failed { message }) => return Err(message),
                    Ok(StartState::Starting { last_check }) => {
                        last = match last_check {
                            Some(c) => format!("its ready command last said: {c}"),
                            None => "its ready command has not run yet".into(),
                        }
                    }
                    Err(e) => last = format!("envd's answer is not a start state: {e}"),
                }
            }
            Ok(Ok((status, _))) => last = format!("envd /warren/start answered {status}"),
            Ok(Err(e)) => last = e,
            Err(_) => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("not ready within {within:?} ({last})"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls [`health`] until it succeeds or `within` passes; the last error otherwise.
pub async fn wait_healthy(sock: &Path, within: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let last = match tokio::time::timeout_at(deadline, health(sock)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => "no answer".to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "envd did not become healthy within {within:?}: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
