//! Bad input: malformed ids, unknown nodes, stale incarnations, generations
//! that are 0 or from the future. Each gets INVALID_ARGUMENT or
//! FAILED_PRECONDITION with a message naming the problem, and nothing is
//! written (the listings are unchanged afterwards).
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::collections::HashMap;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::EventType;

const BAD_SANDBOX_IDS: &[(&str, &str)] = &[
    ("", "empty"),
    ("ABC", "[a-z0-9]"),
    ("abc-def", "[a-z0-9]"),
    ("abc/../x", "[a-z0-9]"),
    ("é", "[a-z0-9]"),
];

/// What a client could observe of the store: every binding and node.
async fn snapshot(c: &mut Client) -> (Vec<pb::Binding>, Vec<(String, u64, u32)>) {
    let nodes = nodes(c)
        .await
        .into_iter()
        .map(|n| (n.node_id, n.incarnation, n.sandboxes))
        .collect();
    (all_sandboxes(c).await, nodes)
}

async fn malformed_sandbox_ids_are_rejected_everywhere(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "t").await;
    let before = snapshot(&mut c).await;

    let long = "a".repeat(65);
    let mut cases: Vec<(String, &str)> = BAD_SANDBOX_IDS
        .iter()
        .map(|(id, why)| (id.to_string(), *why))
        .collect();
    cases.push((long, "65 characters"));
    for (id, why) in &cases {
        assert_status(lookup(&mut c, id).await, Code::InvalidArgument, why);
        assert_status(get(&mut c, id).await, Code::InvalidArgument, why);
        let rec = c
            .record_assignment(pb::RecordAssignmentRequest {
                sandbox_id: id.clone(),
                node_id: "node-a".into(),
                generation: p.generation,
            })
            .await;
        assert_status(rec, Code::InvalidArgument, why);
        let st = c
            .set_timeout(pb::SetTimeoutRequest {
                sandbox_id: id.clone(),
                end_at_ms: 1,
            })
            .await;
        assert_status(st, Code::InvalidArgument, why);
        let re = c
            .reassign(pb::ReassignRequest {
                sandbox_id: id.clone(),
                node_id: String::new(),
            })
            .await;
        assert_status(re, Code::InvalidArgument, why);
        let ev = c
            .report_sandbox_event(pb::ReportSandboxEventRequest {
                node_id: "node-a".into(),
                events: vec![pb::SandboxEvent {
                    sandbox_id: id.clone(),
                    generation: 1,
                    r#type: EventType::Delete as i32,
                    paused_record: None,
                    logs: Vec::new(),
                }],
            })
            .await;
        assert_status(ev, Code::InvalidArgument, why);
        let hb = c
            .heartbeat(pb::HeartbeatRequest {
                node_id: "node-a".into(),
                incarnation: inc,
                roster: vec![sref(id, 1)],
                cached_layers: vec![],
                paused: Vec::new(),
                lists_paused: false,
            })
            .await;
        assert_status(hb, Code::InvalidArgument, "roster entry");
    }
    // Well-formed but unknown.
    assert_status(
        lookup(&mut c, "nosuchsandbox").await,
        Code::NotFound,
        "nosuchsandbox",
    );
    assert_status(
        get(&mut c, "nosuchsandbox").await,
        Code::NotFound,
        "not found",
    );
    let re = c
        .reassign(pb::ReassignRequest {
            sandbox_id: "nosuchsandbox".into(),
            node_id: String::new(),
        })
        .await;
    assert_status(re, Code::NotFound, "not found");
    assert_eq!(snapshot(&mut c).await, before);
    s.stop().await;
}

