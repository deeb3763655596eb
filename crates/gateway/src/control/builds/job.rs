//! A started build, run to its end in the background: a sandbox of the
//! team from the parent template, driven through this gateway's own
//! listener with the team's key; each step run with envd; the result
//! snapshotted and recorded as the team's template (see the module doc of
//! `builds`).

use super::super::catalog;
use super::ledger::Running;
use super::plan::{copy_base, Plan, Step};
use super::{tagged, BUILT_SOURCE};
use crate::limits::SandboxCaps;
use crate::state::App;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use warren_proto::scheduler::v1 as pb;
use warren_template::spec::Defaults;
use warren_template::{Snapshot, Template};

/// Most output of one step kept for the log, in bytes.
const MAX_STEP_OUTPUT: usize = 1024 * 1024;
/// Longest log line kept, in bytes.
const MAX_LINE: usize = 4096;
/// How long the build sandbox may live.
const SANDBOX_TIMEOUT_SECS: u64 = 3600;
/// How much of a COPY archive one envd upload carries (the gateway holds
/// one chunk in memory at a time).
const COPY_CHUNK: usize = 8 * 1024 * 1024;

/// A started build, run to its end in the background.
pub(super) struct Job {
    pub(super) app: Arc<App>,
    /// The build's log and lease.
    pub(super) log: Running,
    pub(super) build_id: String,
    pub(super) team: String,
    pub(super) name: String,
    pub(super) tags: Vec<String>,
    pub(super) self_url: String,
    pub(super) key: String,
    pub(super) parent: Template,
    pub(super) cpu_count: u32,
    pub(super) memory_mb: u64,
    /// What a team's template may have at most (its disk is its parent's).
    pub(super) caps: SandboxCaps,
    pub(super) plan: Plan,
    /// The uploads its COPY steps read, as claimed.
    pub(super) uploads: Vec<pb::Upload>,
    /// Their archives by files hash (fetched at the start), with their
    /// sizes.
    pub(super) files: HashMap<String, (Arc<std::fs::File>, u64)>,
}

/// Why a build failed: the message and the step (1-based) it failed at.
type Failure = (String, Option<String>);

impl Job {
    pub(super) async fn run(mut self) {
        for u in std::mem::take(&mut self.uploads) {
            match self.app.uploads.open(&u).await {
                Ok((file, size)) => {
                    self.files
                        .insert(u.files_hash.clone(), (Arc::new(file), size));
                }
                Err(e) => return self.finish(Err((e, None))).await,
            }
        }
        let client = match warren_client::ClientBuilder::new(&[self.self_url.as_str()])
            .api_key(self.key.clone())
            .attempts(1)
            .timeout(Duration::from_secs(600))
            .build()
        {
            Ok(c) => c,
            Err(e) => return self.finish(Err((format!("cannot start: {e}"), None))).await,
        };
        let new = warren_client::NewSandbox {
            template_id: self.plan.from.clone(),
            timeout: SANDBOX_TIMEOUT_SECS,
            ..Default::default()
        };
        self.log(
            "info",
            format!("starting a build sandbox from {}", self.plan.from),
        );
        let sandbox = match client.create(&new, &self.build_id).await {
            Ok(c) => c.sandbox,
            Err(e) => {
                return self
                    .finish(Err((format!("cannot start the build sandbox: {e}"), None)))
                    .await
            }
        };
        let result = self.steps(&client, &sandbox).await;
        if let Err(e) = client.kill(&sandbox.sandbox_id).await {
            tracing::warn!(sandbox = %sandbox.sandbox_id, error = %e, "cannot kill a build sandbox");
        }
        match &result {
            Ok(()) => {
                self.log("info", format!("template {} built", self.name));
                tracing::info!(template = %self.name, build = %self.build_id, "template built");
            }
            Err((m, _)) => {
                tracing::info!(template = %self.name, build = %self.build_id, error = %m, "template build failed")
            }
        }
        self.finish(result).await;
    }

    async fn finish(self, result: Result<(), Failure>) {
        self.log.finish(result).await;
    }

