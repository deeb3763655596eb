//! [`BlobStore::fetch`]: a blob to a local file, verified while it streams.

use crate::error::{classify, Kind};
use crate::ops::backoff;
use crate::put::io;
use crate::{BlobError, BlobStore, Digest, ATTEMPTS};
use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path as Key;
use object_store::{GetOptions, GetRange, GetResultPayload};
use sha2::{Digest as _, Sha256};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// How much is gathered from a stream before one write (and hash) on a
/// blocking thread; also the read size for a local store's files.
const BATCH: usize = 1 << 20;

/// What has arrived so far: the temporary file, the hash of its bytes,
/// their count. Moved to a blocking thread for each write and back.
#[derive(Default)]
struct Received {
    file: Option<std::fs::File>,
    hasher: Sha256,
    written: u64,
}

/// Why one attempt stopped early.
enum Stop {
    /// The store's answer to the request.
    Store(object_store::Error),
    /// The body broke off after the answer began: worth resuming.
    Cut(String),
    /// Final (this host's disk).
    Fatal(BlobError),
}

/// Removes the temporary file unless the fetch succeeded, on every way
/// out (errors, and a caller dropping the future).
struct Scratch(Option<PathBuf>);

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Makes temporary names unique within this process.
static SEQ: AtomicU64 = AtomicU64::new(0);

