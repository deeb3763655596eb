//! Schema 10 through the API, on both stores: an ended sandbox's log
//! kept by the DELETE that removes its binding (under the binding's team,
//! only when the DELETE applies, within the team's bound, gone after its
//! retention), and public template records (one per name across teams,
//! listed to every team).
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::collections::HashMap;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;

fn line(at_ms: i64, message: &str) -> pb::SandboxLogEntry {
    pb::SandboxLogEntry {
        at_ms,
        level: "info".into(),
        logger: "process".into(),
        message: message.into(),
        fields: HashMap::from([("pid".to_string(), "42".to_string())]),
    }
}

async fn delete_with_log(
    c: &mut Client,
    node: &str,
    p: &pb::Placement,
    logs: Vec<pb::SandboxLogEntry>,
) -> pb::EventResult {
    let b = p.binding.as_ref().unwrap();
    c.report_sandbox_event(pb::ReportSandboxEventRequest {
        node_id: node.into(),
        events: vec![pb::SandboxEvent {
            sandbox_id: b.sandbox_id.clone(),
            generation: b.generation,
            r#type: pb::EventType::Delete as i32,
            paused_record: None,
            logs,
        }],
    })
    .await
    .unwrap()
    .into_inner()
    .results
    .remove(0)
}

async fn read(
    c: &mut Client,
    sandbox: &str,
    team: &str,
) -> Result<Vec<pb::SandboxLogEntry>, tonic::Status> {
    c.read_sandbox_logs(pb::ReadSandboxLogsRequest {
        sandbox_id: sandbox.into(),
        team_id: team.into(),
    })
    .await
    .map(|r| r.into_inner().entries)
}

fn id_of(p: &pb::Placement) -> String {
    p.binding.as_ref().unwrap().sandbox_id.clone()
}

async fn an_ended_sandboxs_log_is_kept_for_its_team(store: TestStore) {
    // A team may keep 8 KiB of ended sandboxes' logs here.
    let s = Sched::start(&store, &["--sandbox-log-team-bytes=8192"]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "team-1").await;
    let id = id_of(&p);
    // A log on anything but a DELETE is refused, whole.
    let b = p.binding.as_ref().unwrap();
    let r = c
        .report_sandbox_event(pb::ReportSandboxEventRequest {
            node_id: "node-a".into(),
            events: vec![pb::SandboxEvent {
                sandbox_id: id.clone(),
                generation: b.generation,
                r#type: pb::EventType::Pause as i32,
                paused_record: None,
                logs: vec![line(1, "x")],
            }],
        })
        .await;
    assert_status(r, Code::InvalidArgument, "logs are only for a DELETE");
    // Nothing kept while it runs (its node has it).
    assert_status(read(&mut c, &id, "team-1").await, Code::NotFound, "no logs");

    // A DELETE whose fence misses (another node's word) keeps nothing;
    // the one that applies keeps the log, under the binding's team, with
    // bad levels read as info and an over-long message cut.
    register(&mut c, "node-z", 10).await;
    let miss = delete_with_log(&mut c, "node-z", &p, vec![line(1, "from another node")]).await;
    assert!(!miss.applied, "{miss:?}");
    assert_status(read(&mut c, &id, "team-1").await, Code::NotFound, "no logs");
    let mut odd = line(3, &"y".repeat(10_000));
    odd.level = "fatal".into();
    let done = delete_with_log(
        &mut c,
        "node-a",
        &p,
        vec![line(1, "Process started"), line(2, "Process exited"), odd],
    )
    .await;
    assert!(done.applied, "{done:?}");
    let kept = read(&mut c, &id, "team-1").await.unwrap();
    assert_eq!(kept.len(), 3);
    assert_eq!(kept[0].message, "Process started");
    assert_eq!(kept[0].fields["pid"], "42");
    assert_eq!(kept[2].level, "info");
    assert_eq!(kept[2].message.len(), 4096);
    // Another team reads nothing of it.
    assert_status(read(&mut c, &id, "team-2").await, Code::NotFound, "no logs");

    // The team's bound: a second ended sandbox's log makes room by
    // dropping the first's.
    let q = running(&mut c, "team-1").await;
    let big: Vec<_> = (0..20).map(|i| line(i, &"z".repeat(200))).collect();
    assert!(delete_with_log(&mut c, "node-a", &q, big).await.applied);
    assert_eq!(read(&mut c, &id_of(&q), "team-1").await.unwrap().len(), 20);
    assert_status(read(&mut c, &id, "team-1").await, Code::NotFound, "no logs");
    s.stop().await;

    // Past the retention they are gone (the sweep).
    let s = Sched::start_fast(&store, &["--sandbox-log-retention=200ms"]).await;
    let mut c = s.client().await;
    register(&mut c, "node-b", 10).await;
    let r = running(&mut c, "team-3").await;
    let node = r.binding.as_ref().unwrap().node_id.clone();
    assert!(
        delete_with_log(&mut c, &node, &r, vec![line(1, "short-lived")])
            .await
            .applied
    );
    eventually("the log to pass its retention", || {
        let mut c = c.clone();
        let id = id_of(&r);
        async move { read(&mut c, &id, "team-3").await.is_err().then_some(()) }
    })
    .await;
    s.stop().await;
}

