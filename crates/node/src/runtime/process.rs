//! The `process` runtime: no isolation. envd runs on the host as the node's
//! user, in its own session, with `--root <sandbox>/fs` so client paths such
//! as `/home/user/x` resolve inside the sandbox's directory (envd keeps `..`
//! and symlinks from escaping it). Code the sandbox runs can see and touch
//! everything the node's user can: use it only where bubblewrap cannot run.
//!
//! envd gets a parent-death signal (`setpriv --pdeathsig KILL`), so it dies
//! with the node; what it started is killed at the node's shutdown, or found
//! by its `WARREN_SANDBOX` mark and killed when the next node process cleans
//! up the sandbox's directory.

use super::limits::{find_program, LimitPlan};
use super::{procs, Handle, LaunchSpec, Launched, Runtime, RuntimeError, RuntimeKind};
use std::ffi::OsString;
use std::path::PathBuf;

/// See the module doc.
pub struct Process {
    limits: LimitPlan,
    /// The `setsid` program (util-linux), so envd leads a session that
    /// delete can find; without it envd gets its own process group only.
    setsid: Option<PathBuf>,
    /// The `setpriv` program (util-linux), to give envd a parent-death
    /// signal: envd dies with the node even when the node is SIGKILLed.
    setpriv: Option<PathBuf>,
}

impl Process {
    pub fn new(limits: LimitPlan) -> Process {
        Process {
            limits,
            setsid: find_program("setsid"),
            setpriv: find_program("setpriv"),
        }
    }
}

impl Runtime for Process {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    fn launch(&self, spec: &LaunchSpec<'_>) -> Result<Launched, RuntimeError> {
        let p = spec.paths;
        let mut cmd: Vec<OsString> = Vec::new();
        if let Some(setpriv) = &self.setpriv {
            cmd.push(setpriv.clone().into_os_string());
            cmd.extend(["--pdeathsig", "KILL", "--"].map(OsString::from));
        }
        if let Some(setsid) = &self.setsid {
            cmd.push(setsid.clone().into_os_string());
        }
        cmd.push(spec.envd_bin.as_os_str().to_owned());
        cmd.extend(
            [
                "envd",
                "--socket",
                &p.envd_sock.to_string_lossy(),
                "--relay-socket",
                &p.relay_sock.to_string_lossy(),
                "--root",
                &p.fs.to_string_lossy(),
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
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .current_dir(&p.home)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| super::SANDBOX_PATH.into()),
            )
            .env("HOME", &p.home)
            .env("LANG", "C.UTF-8");
        if self.setsid.is_none() {
            command.process_group(0);
        }
        super::spawn_envd(
            command,
            spec,
            RuntimeKind::Process,
            format!("envd ({})", spec.envd_bin.display()),
            cgroup,
        )
    }

    fn settle(&self, handle: &mut Handle) {
        // Only now (envd answers) has the exec chain reached setsid.
        handle.session = procs::stat(handle.pid).is_some_and(|s| s.session == handle.pid);
    }
}
