//! The gateway's route cache against real processes: a scheduler, two
//! `--runtime process` nodes and two gateways on 127.0.0.1:0 (ARCHITECTURE.md
//! invariants "Positive caching only", "Nodes check identity", "Bounded
//! staleness" and "Retry only what is safe"). The scheduler's own counters and the
//! gateways' `/metrics` tell how often the scheduler was asked; the
//! gateways' `GET /_warren/v1/routes/{id}` (what `warren route` prints)
//! tells what each one has cached.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;
use warren_proto::scheduler::v1::{
    GetSandboxRequest, Placement, ReassignRequest, RecordAssignmentRequest,
};
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::{create_sandbox, Answer, Http};
use warren_test_support::wait_until;

const KEY: &str = "key-route-cache";
const ENVD: &str = "49983";

fn bin() -> &'static std::path::Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// A scheduler, two nodes and two gateways.
struct Rig(Cluster);

impl std::ops::Deref for Rig {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        &self.0
    }
}

impl std::ops::DerefMut for Rig {
    fn deref_mut(&mut self) -> &mut Cluster {
        &mut self.0
    }
}

impl Rig {
    /// Starts everything; both gateways get `gateway_args` too.
    async fn start(gateway_args: &[&str]) -> Rig {
        Self::start_each([gateway_args, gateway_args]).await
    }

    /// Starts everything, gateway `g` with `gateway_args[g]` too, and waits
    /// until the watch of every gateway that has one is live.
    async fn start_each(gateway_args: [&[&str]; 2]) -> Rig {
        let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
        let spec = Spec {
            // This test calls the node's or the scheduler's API directly.
            tls: false,
            nodes: 2,
            gateways: 2,
            keys: vec![(KEY.into(), "team-a".into())],
            gateway_args: strings(&["--connect-timeout", "1s"]),
            per_gateway_args: gateway_args.iter().map(|a| strings(a)).collect(),
            ..Spec::default()
        };
        let c = Rig(Cluster::start(bin(), spec).await.expect("cluster starts"));
        let cluster = &c;
        for (g, extra) in gateway_args.iter().enumerate() {
            if !extra
                .windows(2)
                .any(|w| w == ["--route-cache-watch", "false"])
            {
                wait_until(
                    "the gateway's watch",
                    Duration::from_secs(20),
                    || async move {
                        let connected = cluster
                            .metric(g, "warren_gateway_route_cache_watch_connected", "")
                            .await;
                        (connected == 1.0).then_some(())
                    },
                )
                .await;
            }
        }
        c
    }

    /// `host:port` of gateway `g`'s public listener.
    fn gw(&self, g: usize) -> String {
        self.gateways[g].addr("gateway http")
    }

