//! What can go wrong, said by which side failed and whether a retry may
//! help; and the one classification of object_store's errors into them.

use crate::Digest;
use std::fmt;

/// A blob store operation's failure. Every message names the store (its
/// URL without credentials) and never holds a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlobError {
    /// The blob is not in the store. Not retryable.
    #[error("blob {digest} is not in blob store {store}")]
    NotFound { store: String, digest: Digest },
    /// The store's bytes for `digest` hash to `actual`: the object is
    /// wrong (or was cut short), nothing was written to the destination.
    /// Not retryable: the object must be stored again (or deleted).
    #[error("blob {digest} in blob store {store} is corrupt: its bytes hash to {actual}")]
    Corrupt {
        store: String,
        digest: Digest,
        actual: Digest,
    },
    /// The store did not answer, or answered with a transient failure
    /// (connection refused or cut, timeout, 5xx, 429), on every one of
    /// [`crate::ATTEMPTS`] attempts. Retryable later.
    #[error(
        "blob store {store} is unavailable while {during} (gave up after {attempts} \
         attempts): {source}"
    )]
    Unavailable {
        store: String,
        /// What was being done: "fetching blob sha256-…", "listing blobs".
        during: String,
        attempts: u32,
        source: Cause,
    },
    /// The store refused the credentials or their rights (401, 403). Not
    /// retryable: fix the credentials or the bucket's policy.
    #[error(
        "blob store {store} refused access while {during} (check its credentials and \
         rights): {source}"
    )]
    Denied {
        store: String,
        during: String,
        source: Cause,
    },
    /// The store answered with an error no retry fixes (a bad request,
    /// an unsupported operation, a local backend's disk error).
    #[error("blob store {store} failed while {during}: {source}")]
    Store {
        store: String,
        during: String,
        source: Cause,
    },
    /// The URL or an option is wrong (unknown scheme or key, a backend
    /// this build lacks, credentials in the URL). Not retryable.
    #[error("blob store configuration: {0}")]
    Config(String),
    /// This host's side: the file being stored or the destination being
    /// written (`what` names it). Not retryable.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl BlobError {
    /// Whether trying the same call again later may succeed (only
    /// [`BlobError::Unavailable`]: the store was down or overloaded).
    pub fn is_retryable(&self) -> bool {
        matches!(self, BlobError::Unavailable { .. })
    }
}

/// The store's own words for a failure, with credentials already removed
/// (so nothing that prints an error's chain can print a secret).
#[derive(Debug, Clone)]
pub struct Cause(pub(crate) String);

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Cause {}

/// How object_store's error is to be taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    NotFound,
    /// Worth another attempt.
    Transient,
    Denied,
    /// Anything else the store said.
    Permanent,
}

/// Sorts an object_store error into a [`Kind`], walking its `source()`
/// chain: an HTTP transport failure (connect, request, timeout, cut) or a
/// 5xx/408/429 status is transient.
pub(crate) fn classify(e: &object_store::Error) -> Kind {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => Kind::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Kind::Denied,
        E::Generic { .. } => {
            if let Some(kind) = transport(e) {
                return kind;
            }
            match status_in(&e.to_string()) {
                Some(s) if s >= 500 || s == 408 || s == 429 => Kind::Transient,
                // S3 may answer 200 with an <Error> body (InternalError,
                // SlowDown): object_store says "error response".
                None if e.to_string().contains("Server returned error response") => Kind::Transient,
                _ => Kind::Permanent,
            }
        }
        _ => Kind::Permanent,
    }
}

/// The kind of the HTTP transport failure in `e`'s chain, if there is one.
#[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
fn transport(e: &object_store::Error) -> Option<Kind> {
    use object_store::client::{HttpError, HttpErrorKind};
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<HttpError>() {
            return Some(match h.kind() {
                HttpErrorKind::Connect
                | HttpErrorKind::Request
                | HttpErrorKind::Timeout
                | HttpErrorKind::Interrupted => Kind::Transient,
                _ => Kind::Permanent,
            });
        }
        cur = err.source();
    }
    None
}

/// Without a cloud backend nothing speaks HTTP.
#[cfg(not(any(feature = "aws", feature = "gcp", feature = "azure")))]
fn transport(_: &object_store::Error) -> Option<Kind> {
    None
}

/// The HTTP status in object_store's message for a failed request
/// ("... status code: 503 Service Unavailable ..."). object_store names
/// no public type for it; tests/status.rs pins this spelling against a
/// real HTTP server, so a change in it fails a test instead of turning
/// 5xx into permanent errors.
fn status_in(msg: &str) -> Option<u16> {
    let at = msg.find("status code: ")? + "status code: ".len();
    msg.get(at..at + 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_read_from_object_stores_message() {
        assert_eq!(
            status_in("Server returned non-2xx status code: 503 Service Unavailable: "),
            Some(503)
        );
        assert_eq!(status_in("connection refused"), None);
    }

    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    #[test]
    fn transport_failures_are_transient_and_others_not() {
        use object_store::client::{HttpError, HttpErrorKind};
        let generic = |kind| object_store::Error::Generic {
            store: "S3",
            source: Box::new(HttpError::new(kind, std::io::Error::other("x"))),
        };
        assert_eq!(classify(&generic(HttpErrorKind::Connect)), Kind::Transient);
        assert_eq!(
            classify(&generic(HttpErrorKind::Interrupted)),
            Kind::Transient
        );
        assert_eq!(classify(&generic(HttpErrorKind::Unknown)), Kind::Permanent);
        let nf = object_store::Error::NotFound {
            path: "p".into(),
            source: "gone".into(),
        };
        assert_eq!(classify(&nf), Kind::NotFound);
    }
}
