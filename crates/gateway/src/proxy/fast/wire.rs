//! HTTP/1.1 as the fast path reads and writes it: a client's request head
//! parsed and rewritten for a node in one pass, the node's response head
//! parsed and cleaned, and a chunked body followed to its end.
//!
//! The fast path takes a strict subset of HTTP/1.1 and leaves the rest to
//! hyper ([`Parsed::Hyper`]), so a request it takes has one meaning to
//! every party: HTTP/1.1 with an origin-form target, one of the common
//! methods, no `Transfer-Encoding`, at most one `Content-Length` (digits
//! only) whose body is small and already here, no `Upgrade`, `Expect` or
//! other hop-by-hop header than `Connection: keep-alive | close`, at most
//! one `Host`, `X-Forwarded-For`, `E2b-Sandbox-Id` and `E2b-Sandbox-Port`,
//! a data-plane target that is valid. The rewrite is the one
//! `super::super::headers` makes for hyper's path: `x-warren-*`, the E2B
//! routing headers and `X-API-Key` out; warren's routing headers and
//! `X-Forwarded-For` in.

use crate::proxy::replay;
use crate::target::{self, Target};
use std::net::IpAddr;
use warren_core::headers::{
    is_hop_by_hop_str, API_KEY, E2B_SANDBOX_ID, E2B_SANDBOX_PORT, GENERATION, IDEMPOTENCY_KEY,
    INTERNAL_PREFIX, ROUTE, ROUTE_NOT_FOUND, SANDBOX_ID, SANDBOX_PORT,
};

/// Headers a request or answer may have, as many as hyper allows: a
/// request with more goes to hyper (which refuses it); an answer with
/// more is a `502`, as on hyper's path.
pub(super) const MAX_HEADERS: usize = 100;

/// The longest request head the fast path reads before it leaves the
/// connection to hyper.
pub(super) const MAX_HEAD: usize = 16 * 1024;

/// The longest answer head it accepts (hyper's client reads up to its
/// buffer's ~400 KiB).
pub(super) const MAX_ANSWER_HEAD: usize = 400 * 1024;

/// What a client's bytes are, to the fast path.
pub(super) enum Parsed {
    /// Not a whole head yet.
    Partial,
    /// Something the fast path leaves to hyper (which answers it, or
    /// refuses it, as it always has).
    Hyper,
    /// A request to forward.
    Request(Request),
}

/// A client's request, rewritten except for what depends on the route.
#[derive(Debug)]
pub(super) struct Request {
    /// Request line and headers for the node, up to (not including) the
    /// generation and the end of the head.
    head: Vec<u8>,
    /// Whether the client sent a `Host` (if not, the node's address is).
    has_host: bool,
    /// Where it goes.
    pub(super) target: Target,
    /// Bytes of the client's head.
    pub(super) head_len: usize,
    /// Bytes of its body (`Content-Length`).
    pub(super) body_len: usize,
    /// A `HEAD` request: the answer has no body whatever it says.
    pub(super) is_head: bool,
    /// May be sent again to a moved sandbox's new node (see `replay`).
    pub(super) replay_safe: bool,
    /// The client asked to close the connection after this answer.
    pub(super) close: bool,
}

/// Case-insensitive name comparison against a lower-case constant.
fn is(name: &str, lower: &str) -> bool {
    name.len() == lower.len() && name.as_bytes().eq_ignore_ascii_case(lower.as_bytes())
}

/// An `x-warren-*` header, in any case.
fn is_internal(name: &str) -> bool {
    name.len() >= INTERNAL_PREFIX.len()
        && name.as_bytes()[..INTERNAL_PREFIX.len()].eq_ignore_ascii_case(INTERNAL_PREFIX.as_bytes())
}

/// A header value as `HeaderValue::to_str` sees it: visible ASCII (and
/// tabs) only.
fn visible(v: &[u8]) -> Result<&str, ()> {
    if v.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b)) {
        std::str::from_utf8(v).map_err(|_| ())
    } else {
        Err(())
    }
}

/// `Content-Length` as digits only, without overflow.
fn content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

