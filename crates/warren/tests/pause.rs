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
//! gone); a kill removes its files. When its node is gone, `connect`
//! boots it on the other node from the layer its pause packed into the
//! template store (`tests/e2b/move.py`): a new generation, its files,
//! environment, metadata and egress policy kept, a second gateway with a warm route
//! follows, the old node restarted keeps nothing of it, and a kill
//! removes the layer from the store.
//!
//! Needs what the security suite needs (root, cgroups, slirp4netns,
//! nftables, the `base` template in `/var/lib/warren/templates`).

use std::time::Duration;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;
use warren_proto::scheduler::v1::GetSandboxRequest;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::Http;
use warren_test_support::sdk::run_case;
use warren_test_support::wait_until;

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

/// A `tests/e2b/move.py` step through gateway `g` (0-based).
async fn step(c: &Cluster, g: usize, name: &str, env: &[(&str, String)]) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(g));
    run_case(
        &gateway,
        "move.py",
        name,
        KEY,
        env,
        Duration::from_secs(300),
    )
    .await
}

/// `(node id, generation)` of the sandbox's binding, from the scheduler.
async fn placed(c: &Cluster, id: &str) -> (String, u64) {
    let b = binding(c, id).await;
    (b.node_id, b.generation)
}

async fn binding(c: &Cluster, id: &str) -> warren_proto::scheduler::v1::Binding {
    let mut s = SchedulerClient::connect(c.scheduler_url())
        .await
        .expect("scheduler gRPC");
    s.get_sandbox(GetSandboxRequest {
        sandbox_id: id.into(),
    })
    .await
    .expect("GetSandbox")
    .into_inner()
}

#[tokio::test]
async fn a_filesystem_paused_sandbox_resumes_on_another_node_when_its_node_is_gone() {
    moves(false).await;
}

#[tokio::test]
async fn a_filesystem_paused_sandbox_on_a_lost_node_resumes_on_another_node() {
    moves(true).await;
}

/// A node restarted before the resume drops its filesystem-paused
/// sandbox (Limits in docs/sandboxes.md), and with it what the pause put
/// in the template store.
#[tokio::test]
async fn a_node_restarted_before_the_resume_removes_the_paused_layer() {
    let mut c = Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![(KEY.into(), "team-a".into())],
            tls: false,
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (isolated needs root, cgroups, slirp4netns, nftables and the base template)");
    let made = step(&c, 0, "create", &[]).await;
    let id = made["sandbox"].as_str().expect("a sandbox id").to_string();
    step(&c, 0, "pause", &[("SANDBOX", id.clone())]).await;
    let record = c
        .template_dir()
        .expect("a private store")
        .join(format!("templates/paused-{id}.json"));
    let packed: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("the paused record"))
            .expect("the paused record is JSON");
    let layer = packed["layers"][0].as_str().expect("its layer").to_string();
    let blob = c
        .template_dir()
        .expect("a private store")
        .join(format!("blobs/{layer}.tar"));
    assert!(std::path::Path::new(&blob).is_file(), "{}", blob.display());
    c.kill_node(1).await;
    c.restart_node(1).await.expect("the node restarts");
    wait_until(
        "the paused record and layer removed",
        Duration::from_secs(60),
        || {
            let (record, blob) = (record.clone(), blob.clone());
            async move {
                (!std::path::Path::new(&record).exists() && !std::path::Path::new(&blob).exists())
                    .then_some(())
            }
        },
    )
    .await;
}

