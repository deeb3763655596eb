//! The invariants (docs/simulation.md, "Invariants"), checked as things
//! happen: every request a node receives and every delivery to a
//! sandbox, every answer a client gets; and the quiescence checks the
//! driver runs once the faults stop ([`crate::client`]).
//!
//! One [`Checker`] per run, per thread (the simulation's), reached by the
//! node's request hook and the simulated envds without being captured (the
//! servers' handlers must be `Send`).

use crate::Trace;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use warren_scheduler::store::{ChangeKind, RouteRow, SqlStore};

/// One request the simulation's clients sent to the data plane.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The sandbox it names.
    pub sandbox_id: String,
    /// Whether the gateway may send it twice (GET, or a key).
    pub replayable: bool,
}

/// What a run saw and what it found wrong.
#[derive(Default)]
pub struct Checker {
    pub trace: Trace,
    pub violations: Vec<String>,
    /// The store, read (never written) by the checks.
    store: Option<Arc<SqlStore>>,
    /// Route-cache TTL of every gateway, plus what a request may take
    /// between being resolved and reaching its node.
    ttl_ms: i64,
    slack_ms: i64,
    /// Data-plane requests the clients sent, by number.
    pub sent: BTreeMap<u64, Sent>,
    /// How often each request reached a sandbox.
    delivered: BTreeMap<u64, u32>,
    /// The generation each request named at the node it last reached.
    named: BTreeMap<(u64, String), u64>,
    /// When each `(sandbox, generation)` stopped being the sandbox's
    /// placement (removed, or moved to a newer generation), store time.
    superseded: BTreeMap<(String, u64), i64>,
    /// The change log read so far.
    revision: u64,
    /// Sandboxes a client deleted (a 2xx answer), and when (sim ms).
    pub deleted: BTreeMap<String, u64>,
    /// Idempotency key → the sandbox its creates answered.
    keys: BTreeMap<String, String>,
    /// The latest generation the change log placed each sandbox at.
    latest: BTreeMap<String, u64>,
    /// `(sandbox, generation)` bound to a node when its process died.
    lost_at: std::collections::BTreeSet<(String, u64)>,
    /// Moves (MOVED changes) the run made.
    pub moves: u64,
    /// Deliveries and answers, for the summary.
    pub deliveries: u64,
    pub answers: u64,
}

thread_local! {
    static CHECKER: RefCell<Option<Checker>> = const { RefCell::new(None) };
}

/// Starts a run's checker.
pub fn begin(store: Arc<SqlStore>, ttl_ms: i64, slack_ms: i64, trace: Trace) {
    let c = Checker {
        store: Some(store),
        ttl_ms,
        slack_ms,
        trace,
        ..Checker::default()
    };
    CHECKER.with(|k| *k.borrow_mut() = Some(c));
}

/// Ends the run: what the checker saw.
pub fn end() -> Option<Checker> {
    CHECKER.with(|k| k.borrow_mut().take())
}

/// Runs `f` on the run's checker (nothing outside a run).
pub fn with<R>(f: impl FnOnce(&mut Checker) -> R) -> Option<R> {
    CHECKER.with(|k| k.borrow_mut().as_mut().map(f))
}

