//! Where templates live (`--template-dir`; one directory that every node
//! and gateway of a machine reads, or a shared mount across machines):
//!
//! ```text
//! blobs/sha256-<hex>.tar      the root filesystem as built or imported, or a
//!                             snapshot's layer (immutable)
//! rootfs/<hex>/               that tarball unpacked, read-only to sandboxes
//!                             (0700: only root enters; a layer holds a tenant's files)
//! tmp/                        scratch (unpacking, builds, snapshots), 0700
//! templates/<name>.json       name → digest (+ layers) and sandbox defaults
//! unused/sha256-<hex>         a layer whose last record went (crate::unused)
//! ```
//!
//! `blobs/` is 0700 and every blob 0600; nothing that holds a tenant's
//! files is ever reachable by another host account, not even while it is
//! being unpacked (see [`Store::open`]).
//!
//! A snapshot (`POST /sandboxes/{id}/snapshots`) is a template too: its
//! record names its parent's root (`digest`, plus the parent's `layers`)
//! and one more layer, the sandbox's writable overlay layer at the time,
//! stored as a blob like any root filesystem (owners moved back to the
//! template's ids; overlay whiteouts and opaque directories kept, so it
//! stacks as an overlay lower layer). Its [`Snapshot`] says which team owns
//! it. Deleting a record never removes blobs: sandboxes running from a
//! deleted snapshot keep their layers; the layer is noted (`unused/`) and
//! removed once nothing stacks it ([`crate::unused`]).
//!
//! A blob is named by the SHA-256 of its bytes, checked when it enters the
//! store; it is unpacked once, into a temporary directory renamed into place
//! (so a half-unpacked tree is never used), with numeric owners and modes
//! kept. Records are replaced atomically (write, then rename): a create sees
//! the old template or the new one, never a mix. Nothing in the store is ever
//! changed in place; a rebuild makes a new blob and moves the name.

use crate::spec::Defaults;
use crate::{io, TemplateError};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A named template: its digest and defaults.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Template {
    pub name: String,
    /// `sha256-<hex>` of the root filesystem tarball.
    pub digest: String,
    pub defaults: Defaults,
    /// Milliseconds since the epoch.
    pub created_at_ms: u64,
    /// How it was made (`build FILE`, `import FILE`, `snapshot of SANDBOX`).
    #[serde(default)]
    pub source: String,
    /// Layers stacked on `digest`'s root, bottom first (`sha256-<hex>`
    /// each): a snapshot's, its parent's before it. Empty for a built or
    /// imported template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// Set for a snapshot: who owns it and where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    /// The container image names (normalized: `ubuntu:22.04`) an E2B
    /// build `fromImage` starts from this template for (its build file's
    /// `images`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
}

/// What makes a template record a team's snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Snapshot {
    /// The team that owns it; no other team may see, use or delete it.
    pub team: String,
    /// The name the team gave it, if any (unique per team).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The sandbox it was taken from.
    pub source_sandbox: String,
    /// The node that took it (sandboxes from it are placed there).
    pub node_id: String,
    /// Set on a filesystem-paused sandbox's own record ([`paused_key`]),
    /// never on a team's snapshot: its `team` is empty, so no team's API
    /// call finds, lists or uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Paused>,
    /// Published by its team (E2B's `public`, `PATCH /templates/{id}`):
    /// every team lists and uses it by its `name`; only its team changes
    /// or deletes it. At most one team's template is public under a name.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub public: bool,
}

/// What a filesystem-only pause recorded to boot the sandbox again on
/// another node: the generation it was paused at and its node's settings
/// for it (egress policy, port access), never its secrets (the scheduler
/// keeps those).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Paused {
    pub generation: u64,
    #[serde(default)]
    pub settings: serde_json::Value,
    /// The layers (of the record's `layers`) that earlier pauses of this
    /// sandbox made, and this pause's: removed from the store once the
    /// sandbox is gone; the others are its template's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub own_layers: Vec<String>,
}

/// The record name of filesystem-paused sandbox `sandbox_id`'s layer.
pub fn paused_key(sandbox_id: &str) -> String {
    format!("paused-{sandbox_id}")
}

