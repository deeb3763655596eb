//! Sandbox metrics over the control API: `GET
//! /_warren/v1/sandboxes/{id}/metrics?generation=g[&start=s][&end=e][&latest=true]`
//! answers the samples the node keeps for that sandbox, oldest first, in
//! E2B's `SandboxMetric` shape, which the gateway passes on unchanged.
//!
//! `start` and `end` are Unix seconds and both inclusive, compared with a
//! sample's `timestampUnix`; `latest=true` answers only the newest sample
//! (what `GET /sandboxes/metrics` needs per sandbox).

use serde::{Deserialize, Serialize};

/// One sample of a sandbox's resource use (E2B's `SandboxMetric`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    /// When the sample was taken, RFC 3339 (E2B marks it deprecated but
    /// its SDKs still read it).
    pub timestamp: String,
    /// The same instant in Unix seconds.
    pub timestamp_unix: i64,
    /// CPUs the sandbox may use (its CPU limit rounded up).
    pub cpu_count: u32,
    /// CPU time used since the previous sample, as a percentage of
    /// `cpu_count` CPUs over that wall time (0–100).
    pub cpu_used_pct: f64,
    /// Memory in use without the page cache, bytes.
    pub mem_used: u64,
    /// The sandbox's memory limit, bytes.
    pub mem_total: u64,
    /// Page cache charged to the sandbox, bytes.
    pub mem_cache: u64,
    /// Used bytes of the sandbox's disk.
    pub disk_used: u64,
    /// Size of the sandbox's disk, bytes.
    pub disk_total: u64,
}

/// Which samples to answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Unix seconds; samples before it are left out.
    pub start: Option<i64>,
    /// Unix seconds; samples after it are left out.
    pub end: Option<i64>,
    /// Only the newest sample in the window.
    pub latest: bool,
}

impl Window {
    /// Parses `start`, `end` and `latest` out of a query string (other
    /// parameters are left to the caller). The error names the parameter.
    pub fn parse(query: &str) -> Result<Window, String> {
        let mut w = Window::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "start" => w.start = Some(seconds("start", v)?),
                "end" => w.end = Some(seconds("end", v)?),
                "latest" => {
                    w.latest = match v {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(format!("latest {v:?} is not true or false")),
                    }
                }
                _ => {}
            }
        }
        if let (Some(s), Some(e)) = (w.start, w.end) {
            if s > e {
                return Err(format!("start ({s}) is after end ({e})"));
            }
        }
        Ok(w)
    }

    /// True when a sample taken at `unix` seconds is in the window.
    pub fn contains(&self, unix: i64) -> bool {
        self.start.is_none_or(|s| unix >= s) && self.end.is_none_or(|e| unix <= e)
    }
}

fn seconds(name: &str, v: &str) -> Result<i64, String> {
    match v.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n),
        _ => Err(format!(
            "{name} {v:?} is not a Unix timestamp in seconds (a non-negative integer)"
        )),
    }
}

/// The node's path for `id`'s samples at `generation` within `w`.
pub fn metrics_path(id: &str, generation: u64, w: &Window) -> String {
    let mut p = format!("{}/{id}/metrics?generation={generation}", super::SANDBOXES);
    if let Some(s) = w.start {
        p.push_str(&format!("&start={s}"));
    }
    if let Some(e) = w.end {
        p.push_str(&format!("&end={e}"));
    }
    if w.latest {
        p.push_str("&latest=true");
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse_and_name_the_bad_parameter() {
        let w = Window::parse("start=10&end=20&generation=3").unwrap_or_default();
        assert_eq!((w.start, w.end, w.latest), (Some(10), Some(20), false));
        assert!(w.contains(10) && w.contains(20) && !w.contains(21) && !w.contains(9));
        assert!(Window::parse("start=-1").is_err_and(|e| e.contains("start")));
        assert!(Window::parse("end=soon").is_err_and(|e| e.contains("end")));
        assert!(Window::parse("start=5&end=4").is_err_and(|e| e.contains("after")));
        assert!(Window::parse("latest=maybe").is_err());
        assert_eq!(
            metrics_path(
                "abc",
                2,
                &Window::parse("end=7&latest=1").unwrap_or_default()
            ),
            "/_warren/v1/sandboxes/abc/metrics?generation=2&end=7&latest=true"
        );
    }
}
