//! Node loss heals in seconds (ARCHITECTURE.md invariants "Fenced writes"
//! and "Heal, don't wait"), with
//! real processes: a scheduler with a short lease, two nodes, a gateway.
//!
//! `kill -9` one node: its sandboxes answer the node-down 502 within the lease
//! plus a sweep, never hang; creates land on the survivor, whose sandboxes keep
//! working throughout; a lost sandbox can still be deleted; restarting the dead
//! node with the same id cleans what it must not serve; a delayed DELETE from
//! before a re-assignment changes nothing; a black-holed node costs a request
//! at most about the connect timeout.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use http::{Method, StatusCode};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;
use warren_proto::scheduler::v1::{
    EventType, GetSandboxRequest, HeartbeatRequest, ListNodesRequest, NodeState, PlaceRequest,
    ReassignRequest, RecordAssignmentRequest, RegisterNodeRequest, ReportSandboxEventRequest,
    SandboxEvent,
};
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::{Answer, Http};
use warren_test_support::wait_until;

const KEY: &str = "key-team-a";
const LEASE: &str = "1500ms";

fn bin() -> &'static std::path::Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

async fn scheduler(c: &Cluster) -> SchedulerClient<Channel> {
    SchedulerClient::connect(c.scheduler_url())
        .await
        .expect("scheduler reachable")
}

/// Creates a sandbox through the gateway; returns (sandbox id, node id).
async fn create(http: &Http, gw: &str) -> (String, String) {
    let a = http
        .send(
            Method::POST,
            gw,
            "/sandboxes",
            &[("x-api-key", KEY)],
            Some(json!({"templateID": "base", "timeout": 600})),
        )
        .await
        .expect("create answers");
    assert_eq!(a.status, StatusCode::CREATED, "create: {:?}", a.json);
    (a.str("sandboxID"), a.str("clientID"))
}