async fn bad_generations_and_fences_change_nothing(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    register(&mut c, "node-b", 10).await;
    let p = place(&mut c, "t").await;
    let other = if p.node_id == "node-a" {
        "node-b"
    } else {
        "node-a"
    };
    let before = snapshot(&mut c).await;

    let record = |node: &str, generation: u64| pb::RecordAssignmentRequest {
        sandbox_id: p.sandbox_id.clone(),
        node_id: node.into(),
        generation,
    };
    let r = c.record_assignment(record(&p.node_id, 0)).await;
    assert_status(r, Code::InvalidArgument, "generation 0");
    let r = c
        .record_assignment(record(&p.node_id, p.generation + 1000))
        .await;
    assert_status(r, Code::InvalidArgument, "never issued");
    let r = c.record_assignment(record(other, p.generation)).await;
    assert_status(r, Code::FailedPrecondition, &p.node_id);
    let r = c.record_assignment(record("Node_A", p.generation)).await;
    assert_status(r, Code::InvalidArgument, "node id");

    // A batch with one bad event applies none of it.
    let batch = |events: Vec<pb::SandboxEvent>| pb::ReportSandboxEventRequest {
        node_id: p.node_id.clone(),
        events,
    };
    let delete = pb::SandboxEvent {
        sandbox_id: p.sandbox_id.clone(),
        generation: p.generation,
        r#type: EventType::Delete as i32,
        paused_record: None,
        logs: Vec::new(),
    };
    let future = pb::SandboxEvent {
        generation: p.generation + 1000,
        ..delete.clone()
    };
    let zero = pb::SandboxEvent {
        generation: 0,
        ..delete.clone()
    };
    let untyped = pb::SandboxEvent {
        r#type: 0,
        ..delete.clone()
    };
    for (bad, why) in [
        (future, "never issued"),
        (zero, "generation 0"),
        (untyped, "event type"),
    ] {
        let r = c
            .report_sandbox_event(batch(vec![delete.clone(), bad]))
            .await;
        assert_status(r, Code::InvalidArgument, why);
    }
    // Unknown node: refused as a whole.
    let r = c
        .report_sandbox_event(pb::ReportSandboxEventRequest {
            node_id: "node-zz".into(),
            events: vec![delete.clone()],
        })
        .await;
    assert_status(r, Code::FailedPrecondition, "unknown node");
    // Wrong node for the fence: not applied, said why.
    let r = event(
        &mut c,
        other,
        &p.sandbox_id,
        p.generation,
        EventType::Delete,
    )
    .await;
    assert!(!r.applied);
    assert!(r.reason.contains(&p.node_id), "{}", r.reason);
    assert_eq!(snapshot(&mut c).await, before);
    s.stop().await;
}

async fn bad_registrations_and_heartbeats_are_refused(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let inc = register(&mut c, "node-a", 10).await;
    let before = snapshot(&mut c).await;

    let good = pb::RegisterNodeRequest {
        node_id: "node-b".into(),
        endpoint: "node-b.test:7000".into(),
        capacity: 5,
        incarnation: 9,
        roster: vec![],
        cached_layers: vec![],
        ..Default::default()
    };
    let cases: Vec<(pb::RegisterNodeRequest, &str)> = vec![
        (
            pb::RegisterNodeRequest {
                node_id: String::new(),
                ..good.clone()
            },
            "node id is empty",
        ),
        (
            pb::RegisterNodeRequest {
                node_id: "-bad".into(),
                ..good.clone()
            },
            "node id",
        ),
        (
            pb::RegisterNodeRequest {
                node_id: "n".repeat(64),
                ..good.clone()
            },
            "node id",
        ),
        (
            pb::RegisterNodeRequest {
                endpoint: String::new(),
                ..good.clone()
            },
            "endpoint is empty",
        ),
        (
            pb::RegisterNodeRequest {
                endpoint: "nohostport".into(),
                ..good.clone()
            },
            "host:port",
        ),
        (
            pb::RegisterNodeRequest {
                capacity: 0,
                ..good.clone()
            },
            "capacity",
        ),
        (
            pb::RegisterNodeRequest {
                incarnation: 0,
                ..good.clone()
            },
            "incarnation",
        ),
        (
            pb::RegisterNodeRequest {
                roster: vec![sref("ok1", 0)],
                ..good.clone()
            },
            "generation 0",
        ),
    ];
    for (req, why) in cases {
        assert_status(c.register_node(req).await, Code::InvalidArgument, why);
    }
    let hb = |node_id: &str, incarnation: u64| pb::HeartbeatRequest {
        node_id: node_id.into(),
        incarnation,
        roster: vec![],
        cached_layers: vec![],
        paused: Vec::new(),
        lists_paused: false,
    };
    assert_status(
        c.heartbeat(hb("node-a", inc ^ 0xff)).await,
        Code::FailedPrecondition,
        "stale incarnation",
    );
    assert_status(
        c.heartbeat(hb("node-b", 9)).await,
        Code::FailedPrecondition,
        "unknown node, register first",
    );
    assert_status(
        c.heartbeat(hb("NODE", 9)).await,
        Code::InvalidArgument,
        "node id",
    );
    assert_eq!(snapshot(&mut c).await, before);
    s.stop().await;
}

