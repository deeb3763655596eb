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

use super::limits::find_program;
use super::{
    procs, EnvdStdin, Handle, LaunchSpec, Launched, Paths, Runtime, RuntimeError, RuntimeKind,
};
use futures_util::future::BoxFuture;
use std::ffi::OsString;
use std::path::PathBuf;

/// See the module doc.
pub struct Process {
    /// The `setsid` program (util-linux), so envd leads a session that
    /// delete can find; without it envd gets its own process group only.
    setsid: Option<PathBuf>,
    /// The `setpriv` program (util-linux), to give envd a parent-death
    /// signal: envd dies with the node even when the node is SIGKILLed.
    setpriv: Option<PathBuf>,
}

impl Process {
    pub fn new() -> Process {
        Process {
            setsid: find_program("setsid"),
            setpriv: find_program("setpriv"),
        }
    }

    async fn start(&self, spec: &LaunchSpec<'_>) -> Result<Launched, RuntimeError> {
        let p = spec.paths;
        if !spec.volumes.is_empty() {
            return Err(RuntimeError::Unsupported(
                "the process runtime cannot mount volumes (its sandboxes share the node's \
                 filesystem, with no mount namespace to bind a volume into); run the node with \
                 --runtime isolated"
                    .into(),
            ));
        }
        if !crate::sandbox::files::template_known(spec.template_id) {
            return Err(RuntimeError::Template(format!(
                "unknown template {:?}: the process runtime has only \"base\"",
                spec.template_id
            )));
        }
        {
            let (paths, parent) = (p.clone(), spec.parent.map(|(pp, _)| pp.clone()));
            tokio::task::spawn_blocking(move || {
                let r = crate::sandbox::files::prepare(&paths, parent.as_ref());
                if r.is_err() {
                    let _ = crate::sandbox::files::remove(&paths);
                }
                r
            })
            .await
            .map_err(|e| RuntimeError::Files(std::io::Error::other(e)))?
            .map_err(RuntimeError::Files)?;
        }
        let listeners = super::bind_envd_sockets(p).map_err(RuntimeError::Files)?;
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
                "--inherited-sockets",
                "--settings-on-stdin",
                "--root",
                &p.fs.to_string_lossy(),
                "--max-output-bytes",
                &spec.max_output_bytes.to_string(),
            ]
            .map(OsString::from),
        );
        let mut command = tokio::process::Command::new(&cmd[0]);
        command
            .args(&cmd[1..])
            .current_dir(&p.home)
            .env_clear()
            .env(
                "PATH",
                std::env::var_os("PATH").unwrap_or_else(|| super::SANDBOX_PATH.into()),
            )
            .env("HOME", &p.home)
            .env("LANG", "C.UTF-8")
            .env(procs::MARK_ENV, spec.mark)
            .envs(super::log_settings())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if self.setsid.is_none() {
            command.process_group(0);
        }
        super::pass_fds(&mut command, listeners, Vec::new())?;
        let mut child = command.spawn().map_err(|source| RuntimeError::Spawn {
            what: format!("envd ({})", spec.envd_bin.display()),
            source,
        })?;
        if let Some(err) = child.stderr.take() {
            super::console::relay(spec.sandbox_id, "stderr", err);
        }
        let pid = child.id().map(|p| p as i32).unwrap_or(0);
        let handle = Handle {
            runtime: RuntimeKind::Process,
            pid,
            start_time: procs::stat(pid).map(|s| s.start_time).unwrap_or(0),
            pid_ns: None,
            session: false,
            cgroup: None,
            mark: spec.mark.to_string(),
            id_base: None,
            id_slot: None,
            template: None,
            layers: Vec::new(),
            defaults: None,
            volumes: Vec::new(),
            leases: Vec::new(),
        };
        super::send_stdin(
            &mut child.stdin,
            &EnvdStdin {
                access_token: spec.access_token,
                env_vars: spec.env_vars,
                // Only `base`, which starts nothing.
                start: None,
                default_user: None,
                default_workdir: None,
            },
        )
        .await?;
        Ok(Launched {
            handle,
            child: Some(child),
            ids: None,
            egress: None,
            ready_within: None,
        })
    }
}

impl Default for Process {
    fn default() -> Self {
        Process::new()
    }
}

impl Runtime for Process {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec<'a>,
    ) -> BoxFuture<'a, Result<Launched, RuntimeError>> {
        Box::pin(self.start(spec))
    }

    fn settle(&self, handle: &mut Handle) {
        // Only now (envd answers) has the exec chain reached setsid.
        handle.session = procs::stat(handle.pid).is_some_and(|s| s.session == handle.pid);
    }

    fn destroy(&self, paths: &Paths, handle: Option<&Handle>) -> Result<(), RuntimeError> {
        let killed = handle.map(super::kill).unwrap_or(Ok(()));
        crate::sandbox::files::remove(paths).map_err(RuntimeError::Files)?;
        killed
    }
}
