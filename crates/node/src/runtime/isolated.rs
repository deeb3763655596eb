//! The `isolated` runtime: each sandbox a small Linux machine of its own,
//! made from a template.
//!
//! The start, in order (each step fails loudly and is undone):
//! 1. an id range of its own ([`super::ids`]): host uids/gids nobody else has;
//! 2. its disk ([`super::disk`]): a bounded ext4 image, loop-mounted at
//!    `disk/` in the node's private mount namespace, holding the overlay's
//!    writable layer (`upper/`, `work/`) — empty, or a copy of a frozen
//!    parent's image (a fork), its files moved to the child's id range;
//! 3. its cgroups ([`super::limits`]): memory, pids, CPU, freezer;
//! 4. its sockets, bound by the node in `sock/` where the sandbox cannot
//!    reach them, handed to envd as inherited descriptors;
//! 5. its user namespace (the holder, see [`super::launch`]), mapped to the
//!    id range;
//! 6. its root: the template's root filesystem, read-only and *idmapped*
//!    through that namespace (files the template has as uid `k` are the
//!    sandbox's uid `k`, e.g. a setuid-root `sudo` is the sandbox's root's),
//!    under an overlay whose writable layer is on the sandbox's disk — the
//!    template itself never changes;
//! 7. the launcher and pid 1 ([`super::launch`]): cgroups, namespaces, the
//!    root, `/proc`, `/dev`, its volumes (each an idmapped, `nosuid,nodev`
//!    bind of the volume's content: `crate::volumes`), the seccomp filter
//!    ([`super::seccomp`]), envd as the namespace's root — no
//!    `no_new_privs`, so `sudo` works;
//! 8. its egress, when the sandbox may reach the internet ([`super::egress`]).

