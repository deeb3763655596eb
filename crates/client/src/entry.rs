//! The entry points a client may use, and the order it tries them in.
//!
//! Calls start at the next entry point in round-robin order (so load spreads
//! when all are healthy) and fail over to the following ones in turn.

use crate::error::ClientError;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One entry point: a gateway or a load balancer in front of gateways.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// `http://host:port`, no trailing slash.
    pub base: String,
    /// `host:port`, for messages and reports.
    pub label: String,
}

/// The configured entry points and the round-robin cursor.
#[derive(Debug)]
pub(crate) struct Entries {
    list: Vec<Entry>,
    /// Where the next call starts.
    cursor: AtomicUsize,
}

impl Entries {
    /// Accepts `host:port` or `http://host:port[/]`; at least one.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Entries, ClientError> {
        if entries.is_empty() {
            return Err(ClientError::Invalid("no entry points given".into()));
        }
        let mut list = Vec::with_capacity(entries.len());
        for e in entries {
            let e = e.as_ref().trim().trim_end_matches('/');
            if e.starts_with("https://") {
                return Err(ClientError::Invalid(format!(
                    "{e}: https entry points are not supported; put TLS in a balancer in front"
                )));
            }
            let label = e.strip_prefix("http://").unwrap_or(e).to_string();
            let base = format!("http://{label}");
            let ok = base
                .parse::<http::Uri>()
                .ok()
                .is_some_and(|u| u.host().is_some() && u.path() == "/");
            if label.is_empty() || label.contains('/') || !ok {
                return Err(ClientError::Invalid(format!(
                    "{e:?} is not an entry point (host:port or http://host:port)"
                )));
            }
            list.push(Entry { base, label });
        }
        Ok(Entries {
            list,
            cursor: AtomicUsize::new(0),
        })
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Entry `i` (modulo the count).
    pub fn get(&self, i: usize) -> &Entry {
        &self.list[i % self.list.len()]
    }

    /// The index a new call starts at (advances the round robin).
    pub fn start(&self) -> usize {
        self.cursor.fetch_add(1, Ordering::Relaxed) % self.list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_parse_and_rotate() {
        let e = Entries::parse(&["127.0.0.1:1", "http://127.0.0.1:2/"]).expect("valid");
        assert_eq!(e.get(0).base, "http://127.0.0.1:1");
        assert_eq!(e.get(1).label, "127.0.0.1:2");
        assert_eq!(e.get(3).label, "127.0.0.1:2");
        assert_eq!((e.start(), e.start(), e.start()), (0, 1, 0));
    }

    #[test]
    fn bad_entry_points_are_refused() {
        assert!(Entries::parse::<&str>(&[]).is_err());
        assert!(Entries::parse(&["https://x:1"]).is_err());
        assert!(Entries::parse(&["http://x:1/api"]).is_err());
        assert!(Entries::parse(&[""]).is_err());
    }
}
