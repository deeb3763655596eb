//! The `bwrap` runtime: each sandbox in its own pid, mount, network, ipc, uts
//! and (where possible) cgroup namespaces, via bubblewrap.
//!
//! Inside, the filesystem is a fresh tmpfs root with the host's `/usr` and
//! `/etc` read-only (plus the `/bin`, `/lib`, ... symlinks or read-only binds
//! of a usrmerge system), a new `/proc` (own pid namespace: only the sandbox's
//! processes) and a minimal `/dev`, the sandbox's own `home/user` and `tmp`
//! read-write, the envd binary read-only at `/opt/warren/bin/warren`, and the
//! socket dir bound at `/run/warren` so envd's Unix sockets appear on the host.
//! The network namespace has only `lo` (bubblewrap brings it up), so sandbox
//! ports are reachable only through envd's relay, and one sandbox cannot reach
//! another's.
//!
//! Who the code runs as: when the node is root, bwrap runs as root (so it can
//! bind the node's private directories) and `setpriv` drops envd to the
//! unprivileged `--sandbox-uid` with no capabilities and `no_new_privs`
//! before it starts; host files owned by root stay unreadable or read-only.
//! When the node is not root, bwrap adds a user namespace (`--unshare-user
//! --uid 1000`) mapped to the node's own uid.
//!
//! `--die-with-parent`: a sandbox dies with the node process.

use super::limits::{find_program, LimitPlan};
use super::{procs, Handle, LaunchSpec, Launched, Runtime, RuntimeError, RuntimeKind};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Where the envd binary appears inside the sandbox.
const ENVD_IN_SANDBOX: &str = "/opt/warren/bin/warren";
/// Where the socket dir appears inside the sandbox.
const RUN_IN_SANDBOX: &str = "/run/warren";

/// See the module doc.
pub struct Bwrap {
    bwrap: PathBuf,
    limits: LimitPlan,
    /// `Some` when the node is root: `setpriv` and the uid/gid to drop to.
    drop_to: Option<(PathBuf, u32, u32)>,
}

impl Bwrap {
    /// Finds bwrap (and setpriv when root). Use [`Bwrap::probe`] to see whether it works.
    pub fn new(limits: LimitPlan, uid: u32, gid: u32) -> Result<Bwrap, String> {
        let bwrap = find_program("bwrap").ok_or("bwrap is not installed")?;
        let drop_to = if nix::unistd::geteuid().is_root() {
            let setpriv = find_program("setpriv").ok_or(
                "the node runs as root and needs setpriv (util-linux) to drop sandboxes' privileges",
            )?;
            Some((setpriv, uid, gid))
        } else {
            None
        };
        Ok(Bwrap {
            bwrap,
            limits,
            drop_to,
        })
    }

    /// The uid that owns sandbox files on the host (None: the node's own).
    pub fn owner(&self) -> Option<(u32, u32)> {
        self.drop_to.as_ref().map(|(_, u, g)| (*u, *g))
    }

