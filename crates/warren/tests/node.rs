//! `warren node` end to end: a real `warren scheduler` and real `warren node`
//! processes on loopback, sandboxes placed through the scheduler and created
//! through the node's control API, and envd driven through the node's data
//! plane with the generated Connect clients (someone else's wire code).
//!
//! Every check runs for the `process` runtime and for `isolated` (which
//! needs root, cgroups and the base template). If it cannot run here those
//! tests fail loudly;
//! set `WARREN_TEST_SKIP_ISOLATED=1` to skip them on purpose.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use connectrpc::client::{ClientConfig, HttpClient};
use http::{Method, StatusCode};
use http_body_util::StreamBody;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use warren_envd_proto::process::{
    process_event, process_input, process_selector, ConnectRequest, ProcessConfig, ProcessInput,
    ProcessSelector, SendInputRequest, StartRequest,
};
use warren_envd_proto::process::{ConnectResponse, ProcessClient, StartResponse};
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::{Answer, Http};
use warren_test_support::{free_port, wait_until, Proc};

const ENVD: u16 = 49983;
const TEAM: &str = "team-node-tests";

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Runtime {
    Process,
    Isolated,
}

impl Runtime {
    fn name(self) -> &'static str {
        match self {
            Runtime::Process => "process",
            Runtime::Isolated => "isolated",
        }
    }
}

/// True when the isolated-runtime tests should be skipped (only by explicit request).
fn skip(runtime: Runtime) -> bool {
    if runtime == Runtime::Isolated
        && std::env::var("WARREN_TEST_SKIP_ISOLATED").as_deref() == Ok("1")
    {
        eprintln!("WARREN_TEST_SKIP_ISOLATED=1: skipping an isolated-runtime test");
        return true;
    }
    false
}

/// A scheduler and one node (`node-1`), from test-support's cluster.
struct Rig {
    c: Cluster,
    /// The node's id, as the scheduler knows it.
    node_id: String,
    /// `host:port` of the node's listener.
    node_http: String,
    /// The node's data dir (kept across restarts).
    data_dir: PathBuf,
    http: Http,
    runtime: Runtime,
}

async fn cluster(runtime: Runtime) -> Rig {
    let spec = Spec {
        // This test calls the node's or the scheduler's API directly.
        tls: false,
        nodes: 1,
        gateways: 0,
        runtime: runtime.name().into(),
        node_args: vec!["--heartbeat-interval".into(), "200ms".into()],
        ..Spec::default()
    };
    let c = Cluster::start(bin(), spec).await.unwrap_or_else(|e| {
        panic!(
            "a scheduler and a node --runtime {} did not start: {e:#}{}",
            runtime.name(),
            if runtime == Runtime::Isolated {
                "\n(bubblewrap must work for this test; set WARREN_TEST_SKIP_ISOLATED=1 to skip it)"
            } else {
                ""
            }
        )
    });
    let rig = Rig {
        node_id: "node-1".into(),
        node_http: c.node(1),
        data_dir: c.dir().join("node-1"),
        c,
        http: Http::default(),
        runtime,
    };
    rig.node_ready().await;
    let listed = rig
        .control(Method::GET, "/_warren/v1/sandboxes", None)
        .await;
    assert_eq!(
        listed.expect_json()["runtime"],
        runtime.name(),
        "the node runs the runtime asked for"
    );
    rig
}

/// One request, answered within the client's timeout.
async fn http(
    addr: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Bytes>,
) -> Answer {
    Http::default()
        .send_raw(method, addr, path, headers, body.unwrap_or_default())
        .await
        .unwrap_or_else(|e| panic!("{path} on {addr}: {e:#}"))
}

/// The node's "not hosted here" answer: 404 with the route marker.
fn is_not_found_marker(r: &Answer) -> bool {
    r.status == StatusCode::NOT_FOUND && warren_core::headers::is_not_hosted(&r.headers)
}

/// A sandbox as the tests hold it.
#[derive(Debug, Clone)]
struct Sbx {
    id: String,
    generation: u64,
    token: String,
}

impl Sbx {
    fn headers(&self, port: u16) -> Vec<(String, String)> {
        vec![
            ("x-warren-sandbox-id".into(), self.id.clone()),
            ("x-warren-sandbox-port".into(), port.to_string()),
            ("x-warren-generation".into(), self.generation.to_string()),
            ("x-access-token".into(), self.token.clone()),
        ]
    }
}

impl Rig {
    async fn control(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        self.http
            .send(method, &self.node_http, path, &[], body)
            .await
            .unwrap_or_else(|e| panic!("{path}: {e:#}"))
    }

    async fn scheduler(&self) -> SchedulerClient<tonic::transport::Channel> {
        SchedulerClient::connect(self.c.scheduler_url())
            .await
            .expect("scheduler connects")
    }

    /// The running node process.
    fn node(&self) -> &Proc {
        self.c.nodes[0].as_ref().expect("node-1 runs")
    }

    fn node_mut(&mut self) -> &mut Proc {
        self.c.nodes[0].as_mut().expect("node-1 runs")
    }

    /// Starts the node again on the same data dir and waits until it registered.
    async fn restart_node(&mut self) {
        let runtime = self.runtime.name();
        self.c
            .restart_node(1)
            .await
            .unwrap_or_else(|e| panic!("node --runtime {runtime} restarts: {e:#}"));
        self.node_http = self.c.node(1);
        self.node_ready().await;
    }

    /// Ready means registered: placements on this node work from here on.
    async fn node_ready(&self) {
        let admin = self.node().addr("node admin");
        wait_until("the node to register", Duration::from_secs(10), || {
            let admin = admin.clone();
            async move {
                (http(&admin, Method::GET, "/readyz", &[], None).await.status == StatusCode::OK)
                    .then_some(())
            }
        })
        .await;
    }