pub(super) fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Parses `buf` as a request head for the fast path: the client at `peer`,
/// sandboxes under `domain`, bodies up to `max_body` bytes.
pub(super) fn parse_request(buf: &[u8], domain: &str, peer: IpAddr, max_body: usize) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Hyper,
    };
    let (Some(method), Some(path), Some(1)) = (req.method, req.path, req.version) else {
        return Parsed::Hyper;
    };
    if !matches!(
        method,
        "GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "PATCH" | "OPTIONS"
    ) {
        return Parsed::Hyper;
    }
    // Origin form, as `http::Uri` reads it (hyper's path forwards that).
    if !path.starts_with('/') {
        return Parsed::Hyper;
    }
    let Ok(path) = http::uri::PathAndQuery::try_from(path) else {
        return Parsed::Hyper;
    };

    let mut head = Vec::with_capacity(head_len + 160);
    head.extend_from_slice(method.as_bytes());
    head.push(b' ');
    head.extend_from_slice(path.as_str().as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");

    let (mut host, mut e2b_id, mut e2b_port, mut xff) = (None, None, None, None);
    let (mut length, mut idempotency_key, mut content_type) = (None, false, None);
    let mut close = false;
    let mut connection_seen = false;
    for h in req.headers.iter() {
        let (name, value) = (h.name, h.value);
        let once = |slot: &Option<&[u8]>| slot.is_none();
        if is(name, "host") {
            if !once(&host) {
                return Parsed::Hyper;
            }
            host = Some(value);
        } else if is(name, E2B_SANDBOX_ID) {
            if !once(&e2b_id) {
                return Parsed::Hyper;
            }
            e2b_id = Some(value);
            continue;
        } else if is(name, E2B_SANDBOX_PORT) {
            if !once(&e2b_port) {
                return Parsed::Hyper;
            }
            e2b_port = Some(value);
            continue;
        } else if is(name, "x-forwarded-for") {
            if !once(&xff) {
                return Parsed::Hyper;
            }
            xff = Some(value);
            continue;
        } else if is(name, "content-length") {
            if length.is_some() {
                return Parsed::Hyper;
            }
            match content_length(value) {
                Some(n) if n <= max_body as u64 => length = Some(n as usize),
                _ => return Parsed::Hyper,
            }
        } else if is(name, "connection") {
            if connection_seen {
                return Parsed::Hyper;
            }
            connection_seen = true;
            let v = value.trim_ascii();
            if v.eq_ignore_ascii_case(b"close") {
                close = true;
            } else if !v.eq_ignore_ascii_case(b"keep-alive") {
                return Parsed::Hyper;
            }
            continue;
        } else if is(name, "expect") || is_hop_by_hop_str(name) {
            return Parsed::Hyper;
        } else if is(name, API_KEY) || is_internal(name) {
            // The team's key never reaches a sandbox (see `headers`), nor
            // does a client's `x-warren-*`.
            continue;
        } else if is(name, IDEMPOTENCY_KEY) {
            idempotency_key = true;
        } else if is(name, "content-type") {
            content_type = Some(value);
        }
        push_header(&mut head, name.as_bytes(), value);
    }

    let host_text = match host.map(visible) {
        Some(Ok(h)) => Some(Ok(target::strip_port(h))),
        Some(Err(())) => Some(Err(())),
        None => None,
    };
    let target = match target::from_parts(
        e2b_id.map(visible),
        e2b_port.map(visible),
        host_text,
        domain,
    ) {
        Some(Ok(t)) => t,
        // The control plane, or a 400 hyper's path words.
        _ => return Parsed::Hyper,
    };

    push_header(
        &mut head,
        SANDBOX_ID.as_bytes(),
        target.sandbox_id.as_bytes(),
    );
    let mut port = itoa::Buffer::new();
    push_header(
        &mut head,
        SANDBOX_PORT.as_bytes(),
        port.format(target.port).as_bytes(),
    );
    head.extend_from_slice(b"x-forwarded-for: ");
    // A value that is not text is replaced, as `headers` does.
    if let Some(Ok(prev)) = xff.map(visible) {
        head.extend_from_slice(prev.as_bytes());
        head.extend_from_slice(b", ");
    }
    write_ip(&mut head, peer);
    head.extend_from_slice(b"\r\n");

    Parsed::Request(Request {
        head,
        has_host: host.is_some(),
        target,
        head_len,
        body_len: length.unwrap_or(0),
        is_head: method == "HEAD",
        replay_safe: replay::safe_parts(method, idempotency_key, content_type),
        close,
    })
}

