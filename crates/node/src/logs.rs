//! Each hosted sandbox's log (E2B's sandbox logs): envd's own entries
//! (its start, processes started and ended, the start command: envd keeps
//! them in a ring, `GET /warren/logs?after=N`) and the node's lifecycle
//! entries (created, paused, resumed, killed), bounded per sandbox.
//!
//! Where they live: on the sandbox's node while it runs or is paused (here,
//! in memory, read from envd on demand: when the gateway asks, before a
//! pause freezes envd, and at the end); once it ends, in the scheduler's
//! store, carried by the DELETE report that removes its binding (this
//! node's, or the gateway's, which got them in the delete's answer), so any
//! gateway answers them after the sandbox, and this node, are gone.
//!
//! envd's answers are the sandbox's: a sandbox's root can make envd say
//! anything, or nothing. So every answer is bounded here again (entries,
//! bytes, the time a read may take) and only ever lands in that sandbox's
//! own log.

use crate::envd;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warren_core::node_api::SandboxLogEntry;

/// What one sandbox's log may hold.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Most entries kept; the oldest go first (`--sandbox-log-entries`).
    pub entries: usize,
    /// Most bytes of entries kept (`--sandbox-log-bytes`).
    pub bytes: usize,
}

/// Most bytes of one message, logger or field envd's answer may carry
/// into the log.
const MAX_TEXT: usize = 4096;
/// Most fields of one entry.
const MAX_FIELDS: usize = 32;
/// Most bytes of one envd answer.
const MAX_ANSWER: usize = 2 << 20;

fn size(e: &SandboxLogEntry) -> usize {
    e.level.len()
        + e.logger.len()
        + e.message.len()
        + e.fields
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + 32
}

fn cut(s: &str) -> String {
    let mut at = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s[..at].to_string()
}

/// One sandbox's log.
#[derive(Debug, Default)]
struct Book {
    entries: VecDeque<SandboxLogEntry>,
    bytes: usize,
    /// envd's instance and the next seq to ask it for.
    envd_instance: String,
    envd_next: u64,
}

impl Book {
    fn push(&mut self, e: SandboxLogEntry, b: Bounds) {
        self.bytes += size(&e);
        self.entries.push_back(e);
        while self.entries.len() > b.entries || self.bytes > b.bytes {
            match self.entries.pop_front() {
                Some(old) => self.bytes -= size(&old),
                None => break,
            }
        }
    }
}

/// envd's `GET /warren/logs` answer (`warren_envd::events::Page`).
#[derive(Debug, serde::Deserialize)]
struct Page {
    instance: String,
    next: u64,
    #[serde(default)]
    dropped: u64,
    entries: Vec<EnvdEntry>,
}

#[derive(Debug, serde::Deserialize)]
struct EnvdEntry {
    seq: u64,
    at_ms: i64,
    level: String,
    logger: String,
    message: String,
    #[serde(default)]
    fields: BTreeMap<String, String>,
}

/// Every hosted sandbox's log, by sandbox id.
#[derive(Debug)]
pub struct LogBooks {
    bounds: Bounds,
    books: Mutex<HashMap<String, Arc<Mutex<Book>>>>,
}

impl LogBooks {
    pub fn new(bounds: Bounds) -> LogBooks {
        LogBooks {
            bounds,
            books: Mutex::new(HashMap::new()),
        }
    }

    fn book(&self, id: &str) -> Arc<Mutex<Book>> {
        let mut books = self.books.lock().unwrap_or_else(|p| p.into_inner());
        books.entry(id.to_string()).or_default().clone()
    }

