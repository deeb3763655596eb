//! [`BlobStore::put_file`]: a file into the store under its SHA-256.

use crate::error::{classify, Kind};
use crate::ops::backoff;
use crate::{BlobError, BlobStore, Digest, ATTEMPTS, PART_SIZE, UPLOAD_CONCURRENCY};
use bytes::Bytes;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutMultipartOptions, PutPayload, WriteMultipart};
use sha2::{Digest as _, Sha256};
use std::io::Read;
use std::path::Path;

/// The read size when hashing a file.
const HASH_BUF: usize = 1 << 20;

/// S3's (and GCS's, Azure's) most parts per upload.
const MAX_PARTS: u64 = 10_000;

/// Why one multipart attempt stopped.
enum Failed {
    /// The store's failure (maybe transient: the upload is tried again).
    Store(object_store::Error),
    /// Ours: final.
    Other(BlobError),
}

impl BlobStore {
    /// Stores the file at `path` under its SHA-256 and returns the digest
    /// and size. A blob already there with the same size is not uploaded
    /// again; to a cloud store a file larger than [`PART_SIZE`] goes up in
    /// parts (see the crate doc), to a local one it is copied in
    /// (`local.rs`). The file is hashed again while it is sent: if it
    /// changed meanwhile, nothing is stored and the error says so.
    pub async fn put_file(&self, path: &Path) -> Result<(Digest, u64), BlobError> {
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(io(format!("cannot read {}", path.display())))?;
        if !meta.is_file() {
            return Err(BlobError::Io {
                what: format!("cannot store {}", path.display()),
                source: std::io::Error::other("not a regular file"),
            });
        }
        if meta.len() <= PART_SIZE as u64 && self.inner.local.is_none() {
            return self.put_small(path).await;
        }
        let (digest, size) = hash_file(path).await?;
        if self.size(&digest).await? == Some(size) {
            return Ok((digest, size));
        }
        if let Some(dir) = &self.inner.local {
            self.put_local(dir, path, &digest, size).await?;
            return Ok((digest, size));
        }
        let key = self.key(&digest);
        let part = part_size(size);
        let mut backoff = backoff();
        let mut attempt = 1;
        loop {
            match self.upload(path, &key, &digest, size, part).await {
                Ok(()) => break,
                Err(Failed::Other(e)) => return Err(e),
                Err(Failed::Store(e)) => {
                    let kind = classify(&e);
                    if kind == Kind::Transient && attempt < ATTEMPTS {
                        self.pause("storing", attempt, &e, &mut backoff).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(self.error(e, kind, attempt, "storing", Some(&digest)));
                }
            }
        }
        Ok((digest, size))
    }

    /// A file of at most one part: read once, hashed, sent in one request.
    async fn put_small(&self, path: &Path) -> Result<(Digest, u64), BlobError> {
        let bytes = Bytes::from(
            tokio::fs::read(path)
                .await
                .map_err(io(format!("cannot read {}", path.display())))?,
        );
        let size = bytes.len() as u64;
        let hashed = bytes.clone();
        let digest = tokio::task::spawn_blocking(move || {
            Digest::from_sha256(Sha256::digest(&hashed).into())
        })
        .await
        .map_err(|e| BlobError::Io {
            what: "hashing".into(),
            source: std::io::Error::other(e),
        })?;
        if self.size(&digest).await? == Some(size) {
            return Ok((digest, size));
        }
        let key = self.key(&digest);
        let payload = PutPayload::from(bytes);
        self.retrying("storing", Some(&digest), || {
            self.inner.store.put(&key, payload.clone())
        })
        .await?;
        Ok((digest, size))
    }

    /// One multipart upload of `path` to `key`, checked against `digest`
    /// and `size` before it completes (and aborted if it does not match).
    async fn upload(
        &self,
        path: &Path,
        key: &Key,
        digest: &Digest,
        size: u64,
        part: usize,
    ) -> Result<(), Failed> {
        let upload = self
            .inner
            .store
            .put_multipart_opts(key, self.multipart_options())
            .await
            .map_err(Failed::Store)?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, part);
        let fed = self.feed(&mut writer, path, part).await;
        match fed {
            Ok((actual, total)) if actual == *digest && total == size => {
                writer.finish().await.map_err(Failed::Store)?;
                Ok(())
            }
            Ok(_) => {
                let _ = writer.abort().await;
                Err(Failed::Other(BlobError::Io {
                    what: format!("cannot store {}", path.display()),
                    source: std::io::Error::other("the file changed while it was being stored"),
                }))
            }
            Err(e) => {
                let _ = writer.abort().await;
                Err(e)
            }
        }
    }