    fn log(&self, level: &'static str, m: String) {
        self.log.log(level, m);
    }

    /// Runs `cmd` in the sandbox; its output goes to the log.
    async fn exec(
        &self,
        client: &warren_client::Client,
        sandbox: &warren_client::Sandbox,
        command: warren_client::Command,
    ) -> Result<i32, String> {
        let mut stream = client
            .run(sandbox, command)
            .await
            .map_err(|e| e.to_string())?;
        // Output goes to the log line by line; a step's output past
        // MAX_STEP_OUTPUT is read and dropped (the gateway's memory is not
        // the tenant's to fill).
        let (mut pending, mut kept, mut dropped) = (Vec::new(), 0usize, 0u64);
        loop {
            match stream.next().await.map_err(|e| e.to_string())? {
                Some(
                    warren_client::StreamEvent::Stdout(b) | warren_client::StreamEvent::Stderr(b),
                ) => {
                    let room = MAX_STEP_OUTPUT.saturating_sub(kept);
                    let take = b.len().min(room);
                    pending.extend_from_slice(&b[..take]);
                    kept += take;
                    dropped += (b.len() - take) as u64;
                    while let Some(i) = pending.iter().position(|&c| c == b'\n') {
                        let line: Vec<u8> = pending.drain(..=i).collect();
                        self.log_output(&line[..i]);
                    }
                }
                Some(warren_client::StreamEvent::End(exit)) => {
                    if !pending.is_empty() {
                        self.log_output(&pending);
                    }
                    if dropped > 0 {
                        self.log("warn", format!("({dropped} more bytes of output not kept)"));
                    }
                    if let Some(e) = exit.error.filter(|e| !e.is_empty()) {
                        if exit.exit_code == 0 {
                            return Err(e);
                        }
                    }
                    return Ok(exit.exit_code);
                }
                Some(_) => {}
                None => return Err("the command's stream ended without its exit".into()),
            }
        }
    }

    /// One line of a step's output, cut at MAX_LINE bytes.
    fn log_output(&self, line: &[u8]) {
        let line = &line[..line.len().min(MAX_LINE)];
        let text = String::from_utf8_lossy(line);
        self.log("info", text.trim_end_matches('\r').to_string());
    }

    /// `script` with `args` as `$1...`, as root (the bookkeeping steps).
    fn as_root(script: &str, args: &[&str]) -> warren_client::Command {
        let mut a = vec!["-c".to_string(), script.to_string(), "sh".to_string()];
        a.extend(args.iter().map(|s| s.to_string()));
        warren_client::Command {
            cmd: "/bin/sh".into(),
            args: a,
            user: Some("root".into()),
            cwd: Some("/".into()),
            ..Default::default()
        }
    }

