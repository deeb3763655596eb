//! The template build file (TOML):
//!
//! ```toml
//! name = "base"
//! # from = "base"                   # start from a template instead of Debian
//! suite = "bookworm"                 # the release mmdebstrap installs
//! packages = ["python3", "sudo"]     # from the archive
//! # An archive other than Debian's (all three optional; see below):
//! # mirror = "http://archive.ubuntu.com/ubuntu"
//! # components = ["main", "universe"]
//! # keyring = "ubuntu/ubuntu-archive-keyring.gpg"
//! # images = ["ubuntu:22.04"]        # image names it stands for (E2B's fromImage)
//! run = ["useradd -m -u 1000 user"]  # shell steps, as root in the template
//! trust_host_cas = true              # the build host's added CAs, trusted
//! user = "user"                      # who commands run as by default
//! workdir = "/home/user"
//! start_cmd = ""                     # started in every new sandbox, if set
//! ready_cmd = ""                     # with start_cmd: ready once this exits 0
//! ready_timeout_secs = 30            # how long a create waits for ready
//! cpu_count = 2
//! memory_mb = 512
//! disk_mb = 2048
//!
//! [env]
//! LANG = "C.UTF-8"
//!
//! [[files]]
//! path = "/etc/sudoers.d/user"
//! content = "user ALL=(ALL) NOPASSWD:ALL\n"
//! mode = "0440"
//!
//! [[files]]
//! path = "/opt/app/server.py"
//! source = "app/server.py"           # a file next to the build file
//! ```
//!
//! The archive: without `mirror`, mmdebstrap's own choice for a Debian
//! `suite` (deb.debian.org, with `-updates` and security). With `mirror`,
//! the template's (and the build's) apt sources are that archive's `suite`,
//! `suite-updates` and `suite-security` (Ubuntu's layout), each with
//! `components` (default `main`). `keyring` is the archive's public key
//! (an OpenPGP keyring file, relative to the build file) that the build
//! checks the archive's signature with; without it, the build host's
//! (Debian's) keys. `images` names the container images (`ubuntu:22.04`,
//! `docker.io/library/ubuntu:22.04` alike) the template stands in for: an
//! E2B build `fromImage` one of them starts from this template.

use crate::TemplateError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A file the build writes into the template (as root, before `run`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct File {
    pub path: String,
    /// The file's text. A build file gives this or `source`;
    /// [`Spec::load`] reads `source` into it.
    #[serde(default)]
    pub content: String,
    /// A text file to copy, relative to the build file's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Octal permission bits, default `0644`.
    #[serde(default = "default_mode")]
    pub mode: String,
}

fn default_mode() -> String {
    "0644".into()
}

/// The sandbox defaults a template carries (also stored with it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    #[serde(default = "default_user")]
    pub user: String,
    #[serde(default = "default_workdir")]
    pub workdir: String,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A shell command line started (as `user`, in `workdir`) in every new
    /// sandbox; empty: none.
    #[serde(default)]
    pub start_cmd: String,
    /// A shell command line run again and again after `start_cmd` until it
    /// exits 0: the sandbox is ready then, and a create answers only once
    /// it is. Empty: ready as soon as `start_cmd` started.
    #[serde(default)]
    pub ready_cmd: String,
    /// How long a create waits for ready before it fails (and the sandbox
    /// is removed).
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_secs: u64,
    #[serde(default = "default_cpus")]
    pub cpu_count: u32,
    #[serde(default = "default_memory")]
    pub memory_mb: u64,
    #[serde(default = "default_disk")]
    pub disk_mb: u64,
}

fn default_user() -> String {
    "user".into()
}
fn default_workdir() -> String {
    "/home/user".into()
}
fn default_ready_timeout() -> u64 {
    30
}
/// The longest `ready_timeout_secs` a template may ask for.
pub const MAX_READY_TIMEOUT_SECS: u64 = 600;
fn default_cpus() -> u32 {
    2
}
fn default_memory() -> u64 {
    512
}
fn default_disk() -> u64 {
    2048
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            user: default_user(),
            workdir: default_workdir(),
            env: BTreeMap::new(),
            start_cmd: String::new(),
            ready_cmd: String::new(),
            ready_timeout_secs: default_ready_timeout(),
            cpu_count: default_cpus(),
            memory_mb: default_memory(),
            disk_mb: default_disk(),
        }
    }
}

