//! The `bwrap` runtime: each sandbox a small machine of its own.
//!
//! The start, in order (each step fails loudly and is undone):
//! 1. an id range of its own ([`super::ids`]): host uids/gids nobody else has;
//! 2. its disk ([`super::disk`]): a bounded ext4 image, loop-mounted at
//!    `fs/` in the node's private mount namespace — fresh (the `base`
//!    layout below) or a copy of a frozen parent's image (a fork);
//! 3. its cgroups ([`super::limits`]): memory, pids, CPU, freezer;
//! 4. its sockets, bound by the node in `sock/` where the sandbox cannot
//!    reach them, handed to envd as inherited descriptors;
//! 5. the launcher ([`super::launch`]): joins the cgroups, unshares a user
//!    namespace that the node maps to the id range, becomes root *of that
//!    namespace* and execs bwrap with a cleared environment;
//! 6. bwrap, reading its arguments from a descriptor (so pid 1's command
//!    line shows no host path): own pid, mount, network, ipc, uts and cgroup
//!    namespaces; the image as `/`; the host's `/usr` read-only (plus the
//!    usrmerge symlinks) and a few harmless `/etc` entries; fresh `/proc`
//!    and `/dev`; envd's binary from a tmpfs copy; the seccomp filter
//!    ([`super::seccomp`]); `--die-with-parent`;
//! 7. envd, as root of the namespace, reads its token and the sandbox's
//!    environment from stdin and runs user code as `user` (uid 1000 inside).
//!
//! Inside, `/etc` is the sandbox's own: `passwd` and `group` with `root`,
//! `user` and `nobody`, `hostname` and `hosts` with the sandbox id, a
//! `resolv.conf`. The network namespace has only `lo`, so sandbox ports are
//! reachable only through envd's relay, and one sandbox cannot reach another.

use super::disk;
use super::ids::{IdRange, IdRanges};
use super::launch::{self, LaunchArgs};
use super::limits::{find_program, Cgroup, LimitPlan};
use super::{
    procs, EnvdStdin, Handle, LaunchSpec, Launched, Paths, Runtime, RuntimeError, RuntimeKind,
};
use futures_util::future::BoxFuture;
use std::ffi::OsString;
use std::io::{Seek, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Where the envd binary appears inside the sandbox.
pub const ENVD_IN_SANDBOX: &str = "/opt/warren/bin/warren";

/// Host `/etc` entries a sandbox sees (read-only): what programs need to
/// run, nothing that describes the host (no passwd, hostname, machine-id).
const HOST_ETC: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "bash.bashrc",
    "profile",
    "profile.d",
    "skel",
    "inputrc",
    "localtime",
    "mime.types",
    "services",
    "protocols",
    "gai.conf",
    "python3",
    "python3.11",
    "perl",
    "login.defs",
    "debian_version",
    "os-release",
];

