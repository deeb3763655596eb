//! The first two processes of an isolated sandbox, and the node's part in
//! starting them.
//!
//! Both leave the node's session first (`setsid`): no process of a sandbox
//! has a controlling terminal, so none can open, type into (`TIOCSTI`) or
//! signal the terminal the node runs in. Each closes every descriptor it
//! was not handed on purpose, and their stdout and stderr are pipes the
//! node reads ([`super::console`]), never a host file.
//!
//! **`warren sandbox-launch --hold`** (the holder) makes the sandbox's user
//! namespace: it becomes the sandbox's first host uid (`base`, so the
//! namespace belongs to `base` and the egress helper running as `base` may
//! enter its network namespace), unshares a user namespace, tells the node
//! (a byte on stdout) and waits for stdin to close. Meanwhile the node
//! writes its `uid_map`/`gid_map` (`0..65536` inside = `base..base+65536`
//! on the host) and mounts the sandbox's root with the template idmapped
//! through that namespace.
//!
//! **`warren sandbox-launch`** (the launcher) is started by the node as host
//! root with a cleared environment and these descriptors: 3 and 4 envd's
//! listening sockets, 5 and 6 the seccomp programs, 7 the sandbox's root (an
//! `O_PATH` descriptor of the overlay the node mounted), 8 envd's binary, 9
//! the holder's user namespace, 10 the paths the sandbox's volumes are
//! mounted at (one a line) and from 11 on each volume's detached bind
//! (`--volumes N` of them). It:
//! 1. asks for SIGKILL when the node goes away, closes every descriptor
//!    past those, enters the sandbox's
//!    cgroups (so nothing it starts can be outside them), sets
//!    `RLIMIT_CORE` to 0;
//! 2. becomes host uid `base` and joins the user namespace (as its owner it
//!    may), where it is root;
//! 3. unshares mount, uts, ipc, network, cgroup and pid namespaces (all
//!    owned by that user namespace), tells the node (a byte on stdout: the
//!    network namespace exists, egress may be attached), sets the hostname;
//! 4. starts `warren sandbox-init` (pid 1 of the new pid namespace) and
//!    waits for it, exiting with its status.
//!
//! **`warren sandbox-init`** (pid 1): makes the sandbox's root the root of
//! its mount namespace (a private tmpfs stage, the root bound there from
//! descriptor 7, envd's binary from 8, a fresh `/dev`, then `pivot_root`
//! and the old root detached), mounts `/proc` (with a fresh random
//! `/proc/sys/kernel/random/boot_id` bound over the host's: one per boot)
//! and `/dev/pts`, brings `lo`
//! up, attaches each volume at its path (made a directory inside the
//! sandbox's root first; everything it follows there is the sandbox's
//! own), installs the seccomp filter — without `no_new_privs`, so `sudo`
//! works inside — closes every descriptor envd must not have and
//! re-executes itself from the sandbox's copy of the binary
//! (`sandbox-init --reap`, so `/proc/1/exe` names no host path), which
//! starts envd as the namespace's root with its listeners, stdin and the
//! console pipes, points its own standard descriptors at `/dev/null`
//! (nothing left for `/proc/1/fd` to reopen), and reaps orphans until envd
//! exits.
//!
//! Nothing either process does depends on a value a tenant chose: their
//! arguments and environment are the node's, and the sandbox's own
//! settings travel on stdin to envd.

use super::RuntimeError;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// The launcher's subcommand name (`warren sandbox-launch`).
pub const SUBCOMMAND: &str = "sandbox-launch";
/// Pid 1's subcommand name (`warren sandbox-init`).
pub const INIT_SUBCOMMAND: &str = "sandbox-init";

/// Pid 1's argument for its second stage (see [`reap`]).
const REAP: &str = "--reap";

/// An empty host directory pid 1 mounts its staging tmpfs on (only in the
/// sandbox's own mount namespace).
pub const STAGE: &str = "/run/warren/stage";

/// How many ids each sandbox's user namespace maps.
pub const IDS_PER_SANDBOX: u32 = 65536;

