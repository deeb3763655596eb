//! [`App`]: what every request handler shares.

use crate::config::Settings;
use crate::metrics::Metrics;
use crate::node_client::{NodeClient, NodeHttp};
use crate::resolver::Resolver;
use std::sync::Arc;
use std::time::Duration;
use warren_proto::client::Scheduler;

/// envd version reported for a sandbox whose node cannot be asked right now
/// (the lowest the e2b SDK accepts; it only gates optional SDK features).
const FALLBACK_ENVD_VERSION: &str = "0.1.0";

/// Shared gateway state.
pub struct App {
    /// Validated configuration.
    pub settings: Settings,
    /// Scheduler replicas.
    pub scheduler: Arc<Scheduler>,
    /// Data-plane route resolution (uncached today; the route cache later).
    pub resolver: Arc<dyn Resolver>,
    /// Pooled HTTP clients for proxied sandbox traffic (this thread's: `http.here()`).
    pub http: NodeHttp,
    /// Node control API over the same pool.
    pub nodes: NodeClient,
    /// Gateway metrics.
    pub metrics: Metrics,
    /// node endpoint → envd version its sandboxes run. Every sandbox on a
    /// node runs that node's `warren envd`, so one answer serves them all;
    /// the TTL picks up node upgrades.
    envd_versions: moka::future::Cache<String, String>,
    /// Data-plane resumes in flight, by `id@generation`: every request that
    /// finds the sandbox paused joins the one resume (see `control::pause`).
    pub(crate) resumes: moka::future::Cache<String, Arc<crate::resolver::Route>>,
    /// Template builds this gateway runs (see `control::builds`).
    pub(crate) builds: Arc<crate::control::Builds>,
    /// COPY archives uploaded for template builds (see `control::uploads`).
    pub(crate) uploads: Arc<crate::control::Uploads>,
    /// Where template and snapshot records are kept (see `crate::records`).
    pub records: crate::records::Records,
    /// `http://host:port` of this gateway's own public listener, where a
    /// template build drives its sandbox (set once the listener is bound).
    pub self_url: std::sync::OnceLock<String>,
    /// Volume content routes this gateway trusts for now (see
    /// `control::volumes::content`).
    pub(crate) volume_routes: crate::control::VolumeRoutes,
}

impl App {
    /// Assembles the shared state.
    pub fn new(
        settings: Settings,
        scheduler: Arc<Scheduler>,
        resolver: Arc<dyn Resolver>,
        http: NodeHttp,
        metrics: Metrics,
    ) -> std::io::Result<Self> {
        let builds = Arc::new(crate::control::Builds::new(
            scheduler.clone(),
            settings.limits.builds,
        ));
        let nodes = NodeClient::new(http.clone(), settings.request_timeout);
        let records = match &settings.blob_store {
            None => crate::records::Records::Local(settings.template_dir.clone()),
            Some(b) => crate::records::Records::Scheduler(Arc::new(
                b.open()
                    .map_err(|e| std::io::Error::other(format!("--blob-store: {e}")))?,
            )),
        };
        let shared = match &records {
            crate::records::Records::Scheduler(b) => Some(b.clone()),
            crate::records::Records::Local(_) => None,
        };
        let uploads = Arc::new(crate::control::Uploads::new(
            settings.uploads.clone(),
            scheduler.clone(),
            shared,
        )?);
        let volume_routes = crate::control::VolumeRoutes::new(settings.volumes.route_ttl);
        Ok(App {
            records,
            uploads,
            settings,
            scheduler,
            resolver,
            http,
            nodes,
            metrics,
            builds,
            self_url: std::sync::OnceLock::new(),
            volume_routes,
            resumes: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(1))
                .build(),
            envd_versions: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(300))
                .build(),
        })
    }

    /// Remembers the envd version a node reported.
    pub async fn note_envd_version(&self, endpoint: &str, version: &str) {
        if !version.is_empty() {
            self.envd_versions
                .insert(endpoint.to_string(), version.to_string())
                .await;
        }
    }

    /// The remembered envd version for `endpoint`, without asking the node
    /// (for lists, which must not fan out to every node).
    pub async fn cached_envd_version(&self, endpoint: &str) -> String {
        self.envd_versions
            .get(endpoint)
            .await
            .unwrap_or_else(|| FALLBACK_ENVD_VERSION.to_string())
    }

    /// The envd version of sandboxes on the node at `endpoint`: remembered,
    /// else asked from the node, else [`FALLBACK_ENVD_VERSION`].
    pub async fn envd_version(&self, endpoint: &str) -> String {
        if endpoint.is_empty() {
            return FALLBACK_ENVD_VERSION.to_string();
        }
        if let Some(v) = self.envd_versions.get(endpoint).await {
            return v;
        }
        match self.nodes.list(endpoint).await {
            Ok(list) => match list.into_iter().find(|s| !s.envd_version.is_empty()) {
                Some(info) => {
                    self.note_envd_version(endpoint, &info.envd_version).await;
                    info.envd_version
                }
                None => FALLBACK_ENVD_VERSION.to_string(),
            },
            Err(e) => {
                tracing::debug!(error = %e, "cannot ask the node for its envd version");
                FALLBACK_ENVD_VERSION.to_string()
            }
        }
    }
}
