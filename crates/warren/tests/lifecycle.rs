//! A sandbox's life as the real `e2b` SDK sees it through a gateway
//! (`tests/e2b/lifecycle.py`), on `process`-runtime clusters: a killed
//! sandbox is E2B's 502 "The sandbox was not found" on the data plane (so
//! `is_running()` is false and a command cut by the kill says the sandbox
//! was killed); `GET /v2/sandboxes` is newest first unless `order=asc`,
//! across pages; a shortened timeout is enforced when it ends, not at the
//! node's next heartbeat.

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;

/// In E2B's format (`e2b_` + 40 hex), as a user's SDK would send it.
const KEY: &str = "e2b_5a7c9e1b3d5f7a9c2e4b6d8f0a2c4e6b8d0f1a3c";

async fn cluster(scheduler_args: &[&str]) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            keys: vec![(KEY.into(), "team-a".into())],
            scheduler_args: scheduler_args.iter().map(|a| a.to_string()).collect(),
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts")
}

async fn run(c: &Cluster, name: &str) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    run_case(
        &gateway,
        "lifecycle.py",
        name,
        KEY,
        &[],
        Duration::from_secs(180),
    )
    .await
}

/// Killed: `is_running()` false, the cut command says the sandbox was
/// killed, the data plane answers 502 "The sandbox was not found" with
/// `Should-Retry: false` (for never-existing ids too); the control plane 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sandbox_is_gone_as_e2b_says_it() {
    let c = cluster(&[]).await;
    let facts = run(&c, "killed_is_gone").await;
    assert!(
        facts["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("The sandbox was not found")),
        "{facts}"
    );
}

/// Newest first by default, oldest first with `order=asc`, and pages of
/// one in order with no sandbox twice; a bad `order` is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_are_newest_first_across_pages() {
    let c = cluster(&[]).await;
    let facts = run(&c, "list_order").await;
    assert_eq!(facts["made"].as_array().map(Vec::len), Some(3), "{facts}");
}

/// `set_timeout(3)` on a cluster whose nodes heartbeat once a minute: the
/// sandbox is gone soon after its end, because the scheduler tells the
/// node when the next end is due and the node asks again then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortened_timeout_is_enforced_when_it_ends() {
    let c = cluster(&["--heartbeat-interval", "60s", "--lease", "180s"]).await;
    let facts = run(&c, "timeout_ends_it").await;
    println!("gone {}s after its end", facts["gone_after_end_s"]);
}
