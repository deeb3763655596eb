//! The proxy's HTTP/1.1 fast path (`--proxy-fast-path`, on by default)
//! against hyper's path (`--proxy-fast-path false`), byte for byte from
//! the client's side: two gateways of one cluster, one with each, the same
//! raw requests to the same sandbox port, and every answer compared
//! (status, headers but `date`, body) — including what the app in the
//! sandbox saw. Among the requests: pipelining, `Connection: close`,
//! `HEAD`, an unknown sandbox, the spoofed and secret headers a gateway
//! must drop, and the request-smuggling shapes (two framings, two
//! lengths), which the fast path must leave to hyper. Among the answers:
//! chunked and streamed in pieces, a large one, and one the app cuts off
//! (the client's connection must end in a reset, not a clean end). And a
//! client that leaves while its answer is pending takes the request with
//! it: the app sees its connection go (what interrupts a code
//! interpreter's run when the SDK's timeout fires).
//!
//! The app is a small HTTP server in this test process; under the
//! `process` runtime a sandbox shares the host's network, so envd's port
//! relay reaches it on loopback.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::create_sandbox;
use warren_test_support::wait_until;

const KEY: &str = "key-team-a";

/// `/slow` requests the app began, and those it saw abandoned (its
/// connection closed before it answered).
static SLOW_BEGUN: AtomicUsize = AtomicUsize::new(0);
static SLOW_ABANDONED: AtomicUsize = AtomicUsize::new(0);

/// Counts an abandoned `/slow` when dropped before it answered.
struct Abandoned(bool);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.0 {
            SLOW_ABANDONED.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The app: echoes what it was sent as JSON; `/chunked` streams three
/// pieces; `/big` is 300 000 bytes; `/cut` promises 100 000 bytes and
/// sends 10 before it drops the connection; `/slow` answers after 60 s.
async fn app() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(answer);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    port
}

type AppBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

async fn answer(
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<AppBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let resp = match parts.uri.path() {
        "/slow" => {
            SLOW_BEGUN.fetch_add(1, Ordering::SeqCst);
            let mut guard = Abandoned(false);
            tokio::time::sleep(Duration::from_secs(60)).await;
            guard.0 = true;
            http::Response::new(full(b"late".to_vec()))
        }
        "/chunked" => {
            let pieces =
                futures_util::stream::iter(["one\n", "two\n", "three\n"]).then(|p| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(p.as_bytes())))
                });
            http::Response::new(BodyExt::boxed(StreamBody::new(pieces)))
        }
        "/big" => http::Response::new(full(vec![b'x'; 300_000])),
        "/cut" => {
            // The error comes after a pause, so the head and the first
            // bytes are on their way by then.
            let pieces = futures_util::stream::iter([true, false]).then(|first| async move {
                if first {
                    return Ok(Frame::data(Bytes::from_static(b"0123456789")));
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                Err(std::io::Error::other("the app stops mid-answer"))
            });
            let mut r = http::Response::new(BodyExt::boxed(StreamBody::new(pieces)));
            r.headers_mut().insert(
                http::header::CONTENT_LENGTH,
                http::HeaderValue::from(100_000),
            );
            r
        }
        _ => {
            let mut headers: Vec<(String, String)> = parts
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect();
            headers.sort();
            let seen = serde_json::json!({
                "method": parts.method.as_str(),
                "uri": parts.uri.to_string(),
                "headers": headers,
                "body": String::from_utf8_lossy(&body),
            });
            let mut r = http::Response::new(full(seen.to_string().into_bytes()));
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            r
        }
    };
    Ok(resp)
}

fn full(bytes: Vec<u8>) -> AppBody {
    Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed()
}

use futures_util::StreamExt;

/// One answer as the client read it.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: u16,
    /// Lower-case names, sorted, without `date`.
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// What a connection carried back: its answers, and how it ended.
#[derive(Debug, PartialEq, Eq)]
struct Transcript {
    answers: Vec<Answer>,
    /// The connection ended with a reset (not a clean close).
    reset: bool,
    /// Bytes after the last whole answer.
    rest: Vec<u8>,
}

