//! Runtimes: how a sandbox's envd is started and how every process of a
//! sandbox is killed.
//!
//! Both runtimes share one on-disk layout per sandbox (see [`Paths`]), one
//! way of handing envd its sockets (bound by the node, inherited as
//! descriptors) and its secrets (JSON on stdin, see [`EnvdStdin`]), and one
//! way of killing (the sandbox's cgroup when there is one, then
//! [`procs::kill_all`]); they differ in how envd is launched:
//! - [`isolated::Isolated`]: a template's root under an overlay, its own
//!   user namespace over a host id range ([`ids`]), cgroups ([`limits`]),
//!   disk ([`disk`]), seccomp filter ([`seccomp`]), pid, mount, network,
//!   ipc, uts namespaces and egress under a policy ([`egress`]), started
//!   through the launcher ([`launch`]). See docs/security.md.
//! - [`process::Process`]: a directory and a session; no isolation and no
//!   limits at all.
//!
//! Launching must happen on a long-lived thread (an async task, never
//! `spawn_blocking`): a launcher's parent-death signal is tied to the *thread*
//! that forked it, and blocking-pool threads exit when idle.

pub mod console;
pub mod disk;
pub mod egress;
pub mod ids;
pub mod isolated;
pub mod launch;
pub mod layers;
pub mod limits;
pub mod process;
pub mod procs;
pub mod seccomp;
pub mod usage;

use command_fds::{CommandFdExt, FdMapping};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The runtime's name, as printed at start and listed by the control API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    Isolated,
    Process,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Isolated => "isolated",
            RuntimeKind::Process => "process",
        }
    }
}

