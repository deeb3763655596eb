//! The fast path's parsing: what it takes, what it leaves to hyper (every
//! request-smuggling shape among them), and what it sends on.

#![allow(clippy::unwrap_used)]

use super::*;

const DOMAIN: &str = "e2b.local";
const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 7));

fn parse(head: &str) -> Parsed {
    parse_request(head.as_bytes(), DOMAIN, PEER, 64 * 1024)
}

fn taken(head: &str) -> Request {
    match parse(head) {
        Parsed::Request(r) => r,
        Parsed::Partial => panic!("partial: {head:?}"),
        Parsed::Hyper => panic!("left to hyper: {head:?}"),
    }
}

fn left_to_hyper(head: &str) -> bool {
    matches!(parse(head), Parsed::Hyper)
}

fn rendered(r: &Request, body: &[u8]) -> String {
    let mut out = Vec::new();
    r.render("127.0.0.1:5007", 3, body, &mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn an_sdk_request_is_rewritten_as_hyper_s_path_rewrites_it() {
    let head = "POST /files?path=/a HTTP/1.1\r\n\
        Host: api.e2b.local\r\n\
        E2b-Sandbox-Id: abc123\r\n\
        E2b-Sandbox-Port: 49983\r\n\
        X-API-Key: e2b_secret\r\n\
        X-Warren-Generation: 999\r\n\
        x-warren-sandbox-id: other\r\n\
        X-Access-Token: envd-token\r\n\
        X-Forwarded-For: 192.0.2.1\r\n\
        Connection: keep-alive\r\n\
        Content-Length: 5\r\n\r\nhello";
    let r = taken(head);
    assert_eq!(r.target.sandbox_id, "abc123");
    assert_eq!(r.target.port, 49983);
    assert_eq!(r.head_len, head.len() - 5);
    assert_eq!(r.body_len, 5);
    assert!(
        !r.replay_safe,
        "a POST without an Idempotency-Key is sent once"
    );
    assert!(!r.close);
    assert_eq!(
        rendered(&r, b"hello"),
        "POST /files?path=/a HTTP/1.1\r\n\
         Host: api.e2b.local\r\n\
         X-Access-Token: envd-token\r\n\
         Content-Length: 5\r\n\
         x-warren-sandbox-id: abc123\r\n\
         x-warren-sandbox-port: 49983\r\n\
         x-forwarded-for: 192.0.2.1, 10.0.0.7\r\n\
         x-warren-generation: 3\r\n\r\nhello"
    );
}

#[test]
fn a_host_named_target_gets_the_node_s_host_only_when_it_has_none() {
    let r = taken("GET /health HTTP/1.1\r\nHost: 8080-abc123.e2b.local:3000\r\n\r\n");
    assert_eq!(r.target.port, 8080);
    assert!(r.replay_safe);
    assert!(rendered(&r, b"").contains("Host: 8080-abc123.e2b.local:3000\r\n"));
    let r = taken("GET / HTTP/1.1\r\ne2b-sandbox-id: abc123\r\ne2b-sandbox-port: 8080\r\n\r\n");
    assert!(rendered(&r, b"").contains("host: 127.0.0.1:5007\r\n"));
    assert!(rendered(&r, b"").contains("x-forwarded-for: 10.0.0.7\r\n"));
}

#[test]
fn connection_close_is_taken_and_remembered() {
    let r = taken("GET / HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\nConnection: Close\r\n\r\n");
    assert!(r.close);
    assert!(!rendered(&r, b"")
        .to_ascii_lowercase()
        .contains("connection"));
}

#[test]
fn an_incomplete_head_waits_for_more() {
    assert!(matches!(
        parse("GET / HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\n"),
        Parsed::Partial
    ));
}

#[test]
fn smuggling_shapes_and_everything_unusual_go_to_hyper() {
    let host = "Host: 80-abc123.e2b.local\r\n";
    for extra in [
        // Two framings, or an ambiguous length: hyper refuses these.
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: chunked\r\n",
        "Content-Length: 5\r\nContent-Length: 5\r\n",
        "Content-Length: +5\r\n",
        "Content-Length: 5, 5\r\n",
        "Content-Length: 0x5\r\n",
        "Content-Length: 99999999999999999999999\r\n",
        // Bodies larger than a replay's buffer stream through hyper.
        "Content-Length: 65537\r\n",
        // Hop-by-hop headers other than a plain Connection.
        "Connection: upgrade\r\nUpgrade: websocket\r\n",
        "Connection: keep-alive, x-custom\r\n",
        "Connection: close\r\nConnection: close\r\n",
        "TE: trailers\r\n",
        "Keep-Alive: timeout=5\r\n",
        "Expect: 100-continue\r\n",
        "Proxy-Authorization: Basic eA==\r\n",
        // Doubled routing headers, half a target, a bad one.
        "Host: 81-abc123.e2b.local\r\n",
        "E2b-Sandbox-Id: abc123\r\n",
        "E2b-Sandbox-Id: abc123\r\nE2b-Sandbox-Id: abc124\r\nE2b-Sandbox-Port: 80\r\n",
        "E2b-Sandbox-Id: ABC!\r\nE2b-Sandbox-Port: 80\r\n",
        "E2b-Sandbox-Id: abc123\r\nE2b-Sandbox-Port: 0\r\n",
        "X-Forwarded-For: 1.1.1.1\r\nX-Forwarded-For: 2.2.2.2\r\n",
        // A folded header line (obsolete line folding).
        "X-A: 1\r\n  folded\r\n",
    ] {
        let head = format!("GET / HTTP/1.1\r\n{host}{extra}\r\n");
        assert!(left_to_hyper(&head), "taken: {head:?}");
    }
    for head in [
        // Not HTTP/1.1, not origin form, an uncommon method, h2c.
        "GET / HTTP/1.0\r\nHost: 80-abc123.e2b.local\r\n\r\n",
        "GET http://80-abc123.e2b.local/ HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\n\r\n",
        "CONNECT 80-abc123.e2b.local:80 HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\nX: a\x01b\r\n\r\n",
        // The control plane.
        "GET /sandboxes HTTP/1.1\r\nHost: api.e2b.local\r\n\r\n",
        "GET / HTTP/1.1\r\n\r\n",
    ] {
        assert!(left_to_hyper(head), "taken: {head:?}");
    }
}

#[test]
fn replay_safety_follows_hyper_s_path() {
    let with = |method: &str, extra: &str| {
        taken(&format!(
            "{method} / HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\n{extra}\r\n"
        ))
        .replay_safe
    };
    assert!(with("GET", ""));
    assert!(with("DELETE", ""));
    assert!(!with("PUT", ""));
    assert!(with("POST", "Idempotency-Key: k1\r\n"));
    assert!(!with(
        "POST",
        "Idempotency-Key: k1\r\nContent-Type: application/connect+json\r\n"
    ));
    assert!(!with("GET", "Content-Type: application/grpc\r\n"));
    assert!(taken("HEAD / HTTP/1.1\r\nHost: 80-abc123.e2b.local\r\n\r\n").is_head);
}

fn response(head: &str, is_head: bool, close: bool) -> (Response, String) {
    let mut out = Vec::new();
    match parse_response(head.as_bytes(), is_head, close, &mut out) {
        ParsedResponse::Response(r) => (r, String::from_utf8(out).unwrap()),
        ParsedResponse::Partial => panic!("partial"),
        ParsedResponse::Bad(why) => panic!("bad: {why}"),
    }
}

fn bad(head: &str) -> &'static str {
    let mut out = Vec::new();
    match parse_response(head.as_bytes(), false, false, &mut out) {
        ParsedResponse::Bad(why) => why,
        _ => panic!("accepted: {head:?}"),
    }
}

#[test]
fn an_answer_loses_hop_by_hop_and_internal_headers() {
    let (r, out) = response(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: keep-alive, x-hop\r\n\
         x-hop: 1\r\nkeep-alive: timeout=5\r\nx-warren-internal: 1\r\ncontent-length: 2\r\n\r\nok",
        false,
        false,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.framing, Framing::Length(2));
    assert!(r.reusable);
    assert!(!r.not_hosted);
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\n"
    );
}

