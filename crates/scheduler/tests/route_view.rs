//! The route view (`--lookup-view`, `src/route_view.rs`): `LookupNode`
//! answered from memory once every binding is loaded, and never older than
//! the caller has seen: this process's own writes, and the revision a
//! caller names. On both stores.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::BindingState;

const VIEW: &str = "warren_scheduler_lookups_total{answer=\"view\"}";
const STORE: &str = "warren_scheduler_lookups_total{answer=\"store\"}";
const READY: &str = "warren_scheduler_route_view_ready";
const ROUTES: &str = "warren_scheduler_route_view_routes";

async fn view_ready(s: &Sched) {
    let admin = s.admin;
    eventually("the route view to load", || async move {
        (metric(admin, READY).await == 1.0).then_some(())
    })
    .await;
}

async fn lookup_with(c: &mut Client, id: &str, min_revision: u64, consistent: bool) -> pb::Route {
    c.lookup_node(pb::LookupNodeRequest {
        sandbox_id: id.into(),
        min_revision,
        consistent,
    })
    .await
    .unwrap()
    .into_inner()
}

/// Bindings a previous run left are loaded at start and answered from
/// memory, the same as the store has them.
async fn bindings_in_the_store_are_loaded_at_start(store: TestStore) {
    let first = Sched::start(&store, &[]).await;
    let mut c = first.client().await;
    register(&mut c, "node-a", 100).await;
    let mut kept = Vec::new();
    for _ in 0..5 {
        kept.push(running(&mut c, "t").await);
    }
    let creating = place(&mut c, "t").await;
    first.stop().await;

    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    view_ready(&s).await;
    assert_eq!(metric(s.admin, ROUTES).await, 6.0);
    let before = metric(s.admin, VIEW).await;
    for p in &kept {
        let r = lookup(&mut c, &p.sandbox_id).await.unwrap();
        assert_eq!(
            (
                r.node_id.as_str(),
                r.generation,
                r.state,
                r.team_id.as_str()
            ),
            ("node-a", p.generation, BindingState::Running as i32, "t")
        );
    }
    let r = lookup(&mut c, &creating.sandbox_id).await.unwrap();
    assert_eq!(r.state, BindingState::Creating as i32);
    assert_eq!(metric(s.admin, VIEW).await - before, 6.0);
    s.stop().await;
}

/// Every write through this scheduler is seen by the very next lookup
/// (no waiting): the view follows, or the store answers while it has not.
async fn a_lookup_sees_the_writes_before_it(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 100).await;
    register(&mut c, "node-b", 100).await;
    view_ready(&s).await;
    for _ in 0..20 {
        let p = place(&mut c, "t").await;
        let r = lookup(&mut c, &p.sandbox_id).await.unwrap();
        assert_eq!(r.state, BindingState::Creating as i32);
        record(&mut c, &p).await;
        let r = lookup(&mut c, &p.sandbox_id).await.unwrap();
        assert_eq!(
            (r.state, r.generation),
            (BindingState::Running as i32, p.generation)
        );
        let moved = c
            .reassign(pb::ReassignRequest {
                sandbox_id: p.sandbox_id.clone(),
                node_id: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        let r = lookup(&mut c, &p.sandbox_id).await.unwrap();
        assert_eq!(
            (r.node_id.as_str(), r.generation, r.state),
            (
                moved.node_id.as_str(),
                moved.generation,
                BindingState::Creating as i32
            )
        );
        assert_ne!(moved.node_id, p.node_id);
        record(&mut c, &moved).await;
        let gone = event(
            &mut c,
            &moved.node_id,
            &p.sandbox_id,
            moved.generation,
            pb::EventType::Delete,
        )
        .await;
        assert!(gone.applied, "{gone:?}");
        assert_status(
            lookup(&mut c, &p.sandbox_id).await,
            Code::NotFound,
            "not found",
        );
    }
    // And once the writes stop, the view answers.
    let p = running(&mut c, "t").await;
    let admin = s.admin;
    let id = p.sandbox_id.clone();
    eventually("a lookup answered from memory", || {
        let (mut c, id) = (c.clone(), id.clone());
        async move {
            let before = metric(admin, VIEW).await;
            lookup(&mut c, &id).await.ok()?;
            (metric(admin, VIEW).await > before).then_some(())
        }
    })
    .await;
    s.stop().await;
}

/// A caller that has seen a newer revision than the view has applied, or
/// that asks for a consistent read, is answered from the store.
async fn a_caller_ahead_of_the_view_is_answered_from_the_store(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 100).await;
    let p = running(&mut c, "t").await;
    view_ready(&s).await;
    let (view, stored) = (metric(s.admin, VIEW).await, metric(s.admin, STORE).await);
    let r = lookup_with(&mut c, &p.sandbox_id, u64::MAX, false).await;
    assert_eq!(r.generation, p.generation);
    let r = lookup_with(&mut c, &p.sandbox_id, 0, true).await;
    assert_eq!(r.generation, p.generation);
    assert_eq!(metric(s.admin, STORE).await - stored, 2.0);
    assert_eq!(metric(s.admin, VIEW).await, view);
    s.stop().await;
}

