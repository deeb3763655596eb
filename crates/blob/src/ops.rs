//! The small operations, and the one retry loop every operation uses.

use crate::error::{classify, Cause, Kind};
use crate::{BlobError, BlobStore, Digest, ATTEMPTS, FIRST_PAUSE};
use futures_util::TryStreamExt;
use object_store::ObjectStoreExt;
use std::future::Future;
use warren_core::backoff::Backoff;

impl BlobStore {
    /// The size of `digest`'s blob, or `None` when the store does not
    /// have it.
    pub async fn size(&self, digest: &Digest) -> Result<Option<u64>, BlobError> {
        let key = self.key(digest);
        match self
            .retrying("looking up", Some(digest), || self.inner.store.head(&key))
            .await
        {
            Ok(meta) => Ok(Some(meta.size)),
            Err(BlobError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes `digest`'s blob; removing one that is not there succeeds.
    pub async fn delete(&self, digest: &Digest) -> Result<(), BlobError> {
        let key = self.key(digest);
        match self
            .retrying("deleting", Some(digest), || self.inner.store.delete(&key))
            .await
        {
            Ok(()) | Err(BlobError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every blob in the store with its size, in no particular order (for
    /// garbage collection and imports). Objects under the blob prefix whose
    /// names are not digests are skipped.
    pub async fn list(&self) -> Result<Vec<(Digest, u64)>, BlobError> {
        let base = &self.inner.base;
        let metas: Vec<object_store::ObjectMeta> = self
            .retrying("listing", None, || {
                self.inner.store.list(Some(base)).try_collect::<Vec<_>>()
            })
            .await?;
        let depth = base.parts().count() + 1;
        Ok(metas
            .into_iter()
            .filter(|m| m.location.parts().count() == depth)
            .filter_map(|m| {
                let hex = m.location.filename()?;
                Some((Digest::from_hex(hex).ok()?, m.size))
            })
            .collect())
    }

    /// Runs `op` until it succeeds, fails for good, or has failed
    /// transiently [`ATTEMPTS`] times, pausing with the workspace backoff.
    pub(crate) async fn retrying<T, F, Fut>(
        &self,
        what: &'static str,
        digest: Option<&Digest>,
        mut op: F,
    ) -> Result<T, BlobError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, object_store::Error>>,
    {
        let mut backoff = backoff();
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let kind = classify(&e);
                    if kind == Kind::Transient && attempt < ATTEMPTS {
                        self.pause(what, attempt, &e, &mut backoff).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(self.error(e, kind, attempt, what, digest));
                }
            }
        }
    }

    /// Logs a transient failure and waits out the next pause.
    pub(crate) async fn pause(
        &self,
        what: &str,
        attempt: u32,
        e: &(dyn std::fmt::Display + Sync),
        backoff: &mut Backoff,
    ) {
        let pause = backoff.next_pause();
        tracing::warn!(
            store = %self.name(),
            op = what,
            attempt,
            error = %self.inner.redactor.redact(&e.to_string()),
            "blob store request failed; retrying in {pause:?}"
        );
        tokio::time::sleep(pause).await;
    }

    /// `e` (of kind `kind`, after `attempts` attempts at `what`, e.g.
    /// "fetching", on `digest`'s blob) as a [`BlobError`].
    pub(crate) fn error(
        &self,
        e: object_store::Error,
        kind: Kind,
        attempts: u32,
        what: &str,
        digest: Option<&Digest>,
    ) -> BlobError {
        let store = self.name().to_string();
        let source = self.cause(&e);
        let during = during(what, digest);
        match (kind, digest) {
            (Kind::NotFound, Some(d)) => BlobError::NotFound {
                store,
                digest: d.clone(),
            },
            (Kind::Transient, _) => BlobError::Unavailable {
                store,
                during,
                attempts,
                source,
            },
            (Kind::Denied, _) => BlobError::Denied {
                store,
                during,
                source,
            },
            _ => BlobError::Store {
                store,
                during,
                source,
            },
        }
    }

    /// `e`'s message with this store's credentials removed.
    pub(crate) fn cause(&self, e: &dyn std::fmt::Display) -> Cause {
        Cause(self.inner.redactor.redact(&e.to_string()))
    }
}

/// "`what` blob `digest`", or "`what` blobs" (for errors).
pub(crate) fn during(what: &str, digest: Option<&Digest>) -> String {
    match digest {
        Some(d) => format!("{what} blob {d}"),
        None => format!("{what} blobs"),
    }
}

/// The pauses between attempts.
pub(crate) fn backoff() -> Backoff {
    Backoff::new(FIRST_PAUSE, warren_core::backoff::MAX)
}