/// Descriptors the node hands the launcher (see the module doc).
pub const FD_USERNS: i32 = 9;
pub const FD_API: i32 = 3;
pub const FD_RELAY: i32 = 4;
pub const FD_SECCOMP: [i32; 2] = [5, 6];
pub const FD_ROOT: i32 = 7;
pub const FD_ENVD: i32 = 8;
/// The volumes' mount paths, one a line (a memfd).
pub const FD_VOLUME_PATHS: i32 = 10;
/// The first volume's detached bind; the others follow in order.
pub const FD_VOLUME_FIRST: i32 = 11;

/// Where envd's binary appears inside the sandbox.
pub const ENVD_IN_SANDBOX: &str = "/opt/warren/bin/warren";

/// The launcher's command line, as the node builds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchArgs {
    /// The holder, not the launcher.
    pub hold: bool,
    /// `cgroup.procs` files to write the launcher's pid into.
    pub cgroup_procs: Vec<PathBuf>,
    /// The sandbox's first host uid/gid.
    pub base: u32,
    /// How many volume binds follow [`FD_VOLUME_FIRST`].
    pub volumes: usize,
    /// The uts hostname (the sandbox id).
    pub hostname: String,
    /// envd's arguments after `envd`.
    pub envd_args: Vec<String>,
    /// The nameserver the sandbox's `/etc/resolv.conf` names (none: no network).
    pub dns: Option<String>,
}

impl LaunchArgs {
    /// `--base N --hostname H [--cgroup PATH]... -- ENVD_ARGS...`
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![SUBCOMMAND.into()];
        if self.hold {
            v.push("--hold".into());
        }
        v.extend(["--base".into(), self.base.to_string().into()]);
        v.extend(["--hostname".into(), self.hostname.clone().into()]);
        if self.volumes > 0 {
            v.extend(["--volumes".into(), self.volumes.to_string().into()]);
        }
        if let Some(dns) = &self.dns {
            v.extend(["--dns".into(), dns.into()]);
        }
        for p in &self.cgroup_procs {
            v.push("--cgroup".into());
            v.push(p.clone().into_os_string());
        }
        v.push("--".into());
        v.extend(self.envd_args.iter().map(OsString::from));
        v
    }

    fn parse(args: &[OsString]) -> Result<LaunchArgs, String> {
        let mut out = LaunchArgs::default();
        let mut it = args.iter();
        let text = |v: Option<&OsString>, what: &str| -> Result<String, String> {
            v.and_then(|s| s.to_str())
                .map(str::to_string)
                .ok_or_else(|| format!("{what} needs a value"))
        };
        while let Some(a) = it.next() {
            match a.to_str() {
                Some("--cgroup") => out
                    .cgroup_procs
                    .push(PathBuf::from(text(it.next(), "--cgroup")?)),
                Some("--base") => {
                    out.base = text(it.next(), "--base")?
                        .parse()
                        .map_err(|_| "--base is not a number".to_string())?
                }
                Some("--hostname") => out.hostname = text(it.next(), "--hostname")?,
                Some("--volumes") => {
                    out.volumes = text(it.next(), "--volumes")?
                        .parse()
                        .ok()
                        .filter(|n| *n <= warren_core::volume::MAX_MOUNTS)
                        .ok_or_else(|| "--volumes is not a small number".to_string())?
                }
                Some("--hold") => out.hold = true,
                Some("--dns") => out.dns = Some(text(it.next(), "--dns")?),
                Some("--") => {
                    for rest in it.by_ref() {
                        out.envd_args.push(text(Some(rest), "envd argument")?);
                    }
                }
                _ => return Err(format!("unexpected argument {a:?}")),
            }
        }
        if out.base == 0 {
            return Err("--base is required (never host uid 0)".into());
        }
        Ok(out)
    }
}

/// The launcher's `main` (see the module doc). `args` excludes the program
/// name and the subcommand.
pub fn main(args: &[OsString]) -> ExitCode {
    let run = match LaunchArgs::parse(args) {
        Ok(a) if a.hold => hold(&a),
        Ok(a) => launcher(&a),
        Err(e) => Err(e),
    };
    match run {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warren sandbox-launch: {e}");
            ExitCode::from(70)
        }
    }
}