    /// Place (scheduler) → create (node control API) → RecordAssignment, as a gateway does.
    async fn sandbox(&self) -> Sbx {
        let mut s = self.scheduler().await;
        let placed = s
            .place(pb::PlaceRequest {
                template_id: "base".into(),
                team_id: TEAM.into(),
                timeout_secs: 600,
                require_node_id: self.node_id.clone(),
                ..Default::default()
            })
            .await
            .expect("place")
            .into_inner();
        let token = format!("tok{}", placed.sandbox_id);
        let r = self
            .control(
                Method::POST,
                "/_warren/v1/sandboxes",
                Some(create_body(&placed.sandbox_id, placed.generation, &token)),
            )
            .await;
        assert_eq!(
            r.status,
            StatusCode::CREATED,
            "create: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        s.record_assignment(pb::RecordAssignmentRequest {
            sandbox_id: placed.sandbox_id.clone(),
            node_id: self.node_id.clone(),
            generation: placed.generation,
        })
        .await
        .expect("record assignment");
        Sbx {
            id: placed.sandbox_id,
            generation: placed.generation,
            token,
        }
    }

    /// A data-plane request to `port` of `sbx`.
    async fn data(
        &self,
        sbx: &Sbx,
        port: u16,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        extra: &[(&str, &str)],
    ) -> Answer {
        let owned = sbx.headers(port);
        let mut headers: Vec<(&str, &str)> = owned
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        headers.extend_from_slice(extra);
        http(&self.node_http, method, path, &headers, body).await
    }

    fn process(&self, sbx: &Sbx) -> ProcessClient<HttpClient> {
        let mut config = ClientConfig::new(format!("http://{}", self.node_http).parse().unwrap());
        for (k, v) in sbx.headers(ENVD) {
            config = config.with_default_header(k, v);
        }
        ProcessClient::new(HttpClient::plaintext(), config)
    }
}

fn create_body(id: &str, generation: u64, token: &str) -> Value {
    json!({
        "sandbox_id": id,
        "generation": generation,
        "template_id": "base",
        "env_vars": {"GREETING": "hello from the env"},
        "metadata": {},
        "access_token": token,
        "timeout_secs": 600,
    })
}

fn sh(command: &str) -> StartRequest {
    StartRequest {
        process: ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), command.into()],
            ..Default::default()
        }
        .into(),
        stdin: Some(true),
        ..Default::default()
    }
}

/// What a process stream delivered.
#[derive(Debug, Default)]
struct Output {
    pid: Option<u32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// stdout and stderr in the order received.
    all: Vec<u8>,
    exit: Option<i32>,
}

impl Output {
    fn push(&mut self, event: Option<process_event::Event>) {
        match event {
            Some(process_event::Event::Start(s)) => self.pid = Some(s.pid),
            Some(process_event::Event::Data(d)) => match d.output {
                Some(process_event::data_event::Output::Stdout(b)) => {
                    self.stdout.extend_from_slice(&b);
                    self.all.extend_from_slice(&b);
                }
                Some(process_event::data_event::Output::Stderr(b)) => {
                    self.stderr.extend_from_slice(&b);
                    self.all.extend_from_slice(&b);
                }
                _ => {}
            },
            Some(process_event::Event::End(e)) => self.exit = Some(e.exit_code),
            _ => {}
        }
    }
}

/// Runs a shell command to its end; returns its output.
async fn run(client: &ProcessClient<HttpClient>, command: &str) -> Output {
    let mut stream = client.start(sh(command)).await.expect("process.Start");
    let mut out = Output::default();
    while let Some(msg) = stream
        .message::<StartResponse>()
        .await
        .expect("stream message")
    {
        out.push(
            msg.to_owned_message()
                .event
                .into_option()
                .and_then(|e| e.event),
        );
    }
    out
}

/// Starts a long-running command and returns its pid once started.
async fn spawn(client: &ProcessClient<HttpClient>, command: &str) -> u32 {
    let mut stream = client.start(sh(command)).await.expect("process.Start");
    let mut out = Output::default();
    while out.pid.is_none() {
        let msg = stream
            .message::<StartResponse>()
            .await
            .expect("stream")
            .expect("a start event");
        out.push(
            msg.to_owned_message()
                .event
                .into_option()
                .and_then(|e| e.event),
        );
    }
    // Dropping the stream detaches; the process keeps running.
    out.pid.unwrap_or(0)
}

fn random_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|_| rand::random::<u8>()).collect()
}

fn multipart(name: &str, data: &[u8]) -> (String, Bytes) {
    let boundary = "warren-node-test-boundary";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (
        format!("multipart/form-data; boundary={boundary}"),
        Bytes::from(body),
    )
}

/// Host pids whose command line contains `needle`.
/// The host pids of `process`-runtime envd processes of sandbox `id` (found
/// by the mark the node puts in their environment).
fn envd_pids_of(id: &str) -> Vec<i32> {
    let mark = format!("WARREN_SANDBOX={id}.");
    host_pids_with("envd --inherited-sockets")
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|kv| kv.starts_with(mark.as_bytes()))
            })
        })
        .collect()
}

