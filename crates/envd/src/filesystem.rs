//! `filesystem.Filesystem`: Stat, ListDir, MakeDir, Move, Remove, and
//! directory watching ([`crate::watch`]): the `WatchDir` stream, and
//! `CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher` for clients that poll.
//!
//! Paths are resolved under the sandbox root ([`crate::paths`]); entries name
//! paths as the sandbox sees them. Removing a path that does not exist is
//! not an error (as in E2B's envd). File system calls are blocking, so each
//! RPC runs on the blocking pool.

use crate::entry::{entry_info, from_metadata, Names};
use crate::paths::{Follow, Jail, Resolved};
use crate::rpc_error::{io_error, path_error};
use crate::watch::{WatchError, Watcher};
use connectrpc::{
    ConnectError, RequestContext, Response, ServiceRequest, ServiceResult, ServiceStream,
};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};
use warren_envd_proto::filesystem::watch_dir_response::Event as WatchEvent;
use warren_envd_proto::filesystem::{
    CreateWatcherRequest, CreateWatcherResponse, EntryInfo, Filesystem, GetWatcherEventsRequest,
    GetWatcherEventsResponse, ListDirRequest, ListDirResponse, MakeDirRequest, MakeDirResponse,
    MoveRequest, MoveResponse, RemoveRequest, RemoveResponse, RemoveWatcherRequest,
    RemoveWatcherResponse, StatRequest, StatResponse, WatchDirRequest, WatchDirResponse,
};

/// Deepest ListDir recursion a client may ask for; deeper requests are cut
/// here rather than walking a whole disk.
const MAX_DEPTH: u32 = 64;

/// Most watchers made with `CreateWatcher` that may exist at once (each
/// holds a kernel inotify instance until `RemoveWatcher`).
pub const MAX_WATCHERS: usize = 128;

/// Polled watchers by id, each with the task that reads its events.
type Watchers = HashMap<String, (Arc<Watcher>, tokio::task::AbortHandle)>;

/// `filesystem.Filesystem` under a [`Jail`].
#[derive(Debug, Clone)]
pub struct FilesystemService {
    jail: Arc<Jail>,
    /// Watchers made with `CreateWatcher`, by id, with the task that reads
    /// their events.
    watchers: Arc<Mutex<Watchers>>,
    /// Keepalive interval of `WatchDir` streams when the client names none.
    keepalive: Duration,
}

impl FilesystemService {
    /// Serves the files under `jail`; `WatchDir` streams send a keepalive
    /// after `keepalive` of quiet unless the client asks for another interval.
    pub fn new(jail: Arc<Jail>, keepalive: Duration) -> FilesystemService {
        FilesystemService {
            jail,
            watchers: Arc::default(),
            keepalive,
        }
    }