/// See the module doc; `lost`: the resume waits until the dead node's
/// lease ran out (the binding LOST) instead of finding it unreachable.
async fn moves(lost: bool) {
    let mut c = Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 2,
            gateways: 2,
            runtime: "isolated".into(),
            keys: vec![(KEY.into(), "team-a".into())],
            // The test reads the scheduler and the old node directly.
            tls: false,
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (isolated needs root, cgroups, slirp4netns, nftables and the base template)");
    let made = step(&c, 0, "create", &[]).await;
    let id = made["sandbox"].as_str().expect("a sandbox id").to_string();
    let boot = made["boot"].as_str().expect("a boot id").to_string();
    let ca = made["ca"].as_str().expect("its egress CA").to_string();
    let env = |extra: &[(&'static str, String)]| {
        let mut v = vec![
            ("SANDBOX", id.clone()),
            ("BOOT", boot.clone()),
            ("CA", ca.clone()),
        ];
        v.extend_from_slice(extra);
        v
    };
    // The second gateway routes to it (its cache holds the route).
    step(&c, 1, "use", &env(&[])).await;
    step(&c, 0, "pause", &env(&[])).await;
    let (home, generation) = placed(&c, &id).await;
    let record = c
        .template_dir()
        .expect("a private store")
        .join(format!("templates/paused-{id}.json"));
    let packed: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&record).expect("the pause recorded the sandbox's layer"),
    )
    .expect("the paused record is JSON");
    let layer = packed["layers"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(|l| l.as_str())
        .expect("the paused record names its layer")
        .to_string();
    assert_eq!(packed["snapshot"]["team"], "", "no team's record: {packed}");
    let blob = c
        .template_dir()
        .expect("a private store")
        .join(format!("blobs/{layer}.tar"));
    assert!(std::path::Path::new(&blob).is_file(), "{}", blob.display());

    // Its node dies; connect boots it on the other one.
    let home_index: usize = home
        .strip_prefix("node-")
        .and_then(|n| n.parse().ok())
        .expect("node-N");
    c.kill_node(home_index).await;
    if lost {
        wait_until("the binding LOST", Duration::from_secs(120), || async {
            let state = binding(&c, &id).await.state;
            (state == warren_proto::scheduler::v1::BindingState::Lost as i32).then_some(())
        })
        .await;
    }
    let resumed = step(&c, 0, "resume", &env(&[])).await;
    eprintln!("resumed: {resumed}");
    let (now_on, now_generation) = placed(&c, &id).await;
    assert_ne!(now_on, home, "it runs on the other node");
    assert!(
        now_generation > generation,
        "{now_generation} > {generation}"
    );
    assert!(
        !std::path::Path::new(&record).exists(),
        "the paused record goes once it runs again"
    );
    // The second gateway, its route to the dead node cached, follows.
    step(&c, 1, "use", &env(&[])).await;

    // The old node, back, neither keeps nor serves it.
    c.restart_node(home_index)
        .await
        .expect("the old node restarts");
    let old = c.node(home_index);
    let listed = |addr: String| async move {
        let a = Http::new(Duration::from_secs(30))
            .send(http::Method::GET, &addr, "/_warren/v1/sandboxes", &[], None)
            .await
            .ok()?;
        a.status.is_success().then_some(a.json)
    };
    let on_old = wait_until("the old node's listing", Duration::from_secs(60), || {
        listed(old.clone())
    })
    .await;
    assert!(
        !on_old.to_string().contains(&id),
        "the old node lists it: {on_old}"
    );
    let kept = c.dir().join(format!("node-{home_index}/sandboxes/{id}"));
    wait_until(
        "the old node's copy removed",
        Duration::from_secs(60),
        || {
            let kept = kept.clone();
            async move { (!kept.exists()).then_some(()) }
        },
    )
    .await;
    step(&c, 0, "use", &env(&[])).await;
    step(&c, 1, "use", &env(&[])).await;
    assert_eq!(placed(&c, &id).await, (now_on, now_generation));

    // A kill removes its layer from the store.
    let killed = Http::new(Duration::from_secs(60))
        .send(
            http::Method::DELETE,
            &c.gateway(0),
            &format!("/sandboxes/{id}"),
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect("DELETE");
    assert_eq!(killed.status, http::StatusCode::NO_CONTENT);
    wait_until("the paused layer removed", Duration::from_secs(60), || {
        let blob = blob.clone();
        async move { (!std::path::Path::new(&blob).exists()).then_some(()) }
    })
    .await;
}
