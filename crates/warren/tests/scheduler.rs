//! `warren scheduler` as a real process: it announces its listeners, answers
//! gRPC and the admin endpoints, refuses bad configuration with exit code 64,
//! and exits 0 on SIGTERM.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::time::Duration;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::scheduler_client::SchedulerClient;
use warren_test_support::{temp_dir, wait_until};

fn warren() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_warren"))
}

/// A minimal HTTP/1.1 GET: (status code, body).
async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|x| x.1.to_string())?;
    Some((status, body))
}

#[tokio::test]
async fn scheduler_serves_grpc_and_admin_and_stops_on_sigterm() {
    let dir = temp_dir();
    let data = dir.path().join("sched");
    let data = data.to_str().unwrap();
    let mut p = warren_test_support::spawn(
        warren(),
        &[
            "scheduler",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--insecure-internal",
            "--data-dir",
            data,
        ],
        &[],
        &["scheduler grpc", "scheduler admin"],
    )
    .await
    .unwrap();
    let grpc = p.addr("scheduler grpc");
    let admin = p.addr("scheduler admin");

    let admin_for_wait = admin.clone();
    wait_until("/readyz to answer 200", Duration::from_secs(20), || {
        let admin = admin_for_wait.clone();
        async move {
            http_get(&admin, "/readyz")
                .await
                .filter(|(code, _)| *code == 200)
        }
    })
    .await;
    let (code, _) = http_get(&admin, "/healthz").await.unwrap();
    assert_eq!(code, 200);

    let mut client = SchedulerClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    client
        .register_node(pb::RegisterNodeRequest {
            node_id: "node-1".into(),
            endpoint: "127.0.0.1:9".into(),
            capacity: 4,
            incarnation: 42,
            roster: vec![],
            cached_layers: vec![],
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes = client
        .list_nodes(pb::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner()
        .nodes;
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].node_id, "node-1");
    assert!(Path::new(data).join("scheduler.db").exists());

    let (code, metrics) = http_get(&admin, "/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("warren_scheduler_rpc_requests_total{rpc=\"RegisterNode\",code=\"OK\"} 1"),
        "{metrics}"
    );

    assert_eq!(p.terminate(Duration::from_secs(15)).await.code, Some(0));
}

/// Runs `warren scheduler ARGS` to completion: (exit code, stderr).
fn run_scheduler(args: &[&str], data: &Path) -> (Option<i32>, String) {
    run_scheduler_env(args, data, &[])
}

fn run_scheduler_env(args: &[&str], data: &Path, envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = std::process::Command::new(warren())
        .envs(envs.iter().copied())
        .arg("scheduler")
        .args([
            "--listen",
            "127.0.0.1:0",
            "--insecure-internal",
            "--data-dir",
        ])
        .arg(data)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_configuration_exits_64_naming_the_flag() {
    let dir = temp_dir();
    let cases: &[(&[&str], &str)] = &[
        (&["--lease", "soon"], "--lease"),
        (
            &["--lease", "2s", "--heartbeat-interval", "5s"],
            "--heartbeat-interval",
        ),
        (&["--listen", "not-an-address"], "--listen"),
        (&["--watch-retention", "0"], "--watch-retention"),
        (
            &["--database-url", "postgres://warren:pw@db:notaport/warren"],
            "--database-url",
        ),
        (
            &["--database-url", "mysql://db/warren"],
            "unsupported scheme",
        ),
        (&["--database-pool-size", "0"], "--database-pool-size"),
        // Replicas must share a store key: PostgreSQL without one is refused.
        (
            &["--database-url", "postgres://warren@127.0.0.1:1/warren"],
            "--store-key-file is required",
        ),
        (
            &["--store-key-file", "/nonexistent/store.key"],
            "/nonexistent/store.key",
        ),
    ];
    for (args, needle) in cases {
        let (code, stderr) = run_scheduler(args, dir.path());
        assert_eq!(code, Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    // A store key other accounts could read is refused, naming the fix.
    let wide = dir.path().join("wide.key");
    std::fs::write(&wide, format!("{}\n", "ab".repeat(32))).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let (code, stderr) = run_scheduler(&["--store-key-file", wide.to_str().unwrap()], dir.path());
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("wide.key") && stderr.contains("chmod 600"),
        "{stderr}"
    );
    // The same checks apply to the environment and the TOML file.
    let (code, stderr) = run_scheduler_env(&[], dir.path(), &[("WARREN_SCHEDULER_LEASE", "soon")]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--lease"), "{stderr}");
    let toml = dir.path().join("scheduler.toml");
    std::fs::write(&toml, "sweep-interval = \"1ms\"\n").unwrap();
    let (code, stderr) = run_scheduler(&["--config", toml.to_str().unwrap()], dir.path());
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--sweep-interval"), "{stderr}");
    // A data directory that cannot exist (under a regular file).
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let (code, stderr) = run_scheduler(
        &["--data-dir", file.join("sub").to_str().unwrap()],
        dir.path(),
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("--data-dir"), "{stderr}");
    // Nothing was created for a refused configuration.
    assert!(!dir.path().join("scheduler.db").exists());
}