    fn watchers(&self) -> MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a watch of `path` after checking it is a directory (on the
    /// blocking pool: a recursive watch walks the tree below).
    async fn watch(
        &self,
        path: String,
        user: Option<String>,
        recursive: bool,
        include_entry: bool,
    ) -> Result<Arc<Watcher>, ConnectError> {
        let shared = self.jail.clone();
        self.blocking(move |jail| {
            let dir = resolve(jail, &path, Follow::All, user.as_deref())?;
            let meta = std::fs::metadata(&dir.host).map_err(|e| io_error(&dir.client, e))?;
            if !meta.is_dir() {
                return Err(ConnectError::invalid_argument(format!(
                    "path {:?} is not a directory; watch its directory instead",
                    dir.client
                )));
            }
            Watcher::start(shared, dir.host, dir.client, recursive, include_entry)
                .map_err(watch_error)
        })
        .await
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

fn watch_error(e: WatchError) -> ConnectError {
    match e {
        WatchError::Exhausted(m) => ConnectError::resource_exhausted(m),
        WatchError::Lost(m) => ConnectError::data_loss(m),
        WatchError::Io(m) => ConnectError::internal(m),
    }
}

/// `path` as the request's `user` names it: relative paths and `~` start
/// at that user's home (see [`Jail::resolve_for`]).
fn resolve(
    jail: &Jail,
    path: &str,
    follow: Follow,
    user: Option<&str>,
) -> Result<Resolved, ConnectError> {
    let who = owner_of(jail, user)?;
    jail.resolve_for(path, follow, who.as_ref())
        .map_err(path_error)
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
        ctx: RequestContext,
        request: ServiceRequest<'_, StatRequest>,
    ) -> ServiceResult<StatResponse> {
        let path = request.path.to_string();
        let user = crate::process::basic_user(&ctx);
        let entry = self
            .blocking(move |jail| {
                stat(
                    jail,
                    &resolve(jail, &path, Follow::NotLast, user.as_deref())?,
                )
            })
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
                let r = resolve(jail, &path, Follow::All, user.as_deref())?;
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
                let from = resolve(jail, &source, Follow::NotLast, user.as_deref())?;
                let to = resolve(jail, &destination, Follow::NotLast, user.as_deref())?;
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
        ctx: RequestContext,
        request: ServiceRequest<'_, ListDirRequest>,
    ) -> ServiceResult<ListDirResponse> {
        let path = request.path.to_string();
        let user = crate::process::basic_user(&ctx);
        // E2B treats 0 (unset) as 1: the directory's own entries.
        let depth = request.depth.clamp(1, MAX_DEPTH);
        let entries = self
            .blocking(move |jail| {
                let dir = resolve(jail, &path, Follow::All, user.as_deref())?;
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
        ctx: RequestContext,
        request: ServiceRequest<'_, RemoveRequest>,
    ) -> ServiceResult<RemoveResponse> {
        let path = request.path.to_string();
        let user = crate::process::basic_user(&ctx);
        self.blocking(move |jail| {
            let r = resolve(jail, &path, Follow::NotLast, user.as_deref())?;
            if r.client == "/" {
                return Err(ConnectError::invalid_argument(
                    "refusing to remove the sandbox root",
                ));
            }
            let meta = match std::fs::symlink_metadata(&r.host) {
                Ok(meta) => meta,
                // Already gone: what the caller wanted.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(io_error(&r.client, e)),
            };
            let res = if meta.is_dir() {
                std::fs::remove_dir_all(&r.host)
            } else {
                std::fs::remove_file(&r.host)
            };
            match res {
                // Removed by someone else meanwhile: gone all the same.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                res => res.map_err(|e| io_error(&r.client, e)),
            }
        })
        .await?;
        Response::ok(RemoveResponse::default())
    }

    async fn watch_dir(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, WatchDirRequest>,
    ) -> ServiceResult<ServiceStream<WatchDirResponse>> {
        let req = request.to_owned_message();
        // `allow_network_mounts` needs nothing: warren's sandboxes have no
        // network file systems to refuse.
        let watcher = self
            .watch(
                req.path,
                crate::process::basic_user(&ctx),
                req.recursive,
                req.include_entry,
            )
            .await?;
        let keepalive = crate::process::keepalive_of(&ctx).unwrap_or(self.keepalive);
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(stream_events(watcher, keepalive, tx));
        Response::stream_ok(tokio_stream::wrappers::ReceiverStream::new(rx).map(|r| r))
    }

    async fn create_watcher(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, CreateWatcherRequest>,
    ) -> ServiceResult<CreateWatcherResponse> {
        let req = request.to_owned_message();
        if self.watchers().len() >= MAX_WATCHERS {
            return Err(ConnectError::resource_exhausted(format!(
                "{MAX_WATCHERS} watchers exist already; remove some with RemoveWatcher"
            )));
        }
        let watcher = self
            .watch(
                req.path,
                crate::process::basic_user(&ctx),
                req.recursive,
                req.include_entry,
            )
            .await?;
        let id = format!("w{:016x}", rand_id());
        let pump = tokio::spawn(watcher.clone().pump()).abort_handle();
        self.watchers().insert(id.clone(), (watcher, pump));
        Response::ok(CreateWatcherResponse {
            watcher_id: id,
            ..Default::default()
        })
    }

    async fn get_watcher_events(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, GetWatcherEventsRequest>,
    ) -> ServiceResult<GetWatcherEventsResponse> {
        let id = request.watcher_id.to_string();
        let watcher = self
            .watchers()
            .get(&id)
            .map(|(w, _)| w.clone())
            .ok_or_else(|| ConnectError::not_found(format!("watcher {id:?} not found")))?;
        let events = self
            .blocking(move |_| watcher.take().map_err(watch_error))
            .await?;
        Response::ok(GetWatcherEventsResponse {
            events,
            ..Default::default()
        })
    }

    async fn remove_watcher(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, RemoveWatcherRequest>,
    ) -> ServiceResult<RemoveWatcherResponse> {
        let id = request.watcher_id.to_string();
        let (_, pump) = self
            .watchers()
            .remove(&id)
            .ok_or_else(|| ConnectError::not_found(format!("watcher {id:?} not found")))?;
        pump.abort();
        Response::ok(RemoveWatcherResponse::default())
    }
}

/// A watcher id nobody can guess from another's.
fn rand_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

type WatchTx = tokio::sync::mpsc::Sender<Result<WatchDirResponse, ConnectError>>;

/// One `WatchDir` stream: the start event, then events as they come, with
/// a keepalive after each quiet interval, until the client goes away or
/// the watch fails.
async fn stream_events(watcher: Arc<Watcher>, keepalive: Duration, tx: WatchTx) {
    let send = |event: WatchEvent| WatchDirResponse {
        event: Some(event),
        ..Default::default()
    };
    if tx
        .send(Ok(send(WatchEvent::Start(Box::default()))))
        .await
        .is_err()
    {
        return;
    }
    let mut tick = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        // Only waiting happens under `select!`: events are taken after it,
        // so a keepalive winning the race can never drop any.
        tokio::select! {
            _ = tx.closed() => return,
            _ = tick.tick() => {
                if tx.send(Ok(send(WatchEvent::Keepalive(Box::default())))).await.is_err() {
                    return;
                }
                continue;
            }
            ready = watcher.readable() => {
                if let Err(e) = ready {
                    let _ = tx.send(Err(watch_error(e))).await;
                    return;
                }
            }
        }
        let events = match watcher.take_blocking().await {
            Ok(events) => events,
            Err(e) => {
                let _ = tx.send(Err(watch_error(e))).await;
                return;
            }
        };
        if events.is_empty() {
            continue;
        }
        for ev in events {
            if tx
                .send(Ok(send(WatchEvent::Filesystem(Box::new(ev)))))
                .await
                .is_err()
            {
                return;
            }
        }
        tick.reset();
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
