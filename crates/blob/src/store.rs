//! [`BlobStore`]: opening a store from its URL and options.

use crate::redact::{strip_url_credentials, Redactor};
use crate::{BlobError, Digest};
use object_store::path::Path as Key;
use object_store::ObjectStore;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A content-addressed blob store (see the crate doc). Cloning is cheap:
/// clones share one client and its connections.
#[derive(Clone)]
pub struct BlobStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    /// The backend every operation goes to.
    pub(crate) store: Arc<dyn ObjectStore>,
    /// `<prefix>/blobs/sha256`: a blob's key is this and its hex.
    pub(crate) base: Key,
    /// The URL without credentials (and the endpoint, if one was set):
    /// what `Display`, `Debug` and every error call the store.
    pub(crate) name: String,
    /// Removes this store's secrets from messages.
    pub(crate) redactor: Redactor,
    /// A local store's `<dir>/blobs/sha256`, which `local.rs` writes
    /// itself (each blob 0600 from the start).
    pub(crate) local: Option<PathBuf>,
}

/// The forms [`BlobStore::open`] takes, for messages.
const FORMS: &str =
    "/abs/dir, file:///abs/dir, s3://bucket[/prefix], gs://bucket[/prefix] or az://container[/prefix]";

impl BlobStore {
    /// Opens the store at `url` with backend `options` (see the crate doc
    /// for the URL forms, the options and where credentials come from).
    /// A local directory is created if missing and made 0700; a cloud store
    /// is not contacted until the first operation.
    pub fn open(url: &str, options: &[(String, String)]) -> Result<BlobStore, BlobError> {
        let url = url.trim();
        // The AWS shared credentials file's keys join the options (and so
        // the redactor's secrets) when nothing else gives a key.
        #[cfg(feature = "aws")]
        let options = &if url.starts_with("s3://") {
            let mut all = options.to_vec();
            all.extend(crate::aws_files::shared_credentials(options)?);
            all
        } else {
            options.to_vec()
        };
        let redactor = Redactor::new(options);
        if url.starts_with('/') {
            return open_local(Path::new(url), options, redactor);
        }
        let shown = redactor.redact(url);
        let parsed = url::Url::parse(url).map_err(|e| {
            BlobError::Config(format!(
                "{shown:?} is not a blob store URL ({e}); use {FORMS}"
            ))
        })?;
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(BlobError::Config(format!(
                "{shown} carries credentials in the URL; give them as options or in the \
                 environment"
            )));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(BlobError::Config(format!(
                "{shown} has a query or fragment; a blob store URL is one of {FORMS}"
            )));
        }
        let prefix = parsed.path().trim_matches('/');
        let host = parsed.host_str().unwrap_or("");
        match parsed.scheme() {
            "file" => {
                if !host.is_empty() && host != "localhost" {
                    return Err(BlobError::Config(format!(
                        "{shown}: a file:// URL names a local directory (file:///abs/dir)"
                    )));
                }
                let dir = parsed.to_file_path().map_err(|()| {
                    BlobError::Config(format!("{shown} is not an absolute directory"))
                })?;
                open_local(&dir, options, redactor)
            }
            scheme @ ("s3" | "gs" | "az") => {
                if host.is_empty() {
                    return Err(BlobError::Config(format!(
                        "{shown} names no bucket ({scheme}://bucket[/prefix])"
                    )));
                }
                let base = base_key(prefix, &shown)?;
                let cloud = cloud::open(scheme, host, options, &shown, &redactor)?;
                let name = match &cloud.endpoint {
                    Some(e) => format!("{shown} (endpoint {})", strip_url_credentials(e)),
                    None => shown,
                };
                Ok(BlobStore {
                    inner: Arc::new(Inner {
                        store: cloud.store,
                        base,
                        name: redactor.redact(&name),
                        redactor,
                        local: None,
                    }),
                })
            }
            other => Err(BlobError::Config(format!(
                "{shown}: unsupported scheme {other:?}; use {FORMS}"
            ))),
        }
    }

    /// The key of `digest`'s object.
    pub(crate) fn key(&self, digest: &Digest) -> Key {
        self.inner.base.clone().join(digest.hex())
    }

    /// The store's name in messages (its URL without credentials).
    pub(crate) fn name(&self) -> &str {
        &self.inner.name
    }
}