/// Becomes host uid `base` (the parent-death signal set again: changing
/// uid clears it).
fn become_base(base: u32) -> Result<(), String> {
    use nix::unistd::{Gid, Uid};
    let (g, u) = (Gid::from_raw(base), Uid::from_raw(base));
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setresgid(g, g, g).map_err(|e| format!("setresgid: {e}"))?;
    nix::unistd::setresuid(u, u, u).map_err(|e| format!("setresuid: {e}"))?;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))
}

/// Leaves the node's session: the sandbox gets no controlling terminal,
/// so nothing in it can open, type into or signal the terminal the node
/// was started from (its `/dev/tty` answers `ENXIO`; terminals inside
/// come only from envd's PTYs).
fn detach() -> Result<(), String> {
    warren_sys::leave_terminal().map_err(|e| format!("setsid: {e}"))
}

fn tell_node(byte: u8) -> Result<(), String> {
    use std::io::Write;
    std::io::stdout()
        .write_all(&[byte])
        .and_then(|_| std::io::stdout().flush())
        .map_err(|e| format!("cannot tell the node: {e}"))
}

/// The holder (see the module doc).
fn hold(a: &LaunchArgs) -> Result<ExitCode, String> {
    use nix::sched::{unshare, CloneFlags};
    use std::io::Read;
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    detach()?;
    warren_sys::close_from(3).map_err(|e| format!("close_range: {e}"))?;
    become_base(a.base)?;
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("unshare(CLONE_NEWUSER): {e}"))?;
    tell_node(b'R')?;
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    Ok(ExitCode::SUCCESS)
}

/// The launcher (see the module doc).
fn launcher(a: &LaunchArgs) -> Result<ExitCode, String> {
    use nix::sched::{setns, unshare, CloneFlags};
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    detach()?;
    // Only the descriptors the node hands on by number go further.
    warren_sys::close_from(FD_VOLUME_FIRST as u32 + a.volumes as u32)
        .map_err(|e| format!("close_range: {e}"))?;
    let me = std::process::id().to_string();
    for procs in &a.cgroup_procs {
        std::fs::write(procs, &me)
            .map_err(|e| format!("cannot enter cgroup {}: {e}", procs.display()))?;
    }
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(|e| format!("setrlimit(RLIMIT_CORE): {e}"))?;
    become_base(a.base)?;
    // The egress helper (also `base`) reads our namespaces through /proc.
    nix::sys::prctl::set_dumpable(true).map_err(|e| format!("prctl(PR_SET_DUMPABLE): {e}"))?;
    let userns = std::fs::File::open(format!("/proc/self/fd/{FD_USERNS}"))
        .map_err(|e| format!("the user namespace descriptor: {e}"))?;
    setns(&userns, CloneFlags::CLONE_NEWUSER).map_err(|e| format!("setns(user): {e}"))?;
    drop(userns);
    let _ = nix::unistd::close(FD_USERNS);
    unshare(
        CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWCGROUP
            | CloneFlags::CLONE_NEWPID,
    )
    .map_err(|e| format!("unshare(namespaces): {e}"))?;
    nix::unistd::sethostname(&a.hostname).map_err(|e| format!("sethostname: {e}"))?;
    tell_node(b'N')?;
    // From here stdout is the sandbox's console like stderr (the node
    // reads both: `console`).
    let mut init = std::process::Command::new("/proc/self/exe");
    init.arg(INIT_SUBCOMMAND);
    if let Some(dns) = &a.dns {
        init.args(["--dns", dns]);
    }
    init.arg("--")
        .args(&a.envd_args)
        .env_clear()
        .env("PATH", super::SANDBOX_PATH)
        .envs(super::log_settings());
    let status = init
        .status()
        .map_err(|e| format!("cannot start the sandbox's init: {e}"))?;
    Ok(match status.code() {
        Some(c) => ExitCode::from(c.clamp(0, 255) as u8),
        None => ExitCode::from(137),
    })
}

/// Pid 1's `main` (see the module doc). `args`: `-- ENVD_ARGS...`.
pub fn init_main(args: &[OsString]) -> ExitCode {
    match init(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("warren sandbox-init: {e}");
            ExitCode::from(71)
        }
    }
}