    /// Sum of the samples of `name` on gateway `g` whose labels contain `labels`.
    async fn metric(&self, g: usize, name: &str, labels: &str) -> f64 {
        let admin = self.gateways[g].addr("gateway admin");
        let r = send(&admin, Method::GET, "/metrics", &[], Bytes::new()).await;
        String::from_utf8_lossy(&r.body)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.split([' ', '{']).next() == Some(name))
            .filter(|l| l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn lookups(&self, g: usize) -> f64 {
        self.metric(g, "warren_gateway_scheduler_lookups_total", "")
            .await
    }

    async fn refetches(&self, g: usize, outcome: &str) -> f64 {
        self.metric(
            g,
            "warren_gateway_route_cache_refetches_total",
            &format!("outcome=\"{outcome}\""),
        )
        .await
    }

    async fn evictions(&self, g: usize, reason: &str) -> f64 {
        self.metric(
            g,
            "warren_gateway_route_cache_evictions_total",
            &format!("reason=\"{reason}\""),
        )
        .await
    }

    /// Asks gateway `g` for `id` until it has cached the route: the watch
    /// may bring the create's change while a lookup is in flight, and then
    /// that lookup's answer is not cached.
    async fn until_cached(&self, g: usize, id: &str) {
        wait_until(
            "the route cached on the gateway",
            Duration::from_secs(10),
            || async {
                if self.route(g, id).await["cached"].is_null() {
                    assert_eq!(self.health(g, id).await.status, StatusCode::NO_CONTENT);
                    None
                } else {
                    Some(())
                }
            },
        )
        .await;
    }

    /// Creates a sandbox through gateway `g`; returns (id, access token).
    async fn create(&self, g: usize) -> (String, String) {
        create_sandbox(&self.gw(g), KEY).await
    }

    /// A data-plane request for sandbox `id` through gateway `g`.
    async fn data(
        &self,
        g: usize,
        id: &str,
        method: Method,
        path: &str,
        extra: &[(&str, &str)],
        body: &'static [u8],
    ) -> Answer {
        let mut headers = vec![("e2b-sandbox-id", id), ("e2b-sandbox-port", ENVD)];
        headers.extend_from_slice(extra);
        send(
            &self.gw(g),
            method,
            path,
            &headers,
            Bytes::from_static(body),
        )
        .await
    }

    async fn health(&self, g: usize, id: &str) -> Answer {
        self.data(g, id, Method::GET, "/health", &[], b"").await
    }

    /// What gateway `g` says about its route for `id`.
    async fn route(&self, g: usize, id: &str) -> Value {
        let r = send(
            &self.gw(g),
            Method::GET,
            &format!("/_warren/v1/routes/{id}"),
            &[("x-api-key", KEY)],
            Bytes::new(),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        r.expect_json()
    }

    async fn scheduler(&self) -> SchedulerClient<tonic::transport::Channel> {
        SchedulerClient::connect(self.scheduler_url())
            .await
            .expect("scheduler gRPC")
    }

    /// Moves `id` to the other node the way a migration would: the
    /// scheduler reassigns it (new generation), the new node creates it at
    /// that generation, the assignment is recorded, and the old node drops
    /// the old generation. Returns the new placement.
    async fn move_sandbox(&self, id: &str) -> Placement {
        let mut s = self.scheduler().await;
        let before = s
            .get_sandbox(GetSandboxRequest {
                sandbox_id: id.into(),
            })
            .await
            .expect("GetSandbox")
            .into_inner();
        let placement = s
            .reassign(ReassignRequest {
                sandbox_id: id.into(),
                node_id: String::new(),
            })
            .await
            .expect("Reassign")
            .into_inner();
        assert_ne!(placement.node_id, before.node_id, "moved to the other node");
        assert!(placement.generation > before.generation);
        let binding = placement.binding.clone().unwrap_or_default();
        let created = send(
            &placement.endpoint,
            Method::POST,
            "/_warren/v1/sandboxes",
            &[("content-type", "application/json")],
            Bytes::from(
                json!({
                    "sandbox_id": id,
                    "generation": placement.generation,
                    "template_id": "base",
                    "env_vars": {},
                    "metadata": {},
                    "access_token": (!binding.access_token.is_empty()).then_some(&binding.access_token),
                    "timeout_secs": 600,
                })
                .to_string(),
            ),
        )
        .await;
        assert!(
            created.status.is_success(),
            "node create: {}",
            created.text()
        );
        s.record_assignment(RecordAssignmentRequest {
            sandbox_id: id.into(),
            node_id: placement.node_id.clone(),
            generation: placement.generation,
        })
        .await
        .expect("RecordAssignment");
        let deleted = send(
            &before.endpoint,
            Method::DELETE,
            &format!(
                "/_warren/v1/sandboxes/{id}?generation={}",
                before.generation
            ),
            &[],
            Bytes::new(),
        )
        .await;
        // 200 with the sandbox's log at its end, or 404 + marker: the old
        // node already killed it as an orphan.
        assert!(
            deleted.status == StatusCode::OK || deleted.status == StatusCode::NOT_FOUND,
            "old node delete: {} {}",
            deleted.status,
            deleted.text()
        );
        placement
    }
}

/// `Some` when gateway `g`'s watch-connected gauge reads `want`.
async fn watch_is(c: &Rig, g: usize, want: f64) -> Option<()> {
    let now = c
        .metric(g, "warren_gateway_route_cache_watch_connected", "")
        .await;
    (now == want).then_some(())
}

/// One request on a fresh client with `body` as is, answered within 30 s.
async fn send(
    addr: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Answer {
    Http::new(Duration::from_secs(30))
        .send_raw(method, addr, path, headers, body)
        .await
        .expect("http request")
}

/// `warren route` itself, against gateway `g`.
fn warren_route(c: &Rig, g: usize, id: &str, json: bool) -> String {
    let api = format!("http://{}", c.gw(g));
    let mut args = vec!["route", id, "--api-url", &api];
    if json {
        args.push("--json");
    }
    let out = std::process::Command::new(bin())
        .args(&args)
        .env("E2B_API_KEY", KEY)
        .output()
        .expect("warren route runs");
    assert!(
        out.status.success(),
        "warren route failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_routes_are_hits_misses_coalesce_and_not_found_is_never_cached() {
    let c = Rig::start(&[]).await;
    let (id, _) = c.create(0).await;

    // "Positive caching only": create taught gateway 0 the route, so its first
    // data-plane request asks the scheduler nothing.
    let before = c.lookups(0).await;
    assert_eq!(c.health(0, &id).await.status, StatusCode::NO_CONTENT);
    assert_eq!(c.lookups(0).await, before, "first request after create");
    assert_eq!(
        c.metric(0, "warren_gateway_route_cache_hits_total", "")
            .await,
        1.0
    );

    // Gateway 1 has never seen the sandbox: 200 concurrent first requests
    // share exactly one LookupNode.
    assert_eq!(c.lookups(1).await, 0.0);
    let gw1 = c.gw(1);
    let requests: Vec<_> = (0..200)
        .map(|_| {
            let (gw, id) = (gw1.clone(), id.clone());
            tokio::spawn(async move {
                let headers = [("e2b-sandbox-id", id.as_str()), ("e2b-sandbox-port", ENVD)];
                send(&gw, Method::GET, "/health", &headers, Bytes::new())
                    .await
                    .status
            })
        })
        .collect();
    for r in requests {
        assert_eq!(r.await.expect("request task"), StatusCode::NO_CONTENT);
    }
    assert_eq!(
        c.lookups(1).await,
        1.0,
        "one lookup for 200 concurrent misses"
    );
    let misses = c
        .metric(1, "warren_gateway_route_cache_misses_total", "")
        .await;
    let hits = c
        .metric(1, "warren_gateway_route_cache_hits_total", "")
        .await;
    let coalesced = c
        .metric(1, "warren_gateway_route_cache_coalesced_total", "")
        .await;
    assert_eq!(misses + hits, 200.0);
    assert_eq!(coalesced, misses - 1.0, "every miss but one waited");
    // The gauge is waited for, never read once: it only has to get there.
    wait_until(
        "the entries gauge to count the route",
        Duration::from_secs(10),
        || async {
            let n = c.metric(1, "warren_gateway_route_cache_entries", "").await;
            (n == 1.0).then_some(())
        },
    )
    .await;

    // `warren route` shows the cached route beside the scheduler's.
    let shown: Value = serde_json::from_str(&warren_route(&c, 1, &id, true)).expect("--json");
    assert_eq!(shown["sandbox_id"], id.as_str());
    assert_eq!(shown["agree"], true);
    assert_eq!(shown["cached"]["node_id"], shown["scheduler"]["node_id"]);
    assert_eq!(
        shown["cached"]["generation"],
        shown["scheduler"]["generation"]
    );
    assert_eq!(shown["scheduler"]["state"], "running");
    assert!(shown["cached"]["ttl_left_ms"].as_u64().unwrap_or(0) > 0);
    let text = warren_route(&c, 1, &id, false);
    assert!(text.contains("agree      yes"), "{text}");
    assert_eq!(
        c.lookups(1).await,
        1.0,
        "asking `warren route` is not a lookup"
    );

    // NotFound is never cached: every request for an unknown id asks again,
    // and nothing is left in the cache.
    for n in 1..=2 {
        let r = c.health(1, "doesnotexist0").await;
        assert_eq!(r.status, StatusCode::BAD_GATEWAY);
        assert_eq!(r.message(), "The sandbox was not found", "{}", r.text());
        assert_eq!(c.lookups(1).await, 1.0 + n as f64);
    }
    let shown = c.route(1, "doesnotexist0").await;
    assert_eq!(shown["cached"], Value::Null);
    assert_eq!(shown["scheduler"], Value::Null);
    // A sandbox created after this gateway answered 404s routes at once.
    let (fresh, _) = c.create(0).await;
    assert_eq!(c.health(1, &fresh).await.status, StatusCode::NO_CONTENT);
}

/// Misses for many sandboxes at once share `LookupNodes` calls (the
/// gateway batches concurrent misses): each request is still routed to
/// its own sandbox (its node checks the generation, so a route meant for
/// another would be refused and evicted as stale), and each unknown id
/// still answers "not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_for_many_sandboxes_each_get_their_own_route() {
    let c = Rig::start(&[]).await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(c.create(0).await.0);
    }
    let unknown = ["doesnotexist1", "doesnotexist2"];
    assert_eq!(c.lookups(1).await, 0.0);
    let gw1 = c.gw(1);
    let mut requests = Vec::new();
    for round in 0..3 {
        for id in ids.iter().map(String::as_str).chain(unknown) {
            if round > 0 && unknown.contains(&id) {
                continue;
            }
            let (gw, id) = (gw1.clone(), id.to_string());
            requests.push(tokio::spawn(async move {
                let headers = [("e2b-sandbox-id", id.as_str()), ("e2b-sandbox-port", ENVD)];
                let a = send(&gw, Method::GET, "/health", &headers, Bytes::new()).await;
                (id, a)
            }));
        }
    }
    for r in requests {
        let (id, a) = r.await.expect("request task");
        if unknown.contains(&id.as_str()) {
            assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{id}: {}", a.text());
            assert_eq!(a.message(), "The sandbox was not found", "{}", a.text());
        } else {
            assert_eq!(a.status, StatusCode::NO_CONTENT, "{id}: {}", a.text());
        }
    }
    // A route given to the wrong id would name another sandbox's
    // generation: its node would refuse it, and the gateway evict it.
    assert_eq!(c.evictions(1, "stale").await, 0.0);
    // One route asked per sandbox (concurrent misses for one id coalesce),
    // whatever number of calls carried them.
    assert_eq!(c.lookups(1).await, 14.0);
    let calls = c
        .metric(1, "warren_gateway_scheduler_lookup_calls_total", "")
        .await;
    eprintln!("14 routes asked in {calls} calls");
    assert!((1.0..=14.0).contains(&calls), "{calls} calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_through_one_gateway_evicts_the_other_by_watch() {
    // An hour of TTL: anything faster than that is the watch. Gateway 0
    // has no watch, so only its own delete can evict its entry.
    let c = Rig::start_each([
        &["--route-cache-ttl", "1h", "--route-cache-watch", "false"],
        &["--route-cache-ttl", "1h"],
    ])
    .await;
    let (id, _) = c.create(0).await;
    assert_eq!(c.health(1, &id).await.status, StatusCode::NO_CONTENT);
    c.until_cached(1, &id).await;

    let r = send(
        &c.gw(0),
        Method::DELETE,
        &format!("/sandboxes/{id}"),
        &[("x-api-key", KEY)],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    // The deleting gateway forgot it as soon as the fenced removal succeeded.
    assert_eq!(c.route(0, &id).await["cached"], Value::Null);
    assert_eq!(c.evictions(0, "delete").await, 1.0);

    // The other gateway hears it from the scheduler's watch.
    wait_until(
        "gateway 1 to drop the route",
        Duration::from_secs(5),
        || async { c.route(1, &id).await["cached"].is_null().then_some(()) },
    )
    .await;
    assert!(c.evictions(1, "watch").await >= 1.0);
    // So its next request is a plain lookup (not found: E2B's 502), not a
    // stale-route refetch.
    let r = c.health(1, &id).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.message(), "The sandbox was not found", "{}", r.text());
    for outcome in ["not_found", "same_node", "moved", "error"] {
        assert_eq!(c.refetches(1, outcome).await, 0.0, "{outcome}");
    }
}

/// One Connect envelope (flags 0) around a JSON message.
fn connect_envelope(msg: &Value) -> Vec<u8> {
    let body = msg.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_sandbox_is_refetched_once_and_only_replay_safe_requests_retry() {
    // No watch: the cached route stays stale until a node proves it so.
    let c = Rig::start(&["--route-cache-watch", "false", "--route-cache-ttl", "1h"]).await;
    let (id, token) = c.create(0).await;
    let auth = [("x-access-token", token.as_str())];
    assert_eq!(c.health(0, &id).await.status, StatusCode::NO_CONTENT);

    // A POST with a body is not replay-safe: after the old node's marker the
    // gateway refetches once, sees the move, and asks the client to retry.
    c.move_sandbox(&id).await;
    let lookups = c.lookups(0).await;
    let r = c
        .data(
            0,
            &id,
            Method::POST,
            "/files?path=moved.txt",
            &[auth[0], ("content-type", "application/octet-stream")],
            b"not replayed",
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.error_code(), "sandbox_moved");
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(c.lookups(0).await, lookups + 1.0, "exactly one refetch");
    assert_eq!(c.refetches(0, "moved").await, 1.0);
    assert_eq!(c.evictions(0, "stale").await, 1.0);
    assert_eq!(
        c.metric(0, "warren_gateway_route_cache_retries_total", "")
            .await,
        0.0
    );
    // The refetched route is cached: the sandbox's own 404 for the file the
    // POST would have written comes straight from the new node, untouched
    // and without a refetch (no marker on it).
    let r = c
        .data(0, &id, Method::GET, "/files?path=moved.txt", &auth, b"")
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    assert_ne!(
        r.message(),
        "The sandbox was not found",
        "envd's 404, not the gateway's"
    );
    assert_eq!(c.lookups(0).await, lookups + 1.0);
    assert_eq!(c.refetches(0, "moved").await, 1.0);

    // A replay-safe GET on a stale route: one refetch, one retry, success on
    // the new node.
    let moved = c.move_sandbox(&id).await;
    let r = c.health(0, &id).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(c.lookups(0).await, lookups + 2.0);
    assert_eq!(c.refetches(0, "moved").await, 2.0);
    assert_eq!(
        c.metric(0, "warren_gateway_route_cache_retries_total", "")
            .await,
        1.0
    );
    let shown = c.route(0, &id).await;
    assert_eq!(shown["cached"]["node_id"], moved.node_id.as_str());
    assert_eq!(shown["cached"]["generation"], moved.generation);
    assert_eq!(shown["agree"], true);

    // A small body with an Idempotency-Key is buffered and replayed.
    c.move_sandbox(&id).await;
    let r = c
        .data(
            0,
            &id,
            Method::POST,
            "/files?path=replayed.txt",
            &[
                auth[0],
                ("content-type", "application/octet-stream"),
                ("idempotency-key", "upload-1"),
            ],
            b"replayed once",
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        c.metric(0, "warren_gateway_route_cache_retries_total", "")
            .await,
        2.0
    );
    let r = c
        .data(0, &id, Method::GET, "/files?path=replayed.txt", &auth, b"")
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(&r.body[..], b"replayed once");

    // A streaming Connect Start is never replayed.
    c.move_sandbox(&id).await;
    let start =
        connect_envelope(&json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi"]}}));
    let start: &'static [u8] = Box::leak(start.into_boxed_slice());
    let r = c
        .data(
            0,
            &id,
            Method::POST,
            "/process.Process/Start",
            &[
                auth[0],
                ("content-type", "application/connect+json"),
                ("connect-protocol-version", "1"),
            ],
            start,
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert_eq!(r.error_code(), "sandbox_moved");
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(c.refetches(0, "moved").await, 4.0);
    assert_eq!(
        c.metric(0, "warren_gateway_route_cache_retries_total", "")
            .await,
        2.0
    );
    // The client's retry goes to the new node.
    let r = c
        .data(
            0,
            &id,
            Method::POST,
            "/process.Process/Start",
            &[
                auth[0],
                ("content-type", "application/connect+json"),
                ("connect-protocol-version", "1"),
            ],
            start,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("application/connect+json"),
        "{:?}",
        r.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_a_distinct_502_and_its_route_is_evicted() {
    let mut c = Rig::start(&[]).await;
    let (id, _) = c.create(0).await;
    assert_eq!(c.health(0, &id).await.status, StatusCode::NO_CONTENT);
    let node = c.route(0, &id).await["cached"]["node_id"]
        .as_str()
        .expect("cached node")
        .to_string();
    let idx = c
        .nodes
        .iter()
        .position(|n| {
            n.as_ref()
                .is_some_and(|n| n.label.contains(&format!("--node-id {node} ")))
        })
        .expect("the hosting node");
    c.kill_node(idx + 1).await;

    // The scheduler still believes in the node (its lease runs), so the one
    // refetch finds the same route: the connection failure is the answer.
    let r = c.health(0, &id).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.error_code(), "upstream_unreachable");
    assert_eq!(
        r.expect_json()["message"],
        "Failed to reach sandbox (upstream connection error)"
    );
    assert_eq!(c.refetches(0, "same_node").await, 1.0);
    assert_eq!(c.evictions(0, "stale").await, 1.0);
    assert_eq!(c.route(0, &id).await["cached"], Value::Null, "evicted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_watch_serves_cached_routes_and_resumes_where_it_stopped() {
    let mut c = Rig::start(&["--route-cache-ttl", "1h"]).await;
    let (id, _) = c.create(0).await;
    assert_eq!(c.health(1, &id).await.status, StatusCode::NO_CONTENT);
    c.until_cached(1, &id).await;
    let revision = c
        .metric(1, "warren_gateway_route_cache_watch_revision", "")
        .await;
    let addr = c.scheduler.addr("scheduler grpc");
    c.scheduler.kill9().await;
    wait_until("the watch to notice", Duration::from_secs(10), || {
        watch_is(&c, 1, 0.0)
    })
    .await;
    // Without the scheduler, known sandboxes still route (within the TTL)...
    assert_eq!(c.health(1, &id).await.status, StatusCode::NO_CONTENT);
    // ...and unknown ones cannot be looked up.
    let r = c.health(1, "neverseen0").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.error_code(), "routing_unavailable");

    // The scheduler comes back on the same address and store: the watch
    // reconnects and resumes from its revision (no resync, so the cached
    // route survives).
    c.restart_scheduler(&addr)
        .await
        .expect("scheduler restarts");
    wait_until("the watch to reconnect", Duration::from_secs(20), || {
        watch_is(&c, 1, 1.0)
    })
    .await;
    assert!(c.route(1, &id).await["cached"].is_object());
    assert!(
        c.metric(1, "warren_gateway_route_cache_watch_revision", "")
            .await
            >= revision
    );
    // And it evicts again: a delete through gateway 0 reaches gateway 1.
    let r = send(
        &c.gw(0),
        Method::DELETE,
        &format!("/sandboxes/{id}"),
        &[("x-api-key", KEY)],
        Bytes::new(),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    wait_until(
        "gateway 1 to drop the route",
        Duration::from_secs(5),
        || async { c.route(1, &id).await["cached"].is_null().then_some(()) },
    )
    .await;
}
