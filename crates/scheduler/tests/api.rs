//! The scheduler's main request paths against a real server and SQLite file:
//! place → record → lookup, fenced deletes, idempotent places, capacity,
//! listing, timeouts, node events, and durability across a restart.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::collections::{HashMap, HashSet};
use tonic::Code;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::{BindingState, EventType};

async fn place_record_lookup(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;

    let mut req = place_req("team-1");
    req.metadata = HashMap::from([("owner".into(), "me".into())]);
    req.timeout_secs = 60;
    let p = c.place(req).await.unwrap().into_inner();
    warren_core::id::validate_sandbox_id(&p.sandbox_id).unwrap();
    assert_eq!(p.node_id, "node-a");
    assert_eq!(p.endpoint, "node-a.test:7000");
    assert_eq!(p.state, BindingState::Creating as i32);
    assert!(p.generation >= 1);
    assert!(!p.existing);
    let b = p.binding.clone().unwrap();
    assert_eq!(b.access_token.len(), 32);
    assert_eq!(b.end_at_ms - b.started_at_ms, 60_000);
    assert_eq!(b.metadata.get("owner").map(String::as_str), Some("me"));

    // A placement is routable while the node creates it.
    let route = lookup(&mut c, &p.sandbox_id).await.unwrap();
    assert_eq!(route.state, BindingState::Creating as i32);

    let rec = pb::RecordAssignmentRequest {
        sandbox_id: p.sandbox_id.clone(),
        node_id: "node-a".into(),
        generation: p.generation,
    };
    let b = c.record_assignment(rec.clone()).await.unwrap().into_inner();
    assert_eq!(b.state, BindingState::Running as i32);
    // The node retrying its report changes nothing and still succeeds.
    let again = c.record_assignment(rec).await.unwrap().into_inner();
    assert_eq!(again.state, BindingState::Running as i32);
    assert_eq!(again.generation, p.generation);

    let route = lookup(&mut c, &p.sandbox_id).await.unwrap();
    assert_eq!(route.node_id, "node-a");
    assert_eq!(route.endpoint, "node-a.test:7000");
    assert_eq!(route.generation, p.generation);
    assert_eq!(route.state, BindingState::Running as i32);
    assert_eq!(route.team_id, "team-1");

    let got = get(&mut c, &p.sandbox_id).await.unwrap();
    assert_eq!(got.template_id, "base");
    assert_eq!(got.team_id, "team-1");

    let nodes = nodes(&mut c).await;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].sandboxes, 1);
    assert_eq!(nodes[0].state, pb::NodeState::Up as i32);
    s.stop().await;
}

/// node id → sandboxes on it, as `ListNodes` reports.
async fn counts(c: &mut Client) -> std::collections::BTreeMap<String, u32> {
    nodes(c)
        .await
        .into_iter()
        .map(|n| (n.node_id, n.sandboxes))
        .collect()
}

