//! The port relay (docs/internals.md, "Relay socket protocol").
//!
//! A client connects to the relay socket and writes `<port>\n`; envd
//! connects to `127.0.0.1:<port>` inside the sandbox (2 s timeout) and
//! answers `OK\n` and splices the two connections byte for byte, or answers
//! `ERR <reason>\n` and closes. Being byte-level, it carries HTTP, WebSocket
//! upgrades and raw TCP alike; this is how the node reaches sandbox ports
//! when the sandbox has its own network namespace.

use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use warren_core::server::Admission;

/// How long envd waits for the target port to accept.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client may take to send its port line.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest valid port line: `65535\n`, with room for a `\r`.
const MAX_LINE: usize = 7;

/// Serves relay connections on `listener` until `shutdown` resolves, at
/// most `max_connections` at once (past it a new connection is closed at
/// once). Connections already spliced keep going until either side closes.
pub async fn serve(
    listener: UnixListener,
    max_connections: usize,
    shutdown: impl Future<Output = ()>,
) {
    let metrics = warren_core::server::Metrics::default().listener("relay");
    let admission = Admission::new(max_connections, None, metrics);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((conn, _)) => {
                    let Ok(slot) = admission.admit(None) else {
                        continue;
                    };
                    tokio::spawn(async move {
                        if let Err(e) = relay(conn).await {
                            tracing::debug!(error = %e, "relay connection ended with an error");
                        }
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a relay connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn relay(mut client: UnixStream) -> std::io::Result<()> {
    let port = match tokio::time::timeout(HEADER_TIMEOUT, read_port(&mut client)).await {
        Ok(Ok(port)) => port,
        Ok(Err(reason)) => return refuse(&mut client, &reason).await,
        Err(_) => return refuse(&mut client, "timed out waiting for the port line").await,
    };
    let target = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return refuse(&mut client, &format!("port {port} is not open: {e}")).await,
        Err(_) => {
            return refuse(
                &mut client,
                &format!("port {port} did not accept within {CONNECT_TIMEOUT:?}"),
            )
            .await
        }
    };
    let _ = target.set_nodelay(true);
    client.write_all(b"OK\n").await?;
    let mut target = target;
    tokio::io::copy_bidirectional(&mut client, &mut target).await?;
    Ok(())
}

/// Reads `<port>\n` one byte at a time, so no byte after the newline (the
/// start of the relayed stream) is consumed here.
async fn read_port(client: &mut UnixStream) -> Result<u16, String> {
    let mut line = Vec::with_capacity(MAX_LINE);
    loop {
        let mut byte = [0u8; 1];
        match client.read(&mut byte).await {
            Ok(0) => return Err("connection closed before the port line".to_string()),
            Ok(_) => {}
            Err(e) => return Err(format!("reading the port line: {e}")),
        }
        if byte[0] == b'\n' {
            break;
        }
        if line.len() == MAX_LINE {
            return Err("the port line is too long".to_string());
        }
        line.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&line);
    let text = text.trim_end_matches('\r');
    match text.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(format!("{text:?} is not a port number (1-65535)")),
    }
}

async fn refuse(client: &mut UnixStream, reason: &str) -> std::io::Result<()> {
    // One line, whatever the reason says.
    let reason = reason.replace(['\r', '\n'], " ");
    client
        .write_all(format!("ERR {reason}\n").as_bytes())
        .await?;
    client.shutdown().await
}
