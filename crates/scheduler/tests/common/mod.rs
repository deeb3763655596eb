//! A real scheduler in-process on 127.0.0.1:0 with a real store — an SQLite
//! file, or a fresh database on a real PostgreSQL server ([`TestStore`]) —
//! and small client helpers shared by the scheduler's integration tests.
//!
//! Scenario files write each test once as `async fn NAME(store: TestStore)`
//! and list them in [`on_both_stores!`], which makes `sqlite::NAME` and
//! `postgres::NAME` tests of them.
#![allow(dead_code, clippy::unwrap_used)]

use clap::Parser;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status};
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;
use warren_scheduler::{Config, ServeError};
use warren_test_support::postgres::PgServer;

pub type Client = SchedulerClient<Channel>;

/// Deadline for anything a test waits on; never reached when things work.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Turns scenario functions `async fn NAME(store: TestStore)` into the tests
/// `sqlite::NAME` and `postgres::NAME`.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::TestStore::sqlite()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::TestStore::postgres()).await
                }
            )*
        }
    };
}

/// Where a test's scheduler keeps its state. Starting a second scheduler on
/// the same `TestStore` finds what the first one wrote.
pub enum TestStore {
    /// `--data-dir` in a temp dir, removed when dropped.
    Sqlite(tempfile::TempDir),
    /// `--database-url` of a fresh database on this test binary's server.
    Postgres(String),
}

impl TestStore {
    pub fn sqlite() -> TestStore {
        TestStore::Sqlite(tempfile::tempdir().unwrap())
    }

    /// A new, empty database on the PostgreSQL server this test binary shares.
    pub fn postgres() -> TestStore {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed));
        TestStore::Postgres(pg_server().create_database(&name).unwrap())
    }

    /// A URL to open this store's database directly (as an attacker with
    /// the file, or an older version, would see it).
    pub fn raw_url(&self) -> String {
        match self {
            TestStore::Sqlite(dir) => format!("sqlite://{}/scheduler.db", dir.path().display()),
            TestStore::Postgres(url) => url.clone(),
        }
    }

    /// The scheduler flags that point at this store (and, on PostgreSQL,
    /// the store key every scheduler of the server shares).
    pub fn flags(&self) -> Vec<String> {
        match self {
            TestStore::Sqlite(dir) => vec![format!("--data-dir={}", dir.path().display())],
            TestStore::Postgres(url) => vec![
                format!("--database-url={url}"),
                format!(
                    "--store-key-file={}",
                    pg_server().store_key_file().display()
                ),
            ],
        }
    }
}

/// One PostgreSQL server per test binary (initdb costs a second of CPU; a
/// database per test keeps tests apart just as well). A static is never
/// dropped, so a watcher process stops the server when this process exits,
/// however it exits.
pub fn pg_server() -> &'static PgServer {
    static SERVER: OnceLock<PgServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server =
            PgServer::start().expect("a private PostgreSQL server (apt-get install postgresql)");
        stop_when_this_process_exits(&server);
        server
    })
}