/// Why a sandbox could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot prepare the sandbox's files: {0}")]
    Files(#[source] std::io::Error),
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no free sandbox identity: {0}")]
    Ids(String),
    #[error("template: {0}")]
    Template(String),
    /// A layer is not on this host and the blob store cannot give it (or
    /// take a new one): the store's to fix, so 503 naming it.
    #[error("{0}")]
    LayerUnavailable(String),
    #[error("egress: {0}")]
    Egress(String),
    /// The network policy cannot be enforced as given (the client's to
    /// fix: a domain that resolves to too many addresses).
    #[error("{0}")]
    Policy(String),
    #[error("cannot freeze the parent sandbox: {0}")]
    Freeze(#[source] std::io::Error),
    #[error("cannot pause or resume the sandbox: {0}")]
    Pause(#[source] std::io::Error),
    #[error("{0}")]
    Unsupported(String),
    #[error("processes {0:?} of the sandbox survived SIGKILL")]
    Survivors(Vec<i32>),
}

/// Where one sandbox's things live, under `<data>/sandboxes/<id>/` (a
/// directory only root can enter).
#[derive(Debug, Clone)]
pub struct Paths {
    /// `<data>/sandboxes/<id>`.
    pub dir: PathBuf,
    /// `disk.img`: the sandbox's writable layer's filesystem (isolated; see [`disk`]).
    pub disk: PathBuf,
    /// `disk/`: where that image is mounted (`upper/`, `work/`).
    pub disk_mnt: PathBuf,
    /// `lower/`: the template's root, idmapped for this sandbox.
    pub lower: PathBuf,
    /// `fs/`: the sandbox's `/` — the overlay (isolated), envd's `--root`
    /// (process).
    pub fs: PathBuf,
    /// `fs/home/user`: `/home/user` inside the sandbox.
    pub home: PathBuf,
    /// `fs/tmp`: `/tmp` inside the sandbox.
    pub tmp: PathBuf,
    /// `sock/`: the sockets the node dials. Never visible inside the
    /// sandbox: envd gets them as inherited listening descriptors, so no
    /// sandbox process can rename, replace or redirect them.
    pub sock: PathBuf,
    /// `sock/envd.sock`: the envd API.
    pub envd_sock: PathBuf,
    /// `sock/relay.sock`: envd's port relay.
    pub relay_sock: PathBuf,
    /// `sandbox.json`: what the node knows, so a restarted node finds it.
    pub state: PathBuf,
}

impl Paths {
    pub fn new(sandboxes_dir: &Path, sandbox_id: &str) -> Paths {
        let dir = sandboxes_dir.join(sandbox_id);
        let fs = dir.join("fs");
        let sock = dir.join("sock");
        Paths {
            disk: dir.join("disk.img"),
            disk_mnt: dir.join("disk"),
            lower: dir.join("lower"),
            home: fs.join("home").join("user"),
            tmp: fs.join("tmp"),
            envd_sock: sock.join("envd.sock"),
            relay_sock: sock.join("relay.sock"),
            state: dir.join("sandbox.json"),
            fs,
            sock,
            dir,
        }
    }
}

/// Everything a runtime needs to start one sandbox.
#[derive(Debug)]
pub struct LaunchSpec<'a> {
    pub sandbox_id: &'a str,
    pub generation: u64,
    pub paths: &'a Paths,
    /// A fork's parent: its files are copied (frozen, isolated).
    pub parent: Option<(&'a Paths, &'a Handle)>,
    /// A boot from the files a filesystem-only pause kept (see
    /// [`Runtime::halt`]): the sandbox's own disk at `paths.disk`, and the
    /// template and settings of this, its handle before the pause.
    pub kept: Option<&'a Handle>,
    /// The template by name (empty: `base`); a fork uses its parent's.
    pub template_id: &'a str,
    /// Its record, as the gateway resolved it: used instead of reading the
    /// record named `template_id` (required where the layers come from a
    /// blob store, which has no records).
    pub template: Option<&'a warren_template::Template>,
    /// Egress policy.
    pub network: &'a egress::NetworkPolicy,
    /// The sandbox's environment (user-supplied `env_vars`). Data for envd,
    /// which applies it to the processes it starts; never the environment
    /// of any process on the host side.
    pub env_vars: &'a BTreeMap<String, String>,
    /// envd's access token; like `env_vars`, sent to envd on its stdin.
    pub access_token: Option<&'a str>,
    pub envd_bin: &'a Path,
    pub max_output_bytes: u64,
    /// The value of [`procs::MARK_ENV`] every process of the sandbox inherits
    /// (see [`mark`]).
    pub mark: &'a str,
    /// The most this sandbox may have; its template's values apply under these.
    pub caps: crate::config::Caps,
    /// The volumes it mounts: each its path inside the sandbox and where
    /// the volume's content is in the node's mount namespace (resolved by
    /// the registry from `mounts`).
    pub volumes: &'a [(String, PathBuf)],
    /// What it was asked to mount, kept in its handle for a fork and a
    /// boot after a filesystem-only pause.
    pub mounts: &'a [warren_core::node_api::volumes::VolumeMount],
}

/// The [`procs::MARK_ENV`] value for a sandbox at a generation on the node
/// whose data dir is `data_dir`: unique on the host even when two nodes (or
/// two test clusters) host the same sandbox id, so one node's kill never
/// touches another's processes.
pub fn mark(sandbox_id: &str, generation: u64, data_dir: &Path) -> String {
    format!("{sandbox_id}.{generation}@{:016x}", instance(data_dir))
}

/// What tells this node's things (marks, cgroups) from another node's on
/// the same machine: a hash of its data dir. FNV-1a: stable across builds,
/// unlike std's hasher, so a restarted (even upgraded) node recognises its own.
pub fn instance(data_dir: &Path) -> u64 {
    warren_core::id::fnv1a(data_dir.as_os_str().as_encoded_bytes())
}

/// How to find a running sandbox's processes again, also after a node
/// restart (it is stored in `sandbox.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Handle {
    pub runtime: RuntimeKind,
    /// The process the node started (the launcher; or envd).
    pub pid: i32,
    /// Its start time (clock ticks since boot), to tell it from a reused pid.
    pub start_time: u64,
    /// The sandbox's pid namespace inode (isolated), once known.
    pub pid_ns: Option<u64>,
    /// True when `pid` leads its own session (`process` runtime).
    pub session: bool,
    /// The sandbox's cgroups (isolated).
    pub cgroup: Option<limits::Cgroup>,
    /// The sandbox's [`procs::MARK_ENV`] value.
    pub mark: String,
    /// The first host uid/gid of the sandbox's id range (isolated).
    #[serde(default)]
    pub id_base: Option<u32>,
    /// Which id range that is (see [`ids`]).
    #[serde(default)]
    pub id_slot: Option<u32>,
    /// The template's digest (isolated).
    #[serde(default)]
    pub template: Option<String>,
    /// The layers stacked on that root, bottom first (a sandbox made from a
    /// snapshot; see `warren_template::store`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// The template's settings the sandbox started with (isolated): a fork
    /// and a snapshot keep them, even once the template's record is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<warren_template::spec::Defaults>,
    /// The volumes it mounts (a fork mounts the same; a boot after a
    /// filesystem-only pause mounts them again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<warren_core::node_api::volumes::VolumeMount>,
    /// The cache leases on those trees (layers from a blob store): no
    /// eviction removes them while the sandbox lives. Not kept on disk: an
    /// isolated sandbox never outlives its node process.
    #[serde(skip)]
    pub leases: Vec<warren_template::cache::Lease>,
}

