//! The run's outputs: `probes.json` and `probes.csv` (every probe),
//! `summary.json` and `summary.md` (successes/attempts per probe kind ×
//! entry point × phase), and `timeline.svg` (every probe over time, the
//! fault and the restore marked).

use crate::reconcile::Reconciled;
use crate::record::{Outcome, Phase, Record};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Counts for one cell of the table.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cell {
    pub attempts: u64,
    pub ok: u64,
    pub refused: u64,
    pub failed: u64,
}

impl Cell {
    fn add(&mut self, o: Outcome) {
        self.attempts += 1;
        match o {
            Outcome::Ok => self.ok += 1,
            Outcome::Refused => self.refused += 1,
            Outcome::Failed => self.failed += 1,
        }
    }

    fn show(&self) -> String {
        if self.attempts == 0 {
            return "–".into();
        }
        let mut s = format!("{}/{}", self.ok, self.attempts);
        if self.refused > 0 {
            let _ = write!(s, " ({} refused)", self.refused);
        }
        s
    }
}

/// One row: a probe kind (and target) through one entry point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub kind: String,
    pub target: String,
    pub entry: String,
    /// Baseline, fault, restored.
    pub phases: [Cell; 3],
    pub total: Cell,
}

/// Everything the run tells, for people (`summary.md`) and tests (`summary.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub component: String,
    pub signal: String,
    pub replica: String,
    pub entries: Vec<String>,
    pub runtime: String,
    pub run: String,
    pub seed: u64,
    pub fault_ms: Option<u64>,
    pub restore_ms: Option<u64>,
    pub end_ms: u64,
    /// How long the signalled replica took to exit, and whether it did on its own.
    pub exit_ms: u64,
    pub exited_on_its_own: bool,
    /// Every record counted (the denominators add up to this).
    pub records: usize,
    pub rows: Vec<Row>,
    pub reconciled: Reconciled,
    /// Workflows whose outcome is unknown even after reconciliation.
    pub unknown_workflows: usize,
    /// Stream probes and how many came out complete.
    pub streams: usize,
    pub complete_streams: usize,
}

/// Builds the table rows from the records.
pub fn rows(records: &[Record]) -> Vec<Row> {
    let order = |k: &str| match k {
        "list" => 0,
        "command" => 1,
        "workflow" => 2,
        "stream" => 3,
        _ => 4,
    };
    let mut map: BTreeMap<(u8, String, String), Row> = BTreeMap::new();
    for r in records {
        let row = map
            .entry((order(&r.kind), r.target.clone(), r.entry.clone()))
            .or_insert_with(|| Row {
                kind: r.kind.clone(),
                target: r.target.clone(),
                entry: r.entry.clone(),
                phases: [Cell::default(); 3],
                total: Cell::default(),
            });
        let i = Phase::ALL.iter().position(|p| *p == r.phase).unwrap_or(0);
        row.phases[i].add(r.outcome);
        row.total.add(r.outcome);
    }
    map.into_values().collect()
}

/// Writes every output file into `dir`.
pub fn write_all(dir: &Path, records: &[Record], summary: &Summary) -> anyhow::Result<()> {
    std::fs::write(dir.join("probes.json"), serde_json::to_vec_pretty(records)?)?;
    std::fs::write(dir.join("probes.csv"), csv(records))?;
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_vec_pretty(summary)?,
    )?;
    std::fs::write(dir.join("summary.md"), markdown(summary))?;
    std::fs::write(dir.join("timeline.svg"), svg(records, summary))?;
    Ok(())
}

fn csv(records: &[Record]) -> String {
    let mut s =
        String::from("t_ms,unix_ms,phase,kind,entry,target,outcome,latency_ms,error,detail\n");
    let q = |v: &str| format!("\"{}\"", v.replace('"', "\"\""));
    for r in records {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{:.1},{},{}",
            r.t_ms,
            r.unix_ms,
            r.phase.name(),
            r.kind,
            r.entry,
            r.target,
            r.outcome.name(),
            r.latency_ms,
            q(&r.error),
            q(&r.detail)
        );
    }
    s
}