    async fn steps(
        &self,
        client: &warren_client::Client,
        sandbox: &warren_client::Sandbox,
    ) -> Result<(), Failure> {
        let d = &self.parent.defaults;
        let (mut user, mut workdir, mut env) = (d.user.clone(), d.workdir.clone(), d.env.clone());
        let total = self.plan.steps.len();
        for (i, step) in self.plan.steps.iter().enumerate() {
            let n = i + 1;
            let at = Some(n.to_string());
            self.log("info", format!("[{n}/{total}] {}", step.describe()));
            match step {
                Step::Run { cmd, user: as_user } => {
                    let u = as_user.clone().unwrap_or_else(|| user.clone());
                    let known = self
                        .exec(
                            client,
                            sandbox,
                            Self::as_root("id -u -- \"$1\" >/dev/null 2>&1", &[&u]),
                        )
                        .await
                        .map_err(|e| (format!("step {n}: {e}"), at.clone()))?;
                    if known != 0 {
                        // E2B's words, which its SDK tests look for.
                        return Err((
                            format!(
                                "failed to run command '{cmd}': command failed: unauthenticated: \
                                 invalid username: '{u}'"
                            ),
                            at,
                        ));
                    }
                    let command = warren_client::Command {
                        cmd: "/bin/bash".into(),
                        args: vec!["-c".into(), cmd.clone()],
                        envs: env.clone().into_iter().collect(),
                        cwd: Some(workdir.clone()),
                        user: Some(u),
                        ..Default::default()
                    };
                    let code = self
                        .exec(client, sandbox, command)
                        .await
                        .map_err(|e| (format!("failed to run command '{cmd}': {e}"), at.clone()))?;
                    if code != 0 {
                        return Err((
                            format!("failed to run command '{cmd}': exit status {code}"),
                            at,
                        ));
                    }
                }
                Step::Env(vars) => env.extend(vars.iter().cloned()),
                Step::Workdir(dir) => {
                    let dir = if dir.starts_with('/') {
                        dir.clone()
                    } else {
                        format!("{}/{dir}", workdir.trim_end_matches('/'))
                    };
                    // Made (and given to the current user) when missing.
                    let code = self
                        .exec(
                            client,
                            sandbox,
                            Self::as_root(
                                "[ -d \"$1\" ] || { mkdir -p -- \"$1\" && chown -- \"$2\" \"$1\"; }",
                                &[&dir, &user],
                            ),
                        )
                        .await
                        .map_err(|e| (format!("step {n}: {e}"), at.clone()))?;
                    if code != 0 {
                        return Err((format!("cannot make the workdir {dir:?}"), at));
                    }
                    workdir = dir;
                }
                Step::User(u) => {
                    // E2B's USER makes the user when the image lacks it.
                    let code = self
                        .exec(
                            client,
                            sandbox,
                            Self::as_root(
                                "id -u -- \"$1\" >/dev/null 2>&1 || useradd -m -s /bin/bash -- \"$1\"",
                                &[u],
                            ),
                        )
                        .await
                        .map_err(|e| (format!("step {n}: {e}"), at.clone()))?;
                    if code != 0 {
                        return Err((format!("cannot make the user {u:?}"), at));
                    }
                    user = u.clone();
                }
                Step::Copy {
                    src,
                    dest,
                    owner,
                    mode,
                    hash,
                } => {
                    self.copy(
                        client,
                        sandbox,
                        n,
                        (src, dest),
                        owner,
                        mode,
                        hash,
                        &user,
                        &workdir,
                    )
                    .await
                    .map_err(|m| (m, at.clone()))?;
                }
            }
        }
        self.log("info", "saving the template".into());
        self.record(client, sandbox, user, workdir, env)
            .await
            .map_err(|m| (m, None))
    }

    /// A COPY step (see the module's doc): the archive into a fresh
    /// directory, unpacked there by `tar` as the owner, moved into place
    /// as root; the directory removed either way.
    #[allow(clippy::too_many_arguments)]
    async fn copy(
        &self,
        client: &warren_client::Client,
        sandbox: &warren_client::Sandbox,
        n: usize,
        (src, dest): (&str, &str),
        owner: &Option<String>,
        mode: &Option<String>,
        hash: &str,
        user: &str,
        workdir: &str,
    ) -> Result<(), String> {
        let owner = owner.clone().unwrap_or_else(|| user.to_string());
        let (as_user, group) = match owner.split_once(':') {
            Some((u, g)) => (u.to_string(), g.to_string()),
            None => (owner.clone(), owner.clone()),
        };
        let step = |e: String| format!("step {n}: {e}");
        let known = self
            .exec(
                client,
                sandbox,
                Self::as_root("id -u -- \"$1\" >/dev/null 2>&1", &[&as_user]),
            )
            .await
            .map_err(step)?;
        if known != 0 {
            return Err(format!(
                "failed to copy '{src}': invalid username: '{as_user}'"
            ));
        }
        let tmp = format!("/tmp/.warren-copy-{}-{n}", self.build_id);
        let result = self
            .copy_in(
                client,
                sandbox,
                &tmp,
                (src, dest),
                &as_user,
                &group,
                mode,
                hash,
                workdir,
            )
            .await;
        if let Err(e) = self
            .exec(client, sandbox, Self::as_root("rm -rf -- \"$1\"", &[&tmp]))
            .await
        {
            tracing::warn!(build = %self.build_id, error = %e, "cannot remove a COPY step's temporary directory");
        }
        result.map_err(|e| format!("failed to copy '{src}': {e}"))
    }

