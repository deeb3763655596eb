//! Pause and resume through a gateway with the real `e2b` SDK
//! (`tests/e2b/pause.py`) on the `isolated` runtime: a paused sandbox's
//! processes stand still (read from the host), listings say `paused`, a
//! paused sandbox outlives its timeout, and `connect` resumes it with its
//! memory intact; a data-plane request does too, but only for a sandbox
//! created with auto-resume (without, E2B's 502 "paused", and it stays
//! paused). A sandbox created with `on_timeout: pause` is paused (frozen,
//! files and processes kept) when its timeout ends instead of killed. On
//! the `process` runtime a pause is a clear 501 that changes nothing, and
//! an auto-pause sandbox is killed at its end. A filesystem-only pause
//! (`keep_memory=False`, or `on_timeout` pause without memory) ends the
//! sandbox's processes (gone from the host's /proc) and keeps its disk;
//! `connect` cold-boots it there (files kept, a new boot id, old processes
//! gone); a kill removes its files.
//!
//! Needs what the security suite needs (root, cgroups, slirp4netns,
//! nftables, the `base` template in `/var/lib/warren/templates`).

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;

const KEY: &str = "e2b_1b3d5f7a9c2e4b6d8f0a2c4e6b8d0f1a3c5e7b9d";

async fn cluster(runtime: &str) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: runtime.into(),
            keys: vec![(KEY.into(), "team-a".into())],
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (isolated needs root, cgroups, slirp4netns, nftables and the base template)")
}

async fn run(c: &Cluster, name: &str) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    let data = c.dir().join("node-1").display().to_string();
    run_case(
        &gateway,
        "pause.py",
        name,
        KEY,
        &[("WARREN_NODE_DATA", data)],
        Duration::from_secs(300),
    )
    .await
}

#[tokio::test]
async fn a_paused_sandbox_stands_still_and_resumes_with_its_memory() {
    let c = cluster("isolated").await;
    let r = run(&c, "freeze_and_resume").await;
    eprintln!("facts: {r}");
    assert!(r["after"].as_u64() > r["frozen"].as_u64(), "{r}");
}

#[tokio::test]
async fn a_paused_sandbox_outlives_its_timeout() {
    let c = cluster("isolated").await;
    run(&c, "paused_outlives_its_timeout").await;
}

#[tokio::test]
async fn without_auto_resume_a_request_does_not_resume_a_paused_sandbox() {
    let c = cluster("isolated").await;
    let r = run(&c, "no_auto_resume_by_default").await;
    eprintln!("facts: {r}");
}

#[tokio::test]
async fn on_timeout_pause_pauses_at_the_end_and_a_request_resumes_with_auto_resume() {
    let c = cluster("isolated").await;
    let r = run(&c, "paused_at_timeout_then_auto_resumed").await;
    eprintln!("facts: {r}");
    assert!(r["after"].as_u64() > r["frozen"].as_u64(), "{r}");
}

#[tokio::test]
async fn a_filesystem_only_pause_ends_the_processes_and_connect_cold_boots() {
    let c = cluster("isolated").await;
    let r = run(&c, "filesystem_only_pause_and_reboot").await;
    eprintln!("facts: {r}");
}

#[tokio::test]
async fn requests_never_cold_boot_a_filesystem_paused_sandbox() {
    let c = cluster("isolated").await;
    let r = run(&c, "filesystem_paused_is_not_auto_resumed").await;
    eprintln!("facts: {r}");
}

#[tokio::test]
async fn killing_a_filesystem_paused_sandbox_removes_its_files() {
    let c = cluster("isolated").await;
    run(&c, "kill_a_filesystem_paused_sandbox").await;
}

#[tokio::test]
async fn on_timeout_pause_without_memory_pauses_filesystem_only() {
    let c = cluster("isolated").await;
    run(&c, "auto_pause_filesystem_only_at_timeout").await;
}

#[tokio::test]
async fn on_timeout_pause_without_auto_resume_stays_paused_on_requests() {
    let c = cluster("isolated").await;
    run(&c, "paused_at_timeout_stays_paused").await;
}