/// A build file.
///
/// (Unknown keys are refused in [`Spec::parse`]: serde's
/// `deny_unknown_fields` cannot be combined with the flattened defaults.)
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Spec {
    pub name: String,
    /// Start from this template (by name) instead of a fresh Debian: only
    /// `files` and `run` apply (`suite`/`packages` must be empty).
    #[serde(default)]
    pub from: Option<String>,
    #[serde(default = "default_suite")]
    pub suite: String,
    #[serde(default)]
    pub packages: Vec<String>,
    /// The archive's URL; none: mmdebstrap's default (Debian's).
    #[serde(default)]
    pub mirror: Option<String>,
    /// The archive areas (`main`, `universe`, ...); empty: `main`.
    #[serde(default)]
    pub components: Vec<String>,
    /// The archive's keyring, relative to the build file.
    #[serde(default)]
    pub keyring: Option<String>,
    /// `keyring` found next to the build file ([`Spec::load`] sets it).
    #[serde(skip)]
    pub keyring_path: Option<std::path::PathBuf>,
    /// The container image names this template stands for.
    #[serde(default)]
    pub images: Vec<String>,
    #[serde(default)]
    pub files: Vec<File>,
    #[serde(default)]
    pub run: Vec<String>,
    /// Copy the build host's own CA certificates
    /// (`/usr/local/share/ca-certificates/*.crt`: a corporate or egress
    /// proxy's) into the template and trust them. Default on.
    #[serde(default = "default_true")]
    pub trust_host_cas: bool,
    /// What a sandbox made from the template starts with.
    #[serde(flatten)]
    pub defaults: Defaults,
}

/// The keys a build file may have.
const KEYS: &[&str] = &[
    "name",
    "from",
    "suite",
    "packages",
    "mirror",
    "components",
    "keyring",
    "images",
    "files",
    "run",
    "trust_host_cas",
    "user",
    "workdir",
    "env",
    "start_cmd",
    "ready_cmd",
    "ready_timeout_secs",
    "cpu_count",
    "memory_mb",
    "disk_mb",
];

fn default_true() -> bool {
    true
}

fn default_suite() -> String {
    "bookworm".into()
}

impl Spec {
    /// The sandbox defaults this template carries.
    pub fn defaults(&self) -> Defaults {
        self.defaults.clone()
    }

    /// Reads, parses and checks the build file at `path`, reading each
    /// file's `source` (relative to `path`'s directory) into its `content`.
    pub fn load(path: &std::path::Path) -> Result<Spec, TemplateError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| TemplateError::Invalid(format!("{}: {e}", path.display())))?;
        let dir = path.parent().unwrap_or(std::path::Path::new("."));
        Spec::parse_in(&text, dir)
    }

    /// [`Spec::parse`], then each file's `source` read from `dir`.
    pub fn parse_in(text: &str, dir: &std::path::Path) -> Result<Spec, TemplateError> {
        let mut spec = Spec::parse(text)?;
        if let Some(k) = &spec.keyring {
            let at = dir.join(k);
            std::fs::metadata(&at)
                .map_err(|e| TemplateError::Invalid(format!("keyring {}: {e}", at.display())))?;
            // mmdebstrap runs elsewhere: the path must not depend on its
            // working directory.
            spec.keyring_path =
                Some(std::path::absolute(&at).map_err(|e| {
                    TemplateError::Invalid(format!("keyring {}: {e}", at.display()))
                })?);
        }
        for f in &mut spec.files {
            if let Some(source) = &f.source {
                let at = dir.join(source);
                f.content = std::fs::read_to_string(&at).map_err(|e| {
                    TemplateError::Invalid(format!(
                        "file {:?}: its source {} cannot be read as text: {e}",
                        f.path,
                        at.display()
                    ))
                })?;
            }
        }
        Ok(spec)
    }

    /// Whether any file comes from a `source`, or the keyring from a file
    /// (and so the build file's text alone does not say what the template
    /// holds).
    pub fn has_sources(&self) -> bool {
        self.keyring.is_some() || self.files.iter().any(|f| f.source.is_some())
    }

    /// Parses and checks a build file; errors name the field. A file's
    /// `source` is not read here (see [`Spec::load`]).
    pub fn parse(text: &str) -> Result<Spec, TemplateError> {
        let table: toml::Table = toml::from_str(text)
            .map_err(|e| TemplateError::Invalid(format!("template file: {e}")))?;
        if let Some(k) = table.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(TemplateError::Invalid(format!(
                "template file: unknown field `{k}` (known: {})",
                KEYS.join(", ")
            )));
        }
        let spec: Spec = table
            .try_into()
            .map_err(|e| TemplateError::Invalid(format!("template file: {e}")))?;
        spec.validate()?;
        Ok(spec)
    }

    fn validate(&self) -> Result<(), TemplateError> {
        let bad = |m: String| Err(TemplateError::Invalid(m));
        crate::validate_name(&self.name)?;
        if let Some(from) = &self.from {
            crate::validate_name(from)?;
            if !self.packages.is_empty() {
                return bad("packages cannot be added to a template built `from` another; use run steps (apt-get install)".into());
            }
        }
        if self.suite.is_empty()
            || !self
                .suite
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad(format!("suite {:?} is not a release name", self.suite));
        }
        if let Some(m) = &self.mirror {
            let ok = (m.starts_with("http://") || m.starts_with("https://"))
                && !m
                    .bytes()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control());
            if !ok {
                return bad(format!(
                    "mirror {m:?} must be an http:// or https:// URL without spaces"
                ));
            }
        }
        for c in &self.components {
            let ok = !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_/".contains(&b));
            if !ok {
                return bad(format!("component {c:?} is not an archive area name"));
            }
        }
        if let Some(k) = &self.keyring {
            if k.is_empty() || k.starts_with('/') || k.contains(',') {
                return bad(format!(
                    "keyring {k:?} must be a path relative to the build file"
                ));
            }
        }
        if self.from.is_some()
            && (self.mirror.is_some() || !self.components.is_empty() || self.keyring.is_some())
        {
            return bad("mirror, components and keyring are for a fresh root, not a template built `from` another".into());
        }
        for i in &self.images {
            normalize_image(i)?;
        }
        for p in &self.packages {
            let ok = !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.:=~".contains(&b));
            if !ok {
                return bad(format!("package {p:?} is not a Debian package name"));
            }
        }
        for f in &self.files {
            if !f.path.starts_with('/') || f.path.split('/').any(|c| c == "..") {
                return bad(format!(
                    "file path {:?} must be absolute, without '..'",
                    f.path
                ));
            }
            match &f.source {
                Some(_) if !f.content.is_empty() => {
                    return bad(format!(
                        "file {:?}: give content or source, not both",
                        f.path
                    ))
                }
                Some(src) if src.is_empty() || src.starts_with('/') => {
                    return bad(format!(
                        "file {:?}: source {src:?} must be a path relative to the build file",
                        f.path
                    ))
                }
                _ => {}
            }
            if u32::from_str_radix(&f.mode, 8).map_or(true, |m| m > 0o7777) {
                return bad(format!(
                    "file {:?}: mode {:?} is not octal permission bits",
                    f.path, f.mode
                ));
            }
        }
        self.defaults().validate()
    }
}

