//! The envd HTTP server: the shared `warren_core::server` loop (HTTP/1.1 and
//! h2c, the timeouts and connection limit of `Settings::listener`, drain)
//! on a TCP or Unix listener, routing `/health`, `/files` and everything
//! else to the Connect router. The listener is created apart from serving
//! (`crate::bind_api`).
//!
//! `GET /warren/start` is warren's own: where the template's start command
//! is (see [`crate::start`]), asked by the node while a sandbox starts.
//!
//! Every request but `GET /health` needs the access token when one is set:
//! `X-Access-Token`, or for `/files` a presigned signature. Without it,
//! `/files` and unknown paths get E2B's `401` JSON and RPCs a Connect
//! `unauthenticated` error in their own wire shape.

use crate::config::Settings;
use crate::drain::{self, DrainOnDrop};
use crate::files;
use crate::filesystem::FilesystemService;
use crate::paths::Jail;
use crate::process::manager::Manager;
use crate::process::ProcessService;
use connectrpc::{ConnectError, ConnectRpcService, DeadlinePolicy, Limits, Router};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use warren_core::body::{self as reply, Body};
use warren_core::server::{self as http_server, Accept, Incoming};

/// The largest Connect message envd accepts (a SendInput chunk, say). Larger
/// ones are refused with `resource_exhausted` before they are buffered
/// (and a unary request whose `Content-Length` says so before any of it is
/// read: `oversized_unary`).
const MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// Where the template's start command is (`GET`).
pub const START_PATH: &str = "/warren/start";
/// envd's own log from a sequence number (`?after=N`; token required):
/// [`crate::events::Page`].
pub const LOGS_PATH: &str = "/warren/logs";

/// A bound listener for the envd API.
#[derive(Debug)]
pub enum ApiListener {
    /// TCP (tests, development).
    Tcp(TcpListener),
    /// A Unix socket (the node); the path is removed on shutdown.
    Unix(UnixListener, PathBuf),
    /// A Unix socket the node bound and passed down (`--inherited-sockets`).
    Inherited(UnixListener),
}

impl ApiListener {
    /// What `announce` prints: `host:port` or `unix:/path`.
    pub fn display_addr(&self) -> String {
        match self {
            ApiListener::Tcp(l) => l
                .local_addr()
                .map_or_else(|e| format!("tcp:?({e})"), |a| a.to_string()),
            ApiListener::Unix(_, path) => format!("unix:{}", path.display()),
            ApiListener::Inherited(_) => "unix:(inherited)".to_string(),
        }
    }
}

/// Shared state of the HTTP routes.
struct App {
    jail: Arc<Jail>,
    token: Option<String>,
    connect: ConnectRpcService<Router>,
    /// Where the template's start command is.
    start: tokio::sync::watch::Receiver<crate::start::StartState>,
    /// envd's own log (`GET /warren/logs`).
    events: Arc<crate::events::EventLog>,
}

