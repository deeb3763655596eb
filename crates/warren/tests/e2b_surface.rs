//! Every call of the pinned `e2b` SDK's generated REST clients answers
//! (the coverage walk, `tests/e2b/coverage.py`), and the calls an SDK user
//! makes beyond the SDK's methods work as on E2B (`tests/e2b/every_call.py`):
//! a sandbox's logs while it runs and once it ended (through another
//! gateway: the scheduler keeps them), keeping a sandbox alive
//! (`refreshes`).
//!
//! One cluster of real processes (the `process` runtime: these are about
//! the API, not the sandbox boundary), two gateways, two teams.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;

/// In E2B's format, as a user's SDK would send them.
const KEY: &str = "e2b_1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d";
const OTHER_KEY: &str = "e2b_9f8e7d6c5b4a39281706f5e4d3c2b1a0f9e8d7c6";

async fn cluster() -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            gateways: 2,
            runtime: "process".into(),
            keys: vec![
                (KEY.into(), "team-a".into()),
                (OTHER_KEY.into(), "team-b".into()),
            ],
            ..Spec::default()
        },
    )
    .await
    .expect("the cluster starts")
}

async fn case(c: &Cluster, script: &str, name: &str) -> serde_json::Value {
    run_case(
        &format!("http://{}", c.gateway(0)),
        script,
        name,
        KEY,
        &[
            ("WARREN_OTHER_KEY", OTHER_KEY.to_string()),
            ("WARREN_OTHER_GATEWAY", format!("http://{}", c.gateway(1))),
        ],
        Duration::from_secs(180),
    )
    .await
}

/// Each of the SDK's REST operations is served: none answers the gateway's
/// unknown-route 404 (or a 405), and each answer parses as the SDK parses
/// it. Only the secret operations may be pending (their issue is open);
/// one of those that is served fails the walk too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_of_the_sdks_rest_clients_is_served() {
    let c = cluster().await;
    let facts = case(&c, "coverage.py", "all").await;
    assert_eq!(facts["failed"], serde_json::json!([]), "{facts}");
    // e2b 2.63.0's generated clients hold 56 operations; 5 are the
    // secrets' (pending until their issue lands).
    assert_eq!(facts["total"], 56, "the pinned SDK's operations: {facts}");
    assert_eq!(
        facts["served"].as_u64().unwrap_or(0) + facts["pending"].as_u64().unwrap_or(0),
        56,
        "{facts}"
    );
}

/// A sandbox's logs: envd's process starts and exits and the node's
/// lifecycle entries, structured, filtered and paged as E2B's v2 does, as
/// JSON lines in v1 (what `e2b sandbox logs` prints); another team's is a
/// 404; once the sandbox is killed they are still there, through the
/// other gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxs_logs_while_it_runs_and_after_it_ended() {
    let c = cluster().await;
    let facts = case(&c, "every_call.py", "logs").await;
    assert!(facts["ended"].as_u64().unwrap_or(0) >= 4, "{facts}");
}

/// `POST /sandboxes/{id}/refreshes` extends the end (never shortens it,
/// at least 15 s), 400 past 3600 s, 404 for another team.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_keeps_a_sandbox_alive() {
    let c = cluster().await;
    let facts = case(&c, "every_call.py", "refresh").await;
    assert!(facts["extended_s"].as_i64().unwrap_or(0) > 500, "{facts}");
}