/// Simulated milliseconds since the run began.
pub fn now_ms() -> u64 {
    turmoil::sim_elapsed()
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Runs a store read on the simulation's thread: the store's executor runs
/// every operation to its end before the call returns.
pub fn read<T>(fut: impl std::future::Future<Output = T>) -> Option<T> {
    futures_util::FutureExt::now_or_never(fut)
}

impl Checker {
    pub fn violation(&mut self, what: String) {
        let line = format!("t={} VIOLATION {what}", now_ms());
        self.trace.push(line.clone());
        self.violations.push(what);
    }

    fn route(&self, id: &str) -> Option<RouteRow> {
        let store = self.store.as_ref()?;
        read(store.route(id)).and_then(Result::ok).flatten()
    }

    /// Reads the change log up to its head, noting when placements ended.
    pub fn follow_changes(&mut self) {
        let Some(store) = self.store.clone() else {
            return;
        };
        loop {
            let Some(Ok(changes)) = read(store.changes_after(self.revision, 500)) else {
                return;
            };
            if changes.is_empty() {
                return;
            }
            for c in changes {
                self.revision = self.revision.max(c.revision);
                if matches!(c.kind, ChangeKind::Assigned | ChangeKind::Moved) {
                    let g = self.latest.entry(c.sandbox_id.clone()).or_insert(0);
                    *g = (*g).max(c.generation);
                }
                if c.kind == ChangeKind::Moved {
                    self.moves += 1;
                }
                match c.kind {
                    ChangeKind::Removed => {
                        self.superseded
                            .entry((c.sandbox_id.clone(), c.generation))
                            .or_insert(c.at_ms);
                    }
                    ChangeKind::Moved => {
                        // Every older generation of it ends here.
                        let older: Vec<(String, u64)> = self
                            .named_generations(&c.sandbox_id)
                            .into_iter()
                            .filter(|g| *g < c.generation)
                            .map(|g| (c.sandbox_id.clone(), g))
                            .collect();
                        for k in older {
                            self.superseded.entry(k).or_insert(c.at_ms);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn named_generations(&self, id: &str) -> Vec<u64> {
        let mut g: Vec<u64> = self
            .superseded
            .keys()
            .filter(|(s, _)| s == id)
            .map(|(_, g)| *g)
            .collect();
        g.extend(
            self.named
                .iter()
                .filter(|((r, _), _)| self.sent.get(r).is_some_and(|s| s.sandbox_id == id))
                .map(|(_, g)| *g),
        );
        g.sort_unstable();
        g.dedup();
        g
    }

    /// A node received a data-plane request naming `(id, generation)`
    /// (before its identity check).
    pub fn node_request(&mut self, node: &str, id: &str, generation: u64, request: Option<u64>) {
        if let Some(r) = request {
            self.named.insert((r, node.to_string()), generation);
        }
        // "A gateway's route is never older than its TTL while its watch is
        // down": a placement that ended more than a TTL ago (plus what a
        // request may spend in flight) is never the one a request names.
        self.follow_changes();
        let key = (id.to_string(), generation);
        if let Some(ended) = self.superseded.get(&key).copied() {
            let now = warren_core::time::now_ms();
            if now - ended > self.ttl_ms + self.slack_ms {
                self.violation(format!(
                    "request {request:?} for sandbox {id} reached {node} naming generation \
                     {generation}, a placement that ended {} ms ago (route TTL {} ms)",
                    now - ended,
                    self.ttl_ms
                ));
            }
        }
    }

    /// A simulated envd received a request.
    pub fn delivered(&mut self, d: &crate::sandbox::Delivery) {
        self.deliveries += 1;
        self.trace.push(format!(
            "t={} deliver {:?} {} to {}@{} on {}",
            now_ms(),
            d.request,
            d.method,
            d.sandbox_id,
            d.generation,
            d.node
        ));
        let Some(r) = d.request else {
            return;
        };
        let sent = self.sent.get(&r).cloned();
        // "Delivered only to the sandbox it names."
        if let Some(s) = &sent {
            if s.sandbox_id != d.sandbox_id {
                self.violation(format!(
                    "request {r} for sandbox {} was delivered to sandbox {}",
                    s.sandbox_id, d.sandbox_id
                ));
            }
        }
        // "At the generation named": the node's identity check.
        if let Some(named) = self.named.get(&(r, d.node.clone())).copied() {
            if named != d.generation {
                self.violation(format!(
                    "{} delivered request {r} naming generation {named} to sandbox {} at \
                     generation {}",
                    d.node, d.sandbox_id, d.generation
                ));
            }
        }
        // "At that sandbox's current generation."
        match self.route(&d.sandbox_id) {
            Some(route) if route.generation != d.generation || route.node_id != d.node => {
                self.violation(format!(
                    "request {r} reached sandbox {} at generation {} on {}, but the store \
                     places it at generation {} on {}",
                    d.sandbox_id, d.generation, d.node, route.generation, route.node_id
                ));
            }
            Some(_) => {}
            None => {
                // "A deleted sandbox is never resurrected."
                if let Some(at) = self.deleted.get(&d.sandbox_id) {
                    self.violation(format!(
                        "request {r} reached sandbox {} on {}, which a client deleted at t={at}",
                        d.sandbox_id, d.node
                    ));
                }
            }
        }
        // "A non-replayable request is never sent twice."
        let n = {
            let n = self.delivered.entry(r).or_insert(0);
            *n += 1;
            *n
        };
        if n > 1 && sent.as_ref().is_some_and(|s| !s.replayable) {
            self.violation(format!(
                "non-replayable request {r} reached a sandbox {n} times"
            ));
        }
    }

    /// Node `node`'s process died: every sandbox bound to it now may vanish.
    pub fn node_crashed(&mut self, node: &str) {
        self.follow_changes();
        for b in self.bindings(Some(node)) {
            self.lost_at.insert((b.sandbox_id, b.generation));
        }
    }

    /// Whether a node sandbox `id` was bound to (at any generation) died.
    pub fn died_once(&self, id: &str) -> bool {
        self.lost_at.iter().any(|(s, _)| s == id)
    }

    /// Whether sandbox `id` may have vanished: its latest placement was on
    /// a node whose process died while it was there.
    pub fn may_have_died(&mut self, id: &str) -> bool {
        self.follow_changes();
        let latest = self.latest.get(id).copied();
        self.lost_at
            .iter()
            .any(|(s, g)| s == id && latest.is_none_or(|l| l == *g))
    }

    /// Every binding of the run's team (on `node`, when given).
    pub fn bindings(&self, node: Option<&str>) -> Vec<warren_scheduler::store::BindingRow> {
        let Some(store) = self.store.as_ref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let filter = warren_scheduler::store::ListFilter {
                team_id: Some(crate::world::TEAM.to_string()),
                node_id: node.map(str::to_string),
                after: after.clone(),
                limit: 500,
                ..Default::default()
            };
            let Some(Ok((page, next))) = read(store.list(&filter)) else {
                return out;
            };
            out.extend(page);
            match next {
                Some(n) => after = Some(n),
                None => return out,
            }
        }
    }

    /// The store's route for `id` now.
    pub fn route_now(&self, id: &str) -> Option<RouteRow> {
        self.route(id)
    }

    /// A create with idempotency key `key` answered sandbox `id`.
    pub fn created_with_key(&mut self, key: &str, id: &str) {
        match self.keys.get(key) {
            Some(first) if first != id => {
                let first = first.clone();
                self.violation(format!(
                    "idempotency key {key} made two sandboxes: {first} and {id}"
                ));
            }
            Some(_) => {}
            None => {
                self.keys.insert(key.to_string(), id.to_string());
            }
        }
    }

    /// Checks a client's answer against the documented ones (the status
    /// and message tables of docs/e2b-compatibility.md and
    /// docs/internals.md): a success, or a JSON error whose `code` is its
    /// status, with a message, and one of the known `error_code`s.
    pub fn answered(&mut self, what: &str, status: u16, body: &[u8]) {
        self.answers += 1;
        if matches!(status, 200 | 201 | 204) {
            return;
        }
        let v: serde_json::Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(_) => {
                self.violation(format!(
                    "{what}: answer {status} is not a JSON error: {:?}",
                    String::from_utf8_lossy(&body[..body.len().min(200)])
                ));
                return;
            }
        };
        let code = v.get("code").and_then(serde_json::Value::as_u64);
        let message = v
            .get("message")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("");
        let error_code = v.get("error_code").and_then(serde_json::Value::as_str);
        let documented = DOCUMENTED.iter().any(|(s, c)| {
            *s == status
                && error_code.is_none_or(|e| e == *c)
                && (error_code.is_some() || c.is_empty())
        });
        if code != Some(u64::from(status)) || message.is_empty() || !documented {
            self.violation(format!(
                "{what}: undocumented answer {status} {error_code:?}: {message}"
            ));
        }
    }
}

/// The answers a client of the simulation may get besides a success:
/// (status, `error_code`), `""` for a node's own answer (which has none).
/// Everything else, a 500 included, is a violation.
pub const DOCUMENTED: &[(u16, &str)] = &[
    (404, "sandbox_not_found"),
    (404, "not_found"),
    (409, "conflict"),
    (409, "sandbox_not_running"),
    // The node's own answers, passed through on the data plane.
    (502, ""),
    (502, "sandbox_not_found"),
    (502, "node_down"),
    (502, "upstream_unreachable"),
    (502, "sandbox_paused"),
    (502, "resume_failed"),
    (502, "upstream_timeout"),
    (502, "sandbox_create_failed"),
    (503, "sandbox_create_failed"),
    (503, "sandbox_moved"),
    (503, "sandbox_not_ready"),
    (503, "routing_unavailable"),
    (503, "sandbox_capacity_unavailable"),
];
