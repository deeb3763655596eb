//! Two `warren scheduler` processes on one real PostgreSQL database: a change
//! made through one replica reaches a `WatchBindings` stream on the other
//! within milliseconds (LISTEN/NOTIFY), `LookupNode` answers the same on
//! either (each from its in-memory route view, never older than the
//! revision its caller has seen on the other), and when the replica that sweeps is SIGKILLed the other one takes
//! the sweep lease (`warren_scheduler_leader`) and keeps detecting dead nodes.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;
use warren_proto::scheduler::v1::{BindingState, ChangeKind, EventType};
use warren_test_support::postgres::PgServer;
use warren_test_support::{wait_until, Proc};

type Client = SchedulerClient<Channel>;

/// Deadline for things that happen in milliseconds when all is well.
const PATIENCE: Duration = Duration::from_secs(15);
/// The node lease the replicas run with. A sweep lease handover must fit in
/// it, or dead nodes would be detected late.
const NODE_LEASE: Duration = Duration::from_secs(2);

fn warren() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_warren"))
}

/// A scheduler replica on `url`, sweeping every 50 ms.
async fn replica(url: &str, key: &std::path::Path) -> Proc {
    warren_test_support::spawn(
        warren(),
        &[
            "scheduler",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--insecure-internal",
            "--database-url",
            url,
            "--store-key-file",
            &key.display().to_string(),
            "--database-pool-size",
            "4",
            "--lease",
            "2s",
            "--sweep-interval",
            "50ms",
        ],
        &[],
        &["scheduler grpc", "scheduler admin"],
    )
    .await
    .unwrap()
}

/// Two replicas started at once (they race to migrate the fresh database).
async fn two_replicas(pg: &PgServer, db: &str) -> (Proc, Proc) {
    let url = pg.create_database(db).unwrap();
    let key = pg.store_key_file();
    tokio::join!(replica(&url, &key), replica(&url, &key))
}

async fn client(p: &Proc) -> Client {
    SchedulerClient::connect(format!("http://{}", p.addr("scheduler grpc")))
        .await
        .unwrap()
}

/// `warren_scheduler_leader` from a replica's /metrics; `None` if it does not answer.
async fn leader_gauge(p: &Proc) -> Option<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(p.addr("scheduler admin"))
        .await
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("warren_scheduler_leader "))
        .and_then(|v| v.trim().parse().ok())
}

