//! The node's volume store (`--volume-dir`; docs/sandboxes.md, "Volumes"):
//! where E2B's persistent volumes live on this node, how a gateway's
//! content calls reach them ([`http`], confined by [`fs`]), and what a
//! sandbox that mounts one is given.
//!
//! Two kinds, one per node:
//! - **local** (the default): each volume an ext4 filesystem in a sparse
//!   image `images/<id>.img` of the volume's size limit, loop-mounted
//!   `nosuid,nodev` at `mnt/<id>` in the node's private mount namespace
//!   when first used; its content is `mnt/<id>/data`. The limit is the
//!   image's size, so a write past it fails with `ENOSPC` in a sandbox and
//!   `507` on the content API, with no quota support needed from the host.
//!   Only this node reads it: the scheduler places every sandbox that
//!   mounts it here.
//! - **shared** (`--volume-shared`): the directory is an operator's shared
//!   POSIX mount (NFS, CephFS, ...) that every node declaring it mounts at
//!   the same path; each volume is a directory `<id>` there, and any such
//!   node serves any volume. No size limit of warren's (the shared
//!   filesystem's own quotas apply).
//!
//! The store's directory is made `0700` root: volume files are owned by
//! the ids sandboxes see (`1000` is `user`), which are real accounts on a
//! host, so no host account may reach them. A sandbox gets a volume as an
//! idmapped bind (`runtime::isolated`): the same files show the same ids
//! in every sandbox, whatever host id range each runs under.

pub mod fs;
pub mod http;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use warren_core::node_api::volumes::VolumeInfo;

pub use crate::config::VolumeSettings;

/// Why a volume could not be had.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// This node's store does not hold it (a stale route, or a volume of
    /// another node): the gateway's stale-route signal.
    #[error("volume {id} is not in node {node}'s volume store")]
    NotHeld { id: String, node: String },
    #[error("{0}")]
    BadRequest(String),
    /// The store cannot make or reach it (its filesystem, `mkfs.ext4`).
    #[error("{0}")]
    Store(String),
}

/// See the module doc.
pub struct VolumeStore {
    settings: VolumeSettings,
    node_id: String,
    /// One lock per volume id: a make, a mount and a removal of one volume
    /// never interleave.
    locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Local volumes mounted in the node's mount namespace now (they stay
    /// mounted until removed, or the node stops).
    mounted: Mutex<std::collections::HashSet<String>>,
}

