//! What a user of an `isolated` sandbox notices, one test per case, each on
//! its own cluster, with the real `e2b` SDK through a gateway
//! (`tests/e2b/sandboxes.py`): `pip install --user` and `sudo apt-get
//! install` from the internet; no internet when asked; denied addresses
//! refused while others connect; never the host nor another sandbox (but
//! the port relay works), not even with the sandbox's own nftables table
//! removed under it; writes under `/usr` stay in their sandbox (the
//! template's root on the host is unchanged); a template built from a file
//! is listed and used; an unknown template is a 404.
//!
//! They need what the security suite needs (root, cgroups, slirp4netns,
//! nftables, the `base` template in `/var/lib/warren/templates`) and, for
//! the package cases, the internet (PyPI, the Debian archive).

use std::path::PathBuf;
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::host_listener::HostListener;
use warren_test_support::sdk::{run_case, try_run_case};
use warren_test_support::templates::{private_store_all, TestTemplate, TEMPLATE_DIR};

/// In E2B's format (`e2b_` + 40 hex), as a user's SDK would send it.
const KEY: &str = "e2b_1b3d5f7a9c2e4b6d8f0a2c4e6b8d0f1a3c5e7b9d";

async fn cluster() -> Cluster {
    cluster_with_store(None).await
}

/// [`cluster`] on the template store `store` (None: one of its own).
async fn cluster_with_store(store: Option<PathBuf>) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![(KEY.into(), "team-a".into())],
            template_dir: store,
            ..Spec::default()
        },
    )
    .await
    .expect("an isolated cluster starts (needs root, cgroups, slirp4netns, nftables and the base template: scripts/test builds it)")
}

/// Runs one case of `tests/e2b/sandboxes.py`; returns its `RESULT` facts.
/// The package cases download from the internet, hence the room.
async fn run(c: &Cluster, name: &str, env: &[(&str, String)]) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    run_case(
        &gateway,
        "sandboxes.py",
        name,
        KEY,
        env,
        Duration::from_secs(900),
    )
    .await
}

/// [`run`] that returns the case's failure instead of panicking.
async fn try_run(
    c: &Cluster,
    name: &str,
    env: &[(&str, String)],
) -> Result<serde_json::Value, String> {
    let gateway = format!("http://{}", c.gateway(0));
    try_run_case(
        &gateway,
        "sandboxes.py",
        name,
        KEY,
        env,
        Duration::from_secs(900),
    )
    .await
}

/// Runs a host-probing case with a [`HostListener`]: checks first that the
/// host accepted nothing (saying what the case saw), then that the case
/// passed; returns its facts.
async fn run_against_the_host(c: &Cluster, name: &str) -> serde_json::Value {
    let host = HostListener::start();
    let outcome = try_run(
        c,
        name,
        &[
            ("WARREN_HOST_PORT", host.port().to_string()),
            ("WARREN_NODE_ADDR", c.node(1)),
            ("WARREN_SCHEDULER_URL", c.scheduler_url()),
        ],
    )
    .await;
    let accepted = host.stop().await;
    let said = match &outcome {
        Ok(facts) => facts.to_string(),
        Err(e) => e.clone(),
    };
    assert_eq!(
        accepted, 0,
        "a sandbox connected to a listener on the host ({accepted} accepted); the case: {said}"
    );
    outcome.unwrap_or_else(|e| panic!("{e}\n(the host listener on 0.0.0.0 accepted no connection)"))
}

/// `<template dir>/rootfs/<hex>`: where a template's root is unpacked.
fn template_root(name: &str) -> PathBuf {
    let meta = std::fs::read_to_string(format!("{TEMPLATE_DIR}/templates/{name}.json"))
        .unwrap_or_else(|e| panic!("template {name} in {TEMPLATE_DIR}: {e}"));
    let meta: serde_json::Value = serde_json::from_str(&meta).expect("template json");
    let digest = meta["digest"].as_str().expect("digest");
    let hex = digest.strip_prefix("sha256-").expect("sha256- digest");
    PathBuf::from(format!("{TEMPLATE_DIR}/rootfs/{hex}"))
}

/// 1. `pip install --user` as the default user, from PyPI; the module imports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pip_install_as_the_user_works() {
    let c = cluster().await;
    run(&c, "pip_install", &[]).await;
}

