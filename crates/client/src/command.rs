//! A command whose output stream survives the death of the entry point it
//! runs through.
//!
//! The stream remembers the process's pid (and a unique tag, for a cut that
//! comes before the pid is known) and how many output bytes it has received.
//! When the stream is cut — a transport error, a stream that ends without the
//! process's end event, or silence longer than the idle timeout — it
//! reconnects through the next entry point with `Connect{pid, offset}`; envd
//! replays from that byte and then streams live. A `Start` that failed before
//! the pid arrived is followed by `Connect{tag}`: found means it did start
//! (nothing is run twice), `not_found` means it never did and it is started
//! again.

use crate::control::{Client, Health, Sandbox};
use crate::error::ClientError;
use crate::headers;
use base64::Engine;
use connectrpc::client::{ClientConfig, ClientTransport, HttpClient, ServerStream};
use connectrpc::{ConnectError, ErrorCode};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use warren_core::backoff::Backoff;
use warren_envd_proto::process::{
    process_event, process_selector, ConnectRequest, ConnectResponse, ConnectResponseView,
    ProcessClient, ProcessConfig, ProcessEvent, ProcessSelector, StartRequest, StartResponse,
    StartResponseView,
};

/// A command to run in a sandbox.
#[derive(Debug, Clone, Default)]
pub struct Command {
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: HashMap<String, String>,
    pub cwd: Option<String>,
    /// The user it runs as (envd's `Authorization: Basic`, as the SDKs
    /// send it); unset: the sandbox's default user.
    pub user: Option<String>,
    /// envd's process tag; one is generated when unset (the stream needs it
    /// to find a process whose start it did not see).
    pub tag: Option<String>,
}

impl Command {
    /// `/bin/sh -c line`.
    pub fn shell(line: impl Into<String>) -> Command {
        Command {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), line.into()],
            ..Default::default()
        }
    }
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    pub error: Option<String>,
}

/// What a [`CommandStream`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// The process started (once per stream, not again after a resume).
    Started {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The stream was cut and continues through `entry` from byte `offset`.
    Resumed {
        entry: String,
        offset: u64,
    },
    /// The process ended; nothing follows.
    End(Exit),
}

/// Everything a command printed, assembled across resumes.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    pub pid: u32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// stdout and stderr interleaved in the order envd saw them.
    pub all: Vec<u8>,
    pub exit: Exit,
    /// How many times the stream was resumed.
    pub resumes: u32,
}

type Body = <HttpClient as ClientTransport>::ResponseBody;

