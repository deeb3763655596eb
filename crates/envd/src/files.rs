//! `GET /files` (download) and `POST /files` (upload), as the e2b SDK sends
//! them, and the presigned-URL check (`signature`, `signature_expiration`).
//!
//! - Download: `?path=P` → the raw bytes, streamed.
//! - Upload, `multipart/form-data`: one or more parts named `file`; each goes
//!   to `?path=` when given (one file), else to the part's file name (the SDK
//!   puts the destination path there).
//! - Upload, `application/octet-stream` (envd >= 0.5.7 clients): the body is
//!   the file, `?path=` is required, `Content-Encoding: gzip` is undone.
//!
//! Both answer `[{"path", "name", "type": "file"}]` (plus `metadata` when
//! set). Parent directories are created; an existing file is overwritten.
//! `username` names the user the files and new directories belong to.
//! `X-Metadata-<key>` headers set the file's metadata (and an upload
//! without them clears it; [`crate::metadata`]), checked before anything
//! is written.

use crate::paths::{Follow, Jail};
use crate::rpc_error::{http_status, path_error};
use futures_util::TryStreamExt;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, StreamBody};
use hyper::body::Frame;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use tokio::io::AsyncWriteExt;
use warren_core::body::{self as reply, Body};
use warren_core::server::Incoming;

/// The query of a `/files` request.
#[derive(Debug, Default)]
pub struct Query {
    /// `path`, as the client named it.
    pub path: Option<String>,
    /// `username` (for the signature; otherwise ignored).
    pub username: Option<String>,
    /// `signature`: `v1_` + base64(sha256(...)) for presigned URLs.
    pub signature: Option<String>,
    /// `signature_expiration`: unix seconds.
    pub signature_expiration: Option<String>,
}

impl Query {
    /// Parses a URL query string.
    pub fn parse(query: Option<&str>) -> Query {
        let map: HashMap<String, String> = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .into_owned()
            .collect();
        let get = |k: &str| map.get(k).cloned();
        Query {
            path: get("path").filter(|p| !p.is_empty()),
            username: get("username").filter(|u| !u.is_empty()),
            signature: get("signature"),
            signature_expiration: get("signature_expiration"),
        }
    }
}

/// Why a signed `/files` URL is refused (E2B envd's messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureError {
    /// No `signature` parameter: the request needs the access token.
    Missing,
    /// `signature_expiration` is not a number.
    BadExpiration,
    /// The signature is not the one the token makes.
    Invalid,
    /// The signature matches, but its expiration has passed.
    Expired,
}

impl SignatureError {
    pub fn message(self) -> &'static str {
        match self {
            SignatureError::Missing => "missing or invalid access token (X-Access-Token)",
            SignatureError::BadExpiration => "invalid signature_expiration",
            SignatureError::Invalid => "invalid signature",
            SignatureError::Expired => "signature is already expired",
        }
    }
}

/// Whether `query` carries a valid, unexpired signature for `method` made
/// with `token` (the e2b SDK's `get_signature`: sha256 of
/// `path:operation:user:token[:expiration]`). The signature is judged
/// before its expiration, so a forger never learns whether the expiry
/// was the problem.
pub fn check_signature(query: &Query, method: &Method, token: &str) -> Result<(), SignatureError> {
    use base64::Engine;
    use sha2::Digest;
    let Some(signature) = query.signature.as_deref() else {
        return Err(SignatureError::Missing);
    };
    let operation = if method == Method::GET {
        "read"
    } else {
        "write"
    };
    let path = query.path.as_deref().unwrap_or("");
    let user = query.username.as_deref().unwrap_or("");
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    let expiration = match query.signature_expiration.as_deref() {
        None => None,
        Some(exp) => {
            let exp = exp
                .parse::<i64>()
                .map_err(|_| SignatureError::BadExpiration)?;
            raw.push_str(&format!(":{exp}"));
            Some(exp)
        }
    };
    let digest = sha2::Sha256::digest(raw.as_bytes());
    let expected = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    );
    if !crate::server::constant_time_eq(expected.as_bytes(), signature.as_bytes()) {
        return Err(SignatureError::Invalid);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    match expiration {
        Some(exp) if now > exp => Err(SignatureError::Expired),
        _ => Ok(()),
    }
}

/// Serves `/files`.
pub async fn handle(jail: &Jail, req: Request<Incoming>) -> Response<Body> {
    let query = Query::parse(req.uri().query());
    match *req.method() {
        Method::GET | Method::HEAD => download(jail, &query, req.method() == Method::HEAD).await,
        Method::POST => match upload(jail, &query, req).await {
            Ok(written) => reply::json(StatusCode::OK, &serde_json::Value::Array(written)),
            Err(res) => res,
        },
        _ => {
            let mut res = reply::error(StatusCode::METHOD_NOT_ALLOWED, "use GET or POST on /files");
            res.headers_mut().insert(
                header::ALLOW,
                header::HeaderValue::from_static("GET, HEAD, POST"),
            );
            res
        }
    }
}