/// 2. `sudo apt-get install -y cowsay` from the Debian archive; it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sudo_apt_get_install_works() {
    let c = cluster().await;
    run(&c, "apt_install", &[]).await;
}

/// 3. `allow_internet_access=False`: no outbound connection, no DNS, only
/// `lo`, as `user` and as the sandbox's root; commands and files still work.
/// (A default sandbox makes the same connections first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_internet_access_means_none() {
    let c = cluster().await;
    run(&c, "no_internet", &[]).await;
}

/// 4. `network.deny_out` with pypi.org's addresses (as the host resolves
/// them): those are refused, another address still connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_addresses_are_refused_others_connect() {
    let c = cluster().await;
    let facts = run(&c, "deny_out", &[]).await;
    assert!(
        !facts["denied"].as_array().expect("denied").is_empty(),
        "{facts}"
    );
}

/// 5. Neither the host (its services' ports, and a listener on every
/// address, through 127.0.0.1, slirp's 10.0.2.2 or the host's addresses)
/// nor another sandbox's server is reachable from a sandbox, not in one try
/// nor in many; the other sandbox's server is reachable through the
/// gateway's port relay. The host listener accepts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neither_the_host_nor_another_sandbox_is_reachable() {
    let c = cluster().await;
    run_against_the_host(&c, "no_host_no_neighbour").await;
}

/// 5b. A sandbox whose own nftables table is removed under it (its policy
/// is gone: a denied address connects) still reaches nothing of the host:
/// the node's guard table refuses the host to every sandbox uid, whatever
/// happens to the sandboxes' own tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_own_table_a_sandbox_still_cannot_reach_the_host() {
    let c = cluster().await;
    let facts = run_against_the_host(&c, "host_without_own_table").await;
    assert!(
        facts["removed"]
            .as_str()
            .is_some_and(|t| t.starts_with("warren_")),
        "{facts}"
    );
}

/// 6. A file written (and one rewritten) under `/usr` with sudo in sandbox A
/// is A's alone: a new sandbox B has the template's, and so has the
/// template's root on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_under_usr_stay_in_their_sandbox() {
    let c = cluster().await;
    let root = template_root("base");
    let copyright = root.join("usr/share/doc/sudo/copyright");
    let before = std::fs::read(&copyright).expect("base has sudo's copyright file");
    run(&c, "writes_stay_in_the_sandbox", &[]).await;
    assert!(
        !root.join("usr/share/doc/warren-test").exists(),
        "the sandbox's new file reached the template's root {}",
        root.display()
    );
    assert_eq!(
        std::fs::read(&copyright).expect("still there"),
        before,
        "the sandbox's rewrite reached the template's root"
    );
}

/// 7. A template built from a file (`from = "base"`, a run step, 384 MiB)
/// is listed by `GET /templates` with its memory, and a sandbox made from
/// it has the run step's file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_built_from_a_file_is_listed_and_used() {
    let name = TestTemplate::name();
    let marker = format!("marker-{:016x}", rand::random::<u64>());
    let dir = tempfile::tempdir().expect("tempdir");
    // A store of the test's own (the machine's templates linked in), the
    // cluster's too: the built template never lands in the machine's.
    let store = dir.path().join("store");
    private_store_all(&store);
    // Declared before the cluster: dropped (removed) after it.
    let _template = TestTemplate::build(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &store,
        &name,
        &format!(
            "name = \"{name}\"\nfrom = \"base\"\nrun = [\"echo {marker} > /etc/warren-marker\"]\nmemory_mb = 384\n"
        ),
        dir.path(),
    )
    .await;
    let c = cluster_with_store(Some(store)).await;
    let facts = run(
        &c,
        "custom_template",
        &[
            ("WARREN_TEMPLATE", name.clone()),
            ("WARREN_MARKER", marker.clone()),
        ],
    )
    .await;
    assert_eq!(facts["template"]["memoryMB"], 384, "{facts}");
}

/// 8. A create naming a template nobody built: the SDK raises, the API
/// answers 404 `template_not_found`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_template_is_not_found() {
    let c = cluster().await;
    let facts = run(&c, "unknown_template", &[]).await;
    assert_eq!(facts["status"], 404, "{facts}");
}
