//! Snapshots through a gateway with the real `e2b` SDK
//! (`tests/e2b/snapshots.py`): a snapshot's files are in every sandbox made
//! from it, each with its own copy; it is listed (and paged) for its team
//! only, usable by name, invisible (404) to another team; deleting it
//! leaves sandboxes made from it running and makes new creates fail
//! clearly. Sandboxes from a snapshot are placed on the node that took it.
//! On the `process` runtime a snapshot is a clear 400. A deleted
//! snapshot's layer leaves the store once nothing stacks it; a team's
//! snapshots are bounded in count and bytes.
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
    cluster_with(runtime, nodes, store, &[]).await
}

async fn cluster_with(runtime: &str, nodes: usize, store: &Path, gateway: &[&str]) -> Cluster {
    let dir = vec!["--template-dir".to_string(), store.display().to_string()];
    let mut gateway_args = dir.clone();
    gateway_args.extend(gateway.iter().map(|s| s.to_string()));
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes,
            runtime: runtime.into(),
            keys: vec![(KEY.into(), "team-a".into()), (KEY_B.into(), "team-b".into())],
            node_args: dir,
            gateway_args,
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
    // The records are gone (their layers go once nothing stacks them:
    // `deleted_snapshots_free_their_layers_once_nothing_stacks_them`).
    let records: Vec<String> = std::fs::read_dir(store.path().join("templates"))
        .expect("records")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(records, vec!["base.json".to_string()]);
    drop(c);
}

/// What is in a store's `dir` (`blobs`, `rootfs`, ...), by name.
fn names(store: &Path, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join(dir))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The attack: three snapshots of 100 MiB, all deleted,
/// used to leave their 300 MiB in the store every team shares, owned by
/// nobody. Now a deleted snapshot's layer goes once no record names it and
/// no node's sandbox stacks it: the two nothing uses go, the one a running
/// sandbox was made from stays until that sandbox is killed, then goes too.
#[tokio::test]
async fn deleted_snapshots_free_their_layers_once_nothing_stacks_them() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster_with(
        "isolated",
        1,
        store.path(),
        &["--layer-gc-interval", "1s", "--layer-gc-grace", "0s"],
    )
    .await;
    let gateway = format!("http://{}", c.gateway(0));
    let client = warren_client::ClientBuilder::new(&[gateway.as_str()])
        .api_key(KEY)
        .timeout(Duration::from_secs(600))
        .build()
        .expect("a client");
    let mut snapshots = Vec::new();
    let mut originals = Vec::new();
    for i in 0..3 {
        let sbx = client
            .create(&warren_client::NewSandbox::base(600), &format!("gc-{i}"))
            .await
            .expect("a sandbox")
            .sandbox;
        let out = client
            .run_to_end(
                &sbx,
                warren_client::Command::shell(format!(
                    "head -c 100M /dev/urandom > /home/user/big-{i}"
                )),
            )
            .await
            .expect("100 MiB written");
        assert_eq!(
            out.exit.exit_code,
            0,
            "{}",
            String::from_utf8_lossy(&out.all)
        );
        let snap = client
            .post_json(
                &format!("/sandboxes/{}/snapshots", sbx.sandbox_id),
                &serde_json::json!({}),
            )
            .await
            .expect("a snapshot");
        let id = snap["snapshotID"].as_str().expect("snapshotID").to_string();
        let record: serde_json::Value = serde_json::from_slice(
            &std::fs::read(store.path().join(format!("templates/{id}.json")))
                .expect("the snapshot's record"),
        )
        .expect("the record parses");
        let layer = record["layers"]
            .as_array()
            .and_then(|l| l.last())
            .and_then(|l| l.as_str())
            .expect("a layer")
            .to_string();
        snapshots.push((id, layer));
        originals.push(sbx);
    }
    let blobs = names(store.path(), "blobs");
    for (_, layer) in &snapshots {
        assert!(blobs.contains(&format!("{layer}.tar")), "{blobs:?}");
    }
    // A sandbox from the third keeps stacking its layer.
    let keeper = client
        .create(
            &warren_client::NewSandbox {
                template_id: snapshots[2].0.clone(),
                timeout: 600,
                ..Default::default()
            },
            "gc-keeper",
        )
        .await
        .expect("a sandbox from the third snapshot")
        .sandbox;
    for sbx in &originals {
        client.kill(&sbx.sandbox_id).await.expect("killed");
    }
    let http = warren_test_support::http::Http::new(Duration::from_secs(30));
    for (id, _) in &snapshots {
        let a = http
            .send(
                http::Method::DELETE,
                &c.gateway(0),
                &format!("/templates/{id}"),
                &[("x-api-key", KEY)],
                None,
            )
            .await
            .expect("the gateway answers");
        assert_eq!(a.status, http::StatusCode::NO_CONTENT, "{}", a.text());
    }
    let gone = |layer: &str| {
        let hex = layer.trim_start_matches("sha256-").to_string();
        !names(store.path(), "blobs").contains(&format!("{layer}.tar"))
            && !names(store.path(), "rootfs").contains(&hex)
    };
    warren_test_support::wait_until(
        "the unused layers to be removed",
        Duration::from_secs(180),
        || async { (gone(&snapshots[0].1) && gone(&snapshots[1].1)).then_some(()) },
    )
    .await;
    // Still stacked: still there, and the sandbox still reads it.
    assert!(
        !gone(&snapshots[2].1),
        "a layer a running sandbox stacks was removed"
    );
    let out = client
        .run_to_end(
            &keeper,
            warren_client::Command::shell("wc -c < /home/user/big-2"),
        )
        .await
        .expect("the keeper reads its file");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "104857600");
    client.kill(&keeper.sandbox_id).await.expect("killed");
    warren_test_support::wait_until(
        "the last layer to be removed once its sandbox is gone",
        Duration::from_secs(180),
        || async { gone(&snapshots[2].1).then_some(()) },
    )
    .await;
    // Nothing of the three is left: no blob, no unpacked tree, no note (the
    // note goes just after the layer: waited for).
    warren_test_support::wait_until(
        "the notes of the removed layers to go",
        Duration::from_secs(30),
        || async { names(store.path(), "unused").is_empty().then_some(()) },
    )
    .await;
    assert_eq!(names(store.path(), "blobs"), Vec::<String>::new());
    drop(c);
}

/// A team's snapshots are bounded in count and bytes (429 naming the
/// flag; one past the bytes is not kept), and another team is not
/// affected.
#[tokio::test]
async fn a_teams_snapshots_are_bounded_in_count_and_bytes() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster_with(
        "isolated",
        1,
        store.path(),
        &[
            "--snapshot-team-count",
            "2",
            "--snapshot-team-bytes",
            "41943040",
        ],
    )
    .await;
    let r = run(&c, "bounds").await;
    assert!(
        r["bytes"]
            .as_str()
            .is_some_and(|m| m.contains("--snapshot-team-bytes")),
        "{r}"
    );
    assert!(
        r["count"]
            .as_str()
            .is_some_and(|m| m.contains("--snapshot-team-count")),
        "{r}"
    );
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