impl BlobStore {
    /// Fetches `digest`'s blob into `dest` and returns its size. The bytes
    /// go to `dest` plus a temporary suffix (mode 0600), hashed as they
    /// arrive; only when all have arrived and their SHA-256 is `digest` is
    /// the file fsynced and renamed to `dest`. A mismatch is
    /// [`BlobError::Corrupt`]; a download cut off resumes where it stopped
    /// (see the crate doc for the retries) and otherwise ends
    /// [`BlobError::Unavailable`]; either way nothing is left at `dest`.
    pub async fn fetch(&self, digest: &Digest, dest: &Path) -> Result<u64, BlobError> {
        let tmp = temp_name(dest);
        let mut scratch = Scratch(Some(tmp.clone()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(format!("cannot create {}", tmp.display())))?;
        let mut got = Received {
            file: Some(file),
            ..Received::default()
        };
        let key = self.key(digest);
        let mut e_tag = None;
        let mut size = None;
        let mut backoff = backoff();
        let mut attempt = 1;
        loop {
            let before = got.written;
            let stop = match self.receive(&key, &mut got, &mut e_tag, &mut size).await {
                Ok(()) => break,
                Err(Stop::Fatal(e)) => return Err(e),
                Err(stop) => stop,
            };
            if size == Some(got.written) {
                // Everything arrived before the connection broke.
                break;
            }
            if got.written > before {
                // Progress: the count of attempts starts over.
                attempt = 1;
                backoff.reset();
            }
            let message = match stop {
                Stop::Fatal(e) => return Err(e),
                Stop::Store(object_store::Error::Precondition { .. }) => {
                    // The object changed under a resumed download: start over.
                    got = restart(got, &tmp).await?;
                    e_tag = None;
                    size = None;
                    "the blob changed; starting over".to_string()
                }
                Stop::Store(e) => {
                    let kind = classify(&e);
                    if kind != Kind::Transient || attempt >= ATTEMPTS {
                        return Err(self.error(e, kind, attempt, "fetching", Some(digest)));
                    }
                    e.to_string()
                }
                Stop::Cut(why) => {
                    if attempt >= ATTEMPTS {
                        return Err(BlobError::Unavailable {
                            store: self.name().to_string(),
                            during: crate::ops::during("fetching", Some(digest)),
                            attempts: attempt,
                            source: self.cause(&format!("the download was cut off: {why}")),
                        });
                    }
                    why
                }
            };
            self.pause("fetching", attempt, &message, &mut backoff)
                .await;
            attempt += 1;
        }
        let written = got.written;
        let actual = Digest::from_sha256(std::mem::take(&mut got.hasher).finalize().into());
        if actual != *digest {
            return Err(BlobError::Corrupt {
                store: self.name().to_string(),
                digest: digest.clone(),
                actual,
            });
        }
        let file = got.file.take();
        let dest_owned = dest.to_path_buf();
        let tmp_owned = tmp.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            if let Some(f) = file {
                f.sync_all()?;
            }
            std::fs::rename(&tmp_owned, &dest_owned)?;
            if let Some(parent) = dest_owned.parent() {
                std::fs::File::open(parent)?.sync_all()?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
        .map_err(io(format!("cannot move {} into place", dest.display())))?;
        scratch.0 = None;
        Ok(written)
    }

    /// One GET from where `got` stopped to the end, into `got`.
    async fn receive(
        &self,
        key: &Key,
        got: &mut Received,
        e_tag: &mut Option<String>,
        size: &mut Option<u64>,
    ) -> Result<(), Stop> {
        let opts = GetOptions {
            range: (got.written > 0).then_some(GetRange::Offset(got.written)),
            if_match: e_tag.clone(),
            ..GetOptions::default()
        };
        let res = self
            .inner
            .store
            .get_opts(key, opts)
            .await
            .map_err(Stop::Store)?;
        if e_tag.is_none() {
            e_tag.clone_from(&res.meta.e_tag);
        }
        *size = Some(res.meta.size);
        let end = res.range.end;
        match res.payload {
            GetResultPayload::File(file, _) => {
                let start = res.range.start;
                let taken = std::mem::take(got);
                let (back, r) =
                    tokio::task::spawn_blocking(move || copy_file(taken, file, start, end))
                        .await
                        .map_err(|e| Stop::Fatal(join_error(e)))?;
                *got = back;
                r
            }
            GetResultPayload::Stream(mut stream) => {
                let mut batch: Vec<Bytes> = Vec::new();
                let mut pending = 0usize;
                loop {
                    // Ok(true): a chunk came; Ok(false): the body ended.
                    let next = match stream.next().await {
                        Some(Ok(chunk)) => {
                            pending += chunk.len();
                            batch.push(chunk);
                            Ok(true)
                        }
                        Some(Err(e)) => Err(e),
                        None => Ok(false),
                    };
                    let more = matches!(next, Ok(true));
                    if pending >= BATCH || (!more && pending > 0) {
                        absorb(got, std::mem::take(&mut batch)).await?;
                        pending = 0;
                    }
                    match next {
                        Ok(true) => {}
                        Err(e) => return Err(Stop::Cut(e.to_string())),
                        Ok(false) if got.written < end => {
                            return Err(Stop::Cut(format!(
                                "the body ended at byte {} of {end}",
                                got.written
                            )))
                        }
                        Ok(false) => return Ok(()),
                    }
                }
            }
        }
    }
}

/// Writes and hashes `batch` on a blocking thread.
async fn absorb(got: &mut Received, batch: Vec<Bytes>) -> Result<(), Stop> {
    let mut taken = std::mem::take(got);
    let (back, r) = tokio::task::spawn_blocking(move || {
        let r = (|| {
            let file = taken.file.as_mut().ok_or_else(lost)?;
            for b in &batch {
                file.write_all(b)?;
                taken.hasher.update(b);
                taken.written += b.len() as u64;
            }
            Ok::<_, std::io::Error>(())
        })();
        (taken, r)
    })
    .await
    .map_err(|e| Stop::Fatal(join_error(e)))?;
    *got = back;
    r.map_err(|e| Stop::Fatal(io("cannot write the fetched blob".into())(e)))
}

/// A local store's file from `start` to `end` into `got` (blocking).
fn copy_file(
    mut got: Received,
    mut src: std::fs::File,
    start: u64,
    end: u64,
) -> (Received, Result<(), Stop>) {
    let r = (|| {
        src.seek(SeekFrom::Start(start))
            .map_err(|e| Stop::Store(local_read(e)))?;
        let mut buf = vec![0u8; BATCH];
        while got.written < end {
            let want = usize::try_from(end - got.written)
                .unwrap_or(BATCH)
                .min(BATCH);
            let n = src
                .read(&mut buf[..want])
                .map_err(|e| Stop::Store(local_read(e)))?;
            if n == 0 {
                return Err(Stop::Cut(format!(
                    "the file ended at byte {} of {end}",
                    got.written
                )));
            }
            let file = got
                .file
                .as_mut()
                .ok_or_else(|| Stop::Fatal(fatal(lost())))?;
            file.write_all(&buf[..n])
                .map_err(|e| Stop::Fatal(fatal(e)))?;
            got.hasher.update(&buf[..n]);
            got.written += n as u64;
        }
        Ok(())
    })();
    (got, r)
}

/// Empties the temporary file for a fresh start.
async fn restart(got: Received, tmp: &Path) -> Result<Received, BlobError> {
    let what = format!("cannot rewrite {}", tmp.display());
    tokio::task::spawn_blocking(move || {
        let mut file = got.file.ok_or_else(lost)?;
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        Ok(Received {
            file: Some(file),
            ..Received::default()
        })
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r)
    .map_err(io(what))
}

/// `dest` plus `.part-<pid>-<n>`, in `dest`'s directory (so the rename is
/// atomic).
fn temp_name(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(format!(
        ".part-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    PathBuf::from(name)
}

fn lost() -> std::io::Error {
    std::io::Error::other("internal: the temporary file was lost")
}

fn fatal(e: std::io::Error) -> BlobError {
    io("cannot write the fetched blob".into())(e)
}

fn join_error(e: tokio::task::JoinError) -> BlobError {
    fatal(std::io::Error::other(e))
}

/// A local store's read failure, as object_store would report it.
fn local_read(e: std::io::Error) -> object_store::Error {
    object_store::Error::Generic {
        store: "LocalFileSystem",
        source: Box::new(e),
    }
}