    /// Reads `path` part by part into `writer`, hashing as it goes; the
    /// digest and size of what it sent.
    async fn feed(
        &self,
        writer: &mut WriteMultipart,
        path: &Path,
        part: usize,
    ) -> Result<(Digest, u64), Failed> {
        let what = format!("cannot read {}", path.display());
        let mut file = std::fs::File::open(path).map_err(|e| Failed::Other(io(what.clone())(e)))?;
        let mut hasher = Sha256::new();
        let mut total = 0u64;
        loop {
            // Read and hashed off the async threads; the file and the
            // hasher go to the blocking thread and come back.
            let chunk;
            (file, hasher, chunk) = tokio::task::spawn_blocking(move || {
                let chunk = read_up_to(&mut file, part)?;
                hasher.update(&chunk);
                Ok::<_, std::io::Error>((file, hasher, chunk))
            })
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r)
            .map_err(|e| Failed::Other(io(what.clone())(e)))?;
            if chunk.is_empty() {
                return Ok((Digest::from_sha256(hasher.finalize().into()), total));
            }
            total += chunk.len() as u64;
            writer
                .wait_for_capacity(UPLOAD_CONCURRENCY)
                .await
                .map_err(Failed::Store)?;
            writer.put(chunk);
        }
    }

    /// A multipart upload's options: each failed part retried with the
    /// workspace backoff (cloud backends; the local one has no transient
    /// failures).
    fn multipart_options(&self) -> PutMultipartOptions {
        let opts = PutMultipartOptions::default();
        #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
        let opts = opts.with_retry_policy(std::sync::Arc::new(part_retry::PartRetry {
            store: self.name().to_string(),
        }));
        opts
    }
}

/// Parts of [`PART_SIZE`], or larger (whole MiB) for a file of more than
/// [`MAX_PARTS`] of them.
fn part_size(size: u64) -> usize {
    let min = size.div_ceil(MAX_PARTS).div_ceil(1 << 20) << 20;
    usize::try_from(min).unwrap_or(usize::MAX).max(PART_SIZE)
}

/// Up to `n` bytes from `file` (fewer only at its end).
fn read_up_to(file: &mut std::fs::File, n: usize) -> std::io::Result<Bytes> {
    let mut buf = Vec::with_capacity(n);
    file.take(n as u64).read_to_end(&mut buf)?;
    Ok(Bytes::from(buf))
}

/// The digest and size of the file at `path`, read on a blocking thread.
async fn hash_file(path: &Path) -> Result<(Digest, u64), BlobError> {
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut file = std::fs::File::open(&owned)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; HASH_BUF];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            size += n as u64;
        }
        Ok((Digest::from_sha256(hasher.finalize().into()), size))
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r)
    .map_err(io(format!("cannot read {}", path.display())))
}

pub(crate) fn io(what: String) -> impl FnOnce(std::io::Error) -> BlobError {
    move |source| BlobError::Io { what, source }
}

#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
mod part_retry {
    use crate::ops::backoff;
    use crate::ATTEMPTS;
    use object_store::client::HttpErrorKind;
    use object_store::retry::{RetryContext, RetryFailure, RetryPolicy};

    /// Retries a failed part of a multipart upload like every other
    /// request: transient failures only, [`ATTEMPTS`] in all, the
    /// workspace backoff.
    #[derive(Debug)]
    pub(super) struct PartRetry {
        /// The store's name, for the log line.
        pub(super) store: String,
    }

    #[async_trait::async_trait]
    impl RetryPolicy for PartRetry {
        async fn retry(&self, ctx: RetryContext) -> bool {
            let transient = match ctx.failure {
                RetryFailure::Status(s) => {
                    s.is_server_error() || s.as_u16() == 408 || s.as_u16() == 429
                }
                RetryFailure::Transport(k) => matches!(
                    k,
                    HttpErrorKind::Connect
                        | HttpErrorKind::Request
                        | HttpErrorKind::Timeout
                        | HttpErrorKind::Interrupted
                ),
                _ => false,
            };
            if !transient || ctx.attempt >= ATTEMPTS as usize {
                return false;
            }
            let mut b = backoff();
            for _ in 1..ctx.attempt {
                b.next_pause();
            }
            let pause = b.next_pause();
            tracing::warn!(
                store = %self.store,
                attempt = ctx.attempt,
                failure = ?ctx.failure,
                "blob store part upload failed; retrying in {pause:?}"
            );
            tokio::time::sleep(pause).await;
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_grow_only_past_ten_thousand() {
        assert_eq!(part_size(1 << 30), PART_SIZE);
        assert_eq!(part_size(PART_SIZE as u64 * MAX_PARTS), PART_SIZE);
        let big = PART_SIZE as u64 * MAX_PARTS + 1;
        let p = part_size(big) as u64;
        assert!(p > PART_SIZE as u64 && p.is_multiple_of(1 << 20));
        assert!(big.div_ceil(p) <= MAX_PARTS);
    }
}
