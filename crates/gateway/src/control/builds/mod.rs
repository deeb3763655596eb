//! E2B's template build API (the SDK's `Template.build`):
//! `POST /v3/templates` (a build is requested: template and build ids),
//! `POST /v2/templates/{id}/builds/{buildID}` (its steps; the build starts),
//! `GET /templates/{id}/builds/{buildID}/status` (status and logs), and
//! `GET /templates/{id}/files/{hash}` (COPY's upload link; the archive is
//! kept by `uploads`).
//!
//! A build runs **in a sandbox**, never on the gateway host: the steps are
//! tenant input, and a sandbox is the boundary warren already puts around
//! tenant code. The gateway drives it through its own public listener
//! with the team's API key, exactly as the team could: it creates a
//! sandbox from the parent template (`fromTemplate`; or `fromImage`: E2B's
//! default image `e2bdev/base` is warren's `base`, any other image is the
//! operator's template whose build file lists it in `images`, such as
//! `ubuntu-22.04` for `ubuntu:22.04`: no registry is ever pulled from),
//! runs each RUN step with envd as the current USER in the current
//! WORKDIR with the ENVs so far, applies each COPY step's uploaded
//! archive (below), snapshots the sandbox, and records the
//! snapshot's root under the team's template name with the defaults the
//! steps set (USER, WORKDIR, ENV, startCmd, readyCmd, cpuCount,
//! memoryMB); the sandbox is killed either way. So a build needs the
//! `isolated` runtime (snapshots) and the
//! shared template store, as snapshots do.
//!
//! COPY: the archive the SDK uploaded (a tar, gzipped or not, of paths
//! relative to its context directory) is written into the build sandbox
//! through envd in chunks of [`COPY_CHUNK`] bytes, into a fresh directory
//! belonging to the step's owner (its `user` argument, else the current
//! USER); `tar` runs **inside the sandbox as that user** to unpack it; as
//! root (in the sandbox) the source's files get the owner and the `mode`
//! argument and go to the destination the way E2B's builder moves them: a
//! file or symlink to the destination path (into it when it ends in `/`),
//! a directory's contents into the destination directory (merged); a
//! relative destination is under the current WORKDIR. Symlinks stay
//! symlinks (the SDK resolves them itself with `resolve_symlinks`). The
//! temporary directory is removed either way. The gateway host never
//! unpacks or reads an archive's paths.
//!
//! Ownership: a built template is its team's, like a named snapshot (the
//! two share a team's names): listed in the team's `GET /templates`,
//! usable by name, deletable with `DELETE /templates/{name}`; for every
//! other team it does not exist (404). Nothing is cached between builds
//! (`force` and `skipCache` change nothing: every step always runs).
//!
//! A build's status and logs live in the memory of the gateway that
//! started it (at most [`MAX_BUILDS`], finished ones dropped after
//! [`KEEP_FINISHED`]); behind a load balancer the status polls must reach
//! that gateway (a sticky balancer), and a gateway restart forgets builds
//! in flight (the template keeps its previous build).

use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{HeaderMap, Response, StatusCode};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warren_core::body::Body;
use warren_template::spec::Defaults;
use warren_template::{Snapshot, Store, Template, TemplateError};

/// Builds kept at once (running or finished).
pub const MAX_BUILDS: usize = 1000;
/// How long a finished build's status stays readable.
pub const KEEP_FINISHED: Duration = Duration::from_secs(3600);
/// Most steps one build may have.
const MAX_STEPS: usize = 500;
/// Longest step argument (a RUN command line), in bytes.
const MAX_ARG: usize = 64 * 1024;
/// Most log lines one build keeps (the rest are dropped, and said so).
const MAX_LOG_LINES: usize = 10_000;
/// Most output of one step kept for the log, in bytes.
const MAX_STEP_OUTPUT: usize = 1024 * 1024;
/// Longest log line kept, in bytes.
const MAX_LINE: usize = 4096;
/// Most log entries one status answer carries (E2B's `limit` maximum).
const MAX_PAGE: usize = 100;
/// How long the build sandbox may live.
const SANDBOX_TIMEOUT_SECS: u64 = 3600;
/// How much of a COPY archive one envd upload carries (the gateway holds
/// one chunk in memory at a time).
const COPY_CHUNK: usize = 8 * 1024 * 1024;
/// What a built template's record says it came from (how it is told from
/// a snapshot, which is also a team's template record).
pub(crate) const BUILT_SOURCE: &str = "api build";

