//! `process.Process`: the RPC layer over the [`Manager`].
//!
//! # Layout
//! - [`exit`]: exit statuses as E2B reports them (`exit status 3`, `signal: killed`).
//! - [`manager`]: the process table — spawn, stdin, signals, retention.
//! - [`output`]: the bounded per-process output log with absolute offsets.
//! - [`pipe`]: reading stdout/stderr (or a terminal) into the log
//!   (backpressure, draining).
//! - [`pty`]: terminals for PTY processes (open, resize, input, output).
//! - [`stream`]: one client's event stream (start, data, end, keepalive).
//!
//! Differences from E2B's envd: `ConnectRequest.offset` replays retained
//! output (E2B streams live output only); finished processes stay
//! reattachable for a while (Connect sends their retained output, from the
//! offset, and the end event); a SIGKILL is answered once the process has
//! been reaped (so it is gone for whatever the client does next).

pub mod exit;
pub mod manager;
pub mod output;
pub mod pipe;
pub mod pty;
pub mod stream;

use crate::rpc_error::proc_error;
use connectrpc::{
    ConnectError, InboundStream, RequestContext, Response, ServiceRequest, ServiceResult,
    ServiceStream,
};
use futures_util::StreamExt;
use manager::{Manager, Proc, Spec};
use nix::sys::signal::Signal as NixSignal;
use std::sync::Arc;
use std::time::Duration;
use warren_envd_proto::process::{
    process_input, process_selector, stream_input_request, CloseStdinRequest, CloseStdinResponse,
    ConnectRequest, ConnectResponse, ListRequest, ListResponse, Process, ProcessConfig,
    ProcessInfo, ProcessSelector, SendInputRequest, SendInputResponse, SendSignalRequest,
    SendSignalResponse, Signal, StartRequest, StartResponse, StreamInputRequest,
    StreamInputResponse, UpdateRequest, UpdateResponse,
};

/// The header in which the e2b SDK asks for a keepalive interval (seconds).
const KEEPALIVE_HEADER: &str = "keepalive-ping-interval";

/// How long a SIGKILL waits for the process to be reaped before answering.
const KILL_REAP_WAIT: Duration = Duration::from_secs(2);

/// `process.Process` over a [`Manager`].
#[derive(Debug, Clone)]
pub struct ProcessService {
    manager: Arc<Manager>,
    /// Keepalive interval when the client names none.
    keepalive: Duration,
}

impl ProcessService {
    /// Serves `manager`'s processes.
    pub fn new(manager: Arc<Manager>, keepalive: Duration) -> ProcessService {
        ProcessService { manager, keepalive }
    }

    fn select(&self, selector: Option<&ProcessSelector>) -> Result<Arc<Proc>, ConnectError> {
        let selector = selector.and_then(|s| s.selector.as_ref()).ok_or_else(|| {
            ConnectError::invalid_argument("a process selector (pid or tag) is required")
        })?;
        match selector {
            process_selector::Selector::Pid(pid) => self.manager.by_pid(*pid),
            process_selector::Selector::Tag(tag) => self.manager.by_tag(tag),
        }
        .map_err(proc_error)
    }

    /// The client's `Keepalive-Ping-Interval`, else ours.
    fn keepalive(&self, ctx: &RequestContext) -> Duration {
        keepalive_of(ctx).unwrap_or(self.keepalive)
    }
}

/// The keepalive interval a client asks for in `Keepalive-Ping-Interval`
/// (whole seconds, 1 s to 1 h).
pub(crate) fn keepalive_of(ctx: &RequestContext) -> Option<Duration> {
    ctx.header(KEEPALIVE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| (1..=3600).contains(s))
        .map(Duration::from_secs)
}

/// The user named by the SDK's `Authorization: Basic base64(user:)`.
pub(crate) fn basic_user(ctx: &RequestContext) -> Option<String> {
    use base64::Engine;
    let value = ctx.header(http::header::AUTHORIZATION)?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.split(':').next()?.trim();
    (!user.is_empty()).then(|| user.to_string())
}

// Concrete return types are simpler to read than the trait's `impl Encodable`.
#[allow(refining_impl_trait)]
impl Process for ProcessService {
    async fn list(
        &self,
        _ctx: RequestContext,
        _request: ServiceRequest<'_, ListRequest>,
    ) -> ServiceResult<ListResponse> {
        let processes = self
            .manager
            .running()
            .into_iter()
            .map(|p| ProcessInfo {
                config: ProcessConfig {
                    cmd: p.spec.cmd.clone(),
                    args: p.spec.args.clone(),
                    envs: p.spec.envs.clone().into_iter().collect(),
                    cwd: p.spec.cwd.clone(),
                    ..Default::default()
                }
                .into(),
                pid: p.pid,
                tag: p.tag.clone(),
                ..Default::default()
            })
            .collect();
        Response::ok(ListResponse {
            processes,
            ..Default::default()
        })
    }

    async fn connect(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, ConnectRequest>,
    ) -> ServiceResult<ServiceStream<ConnectResponse>> {
        let req = request.to_owned_message();
        let proc = self.select(req.process.as_option())?;
        // Without an offset, E2B's behaviour: live output only.
        let cursor = proc
            .attach(req.offset)
            .map_err(|e| ConnectError::out_of_range(e.to_string()))?;
        let events = stream::events(cursor, self.keepalive(&ctx)).map(|ev| {
            ev.map(|event| ConnectResponse {
                event: event.into(),
                ..Default::default()
            })
        });
        Response::stream_ok(events)
    }

