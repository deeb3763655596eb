//! Every probe's result, kept in one place so the reports have complete
//! denominators: a probe is recorded when it ends, whatever happened.

use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

/// Which part of the experiment a probe started in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Before the fault.
    Baseline,
    /// From the signal until the replica is restarted.
    Fault,
    /// After the restart.
    Restored,
}

impl Phase {
    pub const ALL: [Phase; 3] = [Phase::Baseline, Phase::Fault, Phase::Restored];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Baseline => "baseline",
            Phase::Fault => "fault",
            Phase::Restored => "restored",
        }
    }
}

/// How a probe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// It did what a user asked.
    Ok,
    /// It was refused with the clear answer for a sandbox that is really
    /// gone (its node was killed): node-down, unreachable, not found. Right,
    /// but not a success.
    Refused,
    /// Anything else: lost, wrong, or timed out.
    Failed,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }
}

/// One probe.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// When it started, in ms since the experiment started.
    pub t_ms: u64,
    /// When it started, in ms since the Unix epoch.
    pub unix_ms: u64,
    pub phase: Phase,
    /// `list`, `command`, `workflow` or `stream`.
    pub kind: String,
    /// The entry point: `l4` or `l7`.
    pub entry: String,
    /// What it aimed at: the node whose sandbox a command probe reads, else empty.
    pub target: String,
    pub outcome: Outcome,
    pub latency_ms: f64,
    /// Why it was not ok (empty when ok).
    pub error: String,
    /// Extra facts (sandbox id, resumes, attempts, ...).
    pub detail: String,
}

/// Collects records; phases are assigned from the fault and restore marks.
pub struct Recorder {
    started: Instant,
    unix0: u64,
    records: Mutex<Vec<Record>>,
    marks: Mutex<(Option<u64>, Option<u64>)>,
}

/// What a probe returns before it is stamped.
pub struct Finished {
    pub outcome: Outcome,
    pub error: String,
    pub detail: String,
}

impl Finished {
    pub fn ok(detail: impl Into<String>) -> Finished {
        Finished {
            outcome: Outcome::Ok,
            error: String::new(),
            detail: detail.into(),
        }
    }

    pub fn failed(error: impl Into<String>, detail: impl Into<String>) -> Finished {
        Finished {
            outcome: Outcome::Failed,
            error: error.into(),
            detail: detail.into(),
        }
    }

    pub fn refused(error: impl Into<String>, detail: impl Into<String>) -> Finished {
        Finished {
            outcome: Outcome::Refused,
            error: error.into(),
            detail: detail.into(),
        }
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            started: Instant::now(),
            unix0: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or_default(),
            records: Mutex::new(Vec::new()),
            marks: Mutex::new((None, None)),
        }
    }

    /// Milliseconds since the experiment started.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// The instant `ms` after the start.
    pub fn instant(&self, ms: u64) -> Instant {
        self.started + Duration::from_millis(ms)
    }

    pub fn mark_fault(&self) -> u64 {
        let t = self.now_ms();
        if let Ok(mut m) = self.marks.lock() {
            m.0 = Some(t);
        }
        t
    }

    pub fn mark_restore(&self) -> u64 {
        let t = self.now_ms();
        if let Ok(mut m) = self.marks.lock() {
            m.1 = Some(t);
        }
        t
    }

    /// `(fault, restore)` in ms since the start.
    pub fn marks(&self) -> (Option<u64>, Option<u64>) {
        self.marks.lock().map(|m| *m).unwrap_or((None, None))
    }

    fn phase_at(&self, t_ms: u64) -> Phase {
        match self.marks() {
            (_, Some(r)) if t_ms >= r => Phase::Restored,
            (Some(f), _) if t_ms >= f => Phase::Fault,
            _ => Phase::Baseline,
        }
    }

    /// Records a probe that started at `t_ms` and took `latency`; returns its
    /// index. A probe belongs to the phase it *ended* in (one in flight when
    /// the signal went out saw the fault), except streams, which span every
    /// phase and are filed under the one they started in.
    pub fn push(
        &self,
        kind: &str,
        entry: &str,
        target: &str,
        t_ms: u64,
        latency: Duration,
        f: Finished,
    ) -> usize {
        let at = if kind == "stream" {
            t_ms
        } else {
            t_ms + latency.as_millis() as u64
        };
        let record = Record {
            t_ms,
            unix_ms: self.unix0 + t_ms,
            phase: self.phase_at(at),
            kind: kind.to_string(),
            entry: entry.to_string(),
            target: target.to_string(),
            outcome: f.outcome,
            latency_ms: latency.as_secs_f64() * 1000.0,
            error: f.error,
            detail: f.detail,
        };
        let mut v = self.records.lock().unwrap_or_else(|p| p.into_inner());
        v.push(record);
        v.len() - 1
    }

    /// Changes a record after the fact (a workflow reconciled at the end).
    pub fn update(&self, index: usize, f: impl FnOnce(&mut Record)) {
        let mut v = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = v.get_mut(index) {
            f(r);
        }
    }

    /// Every record, by start time.
    pub fn snapshot(&self) -> Vec<Record> {
        let mut v = self
            .records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        v.sort_by_key(|r| r.t_ms);
        v
    }
}