/// A binding that appears in the store without a change row (as
/// `warren-bench seed` writes them) is found there, then kept in memory.
async fn a_binding_the_view_lacks_is_read_from_the_store(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 100).await;
    let p = running(&mut c, "t").await;
    view_ready(&s).await;
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&store.raw_url()).await.unwrap();
    // A copy of p's row under a new id, behind the scheduler's back.
    let (stem, last) = p.sandbox_id.split_at(p.sandbox_id.len() - 1);
    let copy = format!("{stem}{}", if last == "x" { "y" } else { "x" });
    sqlx::query(
        "INSERT INTO bindings SELECT $1, node_id, endpoint, generation, state, team_id, \
         template_id, started_at_ms, end_at_ms, metadata, env_vars, access_token, cpu_count, \
         memory_mb, assigned_at_ms, updated_at_ms, idempotency_key, missing_since_ms, \
         auto_pause, auto_resume, egress_ca FROM bindings WHERE sandbox_id = $2",
    )
    .bind(&copy)
    .bind(&p.sandbox_id)
    .execute(&db)
    .await
    .unwrap();
    db.close().await;
    let stored = metric(s.admin, STORE).await;
    let r = lookup(&mut c, &copy).await.unwrap();
    assert_eq!(
        (r.sandbox_id.as_str(), r.generation),
        (copy.as_str(), p.generation)
    );
    assert_eq!(metric(s.admin, STORE).await - stored, 1.0);
    let view = metric(s.admin, VIEW).await;
    lookup(&mut c, &copy).await.unwrap();
    assert_eq!(metric(s.admin, VIEW).await - view, 1.0);
    s.stop().await;
}

/// `--lookup-view false`: nothing in memory, every lookup a query.
async fn with_the_view_off_every_lookup_reads_the_store(store: TestStore) {
    let s = Sched::start(&store, &["--lookup-view=false"]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 100).await;
    let p = running(&mut c, "t").await;
    for _ in 0..3 {
        assert_eq!(
            lookup(&mut c, &p.sandbox_id).await.unwrap().generation,
            p.generation
        );
    }
    assert_eq!(metric(s.admin, STORE).await, 3.0);
    assert_eq!(metric(s.admin, VIEW).await, 0.0);
    assert_eq!(metric(s.admin, READY).await, 0.0);
    s.stop().await;
}

on_both_stores!(
    bindings_in_the_store_are_loaded_at_start,
    a_lookup_sees_the_writes_before_it,
    a_caller_ahead_of_the_view_is_answered_from_the_store,
    a_binding_the_view_lacks_is_read_from_the_store,
    with_the_view_off_every_lookup_reads_the_store,
    lookup_nodes_answers_each_id_as_lookup_node_would,
);

/// `LookupNodes` answers each id exactly as its own `LookupNode` would:
/// the route, or the same code, message and reason (unknown, malformed,
/// on a node that is down); more than 1024 ids is refused as a whole.
async fn lookup_nodes_answers_each_id_as_lookup_node_would(store: TestStore) {
    let s = Sched::start_fast(&store, &[]).await;
    let mut c = s.client().await;
    // node-a stops heartbeating once its sandbox runs: LOST; node-b lives.
    register(&mut c, "node-a", 100).await;
    let lost = running(&mut c, "t").await.sandbox_id;
    let inc = register(&mut c, "node-b", 100).await;
    let mut req = place_req("t");
    req.require_node_id = "node-b".into();
    let up = c.place(req).await.unwrap().into_inner();
    record(&mut c, &up).await;
    let beats = Heartbeats::with_roster(
        c.clone(),
        "node-b",
        inc,
        vec![sref(&up.sandbox_id, up.generation)],
    );
    let cc = c.clone();
    let id = lost.clone();
    eventually("node-a's sandbox to be LOST", || {
        let (mut c, id) = (cc.clone(), id.clone());
        async move { (get(&mut c, &id).await.ok()?.state == BindingState::Lost as i32).then_some(()) }
    })
    .await;
    let mut cc = c.clone();
    let ids: Vec<String> = vec![
        up.sandbox_id.clone(),
        "nosuchsandbox0000000000000".into(),
        "NOT/AN-ID".into(),
        lost.clone(),
        up.sandbox_id.clone(),
    ];
    let batch = cc
        .lookup_nodes(pb::LookupNodesRequest {
            sandbox_ids: ids.clone(),
            min_revision: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.results.len(), ids.len());
    for (id, got) in ids.iter().zip(&batch.results) {
        match lookup(&mut cc, id).await {
            Ok(route) => assert_eq!(got.route.as_ref(), Some(&route), "{id}"),
            Err(status) => {
                assert_eq!(got.route, None, "{id}");
                assert_eq!(got.code, status.code() as i32, "{id}");
                assert_eq!(got.message, status.message(), "{id}");
                assert_eq!(
                    Some(got.reason.clone()),
                    reason(&status).or(Some(String::new())),
                    "{id}"
                );
            }
        }
    }
    assert_eq!(batch.results[1].code, Code::NotFound as i32);
    assert_eq!(batch.results[2].code, Code::InvalidArgument as i32);
    assert_eq!(batch.results[3].reason, "node-down");
    let many = cc
        .lookup_nodes(pb::LookupNodesRequest {
            sandbox_ids: vec![up.sandbox_id.clone(); 1025],
            min_revision: 0,
        })
        .await;
    assert_status(many, Code::InvalidArgument, "the limit is 1024");
    drop(beats);
    s.stop().await;
}
