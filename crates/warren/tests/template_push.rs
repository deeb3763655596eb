//! `warren template push`: a template store's blobs copied to a blob store
//! (a local directory, and a real Garage over S3), verified; credentials
//! refused on the command line; a damaged template blob named.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};
use warren_blob::BlobStore;
use warren_harness::garage::GarageServer;

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

fn warren(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("warren runs")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A template store in `dir` holding two imported templates (two blobs).
fn store_with_two_templates(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let store = dir.join("templates");
    for name in ["one", "two"] {
        let root = dir.join(format!("{name}-root"));
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/hostname"), format!("{name}\n")).unwrap();
        let tar = dir.join(format!("{name}.tar"));
        let st = Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&root)
            .arg(".")
            .status()
            .expect("tar runs");
        assert!(st.success());
        let out = warren(
            &[
                "template",
                "--template-dir",
                &store.display().to_string(),
                "import",
                &tar.display().to_string(),
                "--name",
                name,
            ],
            &[],
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    let mut blobs: Vec<(String, Vec<u8>)> = std::fs::read_dir(store.join("blobs"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let digest = name.strip_suffix(".tar")?.to_string();
            Some((digest, std::fs::read(e.path()).unwrap()))
        })
        .collect();
    blobs.sort();
    assert_eq!(blobs.len(), 2, "two templates, two blobs");
    blobs
}

/// What `store` holds, by digest, read back through the blob store.
async fn read_back(store: &BlobStore, dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut got = Vec::new();
    for (digest, _) in store.list().await.expect("list") {
        let dest = dir.join(digest.hex());
        store.fetch(&digest, &dest).await.expect("fetch");
        got.push((digest.to_string(), std::fs::read(&dest).unwrap()));
    }
    got.sort();
    got
}

#[tokio::test]
async fn push_copies_every_blob_to_a_local_blob_store_once() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = store_with_two_templates(dir.path());
    let target = dir.path().join("bucket");
    let push = || {
        warren(
            &[
                "template",
                "--template-dir",
                &dir.path().join("templates").display().to_string(),
                "push",
                "--to",
                &target.display().to_string(),
            ],
            &[],
        )
    };
    let out = push();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("2 blobs ("),
        "{}",
        text(&out)
    );
    let store = BlobStore::open(&target.display().to_string(), &[]).unwrap();
    let back = dir.path().join("back");
    std::fs::create_dir_all(&back).unwrap();
    assert_eq!(read_back(&store, &back).await, blobs);
    // Again: nothing changes, nothing fails.
    let out = push();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(read_back(&store, &back).await, blobs);

    // A template blob damaged on disk is named, not passed off under its name.
    let (digest, _) = &blobs[0];
    let file = dir
        .path()
        .join("templates/blobs")
        .join(format!("{digest}.tar"));
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&file, bytes).unwrap();
    let out = push();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(digest.as_str()) && err.contains("damaged"),
        "{err}"
    );
}

#[tokio::test]
async fn push_goes_to_s3_with_credentials_from_the_environment_only() {
    let dir = tempfile::tempdir().unwrap();
    let blobs = store_with_two_templates(dir.path());
    let g = tokio::task::spawn_blocking(GarageServer::start)
        .await
        .expect("join")
        .expect("a private Garage server: cargo install garage --locked (.ci/run installs it)");
    let templates = dir.path().join("templates").display().to_string();
    let url = g.url();
    let (endpoint, region) = (
        format!("endpoint={}", g.endpoint),
        format!("region={}", g.region),
    );
    let base = [
        "template",
        "--template-dir",
        &templates,
        "push",
        "--to",
        &url,
        "--blob-option",
        &endpoint,
        "--blob-option",
        &region,
        "--blob-option",
        "allow_http=true",
    ];
    let env = [
        ("AWS_ACCESS_KEY_ID", g.access_key_id.as_str()),
        ("AWS_SECRET_ACCESS_KEY", g.secret_access_key.as_str()),
    ];

    // A secret on the command line is refused, and not echoed.
    let mut with_secret = base.to_vec();
    let secret = format!("secret_access_key={}", g.secret_access_key);
    with_secret.extend(["--blob-option", &secret]);
    let out = warren(&with_secret, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("AWS_SECRET_ACCESS_KEY"), "{err}");
    assert!(!err.contains(&g.secret_access_key), "{err}");

    let out = warren(&base, &env);
    assert!(out.status.success(), "{}", text(&out));
    let store = BlobStore::open(&url, &g.options()).unwrap();
    let back = dir.path().join("back");
    std::fs::create_dir_all(&back).unwrap();
    assert_eq!(read_back(&store, &back).await, blobs);
}

