//! Node liveness: leases, LOST bindings, incarnations, roster reconciliation
//! and the stuck-create sweep, with a 300ms lease so they run quickly.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::collections::HashSet;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::{BindingState, ChangeKind};

async fn lease_expiry_marks_bindings_lost_and_placement_avoids_the_node(store: TestStore) {
    let s = Sched::start_fast(&store, &[]).await;
    let mut c = s.client().await;
    let mut w = watch(&mut c, 0).await;
    let hello = next_change(&mut w).await;
    assert_eq!(hello.kind, ChangeKind::Hello as i32);

    // node-a gets a sandbox, then stops heartbeating; node-b stays alive.
    register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "t").await;
    assert_eq!(p.node_id, "node-a");
    let inc_b = register(&mut c, "node-b", 10).await;
    let _alive = Heartbeats::start(c.clone(), "node-b", inc_b);

    let assigned = next_change(&mut w).await;
    assert_eq!(assigned.kind, ChangeKind::Assigned as i32);
    assert_eq!(assigned.sandbox_id, p.sandbox_id);

    let lost = next_change(&mut w).await;
    assert_eq!(lost.kind, ChangeKind::Lost as i32, "{lost:?}");
    assert_eq!(lost.sandbox_id, p.sandbox_id);
    assert_eq!(lost.node_id, "node-a");
    assert_eq!(lost.generation, p.generation);
    assert!(lost.revision > assigned.revision);

    let st = assert_status(
        lookup(&mut c, &p.sandbox_id).await,
        Code::FailedPrecondition,
        "down",
    );
    assert_eq!(reason(&st).as_deref(), Some(warren_proto::REASON_NODE_DOWN));
    let b = get(&mut c, &p.sandbox_id).await.unwrap();
    assert_eq!(b.state, BindingState::Lost as i32);
    let nodes = nodes(&mut c).await;
    let state_of = |id: &str| nodes.iter().find(|n| n.node_id == id).unwrap().state;
    assert_eq!(state_of("node-a"), pb::NodeState::Down as i32);
    assert_eq!(state_of("node-b"), pb::NodeState::Up as i32);

    // New sandboxes never land on the dead node, even when asked for.
    for _ in 0..5 {
        assert_eq!(place(&mut c, "t").await.node_id, "node-b");
    }
    let mut pinned = place_req("t");
    pinned.require_node_id = "node-a".into();
    let st = assert_status(c.place(pinned).await, Code::FailedPrecondition, "down");
    assert_eq!(reason(&st).as_deref(), Some(warren_proto::REASON_NODE_DOWN));

    let admin = s.admin;
    let metrics = eventually("the lost binding to be counted", || async move {
        let m = http_get(admin, "/metrics").await;
        m.contains("warren_scheduler_lost_bindings_total 1")
            .then_some(m)
    })
    .await;
    assert!(metrics.contains("warren_scheduler_rpc_duration_seconds_bucket"));
    assert!(
        metrics.contains("rpc=\"LookupNode\",code=\"FAILED_PRECONDITION\""),
        "{metrics}"
    );
    s.stop().await;
}

