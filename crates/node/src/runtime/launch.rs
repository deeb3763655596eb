//! `warren sandbox-launch`: the first process of a `bwrap` sandbox, and the
//! node's side of starting it.
//!
//! The launcher runs as host root with a cleared environment (nothing a
//! tenant supplied is in its environment or argv) and does, in order:
//! 1. enters the sandbox's cgroups (so nothing it starts can be outside them),
//! 2. sets `RLIMIT_CORE` to 0,
//! 3. unshares a mount namespace of its own and mounts a tmpfs on the
//!    stage dir ([`STAGE`]) with the sandbox's root and envd's binary bound
//!    into it: those live under the node's data dir, which the sandbox's
//!    ids may not traverse, and bwrap (running as one of them) binds them
//!    from the stage instead,
//! 4. `unshare(CLONE_NEWUSER)`: a user namespace whose ids the *node* then
//!    maps to the sandbox's own range of host ids (`0..65536` inside →
//!    `base..base+65536` on the host; see [`crate::runtime::ids`]),
//! 5. tells the node it is ready (a byte on stdout) and waits for the node's
//!    go (a byte on stdin) — the node writes `uid_map`/`gid_map` in between,
//! 6. becomes root *of that namespace* (`setresgid`/`setgroups`/`setresuid`
//!    to 0: host uid `base`, no capability outside the namespace),
//! 7. points stdout at `/dev/null` and execs the program (bwrap); stdin
//!    stays: the node writes envd's settings there next.
//!
//! No exec happens between `unshare` and `setresuid`, so the process keeps
//! the capabilities the new namespace gave it; after the exec, bwrap runs
//! as uid 0 of the namespace with full capabilities there and none outside.

use super::RuntimeError;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The hidden subcommand name (`warren sandbox-launch`).
pub const SUBCOMMAND: &str = "sandbox-launch";

/// Where the launcher stages what bwrap binds (see the module doc). An
/// empty directory on the host; only the launcher's own mount namespace
/// has anything mounted there.
pub const STAGE: &str = "/run/warren/stage";

/// How many ids each sandbox's user namespace maps.
pub const IDS_PER_SANDBOX: u32 = 65536;

/// The launcher's command line, as the node builds it.
#[derive(Debug, Clone, Default)]
pub struct LaunchArgs {
    /// `cgroup.procs` files to write the launcher's pid into.
    pub cgroup_procs: Vec<PathBuf>,
    /// `(source, name)`: bind `source` at `STAGE/name`.
    pub stage: Vec<(PathBuf, String)>,
    /// The program and its argv.
    pub program: Vec<OsString>,
}

impl LaunchArgs {
    /// `[--cgroup PATH]... -- PROGRAM ARGS...`
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![SUBCOMMAND.into()];
        for p in &self.cgroup_procs {
            v.push("--cgroup".into());
            v.push(p.clone().into_os_string());
        }
        for (src, name) in &self.stage {
            v.push("--stage".into());
            v.push(src.clone().into_os_string());
            v.push(name.into());
        }
        v.push("--".into());
        v.extend(self.program.iter().cloned());
        v
    }

    fn parse(args: &[OsString]) -> Result<LaunchArgs, String> {
        let mut out = LaunchArgs::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.to_str() {
                Some("--cgroup") => out
                    .cgroup_procs
                    .push(PathBuf::from(it.next().ok_or("--cgroup needs a path")?)),
                Some("--stage") => {
                    let src = PathBuf::from(it.next().ok_or("--stage needs a source")?);
                    let name = it
                        .next()
                        .and_then(|n| n.to_str())
                        .filter(|n| !n.is_empty() && !n.contains('/') && *n != "..")
                        .ok_or("--stage needs a plain name")?;
                    out.stage.push((src, name.to_string()));
                }
                Some("--") => {
                    out.program = it.cloned().collect();
                    break;
                }
                _ => return Err(format!("unexpected argument {a:?}")),
            }
        }
        if out.program.is_empty() {
            return Err("no program after --".into());
        }
        Ok(out)
    }
}

/// The launcher's `main` (see the module doc). `args` excludes the program
/// name and the subcommand. Only returns on failure.
pub fn main(args: &[OsString]) -> ExitCode {
    match run(args) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("warren sandbox-launch: {e}");
            ExitCode::from(70)
        }
    }
}

