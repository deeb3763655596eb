//! Storing into the local directory backend: the blob is copied into a
//! staging file created 0600 beside its final name (never created wider
//! and narrowed after, as `warren_core::private` does), hashed as it is
//! copied, fsynced and renamed into place. object_store's own local
//! writes would create the file with the process umask (0644) first.

use crate::error::Cause;
use crate::put::io;
use crate::{BlobError, BlobStore, Digest};
use sha2::{Digest as _, Sha256};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The copy buffer.
const BUF: usize = 1 << 20;

/// Makes staging names unique within this process.
static SEQ: AtomicU64 = AtomicU64::new(0);

/// Removes the staging file unless it was renamed into place.
struct Staged(Option<PathBuf>);

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Why a local copy failed: the source (ours) or the store's disk.
enum Failed {
    Source(std::io::Error),
    Store(String, std::io::Error),
}

impl BlobStore {
    /// Copies `path` into the local store at `dir` (its `blobs/sha256`)
    /// under `digest`, which the file hashed to a moment ago; if what is
    /// copied hashes otherwise (the file changed), nothing is stored.
    pub(crate) async fn put_local(
        &self,
        dir: &Path,
        path: &Path,
        digest: &Digest,
        size: u64,
    ) -> Result<(), BlobError> {
        let stage = dir.join(format!(
            ".stage-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let dest = dir.join(digest.hex());
        let (src, want, dir_owned) = (path.to_path_buf(), digest.clone(), dir.to_path_buf());
        let copied =
            tokio::task::spawn_blocking(move || copy(&src, &stage, &dest, &dir_owned, &want, size))
                .await
                .map_err(|e| Failed::Source(std::io::Error::other(e)))
                .and_then(|r| r);
        match copied {
            Ok(true) => Ok(()),
            Ok(false) => Err(BlobError::Io {
                what: format!("cannot store {}", path.display()),
                source: std::io::Error::other("the file changed while it was being stored"),
            }),
            Err(Failed::Source(e)) => Err(io(format!("cannot read {}", path.display()))(e)),
            Err(Failed::Store(what, e)) => Err(BlobError::Store {
                store: self.name().to_string(),
                during: crate::ops::during("storing", Some(digest)),
                source: Cause(format!("{what}: {e}")),
            }),
        }
    }
}

/// The blocking copy: `Ok(false)` when the bytes did not hash to `want`.
fn copy(
    src: &Path,
    stage: &Path,
    dest: &Path,
    dir: &Path,
    want: &Digest,
    size: u64,
) -> Result<bool, Failed> {
    let mut from = std::fs::File::open(src).map_err(Failed::Source)?;
    let at = |what: &str, p: &Path| format!("cannot {what} {}", p.display());
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(stage)
        .map_err(|e| Failed::Store(at("create", stage), e))?;
    let mut guard = Staged(Some(stage.to_path_buf()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF];
    let mut total = 0u64;
    loop {
        let n = from.read(&mut buf).map_err(Failed::Source)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        to.write_all(&buf[..n])
            .map_err(|e| Failed::Store(at("write", stage), e))?;
    }
    if total != size || Digest::from_sha256(hasher.finalize().into()) != *want {
        return Ok(false);
    }
    to.sync_all()
        .map_err(|e| Failed::Store(at("sync", stage), e))?;
    std::fs::rename(stage, dest).map_err(|e| Failed::Store(at("rename into", dest), e))?;
    guard.0 = None;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Failed::Store(at("sync", dir), e))?;
    Ok(true)
}