/// Whether a record is a template built through this API.
pub(crate) fn is_built(t: &Template) -> bool {
    t.source.starts_with(BUILT_SOURCE)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

#[derive(Debug, Clone, serde::Serialize)]
struct LogEntry {
    timestamp: String,
    level: &'static str,
    message: String,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Reason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
}

#[derive(Debug)]
struct Build {
    team: String,
    name: String,
    /// The tags the build gets (`default` when the request named none).
    tags: Vec<String>,
    cpu_count: u32,
    memory_mb: u64,
    status: Status,
    logs: Vec<LogEntry>,
    reason: Option<Reason>,
    finished: Option<Instant>,
}

/// The builds this gateway runs, by build id.
#[derive(Debug, Default)]
pub(crate) struct Builds {
    inner: Mutex<HashMap<String, Build>>,
}

impl Builds {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Build>) -> T) -> T {
        let mut g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut g)
    }

    fn log(&self, id: &str, level: &'static str, message: impl Into<String>) {
        let message = message.into();
        self.with(|m| {
            if let Some(b) = m.get_mut(id) {
                if b.logs.len() < MAX_LOG_LINES {
                    b.logs.push(entry(level, message));
                } else if b.logs.len() == MAX_LOG_LINES {
                    b.logs
                        .push(entry("warn", "(more output; the rest is not kept)".into()));
                }
            }
        })
    }

    fn finish(&self, id: &str, result: Result<(), (String, Option<String>)>) {
        self.with(|m| {
            if let Some(b) = m.get_mut(id) {
                b.finished = Some(Instant::now());
                match result {
                    Ok(()) => b.status = Status::Ready,
                    Err((message, step)) => {
                        let tail = b.logs.len().saturating_sub(20);
                        b.logs.push(entry("error", message.clone()));
                        b.status = Status::Error;
                        b.reason = Some(Reason {
                            message,
                            step,
                            log_entries: b.logs[tail..].to_vec(),
                        });
                    }
                }
            }
        })
    }
}

fn entry(level: &'static str, message: String) -> LogEntry {
    LogEntry {
        timestamp: warren_core::time::rfc3339_ms(now_ms()),
        level,
        message,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn bad(m: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_build", m)
}

fn build_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "build_not_found",
        format!("template build {id:?} not found"),
    )
}

fn decode(raw: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| bad("the path is not UTF-8"))
}

/// E2B's `TemplateRequestResponseV3`.
#[derive(Debug, serde::Serialize)]
struct Requested {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    tags: Vec<String>,
}

/// `POST /v3/templates` (E2B's `TemplateBuildRequestV3`): checks the name
/// and resources and makes a waiting build. The template id is the name.
pub(super) fn request(app: &App, team: &Team, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON body: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("the body must be a JSON object"))?;
    let raw = match (obj.get("name"), obj.get("alias")) {
        (Some(serde_json::Value::String(n)), _) | (None, Some(serde_json::Value::String(n))) => {
            n.clone()
        }
        _ => return Err(bad("field \"name\" (a string) is required")),
    };
    let (name, tag) = match raw.split_once(':') {
        Some((n, t)) => (n.to_string(), Some(t.to_string())),
        None => (raw.clone(), None),
    };
    super::snapshots::validate_name(&name)?;
    let mut tags: Vec<String> = match obj.get("tags") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("field \"tags\" must be an array of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("field \"tags\" must be an array of strings")),
    };
    tags.extend(tag);
    for t in &tags {
        validate_tag(t)?;
    }
    if tags.is_empty() {
        tags.push(DEFAULT_TAG.to_string());
    }
    tags.dedup();
    let number = |k: &str, default: u64, range: std::ops::RangeInclusive<u64>| match obj.get(k) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(n) => n.as_u64().filter(|n| range.contains(n)).ok_or_else(|| {
            bad(format!(
                "field {k:?} must be a whole number from {} to {}",
                range.start(),
                range.end()
            ))
        }),
    };
    let cpu_count = number("cpuCount", 2, 1..=64)? as u32;
    let memory_mb = number("memoryMB", 512, 64..=1024 * 1024)?;
    let store = super::snapshots::store(app)?;
    if matches!(store.get(&name), Ok(t) if t.snapshot.is_none()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "template_name_taken",
            format!("{name:?} is the name of an operator's template; choose another name"),
        ));
    }
    let build_id = new_build_id();
    app.builds.with(|m| {
        if m.len() >= MAX_BUILDS {
            m.retain(|_, b| b.finished.is_none_or(|at| at.elapsed() < KEEP_FINISHED));
        }
        if m.len() >= MAX_BUILDS {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_builds",
                format!("this gateway keeps {MAX_BUILDS} builds at most; try again later"),
            ));
        }
        m.insert(
            build_id.clone(),
            Build {
                team: team.0.clone(),
                name: name.clone(),
                cpu_count,
                memory_mb,
                tags: tags.clone(),
                status: Status::Waiting,
                logs: Vec::new(),
                reason: None,
                finished: None,
            },
        );
        Ok(())
    })?;
    tracing::info!(template = %name, build = %build_id, team = %team.0, "template build requested");
    reply(
        StatusCode::ACCEPTED,
        &Requested {
            template_id: name.clone(),
            build_id,
            public: false,
            aliases: vec![name.clone()],
            names: vec![name],
            tags,
        },
    )
}