/// The user an upload writes as (`username`, default `user`), when envd
/// switches identities.
fn owner_of(
    jail: &Jail,
    query: &Query,
) -> Result<Option<crate::users::Identity>, crate::users::UnknownUser> {
    jail.users().lookup(query.username.as_deref())
}

fn unknown_user(e: crate::users::UnknownUser) -> Response<Body> {
    reply::error(StatusCode::BAD_REQUEST, e.to_string())
}

fn resolve_error(e: crate::paths::PathError) -> Response<Body> {
    let err = path_error(e);
    reply::error(http_status(err.code), err.message.unwrap_or_default())
}

fn io_response(client: &str, e: std::io::Error) -> Response<Body> {
    let err = crate::rpc_error::io_error(client, e);
    reply::error(http_status(err.code), err.message.unwrap_or_default())
}

async fn download(jail: &Jail, query: &Query, head: bool) -> Response<Body> {
    let Some(path) = query.path.as_deref() else {
        return reply::error(
            StatusCode::BAD_REQUEST,
            "the path query parameter is required",
        );
    };
    let user = match owner_of(jail, query) {
        Ok(u) => u,
        Err(e) => return unknown_user(e),
    };
    let r = match jail.resolve_for(path, Follow::All, user.as_ref()) {
        Ok(r) => r,
        Err(e) => return resolve_error(e),
    };
    let file = match tokio::fs::File::open(&r.host).await {
        Ok(f) => f,
        Err(e) => return io_response(&r.client, e),
    };
    let meta = match file.metadata().await {
        Ok(m) => m,
        Err(e) => return io_response(&r.client, e),
    };
    if meta.is_dir() {
        return reply::error(
            StatusCode::BAD_REQUEST,
            format!("path {:?} is a directory", r.client),
        );
    }
    if !meta.is_file() {
        // A device, pipe or socket has no end to read to (`/dev/zero`) or
        // blocks until a writer comes (a FIFO).
        return reply::error(
            StatusCode::BAD_REQUEST,
            format!(
                "path {:?} is not a regular file (a device, pipe or socket) and cannot be downloaded",
                r.client
            ),
        );
    }
    let length = trusted_size(&file, meta.len());
    let body = if head {
        reply::empty()
    } else {
        // With a length, exactly that many bytes: a file that grows while
        // it is sent cannot overrun the answer's framing.
        let reader = tokio::io::AsyncReadExt::take(file, length.unwrap_or(u64::MAX));
        let frames = tokio_util::io::ReaderStream::new(reader)
            .map_ok(Frame::data)
            .map_err(|e| Box::new(e) as reply::BoxError);
        BodyExt::boxed_unsync(StreamBody::new(frames))
    };
    let name = r
        .client
        .rsplit('/')
        .next()
        .unwrap_or("file")
        .replace('"', "");
    let mut res = Response::new(body);
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(length) = length {
        h.insert(header::CONTENT_LENGTH, length.into());
    }
    if let Ok(v) = header::HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    res
}

/// The size a download can announce as `Content-Length`, or `None` when
/// the file must be read to its end instead: files of the kernel's
/// pseudo-filesystems report a size of 0 (`/proc`) or a page (`/sys`)
/// whatever they hold, and a size of 0 proves nothing anywhere.
fn trusted_size(file: &tokio::fs::File, size: u64) -> Option<u64> {
    use nix::sys::statfs::{self as fs, fstatfs};
    const PSEUDO: [fs::FsType; 9] = [
        fs::PROC_SUPER_MAGIC,
        fs::SYSFS_MAGIC,
        fs::DEBUGFS_MAGIC,
        fs::TRACEFS_MAGIC,
        fs::SECURITYFS_MAGIC,
        fs::CGROUP_SUPER_MAGIC,
        fs::CGROUP2_SUPER_MAGIC,
        fs::BPF_FS_MAGIC,
        fs::SELINUX_MAGIC,
    ];
    if size == 0 {
        return None;
    }
    match fstatfs(file) {
        Ok(st) if PSEUDO.contains(&st.filesystem_type()) => None,
        Ok(_) => Some(size),
        Err(_) => None,
    }
}

