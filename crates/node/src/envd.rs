//! Talking to a sandbox's envd over its Unix sockets (docs/internals.md
//! "envd" and "Relay socket protocol"): the API socket, the relay handshake,
//! and the `/health` probe used while a sandbox starts and on adoption.

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

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
pub async fn connect_api(sock: &Path) -> std::io::Result<UnixStream> {
    UnixStream::connect(sock).await
}

/// Opens a relayed connection to `127.0.0.1:<port>` inside the sandbox.
pub async fn connect_relay(sock: &Path, port: u16) -> Result<UnixStream, RelayError> {
    let mut s = UnixStream::connect(sock).await?;
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

/// One `GET /health` on envd's socket: Ok when it answers 2xx.
pub async fn health(sock: &Path) -> Result<(), String> {
    let stream = connect_api(sock)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", sock.display()))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with envd failed: {e}"))?;
    let conn = tokio::spawn(conn);
    let req = http::Request::get("/health")
        .header(http::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let result = sender.send_request(req).await;
    conn.abort();
    match result {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("envd /health answered {}", r.status())),
        Err(e) => Err(format!("envd /health failed: {e}")),
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