/// One build step, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Run {
        cmd: String,
        user: Option<String>,
    },
    Env(Vec<(String, String)>),
    Workdir(String),
    User(String),
    /// COPY: the archive of `hash`'s files, `src` in it, to `dest`, owned
    /// by `owner` (`user` or `user:group`; unset: the current USER), with
    /// `mode` (octal) when given.
    Copy {
        src: String,
        dest: String,
        owner: Option<String>,
        mode: Option<String>,
        hash: String,
    },
}

impl Step {
    fn describe(&self) -> String {
        match self {
            Step::Run { cmd, user: None } => format!("RUN {cmd}"),
            Step::Run { cmd, user: Some(u) } => format!("RUN (as {u}) {cmd}"),
            Step::Env(vars) => format!(
                "ENV {}",
                vars.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Step::Workdir(d) => format!("WORKDIR {d}"),
            Step::User(u) => format!("USER {u}"),
            Step::Copy {
                src,
                dest,
                owner,
                mode,
                ..
            } => {
                let mut s = String::from("COPY");
                if let Some(o) = owner {
                    s.push_str(&format!(" --chown={o}"));
                }
                if let Some(m) = mode {
                    s.push_str(&format!(" --chmod={m}"));
                }
                format!("{s} {src} {dest}")
            }
        }
    }
}

/// A checked `TemplateBuildStartV2`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    from: String,
    /// `fromImage`, when it is not E2B's base: `from` is the template
    /// that stands for it ([`resolve_image`]).
    image: Option<String>,
    steps: Vec<Step>,
    start_cmd: String,
    ready_cmd: String,
}

/// The tag of a template's name without one (`name` is `name:default`).
pub(crate) const DEFAULT_TAG: &str = "default";

/// A build id: a random UUID (the SDK parses some as UUIDs).
fn new_build_id() -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(warren_core::id::random_token(32).as_bytes());
    let x: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &x[..8],
        &x[8..12],
        &x[13..16],
        &x[17..20],
        &x[20..32]
    )
}

/// Checks a tag: 1 to 64 of `A-Z a-z 0-9 . _ -`, starting with a letter
/// or digit (so no `:`; `name:tag` is how a name carries one).
pub(crate) fn validate_tag(t: &str) -> Result<(), ApiError> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.as_bytes()[0].is_ascii_alphanumeric()
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "tag {t:?} must be 1 to 64 of A-Z, a-z, 0-9, '.', '_', '-', starting with a letter \
             or digit"
        )))
    }
}

/// The name a team's template is found by with `tag`: `name`, or
/// `name:tag`.
pub(crate) fn tagged(name: &str, tag: &str) -> String {
    if tag == DEFAULT_TAG {
        name.to_string()
    } else {
        format!("{name}:{tag}")
    }
}

/// A user name a step may name: 1 to 32 of `A-Z a-z 0-9 . _ -`, not
/// starting with `-`.
fn validate_user(u: &str) -> Result<(), ApiError> {
    let ok = !u.is_empty()
        && u.len() <= 32
        && !u.starts_with('-')
        && u.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "user {u:?} is not a user name (1 to 32 of A-Z a-z 0-9 . _ -, not starting with '-')"
        )))
    }
}

fn text(v: &serde_json::Value, what: &str) -> Result<String, ApiError> {
    let s = v
        .as_str()
        .ok_or_else(|| bad(format!("{what} must be a string")))?;
    if s.len() > MAX_ARG {
        return Err(bad(format!("{what} is longer than {MAX_ARG} bytes")));
    }
    if s.contains('\0') {
        return Err(bad(format!("{what} contains a NUL byte")));
    }
    Ok(s.to_string())
}

