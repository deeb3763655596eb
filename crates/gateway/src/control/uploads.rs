//! COPY's uploads: `GET /templates/{id}/files/{hash}` answers
//! `{"present", "url"}`, and the SDK `PUT`s a tar of the files to that URL
//! (no API key: the URL is the capability).
//!
//! An upload URL is `/_warren/v1/uploads/{hash}?team=&expires=&signature=`:
//! an HMAC-SHA256 over the team, the files hash and the expiry, so it works
//! for that team's hash only, until it expires (`--build-upload-ttl`), and
//! cannot be guessed or bent to another team or hash. The key is
//! `--build-upload-key-file`'s (the same file on every gateway: any of them
//! takes any link), or one drawn at start (links then work only on the
//! gateway that made them).
//!
//! An archive is an **opaque blob**: staged in a private directory while it
//! arrives (at most `--build-upload-max-bytes`, 413), put into the blob
//! store (`--blob-store`, or the local store `--build-upload-dir`) under
//! its SHA-256, and recorded in the scheduler's store as the team's upload
//! of that files hash (`PutUpload`), where the team's and everyone's bytes
//! are bounded in the writing transaction (`--build-upload-team-bytes`,
//! 429; `--build-upload-total-bytes`, 507) and an upload is kept
//! `--build-upload-ttl`. A replaced or expired archive's blob is noted as
//! unused and removed by the blob sweep (`super::layers`); a build that
//! claimed it keeps it while it runs. Read back only to be written into a
//! build sandbox, where `tar` runs (`builds`); nothing on a gateway host
//! ever reads a path out of it.

use crate::auth::Team;
use crate::error::ApiError;
use hmac::{Hmac, Mac};
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use sha2::Sha256;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use warren_blob::BlobStore;
use warren_core::server::Incoming;
use warren_proto::client::Scheduler;
use warren_proto::scheduler::v1 as pb;

/// Where uploads go and how big and how old they may get (the
/// `--build-upload-*` flags).
#[derive(Debug, Clone)]
pub struct UploadSettings {
    /// The local blob store archives are kept in without `--blob-store`.
    pub dir: PathBuf,
    /// Where an upload is staged while it arrives (a private directory is
    /// made in it).
    pub staging: PathBuf,
    /// The link-signing key (`--build-upload-key-file`); `None`: drawn at
    /// start.
    pub key: Option<Vec<u8>>,
    /// Largest single archive, in bytes.
    pub max_bytes: u64,
    /// Most bytes all archives may take at once.
    pub total_bytes: u64,
    /// Most bytes one team's archives may take at once.
    pub team_bytes: u64,
    /// How long a link works and an archive is kept.
    pub ttl: Duration,
}

/// The uploads, recorded in the scheduler's store.
pub(crate) struct Uploads {
    settings: UploadSettings,
    scheduler: Arc<Scheduler>,
    /// The blob store (`--blob-store`); `None`: the local store at
    /// `settings.dir`, opened on first use ([`Uploads::blobs`]).
    shared: Option<Arc<BlobStore>>,
    local: Mutex<Option<Arc<BlobStore>>>,
    /// The private staging directory (made at start, removed on drop).
    staging: PathBuf,
    /// The link-signing key.
    key: Vec<u8>,
}

impl Drop for Uploads {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.staging);
    }
}

/// Checks a files hash: the SDK's SHA-256 hex digest (64 of `0-9 a-f`).
pub(crate) fn validate_hash(h: &str) -> Result<(), ApiError> {
    if h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_files_hash",
            format!(
                "files hash {:?} is not a SHA-256 hex digest (64 of 0-9, a-f)",
                h.chars().take(80).collect::<String>()
            ),
        ))
    }
}

