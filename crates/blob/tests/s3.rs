//! The S3 backend against a real S3-compatible server: a private Garage
//! (warren_harness::garage) per test. Without the `garage` binary these
//! tests fail, saying how to install it (.ci/run installs it).

mod common;

use common::{digest_of, names, same_bytes, write_pattern, write_sparse};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt};
use std::sync::Arc;
use warren_blob::{BlobError, BlobStore, Digest, ATTEMPTS, PART_SIZE};
use warren_harness::garage::GarageServer;

async fn garage() -> GarageServer {
    tokio::task::spawn_blocking(GarageServer::start)
        .await
        .expect("join")
        .expect(
            "a private Garage server for the S3 tests: cargo install garage --locked \
             (.ci/run installs it)",
        )
}

/// The store at `s3://<bucket>[/prefix]` on `g` with its key.
fn open(g: &GarageServer, prefix: &str) -> BlobStore {
    BlobStore::open(&format!("{}{prefix}", g.url()), &g.options()).expect("opens")
}

/// The bucket itself, past the blob store (to look at and tamper with
/// objects).
fn raw(g: &GarageServer) -> Arc<dyn ObjectStore> {
    Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(&g.endpoint)
            .with_region(&g.region)
            .with_bucket_name(&g.bucket)
            .with_access_key_id(&g.access_key_id)
            .with_secret_access_key(&g.secret_access_key)
            .with_allow_http(true)
            .build()
            .expect("raw client"),
    )
}

fn key(prefix: &str, d: &Digest) -> Key {
    Key::parse(format!("{prefix}blobs/sha256/{}", d.hex())).expect("key")
}

#[tokio::test]
async fn blobs_round_trip_through_garage_under_their_keys() {
    let g = garage().await;
    let store = open(&g, "/team/layers");
    let dir = tempfile::tempdir().expect("tempdir");
    let small = dir.path().join("small");
    write_pattern(&small, 200_000, 1);
    // Larger than a part: a multipart upload of 7 parts.
    let big = dir.path().join("big");
    write_sparse(&big, 100 << 20);
    const { assert!(100 << 20 > 6 * PART_SIZE) };

    let (ds, ss) = store.put_file(&small).await.expect("put small");
    let (db, sb) = store.put_file(&big).await.expect("put big");
    assert_eq!((ds.clone(), ss), (digest_of(&small), 200_000));
    assert_eq!((db.clone(), sb), (digest_of(&big), 100 << 20));
    // Idempotent (and skipped: the object is there with its size).
    assert_eq!(store.put_file(&big).await.expect("again"), (db.clone(), sb));

    // The documented key scheme, seen from the bucket itself.
    let bucket = raw(&g);
    let meta = bucket
        .head(&key("team/layers/", &db))
        .await
        .expect("the object is at <prefix>/blobs/sha256/<hex>");
    assert_eq!(meta.size, 100 << 20);

    for (d, src) in [(&ds, &small), (&db, &big)] {
        let dest = dir.path().join(format!("got-{}", d.hex()));
        store.fetch(d, &dest).await.expect("fetch");
        assert!(same_bytes(src, &dest));
    }
    let mut listed = store.list().await.expect("list");
    listed.sort();
    let mut want = vec![(ds.clone(), ss), (db.clone(), sb)];
    want.sort();
    assert_eq!(listed, want);

    store.delete(&ds).await.expect("delete");
    store.delete(&ds).await.expect("delete again");
    assert_eq!(store.size(&ds).await.expect("size"), None);
    let err = store
        .fetch(&ds, &dir.path().join("gone"))
        .await
        .expect_err("deleted");
    assert!(matches!(err, BlobError::NotFound { .. }), "{err:?}");
    assert!(!dir.path().join("gone").exists());
}

#[tokio::test]
async fn a_blob_corrupted_in_the_bucket_is_refused_and_never_lands() {
    let g = garage().await;
    let store = open(&g, "");
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("layer");
    write_pattern(&src, 1_000_000, 2);
    let (digest, _) = store.put_file(&src).await.expect("put");
    let bucket = raw(&g);
    let k = key("", &digest);

    let mut flipped = std::fs::read(&src).expect("read");
    flipped[500_000] ^= 1;
    let short = flipped[..400_000].to_vec();
    for bad in [flipped, short] {
        bucket.put(&k, bad.into()).await.expect("tamper");
        let dest = dir.path().join("dest");
        match store.fetch(&digest, &dest).await {
            Err(BlobError::Corrupt { digest: d, .. }) => assert_eq!(d, digest),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(names(dir.path()), ["layer"], "something landed");
    }

    // Stored again, it is whole again (a short object is not "there").
    store.put_file(&src).await.expect("put again");
    store
        .fetch(&digest, &dir.path().join("dest"))
        .await
        .expect("fetch");
    assert!(same_bytes(&src, &dir.path().join("dest")));
}

#[tokio::test]
async fn a_store_that_is_down_is_unavailable_naming_it() {
    let g = garage().await;
    let store = open(&g, "/p");
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("layer");
    write_pattern(&src, 10_000, 3);
    let (digest, _) = store.put_file(&src).await.expect("put");
    let g = tokio::task::spawn_blocking(move || {
        let mut g = g;
        g.stop();
        g
    })
    .await
    .expect("join");

    let dest = dir.path().join("dest");
    let err = store.fetch(&digest, &dest).await.expect_err("down");
    match &err {
        BlobError::Unavailable {
            store: name,
            attempts,
            ..
        } => {
            assert_eq!(*attempts, ATTEMPTS);
            assert!(name.contains("s3://warren-test/p"), "{name}");
            assert!(name.contains(&g.endpoint), "{name}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(err.is_retryable());
    assert!(
        err.to_string().contains(&format!("fetching blob {digest}")),
        "{err}"
    );
    assert!(!err.to_string().contains(&g.secret_access_key));
    assert_eq!(names(dir.path()), ["layer"], "something landed");
    let err = store.put_file(&src).await.expect_err("down");
    assert!(matches!(err, BlobError::Unavailable { .. }), "{err:?}");
}

#[tokio::test]
async fn wrong_credentials_are_denied_and_the_secret_is_not_shown() {
    let g = garage().await;
    let wrong = "0123456789abcdef-not-the-secret-fedcba9876543210".to_string();
    let mut opts = g.options();
    for (k, v) in &mut opts {
        if k == "secret_access_key" {
            v.clone_from(&wrong);
        }
    }
    let bad_secret = BlobStore::open(&g.url(), &opts).expect("opens");
    let mut opts = g.options();
    for (k, v) in &mut opts {
        if k == "access_key_id" {
            *v = "GK000000000000000000000000".into();
        }
    }
    let bad_key = BlobStore::open(&g.url(), &opts).expect("opens");
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("layer");
    write_pattern(&src, 1000, 4);
    for store in [bad_secret, bad_key] {
        let err = store.put_file(&src).await.expect_err("denied");
        assert!(matches!(err, BlobError::Denied { .. }), "{err:?}");
        assert!(!err.is_retryable());
        let all = format!("{err} {err:?}");
        assert!(all.contains("refused access"), "{all}");
        assert!(!all.contains(&wrong), "{all}");
        assert!(!all.contains(&g.secret_access_key), "{all}");
    }
}
