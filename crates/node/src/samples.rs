//! Sandbox metrics (E2B's `GET /sandboxes/{id}/metrics`): every
//! `--metrics-interval` (default 5 s, as E2B) the sampler reads what each
//! running sandbox uses ([`crate::runtime::usage`]) and appends one sample
//! to that sandbox's ring; the control API answers from the ring
//! (`GET /_warren/v1/sandboxes/{id}/metrics`, see
//! [`warren_core::node_api::metrics`]).
//!
//! - **Bounded.** A ring keeps the newest `--metrics-samples` samples
//!   (default 720: an hour at 5 s), 56 bytes each: about 40 KiB per
//!   sandbox (under 64 KiB allocated, as the buffer grows by doubling);
//!   older samples are dropped. A ring goes with its
//!   sandbox (a new generation of the same id starts a new ring).
//! - **CPU** is the cgroup's CPU time used between two samples over the
//!   wall time between them, as a percentage of the sandbox's CPUs. A new
//!   sandbox's first sample measures from its start.
//! - **Paused** (frozen) sandboxes keep their samples and are not sampled;
//!   after a resume the next sample measures from the resume's first tick,
//!   never across the frozen time.

use crate::http::not_found_marker;
use crate::runtime::usage::{self, Usage};
use crate::sandbox::Registry;
use http::{Response, StatusCode};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warren_core::body::{error, json, Body};
use warren_core::node_api::metrics::{SandboxMetric, Window};
use warren_core::time::{now_ms, rfc3339_ms};

/// One sample, compact (rendered as a [`SandboxMetric`] when asked for).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at_ms: i64,
    cpu_pct: f32,
    cpu_count: u32,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

impl Sample {
    fn metric(&self) -> SandboxMetric {
        SandboxMetric {
            timestamp: rfc3339_ms(self.at_ms),
            timestamp_unix: self.at_ms.div_euclid(1000),
            cpu_count: self.cpu_count,
            cpu_used_pct: f64::from(self.cpu_pct),
            mem_used: self.mem_used,
            mem_total: self.mem_total,
            mem_cache: self.mem_cache,
            disk_used: self.disk_used,
            disk_total: self.disk_total,
        }
    }
}

/// One sandbox's samples.
#[derive(Debug)]
struct Ring {
    generation: u64,
    /// CPU time and wall time of the reading the next sample measures from;
    /// `None` after the sandbox was seen paused.
    base: Option<(u64, i64)>,
    samples: VecDeque<Sample>,
}

/// Every hosted sandbox's ring. See the module doc.
pub struct Samples {
    /// How often the sampler reads.
    interval: Duration,
    /// Most samples a ring keeps.
    capacity: usize,
    /// By sandbox id.
    rings: Mutex<HashMap<String, Ring>>,
}

impl Samples {
    pub fn new(interval: Duration, capacity: usize) -> Samples {
        Samples {
            interval,
            capacity: capacity.max(1),
            rings: Mutex::new(HashMap::new()),
        }
    }

