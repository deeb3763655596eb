//! Sandbox metrics (`GET /sandboxes/{id}/metrics`, `GET /sandboxes/metrics`)
//! through a gateway with the real `e2b` SDK (`tests/e2b/metrics.py`), on
//! nodes that sample every second: on the `isolated` runtime the figures
//! are the sandbox's cgroup and disk (CPU burnt, memory held and a file
//! written all show), windows filter, teams are apart, the multi form
//! answers only what was asked, and a paused sandbox is not sampled; on
//! the `process` runtime what can be read without cgroups.
//!
//! The isolated cases need what the security suite needs (root, cgroups,
//! slirp4netns, nftables, the `base` template in `/var/lib/warren/templates`).

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;

const KEY: &str = "e2b_2c4e6a8b0d1f3a5c7e9b1d3f5a7c9e0b2d4f6a8c";
const OTHER_KEY: &str = "e2b_9e7c5a3f1d0b8e6c4a2f0d9b7e5c3a1f8d6b4e2a";

async fn cluster(runtime: &str) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: runtime.into(),
            keys: vec![(KEY.into(), "team-a".into()), (OTHER_KEY.into(), "team-b".into())],
            node_args: vec!["--metrics-interval".into(), "1s".into()],
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (isolated needs root, cgroups, slirp4netns, nftables and the base template)")
}

async fn run(c: &Cluster, name: &str) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    let r = run_case(
        &gateway,
        "metrics.py",
        name,
        KEY,
        &[("OTHER_API_KEY", OTHER_KEY.to_string())],
        Duration::from_secs(300),
    )
    .await;
    eprintln!("facts: {r}");
    r
}

#[tokio::test]
async fn cpu_memory_and_disk_use_show_in_the_samples() {
    let c = cluster("isolated").await;
    let r = run(&c, "usage_shows_in_samples").await;
    let n = |k: &str| r[k].as_f64().unwrap_or(-1.0);
    assert!(n("busy_pct") > n("idle_pct"), "{r}");
    assert!(n("mem_after") >= n("mem_before") + 90.0 * 1048576.0, "{r}");
    assert!(
        n("disk_after") >= n("disk_before") + 45.0 * 1048576.0,
        "{r}"
    );
}

#[tokio::test]
async fn windows_teams_the_multi_form_and_pauses() {
    let c = cluster("isolated").await;
    let r = run(&c, "windows_teams_and_many").await;
    assert!(r["samples"].as_u64() > Some(0), "{r}");
}

#[tokio::test]
async fn the_process_runtime_reports_cpu_and_memory() {
    let c = cluster("process").await;
    let r = run(&c, "process_runtime").await;
    assert!(r["mem_used"].as_u64() > Some(0), "{r}");
}