/// The record name of `team`'s snapshot called `name`: `snap-` and 40 hex
/// of SHA-256 over both, so one team's names can never reach another's
/// record, and taking a named snapshot again replaces the record in place.
pub fn named_snapshot_key(team: &str, name: &str) -> String {
    let mut h = Sha256::new();
    h.update(team.as_bytes());
    h.update([0u8]);
    h.update(name.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("snap-{}", &hex[..40])
}

/// A template store (see the module doc).
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store at `dir` (created if missing). Its `blobs/`, `rootfs/`
    /// and `tmp/` are made its owner's only (0700), and every blob 0600:
    /// they hold every team's files, set-user-ID programs among them, and
    /// everything is unpacked under `tmp/` before it moves into `rootfs/`.
    /// A process running as root (a node, `warren template build`) that
    /// cannot make them so fails; another (a gateway reading a store it
    /// does not own) goes on.
    pub fn open(dir: &Path) -> Result<Store, TemplateError> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir.join("templates")).map_err(io(format!(
            "cannot create {}",
            dir.join("templates").display()
        )))?;
        let root = nix_is_root();
        for sub in ["blobs", "rootfs", "tmp"] {
            let path = dir.join(sub);
            match warren_core::private::dir(&path) {
                Ok(()) => {}
                Err(e) if root => {
                    return Err(io(format!("cannot make {} private (0700)", path.display()))(e))
                }
                Err(_) if path.is_dir() => {}
                Err(e) => return Err(io(format!("cannot create {}", path.display()))(e)),
            }
        }
        if root {
            // Blobs an earlier version stored readable by every account.
            if let Ok(blobs) = std::fs::read_dir(dir.join("blobs")) {
                for blob in blobs.flatten() {
                    let wide = blob
                        .metadata()
                        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o077 != 0);
                    if wide {
                        std::fs::set_permissions(
                            blob.path(),
                            std::fs::Permissions::from_mode(0o600),
                        )
                        .map_err(io(format!("cannot make {} private", blob.path().display())))?;
                    }
                }
            }
        }
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// A scratch directory inside the store (same filesystem, so results
    /// can be renamed into place).
    pub fn scratch(&self, what: &str) -> PathBuf {
        self.dir.join("tmp").join(format!(
            "{what}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ))
    }

    /// Moves the tarball at `tar` into the store under its digest and
    /// unpacks it (once). Returns the digest.
    pub fn add_blob(&self, tar: &Path) -> Result<String, TemplateError> {
        let hex = sha256_file(tar)?;
        let digest = format!("sha256-{hex}");
        let blob = self.blob_path(&digest);
        if !blob.exists() {
            // Private before it is in place: a blob may hold a tenant's files.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(tar, std::fs::Permissions::from_mode(0o600))
                .map_err(io(format!("cannot make {} private", tar.display())))?;
            std::fs::rename(tar, &blob)
                .or_else(|_| std::fs::copy(tar, &blob).map(|_| ()))
                .map_err(io(format!("cannot store {}", blob.display())))?;
        }
        self.unpack(&digest)?;
        Ok(digest)
    }

    /// Records `template` under its name (replacing an older record). An
    /// operator template built again notes its old root and layers
    /// (`crate::unused`): they go once nothing names or stacks them.
    pub fn put(&self, template: &Template) -> Result<(), TemplateError> {
        crate::validate_name(&template.name)?;
        template.defaults.validate()?;
        if template.snapshot.is_none() {
            if let Ok(old) = self.get(&template.name) {
                let gone: Vec<String> = std::iter::once(old.digest)
                    .chain(old.layers)
                    .filter(|d| *d != template.digest && !template.layers.contains(d))
                    .collect();
                self.note_unused(&gone)?;
            }
        }
        let path = self.record_path(&template.name);
        let tmp = self.scratch("record");
        let body = serde_json::to_vec_pretty(template)
            .map_err(|e| TemplateError::Invalid(e.to_string()))?;
        std::fs::write(&tmp, body).map_err(io(format!("cannot write {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io(format!("cannot write {}", path.display())))
    }

    /// Removes the record of `name` (its blobs stay: see the module doc).
    /// False when there was none.
    pub fn remove(&self, name: &str) -> Result<bool, TemplateError> {
        crate::validate_name(name).map_err(|_| TemplateError::NotFound(name.to_string()))?;
        let path = self.record_path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(format!("cannot remove {}", path.display()))(e)),
        }
    }

    /// Removes the layer blob `digest` and its unpacked tree, unless a
    /// record names it (a snapshot taken from it). The caller knows no
    /// sandbox stacks it. False when it stays (or was not there).
    pub fn remove_layer(&self, digest: &str) -> Result<bool, TemplateError> {
        let root = self.rootfs_path(digest)?;
        if self
            .list()?
            .iter()
            .any(|t| t.digest == digest || t.layers.iter().any(|l| l == digest))
        {
            return Ok(false);
        }
        let blob = self.blob_path(digest);
        let had = blob.exists();
        match std::fs::remove_file(&blob) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("cannot remove {}", blob.display()))(e)),
        }
        // Marked incomplete first: a half-removed tree is never used.
        let _ = std::fs::remove_file(root.join(".warren-complete"));
        match std::fs::remove_dir_all(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("cannot remove {}", root.display()))(e)),
        }
        Ok(had)
    }

    /// Removes the blob `digest` and its unpacked tree, whatever names
    /// them (a cache's eviction: the caller holds the layer's exclusive
    /// lock). The tree is marked incomplete first, so a half-removed one is
    /// never used.
    pub fn remove_tree(&self, digest: &str) -> Result<(), TemplateError> {
        let root = self.rootfs_path(digest)?;
        let _ = std::fs::remove_file(root.join(".warren-complete"));
        match std::fs::remove_dir_all(&root) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("cannot remove {}", root.display()))(e)),
        }
        match std::fs::remove_file(self.blob_path(digest)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(format!("cannot remove the blob of {digest}"))(e)),
        }
    }

    /// The template called `name`.
    pub fn get(&self, name: &str) -> Result<Template, TemplateError> {
        crate::validate_name(name).map_err(|_| TemplateError::NotFound(name.to_string()))?;
        let path = self.record_path(name);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TemplateError::NotFound(name.to_string()))
            }
            Err(e) => return Err(io(format!("cannot read {}", path.display()))(e)),
        };
        serde_json::from_slice(&text)
            .map_err(|e| TemplateError::Invalid(format!("{}: {e}", path.display())))
    }

    /// Every template, by name.
    pub fn list(&self) -> Result<Vec<Template>, TemplateError> {
        let dir = self.dir.join("templates");
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir)
            .map_err(io(format!("cannot list {}", dir.display())))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(name) = name.strip_suffix(".json") {
                if let Ok(t) = self.get(name) {
                    out.push(t);
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The unpacked root filesystem of `digest`, checked to be complete.
    pub fn rootfs(&self, digest: &str) -> Result<PathBuf, TemplateError> {
        let dir = self.rootfs_path(digest)?;
        if !dir.join(".warren-complete").exists() {
            if !self.blob_path(digest).exists() {
                return Err(TemplateError::NotFound(digest.to_string()));
            }
            self.unpack(digest)?;
        }
        Ok(dir)
    }

    /// Every blob in the store, by digest, with its file: the layers of
    /// every template, snapshot and paused sandbox it records.
    pub fn blobs(&self) -> Result<Vec<(String, PathBuf)>, TemplateError> {
        let dir = self.dir.join("blobs");
        let read = || io(format!("cannot read {}", dir.display()));
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(read())? {
            let entry = entry.map_err(read())?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(digest) = name.strip_suffix(".tar") else {
                continue;
            };
            if self.rootfs_path(digest).is_ok() && entry.file_type().is_ok_and(|t| t.is_file()) {
                out.push((digest.to_string(), entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    pub(crate) fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{digest}.tar"))
    }

    pub(crate) fn rootfs_path(&self, digest: &str) -> Result<PathBuf, TemplateError> {
        let hex = digest
            .strip_prefix("sha256-")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| TemplateError::Invalid(format!("{digest:?} is not a sha256 digest")))?;
        Ok(self.dir.join("rootfs").join(hex))
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join("templates").join(format!("{name}.json"))
    }

    /// Unpacks a blob (verified against its digest) unless already done.
    fn unpack(&self, digest: &str) -> Result<(), TemplateError> {
        let dir = self.rootfs_path(digest)?;
        if dir.join(".warren-complete").exists() {
            return Ok(());
        }
        let blob = self.blob_path(digest);
        let actual = format!("sha256-{}", sha256_file(&blob)?);
        if actual != digest {
            return Err(TemplateError::Corrupt {
                name: blob.display().to_string(),
                actual,
            });
        }
        // Unpacked one level down in a private scratch directory (inside
        // the private `tmp/`): tar gives the tree's top the archive's mode
        // (0755) when it finishes, which must never open it to other accounts.
        let scratch = self.scratch("unpack");
        warren_core::private::dir(&scratch)
            .map_err(io(format!("cannot create {}", scratch.display())))?;
        let tmp = scratch.join("root");
        std::fs::create_dir(&tmp).map_err(io(format!("cannot create {}", tmp.display())))?;
        let out = std::process::Command::new("tar")
            // Overlay whiteouts' markers (`trusted.overlay.*`) as well as the
            // `user.*` attributes tar restores by default: a snapshot's
            // layer needs them to stack.
            .args([
                "--numeric-owner",
                "--same-permissions",
                "--xattrs",
                "--xattrs-include=user.*",
                "--xattrs-include=trusted.overlay.*",
                "-xf",
            ])
            .arg(&blob)
            .arg("-C")
            .arg(&tmp)
            .output()
            .map_err(io("cannot run tar"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(TemplateError::Tool {
                tool: "tar".into(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        std::fs::write(tmp.join(".warren-complete"), digest)
            .map_err(io("cannot mark the unpacked template"))?;
        let moved = std::fs::rename(&tmp, &dir);
        match moved {
            Ok(()) => {
                let _ = std::fs::remove_dir(&scratch);
                Ok(())
            }
            // Another process unpacked it first.
            Err(_) if dir.join(".warren-complete").exists() => {
                let _ = std::fs::remove_dir_all(&scratch);
                Ok(())
            }
            Err(e) => Err(io(format!(
                "cannot move the unpacked template to {}",
                dir.display()
            ))(e)),
        }
    }
}

fn nix_is_root() -> bool {
    // The euid, without a dependency for one call: `/proc/self/status`.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The hex SHA-256 of a file.
pub fn sha256_file(path: &Path) -> Result<String, TemplateError> {
    let mut f = std::fs::File::open(path).map_err(io(format!("cannot open {}", path.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io(format!("cannot read {}", path.display())))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Test helper: a tarball at `tar` holding `files` (path, contents).
#[cfg(test)]
pub(crate) fn tar_of(tar: &Path, files: &[(&str, &str)]) {
    let src = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = src.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let ok = std::process::Command::new("tar")
        .arg("-cf")
        .arg(tar)
        .arg("-C")
        .arg(src.path())
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_content_addressed_and_records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let tar = dir.path().join("in.tar");
        tar_of(&tar, &[("etc/hello", "hi")]);
        let digest = store.add_blob(&tar).unwrap();
        assert!(digest.starts_with("sha256-"));
        let root = store.rootfs(&digest).unwrap();
        assert_eq!(
            std::fs::read_to_string(root.join("etc/hello")).unwrap(),
            "hi"
        );
        let t = Template {
            name: "t1".into(),
            digest: digest.clone(),
            defaults: Defaults::default(),
            created_at_ms: 1,
            source: "test".into(),
            layers: Vec::new(),
            snapshot: None,
            images: vec!["ubuntu:22.04".into()],
        };
        store.put(&t).unwrap();
        assert_eq!(store.get("t1").unwrap(), t);
        assert_eq!(store.list().unwrap().len(), 1);
        assert!(matches!(store.get("nope"), Err(TemplateError::NotFound(_))));
        assert!(matches!(store.get("../x"), Err(TemplateError::NotFound(_))));
        // A layer a record names stays; once none does, it goes, tree and all.
        let layered = Template {
            name: "t2".into(),
            digest: format!("sha256-{}", "0".repeat(64)),
            layers: vec![digest.clone()],
            ..t.clone()
        };
        store.put(&layered).unwrap();
        assert!(store.remove("t1").unwrap());
        assert!(!store.remove("t1").unwrap());
        assert!(matches!(store.get("t1"), Err(TemplateError::NotFound(_))));
        assert!(!store.remove_layer(&digest).unwrap());
        assert!(root.join("etc/hello").exists());
        assert!(store.remove("t2").unwrap());
        assert!(store.remove_layer(&digest).unwrap());
        assert!(!root.exists());
        assert!(!dir.path().join(format!("blobs/{digest}.tar")).exists());
        assert!(matches!(
            store.rootfs(&digest),
            Err(TemplateError::NotFound(_))
        ));
        assert!(store.remove_layer("../x").is_err());
    }

    #[test]
    fn what_holds_tenant_files_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // An older store: wide directories and a wide blob.
        for sub in ["blobs", "rootfs", "tmp"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
            std::fs::set_permissions(dir.path().join(sub), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        let old_blob = dir.path().join("blobs/sha256-old.tar");
        std::fs::write(&old_blob, "x").unwrap();
        std::fs::set_permissions(&old_blob, std::fs::Permissions::from_mode(0o644)).unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        if !nix_is_root() {
            return; // narrowing an existing store is for its owner, root
        }
        for sub in ["blobs", "rootfs", "tmp"] {
            assert_eq!(mode(&dir.path().join(sub)), 0o700, "{sub}");
        }
        assert_eq!(mode(&old_blob), 0o600);
        let tar = dir.path().join("in.tar");
        tar_of(&tar, &[("f", "hi")]);
        std::fs::set_permissions(&tar, std::fs::Permissions::from_mode(0o644)).unwrap();
        let digest = store.add_blob(&tar).unwrap();
        assert_eq!(mode(&dir.path().join(format!("blobs/{digest}.tar"))), 0o600);
        // Nothing is left in tmp/, and what was unpacked is only under rootfs/.
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );
    }
}