fn init(args: &[OsString]) -> Result<ExitCode, String> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let envd_args: Vec<&OsString> = args.iter().skip_while(|a| *a != "--").skip(1).collect();
    if args.first().is_some_and(|a| a == REAP) {
        return reap(&envd_args);
    }
    let dns = args
        .iter()
        .take_while(|a| *a != "--")
        .skip_while(|a| *a != "--dns")
        .nth(1)
        .and_then(|d| d.to_str())
        .map(str::to_string);
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    let m =
        |src: Option<&str>, dst: &str, fstype: Option<&str>, flags: MsFlags, data: Option<&str>| {
            mount(src, dst, fstype, flags, data)
                .map_err(|e| format!("mount {} on {dst}: {e}", src.or(fstype).unwrap_or("-")))
        };
    m(None, "/", None, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None)?;
    m(
        Some("tmpfs"),
        STAGE,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=64k,mode=0755"),
    )?;
    let root = format!("{STAGE}/root");
    std::fs::create_dir(&root).map_err(|e| format!("mkdir {root}: {e}"))?;
    // The root comes as a descriptor: its host path is in a directory this
    // namespace's ids may not enter.
    attach(FD_ROOT, &root)?;
    // `proc` and `dev` are the components here the sandbox (a fork's
    // parent) chose; no sandbox process runs yet, so making them plain
    // directories cannot race.
    let own_dir = |name: &str| -> Result<String, String> {
        let d = format!("{root}/{name}");
        match std::fs::symlink_metadata(&d) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => {
                std::fs::remove_file(&d).map_err(|e| format!("remove {d}: {e}"))?;
                std::fs::create_dir(&d).map_err(|e| format!("mkdir {d}: {e}"))?;
            }
            Err(_) => std::fs::create_dir(&d).map_err(|e| format!("mkdir {d}: {e}"))?,
        }
        Ok(d)
    };
    // /proc before the pivot: the kernel lets a user namespace mount a new
    // proc only while a complete one is visible.
    let proc_dir = own_dir("proc")?;
    m(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    // A boot id of its own: every boot of the sandbox (a create, a fork,
    // a resume after a filesystem-only pause) gets a fresh random one
    // over the kernel's, which is the host's.
    let boot_id = format!("{STAGE}/boot_id");
    let uuid = std::fs::read_to_string(format!("{proc_dir}/sys/kernel/random/uuid"))
        .map_err(|e| format!("cannot read a random uuid: {e}"))?;
    std::fs::write(&boot_id, uuid).map_err(|e| format!("create {boot_id}: {e}"))?;
    let boot_id_at = format!("{proc_dir}/sys/kernel/random/boot_id");
    m(Some(&boot_id), &boot_id_at, None, MsFlags::MS_BIND, None)?;
    m(
        None,
        &boot_id_at,
        None,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None,
    )?;
    // A fresh /dev: the usual device nodes bound from the host, nothing else.
    let dev = own_dir("dev")?;
    m(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = format!("{dev}/{node}");
        std::fs::write(&target, b"").map_err(|e| format!("create {target}: {e}"))?;
        m(
            Some(&format!("/dev/{node}")),
            &target,
            None,
            MsFlags::MS_BIND,
            None,
        )?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        std::os::unix::fs::symlink(to, format!("{dev}/{link}"))
            .map_err(|e| format!("symlink /dev/{link}: {e}"))?;
    }
    for d in ["pts", "shm"] {
        std::fs::create_dir(format!("{dev}/{d}")).map_err(|e| format!("mkdir /dev/{d}: {e}"))?;
    }
    m(
        Some("devpts"),
        &format!("{dev}/pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    m(
        Some("tmpfs"),
        &format!("{dev}/shm"),
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777"),
    )?;
    std::env::set_current_dir(&root).map_err(|e| format!("chdir {root}: {e}"))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detach the old root: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    // From here every path is inside the sandbox's root: whatever the
    // sandbox (or its parent, for a fork) put there leads nowhere else.
    let mkdir = |d: &str| std::fs::create_dir_all(d).map_err(|e| format!("mkdir {d}: {e}"));
    // envd's binary, from the node's read-only copy.
    mkdir("/opt/warren/bin")?;
    if std::fs::symlink_metadata(ENVD_IN_SANDBOX).is_err() {
        std::fs::write(ENVD_IN_SANDBOX, b"")
            .map_err(|e| format!("create {ENVD_IN_SANDBOX}: {e}"))?;
    }
    attach(FD_ENVD, ENVD_IN_SANDBOX)?;
    mount_volumes()?;
    warren_sys::loopback_up().map_err(|e| format!("cannot bring lo up: {e}"))?;
    // The sandbox's own name and resolver (inside its root: a path the
    // sandbox changed leads nowhere but into the sandbox).
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let _ = std::fs::create_dir_all("/etc");
    let etc = [
        ("/etc/hostname", format!("{host}\n")),
        (
            "/etc/hosts",
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\t{host}\n"),
        ),
        (
            "/etc/resolv.conf",
            match &dns {
                Some(ip) => format!("nameserver {ip}\n"),
                None => "# this sandbox has no network access\n".to_string(),
            },
        ),
    ];
    for (path, text) in etc {
        let _ = std::fs::remove_file(path);
        std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    for fd in FD_SECCOMP {
        let program = std::fs::read(format!("/proc/self/fd/{fd}"))
            .map_err(|e| format!("cannot read seccomp program {fd}: {e}"))?;
        warren_sys::install_seccomp(&program)
            .map_err(|e| format!("cannot install seccomp: {e}"))?;
    }
    // Every descriptor but stdin (envd's settings), stdout and stderr (the
    // console pipes) and envd's two listeners goes now: the seccomp
    // programs, the root, envd's binary and anything else.
    warren_sys::close_from(FD_SECCOMP[0] as u32).map_err(|e| format!("close_range: {e}"))?;
    // Pid 1 goes on as the sandbox's own copy of the binary, so that its
    // `/proc/1/exe` names a path inside the sandbox, not the node's.
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(ENVD_IN_SANDBOX)
        .arg0("warren")
        .arg(INIT_SUBCOMMAND)
        .arg(REAP)
        .arg("--")
        .args(envd_args)
        .env_clear()
        .env("PATH", super::SANDBOX_PATH)
        .envs(super::log_settings())
        .current_dir("/")
        .exec();
    Err(format!("cannot exec {ENVD_IN_SANDBOX} as pid 1: {err}"))
}

/// Pid 1 once the sandbox is set up (`sandbox-init --reap -- ENVD_ARGS`):
/// starts envd with the descriptors it was left (stdin, the console,
/// envd's listeners), keeps none of them itself, and reaps every orphan
/// until envd exits.
fn reap(envd_args: &[&OsString]) -> Result<ExitCode, String> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    let mut envd = std::process::Command::new(ENVD_IN_SANDBOX);
    envd.arg("envd")
        .args(envd_args)
        .env_clear()
        .env("PATH", super::SANDBOX_PATH)
        .env("LISTEN_FDS", "2")
        .env("LISTEN_FDS_FIRST_FD", FD_API.to_string())
        .current_dir("/");
    for (k, v) in super::log_settings() {
        envd.env(k, v);
    }
    let child = envd
        .spawn()
        .map_err(|e| format!("cannot start envd: {e}"))?;
    let envd_pid = nix::unistd::Pid::from_raw(child.id() as i32);
    // envd has its own copies: pid 1 holds nothing a process of the
    // sandbox could reopen through `/proc/1/fd`.
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("/dev/null: {e}"))?;
    nix::unistd::dup2_stdin(&null).map_err(|e| format!("dup2: {e}"))?;
    nix::unistd::dup2_stdout(&null).map_err(|e| format!("dup2: {e}"))?;
    nix::unistd::dup2_stderr(&null).map_err(|e| format!("dup2: {e}"))?;
    drop(null);
    warren_sys::close_from(FD_API as u32).map_err(|e| format!("close_range: {e}"))?;
    // Pid 1 reaps every orphan; it ends when envd does.
    loop {
        use nix::sys::wait::{waitpid, WaitStatus};
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == envd_pid => {
                return Ok(ExitCode::from(code.clamp(0, 255) as u8))
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == envd_pid => {
                return Ok(ExitCode::from(128 + sig as u8))
            }
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(format!("waitpid: {e}")),
        }
    }
}

