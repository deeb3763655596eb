//! A build's steps (E2B's `TemplateBuildStartV2`), checked: every problem
//! is a 400 naming the field; and the parent template an image stands for.

use super::bad;
use crate::error::ApiError;
use warren_template::Template;

/// Most steps one build may have.
const MAX_STEPS: usize = 500;
/// Longest step argument (a RUN command line), in bytes.
const MAX_ARG: usize = 64 * 1024;

/// One build step, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
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
    pub(super) fn describe(&self) -> String {
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
pub(super) struct Plan {
    pub(super) from: String,
    /// `fromImage`, when it is not E2B's base: `from` is the template
    /// that stands for it ([`resolve_image`]).
    pub(super) image: Option<String>,
    pub(super) steps: Vec<Step>,
    pub(super) start_cmd: String,
    pub(super) ready_cmd: String,
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
pub(super) fn parse_plan(body: &[u8]) -> Result<Plan, ApiError> {
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
            super::super::snapshots::validate_name(&t)?;
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
    super::super::uploads::validate_hash(&hash)
        .map_err(|e| bad(format!("step {n}: {}", e.message)))?;
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
pub(super) fn copy_base(src: &str) -> String {
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
pub(super) fn resolve_image(operators: &[Template], image: &str) -> Result<String, ApiError> {
    let wanted =
        warren_template::spec::normalize_image(image).map_err(|_| no_registry(image, &[]))?;
    let operators: Vec<&Template> = operators.iter().filter(|t| t.snapshot.is_none()).collect();
    if let Some(t) = operators.iter().find(|t| t.images.contains(&wanted)) {
        return Ok(t.name.clone());
    }
    let mut available: Vec<String> = operators
        .into_iter()
        .flat_map(|t| t.images.iter().cloned())
        .collect();
    available.sort();
    available.dedup();
    Err(no_registry(image, &available))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warren_template::spec::Defaults;
    use warren_template::Snapshot;

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
        let mut store: Vec<Template> = Vec::new();
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
                public: false,
            }),
            images: images.iter().map(|i| i.to_string()).collect(),
        };
        let unknown = format!("{:?}", resolve_image(&store, "ubuntu:22.04").unwrap_err());
        assert!(
            unknown.contains("cannot reach an image registry"),
            "{unknown}"
        );
        // A team's template never stands for an image.
        store.push(record("snap-x", &["ubuntu:22.04"], Some("team-a")));
        assert!(resolve_image(&store, "ubuntu:22.04").is_err());
        store.push(record(
            "ubuntu-22.04",
            &["ubuntu:22.04", "ubuntu:jammy"],
            None,
        ));
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