use super::console;
use super::disk;
use super::egress::{Egress, EgressHandle};
use super::ids::{IdRange, IdRanges};
use super::launch::{self, LaunchArgs};
use super::layers::Layers;
use super::limits::{find_program, Cgroup, LimitPlan};
use super::{
    procs, EnvdStdin, Handle, LaunchSpec, Launched, Paths, Runtime, RuntimeError, RuntimeKind,
    SnapshotSpec, StartCommand,
};
use futures_util::future::BoxFuture;
use std::io::{Seek, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// See the module doc.
pub struct Isolated {
    /// The `warren` binary run as `warren sandbox-launch`.
    launcher: PathBuf,
    /// envd's binary on the node's read-only tmpfs (see [`disk::stage_binary`]).
    envd_bin: PathBuf,
    limits: LimitPlan,
    ids: IdRanges,
    /// The two seccomp programs (see [`super::seccomp`]).
    seccomp: [Vec<u8>; 2],
    layers: Layers,
    /// How sandboxes reach the internet, when this node can give them that.
    egress: Option<Egress>,
}

impl Isolated {
    /// Checks everything this runtime needs; the error says what is missing.
    pub fn new(
        limits: LimitPlan,
        ids: IdRanges,
        launcher: PathBuf,
        envd_bin: PathBuf,
        layers: Layers,
        egress: Option<Egress>,
    ) -> Result<Isolated, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "the isolated runtime needs the node to run as root (it maps each \
                        sandbox's user namespace, mounts its disk and root, makes its cgroups)"
                    .into(),
            );
        }
        if let Some(why) = limits.unavailable() {
            return Err(format!("no usable cgroups for sandbox limits ({why})"));
        }
        for tool in ["mkfs.ext4", "mount", "cp", "tar"] {
            find_program(tool).ok_or(format!("{tool} is not installed"))?;
        }
        let seccomp = super::seccomp::programs()?;
        Ok(Isolated {
            launcher,
            envd_bin,
            limits,
            ids,
            seccomp,
            layers,
            egress,
        })
    }

    /// Where sandboxes' roots and layers come from.
    pub fn layers(&self) -> &Layers {
        &self.layers
    }

    /// The record of template `name`: the one the create was handed, else
    /// the shared store's.
    fn record(
        &self,
        given: Option<&warren_template::Template>,
        name: &str,
    ) -> Result<warren_template::Template, RuntimeError> {
        if let Some(t) = given {
            return Ok(t.clone());
        }
        match self.layers.shared() {
            Some(store) => store
                .get(name)
                .map_err(|e| RuntimeError::Template(e.to_string())),
            None => Err(RuntimeError::Template(format!(
                "the create names template {name:?} without its record, and this node keeps \
                 none (its layers come from a blob store): the gateway must send it"
            ))),
        }
    }

    fn command(&self, args: &LaunchArgs) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.launcher);
        c.args(args.to_argv())
            .env_clear()
            .env("PATH", super::SANDBOX_PATH)
            .env("LANG", "C.UTF-8")
            .envs(super::log_settings())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    async fn launch_inner(
        &self,
        spec: &LaunchSpec<'_>,
        ids: &IdRange,
        made: &mut Made,
    ) -> Result<(tokio::process::Child, Handle, Option<std::time::Duration>), RuntimeError> {
        let p = spec.paths;
        // The template: the parent's for a fork, else the one named.
        let name = if spec.template_id.is_empty() {
            "base"
        } else {
            spec.template_id
        };
        // A fork copies its parent's root and settings, which need not be
        // in the store any more (a deleted snapshot's); a create reads the
        // template's record.
        // A boot from kept files reads them from the sandbox's own handle.
        let source = spec.parent.map(|(_, ph)| ph).or(spec.kept);
        let (digest, layers, defaults) = match source {
            Some(ph) if ph.defaults.is_some() => (
                ph.template.clone().ok_or_else(|| {
                    RuntimeError::Template("the parent sandbox has no template".into())
                })?,
                ph.layers.clone(),
                ph.defaults.clone().unwrap_or_default(),
            ),
            parent => {
                let template = self.record(spec.template, name)?;
                match parent {
                    Some(ph) => (
                        ph.template.clone().ok_or_else(|| {
                            RuntimeError::Template("the parent sandbox has no template".into())
                        })?,
                        ph.layers.clone(),
                        template.defaults,
                    ),
                    None => (template.digest, template.layers, template.defaults),
                }
            }
        };
        let d = &defaults;
        let (limits, disk_bytes) = spec.caps.limits(d.cpu_count, d.memory_mb, d.disk_mb);
        // The root and its layers, bottom first.
        let digests: Vec<String> = std::iter::once(digest.clone())
            .chain(layers.iter().cloned())
            .collect();
        let (roots, leases) = self.layers.roots(&digests).await?;
        {
            let (paths, parent, kept) = (
                p.clone(),
                spec.parent.map(|(pp, ph)| (pp.clone(), ph.clone())),
                spec.kept.cloned(),
            );
            let (bytes, base) = (disk_bytes, ids.base);
            tokio::task::spawn_blocking(move || match kept {
                Some(k) => mount_kept_disk(&paths, &k, base),
                None => prepare_disk(&paths, parent.as_ref().map(|(p, h)| (p, h)), bytes, base),
            })
            .await
            .map_err(|e| RuntimeError::Files(std::io::Error::other(e)))??;
        }
        let cgroup_name = format!("{}-{}", spec.sandbox_id, spec.generation);
        made.cgroup = self
            .limits
            .create(&cgroup_name, &limits)
            .map_err(RuntimeError::Files)?;
        let listeners = super::bind_envd_sockets(p).map_err(RuntimeError::Files)?;

        // 5: the user namespace.
        let mut holder = self
            .command(&LaunchArgs {
                hold: true,
                base: ids.base,
                ..LaunchArgs::default()
            })
            .spawn()
            .map_err(|e| RuntimeError::Spawn {
                what: format!("{} sandbox-launch --hold", self.launcher.display()),
                source: e,
            })?;
        if let Some(err) = holder.stderr.take() {
            console::relay(spec.sandbox_id, "holder", err);
        }
        let result = async {
            let userns = launch::map_holder(&mut holder, ids.base).await?;
            // 6: the root.
            {
                let (paths, roots) = (p.clone(), roots.clone());
                let ns = userns.try_clone().map_err(RuntimeError::Files)?;
                tokio::task::spawn_blocking(move || mount_root(&paths, &roots, &ns))
                    .await
                    .map_err(|e| RuntimeError::Files(std::io::Error::other(e)))??;
            }
            // 7: the launcher.
            // Detached copies of the root and of envd's binary: pid 1 attaches
            // them in its own mount namespace (a descriptor of a mount in
            // this namespace could not be bound there).
            let detach = |path: &Path| {
                warren_sys::open_tree_clone(path, true).map_err(|e| {
                    RuntimeError::Files(std::io::Error::other(format!(
                        "open_tree {}: {e}",
                        path.display()
                    )))
                })
            };
            let root_fd = detach(&p.fs)?;
            let envd_fd = detach(&self.envd_bin)?;
            let fail = |e: String| RuntimeError::Spawn {
                what: "the sandbox launcher".into(),
                source: std::io::Error::other(e),
            };
            // Each volume: a detached bind of its content, idmapped through
            // the sandbox's namespace (the ids on disk are the ids inside,
            // whatever this sandbox's host range), nosuid and nodev.
            let mut volumes = Vec::with_capacity(spec.volumes.len());
            for (inside, source) in spec.volumes {
                let tree = warren_sys::open_tree_clone(source, false).map_err(|e| {
                    RuntimeError::Files(std::io::Error::other(format!(
                        "open_tree of the volume for {inside}: {e}"
                    )))
                })?;
                warren_sys::set_idmap_nosuid_nodev(&tree, &userns).map_err(|e| {
                    RuntimeError::Files(std::io::Error::other(format!(
                        "cannot idmap the volume for {inside} (its store's filesystem must \
                         support idmapped mounts: ext4, xfs, btrfs do; NFS does not): {e}"
                    )))
                })?;
                volumes.push(tree);
            }
            let paths: String = spec.volumes.iter().map(|(i, _)| format!("{i}\n")).collect();
            let mut extra = vec![
                sealed_file(&self.seccomp[0]).map_err(fail)?,
                sealed_file(&self.seccomp[1]).map_err(fail)?,
                root_fd,
                envd_fd,
                OwnedFd::from(userns),
                sealed_file(paths.as_bytes()).map_err(fail)?,
            ];
            extra.extend(volumes);
            let args = LaunchArgs {
                hold: false,
                cgroup_procs: made
                    .cgroup
                    .as_ref()
                    .map(|c| c.procs_files())
                    .unwrap_or_default(),
                base: ids.base,
                volumes: spec.volumes.len(),
                hostname: spec.sandbox_id.to_string(),
                // Whenever the node can give it a network at all: a sandbox
                // created without one may be given one later (a policy
                // update); until then the resolver is unreachable.
                dns: (spec.network.has_network() || self.egress.is_some())
                    .then(|| super::egress::DNS.to_string()),
                envd_args: [
                    "--inherited-sockets",
                    "--settings-on-stdin",
                    "--switch-users",
                    "--root",
                    "/",
                    "--max-output-bytes",
                    &spec.max_output_bytes.to_string(),
                ]
                .map(str::to_string)
                .to_vec(),
            };
            let mut command = self.command(&args);
            super::pass_fds(&mut command, listeners, extra)?;
            let mut child = command.spawn().map_err(|e| RuntimeError::Spawn {
                what: format!("{} sandbox-launch", self.launcher.display()),
                source: e,
            })?;
            if let Some(err) = child.stderr.take() {
                console::relay(spec.sandbox_id, "stderr", err);
            }
            let ready = launch::namespaces_ready(&mut child).await;
            if let Err(e) = ready {
                let _ = child.start_kill();
                return Err(e);
            }
            // Past the launcher's one control byte, its stdout is the
            // sandbox's (pid 1's and envd's).
            if let Some(out) = child.stdout.take() {
                console::relay(spec.sandbox_id, "stdout", out);
            }
            Ok(child)
        }
        .await;
        // The launcher joined the namespace (or failed): the holder may go.
        drop(holder.stdin.take());
        let _ = holder.wait().await;
        let mut child = result?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        // 8: egress.
        if spec.network.has_network() {
            let egress = self.egress.as_ref().ok_or_else(|| {
                RuntimeError::Egress(
                    "this node cannot give sandboxes internet access (see its start log); \
                     create with allow_internet_access=false"
                        .into(),
                )
            })?;
            let procs = made.cgroup.as_ref().map(|c| c.procs_files());
            made.egress = Some(
                egress
                    .attach(
                        pid,
                        ids.base,
                        ids.slot,
                        spec.network,
                        procs.unwrap_or_default(),
                    )
                    .await?,
            );
        }
        let handle = Handle {
            runtime: RuntimeKind::Isolated,
            pid,
            start_time: procs::stat(pid).map(|s| s.start_time).unwrap_or(0),
            pid_ns: None,
            session: false,
            cgroup: made.cgroup.clone(),
            mark: spec.mark.to_string(),
            id_base: Some(ids.base),
            id_slot: Some(ids.slot),
            template: Some(digest),
            layers,
            defaults: Some(defaults.clone()),
            volumes: spec.mounts.to_vec(),
            leases,
        };
        // The template's environment, under the create's own variables.
        let mut env = defaults.env.clone();
        env.extend(spec.env_vars.iter().map(|(k, v)| (k.clone(), v.clone())));
        // Every new sandbox runs its template's start command, a fork too:
        // a fork copies files, not processes.
        let start = StartCommand::of(&defaults);
        let ready_within = start.as_ref().map(StartCommand::wait);
        super::send_stdin(
            &mut child.stdin,
            &EnvdStdin {
                access_token: spec.access_token,
                env_vars: &env,
                start,
                default_user: Some(&defaults.user),
                default_workdir: Some(&defaults.workdir),
            },
        )
        .await?;
        Ok((child, handle, ready_within))
    }
}