/// An image name as a registry would resolve it: Docker Hub's
/// `docker.io/` (or `index.docker.io/`) and `library/` dropped, `:latest`
/// when no tag or digest is given. `ubuntu:22.04`,
/// `library/ubuntu:22.04` and `docker.io/library/ubuntu:22.04` are one.
pub fn normalize_image(image: &str) -> Result<String, TemplateError> {
    let ok = !image.is_empty()
        && image.len() <= 255
        && image
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@".contains(&b));
    if !ok {
        return Err(TemplateError::Invalid(format!(
            "image {image:?} is not an image name (like ubuntu:22.04)"
        )));
    }
    let mut name = image;
    for registry in ["docker.io/", "index.docker.io/", "registry-1.docker.io/"] {
        name = name.strip_prefix(registry).unwrap_or(name);
    }
    name = name.strip_prefix("library/").unwrap_or(name);
    let last = name.rsplit('/').next().unwrap_or(name);
    if last.contains(':') || last.contains('@') {
        Ok(name.to_string())
    } else {
        Ok(format!("{name}:latest"))
    }
}

impl Defaults {
    /// Checks the values a sandbox will be made with.
    pub fn validate(&self) -> Result<(), TemplateError> {
        let bad = |m: String| Err(TemplateError::Invalid(m));
        if self.user.is_empty() || self.user.contains(['/', ':', '\0', '\n']) {
            return bad(format!("user {:?} is not a user name", self.user));
        }
        if !self.workdir.starts_with('/') {
            return bad(format!("workdir {:?} must be absolute", self.workdir));
        }
        if !(1..=64).contains(&self.cpu_count) {
            return bad(format!(
                "cpu_count {} must be between 1 and 64",
                self.cpu_count
            ));
        }
        if self.memory_mb < 64 {
            return bad(format!("memory_mb {} must be at least 64", self.memory_mb));
        }
        if self.disk_mb < 64 {
            return bad(format!("disk_mb {} must be at least 64", self.disk_mb));
        }
        if !self.ready_cmd.is_empty() && self.start_cmd.is_empty() {
            return bad("ready_cmd needs a start_cmd (it says when that is ready)".into());
        }
        if !(1..=MAX_READY_TIMEOUT_SECS).contains(&self.ready_timeout_secs) {
            return bad(format!(
                "ready_timeout_secs {} must be between 1 and {MAX_READY_TIMEOUT_SECS}",
                self.ready_timeout_secs
            ));
        }
        for (what, cmd) in [
            ("start_cmd", &self.start_cmd),
            ("ready_cmd", &self.ready_cmd),
        ] {
            if cmd.contains('\0') {
                return bad(format!("{what} contains a NUL byte"));
            }
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains(['=', '\0']) {
                return bad(format!("env name {k:?} is not allowed"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_defaults() {
        let s = Spec::parse("name = \"t\"\npackages = [\"curl\"]\n[env]\nA = \"1\"\n").unwrap();
        assert_eq!(s.suite, "bookworm");
        assert_eq!(s.defaults.user, "user");
        assert_eq!(s.defaults.memory_mb, 512);
        assert_eq!(s.defaults.env["A"], "1");
        assert_eq!(s.defaults.ready_timeout_secs, 30);
        assert!(s.defaults.start_cmd.is_empty());
    }

    #[test]
    fn sources_are_read_next_to_the_build_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("app")).unwrap();
        std::fs::write(dir.path().join("app/run.sh"), "echo hi\n").unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(
            &file,
            "name = \"t\"\n[[files]]\npath = \"/opt/run.sh\"\nsource = \"app/run.sh\"\nmode = \"0755\"\n",
        )
        .unwrap();
        let spec = Spec::load(&file).unwrap();
        assert_eq!(spec.files[0].content, "echo hi\n");
        assert!(spec.has_sources());
        std::fs::remove_file(dir.path().join("app/run.sh")).unwrap();
        let e = Spec::load(&file).unwrap_err().to_string();
        assert!(e.contains("app/run.sh"), "{e}");
    }

    #[test]
    fn rejects_bad_fields_by_name() {
        for (text, needle) in [
            ("name = \"t\"\npackages = [\"curl; rm -rf /\"]", "package"),
            ("name = \"T\"", "template name"),
            (
                "name = \"t\"\n[[files]]\npath = \"etc/x\"\ncontent = \"\"",
                "absolute",
            ),
            ("name = \"t\"\nmemory_mb = 1", "memory_mb"),
            ("name = \"t\"\nbogus = 1", "unknown field"),
            ("name = \"t\"\nready_cmd = \"true\"", "needs a start_cmd"),
            (
                "name = \"t\"\nstart_cmd = \"x\"\nready_timeout_secs = 0",
                "ready_timeout_secs",
            ),
            (
                "name = \"t\"\n[[files]]\npath = \"/x\"\ncontent = \"a\"\nsource = \"b\"",
                "not both",
            ),
            (
                "name = \"t\"\n[[files]]\npath = \"/x\"\nsource = \"/etc/passwd\"",
                "relative",
            ),
            ("name = \"t\"\nmirror = \"ftp://x\"", "mirror"),
            ("name = \"t\"\nmirror = \"http://a b\"", "mirror"),
            (
                "name = \"t\"\ncomponents = [\"main universe\"]",
                "component",
            ),
            ("name = \"t\"\nkeyring = \"/etc/k.gpg\"", "relative"),
            (
                "name = \"t\"\nfrom = \"base\"\nmirror = \"http://x\"",
                "fresh root",
            ),
            ("name = \"t\"\nimages = [\"ubuntu 22.04\"]", "image name"),
        ] {
            let e = Spec::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn images_normalize_as_a_registry_resolves_them() {
        for (a, b) in [
            ("ubuntu:22.04", "ubuntu:22.04"),
            ("docker.io/library/ubuntu:22.04", "ubuntu:22.04"),
            ("library/ubuntu:22.04", "ubuntu:22.04"),
            ("ubuntu", "ubuntu:latest"),
            ("e2bdev/base", "e2bdev/base:latest"),
            ("ghcr.io/x/y:1", "ghcr.io/x/y:1"),
            ("localhost:5000/y", "localhost:5000/y:latest"),
        ] {
            assert_eq!(normalize_image(a).unwrap(), b, "{a}");
        }
        assert!(normalize_image("").is_err());
        assert!(normalize_image("a;b").is_err());
    }

    #[test]
    fn the_keyring_is_found_next_to_the_build_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(
            &file,
            "name = \"t\"\nsuite = \"jammy\"\nmirror = \"http://archive.ubuntu.com/ubuntu\"\n\
             components = [\"main\", \"universe\"]\nkeyring = \"k/a.gpg\"\nimages = [\"ubuntu:22.04\"]\n",
        )
        .unwrap();
        let e = Spec::load(&file).unwrap_err().to_string();
        assert!(e.contains("k/a.gpg"), "{e}");
        std::fs::create_dir(dir.path().join("k")).unwrap();
        std::fs::write(dir.path().join("k/a.gpg"), b"\x99\x02").unwrap();
        let spec = Spec::load(&file).unwrap();
        assert_eq!(
            spec.keyring_path.as_deref(),
            Some(dir.path().join("k/a.gpg").as_path())
        );
        assert!(
            spec.has_sources(),
            "the keyring's bytes are not in the text"
        );
        assert_eq!(spec.images, ["ubuntu:22.04"]);
    }
}
