//! A sandbox's console: what its first processes (the holder, the
//! launcher, pid 1, envd) write on stdout and stderr reaches the node
//! through pipes, never a host file or terminal, and the node puts it in
//! its own log one line at a time, labelled with the sandbox and the
//! stream, bounded, and with every control character escaped.
//!
//! The sandbox's root can write to those pipes too (they are envd's
//! descriptors), so everything here treats the bytes as hostile:
//! - a line is at most [`MAX_LINE`] bytes (the rest is cut, and said so);
//! - each sandbox has a budget of [`BURST`] bytes, refilled at
//!   [`REFILL_PER_SEC`] bytes a second: past it, lines are dropped and
//!   counted, and one warning says how much once the budget is back;
//! - control characters (escape sequences that would drive the operator's
//!   terminal, forged newlines) are written as `\u{..}` escapes;
//! - the pipe is always drained, so a writer never blocks on the node.
//!
//! Lines go to the `warren_node::sandbox_output` target at INFO, with
//! `sandbox` and `stream` fields. slirp4netns's stderr comes the same way
//! (`stream="slirp4netns"`, and its nftables table for `sandbox`): it
//! parses the sandbox's packets, so what it says is the sandbox's too.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::time::Instant;

/// The longest line kept; the rest of it is dropped.
pub const MAX_LINE: usize = 2048;
/// Bytes a sandbox may log at once.
pub const BURST: f64 = 256.0 * 1024.0;
/// Bytes a second its budget grows by, up to [`BURST`].
pub const REFILL_PER_SEC: f64 = 4096.0;

/// Reads `pipe` until every writer has closed it, logging its lines as
/// `stream` of `sandbox` (see the module doc). Runs as its own task.
pub fn relay<R>(sandbox: &str, stream: &'static str, pipe: R)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let sandbox = sandbox.to_string();
    tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(MAX_LINE, pipe);
        let mut budget = Budget::new(Instant::now());
        let mut line = Vec::with_capacity(256);
        loop {
            let (done, cut) = match read_line(&mut reader, &mut line).await {
                Ok(r) => r,
                Err(_) => return,
            };
            if !line.is_empty() || cut {
                let cost = line.len().max(1);
                match budget.take(cost, Instant::now()) {
                    Take::Ok { dropped } => {
                        if dropped > 0 {
                            tracing::warn!(
                                target: "warren_node::sandbox_output",
                                sandbox = %sandbox,
                                stream,
                                dropped_bytes = dropped,
                                "sandbox output over its budget ({BURST} bytes, then \
                                 {REFILL_PER_SEC} a second): dropped {dropped} bytes"
                            );
                        }
                        let text = escape(&line);
                        let cut = if cut { " [line cut]" } else { "" };
                        tracing::info!(
                            target: "warren_node::sandbox_output",
                            sandbox = %sandbox,
                            stream,
                            "{text}{cut}"
                        );
                    }
                    Take::Dropped => {}
                }
            }
            if done {
                return;
            }
        }
    });
}

/// Reads one line (without its newline) into `line`, keeping at most
/// [`MAX_LINE`] bytes and discarding the rest of a longer one. Returns
/// (end of the pipe, the line was cut).
async fn read_line<R: AsyncRead + Unpin>(
    reader: &mut BufReader<R>,
    line: &mut Vec<u8>,
) -> std::io::Result<(bool, bool)> {
    line.clear();
    let mut cut = false;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok((true, cut));
        }
        let (chunk, used, end) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], i + 1, true),
            None => (buf, buf.len(), false),
        };
        let room = MAX_LINE - line.len();
        if chunk.len() > room {
            cut = true;
        }
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        reader.consume(used);
        if end {
            return Ok((false, cut));
        }
    }
}

/// Every control character of `bytes` (as lossy UTF-8) escaped.
fn escape(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::with_capacity(text.len());
    for c in text.trim_end_matches('\r').chars() {
        if c.is_control() && c != '\t' {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A token bucket of bytes.
struct Budget {
    tokens: f64,
    at: Instant,
    dropped: u64,
}

enum Take {
    /// Logged; `dropped` bytes were dropped before it (to say once).
    Ok {
        dropped: u64,
    },
    Dropped,
}

impl Budget {
    fn new(now: Instant) -> Budget {
        Budget {
            tokens: BURST,
            at: now,
            dropped: 0,
        }
    }

    fn take(&mut self, bytes: usize, now: Instant) -> Take {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * REFILL_PER_SEC).min(BURST);
        self.at = now;
        let bytes = bytes as f64;
        if self.tokens < bytes {
            self.dropped += bytes as u64;
            return Take::Dropped;
        }
        self.tokens -= bytes;
        Take::Ok {
            dropped: std::mem::take(&mut self.dropped),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(
            escape(b"\x1b]0;owned\x07 ok\ttab\r"),
            "\\u{1b}]0;owned\\u{7} ok\ttab"
        );
        assert_eq!(escape(b"bad \xff utf8"), "bad \u{fffd} utf8");
    }

    #[test]
    fn the_budget_drops_past_its_burst_and_refills() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        assert!(matches!(
            b.take(BURST as usize, t0),
            Take::Ok { dropped: 0 }
        ));
        assert!(matches!(b.take(100, t0), Take::Dropped));
        assert!(matches!(b.take(50, t0), Take::Dropped));
        let later = t0 + Duration::from_secs(1);
        assert!(matches!(b.take(100, later), Take::Ok { dropped: 150 }));
        assert!(matches!(b.take(100, later), Take::Ok { dropped: 0 }));
    }

    #[tokio::test]
    async fn long_lines_are_cut_and_the_pipe_drained() {
        let mut input = vec![b'a'; MAX_LINE * 3];
        input.extend_from_slice(b"\nshort\n");
        let mut r = BufReader::with_capacity(64, &input[..]);
        let mut line = Vec::new();
        assert_eq!(read_line(&mut r, &mut line).await.unwrap(), (false, true));
        assert_eq!(line.len(), MAX_LINE);
        assert_eq!(read_line(&mut r, &mut line).await.unwrap(), (false, false));
        assert_eq!(line, b"short");
        assert_eq!(read_line(&mut r, &mut line).await.unwrap(), (true, false));
        assert!(line.is_empty());
    }
}
