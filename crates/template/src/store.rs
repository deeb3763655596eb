//! Where templates live (`--template-dir`; one directory that every node
//! and gateway of a machine reads, or a shared mount across machines):
//!
//! ```text
//! blobs/sha256-<hex>.tar      the root filesystem as built or imported (immutable)
//! rootfs/<hex>/               that tarball unpacked, read-only to sandboxes
//! templates/<name>.json       name → digest and sandbox defaults
//! ```
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
    /// How it was made (`build FILE`, `import FILE`).
    #[serde(default)]
    pub source: String,
}

/// A template store (see the module doc).
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// The store at `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<Store, TemplateError> {
        for sub in ["blobs", "rootfs", "templates", "tmp"] {
            std::fs::create_dir_all(dir.join(sub))
                .map_err(io(format!("cannot create {}", dir.join(sub).display())))?;
        }
        Ok(Store {
            dir: dir.to_path_buf(),
        })
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
            std::fs::rename(tar, &blob)
                .or_else(|_| std::fs::copy(tar, &blob).map(|_| ()))
                .map_err(io(format!("cannot store {}", blob.display())))?;
        }
        self.unpack(&digest)?;
        Ok(digest)
    }

    /// Records `template` under its name (replacing an older record).
    pub fn put(&self, template: &Template) -> Result<(), TemplateError> {
        crate::validate_name(&template.name)?;
        template.defaults.validate()?;
        let path = self.record_path(&template.name);
        let tmp = self.scratch("record");
        let body = serde_json::to_vec_pretty(template)
            .map_err(|e| TemplateError::Invalid(e.to_string()))?;
        std::fs::write(&tmp, body).map_err(io(format!("cannot write {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io(format!("cannot write {}", path.display())))
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

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs").join(format!("{digest}.tar"))
    }

    fn rootfs_path(&self, digest: &str) -> Result<PathBuf, TemplateError> {
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
        let tmp = self.scratch("unpack");
        std::fs::create_dir_all(&tmp).map_err(io(format!("cannot create {}", tmp.display())))?;
        let out = std::process::Command::new("tar")
            .args(["--numeric-owner", "--same-permissions", "--xattrs", "-xf"])
            .arg(&blob)
            .arg("-C")
            .arg(&tmp)
            .output()
            .map_err(io("cannot run tar"))?;
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(TemplateError::Tool {
                tool: "tar".into(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        std::fs::write(tmp.join(".warren-complete"), digest)
            .map_err(io("cannot mark the unpacked template"))?;
        match std::fs::rename(&tmp, &dir) {
            Ok(()) => Ok(()),
            // Another process unpacked it first.
            Err(_) if dir.join(".warren-complete").exists() => {
                let _ = std::fs::remove_dir_all(&tmp);
                Ok(())
            }
            Err(e) => Err(io(format!(
                "cannot move the unpacked template to {}",
                dir.display()
            ))(e)),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_content_addressed_and_records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("etc")).unwrap();
        std::fs::write(src.path().join("etc/hello"), "hi").unwrap();
        let tar = dir.path().join("in.tar");
        let ok = std::process::Command::new("tar")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(src.path())
            .arg(".")
            .status()
            .unwrap();
        assert!(ok.success());
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
        };
        store.put(&t).unwrap();
        assert_eq!(store.get("t1").unwrap(), t);
        assert_eq!(store.list().unwrap().len(), 1);
        assert!(matches!(store.get("nope"), Err(TemplateError::NotFound(_))));
        assert!(matches!(store.get("../x"), Err(TemplateError::NotFound(_))));
    }
}