/// Top-level dirs a usrmerge system has as symlinks into `/usr`.
const USRMERGE: [&str; 6] = ["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Uid and gid of `user` inside every sandbox.
pub const USER_ID: u32 = 1000;

/// See the module doc.
pub struct Bwrap {
    bwrap: PathBuf,
    /// The `warren` binary run as `warren sandbox-launch`.
    launcher: PathBuf,
    /// envd's binary on the node's read-only tmpfs (see [`disk::stage_binary`]).
    envd_bin: PathBuf,
    limits: LimitPlan,
    ids: IdRanges,
    /// The two seccomp programs (see [`super::seccomp`]).
    seccomp: [Vec<u8>; 2],
}

impl Bwrap {
    /// Checks everything this runtime needs; the error says what is missing.
    pub fn new(
        limits: LimitPlan,
        ids: IdRanges,
        launcher: PathBuf,
        envd_bin: PathBuf,
    ) -> Result<Bwrap, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err(
                "the bwrap runtime needs the node to run as root (it maps each \
                        sandbox's user namespace, mounts its disk and makes its cgroups)"
                    .into(),
            );
        }
        if let Some(why) = limits.unavailable() {
            return Err(format!("no usable cgroups for sandbox limits ({why})"));
        }
        let bwrap = find_program("bwrap").ok_or("bwrap is not installed")?;
        for tool in ["mkfs.ext4", "mount", "cp"] {
            find_program(tool).ok_or(format!("{tool} is not installed"))?;
        }
        let seccomp = super::seccomp::programs()?;
        Ok(Bwrap {
            bwrap,
            launcher,
            envd_bin,
            limits,
            ids,
            seccomp,
        })
    }

    /// Runs `true` in a sandbox made like the real ones (own id range,
    /// cgroups, seccomp; a tmpfs root); Ok when it worked.
    pub async fn probe(&self, node_id: &str) -> Result<(), String> {
        let ids = self.ids.take(None)?;
        let cgroup = self
            .limits
            .create(
                &format!("probe-{}", std::process::id()),
                &self.limits.limits(),
            )
            .map_err(|e| format!("cannot make a cgroup: {e}"))?;
        let mut args = self.namespace_args(node_id);
        args.extend(["--tmpfs", "/", "--ro-bind", "/usr", "/usr"].map(OsString::from));
        usrmerge_args(&mut args, true);
        args.extend(["--proc", "/proc", "--dev", "/dev"].map(OsString::from));
        args.extend(self.seccomp_args());
        let result = async {
            let mut child = self.spawn(
                &args,
                &["/usr/bin/true".into()],
                cgroup.as_ref(),
                None,
                Vec::new(),
            )?;
            launch::map_ids(&mut child, ids.base)
                .await
                .map_err(|e| e.to_string())?;
            let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .map_err(|_| "the probe sandbox did not finish within 10s".to_string())?
                .map_err(|e| e.to_string())?;
            if status.success() {
                Ok(())
            } else {
                Err(format!(
                    "the probe sandbox failed ({status}); see bwrap's message above"
                ))
            }
        }
        .await;
        if let Some(cg) = &cgroup {
            cg.kill();
            cg.remove();
        }
        result
    }

    /// Namespaces and session flags common to every sandbox.
    fn namespace_args(&self, hostname: &str) -> Vec<OsString> {
        [
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            hostname,
            "--die-with-parent",
            "--new-session",
        ]
        .map(OsString::from)
        .to_vec()
    }

    /// `--add-seccomp-fd` for the two programs, which [`Bwrap::spawn`]
    /// passes as descriptors 6 and 7 (after the listeners and `--args`).
    fn seccomp_args(&self) -> Vec<OsString> {
        let first = super::ENVD_FIRST_FD + 3;
        vec![
            "--add-seccomp-fd".into(),
            first.to_string().into(),
            "--add-seccomp-fd".into(),
            (first + 1).to_string().into(),
        ]
    }

    /// Starts the launcher → bwrap with `args` (passed through `--args`;
    /// only `program`, which names no host path, is on the command line),
    /// in `cgroup`, with envd's listeners when given. Stdin and stdout are
    /// the launcher's control pipes (see [`launch`]).
    fn spawn(
        &self,
        args: &[OsString],
        program: &[OsString],
        cgroup: Option<&Cgroup>,
        listeners: Option<super::EnvdListeners>,
        stage: Vec<(PathBuf, String)>,
    ) -> Result<tokio::process::Child, String> {
        let mut data = Vec::new();
        for a in args {
            data.extend_from_slice(a.as_bytes());
            data.push(0);
        }
        let extra = vec![
            sealed_file(&data)?,
            sealed_file(&self.seccomp[0])?,
            sealed_file(&self.seccomp[1])?,
        ];
        let args_fd = super::ENVD_FIRST_FD + 2;
        let launch = LaunchArgs {
            cgroup_procs: cgroup.map(|c| c.procs_files()).unwrap_or_default(),
            stage,
            program: [
                self.bwrap.clone().into_os_string(),
                "--args".into(),
                args_fd.to_string().into(),
                "--".into(),
            ]
            .into_iter()
            .chain(program.iter().cloned())
            .collect(),
        };
        let mut command = tokio::process::Command::new(&self.launcher);
        command
            .args(launch.to_argv())
            .env_clear()
            .env("PATH", super::SANDBOX_PATH)
            .env("LANG", "C.UTF-8")
            .envs(super::log_settings())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let listeners = match listeners {
            Some(l) => l,
            // The probe: placeholders so the descriptor numbers stay the same.
            None => super::EnvdListeners {
                api: sealed_file(b"")?,
                relay: sealed_file(b"")?,
            },
        };
        super::pass_fds(&mut command, listeners, extra).map_err(|e| e.to_string())?;
        command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.launcher.display()))
    }

    async fn launch_inner(
        &self,
        spec: &LaunchSpec<'_>,
        ids: &IdRange,
        cgroup: &mut Option<Cgroup>,
    ) -> Result<(tokio::process::Child, Handle), RuntimeError> {
        let p = spec.paths;
        {
            let (paths, parent) = (
                p.clone(),
                spec.parent.map(|(pp, ph)| (pp.clone(), ph.clone())),
            );
            let (bytes, base, id) = (spec.disk_bytes, ids.base, spec.sandbox_id.to_string());
            tokio::task::spawn_blocking(move || {
                prepare_disk(
                    &paths,
                    parent.as_ref().map(|(p, h)| (p, h)),
                    bytes,
                    base,
                    &id,
                )
            })
            .await
            .map_err(|e| RuntimeError::Files(std::io::Error::other(e)))??;
        }
        let name = format!("{}-{}", spec.sandbox_id, spec.generation);
        *cgroup = self
            .limits
            .create(&name, &spec.limits)
            .map_err(RuntimeError::Files)?;
        let listeners = super::bind_envd_sockets(p).map_err(RuntimeError::Files)?;

        // The sandbox's root and envd's binary live under the node's private
        // data dir, which the namespace's root (a host uid of the range)
        // cannot traverse: the launcher stages them (see `launch`).
        let stage = vec![
            (p.fs.clone(), "root".to_string()),
            (self.envd_bin.clone(), "envd".to_string()),
        ];
        let staged = |name: &str| PathBuf::from(launch::STAGE).join(name);
        let mut args = self.namespace_args(spec.sandbox_id);
        let bind = |a: &mut Vec<OsString>, flag: &str, src: &Path, dst: &str| {
            a.push(flag.into());
            a.push(src.as_os_str().to_owned());
            a.push(dst.into());
        };
        bind(&mut args, "--bind", &staged("root"), "/");
        bind(&mut args, "--ro-bind", Path::new("/usr"), "/usr");
        // The image has the usrmerge symlinks already (see `populate`).
        usrmerge_args(&mut args, false);
        for entry in HOST_ETC {
            let host = Path::new("/etc").join(entry);
            bind(&mut args, "--ro-bind-try", &host, &format!("/etc/{entry}"));
        }
        args.extend(["--proc", "/proc", "--dev", "/dev"].map(OsString::from));
        bind(&mut args, "--ro-bind", &staged("envd"), ENVD_IN_SANDBOX);
        args.extend(["--chdir", "/home/user"].map(OsString::from));
        args.extend(self.seccomp_args());
        let program: Vec<OsString> = [
            ENVD_IN_SANDBOX,
            "envd",
            "--inherited-sockets",
            "--settings-on-stdin",
            "--switch-users",
            "--root",
            "/",
            "--max-output-bytes",
            &spec.max_output_bytes.to_string(),
        ]
        .map(OsString::from)
        .to_vec();
        let mut child = self
            .spawn(&args, &program, cgroup.as_ref(), Some(listeners), stage)
            .map_err(|e| RuntimeError::Spawn {
                what: format!("bwrap ({})", self.bwrap.display()),
                source: std::io::Error::other(e),
            })?;
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let handle = Handle {
            runtime: RuntimeKind::Bwrap,
            pid,
            start_time: procs::stat(pid).map(|s| s.start_time).unwrap_or(0),
            pid_ns: None,
            session: false,
            cgroup: cgroup.clone(),
            mark: spec.mark.to_string(),
            id_base: Some(ids.base),
            id_slot: Some(ids.slot),
        };
        launch::map_ids(&mut child, ids.base).await?;
        super::send_stdin(
            &mut child.stdin,
            &EnvdStdin {
                access_token: spec.access_token,
                env_vars: spec.env_vars,
            },
        )
        .await?;
        Ok((child, handle))
    }
}