fn run(args: &[OsString]) -> Result<std::convert::Infallible, String> {
    use nix::sched::{unshare, CloneFlags};
    use nix::unistd::{Gid, Uid};
    use std::io::Write;
    use std::os::fd::AsFd;

    let a = LaunchArgs::parse(args)?;
    let me = std::process::id().to_string();
    for procs in &a.cgroup_procs {
        std::fs::write(procs, &me)
            .map_err(|e| format!("cannot enter cgroup {}: {e}", procs.display()))?;
    }
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0)
        .map_err(|e| format!("setrlimit(RLIMIT_CORE): {e}"))?;
    if !a.stage.is_empty() {
        stage(&a.stage)?;
    }
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| format!("unshare(CLONE_NEWUSER): {e}"))?;
    std::io::stdout()
        .write_all(b"R")
        .and_then(|_| std::io::stdout().flush())
        .map_err(|e| format!("cannot tell the node: {e}"))?;
    // One unbuffered byte: what follows on stdin is envd's, not ours.
    let mut go = [0u8; 1];
    let n = nix::unistd::read(std::io::stdin().as_fd(), &mut go)
        .map_err(|e| format!("the node did not map the namespace: {e}"))?;
    if n != 1 || go[0] != b'G' {
        return Err("the node refused to map the namespace".into());
    }
    let root_g = Gid::from_raw(0);
    let root_u = Uid::from_raw(0);
    nix::unistd::setresgid(root_g, root_g, root_g).map_err(|e| format!("setresgid: {e}"))?;
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    nix::unistd::setresuid(root_u, root_u, root_u).map_err(|e| format!("setresuid: {e}"))?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("/dev/null: {e}"))?;
    nix::unistd::dup2_stdout(&null).map_err(|e| format!("dup2: {e}"))?;
    let argv: Vec<CString> = a
        .program
        .iter()
        .map(|s| CString::new(s.as_bytes()).map_err(|_| format!("NUL in argument {s:?}")))
        .collect::<Result<_, _>>()?;
    let e = nix::unistd::execv(&argv[0], &argv).map_err(|e| e.to_string());
    Err(format!(
        "cannot exec {:?}: {}",
        a.program[0],
        e.err().unwrap_or_default()
    ))
}

/// Step 2b of the module doc.
fn stage(binds: &[(PathBuf, String)]) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make / a slave mount: {e}"))?;
    mount(
        Some("tmpfs"),
        STAGE,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=64k,mode=0755"),
    )
    .map_err(|e| format!("cannot mount a tmpfs at {STAGE}: {e}"))?;
    for (src, name) in binds {
        let dst = PathBuf::from(STAGE).join(name);
        let made = if src.is_dir() {
            std::fs::create_dir(&dst)
        } else {
            std::fs::write(&dst, b"")
        };
        made.map_err(|e| format!("cannot create {}: {e}", dst.display()))?;
        mount(
            Some(src.as_path()),
            &dst,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("cannot bind {} at {}: {e}", src.display(), dst.display()))?;
    }
    Ok(())
}

/// The node's half: after the launcher (spawned with piped stdin and stdout)
/// has unshared its user namespace, maps `base..base+65536` into it and lets
/// it go on.
pub async fn map_ids(child: &mut tokio::process::Child, base: u32) -> Result<(), RuntimeError> {
    let fail = |what: String| RuntimeError::Spawn {
        what: "the sandbox launcher".into(),
        source: std::io::Error::other(what),
    };
    let pid = child.id().ok_or_else(|| fail("exited at once".into()))?;
    // stdout is only for this; stdin carries envd's settings next, so it stays.
    let (Some(mut out), Some(inp)) = (child.stdout.take(), child.stdin.as_mut()) else {
        return Err(fail("has no control pipes".into()));
    };
    let mut ready = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(10), out.read_exact(&mut ready)).await {
        Ok(Ok(_)) if ready[0] == b'R' => {}
        Ok(_) => return Err(fail("exited before its user namespace existed".into())),
        Err(_) => return Err(fail("did not create its user namespace within 10s".into())),
    }
    let line = format!("0 {base} {IDS_PER_SANDBOX}\n");
    for map in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{map}");
        std::fs::write(&path, &line).map_err(|e| fail(format!("cannot write {path}: {e}")))?;
    }
    inp.write_all(b"G")
        .await
        .map_err(|e| fail(format!("cannot release it: {e}")))?;
    Ok(())
}
