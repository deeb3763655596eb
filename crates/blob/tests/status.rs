//! How the store takes what an HTTP object store answers, against a real
//! HTTP server on loopback that answers what each test needs (a status, an
//! object, an object cut off mid-body): which failures are retried, how
//! often, which are final, and that a cut download resumes. This also pins
//! object_store's spelling of statuses that `error.rs` reads.

mod common;

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_blob::{BlobError, BlobStore, Digest, ATTEMPTS};

/// What the server answers to every request.
#[derive(Clone)]
enum Answer {
    /// This status with this body.
    Status(u16, String),
    /// An object; each GET's body stops after absolute byte `cut(n)` for
    /// the `n`th GET (0-based), `None`: not cut.
    Object {
        data: Arc<Vec<u8>>,
        cut: fn(usize) -> Option<usize>,
    },
}

/// A request as the server saw it: method and `Range` header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// Serves `answer` on a loopback port; returns the store that points at
/// it and what it saw.
async fn serve(answer: Answer) -> (BlobStore, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut gets = 0;
        while let Ok((mut conn, _)) = listener.accept().await {
            let Some((method, range)) = read_head(&mut conn).await else {
                continue;
            };
            log.lock()
                .expect("lock")
                .push((method.clone(), range.clone()));
            let n = gets;
            if method == "GET" {
                gets += 1;
            }
            let answer = answer.clone();
            tokio::spawn(async move {
                let _ = respond(&mut conn, &method, range.as_deref(), &answer, n).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    let store = BlobStore::open(
        "s3://bucket/pre",
        &[
            ("endpoint".into(), format!("http://{addr}")),
            ("allow_http".into(), "true".into()),
            ("region".into(), "test".into()),
            ("access_key_id".into(), "GKtest".into()),
            ("secret_access_key".into(), SECRET.into()),
        ],
    )
    .expect("opens");
    (store, seen)
}

const SECRET: &str = "s3cr3t-never-shown-0123456789";

/// The request line's method and the `Range` header.
async fn read_head(conn: &mut tokio::net::TcpStream) -> Option<(String, Option<String>)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let method = head.split(' ').next()?.to_string();
    let range = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("range")
            .then(|| v.trim().to_string())
    });
    Some((method, range))
}

async fn respond(
    conn: &mut tokio::net::TcpStream,
    method: &str,
    range: Option<&str>,
    answer: &Answer,
    n: usize,
) -> std::io::Result<()> {
    match answer {
        Answer::Status(code, body) => {
            let head = format!(
                "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            conn.write_all(head.as_bytes()).await?;
            if method != "HEAD" {
                conn.write_all(body.as_bytes()).await?;
            }
        }
        Answer::Object { data, cut } => {
            let len = data.len();
            let start = range
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.parse::<usize>().ok())
                .unwrap_or(0);
            let common = format!(
                "ETag: \"v1\"\r\nLast-Modified: Wed, 21 Oct 2015 07:28:00 GMT\r\n\
                 Content-Length: {}\r\nConnection: close\r\n",
                len - start
            );
            let head = if range.is_some() {
                format!(
                    "HTTP/1.1 206 Partial Content\r\n{common}Content-Range: bytes {start}-{}/{len}\r\n\r\n",
                    len - 1
                )
            } else {
                format!("HTTP/1.1 200 OK\r\n{common}\r\n")
            };
            conn.write_all(head.as_bytes()).await?;
            if method == "GET" {
                let end = cut(n).unwrap_or(len).clamp(start, len);
                conn.write_all(&data[start..end]).await?;
            }
        }
    }
    conn.flush().await
}

fn digest_of(bytes: &[u8]) -> Digest {
    use sha2::Digest as _;
    Digest::from_sha256(sha2::Sha256::digest(bytes).into())
}

fn some_digest() -> Digest {
    digest_of(b"anything")
}

