//! Simulated sandboxes: what the node's runtime would start, reduced to
//! what routing needs. The node around them is warren's own (registry,
//! control API, data-plane identity check, scheduler link); only the
//! runtime ([`SimRuntime`]: no processes, namespaces or disks) and envd
//! ([`dial`]: an in-memory HTTP server per sandbox that answers `/health`
//! and records every request that reaches it) are simulated.
//!
//! State is per thread (the simulation runs on one): which envds are
//! alive, keyed by their API socket's path, and who is told of deliveries.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use warren_node::runtime::{
    Handle, LaunchSpec, Launched, Paths, Runtime, RuntimeError, RuntimeKind, SnapshotSpec,
};

/// One request that reached a sandbox's envd.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The node that forwarded it.
    pub node: String,
    /// The sandbox incarnation it reached.
    pub sandbox_id: String,
    pub generation: u64,
    /// The simulation's request number (`x-sim-request`), if it had one.
    pub request: Option<u64>,
    pub method: http::Method,
}

/// A simulated envd: whose it is and whether its processes run.
#[derive(Debug, Clone)]
struct Envd {
    node: String,
    sandbox_id: String,
    generation: u64,
    alive: bool,
}

thread_local! {
    /// API socket path → envd. Paths are unique per node (its data dir).
    static ENVDS: RefCell<BTreeMap<PathBuf, Envd>> = const { RefCell::new(BTreeMap::new()) };
}

/// Forgets every envd: a new run starts empty.
pub fn reset() {
    ENVDS.with(|e| e.borrow_mut().clear());
}

/// Every envd of `node` stops (its node process died, and a sandbox never
/// outlives its node process).
pub fn node_died(node: &str) {
    ENVDS.with(|e| {
        for envd in e.borrow_mut().values_mut() {
            if envd.node == node {
                envd.alive = false;
            }
        }
    });
}

fn set(path: &Path, envd: Option<Envd>) {
    ENVDS.with(|e| {
        let mut e = e.borrow_mut();
        match envd {
            Some(v) => {
                e.insert(path.to_path_buf(), v);
            }
            None => {
                e.remove(path);
            }
        }
    });
}

fn set_alive(path: &Path, alive: bool) {
    ENVDS.with(|e| {
        if let Some(v) = e.borrow_mut().get_mut(path) {
            v.alive = alive;
        }
    });
}

/// The node's envd dialer in the simulation (`warren_node::envd::simulate_envd`):
/// a live envd answers on a fresh in-memory connection; a dead or unknown
/// one refuses. Relay sockets (ports other than envd's) are not simulated.
pub fn dial(path: &Path) -> Option<std::io::Result<tokio::io::DuplexStream>> {
    let refused = || {
        Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "simulated envd is not running",
        )))
    };
    let envd = ENVDS.with(|e| e.borrow().get(path).cloned());
    let Some(envd) = envd.filter(|e| e.alive) else {
        return refused();
    };
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let envd = std::sync::Arc::new(envd);
        let service = hyper::service::service_fn(move |req| answer(envd.clone(), req));
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(theirs), service)
            .await;
    });
    Some(Ok(ours))
}

async fn answer(
    envd: std::sync::Arc<Envd>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let ok = |body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = StatusCode::OK;
        Ok(r)
    };
    match req.uri().path() {
        "/health" => return ok(String::new()),
        "/warren/start" => return ok(r#"{"state":"none"}"#.into()),
        _ => {}
    }
    let delivery = Delivery {
        node: envd.node.clone(),
        sandbox_id: envd.sandbox_id.clone(),
        generation: envd.generation,
        request: req
            .headers()
            .get(crate::REQUEST_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok()),
        method: req.method().clone(),
    };
    crate::check::with(|c| c.delivered(&delivery));
    let _ = req.into_body().collect().await;
    ok(format!(
        r#"{{"sandbox":"{}","generation":{}}}"#,
        envd.sandbox_id, envd.generation
    ))
}

/// The node's runtime in the simulation: starts nothing, but keeps the
/// envd registry above in step with what the node believes it started,
/// froze, halted and destroyed. It says it is `isolated`, so the node's
/// filesystem-only pause (and with it moves) works as on a real host.
pub struct SimRuntime {
    node: String,
    /// The shared template store (the one machine's `--template-dir`):
    /// paused sandboxes' records go there.
    store: warren_template::Store,
    /// The `base` record snapshots are made from.
    base: warren_template::Template,
}

impl SimRuntime {
    pub fn new(
        node: &str,
        store: warren_template::Store,
        base: warren_template::Template,
    ) -> SimRuntime {
        SimRuntime {
            node: node.to_string(),
            store,
            base,
        }
    }
}

/// A pid no process has (above Linux's `pid_max` limit), so nothing that
/// signals a handle's pid can touch a real process.
const NO_PID: i32 = 0x7fff_fff0;

impl Runtime for SimRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Isolated
    }

    fn store(&self) -> Option<&warren_template::Store> {
        Some(&self.store)
    }

    fn launch<'a>(
        &'a self,
        spec: &'a LaunchSpec<'a>,
    ) -> futures_util::future::BoxFuture<'a, Result<Launched, RuntimeError>> {
        Box::pin(async move {
            std::fs::create_dir_all(&spec.paths.dir).map_err(RuntimeError::Files)?;
            set(
                &spec.paths.envd_sock,
                Some(Envd {
                    node: self.node.clone(),
                    sandbox_id: spec.sandbox_id.to_string(),
                    generation: spec.generation,
                    alive: true,
                }),
            );
            Ok(Launched {
                steps: warren_node::runtime::Steps::start(),
                handle: Handle {
                    runtime: RuntimeKind::Isolated,
                    pid: NO_PID,
                    start_time: 0,
                    pid_ns: None,
                    session: false,
                    cgroup: None,
                    mark: spec.mark.to_string(),
                    id_base: None,
                    id_slot: None,
                    template: Some(spec.template_id.to_string()),
                    layers: Vec::new(),
                    defaults: None,
                    leases: Vec::new(),
                    volumes: Vec::new(),
                },
                child: None,
                ids: None,
                egress: None,
                ready_within: None,
            })
        })
    }

    fn destroy(&self, paths: &Paths, _handle: Option<&Handle>) -> Result<(), RuntimeError> {
        set(&paths.envd_sock, None);
        match std::fs::remove_dir_all(&paths.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::Files(e)),
        }
    }

    fn set_frozen(&self, _handle: &Handle, _frozen: bool) -> Result<(), RuntimeError> {
        // A frozen sandbox answers nothing; the node does not forward to
        // one (it answers "paused"), so the envd stays as it is.
        Ok(())
    }

    fn halt(&self, paths: &Paths, _handle: &Handle) -> Result<(), RuntimeError> {
        set_alive(&paths.envd_sock, false);
        Ok(())
    }

    fn snapshot(
        &self,
        _paths: &Paths,
        _handle: &Handle,
        _frozen: bool,
        snapshot: &SnapshotSpec,
    ) -> Result<warren_template::Template, RuntimeError> {
        Ok(warren_template::Template {
            name: snapshot.key.clone(),
            snapshot: Some(snapshot.meta.clone()),
            source: format!("snapshot of {}", snapshot.meta.source_sandbox),
            ..self.base.clone()
        })
    }
}
