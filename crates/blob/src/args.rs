//! `--blob-store URL` and `--blob-store-option KEY=VALUE`: one set of
//! flags for every part that keeps blobs (flattened into the gateway's and
//! the node's configuration; docs/blobs.md).

use crate::{BlobError, BlobStore};

/// See the module doc.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BlobStoreArgs {
    /// The blob store template and snapshot layers live in: a directory,
    /// `s3://bucket[/prefix]`, `gs://bucket[/prefix]` or
    /// `az://container[/prefix]` (docs/blobs.md). Give every gateway and
    /// node the same. Set, layers are blobs there (nodes fetch what they
    /// lack into their caches) and records are the scheduler's; unset,
    /// both are files in the shared `--template-dir`.
    #[arg(long, env = "WARREN_BLOB_STORE")]
    pub blob_store: Option<String>,
    /// A blob store option (`endpoint=...`, `region=...`,
    /// `allow_http=true`, ...; comma-separated in the environment).
    /// Credentials come from the environment or the cloud's files, never
    /// from here.
    #[arg(
        long = "blob-store-option",
        value_name = "KEY=VALUE",
        env = "WARREN_BLOB_STORE_OPTIONS",
        value_delimiter = ','
    )]
    pub blob_store_options: Vec<String>,
}

/// A validated `--blob-store` and its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobStoreSettings {
    pub url: String,
    pub options: Vec<(String, String)>,
}

impl BlobStoreArgs {
    /// The settings, `None` without `--blob-store`; the error names the
    /// flag (an option without a store, one that is not `KEY=VALUE` or
    /// holds a secret, a URL or option the store refuses).
    pub fn settings(&self) -> Result<Option<BlobStoreSettings>, String> {
        let Some(url) = &self.blob_store else {
            if !self.blob_store_options.is_empty() {
                return Err("--blob-store-option needs --blob-store".into());
            }
            return Ok(None);
        };
        let options = crate::parse_options(&self.blob_store_options, "--blob-store-option")?;
        let s = BlobStoreSettings {
            url: url.clone(),
            options,
        };
        // Checked now: a bad URL or option fails the start, not a create.
        s.open().map_err(|e| format!("--blob-store: {e}"))?;
        Ok(Some(s))
    }
}

impl BlobStoreSettings {
    /// The store (opened, not contacted).
    pub fn open(&self) -> Result<BlobStore, BlobError> {
        BlobStore::open(&self.url, &self.options)
    }
}