async fn delayed_delete_of_an_old_generation_leaves_the_new_binding(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    register(&mut c, "node-b", 10).await;
    let p = running(&mut c, "team").await;
    let old_node = p.node_id.clone();

    let moved = c
        .reassign(pb::ReassignRequest {
            sandbox_id: p.sandbox_id.clone(),
            node_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        moved.node_id, old_node,
        "an empty target means another node"
    );
    assert!(moved.generation > p.generation);
    assert_eq!(moved.state, BindingState::Creating as i32);
    // Each node's count (what `warren node ls` shows, and what placement
    // weighs) followed the move.
    assert_eq!(
        counts(&mut c).await,
        [(old_node.clone(), 0), (moved.node_id.clone(), 1)].into()
    );

    // The old node's DELETE arrives late: the fence does not match.
    let r = event(
        &mut c,
        &old_node,
        &p.sandbox_id,
        p.generation,
        EventType::Delete,
    )
    .await;
    assert!(!r.applied, "stale delete applied: {r:?}");
    assert!(r.reason.contains("generation"), "{}", r.reason);
    let route = lookup(&mut c, &p.sandbox_id).await.unwrap();
    assert_eq!(route.node_id, moved.node_id);
    assert_eq!(route.generation, moved.generation);

    // The old generation cannot be recorded either.
    let stale = c
        .record_assignment(pb::RecordAssignmentRequest {
            sandbox_id: p.sandbox_id.clone(),
            node_id: old_node.clone(),
            generation: p.generation,
        })
        .await;
    assert_status(stale, Code::FailedPrecondition, "generation");

    // The current one removes it.
    let r = event(
        &mut c,
        &moved.node_id,
        &p.sandbox_id,
        moved.generation,
        EventType::Delete,
    )
    .await;
    assert!(r.applied, "{r:?}");
    assert_eq!(
        counts(&mut c).await,
        [(old_node.clone(), 0), (moved.node_id.clone(), 0)].into(),
        "the stale delete counted nothing, the current one its node's sandbox"
    );
    assert_status(
        lookup(&mut c, &p.sandbox_id).await,
        Code::NotFound,
        "not found",
    );
    s.stop().await;
}

async fn the_same_idempotency_key_returns_the_same_sandbox(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let mut req = place_req("team-1");
    req.idempotency_key = "retry-me".into();

    let first = c.place(req.clone()).await.unwrap().into_inner();
    let second = c.place(req.clone()).await.unwrap().into_inner();
    assert_eq!(second.sandbox_id, first.sandbox_id);
    assert_eq!(second.generation, first.generation);
    assert!(!first.existing);
    assert!(second.existing);
    assert_eq!(all_sandboxes(&mut c).await.len(), 1, "no second binding");

    req.team_id = "team-2".into();
    let other = c.place(req).await.unwrap().into_inner();
    assert_ne!(other.sandbox_id, first.sandbox_id, "keys are per team");
    assert_eq!(all_sandboxes(&mut c).await.len(), 2);
    s.stop().await;
}

async fn placement_spreads_load_and_respects_capacity(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 1).await;
    register(&mut c, "node-b", 1).await;

    let a = place(&mut c, "t").await;
    let b = place(&mut c, "t").await;
    assert_ne!(a.node_id, b.node_id, "least loaded first");
    let full = c.place(place_req("t")).await;
    let st = assert_status(full, Code::ResourceExhausted, "capacity");
    assert_eq!(
        reason(&st).as_deref(),
        Some(warren_proto::REASON_NO_CAPACITY)
    );

    // Freeing a slot on node-a makes require_node_id land there.
    let r = event(
        &mut c,
        &a.node_id,
        &a.sandbox_id,
        a.generation,
        EventType::Delete,
    )
    .await;
    assert!(r.applied);
    let mut req = place_req("t");
    req.require_node_id = a.node_id.clone();
    let pinned = c.place(req).await.unwrap().into_inner();
    assert_eq!(pinned.node_id, a.node_id);
    s.stop().await;
}

/// A gateway re-placing a create it could not deliver names the node to
/// avoid: never picked, even when it is the least loaded; with no other
/// node with room, no capacity.
async fn placement_avoids_the_node_it_is_told_to(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    register(&mut c, "node-b", 4).await;
    // node-b is busier, so node-a would be picked.
    let mut req = place_req("t");
    req.require_node_id = "node-b".into();
    c.place(req).await.unwrap();
    for _ in 0..3 {
        let mut req = place_req("t");
        req.avoid_node_id = "node-a".into();
        let p = c.place(req).await.unwrap().into_inner();
        assert_eq!(p.node_id, "node-b");
    }
    // node-b is full now: avoiding node-a leaves no node with room.
    let mut req = place_req("t");
    req.avoid_node_id = "node-a".into();
    let st = assert_status(c.place(req).await, Code::ResourceExhausted, "capacity");
    assert_eq!(
        reason(&st).as_deref(),
        Some(warren_proto::REASON_NO_CAPACITY)
    );
    let mut req = place_req("t");
    req.avoid_node_id = "Bad Node".into();
    assert_status(c.place(req).await, Code::InvalidArgument, "node");
    s.stop().await;
}

