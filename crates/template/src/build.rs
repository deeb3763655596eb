//! Making templates: [`build`] runs `mmdebstrap` (Debian's archive is what
//! these machines reach) with the spec's packages, then writes its files and
//! runs its steps as root inside the new tree (a `chroot`, in mmdebstrap's
//! customize hook); [`import`] takes a root filesystem tarball as it is.
//! Either way the tarball enters the [`Store`] under its digest.

use crate::spec::{Defaults, Spec};
use crate::store::{Store, Template};
use crate::{io, TemplateError};
use std::path::Path;
use std::process::Stdio;

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Single-quotes `s` for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The variables a build step may inherit from the builder: a proxy the
/// build host needs to reach the registries. Nothing else of the
/// builder's environment (its `PIP_*`, `NPM_*`, ... settings) leaks in.
const PASSED_ENV: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

/// The environment a run step starts with (`env -i` arguments, quoted).
fn step_env() -> String {
    let mut vars = vec![
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        "HOME=/root".to_string(),
        "LANG=C.UTF-8".to_string(),
        "DEBIAN_FRONTEND=noninteractive".to_string(),
    ];
    for k in PASSED_ENV {
        if let Ok(v) = std::env::var(k) {
            vars.push(format!("{k}={v}"));
        }
    }
    vars.iter().map(|v| quote(v)).collect::<Vec<_>>().join(" ")
}

/// The customize hook: files first, then the run steps, each in the new
/// root (`$1`) with a clean environment ([`step_env`]). Written to a file
/// mmdebstrap runs with `sh`.
fn hook_script(spec: &Spec) -> String {
    let mut s = String::from("#!/bin/sh\nset -eu\nroot=\"$1\"\n");
    for f in &spec.files {
        s.push_str(&format!(
            "mkdir -p \"$root\"$(dirname {p})\nprintf '%s' {c} > \"$root\"{p}\nchmod {m} \"$root\"{p}\n",
            p = quote(&f.path),
            c = quote(&f.content),
            m = quote(&f.mode),
        ));
    }
    if spec.trust_host_cas {
        s.push_str(
            "if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then\n  \
             mkdir -p \"$root/usr/local/share/ca-certificates\"\n  \
             cp /usr/local/share/ca-certificates/*.crt \"$root/usr/local/share/ca-certificates/\"\n  \
             chroot \"$root\" update-ca-certificates >/dev/null 2>&1 || true\n\
             fi\n",
        );
    }
    let env = step_env();
    for step in &spec.run {
        s.push_str(&format!(
            "echo '+ '{q}\nchroot \"$root\" /usr/bin/env -i {env} /bin/sh -eu -c {q}\n",
            q = quote(step)
        ));
    }
    s
}

