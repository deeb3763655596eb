//! `warren template gc` on a template store a cluster of isolated
//! sandboxes uses (a private one: the machine's store is never collected
//! by a test):
//!
//! - a deleted snapshot's layer that a running sandbox stacks is kept
//!   ("a sandbox of this host stacks it": the node leases every tree its
//!   sandboxes stack), and removed once that sandbox is gone;
//! - `--dry-run` says what would go and changes nothing;
//! - given the teams that still exist, another team's snapshots go, then
//!   their layers;
//! - the machine's store is as it was.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use http::{Method, StatusCode};
use std::path::Path;
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::Http;
use warren_test_support::templates::{machine_store, private_store_all};

const KEY: &str = "e2b_5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f";
const GONE_KEY: &str = "e2b_6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a";

async fn api(
    c: &Cluster,
    key: &str,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> serde_json::Value {
    let a = Http::new(Duration::from_secs(120))
        .send(
            method.clone(),
            &c.gateway(0),
            path,
            &[("x-api-key", key)],
            body,
        )
        .await
        .expect("the gateway answers");
    assert!(
        a.status.is_success(),
        "{method} {path}: {} {}",
        a.status,
        a.text()
    );
    if a.status == StatusCode::NO_CONTENT {
        serde_json::Value::Null
    } else {
        a.expect_json()
    }
}

async fn sandbox(c: &Cluster, key: &str, template: &str) -> String {
    let made = api(
        c,
        key,
        Method::POST,
        "/sandboxes",
        Some(serde_json::json!({"templateID": template, "timeout": 300})),
    )
    .await;
    made["sandboxID"].as_str().expect("an id").to_string()
}

/// The top layer of the snapshot record `name` (by its team-given name).
fn snapshot_layer(store: &Path, called: &str) -> (String, String) {
    for e in std::fs::read_dir(store.join("templates"))
        .expect("records")
        .flatten()
    {
        let t: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.path()).expect("a record")).expect("JSON");
        if t["snapshot"]["name"] == called {
            let layer = t["layers"]
                .as_array()
                .and_then(|l| l.last())
                .and_then(|l| l.as_str())
                .expect("a layer")
                .to_string();
            return (t["name"].as_str().expect("a name").to_string(), layer);
        }
    }
    panic!("no snapshot {called} in {}", store.display());
}

fn gc(store: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .arg("template")
        .arg("--template-dir")
        .arg(store)
        .arg("gc")
        .args(args)
        .output()
        .expect("warren template gc runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "warren template gc {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("$ warren template gc {}\n{text}", args.join(" "));
    text
}

fn listing(store: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["templates", "blobs", "rootfs"] {
        if let Ok(entries) = std::fs::read_dir(store.join(sub)) {
            out.extend(
                entries
                    .flatten()
                    .map(|e| format!("{sub}/{}", e.file_name().to_string_lossy())),
            );
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collecting_a_store_keeps_what_sandboxes_stack_and_drops_gone_teams() {
    let machine_before = listing(&machine_store());
    let dir = tempfile::tempdir().expect("a directory");
    let store = dir.path().join("store");
    private_store_all(&store);
    let c = Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![
                (KEY.into(), "team-a".into()),
                (GONE_KEY.into(), "team-gone".into()),
            ],
            template_dir: Some(store.clone()),
            ..Spec::default()
        },
    )
    .await
    .expect("an isolated cluster starts (needs root and the base template)");

    // A snapshot, a sandbox stacking its layer, the snapshot deleted.
    let a = sandbox(&c, KEY, "base").await;
    api(
        &c,
        KEY,
        Method::POST,
        &format!("/sandboxes/{a}/snapshots"),
        Some(serde_json::json!({"name": "gc-snap"})),
    )
    .await;
    let (_, layer) = snapshot_layer(&store, "gc-snap");
    let b = sandbox(&c, KEY, "gc-snap").await;
    api(&c, KEY, Method::DELETE, "/templates/gc-snap", None).await;
    let blob = store.join(format!("blobs/{layer}.tar"));
    assert!(blob.is_file());

    // Another team's snapshot, of a team that is then gone.
    let g = sandbox(&c, GONE_KEY, "base").await;
    api(
        &c,
        GONE_KEY,
        Method::POST,
        &format!("/sandboxes/{g}/snapshots"),
        Some(serde_json::json!({"name": "theirs"})),
    )
    .await;
    let (theirs, their_layer) = snapshot_layer(&store, "theirs");
    api(
        &c,
        GONE_KEY,
        Method::DELETE,
        &format!("/sandboxes/{g}"),
        None,
    )
    .await;

    // Stacked by b: kept, however old.
    let out = gc(&store, &["--grace", "0s"]);
    assert!(
        out.contains(&format!("kept {layer}")) && out.contains("stacks it"),
        "{out}"
    );
    assert!(blob.is_file());
    assert!(
        store.join(format!("templates/{theirs}.json")).is_file(),
        "no team list: records stay"
    );

    // b gone: a dry run says the layer would go, and nothing changes.
    api(&c, KEY, Method::DELETE, &format!("/sandboxes/{b}"), None).await;
    let out = gc(
        &store,
        &["--grace", "0s", "--dry-run", "--keep-team", "team-a"],
    );
    assert!(out.contains(&format!("would remove {layer}")), "{out}");
    assert!(
        out.contains(&format!("would remove record {theirs}")),
        "{out}"
    );
    assert!(blob.is_file() && store.join(format!("templates/{theirs}.json")).is_file());

    // And it goes; the gone team's record and layer too; a is untouched.
    let out = gc(&store, &["--grace", "0s", "--keep-team", "team-a"]);
    assert!(out.contains(&format!("removed {layer}")), "{out}");
    assert!(!blob.exists() && !store.join("rootfs").join(&layer[7..]).exists());
    assert!(!store.join(format!("templates/{theirs}.json")).exists());
    assert!(!store.join(format!("blobs/{their_layer}.tar")).exists());
    assert!(store.join("templates/base.json").is_file());
    let alive = Http::default()
        .send(
            Method::GET,
            &c.gateway(0),
            &format!("/sandboxes/{a}"),
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect("answers");
    assert_eq!(alive.status, StatusCode::OK);

    drop(c);
    assert_eq!(
        listing(&machine_store()),
        machine_before,
        "the machine's store is as it was"
    );
}