/// Writes `request` to `addr` in one write and reads until the server
/// closes; `heads` says which of the answers are to `HEAD` requests.
async fn exchange(addr: &str, request: &str, heads: &[bool]) -> Transcript {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut got)).await;
    let reset = match read {
        Ok(Ok(_)) => false,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => true,
        Ok(Err(e)) => panic!("reading from {addr}: {e}"),
        Err(_) => panic!(
            "{addr} did not close the connection within 20 s: {:?}",
            String::from_utf8_lossy(&got)
        ),
    };
    let mut answers = Vec::new();
    let mut at = 0;
    while let Some((answer, used)) = parse_answer(
        &got[at..],
        heads.get(answers.len()).copied().unwrap_or(false),
    ) {
        answers.push(answer);
        at += used;
    }
    Transcript {
        answers,
        reset,
        rest: got[at..].to_vec(),
    }
}

/// One whole answer from the start of `bytes`, and its length.
fn parse_answer(bytes: &[u8], head_only: bool) -> Option<(Answer, usize)> {
    let mut h = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut h);
    let httparse::Status::Complete(n) = resp.parse(bytes).ok()? else {
        return None;
    };
    let mut headers: Vec<(String, String)> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_ascii_lowercase(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .filter(|(k, _)| k != "date")
        .collect();
    headers.sort();
    let value = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let status = resp.code?;
    let (body, used) = if head_only || status == 204 || status == 304 {
        (Vec::new(), 0)
    } else if let Some(len) = value("content-length") {
        let len: usize = len.parse().ok()?;
        (bytes.get(n..n + len)?.to_vec(), len)
    } else if value("transfer-encoding").is_some() {
        dechunk(&bytes[n..])?
    } else {
        (bytes[n..].to_vec(), bytes.len() - n)
    };
    Some((
        Answer {
            status,
            headers,
            body,
        },
        n + used,
    ))
}

fn dechunk(mut bytes: &[u8]) -> Option<(Vec<u8>, usize)> {
    let total = bytes.len();
    let mut body = Vec::new();
    loop {
        let line = bytes.windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&bytes[..line]).ok()?, 16).ok()?;
        bytes = &bytes[line + 2..];
        if size == 0 {
            // No trailers from this app.
            bytes = bytes.strip_prefix(b"\r\n")?;
            return Some((body, total - bytes.len()));
        }
        body.extend_from_slice(bytes.get(..size)?);
        bytes = bytes.get(size + 2..)?;
    }
}

fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn scrape(c: &Cluster, g: usize) -> String {
    let admin = c.gateways[g].addr("gateway admin");
    let r = warren_test_support::http::Http::new(Duration::from_secs(10))
        .send(http::Method::GET, &admin, "/metrics", &[], None)
        .await
        .expect("metrics");
    r.text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_answers_every_request_as_hyper_s_path_does() {
    let port = app().await;
    let c = Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            gateways: 2,
            per_gateway_args: vec![vec![], vec!["--proxy-fast-path".into(), "false".into()]],
            ..Spec::default()
        },
    )
    .await
    .expect("cluster");
    let (fast, slow_gw) = (c.gateway(0), c.gateway(1));
    let (id, _) = create_sandbox(&fast, KEY).await;
    let to = format!("E2b-Sandbox-Id: {id}\r\nE2b-Sandbox-Port: {port}\r\n");
    let host = format!("Host: {port}-{id}.localhost\r\n");
    let close = "Connection: close\r\n";

    let cases: Vec<(&str, String, Vec<bool>)> = vec![
        (
            "a GET with the headers a gateway drops or rewrites",
            format!(
                "GET /echo?q=1 HTTP/1.1\r\n{to}Host: api.localhost\r\nX-API-Key: {KEY}\r\n\
                 X-Warren-Generation: 999\r\nX-Forwarded-For: 192.0.2.1\r\nX-Custom: a\r\n{close}\r\n"
            ),
            vec![],
        ),
        (
            "three requests pipelined in one write, the Host-named target",
            format!(
                "GET /one HTTP/1.1\r\n{host}\r\n\
                 POST /two HTTP/1.1\r\n{host}Content-Length: 5\r\n\r\nhello\
                 DELETE /three HTTP/1.1\r\n{host}{close}\r\n"
            ),
            vec![],
        ),
        (
            "HEAD",
            format!("HEAD /echo HTTP/1.1\r\n{to}{close}\r\n"),
            vec![true],
        ),
        (
            "a chunked answer streamed in pieces, then a large one",
            format!("GET /chunked HTTP/1.1\r\n{to}\r\nGET /big HTTP/1.1\r\n{to}{close}\r\n"),
            vec![],
        ),
        (
            "an unknown sandbox",
            format!(
                "GET / HTTP/1.1\r\nE2b-Sandbox-Id: doesnotexist0\r\nE2b-Sandbox-Port: {port}\r\n{close}\r\n"
            ),
            vec![],
        ),
        (
            "two framings: a length and chunked (smuggling)",
            format!(
                "POST /framed HTTP/1.1\r\n{to}Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n\
                 0\r\n\r\nGET /smuggled HTTP/1.1\r\n{to}{close}\r\n"
            ),
            vec![],
        ),
        (
            "two different lengths (smuggling)",
            format!(
                "POST /lengths HTTP/1.1\r\n{to}Content-Length: 3\r\nContent-Length: 30\r\n\r\nabc{close}"
            ),
            vec![],
        ),
        (
            "an HTTP/1.0 request, then the connection ends",
            format!("GET /old HTTP/1.0\r\n{to}\r\n"),
            vec![],
        ),
    ];
    for (what, request, heads) in &cases {
        let a = exchange(&fast, request, heads).await;
        let b = exchange(&slow_gw, request, heads).await;
        assert_eq!(
            a, b,
            "{what}: the fast path (left) and hyper's (right) differ"
        );
        assert!(!a.answers.is_empty(), "{what}: no answer: {a:?}");
    }

    // What the app saw through the fast path, beyond agreeing with hyper's.
    let t = exchange(&fast, &cases[0].1, &[]).await;
    let seen: serde_json::Value = serde_json::from_slice(&t.answers[0].body).expect("echo");
    let headers = seen["headers"].as_array().expect("headers");
    let get = |name: &str| {
        headers
            .iter()
            .filter(|h| h[0] == name)
            .map(|h| h[1].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(get("x-forwarded-for"), ["192.0.2.1, 127.0.0.1"], "{seen}");
    assert_eq!(get("x-custom"), ["a"]);
    assert!(
        get("x-api-key").is_empty(),
        "the team's key reached the sandbox: {seen}"
    );
    assert!(get("e2b-sandbox-id").is_empty(), "{seen}");
    assert_eq!(seen["uri"], "/echo?q=1");
    let t = exchange(&fast, &cases[1].1, &[]).await;
    let paths: Vec<String> = t
        .answers
        .iter()
        .map(|a| {
            serde_json::from_slice::<serde_json::Value>(&a.body).expect("echo")["uri"].to_string()
        })
        .collect();
    assert_eq!(paths, ["\"/one\"", "\"/two\"", "\"/three\""]);
    let t = exchange(&fast, &cases[3].1, &[]).await;
    assert_eq!(t.answers[0].body, b"one\ntwo\nthree\n");
    assert_eq!(t.answers[1].body.len(), 300_000);

    // An answer the app cuts off ends the client's connection with a
    // reset on both paths, after the bytes that came.
    let cut = format!("GET /cut HTTP/1.1\r\n{to}\r\n");
    for gw in [&fast, &slow_gw] {
        let t = exchange(gw, &cut, &[]).await;
        assert!(t.reset, "{gw}: a cut answer must end in a reset: {t:?}");
        assert!(t.answers.is_empty(), "{gw}: {t:?}");
    }

    // A client that leaves while the app works on its request: the app
    // sees its connection closed, through either path.
    let slow = format!("GET /slow HTTP/1.1\r\n{to}\r\n");
    for gw in [&fast, &slow_gw] {
        let (begun, abandoned) = (
            SLOW_BEGUN.load(Ordering::SeqCst),
            SLOW_ABANDONED.load(Ordering::SeqCst),
        );
        let mut s = TcpStream::connect(gw.as_str()).await.expect("connect");
        s.write_all(slow.as_bytes()).await.expect("write");
        wait_until(
            "the app to begin /slow",
            Duration::from_secs(20),
            || async { (SLOW_BEGUN.load(Ordering::SeqCst) > begun).then_some(()) },
        )
        .await;
        drop(s);
        wait_until(
            &format!("the app to see the client of {gw} go"),
            Duration::from_secs(30),
            || async { (SLOW_ABANDONED.load(Ordering::SeqCst) > abandoned).then_some(()) },
        )
        .await;
    }

    let (on, off) = (scrape(&c, 0).await, scrape(&c, 1).await);
    let name = "warren_gateway_proxy_fast_path_requests_total";
    assert!(
        counter(&on, name) >= 10.0,
        "the fast path took too few: {}",
        counter(&on, name)
    );
    assert_eq!(
        counter(&off, name),
        0.0,
        "--proxy-fast-path false still took requests"
    );
    assert!(counter(&on, "warren_gateway_proxy_fast_path_handovers_total") >= 3.0);
}
