//! `filesystem.Filesystem`: Stat, ListDir, MakeDir, Move, Remove.
//!
//! Paths are resolved under the sandbox root ([`crate::paths`]); entries name
//! paths as the sandbox sees them. The watcher RPCs answer `unimplemented`.
//! File system calls are blocking, so each RPC runs on the blocking pool.

use crate::entry::{entry_info, from_metadata, Names};
use crate::paths::{Follow, Jail, Resolved};
use crate::rpc_error::{io_error, path_error};
use connectrpc::{
    ConnectError, RequestContext, Response, ServiceRequest, ServiceResult, ServiceStream,
};
use std::sync::Arc;
use warren_envd_proto::filesystem::{
    CreateWatcherRequest, CreateWatcherResponse, EntryInfo, Filesystem, GetWatcherEventsRequest,
    GetWatcherEventsResponse, ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse,
    MoveRequest, MoveResponse, RemoveRequest, RemoveResponse, RemoveWatcherRequest,
    RemoveWatcherResponse, StatRequest, StatResponse, WatchDirRequest, WatchDirResponse,
};

/// Deepest ListDir recursion a client may ask for; deeper requests are cut
/// here rather than walking a whole disk.
const MAX_DEPTH: u32 = 64;

const NO_WATCH: &str =
    "directory watching is not supported by warren envd yet; poll with ListDir/Stat instead";

/// `filesystem.Filesystem` under a [`Jail`].
#[derive(Debug, Clone)]
pub struct FilesystemService {
    jail: Arc<Jail>,
}

impl FilesystemService {
    /// Serves the files under `jail`.
    pub fn new(jail: Arc<Jail>) -> FilesystemService {
        FilesystemService { jail }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Jail) -> Result<T, ConnectError> + Send + 'static,
    ) -> Result<T, ConnectError> {
        let jail = self.jail.clone();
        tokio::task::spawn_blocking(move || f(&jail))
            .await
            .map_err(|e| ConnectError::internal(format!("filesystem task failed: {e}")))?
    }
}

fn resolve(jail: &Jail, path: &str, follow: Follow) -> Result<Resolved, ConnectError> {
    jail.resolve(path, follow).map_err(path_error)
}

/// The user a request creates files as (see [`crate::users`]).
fn owner_of(
    jail: &Jail,
    user: Option<&str>,
) -> Result<Option<crate::users::Identity>, ConnectError> {
    jail.users()
        .lookup(user)
        .map_err(|e| ConnectError::invalid_argument(e.to_string()))
}

fn stat(jail: &Jail, r: &Resolved) -> Result<EntryInfo, ConnectError> {
    entry_info(jail, &r.host, &r.client, &mut Names::default()).map_err(|e| io_error(&r.client, e))
}

// Concrete return types are simpler to read than the trait's `impl Encodable`.
#[allow(refining_impl_trait)]
impl Filesystem for FilesystemService {
    async fn stat(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, StatRequest>,
    ) -> ServiceResult<StatResponse> {
        let path = request.path.to_string();
        let entry = self
            .blocking(move |jail| stat(jail, &resolve(jail, &path, Follow::NotLast)?))
            .await?;
        Response::ok(StatResponse {
            entry: entry.into(),
            ..Default::default()
        })
    }

    async fn make_dir(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, MakeDirRequest>,
    ) -> ServiceResult<MakeDirResponse> {
        let path = request.path.to_string();
        let user = crate::process::basic_user(&ctx);
        let entry = self
            .blocking(move |jail| {
                let r = resolve(jail, &path, Follow::All)?;
                match std::fs::metadata(&r.host) {
                    Ok(m) if m.is_dir() => {
                        return Err(ConnectError::already_exists(format!(
                            "directory {:?} already exists",
                            r.client
                        )))
                    }
                    Ok(_) => {
                        return Err(ConnectError::already_exists(format!(
                            "path {:?} already exists and is not a directory",
                            r.client
                        )))
                    }
                    Err(_) => {}
                }
                let owner = owner_of(jail, user.as_deref())?;
                crate::users::make_dirs(&r.host, owner.as_ref())
                    .map_err(|e| io_error(&r.client, e))?;
                stat(jail, &r)
            })
            .await?;
        Response::ok(MakeDirResponse {
            entry: entry.into(),
            ..Default::default()
        })
    }

