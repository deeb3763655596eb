//! A process's output log: the last N bytes of stdout and stderr together,
//! in the order envd read them, addressed by absolute byte offsets.
//!
//! Offset 0 is the first byte the process ever wrote (to either stream);
//! offsets keep counting when old bytes are evicted, so a client that saw
//! bytes `[0, n)` asks to resume at `n` and gets exactly what it missed, each
//! chunk still labelled stdout or stderr.

use bytes::Bytes;
use std::collections::VecDeque;

/// Which pipe a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipe {
    /// The process's stdout.
    Stdout,
    /// The process's stderr.
    Stderr,
    /// The terminal of a PTY process (its only output).
    Pty,
}

/// One read from a pipe, at its absolute offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Absolute offset of `data[0]`.
    pub offset: u64,
    /// The pipe it came from.
    pub pipe: Pipe,
    /// The bytes.
    pub data: Bytes,
}

/// A resume point that is no longer (or not yet) in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffsetError {
    /// Older than what is retained.
    #[error("offset {requested} is no longer retained; the oldest retained offset is {oldest}")]
    Evicted {
        /// What the client asked for.
        requested: u64,
        /// The oldest offset still in the log.
        oldest: u64,
    },
    /// Past the end of what the process has written.
    #[error("offset {requested} is past the end of the output ({end} bytes so far)")]
    Beyond {
        /// What the client asked for.
        requested: u64,
        /// The offset the next byte will get.
        end: u64,
    },
}

/// The bounded output log of one process.
#[derive(Debug)]
pub struct OutputLog {
    chunks: VecDeque<Chunk>,
    /// Bytes held in `chunks`.
    retained: usize,
    /// The most bytes kept; older ones are evicted first.
    max: usize,
    /// The offset the next byte will get.
    end: u64,
}

impl OutputLog {
    /// An empty log keeping at most `max` bytes (at least 1).
    pub fn new(max: usize) -> OutputLog {
        OutputLog {
            chunks: VecDeque::new(),
            retained: 0,
            max: max.max(1),
            end: 0,
        }
    }

    /// The offset of the oldest retained byte (== `end()` when empty).
    pub fn start(&self) -> u64 {
        self.chunks.front().map_or(self.end, |c| c.offset)
    }

    /// The most bytes it keeps.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The offset the next byte will get: the total bytes ever written.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Appends what was read from `pipe`, evicting the oldest bytes beyond
    /// the bound (a chunk can be cut part-way, so the bound is exact).
    pub fn push(&mut self, pipe: Pipe, data: Bytes) {
        self.push_keeping(pipe, data, u64::MAX);
    }

    /// Like [`push`](Self::push), but never evicts bytes at or after
    /// `keep_from` (what an attached stream has not sent yet); the log may
    /// then hold more than its bound until that stream moves on.
    pub fn push_keeping(&mut self, pipe: Pipe, data: Bytes, keep_from: u64) {
        if data.is_empty() {
            return;
        }
        let len = data.len();
        self.chunks.push_back(Chunk {
            offset: self.end,
            pipe,
            data,
        });
        self.end += len as u64;
        self.retained += len;
        self.trim(keep_from);
    }

    /// Evicts the oldest bytes beyond the bound, but none at or after
    /// `keep_from`. Called again when the stream holding them moves on.
    pub fn trim(&mut self, keep_from: u64) {
        while self.retained > self.max {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            if front.offset >= keep_from {
                break;
            }
            let evictable = (keep_from - front.offset).min(usize::MAX as u64) as usize;
            let cut = (self.retained - self.max).min(evictable);
            if front.data.len() <= cut {
                self.retained -= front.data.len();
                self.chunks.pop_front();
            } else {
                front.data = front.data.slice(cut..);
                front.offset += cut as u64;
                self.retained -= cut;
            }
        }
    }