async fn bad_places_and_queries_write_nothing(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let before = snapshot(&mut c).await;

    let base = place_req("t");
    let too_many: HashMap<String, String> =
        (0..200).map(|i| (format!("k{i}"), "v".into())).collect();
    let cases: Vec<(pb::PlaceRequest, Code, &str)> = vec![
        (
            pb::PlaceRequest {
                require_node_id: "Bad Node".into(),
                ..base.clone()
            },
            Code::InvalidArgument,
            "node id",
        ),
        (
            pb::PlaceRequest {
                require_node_id: "node-zz".into(),
                ..base.clone()
            },
            Code::FailedPrecondition,
            "unknown node",
        ),
        (
            pb::PlaceRequest {
                timeout_secs: u64::MAX,
                ..base.clone()
            },
            Code::InvalidArgument,
            "timeout_secs",
        ),
        (
            pb::PlaceRequest {
                metadata: too_many,
                ..base.clone()
            },
            Code::InvalidArgument,
            "metadata",
        ),
        (
            pb::PlaceRequest {
                team_id: "t".repeat(500),
                ..base.clone()
            },
            Code::InvalidArgument,
            "team_id",
        ),
        (
            pb::PlaceRequest {
                idempotency_key: "k".repeat(300),
                ..base.clone()
            },
            Code::InvalidArgument,
            "idempotency key",
        ),
    ];
    for (req, code, why) in cases {
        assert_status(c.place(req).await, code, why);
    }
    let list = |req: pb::ListSandboxesRequest| {
        let mut c = c.clone();
        async move { c.list_sandboxes(req).await }
    };
    let r = list(pb::ListSandboxesRequest {
        page_token: "garbage".into(),
        ..Default::default()
    })
    .await;
    assert_status(r, Code::InvalidArgument, "page_token");
    let r = list(pb::ListSandboxesRequest {
        states: vec![0],
        ..Default::default()
    })
    .await;
    assert_status(r, Code::InvalidArgument, "state");
    let r = c
        .set_timeout(pb::SetTimeoutRequest {
            sandbox_id: "abc".into(),
            end_at_ms: 0,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "end_at_ms");
    assert_eq!(snapshot(&mut c).await, before);
    s.stop().await;
}

/// A team's snapshot record that passes every check.
fn good_record() -> pb::TemplateRecord {
    pb::TemplateRecord {
        name: "snap-a".into(),
        kind: pb::RecordKind::Snapshot as i32,
        team_id: "t".into(),
        digest: blob(1),
        layers: vec![pb::Layer {
            digest: blob(2),
            size_bytes: 10,
        }],
        defaults: Some(pb::TemplateDefaults::default()),
        snapshot: Some(pb::SnapshotMeta::default()),
        ..Default::default()
    }
}

/// Every records RPC refuses malformed input with INVALID_ARGUMENT naming
/// the field, and writes nothing.
async fn bad_record_build_and_upload_input_names_the_field(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let put = |c: Client, puts: Vec<(pb::TemplateRecord, u64)>| async move {
        let mut c = c;
        c.put_template_records(pb::PutTemplateRecordsRequest {
            puts: puts
                .into_iter()
                .map(|(r, v)| pb::RecordPut {
                    record: Some(r),
                    expected_version: v,
                })
                .collect(),
            bounds: None,
        })
        .await
    };
    let with = |f: fn(&mut pb::TemplateRecord)| {
        let mut r = good_record();
        f(&mut r);
        r
    };
    let bad_records: Vec<(pb::TemplateRecord, &str)> = vec![
        (
            with(|r| r.name = "Snap/A".into()),
            "puts[0].record.name \"Snap/A\"",
        ),
        (
            with(|r| r.kind = 0),
            "puts[0].record.kind 0 is not a record kind",
        ),
        (with(|r| r.kind = 42), "puts[0].record.kind 42"),
        (
            with(|r| r.team_id.clear()),
            "puts[0].record.team_id is required",
        ),
        (
            with(|r| {
                r.kind = pb::RecordKind::Operator as i32;
                r.snapshot = None;
            }),
            "puts[0].record.team_id must be empty",
        ),
        (
            with(|r| r.digest = "sha256-xyz".into()),
            "puts[0].record.digest",
        ),
        (
            with(|r| r.layers[0].digest = "md5-00".into()),
            "puts[0].record.layers[0].digest",
        ),
        (
            with(|r| r.layers[0].size_bytes = u64::MAX),
            "puts[0].record.layers[0].size_bytes",
        ),
        (
            with(|r| r.defaults = None),
            "puts[0].record.defaults is required",
        ),
        (
            with(|r| r.snapshot = None),
            "puts[0].record.snapshot is required",
        ),
        (
            with(|r| r.snapshot.as_mut().unwrap().source_sandbox = "A/B".into()),
            "puts[0].record.snapshot.source_sandbox",
        ),
        (
            with(|r| r.snapshot.as_mut().unwrap().paused = Some(pb::PausedMeta::default())),
            "puts[0].record.snapshot.paused is only for a paused record",
        ),
        (
            with(|r| {
                r.kind = pb::RecordKind::Paused as i32;
                r.team_id.clear();
                r.snapshot.as_mut().unwrap().paused = Some(pb::PausedMeta {
                    own_layers: vec![blob(9)],
                    ..Default::default()
                });
            }),
            "puts[0].record.snapshot.paused.own_layers[0]",
        ),
        (
            with(|r| r.created_at_ms = -1),
            "puts[0].record.created_at_ms -1 is not a time",
        ),
        (
            with(|r| r.source = "a\nb".into()),
            "puts[0].record.source contains control characters",
        ),
    ];
    for (r, needle) in bad_records {
        assert_status(
            put(c.clone(), vec![(r, 0)]).await,
            Code::InvalidArgument,
            needle,
        );
    }
    assert_status(
        put(c.clone(), vec![]).await,
        Code::InvalidArgument,
        "puts has 0 entries",
    );
    assert_status(
        put(c.clone(), vec![(good_record(), 0), (good_record(), 0)]).await,
        Code::InvalidArgument,
        "puts names \"snap-a\" twice",
    );
    assert_status(
        put(c.clone(), vec![(good_record(), u64::MAX)]).await,
        Code::InvalidArgument,
        "puts[0].expected_version",
    );
    let r = c
        .delete_template_records(pb::DeleteTemplateRecordsRequest {
            records: vec![pb::RecordRef {
                name: "snap-a".into(),
                expected_version: 0,
            }],
            team_id: String::new(),
        })
        .await;
    assert_status(r, Code::InvalidArgument, "records[0].expected_version is 0");
    let r = c
        .get_template_record(pb::GetTemplateRecordRequest {
            name: String::new(),
            team_id: String::new(),
        })
        .await;
    assert_status(r, Code::InvalidArgument, "name \"\"");
    let r = c
        .list_template_records(pb::ListTemplateRecordsRequest {
            kinds: vec![9],
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "kinds[0] 9");
    let r = c
        .list_template_records(pb::ListTemplateRecordsRequest {
            page_token: "forged".into(),
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "page_token");
    let r = c
        .note_unused_blobs(pb::NoteUnusedBlobsRequest {
            digests: vec![blob(1), "sha256-".into()],
        })
        .await;
    assert_status(r, Code::InvalidArgument, "digests[1]");
    let r = c
        .remove_unused_blob(pb::RemoveUnusedBlobRequest {
            digest: blob(1),
            noted_at_ms: -5,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "noted_at_ms -5");
    let r = c
        .list_unused_blobs(pb::ListUnusedBlobsRequest {
            grace_ms: u64::MAX,
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "grace_ms");

    // Builds.
    let build = pb::CreateBuildRequest {
        build_id: "b-1".into(),
        team_id: "t".into(),
        template_name: "app".into(),
        request_json: "{}".into(),
        start_ttl_ms: 60_000,
        retention_ms: 60_000,
        bounds: None,
    };
    let creates: Vec<(pb::CreateBuildRequest, &str)> = vec![
        (
            pb::CreateBuildRequest {
                build_id: "B 1".into(),
                ..build.clone()
            },
            "build_id \"B 1\"",
        ),
        (
            pb::CreateBuildRequest {
                team_id: String::new(),
                ..build.clone()
            },
            "team_id is required",
        ),
        (
            pb::CreateBuildRequest {
                template_name: "a/b".into(),
                ..build.clone()
            },
            "template_name",
        ),
        (
            pb::CreateBuildRequest {
                request_json: "[1]".into(),
                ..build.clone()
            },
            "request_json must be a JSON object",
        ),
        (
            pb::CreateBuildRequest {
                request_json: "{".into(),
                ..build.clone()
            },
            "request_json is not JSON",
        ),
        (
            pb::CreateBuildRequest {
                start_ttl_ms: 0,
                ..build.clone()
            },
            "start_ttl_ms 0 must be between",
        ),
        (
            pb::CreateBuildRequest {
                retention_ms: u64::MAX,
                ..build.clone()
            },
            "retention_ms",
        ),
    ];
    for (req, needle) in creates {
        assert_status(c.create_build(req).await, Code::InvalidArgument, needle);
    }
    c.create_build(build).await.unwrap();
    let claim = pb::ClaimBuildRequest {
        build_id: "b-1".into(),
        team_id: "t".into(),
        template_name: "app".into(),
        owner: "gw".into(),
        lease_ms: 60_000,
        plan_json: "{}".into(),
        upload_hashes: vec![],
    };
    let claims: Vec<(pb::ClaimBuildRequest, &str)> = vec![
        (
            pb::ClaimBuildRequest {
                owner: String::new(),
                ..claim.clone()
            },
            "owner is required",
        ),
        (
            pb::ClaimBuildRequest {
                lease_ms: 3_600_001,
                ..claim.clone()
            },
            "lease_ms 3600001",
        ),
        (
            pb::ClaimBuildRequest {
                plan_json: "steps".into(),
                ..claim.clone()
            },
            "plan_json is not JSON",
        ),
        (
            pb::ClaimBuildRequest {
                upload_hashes: vec!["ABC".into()],
                ..claim.clone()
            },
            "upload_hashes[0] \"ABC\" is not a files hash",
        ),
    ];
    for (req, needle) in claims {
        assert_status(c.claim_build(req).await, Code::InvalidArgument, needle);
    }
    let b = c
        .claim_build(claim)
        .await
        .unwrap()
        .into_inner()
        .build
        .unwrap();
    assert_eq!(b.owner, "gw");
    let r = c
        .update_build_status(pb::UpdateBuildStatusRequest {
            build_id: "b-1".into(),
            owner: "gw".into(),
            status: pb::BuildStatus::Building as i32,
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "is not READY or ERROR");
    let append = pb::AppendBuildLogRequest {
        build_id: "b-1".into(),
        owner: "gw".into(),
        lines: vec![pb::LogLine {
            level: "info".into(),
            message: "ok".into(),
            ..Default::default()
        }],
        bounds: None,
        batch: 1,
    };
    let mut loud = append.clone();
    loud.lines[0].level = "loud".into();
    let mut many = append.clone();
    many.lines = vec![append.lines[0].clone(); 1001];
    let appends: Vec<(pb::AppendBuildLogRequest, &str)> = vec![
        (
            pb::AppendBuildLogRequest {
                batch: 0,
                ..append.clone()
            },
            "batch is 0",
        ),
        (loud, "lines[0].level \"loud\""),
        (many, "lines has 1001 entries"),
    ];
    for (req, needle) in appends {
        assert_status(c.append_build_log(req).await, Code::InvalidArgument, needle);
    }

    // Uploads.
    let upload = pb::PutUploadRequest {
        team_id: "t".into(),
        files_hash: "a".repeat(64),
        blob_digest: blob(3),
        size_bytes: 1,
        ttl_ms: 60_000,
        ..Default::default()
    };
    let uploads: Vec<(pb::PutUploadRequest, &str)> = vec![
        (
            pb::PutUploadRequest {
                files_hash: "abc".into(),
                ..upload.clone()
            },
            "files_hash \"abc\"",
        ),
        (
            pb::PutUploadRequest {
                blob_digest: "x".into(),
                ..upload.clone()
            },
            "blob_digest \"x\"",
        ),
        (
            pb::PutUploadRequest {
                ttl_ms: 0,
                ..upload.clone()
            },
            "ttl_ms 0",
        ),
        (
            pb::PutUploadRequest {
                size_bytes: u64::MAX,
                ..upload.clone()
            },
            "size_bytes",
        ),
    ];
    for (req, needle) in uploads {
        assert_status(c.put_upload(req).await, Code::InvalidArgument, needle);
    }
    let r = c
        .delete_upload(pb::DeleteUploadRequest {
            team_id: "t".into(),
            files_hash: "a".repeat(64),
            expected_version: 0,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "expected_version is 0");

    // Nothing was written by any of them.
    let records = c
        .list_template_records(pb::ListTemplateRecordsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .records;
    assert!(records.is_empty(), "{records:?}");
    assert!(noted(&mut c, 0).await.is_empty());
    let usage = c
        .get_team_usage(pb::GetTeamUsageRequest {
            team_id: "t".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (usage.builds, usage.build_log_bytes, usage.uploads),
        (1, 0, 0)
    );
    s.stop().await;
}

on_both_stores!(
    malformed_sandbox_ids_are_rejected_everywhere,
    bad_generations_and_fences_change_nothing,
    bad_registrations_and_heartbeats_are_refused,
    bad_places_and_queries_write_nothing,
    bad_record_build_and_upload_input_names_the_field,
);