    #[allow(clippy::too_many_arguments)]
    async fn copy_in(
        &self,
        client: &warren_client::Client,
        sandbox: &warren_client::Sandbox,
        tmp: &str,
        (src, dest): (&str, &str),
        as_user: &str,
        group: &str,
        mode: &Option<String>,
        hash: &str,
        workdir: &str,
    ) -> Result<(), String> {
        let Some((file, size)) = self.files.get(hash).cloned() else {
            return Err(format!("no upload of the files with hash {hash}"));
        };
        // The archive goes in as opaque bytes, chunk by chunk (read with
        // pread: the gateway holds one chunk at a time).
        let (mut at, mut part, mut gzip) = (0u64, 0usize, false);
        while at < size {
            let len = (size - at).min(COPY_CHUNK as u64) as usize;
            let f = file.clone();
            let chunk = tokio::task::spawn_blocking(move || {
                use std::os::unix::fs::FileExt;
                let mut buf = vec![0u8; len];
                f.read_exact_at(&mut buf, at).map(|_| buf)
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot read the uploaded archive: {e}"))?;
            if at == 0 {
                gzip = chunk.starts_with(&[0x1f, 0x8b]);
            }
            client
                .write_file(
                    sandbox,
                    &format!("{tmp}/p{part:06}"),
                    as_user,
                    bytes::Bytes::from(chunk),
                )
                .await
                .map_err(|e| format!("cannot write the archive into the build sandbox: {e}"))?;
            at += len as u64;
            part += 1;
        }
        if part == 0 {
            return Err("the uploaded archive is empty".into());
        }
        // Unpacked by the owner, in the sandbox.
        let unpack = warren_client::Command {
            cmd: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "mkdir -- \"$1/unpack\" && cat -- \"$1\"/p* | tar -x $2 -p -f - -C \"$1/unpack\""
                    .into(),
                "sh".into(),
                tmp.to_string(),
                if gzip { "-z" } else { "" }.to_string(),
            ],
            user: Some(as_user.to_string()),
            cwd: Some("/".into()),
            ..Default::default()
        };
        let code = self.exec(client, sandbox, unpack).await?;
        if code != 0 {
            return Err(format!(
                "tar could not unpack the uploaded archive (exit {code})"
            ));
        }
        let target = if dest.starts_with('/') {
            dest.to_string()
        } else {
            format!("{}/{dest}", workdir.trim_end_matches('/'))
        };
        let base = copy_base(src);
        let code = self
            .exec(
                client,
                sandbox,
                Self::as_root(
                    MOVE_SCRIPT,
                    &[
                        tmp,
                        &base,
                        &target,
                        &format!("{as_user}:{group}"),
                        mode.as_deref().unwrap_or(""),
                    ],
                ),
            )
            .await?;
        if code != 0 {
            return Err(format!("cannot move the files to {target:?} (exit {code})"));
        }
        Ok(())
    }

    /// Snapshots the sandbox and records its root under the team's name
    /// with the defaults the steps set.
    async fn record(
        &self,
        client: &warren_client::Client,
        sandbox: &warren_client::Sandbox,
        user: String,
        workdir: String,
        env: BTreeMap<String, String>,
    ) -> Result<(), String> {
        let answer = client
            .post_json(
                &format!("/sandboxes/{}/snapshots", sandbox.sandbox_id),
                &serde_json::json!({}),
            )
            .await
            .map_err(|e| format!("cannot save the build sandbox's files: {e}"))?;
        let snap_id = answer["snapshotID"]
            .as_str()
            .ok_or_else(|| format!("the snapshot answer has no snapshotID: {answer}"))?
            .to_string();
        let (snap, snap_version) = catalog::get(&self.app, &snap_id)
            .await
            .map_err(|e| format!("cannot read the build's snapshot {snap_id}: {}", e.message))?
            .ok_or_else(|| format!("the build's snapshot {snap_id} is gone"))?;
        let mut defaults = Defaults {
            user,
            workdir,
            env,
            start_cmd: self.plan.start_cmd.clone(),
            ready_cmd: self.plan.ready_cmd.clone(),
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            ..self.parent.defaults.clone()
        };
        // The parent's disk, and anything else, at most what a team's
        // template may have.
        self.caps.bound(&mut defaults);
        let mut template = Template {
            name: String::new(),
            digest: snap.digest.clone(),
            defaults,
            created_at_ms: warren_core::time::now_ms() as u64,
            source: format!("{BUILT_SOURCE} {} (from {})", self.build_id, self.plan.from),
            layers: snap.layers.clone(),
            snapshot: Some(Snapshot {
                team: self.team.clone(),
                name: None,
                source_sandbox: sandbox.sandbox_id.clone(),
                node_id: snap
                    .snapshot
                    .as_ref()
                    .map(|s| s.node_id.clone())
                    .unwrap_or_default(),
                paused: None,
                // A build of a published template is published too.
                public: super::super::manage::is_public(&self.app, &self.team, &self.name)
                    .await
                    .unwrap_or(false),
            }),
            images: Vec::new(),
        };
        let names: Vec<String> = self.tags.iter().map(|t| tagged(&self.name, t)).collect();
        let team = crate::auth::Team(self.team.clone());
        let mut put = super::room_for_templates(&self.app, &team, &names)
            .await
            .map_err(|e| e.message);
        if put.is_ok() {
            for called in names {
                template.name = warren_template::named_snapshot_key(&self.team, &called);
                if let Some(s) = template.snapshot.as_mut() {
                    s.name = Some(called);
                }
                // A rebuild replaces the tag's record (as read now).
                let step = async {
                    let expected = catalog::get(&self.app, &template.name)
                        .await?
                        .map_or(0, |(_, v)| v);
                    super::put_built(&self.app, &template, expected).await
                };
                put = put.and(step.await.map_err(|e| e.message));
            }
        }
        // The build's snapshot record is done with; its layers are the
        // template's now, or, when nothing was recorded, nobody's.
        if put.is_ok() {
            if let Err(e) = catalog::remove(&self.app, &snap_id, snap_version).await {
                tracing::warn!(build = %self.build_id, error = %e.message, "cannot remove the build's snapshot record");
            }
        } else if let Err(e) = super::remove_record(&self.app, &snap, snap_version).await {
            tracing::warn!(build = %self.build_id, error = %e.message, "cannot remove the build's snapshot");
        }
        put
    }
}

/// E2B's COPY move, as root in the build sandbox: `$1` the temporary
/// directory, `$2` the source in the archive, `$3` the destination, `$4`
/// `user:group`, `$5` the mode (or empty). A file or symlink goes to the
/// destination (into it when it ends in `/` or is a directory); a
/// directory's contents are merged into the destination directory.
const MOVE_SCRIPT: &str = r#"set -e
src="$1/unpack${2:+/$2}"
if [ -L "$src" ] || [ -f "$src" ]; then
  chown -h -- "$4" "$src"
  if [ -n "$5" ] && [ ! -L "$src" ]; then chmod -- "$5" "$src"; fi
  case "$3" in
    */) mkdir -p -- "$3" ;;
    *) mkdir -p -- "$(dirname -- "$3")" ;;
  esac
  mv -f -- "$src" "$3"
elif [ -d "$src" ]; then
  chown -hR -- "$4" "$src"
  if [ -n "$5" ]; then chmod -R -- "$5" "$src"; fi
  mkdir -p -- "$3"
  find "$src" -mindepth 1 -maxdepth 1 -exec cp -a --remove-destination -t "$3" -- {} +
else
  echo "$2: not in the uploaded archive" >&2
  exit 1
fi
"#;
