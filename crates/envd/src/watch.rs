//! Directory watching (`WatchDir`, and `CreateWatcher`/`GetWatcherEvents`/
//! `RemoveWatcher` for clients that poll), on inotify, with E2B's events:
//!
//! | inotify | event |
//! |---|---|
//! | `IN_CREATE`, `IN_MOVED_TO` | `CREATE` |
//! | `IN_MODIFY` | `WRITE` |
//! | `IN_DELETE` | `REMOVE` |
//! | `IN_MOVED_FROM` | `RENAME` |
//! | `IN_ATTRIB` (mode, owner, times, xattrs) | `CHMOD` |
//!
//! An event's `name` is the path relative to the watched directory
//! (`sub/file.txt` for a recursive watch). With `include_entry`, events for
//! a path that still exists carry its `EntryInfo`, read when envd handles
//! the event.
//!
//! A recursive watch adds every directory below, never through symlinks,
//! and each directory created (or moved in) later the moment its event is
//! read; what such a directory already holds by then is reported as
//! `CREATE`, so nothing made in it before the watch caught up goes unseen.
//!
//! Events are read from the kernel by a task as they come and kept in a
//! bounded queue ([`MAX_QUEUED`]); `GetWatcherEvents` also reads whatever
//! the kernel has queued at the moment it is asked, so a change that
//! finished before the call is always in its answer. A queue that
//! overflows (here or in the kernel) fails the watcher with a message
//! saying events were lost, rather than silently skipping them.

use crate::entry::{entry_info, Names};
use crate::paths::Jail;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::unix::AsyncFd;
use warren_envd_proto::filesystem::{EventType, FilesystemEvent};

/// Most events a watcher keeps for a client that has not collected them.
pub const MAX_QUEUED: usize = 65_536;

/// Most directories one recursive watch covers (inotify watches are a
/// per-user kernel resource).
pub const MAX_DIRS: usize = 65_536;

/// What a watch reports on for each directory.
fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_ONLYDIR
}

/// Why a watch could not start or stopped.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WatchError {
    /// The kernel's inotify limits (instances or watches) are used up.
    #[error("{0}")]
    Exhausted(String),
    /// Events were lost; the client must rescan and watch again.
    #[error("{0}")]
    Lost(String),
    /// Anything else from the system.
    #[error("{0}")]
    Io(String),
}

/// One watch of one directory (and, if recursive, all below it).
pub struct Watcher {
    inotify: Inotify,
    /// A second descriptor of the same inotify instance, for the reactor
    /// to say when events are there (they are read through `inotify`).
    ready: AsyncFd<OwnedFd>,
    state: Mutex<State>,
    jail: Arc<Jail>,
    /// The watched directory as the client names it.
    root_client: String,
    include_entry: bool,
}

struct State {
    /// Each watched directory, relative to the root ("" for the root).
    dirs: HashMap<WatchDescriptor, String>,
    root_host: PathBuf,
    recursive: bool,
    queue: VecDeque<FilesystemEvent>,
    /// Set once events were lost; the watcher is then dead.
    failed: Option<WatchError>,
    /// Entries `add_tree` found in a directory that just appeared.
    found: Vec<String>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("root", &self.root_client)
            .finish_non_exhaustive()
    }
}

fn io_err(what: &str, e: nix::Error) -> WatchError {
    match e {
        nix::Error::EMFILE | nix::Error::ENOSPC | nix::Error::ENFILE => {
            WatchError::Exhausted(format!(
                "{what}: the kernel's inotify limit is reached ({e}); remove other watchers, \
                 or watch fewer directories"
            ))
        }
        e => WatchError::Io(format!("{what}: {e}")),
    }
}