/// The open RPC: the first `Start`, or a `Connect` after a cut.
enum Live {
    Start(ServerStream<Body, StartResponseView<'static>>),
    Connect(ServerStream<Body, ConnectResponseView<'static>>),
}

impl Live {
    async fn next(&mut self) -> Result<Option<Option<ProcessEvent>>, ConnectError> {
        Ok(match self {
            Live::Start(s) => s
                .message::<StartResponse>()
                .await?
                .map(|m| m.to_owned_message().event.into_option()),
            Live::Connect(s) => s
                .message::<ConnectResponse>()
                .await?
                .map(|m| m.to_owned_message().event.into_option()),
        })
    }
}

/// A running command's output, resumed across entry points when cut.
pub struct CommandStream {
    client: Client,
    sandbox: Sandbox,
    command: Command,
    tag: String,
    pid: Option<u32>,
    /// Output bytes received so far (stdout + stderr): where a resume starts.
    offset: u64,
    /// Index of the entry point in use (into the client's list, modulo).
    entry: usize,
    live: Option<Live>,
    ended: bool,
    resumes: u32,
    pending: VecDeque<StreamEvent>,
    /// Why the last stream was cut (returned as is when resuming is off).
    cut: Option<ClientError>,
}

impl CommandStream {
    pub(crate) async fn start(
        client: Client,
        sandbox: Sandbox,
        mut command: Command,
    ) -> Result<CommandStream, ClientError> {
        let tag = command.tag.get_or_insert_with(unique_tag).clone();
        let entry = client.inner.entries.start();
        let mut stream = CommandStream {
            client,
            sandbox,
            command,
            tag,
            pid: None,
            offset: 0,
            entry,
            live: None,
            ended: false,
            resumes: 0,
            pending: VecDeque::new(),
            cut: None,
        };
        match stream.open_start(entry).await {
            Ok(live) => stream.live = Some(live),
            Err(e) if retryable(&e) && stream.client.inner.resume_attempts > 0 => {
                tracing::debug!(error = %e, "start failed without an answer; reattaching by tag");
                stream.reattach().await?;
            }
            Err(e) => return Err(stream.explain(e).await),
        }
        Ok(stream)
    }

    /// The process id, once known.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Output bytes received so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// How many times the stream was resumed.
    pub fn resumes(&self) -> u32 {
        self.resumes
    }

    /// The next event, `None` after [`StreamEvent::End`].
    pub async fn next(&mut self) -> Result<Option<StreamEvent>, ClientError> {
        loop {
            if let Some(ev) = self.pending.pop_front() {
                return Ok(Some(ev));
            }
            if self.ended {
                return Ok(None);
            }
            let Some(live) = self.live.as_mut() else {
                if self.client.inner.resume_attempts == 0 {
                    return Err(self.cut.take().unwrap_or_else(|| ClientError::Stream {
                        code: "unavailable".into(),
                        message: "the stream was cut".into(),
                    }));
                }
                self.reattach().await?;
                continue;
            };
            let idle = self.client.inner.stream_idle_timeout;
            match tokio::time::timeout(idle, live.next()).await {
                Ok(Ok(Some(Some(event)))) => self.accept(event),
                Ok(Ok(Some(None))) => {}
                Ok(Ok(None)) => {
                    tracing::debug!(offset = self.offset, "stream ended without an end event");
                    self.live = None;
                    self.cut = Some(ClientError::Stream {
                        code: "internal".into(),
                        message: "the stream ended without the process's end event".into(),
                    });
                }
                Ok(Err(e)) if retryable(&e) => {
                    tracing::debug!(offset = self.offset, error = %e, "command stream cut");
                    self.live = None;
                    self.cut = Some(self.stream_error(e));
                }
                // A Connect by tag answers "not found" in the stream's end
                // frame: the lost Start never reached envd, so start it now.
                Ok(Err(e))
                    if e.code == ErrorCode::NotFound
                        && self.pid.is_none()
                        && matches!(self.live, Some(Live::Connect(_))) =>
                {
                    tracing::debug!("the command never started; starting it");
                    match self.open_start(self.entry).await {
                        Ok(live) => self.live = Some(live),
                        Err(e) if retryable(&e) => {
                            self.live = None;
                            self.cut = Some(self.stream_error(e));
                        }
                        Err(e) => return Err(self.explain(e).await),
                    }
                }
                Ok(Err(e)) => return Err(self.stream_error(e)),
                Err(_) => {
                    tracing::debug!(offset = self.offset, "command stream silent for {idle:?}");
                    self.live = None;
                    self.cut = Some(ClientError::Stream {
                        code: "deadline_exceeded".into(),
                        message: format!("no event for {idle:?}"),
                    });
                }
            }
        }
    }

    /// Reads to the end and assembles the output.
    pub async fn collect(mut self) -> Result<CommandOutput, ClientError> {
        let (mut stdout, mut stderr, mut all) = (Vec::new(), Vec::new(), Vec::new());
        let mut exit = None;
        while let Some(ev) = self.next().await? {
            match ev {
                StreamEvent::Stdout(b) => {
                    all.extend_from_slice(&b);
                    stdout.extend(b);
                }
                StreamEvent::Stderr(b) => {
                    all.extend_from_slice(&b);
                    stderr.extend(b);
                }
                StreamEvent::End(e) => exit = Some(e),
                StreamEvent::Started { .. } | StreamEvent::Resumed { .. } => {}
            }
        }
        let exit = exit.ok_or_else(|| ClientError::Stream {
            code: "internal".into(),
            message: "the stream ended without an end event".into(),
        })?;
        Ok(CommandOutput {
            pid: self.pid.unwrap_or_default(),
            stdout,
            stderr,
            all,
            exit,
            resumes: self.resumes,
        })
    }

    fn accept(&mut self, event: ProcessEvent) {
        let Some(event) = event.event else { return };
        match event {
            process_event::Event::Start(s) => {
                // A Connect replays the start event; report the start once.
                if self.pid.is_none() {
                    self.pid = Some(s.pid);
                    self.pending.push_back(StreamEvent::Started { pid: s.pid });
                }
            }
            process_event::Event::Data(d) => match d.output {
                Some(process_event::data_event::Output::Stdout(b)) => {
                    self.offset += b.len() as u64;
                    self.pending.push_back(StreamEvent::Stdout(b));
                }
                Some(process_event::data_event::Output::Stderr(b))
                | Some(process_event::data_event::Output::Pty(b)) => {
                    self.offset += b.len() as u64;
                    self.pending.push_back(StreamEvent::Stderr(b));
                }
                None => {}
            },
            process_event::Event::End(e) => {
                self.ended = true;
                self.live = None;
                self.pending.push_back(StreamEvent::End(Exit {
                    exit_code: e.exit_code,
                    exited: e.exited,
                    status: e.status.clone(),
                    error: e.error.clone().filter(|s| !s.is_empty()),
                }));
            }
            process_event::Event::Keepalive(_) => {}
        }
    }

    /// Reconnects through the following entry points until one takes.
    async fn reattach(&mut self) -> Result<(), ClientError> {
        let inner = self.client.inner.clone();
        let mut last: Option<ClientError> = None;
        // Capped lower than other retries: a stream's reader is waiting.
        let mut backoff = Backoff::new(inner.backoff, Duration::from_secs(2));
        for attempt in 0..inner.resume_attempts {
            if attempt > 0 {
                tokio::time::sleep(backoff.next_pause()).await;
                // Repeated failures: ask the data plane whether the sandbox
                // is lost for good, so a dead node is not retried forever.
                if attempt % 2 == 0 {
                    self.check_sandbox().await?;
                }
            }
            self.entry += 1;
            let entry = self.entry;
            let label = inner.entries.get(entry).label.clone();
            let selector = match self.pid {
                Some(pid) => process_selector::Selector::Pid(pid),
                None => process_selector::Selector::Tag(self.tag.clone()),
            };
            let req = ConnectRequest {
                process: ProcessSelector {
                    selector: Some(selector),
                    ..Default::default()
                }
                .into(),
                offset: Some(self.offset),
                ..Default::default()
            };
            let client = self.process_client(entry)?;
            let opened = tokio::time::timeout(inner_timeout(&self.client), client.connect(req))
                .await
                .unwrap_or_else(|_| Err(ConnectError::deadline_exceeded("no answer in time")));
            match opened {
                Ok(s) => {
                    self.live = Some(Live::Connect(s));
                    if self.pid.is_some() || self.offset > 0 {
                        self.resumes += 1;
                        self.pending.push_back(StreamEvent::Resumed {
                            entry: label,
                            offset: self.offset,
                        });
                    }
                    return Ok(());
                }
                // Never started (the Start was lost before envd saw it): start it now.
                Err(e) if e.code == ErrorCode::NotFound && self.pid.is_none() => {
                    match self.open_start(entry).await {
                        Ok(live) => {
                            self.live = Some(live);
                            return Ok(());
                        }
                        Err(e) if retryable(&e) => last = Some(self.stream_error(e)),
                        Err(e) => return Err(self.explain(e).await),
                    }
                }
                Err(e) if retryable(&e) => {
                    tracing::debug!(entry = %label, error = %e, "resume failed; trying the next entry point");
                    last = Some(self.stream_error(e));
                }
                Err(e) => return Err(self.explain(e).await),
            }
        }
        self.check_sandbox().await?;
        Err(ClientError::Exhausted {
            attempts: inner.resume_attempts,
            unknown: false,
            last: Box::new(last.unwrap_or_else(|| ClientError::Stream {
                code: "unavailable".into(),
                message: "no entry point took the stream".into(),
            })),
        })
    }

    /// Fails fast when the data plane says the sandbox is lost or gone.
    async fn check_sandbox(&self) -> Result<(), ClientError> {
        match self.client.health(&self.sandbox).await {
            Ok(Health::NodeDown) => Err(ClientError::NodeDown {
                sandbox_id: self.sandbox.sandbox_id.clone(),
            }),
            Ok(Health::NotFound) => Err(ClientError::Stream {
                code: "not_found".into(),
                message: format!("sandbox {} no longer exists", self.sandbox.sandbox_id),
            }),
            _ => Ok(()),
        }
    }

    async fn open_start(&self, entry: usize) -> Result<Live, ConnectError> {
        let c = &self.command;
        let req = StartRequest {
            process: ProcessConfig {
                cmd: c.cmd.clone(),
                args: c.args.clone(),
                envs: c.envs.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                cwd: c.cwd.clone(),
                ..Default::default()
            }
            .into(),
            tag: Some(self.tag.clone()),
            stdin: Some(false),
            ..Default::default()
        };
        let client = self
            .process_client(entry)
            .map_err(|e| ConnectError::invalid_argument(e.to_string()))?;
        tokio::time::timeout(inner_timeout(&self.client), client.start(req))
            .await
            .unwrap_or_else(|_| Err(ConnectError::deadline_exceeded("no answer in time")))
            .map(Live::Start)
    }

    fn process_client(&self, entry: usize) -> Result<ProcessClient<HttpClient>, ClientError> {
        let inner = &self.client.inner;
        let base = &inner.entries.get(entry).base;
        let uri: http::Uri = base
            .parse()
            .map_err(|e| ClientError::Invalid(format!("{base}: {e}")))?;
        let bad = |what: &str| ClientError::Invalid(format!("{what} is not a valid header value"));
        let mut config = ClientConfig::new(uri)
            .with_default_header(
                headers::E2B_SANDBOX_ID,
                http::HeaderValue::from_str(&self.sandbox.sandbox_id)
                    .map_err(|_| bad("the sandbox id"))?,
            )
            .with_default_header(
                headers::E2B_SANDBOX_PORT,
                http::HeaderValue::from(headers::ENVD_PORT),
            );
        if let Some(u) = &self.command.user {
            let basic = format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:"))
            );
            config = config.with_default_header(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_str(&basic).map_err(|_| bad("the user"))?,
            );
        }
        if let Some(t) = &self.sandbox.envd_access_token {
            config = config.with_default_header(
                headers::ACCESS_TOKEN,
                http::HeaderValue::from_str(t).map_err(|_| bad("the access token"))?,
            );
        }
        Ok(ProcessClient::new(inner.rpc.clone(), config))
    }

    /// Turns a failed Start/Connect into the most precise error: a
    /// gateway's JSON error is not a Connect error body, so the Connect
    /// client keeps only its status ("HTTP error 502"); the data plane's
    /// `GET /health` then says which it was (node down, node unreachable,
    /// sandbox gone).
    async fn explain(&self, e: ConnectError) -> ClientError {
        let from_status = e
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with("HTTP error "));
        if !from_status {
            return self.stream_error(e);
        }
        let entry = self.client.inner.entries.get(self.entry).label.clone();
        match self.client.health(&self.sandbox).await {
            Ok(Health::NodeDown) => ClientError::NodeDown {
                sandbox_id: self.sandbox.sandbox_id.clone(),
            },
            Ok(Health::Unreachable) => ClientError::Api {
                entry,
                error: crate::error::ApiError {
                    status: http::StatusCode::BAD_GATEWAY,
                    error_code: "upstream_unreachable".into(),
                    message: "Failed to reach sandbox (upstream connection error)".into(),
                },
            },
            Ok(Health::NotFound) => ClientError::Stream {
                code: "sandbox_not_found".into(),
                message: format!("sandbox {} not found", self.sandbox.sandbox_id),
            },
            Ok(Health::Other(error)) => ClientError::Api { entry, error },
            Ok(Health::Ok) | Err(_) => self.stream_error(e),
        }
    }