/// A node whose cache holds the layer asked for is chosen before an
/// emptier one in the same load quarter, never over a much emptier one
/// (every live node can take any sandbox); what it holds is what its last
/// heartbeat said. A bad digest, or too many, is refused.
async fn placement_prefers_a_node_holding_the_layer(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let layer = format!("sha256-{}", "ab".repeat(32));
    let other = format!("sha256-{}", "cd".repeat(32));
    let inc_a = register(&mut c, "node-a", 8).await;
    let inc_b = register(&mut c, "node-b", 8).await;
    heartbeat_layers(&c, "node-b", inc_b, vec![other.clone(), layer.clone()]).await;
    // node-b is busier (1 of 8, against 0 of 8), same quarter: it holds it.
    let mut req = place_req("t");
    req.require_node_id = "node-b".into();
    c.place(req).await.unwrap();
    let want = |l: &str| {
        let mut req = place_req("t");
        req.prefer_layer = l.to_string();
        req
    };
    let p = c.place(want(&layer)).await.unwrap().into_inner();
    assert_eq!(p.node_id, "node-b");
    // Without a preference, the emptier one.
    let p = c.place(place_req("t")).await.unwrap().into_inner();
    assert_eq!(p.node_id, "node-a");
    // node-b at 3 of 8 (the second quarter), node-a at 1: load wins.
    let mut req = place_req("t");
    req.require_node_id = "node-b".into();
    c.place(req).await.unwrap();
    let p = c.place(want(&layer)).await.unwrap().into_inner();
    assert_eq!(p.node_id, "node-a");
    // A heartbeat replaces what a node holds.
    heartbeat_layers(&c, "node-a", inc_a, vec![layer.clone()]).await;
    heartbeat_layers(&c, "node-b", inc_b, vec![]).await;
    let p = c.place(want(&layer)).await.unwrap().into_inner();
    assert_eq!(p.node_id, "node-a");
    assert_status(
        c.place(want("sha256-x")).await,
        Code::InvalidArgument,
        "prefer_layer",
    );
    let st = c
        .clone()
        .heartbeat(pb::HeartbeatRequest {
            node_id: "node-a".into(),
            incarnation: inc_a,
            roster: vec![],
            cached_layers: vec![layer.clone(); 1001],
            paused: Vec::new(),
            lists_paused: false,
        })
        .await;
    assert_status(st, Code::InvalidArgument, "cached_layers");
    s.stop().await;
}

async fn heartbeat_layers(c: &Client, node_id: &str, incarnation: u64, layers: Vec<String>) {
    c.clone()
        .heartbeat(pb::HeartbeatRequest {
            node_id: node_id.into(),
            incarnation,
            roster: vec![],
            cached_layers: layers,
            paused: Vec::new(),
            lists_paused: false,
        })
        .await
        .unwrap();
}