impl Watcher {
    /// Starts watching the directory `host` (named `client`), which the
    /// caller checked is a directory inside the jail.
    pub fn start(
        jail: Arc<Jail>,
        host: PathBuf,
        client: String,
        recursive: bool,
        include_entry: bool,
    ) -> Result<Arc<Watcher>, WatchError> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| io_err("starting a watch", e))?;
        let wd = inotify
            .add_watch(&host, mask())
            .map_err(|e| io_err(&format!("watching {client}"), e))?;
        let mut state = State {
            dirs: HashMap::from([(wd, String::new())]),
            root_host: host.clone(),
            recursive,
            queue: VecDeque::new(),
            failed: None,
            found: Vec::new(),
        };
        let ready = inotify
            .as_fd()
            .try_clone_to_owned()
            .and_then(warren_sys::async_fd)
            .map_err(|e| WatchError::Io(format!("starting a watch: {e}")))?;
        if recursive {
            add_tree(&inotify, &mut state, &host, "", false)?;
        }
        Ok(Arc::new(Watcher {
            inotify,
            ready,
            state: Mutex::new(state),
            jail,
            root_client: client,
            include_entry,
        }))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves what the kernel has queued into the watcher's queue.
    fn drain(&self) {
        let inotify = &self.inotify;
        let mut state = self.state();
        if state.failed.is_some() {
            return;
        }
        loop {
            let events = match inotify.read_events() {
                Ok(events) => events,
                Err(nix::Error::EAGAIN) => return,
                Err(e) => {
                    state.failed = Some(WatchError::Io(format!("reading watch events: {e}")));
                    return;
                }
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    state.failed = Some(WatchError::Lost(
                        "the kernel's event queue overflowed and events were lost; list the \
                         directory again and start a new watch"
                            .into(),
                    ));
                    return;
                }
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    state.dirs.remove(&ev.wd);
                    continue;
                }
                let Some(dir) = state.dirs.get(&ev.wd).cloned() else {
                    continue;
                };
                let Some(name) = ev.name.as_ref().map(|n| n.to_string_lossy().into_owned()) else {
                    continue;
                };
                let rel = if dir.is_empty() {
                    name
                } else {
                    format!("{dir}/{name}")
                };
                let is_dir = ev.mask.contains(AddWatchFlags::IN_ISDIR);
                let kinds = kinds(ev.mask);
                for kind in &kinds {
                    self.push(&mut state, &rel, *kind);
                }
                if state.recursive && is_dir {
                    if ev
                        .mask
                        .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
                    {
                        forget_tree(inotify, &mut state, &rel);
                    }
                    if ev
                        .mask
                        .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                    {
                        let host = state.root_host.join(&rel);
                        if let Err(e) = add_tree(inotify, &mut state, &host, &rel, true) {
                            state.failed = Some(e);
                            return;
                        }
                        // What the new directory already holds.
                        let found: Vec<String> = state.found.drain(..).collect();
                        for rel in found {
                            self.push(&mut state, &rel, EventType::EVENT_TYPE_CREATE);
                        }
                    }
                }
                if state.queue.len() > MAX_QUEUED {
                    state.queue.clear();
                    state.failed = Some(WatchError::Lost(format!(
                        "more than {MAX_QUEUED} events were not collected and were dropped; list \
                         the directory again and start a new watch"
                    )));
                    return;
                }
            }
        }
    }

    fn push(&self, state: &mut State, rel: &str, kind: EventType) {
        let entry = if self.include_entry && kind != EventType::EVENT_TYPE_REMOVE {
            let host = state.root_host.join(rel);
            let client = if self.root_client == "/" {
                format!("/{rel}")
            } else {
                format!("{}/{rel}", self.root_client)
            };
            entry_info(&self.jail, &host, &client, &mut Names::default()).ok()
        } else {
            None
        };
        state.queue.push_back(FilesystemEvent {
            name: rel.to_string(),
            r#type: kind.into(),
            entry: entry.into(),
            ..Default::default()
        });
    }

    /// Everything that happened since the last call (reading the kernel's
    /// queue first), or the error that ended the watch.
    pub fn take(&self) -> Result<Vec<FilesystemEvent>, WatchError> {
        self.drain();
        let mut state = self.state();
        if let Some(e) = &state.failed {
            return Err(e.clone());
        }
        Ok(state.queue.drain(..).collect())
    }

    /// Waits until the kernel has events for this watch. Cancel safe: it
    /// takes nothing, so call [`take_blocking`](Self::take_blocking) after.
    pub async fn readable(&self) -> Result<(), WatchError> {
        let mut ready = self
            .ready
            .readable()
            .await
            .map_err(|e| WatchError::Io(format!("waiting for watch events: {e}")))?;
        // Cleared before the events are read (which reads until EAGAIN):
        // whatever comes after that makes it ready again.
        ready.clear_ready();
        Ok(())
    }

    /// [`take`](Self::take) on the blocking pool: reading events (`stat`
    /// for entry info, walking a new directory) is file system work.
    pub async fn take_blocking(self: &Arc<Self>) -> Result<Vec<FilesystemEvent>, WatchError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.take())
            .await
            .map_err(|e| WatchError::Io(format!("reading watch events: {e}")))?
    }

    /// Reads events into the queue as they come, until the watch fails (the
    /// owner aborts it when the watcher is removed): a polled watcher then
    /// never lets the kernel's queue overflow, and recursive watches catch
    /// new directories at once.
    pub async fn pump(self: Arc<Self>) {
        loop {
            let Ok(mut ready) = self.ready.readable().await else {
                return;
            };
            ready.clear_ready();
            drop(ready);
            let me = self.clone();
            let failed = tokio::task::spawn_blocking(move || {
                me.drain();
                me.state().failed.is_some()
            })
            .await;
            if !matches!(failed, Ok(false)) {
                return;
            }
        }
    }
}