/// Reads E2B's `TemplateBuildStartV2`; every problem is a 400 naming it.
fn parse_plan(body: &[u8]) -> Result<Plan, ApiError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON body: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("the body must be a JSON object"))?;
    let opt = |k: &str| -> Result<Option<String>, ApiError> {
        match obj.get(k) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => text(v, &format!("field {k:?}")).map(Some),
        }
    };
    if obj.get("fromImageRegistry").is_some_and(|r| !r.is_null()) {
        return Err(no_registry(&opt("fromImage")?.unwrap_or_default(), &[]));
    }
    let (from, image) = match (opt("fromTemplate")?, opt("fromImage")?) {
        (Some(t), _) => {
            super::snapshots::validate_name(&t)?;
            (t, None)
        }
        (None, Some(image)) => match image.as_str() {
            "e2bdev/base"
            | "e2bdev/base:latest"
            | "docker.io/e2bdev/base"
            | "docker.io/e2bdev/base:latest" => ("base".to_string(), None),
            _ => (String::new(), Some(image)),
        },
        (None, None) => return Err(bad("give \"fromTemplate\" or \"fromImage\"")),
    };
    let raw_steps = match obj.get("steps") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(a)) => a.clone(),
        Some(_) => return Err(bad("field \"steps\" must be an array")),
    };
    if raw_steps.len() > MAX_STEPS {
        return Err(bad(format!("a build has at most {MAX_STEPS} steps")));
    }
    let mut steps = Vec::with_capacity(raw_steps.len());
    for (i, s) in raw_steps.iter().enumerate() {
        let n = i + 1;
        let kind = s
            .get("type")
            .and_then(|t| t.as_str())
            .ok_or_else(|| bad(format!("step {n}: \"type\" (a string) is required")))?;
        let args: Vec<String> = match s.get("args") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|a| text(a, &format!("step {n}: an argument")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad(format!("step {n}: \"args\" must be an array"))),
        };
        let step = match (kind, args.as_slice()) {
            ("RUN", [cmd]) if !cmd.trim().is_empty() => Step::Run {
                cmd: cmd.clone(),
                user: None,
            },
            ("RUN", [cmd, user]) if !cmd.trim().is_empty() => {
                validate_user(user)?;
                Step::Run {
                    cmd: cmd.clone(),
                    user: Some(user.clone()),
                }
            }
            ("RUN", _) => {
                return Err(bad(format!(
                    "step {n}: RUN takes a command line and optionally a user"
                )))
            }
            ("ENV", a) if !a.is_empty() && a.len() % 2 == 0 => {
                let mut vars = Vec::new();
                for kv in a.chunks(2) {
                    let k = &kv[0];
                    let ok = k
                        .bytes()
                        .next()
                        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                    if !ok {
                        return Err(bad(format!(
                            "step {n}: {k:?} is not an environment variable name"
                        )));
                    }
                    vars.push((k.clone(), kv[1].clone()));
                }
                Step::Env(vars)
            }
            ("ENV", _) => return Err(bad(format!("step {n}: ENV takes name and value pairs"))),
            ("WORKDIR", [d]) if !d.is_empty() && d.len() <= 4096 => Step::Workdir(d.clone()),
            ("WORKDIR", _) => return Err(bad(format!("step {n}: WORKDIR takes one path"))),
            ("USER", [u]) => {
                validate_user(u)?;
                Step::User(u.clone())
            }
            ("USER", _) => return Err(bad(format!("step {n}: USER takes one user name"))),
            ("COPY", a) if (2..=4).contains(&a.len()) => parse_copy(n, a, s)?,
            ("COPY", _) => {
                return Err(bad(format!(
                    "step {n}: COPY takes a source, a destination, and optionally a user and \
                     a mode"
                )))
            }
            (other, _) => {
                return Err(bad(format!(
                    "step {n}: unknown step type {other:?} (known: RUN, ENV, WORKDIR, USER, COPY)"
                )))
            }
        };
        steps.push(step);
    }
    let start_cmd = opt("startCmd")?.unwrap_or_default();
    let ready_cmd = opt("readyCmd")?.unwrap_or_default();
    if !ready_cmd.is_empty() && start_cmd.is_empty() {
        return Err(bad(
            "\"readyCmd\" needs a \"startCmd\" (it says when that is ready)",
        ));
    }
    Ok(Plan {
        from,
        image,
        steps,
        start_cmd,
        ready_cmd,
    })
}

/// A COPY step's arguments (`[src, dest, user, mode]`, the last two may be
/// empty) and its `filesHash`.
fn parse_copy(n: usize, a: &[String], step: &serde_json::Value) -> Result<Step, ApiError> {
    let (src, dest) = (&a[0], &a[1]);
    if src.trim().is_empty() || dest.is_empty() || dest.len() > 4096 {
        return Err(bad(format!(
            "step {n}: COPY needs a source and a destination (at most 4096 bytes)"
        )));
    }
    let owner = match a.get(2).map(String::as_str) {
        None | Some("") => None,
        Some(o) => {
            let (u, g) = o.split_once(':').unwrap_or((o, o));
            validate_user(u)
                .and_then(|_| validate_user(g))
                .map_err(|_| {
                    bad(format!(
                        "step {n}: COPY's owner {o:?} is not user or user:group (each 1 to 32 of \
                     A-Z a-z 0-9 . _ -)"
                    ))
                })?;
            Some(o.to_string())
        }
    };
    let mode = match a.get(3).map(String::as_str) {
        None | Some("") => None,
        Some(m) if (1..=4).contains(&m.len()) && m.bytes().all(|b| (b'0'..=b'7').contains(&b)) => {
            Some(m.to_string())
        }
        Some(m) => {
            return Err(bad(format!(
                "step {n}: COPY's mode {m:?} is not an octal mode (like 0755)"
            )))
        }
    };
    let hash = match step.get("filesHash") {
        Some(serde_json::Value::String(h)) => h.clone(),
        _ => {
            return Err(bad(format!(
                "step {n}: COPY needs \"filesHash\" (the hash its files were uploaded under)"
            )))
        }
    };
    super::uploads::validate_hash(&hash).map_err(|e| bad(format!("step {n}: {}", e.message)))?;
    Ok(Step::Copy {
        src: src.clone(),
        dest: dest.clone(),
        owner,
        mode,
        hash,
    })
}