fn host_pids_with(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

// ---------------------------------------------------------------------------

/// Create → Start streams stdout/stderr/exit code; a dropped client resumes
/// byte-exactly with an offset; /files round-trips random bytes; the access
/// token is enforced; idempotent create and 409.
async fn envd_api_through_the_node(runtime: Runtime) {
    if skip(runtime) {
        return;
    }
    let c = cluster(runtime).await;
    let sbx = c.sandbox().await;
    let client = c.process(&sbx);

    // Start `echo`: stdout, stderr and the exit code arrive, env vars too.
    let out = run(
        &client,
        "echo out; echo err >&2; echo \"$GREETING\"; exit 3",
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "out\nhello from the env\n"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    assert_eq!(out.exit, Some(3));
    let home = run(&client, "pwd; cat ~/README 2>/dev/null | head -1; ls -a ~").await;
    let cwd = String::from_utf8_lossy(&home.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    match runtime {
        Runtime::Isolated => assert_eq!(cwd, "/home/user"),
        Runtime::Process => assert!(cwd.ends_with("/fs/home/user"), "{cwd}"),
    }
    let want = match runtime {
        // The template's skeleton home (Debian's /etc/skel).
        Runtime::Isolated => ".bashrc",
        Runtime::Process => "This is a warren sandbox",
    };
    assert!(
        String::from_utf8_lossy(&home.stdout).contains(want),
        "the base template's home: {:?}",
        String::from_utf8_lossy(&home.stdout)
    );

    // The memory limit holds under bwrap (512 MiB by default, the
    // sandbox's cgroup); the process runtime limits nothing.
    if runtime == Runtime::Isolated {
        let hog = run(
            &client,
            "python3 -c 'b = bytearray(3 << 30); print(len(b))'",
        )
        .await;
        assert_ne!(
            hog.exit,
            Some(0),
            "a 3 GiB allocation must fail: {:?}",
            String::from_utf8_lossy(&hog.stdout)
        );
    }

    // A long process survives its client; Connect with an offset replays the rest exactly.
    let script = "for i in $(seq 1 20); do echo line $i; done; read go; \
                  for i in $(seq 21 40); do if [ $((i % 2)) = 0 ]; then echo line $i; else echo line $i >&2; fi; done";
    let mut stream = client.start(sh(script)).await.expect("start");
    let mut first = Output::default();
    while first.all.len() < 20 {
        let msg = stream
            .message::<StartResponse>()
            .await
            .expect("stream")
            .expect("more output");
        first.push(
            msg.to_owned_message()
                .event
                .into_option()
                .and_then(|e| e.event),
        );
    }
    let pid = first.pid.expect("pid");
    let seen = first.all.clone();
    drop(stream);
    let selector = ProcessSelector {
        selector: Some(process_selector::Selector::Pid(pid)),
        ..Default::default()
    };
    client
        .send_input(SendInputRequest {
            process: selector.clone().into(),
            input: ProcessInput {
                input: Some(process_input::Input::Stdin(b"go\n".to_vec())),
                ..Default::default()
            }
            .into(),
            ..Default::default()
        })
        .await
        .expect("the process still runs and takes input");
    let mut resumed = client
        .connect(ConnectRequest {
            process: selector.into(),
            offset: Some(seen.len() as u64),
            ..Default::default()
        })
        .await
        .expect("connect with offset");
    let mut rest = Output::default();
    while let Some(msg) = resumed.message::<ConnectResponse>().await.expect("stream") {
        rest.push(
            msg.to_owned_message()
                .event
                .into_option()
                .and_then(|e| e.event),
        );
    }
    assert_eq!(rest.exit, Some(0));
    let mut assembled = seen;
    assembled.extend_from_slice(&rest.all);
    // stdout and stderr are two pipes, so their interleaving is envd's to
    // decide; what must hold is that seen + resumed is exactly envd's log.
    let mut full = client
        .connect(ConnectRequest {
            process: ProcessSelector {
                selector: Some(process_selector::Selector::Pid(pid)),
                ..Default::default()
            }
            .into(),
            offset: Some(0),
            ..Default::default()
        })
        .await
        .expect("connect from offset 0");
    let mut log = Output::default();
    while let Some(msg) = full.message::<ConnectResponse>().await.expect("stream") {
        log.push(
            msg.to_owned_message()
                .event
                .into_option()
                .and_then(|e| e.event),
        );
    }
    assert_eq!(
        String::from_utf8_lossy(&assembled),
        String::from_utf8_lossy(&log.all),
        "byte-exact resume"
    );
    let stdout_lines: String = (1..=40)
        .filter(|i| *i <= 20 || i % 2 == 0)
        .map(|i| format!("line {i}\n"))
        .collect();
    let mut stdout = first.stdout.clone();
    stdout.extend_from_slice(&rest.stdout);
    assert_eq!(String::from_utf8_lossy(&stdout), stdout_lines);
    let stderr_lines: String = (21..=40)
        .filter(|i| i % 2 == 1)
        .map(|i| format!("line {i}\n"))
        .collect();
    assert_eq!(String::from_utf8_lossy(&rest.stderr), stderr_lines);

    // /files: random binary bytes up and down, byte for byte.
    let data = random_bytes(256 * 1024 + 3);
    let (ct, body) = multipart("/home/user/blob.bin", &data);
    let up = c
        .data(
            &sbx,
            ENVD,
            Method::POST,
            "/files?path=%2Fhome%2Fuser%2Fblob.bin",
            Some(body),
            &[("content-type", &ct)],
        )
        .await;
    assert_eq!(
        up.status,
        StatusCode::OK,
        "upload: {:?}",
        String::from_utf8_lossy(&up.body)
    );
    let down = c
        .data(
            &sbx,
            ENVD,
            Method::GET,
            "/files?path=%2Fhome%2Fuser%2Fblob.bin",
            None,
            &[],
        )
        .await;
    assert_eq!(down.status, StatusCode::OK);
    assert_eq!(
        down.body.as_ref(),
        data.as_slice(),
        "downloaded bytes equal uploaded bytes"
    );

    // The token is enforced by envd behind the node (and the node strips nothing it should keep).
    let mut wrong = sbx.clone();
    wrong.token = "not-the-token".into();
    let denied = c
        .data(
            &wrong,
            ENVD,
            Method::GET,
            "/files?path=%2Fhome%2Fuser%2Fblob.bin",
            None,
            &[],
        )
        .await;
    assert_eq!(denied.status, StatusCode::UNAUTHORIZED);

    // Idempotent create; another generation of the same id is a conflict.
    let again = c
        .control(
            Method::POST,
            "/_warren/v1/sandboxes",
            Some(create_body(&sbx.id, sbx.generation, &sbx.token)),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.expect_json()["sandbox_id"], sbx.id.as_str());
    assert_eq!(again.expect_json()["generation"], sbx.generation);
    let other = c
        .control(
            Method::POST,
            "/_warren/v1/sandboxes",
            Some(create_body(&sbx.id, sbx.generation + 1, &sbx.token)),
        )
        .await;
    assert_eq!(other.status, StatusCode::CONFLICT);
    let bad = c
        .control(
            Method::POST,
            "/_warren/v1/sandboxes",
            Some(json!({"sandbox_id": "x", "generation": 1, "template_id": "python"})),
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert!(bad.expect_json()["message"]
        .as_str()
        .unwrap()
        .contains("python"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_api_through_the_node_process() {
    envd_api_through_the_node(Runtime::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_api_through_the_node_isolated() {
    envd_api_through_the_node(Runtime::Isolated).await;
}

/// The stale-route marker: wrong id, old generation, and a request whose
/// body never ends (so the node must answer without reading it). A relayed
/// port works; a closed one is a 502 naming it. Fork copies files (not
/// processes). Delete kills every process of the sandbox. The scheduler
/// lists the node with its sandboxes.
async fn routing_relay_fork_delete(runtime: Runtime) {
    if skip(runtime) {
        return;
    }
    let c = cluster(runtime).await;
    let sbx = c.sandbox().await;
    let client = c.process(&sbx);

    // Not-found marker: unknown id, and the right id at another generation.
    let mut unknown = sbx.clone();
    unknown.id = "nosuchsandbox".into();
    let r = c
        .data(&unknown, ENVD, Method::GET, "/health", None, &[])
        .await;
    assert!(is_not_found_marker(&r), "{} {:?}", r.status, r.headers);
    assert!(r.expect_json()["message"]
        .as_str()
        .unwrap()
        .contains("nosuchsandbox"));
    for g in [
        sbx.generation + 1,
        sbx.generation.saturating_sub(1).max(1000),
    ] {
        let mut old = sbx.clone();
        old.generation = g;
        let r = c.data(&old, ENVD, Method::GET, "/health", None, &[]).await;
        assert!(is_not_found_marker(&r), "generation {g}: {}", r.status);
    }
    // ...even with a body that never ends: the answer cannot wait for it.
    {
        let (tx, rx) =
            tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::io::Error>>(4);
        let big = Bytes::from(vec![b'x'; 4 << 20]);
        tokio::spawn(async move {
            let _ = tx.send(Ok(hyper::body::Frame::data(big))).await;
            // Keep the body open forever (until the test ends).
            tx.closed().await;
        });
        let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let client = Client::builder(TokioExecutor::new()).build_http::<StreamBody<_>>();
        let req = http::Request::post(format!("http://{}/files?path=%2Ftmp%2Fx", c.node_http))
            .header("x-warren-sandbox-id", sbx.id.as_str())
            .header("x-warren-sandbox-port", "49983")
            .header("x-warren-generation", (sbx.generation + 7).to_string())
            .body(body)
            .unwrap();
        let res = tokio::time::timeout(Duration::from_secs(10), client.request(req))
            .await
            .expect("the node answers without reading the body")
            .expect("a response");
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        assert_eq!(res.headers()["x-warren-route"], "not-found");
    }
    // Malformed headers are a 400, not a marker.
    let r = http(
        &c.node_http,
        Method::GET,
        "/health",
        &[("x-warren-sandbox-id", "Bad!")],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.headers.get("x-warren-route").is_none());

    // A relayed port: python's http.server inside the sandbox, reached through envd's relay.
    // Under `process` the sandbox shares the host's network, so pick a free port;
    // the site dir name makes the server's command line unique to this test.
    let port = free_port();
    let closed_port = free_port();
    let site = format!("site{}", rand::random::<u32>());
    run(
        &client,
        &format!("mkdir -p ~/{site} && echo served-from-the-sandbox > ~/{site}/index.html"),
    )
    .await;
    spawn(
        &client,
        &format!("exec python3 -m http.server {port} --bind 127.0.0.1 --directory $HOME/{site}"),
    )
    .await;
    let page = wait_until(
        "http.server to answer through the relay",
        Duration::from_secs(15),
        || {
            let (c, sbx) = (&c, &sbx);
            async move {
                let r = c
                    .data(sbx, port, Method::GET, "/index.html", None, &[])
                    .await;
                (r.status == StatusCode::OK).then_some(r)
            }
        },
    )
    .await;
    assert_eq!(page.body.as_ref(), b"served-from-the-sandbox\n");
    let closed = c.data(&sbx, closed_port, Method::GET, "/", None, &[]).await;
    assert_eq!(closed.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        closed.expect_json()["message"],
        format!("port {closed_port} is not open in sandbox {}", sbx.id).as_str()
    );

    // Fork: files are copied; processes are not carried over.
    run(&client, "echo forked-data > ~/note.txt").await;
    let mut s = c.scheduler().await;
    let placed = s
        .place(pb::PlaceRequest {
            template_id: "base".into(),
            team_id: TEAM.into(),
            timeout_secs: 600,
            require_node_id: c.node_id.clone(),
            ..Default::default()
        })
        .await
        .expect("place the fork")
        .into_inner();
    let child = Sbx {
        id: placed.sandbox_id.clone(),
        generation: placed.generation,
        token: "child-token".into(),
    };
    let forked = c
        .control(
            Method::POST,
            &format!("/_warren/v1/sandboxes/{}/fork", sbx.id),
            Some(json!({"generation": sbx.generation, "child": create_body(&child.id, child.generation, &child.token)})),
        )
        .await;
    assert_eq!(
        forked.status,
        StatusCode::CREATED,
        "{:?}",
        String::from_utf8_lossy(&forked.body)
    );
    s.record_assignment(pb::RecordAssignmentRequest {
        sandbox_id: child.id.clone(),
        node_id: c.node_id.clone(),
        generation: child.generation,
    })
    .await
    .expect("record the fork");
    let child_client = c.process(&child);
    let note = run(
        &child_client,
        &format!("cat ~/note.txt ~/{site}/index.html"),
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&note.stdout),
        "forked-data\nserved-from-the-sandbox\n"
    );
    let child_procs = child_client
        .list(warren_envd_proto::process::ListRequest::default())
        .await
        .expect("list the child's processes")
        .into_owned();
    assert!(
        !child_procs.processes.iter().any(|p| p
            .config
            .as_option()
            .is_some_and(|c| c.args.iter().any(|a| a.contains("http.server")))),
        "the parent's processes did not come along"
    );
    if runtime == Runtime::Isolated {
        let not_carried = c
            .data(&child, port, Method::GET, "/index.html", None, &[])
            .await;
        assert_eq!(
            not_carried.status,
            StatusCode::BAD_GATEWAY,
            "the child's port is its own"
        );
    }
    // Forking from a generation the node does not host is the marker.
    let stale = c
        .control(
            Method::POST,
            &format!("/_warren/v1/sandboxes/{}/fork", sbx.id),
            Some(json!({"generation": sbx.generation + 5, "child": create_body("otherchild", 1, "t")})),
        )
        .await;
    assert!(is_not_found_marker(&stale));

    // The scheduler lists this node with both sandboxes.
    let nodes = s
        .list_nodes(pb::ListNodesRequest {})
        .await
        .expect("list nodes")
        .into_inner();
    let me = nodes
        .nodes
        .iter()
        .find(|n| n.node_id == c.node_id)
        .expect("the node is listed");
    assert_eq!(me.endpoint, c.node_http);
    assert_eq!(me.state, pb::NodeState::Up as i32);
    let listed = s
        .list_sandboxes(pb::ListSandboxesRequest {
            node_id: c.node_id.clone(),
            ..Default::default()
        })
        .await
        .expect("list sandboxes")
        .into_inner();
    let mut ids: Vec<&str> = listed
        .sandboxes
        .iter()
        .map(|b| b.sandbox_id.as_str())
        .collect();
    ids.sort();
    let mut want = vec![sbx.id.as_str(), child.id.as_str()];
    want.sort();
    assert_eq!(ids, want);

    // Delete kills every process: a sleep, a detached grandchild, the http.server.
    let marker_tag = format!("sleep 7{}", rand::random::<u32>() % 1_000_000);
    spawn(
        &client,
        &format!("{marker_tag} & setsid sh -c '{marker_tag}' & exec {marker_tag}"),
    )
    .await;
    let before = wait_until(
        "the sleeps to show up on the host",
        Duration::from_secs(5),
        || {
            let found = host_pids_with(&marker_tag);
            async move { (found.len() >= 3).then_some(found) }
        },
    )
    .await;
    assert!(!host_pids_with(&site).is_empty());
    let del = c
        .control(
            Method::DELETE,
            &format!(
                "/_warren/v1/sandboxes/{}?generation={}",
                sbx.id, sbx.generation
            ),
            None,
        )
        .await;
    // The answer is the sandbox's log at its end: the processes it ran.
    assert_eq!(del.status, StatusCode::OK);
    let entries = del.expect_json()["entries"].clone();
    assert!(
        entries
            .as_array()
            .is_some_and(|e| e.iter().any(|l| l["message"] == "Sandbox killed")),
        "{entries}"
    );
    let left = host_pids_with(&marker_tag);
    assert!(
        left.is_empty(),
        "processes {left:?} of {before:?} survived delete"
    );
    let httpd: Vec<i32> = host_pids_with(&site);
    assert!(
        httpd.is_empty(),
        "the sandbox's http.server survived: {httpd:?}"
    );
    assert!(
        !c.data_dir.join("sandboxes").join(&sbx.id).exists(),
        "files removed"
    );
    let gone = c.data(&sbx, ENVD, Method::GET, "/health", None, &[]).await;
    assert!(is_not_found_marker(&gone));
    let again = c
        .control(
            Method::DELETE,
            &format!(
                "/_warren/v1/sandboxes/{}?generation={}",
                sbx.id, sbx.generation
            ),
            None,
        )
        .await;
    assert!(is_not_found_marker(&again));
    // The scheduler heard about the delete.
    wait_until(
        "the scheduler to drop the binding",
        Duration::from_secs(10),
        || {
            let mut s = s.clone();
            let id = sbx.id.clone();
            async move {
                s.get_sandbox(pb::GetSandboxRequest { sandbox_id: id })
                    .await
                    .is_err()
                    .then_some(())
            }
        },
    )
    .await;
    // The child lives on.
    let child_alive = c
        .data(&child, ENVD, Method::GET, "/health", None, &[])
        .await;
    assert_eq!(child_alive.status, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_relay_fork_delete_process() {
    routing_relay_fork_delete(Runtime::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_relay_fork_delete_isolated() {
    routing_relay_fork_delete(Runtime::Isolated).await;
}

/// With bwrap, a sandbox sees only its own processes and files, cannot read
/// the host's secrets, and cannot reach another sandbox's ports or the host's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_sandboxes_are_isolated() {
    if skip(Runtime::Isolated) {
        return;
    }
    let c = cluster(Runtime::Isolated).await;
    let a = c.sandbox().await;
    let b = c.sandbox().await;
    let (ca, cb) = (c.process(&a), c.process(&b));

    // Processes: only the sandbox's own (bwrap's init, envd, this shell and its children).
    let ps = run(
        &ca,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    )
    .await;
    let seen = String::from_utf8_lossy(&ps.stdout).into_owned();
    assert!(seen.contains("envd"), "its own envd is visible: {seen}");
    for host_only in ["scheduler", "warren node", "cargo"] {
        assert!(
            !seen.contains(host_only),
            "the host's {host_only:?} is visible: {seen}"
        );
    }
    let count = run(&ca, "ls -d /proc/[0-9]* | wc -l").await;
    let n: usize = String::from_utf8_lossy(&count.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(n < 10, "{n} processes visible");
    let host_pid = c.node().pid().expect("the node runs");
    let probe = run(&ca, &format!("cat /proc/{host_pid}/cmdline")).await;
    assert!(
        !String::from_utf8_lossy(&probe.stdout).contains("node"),
        "the node's pid is not visible"
    );

    // Files: nothing of the host; the template's system dirs are root's.
    let data_dir = c.data_dir.display().to_string();
    let files = run(
        &ca,
        &format!(
            "ls {data_dir} 2>&1; ls /root 2>&1; cat /etc/shadow 2>&1; touch /usr/x 2>&1; touch /etc/x 2>&1; \
             ls /work 2>&1; id -u"
        ),
    )
    .await;
    let text = String::from_utf8_lossy(&files.stdout).into_owned();
    assert!(
        !text.contains(&b.id),
        "another sandbox's dir is visible: {text}"
    );
    assert!(!text.contains("sandbox.json"), "{text}");
    assert!(
        text.contains("Permission denied") || text.contains("No such file"),
        "{text}"
    );
    assert!(
        text.contains("touch: cannot touch '/usr/x': Permission denied"),
        "system dirs are not the user's: {text}"
    );
    assert!(
        !text.trim_end().ends_with("\n0") && text.trim_end() != "0",
        "not root: {text}"
    );
    let other_home = run(
        &ca,
        &format!(
            "ls /home; cat {data_dir}/sandboxes/{}/fs/home/user/README 2>&1",
            b.id
        ),
    )
    .await;
    assert_eq!(
        String::from_utf8_lossy(&other_home.stdout).lines().next(),
        Some("user")
    );
    assert!(String::from_utf8_lossy(&other_home.stdout).contains("No such file"));

    // Ports: A serves on 8000; B cannot reach it (own network namespace), nor the node's port.
    spawn(&ca, "exec python3 -m http.server 8000 --bind 127.0.0.1").await;
    wait_until("A's server", Duration::from_secs(15), || {
        let (c, a) = (&c, &a);
        async move {
            (c.data(a, 8000, Method::GET, "/", None, &[]).await.status == StatusCode::OK)
                .then_some(())
        }
    })
    .await;
    let node_port = c.node_http.rsplit(':').next().unwrap().to_string();
    let reach = |port: &str| {
        format!(
            "python3 -c \"import socket,sys\ntry:\n socket.create_connection(('127.0.0.1', {port}), timeout=2)\n print('connected')\nexcept OSError as e:\n print('refused', e)\""
        )
    };
    let from_b = run(&cb, &reach("8000")).await;
    assert!(
        String::from_utf8_lossy(&from_b.stdout).starts_with("refused"),
        "B reached A's port: {:?}",
        String::from_utf8_lossy(&from_b.stdout)
    );
    let to_node = run(&cb, &reach(&node_port)).await;
    assert!(
        String::from_utf8_lossy(&to_node.stdout).starts_with("refused"),
        "B reached the node: {:?}",
        String::from_utf8_lossy(&to_node.stdout)
    );
    let from_a = run(&ca, &reach("8000")).await;
    assert!(
        String::from_utf8_lossy(&from_a.stdout).starts_with("connected"),
        "A reaches its own port"
    );
    // And through the node, B's port 8000 is B's (closed), never A's.
    let via_b = c.data(&b, 8000, Method::GET, "/", None, &[]).await;
    assert_eq!(via_b.status, StatusCode::BAD_GATEWAY);
}

/// A sandbox the scheduler never placed here is an orphan: the next
/// heartbeat names it and the node kills it. Concurrent duplicate creates
/// start one envd.
async fn orphans_and_concurrent_creates(runtime: Runtime) {
    if skip(runtime) {
        return;
    }
    let c = cluster(runtime).await;
    let id = &format!("orphan{}", runtime.name());
    let results = futures_util::future::join_all((0..4).map(|_| {
        c.control(
            Method::POST,
            "/_warren/v1/sandboxes",
            Some(create_body(id, 3, "t")),
        )
    }))
    .await;
    let mut statuses: Vec<u16> = results.iter().map(|r| r.status.as_u16()).collect();
    statuses.sort();
    assert_eq!(
        statuses,
        vec![200, 200, 200, 201],
        "one create, three answered with the same sandbox"
    );
    if runtime == Runtime::Process {
        assert_eq!(envd_pids_of(id).len(), 1, "one envd for one sandbox");
    }
    // Not placed by the scheduler: an orphan, killed after a heartbeat.
    wait_until("the orphan to be killed", Duration::from_secs(10), || {
        let c = &c;
        async move {
            let r = c.control(Method::GET, "/_warren/v1/sandboxes", None).await;
            r.expect_json()["sandboxes"]
                .as_array()
                .is_some_and(|a| a.is_empty())
                .then_some(())
        }
    })
    .await;
    let dir = c.data_dir.join("sandboxes").join(id);
    wait_until("the orphan's files to go", Duration::from_secs(10), || {
        let gone = !dir.exists();
        async move { gone.then_some(()) }
    })
    .await;
    // The delete is counted when it has finished, which may be a moment
    // after the sandbox left the list and its files went: wait for it.
    let admin = c.node().addr("node admin");
    let text = wait_until("the delete to be counted", Duration::from_secs(10), || {
        let admin = admin.clone();
        async move {
            let metrics = http(&admin, Method::GET, "/metrics", &[], None).await;
            let text = String::from_utf8_lossy(&metrics.body).into_owned();
            text.contains("warren_node_deletes_total 1").then_some(text)
        }
    })
    .await;
    assert!(text.contains("warren_node_creates_total 1"), "{text}");
    assert!(text.contains("warren_node_sandboxes 0"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_and_concurrent_creates_process() {
    orphans_and_concurrent_creates(Runtime::Process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_and_concurrent_creates_isolated() {
    orphans_and_concurrent_creates(Runtime::Isolated).await;
}

/// Sandboxes never outlive their node: SIGTERM kills them (and exits 0);
/// after a SIGKILL, the next node on the same data dir cleans up what is
/// left, and the scheduler drops the bindings the new roster lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_do_not_outlive_their_node() {
    let mut c = cluster(Runtime::Process).await;
    let mut s = c.scheduler().await;

    let first = c.sandbox().await;
    let tag1 = format!("sleep 8{}", rand::random::<u32>() % 1_000_000);
    spawn(&c.process(&first), &format!("exec {tag1}")).await;
    assert_eq!(host_pids_with(&tag1).len(), 1);
    assert_eq!(
        c.node_mut().terminate(Duration::from_secs(15)).await.code,
        Some(0),
        "SIGTERM exits 0"
    );
    assert!(
        host_pids_with(&tag1).is_empty(),
        "a graceful stop kills the sandbox's processes"
    );
    assert!(!c.data_dir.join("sandboxes").join(&first.id).exists());

    c.restart_node().await;
    let second = c.sandbox().await;
    let tag2 = format!("sleep 8{}", rand::random::<u32>() % 1_000_000);
    spawn(&c.process(&second), &format!("exec {tag2}")).await;
    assert_eq!(
        envd_pids_of(&second.id).len(),
        1,
        "found envd before the kill"
    );
    c.node_mut().kill9().await;
    // envd dies with the node (parent-death signal); what it started is orphaned...
    wait_until("envd to die with its node", Duration::from_secs(5), || {
        let gone = envd_pids_of(&second.id).is_empty();
        async move { gone.then_some(()) }
    })
    .await;
    // ...until the next node process cleans up.
    c.restart_node().await;
    assert!(
        host_pids_with(&tag2).is_empty(),
        "leftovers are killed at start"
    );
    assert!(!c.data_dir.join("sandboxes").join(&second.id).exists());
    let listed = c
        .control(Method::GET, "/_warren/v1/sandboxes", None)
        .await
        .expect_json();
    assert_eq!(listed["sandboxes"], json!([]));
    for id in [&first.id, &second.id] {
        let err = s
            .get_sandbox(pb::GetSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await
            .expect_err("the scheduler dropped the binding");
        assert_eq!(err.code(), tonic::Code::NotFound);
    }
}

#[tokio::test]
async fn bad_configuration_exits_64() {
    for args in [
        &["node", "--node-id", "Not_Valid"][..],
        &[
            "node",
            "--insecure-internal",
            "--scheduler",
            "https://127.0.0.1:50051",
        ][..],
        // Neither certificates nor --insecure-internal.
        &["node", "--node-id", "n1"][..],
        &[
            "node",
            "--tls-ca",
            "/nonexistent/ca.pem",
            "--tls-cert",
            "/x",
            "--tls-key",
            "/y",
        ][..],
        &["node", "--capacity", "0"][..],
    ] {
        let out = tokio::process::Command::new(bin())
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(64),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Deleting a sandbox kills its processes and nothing else. The kernel reuses
/// a freed pid-namespace inode number at once, often for the very next
/// sandbox's namespace, so a kill that went on matching by the old inode
/// would take the next sandbox's envd down with it (seen in the failover
/// experiment). Delete one while creating the next; the next one must live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_sandbox_never_kills_the_next_one_isolated() {
    if skip(Runtime::Isolated) {
        return;
    }
    let c = cluster(Runtime::Isolated).await;
    let mut previous = c.sandbox().await;
    for round in 0..6 {
        // Delete the previous sandbox while the next one is being created:
        // the new namespace may get the old one's inode number.
        let path = format!(
            "/_warren/v1/sandboxes/{}?generation={}",
            previous.id, previous.generation
        );
        let (deleted, next) = tokio::join!(c.control(Method::DELETE, &path, None), async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            c.sandbox().await
        });
        assert_eq!(deleted.status, StatusCode::OK, "round {round}: delete");
        tokio::time::sleep(Duration::from_millis(200)).await;
        let h = c.data(&next, ENVD, Method::GET, "/health", None, &[]).await;
        assert_eq!(
            h.status,
            StatusCode::NO_CONTENT,
            "round {round}: the sandbox created during the delete died: {:?}",
            String::from_utf8_lossy(&h.body)
        );
        previous = next;
    }
}

/// With a blob store (a directory here) a node keeps no records. A
/// filesystem-only pause puts the sandbox's writable layer into the blob
/// store and answers the paused record (`paused_record`) for the gateway
/// to keep; a resume on the node boots it again from its kept files, the
/// file written before the pause still there. An auto-pause at its end
/// (filesystem-only) has no gateway: the node's PAUSE report carries the
/// record, and the scheduler keeps it with the PAUSE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_only_pause_on_a_blob_store_answers_and_reports_its_record() {
    if skip(Runtime::Isolated) {
        return;
    }
    let blobs = tempfile::tempdir().expect("a temporary directory");
    let base = base_into_blob_dir(blobs.path());
    let spec = Spec {
        tls: false,
        nodes: 1,
        gateways: 0,
        runtime: "isolated".into(),
        node_args: vec![
            "--heartbeat-interval".into(),
            "200ms".into(),
            "--blob-store".into(),
            blobs.path().display().to_string(),
        ],
        ..Spec::default()
    };
    let c = Cluster::start(bin(), spec)
        .await
        .unwrap_or_else(|e| panic!("a scheduler and an isolated node with a blob store: {e:#}"));
    let rig = Rig {
        node_id: "node-1".into(),
        node_http: c.node(1),
        data_dir: c.dir().join("node-1"),
        c,
        // The first create unpacks the base template from the blob store.
        http: Http::new(Duration::from_secs(300)),
        runtime: Runtime::Isolated,
    };
    rig.node_ready().await;

    // Paused as a gateway pauses it: the answer carries the record.
    let sbx = blob_sandbox(&rig, &base, None).await;
    let out = run(&rig.process(&sbx), "echo kept > /home/user/mark.txt").await;
    assert_eq!(out.exit, Some(0), "{:?}", String::from_utf8_lossy(&out.all));
    let r = rig
        .control(
            Method::POST,
            &format!(
                "/_warren/v1/sandboxes/{}/pause?generation={}",
                sbx.id, sbx.generation
            ),
            Some(json!({"memory": false})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let record = r.expect_json()["paused_record"].clone();
    assert_eq!(record["name"], format!("paused-{}", sbx.id), "{record}");
    let paused = &record["snapshot"]["paused"];
    assert_eq!(paused["generation"], sbx.generation, "{record}");
    assert_eq!(record["snapshot"]["team"], "", "{record}");
    let layer = record["layers"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(Value::as_str)
        .expect("the pause's layer")
        .to_string();
    assert_eq!(paused["own_layers"], json!([layer]), "{record}");
    assert!(
        blob_path(blobs.path(), &layer).is_file(),
        "the pause's layer {layer} is in the blob store"
    );
    // Booted again on this node, from its kept files.
    let r = rig
        .control(
            Method::POST,
            &format!(
                "/_warren/v1/sandboxes/{}/resume?generation={}",
                sbx.id, sbx.generation
            ),
            Some(json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.expect_json().get("paused_record").is_none(),
        "{}",
        r.text()
    );
    let out = run(&rig.process(&sbx), "cat /home/user/mark.txt").await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");

    // Auto-paused filesystem-only at its end, by the node alone.
    let auto = blob_sandbox(&rig, &base, Some(2)).await;
    let mut s = rig.scheduler().await;
    let key = format!("paused-{}", auto.id);
    let kept = wait_until(
        "the scheduler to keep the auto-pause's record",
        Duration::from_secs(60),
        || {
            let (mut s, key) = (s.clone(), key.clone());
            async move {
                s.get_template_record(pb::GetTemplateRecordRequest {
                    name: key,
                    team_id: String::new(),
                })
                .await
                .ok()
                .map(|r| r.into_inner())
            }
        },
    )
    .await;
    assert_eq!(kept.kind, pb::RecordKind::Paused as i32, "{kept:?}");
    let meta = kept.snapshot.as_ref().and_then(|s| s.paused.as_ref());
    assert_eq!(
        meta.map(|p| p.generation),
        Some(auto.generation),
        "{kept:?}"
    );
    let own = meta
        .and_then(|p| p.own_layers.last())
        .expect("its own layer");
    assert!(
        blob_path(blobs.path(), own).is_file(),
        "{own} in the blob store"
    );
    let b = s
        .get_sandbox(pb::GetSandboxRequest {
            sandbox_id: auto.id.clone(),
        })
        .await
        .expect("the binding")
        .into_inner();
    assert_eq!(b.state, pb::BindingState::Paused as i32, "{b:?}");
}

/// A sandbox of `base` (its record handed in, as a gateway with a blob
/// store hands it): placed, created on the node, recorded. With
/// `auto_pause_secs`, it ends that soon and is then paused filesystem-only.
async fn blob_sandbox(rig: &Rig, base: &Value, auto_pause_secs: Option<u64>) -> Sbx {
    let mut s = rig.scheduler().await;
    let placed = s
        .place(pb::PlaceRequest {
            template_id: "base".into(),
            team_id: TEAM.into(),
            timeout_secs: auto_pause_secs.unwrap_or(600),
            require_node_id: rig.node_id.clone(),
            lifecycle: auto_pause_secs.map(|_| pb::Lifecycle {
                auto_pause: true,
                auto_resume: false,
            }),
            ..Default::default()
        })
        .await
        .expect("place")
        .into_inner();
    let token = format!("tok{}", placed.sandbox_id);
    let mut body = create_body(&placed.sandbox_id, placed.generation, &token);
    body["template_record"] = base.clone();
    if let Some(secs) = auto_pause_secs {
        body["timeout_secs"] = json!(secs);
        body["auto_pause_filesystem_only"] = json!(true);
    }
    let r = rig
        .control(Method::POST, "/_warren/v1/sandboxes", Some(body))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "create: {}", r.text());
    s.record_assignment(pb::RecordAssignmentRequest {
        sandbox_id: placed.sandbox_id.clone(),
        node_id: rig.node_id.clone(),
        generation: placed.generation,
    })
    .await
    .expect("record assignment");
    Sbx {
        id: placed.sandbox_id,
        generation: placed.generation,
        token,
    }
}

/// Blob `digest`'s file in a directory blob store.
fn blob_path(dir: &Path, digest: &str) -> PathBuf {
    dir.join("blobs/sha256")
        .join(digest.trim_start_matches("sha256-"))
}

/// The machine's `base` blob into the directory blob store `dir` (linked,
/// or copied across filesystems); its record.
fn base_into_blob_dir(dir: &Path) -> Value {
    let store = Path::new(warren_test_support::templates::TEMPLATE_DIR);
    let record = std::fs::read(store.join("templates/base.json")).unwrap_or_else(|e| {
        panic!("the base template is built (scripts/test builds it; docs/sandboxes.md): {e}")
    });
    let t: Value = serde_json::from_slice(&record).expect("the record parses");
    let digest = t["digest"].as_str().expect("a digest");
    let from = store.join(format!("blobs/{digest}.tar"));
    let to = blob_path(dir, digest);
    std::fs::create_dir_all(to.parent().expect("a parent")).expect("the blob dir");
    std::fs::hard_link(&from, &to)
        .or_else(|_| std::fs::copy(&from, &to).map(|_| ()))
        .expect("base's blob in the blob store");
    t
}