/// `<prefix>/blobs/sha256` as a key.
fn base_key(prefix: &str, shown: &str) -> Result<Key, BlobError> {
    let base = if prefix.is_empty() {
        "blobs/sha256".to_string()
    } else {
        format!("{prefix}/blobs/sha256")
    };
    Key::parse(&base).map_err(|e| BlobError::Config(format!("{shown}: bad prefix: {e}")))
}

fn open_local(
    dir: &Path,
    options: &[(String, String)],
    redactor: Redactor,
) -> Result<BlobStore, BlobError> {
    if let Some((k, _)) = options.first() {
        return Err(BlobError::Config(format!(
            "a local blob store ({}) takes no options; got {k:?}",
            dir.display()
        )));
    }
    if !dir.is_absolute() {
        return Err(BlobError::Config(format!(
            "a local blob store must be an absolute directory, not {}",
            dir.display()
        )));
    }
    let blobs = dir.join("blobs").join("sha256");
    for d in [dir, &dir.join("blobs"), &blobs] {
        warren_core::private::dir(d).map_err(|source| BlobError::Io {
            what: format!("cannot make blob store directory {} (0700)", d.display()),
            source,
        })?;
    }
    let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| BlobError::Config(format!("{}: {e}", dir.display())))?
        .with_fsync(true);
    let name = url::Url::from_directory_path(dir)
        .map(|u| u.to_string().trim_end_matches('/').to_string())
        .unwrap_or_else(|()| dir.display().to_string());
    Ok(BlobStore {
        inner: Arc::new(Inner {
            store: Arc::new(fs),
            base: Key::from("blobs/sha256"),
            name: redactor.redact(&name),
            redactor,
            local: Some(blobs),
        }),
    })
}

impl fmt::Display for BlobStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.inner.name)
    }
}

impl fmt::Debug for BlobStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobStore")
            .field("url", &self.inner.name)
            .finish_non_exhaustive()
    }
}

/// The cloud backends, each behind its feature.
mod cloud {
    use crate::redact::Redactor;
    use crate::BlobError;
    use object_store::ObjectStore;
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    use object_store::{ClientConfigKey, RetryConfig};
    use std::sync::Arc;

    pub(super) struct Cloud {
        pub(super) store: Arc<dyn ObjectStore>,
        /// The endpoint it was pointed at, if not the cloud's own.
        pub(super) endpoint: Option<String>,
    }

    /// object_store's client settings warren sets before the options
    /// (which may override them); see the crate doc.
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    const CLIENT_DEFAULTS: &[(ClientConfigKey, &str)] = &[
        (ClientConfigKey::ConnectTimeout, "5s"),
        (ClientConfigKey::ReadTimeout, "60s"),
        (ClientConfigKey::Timeout, "10m"),
    ];