fn forbidden(m: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "invalid_upload_link", m)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        format!("upload store: {e}"),
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Uploads {
    /// Makes the private staging directory; archives go to `shared`, or
    /// without it to the local store at `settings.dir`.
    pub(crate) fn new(
        settings: UploadSettings,
        scheduler: Arc<Scheduler>,
        shared: Option<Arc<BlobStore>>,
    ) -> std::io::Result<Uploads> {
        use std::os::unix::fs::DirBuilderExt;
        let staging = settings.staging.join(format!(
            "warren-gateway-uploads-{}",
            warren_core::id::random_token(12)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&staging)?;
        Ok(Uploads {
            key: settings
                .key
                .clone()
                .unwrap_or_else(|| warren_core::id::random_token(43).into_bytes()),
            settings,
            scheduler,
            shared,
            local: Mutex::new(None),
            staging,
        })
    }

    /// The blob store archives are kept in.
    pub(crate) fn blobs(&self) -> Result<Arc<BlobStore>, ApiError> {
        if let Some(b) = &self.shared {
            return Ok(b.clone());
        }
        let mut g = match self.local.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(b) = g.as_ref() {
            return Ok(b.clone());
        }
        let dir = &self.settings.dir;
        let opened = dir
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", dir.display()))
            .and_then(|d| BlobStore::open(d, &[]).map_err(|e| e.to_string()))
            .map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "upload_store_unavailable",
                    format!("cannot open the upload store (--build-upload-dir): {e}"),
                )
            })?;
        let b = Arc::new(opened);
        *g = Some(b.clone());
        Ok(b)
    }

    /// The blob store archives are kept in, if there is one yet: never
    /// made by asking.
    pub(crate) fn existing(&self) -> Option<Arc<BlobStore>> {
        if self.shared.is_some() || self.settings.dir.is_dir() {
            self.blobs().ok()
        } else {
            None
        }
    }

    /// The team's upload of `hash`, if it is there and has not expired.
    async fn get(&self, team: &str, hash: &str) -> Result<Option<pb::Upload>, ApiError> {
        let req = pb::GetUploadRequest {
            team_id: team.to_string(),
            files_hash: hash.to_string(),
        };
        match self
            .scheduler
            .call("GetUpload", |mut c| {
                let req = req.clone();
                async move { c.get_upload(req).await }
            })
            .await
        {
            Ok(u) => Ok(Some(u)),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(ApiError::from_scheduler(&s, None)),
        }
    }

    /// `GET /templates/{id}/files/{hash}`: whether the team's archive is
    /// there, and a link to upload it (201, as E2B answers).
    pub(crate) async fn link(
        &self,
        team: &Team,
        hash: &str,
        headers: &HeaderMap,
    ) -> Result<serde_json::Value, ApiError> {
        validate_hash(hash)?;
        let host = headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<http::uri::Authority>().ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_host",
                    "the request has no usable Host header to build the upload link from",
                )
            })?;
        let present = self.get(&team.0, hash).await?.is_some();
        let scheme = match headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
        {
            Some(p) if p.eq_ignore_ascii_case("https") => "https",
            _ => "http",
        };
        let expires = unix_now() + self.settings.ttl.as_secs();
        let query = link_query(&self.key, &team.0, hash, expires)?;
        Ok(serde_json::json!({
            "present": present,
            "url": format!("{scheme}://{host}/_warren/v1/uploads/{hash}?{query}"),
        }))
    }

    /// Checks an upload link; the team it was made for.
    fn check(&self, hash: &str, query: &str) -> Result<String, ApiError> {
        check_link(&self.key, hash, query, unix_now())
    }

    /// `PUT /_warren/v1/uploads/{hash}?...`: stores the body as the team's
    /// archive for `hash` (replacing any before it).
    pub(crate) async fn put(
        &self,
        hash: &str,
        query: &str,
        headers: &HeaderMap,
        mut body: Incoming,
    ) -> Result<(), ApiError> {
        let team = match self.check(hash, query) {
            Ok(t) => t,
            Err(e) => {
                // Little is read for a link that is not one: whoever holds
                // no link gets the answer for a small body only.
                drain(&mut body, 1 << 20).await;
                return Err(e);
            }
        };
        let max = self.settings.max_bytes;
        let too_large = || {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "upload_too_large",
                format!(
                    "the archive is larger than {max} bytes, the most this gateway takes \
                     (--build-upload-max-bytes)"
                ),
            )
        };
        let declared = headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            drain(&mut body, DRAIN).await;
            return Err(too_large());
        }
        let partial = self
            .staging
            .join(format!(".partial-{}", warren_core::id::random_token(16)));
        let staged = async {
            let mut file = std::fs::File::create(&partial).map_err(internal)?;
            let mut written = 0u64;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| {
                    ApiError::bad_request("invalid_body", format!("reading the upload: {e}"))
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                written += data.len() as u64;
                if written > max {
                    return Err(too_large());
                }
                file.write_all(&data).map_err(internal)?;
            }
            file.sync_all().map_err(internal)?;
            Ok(written)
        }
        .await;
        let result = match staged {
            Ok(_) => self.keep(&team, hash, &partial).await,
            Err(e) => {
                drain(&mut body, DRAIN).await;
                Err(e)
            }
        };
        let _ = std::fs::remove_file(&partial);
        result
    }

    /// Puts the staged archive at `path` into the blob store and records
    /// it as `team`'s upload of `hash`.
    async fn keep(&self, team: &str, hash: &str, path: &std::path::Path) -> Result<(), ApiError> {
        let blobs = self.blobs()?;
        let (digest, size) = blobs.put_file(path).await.map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "blob_store_unavailable",
                format!("cannot store the archive in {blobs}: {e}"),
            )
        })?;
        let expected = self.get(team, hash).await?.map_or(0, |u| u.version);
        let s = self.settings.clone();
        let req = pb::PutUploadRequest {
            team_id: team.to_string(),
            files_hash: hash.to_string(),
            blob_digest: digest.as_str().to_string(),
            size_bytes: size,
            ttl_ms: s.ttl.as_millis() as u64,
            expected_version: expected,
            bounds: Some(pb::UploadBounds {
                max_team_bytes: s.team_bytes,
                max_total_bytes: s.total_bytes,
            }),
        };
        let put = self
            .scheduler
            .call("PutUpload", |mut c| {
                let req = req.clone();
                async move { c.put_upload(req).await }
            })
            .await;
        let refused = match put {
            Ok(_) => {
                tracing::info!(team = %team, hash, bytes = size, blob = %digest, "build files uploaded");
                return Ok(());
            }
            Err(st) => st,
        };
        // The blob is nobody's (unless another record names it: the sweep
        // checks).
        let note = pb::NoteUnusedBlobsRequest {
            digests: vec![digest.as_str().to_string()],
        };
        let _ = self
            .scheduler
            .call("NoteUnusedBlobs", |mut c| {
                let req = note.clone();
                async move { c.note_unused_blobs(req).await }
            })
            .await;
        let bound = refused
            .metadata()
            .get(warren_proto::BOUND_METADATA)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        Err(match refused.code() {
            tonic::Code::ResourceExhausted if bound == warren_proto::BOUND_TOTAL_UPLOAD_BYTES => {
                ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    "upload_store_full",
                    format!(
                        "uploads take {} bytes at most (--build-upload-total-bytes) and are \
                         full; try again later",
                        s.total_bytes
                    ),
                )
            }
            tonic::Code::ResourceExhausted => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "upload_quota_exceeded",
                format!(
                    "team {team}'s uploads would pass {} bytes, the most one team may keep \
                     (--build-upload-team-bytes); they are kept {:?}, or replaced by a new \
                     upload of the same files",
                    s.team_bytes, s.ttl
                ),
            ),
            tonic::Code::AlreadyExists | tonic::Code::Aborted => ApiError::new(
                StatusCode::CONFLICT,
                "upload_changed",
                format!(
                    "another upload of the files with hash {hash} was recorded at the same \
                     time; try again"
                ),
            ),
            _ => ApiError::from_scheduler(&refused, None),
        })
    }

    /// The archive of a build's `upload`, fetched and verified into the
    /// staging directory and opened there (the name is removed at once),
    /// and its size.
    pub(crate) async fn open(&self, upload: &pb::Upload) -> Result<(std::fs::File, u64), String> {
        let blobs = self.blobs().map_err(|e| e.message)?;
        let digest: warren_blob::Digest = upload
            .blob_digest
            .parse()
            .map_err(|e| format!("the upload's blob {:?}: {e}", upload.blob_digest))?;
        let path = self
            .staging
            .join(format!(".build-{}", warren_core::id::random_token(16)));
        let size = blobs.fetch(&digest, &path).await.map_err(|e| {
            format!(
                "cannot read the uploaded files (hash {}) from {blobs}: {e}",
                upload.files_hash
            )
        })?;
        let file = std::fs::File::open(&path);
        let _ = std::fs::remove_file(&path);
        Ok((file.map_err(internal).map_err(|e| e.message)?, size))
    }
}