/// `push --import`: the store's templates become records of the
/// scheduler's, through a gateway with `--blob-store` (a local directory
/// here), which every gateway of that store then lists; a plain key, a
/// record whose blob is not pushed, a team's snapshot and a gateway on a
/// shared `--template-dir` are each refused with a message naming why, and
/// nothing is imported by a refused call.
#[tokio::test]
async fn import_makes_the_store_templates_records_every_gateway_lists() {
    let dir = tempfile::tempdir().unwrap();
    store_with_two_templates(dir.path());
    let store = dir.path().join("templates");
    let to = dir.path().join("blobs");
    let to_s = to.display().to_string();
    let spec = warren_test_support::cluster::Spec {
        nodes: 1,
        gateways: 3,
        keys: vec![
            ("key-op".into(), "ops".into()),
            ("key-team".into(), "team-a".into()),
        ],
        gateway_args: vec!["--admin-team".into(), "ops".into()],
        per_gateway_args: vec![
            vec!["--blob-store".into(), to_s.clone()],
            vec!["--blob-store".into(), to_s.clone()],
            // The third keeps its records in a --template-dir.
            vec!["--template-dir".into(), store.display().to_string()],
        ],
        ..Default::default()
    };
    let c = warren_test_support::cluster::Cluster::start(bin(), spec)
        .await
        .unwrap();
    let push = |gateway: String, key: &'static str| {
        let store = store.display().to_string();
        let to_s = to_s.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let url = format!("http://{gateway}");
                warren(
                    &[
                        "template",
                        "--template-dir",
                        &store,
                        "push",
                        "--to",
                        &to_s,
                        "--import",
                    ],
                    &[("E2B_API_URL", &url), ("E2B_API_KEY", key)],
                )
            })
            .await
            .unwrap()
        }
    };
    let names = |gateway: String| async move {
        let a = warren_test_support::http::Http::default()
            .send(
                http::Method::GET,
                &gateway,
                "/templates",
                &[("x-api-key", "key-team")],
                None,
            )
            .await
            .unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
        let mut n: Vec<String> = a
            .expect_json()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["templateID"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };

    // A team's key is no operator's.
    let out = push(c.gateway(0), "key-team").await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("importing templates needs an operator key"),
        "{}",
        text(&out)
    );
    assert!(names(c.gateway(1)).await.is_empty());

    // A gateway on a shared --template-dir has nothing to import.
    let out = push(c.gateway(2), "key-op").await;
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("imports are for gateways with --blob-store"),
        "{}",
        text(&out)
    );

    // Through one gateway; listed by the other.
    let out = push(c.gateway(0), "key-op").await;
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("2 templates imported"),
        "{}",
        text(&out)
    );
    assert_eq!(names(c.gateway(1)).await, ["one", "two"]);
    // An operator's template is not deleted through the API.
    let a = warren_test_support::http::Http::default()
        .send(
            http::Method::DELETE,
            &c.gateway(1),
            "/templates/one",
            &[("x-api-key", "key-team")],
            None,
        )
        .await
        .unwrap();
    assert_eq!(a.status, 403, "{}", a.text());

    // Refused as a whole: a record whose blob is not in the blob store
    // (and a good one beside it), a team's snapshot.
    let one: serde_json::Value =
        serde_json::from_slice(&std::fs::read(store.join("templates/one.json")).unwrap()).unwrap();
    let mut missing = one.clone();
    missing["name"] = "three".into();
    missing["digest"] = format!("sha256-{}", "0".repeat(64)).into();
    let mut snapshot = one.clone();
    snapshot["name"] = "four".into();
    snapshot["snapshot"] =
        serde_json::json!({"team": "team-a", "source_sandbox": "s", "node_id": "node-1"});
    for (body, why) in [
        (
            serde_json::json!([one.clone(), missing]),
            "is not in the blob store",
        ),
        (serde_json::json!([snapshot]), "not an operator's template"),
        (serde_json::json!({"name": "x"}), "JSON array"),
    ] {
        let a = warren_test_support::http::Http::default()
            .send(
                http::Method::POST,
                &c.gateway(0),
                "/_warren/v1/templates",
                &[("x-api-key", "key-op")],
                Some(body),
            )
            .await
            .unwrap();
        assert_eq!(a.status, 400, "{}", a.text());
        assert!(a.message().contains(why), "{}", a.text());
    }
    assert_eq!(names(c.gateway(1)).await, ["one", "two"]);
}