/// A started sandbox: its handle, the child to reap when this process
/// started it, and the id range it holds.
pub struct Launched {
    pub handle: Handle,
    pub child: Option<tokio::process::Child>,
    pub ids: Option<ids::IdRange>,
    pub egress: Option<egress::EgressHandle>,
    /// When the template has a start command: how long the create waits
    /// for it to be ready (see [`StartCommand`]).
    pub ready_within: Option<std::time::Duration>,
}

/// What envd reads from its stdin at start (JSON): the secrets and tenant
/// data that must never be in an environment, argv or file on the host.
#[derive(Debug, Serialize)]
pub struct EnvdStdin<'a> {
    pub access_token: Option<&'a str>,
    pub env_vars: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<StartCommand<'a>>,
    /// The template's user and working directory: the defaults of requests
    /// naming none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_user: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_workdir: Option<&'a str>,
}

/// A template's start command as envd takes it (envd's
/// `start::StartCommand`): envd starts it, as the template's user in its
/// working directory, and runs the ready command until it succeeds or
/// `timeout_secs` pass; the node asks envd where it is
/// ([`crate::envd::wait_started`]) before the create answers.
#[derive(Debug, Serialize)]
pub struct StartCommand<'a> {
    pub cmd: &'a str,
    pub ready_cmd: &'a str,
    pub user: &'a str,
    pub cwd: &'a str,
    pub timeout_secs: u64,
}

impl<'a> StartCommand<'a> {
    /// The template's start command, if it has one.
    pub fn of(d: &'a warren_template::spec::Defaults) -> Option<StartCommand<'a>> {
        (!d.start_cmd.is_empty()).then_some(StartCommand {
            cmd: &d.start_cmd,
            ready_cmd: &d.ready_cmd,
            user: &d.user,
            cwd: &d.workdir,
            timeout_secs: d.ready_timeout_secs,
        })
    }

    /// How long the node waits: envd's own bound plus room for envd to
    /// notice it and answer.
    pub fn wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_secs + 5)
    }
}

/// The listening sockets envd serves on, bound by the node in the
/// sandbox's private `sock/` dir (0700, root).
pub struct EnvdListeners {
    pub api: OwnedFd,
    pub relay: OwnedFd,
}