/// The table, in the shape CubeSandbox published theirs: successes/attempts.
pub fn markdown(s: &Summary) -> String {
    let mut m = String::new();
    let secs = |ms: Option<u64>| {
        ms.map(|v| format!("{:.1}s", v as f64 / 1000.0))
            .unwrap_or_else(|| "–".into())
    };
    let _ = writeln!(
        m,
        "# warren chaos failover: {} {} (SIG{})\n",
        s.component, s.replica, s.signal
    );
    let _ = writeln!(
        m,
        "Cluster: 2 scheduler replicas on PostgreSQL, 2 gateways, 2 nodes ({} runtime); \
         entry points: {}. Fault at {}, restart at {}, end at {}. The {} exited {:.1}s after \
         the signal{}. Run `{}`, seed {}.\n",
        s.runtime,
        s.entries
            .iter()
            .map(|e| format!("HAProxy {}", e.to_uppercase()))
            .collect::<Vec<_>>()
            .join(", "),
        secs(s.fault_ms),
        secs(s.restore_ms),
        secs(Some(s.end_ms)),
        s.replica,
        s.exit_ms as f64 / 1000.0,
        if s.exited_on_its_own {
            ""
        } else {
            " (killed after the wait)"
        },
        s.run,
        s.seed
    );
    let _ = writeln!(
        m,
        "| probe | entry | baseline | fault | restored | total ok/attempts | refused | failed |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|---|---|---|");
    for r in &s.rows {
        let kind = if r.target.is_empty() {
            r.kind.clone()
        } else {
            format!("{} ({})", r.kind, r.target)
        };
        let _ = writeln!(
            m,
            "| {kind} | {} | {} | {} | {} | {}/{} | {} | {} |",
            r.entry.to_uppercase(),
            r.phases[0].show(),
            r.phases[1].show(),
            r.phases[2].show(),
            r.total.ok,
            r.total.attempts,
            r.total.refused,
            r.total.failed
        );
    }
    let workflows: u64 = s
        .rows
        .iter()
        .filter(|r| r.kind == "workflow")
        .map(|r| r.total.attempts)
        .sum();
    let _ = writeln!(
        m,
        "\n{} probes recorded. Streams complete and in order: {}/{}. Workflows: {} (each \
         with its own Idempotency-Key), {} with an unknown outcome ({} settled by the final \
         listing). Idempotency keys with more than one sandbox: {} (of {} keys still listed \
         at the end).",
        s.records,
        s.complete_streams,
        s.streams,
        workflows,
        s.unknown_workflows,
        s.reconciled.settled,
        s.reconciled.duplicate_keys.len(),
        s.reconciled.keys
    );
    let _ = writeln!(
        m,
        "\n`refused`: the clear node-down / unreachable / not-found answer for a sandbox \
         whose node was killed (it is really gone) — correct, counted apart from failures."
    );
    m
}

