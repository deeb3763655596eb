//! Warm pools (`--warm-pool`), as a user of the SDK sees them
//! (`tests/e2b/pool.py`): a sandbox a create takes from the pool shows
//! what a cold create's shows (environment, users, name, network, limits,
//! files, metadata, lifetime, token); the isolation checks of
//! `sandboxes.rs` hold for pooled sandboxes; concurrent creates never
//! share one; a changed template record drains the pool; pooled sandboxes
//! hold only a node's spare room. Each test on its own cluster.
//!
//! They need what `sandboxes.rs` needs (root, cgroups, slirp4netns,
//! nftables, the `base` template).

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::host_listener::HostListener;
use warren_test_support::sdk::{run_case, try_run_case};
use warren_test_support::templates::private_store;

/// In E2B's format (`e2b_` + 40 hex), as a user's SDK would send it.
const KEY: &str = "e2b_2c4e6a8b0d2f4a6c8e0b2d4f6a8c0e2b4d6f8a0c";

async fn cluster(node_args: &[&str]) -> Cluster {
    cluster_with(node_args, &[]).await
}

async fn cluster_with(node_args: &[&str], gateway_args: &[&str]) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![(KEY.into(), "team-a".into())],
            node_args: node_args.iter().map(|a| a.to_string()).collect(),
            gateway_args: gateway_args.iter().map(|a| a.to_string()).collect(),
            ..Spec::default()
        },
    )
    .await
    .expect("an isolated cluster starts (needs root, cgroups, slirp4netns, nftables and the base template: scripts/test builds it)")
}

fn metrics_url(c: &Cluster) -> String {
    let node = c.nodes[0].as_ref().expect("node-1 runs");
    format!("http://{}/metrics", node.addr("node admin"))
}

/// The value of the node's metric line starting with `series` (0 when absent).
async fn metric(c: &Cluster, series: &str) -> f64 {
    let node = c.nodes[0].as_ref().expect("node-1 runs");
    let a = warren_test_support::http::Http::default()
        .send(
            http::Method::GET,
            &node.addr("node admin"),
            "/metrics",
            &[],
            None,
        )
        .await
        .expect("the node's metrics answer");
    String::from_utf8_lossy(&a.body)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const READY: &str = "warren_node_warm_pool_ready{template=\"base\"}";
const TAKEN: &str = "warren_node_warm_pool_takes_total{template=\"base\",outcome=\"taken\"}";

/// Waits until the node's pool for `base` holds `n` sandboxes.
async fn filled(c: &Cluster, n: f64) {
    warren_test_support::wait_until(
        "the warm pool to fill",
        Duration::from_secs(120),
        || async move { (metric(c, READY).await >= n).then_some(()) },
    )
    .await;
}

async fn run(c: &Cluster, script: &str, name: &str, env: &[(&str, String)]) -> serde_json::Value {
    let mut env = env.to_vec();
    env.push(("WARREN_NODE_METRICS", metrics_url(c)));
    run_case(
        &format!("http://{}", c.gateway(0)),
        script,
        name,
        KEY,
        &env,
        Duration::from_secs(600),
    )
    .await
}

/// Two sandboxes a user makes (variables and metadata; no internet) on a
/// node without a pool and on one with a pool of two: both pooled ones are
/// taken from it, and what they show is the same, to the byte, as what the
/// cold ones show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_sandbox_is_the_sandbox_a_cold_create_makes() {
    let cold = cluster(&[]).await;
    let pooled = cluster(&["--warm-pool", "base=2"]).await;
    filled(&pooled, 2.0).await;
    let a = run(&cold, "pool.py", "facts", &[]).await;
    let b = run(&pooled, "pool.py", "facts", &[]).await;
    assert_eq!(
        metric(&pooled, TAKEN).await,
        2.0,
        "both creates were pooled"
    );
    assert_eq!(metric(&cold, TAKEN).await, 0.0);
    for part in ["default", "no_internet"] {
        for (key, value) in a[part].as_object().expect("facts") {
            assert_eq!(
                &b[part][key], value,
                "{part}.{key}: cold {value}, pooled {}",
                b[part][key]
            );
        }
    }
    assert_eq!(a, b);
}

/// The isolation checks of `sandboxes.rs` on pooled sandboxes: neither
/// the host nor another sandbox is reachable (the host listener accepts
/// nothing), and without internet access nothing leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_holds_for_pooled_sandboxes() {
    let c = cluster(&["--warm-pool", "base=2"]).await;
    filled(&c, 2.0).await;
    let host = HostListener::start();
    let outcome = try_run_case(
        &format!("http://{}", c.gateway(0)),
        "sandboxes.py",
        "no_host_no_neighbour",
        KEY,
        &[
            ("WARREN_HOST_PORT", host.port().to_string()),
            ("WARREN_NODE_ADDR", c.node(1)),
            ("WARREN_SCHEDULER_URL", c.scheduler_url()),
        ],
        Duration::from_secs(600),
    )
    .await;
    let accepted = host.stop().await;
    assert_eq!(
        accepted, 0,
        "a pooled sandbox reached the host: {outcome:?}"
    );
    outcome.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        metric(&c, TAKEN).await >= 2.0,
        "the case's sandboxes came from the pool"
    );
    filled(&c, 2.0).await;
    let before = metric(&c, TAKEN).await;
    run(&c, "sandboxes.py", "no_internet", &[]).await;
    assert!(
        metric(&c, TAKEN).await > before,
        "no_internet's sandboxes came from the pool"
    );
}

/// Eight creates at once on a pool of two: eight sandboxes, each its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_share_a_pooled_sandbox() {
    let c = cluster(&["--warm-pool", "base=2"]).await;
    filled(&c, 2.0).await;
    let facts = run(&c, "pool.py", "many_at_once", &[]).await;
    assert!(facts["taken"].as_f64().unwrap_or(0.0) >= 1.0, "{facts}");
}

/// A cluster on a store of its own: when `base`'s record changes there
/// (as a rebuild replaces it), no create gets a pooled sandbox of the old
/// one, and the pool refills from the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_template_drains_the_pool() {
    let store = warren_test_support::temp_dir();
    private_store(store.path());
    let dir = store.path().display().to_string();
    let c = cluster_with(
        &["--template-dir", &dir, "--warm-pool", "base=1"],
        &["--template-dir", &dir],
    )
    .await;
    let record = store.path().join("templates/base.json");
    run(
        &c,
        "pool.py",
        "rebuild",
        &[("WARREN_RECORD", record.display().to_string())],
    )
    .await;
}

/// `--capacity 2` and a pool of two: the pool is the node's spare room,
/// taken by creates, refused past capacity, given back by a delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_sandboxes_hold_only_spare_room() {
    let c = cluster(&["--capacity", "2", "--warm-pool", "base=2"]).await;
    run(&c, "pool.py", "capacity", &[]).await;
}