    async fn r#move(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, MoveRequest>,
    ) -> ServiceResult<MoveResponse> {
        let (source, destination) = (request.source.to_string(), request.destination.to_string());
        let user = crate::process::basic_user(&ctx);
        let entry = self
            .blocking(move |jail| {
                let from = resolve(jail, &source, Follow::NotLast)?;
                let to = resolve(jail, &destination, Follow::NotLast)?;
                if from.client == "/" || to.client == "/" {
                    return Err(ConnectError::invalid_argument(
                        "cannot move the sandbox root",
                    ));
                }
                std::fs::symlink_metadata(&from.host).map_err(|e| io_error(&from.client, e))?;
                if let Some(parent) = to.host.parent() {
                    let owner = owner_of(jail, user.as_deref())?;
                    crate::users::make_dirs(parent, owner.as_ref())
                        .map_err(|e| io_error(&to.client, e))?;
                }
                std::fs::rename(&from.host, &to.host).map_err(|e| {
                    io_error(&format!("moving {} to {}", from.client, to.client), e)
                })?;
                stat(jail, &to)
            })
            .await?;
        Response::ok(MoveResponse {
            entry: entry.into(),
            ..Default::default()
        })
    }

    async fn list_dir(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, ListDirRequest>,
    ) -> ServiceResult<ListDirResponse> {
        let path = request.path.to_string();
        // E2B treats 0 (unset) as 1: the directory's own entries.
        let depth = request.depth.clamp(1, MAX_DEPTH);
        let entries = self
            .blocking(move |jail| {
                let dir = resolve(jail, &path, Follow::All)?;
                let meta = std::fs::metadata(&dir.host).map_err(|e| io_error(&dir.client, e))?;
                if !meta.is_dir() {
                    return Err(ConnectError::invalid_argument(format!(
                        "path {:?} is not a directory",
                        dir.client
                    )));
                }
                let mut out = Vec::new();
                walk(jail, &dir, depth, &mut Names::default(), &mut out)?;
                Ok(out)
            })
            .await?;
        Response::ok(ListDirResponse {
            entries,
            ..Default::default()
        })
    }

    async fn remove(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, RemoveRequest>,
    ) -> ServiceResult<RemoveResponse> {
        let path = request.path.to_string();
        self.blocking(move |jail| {
            let r = resolve(jail, &path, Follow::NotLast)?;
            if r.client == "/" {
                return Err(ConnectError::invalid_argument(
                    "refusing to remove the sandbox root",
                ));
            }
            let meta = std::fs::symlink_metadata(&r.host).map_err(|e| io_error(&r.client, e))?;
            let res = if meta.is_dir() {
                std::fs::remove_dir_all(&r.host)
            } else {
                std::fs::remove_file(&r.host)
            };
            res.map_err(|e| io_error(&r.client, e))
        })
        .await?;
        Response::ok(RemoveResponse::default())
    }

    async fn watch_dir(
        &self,
        _ctx: RequestContext,
        _request: ServiceRequest<'_, WatchDirRequest>,
    ) -> ServiceResult<ServiceStream<WatchDirResponse>> {
        Err(ConnectError::unimplemented(NO_WATCH))
    }

    async fn create_watcher(
        &self,
        _ctx: RequestContext,
        _request: ServiceRequest<'_, CreateWatcherRequest>,
    ) -> ServiceResult<CreateWatcherResponse> {
        Err(ConnectError::unimplemented(NO_WATCH))
    }

    async fn get_watcher_events(
        &self,
        _ctx: RequestContext,
        _request: ServiceRequest<'_, GetWatcherEventsRequest>,
    ) -> ServiceResult<GetWatcherEventsResponse> {
        Err(ConnectError::unimplemented(NO_WATCH))
    }

    async fn remove_watcher(
        &self,
        _ctx: RequestContext,
        _request: ServiceRequest<'_, RemoveWatcherRequest>,
    ) -> ServiceResult<RemoveWatcherResponse> {
        Err(ConnectError::unimplemented(NO_WATCH))
    }
}

/// Lists `dir`, descending into subdirectories (never through symlinks)
/// while `depth` allows. Entries are sorted by name at each level.
fn walk(
    jail: &Jail,
    dir: &Resolved,
    depth: u32,
    names: &mut Names,
    out: &mut Vec<EntryInfo>,
) -> Result<(), ConnectError> {
    let read = std::fs::read_dir(&dir.host).map_err(|e| io_error(&dir.client, e))?;
    let mut children: Vec<_> = read.filter_map(Result::ok).collect();
    children.sort_by_key(|e| e.file_name());
    for child in children {
        let name = child.file_name().to_string_lossy().into_owned();
        let client = if dir.client == "/" {
            format!("/{name}")
        } else {
            format!("{}/{name}", dir.client)
        };
        let host = child.path();
        // Entries can vanish while we list; skip those rather than fail.
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        out.push(from_metadata(jail, &host, &client, &meta, names));
        if depth > 1 && meta.is_dir() {
            let sub = Resolved { host, client };
            // An unreadable subdirectory does not spoil the listing.
            let _ = walk(jail, &sub, depth - 1, names, out);
        }
    }
    Ok(())
}
