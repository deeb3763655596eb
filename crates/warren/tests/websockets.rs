//! Long-lived WebSockets through the gateway and the node (a desktop
//! sandbox's stream is one: docs/desktop.md): a sandbox's WebSocket server
//! reached through both, and a stream that stays idle longer than the
//! listeners' `--idle-timeout` (and whose body-progress timeout is as
//! short) and still carries the next message. Each listener timeout is for
//! requests: once a connection is upgraded, none applies (docs/desktop.md,
//! "Long streams"). Real processes, `--runtime process`
//! nodes, all on 127.0.0.1:0.
#![allow(unused_crate_dependencies)]

use futures_util::{SinkExt, StreamExt};
use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use warren_envd_proto::process::{
    process_event, ProcessClient, ProcessConfig, StartRequest, StartResponse,
};
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::{Answer, Http};
use warren_test_support::{free_port, wait_until};

const KEY: &str = "key-team-a";
const ENVD: u16 = 49983;

/// A scheduler, one node and one gateway, the node and gateway with
/// `args` too.
async fn cluster(args: &[&str]) -> Cluster {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let spec = Spec {
        nodes: 1,
        node_args: args.clone(),
        gateway_args: args,
        ..Spec::default()
    };
    Cluster::start(env!("CARGO_BIN_EXE_warren").as_ref(), spec)
        .await
        .expect("cluster starts")
}

async fn http(
    c: &Cluster,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    Http::new(Duration::from_secs(30))
        .send(method, &c.gateway(0), path, headers, body)
        .await
        .expect("http request")
}

/// A `base` sandbox of team A: its id and envd access token.
async fn create(c: &Cluster) -> (String, String) {
    let sb = wait_until(
        "a sandbox to be created",
        Duration::from_secs(30),
        || async {
            let r = http(
                c,
                Method::POST,
                "/v2/sandboxes",
                &[("x-api-key", KEY)],
                Some(json!({"templateID": "base"})),
            )
            .await;
            match r.status {
                StatusCode::CREATED => Some(r.expect_json()),
                // No node registered yet.
                StatusCode::SERVICE_UNAVAILABLE => None,
                other => panic!(
                    "create answered {other}: {}",
                    String::from_utf8_lossy(&r.body)
                ),
            }
        },
    )
    .await;
    let id = sb["sandboxID"].as_str().expect("id").to_string();
    let token = sb["envdAccessToken"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (id, token)
}

/// A tiny WebSocket echo server (RFC 6455 handshake and framing) for inside
/// a sandbox, without third-party Python packages.
const WS_ECHO: &str = r#"
import base64, hashlib, socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
print("listening", flush=True)
def exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d: raise EOFError
        b += d
    return b
def serve(c):
    req = b""
    while b"\r\n\r\n" not in req:
        d = c.recv(4096)
        if not d: return
        req += d
    key = [l.split(":", 1)[1].strip() for l in req.decode().split("\r\n") if l.lower().startswith("sec-websocket-key:")][0]
    acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + "\r\n\r\n").encode())
    try:
        while True:
            h = exact(c, 2); op = h[0] & 15; n = h[1] & 127
            if n == 126: n = int.from_bytes(exact(c, 2), "big")
            elif n == 127: n = int.from_bytes(exact(c, 8), "big")
            mask = exact(c, 4) if h[1] & 128 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(exact(c, n)))
            if op == 8:
                c.sendall(b"\x88\x00"); return
            hdr = bytes([128 | op, n]) if n < 126 else bytes([128 | op, 126]) + n.to_bytes(2, "big") if n < 65536 else bytes([128 | op, 127]) + n.to_bytes(8, "big")
            c.sendall(hdr + data)
    except EOFError:
        pass
    finally:
        c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Starts [`WS_ECHO`] in sandbox `id` through envd; returns its port and
