//! Layers that lost their records, and their removal.
//!
//! A snapshot's layer (and a built template's) is a blob in the store that
//! the records of the team's snapshots name. Deleting or replacing the last
//! record that names a layer does not remove it at once: a running or
//! paused sandbox may stack it, on any node sharing the store, and a create
//! that read the record just before may be mounting it. Instead the layer
//! is *noted* (`unused/<digest>`, its time the time of the last note), and
//! whoever can prove that nothing uses it any more removes it with
//! [`Store::remove_unused`] (the gateway: after `--layer-gc-grace`, once
//! every node has said its sandboxes do not stack it). A noted layer that
//! a record names again stays, noted, until no record does.
//!
//! A record's end notes its layers; an operator template built again under
//! its name notes its old root ([`Store::put`]). Whatever is noted goes
//! only once no record names it and no sandbox of the host leases it
//! ([`Store::lease`], `crate::gc`).

use crate::{io, Store, TemplateError};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// What [`Store::remove_unused`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its blob and unpacked tree are gone, and its note.
    Removed,
    /// A record names it again: it stays (and stays noted).
    Named,
    /// It was not in the store (any more); the note is gone.
    Gone,
    /// A sandbox of this host stacks it (holds its lease): it stays, noted.
    InUse,
}

impl Store {
    fn unused_dir(&self) -> PathBuf {
        self.path().join("unused")
    }

    /// Notes `layers` (digests a deleted or replaced record named) as
    /// candidates for removal, each at the time now. Malformed digests are
    /// skipped.
    pub fn note_unused(&self, layers: &[String]) -> Result<(), TemplateError> {
        let dir = self.unused_dir();
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(format!("cannot create {}", dir.display()))(e)),
            }
        }
        for l in layers.iter().filter(|l| is_digest(l)) {
            let path = dir.join(l);
            // Written again each time: the note's time is the last record's end.
            std::fs::write(&path, b"").map_err(io(format!("cannot write {}", path.display())))?;
        }
        Ok(())
    }

    /// The noted layers, each with how long ago it was last noted.
    pub fn noted_unused(&self) -> Result<Vec<(String, Duration)>, TemplateError> {
        let dir = self.unused_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("cannot list {}", dir.display()))(e)),
        };
        let now = SystemTime::now();
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !is_digest(&name) {
                continue;
            }
            let age = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default();
            out.push((name, age));
        }
        out.sort();
        Ok(out)
    }

    /// Removes noted layer `digest` (blob, unpacked tree, note) unless a
    /// record names it. The caller has made sure no sandbox stacks it.
    pub fn remove_unused(&self, digest: &str) -> Result<Removal, TemplateError> {
        if !is_digest(digest) {
            return Err(TemplateError::Invalid(format!(
                "{digest:?} is not a sha256 digest"
            )));
        }
        let named = self
            .list()?
            .iter()
            .any(|t| t.digest == digest || t.layers.iter().any(|l| l == digest));
        if named {
            return Ok(Removal::Named);
        }
        // Held while it is removed: a sandbox leasing it waits, then finds
        // it gone (and a leased one stays).
        let _held = match self.tree_handle_locked(digest)? {
            Some(Ok(held)) => Some(held),
            Some(Err(())) => return Ok(Removal::InUse),
            None => None,
        };
        let had = self.remove_layer(digest)?;
        let note = self.unused_dir().join(digest);
        match std::fs::remove_file(&note) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(format!("cannot remove {}", note.display()))(e)),
        }
        Ok(if had { Removal::Removed } else { Removal::Gone })
    }

    /// The size in bytes of blob `digest`, if the store has it.
    pub fn blob_size(&self, digest: &str) -> Option<u64> {
        if !is_digest(digest) {
            return None;
        }
        std::fs::metadata(self.path().join("blobs").join(format!("{digest}.tar")))
            .ok()
            .map(|m| m.len())
    }
}

/// `sha256-` and 64 lowercase hex digits.
fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256-")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Defaults;
    use crate::Template;

    fn layer(store: &Store, dir: &std::path::Path, content: &str) -> String {
        let tar = dir.join(format!("{content}.tar"));
        crate::store::tar_of(&tar, &[("f", content)]);
        store.add_blob(&tar).unwrap()
    }

    #[test]
    fn noted_layers_go_once_no_record_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let (a, b) = (
            layer(&store, scratch.path(), "a"),
            layer(&store, scratch.path(), "b"),
        );
        assert!(store.blob_size(&a).is_some_and(|n| n > 0));
        let record = Template {
            name: "snap-1".into(),
            digest: format!("sha256-{}", "0".repeat(64)),
            defaults: Defaults::default(),
            created_at_ms: 1,
            source: "test".into(),
            layers: vec![a.clone()],
            snapshot: None,
            images: Vec::new(),
        };
        store.put(&record).unwrap();
        store
            .note_unused(&[a.clone(), b.clone(), "../x".into()])
            .unwrap();
        let noted: Vec<String> = store
            .noted_unused()
            .unwrap()
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        let mut want = vec![a.clone(), b.clone()];
        want.sort();
        assert_eq!(noted, want);
        // Named by a record: stays, noted.
        assert_eq!(store.remove_unused(&a).unwrap(), Removal::Named);
        assert!(store.rootfs(&a).is_ok());
        // Named by none: gone, tree, blob and note.
        assert_eq!(store.remove_unused(&b).unwrap(), Removal::Removed);
        assert!(store.blob_size(&b).is_none());
        assert!(store.rootfs(&b).is_err());
        assert_eq!(store.remove_unused(&b).unwrap(), Removal::Gone);
        store.remove("snap-1").unwrap();
        assert_eq!(store.remove_unused(&a).unwrap(), Removal::Removed);
        assert!(store.noted_unused().unwrap().is_empty());
        assert!(store.remove_unused("../etc").is_err());
    }
}