/// Serves the envd API on `listener` until `shutdown` resolves, then kills
/// every process it started and drains open requests briefly.
pub async fn serve(
    settings: Settings,
    listener: ApiListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let users = if settings.switch_users {
        crate::users::Users::switching(&settings.root).with_defaults(
            settings.default_user.clone(),
            settings.default_workdir.clone(),
        )
    } else {
        crate::users::Users::default()
    };
    let jail = Arc::new(Jail::new(settings.root.clone(), settings.home.clone()).with_users(users));
    // A home that does not exist yet would make every relative path fail.
    let _ = std::fs::create_dir_all(jail.home_host());
    let manager = Manager::new(
        (*jail).clone(),
        settings.env_vars.clone(),
        settings.max_output_bytes,
        settings.keep_finished,
    );
    let start = match settings.start.clone() {
        Some(cmd) => crate::start::spawn(manager.clone(), cmd, settings.access_token.as_deref()),
        None => tokio::sync::watch::channel(crate::start::StartState::None).1,
    };
    let router = Router::new()
        .add_service(Arc::new(ProcessService::new(
            manager.clone(),
            settings.keepalive,
        )))
        .add_service(Arc::new(FilesystemService::new(
            jail.clone(),
            settings.keepalive,
        )));
    let limits = settings.listener;
    let connect = ConnectRpcService::new(router)
        .with_limits(
            Limits::default()
                .with_max_message_size(MAX_MESSAGE_BYTES)
                .with_max_request_body_size(MAX_MESSAGE_BYTES + 1024),
        )
        // A client's `Connect-Timeout-Ms` bounds the whole call, streams
        // included: a `Start`, `Connect` or `WatchDir` stream ends with
        // `deadline_exceeded` when it runs out (the SDK's `timeout`; the
        // process itself keeps running and stays reattachable). Without
        // the header a stream runs until it ends.
        .with_deadline_policy(DeadlinePolicy::new().with_enforce_on_streams(true));
    manager.events().record(
        "info",
        "envd",
        "envd started",
        [("envd_version", crate::ENVD_VERSION.to_string())],
    );
    let app = Arc::new(App {
        jail,
        token: settings.access_token.clone(),
        connect,
        start,
        events: manager.events().clone(),
    });

    // A Unix socket's path outlives the listener; it is removed at the end.
    let unix_path = match &listener {
        ApiListener::Unix(_, path) => Some(path.clone()),
        ApiListener::Tcp(_) | ApiListener::Inherited(_) => None,
    };
    let handler = move |_peer, req| {
        let app = app.clone();
        async move { route(&app, req).await }
    };
    // Killing when shutdown is asked for, before the drain, lets every open
    // process stream end properly (with its end event) instead of being cut
    // off when the drain times out.
    let stop = async move {
        shutdown.await;
        tracing::info!("envd shutting down");
        manager.kill_all();
    };
    // envd has no admin listener to show metrics on.
    let metrics = http_server::Metrics::default().listener("http");
    warren_core::server::serve(listener, handler, stop, limits, metrics).await;
    if let Some(path) = unix_path {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// A connection of either kind.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

impl Accept for ApiListener {
    type Conn = Box<dyn Io>;
    type Io = Box<dyn Io>;
    type Peer = ();

    async fn accept(&self) -> std::io::Result<(Box<dyn Io>, ())> {
        Ok(match self {
            ApiListener::Tcp(l) => (Box::new(Accept::accept(l).await?.0), ()),
            ApiListener::Unix(l, _) | ApiListener::Inherited(l) => {
                (Box::new(Accept::accept(l).await?.0), ())
            }
        })
    }

    fn handshake(
        &self,
        conn: Box<dyn Io>,
        peer: (),
    ) -> impl Future<Output = std::io::Result<(Box<dyn Io>, ())>> + Send + 'static {
        std::future::ready(Ok((conn, peer)))
    }
}

async fn route(app: &App, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path == "/health" && (req.method() == Method::GET || req.method() == Method::HEAD) {
        return reply::status(StatusCode::NO_CONTENT);
    }
    let is_files = path == "/files";
    if let Err(why) = authorized(app, &req, is_files) {
        let answer = unauthorized(&req, why.message());
        drain::discard(req.into_body());
        return answer;
    }
    if is_files {
        return files::handle(&app.jail, req).await;
    }
    if path == START_PATH && req.method() == Method::GET {
        let state = app.start.borrow().clone();
        return reply::json(StatusCode::OK, &state);
    }
    if path == LOGS_PATH && req.method() == Method::GET {
        let after = req
            .uri()
            .query()
            .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("after=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        return reply::json(StatusCode::OK, &app.events.page(after));
    }
    if let Some(answer) = oversized_unary(&req) {
        drain::discard(req.into_body());
        return answer;
    }
    // Connect answers a body over its limit (a streamed unary request, a
    // streaming message) before reading the rest; the rest is read anyway
    // so that the answer arrives (see `drain`).
    let req = req.map(DrainOnDrop::new);
    let mut connect = app.connect.clone();
    let res = match tower_service::Service::call(&mut connect, req).await {
        Ok(res) => res,
        Err(never) => match never {},
    };
    res.map(|b| b.map_err(|never| match never {}).boxed_unsync())
}

/// A unary Connect request whose `Content-Length` is over the message
/// limit, answered `resource_exhausted` (HTTP 429 in Connect's mapping)
/// with a message naming the limit, before any of it is read.
fn oversized_unary(req: &Request<Incoming>) -> Option<Response<Body>> {
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)?
        .to_str()
        .ok()?;
    // Streaming RPCs (`application/connect+...`) are checked per message.
    if req.method() != Method::POST
        || !content_type.starts_with("application/")
        || content_type.starts_with("application/connect+")
        || content_type.starts_with("application/grpc")
    {
        return None;
    }
    let length: u64 = req
        .headers()
        .get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    if length <= MAX_MESSAGE_BYTES as u64 {
        return None;
    }
    let message = format!(
        "request body of {length} bytes is over envd's limit of {MAX_MESSAGE_BYTES} bytes \
         ({} MiB) for one Connect request; send large input in several requests, and \
         files with POST /files",
        MAX_MESSAGE_BYTES >> 20
    );
    Some(
        ConnectError::resource_exhausted(message)
            .into_http_response(req.headers())
            .map(|b| b.map_err(|never| match never {}).boxed_unsync()),
    )
}

/// Ok when the request carries the access token, or (for `/files`) a
/// valid signed URL; otherwise why not.
fn authorized(
    app: &App,
    req: &Request<Incoming>,
    is_files: bool,
) -> Result<(), files::SignatureError> {
    let Some(token) = app.token.as_deref() else {
        return Ok(());
    };
    let header_ok = req
        .headers()
        .get("x-access-token")
        .is_some_and(|v| constant_time_eq(v.as_bytes(), token.as_bytes()));
    if header_ok {
        return Ok(());
    }
    if !is_files {
        return Err(files::SignatureError::Missing);
    }
    files::check_signature(&files::Query::parse(req.uri().query()), req.method(), token)
}

fn unauthorized(req: &Request<Incoming>, message: &str) -> Response<Body> {
    let is_rpc = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/"))
        && req.uri().path().matches('/').count() == 2
        && req.uri().path() != "/files";
    if is_rpc {
        ConnectError::unauthenticated(message)
            .into_http_response(req.headers())
            .map(|b| b.map_err(|never| match never {}).boxed_unsync())
    } else {
        reply::error(StatusCode::UNAUTHORIZED, message)
    }
}

/// Compares secrets without leaking where they differ through timing.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