/// Probe outcomes over time, one lane per probe kind × entry point.
pub fn svg(records: &[Record], s: &Summary) -> String {
    let lanes: Vec<(String, String, String)> = rows(records)
        .into_iter()
        .map(|r| (r.kind, r.target, r.entry))
        .collect();
    let (left, right, top, lane_h) = (190.0, 20.0, 40.0, 26.0);
    let width = 1000.0;
    let plot_w = width - left - right;
    let height = top + lane_h * lanes.len() as f64 + 60.0;
    let end = s.end_ms.max(1) as f64;
    let x = |ms: f64| left + plot_w * (ms / end).clamp(0.0, 1.0);
    let mut v = String::new();
    let _ = writeln!(
        v,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(v, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        v,
        r#"<text x="{left}" y="18" font-size="14" font-weight="bold">{} {} SIG{}: probe outcomes over time</text>"#,
        s.component, s.replica, s.signal
    );
    // Time axis: a tick every 5 s (every 1 s for short runs).
    let step = if end > 20_000.0 { 5000.0 } else { 1000.0 };
    let axis_y = top + lane_h * lanes.len() as f64 + 6.0;
    let mut t = 0.0;
    while t <= end {
        let _ = writeln!(
            v,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{axis_y}" stroke="#eee"/><text x="{0:.1}" y="{1:.1}" text-anchor="middle" fill="#555">{2}s</text>"##,
            x(t),
            axis_y + 14.0,
            (t / 1000.0) as u64
        );
        t += step;
    }
    for (i, (kind, target, entry)) in lanes.iter().enumerate() {
        let y = top + lane_h * i as f64;
        let label = if target.is_empty() {
            format!("{kind} · {}", entry.to_uppercase())
        } else {
            format!("{kind} ({target}) · {}", entry.to_uppercase())
        };
        let _ = writeln!(
            v,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text><line x1="{left}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            left - 8.0,
            y + lane_h / 2.0 + 4.0,
            y + lane_h,
            width - right,
            y + lane_h
        );
        for r in records
            .iter()
            .filter(|r| &r.kind == kind && &r.target == target && &r.entry == entry)
        {
            let color = match r.outcome {
                Outcome::Ok => "#2e7d32",
                Outcome::Refused => "#f9a825",
                Outcome::Failed => "#c62828",
            };
            let x0 = x(r.t_ms as f64);
            // Streams are drawn for their whole life; other probes as ticks.
            let w = if r.kind == "stream" {
                (x(r.t_ms as f64 + r.latency_ms) - x0).max(3.0)
            } else {
                3.0
            };
            let title = if r.error.is_empty() {
                r.outcome.name().to_string()
            } else {
                format!("{}: {}", r.outcome.name(), xml(&r.error))
            };
            let _ = writeln!(
                v,
                r#"<rect x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{color}"><title>{}ms {title}</title></rect>"#,
                y + 5.0,
                lane_h - 10.0,
                r.t_ms
            );
        }
    }
    let bottom = top + lane_h * lanes.len() as f64;
    for (ms, color, label) in [
        (
            s.fault_ms,
            "#c62828",
            format!("SIG{} {}", s.signal, s.replica),
        ),
        (s.restore_ms, "#1565c0", format!("restart {}", s.replica)),
    ] {
        if let Some(ms) = ms {
            let _ = writeln!(
                v,
                r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{bottom}" stroke="{color}" stroke-width="2" stroke-dasharray="6,4"/><text x="{2:.1}" y="{3}" fill="{color}">{label}</text>"#,
                x(ms as f64),
                top - 6.0,
                x(ms as f64) + 4.0,
                top - 8.0
            );
        }
    }
    let ly = height - 16.0;
    for (i, (color, label)) in [
        ("#2e7d32", "ok"),
        ("#f9a825", "correct refusal (sandbox really lost)"),
        ("#c62828", "failed"),
    ]
    .iter()
    .enumerate()
    {
        let lx = left + 260.0 * i as f64;
        let _ = writeln!(
            v,
            r#"<rect x="{lx}" y="{:.1}" width="10" height="10" fill="{color}"/><text x="{:.1}" y="{ly}">{label}</text>"#,
            ly - 9.0,
            lx + 14.0
        );
    }
    v.push_str("</svg>\n");
    v
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: u64, kind: &str, entry: &str, phase: Phase, outcome: Outcome) -> Record {
        Record {
            t_ms: t,
            unix_ms: t,
            phase,
            kind: kind.into(),
            entry: entry.into(),
            target: String::new(),
            outcome,
            latency_ms: 1.0,
            error: if outcome == Outcome::Ok {
                String::new()
            } else {
                "x<y".into()
            },
            detail: "a \"quoted\" detail".into(),
        }
    }

    #[test]
    fn rows_count_every_record_once_per_phase() {
        let rs = vec![
            rec(0, "list", "l4", Phase::Baseline, Outcome::Ok),
            rec(1, "list", "l4", Phase::Fault, Outcome::Failed),
            rec(2, "list", "l7", Phase::Fault, Outcome::Ok),
            rec(3, "command", "l4", Phase::Restored, Outcome::Refused),
        ];
        let rows = rows(&rs);
        assert_eq!(rows.len(), 3);
        let l4 = &rows[0];
        assert_eq!((l4.kind.as_str(), l4.entry.as_str()), ("list", "l4"));
        assert_eq!(l4.total.attempts, 2);
        assert_eq!(l4.phases[1].failed, 1);
        let total: u64 = rows.iter().map(|r| r.total.attempts).sum();
        assert_eq!(total, rs.len() as u64);
        assert_eq!(rows[2].phases[2].show(), "0/1 (1 refused)");
    }

    #[test]
    fn csv_quotes_and_svg_escapes() {
        let rs = vec![rec(5, "list", "l4", Phase::Fault, Outcome::Failed)];
        let c = csv(&rs);
        assert_eq!(c.lines().count(), 2);
        assert!(c.contains("\"a \"\"quoted\"\" detail\""));
        let s = Summary {
            component: "gateway".into(),
            signal: "KILL".into(),
            replica: "gateway-1".into(),
            entries: vec!["l4".into()],
            runtime: "process".into(),
            run: "r".into(),
            seed: 1,
            fault_ms: Some(2),
            restore_ms: Some(4),
            end_ms: 10,
            exit_ms: 0,
            exited_on_its_own: true,
            records: 1,
            rows: rows(&rs),
            reconciled: Reconciled::default(),
            unknown_workflows: 0,
            streams: 0,
            complete_streams: 0,
        };
        let svg = svg(&rs, &s);
        assert!(svg.contains("x&lt;y") && !svg.contains("x<y"));
        assert!(markdown(&s).contains("| list | L4 | – | 0/1 | – | 0/1 | 0 | 1 |"));
    }
}
