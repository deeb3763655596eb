//! One blob store for every immutable artifact warren keeps: template
//! layers, snapshot layers, filesystem-paused sandboxes' layers, COPY
//! archives. A blob is named by the SHA-256 of its bytes ([`Digest`],
//! `sha256-<hex>`), written once, never changed, and verified on every
//! read. Built on Apache Arrow's [`object_store`], so one code path serves
//! a local directory and the object stores.
//!
//! # Layout
//! - [`BlobStore`] (`store.rs`): [`BlobStore::open`] from a URL and options;
//!   its `Display`/`Debug` are the URL without credentials.
//! - `put.rs`: [`BlobStore::put_file`], hashing, skipping a blob already
//!   there, multipart uploads; `local.rs`: the local directory's writes.
//! - `aws_files.rs`: S3 keys from the AWS shared credentials file.
//! - `fetch.rs`: [`BlobStore::fetch`], verified while streaming, resumed
//!   after a cut, renamed into place only when whole and right.
//! - `ops.rs`: [`BlobStore::size`], [`BlobStore::delete`],
//!   [`BlobStore::list`] and the one retry loop.
//! - [`BlobError`] (`error.rs`): which side failed and whether a retry may
//!   help; the classification of object_store's errors.
//! - `redact.rs`: credentials out of every message.
//! - [`Digest`] (`digest.rs`).
//!
//! # URLs
//!
//! | URL | Backend |
//! |---|---|
//! | `/abs/dir` or `file:///abs/dir` | a local directory (the embedded default) |
//! | `s3://bucket[/prefix]` | S3 and what speaks it: AWS S3, Garage, MinIO, Ceph RGW, R2 (feature `aws`, on by default) |
//! | `gs://bucket[/prefix]` | Google Cloud Storage (feature `gcp`) |
//! | `az://container[/prefix]` | Azure Blob Storage (feature `azure`) |
//!
//! A URL never carries credentials: one with `user:password@`, a query or a
//! fragment is refused ([`BlobError::Config`]).
//!
//! # Object keys
//!
//! Every blob is the object `<prefix>/blobs/sha256/<64 hex>` (no prefix:
//! `blobs/sha256/<hex>`); nothing else under `<prefix>/blobs/sha256/` is
//! read ([`BlobStore::list`] skips what is not a digest). The local
//! directory holds the same keys as files: `<dir>/blobs/sha256/<hex>`,
//! the directories 0700 and every blob 0600 (a blob may hold a tenant's
//! files), each written to a staging file, fsynced and renamed into place.
//!
//! # Options and credentials
//!
//! `options` are object_store's configuration keys for the backend, in
//! either spelling (`endpoint` or `aws_endpoint`, `AWS_ENDPOINT`), e.g.
//! for Garage or MinIO: `endpoint=http://127.0.0.1:3900`, `region=garage`,
//! `allow_http=true` (required for a plain-HTTP endpoint, refused
//! without it); requests are path-style unless
//! `virtual_hosted_style_request=true`. An unknown key is refused, naming
//! the key. Options override the environment; credentials come from the
//! options or from where each cloud's own tools find them:
//! - S3: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`,
//!   `AWS_ENDPOINT`, `AWS_REGION`, `AWS_ALLOW_HTTP` and every other
//!   `AWS_*` variable object_store knows, web identity
//!   (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, as on EKS), ECS
//!   container credentials, then the EC2 instance metadata service; and,
//!   when neither options nor environment give an access key, the static
//!   keys of the AWS shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`
//!   or `~/.aws/credentials`, profile `AWS_PROFILE` or `default`;
//!   `aws_files.rs`);
//! - GCS: `GOOGLE_SERVICE_ACCOUNT` (a key file),
//!   `GOOGLE_APPLICATION_CREDENTIALS`, then the metadata server;
//! - Azure: `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY`,
//!   a SAS, a client secret, federated tokens (`AZURE_FEDERATED_TOKEN_FILE`)
//!   or managed identity.
//!
//! No secret is ever logged or put in an error: messages go through a
//! redactor that removes every secret-named option's and environment
//! variable's value and every URL's user information and query string.
//!
//! Timeouts (object_store's keys; options override): `connect_timeout`
//! 5 s, `read_timeout` 60 s (no byte for that long fails the request),
//! `timeout` 10 min per request (a fetch cut by it resumes where it
//! stopped).
//!
//! # Retries
//!
//! object_store's own retries are off; a transient failure (connection
//! refused or cut, a timeout, 5xx, 408, 429) is retried here with the
//! workspace's one backoff (`warren_core::backoff`, from
//! [`FIRST_PAUSE`] doubling up to `warren_core::backoff::MAX`, ±25%
//! jitter), [`ATTEMPTS`] attempts in all (about 4 s of pauses), then
//! [`BlobError::Unavailable`] names the store. A multipart upload
//! retries each failed part the same way; a fetch resumes from the last
//! byte it received, and its attempts count from the last progress.
//! Nothing else is retried: a missing blob, refused credentials, a
//! corrupt blob or a local disk error is final.
//!
//! # Verification
//!
//! [`BlobStore::put_file`] hashes the file before it uploads and again
//! while it uploads; if the two differ (the file changed) the upload is
//! aborted before it completes, so an object's bytes always match its key.
//! [`BlobStore::fetch`] hashes while it streams into a temporary file next
//! to the destination; only whole, matching bytes are fsynced and renamed
//! into place. A mismatch is [`BlobError::Corrupt`], a cut download that
//! does not recover is [`BlobError::Unavailable`]; neither leaves anything
//! at the destination.
//!
//! # Large blobs
//!
//! To a cloud store, a file larger than [`PART_SIZE`] (16 MiB) goes up as
//! a multipart upload of [`PART_SIZE`] parts, [`UPLOAD_CONCURRENCY`] in
//! flight (so about 80 MiB of memory per upload); a file of more than
//! 10 000 parts (S3's limit) gets parts of `size / 10 000` rounded up to a
//! MiB. Into a local store any file is copied in one pass.
//!
//! # Build cost
//!
//! The default build (`aws`) brings object_store, reqwest (on the
//! workspace's rustls with ring: no second TLS or crypto stack, no C
//! build), quick-xml and chrono; `gcp` and `azure` add little on top. See
//! docs/benchmarks.md ("The blob store's build cost") for the measured
//! seconds.

