//! Listeners under load (docs/security.md, "Listeners under load"), against
//! real processes on loopback: thousands of idle connections, silent and
//! trickling clients, stalled bodies, a second peer address (`127.0.0.2`)
//! next to a flooding one. Every flood is bounded in count and held only
//! for the test.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use futures_util::StreamExt;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::wait_until;

const KEY: &str = "key-team-a";

/// Longest a test waits for anything that must happen.
const PATIENCE: Duration = Duration::from_secs(30);

fn bin() -> &'static std::path::Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// A scheduler, `nodes` nodes (`process` runtime) and one gateway with
/// `gateway_args`.
async fn cluster(nodes: usize, gateway_args: &[&str], node_args: &[&str]) -> Cluster {
    let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
    let spec = Spec {
        nodes,
        gateways: 1,
        keys: vec![(KEY.into(), "team-a".into())],
        gateway_args: strings(gateway_args),
        node_args: strings(node_args),
        ..Spec::default()
    };
    Cluster::start(bin(), spec).await.expect("cluster starts")
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("a socket address")
}

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// Waits for the server to close `conn`; what it sent before closing.
async fn closed_by_server(conn: &mut TcpStream, what: &str) -> String {
    let mut buf = Vec::new();
    match tokio::time::timeout(PATIENCE, conn.read_to_end(&mut buf)).await {
        Ok(_) => String::from_utf8_lossy(&buf).into_owned(),
        Err(_) => panic!("{what}: the server kept the connection open for {PATIENCE:?}"),
    }
}

/// Sends `GET {path}` with the API key on `conn` and reads one answer
/// (keeping the connection): status and body.
async fn get(conn: &mut TcpStream, path: &str) -> (u16, String) {
    let raw = format!("GET {path} HTTP/1.1\r\nhost: gateway\r\nx-api-key: {KEY}\r\n\r\n");
    conn.write_all(raw.as_bytes())
        .await
        .expect("send a request");
    read_answer(conn).await
}