/// Builds `spec` into `store` and records it under its name. `progress`
/// gets one line per stage (mmdebstrap's own output goes to stderr).
pub fn build(
    spec: &Spec,
    store: &Store,
    mut progress: impl FnMut(&str),
) -> Result<Template, TemplateError> {
    let work = store.scratch("build");
    std::fs::create_dir_all(&work).map_err(io(format!("cannot create {}", work.display())))?;
    let result = (|| {
        let hook = work.join("customize.sh");
        std::fs::write(&hook, hook_script(spec)).map_err(io("cannot write the build hook"))?;
        let tar = work.join("rootfs.tar");
        if let Some(from) = &spec.from {
            derive(spec, from, store, &hook, &work, &tar, &mut progress)?;
            return finish(spec, store, &tar, &mut progress);
        }
        progress(&format!(
            "template {}: installing {} package(s) from {} {} with mmdebstrap",
            spec.name,
            spec.packages.len(),
            spec.mirror.as_deref().unwrap_or("Debian"),
            spec.suite
        ));
        let mut cmd = std::process::Command::new("mmdebstrap");
        // Package lists stay, so `sudo apt-get install` works in a sandbox
        // without an update first.
        cmd.args([
            "--variant=minbase",
            "--mode=root",
            "--format=tar",
            "--skip=cleanup/apt/lists",
        ]);
        if !spec.packages.is_empty() {
            cmd.arg(format!("--include={}", spec.packages.join(",")));
        }
        if let Some(k) = &spec.keyring_path {
            cmd.arg(format!("--keyring={}", k.display()));
        } else if spec.keyring.is_some() {
            return Err(TemplateError::Invalid(format!(
                "template {}: its keyring is a file next to the build file; build it from its file",
                spec.name
            )));
        }
        if spec.mirror.is_none() && !spec.components.is_empty() {
            cmd.arg(format!("--components={}", spec.components.join(",")));
        }
        cmd.arg(format!(
            "--customize-hook=sh {} \"$1\"",
            quote(&hook.display().to_string())
        ))
        .arg(&spec.suite)
        .arg(&tar)
        .args(sources(spec))
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
        let status = cmd.status().map_err(|e| TemplateError::Tool {
            tool: "mmdebstrap".into(),
            message: format!("cannot run it ({e}); install it with `apt-get install mmdebstrap`"),
        })?;
        if !status.success() {
            return Err(TemplateError::Tool {
                tool: "mmdebstrap".into(),
                message: format!("{status}; its output is above"),
            });
        }
        finish(spec, store, &tar, &mut progress)
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// The apt source lines for a `mirror` (none without one: mmdebstrap's
/// default): the suite, its updates and its security pocket.
fn sources(spec: &Spec) -> Vec<String> {
    let Some(mirror) = &spec.mirror else {
        return Vec::new();
    };
    let components = if spec.components.is_empty() {
        "main".to_string()
    } else {
        spec.components.join(" ")
    };
    ["", "-updates", "-security"]
        .iter()
        .map(|pocket| format!("deb {mirror} {}{pocket} {components}", spec.suite))
        .collect()
}

fn finish(
    spec: &Spec,
    store: &Store,
    tar: &Path,
    progress: &mut impl FnMut(&str),
) -> Result<Template, TemplateError> {
    progress(&format!("template {}: storing and unpacking", spec.name));
    let digest = store.add_blob(tar)?;
    let source = match &spec.from {
        Some(f) => format!("build (from {f}, {} steps)", spec.run.len()),
        None => format!(
            "build (suite {}, {} packages)",
            spec.suite,
            spec.packages.len()
        ),
    };
    let template = Template {
        name: spec.name.clone(),
        digest,
        defaults: spec.defaults(),
        created_at_ms: now_ms(),
        source,
        layers: Vec::new(),
        snapshot: None,
        images: spec
            .images
            .iter()
            .map(|i| crate::spec::normalize_image(i))
            .collect::<Result<_, _>>()?,
    };
    store.put(&template)?;
    Ok(template)
}

fn run_tool(cmd: &mut std::process::Command, tool: &str) -> Result<(), TemplateError> {
    let out = cmd.output().map_err(|e| TemplateError::Tool {
        tool: tool.into(),
        message: format!("cannot run it: {e}"),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(TemplateError::Tool {
            tool: tool.into(),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// A template from another: its root copied, the hook run on it (files,
/// run steps in a chroot), packed again.
fn derive(
    spec: &Spec,
    from: &str,
    store: &Store,
    hook: &Path,
    work: &Path,
    tar: &Path,
    progress: &mut impl FnMut(&str),
) -> Result<(), TemplateError> {
    let parent = store.get(from)?;
    let src = store.rootfs(&parent.digest)?;
    progress(&format!(
        "template {}: from {} ({})",
        spec.name, from, parent.digest
    ));
    let root = work.join("root");
    std::fs::create_dir_all(&root).map_err(io("cannot create the build root"))?;
    run_tool(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", src.display()))
            .arg(&root),
        "cp",
    )?;
    let _ = std::fs::remove_file(root.join(".warren-complete"));
    progress(&format!(
        "template {}: {} file(s), {} run step(s)",
        spec.name,
        spec.files.len(),
        spec.run.len()
    ));
    // The steps get a `/proc` (node, pip and friends need one), mounted in
    // a mount namespace of their own so it goes away with them, however
    // they end.
    std::fs::create_dir_all(root.join("proc"))
        .map_err(io("cannot create the build root's /proc"))?;
    // Their output goes to stderr as it comes, as mmdebstrap's does.
    let status = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg("mount -t proc proc \"$1/proc\" && exec sh \"$2\" \"$1\"")
        .arg("sh")
        .arg(&root)
        .arg(hook)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| TemplateError::Tool {
            tool: "unshare".into(),
            message: format!("cannot run the build steps: {e}"),
        })?;
    if !status.success() {
        return Err(TemplateError::Tool {
            tool: "the build steps".into(),
            message: format!("{status}; their output is above"),
        });
    }
    run_tool(
        std::process::Command::new("tar")
            .args(["--numeric-owner", "--xattrs", "-cf"])
            .arg(tar)
            .arg("-C")
            .arg(&root)
            .arg("."),
        "tar",
    )
}

/// Imports a root filesystem tarball (`docker export` output) as `name`.
pub fn import(
    tarball: &Path,
    name: &str,
    defaults: Defaults,
    store: &Store,
) -> Result<Template, TemplateError> {
    crate::validate_name(name)?;
    defaults.validate()?;
    let copy = store.scratch("import");
    std::fs::copy(tarball, &copy).map_err(io(format!("cannot read {}", tarball.display())))?;
    let digest = store.add_blob(&copy);
    let _ = std::fs::remove_file(&copy);
    let template = Template {
        name: name.to_string(),
        digest: digest?,
        defaults,
        created_at_ms: now_ms(),
        source: format!("import {}", tarball.display()),
        layers: Vec::new(),
        snapshot: None,
        images: Vec::new(),
    };
    store.put(&template)?;
    Ok(template)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hook_quotes_everything() {
        let spec = crate::Spec::parse(
            "name = \"t\"\nrun = [\"echo 'hi' > /x\"]\n[[files]]\npath = \"/etc/a b\"\ncontent = \"it's\"\n",
        )
        .unwrap();
        let s = super::hook_script(&spec);
        assert!(
            s.contains(r#"printf '%s' 'it'\''s' > "$root"'/etc/a b'"#),
            "{s}"
        );
        assert!(
            s.contains(r#"/bin/sh -eu -c 'echo '\''hi'\'' > /x'"#),
            "{s}"
        );
        assert!(
            s.contains(r#"chroot "$root" /usr/bin/env -i 'PATH="#),
            "steps start from a clean environment: {s}"
        );
    }

    #[test]
    fn a_mirror_gives_the_suite_its_updates_and_security() {
        let spec = crate::Spec::parse(
            "name = \"t\"\nsuite = \"jammy\"\nmirror = \"http://archive.ubuntu.com/ubuntu\"\ncomponents = [\"main\", \"universe\"]\n",
        )
        .unwrap();
        assert_eq!(
            super::sources(&spec),
            [
                "deb http://archive.ubuntu.com/ubuntu jammy main universe",
                "deb http://archive.ubuntu.com/ubuntu jammy-updates main universe",
                "deb http://archive.ubuntu.com/ubuntu jammy-security main universe",
            ]
        );
        let debian = crate::Spec::parse("name = \"t\"\n").unwrap();
        assert!(super::sources(&debian).is_empty());
    }
}