/// What a launch made so far, for undoing it.
#[derive(Default)]
struct Made {
    cgroup: Option<Cgroup>,
    egress: Option<EgressHandle>,
}

/// An anonymous in-memory file holding `data`, positioned at its start, to
/// hand to a child as a descriptor (the seccomp programs).
fn sealed_file(data: &[u8]) -> Result<OwnedFd, String> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create("warren-launch", MFdFlags::MFD_CLOEXEC)
        .map_err(|e| format!("memfd_create: {e}"))?;
    let mut f = std::fs::File::from(fd);
    f.write_all(data)
        .and_then(|_| f.rewind())
        .map_err(|e| format!("cannot write a launch file: {e}"))?;
    Ok(f.into())
}

/// Mounts the sandbox's root at `fs/`: the template (`roots[0]`) idmapped
/// through the sandbox's user namespace at `lower/`, a snapshot's layers
/// (`roots[1..]`, bottom first) likewise at `layers/<i>/`, under an
/// overlay whose writable layer is on its disk. Blocking.
fn mount_root(
    paths: &Paths,
    roots: &[PathBuf],
    userns: &std::fs::File,
) -> Result<(), RuntimeError> {
    let files = RuntimeError::Files;
    let Some((rootfs, layers)) = roots.split_first() else {
        return Err(RuntimeError::Template("no root filesystem".into()));
    };
    std::fs::create_dir_all(&paths.fs).map_err(files)?;
    let mount_idmapped = |from: &Path, at: &Path| -> Result<(), RuntimeError> {
        std::fs::create_dir_all(at).map_err(files)?;
        let tree = warren_sys::open_tree_clone(from, true).map_err(|e| {
            files(std::io::Error::other(format!(
                "open_tree {}: {e}",
                from.display()
            )))
        })?;
        warren_sys::set_idmap(&tree, userns).map_err(|e| {
            files(std::io::Error::other(format!(
                "cannot idmap the template (the kernel and filesystem must support idmapped mounts): {e}"
            )))
        })?;
        warren_sys::move_mount_to(&tree, at)
            .map_err(|e| files(std::io::Error::other(format!("move_mount: {e}"))))
    };
    mount_idmapped(rootfs, &paths.lower)?;
    for (i, layer) in layers.iter().enumerate() {
        mount_idmapped(layer, &layer_dir(paths, i))?;
    }
    disk::mount_overlay(&paths.dir, layers.len()).map_err(files)
}