    /// Adds one of the node's own entries (logger `node`) to `id`'s log.
    pub fn node(
        &self,
        id: &str,
        level: &str,
        message: &str,
        fields: impl IntoIterator<Item = (&'static str, String)>,
    ) {
        let e = SandboxLogEntry {
            at_ms: warren_core::time::now_ms(),
            level: level.to_string(),
            logger: "node".to_string(),
            message: message.to_string(),
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), cut(&v)))
                .collect(),
        };
        let book = self.book(id);
        let mut b = book.lock().unwrap_or_else(|p| p.into_inner());
        b.push(e, self.bounds);
    }

    /// Reads what envd (its API socket `sock`, with `token`) has written
    /// since the last read into `id`'s log, within `within`. A failure (envd
    /// frozen, gone, or not answering) is logged and leaves the log as it
    /// was: the caller answers what is there.
    pub async fn refresh(&self, id: &str, sock: &Path, token: Option<&str>, within: Duration) {
        let book = self.book(id);
        let after = {
            let b = book.lock().unwrap_or_else(|p| p.into_inner());
            b.envd_next
        };
        let path = format!("/warren/logs?after={after}");
        let answer =
            tokio::time::timeout(within, envd::get_bounded(sock, &path, token, MAX_ANSWER));
        let page = match answer.await {
            Ok(Ok((status, body))) if status.is_success() => {
                match serde_json::from_slice::<Page>(&body) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!(sandbox_id = id, error = %e, "envd's log answer is not a log page");
                        return;
                    }
                }
            }
            Ok(Ok((status, _))) => {
                tracing::debug!(sandbox_id = id, %status, "envd did not answer its log");
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(sandbox_id = id, error = %e, "cannot read envd's log");
                return;
            }
            Err(_) => {
                tracing::debug!(
                    sandbox_id = id,
                    ?within,
                    "envd's log did not answer in time"
                );
                return;
            }
        };
        let mut b = book.lock().unwrap_or_else(|p| p.into_inner());
        // Another envd (booted again after a filesystem-only pause): its
        // entries count from 0.
        let from = if page.instance == b.envd_instance {
            b.envd_next
        } else {
            0
        };
        if page.dropped > 0 && page.instance == b.envd_instance {
            b.push(
                SandboxLogEntry {
                    at_ms: warren_core::time::now_ms(),
                    level: "warn".into(),
                    logger: "node".into(),
                    message: format!(
                        "{} entries of envd's log were dropped before they were read",
                        page.dropped
                    ),
                    fields: BTreeMap::new(),
                },
                self.bounds,
            );
        }
        for e in page.entries.into_iter().filter(|e| e.seq >= from) {
            let level = match e.level.as_str() {
                "debug" | "info" | "warn" | "error" => e.level,
                _ => "info".into(),
            };
            b.push(
                SandboxLogEntry {
                    at_ms: e.at_ms.max(0),
                    level,
                    logger: cut(&e.logger),
                    message: cut(&e.message),
                    fields: e
                        .fields
                        .iter()
                        .take(MAX_FIELDS)
                        .map(|(k, v)| (cut(k), cut(v)))
                        .collect(),
                },
                self.bounds,
            );
        }
        b.envd_instance = page.instance;
        b.envd_next = page.next;
    }

    /// `id`'s log now, oldest first.
    pub fn entries(&self, id: &str) -> Vec<SandboxLogEntry> {
        let book = self.book(id);
        let b = book.lock().unwrap_or_else(|p| p.into_inner());
        in_time_order(&b)
    }

    /// Forgets `id`'s log, answering it (the sandbox ended).
    pub fn take(&self, id: &str) -> Vec<SandboxLogEntry> {
        let book = {
            let mut books = self.books.lock().unwrap_or_else(|p| p.into_inner());
            books.remove(id)
        };
        match book {
            Some(book) => {
                let b = book.lock().unwrap_or_else(|p| p.into_inner());
                in_time_order(&b)
            }
            None => Vec::new(),
        }
    }
}

/// A log's entries by time: envd's are read after the node wrote its own
/// of the same moments (a create's, a pause's), so the book holds them out
/// of order. Stable: entries of one millisecond keep their order.
fn in_time_order(b: &Book) -> Vec<SandboxLogEntry> {
    let mut out: Vec<SandboxLogEntry> = b.entries.iter().cloned().collect();
    out.sort_by_key(|e| e.at_ms);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_book_keeps_its_bounds() {
        let books = LogBooks::new(Bounds {
            entries: 3,
            bytes: 1 << 20,
        });
        for i in 0..5 {
            books.node("s1", "info", &format!("e{i}"), [("i", i.to_string())]);
        }
        let kept = books.entries("s1");
        assert_eq!(
            kept.iter().map(|e| e.message.as_str()).collect::<Vec<_>>(),
            ["e2", "e3", "e4"]
        );
        assert_eq!(kept[0].logger, "node");
        assert_eq!(books.take("s1").len(), 3);
        assert!(books.entries("s1").is_empty(), "taken, then empty");
        let small = LogBooks::new(Bounds {
            entries: 100,
            bytes: 200,
        });
        for _ in 0..10 {
            small.node("s2", "info", &"x".repeat(60), []);
        }
        assert!(small.entries("s2").len() < 10);
    }
}