async fn register(c: &mut Client, node_id: &str) -> u64 {
    let incarnation = rand::random::<u64>() | 1;
    c.register_node(pb::RegisterNodeRequest {
        node_id: node_id.into(),
        endpoint: "127.0.0.1:9".into(),
        capacity: 10,
        incarnation,
        roster: vec![],
        cached_layers: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
    incarnation
}

/// Heartbeats `node_id` (empty roster) every 200 ms until aborted, so that
/// a slow machine never lets its short lease run out mid-test.
fn keep_alive(c: &Client, node_id: &str, incarnation: u64) -> tokio::task::JoinHandle<()> {
    let (mut c, node_id) = (c.clone(), node_id.to_string());
    tokio::spawn(async move {
        loop {
            let _ = c
                .heartbeat(pb::HeartbeatRequest {
                    node_id: node_id.clone(),
                    incarnation,
                    roster: vec![],
                    cached_layers: vec![],
                    paused: Vec::new(),
                    lists_paused: false,
                })
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Place + RecordAssignment: a RUNNING sandbox on `node_id`.
async fn running(c: &mut Client, node_id: &str) -> pb::Placement {
    let p = c
        .place(pb::PlaceRequest {
            template_id: "base".into(),
            team_id: "team".into(),
            require_node_id: node_id.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    c.record_assignment(pb::RecordAssignmentRequest {
        sandbox_id: p.sandbox_id.clone(),
        node_id: p.node_id.clone(),
        generation: p.generation,
    })
    .await
    .unwrap();
    p
}

async fn lookup(c: &mut Client, id: &str) -> Result<pb::Route, tonic::Status> {
    c.lookup_node(pb::LookupNodeRequest {
        sandbox_id: id.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

/// `LookupNode` for a caller that has seen every change up to `seen`.
async fn lookup_after(c: &mut Client, id: &str, seen: u64) -> Result<pb::Route, tonic::Status> {
    c.lookup_node(pb::LookupNodeRequest {
        sandbox_id: id.into(),
        min_revision: seen,
        consistent: false,
    })
    .await
    .map(|r| r.into_inner())
}

async fn next_change(s: &mut tonic::Streaming<pb::BindingChange>) -> pb::BindingChange {
    tokio::time::timeout(PATIENCE, s.message())
        .await
        .expect("no watch message in time")
        .unwrap()
        .expect("watch stream ended")
}

#[tokio::test]
async fn a_delete_through_replica_2_reaches_a_watch_on_replica_1() {
    let pg = PgServer::start().unwrap();
    let (r1, r2) = two_replicas(&pg, "watch").await;
    let (mut c1, mut c2) = (client(&r1).await, client(&r2).await);
    let mut watch = c1
        .watch_bindings(pb::WatchBindingsRequest { from_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_change(&mut watch).await.kind, ChangeKind::Hello as i32);

    let inc = register(&mut c2, "node-a").await;
    let beating = keep_alive(&c2, "node-a", inc);
    let p = running(&mut c2, "node-a").await;
    let assigned = next_change(&mut watch).await;
    assert_eq!(
        (assigned.kind, assigned.sandbox_id.as_str()),
        (ChangeKind::Assigned as i32, p.sandbox_id.as_str())
    );
    // LookupNode answers the same on either replica.
    let (route1, route2) = (
        lookup(&mut c1, &p.sandbox_id).await.unwrap(),
        lookup(&mut c2, &p.sandbox_id).await.unwrap(),
    );
    assert_eq!(route1, route2);
    assert_eq!(
        (route1.node_id.as_str(), route1.generation),
        ("node-a", p.generation)
    );

    // The node reports the delete to replica 2; replica 1's watcher hears it.
    let sent = Instant::now();
    let report = c2
        .report_sandbox_event(pb::ReportSandboxEventRequest {
            node_id: "node-a".into(),
            events: vec![pb::SandboxEvent {
                sandbox_id: p.sandbox_id.clone(),
                generation: p.generation,
                r#type: EventType::Delete as i32,
                paused_record: None,
                logs: Vec::new(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(report.results[0].applied, "{report:?}");
    let removed = next_change(&mut watch).await;
    eprintln!(
        "replica 1 saw replica 2's delete {:?} after it was sent",
        sent.elapsed()
    );
    assert_eq!(removed.kind, ChangeKind::Removed as i32);
    assert_eq!(removed.sandbox_id, p.sandbox_id);
    assert_eq!(removed.generation, p.generation);
    let gone = lookup(&mut c1, &p.sandbox_id).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    beating.abort();
}

#[tokio::test]
async fn killing_the_sweeping_replica_hands_the_lease_to_the_other() {
    let pg = PgServer::start().unwrap();
    let (r1, r2) = two_replicas(&pg, "lease").await;
    let r1_leads = wait_until("exactly one replica to lead", PATIENCE, || async {
        match (leader_gauge(&r1).await?, leader_gauge(&r2).await?) {
            (1, 0) => Some(true),
            (0, 1) => Some(false),
            _ => None,
        }
    })
    .await;
    let (mut leader, survivor) = if r1_leads { (r1, r2) } else { (r2, r1) };
    let mut c = client(&survivor).await;
    // A node that keeps heartbeating through the survivor.
    let alive_inc = register(&mut c, "node-alive").await;
    let kept = running(&mut c, "node-alive").await;
    let mut beats = c.clone();
    let roster = vec![pb::SandboxRef {
        sandbox_id: kept.sandbox_id.clone(),
        generation: kept.generation,
    }];
    let heartbeats = tokio::spawn(async move {
        loop {
            let _ = beats
                .heartbeat(pb::HeartbeatRequest {
                    node_id: "node-alive".into(),
                    incarnation: alive_inc,
                    roster: roster.clone(),
                    cached_layers: vec![],
                    paused: Vec::new(),
                    lists_paused: false,
                })
                .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });

    leader.kill9().await;
    let killed = Instant::now();
    wait_until(
        "the survivor to take the sweep lease",
        NODE_LEASE,
        || async { (leader_gauge(&survivor).await? == 1).then_some(()) },
    )
    .await;
    eprintln!(
        "sweep lease handed over {:?} after SIGKILL",
        killed.elapsed()
    );

    // The survivor sweeps: a node that never heartbeats again is found dead
    // and its sandbox marked LOST; the heartbeating node keeps its own.
    // (Kept alive until its sandbox runs, then silent.)
    let silent_inc = register(&mut c, "node-silent").await;
    let beating = keep_alive(&c, "node-silent", silent_inc);
    let doomed = running(&mut c, "node-silent").await;
    beating.abort();
    wait_until("the silent node's sandbox to be LOST", PATIENCE, || {
        let mut c = c.clone();
        let id = doomed.sandbox_id.clone();
        async move {
            let b = c
                .get_sandbox(pb::GetSandboxRequest { sandbox_id: id })
                .await
                .ok()?
                .into_inner();
            (b.state == BindingState::Lost as i32).then_some(())
        }
    })
    .await;
    let down = lookup(&mut c, &doomed.sandbox_id).await.unwrap_err();
    assert_eq!(down.code(), Code::FailedPrecondition, "{down:?}");
    let route = lookup(&mut c, &kept.sandbox_id).await.unwrap();
    assert_eq!(route.state, BindingState::Running as i32);
    heartbeats.abort();
}

/// A gateway watching replica 2 and looking up through replica 1 names the
/// revision it has seen; replica 1's route view may not have applied it
/// yet (it follows replica 2's commits through NOTIFY), and then it answers
/// from the store: never the route the caller already knows is gone.
#[tokio::test]
async fn a_replica_behind_the_callers_revision_answers_from_its_store() {
    let pg = PgServer::start().unwrap();
    let (r1, r2) = two_replicas(&pg, "behind").await;
    let (mut c1, mut c2) = (client(&r1).await, client(&r2).await);
    let inc = register(&mut c2, "node-a").await;
    let beating = keep_alive(&c2, "node-a", inc);
    let mut watch = c2
        .watch_bindings(pb::WatchBindingsRequest { from_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(next_change(&mut watch).await.kind, ChangeKind::Hello as i32);
    for _ in 0..30 {
        let p = running(&mut c2, "node-a").await;
        let assigned = next_change(&mut watch).await;
        assert_eq!(assigned.kind, ChangeKind::Assigned as i32);
        let route = lookup_after(&mut c1, &p.sandbox_id, assigned.revision)
            .await
            .unwrap();
        assert_eq!(
            (route.generation, route.state),
            (p.generation, BindingState::Running as i32)
        );
        c2.report_sandbox_event(pb::ReportSandboxEventRequest {
            node_id: "node-a".into(),
            events: vec![pb::SandboxEvent {
                sandbox_id: p.sandbox_id.clone(),
                generation: p.generation,
                r#type: EventType::Delete as i32,
                paused_record: None,
                logs: Vec::new(),
            }],
        })
        .await
        .unwrap();
        let removed = next_change(&mut watch).await;
        assert_eq!(removed.kind, ChangeKind::Removed as i32);
        let gone = lookup_after(&mut c1, &p.sandbox_id, removed.revision).await;
        assert_eq!(
            gone.as_ref().map_err(|s| s.code()).err(),
            Some(Code::NotFound),
            "{gone:?}"
        );
    }
    beating.abort();
}