async fn read_byte(
    out: &mut tokio::process::ChildStdout,
    want: u8,
    what: &str,
) -> Result<(), RuntimeError> {
    let fail = |m: String| RuntimeError::Spawn {
        what: what.to_string(),
        source: std::io::Error::other(m),
    };
    let mut b = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(10), out.read_exact(&mut b)).await {
        Ok(Ok(_)) if b[0] == want => Ok(()),
        Ok(_) => Err(fail(
            "exited before it was ready (its error is in the node's log)".into(),
        )),
        Err(_) => Err(fail("was not ready within 10s".into())),
    }
}

/// Attaches each volume the node passed (see the module doc) at its path,
/// made a directory first. Runs after the pivot: every path is inside the
/// sandbox's root, so whatever the sandbox's files hold there (a fork's or
/// a rebooted sandbox's own symlinks) leads only to its own files.
fn mount_volumes() -> Result<(), String> {
    let paths = std::fs::read_to_string(format!("/proc/self/fd/{FD_VOLUME_PATHS}"))
        .map_err(|e| format!("cannot read the volume paths: {e}"))?;
    for (i, path) in paths.lines().filter(|l| !l.is_empty()).enumerate() {
        std::fs::create_dir_all(path)
            .map_err(|e| format!("cannot make the volume mount point {path}: {e}"))?;
        attach(FD_VOLUME_FIRST + i as i32, path)?;
    }
    Ok(())
}

