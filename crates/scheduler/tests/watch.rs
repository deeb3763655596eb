//! WatchBindings: live changes, resuming from a revision, and resync when the
//! revision is no longer retained.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::{BindingState, ChangeKind, EventType};

fn summary(c: &pb::BindingChange) -> (i32, String) {
    (c.kind, c.sandbox_id.clone())
}

async fn resume_replays_exactly_the_missed_changes_then_goes_live(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    register(&mut c, "node-b", 10).await;

    let mut w = watch(&mut c, 0).await;
    let hello = next_change(&mut w).await;
    assert_eq!(hello.kind, ChangeKind::Hello as i32);
    assert!(!hello.resync_required);

    // Many subscribers see the same changes.
    let mut others = Vec::new();
    for _ in 0..10 {
        let mut o = watch(&mut c, 0).await;
        assert_eq!(next_change(&mut o).await.kind, ChangeKind::Hello as i32);
        others.push(o);
    }

    let p = running(&mut c, "t").await;
    let r = event(
        &mut c,
        &p.node_id,
        &p.sandbox_id,
        p.generation,
        EventType::Delete,
    )
    .await;
    assert!(r.applied);
    let assigned = next_change(&mut w).await;
    assert_eq!(
        summary(&assigned),
        (ChangeKind::Assigned as i32, p.sandbox_id.clone())
    );
    assert_eq!(assigned.state, BindingState::Running as i32);
    assert_eq!(assigned.generation, p.generation);
    assert!(assigned.revision > hello.revision);
    let removed = next_change(&mut w).await;
    assert_eq!(
        summary(&removed),
        (ChangeKind::Removed as i32, p.sandbox_id.clone())
    );
    assert!(removed.revision > assigned.revision);
    for o in &mut others {
        assert_eq!(next_change(o).await, assigned);
        assert_eq!(next_change(o).await, removed);
    }
    drop(w);
    drop(others);

    // Changes while nobody watches.
    let q = running(&mut c, "t").await;
    let moved = c
        .reassign(pb::ReassignRequest {
            sandbox_id: q.sandbox_id.clone(),
            node_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();

    let mut w = watch(&mut c, removed.revision).await;
    let hello = next_change(&mut w).await;
    assert_eq!(hello.kind, ChangeKind::Hello as i32);
    assert!(!hello.resync_required);
    let a = next_change(&mut w).await;
    let m = next_change(&mut w).await;
    assert_eq!(
        summary(&a),
        (ChangeKind::Assigned as i32, q.sandbox_id.clone())
    );
    assert_eq!(
        summary(&m),
        (ChangeKind::Moved as i32, q.sandbox_id.clone())
    );
    assert_eq!(m.node_id, moved.node_id);
    assert_eq!(m.generation, moved.generation);
    assert_eq!(m.state, BindingState::Creating as i32);
    assert_eq!(hello.revision, m.revision, "HELLO carries the head");
    assert!(removed.revision < a.revision && a.revision < m.revision);

    // Then live.
    c.record_assignment(pb::RecordAssignmentRequest {
        sandbox_id: q.sandbox_id.clone(),
        node_id: moved.node_id.clone(),
        generation: moved.generation,
    })
    .await
    .unwrap();
    let live = next_change(&mut w).await;
    assert_eq!(
        summary(&live),
        (ChangeKind::Assigned as i32, q.sandbox_id.clone())
    );
    assert_eq!(live.generation, moved.generation);
    assert!(live.revision > m.revision);
    s.stop().await;
}

async fn a_revision_that_is_no_longer_retained_requires_a_resync(store: TestStore) {
    let s = Sched::start(&store, &["--watch-retention=2", "--sweep-interval=20ms"]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    for _ in 0..3 {
        let p = running(&mut c, "t").await;
        event(
            &mut c,
            &p.node_id,
            &p.sandbox_id,
            p.generation,
            EventType::Delete,
        )
        .await;
    }
    // 6 changes; once pruned, only revisions head-1 and head remain.
    let mut w = eventually("the change log to be pruned", || {
        let mut c = c.clone();
        async move {
            let mut w = watch(&mut c, 1).await;
            let hello = next_change(&mut w).await;
            hello.resync_required.then_some((w, hello))
        }
    })
    .await;
    let head = w.1.revision;
    assert!(head >= 6);

    // After a resync HELLO the stream continues live from the head.
    let p = running(&mut c, "t").await;
    let live = next_change(&mut w.0).await;
    assert_eq!(live.kind, ChangeKind::Assigned as i32);
    assert_eq!(live.sandbox_id, p.sandbox_id);
    assert_eq!(live.revision, head + 1);
    let head = live.revision;

    // Still retained: no resync, exactly the missing change.
    let mut ok = watch(&mut c, head - 1).await;
    let hello = next_change(&mut ok).await;
    assert!(!hello.resync_required);
    assert_eq!(next_change(&mut ok).await.revision, head);

    // From the future (another store's history): resync.
    let mut future = watch(&mut c, head + 100).await;
    let hello = next_change(&mut future).await;
    assert!(hello.resync_required);
    assert_eq!(hello.revision, head);
    s.stop().await;
}

async fn shutdown_ends_open_watch_streams_instead_of_waiting_for_the_drain_timeout(
    store: TestStore,
) {
    // A drain timeout far beyond the test's patience: only ending the streams
    // lets `stop` return in time.
    let s = Sched::start(&store, &["--drain-timeout=120s"]).await;
    let mut c = s.client().await;
    let mut w = watch(&mut c, 0).await;
    assert_eq!(next_change(&mut w).await.kind, ChangeKind::Hello as i32);
    s.stop().await;
    let end = tokio::time::timeout(PATIENCE, w.message())
        .await
        .expect("the stream did not end");
    match end {
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status}"),
        Ok(None) => {}
        Ok(Some(m)) => panic!("unexpected message after shutdown: {m:?}"),
    }
}

on_both_stores!(
    resume_replays_exactly_the_missed_changes_then_goes_live,
    a_revision_that_is_no_longer_retained_requires_a_resync,
    shutdown_ends_open_watch_streams_instead_of_waiting_for_the_drain_timeout,
);