/// The static start of a COPY source (`dir/*.txt` → `dir`; `./a/b/` →
/// `a/b`), as E2B's builder finds the source in the unpacked archive (the
/// SDK resolves globs itself; the archive's paths are relative to its
/// context directory, like the source). Empty: the archive's top.
fn copy_base(src: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in src.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c if c.contains(['*', '?', '[', '{']) => break,
            c => parts.push(c),
        }
    }
    parts.join("/")
}

/// The 400 for an image warren has no template for.
fn no_registry(image: &str, available: &[String]) -> ApiError {
    let offered = if available.is_empty() {
        "no image has one".to_string()
    } else {
        format!("images with one: {}", available.join(", "))
    };
    bad(format!(
        "image {image:?}: warren's machines cannot reach an image registry, and no template \
         here stands for that image ({offered}); build from the `base` template instead \
         (Template().from_template(\"base\"), or from_base_image(), which is warren's base)"
    ))
}

/// The operator template (not a team's) whose build file lists `image`
/// in its `images`; a 400 naming the images there are when none does.
fn resolve_image(store: &Store, image: &str) -> Result<String, ApiError> {
    let wanted =
        warren_template::spec::normalize_image(image).map_err(|_| no_registry(image, &[]))?;
    let operators: Vec<Template> = store
        .list()
        .map_err(super::snapshots::internal)?
        .into_iter()
        .filter(|t| t.snapshot.is_none())
        .collect();
    if let Some(t) = operators.iter().find(|t| t.images.contains(&wanted)) {
        return Ok(t.name.clone());
    }
    let mut available: Vec<String> = operators.into_iter().flat_map(|t| t.images).collect();
    available.sort();
    available.dedup();
    Err(no_registry(image, &available))
}

/// `POST /v2/templates/{id}/builds/{buildID}`: checks the steps and
/// starts the build; 202.
pub(super) fn start(
    app: &App,
    team: &Team,
    headers: &HeaderMap,
    template_raw: &str,
    build_id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let template_id = decode(template_raw)?;
    let mut plan = parse_plan(body)?;
    // Every COPY's archive, opened now: an unknown hash is this request's
    // 400, and an archive that expires mid-build stays readable.
    let mut files = HashMap::new();
    for (i, step) in plan.steps.iter().enumerate() {
        if let Step::Copy { hash, .. } = step {
            if !files.contains_key(hash) {
                let (file, size) = app
                    .uploads
                    .open(team, hash)
                    .map_err(|e| bad(format!("step {}: {}", i + 1, e.message)))?;
                files.insert(hash.clone(), (Arc::new(file), size));
            }
        }
    }
    let store = super::snapshots::store(app)?;
    if let Some(image) = &plan.image {
        plan.from = resolve_image(&store, image)?;
    }
    // The parent, as this team may use it: its defaults are where the
    // steps start.
    let parent = match super::snapshots::find(&store, team, &plan.from)? {
        Some(t) => t,
        None => match store.get(&plan.from) {
            Ok(t) if t.snapshot.is_none() => t,
            Ok(_) | Err(TemplateError::NotFound(_)) => {
                return Err(bad(format!(
                    "template {:?} (fromTemplate) not found",
                    plan.from
                )))
            }
            Err(e) => return Err(super::snapshots::internal(e)),
        },
    };
    let self_url = app.self_url.get().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the gateway is still starting",
        )
    })?;
    let key = headers
        .get(warren_client::headers::API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    let (name, tags, cpu_count, memory_mb) = app.builds.with(|m| {
        let Some(b) = m
            .get_mut(build_id)
            .filter(|b| b.team == team.0 && b.name == template_id)
        else {
            return Err(build_not_found(build_id));
        };
        if b.status != Status::Waiting {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "build_started",
                format!("template build {build_id} has already started"),
            ));
        }
        b.status = Status::Building;
        Ok((b.name.clone(), b.tags.clone(), b.cpu_count, b.memory_mb))
    })?;
    let job = Job {
        builds: app.builds.clone(),
        build_id: build_id.to_string(),
        team: team.0.clone(),
        name,
        tags,
        store,
        self_url,
        key,
        parent,
        cpu_count,
        memory_mb,
        plan,
        files,
    };
    tracing::info!(template = %job.name, build = %build_id, team = %team.0, "template build started");
    tokio::spawn(job.run());
    Ok(warren_core::body::status(StatusCode::ACCEPTED))
}