mod args;
#[cfg(feature = "aws")]
mod aws_files;
mod digest;
mod error;
mod fetch;
mod local;
mod ops;
mod put;
mod redact;
mod store;

pub use args::{BlobStoreArgs, BlobStoreSettings};
pub use digest::{BadDigest, Digest};
pub use error::{BlobError, Cause};
pub use store::BlobStore;

/// Whether an option named `key` holds a secret (a key, secret, token,
/// password, signature): such options belong in the environment or a
/// file, never on a command line.
pub fn is_secret_option(key: &str) -> bool {
    redact::is_secret_key(key)
}

/// `KEY=VALUE` options as a command line gives them (`flag` names the
/// flag in messages): each split at its first `=`, and a secret-named key
/// ([`is_secret_option`]) refused, since every account on the host can
/// read a command line.
pub fn parse_options(options: &[String], flag: &str) -> Result<Vec<(String, String)>, String> {
    options
        .iter()
        .map(|o| {
            let (k, v) = o
                .split_once('=')
                .ok_or_else(|| format!("{flag} {o:?} is not KEY=VALUE"))?;
            if is_secret_option(k) {
                return Err(format!(
                    "{flag} {k}: a credential on the command line, which every account on this \
                     host can read; give it in the environment (AWS_SECRET_ACCESS_KEY, ...)"
                ));
            }
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

use std::time::Duration;

/// How many times a transient failure is tried in all before
/// [`BlobError::Unavailable`].
pub const ATTEMPTS: u32 = 5;

/// The first pause between attempts (then doubling, with jitter).
pub const FIRST_PAUSE: Duration = Duration::from_millis(250);

/// The size of a multipart upload's parts (and of the largest file sent
/// in one request).
pub const PART_SIZE: usize = 16 << 20;

/// How many parts of one upload are in flight at once.
pub const UPLOAD_CONCURRENCY: usize = 4;

#[cfg(test)]
mod tests {
    #[test]
    fn options_from_a_command_line() {
        let ok = super::parse_options(
            &["region=garage".into(), "endpoint=http://h:1=2".into()],
            "--o",
        );
        assert_eq!(
            ok.unwrap(),
            vec![
                ("region".to_string(), "garage".to_string()),
                ("endpoint".to_string(), "http://h:1=2".to_string())
            ]
        );
        let e = super::parse_options(&["region".into()], "--o").unwrap_err();
        assert!(e.contains("--o \"region\" is not KEY=VALUE"), "{e}");
        let e = super::parse_options(&["secret_access_key=x".into()], "--o").unwrap_err();
        assert!(e.contains("credential") && !e.contains("=x"), "{e}");
    }

    /// Every operation's future is `Send`: callers spawn them on a
    /// multi-threaded runtime (the node's layer cache does).
    #[test]
    fn operations_can_be_spawned() {
        fn send<T: Send>(_: T) {}
        let dir = tempfile::tempdir().unwrap();
        let store = super::BlobStore::open(&dir.path().display().to_string(), &[]).unwrap();
        let d: super::Digest = format!("sha256-{}", "0".repeat(64)).parse().unwrap();
        let p = dir.path().join("x");
        send(store.fetch(&d, &p));
        send(store.put_file(&p));
        send(store.size(&d));
        send(store.delete(&d));
        send(store.list());
    }
}