/// The host's top-level system dirs: `/bin` → `usr/bin` and the like
/// (usrmerge; as `--symlink`s when `symlinks`, else the root has them) or
/// read-only binds of real dirs.
fn usrmerge_args(a: &mut Vec<OsString>, symlinks: bool) {
    for top in USRMERGE {
        let host = Path::new("/").join(top);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                if !symlinks {
                    continue;
                }
                if let Ok(target) = std::fs::read_link(&host) {
                    a.push("--symlink".into());
                    a.push(target.into_os_string());
                    a.push(host.into_os_string());
                }
            }
            Ok(m) if m.is_dir() => {
                a.push("--ro-bind".into());
                a.push(host.clone().into_os_string());
                a.push(host.into_os_string());
            }
            _ => {}
        }
    }
}

/// An anonymous in-memory file holding `data`, positioned at its start, to
/// hand to a child as a descriptor (bwrap's `--args` and seccomp programs).
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

impl Runtime for Bwrap {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bwrap
    }

    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec<'a>,
    ) -> BoxFuture<'a, Result<Launched, RuntimeError>> {
        Box::pin(async move {
            let prefer = None;
            let ids = self.ids.take(prefer).map_err(RuntimeError::Ids)?;
            let mut cgroup = None;
            match self.launch_inner(spec, &ids, &mut cgroup).await {
                Ok((child, handle)) => Ok(Launched {
                    handle,
                    child: Some(child),
                    ids: Some(ids),
                }),
                Err(e) => {
                    let paths = spec.paths.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        if let Some(cg) = &cgroup {
                            cg.kill();
                            cg.remove();
                        }
                        let _ = remove_sandbox_files(&paths);
                    })
                    .await;
                    Err(e)
                }
            }
        })
    }

    fn settle(&self, handle: &mut Handle) {
        // bwrap's first child is pid 1 of the sandbox's pid namespace.
        let mine = procs::pid_ns(std::process::id() as i32);
        handle.pid_ns = procs::children(handle.pid)
            .into_iter()
            .filter_map(procs::pid_ns)
            .find(|ns| Some(*ns) != mine);
    }

    fn shutdown(&self) {
        self.limits.remove_all();
    }

    fn destroy(&self, paths: &Paths, handle: Option<&Handle>) -> Result<(), RuntimeError> {
        let killed = handle.map(super::kill).unwrap_or(Ok(()));
        remove_sandbox_files(paths).map_err(RuntimeError::Files)?;
        killed
    }
}