/// Checks an upload link made with `key` for `hash` at `now` (Unix
/// seconds): the team it was made for. Every part of the query is the
/// client's: a missing, malformed, forged or expired part is a 403.
pub(crate) fn check_link(
    key: &[u8],
    hash: &str,
    query: &str,
    now: u64,
) -> Result<String, ApiError> {
    validate_hash(hash)?;
    let (mut team, mut expires, mut sig) = (None, None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "team" => team = Some(v.into_owned()),
            "expires" => expires = Some(v.into_owned()),
            "signature" => sig = Some(v.into_owned()),
            _ => {}
        }
    }
    let (Some(team), Some(expires), Some(sig)) = (team, expires, sig) else {
        return Err(forbidden(
            "this upload link lacks its team, expires or signature; ask for a new one \
             (GET /templates/{id}/files/{hash})",
        ));
    };
    let expires: u64 = expires
        .parse()
        .map_err(|_| forbidden("this upload link's expiry is not a number"))?;
    let sig = decode_hex(&sig).ok_or_else(|| forbidden("this upload link is not valid"))?;
    link_mac(key, &team, hash, expires)?
        .verify_slice(&sig)
        .map_err(|_| {
            forbidden(
                "this upload link is not valid (not made for this team and files hash by a \
                 gateway with this gateway's --build-upload-key-file)",
            )
        })?;
    if now > expires {
        return Err(forbidden(
            "this upload link has expired; ask for a new one (GET /templates/{id}/files/{hash})",
        ));
    }
    Ok(team)
}

