//! COPY's uploads: `GET /templates/{id}/files/{hash}` answers
//! `{"present", "url"}`, and the SDK `PUT`s a tar of the files to that URL
//! (no API key: the URL is the capability).
//!
//! An upload URL is `/_warren/v1/uploads/{hash}?team=&expires=&signature=`:
//! an HMAC-SHA256 (a key this gateway draws at start) over the team, the
//! files hash and the expiry, so it works for that team's hash only, until
//! it expires (`--build-upload-ttl`), and cannot be guessed or bent to
//! another team or hash. A gateway restart voids every link (and every
//! upload: they live in a directory of this process).
//!
//! An archive is an **opaque blob** here: written to a private directory
//! (`--build-upload-dir`, mode 0700, removed at exit) under a name made of
//! a digest of the team and the hash, read back only to be written into a
//! build sandbox, where `tar` runs (`builds`). Nothing on this host ever
//! reads a path out of it. Bounds: one archive at most
//! `--build-upload-max-bytes` (413), all of them at most
//! `--build-upload-total-bytes` (507), each kept `--build-upload-ttl`
//! after its upload (a build that started in time holds it open).
//!
//! Like build status, uploads live on the gateway that took them: behind a
//! load balancer the upload and the build must reach the same gateway.

use crate::auth::Team;
use crate::error::ApiError;
use hmac::{Hmac, Mac};
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use warren_core::server::Incoming;

/// Where uploads wait and how big and how old they may get (the
/// `--build-upload-*` flags).
#[derive(Debug, Clone)]
pub struct UploadSettings {
    /// The directory the private upload directory is made in.
    pub dir: PathBuf,
    /// Largest single archive, in bytes.
    pub max_bytes: u64,
    /// Most bytes all archives may take at once.
    pub total_bytes: u64,
    /// Most bytes one team's archives may take at once.
    pub team_bytes: u64,
    /// How long a link works and an archive is kept.
    pub ttl: Duration,
}

/// One stored archive.
#[derive(Debug)]
struct Blob {
    team: String,
    size: u64,
    at: Instant,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes on disk: stored archives plus uploads in flight.
    used: u64,
    /// The same, per team.
    by_team: HashMap<String, u64>,
    /// Stored archives by file name.
    blobs: HashMap<String, Blob>,
}

impl State {
    /// Counts `n` more bytes for `team`.
    fn take(&mut self, team: &str, n: u64) {
        self.used += n;
        *self.by_team.entry(team.to_string()).or_default() += n;
    }

    /// Counts `n` bytes of `team`'s as freed.
    fn give_back(&mut self, team: &str, n: u64) {
        self.used = self.used.saturating_sub(n);
        if let Some(t) = self.by_team.get_mut(team) {
            *t = t.saturating_sub(n);
            if *t == 0 {
                self.by_team.remove(team);
            }
        }
    }
}

/// The uploads this gateway holds.
#[derive(Debug)]
pub(crate) struct Uploads {
    settings: UploadSettings,
    /// The private directory (made at start, removed on drop).
    dir: PathBuf,
    /// The link-signing key, drawn at start.
    key: Vec<u8>,
    state: Mutex<State>,
}

