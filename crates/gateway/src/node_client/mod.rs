//! HTTP towards nodes: pooled hyper-util clients used by the data-plane
//! proxy and the node control API (`/_warren/v1/...`, docs/internals.md),
//! one per worker thread of the public listener ([`NodeHttp`]).

mod metrics;
mod pool;

pub use pool::{Dial, DialIo, DialedIo, NodePool, PooledBody, SendError, IDLE_TIMEOUT};

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use std::sync::Arc;
use std::time::Duration;
use warren_core::body::full;
use warren_core::headers::is_not_hosted;
use warren_core::node_api::{self, ErrorBody, ForkSandbox, SandboxList};
pub use warren_core::node_api::{CreateSandbox, SandboxInfo};
use warren_core::server::Workers;

/// What dials nodes: TCP, then mutual TLS to a node certificate
/// (`https://` URIs), or nothing more under `--insecure-internal`.
type HttpsConnector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Largest control-API answer read from a node.
const MAX_NODE_ANSWER: usize = 16 * 1024 * 1024;

/// How long a node may take, on top of the request timeout, to pack a
/// filesystem-paused sandbox's writable layer.
const PACK_TIME: Duration = Duration::from_secs(300);

/// A pool of node connections: connect timeout as configured, no Nagle
/// (interactive streams), idle connections kept for reuse, dropped once a
/// node leaves what was sent unacknowledged for `dead_node` (or is silent
/// to keepalive probes while idle); with `trust`, every node connection is
/// mutual TLS and the node must show a node certificate.
pub fn node_pool(
    connect_timeout: Duration,
    dead_node: Duration,
    trust: Option<&warren_trust::Trust>,
) -> Result<NodePool, String> {
    let connector = warren_trust::connect::connector(
        trust,
        warren_trust::Role::Node,
        connect_timeout,
        dead_node,
        false,
    )?;
    Ok(NodePool::new(
        connector,
        warren_trust::connect::scheme(trust),
    ))
}

/// The node clients: one pool per worker thread of the public listener,
/// so a request's node connection is driven by the thread that serves the
/// request (no hop to another thread and back), and one shared pool for
/// everything that runs elsewhere (the watch, tasks of the main runtime).
/// Cheap to clone.
#[derive(Clone)]
pub struct NodeHttp {
    shared: NodePool,
    per_worker: Arc<[NodePool]>,
    workers: Option<Workers>,
}

impl NodeHttp {
    /// Pools as [`node_pool`] builds them, one per thread of `workers` and
    /// a shared one.
    pub fn new(
        connect_timeout: Duration,
        dead_node: Duration,
        trust: Option<&warren_trust::Trust>,
        workers: Option<&Workers>,
    ) -> Result<Self, String> {
        let per_worker = (0..workers.map_or(0, Workers::len))
            .map(|_| node_pool(connect_timeout, dead_node, trust))
            .collect::<Result<Arc<[_]>, _>>()?;
        Ok(NodeHttp {
            shared: node_pool(connect_timeout, dead_node, trust)?,
            per_worker,
            workers: workers.cloned(),
        })
    }

    /// One pool for everything, no worker threads: the simulation's
    /// gateways (`crates/sim`), over [`NodePool::with_dial`].
    pub fn single(pool: NodePool) -> Self {
        NodeHttp {
            shared: pool,
            per_worker: Arc::from(Vec::new()),
            workers: None,
        }
    }

    /// The pool of the thread this runs on.
    pub fn here(&self) -> &NodePool {
        self.workers
            .as_ref()
            .and_then(Workers::index_here)
            .and_then(|i| self.per_worker.get(i))
            .unwrap_or(&self.shared)
    }
}