/// One HTTP/1.1 answer with a Content-Length (what warren sends for JSON).
async fn read_answer(conn: &mut TcpStream) -> (u16, String) {
    let mut buf: Vec<u8> = Vec::new();
    let read = async {
        loop {
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await.expect("read an answer");
            assert!(
                n > 0,
                "the connection closed before an answer: {:?}",
                String::from_utf8_lossy(&buf)
            );
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            let Some((head, body)) = text.split_once("\r\n\r\n") else {
                continue;
            };
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if body.len() >= len {
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                return (status, body.to_string());
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("an answer within the patience")
}

/// The sum of the `/metrics` samples of `admin` whose line contains every
/// one of `parts` (None when the admin listener did not answer).
async fn metric(admin: &str, parts: &[&str]) -> Option<u64> {
    let text = warren_harness::http::get_text(admin, "/metrics")
        .await
        .ok()?;
    Some(
        text.lines()
            .filter(|l| !l.starts_with('#') && parts.iter().all(|p| l.contains(p)))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum(),
    )
}

/// Waits until the metric matching `parts` reaches exactly `want`.
async fn wait_metric(admin: &str, parts: &[&str], want: u64) {
    let what = format!("{parts:?} = {want} on {admin}");
    wait_until(&what, PATIENCE, || async move {
        (metric(admin, parts).await == Some(want)).then_some(())
    })
    .await;
}

/// Open descriptors of process `pid`.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read the process's descriptors")
        .count()
}

/// Raises this test process's open-file limit to its hard limit (the
/// processes it starts inherit it) and checks there is room for `need`.
fn room_for_descriptors(need: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("raise RLIMIT_NOFILE");
    assert!(
        hard >= need,
        "this test needs {need} open files; the hard limit is {hard}"
    );
}

/// Opens `n` connections to the gateway `to` from 127.0.0.1 and keeps
/// them, sending nothing. They go in batches, each waited for until the
/// gateway has accepted (and kept or refused) all of it — its `admin`
/// metrics count `already` connections before the flood — so the kernel's
/// accept queue never overflows: a handshake the queue dropped would reach
/// the gateway only seconds later, when the kernel retries it.
async fn flood(to: SocketAddr, n: usize, admin: &str, already: u64) -> Vec<TcpStream> {
    const BATCH: usize = 250;
    let mut conns = Vec::with_capacity(n);
    while conns.len() < n {
        let batch = BATCH.min(n - conns.len());
        let opened: Vec<TcpStream> = futures_util::stream::iter(0..batch)
            .map(|_| async move {
                tokio::time::timeout(PATIENCE, connect_from([127, 0, 0, 1], to))
                    .await
                    .expect("a flood connection within the patience")
                    .expect("a flood connection")
            })
            .buffer_unordered(batch)
            .collect()
            .await;
        conns.extend(opened);
        let want = already + conns.len() as u64;
        let what = format!("the gateway to have taken {want} connections");
        wait_until(&what, PATIENCE, || async move {
            let open = metric(admin, &["listener_connections", "listener=\"http\""]).await?;
            let refused = metric(admin, &["listener_refused_total", "listener=\"http\""]).await?;
            (open + refused == want).then_some(())
        })
        .await;
    }
    conns
}

#[tokio::test]
async fn five_thousand_idle_connections_leave_the_gateway_answering() {
    const FLOOD: u64 = 5_000;
    const MAX: u64 = 1_000;
    const PER_PEER: u64 = 500;
    room_for_descriptors(FLOOD + 1_000);
    // A long header-read timeout: here the connection limits alone must
    // keep the gateway's descriptors bounded while the flood lasts.
    let c = cluster(
        0,
        &[
            "--max-connections",
            &MAX.to_string(),
            "--max-connections-per-peer",
            &PER_PEER.to_string(),
            "--header-read-timeout",
            "10m",
        ],
        &[],
    )
    .await;
    let gateway = addr(&c.gateway(0));
    let admin = c.gateways[0].addr("gateway admin");
    let pid = c.gateways[0].pid().expect("the gateway's pid");
    let baseline = fd_count(pid);

    // A kept-alive connection from the flooding peer, made before the flood.
    let mut kept = connect_from([127, 0, 0, 1], gateway)
        .await
        .expect("connect");
    assert_eq!(get(&mut kept, "/sandboxes").await.0, 200);

    let idle = flood(gateway, FLOOD as usize, &admin, 1).await;
    // The gateway has dealt with every one of them: the peer's cap is full
    // (the kept connection is one of its places), the rest were refused.
    let refused = FLOOD - (PER_PEER - 1);
    let http = "listener=\"http\"";
    wait_metric(
        &admin,
        &["listener_refused_total", http, "max_connections_per_peer"],
        refused,
    )
    .await;
    wait_metric(&admin, &["listener_connections", http], PER_PEER).await;
    let fds = fd_count(pid);
    eprintln!(
        "gateway descriptors: {baseline} before, {fds} with {FLOOD} flood connections \
         ({refused} refused; limit {MAX}, per peer {PER_PEER})"
    );
    assert!(
        fds as u64 <= MAX + 64,
        "the gateway holds {fds} descriptors with --max-connections {MAX}"
    );

    // A normal request from another address is answered (within 10 s,
    // however slow the machine: nothing here waits for a timeout).
    let normal = async {
        let mut conn = connect_from([127, 0, 0, 2], gateway)
            .await
            .expect("connect");
        get(&mut conn, "/sandboxes").await
    };
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), normal)
        .await
        .expect("a request from another peer is answered during the flood");
    assert_eq!(status, 200, "{body}");
    // One more from the flooding address is closed without an answer.
    let mut extra = connect_from([127, 0, 0, 1], gateway)
        .await
        .expect("connect");
    let _ = extra
        .write_all(
            format!("GET /sandboxes HTTP/1.1\r\nhost: g\r\nx-api-key: {KEY}\r\n\r\n").as_bytes(),
        )
        .await;
    assert_eq!(
        closed_by_server(&mut extra, "a connection past the per-peer cap").await,
        ""
    );
    // The established connection keeps working past the limit.
    assert_eq!(get(&mut kept, "/sandboxes").await.0, 200);

    // When the flood ends, its places are free again.
    drop(idle);
    wait_metric(&admin, &["listener_connections", http], 1).await;
    let mut after = connect_from([127, 0, 0, 1], gateway)
        .await
        .expect("connect");
    assert_eq!(get(&mut after, "/sandboxes").await.0, 200);
}

