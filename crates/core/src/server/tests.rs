//! The server loop against real sockets: short timeouts, generous waits.

use super::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// Longest any test waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(30);

fn limits() -> Limits {
    Limits {
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        body_progress_timeout: Duration::from_secs(30),
        ..Limits::new(100, Duration::from_secs(1))
    }
}

/// A server answering every request with the size of its body (read
/// whole; a body that fails to read is a 400, as handlers answer).
struct Server {
    addr: SocketAddr,
    registry: prometheus_client::registry::Registry,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(limits: Limits) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let handler = |_peer, req: Request<Incoming>| async move {
            let (status, text) = match req.into_body().collect().await {
                Ok(b) => (StatusCode::OK, b.to_bytes().len().to_string()),
                Err(e) => (StatusCode::BAD_REQUEST, e.to_string()),
            };
            let mut resp = Response::new(http_body_util::Full::new(Bytes::from(text)));
            *resp.status_mut() = status;
            resp
        };
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(&mut registry);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(
            listener,
            handler,
            async {
                let _ = stopped.await;
            },
            limits,
            metrics.listener("test"),
        ));
        Server {
            addr,
            registry,
            stop: Some(stop),
            task,
        }
    }

    /// The sum of the listener metric lines that contain `what`.
    fn count(&self, what: &str) -> u64 {
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(what))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(PATIENCE, self.task).await;
    }
}

async fn connect_from(ip: [u8; 4], to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((ip, 0)))
        .expect("bind the client");
    socket.connect(to).await.expect("connect")
}

/// Reads until the server closes; what it sent.
async fn until_closed(conn: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    tokio::time::timeout(PATIENCE, conn.read_to_end(&mut buf))
        .await
        .expect("the server closes the connection")
        .ok();
    String::from_utf8_lossy(&buf).into_owned()
}

/// One request on `conn`; the response head and body.
async fn request(conn: &mut TcpStream, body: &str) -> String {
    let raw = format!(
        "POST / HTTP/1.1\r\nhost: t\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(raw.as_bytes()).await.expect("write");
    read_answer(conn).await
}

/// The next response on `conn`, head and body.
async fn read_answer(conn: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let read = async {
        loop {
            let mut chunk = [0u8; 1024];
            let n = conn.read(&mut chunk).await.expect("read");
            assert!(
                n > 0,
                "closed before answering: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if rest.len() >= len {
                    return text;
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("an answer")
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_read_timeout() {
    let server = Server::start(Limits {
        header_read_timeout: Duration::from_millis(200),
        ..limits()
    })
    .await;
    // Not a byte: hyper alone would wait forever here (it has not
    // even seen which HTTP version this is).
    let mut silent = TcpStream::connect(server.addr).await.expect("connect");
    assert_eq!(until_closed(&mut silent).await, "");
    // A head that trickles in forever is cut off too.
    let mut slow = TcpStream::connect(server.addr).await.expect("connect");
    slow.write_all(b"GET / HTTP/1.1\r\n").await.expect("write");
    let trickle = async {
        for _ in 0..1000 {
            if slow.write_all(b"x-a: b\r\n").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(PATIENCE, trickle)
        .await
        .expect("the trickling connection is closed");
    assert_eq!(server.count("header_read"), 2);
    server.stop().await;
}

#[tokio::test]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let server = Server::start(Limits {
        idle_timeout: Duration::from_millis(300),
        ..limits()
    })
    .await;
    let mut conn = TcpStream::connect(server.addr).await.expect("connect");
    let answer = request(&mut conn, "abc").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("\r\n\r\n3"), "{answer}");
    assert_eq!(until_closed(&mut conn).await, "");
    assert_eq!(server.count("idle"), 1);
    assert_eq!(server.count("header_read"), 0);
    server.stop().await;
}

#[tokio::test]
async fn a_stalled_request_body_is_answered_408() {
    let server = Server::start(Limits {
        body_progress_timeout: Duration::from_millis(200),
        ..limits()
    })
    .await;
    let mut conn = TcpStream::connect(server.addr).await.expect("connect");
    conn.write_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\nonly this")
        .await
        .expect("write");
    let answer = until_closed(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":408"), "{answer}");
    assert!(answer.contains("sent nothing for"), "{answer}");
    assert_eq!(server.count("body_progress"), 1);
    server.stop().await;

    // A body that keeps coming, however slowly, is fine: it takes
    // longer than the timeout in all, but never stalls that long.
    let server = Server::start(Limits {
        body_progress_timeout: Duration::from_secs(1),
        ..limits()
    })
    .await;
    let mut slow = TcpStream::connect(server.addr).await.expect("connect");
    slow.write_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 8\r\n\r\n")
        .await
        .expect("write");
    for part in [b"ab", b"cd", b"ef", b"gh"] {
        tokio::time::sleep(Duration::from_millis(400)).await;
        slow.write_all(part).await.expect("write");
    }
    let slow_answer = read_answer(&mut slow).await;
    assert!(slow_answer.starts_with("HTTP/1.1 200"), "{slow_answer}");
    assert!(slow_answer.ends_with("\r\n\r\n8"), "{slow_answer}");
    assert_eq!(server.count("body_progress"), 0);
    server.stop().await;
}

#[tokio::test]
async fn past_the_limits_new_connections_are_closed_and_established_ones_keep_working() {
    let server = Server::start(Limits {
        max_connections: 3,
        max_connections_per_peer: Some(2),
        ..limits()
    })
    .await;
    let mut a = connect_from([127, 0, 0, 1], server.addr).await;
    assert!(request(&mut a, "x").await.starts_with("HTTP/1.1 200"));
    let mut b = connect_from([127, 0, 0, 1], server.addr).await;
    assert!(request(&mut b, "x").await.starts_with("HTTP/1.1 200"));
    // A third from the same peer: closed without an answer.
    let mut c = connect_from([127, 0, 0, 1], server.addr).await;
    let _ = c.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n").await;
    assert_eq!(until_closed(&mut c).await, "");
    // Another peer still gets in, up to the total.
    let mut d = connect_from([127, 0, 0, 2], server.addr).await;
    assert!(request(&mut d, "x").await.starts_with("HTTP/1.1 200"));
    let mut e = connect_from([127, 0, 0, 3], server.addr).await;
    assert_eq!(until_closed(&mut e).await, "");
    assert_eq!(server.count("reason=\"max_connections_per_peer\""), 1);
    assert_eq!(server.count("reason=\"max_connections\""), 1);
    // Established connections keep working past the limit.
    for conn in [&mut a, &mut b, &mut d] {
        assert!(request(conn, "yy").await.ends_with("\r\n\r\n2"));
    }
    // A closed connection frees its place.
    drop(a);
    let mut f = wait_for_admission([127, 0, 0, 1], server.addr).await;
    assert!(request(&mut f, "x").await.starts_with("HTTP/1.1 200"));
    server.stop().await;
}

/// Connects until the server keeps the connection (its slot count
/// drops asynchronously after a close).
async fn wait_for_admission(ip: [u8; 4], to: SocketAddr) -> TcpStream {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut conn = connect_from(ip, to).await;
        let raw = b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n";
        conn.write_all(raw).await.expect("write");
        let mut head = [0u8; 12];
        if conn.read_exact(&mut head).await.is_ok() {
            // Read the rest of that answer ("...content-length: 1\r\n\r\n0").
            let mut rest = Vec::new();
            while !rest.ends_with(b"\r\n\r\n0") {
                let mut byte = [0u8; 1];
                conn.read_exact(&mut byte)
                    .await
                    .expect("rest of the answer");
                rest.push(byte[0]);
            }
            return conn;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never admitted again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