async fn upload(
    jail: &Jail,
    query: &Query,
    req: Request<Incoming>,
) -> Result<Vec<serde_json::Value>, Response<Body>> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let gzip = match req
        .headers()
        .get(header::CONTENT_ENCODING)
        .map(|v| v.as_bytes())
    {
        None | Some(b"identity") => false,
        Some(b"gzip") => true,
        Some(other) => {
            return Err(reply::error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "unsupported Content-Encoding {:?} (identity or gzip)",
                    String::from_utf8_lossy(other)
                ),
            ))
        }
    };
    let metadata = match crate::metadata::from_headers(req.headers()) {
        Ok(m) => m,
        Err(message) => {
            drain(&mut req.into_body()).await;
            return Err(reply::error(StatusCode::BAD_REQUEST, message));
        }
    };
    if content_type.starts_with("multipart/form-data") {
        if gzip {
            return Err(reply::error(
                StatusCode::BAD_REQUEST,
                "gzip is only supported with application/octet-stream uploads",
            ));
        }
        return upload_multipart(jail, query, &content_type, &metadata, req.into_body()).await;
    }
    let Some(path) = query.path.as_deref() else {
        return Err(reply::error(
            StatusCode::BAD_REQUEST,
            "the path query parameter is required for application/octet-stream uploads",
        ));
    };
    let owner = owner_of(jail, query).map_err(unknown_user)?;
    let mut body = req.into_body();
    let written = async {
        let mut sink = Sink::open(jail, path, gzip, owner.as_ref(), &metadata).await?;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                reply::error(StatusCode::BAD_REQUEST, format!("reading the upload: {e}"))
            })?;
            if let Ok(data) = frame.into_data() {
                sink.write(&data).await?;
            }
        }
        Ok(vec![sink.finish().await?])
    }
    .await;
    if written.is_err() {
        drain(&mut body).await;
    }
    written
}

/// After an error answer to an upload, reads and discards what the client
/// is still sending (bounded), so it gets the answer instead of a reset
/// that could swallow it.
async fn drain(body: &mut Incoming) {
    const LIMIT: usize = 256 << 20;
    let mut seen = 0usize;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > LIMIT {
                break;
            }
        }
    })
    .await;
}

async fn upload_multipart(
    jail: &Jail,
    query: &Query,
    content_type: &str,
    metadata: &BTreeMap<String, String>,
    body: Incoming,
) -> Result<Vec<serde_json::Value>, Response<Body>> {
    // multer stops at the closing boundary; whatever follows it (a final
    // CRLF, often sent in a packet of its own) is read and dropped after the
    // answer, so the connection is not closed under a sender still writing
    // it (the node would report that as a 502).
    let stream = BodyStream::new(crate::drain::DrainOnDrop::new(body))
        .try_filter_map(|frame| async move { Ok(frame.into_data().ok()) });
    upload_parts(jail, query, content_type, metadata, stream).await
}

/// A `multipart/form-data` upload whose body is `body`, whatever carries
/// it (the request's body; a fuzz target's bytes, [`fuzz_multipart`]).
async fn upload_parts<S, E>(
    jail: &Jail,
    query: &Query,
    content_type: &str,
    metadata: &BTreeMap<String, String>,
    body: S,
) -> Result<Vec<serde_json::Value>, Response<Body>>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: Into<Box<dyn std::error::Error + Send + Sync>> + 'static,
{
    let boundary = multer::parse_boundary(content_type).map_err(|e| {
        reply::error(
            StatusCode::BAD_REQUEST,
            format!("bad multipart Content-Type: {e}"),
        )
    })?;
    let mut multipart = multer::Multipart::new(body, boundary);
    let bad = |e: multer::Error| {
        reply::error(StatusCode::BAD_REQUEST, format!("bad multipart body: {e}"))
    };
    let mut written = Vec::new();
    let result: Result<(), Response<Body>> = async {
        while let Some(mut field) = multipart.next_field().await.map_err(bad)? {
            if field.name() != Some("file") && field.file_name().is_none() {
                continue;
            }
            let dest = match (&query.path, field.file_name()) {
                (Some(_), _) if !written.is_empty() => {
                    return Err(reply::error(
                        StatusCode::BAD_REQUEST,
                        "several files were sent with one path query parameter; name each file's path in its part instead",
                    ))
                }
                (Some(p), _) => p.clone(),
                (None, Some(name)) if !name.is_empty() => name.to_string(),
                (None, _) => {
                    return Err(reply::error(
                        StatusCode::BAD_REQUEST,
                        "a file part needs a file name (its destination) or the path query parameter",
                    ))
                }
            };
            let owner = owner_of(jail, query).map_err(unknown_user)?;
            let mut sink = Sink::open(jail, &dest, false, owner.as_ref(), metadata).await?;
            while let Some(chunk) = field.chunk().await.map_err(bad)? {
                sink.write(&chunk).await?;
            }
            written.push(sink.finish().await?);
        }
        Ok(())
    }
    .await;
    if let Err(answer) = result {
        // Read what the client is still sending (bounded) so it gets the
        // answer instead of a reset that could swallow it.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while let Ok(Some(mut field)) = multipart.next_field().await {
                while let Ok(Some(_)) = field.chunk().await {}
            }
        })
        .await;
        return Err(answer);
    }
    if written.is_empty() {
        return Err(reply::error(
            StatusCode::BAD_REQUEST,
            "the multipart body has no file part",
        ));
    }
    Ok(written)
}