    /// object_store's own retries off: transient failures are retried by
    /// this crate, with the workspace's backoff.
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    fn no_retries() -> RetryConfig {
        RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        }
    }

    /// The rustls crypto provider the HTTP client uses: the workspace's ring.
    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    fn install_crypto() {
        // Err: a provider is installed already (warren's own, or another
        // part's); that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }

    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    fn unknown_key(shown: &str, key: &str) -> BlobError {
        BlobError::Config(format!(
            "{shown}: unknown option {key:?} (object_store's configuration keys for this \
             backend, e.g. endpoint, region, allow_http)"
        ))
    }

    #[cfg(any(feature = "aws", feature = "gcp", feature = "azure"))]
    fn built(shown: &str, e: object_store::Error, redactor: &Redactor) -> BlobError {
        BlobError::Config(format!("{shown}: {}", redactor.redact(&e.to_string())))
    }

    /// The `scheme` backend for `bucket` (a container, for Azure).
    pub(super) fn open(
        scheme: &str,
        bucket: &str,
        options: &[(String, String)],
        shown: &str,
        redactor: &Redactor,
    ) -> Result<Cloud, BlobError> {
        match scheme {
            #[cfg(feature = "aws")]
            "s3" => s3(bucket, options, shown, redactor),
            #[cfg(feature = "gcp")]
            "gs" => gcs(bucket, options, shown, redactor),
            #[cfg(feature = "azure")]
            "az" => azure(bucket, options, shown, redactor),
            _ => {
                let _ = (bucket, options, redactor);
                let feature = match scheme {
                    "s3" => "aws",
                    "gs" => "gcp",
                    _ => "azure",
                };
                Err(BlobError::Config(format!(
                    "{shown}: this build has no {scheme}:// backend (warren-blob's feature \
                     {feature:?})"
                )))
            }
        }
    }

    #[cfg(feature = "aws")]
    fn s3(
        bucket: &str,
        options: &[(String, String)],
        shown: &str,
        redactor: &Redactor,
    ) -> Result<Cloud, BlobError> {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey as K};
        install_crypto();
        let mut b = AmazonS3Builder::from_env();
        for (k, v) in CLIENT_DEFAULTS {
            b = b.with_config(K::Client(*k), *v);
        }
        for (k, v) in options {
            let key: K = k
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| unknown_key(shown, k))?;
            b = b.with_config(key, v);
        }
        let endpoint = b.get_config_value(&K::Endpoint);
        let allow_http = b
            .get_config_value(&K::Client(ClientConfigKey::AllowHttp))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        if let Some(e) = &endpoint {
            if e.starts_with("http://") && !allow_http {
                return Err(BlobError::Config(format!(
                    "{shown}: endpoint {} is plain HTTP; set allow_http=true to use it",
                    redactor.redact(e)
                )));
            }
        }
        let store = b
            .with_bucket_name(bucket)
            .with_retry(no_retries())
            .build()
            .map_err(|e| built(shown, e, redactor))?;
        Ok(Cloud {
            store: Arc::new(store),
            endpoint,
        })
    }

    #[cfg(feature = "gcp")]
    fn gcs(
        bucket: &str,
        options: &[(String, String)],
        shown: &str,
        redactor: &Redactor,
    ) -> Result<Cloud, BlobError> {
        use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey as K};
        install_crypto();
        let mut b = GoogleCloudStorageBuilder::from_env();
        for (k, v) in CLIENT_DEFAULTS {
            b = b.with_config(K::Client(*k), *v);
        }
        for (k, v) in options {
            let key: K = k
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| unknown_key(shown, k))?;
            b = b.with_config(key, v);
        }
        let endpoint = b.get_config_value(&K::BaseUrl);
        let store = b
            .with_bucket_name(bucket)
            .with_retry(no_retries())
            .build()
            .map_err(|e| built(shown, e, redactor))?;
        Ok(Cloud {
            store: Arc::new(store),
            endpoint,
        })
    }

    #[cfg(feature = "azure")]
    fn azure(
        container: &str,
        options: &[(String, String)],
        shown: &str,
        redactor: &Redactor,
    ) -> Result<Cloud, BlobError> {
        use object_store::azure::{AzureConfigKey as K, MicrosoftAzureBuilder};
        install_crypto();
        let mut b = MicrosoftAzureBuilder::from_env();
        for (k, v) in CLIENT_DEFAULTS {
            b = b.with_config(K::Client(*k), *v);
        }
        for (k, v) in options {
            let key: K = k
                .to_ascii_lowercase()
                .parse()
                .map_err(|_| unknown_key(shown, k))?;
            b = b.with_config(key, v);
        }
        let endpoint = b.get_config_value(&K::Endpoint);
        let store = b
            .with_container_name(container)
            .with_retry(no_retries())
            .build()
            .map_err(|e| built(shown, e, redactor))?;
        Ok(Cloud {
            store: Arc::new(store),
            endpoint,
        })
    }
}
