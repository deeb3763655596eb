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
