//! The node's volume endpoints (`warren_core::node_api::volumes`): make
//! and remove a volume's data, and E2B's content calls, which a gateway
//! forwards as the client sent them (query and body).
//!
//! Bodies stream both ways: a download is read from the file in chunks as
//! the client takes them, an upload written as it arrives (through a
//! bounded channel to a writer thread), never held whole. An answer given
//! before an upload's body is read (a bad path, a full volume) still
//! reads and discards the rest in the background, so the client gets it.

use super::fs::{self, FsError, Owner, VPath};
use super::{VolumeError, VolumeStore};
use crate::http::not_found_marker;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use warren_core::body::{error, json, Body};
use warren_core::node_api::volumes::{EnsureVolume, VOLUMES};
use warren_core::server::Incoming;

/// Largest JSON body of a metadata update.
const MAX_JSON: usize = 64 * 1024;
/// Bytes per read of a download.
const CHUNK: usize = 256 * 1024;
/// Chunks in flight between the network and a file, each way.
const IN_FLIGHT: usize = 8;

/// Answers `/_warren/v1/volumes/...`.
pub async fn handle(store: Option<&Arc<VolumeStore>>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let rest = path.strip_prefix(VOLUMES).unwrap_or("");
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let Some(store) = store else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node has no volume store (see its start log)",
        );
    };
    let method = req.method().clone();
    match (method, parts.as_slice()) {
        (Method::PUT, [id]) => {
            let id = id.to_string();
            let body = match warren_core::body::read_limited(req.into_body(), MAX_JSON).await {
                Ok(b) => b,
                Err(e) => return error(e.status(), e),
            };
            let ask: EnsureVolume = if body.iter().all(u8::is_ascii_whitespace) {
                EnsureVolume::default()
            } else {
                match serde_json::from_slice(&body) {
                    Ok(a) => a,
                    Err(e) => {
                        return error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}"))
                    }
                }
            };
            let store = store.clone();
            match blocking(move || store.ensure(&id, ask.max_bytes)).await {
                Ok(info) => json(StatusCode::OK, &info),
                Err(e) => volume_error(e),
            }
        }
        (Method::DELETE, [id]) => {
            let (store, id) = (store.clone(), id.to_string());
            match blocking(move || store.remove(&id)).await {
                Ok(()) => warren_core::body::status(StatusCode::NO_CONTENT),
                Err(e) => volume_error(e),
            }
        }
        (_, [id, op @ ("path" | "dir" | "file")]) => content(store, id, op, req).await,
        (m, _) => error(
            StatusCode::NOT_FOUND,
            format!("no volume endpoint {m} {path}"),
        ),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, VolumeError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(VolumeError::Store(format!("the volume task failed: {e}"))))
}

fn volume_error(e: VolumeError) -> Response<Body> {
    match e {
        VolumeError::NotHeld { .. } => not_found_marker(e),
        VolumeError::BadRequest(m) => error(StatusCode::BAD_REQUEST, m),
        VolumeError::Store(m) => {
            tracing::error!(error = %m, "volume store");
            error(StatusCode::INTERNAL_SERVER_ERROR, m)
        }
    }
}

/// The query's parameters (the first of each name).
fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
        out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    out
}

fn number(q: &HashMap<String, String>, name: &str) -> Result<Option<u32>, FsError> {
    q.get(name)
        .map(|v| {
            v.parse::<u32>().map_err(|_| {
                FsError::BadRequest(format!("{name} {v:?} is not a non-negative integer"))
            })
        })
        .transpose()
}

fn flag(q: &HashMap<String, String>, name: &str) -> Result<bool, FsError> {
    match q.get(name).map(String::as_str) {
        None | Some("false" | "0" | "") => Ok(false),
        Some("true" | "1") => Ok(true),
        Some(v) => Err(FsError::BadRequest(format!(
            "{name} {v:?} is not true or false"
        ))),
    }
}

/// One content call on volume `id` (see the module doc).
async fn content(
    store: &Arc<VolumeStore>,
    id: &str,
    op: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    // Identity first, before any of the body is read: a node that does
    // not hold the volume says so with the stale-route marker.
    let root = {
        let (store, id) = (store.clone(), id.to_string());
        match blocking(move || store.root(&id)).await {
            Ok(fd) => Arc::new(fd),
            Err(e) => return volume_error(e),
        }
    };
    let q = query(&req);
    let method = req.method().clone();
    let answer = async move {
        let path =
            VPath::parse(q.get("path").map(String::as_str).ok_or_else(|| {
                FsError::BadRequest("the query needs a path (?path=/...)".into())
            })?)?;
        Ok::<_, FsError>(match (method.clone(), op) {
            (Method::GET, "path") => json(
                StatusCode::OK,
                &run(&root, move |r| fs::stat(r, &path)).await?,
            ),
            (Method::PATCH, "path") => {
                let body = warren_core::body::read_limited(req.into_body(), MAX_JSON)
                    .await
                    .map_err(|e| FsError::BadRequest(e.to_string()))?;
                let m: Metadata = serde_json::from_slice(&body)
                    .map_err(|e| FsError::BadRequest(format!("invalid JSON body: {e}")))?;
                let e = run(&root, move |r| fs::update(r, &path, m.uid, m.gid, m.mode)).await?;
                json(StatusCode::OK, &e)
            }
            (Method::DELETE, "path") => {
                run(&root, move |r| fs::remove(r, &path)).await?;
                warren_core::body::status(StatusCode::NO_CONTENT)
            }
            (Method::GET, "dir") => {
                let depth = number(&q, "depth")?.unwrap_or(1);
                json(
                    StatusCode::OK,
                    &run(&root, move |r| fs::list(r, &path, depth)).await?,
                )
            }
            (Method::POST, "dir") => {
                let owner = Owner::new(
                    number(&q, "uid")?,
                    number(&q, "gid")?,
                    number(&q, "mode")?,
                    0o755,
                )?;
                let force = flag(&q, "force")?;
                let e = run(&root, move |r| fs::make_dir(r, &path, owner, force)).await?;
                json(StatusCode::CREATED, &e)
            }
            (Method::GET, "file") => download(&root, path).await?,
            (Method::PUT, "file") => {
                let owner = Owner::new(
                    number(&q, "uid")?,
                    number(&q, "gid")?,
                    number(&q, "mode")?,
                    0o644,
                )?;
                // `force` is accepted: a file is always replaced (E2B's SDKs
                // say so); a directory in its place never is.
                flag(&q, "force")?;
                let e = upload(&root, path, owner, req.into_body()).await?;
                json(StatusCode::CREATED, &e)
            }
            (m, op) => {
                return Ok(error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    format!("{m} is not allowed on /volumecontent/{{id}}/{op}"),
                ))
            }
        })
    }
    .await;
    match answer {
        Ok(r) => r,
        Err(e) => fs_error(store, id, e),
    }
}