impl Drop for Uploads {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
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
    /// Makes the private directory in `settings.dir`.
    pub(crate) fn new(settings: UploadSettings) -> std::io::Result<Uploads> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = settings.dir.join(format!(
            "warren-gateway-uploads-{}",
            warren_core::id::random_token(12)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(Uploads {
            key: warren_core::id::random_token(43).into_bytes(),
            settings,
            dir,
            state: Mutex::new(State::default()),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut g = match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    /// The blob's file name: no team name or tenant text in a path.
    fn blob_name(team: &str, hash: &str) -> String {
        let t = Sha256::digest(team.as_bytes());
        let t: String = t.iter().map(|b| format!("{b:02x}")).collect();
        format!("{t}-{hash}")
    }

    fn signature(&self, team: &str, hash: &str, expires: u64) -> Result<Hmac<Sha256>, ApiError> {
        // HMAC takes a key of any length: the error is never reached.
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).map_err(internal)?;
        mac.update(format!("warren-upload-v1\n{team}\n{hash}\n{expires}").as_bytes());
        Ok(mac)
    }

    /// Drops archives older than the TTL.
    fn sweep(&self) {
        let ttl = self.settings.ttl;
        let gone: Vec<String> = self.with(|s| {
            let old: Vec<String> = s
                .blobs
                .iter()
                .filter(|(_, b)| b.at.elapsed() >= ttl)
                .map(|(k, _)| k.clone())
                .collect();
            for k in &old {
                if let Some(b) = s.blobs.remove(k) {
                    s.give_back(&b.team, b.size);
                }
            }
            old
        });
        for name in gone {
            let _ = std::fs::remove_file(self.dir.join(name));
        }
    }

    /// `GET /templates/{id}/files/{hash}`: whether the team's archive is
    /// here, and a link to upload it (201, as E2B answers).
    pub(crate) fn link(
        &self,
        team: &Team,
        hash: &str,
        headers: &HeaderMap,
    ) -> Result<serde_json::Value, ApiError> {
        validate_hash(hash)?;
        self.sweep();
        let present = self.with(|s| s.blobs.contains_key(&Self::blob_name(&team.0, hash)));
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
        let scheme = match headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
        {
            Some(p) if p.eq_ignore_ascii_case("https") => "https",
            _ => "http",
        };
        let expires = unix_now() + self.settings.ttl.as_secs();
        let sig = self
            .signature(&team.0, hash, expires)?
            .finalize()
            .into_bytes();
        let sig: String = sig.iter().map(|b| format!("{b:02x}")).collect();
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("team", &team.0)
            .append_pair("expires", &expires.to_string())
            .append_pair("signature", &sig)
            .finish();
        Ok(serde_json::json!({
            "present": present,
            "url": format!("{scheme}://{host}/_warren/v1/uploads/{hash}?{query}"),
        }))
    }

    /// Checks an upload link; the team it was made for.
    fn check(&self, hash: &str, query: &str) -> Result<String, ApiError> {
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
        self.signature(&team, hash, expires)?
            .verify_slice(&sig)
            .map_err(|_| {
                forbidden("this upload link is not valid (not made by this gateway for this team and files hash)")
            })?;
        if unix_now() > expires {
            return Err(forbidden(
                "this upload link has expired; ask for a new one (GET /templates/{id}/files/{hash})",
            ));
        }
        Ok(team)
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
        self.sweep();
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
            .dir
            .join(format!(".partial-{}", warren_core::id::random_token(16)));
        let mut written = 0u64;
        let result = async {
            let mut file = std::fs::File::create(&partial).map_err(internal)?;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| {
                    ApiError::bad_request("invalid_body", format!("reading the upload: {e}"))
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let n = data.len() as u64;
                if written + n > max {
                    return Err(too_large());
                }
                let (total, per_team) = (self.settings.total_bytes, self.settings.team_bytes);
                self.with(|s| {
                    if s.by_team.get(&team).copied().unwrap_or(0) + n > per_team {
                        return Err(ApiError::new(
                            StatusCode::TOO_MANY_REQUESTS,
                            "upload_quota_exceeded",
                            format!(
                                "team {team}'s uploads would pass {per_team} bytes, the most one \
                                 team may keep on this gateway (--build-upload-team-bytes); \
                                 they are kept {:?}, or replaced by a new upload of the same files",
                                self.settings.ttl
                            ),
                        ));
                    }
                    if s.used + n > total {
                        return Err(ApiError::new(
                            StatusCode::INSUFFICIENT_STORAGE,
                            "upload_store_full",
                            format!(
                                "this gateway holds {total} bytes of uploads at most \
                                 (--build-upload-total-bytes) and is full; try again later"
                            ),
                        ));
                    }
                    s.take(&team, n);
                    Ok(())
                })?;
                written += n;
                file.write_all(&data).map_err(internal)?;
            }
            file.sync_all().map_err(internal)?;
            let name = Self::blob_name(&team, hash);
            std::fs::rename(&partial, self.dir.join(&name)).map_err(internal)?;
            self.with(|s| {
                if let Some(old) = s.blobs.insert(
                    name,
                    Blob {
                        team: team.clone(),
                        size: written,
                        at: Instant::now(),
                    },
                ) {
                    s.give_back(&old.team, old.size);
                }
            });
            Ok(())
        }
        .await;
        if result.is_err() {
            let _ = std::fs::remove_file(&partial);
            self.with(|s| s.give_back(&team, written));
            drain(&mut body, DRAIN).await;
        } else {
            tracing::info!(team = %team, hash, bytes = written, "build files uploaded");
        }
        result
    }

    /// The team's archive for `hash`, opened (it stays readable through the
    /// open file even once it expires), and its size.
    pub(crate) fn open(&self, team: &Team, hash: &str) -> Result<(std::fs::File, u64), ApiError> {
        validate_hash(hash)?;
        self.sweep();
        let name = Self::blob_name(&team.0, hash);
        let missing = || {
            ApiError::bad_request(
                "files_not_uploaded",
                format!(
                    "no upload of the files with hash {hash} (COPY's files are uploaded \
                     before the build starts, through GET /templates/{{id}}/files/{{hash}}; \
                     uploads are kept {:?})",
                    self.settings.ttl
                ),
            )
        };
        if !self.with(|s| s.blobs.contains_key(&name)) {
            return Err(missing());
        }
        let path: &Path = &self.dir.join(&name);
        let file = std::fs::File::open(path).map_err(|_| missing())?;
        let size = file.metadata().map_err(internal)?.len();
        Ok((file, size))
    }
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
        let u = Uploads::new(UploadSettings {
            dir: d.path().to_path_buf(),
            max_bytes: 10,
            total_bytes: 20,
            team_bytes: 15,
            ttl: Duration::from_secs(60),
        })
        .unwrap();
        (d, u)
    }

    #[test]
    fn links_are_bound_to_team_hash_and_time() {
        let (_d, u) = uploads();
        let h = "a".repeat(64);
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, "gw:3000".parse().unwrap());
        let link = u.link(&Team("t1".into()), &h, &headers).unwrap();
        assert_eq!(link["present"], false);
        let url = link["url"].as_str().unwrap();
        let (path, query) = url.split_once('?').unwrap();
        assert_eq!(path, format!("http://gw:3000/_warren/v1/uploads/{h}"));
        assert_eq!(u.check(&h, query).unwrap(), "t1");
        // Another team, another hash, a later expiry: refused.
        let forged = query.replace("team=t1", "team=t2");
        assert!(format!("{:?}", u.check(&h, &forged).unwrap_err()).contains("not valid"));
        let other = "b".repeat(64);
        assert!(u.check(&other, query).is_err());
        let exp = query
            .split('&')
            .find(|p| p.starts_with("expires="))
            .unwrap()
            .to_string();
        let later = query.replace(&exp, "expires=99999999999");
        assert!(u.check(&h, &later).is_err());
        // An expired link (signed by this gateway, but past its time).
        let sig = u.signature("t1", &h, 1).unwrap().finalize().into_bytes();
        let sig: String = sig.iter().map(|b| format!("{b:02x}")).collect();
        let old = format!("team=t1&expires=1&signature={sig}");
        assert!(format!("{:?}", u.check(&h, &old).unwrap_err()).contains("expired"));
        // Bad hashes.
        for bad in ["", "../x", &"A".repeat(64), &"a".repeat(63)] {
            assert!(validate_hash(bad).is_err(), "{bad}");
        }
        assert!(u.open(&Team("t1".into()), &h).is_err());
    }
}
