//! A host's cache of layers: the root filesystems and snapshot layers its
//! sandboxes stack, fetched from the blob store on first use and unpacked
//! once, bounded in bytes, shared by every node on the host.
//!
//! The cache is a [`Store`] directory of its own (`blobs/`, `rootfs/`,
//! `tmp/`, with the store's modes) plus `locks/<hex>`, one lock file per
//! digest. What it promises:
//!
//! - **One download per digest**, however many creates wait, across the
//!   node's tasks (an in-process lock per digest) and across the nodes of
//!   the host (an exclusive `flock` on the digest's lock file while it is
//!   fetched and unpacked). A waiter that gets the lock after the download
//!   finds the tree complete and uses it.
//! - **Verified**: a fetched blob is hashed again before it is unpacked
//!   ([`Store`] refuses one whose SHA-256 is not its name), and nothing is
//!   unpacked from a partial download: the source writes a temporary file
//!   and only a complete, verified one is moved into `blobs/`.
//! - **Never evicting what is used.** A sandbox that stacks a layer holds a
//!   [`Lease`] on it: a shared `flock` on its lock file, held while the
//!   sandbox runs or is paused, released with the lease (or with the
//!   process, however it dies). Eviction takes the exclusive lock without
//!   waiting and skips every layer it cannot get, so it never removes a
//!   layer any node of the host is using.
//! - **Bounded** (`max_bytes`, the node's `--cache-max-bytes`): after a
//!   fetch, and whenever [`Cache::evict`] is called, unused layers are
//!   removed least recently used first until the cache fits. Layers in use
//!   are never removed, so while every cached layer is in use the cache may
//!   stay above its bound (and says so in [`Eviction`]).
//!
//! Sizes are the blobs' sizes (a tarball is as large as what it unpacks
//! to, within tar's headers), kept in `rootfs/<hex>/.warren-size`; the last
//! use is the modification time of `rootfs/<hex>/.warren-used`.

use crate::{io, Store, TemplateError};
use futures_util::future::BoxFuture;
use nix::fcntl::{Flock, FlockArg};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// Where the cache fetches a blob it lacks (the blob store).
pub trait Source: Send + Sync + 'static {
    /// Writes blob `digest` (`sha256-<hex>`) to `dest`, complete or not at
    /// all; returns its size. The error says what failed, naming the store.
    fn fetch<'a>(&'a self, digest: &'a str, dest: &'a Path) -> BoxFuture<'a, Result<u64, String>>;
}

