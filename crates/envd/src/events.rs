//! envd's own log: what E2B's sandbox logs show of envd (its start, each
//! process it starts and how each ends, the template's start command),
//! as structured entries in a bounded ring the node reads
//! (`GET /warren/logs?after=N`, with the access token).
//!
//! Every entry gets a sequence number from 0; the answer carries this
//! envd's `instance` (random, per start), so a reader that sees another
//! instance (envd started again: a filesystem-only pause's boot) starts
//! over at 0. The ring keeps the newest [`MAX_ENTRIES`] entries and at most
//! [`MAX_BYTES`] of them; older ones are gone (a reader's `after` below the
//! oldest kept gets what is there, and `dropped` says how many it missed).
//!
//! Entries are about the sandbox's own processes, written by envd, read by
//! the sandbox's own team: nothing here is trusted by the node beyond its
//! bounds (the node caps what it keeps again).

use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// Most entries kept.
pub const MAX_ENTRIES: usize = 1000;
/// Most bytes of entries kept (messages and fields).
pub const MAX_BYTES: usize = 512 * 1024;
/// Most bytes of one message or field value; longer ones are cut.
const MAX_TEXT: usize = 1024;

/// One entry.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub at_ms: i64,
    /// debug, info, warn or error.
    pub level: &'static str,
    /// `envd` or `process`.
    pub logger: &'static str,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

impl Entry {
    fn size(&self) -> usize {
        self.message.len()
            + self
                .fields
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
            + 32
    }
}

/// What `GET /warren/logs?after=N` answers.
#[derive(Debug, Serialize)]
pub struct Page {
    /// This envd's start (random): entries of another instance are another
    /// sequence.
    pub instance: String,
    /// The seq the next entry gets.
    pub next: u64,
    /// Entries at or after `after` that were dropped from the ring first.
    pub dropped: u64,
    pub entries: Vec<Entry>,
}

/// The ring (see the module doc).
#[derive(Debug)]
pub struct EventLog {
    instance: String,
    ring: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    entries: VecDeque<Entry>,
    bytes: usize,
    next: u64,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog::new()
    }
}

fn cut(mut s: String) -> String {
    if s.len() > MAX_TEXT {
        let mut at = MAX_TEXT;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push('…');
    }
    s
}

impl EventLog {
    pub fn new() -> EventLog {
        EventLog {
            instance: warren_core::id::random_token(16),
            ring: Mutex::new(Ring::default()),
        }
    }

    /// Adds an entry now.
    pub fn record(
        &self,
        level: &'static str,
        logger: &'static str,
        message: impl Into<String>,
        fields: impl IntoIterator<Item = (&'static str, String)>,
    ) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let entry = Entry {
            seq: ring.next,
            at_ms: warren_core::time::now_ms(),
            level,
            logger,
            message: cut(message.into()),
            fields: fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), cut(v)))
                .collect(),
        };
        ring.next += 1;
        ring.bytes += entry.size();
        ring.entries.push_back(entry);
        while ring.entries.len() > MAX_ENTRIES || ring.bytes > MAX_BYTES {
            match ring.entries.pop_front() {
                Some(old) => ring.bytes -= old.size(),
                None => break,
            }
        }
    }

    /// The entries from seq `after` on.
    pub fn page(&self, after: u64) -> Page {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let oldest = ring.entries.front().map_or(ring.next, |e| e.seq);
        Page {
            instance: self.instance.clone(),
            next: ring.next,
            dropped: oldest.saturating_sub(after),
            entries: ring
                .entries
                .iter()
                .filter(|e| e.seq >= after)
                .cloned()
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_ring_read_from_a_cursor() {
        let log = EventLog::new();
        for i in 0..(MAX_ENTRIES + 5) {
            log.record("info", "process", format!("p{i}"), [("pid", i.to_string())]);
        }
        let all = log.page(0);
        assert_eq!(all.entries.len(), MAX_ENTRIES);
        assert_eq!(all.dropped, 5);
        assert_eq!(all.next, (MAX_ENTRIES + 5) as u64);
        assert_eq!(all.entries[0].message, "p5");
        let tail = log.page(all.next - 2);
        assert_eq!(tail.entries.len(), 2);
        assert_eq!(tail.dropped, 0);
        assert_eq!(tail.instance, all.instance);
        // Long text is cut; the ring's bytes stay bounded.
        log.record("warn", "envd", "x".repeat(10_000), []);
        let last = log.page(log.page(0).next - 1);
        assert!(last.entries[0].message.len() <= MAX_TEXT + 3);
    }
}