    /// The chunks from `from` on, at most about `limit` bytes (at least one
    /// chunk when any is there), the first one cut to start exactly at `from`.
    pub fn read_from(&self, from: u64, limit: usize) -> Result<Vec<Chunk>, OffsetError> {
        self.check(from)?;
        let first = self
            .chunks
            .partition_point(|c| c.offset + c.data.len() as u64 <= from);
        let mut out = Vec::new();
        let mut taken = 0usize;
        for c in self.chunks.range(first..) {
            if taken >= limit && !out.is_empty() {
                break;
            }
            let skip = from.saturating_sub(c.offset) as usize;
            let data = c.data.slice(skip..);
            taken += data.len();
            out.push(Chunk {
                offset: c.offset + skip as u64,
                pipe: c.pipe,
                data,
            });
        }
        Ok(out)
    }

    /// Whether `from` is a valid resume point now.
    pub fn check(&self, from: u64) -> Result<(), OffsetError> {
        if from < self.start() {
            return Err(OffsetError::Evicted {
                requested: from,
                oldest: self.start(),
            });
        }
        if from > self.end {
            return Err(OffsetError::Beyond {
                requested: from,
                end: self.end,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn concat(chunks: &[Chunk]) -> Vec<u8> {
        chunks.iter().flat_map(|c| c.data.iter().copied()).collect()
    }

    #[test]
    fn replays_from_any_offset_with_pipe_labels() {
        let mut log = OutputLog::new(1024);
        log.push(Pipe::Stdout, Bytes::from_static(b"hello "));
        log.push(Pipe::Stderr, Bytes::from_static(b"oops "));
        log.push(Pipe::Stdout, Bytes::from_static(b"world"));
        assert_eq!(log.end(), 16);
        let all = log.read_from(0, usize::MAX).expect("from 0");
        assert_eq!(concat(&all), b"hello oops world");
        let mid = log.read_from(8, usize::MAX).expect("from 8");
        assert_eq!(mid[0].pipe, Pipe::Stderr);
        assert_eq!(mid[0].offset, 8);
        assert_eq!(concat(&mid), b"ps world");
        assert!(log.read_from(16, usize::MAX).expect("at end").is_empty());
        assert_eq!(
            log.read_from(17, 1),
            Err(OffsetError::Beyond {
                requested: 17,
                end: 16
            })
        );
    }

    #[test]
    fn evicts_oldest_bytes_exactly_at_the_bound() {
        let mut log = OutputLog::new(10);
        log.push(Pipe::Stdout, Bytes::from_static(b"0123456789"));
        log.push(Pipe::Stderr, Bytes::from_static(b"abcd"));
        assert_eq!(log.start(), 4);
        assert_eq!(log.end(), 14);
        assert_eq!(
            concat(&log.read_from(4, usize::MAX).expect("oldest")),
            b"456789abcd"
        );
        assert_eq!(
            log.read_from(3, usize::MAX),
            Err(OffsetError::Evicted {
                requested: 3,
                oldest: 4
            })
        );
        // One chunk larger than the whole bound keeps only its tail.
        log.push(Pipe::Stdout, Bytes::from_static(b"ABCDEFGHIJKLMNOP"));
        assert_eq!(log.start(), 20);
        assert_eq!(
            concat(&log.read_from(20, usize::MAX).expect("tail")),
            b"GHIJKLMNOP"
        );
    }

    #[test]
    fn bytes_a_stream_still_needs_are_kept_past_the_bound() {
        let mut log = OutputLog::new(10);
        log.push_keeping(Pipe::Stdout, Bytes::from_static(b"0123456789abcdef"), 0);
        assert_eq!(log.start(), 0, "nothing sent yet, nothing evicted");
        log.push_keeping(Pipe::Stdout, Bytes::from_static(b"XY"), 12);
        assert_eq!(log.start(), 8, "evicted down to the bound");
        log.push_keeping(Pipe::Stdout, Bytes::from_static(b"Z"), 6);
        assert_eq!(
            log.start(),
            8,
            "never past the bound and never evicting kept bytes"
        );
    }

    #[test]
    fn read_limit_returns_whole_chunks_but_at_least_one() {
        let mut log = OutputLog::new(1024);
        for _ in 0..4 {
            log.push(Pipe::Stdout, Bytes::from_static(b"xxxx"));
        }
        assert_eq!(log.read_from(0, 1).expect("one").len(), 1);
        assert_eq!(log.read_from(0, 8).expect("two").len(), 2);
    }
}