/// Where a sandbox's `i`th snapshot layer (bottom first) is mounted.
fn layer_dir(paths: &Paths, i: usize) -> PathBuf {
    paths.dir.join("layers").join(i.to_string())
}

impl Runtime for Isolated {
    fn store(&self) -> Option<&warren_template::Store> {
        self.layers.shared()
    }

    fn cached_layers(&self) -> Vec<String> {
        self.layers.cached()
    }

    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Isolated
    }

    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec<'a>,
    ) -> BoxFuture<'a, Result<Launched, RuntimeError>> {
        Box::pin(async move {
            // A boot from kept files takes its old range back when it is
            // free (else its files move to the new one).
            let prefer = spec.kept.and_then(|h| h.id_slot);
            let ids = self.ids.take(prefer).map_err(RuntimeError::Ids)?;
            let mut made = Made::default();
            match self.launch_inner(spec, &ids, &mut made).await {
                Ok((child, handle, ready_within)) => Ok(Launched {
                    handle,
                    child: Some(child),
                    ids: Some(ids),
                    egress: made.egress,
                    ready_within,
                }),
                Err(e) => {
                    let paths = spec.paths.clone();
                    let kept = spec.kept.is_some();
                    if let Some(eg) = made.egress.take() {
                        eg.detach().await;
                    }
                    let cgroup = made.cgroup.take();
                    let _ = tokio::task::spawn_blocking(move || {
                        if let Some(cg) = &cgroup {
                            cg.kill();
                            cg.remove();
                        }
                        // Kept files stay for another try (or the delete).
                        let _ = if kept {
                            unmount_sandbox_files(&paths)
                        } else {
                            remove_sandbox_files(&paths)
                        };
                    })
                    .await;
                    Err(e)
                }
            }
        })
    }

    fn update_network<'a>(
        &'a self,
        handle: &'a Handle,
        egress: &'a mut Option<EgressHandle>,
        policy: &'a super::egress::NetworkPolicy,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            if let Some(e) = egress.as_mut() {
                return e.update(policy).await.map_err(RuntimeError::from);
            }
            if !policy.has_network() {
                // No tap0 and none wanted: nothing leaves the sandbox.
                return Ok(());
            }
            let node_egress = self.egress.as_ref().ok_or_else(|| {
                RuntimeError::Egress(
                    "this node cannot give sandboxes internet access (see its start log)".into(),
                )
            })?;
            let (Some(base), Some(slot)) = (handle.id_base, handle.id_slot) else {
                return Err(RuntimeError::Egress("the sandbox has no id range".into()));
            };
            // The launcher holds the sandbox's namespaces; make sure the pid
            // is still it before slirp4netns joins them.
            if procs::stat(handle.pid).map(|s| s.start_time) != Some(handle.start_time) {
                return Err(RuntimeError::Egress(
                    "the sandbox's launcher is gone; it cannot be given a network".into(),
                ));
            }
            let procs = handle.cgroup.as_ref().map(|c| c.procs_files());
            *egress = Some(
                node_egress
                    .attach(handle.pid, base, slot, policy, procs.unwrap_or_default())
                    .await?,
            );
            Ok(())
        })
    }

    fn settle(&self, handle: &mut Handle) {
        // The launcher's child is pid 1 of the sandbox's pid namespace.
        let mine = procs::pid_ns(std::process::id() as i32);
        handle.pid_ns = procs::children(handle.pid)
            .into_iter()
            .filter_map(procs::pid_ns)
            .find(|ns| Some(*ns) != mine);
    }

    fn shutdown(&self) {
        self.limits.remove_all();
    }

    fn set_frozen(&self, handle: &Handle, frozen: bool) -> Result<(), RuntimeError> {
        let cg = handle.cgroup.as_ref().ok_or_else(|| {
            RuntimeError::Unsupported("the sandbox has no cgroup to freeze".into())
        })?;
        if frozen { cg.freeze() } else { cg.thaw() }.map_err(RuntimeError::Pause)
    }

    fn snapshot(
        &self,
        paths: &Paths,
        handle: &Handle,
        frozen: bool,
        spec: &SnapshotSpec,
    ) -> Result<warren_template::Template, RuntimeError> {
        let base = handle
            .template
            .clone()
            .ok_or_else(|| RuntimeError::Template("the sandbox has no template".into()))?;
        if handle.layers.len() >= MAX_LAYERS {
            return Err(RuntimeError::Unsupported(format!(
                "the sandbox already stacks {MAX_LAYERS} snapshot layers, the most a \
                 snapshot may have; snapshot a sandbox made from an earlier one"
            )));
        }
        let from = handle.id_base.ok_or_else(|| {
            RuntimeError::Files(std::io::Error::other("the sandbox has no id range"))
        })?;
        // The template's defaults, as the sandbox started with them (from
        // its template's record for one started before they were kept).
        let defaults = match &handle.defaults {
            Some(d) => d.clone(),
            None => {
                self.record(
                    None,
                    if spec.template_id.is_empty() {
                        "base"
                    } else {
                        &spec.template_id
                    },
                )?
                .defaults
            }
        };
        let work = self.layers.scratch("snapshot");
        let made = (|| {
            std::fs::create_dir_all(&work).map_err(RuntimeError::Files)?;
            let layer = make_layer(paths, handle, frozen, from, &work)?;
            self.layers.add_layer(&layer)
        })();
        let _ = disk::unmount(&work.join("disk"));
        let _ = std::fs::remove_dir_all(&work);
        let digest = made?;
        let mut layers = handle.layers.clone();
        layers.push(digest);
        let template = warren_template::Template {
            name: spec.key.clone(),
            digest: base,
            defaults,
            created_at_ms: warren_core::time::now_ms().max(0) as u64,
            source: format!("snapshot of sandbox {}", spec.meta.source_sandbox),
            layers,
            snapshot: Some(spec.meta.clone()),
            images: Vec::new(),
        };
        // The shared store keeps the record; from a blob store's node it
        // goes back to the gateway, which keeps it (see `layers`).
        if let Some(store) = self.layers.shared() {
            store
                .put(&template)
                .map_err(|e| RuntimeError::Template(e.to_string()))?;
        }
        Ok(template)
    }

    fn halt(&self, paths: &Paths, handle: &Handle) -> Result<(), RuntimeError> {
        let killed = super::kill(handle);
        // Flushed before the unmount (which flushes too): what the sandbox
        // wrote is on its disk image from here.
        let _ = disk::sync(&paths.disk_mnt);
        unmount_sandbox_files(paths).map_err(RuntimeError::Files)?;
        killed
    }

    fn destroy(&self, paths: &Paths, handle: Option<&Handle>) -> Result<(), RuntimeError> {
        let killed = handle.map(super::kill).unwrap_or(Ok(()));
        remove_sandbox_files(paths).map_err(RuntimeError::Files)?;
        killed
    }
}