#[test]
fn framing_of_answers() {
    let (r, out) = response(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        false,
        true,
    );
    assert_eq!(r.framing, Framing::Chunked);
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    let (r, _) = response("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", true, false);
    assert_eq!(
        r.framing,
        Framing::Empty,
        "the answer to a HEAD has no body"
    );
    let (r, _) = response("HTTP/1.1 204 No Content\r\n\r\n", false, false);
    assert_eq!(r.framing, Framing::Empty);
    let (r, out) = response("HTTP/1.1 200 OK\r\n\r\n", false, false);
    assert_eq!(r.framing, Framing::Close);
    assert!(!r.reusable);
    assert!(out.ends_with("connection: close\r\n\r\n"));
    let (r, _) = response(
        "HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 0\r\n\r\n",
        false,
        false,
    );
    assert!(!r.reusable, "the node closes it");
    let (r, _) = response(
        "HTTP/1.1 404 Not Found\r\nX-Warren-Route: Not-Found\r\ncontent-length: 0\r\n\r\n",
        false,
        false,
    );
    assert!(r.not_hosted);
}

#[test]
fn answers_with_two_framings_are_refused() {
    bad("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n");
    bad("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n");
    bad("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
    bad("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n");
    assert_eq!(
        bad("HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        "the sandbox switched protocols without being asked to"
    );
    bad("HTTP/1.1 103 Early Hints\r\n\r\n");
    bad("HTTP/1.1 200 OK\r\nbad header\r\n\r\n");
}

#[test]
fn a_chunked_body_is_followed_to_its_end_however_it_is_cut() {
    let body =
        b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
    let end = body.len() - 4;
    for cut in 1..body.len() {
        let mut c = Chunked::default();
        let (a, b) = body.split_at(cut);
        let found = match c.feed(a).unwrap() {
            Some(n) => n,
            None => cut + c.feed(b).unwrap().unwrap(),
        };
        assert_eq!(found, end, "cut at {cut}");
    }
    let mut c = Chunked::default();
    assert_eq!(c.feed(b"0\r\n\r\n"), Ok(Some(5)));
}

#[test]
fn a_malformed_chunked_body_is_an_error() {
    for body in [
        &b"\r\n"[..],
        b"g\r\n",
        b"5\nhello",
        b"5\r\nhelloX\r\n",
        b"1000000000000000\r\n",
        b"0\r\n\n",
        b"0\r\nx: 1\n",
    ] {
        let mut c = Chunked::default();
        assert_eq!(c.feed(body), Err(BadChunk), "{body:?}");
    }
}