/// `PATCH /path` body.
#[derive(serde::Deserialize)]
struct Metadata {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

async fn run<T: Send + 'static>(
    root: &Arc<OwnedFd>,
    f: impl FnOnce(&OwnedFd) -> Result<T, FsError> + Send + 'static,
) -> Result<T, FsError> {
    let root = root.clone();
    tokio::task::spawn_blocking(move || f(&root))
        .await
        .unwrap_or_else(|e| Err(FsError::Internal(format!("the volume task failed: {e}"))))
}

fn fs_error(store: &VolumeStore, id: &str, e: FsError) -> Response<Body> {
    let status = match &e {
        FsError::NotFound(_) => StatusCode::NOT_FOUND,
        FsError::BadRequest(_) => StatusCode::BAD_REQUEST,
        FsError::Conflict(_) => StatusCode::CONFLICT,
        FsError::Forbidden(_) => StatusCode::FORBIDDEN,
        FsError::NoSpace(what) => {
            let limit = store.limit(id);
            let message = if limit > 0 {
                format!(
                    "volume {id} is full: it holds at most {limit} bytes (the size limit \
                     volumes get, --volume-max-bytes); cannot {what}"
                )
            } else {
                format!(
                    "volume {id} is full: the shared filesystem holding it has no room (or \
                     its quota is reached); cannot {what}"
                )
            };
            return error(StatusCode::INSUFFICIENT_STORAGE, message);
        }
        FsError::Internal(m) => {
            tracing::error!(volume = id, error = %m, "volume content call failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    error(status, e)
}

/// `GET /file`: the file, streamed as the client reads it.
async fn download(root: &Arc<OwnedFd>, path: VPath) -> Result<Response<Body>, FsError> {
    let (file, size) = run(root, move |r| fs::open_file(r, &path)).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut file = file;
        loop {
            let mut buf = vec![0u8; CHUNK];
            let n = match file.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            };
            buf.truncate(n);
            if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                // The client went away.
                return;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .map(|r| {
        r.map(hyper::body::Frame::data)
            .map_err(warren_core::body::BoxError::from)
    });
    let mut resp = Response::new(warren_core::body::boxed(http_body_util::StreamBody::new(
        stream,
    )));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    Ok(resp)
}

/// `PUT /file`: writes the body into `path` as it arrives.
async fn upload(
    root: &Arc<OwnedFd>,
    path: VPath,
    owner: Owner,
    mut body: Incoming,
) -> Result<fs::Entry, FsError> {
    let up = {
        let path = path.clone();
        run(root, move |r| fs::start_upload(r, &path, owner)).await
    };
    let up = match up {
        Ok(up) => up,
        Err(e) => {
            drain(body);
            return Err(e);
        }
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(IN_FLIGHT);
    let writer = tokio::task::spawn_blocking(move || {
        let mut up = up;
        while let Some(chunk) = rx.blocking_recv() {
            up.write(&chunk)?;
        }
        Ok::<_, FsError>(up)
    });
    let mut cut = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(data) = f.into_data() {
                    if tx.send(data).await.is_err() {
                        // The writer stopped (a full volume): answer now,
                        // and read what is left in the background.
                        drain(body);
                        break;
                    }
                }
            }
            Err(e) => {
                cut = Some(e);
                break;
            }
        }
    }
    drop(tx);
    let up = writer
        .await
        .unwrap_or_else(|e| Err(FsError::Internal(format!("the upload task failed: {e}"))))?;
    if let Some(e) = cut {
        // Dropping the upload removes its temporary file.
        drop(up);
        return Err(FsError::BadRequest(format!(
            "the upload of {} was cut off: {e}",
            path.display()
        )));
    }
    tokio::task::spawn_blocking(move || up.finish())
        .await
        .unwrap_or_else(|e| Err(FsError::Internal(format!("the upload task failed: {e}"))))
}

/// Reads and discards what is left of `body` in the background.
fn drain(mut body: Incoming) {
    tokio::spawn(async move { while let Some(Ok(_)) = body.frame().await {} });
}
