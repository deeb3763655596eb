//! Collecting what a template store no longer needs (`warren template gc`):
//! records of teams that are gone, blobs and unpacked trees no record
//! names, scratch left by work that died, notes of layers that are gone.
//!
//! A tree (`rootfs/<hex>`) or blob (`blobs/sha256-<hex>.tar`) goes only
//! when all of these hold:
//!
//! - **no record names it** (as a root or a layer), after the records of
//!   gone teams are removed;
//! - **it has been unnamed for the grace period**: the later of the blob's
//!   time, the tree's completion and the last note of it (a record's end
//!   notes its layers: `crate::unused`; a rebuild notes the old root) is at
//!   least `grace` ago. A create that resolved a record just before it went
//!   has mounted what it named well within that time;
//! - **no sandbox of this host stacks it**: nodes hold a shared `flock` on
//!   the tree's directory for every tree a sandbox stacks
//!   ([`Store::lease`]), and the collection takes the exclusive lock
//!   without waiting and holds it while it removes; a tree it cannot lock
//!   stays.
//!
//! Records go only for the teams the caller says are gone (every team not
//! in `keep_teams`); without that list no record is touched. Operator
//! templates and paused sandboxes' own records are never removed here.
//!
//! [`Store::gc`] with `dry_run` says what it would do and changes nothing.

use crate::{io, Store, TemplateError};
use nix::fcntl::{Flock, FlockArg};
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// What a collection removes.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// How long a blob or tree must have been unnamed.
    pub grace: Duration,
    /// The teams that still exist: every other team's snapshots and built
    /// templates are removed (their layers then go with the rest). `None`:
    /// records are kept.
    pub keep_teams: Option<HashSet<String>>,
    /// Say what would go; remove nothing.
    pub dry_run: bool,
}

/// One thing removed (or, dry, to be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    /// A record name, a digest, or a scratch path.
    pub what: String,
    pub bytes: u64,
    pub why: String,
}

/// What a collection did (or, dry, would do).
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    pub records: Vec<Gone>,
    pub layers: Vec<Gone>,
    pub scratch: Vec<Gone>,
    /// Unnamed but kept: in use, or within the grace period.
    pub kept: Vec<Gone>,
}

impl GcReport {
    /// Bytes removed (blobs, trees, scratch).
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .chain(&self.scratch)
            .map(|g| g.bytes)
            .sum()
    }
}

/// What a store holds now (`warren template gc --dry-run` prints it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub records: usize,
    pub blobs: usize,
    pub blob_bytes: u64,
    pub trees: usize,
    pub tree_bytes: u64,
}

/// Bytes under `path` (not following symlinks), best effort.
pub fn du(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries.flatten().map(|e| du(&e.path())).sum()
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
}