/// The blob store is the cache's source: a template layer's digest is its
/// tarball's SHA-256, the blob's name. The store verifies what it fetches
/// (a corrupt object is refused, nothing is left at `dest`).
impl Source for warren_blob::BlobStore {
    fn fetch<'a>(&'a self, digest: &'a str, dest: &'a Path) -> BoxFuture<'a, Result<u64, String>> {
        Box::pin(async move {
            let digest: warren_blob::Digest = digest.parse().map_err(|e| format!("{e}"))?;
            warren_blob::BlobStore::fetch(self, &digest, dest)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Why a layer is not available.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{0}")]
    Template(#[from] TemplateError),
    /// Not cached, and the cache has no source (or the source failed).
    #[error("layer {digest} is not on this host and cannot be fetched: {why}")]
    Unavailable { digest: String, why: String },
}

/// A layer in use: its unpacked tree, kept from eviction until dropped.
#[derive(Debug, Clone)]
pub struct Lease {
    path: PathBuf,
    _lock: Arc<Flock<File>>,
}

impl Lease {
    /// The unpacked tree.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A lease on the tree at `path` held by `lock` (a shared `flock`).
    pub(crate) fn new(path: PathBuf, lock: Flock<File>) -> Lease {
        Lease {
            path,
            _lock: Arc::new(lock),
        }
    }
}

/// What an eviction pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Eviction {
    /// Digests removed, least recently used first.
    pub removed: Vec<String>,
    /// Bytes the cache holds after the pass.
    pub bytes: u64,
    /// Bytes of it that are in use (leased by some node of the host).
    pub in_use: u64,
}

/// See the module doc.
pub struct Cache {
    store: Store,
    source: Option<Arc<dyn Source>>,
    max_bytes: u64,
    /// One lock per digest for this process's fetches (the flock orders
    /// processes; this orders tasks, which must not block a worker thread
    /// on a flock another task of this process holds).
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Cache {
    /// The cache in `dir` (created if missing), fetching from `source`,
    /// bounded to `max_bytes`.
    pub fn open(
        dir: &Path,
        max_bytes: u64,
        source: Option<Arc<dyn Source>>,
    ) -> Result<Cache, TemplateError> {
        let store = Store::open(dir)?;
        warren_core::private::dir(&dir.join("locks"))
            .map_err(io(format!("cannot create {}", dir.join("locks").display())))?;
        Ok(Cache {
            store,
            source,
            max_bytes,
            fetching: Mutex::new(HashMap::new()),
        })
    }

    /// The store the cache keeps its layers in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The bound, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Layer `digest`, fetched and unpacked if this host lacks it, leased
    /// for as long as the returned [`Lease`] lives.
    pub async fn acquire(&self, digest: &str) -> Result<Lease, CacheError> {
        // flock cannot turn the fetch's exclusive lock into the lease's
        // shared one atomically: another node's eviction may take the layer
        // in between (only when it is the least recently used unleased one
        // of a full cache). Then fetch again, a bounded number of times.
        for _ in 0..3 {
            if let Some(lease) = self.acquire_once(digest).await? {
                return Ok(lease);
            }
        }
        Err(CacheError::Unavailable {
            digest: digest.to_string(),
            why: "it was evicted as soon as it was fetched, three times: the cache \
                  (--cache-max-bytes) is too small for what this host's sandboxes use"
                .into(),
        })
    }

    async fn acquire_once(&self, digest: &str) -> Result<Option<Lease>, CacheError> {
        let root = self.store.rootfs_path(digest)?;
        if let Some(lease) = self.lease_if_complete(digest, &root).await? {
            return Ok(Some(lease));
        }
        let task_lock = {
            let mut map = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(digest.to_string()).or_default().clone()
        };
        let task = task_lock.lock().await;
        // Another task of this node fetched it while this one waited. (Its
        // lease holds the shared lock: taking the exclusive one now would
        // wait for that lease to end.)
        if let Some(lease) = self.lease_if_complete(digest, &root).await? {
            drop(task);
            drop(task_lock);
            self.forget_task_lock(digest);
            return Ok(Some(lease));
        }
        // Another node of the host may be fetching: wait for its exclusive
        // lock (off the async workers), then look again.
        let lock_path = self.lock_path(digest)?;
        let exclusive = blocking(move || {
            let file = open_lock(&lock_path)?;
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, e)| io("cannot lock a cached layer")(e.into()))
        })
        .await?;
        let result = async {
            if !complete(&root) {
                self.fill(digest).await?;
            }
            touch_used(&root);
            Ok::<(), CacheError>(())
        }
        .await;
        // Downgrade to shared: the lease starts before anyone may evict.
        let lease = blocking(move || {
            let file = exclusive
                .unlock()
                .map_err(|(_, e)| io("cannot unlock a cached layer")(e.into()))?;
            Flock::lock(file, FlockArg::LockShared)
                .map_err(|(_, e)| io("cannot lock a cached layer")(e.into()))
        })
        .await?;
        drop(task);
        drop(task_lock);
        self.forget_task_lock(digest);
        result?;
        if !complete(&root) {
            return Ok(None);
        }
        let lease = Lease {
            path: root,
            _lock: Arc::new(lease),
        };
        // Make room for what just came in; what is leased stays.
        let _ = self.evict();
        Ok(Some(lease))
    }

    /// Keeps the tarball at `tar` (moved away), a layer this host made
    /// and put into the blob store as `digest`, so that its first use
    /// unpacks it rather than fetching it back. Only for a digest nobody
    /// can be fetching yet (a new layer's).
    pub fn insert(&self, tar: &Path, digest: &str) -> Result<(), TemplateError> {
        // Validates the digest (the blob's name is made from it).
        self.store.rootfs_path(digest)?;
        let blob = self.store.blob_path(digest);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(tar, std::fs::Permissions::from_mode(0o600))
            .map_err(io(format!("cannot make {} private", tar.display())))?;
        std::fs::rename(tar, &blob).map_err(io(format!("cannot store {}", blob.display())))
    }

    /// Whether `digest` is unpacked here now.
    pub fn has(&self, digest: &str) -> bool {
        self.store
            .rootfs_path(digest)
            .map(|r| complete(&r))
            .unwrap_or(false)
    }

    /// Every digest unpacked here (what a node tells the scheduler it holds).
    /// Most recently used first; then the layers this host made and keeps
    /// as blobs until their first use ([`Cache::insert`]).
    pub fn cached(&self) -> Vec<String> {
        let mut entries = self.entries();
        entries.sort_by_key(|e| std::cmp::Reverse(e.used));
        let mut out: Vec<String> = entries.into_iter().map(|e| e.digest).collect();
        if let Ok(blobs) = std::fs::read_dir(self.store.path().join("blobs")) {
            for f in blobs.flatten() {
                let name = f.file_name();
                let Some(digest) = name.to_str().and_then(|n| n.strip_suffix(".tar")) else {
                    continue;
                };
                if self.store.rootfs_path(digest).is_ok() && !out.iter().any(|d| d == digest) {
                    out.push(digest.to_string());
                }
            }
        }
        out
    }

    /// Removes unused layers, least recently used first, until the cache
    /// holds at most its bound (see the module doc). Blocking, and short:
    /// it stats the entries and removes trees.
    pub fn evict(&self) -> Result<Eviction, TemplateError> {
        let mut entries = self.entries();
        entries.sort_by_key(|e| e.used);
        let mut bytes: u64 = entries.iter().map(|e| e.bytes).sum();
        let mut out = Eviction::default();
        for e in &entries {
            if bytes <= self.max_bytes {
                break;
            }
            let Ok(lock_path) = self.lock_path(&e.digest) else {
                continue;
            };
            let Ok(file) = open_lock(&lock_path) else {
                continue;
            };
            // In use by some node of this host (or being fetched): skip.
            let Ok(held) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                continue;
            };
            self.store.remove_tree(&e.digest)?;
            drop(held);
            bytes = bytes.saturating_sub(e.bytes);
            out.removed.push(e.digest.clone());
        }
        out.bytes = bytes;
        out.in_use = self
            .entries()
            .iter()
            .filter(|e| self.in_use(&e.digest))
            .map(|e| e.bytes)
            .sum();
        Ok(out)
    }

    /// Whether some node of the host holds a lease on `digest`.
    fn in_use(&self, digest: &str) -> bool {
        let Ok(path) = self.lock_path(digest) else {
            return false;
        };
        let Ok(file) = open_lock(&path) else {
            return false;
        };
        Flock::lock(file, FlockArg::LockExclusiveNonblock).is_err()
    }

    async fn lease_if_complete(
        &self,
        digest: &str,
        root: &Path,
    ) -> Result<Option<Lease>, CacheError> {
        if !complete(root) {
            return Ok(None);
        }
        let lock_path = self.lock_path(digest)?;
        let shared = blocking(move || {
            let file = open_lock(&lock_path)?;
            Flock::lock(file, FlockArg::LockShared)
                .map_err(|(_, e)| io("cannot lock a cached layer")(e.into()))
        })
        .await?;
        // Evicted between the look and the lock: fetch it again.
        if !complete(root) {
            return Ok(None);
        }
        touch_used(root);
        Ok(Some(Lease {
            path: root.to_path_buf(),
            _lock: Arc::new(shared),
        }))
    }

    /// Fetches (when the blob is not here) and unpacks `digest`, under the
    /// exclusive lock.
    async fn fill(&self, digest: &str) -> Result<(), CacheError> {
        let blob = self.store.blob_path(digest);
        if !blob.exists() {
            let source = self
                .source
                .as_ref()
                .ok_or_else(|| CacheError::Unavailable {
                    digest: digest.to_string(),
                    why: "this node has no blob store to fetch it from".into(),
                })?;
            let tmp = self.store.scratch("fetch");
            let fetched = source.fetch(digest, &tmp).await;
            if let Err(why) = fetched {
                let _ = std::fs::remove_file(&tmp);
                return Err(CacheError::Unavailable {
                    digest: digest.to_string(),
                    why,
                });
            }
            // Verified before it enters the cache: a blob that is not its
            // digest is never stored, let alone unpacked.
            let store = self.store.clone();
            let want = digest.to_string();
            blocking(move || {
                let actual = crate::store::sha256_file(&tmp).map(|h| format!("sha256-{h}"));
                let added = match actual {
                    Ok(a) if a == want => store.add_blob(&tmp).map(|_| ()),
                    Ok(actual) => Err(TemplateError::Corrupt { name: want, actual }),
                    Err(e) => Err(e),
                };
                let _ = std::fs::remove_file(&tmp);
                added
            })
            .await?;
        } else {
            let store = self.store.clone();
            let d = digest.to_string();
            blocking(move || store.rootfs(&d).map(|_| ())).await?;
        }
        let root = self.store.rootfs_path(digest)?;
        let size = std::fs::metadata(&blob).map(|m| m.len()).unwrap_or(0);
        std::fs::write(root.join(SIZE), size.to_string())
            .map_err(io(format!("cannot write {}", root.join(SIZE).display())))?;
        // The unpacked tree is what is used; the blob store keeps the blob.
        if self.source.is_some() {
            let _ = std::fs::remove_file(&blob);
        }
        Ok(())
    }

    fn forget_task_lock(&self, digest: &str) {
        let mut map = self.fetching.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(digest).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(digest);
        }
    }

    fn lock_path(&self, digest: &str) -> Result<PathBuf, TemplateError> {
        let root = self.store.rootfs_path(digest)?;
        let hex = root.file_name().map(|n| n.to_owned()).unwrap_or_default();
        Ok(self.store.path().join("locks").join(hex))
    }

    fn entries(&self) -> Vec<Entry> {
        let dir = self.store.path().join("rootfs");
        let Ok(read) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        read.flatten()
            .filter(|e| complete(&e.path()))
            .filter_map(|e| {
                let hex = e.file_name().to_str()?.to_string();
                let root = e.path();
                let bytes = std::fs::read_to_string(root.join(SIZE))
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                let used = std::fs::metadata(root.join(USED))
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                Some(Entry {
                    digest: format!("sha256-{hex}"),
                    bytes,
                    used,
                })
            })
            .collect()
    }
}