/// Attaches the detached mount the node passed as descriptor `fd` at `at`.
fn attach(fd: i32, at: &str) -> Result<(), String> {
    let file = std::fs::File::open(format!("/proc/self/fd/{fd}"));
    // The descriptor is an `open_tree` clone: reopening it through /proc
    // gives a new description of the same detached tree.
    let file = file.map_err(|e| format!("descriptor {fd}: {e}"))?;
    warren_sys::move_mount_to(&file, std::path::Path::new(at))
        .map_err(|e| format!("attach descriptor {fd} at {at}: {e}"))
}

/// The node's half of the holder: waits until it has unshared its user
/// namespace, maps `base..base+65536` into it and returns the namespace.
pub async fn map_holder(
    holder: &mut tokio::process::Child,
    base: u32,
) -> Result<std::fs::File, RuntimeError> {
    let fail = |m: String| RuntimeError::Spawn {
        what: "the sandbox's user namespace".into(),
        source: std::io::Error::other(m),
    };
    let pid = holder
        .id()
        .ok_or_else(|| fail("its holder exited at once".into()))?;
    let out = holder
        .stdout
        .as_mut()
        .ok_or_else(|| fail("no control pipe".into()))?;
    read_byte(out, b'R', "the sandbox's user namespace").await?;
    let line = format!("0 {base} {IDS_PER_SANDBOX}\n");
    for map in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{map}");
        std::fs::write(&path, &line).map_err(|e| fail(format!("cannot write {path}: {e}")))?;
    }
    std::fs::File::open(format!("/proc/{pid}/ns/user"))
        .map_err(|e| fail(format!("cannot open it: {e}")))
}

/// Waits until the launcher has made the sandbox's namespaces.
pub async fn namespaces_ready(launcher: &mut tokio::process::Child) -> Result<(), RuntimeError> {
    let out = launcher
        .stdout
        .as_mut()
        .ok_or_else(|| RuntimeError::Spawn {
            what: "the sandbox launcher".into(),
            source: std::io::Error::other("no control pipe"),
        })?;
    read_byte(out, b'N', "the sandbox launcher").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_args_round_trip() {
        let a = LaunchArgs {
            hold: false,
            cgroup_procs: vec!["/sys/fs/cgroup/x/cgroup.procs".into()],
            base: 2_000_000_000,
            volumes: 2,
            hostname: "abc".into(),
            envd_args: vec!["--root".into(), "/".into()],
            dns: Some("10.0.2.3".into()),
        };
        let argv = a.to_argv();
        assert_eq!(LaunchArgs::parse(&argv[1..]).unwrap(), a);
        assert!(
            LaunchArgs::parse(&["--hostname".into(), "x".into()]).is_err(),
            "no base"
        );
    }
}