#[tokio::test]
async fn a_5xx_is_retried_with_the_backoff_then_unavailable_naming_the_store() {
    let (store, seen) = serve(Answer::Status(503, "busy".into())).await;
    let digest = some_digest();
    let err = store.size(&digest).await.expect_err("unavailable");
    match &err {
        BlobError::Unavailable { attempts, .. } => assert_eq!(*attempts, ATTEMPTS),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(err.is_retryable());
    let msg = err.to_string();
    assert!(
        msg.contains("s3://bucket/pre") && msg.contains("503"),
        "{msg}"
    );
    assert!(msg.contains(&format!("looking up blob {digest}")), "{msg}");
    assert_eq!(seen.lock().expect("lock").len(), ATTEMPTS as usize);
}

#[tokio::test]
async fn a_bad_request_is_final_at_once() {
    let (store, seen) = serve(Answer::Status(400, "<Error>InvalidRequest</Error>".into())).await;
    let err = store.size(&some_digest()).await.expect_err("refused");
    assert!(matches!(err, BlobError::Store { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(seen.lock().expect("lock").len(), 1);
}

#[tokio::test]
async fn refused_credentials_are_denied_and_the_secret_is_not_repeated() {
    // A store that echoes what it was sent, secret and all.
    let body = format!("<Error><Code>SignatureDoesNotMatch</Code><Key>{SECRET}</Key></Error>");
    let (store, seen) = serve(Answer::Status(403, body)).await;
    let dest = tempfile::tempdir().expect("tempdir");
    let err = store
        .fetch(&some_digest(), &dest.path().join("x"))
        .await
        .expect_err("denied");
    assert!(matches!(err, BlobError::Denied { .. }), "{err:?}");
    assert!(!err.is_retryable());
    let all = format!("{err} {err:?}");
    assert!(!all.contains(SECRET), "{all}");
    assert!(all.contains("SignatureDoesNotMatch"), "{all}");
    assert_eq!(seen.lock().expect("lock").len(), 1);
    assert!(common::names(dest.path()).is_empty());
}

#[tokio::test]
async fn a_download_cut_off_resumes_where_it_stopped() {
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let digest = digest_of(&data);
    let (store, seen) = serve(Answer::Object {
        data: Arc::new(data.clone()),
        cut: |n| (n == 0).then_some(1_048_583),
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("blob");
    assert_eq!(
        store.fetch(&digest, &dest).await.expect("fetched"),
        3_000_000
    );
    assert_eq!(std::fs::read(&dest).expect("read"), data);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen,
        [
            ("GET".to_string(), None),
            ("GET".to_string(), Some("bytes=1048583-".to_string()))
        ]
    );
    assert_eq!(common::names(dir.path()), ["blob"]);
}

#[tokio::test]
async fn a_download_that_never_gets_further_gives_up_and_leaves_nothing() {
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 13) as u8).collect();
    let digest = digest_of(&data);
    let (store, seen) = serve(Answer::Object {
        data: Arc::new(data),
        cut: |_| Some(100_000),
    })
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("blob");
    let err = store.fetch(&digest, &dest).await.expect_err("cut");
    assert!(matches!(err, BlobError::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(common::names(dir.path()).is_empty(), "something was left");
    // Attempts count from the last progress: the GET that got 100 000
    // bytes was the first of ATTEMPTS.
    assert_eq!(seen.lock().expect("lock").len(), ATTEMPTS as usize);
}

#[tokio::test]
async fn a_store_that_does_not_answer_is_unavailable() {
    let port = warren_harness::free_port().expect("port");
    let store = BlobStore::open(
        "s3://bucket",
        &[
            ("endpoint".into(), format!("http://127.0.0.1:{port}")),
            ("allow_http".into(), "true".into()),
            ("access_key_id".into(), "GKtest".into()),
            ("secret_access_key".into(), SECRET.into()),
        ],
    )
    .expect("opens");
    let err = store.list().await.expect_err("refused");
    match &err {
        BlobError::Unavailable {
            store, attempts, ..
        } => {
            assert_eq!(*attempts, ATTEMPTS);
            assert!(store.contains("s3://bucket"), "{store}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