    /// Runs `true` in a sandbox made like the real ones; Ok when it worked.
    pub async fn probe(&self) -> Result<(), String> {
        let mut argv = self.namespace_args("probe");
        argv.extend(self.privilege_drop());
        argv.push("/usr/bin/true".into());
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::process::Command::new(&self.bwrap)
                .args(&argv)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| "bwrap did not finish within 10s".to_string())?
        .map_err(|e| format!("cannot run {}: {e}", self.bwrap.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "bwrap failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Namespaces and the read-only system part of the filesystem.
    fn namespace_args(&self, hostname: &str) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &[&str]| a.extend(s.iter().map(OsString::from));
        push(&[
            "--unshare-pid",
            "--unshare-net",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            hostname,
            "--die-with-parent",
            "--new-session",
        ]);
        if self.drop_to.is_none() {
            push(&["--unshare-user", "--uid", "1000", "--gid", "1000"]);
        }
        push(&["--ro-bind", "/usr", "/usr"]);
        // Debian's usrmerge makes these symlinks into /usr; older systems have dirs.
        for top in ["bin", "sbin", "lib", "lib32", "lib64", "libx32"] {
            let host = Path::new("/").join(top);
            match std::fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
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
        let mut push = |s: &[&str]| a.extend(s.iter().map(OsString::from));
        push(&["--ro-bind", "/etc", "/etc"]);
        push(&["--proc", "/proc", "--dev", "/dev"]);
        a
    }

    /// `setpriv ... --` when the node is root; nothing otherwise.
    fn privilege_drop(&self) -> Vec<OsString> {
        let Some((setpriv, uid, gid)) = &self.drop_to else {
            return Vec::new();
        };
        let mut a = vec![setpriv.clone().into_os_string()];
        a.extend(
            [
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".into(),
                "--inh-caps=-all".into(),
                "--bounding-set=-all".into(),
                "--no-new-privs".into(),
                "--".into(),
            ]
            .map(OsString::from),
        );
        a
    }
}

fn bind(a: &mut Vec<OsString>, flag: &str, src: &Path, dst: &str) {
    a.push(flag.into());
    a.push(src.as_os_str().to_owned());
    a.push(dst.into());
}

impl Runtime for Bwrap {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Bwrap
    }

    fn launch(&self, spec: &LaunchSpec<'_>) -> Result<Launched, RuntimeError> {
        let p = spec.paths;
        let mut cmd: Vec<OsString> = vec![self.bwrap.clone().into_os_string()];
        cmd.extend(self.namespace_args(spec.sandbox_id));
        // Mount points' parents would otherwise be created 0700 root, which
        // the unprivileged sandbox user could not traverse.
        for dir in ["/home", "/run", "/opt", "/opt/warren", "/opt/warren/bin"] {
            cmd.extend(["--perms", "0755", "--dir", dir].map(OsString::from));
        }
        bind(&mut cmd, "--bind", &p.home, "/home/user");
        bind(&mut cmd, "--bind", &p.tmp, "/tmp");
        bind(&mut cmd, "--bind", &p.run, RUN_IN_SANDBOX);
        bind(&mut cmd, "--ro-bind", spec.envd_bin, ENVD_IN_SANDBOX);
        cmd.extend(["--chdir", "/home/user"].map(OsString::from));
        cmd.extend(self.privilege_drop());
        let envd_sock = format!("{RUN_IN_SANDBOX}/envd.sock");
        let relay_sock = format!("{RUN_IN_SANDBOX}/relay.sock");
        cmd.extend(
            [
                ENVD_IN_SANDBOX,
                "envd",
                "--socket",
                &envd_sock,
                "--relay-socket",
                &relay_sock,
                "--root",
                "/",
                "--max-output-bytes",
                &spec.max_output_bytes.to_string(),
            ]
            .map(OsString::from),
        );
        let cgroup_name = format!("{}-{}", spec.sandbox_id, spec.generation);
        let (argv, cgroup) = self
            .limits
            .wrap(&cgroup_name, cmd)
            .map_err(RuntimeError::Files)?;
        // bwrap passes its environment on (no --clearenv), which keeps the
        // access token and user variables out of every argv.
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env_clear()
            .env("PATH", super::SANDBOX_PATH)
            .env("HOME", "/home/user")
            .env("USER", "user")
            .env("LANG", "C.UTF-8");
        super::spawn_envd(
            command,
            spec,
            RuntimeKind::Bwrap,
            format!("bwrap ({})", self.bwrap.display()),
            cgroup,
        )
    }

    fn file_owner(&self) -> Option<(u32, u32)> {
        self.owner()
    }

    fn settle(&self, handle: &mut Handle) {
        // bwrap's first child is pid 1 of the sandbox's pid namespace.
        let mine = procs::pid_ns(std::process::id() as i32);
        handle.pid_ns = procs::children(handle.pid)
            .into_iter()
            .filter_map(procs::pid_ns)
            .find(|ns| Some(*ns) != mine);
    }
}