impl Store {
    /// The unpacked tree of `digest` opened for its lock (a `flock` on the
    /// directory itself: a tree linked from another store, as private
    /// stores link the machine's, is the same directory, so that store's
    /// collection sees leases taken through the link). `None` when there
    /// is no tree.
    fn tree_handle(&self, digest: &str) -> Result<Option<File>, TemplateError> {
        let root = self.rootfs_path(digest)?;
        match File::open(&root) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("cannot open {}", root.display()))(e)),
        }
    }

    /// A lease on tree `digest` for a sandbox that stacks it: a shared
    /// `flock` on the tree's directory, held until the lease is dropped
    /// (or the process dies), so no collection removes the tree under the
    /// sandbox. The tree is unpacked first when only its blob is here.
    pub fn lease(&self, digest: &str) -> Result<crate::cache::Lease, TemplateError> {
        let root = self.rootfs(digest)?;
        let dir = self
            .tree_handle(digest)?
            .ok_or_else(|| TemplateError::NotFound(digest.to_string()))?;
        let lock = Flock::lock(dir, FlockArg::LockShared)
            .map_err(|(_, e)| io(format!("cannot lock layer {digest}"))(e.into()))?;
        // Removed by a collection between the look and the lock.
        if !root.join(".warren-complete").exists() {
            return Err(TemplateError::NotFound(digest.to_string()));
        }
        Ok(crate::cache::Lease::new(root, lock))
    }

    /// Tree `digest` locked for its removal: `None` when there is no tree,
    /// `Some(Err)` when a sandbox of this host leases it.
    pub(crate) fn tree_handle_locked(
        &self,
        digest: &str,
    ) -> Result<Option<Result<Flock<File>, ()>>, TemplateError> {
        Ok(self
            .tree_handle(digest)?
            .map(|f| Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|_| ())))
    }

    /// Whether a sandbox of this host holds a lease on `digest`.
    pub fn leased(&self, digest: &str) -> bool {
        match self.tree_handle(digest) {
            Ok(Some(f)) => Flock::lock(f, FlockArg::LockExclusiveNonblock).is_err(),
            _ => false,
        }
    }

    /// Every digest with a blob or a tree here.
    fn held(&self) -> Result<Vec<String>, TemplateError> {
        let mut out: HashSet<String> = self.blobs()?.into_iter().map(|(d, _)| d).collect();
        let rootfs = self.path().join("rootfs");
        if let Ok(entries) = std::fs::read_dir(&rootfs) {
            for e in entries.flatten() {
                let d = format!("sha256-{}", e.file_name().to_string_lossy());
                if self.rootfs_path(&d).is_ok() {
                    out.insert(d);
                }
            }
        }
        let mut out: Vec<String> = out.into_iter().collect();
        out.sort();
        Ok(out)
    }

    /// What the store holds now.
    pub fn usage(&self) -> Result<Usage, TemplateError> {
        let blobs = self.blobs()?;
        let mut u = Usage {
            records: self.list()?.len(),
            blobs: blobs.len(),
            blob_bytes: blobs.iter().map(|(_, p)| du(p)).sum(),
            ..Usage::default()
        };
        if let Ok(entries) = std::fs::read_dir(self.path().join("rootfs")) {
            for e in entries.flatten() {
                u.trees += 1;
                u.tree_bytes += du(&e.path());
            }
        }
        Ok(u)
    }

    /// Collects (see the module doc).
    pub fn gc(&self, opts: &GcOptions) -> Result<GcReport, TemplateError> {
        let mut report = GcReport::default();
        let now = SystemTime::now();
        let old = |t: Option<SystemTime>| {
            t.and_then(|t| now.duration_since(t).ok())
                .is_none_or(|age| age >= opts.grace)
        };

        // 1. The records of gone teams.
        let mut records = self.list()?;
        if let Some(keep) = &opts.keep_teams {
            let mut left = Vec::with_capacity(records.len());
            for t in records {
                let gone_team = t
                    .snapshot
                    .as_ref()
                    .filter(|s| s.paused.is_none() && !s.team.is_empty())
                    .filter(|s| !keep.contains(&s.team))
                    .map(|s| s.team.clone());
                match gone_team {
                    Some(team) => {
                        if !opts.dry_run {
                            self.remove(&t.name)?;
                            self.note_unused(&t.layers)?;
                        }
                        report.records.push(Gone {
                            what: t.name.clone(),
                            bytes: 0,
                            why: format!("team {team:?} is gone"),
                        });
                    }
                    None => left.push(t),
                }
            }
            records = left;
        }

        // 2. Blobs and trees no record left names.
        let named: HashSet<&String> = records
            .iter()
            .flat_map(|t| std::iter::once(&t.digest).chain(t.layers.iter()))
            .collect();
        let notes: BTreeMap<String, Duration> = self.noted_unused()?.into_iter().collect();
        for digest in self.held()? {
            if named.contains(&digest) {
                continue;
            }
            let root = self.rootfs_path(&digest)?;
            let blob = self.blob_path(&digest);
            let bytes = du(&root) + du(&blob);
            let last = [
                modified(&blob),
                modified(&root.join(".warren-complete")),
                modified(&root),
                notes.get(&digest).and_then(|age| now.checked_sub(*age)),
            ]
            .into_iter()
            .flatten()
            .max();
            if !old(last) {
                report.kept.push(Gone {
                    what: digest,
                    bytes,
                    why: format!("unnamed for less than {:?}", opts.grace),
                });
                continue;
            }
            // Held while it is removed: a node leasing it waits, then
            // finds it gone. No tree: nothing can stack it.
            let _held = match self.tree_handle_locked(&digest)? {
                None => None,
                Some(Ok(held)) => Some(held),
                Some(Err(())) => {
                    report.kept.push(Gone {
                        what: digest,
                        bytes,
                        why: "a sandbox of this host stacks it".into(),
                    });
                    continue;
                }
            };
            if !opts.dry_run {
                // remove_layer checks the records once more.
                if !self.remove_layer(&digest)? {
                    // Its blob was gone already; the tree is not now.
                    let _ = std::fs::remove_dir_all(&root);
                }
                let _ = std::fs::remove_file(self.path().join("unused").join(&digest));
            }
            report.layers.push(Gone {
                what: digest,
                bytes,
                why: "no record names it".into(),
            });
        }
        // Notes of digests no longer here.
        if !opts.dry_run {
            for digest in notes.keys() {
                let root = self.rootfs_path(digest)?;
                if !root.exists() && !self.blob_path(digest).exists() {
                    let _ = std::fs::remove_file(self.path().join("unused").join(digest));
                }
            }
        }

        // 3. Scratch of work that died (builds, unpacks, snapshots).
        let tmp = self.path().join("tmp");
        if let Ok(entries) = std::fs::read_dir(&tmp) {
            for e in entries.flatten() {
                let path = e.path();
                if !old(modified(&path)) {
                    continue;
                }
                let bytes = du(&path);
                if !opts.dry_run {
                    let gone = if path.is_dir() {
                        std::fs::remove_dir_all(&path)
                    } else {
                        std::fs::remove_file(&path)
                    };
                    if let Err(e) = gone {
                        return Err(io(format!("cannot remove {}", path.display()))(e));
                    }
                }
                report.scratch.push(Gone {
                    what: path.display().to_string(),
                    bytes,
                    why: "scratch older than the grace period".into(),
                });
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Defaults;
    use crate::{Snapshot, Template};

    fn record(name: &str, digest: &str, layers: &[String], team: Option<&str>) -> Template {
        Template {
            name: name.into(),
            digest: digest.into(),
            defaults: Defaults::default(),
            created_at_ms: 1,
            source: "test".into(),
            layers: layers.to_vec(),
            snapshot: team.map(|t| Snapshot {
                team: t.into(),
                name: None,
                source_sandbox: "s".into(),
                node_id: "n".into(),
                paused: None,
                public: false,
            }),
            images: Vec::new(),
        }
    }

    fn blob(store: &Store, scratch: &Path, content: &str) -> String {
        let tar = scratch.join(format!("{content}.tar"));
        crate::store::tar_of(&tar, &[("f", content)]);
        store.add_blob(&tar).unwrap()
    }

    #[test]
    fn unnamed_unleased_old_layers_and_gone_teams_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let root = blob(&store, scratch.path(), "root");
        let kept_layer = blob(&store, scratch.path(), "kept");
        let gone_team_layer = blob(&store, scratch.path(), "gone-team");
        let orphan = blob(&store, scratch.path(), "orphan");
        let leased = blob(&store, scratch.path(), "leased");
        store.put(&record("base", &root, &[], None)).unwrap();
        store
            .put(&record(
                "snap-a",
                &root,
                std::slice::from_ref(&kept_layer),
                Some("alive"),
            ))
            .unwrap();
        store
            .put(&record(
                "snap-b",
                &root,
                std::slice::from_ref(&gone_team_layer),
                Some("gone"),
            ))
            .unwrap();
        std::fs::create_dir_all(dir.path().join("tmp/unpack-1")).unwrap();
        let lease = store.lease(&leased).unwrap();
        assert!(store.leased(&leased));

        // Within the grace period nothing unnamed goes; no team list, no
        // record goes.
        let fresh = GcOptions {
            grace: Duration::from_secs(3600),
            keep_teams: None,
            dry_run: false,
        };
        let r = store.gc(&fresh).unwrap();
        assert!(r.records.is_empty() && r.layers.is_empty() && r.scratch.is_empty());
        assert_eq!(r.kept.len(), 2, "{r:?}");

        // Dry: says what would go, changes nothing.
        let all = GcOptions {
            grace: Duration::ZERO,
            keep_teams: Some(["alive".to_string()].into()),
            dry_run: true,
        };
        let dry = store.gc(&all).unwrap();
        assert_eq!(dry.records.len(), 1);
        let mut would: Vec<&str> = dry.layers.iter().map(|g| g.what.as_str()).collect();
        would.sort();
        let mut want = vec![gone_team_layer.as_str(), orphan.as_str()];
        want.sort();
        assert_eq!(would, want);
        assert!(dry.kept.iter().any(|g| g.what == leased));
        assert_eq!(dry.scratch.len(), 1);
        assert!(store.get("snap-b").is_ok() && store.rootfs(&orphan).is_ok());

        let done = store
            .gc(&GcOptions {
                dry_run: false,
                ..all.clone()
            })
            .unwrap();
        assert_eq!(done.layers.len(), 2);
        assert!(done.bytes() > 0);
        assert!(store.get("snap-b").is_err());
        assert!(store.get("snap-a").is_ok() && store.get("base").is_ok());
        assert!(store.rootfs(&kept_layer).is_ok() && store.rootfs(&root).is_ok());
        assert!(store.blob_size(&orphan).is_none());
        assert!(!dir.path().join("rootfs").join(&orphan[7..]).exists());
        // The leased one stays while leased, goes once released.
        assert!(store.rootfs(&leased).is_ok());
        drop(lease);
        let after = store.gc(&all.clone()).unwrap();
        assert!(after.kept.iter().all(|g| g.what != leased));
        store
            .gc(&GcOptions {
                dry_run: false,
                ..all
            })
            .unwrap();
        assert!(store.blob_size(&leased).is_none());
        let u = store.usage().unwrap();
        assert_eq!((u.records, u.blobs, u.trees), (2, 2, 2));
    }
}
