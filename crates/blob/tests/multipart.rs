//! A multipart upload against a loopback HTTP server speaking just enough
//! S3 (create, parts, complete, abort): a part answered 503 is sent again
//! after the backoff, and the upload completes; a part that keeps failing
//! aborts the upload and ends `Unavailable`. Garage (tests/s3.rs) cannot be
//! made to fail one part.

mod common;

use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_blob::{BlobError, BlobStore, ATTEMPTS, PART_SIZE};

/// Each request's method and target (path and query), in order.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Serves S3's multipart calls; a `PUT` of part 2 is answered 503 the
/// first `fail_part2` times.
async fn serve(fail_part2: usize) -> (BlobStore, Seen) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    tokio::spawn(async move {
        let mut part2 = 0;
        while let Ok((mut conn, _)) = listener.accept().await {
            let Some((method, target)) = read_request(&mut conn).await else {
                continue;
            };
            log.lock()
                .expect("lock")
                .push((method.clone(), target.clone()));
            let (status, body, etag) = match method.as_str() {
                "HEAD" => (404, String::new(), None),
                "POST" if !target.contains("uploadId") => (
                    200,
                    "<InitiateMultipartUploadResult><UploadId>u1</UploadId>\
                     </InitiateMultipartUploadResult>"
                        .to_string(),
                    None,
                ),
                "PUT" if target.contains("partNumber=2&") => {
                    part2 += 1;
                    if part2 <= fail_part2 {
                        (503, "busy".to_string(), None)
                    } else {
                        (200, String::new(), Some("\"p2\""))
                    }
                }
                "PUT" => (200, String::new(), Some("\"p\"")),
                "POST" => (
                    200,
                    "<CompleteMultipartUploadResult><ETag>\"done\"</ETag>\
                     </CompleteMultipartUploadResult>"
                        .to_string(),
                    None,
                ),
                "DELETE" => (204, String::new(), None),
                _ => (400, String::new(), None),
            };
            let etag = etag.map(|e| format!("ETag: {e}\r\n")).unwrap_or_default();
            let head = format!(
                "HTTP/1.1 {status} X\r\n{etag}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes()).await;
            let _ = conn.write_all(body.as_bytes()).await;
            let _ = conn.shutdown().await;
        }
    });
    let store = BlobStore::open(
        "s3://bucket",
        &[
            ("endpoint".into(), format!("http://{addr}")),
            ("allow_http".into(), "true".into()),
            ("region".into(), "test".into()),
            ("access_key_id".into(), "GKtest".into()),
            ("secret_access_key".into(), "s3cr3t-0123456789".into()),
        ],
    )
    .expect("opens");
    (store, seen)
}

/// The method and target of one request, its body read and dropped.
async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut words = head.split(' ');
    let method = words.next()?.to_string();
    let target = words.next()?.to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut left = len;
    let mut buf = vec![0u8; 1 << 16];
    while left > 0 {
        let n = conn.read(&mut buf[..left.min(1 << 16)]).await.ok()?;
        if n == 0 {
            return None;
        }
        left -= n;
    }
    Some((method, target))
}

/// How often each kind of request was seen.
fn count(seen: &Seen, method: &str, contains: &str) -> usize {
    seen.lock()
        .expect("lock")
        .iter()
        .filter(|(m, t)| m == method && t.contains(contains))
        .count()
}

#[tokio::test]
async fn a_failed_part_is_sent_again_and_the_upload_completes() {
    let (store, seen) = serve(2).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("layer");
    // Two parts: a whole one and one byte.
    common::write_sparse(&src, PART_SIZE as u64 + 1);
    let (digest, size) = store.put_file(&src).await.expect("stored");
    assert_eq!(
        (digest, size),
        (common::digest_of(&src), PART_SIZE as u64 + 1)
    );
    assert_eq!(count(&seen, "POST", "?uploads"), 1, "one upload");
    assert_eq!(count(&seen, "PUT", "partNumber=1&"), 1);
    assert_eq!(
        count(&seen, "PUT", "partNumber=2&"),
        3,
        "part 2 sent 3 times"
    );
    assert_eq!(count(&seen, "POST", "?uploadId=u1"), 1, "completed");
    assert_eq!(count(&seen, "DELETE", ""), 0, "not aborted");
}

#[tokio::test]
async fn a_part_that_keeps_failing_aborts_the_upload_and_is_unavailable() {
    let (store, seen) = serve(usize::MAX).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("layer");
    common::write_sparse(&src, PART_SIZE as u64 + 1);
    let err = store.put_file(&src).await.expect_err("unavailable");
    assert!(matches!(err, BlobError::Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("storing blob sha256-"), "{err}");
    // Each upload tries part 2 ATTEMPTS times, then is aborted; the whole
    // upload is tried ATTEMPTS times.
    let uploads = count(&seen, "POST", "?uploads");
    assert_eq!(uploads, ATTEMPTS as usize);
    assert_eq!(
        count(&seen, "PUT", "partNumber=2&"),
        (ATTEMPTS * ATTEMPTS) as usize
    );
    assert_eq!(
        count(&seen, "DELETE", "uploadId=u1"),
        uploads,
        "each aborted"
    );
    assert_eq!(count(&seen, "POST", "?uploadId=u1"), 0, "never completed");
}