/// The query of an upload link for `team`'s `hash` until `expires`.
pub(crate) fn link_query(
    key: &[u8],
    team: &str,
    hash: &str,
    expires: u64,
) -> Result<String, ApiError> {
    let sig = link_mac(key, team, hash, expires)?.finalize().into_bytes();
    let sig: String = sig.iter().map(|b| format!("{b:02x}")).collect();
    Ok(form_urlencoded::Serializer::new(String::new())
        .append_pair("team", team)
        .append_pair("expires", &expires.to_string())
        .append_pair("signature", &sig)
        .finish())
}

/// The MAC an upload link for `team`'s `hash` until `expires` carries.
fn link_mac(key: &[u8], team: &str, hash: &str, expires: u64) -> Result<Hmac<Sha256>, ApiError> {
    // HMAC takes a key of any length: the error is never reached.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).map_err(internal)?;
    mac.update(format!("warren-upload-v1\n{team}\n{hash}\n{expires}").as_bytes());
    Ok(mac)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 128 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Most of a refused upload read (and dropped) before the answer.
const DRAIN: usize = 64 << 20;

/// After an error answer to an upload, reads and drops what the client is
/// still sending (at most `limit` bytes, 10 s), so it gets the answer
/// instead of a reset that could swallow it.
async fn drain(body: &mut Incoming, limit: usize) {
    let mut seen = 0usize;
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > limit {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn uploads() -> (tempfile::TempDir, Uploads) {
        let d = tempfile::tempdir().unwrap();
        let scheduler = Arc::new(
            Scheduler::new(
                &["http://127.0.0.1:1".to_string()],
                Duration::from_secs(1),
                Duration::from_secs(1),
                None,
            )
            .unwrap(),
        );
        let u = Uploads::new(
            UploadSettings {
                dir: d.path().join("uploads"),
                staging: d.path().to_path_buf(),
                key: None,
                max_bytes: 10,
                total_bytes: 20,
                team_bytes: 15,
                ttl: Duration::from_secs(60),
            },
            scheduler,
            None,
        )
        .unwrap();
        (d, u)
    }

    #[tokio::test]
    async fn links_are_bound_to_team_hash_and_time() {
        let (_d, u) = uploads();
        let h = "a".repeat(64);
        let sig = |team: &str, expires: u64| {
            let s = link_mac(&u.key, team, &h, expires)
                .unwrap()
                .finalize()
                .into_bytes();
            s.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        let later = unix_now() + 60;
        let query = format!("team=t1&expires={later}&signature={}", sig("t1", later));
        assert_eq!(u.check(&h, &query).unwrap(), "t1");
        // Another team, another hash, a later expiry: refused.
        let forged = query.replace("team=t1", "team=t2");
        assert!(format!("{:?}", u.check(&h, &forged).unwrap_err()).contains("not valid"));
        let other = "b".repeat(64);
        assert!(u.check(&other, &query).is_err());
        let stretched = query.replace(&format!("expires={later}"), "expires=99999999999");
        assert!(u.check(&h, &stretched).is_err());
        // An expired link (signed with this key, but past its time).
        let old = format!("team=t1&expires=1&signature={}", sig("t1", 1));
        assert!(format!("{:?}", u.check(&h, &old).unwrap_err()).contains("expired"));
        // A link signed with another gateway's key.
        let (_d2, v) = uploads();
        assert!(v.check(&h, &query).is_err());
        // Bad hashes.
        for bad in ["", "../x", &"A".repeat(64), &"a".repeat(63)] {
            assert!(validate_hash(bad).is_err(), "{bad}");
        }
    }
}