fn write_ip(out: &mut Vec<u8>, ip: IpAddr) {
    use std::io::Write;
    let _ = write!(out, "{ip}");
}

impl Request {
    /// The request for the node at `endpoint`, at `generation`, with `body`,
    /// into `out`.
    pub(super) fn render(&self, endpoint: &str, generation: u64, body: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.head);
        if !self.has_host {
            push_header(out, b"host", endpoint.as_bytes());
        }
        let mut g = itoa::Buffer::new();
        push_header(out, GENERATION.as_bytes(), g.format(generation).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
    }
}

/// How a response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    /// No body (`HEAD`, `204`, `304`).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`, passed on as it is.
    Chunked,
    /// Until the node closes the connection (which then ends the client's).
    Close,
}

/// A node's response head, cleaned for the client.
#[derive(Debug)]
pub(super) struct Response {
    pub(super) status: u16,
    /// Bytes of the node's head.
    pub(super) head_len: usize,
    pub(super) framing: Framing,
    /// The node keeps the connection open after the body.
    pub(super) reusable: bool,
    /// `404` with `X-Warren-Route: not-found`: the stale-route signal.
    pub(super) not_hosted: bool,
}

/// What a node's bytes are.
pub(super) enum ParsedResponse {
    Partial,
    /// Not an answer the fast path passes on (the client gets a `502`).
    Bad(&'static str),
    Response(Response),
}

/// Parses the node's response head in `buf` and writes the client's head
/// into `out` (with `Connection: close` when `close`, or when the body
/// ends with the connection); `is_head` for the answer to a `HEAD`.
pub(super) fn parse_response(
    buf: &[u8],
    is_head: bool,
    close: bool,
    out: &mut Vec<u8>,
) -> ParsedResponse {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_ANSWER_HEAD => {
            return ParsedResponse::Partial
        }
        Ok(httparse::Status::Partial) => {
            return ParsedResponse::Bad("the node's answer head is too large")
        }
        Err(_) => return ParsedResponse::Bad("the node's answer head is malformed"),
    };
    let (Some(version), Some(status)) = (resp.version, resp.code) else {
        return ParsedResponse::Bad("the node's answer head is malformed");
    };
    if status == 101 {
        return ParsedResponse::Bad("the sandbox switched protocols without being asked to");
    }
    if status < 200 {
        return ParsedResponse::Bad("the node sent an informational answer");
    }

    // Names a `Connection` header lists are this hop's too.
    let mut reusable = version == 1;
    let mut named: Vec<&str> = Vec::new();
    for h in resp.headers.iter().filter(|h| is(h.name, "connection")) {
        for token in visible(h.value).unwrap_or("").split(',') {
            let token = token.trim();
            if token.eq_ignore_ascii_case("close") {
                reusable = false;
            } else if token.eq_ignore_ascii_case("keep-alive") {
                reusable = reusable || version == 0;
            } else if !token.is_empty() {
                named.push(token);
            }
        }
    }

    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    let mut code = itoa::Buffer::new();
    out.extend_from_slice(code.format(status).as_bytes());
    out.push(b' ');
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason());
    out.extend_from_slice(reason.unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");

    let (mut length, mut chunked, mut not_hosted) = (None, false, false);
    for h in resp.headers.iter() {
        let (name, value) = (h.name, h.value);
        if is(name, "content-length") {
            if length.is_some() {
                return ParsedResponse::Bad("the node's answer has two lengths");
            }
            let Some(n) = content_length(value) else {
                return ParsedResponse::Bad("the node's answer has an invalid length");
            };
            length = Some(n);
        } else if is(name, "transfer-encoding") {
            if chunked || !value.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return ParsedResponse::Bad("the node's answer has an unsupported transfer coding");
            }
            chunked = true;
            // Written again below, only when the body is passed on chunked.
            continue;
        } else if is(name, ROUTE) {
            not_hosted = value
                .trim_ascii()
                .eq_ignore_ascii_case(ROUTE_NOT_FOUND.as_bytes());
            continue;
        } else if is_hop_by_hop_str(name)
            || named.iter().any(|n| n.eq_ignore_ascii_case(name))
            || is_internal(name)
        {
            continue;
        }
        push_header(out, name.as_bytes(), value);
    }
    if chunked && length.is_some() {
        return ParsedResponse::Bad("the node's answer has both a length and a transfer coding");
    }
    let framing = if is_head || status == 204 || status == 304 {
        Framing::Empty
    } else if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        reusable = false;
        Framing::Close
    };
    if close || framing == Framing::Close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    ParsedResponse::Response(Response {
        status,
        head_len,
        framing,
        reusable,
        not_hosted: status == 404 && not_hosted,
    })
}