/// E2B's `TemplateBuildInfo`.
#[derive(Debug, serde::Serialize)]
struct BuildInfo {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: Status,
    logs: Vec<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
}

/// `GET /templates/{id}/builds/{buildID}/status?logsOffset=&limit=&level=`.
pub(super) fn status(
    app: &App,
    team: &Team,
    template_raw: &str,
    build_id: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let template_id = decode(template_raw)?;
    let (mut offset, mut limit, mut level) = (0usize, MAX_PAGE, None::<String>);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let q = |m: String| ApiError::bad_request("invalid_query", m);
        match k.as_ref() {
            "logsOffset" => {
                offset = v
                    .parse()
                    .map_err(|_| q(format!("logsOffset {v:?} is not a whole number")))?
            }
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| *n <= MAX_PAGE)
                    .ok_or_else(|| q(format!("limit must be between 0 and {MAX_PAGE}")))?
            }
            "level" => match v.as_ref() {
                "debug" | "info" | "warn" | "error" => level = Some(v.into_owned()),
                _ => return Err(q(format!("level {v:?} is not debug, info, warn or error"))),
            },
            _ => {}
        }
    }
    let info = app.builds.with(|m| {
        let b = m
            .get(build_id)
            .filter(|b| b.team == team.0 && b.name == template_id)
            .ok_or_else(|| build_not_found(build_id))?;
        let rank = |l: &str| {
            ["debug", "info", "warn", "error"]
                .iter()
                .position(|x| *x == l)
        };
        let min = level.as_deref().and_then(rank).unwrap_or(0);
        let entries: Vec<LogEntry> = b
            .logs
            .iter()
            .skip(offset)
            .take(limit)
            .filter(|e| rank(e.level).unwrap_or(0) >= min)
            .cloned()
            .collect();
        Ok::<_, ApiError>(BuildInfo {
            template_id: b.name.clone(),
            build_id: build_id.to_string(),
            status: b.status,
            logs: entries.iter().map(|e| e.message.clone()).collect(),
            log_entries: entries,
            reason: b.reason.clone(),
        })
    })?;
    reply(StatusCode::OK, &info)
}

/// `GET /templates/{id}/files/{hash}`: whether the team's archive of
/// those files is here, and where to upload it (201).
pub(super) fn files(
    app: &App,
    team: &Team,
    headers: &HeaderMap,
    template_raw: &str,
    hash: &str,
) -> Result<Response<Body>, ApiError> {
    // The archive is the team's, whatever template it is first used for
    // (E2B keeps them per team too); the id is only checked.
    super::snapshots::validate_name(decode(template_raw)?.split(':').next().unwrap_or_default())?;
    let link = app.uploads.link(team, hash, headers)?;
    reply(StatusCode::CREATED, &link)
}

/// E2B's `AssignedTemplateTags`.
#[derive(Debug, serde::Serialize)]
struct Assigned {
    tags: Vec<String>,
    #[serde(rename = "buildID")]
    build_id: String,
}

/// The build id a built record names.
fn build_of(t: &Template) -> String {
    t.source
        .strip_prefix(BUILT_SOURCE)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

fn string_list(
    obj: &serde_json::Map<String, serde_json::Value>,
    k: &str,
) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match obj.get(k) {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|t| t.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("field {k:?} must be an array of strings")))?,
        _ => {
            return Err(bad(format!(
                "field {k:?} (an array of strings) is required"
            )))
        }
    };
    if list.is_empty() || list.len() > 64 {
        return Err(bad(format!("field {k:?} must name 1 to 64 tags")));
    }
    for t in &list {
        validate_tag(t)?;
    }
    Ok(list)
}

fn object(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(o)) => Ok(o),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("invalid JSON body: {e}"))),
    }
}

/// The team's built template `called` (`name` or `name:tag`), or 404.
fn built(store: &Store, team: &Team, called: &str) -> Result<Template, ApiError> {
    match super::snapshots::find(store, team, called)? {
        Some(t) if is_built(&t) => Ok(t),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "template_not_found",
            format!("template {called:?} not found"),
        )),
    }
}