/// Binds envd's two sockets (replacing stale ones from an earlier run).
pub fn bind_envd_sockets(paths: &Paths) -> std::io::Result<EnvdListeners> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(&paths.sock)?;
    std::fs::set_permissions(&paths.sock, std::fs::Permissions::from_mode(0o700))?;
    let bind = |p: &Path| -> std::io::Result<OwnedFd> {
        let _ = std::fs::remove_file(p);
        Ok(std::os::unix::net::UnixListener::bind(p)?.into())
    };
    Ok(EnvdListeners {
        api: bind(&paths.envd_sock)?,
        relay: bind(&paths.relay_sock)?,
    })
}

/// The first inherited descriptor envd takes its listeners from
/// (`LISTEN_FDS` protocol: api, then relay).
pub const ENVD_FIRST_FD: i32 = 3;

/// Hands envd's listeners to `command` as descriptors 3 and 4 (plus `extra`
/// from 5 on), with the `LISTEN_FDS` variables envd reads.
pub fn pass_fds(
    command: &mut tokio::process::Command,
    listeners: EnvdListeners,
    extra: Vec<OwnedFd>,
) -> Result<(), RuntimeError> {
    let mut maps = vec![
        FdMapping {
            parent_fd: listeners.api,
            child_fd: ENVD_FIRST_FD,
        },
        FdMapping {
            parent_fd: listeners.relay,
            child_fd: ENVD_FIRST_FD + 1,
        },
    ];
    for (i, fd) in extra.into_iter().enumerate() {
        maps.push(FdMapping {
            parent_fd: fd,
            child_fd: ENVD_FIRST_FD + 2 + i as i32,
        });
    }
    command
        .as_std_mut()
        .fd_mappings(maps)
        .map_err(|_| RuntimeError::Spawn {
            what: "envd".into(),
            source: std::io::Error::other("descriptor numbers collide"),
        })?;
    command
        .env("LISTEN_FDS", "2")
        .env("LISTEN_FDS_FIRST_FD", ENVD_FIRST_FD.to_string());
    Ok(())
}

/// Writes envd's stdin document and closes the pipe.
pub async fn send_stdin(
    stdin: &mut Option<tokio::process::ChildStdin>,
    doc: &EnvdStdin<'_>,
) -> Result<(), RuntimeError> {
    use tokio::io::AsyncWriteExt;
    let fail = |e: std::io::Error| RuntimeError::Spawn {
        what: "envd (its settings on stdin)".into(),
        source: e,
    };
    let body = serde_json::to_vec(doc).map_err(|e| fail(std::io::Error::other(e)))?;
    let Some(mut pipe) = stdin.take() else {
        return Err(fail(std::io::Error::other("no stdin pipe")));
    };
    pipe.write_all(&body).await.map_err(fail)?;
    pipe.shutdown().await.map_err(fail)?;
    Ok(())
}