/// A failed node control-API call.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No HTTP answer: refused, reset, or connect timeout.
    #[error("cannot reach node {endpoint}: {source}")]
    Unreachable {
        endpoint: String,
        #[source]
        source: SendError,
    },
    /// No full answer within the request timeout.
    #[error("node {endpoint} did not answer within {timeout:?}")]
    Timeout { endpoint: String, timeout: Duration },
    /// The node answered with an error status.
    #[error("node {endpoint} answered {status}: {message}")]
    Status {
        endpoint: String,
        status: StatusCode,
        message: String,
        /// The answer carried `X-Warren-Route: not-found`.
        not_hosted: bool,
    },
    /// The answer could not be read or parsed.
    #[error("node {endpoint} sent an unreadable answer: {message}")]
    Protocol { endpoint: String, message: String },
}

impl NodeError {
    /// The connection to the node never came up: the request was not sent,
    /// so nothing can have happened on the node.
    pub fn is_connect(&self) -> bool {
        matches!(self, NodeError::Unreachable { source, .. } if source.is_connect())
    }
}

/// The node control API.
#[derive(Clone)]
pub struct NodeClient {
    client: NodeHttp,
    timeout: Duration,
}

impl NodeClient {
    /// Control-API calls over `client`, each bounded by `timeout`.
    pub fn new(client: NodeHttp, timeout: Duration) -> Self {
        NodeClient { client, timeout }
    }

    /// `POST /_warren/v1/sandboxes`, allowed `extra` time on top of the
    /// request timeout (the template's start command's ready timeout).
    pub async fn create(
        &self,
        endpoint: &str,
        req: &CreateSandbox,
        extra: Duration,
    ) -> Result<SandboxInfo, NodeError> {
        self.post_within(endpoint, node_api::SANDBOXES.into(), req, extra)
            .await
    }

    /// `POST /_warren/v1/sandboxes/{parent}/fork`, allowed `extra` time as
    /// [`NodeClient::create`] is.
    pub async fn fork(
        &self,
        endpoint: &str,
        parent: &str,
        parent_generation: u64,
        child: &CreateSandbox,
        extra: Duration,
    ) -> Result<SandboxInfo, NodeError> {
        let fork = ForkSandbox {
            generation: parent_generation,
            child: child.clone(),
        };
        self.post_within(endpoint, node_api::fork_path(parent), &fork, extra)
            .await
    }