/// Unmounts the sandbox's disk and removes its directory. Nothing inside
/// the sandbox's filesystem is walked: it is one image file.
pub fn remove_sandbox_files(paths: &Paths) -> std::io::Result<()> {
    disk::unmount(&paths.fs)?;
    match std::fs::remove_dir_all(&paths.dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Makes the sandbox's directory and disk: fresh, or a copy of `parent`'s
/// (frozen while it is copied). Blocking.
fn prepare_disk(
    paths: &Paths,
    parent: Option<(&Paths, &Handle)>,
    bytes: u64,
    base: u32,
    sandbox_id: &str,
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
            disk::mount(&paths.disk, &paths.fs).map_err(files)?;
            populate(&paths.fs, base, sandbox_id).map_err(files)?;
        }
        Some((pp, ph)) => {
            let from = ph
                .id_base
                .ok_or_else(|| files(std::io::Error::other("the parent has no id range")))?;
            copy_frozen(pp, ph, &paths.disk)?;
            disk::mount(&paths.disk, &paths.fs).map_err(files)?;
            shift_owners(&paths.fs, from, base).map_err(files)?;
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
    let copied = disk::sync(&parent.fs).and_then(|_| disk::copy(&parent.disk, to));
    let thawed = cg.thaw();
    copied.map_err(RuntimeError::Files)?;
    thawed.map_err(RuntimeError::Freeze)
}

/// Files of a fresh sandbox. The filesystem was made a moment ago and no
/// sandbox process exists yet, so plain paths are safe here.
fn populate(fs: &Path, base: u32, sandbox_id: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{chown, PermissionsExt};
    let root = Some(base);
    let user = Some(base + USER_ID);
    let mk = |rel: &str, mode: u32, owner: Option<u32>| -> std::io::Result<()> {
        let p = fs.join(rel);
        std::fs::create_dir_all(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
        chown(&p, owner, owner)
    };
    let file = |rel: &str, text: &str, mode: u32, owner: Option<u32>| -> std::io::Result<()> {
        let p = fs.join(rel);
        std::fs::write(&p, text)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
        chown(&p, owner, owner)
    };
    mk("etc", 0o755, root)?;
    mk("home", 0o755, root)?;
    mk("home/user", 0o755, user)?;
    mk("root", 0o700, root)?;
    mk("tmp", 0o1777, root)?;
    mk("var", 0o755, root)?;
    mk("var/tmp", 0o1777, root)?;
    mk("opt", 0o755, root)?;
    for top in USRMERGE {
        let host = Path::new("/").join(top);
        if let Ok(target) = std::fs::read_link(&host) {
            let link = fs.join(top);
            std::os::unix::fs::symlink(&target, &link)?;
            std::os::unix::fs::lchown(&link, root, root)?;
        }
    }
    file(
        "etc/passwd",
        "root:x:0:0:root:/root:/bin/bash\n\
         user:x:1000:1000:user:/home/user:/bin/bash\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        0o644,
        root,
    )?;
    file(
        "etc/group",
        "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
        0o644,
        root,
    )?;
    file("etc/hostname", &format!("{sandbox_id}\n"), 0o644, root)?;
    file(
        "etc/hosts",
        &format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{sandbox_id}\n"),
        0o644,
        root,
    )?;
    file(
        "etc/resolv.conf",
        "# This sandbox has no network of its own yet.\n",
        0o644,
        root,
    )?;
    file(
        "etc/nsswitch.conf",
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
        0o644,
        root,
    )?;
    file(
        "home/user/.profile",
        "# ~/.profile of a warren sandbox\nexport PATH=\"$HOME/.local/bin:$PATH\"\n",
        0o644,
        user,
    )?;
    file(
        "home/user/README",
        "This is a warren sandbox (template `base`). Its files belong to it alone;\n\
         a fork starts with a copy of them (running processes are not carried over).\n",
        0o644,
        user,
    )?;
    Ok(())
}

/// How deep a fork's ownership shift follows directories.
const MAX_DEPTH: usize = 512;

/// Moves every file of a (not running) sandbox filesystem from the id range
/// at `from` to the one at `to`, walking by directory descriptors without
/// following any symlink.
fn shift_owners(fs: &Path, from: u32, to: u32) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    use nix::sys::stat::Mode;
    let dir = nix::dir::Dir::open(
        fs,
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
            fchownat(
                &dir,
                name.as_c_str(),
                shift_id(st.st_uid, from, to).map(Uid::from_raw),
                shift_id(st.st_gid, from, to).map(Gid::from_raw),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
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
