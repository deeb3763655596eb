//! What a sandbox's connection names, read from its first bytes without
//! consuming them: the server name of a TLS ClientHello (SNI), or the
//! `Host` of a plain HTTP/1.x request head. Everything here parses bytes
//! the sandbox wrote: every length is checked against what is there, and
//! anything that does not parse names nothing.

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A TLS ClientHello, with its server name if it sent one.
    Tls(Option<String>),
    /// A plain HTTP/1.x request head, with its `Host` (port removed).
    Http(Option<String>),
    /// Something else: spliced as it is.
    Other,
}

/// Whether `buf` holds enough to decide (`Some`), or more bytes may change
/// the answer (`None`).
pub fn parse(buf: &[u8]) -> Option<Hello> {
    match buf.first()? {
        0x16 => tls(buf),
        b'A'..=b'Z' => http(buf),
        _ => Some(Hello::Other),
    }
}

/// Most bytes read before giving up on finding a name: a ClientHello
/// record is at most 16 KiB plus its header; a request head past 8 KiB is
/// not one the proxy reads a name from.
pub const MAX_PEEK: usize = 16 * 1024 + 5;

fn tls(buf: &[u8]) -> Option<Hello> {
    if buf.len() < 5 {
        return None;
    }
    // Record: type 22 (handshake), version 3.x, length.
    if buf[1] != 3 {
        return Some(Hello::Other);
    }
    let len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if len > 16 * 1024 {
        return Some(Hello::Other);
    }
    if buf.len() < 5 + len {
        return None;
    }
    let body = &buf[5..5 + len];
    Some(Hello::Tls(client_hello_sni(body)))
}

/// A cursor over bytes that never reads past their end.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

/// The `server_name` of a ClientHello in a handshake record's body (one
/// that fits the first record; a hello split across records names
/// nothing).
fn client_hello_sni(body: &[u8]) -> Option<String> {
    let mut c = Cur(body);
    if c.u8()? != 1 {
        return None;
    }
    let n = c.u24()?;
    let hello = c.take(n)?;
    let mut c = Cur(hello);
    c.take(2 + 32)?; // version, random
    let sid = c.u8()?;
    c.take(sid)?;
    let suites = c.u16()?;
    c.take(suites)?;
    let comp = c.u8()?;
    c.take(comp)?;
    let ext_len = c.u16()?;
    let mut exts = Cur(c.take(ext_len)?);
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let n = exts.u16()?;
        let data = exts.take(n)?;
        if kind != 0 {
            continue;
        }
        let mut names = Cur(data);
        let n = names.u16()?;
        let mut list = Cur(names.take(n)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let n = list.u16()?;
            let name = list.take(n)?;
            if name_type == 0 {
                return host_name(name);
            }
        }
    }
    None
}

/// A host name as the proxy compares it: ASCII letters, digits, `-`, `_`
/// and `.`, lower-cased, without a trailing dot.
fn host_name(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?;
    let s = s.trim_end_matches('.');
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    ok.then(|| s.to_ascii_lowercase())
}

/// The `Host` of an HTTP/1.x request head (`None` until the head is
/// complete or 8 KiB long).
fn http(buf: &[u8]) -> Option<Hello> {
    const MAX_HEAD: usize = 8 * 1024;
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let head = match head_end {
        Some(end) => &buf[..end],
        None if buf.len() >= MAX_HEAD => return Some(Hello::Http(None)),
        None => {
            // A request line that is plainly not HTTP decides at once.
            if let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") {
                if !is_request_line(&buf[..line_end]) {
                    return Some(Hello::Other);
                }
            }
            return None;
        }
    };
    let mut lines = head.split(|b| *b == b'\n');
    let first = lines.next().unwrap_or_default();
    if !is_request_line(first.strip_suffix(b"\r").unwrap_or(first)) {
        return Some(Hello::Other);
    }
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        if line[..colon].eq_ignore_ascii_case(b"host") {
            let value = std::str::from_utf8(&line[colon + 1..]).ok()?.trim();
            return Some(Hello::Http(host_of_authority(value)));
        }
    }
    Some(Hello::Http(None))
}

fn is_request_line(line: &[u8]) -> bool {
    let s = String::from_utf8_lossy(line);
    let mut parts = s.split(' ');
    let method = parts.next().unwrap_or("");
    let _target = parts.next();
    let version = parts.next().unwrap_or("");
    !method.is_empty()
        && method.bytes().all(|b| b.is_ascii_uppercase())
        && version.starts_with("HTTP/1.")
}

/// The host of a `Host` header or `:authority` (`[::1]:80` → `::1`,
/// `a.com:8080` → `a.com`), checked as a host name or IP address.
pub fn host_of_authority(authority: &str) -> Option<String> {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next()?
    } else {
        authority.split(':').next()?
    };
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Some(ip.to_string());
    }
    host_name(host.as_bytes())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A ClientHello as rustls writes it, for `name`.
    fn hello(name: &str) -> Vec<u8> {
        use std::io::Write;
        let roots = rustls::RootCertStore::empty();
        let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut conn = rustls::ClientConnection::new(
            std::sync::Arc::new(cfg),
            name.to_string().try_into().unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out.flush().unwrap();
        out
    }

    #[test]
    fn sni_is_read_from_a_real_client_hello() {
        let h = hello("API.Example.com");
        assert_eq!(parse(&h), Some(Hello::Tls(Some("api.example.com".into()))));
        // Not yet complete: undecided.
        assert_eq!(parse(&h[..h.len() - 1]), None);
        assert_eq!(parse(&h[..3]), None);
        // An IP address is sent without SNI.
        assert_eq!(parse(&hello("10.0.0.1")), Some(Hello::Tls(None)));
    }

    #[test]
    fn garbage_names_nothing_and_never_panics() {
        let h = hello("a.example.com");
        for cut in 5..h.len() {
            let mut g = h.clone();
            g[cut] ^= 0xff;
            let _ = parse(&g);
            let _ = parse(&h[..cut]);
        }
        assert_eq!(
            parse(b"\x16\x03\x01\x00\x05\x01\xff\xff\xff\xff"),
            Some(Hello::Tls(None))
        );
        assert_eq!(parse(b"SSH-2.0-OpenSSH\r\n"), Some(Hello::Other));
        assert_eq!(parse(b"\x00\x01"), Some(Hello::Other));
    }

    #[test]
    fn http_hosts_are_read_from_the_head() {
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nUser-Agent: x\r\nhost: Api.Example.com:8080\r\n\r\n"),
            Some(Hello::Http(Some("api.example.com".into())))
        );
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: a.com"), None);
        assert_eq!(parse(b"GET / HTTP/1.0\r\n\r\n"), Some(Hello::Http(None)));
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Some(Hello::Http(Some("::1".into())))
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n"),
            Some(Hello::Http(None))
        );
        assert_eq!(parse(b"HELLO world\r\n"), Some(Hello::Other));
    }
}
