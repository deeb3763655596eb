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
                }],
            })
            .await;
        assert_status(ev, Code::InvalidArgument, why);
        let hb = c
            .heartbeat(pb::HeartbeatRequest {
                node_id: "node-a".into(),
                incarnation: inc,
                roster: vec![sref(id, 1)],
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

on_both_stores!(
    malformed_sandbox_ids_are_rejected_everywhere,
    bad_generations_and_fences_change_nothing,
    bad_registrations_and_heartbeats_are_refused,
    bad_places_and_queries_write_nothing,
);
