//! What only PostgreSQL can show: several scheduler replicas on one real
//! database. (Every single-replica scenario of `api.rs`, `watch.rs`,
//! `liveness.rs` and `bad_input.rs` also runs on PostgreSQL, as `postgres::*`.)
//!
//! - a change made through one replica reaches a watch on another;
//! - fences, capacity and idempotency keys hold across replicas;
//! - commits wake `LISTEN`ers, and a listener that lost its connection
//!   re-reads the log once reconnected;
//! - exactly one replica sweeps, and another takes over when it stops; a
//!   replica that loses its lease session stops sweeping.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sqlx::Connection as _;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::sync::Notify;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::{BindingState, ChangeKind, EventType};

fn url(store: &TestStore) -> &str {
    match store {
        TestStore::Postgres(url) => url,
        TestStore::Sqlite(_) => unreachable!("PostgreSQL tests use PostgreSQL"),
    }
}

/// Two replicas on one fresh database, started together (they race to
/// migrate it; the write lock makes that safe).
async fn two_replicas(extra: &[&str]) -> (TestStore, Sched, Sched) {
    let store = TestStore::postgres();
    let (a, b) = tokio::join!(Sched::start(&store, extra), Sched::start(&store, extra));
    (store, a, b)
}

#[tokio::test]
async fn a_delete_through_one_replica_reaches_a_watch_on_the_other() {
    let (_store, a, b) = two_replicas(&[]).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let mut on_a = watch(&mut ca, 0).await;
    assert_eq!(next_change(&mut on_a).await.kind, ChangeKind::Hello as i32);

    register(&mut cb, "node-a", 10).await;
    let p = running(&mut cb, "team").await;
    let assigned = next_change(&mut on_a).await;
    assert_eq!(assigned.kind, ChangeKind::Assigned as i32);
    assert_eq!(assigned.sandbox_id, p.sandbox_id);
    // LookupNode answers the same on either replica.
    let (ra, rb) = (
        lookup(&mut ca, &p.sandbox_id).await.unwrap(),
        lookup(&mut cb, &p.sandbox_id).await.unwrap(),
    );
    assert_eq!(ra, rb);
    assert_eq!(ra.generation, p.generation);

    let r = event(
        &mut cb,
        "node-a",
        &p.sandbox_id,
        p.generation,
        EventType::Delete,
    )
    .await;
    assert!(r.applied, "{r:?}");
    let removed = next_change(&mut on_a).await;
    assert_eq!(removed.kind, ChangeKind::Removed as i32);
    assert_eq!(removed.sandbox_id, p.sandbox_id);
    assert_eq!(removed.generation, p.generation);
    assert!(removed.revision > assigned.revision);
    assert_status(
        lookup(&mut ca, &p.sandbox_id).await,
        Code::NotFound,
        "not found",
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn fences_hold_across_replicas() {
    let (_store, a, b) = two_replicas(&[]).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    register(&mut ca, "node-a", 10).await;
    register(&mut cb, "node-b", 10).await;
    let p = running(&mut ca, "team").await;

    let moved = cb
        .reassign(pb::ReassignRequest {
            sandbox_id: p.sandbox_id.clone(),
            node_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(moved.node_id, p.node_id);
    assert!(moved.generation > p.generation);

    // The old node's late DELETE, through the other replica: not applied.
    let r = event(
        &mut ca,
        &p.node_id,
        &p.sandbox_id,
        p.generation,
        EventType::Delete,
    )
    .await;
    assert!(!r.applied, "stale delete applied: {r:?}");
    for c in [&mut ca, &mut cb] {
        let route = lookup(c, &p.sandbox_id).await.unwrap();
        assert_eq!(
            (route.node_id, route.generation),
            (moved.node_id.clone(), moved.generation)
        );
    }
    // The current generation's DELETE, through either, removes it.
    let r = event(
        &mut ca,
        &moved.node_id,
        &p.sandbox_id,
        moved.generation,
        EventType::Delete,
    )
    .await;
    assert!(r.applied, "{r:?}");
    assert_status(
        get(&mut cb, &p.sandbox_id).await,
        Code::NotFound,
        "not found",
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn replicas_share_capacity_and_idempotency_keys() {
    let (_store, a, b) = two_replicas(&[]).await;
    let (ca, cb) = (a.client().await, b.client().await);
    register(&mut ca.clone(), "node-a", 5).await;

    // 12 places at once, alternating replicas, for 5 slots.
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let mut c = if i % 2 == 0 { ca.clone() } else { cb.clone() };
            tokio::spawn(async move { c.place(place_req("team")).await })
        })
        .collect();
    let (mut ok, mut full) = (HashSet::new(), 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(p) => assert!(ok.insert(p.into_inner().sandbox_id)),
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                full += 1;
            }
        }
    }
    assert_eq!((ok.len(), full), (5, 7));
    assert_eq!(nodes(&mut cb.clone()).await[0].sandboxes, 5);

    // One idempotency key sent through both replicas at once: one sandbox.
    register(&mut ca.clone(), "node-b", 50).await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let mut c = if i % 2 == 0 { ca.clone() } else { cb.clone() };
            tokio::spawn(async move {
                let mut req = place_req("team");
                req.idempotency_key = "same-key".into();
                c.place(req).await.unwrap().into_inner()
            })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut fresh = 0;
    for t in tasks {
        let p = t.await.unwrap();
        ids.insert(p.sandbox_id);
        fresh += usize::from(!p.existing);
    }
    assert_eq!((ids.len(), fresh), (1, 1), "{ids:?}");
    a.stop().await;
    b.stop().await;
}

/// A commit that appends to the change log wakes every `LISTEN`er; a
/// listener whose connection is killed reconnects and wakes its hub to
/// re-read the log, then hears later commits again.
#[tokio::test]
async fn commits_wake_listeners_and_a_reconnected_listener_re_reads() {
    let store = TestStore::postgres();
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let woke = Arc::new(Notify::new());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let listener_url = format!("{}?application_name=probe-listener", url(&store));
    let task = tokio::spawn(warren_scheduler::store::postgres::follow_changes(
        listener_url,
        woke.clone(),
        stopped,
    ));
    let woken = || async {
        tokio::time::timeout(PATIENCE, woke.notified())
            .await
            .expect("the listener did not wake its hub")
    };
    // Listening: it wakes once to read whatever it may have missed.
    woken().await;

    register(&mut c, "node-a", 10).await;
    running(&mut c, "team").await;
    woken().await;

    // Kill the listener's session from the server side.
    let mut admin = sqlx::PgConnection::connect(url(&store)).await.unwrap();
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'probe-listener'",
    )
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(killed, vec![true]);
    // Woken only once listening again (a new session): whatever committed
    // in between is re-read from the log.
    woken().await;
    // And later commits are heard.
    running(&mut c, "team").await;
    woken().await;

    stop.send(true).unwrap();
    tokio::time::timeout(PATIENCE, task).await.unwrap().unwrap();
    s.stop().await;
}

/// `warren_scheduler_leader` from a replica's /metrics.
async fn leader_gauge(s: &Sched) -> Option<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(s.admin).await.ok()?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = String::new();
    conn.read_to_string(&mut out).await.ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("warren_scheduler_leader "))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn exactly_one_replica_sweeps_and_another_takes_over_when_it_stops() {
    let fast = [
        "--lease=300ms",
        "--heartbeat-interval=100ms",
        "--sweep-interval=30ms",
    ];
    let (_store, a, b) = two_replicas(&fast).await;
    let a_leads = eventually("exactly one replica to lead", || async {
        match (leader_gauge(&a).await?, leader_gauge(&b).await?) {
            (1, 0) => Some(true),
            (0, 1) => Some(false),
            _ => None,
        }
    })
    .await;
    let (leader, other) = if a_leads { (a, b) } else { (b, a) };
    leader.stop().await;

    // The survivor takes the lease...
    eventually("the other replica to lead", || async {
        (leader_gauge(&other).await? == 1).then_some(())
    })
    .await;
    // ...and sweeps: a node that stops heartbeating loses its sandboxes.
    let mut c = other.client().await;
    register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "team").await;
    eventually("the silent node's binding to be lost", || {
        let mut c = c.clone();
        let id = p.sandbox_id.clone();
        async move {
            let b = get(&mut c, &id).await.ok()?;
            (b.state == BindingState::Lost as i32).then_some(())
        }
    })
    .await;
    other.stop().await;
}