/// What both runtimes do.
pub trait Runtime: Send + Sync + 'static {
    fn kind(&self) -> RuntimeKind;
    /// The template store its sandboxes' roots and layers come from
    /// (isolated); `None`: it has none.
    fn store(&self) -> Option<&warren_template::Store> {
        None
    }
    /// The layer digests this host holds unpacked (see
    /// [`layers::Layers::cached`]).
    fn cached_layers(&self) -> Vec<String> {
        Vec::new()
    }
    /// Makes the sandbox's files (fresh, or a copy of `spec.parent`) and
    /// starts its envd. Must be awaited on an async task (see the module doc).
    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec<'a>,
    ) -> BoxFuture<'a, Result<Launched, RuntimeError>>;
    /// Fills in what can only be learned once envd is up (isolated: the pid
    /// namespace). Blocking but quick.
    fn settle(&self, handle: &mut Handle) {
        let _ = handle;
    }
    /// Kills every process of a sandbox and removes everything it had on
    /// disk (blocking; run it in `spawn_blocking`). `handle` is None for a
    /// sandbox that never started.
    fn destroy(&self, paths: &Paths, handle: Option<&Handle>) -> Result<(), RuntimeError>;
    /// Freezes (`true`) or thaws (`false`) every process of a running
    /// sandbox in place, memory kept (blocking but quick). The default: the
    /// runtime cannot (see [`RuntimeError::Unsupported`]).
    fn set_frozen(&self, handle: &Handle, frozen: bool) -> Result<(), RuntimeError> {
        let _ = (handle, frozen);
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot pause a sandbox (it has no cgroup to freeze); \
             use the isolated runtime",
            self.kind().as_str()
        )))
    }
    /// A filesystem-only pause: kills every process of the sandbox and
    /// releases what they held, keeping its files (its disk image) for a
    /// later [`Runtime::launch`] with [`LaunchSpec::kept`] (blocking; run
    /// it in `spawn_blocking`). The default: the runtime cannot.
    fn halt(&self, paths: &Paths, handle: &Handle) -> Result<(), RuntimeError> {
        let _ = (paths, handle);
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot pause a sandbox filesystem-only (it keeps no disk \
             to boot it again from); use the isolated runtime",
            self.kind().as_str()
        )))
    }
    /// Replaces a running sandbox's egress policy; `egress` is its egress
    /// so far (None: it has none yet) and is what it has afterwards, also
    /// when the update fails. The default: the runtime has no network
    /// isolation to change (see [`RuntimeError::Unsupported`]).
    fn update_network<'a>(
        &'a self,
        handle: &'a Handle,
        egress: &'a mut Option<egress::EgressHandle>,
        policy: &'a egress::NetworkPolicy,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        let _ = (handle, egress, policy);
        Box::pin(async move {
            Err(RuntimeError::Unsupported(format!(
                "the {} runtime has no network isolation: its sandboxes share the \
                 node's network, so there are no egress rules to change; use the \
                 isolated runtime",
                self.kind().as_str()
            )))
        })
    }
    /// After every sandbox is gone (node shutdown): removes what the
    /// runtime made for the node as a whole.
    fn shutdown(&self) {}
    /// Makes a template of a running (or paused: `frozen`) sandbox's
    /// filesystem and records it as `snapshot.key` (blocking; run it in
    /// `spawn_blocking`). The default: the runtime cannot.
    fn snapshot(
        &self,
        paths: &Paths,
        handle: &Handle,
        frozen: bool,
        snapshot: &SnapshotSpec,
    ) -> Result<warren_template::Template, RuntimeError> {
        let _ = (paths, handle, frozen, snapshot);
        Err(RuntimeError::Unsupported(format!(
            "the {} runtime cannot snapshot a sandbox: its sandboxes have no template \
             root and writable layer to copy; run the node with --runtime isolated",
            self.kind().as_str()
        )))
    }
}

/// What a snapshot is recorded as (see [`Runtime::snapshot`]).
#[derive(Debug, Clone)]
pub struct SnapshotSpec {
    /// The template record's name (the snapshot's id).
    pub key: String,
    /// Who owns it, its name and where it came from.
    pub meta: warren_template::Snapshot,
    /// The template the sandbox was made from (for its defaults).
    pub template_id: String,
}

/// Kills every process of a sandbox (blocking): through its cgroup when it
/// has one, then by the marks `/proc` shows (see [`procs`]).
pub fn kill(handle: &Handle) -> Result<(), RuntimeError> {
    if let Some(cg) = &handle.cgroup {
        cg.kill();
    }
    let result = procs::kill_all(handle, &handle.mark);
    if let Some(cg) = &handle.cgroup {
        cg.remove();
    }
    result.map_err(RuntimeError::Survivors)
}

/// The node's own log settings, passed on so envd logs like the node does.
fn log_settings() -> Vec<(String, String)> {
    ["WARREN_LOG", "WARREN_LOG_FORMAT"]
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
        .collect()
}

/// The `PATH` processes in a sandbox get.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