/// A `multipart/form-data` upload of `body` under `content_type`, with
/// the `/files` query `query`, into `jail`: the status and answer a client
/// would get. For the fuzz targets (`fuzz/`); not an API.
#[doc(hidden)]
pub async fn fuzz_multipart(
    jail: &Jail,
    query: Option<&str>,
    content_type: &str,
    body: Vec<bytes::Bytes>,
) -> (StatusCode, Vec<serde_json::Value>) {
    let query = Query::parse(query);
    let stream = futures_util::stream::iter(body.into_iter().map(Ok::<_, std::io::Error>));
    match upload_parts(jail, &query, content_type, &BTreeMap::new(), stream).await {
        Ok(written) => (StatusCode::OK, written),
        Err(answer) => (answer.status(), Vec::new()),
    }
}

/// A file being written, optionally through a gzip decoder.
struct Sink {
    file: tokio::fs::File,
    client: String,
    gunzip: Option<flate2::write::GzDecoder<Vec<u8>>>,
    /// What the file's metadata now is, for the answer.
    metadata: BTreeMap<String, String>,
}

impl Sink {
    /// Opens `path` for writing with its metadata set to `metadata`. The
    /// metadata goes on before the old contents are truncated, so a file
    /// system that cannot keep it leaves an existing file as it was (and a
    /// new file is removed again): a 4xx, never half an upload.
    async fn open(
        jail: &Jail,
        path: &str,
        gzip: bool,
        owner: Option<&crate::users::Identity>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Sink, Response<Body>> {
        let r = jail
            .resolve_for(path, Follow::All, owner)
            .map_err(resolve_error)?;
        if let Ok(meta) = tokio::fs::metadata(&r.host).await {
            if meta.is_dir() {
                return Err(reply::error(
                    StatusCode::BAD_REQUEST,
                    format!("path {:?} is a directory", r.client),
                ));
            }
        }
        if let Some(parent) = r.host.parent() {
            crate::users::make_dirs(parent, owner).map_err(|e| io_response(&r.client, e))?;
        }
        let existed = tokio::fs::symlink_metadata(&r.host).await.is_ok();
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&r.host)
            .await
            .map_err(|e| io_response(&r.client, e))?;
        crate::users::give(&r.host, owner).map_err(|e| io_response(&r.client, e))?;
        if let Err(e) = crate::metadata::replace(&file, metadata) {
            if !existed {
                let _ = tokio::fs::remove_file(&r.host).await;
            }
            let status = if e.kind() == std::io::ErrorKind::Unsupported {
                StatusCode::BAD_REQUEST
            } else {
                return Err(io_response(&r.client, e));
            };
            return Err(reply::error(status, format!("{}: {e}", r.client)));
        }
        // A new file is empty already; truncating it would add a WRITE
        // event for directory watchers that nothing wrote.
        if existed {
            file.set_len(0)
                .await
                .map_err(|e| io_response(&r.client, e))?;
        }
        Ok(Sink {
            file,
            client: r.client,
            gunzip: gzip.then(|| flate2::write::GzDecoder::new(Vec::new())),
            metadata: metadata.clone(),
        })
    }

    async fn write(&mut self, data: &[u8]) -> Result<(), Response<Body>> {
        let plain = match self.gunzip.as_mut() {
            Some(dec) => {
                dec.write_all(data).map_err(gzip_error)?;
                std::mem::take(dec.get_mut())
            }
            None => data.to_vec(),
        };
        self.put(&plain).await
    }

    async fn put(&mut self, data: &[u8]) -> Result<(), Response<Body>> {
        self.file
            .write_all(data)
            .await
            .map_err(|e| io_response(&self.client, e))
    }

    async fn finish(mut self) -> Result<serde_json::Value, Response<Body>> {
        if let Some(dec) = self.gunzip.take() {
            let rest = dec.finish().map_err(gzip_error)?;
            self.put(&rest).await?;
        }
        self.file
            .flush()
            .await
            .map_err(|e| io_response(&self.client, e))?;
        let name = self
            .client
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let mut info = serde_json::json!({ "path": self.client, "name": name, "type": "file" });
        if !self.metadata.is_empty() {
            info["metadata"] = serde_json::json!(self.metadata);
        }
        Ok(info)
    }
}

fn gzip_error(e: std::io::Error) -> Response<Body> {
    reply::error(
        StatusCode::BAD_REQUEST,
        format!("the gzip upload body is invalid: {e}"),
    )
}