/// the process's output stream (kept open: the server runs while it is).
async fn start_echo(c: &Cluster, id: &str, token: &str) -> (u16, impl Sized) {
    let uri: http::Uri = format!("http://{}", c.gateway(0)).parse().expect("uri");
    let port = ENVD.to_string();
    let config = connectrpc::client::ClientConfig::new(uri)
        .with_default_header("e2b-sandbox-id", id.to_string())
        .with_default_header("e2b-sandbox-port", port)
        .with_default_header("x-access-token", token.to_string());
    let envd = ProcessClient::new(connectrpc::client::HttpClient::plaintext(), config);
    let ws_port = free_port();
    let mut server = envd
        .start(StartRequest {
            process: ProcessConfig {
                cmd: "python3".into(),
                args: vec!["-c".into(), WS_ECHO.into(), ws_port.to_string()],
                ..Default::default()
            }
            .into(),
            stdin: Some(false),
            ..Default::default()
        })
        .await
        .expect("start the echo server");
    // Wait for "listening" on its stdout.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("listening") {
        let msg = tokio::time::timeout(Duration::from_secs(20), server.message::<StartResponse>())
            .await
            .expect("echo server starts")
            .expect("stream")
            .expect("echo server exited early");
        match msg
            .to_owned_message()
            .event
            .into_option()
            .and_then(|e| e.event)
        {
            Some(process_event::Event::Data(d)) => match d.output {
                Some(process_event::data_event::Output::Stdout(b))
                | Some(process_event::data_event::Output::Stderr(b)) => seen.extend_from_slice(&b),
                _ => {}
            },
            Some(process_event::Event::End(end)) => {
                panic!(
                    "echo server ended: {end:?} {}",
                    String::from_utf8_lossy(&seen)
                )
            }
            _ => {}
        }
    }
    (ws_port, server)
}

type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// A WebSocket to sandbox `id`'s `port` through the gateway.
async fn connect(c: &Cluster, id: &str, port: u16) -> Ws {
    let mut req = format!("ws://{}/echo", c.gateway(0))
        .into_client_request()
        .expect("ws request");
    req.headers_mut()
        .insert("e2b-sandbox-id", id.parse().expect("header"));
    req.headers_mut().insert(
        "e2b-sandbox-port",
        port.to_string().parse().expect("header"),
    );
    let (ws, resp) = tokio::time::timeout(
        Duration::from_secs(20),
        tokio_tungstenite::connect_async(req),
    )
    .await
    .expect("handshake in time")
    .expect("WebSocket handshake through the gateway");
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    ws
}

/// Sends `message` and expects it back within 10 s.
async fn echo(ws: &mut Ws, message: Message) {
    ws.send(message.clone()).await.expect("send");
    let echoed = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("echo in time")
        .expect("a frame")
        .expect("frame ok");
    assert_eq!(echoed, message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_echo_inside_a_sandbox_through_the_gateway() {
    let c = cluster(&[]).await;
    let (id, token) = create(&c).await;
    let (port, _server) = start_echo(&c, &id, &token).await;
    let mut ws = connect(&c, &id, port).await;
    for text in ["hello", "through warren"] {
        echo(&mut ws, Message::text(text)).await;
    }
    echo(&mut ws, Message::binary(vec![7u8; 100_000])).await;
    ws.close(None).await.expect("close");

    // A port nothing listens on is a clear 502, not a hang.
    let closed = free_port().to_string();
    let r = http(
        &c,
        Method::GET,
        "/",
        &[("e2b-sandbox-id", &id), ("e2b-sandbox-port", &closed)],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert!(r.message().contains("is not open"), "{}", r.message());
}

/// With the gateway's and node's idle and body-progress timeouts at 1 s, a
/// kept-alive HTTP connection that sends nothing is closed (the idle
/// timeout is live), and a WebSocket through both that stays silent for
/// 4 s, twice, still carries the next message each way. (The header-read
/// timeout bounds the wait for a request's head; an upgraded connection
/// has no more of them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_websocket_outlives_the_listeners_timeouts() {
    let timeouts = ["--idle-timeout", "1s", "--body-progress-timeout", "1s"];
    let c = cluster(&timeouts).await;
    let (id, token) = create(&c).await;
    let (port, _server) = start_echo(&c, &id, &token).await;

    // The idle timeout is live: an HTTP/1.1 connection kept alive after its
    // answer is closed by the gateway once it has been idle for 1 s.
    let mut tcp = tokio::net::TcpStream::connect(c.gateway(0))
        .await
        .expect("connect");
    let head = format!("GET /health HTTP/1.1\r\nHost: 49983-{id}.localhost\r\n\r\n");
    tcp.write_all(head.as_bytes())
        .await
        .expect("send a request");
    let mut answer = vec![0u8; 4096];
    let n = tcp.read(&mut answer).await.expect("an answer");
    assert!(
        answer[..n].starts_with(b"HTTP/1.1 "),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    let closed = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut answer))
        .await
        .expect("the idle connection is closed within 10 s");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");

    let mut ws = connect(&c, &id, port).await;
    echo(&mut ws, Message::text("before")).await;
    for round in ["after 4 s", "after 8 s"] {
        tokio::time::sleep(Duration::from_secs(4)).await;
        echo(&mut ws, Message::text(round)).await;
    }
    ws.close(None).await.expect("close");
}