    fn stream_error(&self, e: ConnectError) -> ClientError {
        let message = e.message.clone().unwrap_or_default();
        // A gateway's 404 JSON is not a Connect error body, so the client
        // maps the status: 404 arrives as `unimplemented` "HTTP error 404".
        let code = if e.code == ErrorCode::Unimplemented && message.starts_with("HTTP error 404") {
            "sandbox_not_found".to_string()
        } else {
            e.code.as_str().to_string()
        };
        ClientError::Stream {
            code,
            message: format!(
                "{} (sandbox {}, pid {:?}, offset {})",
                if message.is_empty() {
                    e.to_string()
                } else {
                    message
                },
                self.sandbox.sandbox_id,
                self.pid,
                self.offset
            ),
        }
    }
}

fn inner_timeout(client: &Client) -> Duration {
    // Opening a stream waits for response headers only; the control-plane
    // timeout bounds it.
    client.inner.timeout
}

/// Failures a reconnect through another entry point may fix: the transport
/// broke, a balancer or gateway answered 502/503/504, the body was cut
/// before the end-of-stream frame, or nothing came in time.
fn retryable(e: &ConnectError) -> bool {
    matches!(
        e.code,
        ErrorCode::Unavailable
            | ErrorCode::Unknown
            | ErrorCode::Internal
            | ErrorCode::DeadlineExceeded
            | ErrorCode::Canceled
            | ErrorCode::Aborted
    )
}

/// A tag no other process in the sandbox has.
fn unique_tag() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!(
        "warren-client-{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