async fn list_filters_and_pages(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 100).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let mut req = place_req(if i < 4 { "team-1" } else { "team-2" });
        req.metadata = HashMap::from([
            (
                "parity".into(),
                (if i % 2 == 0 { "even" } else { "odd" }).into(),
            ),
            ("app".into(), "x".into()),
        ]);
        let p = c.place(req).await.unwrap().into_inner();
        if i == 0 {
            c.record_assignment(pb::RecordAssignmentRequest {
                sandbox_id: p.sandbox_id.clone(),
                node_id: p.node_id.clone(),
                generation: p.generation,
            })
            .await
            .unwrap();
        }
        ids.push(p.sandbox_id);
    }

    // Pages of 2 over team-1's 4 sandboxes, in id order, no repeats.
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let r = c
            .list_sandboxes(pb::ListSandboxesRequest {
                team_id: "team-1".into(),
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.sandboxes.len() <= 2);
        seen.extend(r.sandboxes.into_iter().map(|b| b.sandbox_id));
        pages += 1;
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    let mut want: Vec<String> = ids[..4].to_vec();
    want.sort();
    assert_eq!(seen, want);
    assert!(pages >= 2);

    let list = |req: pb::ListSandboxesRequest| {
        let mut c = c.clone();
        async move { c.list_sandboxes(req).await.unwrap().into_inner().sandboxes }
    };
    let even = list(pb::ListSandboxesRequest {
        metadata: HashMap::from([("parity".into(), "even".into()), ("app".into(), "x".into())]),
        ..Default::default()
    })
    .await;
    assert_eq!(even.len(), 3, "ids 0, 2, 4");
    let running = list(pb::ListSandboxesRequest {
        states: vec![BindingState::Running as i32],
        ..Default::default()
    })
    .await;
    assert_eq!(running.len(), 1);
    assert_eq!(running[0].sandbox_id, ids[0]);
    let on_node = list(pb::ListSandboxesRequest {
        node_id: "node-a".into(),
        team_id: "team-2".into(),
        ..Default::default()
    })
    .await;
    assert_eq!(on_node.len(), 1);
    let none = list(pb::ListSandboxesRequest {
        node_id: "node-zzz".into(),
        ..Default::default()
    })
    .await;
    assert!(none.is_empty());
    s.stop().await;
}