    /// `DELETE /_warren/v1/sandboxes/{id}?generation=g`.
    /// Answers the sandbox's log at its end (empty from a node that
    /// answers none), for the DELETE report.
    pub async fn delete(
        &self,
        endpoint: &str,
        id: &str,
        generation: u64,
    ) -> Result<Vec<node_api::SandboxLogEntry>, NodeError> {
        let path = format!("{}?generation={generation}", node_api::sandbox_path(id));
        let (_, bytes) = self.send(endpoint, Method::DELETE, path, None).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Vec::new());
        }
        Ok(serde_json::from_slice::<node_api::SandboxLogs>(&bytes)
            .map(|l| l.entries)
            .unwrap_or_default())
    }

    /// `GET /_warren/v1/sandboxes/{id}/logs?generation=g`: the sandbox's
    /// log as its node holds it, oldest first.
    pub async fn logs(
        &self,
        endpoint: &str,
        id: &str,
        generation: u64,
    ) -> Result<Vec<node_api::SandboxLogEntry>, NodeError> {
        let path = node_api::logs_path(id, generation);
        let (_, bytes) = self.send(endpoint, Method::GET, path, None).await?;
        parse::<node_api::SandboxLogs>(endpoint, &bytes).map(|l| l.entries)
    }

    /// `POST /_warren/v1/heartbeat`: the node heartbeats now.
    pub async fn heartbeat_now(&self, endpoint: &str) -> Result<(), NodeError> {
        self.send(endpoint, Method::POST, node_api::HEARTBEAT.into(), None)
            .await
            .map(|_| ())
    }

    /// `POST /_warren/v1/sandboxes/{id}/pause|resume?generation=g`: freezes
    /// or thaws the sandbox in place; `keep_memory: false` pauses it
    /// filesystem-only (body [`node_api::PauseSandbox`]), and the resume of
    /// such a sandbox boots it again unless `cold_boot` is false (body
    /// [`node_api::ResumeSandbox`]; then a `409`). A filesystem-only
    /// pause's paused record, when the node answers one
    /// ([`node_api::SandboxInfo::paused_record`]).
    pub async fn set_paused(
        &self,
        endpoint: &str,
        id: &str,
        generation: u64,
        pause: bool,
        keep_memory: bool,
        cold_boot: bool,
    ) -> Result<Option<serde_json::Value>, NodeError> {
        let action = if pause { "pause" } else { "resume" };
        let path = node_api::freeze_path(id, action, generation);
        let body = if pause && !keep_memory {
            serde_json::to_vec(&node_api::PauseSandbox {
                memory: Some(false),
            })
            .unwrap_or_default()
        } else if !pause && !cold_boot {
            serde_json::to_vec(&node_api::ResumeSandbox {
                cold_boot: Some(false),
            })
            .unwrap_or_default()
        } else {
            b"{}".to_vec()
        };
        // A filesystem-only pause packs the sandbox's writable layer into
        // the template store (for a resume on another node): a disk's time.
        let within = if pause && !keep_memory {
            self.timeout + PACK_TIME
        } else {
            self.timeout
        };
        let (_, bytes) = self
            .send_within(within, endpoint, Method::POST, path, Some(body))
            .await?;
        // A filesystem-only pause from a blob store's node answers the
        // sandbox's paused record. An answer without one (a node on a
        // shared store, or one that could not pack the layer) is no error:
        // the sandbox is paused all the same, to resume on its node.
        if !pause || keep_memory {
            return Ok(None);
        }
        match serde_json::from_slice::<node_api::SandboxInfo>(&bytes) {
            Ok(info) => Ok(info.paused_record),
            Err(e) => {
                tracing::warn!(%endpoint, sandbox_id = id, error = %e,
                    "the node's pause answer is not a sandbox; no paused record kept");
                Ok(None)
            }
        }
    }

    /// `POST /_warren/v1/sandboxes/{id}/snapshot`, allowed `extra` time on
    /// top of the request timeout (the node copies and packs a disk).
    pub async fn snapshot(
        &self,
        endpoint: &str,
        id: &str,
        req: &node_api::CreateSnapshot,
        extra: Duration,
    ) -> Result<node_api::SnapshotMade, NodeError> {
        self.post_within(endpoint, node_api::snapshot_path(id), req, extra)
            .await
    }

    /// `GET /_warren/v1/sandboxes`: what the node hosts now.
    pub async fn list(&self, endpoint: &str) -> Result<Vec<SandboxInfo>, NodeError> {
        let (_, bytes) = self
            .send(endpoint, Method::GET, node_api::SANDBOXES.into(), None)
            .await?;
        parse::<SandboxList>(endpoint, &bytes).map(|r| r.sandboxes)
    }

    async fn send(
        &self,
        endpoint: &str,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), NodeError> {
        self.send_within(self.timeout, endpoint, method, path, body)
            .await
    }

    /// POSTs `body` as JSON to `path`, allowed `extra` time on top of the
    /// request timeout, and parses the JSON answer.
    async fn post_within<B: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        endpoint: &str,
        path: String,
        body: &B,
        extra: Duration,
    ) -> Result<R, NodeError> {
        let body = serde_json::to_vec(body).unwrap_or_default();
        let (_, bytes) = self
            .send_within(
                self.timeout + extra,
                endpoint,
                Method::POST,
                path,
                Some(body),
            )
            .await?;
        parse(endpoint, &bytes)
    }

    async fn send_within(
        &self,
        timeout: Duration,
        endpoint: &str,
        method: Method,
        path: String,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), NodeError> {
        let protocol = |message: String| NodeError::Protocol {
            endpoint: endpoint.to_string(),
            message,
        };
        let mut builder = Request::builder().method(method).uri(path);
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        let req = builder
            .body(full(body.unwrap_or_default()))
            .map_err(|e| protocol(format!("bad request for endpoint: {e}")))?;
        let call = async {
            let resp = self
                .client
                .here()
                .request(endpoint, req)
                .await
                .map_err(|source| NodeError::Unreachable {
                    endpoint: endpoint.to_string(),
                    source,
                })?;
            let status = resp.status();
            let not_hosted = is_not_hosted(resp.headers());
            let bytes = Limited::new(resp.into_body(), MAX_NODE_ANSWER)
                .collect()
                .await
                .map_err(|e| protocol(format!("reading the answer: {e}")))?
                .to_bytes();
            if !status.is_success() {
                let message = serde_json::from_slice::<ErrorBody>(&bytes)
                    .map(|b| b.message)
                    .unwrap_or_else(|_| {
                        String::from_utf8_lossy(&bytes).chars().take(300).collect()
                    });
                return Err(NodeError::Status {
                    endpoint: endpoint.to_string(),
                    status,
                    message,
                    not_hosted,
                });
            }
            Ok((status, bytes))
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(NodeError::Timeout {
                endpoint: endpoint.to_string(),
                timeout,
            }),
        }
    }
}