    async fn start(
        &self,
        ctx: RequestContext,
        request: ServiceRequest<'_, StartRequest>,
    ) -> ServiceResult<ServiceStream<StartResponse>> {
        let req = request.to_owned_message();
        let pty = match req.pty.as_option() {
            None => None,
            Some(pty) => Some(pty_size(pty)?),
        };
        let config = req.process.into_option().ok_or_else(|| {
            ConnectError::invalid_argument("process (cmd, args, ...) is required")
        })?;
        if config.cmd.is_empty() {
            return Err(ConnectError::invalid_argument("process.cmd is empty"));
        }
        let spec = Spec {
            cmd: config.cmd,
            args: config.args,
            envs: config.envs.into_iter().collect(),
            cwd: config.cwd.filter(|c| !c.is_empty()),
            // Absent means true: SDKs before envd 0.3.0 never sent it.
            stdin: req.stdin.unwrap_or(true),
            tag: req.tag,
            user: basic_user(&ctx),
            pty,
        };
        let cursor = self.manager.start(spec).map_err(proc_error)?;
        tracing::debug!(pid = cursor.proc().pid, cmd = %cursor.proc().spec.cmd, "process started");
        let events = stream::events(cursor, self.keepalive(&ctx)).map(|ev| {
            ev.map(|event| StartResponse {
                event: event.into(),
                ..Default::default()
            })
        });
        Response::stream_ok(events)
    }

    async fn update(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, UpdateRequest>,
    ) -> ServiceResult<UpdateResponse> {
        let req = request.to_owned_message();
        let Some(pty) = req.pty.as_option() else {
            return Err(ConnectError::invalid_argument(
                "nothing to update: pty (with its size) is required",
            ));
        };
        let size = pty_size(pty)?;
        let proc = self.select(req.process.as_option())?;
        proc.resize(size).map_err(proc_error)?;
        Response::ok(UpdateResponse::default())
    }

    async fn stream_input(
        &self,
        _ctx: RequestContext,
        mut requests: InboundStream<StreamInputRequest>,
    ) -> ServiceResult<StreamInputResponse> {
        let mut target: Option<Arc<Proc>> = None;
        while let Some(msg) = requests.next().await {
            let msg = msg?.to_owned_message();
            match msg.event {
                Some(stream_input_request::Event::Start(start)) => {
                    target = Some(self.select(start.process.as_option())?);
                }
                Some(stream_input_request::Event::Data(data)) => {
                    let proc = target.as_ref().ok_or_else(|| {
                        ConnectError::invalid_argument(
                            "the first StreamInput message must be `start`",
                        )
                    })?;
                    let input = data.input.as_option().and_then(|i| i.input.as_ref());
                    write_input(proc, input).await?;
                }
                Some(stream_input_request::Event::Keepalive(_)) | None => {}
            }
        }
        Response::ok(StreamInputResponse::default())
    }

    async fn send_input(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, SendInputRequest>,
    ) -> ServiceResult<SendInputResponse> {
        let req = request.to_owned_message();
        let proc = self.select(req.process.as_option())?;
        let input = req.input.as_option().and_then(|i| i.input.as_ref());
        write_input(&proc, input).await?;
        Response::ok(SendInputResponse::default())
    }

    async fn send_signal(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, SendSignalRequest>,
    ) -> ServiceResult<SendSignalResponse> {
        let req = request.to_owned_message();
        let signal = match req.signal.as_known() {
            Some(Signal::SIGNAL_SIGKILL) => NixSignal::SIGKILL,
            Some(Signal::SIGNAL_SIGTERM) => NixSignal::SIGTERM,
            _ => {
                return Err(ConnectError::invalid_argument(format!(
                    "unsupported signal {} (SIGNAL_SIGTERM or SIGNAL_SIGKILL)",
                    req.signal.to_i32()
                )))
            }
        };
        let proc = self.select(req.process.as_option())?;
        proc.signal(signal).map_err(proc_error)?;
        // SIGKILL cannot be caught: wait (briefly) until it has been reaped,
        // so the process is gone for whatever the client does next (a
        // `kill -0 PID` of it fails) rather than lingering as a zombie.
        if signal == NixSignal::SIGKILL && !proc.wait_reaped(KILL_REAP_WAIT).await {
            tracing::warn!(
                pid = proc.pid,
                "SIGKILLed process not reaped within {KILL_REAP_WAIT:?}"
            );
        }
        Response::ok(SendSignalResponse::default())
    }

    async fn close_stdin(
        &self,
        _ctx: RequestContext,
        request: ServiceRequest<'_, CloseStdinRequest>,
    ) -> ServiceResult<CloseStdinResponse> {
        let req = request.to_owned_message();
        let proc = self.select(req.process.as_option())?;
        proc.close_stdin().await.map_err(proc_error)?;
        Response::ok(CloseStdinResponse::default())
    }
}

async fn write_input(
    proc: &Proc,
    input: Option<&process_input::Input>,
) -> Result<(), ConnectError> {
    match input {
        Some(process_input::Input::Stdin(bytes)) => {
            proc.write_stdin(bytes).await.map_err(proc_error)
        }
        Some(process_input::Input::Pty(bytes)) => proc.write_pty(bytes).await.map_err(proc_error),
        None => Err(ConnectError::invalid_argument(
            "input (stdin or pty bytes) is required",
        )),
    }
}

/// The terminal size a request names (`pty.size` is required).
fn pty_size(pty: &warren_envd_proto::process::PTY) -> Result<pty::Size, ConnectError> {
    let size = pty
        .size
        .as_option()
        .ok_or_else(|| ConnectError::invalid_argument("pty.size (cols and rows) is required"))?;
    pty::Size::new(size.cols, size.rows).map_err(ConnectError::invalid_argument)
}