fn built(name: &str, team: &str, called: &str, public: bool) -> pb::TemplateRecord {
    pb::TemplateRecord {
        name: name.into(),
        kind: pb::RecordKind::Built as i32,
        team_id: team.into(),
        digest: blob(1),
        layers: vec![pb::Layer {
            digest: blob(2),
            size_bytes: 10,
        }],
        defaults: Some(pb::TemplateDefaults::default()),
        source: "api build b1".into(),
        snapshot: Some(pb::SnapshotMeta {
            name: called.into(),
            source_sandbox: String::new(),
            node_id: "node-a".into(),
            paused: None,
            public,
        }),
        ..Default::default()
    }
}

async fn put(
    c: &mut Client,
    r: pb::TemplateRecord,
    expected: u64,
) -> Result<pb::TemplateRecord, tonic::Status> {
    c.put_template_records(pb::PutTemplateRecordsRequest {
        puts: vec![pb::RecordPut {
            record: Some(r),
            expected_version: expected,
        }],
        bounds: None,
    })
    .await
    .map(|r| r.into_inner().records.remove(0))
}

async fn public_names(c: &mut Client) -> Vec<String> {
    c.list_template_records(pb::ListTemplateRecordsRequest {
        public_only: true,
        page_size: 100,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .records
    .into_iter()
    .map(|r| r.snapshot.unwrap().name)
    .collect()
}

async fn one_name_is_public_once_across_teams(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let a = put(&mut c, built("snap-a", "team-a", "app", false), 0)
        .await
        .unwrap();
    put(&mut c, built("snap-b", "team-b", "app", false), 0)
        .await
        .unwrap();
    assert!(public_names(&mut c).await.is_empty());
    // team-a publishes "app": listed to all, its flag kept on read.
    let a = put(&mut c, built("snap-a", "team-a", "app", true), a.version)
        .await
        .unwrap();
    assert!(a.snapshot.as_ref().unwrap().public);
    assert_eq!(public_names(&mut c).await, ["app"]);
    // team-b cannot publish the same name, nor insert one public under it.
    let b = c
        .get_template_record(pb::GetTemplateRecordRequest {
            name: "snap-b".into(),
            team_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let r = put(&mut c, built("snap-b", "team-b", "app", true), b.version).await;
    assert_status(r, Code::AlreadyExists, "public as \"app\" already");
    let r = put(&mut c, built("snap-c", "team-b", "app", true), 0).await;
    assert_status(r, Code::AlreadyExists, "public as \"app\" already");
    // Public needs a team's named record.
    let mut op = built("op", "", "", true);
    op.kind = pb::RecordKind::Operator as i32;
    op.snapshot = None;
    put(&mut c, op, 0).await.unwrap();
    let r = put(&mut c, built("snap-d", "team-b", "", true), 0).await;
    assert_status(r, Code::InvalidArgument, "public is only for");
    // Unpublished, the name is free again.
    put(&mut c, built("snap-a", "team-a", "app", false), a.version)
        .await
        .unwrap();
    assert!(public_names(&mut c).await.is_empty());
    put(&mut c, built("snap-b", "team-b", "app", true), b.version)
        .await
        .unwrap();
    assert_eq!(public_names(&mut c).await, ["app"]);
    s.stop().await;
}

on_both_stores!(
    an_ended_sandboxs_log_is_kept_for_its_team,
    one_name_is_public_once_across_teams
);