/// E2B's network API (`control/network.rs`).
impl NodeClient {
    /// `PUT /_warren/v1/sandboxes/{id}/network?generation=g`: replaces the
    /// sandbox's egress policy and rules; the node answers once they are
    /// enforced.
    pub async fn update_network(
        &self,
        endpoint: &str,
        id: &str,
        generation: u64,
        update: &node_api::NetworkUpdate,
    ) -> Result<node_api::NetworkInfo, NodeError> {
        let body = serde_json::to_vec(update).unwrap_or_default();
        let path = node_api::network_path(id, generation);
        let (_, bytes) = self.send(endpoint, Method::PUT, path, Some(body)).await?;
        parse(endpoint, &bytes)
    }

    /// `GET /_warren/v1/sandboxes/{id}?generation=g`: one hosted sandbox.
    pub async fn get(
        &self,
        endpoint: &str,
        id: &str,
        generation: u64,
    ) -> Result<SandboxInfo, NodeError> {
        let path = format!("{}?generation={generation}", node_api::sandbox_path(id));
        let (_, bytes) = self.send(endpoint, Method::GET, path, None).await?;
        parse(endpoint, &bytes)
    }
}

/// Volumes (`control/volumes`): their data on the node that holds them.
impl NodeClient {
    /// `PUT /_warren/v1/volumes/{id}`: makes the volume's data if it is
    /// not there.
    pub async fn ensure_volume(
        &self,
        endpoint: &str,
        id: &str,
        max_bytes: u64,
    ) -> Result<node_api::volumes::VolumeInfo, NodeError> {
        let body =
            serde_json::to_vec(&node_api::volumes::EnsureVolume { max_bytes }).unwrap_or_default();
        let path = node_api::volumes::volume_path(id);
        let (_, bytes) = self.send(endpoint, Method::PUT, path, Some(body)).await?;
        parse(endpoint, &bytes)
    }

    /// `DELETE /_warren/v1/volumes/{id}`: removes its data (a large tree
    /// may take a while).
    pub async fn remove_volume(&self, endpoint: &str, id: &str) -> Result<(), NodeError> {
        let path = node_api::volumes::volume_path(id);
        self.send_within(
            self.timeout + PACK_TIME,
            endpoint,
            Method::DELETE,
            path,
            None,
        )
        .await
        .map(|_| ())
    }
}

fn parse<T: serde::de::DeserializeOwned>(endpoint: &str, bytes: &[u8]) -> Result<T, NodeError> {
    serde_json::from_slice(bytes).map_err(|e| NodeError::Protocol {
        endpoint: endpoint.to_string(),
        message: e.to_string(),
    })
}
