//! The local backend (the embedded default): everything a node or a
//! one-machine install relies on, against real files.

mod common;

use common::{digest_of, names, same_bytes, write_pattern};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use warren_blob::{BlobError, BlobStore, Digest, PART_SIZE};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

/// A store in a fresh temp dir, plus a scratch dir for sources and
/// destinations.
fn store() -> (tempfile::TempDir, BlobStore, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("store");
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let store = BlobStore::open(root.to_str().expect("utf-8"), &[]).expect("opens");
    (tmp, store, root, work)
}

fn blob_path(root: &Path, d: &Digest) -> PathBuf {
    root.join("blobs/sha256").join(d.hex())
}

#[tokio::test]
async fn round_trip_names_the_blob_by_its_sha256() {
    let (_tmp, store, root, work) = store();
    let src = work.join("layer.tar");
    write_pattern(&src, 300_000, 1);
    let (digest, size) = store.put_file(&src).await.expect("put");
    assert_eq!(digest, digest_of(&src));
    assert_eq!(size, 300_000);
    assert_eq!(store.size(&digest).await.expect("size"), Some(300_000));
    assert!(blob_path(&root, &digest).is_file());

    let dest = work.join("fetched");
    assert_eq!(store.fetch(&digest, &dest).await.expect("fetch"), 300_000);
    assert!(same_bytes(&src, &dest));
    assert_eq!(
        names(&work),
        ["fetched", "layer.tar"],
        "a temporary file was left"
    );
}

#[tokio::test]
async fn file_urls_and_plain_paths_are_the_same_store() {
    let (_tmp, store, root, work) = store();
    let src = work.join("a");
    write_pattern(&src, 1000, 2);
    let (digest, _) = store.put_file(&src).await.expect("put");
    let url = format!("file://{}", root.display());
    let again = BlobStore::open(&url, &[]).expect("opens");
    assert_eq!(again.to_string(), url);
    assert_eq!(again.size(&digest).await.expect("size"), Some(1000));
}

#[tokio::test]
async fn the_store_is_private_0700_and_its_blobs_0600() {
    let (_tmp, store, root, work) = store();
    for d in [root.clone(), root.join("blobs"), root.join("blobs/sha256")] {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
    }
    let small = work.join("small");
    write_pattern(&small, 10, 3);
    let big = work.join("big");
    write_pattern(&big, PART_SIZE + 1, 4);
    for src in [small, big] {
        let (digest, _) = store.put_file(&src).await.expect("put");
        assert_eq!(mode(&blob_path(&root, &digest)), 0o600);
    }
    let dest = work.join("out");
    let (digest, _) = store.put_file(&work.join("small")).await.expect("put");
    store.fetch(&digest, &dest).await.expect("fetch");
    assert_eq!(mode(&dest), 0o600, "a fetched blob is its owner's only");

    // Reopening narrows a directory someone widened.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    BlobStore::open(root.to_str().expect("utf-8"), &[]).expect("reopens");
    assert_eq!(mode(&root), 0o700);
}

#[tokio::test]
async fn a_file_larger_than_a_part_goes_up_in_parts_and_comes_back_whole() {
    let (_tmp, store, root, work) = store();
    let src = work.join("big");
    let len = 2 * PART_SIZE + 12_345;
    write_pattern(&src, len, 5);
    let (digest, size) = store.put_file(&src).await.expect("put");
    assert_eq!((digest.clone(), size), (digest_of(&src), len as u64));
    assert_eq!(
        names(&root.join("blobs/sha256")),
        [digest.hex()],
        "a staging file was left"
    );
    let dest = work.join("back");
    assert_eq!(
        store.fetch(&digest, &dest).await.expect("fetch"),
        len as u64
    );
    assert!(same_bytes(&src, &dest));
}

#[tokio::test]
async fn putting_a_blob_again_skips_the_upload_but_repairs_a_short_one() {
    let (_tmp, store, root, work) = store();
    let src = work.join("a");
    write_pattern(&src, 5000, 6);
    let (digest, _) = store.put_file(&src).await.expect("put");
    let blob = blob_path(&root, &digest);
    // Mark the stored file: a second put that wrote it would clear this.
    let epoch = std::fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH);
    std::fs::File::options()
        .write(true)
        .open(&blob)
        .expect("open")
        .set_times(epoch)
        .expect("set mtime");
    assert_eq!(
        store.put_file(&src).await.expect("put again"),
        (digest.clone(), 5000)
    );
    let mtime = std::fs::metadata(&blob)
        .expect("stat")
        .modified()
        .expect("mtime");
    assert_eq!(mtime, std::time::UNIX_EPOCH, "the blob was written again");

    // One of the wrong size is not taken for the blob: it is replaced.
    std::fs::File::options()
        .write(true)
        .open(&blob)
        .expect("open")
        .set_len(100)
        .expect("truncate");
    store.put_file(&src).await.expect("put over a short blob");
    assert_eq!(store.size(&digest).await.expect("size"), Some(5000));
    assert!(same_bytes(&src, &blob));
}

