//! Where an isolated sandbox's root and layers come from (docs/blobs.md).
//!
//! - [`Layers::Shared`]: the template store at `--template-dir`, shared
//!   with the machine's gateways (a one-machine install, `warren dev`):
//!   roots are read in place; a snapshot's layer is added there and its
//!   record written there.
//! - [`Layers::Fetched`]: a blob store (`--blob-store`) and this host's
//!   cache of it (`--cache-dir`, [`warren_template::cache`]). A layer the
//!   host lacks is fetched on the first create that needs it (one download
//!   however many wait), verified and unpacked once; each sandbox holds a
//!   lease on every tree it stacks, so none is evicted under it. The node
//!   keeps no records: each create's gateway hands it the template's
//!   record, and a snapshot's record goes back to the gateway, which keeps
//!   it in the scheduler's store. A snapshot's layer goes into the blob
//!   store, then into the cache (so this node stacks it without fetching
//!   it back). Nothing here reads another part's disk.

use super::RuntimeError;
use crate::config::BlobSettings;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use warren_template::cache::{Cache, CacheError, Lease};
use warren_template::Store;

/// See the module doc.
pub enum Layers {
    Shared(Store),
    Fetched(Fetched),
}

/// A blob store and this host's cache of it.
pub struct Fetched {
    cache: Cache,
    blobs: Arc<warren_blob::BlobStore>,
}

impl Layers {
    /// The shared template store at `template_dir`, or, with `blob`, the
    /// blob store and its cache (opened, not contacted: a store that is
    /// down fails the creates that need a fetch, not the node's start).
    pub fn open(template_dir: &Path, blob: Option<&BlobSettings>) -> Result<Layers, String> {
        let Some(b) = blob else {
            return Store::open(template_dir)
                .map(Layers::Shared)
                .map_err(|e| format!("--template-dir: {e}"));
        };
        let blobs = Arc::new(b.store.open().map_err(|e| format!("--blob-store: {e}"))?);
        let source: Arc<dyn warren_template::cache::Source> = blobs.clone();
        let cache = Cache::open(&b.cache_dir, b.cache_max_bytes, Some(source))
            .map_err(|e| format!("--cache-dir {}: {e}", b.cache_dir.display()))?;
        Ok(Layers::Fetched(Fetched { cache, blobs }))
    }

    /// The shared template store, when the layers come from one.
    pub fn shared(&self) -> Option<&Store> {
        match self {
            Layers::Shared(s) => Some(s),
            Layers::Fetched(_) => None,
        }
    }

    /// The local store new layers are made in (scratch space on the same
    /// filesystem as the trees).
    fn local(&self) -> &Store {
        match self {
            Layers::Shared(s) => s,
            Layers::Fetched(f) => f.cache.store(),
        }
    }

    /// A scratch directory beside the trees.
    pub fn scratch(&self, what: &str) -> PathBuf {
        self.local().scratch(what)
    }

    /// The unpacked trees of `digests` (bottom first), each fetched first
    /// when the host lacks it, with the leases that keep them from
    /// eviction while the sandbox lives.
    pub async fn roots(
        &self,
        digests: &[String],
    ) -> Result<(Vec<PathBuf>, Vec<Lease>), RuntimeError> {
        match self {
            // Leased too: a collection of the shared store
            // (`warren template gc`) never removes a tree a sandbox of
            // this host stacks.
            Layers::Shared(store) => {
                let (store, digests) = (store.clone(), digests.to_vec());
                let leases = warren_core::blocking::run(move || {
                    digests
                        .iter()
                        .map(|d| store.lease(d))
                        .collect::<Result<Vec<Lease>, _>>()
                })
                .await
                .map_err(|e| RuntimeError::Template(e.to_string()))?
                .map_err(|e| RuntimeError::Template(e.to_string()))?;
                Ok((
                    leases.iter().map(|l| l.path().to_path_buf()).collect(),
                    leases,
                ))
            }
            Layers::Fetched(f) => {
                let mut leases = Vec::with_capacity(digests.len());
                for d in digests {
                    match f.cache.acquire(d).await {
                        Ok(l) => leases.push(l),
                        Err(CacheError::Unavailable { digest, why }) => {
                            return Err(RuntimeError::LayerUnavailable(format!(
                                "layer {digest} is not on this node and cannot be fetched from \
                                 the blob store {}: {why}",
                                f.blobs
                            )))
                        }
                        Err(e) => return Err(RuntimeError::Template(e.to_string())),
                    }
                }
                Ok((
                    leases.iter().map(|l| l.path().to_path_buf()).collect(),
                    leases,
                ))
            }
        }
    }

    /// Keeps the layer tarball at `tar` (a snapshot's or a pause's; moved
    /// away): into the shared store, or into the blob store and this
    /// host's cache. Returns its digest. Blocking: call it off the async
    /// workers (inside `spawn_blocking`, where it may wait on the runtime).
    pub fn add_layer(&self, tar: &Path) -> Result<String, RuntimeError> {
        match self {
            Layers::Shared(store) => store
                .add_blob(tar)
                .map_err(|e| RuntimeError::Template(e.to_string())),
            Layers::Fetched(f) => {
                let rt = tokio::runtime::Handle::try_current().map_err(|e| {
                    RuntimeError::Template(format!("no async runtime to upload the layer: {e}"))
                })?;
                let (digest, _) = rt.block_on(f.blobs.put_file(tar)).map_err(|e| {
                    RuntimeError::LayerUnavailable(format!(
                        "cannot put the layer into the blob store {}: {e}",
                        f.blobs
                    ))
                })?;
                // Into the cache (unpacked on the first use) rather than
                // fetched back; a failure here only costs that fetch.
                if let Err(e) = f.cache.insert(tar, digest.as_str()) {
                    tracing::warn!(layer = %digest, error = %e, "cannot keep a new layer in the cache; it will be fetched when used");
                }
                Ok(digest.as_str().to_string())
            }
        }
    }

    /// The digests unpacked on this host (what the heartbeat reports, so
    /// placement prefers this node for templates it holds); empty for a
    /// shared store, where every node holds everything.
    pub fn cached(&self) -> Vec<String> {
        match self {
            Layers::Shared(_) => Vec::new(),
            Layers::Fetched(f) => f.cache.cached(),
        }
    }

    /// Where they come from, for the start log.
    pub fn describe(&self) -> String {
        match self {
            Layers::Shared(s) => format!("template store {}", s.path().display()),
            Layers::Fetched(f) => format!(
                "blob store {}, cached in {} (at most {} bytes)",
                f.blobs,
                f.cache.store().path().display(),
                f.cache.max_bytes()
            ),
        }
    }
}
