//! Keys from the AWS shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`,
//! `AWS_PROFILE`) reach a real S3-compatible server, a private Garage, and
//! never show in errors. Its own test binary with one test: it sets
//! environment variables, which no other test may see.

mod common;

use common::{same_bytes, write_pattern};
use warren_blob::{BlobError, BlobStore};
use warren_harness::garage::GarageServer;

#[tokio::test]
async fn keys_come_from_the_shared_credentials_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let creds = dir.path().join("credentials");
    std::fs::write(&creds, "[default]\naws_access_key_id = GKnotthisone\n").expect("write");
    // Set before any other thread runs (the runtime is single-threaded).
    std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &creds);
    std::env::set_var("AWS_PROFILE", "missing");
    let err = BlobStore::open("s3://bucket", &[]).expect_err("no such profile");
    let msg = err.to_string();
    assert!(matches!(err, BlobError::Config(_)), "{err:?}");
    assert!(
        msg.contains("\"missing\"") && msg.contains("credentials"),
        "{msg}"
    );
    std::env::set_var("AWS_PROFILE", "default");
    let err = BlobStore::open("s3://bucket", &[]).expect_err("no secret");
    assert!(err.to_string().contains("aws_secret_access_key"), "{err}");

    let g = tokio::task::spawn_blocking(GarageServer::start)
        .await
        .expect("join")
        .expect("a private Garage server: cargo install garage --locked (.ci/run installs it)");
    // The server's place, not its key: that is in the file.
    let place: Vec<(String, String)> = g
        .options()
        .into_iter()
        .filter(|(k, _)| !k.contains("key"))
        .collect();
    std::fs::write(
        &creds,
        format!(
            "[other]\naws_access_key_id = GK000000000000000000000000\n\
             aws_secret_access_key = wrong\n\n\
             [warren]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
            g.access_key_id, g.secret_access_key
        ),
    )
    .expect("write");
    std::env::set_var("AWS_PROFILE", "warren");
    let store = BlobStore::open(&g.url(), &place).expect("opens");
    let src = dir.path().join("layer");
    write_pattern(&src, 50_000, 1);
    let (digest, _) = store
        .put_file(&src)
        .await
        .expect("put with the file's keys");
    let back = dir.path().join("back");
    store.fetch(&digest, &back).await.expect("fetch");
    assert!(same_bytes(&src, &back));

    // A wrong secret in the file: denied, and the secret is not repeated.
    let wrong = "0123456789abcdef-wrong-secret-from-the-file";
    std::fs::write(
        &creds,
        format!(
            "[warren]\naws_access_key_id = {}\naws_secret_access_key = {wrong}\n",
            g.access_key_id
        ),
    )
    .expect("write");
    let store = BlobStore::open(&g.url(), &place).expect("opens");
    let err = store.put_file(&src).await.expect_err("denied");
    let all = format!("{err} {err:?} {store} {store:?}");
    assert!(matches!(err, BlobError::Denied { .. }), "{err:?}");
    assert!(!all.contains(wrong), "{all}");
}