#[tokio::test]
async fn past_the_connection_limit_only_new_connections_are_refused() {
    const MAX: u64 = 50;
    room_for_descriptors(1_000);
    let c = cluster(
        0,
        &[
            "--max-connections",
            &MAX.to_string(),
            "--max-connections-per-peer",
            "0",
            "--header-read-timeout",
            "10m",
        ],
        &[],
    )
    .await;
    let gateway = addr(&c.gateway(0));
    let admin = c.gateways[0].addr("gateway admin");
    let http = "listener=\"http\"";

    let mut kept = connect_from([127, 0, 0, 3], gateway)
        .await
        .expect("connect");
    assert_eq!(get(&mut kept, "/sandboxes").await.0, 200);
    let idle = flood(gateway, 200, &admin, 1).await;
    wait_metric(
        &admin,
        &["listener_refused_total", http, "reason=\"max_connections\""],
        200 - (MAX - 1),
    )
    .await;
    // Without a per-peer cap, another address is refused too once the
    // total is reached...
    let mut other = connect_from([127, 0, 0, 2], gateway)
        .await
        .expect("connect");
    assert_eq!(
        closed_by_server(&mut other, "a connection past the limit").await,
        ""
    );
    // ...while every established connection keeps working.
    for _ in 0..3 {
        assert_eq!(get(&mut kept, "/sandboxes").await.0, 200);
    }
    drop(idle);
    wait_metric(&admin, &["listener_connections", http], 1).await;
    let mut again = connect_from([127, 0, 0, 2], gateway)
        .await
        .expect("connect");
    assert_eq!(get(&mut again, "/sandboxes").await.0, 200);
}

#[tokio::test]
async fn silent_and_idle_connections_are_closed_on_time() {
    let c = cluster(
        0,
        &["--header-read-timeout", "1s", "--idle-timeout", "2s"],
        &[],
    )
    .await;
    let gateway = addr(&c.gateway(0));
    let admin = c.gateways[0].addr("gateway admin");

    // Not a byte: closed after the header-read timeout.
    let mut silent = TcpStream::connect(gateway).await.expect("connect");
    closed_by_server(&mut silent, "a connection that sends nothing").await;
    // Half a request head, then nothing: the same.
    let mut half = TcpStream::connect(gateway).await.expect("connect");
    half.write_all(b"GET /sandboxes HTTP/1.1\r\nhost: g\r\n")
        .await
        .expect("write");
    closed_by_server(&mut half, "a connection that never finishes its head").await;
    wait_metric(
        &admin,
        &[
            "listener_timeouts_total",
            "listener=\"http\"",
            "header_read",
        ],
        2,
    )
    .await;

    // A kept-alive connection is closed once idle for the idle timeout.
    let mut kept = TcpStream::connect(gateway).await.expect("connect");
    assert_eq!(get(&mut kept, "/sandboxes").await.0, 200);
    closed_by_server(&mut kept, "an idle kept-alive connection").await;
    wait_metric(
        &admin,
        &["listener_timeouts_total", "listener=\"http\"", "idle"],
        1,
    )
    .await;

    // The admin listener has the same header-read timeout.
    let mut silent_admin = TcpStream::connect(addr(&admin)).await.expect("connect");
    closed_by_server(
        &mut silent_admin,
        "a silent connection to the admin listener",
    )
    .await;
}