/// A leader whose lease session is lost stops sweeping at once, and leads
/// again only once it wins the lock back.
#[tokio::test]
async fn a_replica_that_loses_its_lease_session_stops_sweeping() {
    use warren_scheduler::store::backend::SWEEP_LOCK_KEY;
    let store = TestStore::postgres();
    let s = Sched::start(&store, &["--sweep-interval=30ms"]).await;
    eventually("the only replica to lead", || async {
        (leader_gauge(&s).await? == 1).then_some(())
    })
    .await;

    // Queue a rival for the lock, then end the leader's lease session: the
    // server hands the lock to the waiting rival as the session ends.
    let mut rival = sqlx::PgConnection::connect(url(&store)).await.unwrap();
    let rival_task = tokio::spawn(async move {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(SWEEP_LOCK_KEY)
            .execute(&mut rival)
            .await
            .unwrap();
        rival
    });
    let admin = sqlx::PgPool::connect(url(&store)).await.unwrap();
    eventually("the rival to wait for the lock", || {
        let admin = admin.clone();
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()",
            )
            .fetch_one(&admin)
            .await
            .unwrap();
            (waiting == 1).then_some(())
        }
    })
    .await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'warren-scheduler-sweep-lease' \
           AND datname = current_database()",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(killed, vec![true]);
    let rival = tokio::time::timeout(PATIENCE, rival_task)
        .await
        .expect("the rival never got the lock")
        .unwrap();
    eventually("the replica to stop leading", || async {
        (leader_gauge(&s).await? == 0).then_some(())
    })
    .await;

    // The rival goes away: the replica takes the lease back.
    rival.close().await.unwrap();
    admin.close().await;
    eventually("the replica to lead again", || async {
        (leader_gauge(&s).await? == 1).then_some(())
    })
    .await;
    s.stop().await;
}