fn stop_when_this_process_exits(server: &PgServer) {
    let data = server.data_dir();
    let dir = data.parent().unwrap().to_path_buf();
    // SIGQUIT is PostgreSQL's immediate shutdown.
    let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 0.2; done
kill -QUIT "$(head -n1 "$2/postmaster.pid")" 2>/dev/null
sleep 1
rm -rf "$3""#;
    // Never waited for: it is meant to outlive this process.
    #[allow(clippy::zombie_processes)]
    std::process::Command::new("sh")
        .args(["-c", script, "pg-reaper"])
        .arg(std::process::id().to_string())
        .arg(&data)
        .arg(&dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
}

/// A running scheduler.
pub struct Sched {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl Sched {
    /// Starts a scheduler on `store`, with extra flags.
    pub async fn start(store: &TestStore, extra: &[&str]) -> Sched {
        let mut args = vec![
            "warren scheduler".to_string(),
            "--listen=127.0.0.1:0".into(),
            "--admin-listen=127.0.0.1:0".into(),
            // The tests call the scheduler's API with a plain client.
            "--insecure-internal".into(),
        ];
        args.extend(store.flags());
        args.extend(extra.iter().map(|s| s.to_string()));
        let config = Config::try_parse_from(args).unwrap();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = grpc.local_addr().unwrap();
        let admin_addr = admin.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(warren_scheduler::serve(config, grpc, admin, async move {
            let _ = stopped.await;
        }));
        Sched {
            addr,
            admin: admin_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Starts with the short timings the liveness tests use.
    pub async fn start_fast(store: &TestStore, extra: &[&str]) -> Sched {
        let mut args = vec![
            "--lease=300ms",
            "--heartbeat-interval=100ms",
            "--sweep-interval=30ms",
        ];
        args.extend_from_slice(extra);
        Sched::start(store, &args).await
    }

    pub async fn client(&self) -> Client {
        let url = format!("http://{}", self.addr);
        for _ in 0..100 {
            if let Ok(c) = SchedulerClient::connect(url.clone()).await {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("cannot connect to the scheduler at {url}");
    }

    /// Stops it the way SIGTERM would, and waits until it has.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let r = tokio::time::timeout(PATIENCE, task)
                .await
                .expect("scheduler did not stop in time");
            r.unwrap().unwrap();
        }
    }
}

impl Drop for Sched {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A fresh random incarnation.
pub fn incarnation() -> u64 {
    rand::random::<u64>() | 1
}

/// Registers `node_id` (endpoint derived from its name) and returns its incarnation.
pub async fn register(c: &mut Client, node_id: &str, capacity: u32) -> u64 {
    let inc = incarnation();
    register_with(c, node_id, capacity, inc, vec![]).await;
    inc
}

pub async fn register_with(
    c: &mut Client,
    node_id: &str,
    capacity: u32,
    incarnation: u64,
    roster: Vec<pb::SandboxRef>,
) -> pb::RegisterNodeResponse {
    c.register_node(pb::RegisterNodeRequest {
        node_id: node_id.into(),
        endpoint: format!("{node_id}.test:7000"),
        capacity,
        incarnation,
        roster,
        cached_layers: vec![],
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

pub fn sref(sandbox_id: &str, generation: u64) -> pb::SandboxRef {
    pb::SandboxRef {
        sandbox_id: sandbox_id.into(),
        generation,
    }
}

/// A plain Place for `team`.
pub fn place_req(team: &str) -> pb::PlaceRequest {
    pb::PlaceRequest {
        template_id: "base".into(),
        team_id: team.into(),
        ..Default::default()
    }
}

pub async fn place(c: &mut Client, team: &str) -> pb::Placement {
    c.place(place_req(team)).await.unwrap().into_inner()
}

/// Place + RecordAssignment: a RUNNING sandbox.
pub async fn running(c: &mut Client, team: &str) -> pb::Placement {
    let p = place(c, team).await;
    record(c, &p).await;
    p
}

/// RecordAssignment for a placement: its binding goes RUNNING.
pub async fn record(c: &mut Client, p: &pb::Placement) {
    c.record_assignment(pb::RecordAssignmentRequest {
        sandbox_id: p.sandbox_id.clone(),
        node_id: p.node_id.clone(),
        generation: p.generation,
    })
    .await
    .unwrap();
}

/// One heartbeat of `node_id` listing `roster`; the scheduler's answer.
pub async fn heartbeat(
    c: &Client,
    node_id: &str,
    incarnation: u64,
    roster: &[pb::SandboxRef],
) -> pb::HeartbeatResponse {
    c.clone()
        .heartbeat(pb::HeartbeatRequest {
            node_id: node_id.into(),
            incarnation,
            roster: roster.to_vec(),
            cached_layers: vec![],
            paused: Vec::new(),
            lists_paused: false,
        })
        .await
        .unwrap()
        .into_inner()
}

pub async fn event(
    c: &mut Client,
    node_id: &str,
    sandbox_id: &str,
    generation: u64,
    kind: pb::EventType,
) -> pb::EventResult {
    let mut r = c
        .report_sandbox_event(pb::ReportSandboxEventRequest {
            node_id: node_id.into(),
            events: vec![pb::SandboxEvent {
                sandbox_id: sandbox_id.into(),
                generation,
                r#type: kind as i32,
                paused_record: None,
                logs: Vec::new(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    r.results.remove(0)
}

pub async fn get(c: &mut Client, sandbox_id: &str) -> Result<pb::Binding, Status> {
    c.get_sandbox(pb::GetSandboxRequest {
        sandbox_id: sandbox_id.into(),
    })
    .await
    .map(|r| r.into_inner())
}

pub async fn lookup(c: &mut Client, sandbox_id: &str) -> Result<pb::Route, Status> {
    c.lookup_node(pb::LookupNodeRequest {
        sandbox_id: sandbox_id.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

/// Every binding, all pages.
pub async fn all_sandboxes(c: &mut Client) -> Vec<pb::Binding> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let r = c
            .list_sandboxes(pb::ListSandboxesRequest {
                page_token: token.clone(),
                page_size: 1000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        out.extend(r.sandboxes);
        if r.next_page_token.is_empty() {
            return out;
        }
        token = r.next_page_token;
    }
}

pub async fn nodes(c: &mut Client) -> Vec<pb::Node> {
    c.list_nodes(pb::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner()
        .nodes
}

/// Asserts a status code and that the message mentions `needle`.
pub fn assert_status<T: std::fmt::Debug>(r: Result<T, Status>, code: Code, needle: &str) -> Status {
    match r {
        Ok(v) => panic!("expected {code:?} ({needle}), got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "wrong code; message: {}", s.message());
            assert!(
                s.message().contains(needle),
                "message {:?} does not mention {needle:?}",
                s.message()
            );
            s
        }
    }
}

/// The `warren-reason` metadata of a status.
pub fn reason(s: &Status) -> Option<String> {
    s.metadata()
        .get(warren_proto::REASON_METADATA)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Polls `check` until it returns `Some`, failing after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next message of a watch stream.
pub async fn next_change(s: &mut tonic::Streaming<pb::BindingChange>) -> pb::BindingChange {
    tokio::time::timeout(PATIENCE, s.message())
        .await
        .expect("no watch message in time")
        .unwrap()
        .expect("watch stream ended")
}

pub async fn watch(c: &mut Client, from_revision: u64) -> tonic::Streaming<pb::BindingChange> {
    c.watch_bindings(pb::WatchBindingsRequest { from_revision })
        .await
        .unwrap()
        .into_inner()
}

/// Keeps a node alive with heartbeats until dropped.
pub struct Heartbeats(JoinHandle<()>);

impl Heartbeats {
    pub fn start(c: Client, node_id: &str, incarnation: u64) -> Heartbeats {
        Heartbeats::with_roster(c, node_id, incarnation, vec![])
    }

    pub fn with_roster(
        mut c: Client,
        node_id: &str,
        incarnation: u64,
        roster: Vec<pb::SandboxRef>,
    ) -> Heartbeats {
        let node_id = node_id.to_string();
        Heartbeats(tokio::spawn(async move {
            loop {
                let _ = c
                    .heartbeat(pb::HeartbeatRequest {
                        node_id: node_id.clone(),
                        incarnation,
                        roster: roster.clone(),
                        cached_layers: vec![],
                        paused: Vec::new(),
                        lists_paused: false,
                    })
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }))
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A blob digest made of `n`.
pub fn blob(n: u64) -> String {
    format!("sha256-{n:064x}")
}

/// The noted unused blobs, due after `grace_ms`.
pub async fn noted(c: &mut Client, grace_ms: u64) -> Vec<pb::UnusedBlob> {
    c.list_unused_blobs(pb::ListUnusedBlobsRequest {
        grace_ms,
        page_size: 1000,
        page_token: String::new(),
    })
    .await
    .unwrap()
    .into_inner()
    .blobs
}

/// The `warren-bound` metadata of a status (which bound a write would pass).
pub fn bound(s: &Status) -> Option<String> {
    s.metadata()
        .get(warren_proto::BOUND_METADATA)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The admin listener's `/metrics` text.
pub async fn scrape(admin: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(admin).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The value of the sample named exactly `series` (with its labels, as
/// exposed: `warren_scheduler_lookups_total{answer="view"}`); 0 when absent.
pub async fn metric(admin: SocketAddr, series: &str) -> f64 {
    scrape(admin)
        .await
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}