    /// Samples every hosted sandbox every interval until `stop` turns true.
    pub async fn run(
        self: Arc<Self>,
        registry: Arc<Registry>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let hosted = registry.hosted();
            let read = warren_core::blocking::run(move || {
                hosted
                    .into_iter()
                    .map(|sb| {
                        // A frozen sandbox is not read; one frozen while
                        // being read is dropped as frozen.
                        let usage = (!sb.is_paused())
                            .then(|| usage::read(&sb.handle, &sb.paths))
                            .filter(|_| !sb.is_paused());
                        Reading {
                            id: sb.info.sandbox_id.clone(),
                            generation: sb.info.generation,
                            started_at_ms: sb.info.started_at_ms,
                            at_ms: now_ms(),
                            usage,
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .await;
            match read {
                Ok(readings) => self.record(readings),
                Err(e) => tracing::error!(error = %e, "the metrics sampler's read failed"),
            }
        }
    }

    /// Turns one round of readings into samples; forgets sandboxes no
    /// longer hosted.
    fn record(&self, readings: Vec<Reading>) {
        let min_gap_ms = (self.interval.as_millis() / 2) as i64;
        let mut rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        rings.retain(|id, ring| {
            readings
                .iter()
                .any(|r| r.id == *id && r.generation == ring.generation)
        });
        for r in readings {
            let ring = rings.entry(r.id).or_insert_with(|| Ring {
                generation: r.generation,
                base: Some((0, r.started_at_ms)),
                samples: VecDeque::new(),
            });
            let Some(u) = r.usage else {
                ring.base = None;
                continue;
            };
            let Some((base_ns, base_ms)) = ring.base else {
                ring.base = Some((u.cpu_ns, r.at_ms));
                continue;
            };
            let wall_ms = r.at_ms - base_ms;
            if wall_ms < min_gap_ms.max(1) {
                // Too soon after the base for a meaningful percentage.
                continue;
            }
            ring.base = Some((u.cpu_ns, r.at_ms));
            if ring.samples.len() >= self.capacity {
                ring.samples.pop_front();
            }
            ring.samples.push_back(sample(
                &u,
                u.cpu_ns.saturating_sub(base_ns),
                wall_ms,
                r.at_ms,
            ));
        }
    }

    /// The samples of `id` at `generation` within `w`, oldest first.
    fn window(&self, id: &str, generation: u64, w: &Window) -> Vec<SandboxMetric> {
        let rings = self.rings.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ring) = rings.get(id).filter(|r| r.generation == generation) else {
            return Vec::new();
        };
        let mut found: Vec<SandboxMetric> = ring
            .samples
            .iter()
            .filter(|s| w.contains(s.at_ms.div_euclid(1000)))
            .map(Sample::metric)
            .collect();
        if w.latest && found.len() > 1 {
            found.drain(..found.len() - 1);
        }
        found
    }

    /// `GET /_warren/v1/sandboxes/{id}/metrics?generation=g&...`.
    pub fn answer(&self, registry: &Registry, id: &str, query: &str) -> Response<Body> {
        let mut generation = None;
        for pair in query.split('&') {
            if let Some(v) = pair.strip_prefix("generation=") {
                match v.parse::<u64>() {
                    Ok(g) if g > 0 => generation = Some(g),
                    _ => {
                        return error(
                            StatusCode::BAD_REQUEST,
                            format!("generation {v:?} is not a positive integer"),
                        )
                    }
                }
            }
        }
        let Some(generation) = generation else {
            return error(StatusCode::BAD_REQUEST, "metrics needs ?generation=");
        };
        let w = match Window::parse(query) {
            Ok(w) => w,
            Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
        };
        if registry.get(id, generation).is_none() {
            return not_found_marker(format!(
                "sandbox {id} (generation {generation}) is not on node {}",
                registry.node_id()
            ));
        }
        json(StatusCode::OK, &self.window(id, generation, &w))
    }
}

/// What one sandbox used at one instant (`usage: None`: it is paused).
struct Reading {
    id: String,
    generation: u64,
    started_at_ms: i64,
    at_ms: i64,
    usage: Option<Usage>,
}

fn sample(u: &Usage, cpu_ns: u64, wall_ms: i64, at_ms: i64) -> Sample {
    let cpus = if u.cpus > 0.0 {
        u.cpus
    } else {
        usage::host_cpus()
    };
    let pct = cpu_ns as f64 / (wall_ms as f64 * 1e6 * cpus) * 100.0;
    Sample {
        at_ms,
        cpu_pct: ((pct.clamp(0.0, 100.0) * 100.0).round() / 100.0) as f32,
        cpu_count: (cpus.ceil() as u32).max(1),
        mem_used: u.mem_used,
        mem_total: u.mem_total,
        mem_cache: u.mem_cache,
        disk_used: u.disk_used,
        disk_total: u.disk_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(id: &str, generation: u64, at_ms: i64, usage: Option<Usage>) -> Reading {
        Reading {
            id: id.into(),
            generation,
            started_at_ms: 0,
            at_ms,
            usage,
        }
    }

    fn busy(cpu_ns: u64) -> Option<Usage> {
        Some(Usage {
            cpu_ns,
            cpus: 2.0,
            mem_used: 1 << 20,
            mem_total: 512 << 20,
            ..Usage::default()
        })
    }

    #[test]
    fn cpu_is_a_share_of_the_sandbox_cpus_between_samples() {
        let s = Samples::new(Duration::from_secs(5), 10);
        // One CPU busy for the first 5 s (of two), idle for the next 5 s.
        s.record(vec![reading("a", 1, 5_000, busy(5_000_000_000))]);
        s.record(vec![reading("a", 1, 10_000, busy(5_000_000_000))]);
        let got = s.window("a", 1, &Window::default());
        let pcts: Vec<f64> = got.iter().map(|m| m.cpu_used_pct).collect();
        assert_eq!(pcts, vec![50.0, 0.0]);
        assert_eq!((got[0].cpu_count, got[0].timestamp_unix), (2, 5));
        assert_eq!(got[1].timestamp, "1970-01-01T00:00:10.000Z");
    }

    #[test]
    fn the_ring_is_bounded_and_windows_filter() {
        let s = Samples::new(Duration::from_secs(1), 3);
        for t in 1..=5 {
            s.record(vec![reading("a", 1, t * 1000, busy(0))]);
        }
        let all: Vec<i64> = s
            .window("a", 1, &Window::default())
            .iter()
            .map(|m| m.timestamp_unix)
            .collect();
        assert_eq!(all, vec![3, 4, 5]);
        let w = Window {
            start: Some(4),
            end: Some(4),
            latest: false,
        };
        assert_eq!(s.window("a", 1, &w).len(), 1);
        let latest = Window {
            latest: true,
            ..Window::default()
        };
        assert_eq!(s.window("a", 1, &latest)[0].timestamp_unix, 5);
        // Another generation of the same id is another sandbox.
        assert!(s.window("a", 2, &Window::default()).is_empty());
    }

    #[test]
    fn paused_sandboxes_keep_samples_and_do_not_average_over_the_freeze() {
        let s = Samples::new(Duration::from_secs(1), 10);
        s.record(vec![reading("a", 1, 1000, busy(0))]);
        s.record(vec![reading("a", 1, 2000, None)]);
        s.record(vec![reading("a", 1, 60_000, None)]);
        assert_eq!(s.window("a", 1, &Window::default()).len(), 1);
        // Resumed: the first reading is the new base, the next one a sample
        // of the second between them only (a full CPU of two: 50%).
        s.record(vec![reading("a", 1, 61_000, busy(10_000_000_000))]);
        s.record(vec![reading("a", 1, 62_000, busy(11_000_000_000))]);
        let got = s.window("a", 1, &Window::default());
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].cpu_used_pct, 50.0);
    }

    #[test]
    fn gone_sandboxes_are_forgotten() {
        let s = Samples::new(Duration::from_secs(1), 10);
        s.record(vec![reading("a", 1, 1000, busy(0))]);
        s.record(vec![reading("b", 1, 2000, busy(0))]);
        assert!(s.window("a", 1, &Window::default()).is_empty());
        assert_eq!(s.window("b", 1, &Window::default()).len(), 1);
    }
}