#[tokio::test]
async fn a_stalled_request_body_is_abandoned_with_408() {
    let c = cluster(1, &["--body-progress-timeout", "1s"], &[]).await;
    let gateway = addr(&c.gateway(0));
    let admin = c.gateways[0].addr("gateway admin");

    // Control plane: a create whose body stops after a few bytes.
    let mut conn = TcpStream::connect(gateway).await.expect("connect");
    let head = format!(
        "POST /sandboxes HTTP/1.1\r\nhost: g\r\nx-api-key: {KEY}\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"templ"
    );
    conn.write_all(head.as_bytes()).await.expect("write");
    let (status, body) = read_answer(&mut conn).await;
    assert_eq!(status, 408, "{body}");
    assert!(body.contains("sent nothing for"), "{body}");

    // Data plane: an upload to a sandbox's envd, through gateway and node.
    let sandbox = wait_until("a sandbox", PATIENCE, || async {
        let mut conn = TcpStream::connect(gateway).await.ok()?;
        let body = r#"{"templateID":"base","timeout":300}"#;
        let raw = format!(
            "POST /sandboxes HTTP/1.1\r\nhost: g\r\nx-api-key: {KEY}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(raw.as_bytes()).await.ok()?;
        let (status, body) = read_answer(&mut conn).await;
        // 503 until the node has registered.
        (status == 201).then(|| serde_json::from_str::<serde_json::Value>(&body).ok())?
    })
    .await;
    let id = sandbox["sandboxID"].as_str().expect("sandboxID");
    let token = sandbox["envdAccessToken"].as_str().unwrap_or_default();
    let mut upload = TcpStream::connect(gateway).await.expect("connect");
    let head = format!(
        "POST /files?path=/tmp/stalled HTTP/1.1\r\nhost: g\r\ne2b-sandbox-id: {id}\r\n\
         e2b-sandbox-port: 49983\r\nx-access-token: {token}\r\n\
         content-type: application/octet-stream\r\ncontent-length: 100000\r\n\r\nthe start"
    );
    upload.write_all(head.as_bytes()).await.expect("write");
    let (status, body) = read_answer(&mut upload).await;
    assert_eq!(status, 408, "{body}");
    wait_metric(&admin, &["listener_timeouts_total", "body_progress"], 2).await;
}

#[tokio::test]
async fn the_node_closes_silent_connections() {
    let c = cluster(1, &[], &["--header-read-timeout", "1s"]).await;
    let node = c.nodes[0].as_ref().expect("node-1");
    for (what, at) in [
        ("the node's listener", node.addr("node http")),
        ("the node's admin listener", node.addr("node admin")),
    ] {
        let mut silent = TcpStream::connect(addr(&at)).await.expect("connect");
        closed_by_server(&mut silent, what).await;
    }
    wait_metric(
        &node.addr("node admin"),
        &[
            "listener_timeouts_total",
            "listener=\"http\"",
            "header_read",
        ],
        1,
    )
    .await;
}

#[tokio::test]
async fn the_scheduler_closes_silent_connections() {
    let dir = warren_test_support::temp_dir();
    let data = dir.path().display().to_string();
    let scheduler = warren_test_support::spawn(
        bin(),
        &[
            "scheduler",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
            "--insecure-internal",
            "--header-read-timeout",
            "1s",
        ],
        &[],
        &["scheduler grpc", "scheduler admin"],
    )
    .await
    .expect("scheduler starts");
    let mut silent = TcpStream::connect(addr(&scheduler.addr("scheduler grpc")))
        .await
        .expect("connect");
    closed_by_server(&mut silent, "a silent gRPC connection").await;
    wait_metric(
        &scheduler.addr("scheduler admin"),
        &[
            "listener_timeouts_total",
            "listener=\"grpc\"",
            "header_read",
        ],
        1,
    )
    .await;
}

#[tokio::test]
async fn envd_closes_silent_connections() {
    let root = warren_test_support::temp_dir();
    let root_arg = root.path().display().to_string();
    let envd = warren_test_support::spawn(
        bin(),
        &[
            "envd",
            "--listen",
            "127.0.0.1:0",
            "--root",
            &root_arg,
            "--header-read-timeout",
            "1s",
        ],
        &[],
        &["envd http"],
    )
    .await
    .expect("envd starts");
    let mut silent = TcpStream::connect(addr(&envd.addr("envd http")))
        .await
        .expect("connect");
    closed_by_server(&mut silent, "a silent connection to envd").await;
}