/// The E2B event types one inotify event stands for (fsnotify's order).
fn kinds(mask: AddWatchFlags) -> Vec<EventType> {
    let mut out = Vec::new();
    if mask.intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO) {
        out.push(EventType::EVENT_TYPE_CREATE);
    }
    if mask.contains(AddWatchFlags::IN_MOVED_FROM) {
        out.push(EventType::EVENT_TYPE_RENAME);
    }
    if mask.contains(AddWatchFlags::IN_ATTRIB) {
        out.push(EventType::EVENT_TYPE_CHMOD);
    }
    if mask.contains(AddWatchFlags::IN_MODIFY) {
        out.push(EventType::EVENT_TYPE_WRITE);
    }
    if mask.contains(AddWatchFlags::IN_DELETE) {
        out.push(EventType::EVENT_TYPE_REMOVE);
    }
    out
}

/// Watches `host` (named `rel` under the root) and every directory below
/// it, never through symlinks. With `report`, the entries found below are
/// noted in `state.found` (as `rel` paths) for `CREATE` events.
fn add_tree(
    inotify: &Inotify,
    state: &mut State,
    host: &Path,
    rel: &str,
    report: bool,
) -> Result<(), WatchError> {
    let mut todo = vec![(host.to_path_buf(), rel.to_string(), !rel.is_empty())];
    while let Some((dir, rel, add)) = todo.pop() {
        if add {
            if state.dirs.len() >= MAX_DIRS {
                return Err(WatchError::Exhausted(format!(
                    "a recursive watch covers at most {MAX_DIRS} directories"
                )));
            }
            match inotify.add_watch(&dir, mask() | AddWatchFlags::IN_DONT_FOLLOW) {
                Ok(wd) => {
                    state.dirs.insert(wd, rel.clone());
                }
                // Gone again, or replaced by something else: nothing to watch.
                Err(nix::Error::ENOENT) | Err(nix::Error::ENOTDIR) => continue,
                Err(e) => return Err(io_err(&format!("watching {rel}"), e)),
            }
        }
        let Ok(read) = std::fs::read_dir(&dir) else {
            continue;
        };
        for child in read.flatten() {
            let name = child.file_name().to_string_lossy().into_owned();
            let child_rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if report {
                state.found.push(child_rel.clone());
            }
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push((child.path(), child_rel, true));
            }
        }
    }
    Ok(())
}

/// Stops watching `rel` and everything below it (it was removed or moved
/// away; a directory moved back in is watched again under its new name).
fn forget_tree(inotify: &Inotify, state: &mut State, rel: &str) {
    let below = format!("{rel}/");
    let gone: Vec<WatchDescriptor> = state
        .dirs
        .iter()
        .filter(|(_, d)| d.as_str() == rel || d.starts_with(&below))
        .map(|(wd, _)| *wd)
        .collect();
    for wd in gone {
        state.dirs.remove(&wd);
        let _ = inotify.rm_watch(wd);
    }
}
