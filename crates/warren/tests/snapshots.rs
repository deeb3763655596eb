//! Snapshots through a gateway with the real `e2b` SDK
//! (`tests/e2b/snapshots.py`): a snapshot's files are in every sandbox made
//! from it, each with its own copy; it is listed (and paged) for its team
//! only, usable by name, invisible (404) to another team; deleting it
//! leaves sandboxes made from it running and makes new creates fail
//! clearly. Sandboxes from a snapshot are placed on the node that took it.
//! On the `process` runtime a snapshot is a clear 400.
//!
//! Each cluster gets a template store of its own, holding only `base`
//! (its root linked from the shared store), so snapshots never land in the
//! store other tests and `warren dev` read.
//!
//! Needs what the security suite needs (root, cgroups, slirp4netns,
//! nftables, the `base` template in `/var/lib/warren/templates`).

use std::path::Path;
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;
use warren_test_support::templates::private_store;

const KEY: &str = "e2b_5a7c9e1b3d5f7a9c2e4b6d8f0a2c4e6b8d0f1a3c";
const KEY_B: &str = "e2b_b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a1c3e5b7d9";

async fn cluster(runtime: &str, nodes: usize, store: &Path) -> Cluster {
    let dir = vec!["--template-dir".to_string(), store.display().to_string()];
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes,
            runtime: runtime.into(),
            keys: vec![(KEY.into(), "team-a".into()), (KEY_B.into(), "team-b".into())],
            node_args: dir.clone(),
            gateway_args: dir,
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (isolated needs root, cgroups, slirp4netns, nftables and the base template)")
}

async fn run(c: &Cluster, case: &str) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    run_case(
        &gateway,
        "snapshots.py",
        case,
        KEY,
        &[("E2B_API_KEY_B", KEY_B.to_string())],
        Duration::from_secs(600),
    )
    .await
}

#[tokio::test]
async fn snapshots_copy_files_stay_with_their_team_and_outlive_nothing_they_serve() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster("isolated", 2, store.path()).await;
    let r = run(&c, "files_listing_and_teams").await;
    eprintln!("facts: {r}");
    // Placement: every sandbox from a snapshot is on the node that took it.
    let original = r["original"].as_str().expect("the original's node");
    let from: Vec<&str> = r["from_snapshot"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(from, vec![original; 3], "{r}");
    // The records are gone; the layers stay, for sandboxes still using them.
    let records: Vec<String> = std::fs::read_dir(store.path().join("templates"))
        .expect("records")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(records, vec!["base.json".to_string()]);
    let blobs = std::fs::read_dir(store.path().join("blobs"))
        .expect("blobs")
        .count();
    assert!(blobs >= 3, "one layer per snapshot taken: {blobs}");
    drop(c);
}

#[tokio::test]
async fn the_process_runtime_cannot_snapshot() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster("process", 1, store.path()).await;
    let r = run(&c, "process_runtime_refuses").await;
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("--runtime isolated")),
        "{r}"
    );
    let records = std::fs::read_dir(store.path().join("templates"))
        .expect("records")
        .count();
    assert_eq!(records, 1, "nothing recorded");
}