#[tokio::test]
async fn a_corrupted_blob_is_refused_and_nothing_is_left_at_dest() {
    let (_tmp, store, root, work) = store();
    let src = work.join("a");
    write_pattern(&src, 70_000, 7);
    let (digest, _) = store.put_file(&src).await.expect("put");
    let blob = blob_path(&root, &digest);
    let mut bytes = std::fs::read(&blob).expect("read");
    bytes[40_000] ^= 0xff;
    std::fs::write(&blob, &bytes).expect("corrupt it");

    let dest = work.join("dest");
    match store.fetch(&digest, &dest).await {
        Err(BlobError::Corrupt {
            digest: d, actual, ..
        }) => {
            assert_eq!(d, digest);
            assert_ne!(actual, digest);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(!dest.exists());
    assert_eq!(names(&work), ["a"], "a temporary file was left");
}

#[tokio::test]
async fn a_blob_cut_short_in_the_store_is_refused() {
    let (_tmp, store, root, work) = store();
    let src = work.join("a");
    write_pattern(&src, PART_SIZE + 4096, 8);
    let (digest, _) = store.put_file(&src).await.expect("put");
    let blob = blob_path(&root, &digest);
    std::fs::File::options()
        .write(true)
        .open(&blob)
        .expect("open")
        .set_len(1 << 20)
        .expect("truncate");
    let dest = work.join("dest");
    let err = store.fetch(&digest, &dest).await.expect_err("refused");
    assert!(matches!(err, BlobError::Corrupt { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(!dest.exists());
    assert_eq!(names(&work), ["a"]);
}

#[tokio::test]
async fn list_and_delete() {
    let (_tmp, store, root, work) = store();
    let mut put = Vec::new();
    for (i, len) in [10usize, 2000, 0].into_iter().enumerate() {
        let src = work.join(format!("f{i}"));
        write_pattern(&src, len, i as u8);
        put.push(store.put_file(&src).await.expect("put"));
    }
    // Not a blob: skipped, not an error.
    std::fs::write(root.join("blobs/sha256/README"), b"hi").expect("write");
    let mut listed = store.list().await.expect("list");
    listed.sort();
    let mut want = put.clone();
    want.sort();
    assert_eq!(listed, want);

    let (gone, _) = put[1].clone();
    store.delete(&gone).await.expect("delete");
    store.delete(&gone).await.expect("deleting again is fine");
    assert_eq!(store.size(&gone).await.expect("size"), None);
    assert_eq!(store.list().await.expect("list").len(), 2);
    let dest = work.join("dest");
    match store.fetch(&gone, &dest).await {
        Err(BlobError::NotFound { digest, .. }) => assert_eq!(digest, gone),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(!dest.exists());
}

#[tokio::test]
async fn host_side_failures_are_io_errors_naming_the_file() {
    let (_tmp, store, _root, work) = store();
    let missing = work.join("nope");
    let err = store.put_file(&missing).await.expect_err("no file");
    assert!(matches!(err, BlobError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("nope"), "{err}");

    let src = work.join("a");
    write_pattern(&src, 10, 9);
    let (digest, _) = store.put_file(&src).await.expect("put");
    let err = store
        .fetch(&digest, &work.join("no-such-dir/dest"))
        .await
        .expect_err("no dir");
    assert!(matches!(err, BlobError::Io { .. }), "{err:?}");
}

#[test]
fn bad_urls_and_options_are_config_errors() {
    for url in [
        "relative/dir",
        "ftp://host/x",
        "s3://",
        "file://host/x",
        "s3://b/p?x=1",
    ] {
        let err = BlobStore::open(url, &[]).expect_err(url);
        assert!(matches!(err, BlobError::Config(_)), "{url}: {err:?}");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let err = BlobStore::open(
        tmp.path().to_str().expect("utf-8"),
        &[("region".into(), "x".into())],
    )
    .expect_err("a local store takes no options");
    assert!(err.to_string().contains("region"), "{err}");
}

/// Without the `aws` feature an `s3://` store is refused, naming it.
#[cfg(not(feature = "aws"))]
#[test]
fn a_backend_this_build_lacks_is_named() {
    let err = BlobStore::open("s3://bucket", &[]).expect_err("no aws backend");
    assert!(err.to_string().contains("\"aws\""), "{err}");
}

#[cfg(feature = "aws")]
#[test]
fn s3_options_are_checked() {
    let err = BlobStore::open("s3://bucket", &[("no_such_key".into(), "v4lue-x".into())])
        .expect_err("unknown key");
    let msg = err.to_string();
    assert!(
        msg.contains("no_such_key") && !msg.contains("v4lue-x"),
        "{msg}"
    );

    let err = BlobStore::open(
        "s3://bucket",
        &[("endpoint".into(), "http://127.0.0.1:9".into())],
    )
    .expect_err("plain HTTP without allow_http");
    assert!(err.to_string().contains("allow_http"), "{err}");
}

#[test]
fn credentials_in_a_url_are_refused_and_not_repeated() {
    const SECRET: &str = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY";
    let err = BlobStore::open(&format!("s3://AKIDEXAMPLE:{SECRET}@bucket/p"), &[])
        .expect_err("credentials in the URL are refused");
    let msg = format!("{err} {err:?}");
    assert!(!msg.contains(SECRET), "{msg}");
    assert!(msg.contains("credentials"), "{msg}");
}

#[cfg(feature = "aws")]
#[test]
fn an_s3_stores_display_and_debug_hold_no_credentials() {
    const SECRET: &str = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY";
    let store = BlobStore::open(
        "s3://bucket/some/prefix",
        &[
            (
                "endpoint".into(),
                format!("http://user:{SECRET}@127.0.0.1:9000"),
            ),
            ("allow_http".into(), "true".into()),
            ("access_key_id".into(), "GKexample".into()),
            ("secret_access_key".into(), SECRET.into()),
            ("aws_session_token".into(), format!("tok-{SECRET}")),
        ],
    )
    .expect("opens");
    let shown = format!("{store} {store:?}");
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(!shown.contains("user:"), "{shown}");
    assert!(shown.contains("s3://bucket/some/prefix"), "{shown}");
    assert!(shown.contains("127.0.0.1:9000"), "{shown}");
}