async fn placement_never_picks_a_down_node(store: TestStore) {
    let s = Sched::start_fast(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    eventually("node-a to go down", || {
        let mut c = c.clone();
        async move {
            let n = nodes(&mut c).await;
            (n[0].state == pb::NodeState::Down as i32).then_some(())
        }
    })
    .await;
    let st = assert_status(
        c.place(place_req("t")).await,
        Code::ResourceExhausted,
        "no live node",
    );
    assert_eq!(
        reason(&st).as_deref(),
        Some(warren_proto::REASON_NO_CAPACITY)
    );
    assert!(all_sandboxes(&mut c).await.is_empty(), "nothing written");
    s.stop().await;
}

async fn a_node_that_comes_back_recovers_what_it_still_hosts(store: TestStore) {
    let s = Sched::start_fast(&store, &["--creating-timeout=1s"]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let kept = running(&mut c, "t").await;
    let gone = running(&mut c, "t").await;
    eventually("bindings to be lost", || {
        let mut c = c.clone();
        let id = kept.sandbox_id.clone();
        async move { lookup(&mut c, &id).await.is_err().then_some(()) }
    })
    .await;

    // Same process, back from a partition: what it hosts is RUNNING again,
    // what it hosts unknown is an orphan, and what it no longer lists is
    // removed once it has not listed it for --creating-timeout (a roster
    // can predate a create: a heartbeat sent before it, delayed or failed
    // over to another replica; the deterministic simulation found a LOST
    // binding removed by such a roster while its sandbox ran).
    let hb = c
        .heartbeat(pb::HeartbeatRequest {
            node_id: "node-a".into(),
            incarnation: inc,
            roster: vec![sref(&kept.sandbox_id, kept.generation), sref("stray1", 1)],
            cached_layers: vec![],
            paused: Vec::new(),
            lists_paused: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.orphans, vec![sref("stray1", 1)]);
    let _alive = Heartbeats::with_roster(
        c.clone(),
        "node-a",
        inc,
        vec![sref(&kept.sandbox_id, kept.generation)],
    );
    let route = lookup(&mut c, &kept.sandbox_id).await.unwrap();
    assert_eq!(route.state, BindingState::Running as i32);
    assert_eq!(route.generation, kept.generation);
    eventually("the binding its node no longer lists to go", || {
        let mut c = c.clone();
        let id = gone.sandbox_id.clone();
        async move {
            get(&mut c, &id)
                .await
                .is_err_and(|st| st.code() == Code::NotFound)
                .then_some(())
        }
    })
    .await;
    s.stop().await;
}

async fn a_new_incarnation_drops_what_the_node_lost(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let old = register(&mut c, "node-a", 10).await;
    let kept = running(&mut c, "t").await;
    let lost = running(&mut c, "t").await;
    let creating = place(&mut c, "t").await;

    // The node restarted: it still has `kept` (and a stale generation of it,
    // and something unknown), nothing else.
    let new = old.wrapping_add(2);
    let r = register_with(
        &mut c,
        "node-a",
        10,
        new,
        vec![
            sref(&kept.sandbox_id, kept.generation),
            sref(&kept.sandbox_id, kept.generation + 1000),
            sref("unknown1", 3),
        ],
    )
    .await;
    let orphans: HashSet<_> = r.orphans.iter().cloned().collect();
    let want = HashSet::from([
        sref(&kept.sandbox_id, kept.generation + 1000),
        sref("unknown1", 3),
    ]);
    assert_eq!(orphans, want);
    assert!(lookup(&mut c, &kept.sandbox_id).await.is_ok());
    assert_status(
        get(&mut c, &lost.sandbox_id).await,
        Code::NotFound,
        "not found",
    );
    assert_status(
        get(&mut c, &creating.sandbox_id).await,
        Code::NotFound,
        "not found",
    );

    // The previous process's heartbeats are refused.
    let stale = c
        .heartbeat(pb::HeartbeatRequest {
            node_id: "node-a".into(),
            incarnation: old,
            roster: vec![],
            cached_layers: vec![],
            paused: Vec::new(),
            lists_paused: false,
        })
        .await;
    assert_status(stale, Code::FailedPrecondition, "stale incarnation");
    let unknown = c
        .heartbeat(pb::HeartbeatRequest {
            node_id: "node-zz".into(),
            incarnation: 7,
            roster: vec![],
            cached_layers: vec![],
            paused: Vec::new(),
            lists_paused: false,
        })
        .await;
    assert_status(
        unknown,
        Code::FailedPrecondition,
        "unknown node, register first",
    );
    // The current one is fine.
    c.heartbeat(pb::HeartbeatRequest {
        node_id: "node-a".into(),
        incarnation: new,
        roster: vec![sref(&kept.sandbox_id, kept.generation)],
        cached_layers: vec![],
        paused: Vec::new(),
        lists_paused: false,
    })
    .await
    .unwrap();
    s.stop().await;
}

async fn stuck_creates_are_resolved_from_the_roster(store: TestStore) {
    let s = Sched::start_fast(&store, &["--creating-timeout=200ms"]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let made = place(&mut c, "t").await;
    let never = place(&mut c, "t").await;
    let roster = vec![sref(&made.sandbox_id, made.generation)];

    // The node keeps heartbeating its roster; nobody records the assignments.
    let (id_made, id_never) = (made.sandbox_id.clone(), never.sandbox_id.clone());
    eventually("the sweep to resolve both creates", || {
        let mut c = c.clone();
        let roster = roster.clone();
        let (id_made, id_never) = (id_made.clone(), id_never.clone());
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
            .unwrap();
            let made = get(&mut c, &id_made).await.ok()?;
            let never = get(&mut c, &id_never).await;
            (made.state == BindingState::Running as i32 && never.is_err()).then_some(())
        }
    })
    .await;
    assert_status(get(&mut c, &id_never).await, Code::NotFound, "not found");
    s.stop().await;
}

/// A sandbox that died on its node without a DELETE report (the node lives on,
/// same incarnation, and simply stops listing it) must not stay routable:
/// after `--creating-timeout` of absence its binding is removed.
async fn a_sandbox_its_node_stopped_listing_is_removed_after_the_grace(store: TestStore) {
    let grace = std::time::Duration::from_millis(200);
    let s = Sched::start(&store, &["--creating-timeout=200ms"]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let kept = running(&mut c, "t").await;
    let died = running(&mut c, "t").await;
    let node = c.clone();
    let beat = |roster: Vec<pb::SandboxRef>| {
        let mut c = node.clone();
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
    let without = vec![sref(&kept.sandbox_id, kept.generation)];
    let with = vec![
        sref(&kept.sandbox_id, kept.generation),
        sref(&died.sandbox_id, died.generation),
    ];

    // One roster without it is only noted: it may predate the create.
    beat(without.clone()).await;
    let route = lookup(&mut c, &died.sandbox_id).await.unwrap();
    assert_eq!(route.state, BindingState::Running as i32);
    // Listed again after the grace passed: the note is cleared, so the next
    // absence starts a new grace instead of removing it.
    tokio::time::sleep(grace + grace / 2).await;
    beat(with).await;
    beat(without.clone()).await;
    assert!(lookup(&mut c, &died.sandbox_id).await.is_ok());

    // Missing for the whole grace: removed (fenced), and only it.
    eventually("the unlisted sandbox to be removed", || {
        let mut c = c.clone();
        let (beat, without) = (&beat, without.clone());
        let id = died.sandbox_id.clone();
        async move {
            beat(without).await;
            get(&mut c, &id)
                .await
                .err()
                .filter(|s| s.code() == Code::NotFound)
        }
    })
    .await;
    let route = lookup(&mut c, &kept.sandbox_id).await.unwrap();
    assert_eq!(route.state, BindingState::Running as i32);
    s.stop().await;
}

/// A tiny HTTP/1.1 GET against the admin listener.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

async fn sandboxes_past_their_end_expire_and_are_handed_to_their_node(store: TestStore) {
    let s = Sched::start(&store, &["--sweep-interval=20ms"]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let mut w = watch(&mut c, 0).await;
    next_change(&mut w).await;
    let mut req = place_req("t");
    req.timeout_secs = 1;
    let p = c.place(req).await.unwrap().into_inner();
    c.record_assignment(pb::RecordAssignmentRequest {
        sandbox_id: p.sandbox_id.clone(),
        node_id: p.node_id.clone(),
        generation: p.generation,
    })
    .await
    .unwrap();
    assert_eq!(next_change(&mut w).await.kind, ChangeKind::Assigned as i32);

    let expiring = next_change(&mut w).await;
    assert_eq!(expiring.kind, ChangeKind::State as i32);
    assert_eq!(expiring.state, BindingState::Expiring as i32);
    assert_eq!(expiring.sandbox_id, p.sandbox_id);
    let hb = c
        .heartbeat(pb::HeartbeatRequest {
            node_id: "node-a".into(),
            incarnation: inc,
            roster: vec![sref(&p.sandbox_id, p.generation)],
            cached_layers: vec![],
            paused: Vec::new(),
            lists_paused: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hb.expired, vec![sref(&p.sandbox_id, p.generation)]);
    s.stop().await;
}

/// A sandbox created with auto-pause is handed to its node at its end to be
/// frozen (`to_pause`, not `expired`), again on every heartbeat until the
/// node reports the PAUSE, which takes it EXPIRING -> PAUSED with a change
/// row (gateways learn it by the watch); it then never expires. The same
/// PAUSE for a sandbox without auto-pause that reached its end is refused
/// (it is killed), and the lifecycle is in every read, forks included.
async fn an_auto_pause_sandbox_is_paused_at_its_end_not_killed(store: TestStore) {
    let s = Sched::start(&store, &["--sweep-interval=20ms"]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let place_with = |auto_pause: bool, auto_resume: bool| {
        let mut req = place_req("t");
        req.timeout_secs = 1;
        req.lifecycle = Some(pb::Lifecycle {
            auto_pause,
            auto_resume,
        });
        req
    };
    let mut made = Vec::new();
    for (pause, resume) in [(true, true), (false, false)] {
        let p = c
            .place(place_with(pause, resume))
            .await
            .unwrap()
            .into_inner();
        record(&mut c, &p).await;
        made.push(p);
    }
    let (auto, plain) = (&made[0], &made[1]);
    let l = get(&mut c, &auto.sandbox_id)
        .await
        .unwrap()
        .lifecycle
        .unwrap();
    assert!(l.auto_pause && l.auto_resume, "{l:?}");
    assert!(lookup(&mut c, &auto.sandbox_id).await.unwrap().auto_resume);
    assert!(!lookup(&mut c, &plain.sandbox_id).await.unwrap().auto_resume);
    let roster = vec![
        sref(&auto.sandbox_id, auto.generation),
        sref(&plain.sandbox_id, plain.generation),
    ];
    let node = c.clone();
    let hb = || heartbeat(&node, "node-a", inc, &roster);
    let mut w = watch(&mut c, 0).await;
    let r = eventually("both reach their end", || async {
        let r = hb().await;
        (!r.to_pause.is_empty() && !r.expired.is_empty()).then_some(r)
    })
    .await;
    assert_eq!(r.to_pause, vec![sref(&auto.sandbox_id, auto.generation)]);
    assert_eq!(r.expired, vec![sref(&plain.sandbox_id, plain.generation)]);
    // Not reported yet: answered again.
    assert_eq!(hb().await.to_pause, r.to_pause);
    // The PAUSE report: EXPIRING -> PAUSED, once (a repeat is "already").
    let e = event(
        &mut c,
        "node-a",
        &auto.sandbox_id,
        auto.generation,
        pb::EventType::Pause,
    )
    .await;
    assert!(e.applied, "{e:?}");
    let e = event(
        &mut c,
        "node-a",
        &auto.sandbox_id,
        auto.generation,
        pb::EventType::Pause,
    )
    .await;
    assert!(e.applied, "{e:?}");
    // Without auto-pause, a PAUSE does not save it from its end.
    let e = event(
        &mut c,
        "node-a",
        &plain.sandbox_id,
        plain.generation,
        pb::EventType::Pause,
    )
    .await;
    assert!(!e.applied, "{e:?}");
    assert_eq!(
        get(&mut c, &plain.sandbox_id).await.unwrap().state,
        BindingState::Expiring as i32
    );
    // The watch saw the auto-pause sandbox go PAUSED.
    loop {
        let ch = next_change(&mut w).await;
        if ch.sandbox_id == auto.sandbox_id && ch.state == BindingState::Paused as i32 {
            break;
        }
    }
    assert_eq!(
        get(&mut c, &auto.sandbox_id).await.unwrap().state,
        BindingState::Paused as i32
    );
    let r = hb().await;
    assert!(r.to_pause.is_empty(), "{r:?}");
    // Paused, it is past its end and outlives sweeps.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(
        get(&mut c, &auto.sandbox_id).await.unwrap().state,
        BindingState::Paused as i32
    );
    // A fork copies its parent's lifecycle.
    let mut req = place_req("t");
    req.fork_of = auto.sandbox_id.clone();
    req.require_node_id = "node-a".into();
    let f = c.place(req).await.unwrap().into_inner();
    let l = f.binding.unwrap().lifecycle.unwrap();
    assert!(l.auto_pause && l.auto_resume, "{l:?}");
    s.stop().await;
}

/// With `--paused-retention`, a sandbox paused for longer is handed to its
/// node to be deleted (`expired`, never `to_pause` again, even when it was
/// created with auto-pause), and gateways see it go EXPIRING by the watch;
/// one paused more recently stays.
async fn a_sandbox_paused_past_the_retention_is_deleted(store: TestStore) {
    let s = Sched::start(&store, &["--sweep-interval=20ms", "--paused-retention=1s"]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let mut req = place_req("t");
    req.lifecycle = Some(pb::Lifecycle {
        auto_pause: true,
        auto_resume: false,
    });
    let p = c.place(req).await.unwrap().into_inner();
    record(&mut c, &p).await;
    let roster = vec![sref(&p.sandbox_id, p.generation)];
    let node = c.clone();
    let hb = || heartbeat(&node, "node-a", inc, &roster);
    assert!(hb().await.expired.is_empty());
    let mut w = watch(&mut c, 0).await;
    let e = event(
        &mut c,
        "node-a",
        &p.sandbox_id,
        p.generation,
        pb::EventType::Pause,
    )
    .await;
    assert!(e.applied, "{e:?}");
    assert_eq!(
        get(&mut c, &p.sandbox_id).await.unwrap().state,
        BindingState::Paused as i32
    );
    let r = eventually(
        "the paused sandbox is handed back to be deleted",
        || async {
            let r = hb().await;
            (!r.expired.is_empty()).then_some(r)
        },
    )
    .await;
    assert_eq!(r.expired, vec![sref(&p.sandbox_id, p.generation)]);
    assert!(r.to_pause.is_empty(), "deleted, not paused again: {r:?}");
    assert_eq!(
        get(&mut c, &p.sandbox_id).await.unwrap().state,
        BindingState::Expiring as i32
    );
    loop {
        let ch = next_change(&mut w).await;
        if ch.sandbox_id == p.sandbox_id && ch.state == BindingState::Expiring as i32 {
            break;
        }
    }
    // The node deletes it and says so: the binding is gone.
    let e = event(
        &mut c,
        "node-a",
        &p.sandbox_id,
        p.generation,
        pb::EventType::Delete,
    )
    .await;
    assert!(e.applied, "{e:?}");
    assert!(get(&mut c, &p.sandbox_id).await.is_err(), "gone");
    s.stop().await;
}

async fn a_paused_sandbox_whose_node_was_cut_off_comes_back_paused(store: TestStore) {
    let s = Sched::start_fast(&store, &[]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let paused = running(&mut c, "t").await;
    let running_one = running(&mut c, "t").await;
    let e = event(
        &mut c,
        "node-a",
        &paused.sandbox_id,
        paused.generation,
        pb::EventType::Pause,
    )
    .await;
    assert!(e.applied, "{e:?}");
    eventually("bindings to be lost", || {
        let mut c = c.clone();
        let id = paused.sandbox_id.clone();
        async move {
            get(&mut c, &id)
                .await
                .is_ok_and(|b| b.state == BindingState::Lost as i32)
                .then_some(())
        }
    })
    .await;
    // Back, saying which of what it hosts is paused there: that one is
    // PAUSED again, not RUNNING (found by the deterministic simulation: a
    // sandbox frozen on its node, RUNNING in the store, answered "paused"
    // to every request and could not be resumed).
    c.heartbeat(pb::HeartbeatRequest {
        node_id: "node-a".into(),
        incarnation: inc,
        roster: vec![
            sref(&paused.sandbox_id, paused.generation),
            sref(&running_one.sandbox_id, running_one.generation),
        ],
        cached_layers: vec![],
        paused: vec![sref(&paused.sandbox_id, paused.generation)],
        lists_paused: true,
    })
    .await
    .unwrap();
    assert_eq!(
        get(&mut c, &paused.sandbox_id).await.unwrap().state,
        BindingState::Paused as i32
    );
    assert_eq!(
        get(&mut c, &running_one.sandbox_id).await.unwrap().state,
        BindingState::Running as i32
    );
    s.stop().await;
}

on_both_stores!(
    a_paused_sandbox_whose_node_was_cut_off_comes_back_paused,
    a_sandbox_paused_past_the_retention_is_deleted,
    an_auto_pause_sandbox_is_paused_at_its_end_not_killed,
    lease_expiry_marks_bindings_lost_and_placement_avoids_the_node,
    placement_never_picks_a_down_node,
    a_node_that_comes_back_recovers_what_it_still_hosts,
    a_new_incarnation_drops_what_the_node_lost,
    stuck_creates_are_resolved_from_the_roster,
    sandboxes_past_their_end_expire_and_are_handed_to_their_node,
    a_sandbox_its_node_stopped_listing_is_removed_after_the_grace,
);