async fn timeouts_pause_and_resume(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "t").await;
    let id = p.sandbox_id.clone();

    let r = event(&mut c, "node-a", &id, p.generation, EventType::Pause).await;
    assert!(r.applied, "{r:?}");
    assert_eq!(
        get(&mut c, &id).await.unwrap().state,
        BindingState::Paused as i32
    );
    let r = event(&mut c, "node-a", &id, p.generation, EventType::Resume).await;
    assert!(r.applied, "{r:?}");
    assert_eq!(
        get(&mut c, &id).await.unwrap().state,
        BindingState::Running as i32
    );

    let later = warren_core::time::now_ms() + 3_600_000;
    let b = c
        .set_timeout(pb::SetTimeoutRequest {
            sandbox_id: id.clone(),
            end_at_ms: later,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.end_at_ms, later);
    assert_eq!(b.state, BindingState::Running as i32);

    // An end in the past: EXPIRING, handed to the node on its next heartbeat.
    let q = running(&mut c, "t").await;
    for sandbox_id in [&id, &q.sandbox_id] {
        let b = c
            .set_timeout(pb::SetTimeoutRequest {
                sandbox_id: sandbox_id.clone(),
                end_at_ms: 1,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(b.state, BindingState::Expiring as i32);
    }
    assert_eq!(
        lookup(&mut c, &id).await.unwrap().state,
        BindingState::Expiring as i32
    );
    let extend = c
        .set_timeout(pb::SetTimeoutRequest {
            sandbox_id: id.clone(),
            end_at_ms: later,
        })
        .await;
    assert_status(extend, Code::FailedPrecondition, "expiring");
    // The node still hosts `id`, and no longer `q` (killed, DELETE lost).
    let hb = c
        .heartbeat(pb::HeartbeatRequest {
            node_id: "node-a".into(),
            incarnation: inc,
            roster: vec![sref(&id, p.generation)],
            cached_layers: vec![],
            paused: Vec::new(),
            lists_paused: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.expired, vec![sref(&id, p.generation)]);
    assert!(hb.orphans.is_empty());
    assert_status(
        get(&mut c, &q.sandbox_id).await,
        Code::NotFound,
        "not found",
    );
    let r = event(&mut c, "node-a", &id, p.generation, EventType::Delete).await;
    assert!(r.applied);
    assert_status(get(&mut c, &id).await, Code::NotFound, &id);
    s.stop().await;
}

async fn restart_keeps_bindings_and_never_reuses_generations(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "team-r").await;
    let before = get(&mut c, &p.sandbox_id).await.unwrap();
    drop(c);
    s.stop().await;
    if let TestStore::Sqlite(dir) = &store {
        assert!(dir.path().join("scheduler.db").exists());
    }

    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let after = get(&mut c, &p.sandbox_id).await.unwrap();
    assert_eq!(after, before);
    let route = lookup(&mut c, &p.sandbox_id).await.unwrap();
    assert_eq!(route.generation, p.generation);
    assert_eq!(nodes(&mut c).await.len(), 1);
    let next = place(&mut c, "team-r").await;
    assert!(next.generation > p.generation);
    s.stop().await;
}

async fn concurrent_places_never_exceed_capacity_or_duplicate_a_key(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;

    // Phase 1: ten callers retry the same create concurrently.
    let burst = |n: usize, key: &'static str| {
        let c = c.clone();
        async move {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let mut c = c.clone();
                    let mut req = place_req("t");
                    req.idempotency_key = key.into();
                    tokio::spawn(async move { c.place(req).await.map(|r| r.into_inner()) })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        }
    };
    let keyed: HashSet<_> = burst(10, "same")
        .await
        .into_iter()
        .map(|r| r.unwrap().sandbox_id)
        .collect();
    assert_eq!(keyed.len(), 1, "one sandbox for one idempotency key");

    // Phase 2: twenty creates race for the nine slots left.
    let mut placed = keyed.clone();
    let mut refused = 0;
    for r in burst(20, "").await {
        match r {
            Ok(p) => assert!(placed.insert(p.sandbox_id)),
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 11);
    let stored = all_sandboxes(&mut c).await;
    let stored_ids: HashSet<_> = stored.iter().map(|b| b.sandbox_id.clone()).collect();
    assert_eq!(
        stored_ids, placed,
        "exactly the placements answered are stored"
    );
    assert_eq!(stored.len(), 10, "capacity is 10");
    let generations: HashSet<_> = stored.iter().map(|b| b.generation).collect();
    assert_eq!(generations.len(), 10, "generations are never shared");
    s.stop().await;
}

/// E2B's listing order: by start time, newest first or oldest first, in
/// pages that continue the order (a token only continues its own order).
async fn lists_by_start_time_across_pages(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let mut made = Vec::new();
    for _ in 0..4 {
        made.push(running(&mut c, "team-o").await.sandbox_id);
        // Start times are kept to the millisecond; make them differ.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    for (order, want) in [
        (
            pb::ListOrder::StartedDesc,
            made.iter().rev().cloned().collect::<Vec<_>>(),
        ),
        (pb::ListOrder::StartedAsc, made.clone()),
    ] {
        let (mut seen, mut token) = (Vec::new(), String::new());
        loop {
            let r = c
                .list_sandboxes(pb::ListSandboxesRequest {
                    team_id: "team-o".into(),
                    page_size: 3,
                    page_token: token.clone(),
                    order: order as i32,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            seen.extend(r.sandboxes.into_iter().map(|b| b.sandbox_id));
            if r.next_page_token.is_empty() {
                break;
            }
            token = r.next_page_token;
        }
        assert_eq!(seen, want, "{order:?}");
    }
    let first = c
        .list_sandboxes(pb::ListSandboxesRequest {
            team_id: "team-o".into(),
            page_size: 1,
            order: pb::ListOrder::StartedDesc as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let wrong = c
        .list_sandboxes(pb::ListSandboxesRequest {
            team_id: "team-o".into(),
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await;
    assert_status(wrong, Code::InvalidArgument, "for this order");
    s.stop().await;
}

/// A heartbeat says when the node's next sandbox ends, and the heartbeat
/// after that end hands it over to be killed (without waiting for a sweep).
async fn heartbeats_say_when_the_next_sandbox_ends(store: TestStore) {
    // A sweep far away: only the heartbeat can expire the sandbox here.
    let s = Sched::start(&store, &["--sweep-interval", "1h"]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "t").await;
    let hb = |c: &mut Client| {
        let mut c = c.clone();
        let roster = vec![sref(&p.sandbox_id, p.generation)];
        async move {
            c.heartbeat(pb::HeartbeatRequest {
                node_id: "node-a".into(),
                incarnation: inc,
                roster,
                cached_layers: vec![],
                paused: Vec::new(),
                lists_paused: false,
            })
            .await
            .unwrap()
            .into_inner()
        }
    };
    let r = hb(&mut c).await;
    assert!(r.next_end_in_ms > 1_000, "the default timeout: {r:?}");
    assert!(r.expired.is_empty());
    let end = warren_core::time::now_ms() + 300;
    c.set_timeout(pb::SetTimeoutRequest {
        sandbox_id: p.sandbox_id.clone(),
        end_at_ms: end,
    })
    .await
    .unwrap();
    let r = hb(&mut c).await;
    assert!(
        (1..=300).contains(&r.next_end_in_ms),
        "the new end is due within 300 ms: {r:?}"
    );
    while warren_core::time::now_ms() <= end {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let r = hb(&mut c).await;
    assert_eq!(r.expired, vec![sref(&p.sandbox_id, p.generation)]);
    assert_eq!(r.next_end_in_ms, 0, "nothing else ends");
    assert_eq!(
        get(&mut c, &p.sandbox_id).await.unwrap().state,
        BindingState::Expiring as i32
    );
    s.stop().await;
}

/// The sandbox's envd token, as its team's gateway asks for it.
async fn access_token(c: &mut Client, sandbox_id: &str) -> String {
    c.get_access_token(pb::GetAccessTokenRequest {
        sandbox_id: sandbox_id.into(),
        team_id: "team-1".into(),
    })
    .await
    .unwrap()
    .into_inner()
    .access_token
}

/// An attacker with a copy of the database finds no envd token and no
/// `envVars` value: both are sealed. Values an older version stored in
/// the clear are sealed again at the next start, and read the same.
async fn tokens_and_env_vars_are_sealed_at_rest(store: TestStore) {
    use sqlx::Row;
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let marker = format!("sk-{:032x}", rand::random::<u128>());
    let mut req = place_req("team-1");
    req.env_vars = HashMap::from([("OPENAI_API_KEY".into(), marker.clone())]);
    let p = c.place(req).await.unwrap().into_inner();
    record(&mut c, &p).await;
    let token = p.binding.clone().unwrap().access_token;
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&store.raw_url()).await.unwrap();
    let raw = |db: sqlx::AnyPool, id: String| async move {
        let row = sqlx::query("SELECT access_token, env_vars FROM bindings WHERE sandbox_id = $1")
            .bind(id)
            .fetch_one(&db)
            .await
            .unwrap();
        (
            row.get::<String, _>("access_token"),
            row.get::<String, _>("env_vars"),
        )
    };
    let (t, e) = raw(db.clone(), p.sandbox_id.clone()).await;
    assert!(t.starts_with("sealed:v1:") && !t.contains(&token), "{t}");
    assert!(e.starts_with("sealed:v1:") && !e.contains(&marker), "{e}");
    assert_eq!(access_token(&mut c, &p.sandbox_id).await, token);
    // A fork copies the parent's envVars, opened.
    let mut fork = place_req("team-1");
    fork.fork_of = p.sandbox_id.clone();
    let child = c.place(fork).await.unwrap().into_inner();
    let child_env = child.binding.unwrap().env_vars;
    assert_eq!(child_env.get("OPENAI_API_KEY"), Some(&marker));
    // What an older version left in the clear...
    sqlx::query("UPDATE bindings SET access_token = $1, env_vars = $2 WHERE sandbox_id = $3")
        .bind(&token)
        .bind(format!("{{\"OPENAI_API_KEY\":\"{marker}\"}}"))
        .bind(&p.sandbox_id)
        .execute(&db)
        .await
        .unwrap();
    s.stop().await;
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let (db2, id) = (db.clone(), p.sandbox_id.clone());
    eventually("the clear values sealed again", || {
        let (db, id) = (db2.clone(), id.clone());
        async move {
            let (t, e) = raw(db, id).await;
            (t.starts_with("sealed:v1:") && e.starts_with("sealed:v1:")).then_some(())
        }
    })
    .await;
    assert_eq!(access_token(&mut c, &p.sandbox_id).await, token);
    db.close().await;
    s.stop().await;
}

/// A reseal pass reads the bindings once, in id order: each batch starts
/// after the last one's final id, never back at the first row. (Each
/// batch starting from the first row again, past every row already
/// sealed, made a pass over a million bindings quadratic: minutes of
/// scans, each create waiting behind its batches for the write lock.)
async fn a_reseal_pass_reads_each_binding_once(store: TestStore) {
    use std::sync::Arc;
    use warren_scheduler::store::{seal::Sealer, Resealed, SqlStore};
    let sealer = Arc::new(Sealer::ephemeral());
    let s = match &store {
        TestStore::Sqlite(dir) => {
            SqlStore::open_sqlite_file(dir.path().join("scheduler.db"), 2, sealer).await
        }
        TestStore::Postgres(url) => SqlStore::open_postgres(url, 2, sealer).await,
    }
    .unwrap();
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&store.raw_url()).await.unwrap();
    // Five bindings an older version wrote, token and envVars in the clear.
    for i in 1..=5 {
        sqlx::query(
            "INSERT INTO bindings (sandbox_id, node_id, endpoint, generation, state, team_id, \
             template_id, started_at_ms, end_at_ms, metadata, env_vars, access_token, cpu_count, \
             memory_mb, assigned_at_ms, updated_at_ms) \
             VALUES ($1, 'node-a', 'node-a.test:7000', $2, 'running', 'team-1', 'base', 0, 0, \
             '{}', '{}', $3, 2, 512, 0, 0)",
        )
        .bind(format!("sbx{i}"))
        .bind(i64::from(i))
        .bind(format!("token-{i}"))
        .execute(&db)
        .await
        .unwrap();
    }
    let batch = |looked_at, last: &str| {
        Some(Resealed {
            looked_at,
            last: last.to_string(),
        })
    };
    assert_eq!(s.reseal("", 2).await.unwrap(), batch(2, "sbx2"));
    // sbx1 back in the clear behind the pass: the pass does not go back
    // for it (the next start's pass does).
    sqlx::query("UPDATE bindings SET access_token = 'token-1' WHERE sandbox_id = 'sbx1'")
        .execute(&db)
        .await
        .unwrap();
    assert_eq!(s.reseal("sbx2", 2).await.unwrap(), batch(2, "sbx4"));
    assert_eq!(s.reseal("sbx4", 2).await.unwrap(), batch(1, "sbx5"));
    assert_eq!(s.reseal("sbx5", 2).await.unwrap(), None);
    assert_eq!(s.reseal("", 2).await.unwrap(), batch(1, "sbx1"));
    assert_eq!(s.reseal("", 2).await.unwrap(), None);
    let clear: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM bindings WHERE access_token NOT LIKE 'sealed:%'")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(clear, 0);
    let b = s.get("sbx3").await.unwrap().unwrap();
    assert_eq!(b.access_token, "token-3");
    db.close().await;
    s.close().await;
}

on_both_stores!(
    tokens_and_env_vars_are_sealed_at_rest,
    a_reseal_pass_reads_each_binding_once,
    place_record_lookup,
    delayed_delete_of_an_old_generation_leaves_the_new_binding,
    the_same_idempotency_key_returns_the_same_sandbox,
    placement_spreads_load_and_respects_capacity,
    placement_avoids_the_node_it_is_told_to,
    placement_prefers_a_node_holding_the_layer,
    list_filters_and_pages,
    timeouts_pause_and_resume,
    restart_keeps_bindings_and_never_reuses_generations,
    concurrent_places_never_exceed_capacity_or_duplicate_a_key,
    lists_by_start_time_across_pages,
    heartbeats_say_when_the_next_sandbox_ends,
);