/// `POST /templates/tags` (`Template.assign_tags`): `{target: "name:tag",
/// tags}`: the target's build gets the tags too (each a record of its own,
/// moved from any build that had it); 201.
pub(super) fn assign_tags(app: &App, team: &Team, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let obj = object(body)?;
    let target = match obj.get("target") {
        Some(serde_json::Value::String(t)) => t.clone(),
        _ => return Err(bad("field \"target\" (a string, name:tag) is required")),
    };
    let tags = string_list(&obj, "tags")?;
    let name = target.split(':').next().unwrap_or_default().to_string();
    if !super::snapshots::team_name_ok(&target) {
        return Err(bad(format!(
            "target {target:?} is not a template name (name or name:tag)"
        )));
    }
    let store = super::snapshots::store(app)?;
    let mut t = built(&store, team, &target)?;
    for tag in &tags {
        let called = tagged(&name, tag);
        t.name = warren_template::named_snapshot_key(&team.0, &called);
        if let Some(s) = t.snapshot.as_mut() {
            s.name = Some(called);
        }
        store.put(&t).map_err(super::snapshots::internal)?;
    }
    reply(
        StatusCode::CREATED,
        &Assigned {
            tags,
            build_id: build_of(&t),
        },
    )
}

/// `DELETE /templates/tags` (`Template.remove_tags`): `{name, tags}`: the
/// tags leave the team's template `name`; 404 if one is not there.
pub(super) fn remove_tags(app: &App, team: &Team, body: &[u8]) -> Result<Response<Body>, ApiError> {
    let obj = object(body)?;
    let name = match obj.get("name") {
        Some(serde_json::Value::String(n)) => n.split(':').next().unwrap_or_default().to_string(),
        _ => return Err(bad("field \"name\" (a string) is required")),
    };
    super::snapshots::validate_name(&name)?;
    let tags = string_list(&obj, "tags")?;
    let store = super::snapshots::store(app)?;
    let found: Vec<Template> = tags
        .iter()
        .map(|tag| built(&store, team, &tagged(&name, tag)))
        .collect::<Result<_, _>>()?;
    for t in found {
        store.remove(&t.name).map_err(super::snapshots::internal)?;
    }
    Ok(warren_core::body::status(StatusCode::NO_CONTENT))
}

/// A started build, run to its end in the background.
struct Job {
    builds: Arc<Builds>,
    build_id: String,
    team: String,
    name: String,
    tags: Vec<String>,
    store: Store,
    self_url: String,
    key: String,
    parent: Template,
    cpu_count: u32,
    memory_mb: u64,
    plan: Plan,
    /// COPY archives by files hash (opened at the start), with their sizes.
    files: HashMap<String, (Arc<std::fs::File>, u64)>,
}

/// Why a build failed: the message and the step (1-based) it failed at.
type Failure = (String, Option<String>);