/// `GET /health` on the sandbox's envd, through the gateway's data plane.
async fn health(http: &Http, gw: &str, id: &str) -> anyhow::Result<Answer> {
    http.send(
        Method::GET,
        gw,
        "/health",
        &[("e2b-sandbox-id", id), ("e2b-sandbox-port", "49983")],
        None,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_heals_in_seconds_and_comes_back_clean() {
    let spec = Spec {
        // This test calls the node's or the scheduler's API directly.
        tls: false,
        nodes: 2,
        scheduler_args: vec![
            "--lease".into(),
            LEASE.into(),
            "--sweep-interval".into(),
            "200ms".into(),
        ],
        gateway_args: vec!["--connect-timeout".into(), "500ms".into()],
        ..Spec::default()
    };
    let mut c = Cluster::start(bin(), spec).await.expect("cluster starts");
    let gw = c.gateway(0);
    let http = Http::new(Duration::from_secs(10));

    // Four sandboxes: placement spreads them over both nodes.
    let mut on1 = Vec::new();
    let mut on2 = Vec::new();
    for _ in 0..4 {
        let (id, node) = create(&http, &gw).await;
        match node.as_str() {
            "node-1" => on1.push(id),
            "node-2" => on2.push(id),
            other => panic!("placed on unknown node {other:?}"),
        }
    }
    assert!(
        on1.len() >= 2 && on2.len() >= 2,
        "placement did not spread: {on1:?} {on2:?}"
    );

    // The survivor's sandboxes must keep working throughout: a poller counts
    // any answer that is not 204 from its envd.
    let survivor_failures = Arc::new(AtomicU64::new(0));
    let survivor_checks = Arc::new(AtomicU64::new(0));
    let poller = {
        let (http, gw, id) = (http.clone(), gw.clone(), on2[0].clone());
        let (fails, checks) = (survivor_failures.clone(), survivor_checks.clone());
        tokio::spawn(async move {
            loop {
                match health(&http, &gw, &id).await {
                    Ok(a) if a.status == StatusCode::NO_CONTENT => {}
                    other => {
                        eprintln!("survivor check failed: {other:?}");
                        fails.fetch_add(1, Ordering::SeqCst);
                    }
                }
                checks.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // kill -9 node-1. Until its lease expires, requests for its sandboxes get
    // a fast 502 "Failed to reach sandbox"; then the node-down 502.
    let killed_at = Instant::now();
    c.kill_node(1).await;
    let mut saw_unreachable = false;
    let first_node_down = loop {
        let started = Instant::now();
        let a = health(&http, &gw, &on1[0])
            .await
            .expect("a request for a dead node's sandbox answers instead of hanging");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a request for a dead node's sandbox took {:?}",
            started.elapsed()
        );
        assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{:?}", a.json);
        match a.str("error_code").as_str() {
            "node_down" => {
                assert_eq!(
                    a.str("message"),
                    format!("sandbox {} is on a node that is down", on1[0])
                );
                break killed_at.elapsed();
            }
            "upstream_unreachable" => {
                assert_eq!(
                    a.str("message"),
                    "Failed to reach sandbox (upstream connection error)"
                );
                saw_unreachable = true;
            }
            other => panic!("unexpected error code {other:?}: {:?}", a.json),
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(30),
            "no node-down answer 30s after kill -9"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!(
        "kill -9 -> first node-down answer: {} ms (lease {LEASE}, sweep 200ms; saw upstream_unreachable before: {saw_unreachable})",
        first_node_down.as_millis()
    );
    // Every sandbox of the dead node says so, not just the first.
    for id in &on1 {
        let a = health(&http, &gw, id).await.expect("answers");
        assert_eq!(a.str("error_code"), "node_down", "{id}: {:?}", a.json);
    }

    // The gateway learns of the loss from its watch, and measures how long
    // after the lease expired (one observation per lost sandbox). The watch
    // may deliver after the lookups above already answered node-down, so
    // the count is waited for.
    let admin = c.gateways[0].addr("gateway admin");
    wait_until(
        "one node-loss observation per lost sandbox",
        Duration::from_secs(10),
        || {
            let (http, admin) = (http.clone(), admin.clone());
            let lost = on1.len() as f64;
            async move {
                let metrics = http
                    .send(Method::GET, &admin, "/metrics", &[], None)
                    .await
                    .ok()?
                    .json;
                let count: f64 = metrics.as_str()?.lines().find_map(|l| {
                    l.strip_prefix("warren_gateway_node_loss_eviction_seconds_count ")?
                        .trim()
                        .parse()
                        .ok()
                })?;
                (count >= lost).then_some(())
            }
        },
    )
    .await;

    // New sandboxes avoid the dead node.
    for _ in 0..3 {
        let (_, node) = create(&http, &gw).await;
        assert_eq!(node, "node-2", "a create landed on the dead node");
    }
    let mut sched = scheduler(&c).await;
    let nodes = sched
        .list_nodes(ListNodesRequest {})
        .await
        .expect("ListNodes")
        .into_inner()
        .nodes;
    let n1 = nodes
        .iter()
        .find(|n| n.node_id == "node-1")
        .expect("node-1 listed");
    assert_eq!(n1.state, NodeState::Down as i32);

    // A lost sandbox can still be deleted: the binding goes now, the node
    // kills the orphan if it ever comes back.
    let deleted = on1[0].clone();
    let a = http
        .send(
            Method::DELETE,
            &gw,
            &format!("/sandboxes/{deleted}"),
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect("delete answers");
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{:?}", a.json);
    let a = health(&http, &gw, &deleted).await.expect("answers");
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{:?}", a.json);
    // E2B's answer for a sandbox that is gone: no error_code, its id.
    assert_eq!(
        a.str("message"),
        "The sandbox was not found",
        "{:?}",
        a.json
    );
    assert_eq!(a.str("sandboxId"), deleted, "{:?}", a.json);

    // Move another lost sandbox to node-2 (a new generation), as an operator
    // recovering it would: Reassign, create on the node, RecordAssignment.
    let moved = on1[1].clone();
    let old = sched
        .get_sandbox(GetSandboxRequest {
            sandbox_id: moved.clone(),
        })
        .await
        .expect("GetSandbox")
        .into_inner();
    let placement = sched
        .reassign(ReassignRequest {
            sandbox_id: moved.clone(),
            node_id: "node-2".into(),
        })
        .await
        .expect("Reassign")
        .into_inner();
    assert!(placement.generation > old.generation);
    let a = http
        .send(
            Method::POST,
            &c.node(2),
            "/_warren/v1/sandboxes",
            &[],
            Some(json!({
                "sandbox_id": moved,
                "generation": placement.generation,
                "template_id": "base",
                "env_vars": {},
                "metadata": {},
                "access_token": old.access_token,
            })),
        )
        .await
        .expect("node create answers");
    assert_eq!(a.status, StatusCode::CREATED, "{:?}", a.json);
    sched
        .record_assignment(RecordAssignmentRequest {
            sandbox_id: moved.clone(),
            node_id: "node-2".into(),
            generation: placement.generation,
        })
        .await
        .expect("RecordAssignment");
    let a = health(&http, &gw, &moved).await.expect("answers");
    assert_eq!(
        a.status,
        StatusCode::NO_CONTENT,
        "moved sandbox: {:?}",
        a.json
    );

    // A delayed DELETE from before the move changes nothing (fenced).
    let results = sched
        .report_sandbox_event(ReportSandboxEventRequest {
            node_id: "node-1".into(),
            events: vec![SandboxEvent {
                sandbox_id: moved.clone(),
                generation: old.generation,
                r#type: EventType::Delete as i32,
                paused_record: None,
                logs: Vec::new(),
            }],
        })
        .await
        .expect("ReportSandboxEvent")
        .into_inner()
        .results;
    assert!(
        !results[0].applied,
        "a stale DELETE was applied: {results:?}"
    );
    let a = health(&http, &gw, &moved).await.expect("answers");
    assert_eq!(a.status, StatusCode::NO_CONTENT, "{:?}", a.json);

    // Restart node-1 with the same id: nothing routes to its stale sandboxes.
    c.restart_node(1).await.expect("node-1 restarts");
    let node1 = c.node(1);
    wait_until("node-1 is up again", Duration::from_secs(10), || {
        let mut sched = sched.clone();
        async move {
            let nodes = sched
                .list_nodes(ListNodesRequest {})
                .await
                .ok()?
                .into_inner()
                .nodes;
            nodes
                .iter()
                .any(|n| n.node_id == "node-1" && n.state == NodeState::Up as i32)
                .then_some(())
        }
    })
    .await;
    for id in &on1 {
        let a = wait_until(
            &format!("{id} stops saying node-down"),
            Duration::from_secs(10),
            || {
                let (http, gw) = (http.clone(), gw.clone());
                async move {
                    let a = health(&http, &gw, id).await.ok()?;
                    (a.str("error_code") != "node_down").then_some(a)
                }
            },
        )
        .await;
        if *id == moved {
            assert_eq!(a.status, StatusCode::NO_CONTENT, "{:?}", a.json);
        } else {
            assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{id}: {:?}", a.json);
            assert_eq!(
                a.str("message"),
                "The sandbox was not found",
                "{id}: {:?}",
                a.json
            );
            assert_eq!(a.str("sandboxId"), *id, "{id}: {:?}", a.json);
        }
    }
    let roster = http
        .send(Method::GET, &node1, "/_warren/v1/sandboxes", &[], None)
        .await
        .expect("node-1 lists")
        .json;
    let hosted: Vec<&str> = roster["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["sandbox_id"].as_str())
        .collect();
    for id in &on1 {
        assert!(
            !hosted.contains(&id.as_str()),
            "restarted node-1 still hosts {id}"
        );
    }

    poller.abort();
    let checks = survivor_checks.load(Ordering::SeqCst);
    assert!(checks > 20, "the survivor poller barely ran ({checks})");
    assert_eq!(
        survivor_failures.load(Ordering::SeqCst),
        0,
        "the surviving node's sandbox failed during the outage ({checks} checks)"
    );
}

/// A listener whose accept queue is full: further connects get no answer at
/// all, as with a black-holed host.
async fn black_hole() -> (String, Vec<tokio::net::TcpStream>) {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = sock.listen(1).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut held = Vec::new();
    // Fill the queue until a connect no longer completes.
    for _ in 0..16 {
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(s)) => held.push(s),
            _ => break,
        }
    }
    std::mem::forget(listener);
    (addr.to_string(), held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_node_costs_a_request_about_the_connect_timeout() {
    let spec = Spec {
        // This test calls the node's or the scheduler's API directly.
        tls: false,
        nodes: 1,
        gateway_args: vec!["--connect-timeout".into(), "500ms".into()],
        ..Spec::default()
    };
    let c = Cluster::start(bin(), spec).await.expect("cluster starts");
    let gw = c.gateway(0);
    let http = Http::new(Duration::from_secs(30));
    let (hole, _held) = black_hole().await;

    // A "node" at the black hole, kept alive by heartbeats from this test.
    let mut sched = scheduler(&c).await;
    sched
        .register_node(RegisterNodeRequest {
            node_id: "hole".into(),
            endpoint: hole.clone(),
            capacity: 10,
            incarnation: 7,
            roster: vec![],
            cached_layers: vec![],
            ..Default::default()
        })
        .await
        .expect("RegisterNode");
    let beat = {
        let mut sched = sched.clone();
        tokio::spawn(async move {
            loop {
                let _ = sched
                    .heartbeat(HeartbeatRequest {
                        node_id: "hole".into(),
                        incarnation: 7,
                        roster: vec![],
                        cached_layers: vec![],
                        paused: Vec::new(),
                        lists_paused: false,
                    })
                    .await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let placed = sched
        .place(PlaceRequest {
            template_id: "base".into(),
            team_id: "team-a".into(),
            timeout_secs: 600,
            require_node_id: "hole".into(),
            ..Default::default()
        })
        .await
        .expect("Place")
        .into_inner();
    sched
        .record_assignment(RecordAssignmentRequest {
            sandbox_id: placed.sandbox_id.clone(),
            node_id: "hole".into(),
            generation: placed.generation,
        })
        .await
        .expect("RecordAssignment");

    let started = Instant::now();
    let a = health(&http, &gw, &placed.sandbox_id)
        .await
        .expect("the gateway answers instead of hanging");
    let took = started.elapsed();
    println!(
        "black-holed node: answered {} in {took:?} (connect timeout 500ms)",
        a.status
    );
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{:?}", a.json);
    assert_eq!(
        a.str("message"),
        "Failed to reach sandbox (upstream connection error)"
    );
    // Not a latency benchmark: the bound only separates "about the connect
    // timeout" (one attempt plus one refetch) from an OS connect that hangs
    // for a minute or more.
    assert!(
        took < Duration::from_secs(5),
        "a black-holed node held the request for {took:?}"
    );
    beat.abort();
}