/// Unmounts the sandbox's root, template view and disk, and removes its
/// directory. Nothing inside the sandbox's filesystem is walked.
pub fn remove_sandbox_files(paths: &Paths) -> std::io::Result<()> {
    unmount_sandbox_files(paths)?;
    match std::fs::remove_dir_all(&paths.dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Unmounts the sandbox's root, template view and disk, leaving its
/// directory (and the disk image in it) in place.
pub fn unmount_sandbox_files(paths: &Paths) -> std::io::Result<()> {
    disk::unmount(&paths.fs)?;
    disk::unmount(&paths.lower)?;
    // Every layer mount goes before the directory does: removing through
    // one would remove the template store's files.
    if let Ok(dir) = std::fs::read_dir(paths.dir.join("layers")) {
        for e in dir.flatten() {
            disk::unmount(&e.path())?;
        }
    }
    disk::unmount(&paths.disk_mnt)
}

/// Mounts the disk a filesystem-only pause kept (`kept`: the sandbox's
/// handle then) for a new boot in the id range at `base`, moving its
/// files' owners there when the range is another than before. Blocking.
fn mount_kept_disk(paths: &Paths, kept: &Handle, base: u32) -> Result<(), RuntimeError> {
    let files = RuntimeError::Files;
    if !paths.disk.is_file() {
        return Err(files(std::io::Error::other(format!(
            "the kept disk {} is missing",
            paths.disk.display()
        ))));
    }
    // Whatever an earlier failed boot left mounted goes first.
    unmount_sandbox_files(paths).map_err(files)?;
    disk::mount(&paths.disk, &paths.disk_mnt).map_err(files)?;
    let from = kept
        .id_base
        .ok_or_else(|| files(std::io::Error::other("the kept sandbox has no id range")))?;
    if from != base {
        shift_owners(&paths.disk_mnt.join("upper"), from, base).map_err(files)?;
    }
    Ok(())
}

/// Makes the sandbox's directory and disk: fresh (an empty writable
/// layer), or a copy of `parent`'s (frozen while it is copied) moved to the
/// id range at `base`. Blocking.
fn prepare_disk(
    paths: &Paths,
    parent: Option<(&Paths, &Handle)>,
    bytes: u64,
    base: u32,
) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    let files = RuntimeError::Files;
    if paths.dir.exists() {
        // Leftovers of a create that died half-way; nothing there is live.
        remove_sandbox_files(paths).map_err(files)?;
    }
    std::fs::create_dir_all(&paths.dir).map_err(files)?;
    std::fs::set_permissions(&paths.dir, std::fs::Permissions::from_mode(0o700)).map_err(files)?;
    match parent {
        None => {
            disk::make(&paths.disk, bytes, base).map_err(files)?;
            disk::mount(&paths.disk, &paths.disk_mnt).map_err(files)?;
            let upper = paths.disk_mnt.join("upper");
            std::fs::create_dir(&upper).map_err(files)?;
            std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(0o755))
                .map_err(files)?;
            std::os::unix::fs::chown(&upper, Some(base), Some(base)).map_err(files)?;
            std::fs::create_dir(paths.disk_mnt.join("work")).map_err(files)?;
        }
        Some((pp, ph)) => {
            let from = ph
                .id_base
                .ok_or_else(|| files(std::io::Error::other("the parent has no id range")))?;
            copy_frozen(pp, ph, &paths.disk)?;
            disk::mount(&paths.disk, &paths.disk_mnt).map_err(files)?;
            shift_owners(&paths.disk_mnt.join("upper"), from, base).map_err(files)?;
        }
    }
    Ok(())
}