struct Entry {
    digest: String,
    bytes: u64,
    used: SystemTime,
}

/// The unpacked tree's size (the blob's), and its last use.
const SIZE: &str = ".warren-size";
const USED: &str = ".warren-used";

fn complete(root: &Path) -> bool {
    root.join(".warren-complete").exists()
}

fn touch_used(root: &Path) {
    let path = root.join(USED);
    if let Ok(f) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
    {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn open_lock(path: &Path) -> Result<File, TemplateError> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io(format!("cannot open {}", path.display())))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TemplateError> + Send + 'static,
) -> Result<T, TemplateError> {
    // warren_core::blocking: the simulation runs it inline (one seed, one run).
    warren_core::blocking::run(f)
        .await
        .map_err(|e| TemplateError::Invalid(format!("a cache task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A source serving the tarballs in a directory, counting fetches.
    struct Dir {
        dir: PathBuf,
        fetches: AtomicUsize,
        /// Bytes to write instead of the blob (a corrupt store).
        corrupt: bool,
    }

    impl Source for Dir {
        fn fetch<'a>(
            &'a self,
            digest: &'a str,
            dest: &'a Path,
        ) -> BoxFuture<'a, Result<u64, String>> {
            Box::pin(async move {
                self.fetches.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                let src = self.dir.join(format!("{digest}.tar"));
                if self.corrupt {
                    std::fs::write(dest, b"not the blob").map_err(|e| e.to_string())?;
                    return Ok(12);
                }
                std::fs::copy(&src, dest).map_err(|e| format!("{}: {e}", src.display()))
            })
        }
    }

    /// A blob of `size` bytes of file content, named by its digest in `dir`.
    fn blob(dir: &Path, name: &str, size: usize) -> String {
        let tar = dir.join(format!("{name}.tmp.tar"));
        crate::store::tar_of(&tar, &[(name, &"x".repeat(size))]);
        let digest = format!("sha256-{}", crate::store::sha256_file(&tar).unwrap());
        std::fs::rename(&tar, dir.join(format!("{digest}.tar"))).unwrap();
        digest
    }

    fn source(dir: &Path, corrupt: bool) -> Arc<Dir> {
        Arc::new(Dir {
            dir: dir.to_path_buf(),
            fetches: AtomicUsize::new(0),
            corrupt,
        })
    }

    /// Through the blob store: a layer put there is fetched, verified and
    /// unpacked once; one corrupted in the store is refused and leaves
    /// nothing behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn layers_come_from_the_blob_store_verified() {
        let (remote, bucket, local) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let blobs =
            warren_blob::BlobStore::open(&bucket.path().display().to_string(), &[]).unwrap();
        let (good, bad) = (
            blob(remote.path(), "a", 1000),
            blob(remote.path(), "b", 2000),
        );
        for d in [&good, &bad] {
            let (put, _) = blobs
                .put_file(&remote.path().join(format!("{d}.tar")))
                .await
                .unwrap();
            assert_eq!(put.as_str(), d.as_str());
        }
        // Flip the second blob's bytes in the bucket, keeping its size.
        let hex = bad.strip_prefix("sha256-").unwrap();
        let object = bucket.path().join("blobs/sha256").join(hex);
        let mut bytes = std::fs::read(&object).unwrap();
        bytes[600] ^= 0xff;
        std::fs::write(&object, bytes).unwrap();

        let cache = Cache::open(local.path(), 1 << 30, Some(Arc::new(blobs))).unwrap();
        let lease = cache.acquire(&good).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(lease.path().join("a"))
                .unwrap()
                .len(),
            1000
        );
        let err = cache.acquire(&bad).await.unwrap_err().to_string();
        assert!(err.contains(&bad) && err.contains("blob store"), "{err}");
        assert!(!cache.has(&bad), "nothing of a corrupt blob is kept");
        assert_eq!(cache.cached(), vec![good.clone()]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_waiters_share_one_download() {
        let (remote, local) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let d = blob(remote.path(), "a", 1000);
        let src = source(remote.path(), false);
        let cache = Arc::new(Cache::open(local.path(), 1 << 30, Some(src.clone())).unwrap());
        let mut waiters = Vec::new();
        for _ in 0..8 {
            let (cache, d) = (cache.clone(), d.clone());
            waiters.push(tokio::spawn(
                async move { cache.acquire(&d).await.unwrap() },
            ));
        }
        for w in waiters {
            let lease = w.await.unwrap();
            assert_eq!(
                std::fs::read_to_string(lease.path().join("a"))
                    .unwrap()
                    .len(),
                1000
            );
        }
        assert_eq!(src.fetches.load(Ordering::SeqCst), 1);
        assert_eq!(cache.cached(), vec![d.clone()]);
        // A second cache on the same directory (another node of the host)
        // uses what is there.
        let other = Cache::open(local.path(), 1 << 30, Some(src.clone())).unwrap();
        other.acquire(&d).await.unwrap();
        assert_eq!(src.fetches.load(Ordering::SeqCst), 1);
    }

    /// A layer this host made is kept without a fetch: reported as cached
    /// at once, unpacked on its first use, never fetched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_layer_made_here_is_used_without_a_fetch() {
        let (remote, made, local) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let src = source(remote.path(), false);
        let cache = Cache::open(local.path(), 1 << 30, Some(src.clone())).unwrap();
        let d = blob(made.path(), "m", 500);
        cache
            .insert(&made.path().join(format!("{d}.tar")), &d)
            .unwrap();
        assert_eq!(cache.cached(), vec![d.clone()]);
        let lease = cache.acquire(&d).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(lease.path().join("m"))
                .unwrap()
                .len(),
            500
        );
        assert_eq!(src.fetches.load(Ordering::SeqCst), 0);
        assert_eq!(cache.cached(), vec![d.clone()]);
        assert!(cache
            .insert(&made.path().join("x.tar"), "sha256-../x")
            .is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_corrupt_download_is_never_unpacked() {
        let (remote, local) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let d = blob(remote.path(), "a", 10);
        let cache = Cache::open(local.path(), 1 << 30, Some(source(remote.path(), true))).unwrap();
        let e = cache.acquire(&d).await.unwrap_err().to_string();
        assert!(e.contains("corrupt"), "{e}");
        assert!(!cache.has(&d));
        assert!(cache.cached().is_empty());
        // Nothing is left in blobs/ or tmp/.
        for sub in ["blobs", "tmp"] {
            assert_eq!(
                std::fs::read_dir(local.path().join(sub)).unwrap().count(),
                0,
                "{sub}"
            );
        }
        // Without a source, a missing layer says so.
        let bare = Cache::open(local.path(), 1 << 30, None).unwrap();
        let e = bare.acquire(&d).await.unwrap_err().to_string();
        assert!(e.contains("no blob store"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn eviction_is_least_recently_used_and_never_takes_a_leased_layer() {
        let (remote, local) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let src = source(remote.path(), false);
        let (a, b, c) = (
            blob(remote.path(), "a", 40_000),
            blob(remote.path(), "b", 40_000),
            blob(remote.path(), "c", 40_000),
        );
        // Room for two.
        let cache = Cache::open(local.path(), 110_000, Some(src.clone())).unwrap();
        let held = cache.acquire(&a).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        drop(cache.acquire(&b).await.unwrap());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        // c comes in: the least recently used unleased one (b) goes; a,
        // older but leased, stays.
        drop(cache.acquire(&c).await.unwrap());
        let mut cached = cache.cached();
        cached.sort();
        let mut want = vec![a.clone(), c.clone()];
        want.sort();
        assert_eq!(cached, want);
        assert!(held.path().join("a").exists());
        // Everything leased and over the bound: nothing goes, and it says so.
        let tight = Cache::open(local.path(), 1, Some(src.clone())).unwrap();
        let held_c = tight.acquire(&c).await.unwrap();
        let ev = tight.evict().unwrap();
        assert!(ev.removed.is_empty(), "{ev:?}");
        assert!(ev.bytes > 1 && ev.in_use == ev.bytes, "{ev:?}");
        // Leases gone: all of it can go.
        drop((held, held_c));
        let ev = tight.evict().unwrap();
        assert_eq!(ev.removed.len(), 2, "{ev:?}");
        assert!(tight.cached().is_empty());
        // And comes back on the next use, fetched again.
        let before = src.fetches.load(Ordering::SeqCst);
        tight.acquire(&a).await.unwrap();
        assert_eq!(src.fetches.load(Ordering::SeqCst), before + 1);
    }
}