/// Follows a chunked body as it passes, to find where it ends.
#[derive(Debug, Default)]
pub(super) struct Chunked {
    state: Chunk,
    size: u64,
    digits: u8,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Hex digits of a chunk's size.
    #[default]
    Size,
    /// A chunk extension, up to its CR.
    Extension,
    /// The LF after a size line.
    SizeLf,
    /// A chunk's data.
    Data,
    DataCr,
    DataLf,
    /// The start of a trailer line (or of the final CRLF).
    TrailerStart,
    /// Inside a trailer field line.
    Trailer,
    TrailerLf,
    /// The final LF.
    EndLf,
}

/// A chunked body that does not follow RFC 9112 §7.1.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BadChunk;

impl Chunked {
    /// Feeds the next bytes; `Some(n)` when the body ended after the
    /// first `n` of them.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, BadChunk> {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            match self.state {
                Chunk::Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if self.digits == 15 {
                            return Err(BadChunk);
                        }
                        let d = (b as char).to_digit(16).ok_or(BadChunk)?;
                        self.size = self.size * 16 + u64::from(d);
                        self.digits += 1;
                    }
                    b';' if self.digits > 0 => self.state = Chunk::Extension,
                    b'\r' if self.digits > 0 => self.state = Chunk::SizeLf,
                    _ => return Err(BadChunk),
                },
                Chunk::Extension => match b {
                    b'\r' => self.state = Chunk::SizeLf,
                    b'\n' => return Err(BadChunk),
                    _ => {}
                },
                Chunk::SizeLf => {
                    if b != b'\n' {
                        return Err(BadChunk);
                    }
                    self.state = if self.size == 0 {
                        Chunk::TrailerStart
                    } else {
                        Chunk::Data
                    };
                }
                Chunk::Data => {
                    let n = (bytes.len() - i).min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.state = Chunk::DataCr;
                    }
                    continue;
                }
                Chunk::DataCr if b == b'\r' => self.state = Chunk::DataLf,
                Chunk::DataLf if b == b'\n' => {
                    self.state = Chunk::Size;
                    self.digits = 0;
                }
                Chunk::DataCr | Chunk::DataLf => return Err(BadChunk),
                Chunk::TrailerStart => match b {
                    b'\r' => self.state = Chunk::EndLf,
                    b'\n' => return Err(BadChunk),
                    _ => self.state = Chunk::Trailer,
                },
                Chunk::Trailer => match b {
                    b'\r' => self.state = Chunk::TrailerLf,
                    b'\n' => return Err(BadChunk),
                    _ => {}
                },
                Chunk::TrailerLf if b == b'\n' => self.state = Chunk::TrailerStart,
                Chunk::TrailerLf => return Err(BadChunk),
                Chunk::EndLf if b == b'\n' => return Ok(Some(i + 1)),
                Chunk::EndLf => return Err(BadChunk),
            }
            i += 1;
        }
        Ok(None)
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