/// Freezes the parent, flushes its filesystem, copies its image, thaws.
fn copy_frozen(parent: &Paths, handle: &Handle, to: &Path) -> Result<(), RuntimeError> {
    let cg = handle
        .cgroup
        .as_ref()
        .ok_or_else(|| RuntimeError::Freeze(std::io::Error::other("the parent has no cgroup")))?;
    cg.freeze().map_err(RuntimeError::Freeze)?;
    let copied = disk::sync(&parent.disk_mnt).and_then(|_| disk::copy(&parent.disk, to));
    let thawed = cg.thaw();
    copied.map_err(RuntimeError::Files)?;
    thawed.map_err(RuntimeError::Freeze)
}

/// The most layers a snapshot stacks on its template's root: each is one
/// more idmapped mount and overlay lower layer (overlayfs takes at most
/// 500, and all their names must fit in one page of mount options).
pub const MAX_LAYERS: usize = 64;

/// A snapshot's layer: the sandbox's disk copied as a fork copies it
/// (frozen, unless `frozen` says a pause already holds it so), that copy
/// mounted in `work/`, its writable layer's owners moved from the
/// sandbox's id range (at `from`) back to the template's ids, packed into
/// `work/layer.tar` — overlay whiteouts and opaque-directory attributes
/// kept. The node reads only its own copy, never the live sandbox.
/// Blocking.
fn make_layer(
    paths: &Paths,
    handle: &Handle,
    frozen: bool,
    from: u32,
    work: &Path,
) -> Result<PathBuf, RuntimeError> {
    let files = RuntimeError::Files;
    let image = work.join("disk.img");
    if frozen {
        disk::sync(&paths.disk_mnt)
            .and_then(|_| disk::copy(&paths.disk, &image))
            .map_err(files)?;
    } else {
        copy_frozen(paths, handle, &image)?;
    }
    let mnt = work.join("disk");
    disk::mount(&image, &mnt).map_err(files)?;
    let upper = mnt.join("upper");
    shift_owners(&upper, from, 0).map_err(files)?;
    let tar = work.join("layer.tar");
    let out = std::process::Command::new("tar")
        .args([
            "--numeric-owner",
            "--xattrs",
            "--xattrs-include=user.*",
            "--xattrs-include=trusted.overlay.*",
            "-cf",
        ])
        .arg(&tar)
        .arg("-C")
        .arg(&upper)
        .arg(".")
        .env_clear()
        .env("PATH", super::SANDBOX_PATH)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| files(std::io::Error::other(format!("cannot run tar: {e}"))))?;
    if !out.status.success() {
        return Err(files(std::io::Error::other(format!(
            "tar failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    disk::unmount(&mnt).map_err(files)?;
    Ok(tar)
}

/// How deep a fork's ownership shift follows directories.
const MAX_DEPTH: usize = 512;

/// Moves every file of a (not running) sandbox's writable layer from the id
/// range at `from` to the one at `to`, walking by directory descriptors
/// without following any symlink.
fn shift_owners(dir: &Path, from: u32, to: u32) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let dir = nix::dir::Dir::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    shift_dir(dir, from, to, 0)
}

fn shift_id(id: u32, from: u32, to: u32) -> Option<u32> {
    (id >= from && id - from < launch::IDS_PER_SANDBOX).then(|| to + (id - from))
}

fn shift_dir(mut dir: nix::dir::Dir, from: u32, to: u32, depth: usize) -> std::io::Result<()> {
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
    use nix::unistd::{fchown, fchownat, Gid, Uid};
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "the parent's files nest deeper than {MAX_DEPTH} directories"
        )));
    }
    let st = fstat(&dir)?;
    fchown(
        &dir,
        shift_id(st.st_uid, from, to).map(Uid::from_raw),
        shift_id(st.st_gid, from, to).map(Gid::from_raw),
    )?;
    let names: Vec<std::ffi::CString> = dir
        .iter()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    for name in names {
        let st = fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFDIR {
            let sub = nix::dir::Dir::openat(
                &dir,
                name.as_c_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            shift_dir(sub, from, to, depth + 1)?;
        } else {
            // chown clears set-user-ID bits; keep the mode as it was.
            fchownat(
                &dir,
                name.as_c_str(),
                shift_id(st.st_uid, from, to).map(Uid::from_raw),
                shift_id(st.st_gid, from, to).map(Gid::from_raw),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
            if kind == SFlag::S_IFREG && st.st_mode & 0o6000 != 0 {
                nix::sys::stat::fchmodat(
                    &dir,
                    name.as_c_str(),
                    Mode::from_bits_truncate(st.st_mode & 0o7777),
                    nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::shift_id;

    #[test]
    fn ids_shift_only_within_the_range() {
        assert_eq!(
            shift_id(2_000_001_000, 2_000_000_000, 2_000_065_536),
            Some(2_000_066_536)
        );
        assert_eq!(shift_id(0, 2_000_000_000, 2_000_065_536), None);
        assert_eq!(shift_id(2_000_065_536, 2_000_000_000, 5), None);
    }
}