impl Job {
    async fn run(self) {
        let client = match warren_client::ClientBuilder::new(&[self.self_url.as_str()])
            .api_key(self.key.clone())
            .attempts(1)
            .timeout(Duration::from_secs(600))
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                self.builds
                    .finish(&self.build_id, Err((format!("cannot start: {e}"), None)));
                return;
            }
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
                self.builds.finish(
                    &self.build_id,
                    Err((format!("cannot start the build sandbox: {e}"), None)),
                );
                return;
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
        self.builds.finish(&self.build_id, result);
    }

    fn log(&self, level: &'static str, m: String) {
        self.builds.log(&self.build_id, level, m);
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
        let snap = self
            .store
            .get(&snap_id)
            .map_err(|e| format!("cannot read the build's snapshot {snap_id}: {e}"))?;
        let defaults = Defaults {
            user,
            workdir,
            env,
            start_cmd: self.plan.start_cmd.clone(),
            ready_cmd: self.plan.ready_cmd.clone(),
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            ..self.parent.defaults.clone()
        };
        let mut template = Template {
            name: String::new(),
            digest: snap.digest.clone(),
            defaults,
            created_at_ms: now_ms() as u64,
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
            }),
            images: Vec::new(),
        };
        let mut put = Ok(());
        for tag in &self.tags {
            let called = tagged(&self.name, tag);
            template.name = warren_template::named_snapshot_key(&self.team, &called);
            if let Some(s) = template.snapshot.as_mut() {
                s.name = Some(called);
            }
            put = put.and(self.store.put(&template).map_err(|e| e.to_string()));
        }
        let _ = self.store.remove(&snap_id);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plans() {
        let p = parse_plan(
            br#"{"fromImage":"e2bdev/base","force":true,"steps":[
                {"type":"RUN","args":["echo hi > /tmp/x"],"force":false},
                {"type":"RUN","args":["whoami","root"]},
                {"type":"ENV","args":["A","1","B_2","two"]},
                {"type":"WORKDIR","args":["/app"]},
                {"type":"USER","args":["guest"]}],
                "startCmd":"sleep 1","readyCmd":"true"}"#,
        )
        .unwrap();
        assert_eq!(p.from, "base");
        assert_eq!(p.steps.len(), 5);
        assert_eq!(
            p.steps[1],
            Step::Run {
                cmd: "whoami".into(),
                user: Some("root".into())
            }
        );
        for (body, needle) in [
            (
                r#"{"fromImage":"ubuntu:22.04","fromImageRegistry":{"type":"registry"}}"#,
                "cannot reach an image registry",
            ),
            (r#"{}"#, "fromTemplate"),
            (r#"{"fromTemplate":"../x"}"#, "snapshot name"),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","b"]}]}"#,
                "filesHash",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","b"],"filesHash":"../x"}]}"#,
                "SHA-256",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","b","x;y"]}]}"#,
                "owner",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","b","","0999"]}]}"#,
                "octal",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"COPY","args":["a"]}]}"#,
                "COPY takes",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"ENV","args":["A=B","1"]}]}"#,
                "not an environment",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"USER","args":["-x"]}]}"#,
                "not a user name",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"RUN","args":["ls","a","b"]}]}"#,
                "RUN takes",
            ),
            (
                r#"{"fromTemplate":"base","steps":[{"type":"NOPE"}]}"#,
                "unknown step type",
            ),
            (r#"{"fromTemplate":"base","readyCmd":"true"}"#, "needs a"),
            (r#"{"fromTemplate":"base","startCmd":"a\u0000"}"#, "NUL"),
            (r#"[1]"#, "JSON object"),
        ] {
            let e = format!("{:?}", parse_plan(body.as_bytes()).unwrap_err());
            assert!(e.contains(needle), "{body}: {e}");
        }
        let h = "0123456789abcdef".repeat(4);
        let p = parse_plan(
            format!(
                r#"{{"fromTemplate":"base","steps":[{{"type":"COPY",
                "args":["dir","./to/","user:grp","0755"],"filesHash":"{h}","force":false}}]}}"#
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            p.steps[0],
            Step::Copy {
                src: "dir".into(),
                dest: "./to/".into(),
                owner: Some("user:grp".into()),
                mode: Some("0755".into()),
                hash: h,
            }
        );
    }

    #[test]
    fn copy_bases() {
        for (src, base) in [
            ("dir", "dir"),
            ("./dir/", "dir"),
            ("a/b.txt", "a/b.txt"),
            ("a/*.txt", "a"),
            ("**/*.py", ""),
            ("a/../b", "b"),
            (".", ""),
        ] {
            assert_eq!(copy_base(src), base, "{src}");
        }
    }

    #[test]
    fn an_image_is_the_operator_template_that_lists_it() {
        let p = parse_plan(br#"{"fromImage":"ubuntu:22.04"}"#).unwrap();
        assert_eq!(p.image.as_deref(), Some("ubuntu:22.04"));
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let record = |name: &str, images: &[&str], team: Option<&str>| Template {
            name: name.into(),
            digest: format!("sha256-{}", "0".repeat(64)),
            defaults: Defaults::default(),
            created_at_ms: 1,
            source: "test".into(),
            layers: Vec::new(),
            snapshot: team.map(|t| Snapshot {
                team: t.into(),
                name: None,
                source_sandbox: "s".into(),
                node_id: "n".into(),
                paused: None,
            }),
            images: images.iter().map(|i| i.to_string()).collect(),
        };
        let unknown = format!("{:?}", resolve_image(&store, "ubuntu:22.04").unwrap_err());
        assert!(
            unknown.contains("cannot reach an image registry"),
            "{unknown}"
        );
        // A team's template never stands for an image.
        store
            .put(&record("snap-x", &["ubuntu:22.04"], Some("team-a")))
            .unwrap();
        assert!(resolve_image(&store, "ubuntu:22.04").is_err());
        store
            .put(&record(
                "ubuntu-22.04",
                &["ubuntu:22.04", "ubuntu:jammy"],
                None,
            ))
            .unwrap();
        for image in ["ubuntu:22.04", "docker.io/library/ubuntu:jammy"] {
            assert_eq!(resolve_image(&store, image).unwrap(), "ubuntu-22.04");
        }
        let e = format!("{:?}", resolve_image(&store, "alpine:3.20").unwrap_err());
        assert!(e.contains("cannot reach an image registry"), "{e}");
        assert!(
            e.contains("ubuntu:22.04, ubuntu:jammy"),
            "lists the images: {e}"
        );
        assert!(format!("{:?}", resolve_image(&store, "a b").unwrap_err()).contains("registry"));
    }
}