impl VolumeStore {
    /// Opens (makes) the store's directory, root-only. An error says why
    /// this node cannot hold volumes; the node then runs without.
    pub fn open(settings: VolumeSettings, node_id: &str) -> Result<VolumeStore, String> {
        use std::os::unix::fs::PermissionsExt;
        let dir = &settings.dir;
        if !nix::unistd::geteuid().is_root() {
            return Err("volumes need the node to run as root (it mounts each volume)".into());
        }
        if settings.shared {
            if !dir.is_dir() {
                return Err(format!(
                    "--volume-dir {} is not a directory: mount the shared filesystem there \
                     first (--volume-shared)",
                    dir.display()
                ));
            }
        } else {
            for tool in ["mkfs.ext4", "mount"] {
                crate::runtime::limits::find_program(tool)
                    .ok_or(format!("{tool} is not installed"))?;
            }
            std::fs::create_dir_all(dir.join("images"))
                .and_then(|()| std::fs::create_dir_all(dir.join("mnt")))
                .map_err(|e| format!("cannot make --volume-dir {}: {e}", dir.display()))?;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make --volume-dir {} root-only: {e}", dir.display()))?;
        Ok(VolumeStore {
            settings,
            node_id: node_id.to_string(),
            locks: Mutex::new(HashMap::new()),
            mounted: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// `"local"` or `"shared"`, as the node registers it.
    pub fn kind(&self) -> &'static str {
        if self.settings.shared {
            "shared"
        } else {
            "local"
        }
    }

    /// Each new volume's size limit (0: none).
    pub fn max_bytes(&self) -> u64 {
        self.settings.max_bytes
    }

    pub fn shared(&self) -> bool {
        self.settings.shared
    }

    fn lock(&self, id: &str) -> Arc<Mutex<()>> {
        let mut l = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        l.entry(id.to_string()).or_default().clone()
    }

    fn image(&self, id: &str) -> PathBuf {
        self.settings.dir.join("images").join(format!("{id}.img"))
    }

    fn mount_dir(&self, id: &str) -> PathBuf {
        self.settings.dir.join("mnt").join(id)
    }

    /// Where the volume's content is in the node's mount namespace.
    fn data(&self, id: &str) -> PathBuf {
        if self.settings.shared {
            self.settings.dir.join(id)
        } else {
            self.mount_dir(id).join("data")
        }
    }

    fn not_held(&self, id: &str) -> VolumeError {
        VolumeError::NotHeld {
            id: id.to_string(),
            node: self.node_id.clone(),
        }
    }

    fn check_id(id: &str) -> Result<(), VolumeError> {
        warren_core::volume::validate_id(id).map_err(VolumeError::BadRequest)
    }

    /// Makes volume `id` if it is not here, limited to `max_bytes` (capped
    /// at this node's `--volume-max-bytes`; a local volume needs one).
    /// Blocking.
    pub fn ensure(&self, id: &str, max_bytes: u64) -> Result<VolumeInfo, VolumeError> {
        Self::check_id(id)?;
        let lock = self.lock(id);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.settings.shared {
            let dir = self.data(id);
            if !dir.exists() {
                make_data_dir(&dir).map_err(|e| {
                    VolumeError::Store(format!("cannot make volume {id}'s directory: {e}"))
                })?;
            }
            return Ok(VolumeInfo {
                volume_id: id.to_string(),
                max_bytes: 0,
                used_bytes: 0,
            });
        }
        let limit = match (max_bytes, self.settings.max_bytes) {
            (0, cap) => cap,
            (asked, cap) => asked.min(cap),
        };
        let image = self.image(id);
        if !image.exists() {
            make_image(&image, limit)
                .map_err(|e| VolumeError::Store(format!("cannot make volume {id}: {e}")))?;
            tracing::info!(volume = id, limit, "volume image made");
        }
        self.mount_locked(id)?;
        Ok(self.info_locked(id))
    }

    /// Mounts a local volume's image (if not mounted yet). Caller holds
    /// the volume's lock.
    fn mount_locked(&self, id: &str) -> Result<(), VolumeError> {
        let mut mounted = self.mounted.lock().unwrap_or_else(|p| p.into_inner());
        if mounted.contains(id) {
            return Ok(());
        }
        let image = self.image(id);
        if !image.is_file() {
            return Err(self.not_held(id));
        }
        let at = self.mount_dir(id);
        if !crate::runtime::disk::is_mounted(&at) {
            crate::runtime::disk::mount(&image, &at)
                .map_err(|e| VolumeError::Store(format!("cannot mount volume {id}: {e}")))?;
        }
        mounted.insert(id.to_string());
        Ok(())
    }

    fn info_locked(&self, id: &str) -> VolumeInfo {
        let (used, total) = std::fs::File::open(self.data(id))
            .ok()
            .map(OwnedFd::from)
            .and_then(|fd| fs::usage(&fd))
            .unwrap_or((0, 0));
        VolumeInfo {
            volume_id: id.to_string(),
            max_bytes: if self.settings.shared {
                0
            } else {
                std::fs::metadata(self.image(id)).map_or(total, |m| m.len())
            },
            used_bytes: used,
        }
    }

    /// The size limit of local volume `id` (its image's size); 0 when
    /// shared or unknown.
    pub fn limit(&self, id: &str) -> u64 {
        if self.settings.shared {
            return 0;
        }
        std::fs::metadata(self.image(id)).map_or(0, |m| m.len())
    }

    /// A descriptor of volume `id`'s root directory, for content calls
    /// ([`fs`]), mounting a local volume first. [`VolumeError::NotHeld`]
    /// when this store has no such volume. Blocking.
    pub fn root(&self, id: &str) -> Result<OwnedFd, VolumeError> {
        Self::check_id(id)?;
        let lock = self.lock(id);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        if !self.settings.shared {
            self.mount_locked(id)?;
        }
        let data = self.data(id);
        match rustix::fs::open(
            &data,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => Ok(fd),
            Err(rustix::io::Errno::NOENT) => Err(self.not_held(id)),
            Err(e) => Err(VolumeError::Store(format!("cannot open volume {id}: {e}"))),
        }
    }

    /// Where volume `id`'s content is, for binding it into a sandbox
    /// (mounted first). Blocking.
    pub fn mount_source(&self, id: &str) -> Result<PathBuf, VolumeError> {
        drop(self.root(id)?);
        Ok(self.data(id))
    }

    /// Removes volume `id` and everything in it (nothing when it is not
    /// here). Blocking.
    pub fn remove(&self, id: &str) -> Result<(), VolumeError> {
        Self::check_id(id)?;
        let lock = self.lock(id);
        let _held = lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.settings.shared {
            let dir = rustix::fs::open(
                &self.settings.dir,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| VolumeError::Store(format!("cannot open the volume store: {e}")))?;
            return fs::remove_tree(&dir, id)
                .map_err(|e| VolumeError::Store(format!("cannot remove volume {id}: {e}")));
        }
        let at = self.mount_dir(id);
        self.mounted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        crate::runtime::disk::unmount(&at)
            .map_err(|e| VolumeError::Store(format!("cannot unmount volume {id}: {e}")))?;
        let _ = std::fs::remove_dir(&at);
        match std::fs::remove_file(self.image(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(VolumeError::Store(format!(
                "cannot remove volume {id}'s image: {e}"
            ))),
            _ => {
                tracing::info!(volume = id, "volume removed");
                Ok(())
            }
        }
    }
}

/// Makes a volume's top directory: `user`'s (`1000`), `0755`.
fn make_data_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir(dir)?;
    std::os::unix::fs::chown(dir, Some(fs::DEFAULT_ID), Some(fs::DEFAULT_ID))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// Makes a volume's image: a sparse file of `bytes`, an ext4 filesystem
/// in it holding the empty `data/`, made under a temporary name and
/// renamed into place, so a crash never leaves half an image.
fn make_image(image: &Path, bytes: u64) -> std::io::Result<()> {
    let tmp = image.with_extension("img.tmp");
    let stage = image.with_extension("stage");
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir(&stage)?;
    let made = (|| {
        make_data_dir(&stage.join("data"))?;
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&tmp)?;
        file.set_len(bytes)?;
        drop(file);
        let out = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-E"])
            .arg("lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0")
            .arg("-d")
            .arg(&stage)
            .arg(&tmp)
            .env_clear()
            .env("PATH", crate::runtime::SANDBOX_PATH)
            .stdin(std::process::Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "mkfs.ext4 failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        std::fs::rename(&tmp, image)
    })();
    let _ = std::fs::remove_dir_all(&stage);
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made
}

/// The volumes a sandbox mounts, resolved to where each is in the node's
/// mount namespace: `(path inside the sandbox, source)`.
pub fn sources(
    store: Option<&VolumeStore>,
    mounts: &[warren_core::node_api::volumes::VolumeMount],
) -> Result<Vec<(String, PathBuf)>, VolumeError> {
    if mounts.is_empty() {
        return Ok(Vec::new());
    }
    let store = store.ok_or_else(|| {
        VolumeError::Store("this node has no volume store (see its start log)".into())
    })?;
    mounts
        .iter()
        .map(|m| {
            if m.shared != store.shared() {
                return Err(VolumeError::Store(format!(
                    "volume {} is in {} store, and this node's is {}",
                    m.volume_id,
                    if m.shared {
                        "the shared"
                    } else {
                        "a node's local"
                    },
                    store.kind()
                )));
            }
            Ok((m.path.clone(), store.mount_source(&m.volume_id)?))
        })
        .collect()
}
