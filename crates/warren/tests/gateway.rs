//! `warren gateway` against real processes: a scheduler, `--runtime process`
//! nodes and a gateway, all on 127.0.0.1:0, driven with plain HTTP, the
//! envd Connect client — what an e2b SDK user does. (WebSockets:
//! `websockets.rs`.)
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::time::Duration;
use warren_envd_proto::process::{
    process_event, ProcessClient, ProcessConfig, StartRequest, StartResponse,
};
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::{Answer, Http};
use warren_test_support::wait_until;

const KEY_A: &str = "key-team-a";
const KEY_B: &str = "key-team-b";
const ENVD: u16 = 49983;

fn bin() -> &'static std::path::Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// A scheduler, `nodes` nodes and one gateway.
async fn cluster(nodes: usize) -> Cluster {
    cluster_with(nodes, &[]).await
}

/// A cluster whose scheduler gets `scheduler_args` too. The gateway is given
/// a dead scheduler replica first: every test also checks that it fails over
/// to the live one.
async fn cluster_with(nodes: usize, scheduler_args: &[&str]) -> Cluster {
    let strings = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
    let spec = Spec {
        nodes,
        gateways: 1,
        keys: vec![
            (KEY_A.into(), "team-a".into()),
            (KEY_B.into(), "team-b".into()),
        ],
        scheduler_args: strings(scheduler_args),
        gateway_args: strings(&["--connect-timeout", "1s", "--drain-timeout", "10s"]),
        dead_scheduler_first: true,
        ..Spec::default()
    };
    Cluster::start(bin(), spec).await.expect("cluster starts")
}

/// One request on a fresh client, answered within 30 s.
async fn http(
    addr: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    Http::new(Duration::from_secs(30))
        .send(method, addr, path, headers, body)
        .await
        .expect("http request")
}

/// Control-plane call with team A's key.
async fn api(c: &Cluster, method: Method, path: &str, body: Option<Value>) -> Answer {
    http(&c.gateway(0), method, path, &[("x-api-key", KEY_A)], body).await
}

/// Creates a sandbox for team A, waiting for the nodes to have registered.
async fn create(c: &Cluster, body: Value, extra: &[(&str, &str)]) -> Value {
    let mut headers = vec![("x-api-key", KEY_A)];
    headers.extend_from_slice(extra);
    wait_until("a sandbox to be created", Duration::from_secs(30), || {
        let (headers, body) = (headers.clone(), body.clone());
        async move {
            let r = http(
                &c.gateway(0),
                Method::POST,
                "/v2/sandboxes",
                &headers,
                Some(body),
            )
            .await;
            match r.status {
                StatusCode::CREATED => Some(r.expect_json()),
                // No node registered yet.
                StatusCode::SERVICE_UNAVAILABLE => None,
                other => panic!(
                    "create answered {other}: {}",
                    String::from_utf8_lossy(&r.body)
                ),
            }
        }
    })
    .await
}

/// `GET /health` of envd through the data plane, by E2B headers.
async fn envd_health(c: &Cluster, id: &str, extra: &[(&str, &str)]) -> Answer {
    let port = ENVD.to_string();
    let mut headers = vec![("e2b-sandbox-id", id), ("e2b-sandbox-port", port.as_str())];
    headers.extend_from_slice(extra);
    http(&c.gateway(0), Method::GET, "/health", &headers, None).await
}

/// An envd process client through the gateway, routed by `headers`.
fn process_client(
    c: &Cluster,
    headers: &[(&str, &str)],
) -> ProcessClient<connectrpc::client::HttpClient> {
    let uri: http::Uri = format!("http://{}", c.gateway(0)).parse().expect("uri");
    let mut config = connectrpc::client::ClientConfig::new(uri);
    for (k, v) in headers {
        config = config.with_default_header(k.to_string(), v.to_string());
    }
    ProcessClient::new(connectrpc::client::HttpClient::plaintext(), config)
}

fn sh(command: &str) -> StartRequest {
    StartRequest {
        process: ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), command.into()],
            ..Default::default()
        }
        .into(),
        stdin: Some(false),
        ..Default::default()
    }
}

/// Runs `command` through the gateway; returns (stdout, exit code, data events).
async fn run(
    client: &ProcessClient<connectrpc::client::HttpClient>,
    command: &str,
) -> (String, i32, usize) {
    let mut stream = client
        .start(sh(command))
        .await
        .expect("process.Start through the gateway");
    let (mut out, mut code, mut events) = (Vec::new(), -1, 0);
    while let Some(msg) = stream
        .message::<StartResponse>()
        .await
        .expect("stream message")
    {
        match msg
            .to_owned_message()
            .event
            .into_option()
            .and_then(|e| e.event)
        {
            Some(process_event::Event::Data(d)) => {
                events += 1;
                if let Some(process_event::data_event::Output::Stdout(b)) = d.output {
                    out.extend_from_slice(&b);
                }
            }
            Some(process_event::Event::End(end)) => code = end.exit_code,
            _ => {}
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), code, events)
}

/// The value of an unlabelled counter in Prometheus text.
async fn metric(admin: &str, name: &str) -> f64 {
    let r = http(admin, Method::GET, "/metrics", &[], None).await;
    let text = String::from_utf8_lossy(&r.body).into_owned();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sum of the scheduler's per-RPC request counters for these RPCs.
async fn scheduler_rpcs(c: &Cluster, rpcs: &[&str]) -> f64 {
    let r = http(
        &c.scheduler.addr("scheduler admin"),
        Method::GET,
        "/metrics",
        &[],
        None,
    )
    .await;
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with("warren_scheduler_rpc_requests_total"))
        .filter(|l| rpcs.iter().any(|rpc| l.contains(&format!("\"{rpc}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_lifecycle_through_both_planes() {
    let c = cluster(1).await;
    let sb = create(
        &c,
        json!({"templateID": "base", "timeout": 120, "metadata": {"purpose": "lifecycle"}, "envVars": {"GREETING": "hi"}}),
        &[],
    )
    .await;
    let id = sb["sandboxID"].as_str().expect("sandboxID").to_string();
    let token = sb["envdAccessToken"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(sb["templateID"], "base");
    assert_eq!(sb["domain"], "localhost");
    assert!(
        sb["clientID"].is_string() && sb["envdVersion"].is_string(),
        "{sb}"
    );

    // Control plane: get, list v1 and v2 (with a metadata filter the way the SDK encodes it).
    let got = api(&c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(got.status, StatusCode::OK);
    let got = got.expect_json();
    assert_eq!(got["state"], "running");
    assert_eq!(got["metadata"]["purpose"], "lifecycle");
    for field in [
        "startedAt",
        "endAt",
        "envdVersion",
        "cpuCount",
        "memoryMB",
        "diskSizeMB",
    ] {
        assert!(
            !got[field].is_null(),
            "GET /sandboxes/{{id}} lacks {field}: {got}"
        );
    }
    let v1 = api(&c, Method::GET, "/sandboxes", None).await.expect_json();
    assert!(
        v1.as_array()
            .expect("array")
            .iter()
            .any(|s| s["sandboxID"] == id.as_str()),
        "{v1}"
    );
    let v2 = api(
        &c,
        Method::GET,
        "/v2/sandboxes?state=running&metadata=purpose%3Dlifecycle&limit=10",
        None,
    )
    .await;
    assert_eq!(v2.status, StatusCode::OK);
    assert!(v2
        .expect_json()
        .as_array()
        .expect("array")
        .iter()
        .any(|s| s["sandboxID"] == id.as_str()));
    let none = api(
        &c,
        Method::GET,
        "/v2/sandboxes?metadata=purpose%3Dother",
        None,
    )
    .await
    .expect_json();
    assert_eq!(none, json!([]), "metadata filter excludes");

    // Data plane by E2B headers and by host name reaches envd.
    assert_eq!(
        envd_health(&c, &id, &[]).await.status,
        StatusCode::NO_CONTENT
    );
    let host = format!("{ENVD}-{id}.localhost");
    let by_host = http(
        &c.gateway(0),
        Method::GET,
        "/health",
        &[("host", &host)],
        None,
    )
    .await;
    assert_eq!(by_host.status, StatusCode::NO_CONTENT);
    // A client-sent X-Warren-Generation (or id) is stripped: routing is unchanged.
    let spoofed = envd_health(
        &c,
        &id,
        &[
            ("x-warren-generation", "999"),
            ("x-warren-sandbox-id", "zzz"),
        ],
    )
    .await;
    assert_eq!(spoofed.status, StatusCode::NO_CONTENT);

    // A Connect server stream through the proxy, routed by headers and by host.
    let port = ENVD.to_string();
    let by_headers = process_client(
        &c,
        &[
            ("e2b-sandbox-id", &id),
            ("e2b-sandbox-port", &port),
            ("x-access-token", &token),
        ],
    );
    let (out, code, _) = run(&by_headers, "echo $GREETING").await;
    assert_eq!(
        (out.as_str(), code),
        ("hi\n", 0),
        "envVars reach the sandbox"
    );
    // The stream is not buffered: "first" arrives while the process still
    // waits for a file that only a second request (after reading "first")
    // creates. A buffering proxy would hang here (the timeout guards that).
    let mut stream = by_headers
        .start(sh(
            "echo first; while [ ! -f go ]; do sleep 0.05; done; echo second",
        ))
        .await
        .expect("start");
    let mut seen = String::new();
    while !seen.contains("first") {
        let msg = tokio::time::timeout(Duration::from_secs(20), stream.message::<StartResponse>())
            .await
            .expect("the first line streams through before the process ends")
            .expect("stream")
            .expect("a message");
        if let Some(process_event::Event::Data(d)) = msg
            .to_owned_message()
            .event
            .into_option()
            .and_then(|e| e.event)
        {
            if let Some(process_event::data_event::Output::Stdout(b)) = d.output {
                seen.push_str(&String::from_utf8_lossy(&b));
            }
        }
    }
    assert_eq!(run(&by_headers, "touch go").await.1, 0);
    while let Some(msg) = stream.message::<StartResponse>().await.expect("stream") {
        if let Some(process_event::Event::Data(d)) = msg
            .to_owned_message()
            .event
            .into_option()
            .and_then(|e| e.event)
        {
            if let Some(process_event::data_event::Output::Stdout(b)) = d.output {
                seen.push_str(&String::from_utf8_lossy(&b));
            }
        }
    }
    assert_eq!(seen, "first\nsecond\n");
    // h2c (HTTP/2 prior knowledge) on the same listener.
    let uri: http::Uri = format!("http://{}", c.gateway(0)).parse().expect("uri");
    let h2 = ProcessClient::new(
        connectrpc::client::HttpClient::plaintext_http2_only(),
        connectrpc::client::ClientConfig::new(uri)
            .with_default_header("e2b-sandbox-id", id.clone())
            .with_default_header("e2b-sandbox-port", port.clone())
            .with_default_header("x-access-token", token.clone()),
    );
    let (out, code, _) = run(&h2, "echo over-h2c").await;
    assert_eq!((out.as_str(), code), ("over-h2c\n", 0));
    let by_host = process_client(&c, &[("host", &host), ("x-access-token", &token)]);
    let (out, code, _) = run(&by_host, "echo via-host").await;
    assert_eq!((out.as_str(), code), ("via-host\n", 0));

    // Timeout, then connect (v2) which only ever extends it.
    let before = got["endAt"].as_str().expect("endAt").to_string();
    let t = api(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/timeout"),
        Some(json!({"timeout": 600})),
    )
    .await;
    assert_eq!(
        t.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&t.body)
    );
    let after = api(&c, Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .expect_json();
    assert!(
        after["endAt"].as_str().expect("endAt") > before.as_str(),
        "{before} -> {after}"
    );
    let conn = api(
        &c,
        Method::POST,
        &format!("/v2/sandboxes/{id}/connect"),
        Some(json!({"timeout": 10})),
    )
    .await;
    assert_eq!(conn.status, StatusCode::OK);
    assert_eq!(conn.expect_json()["sandboxID"], id.as_str());
    assert_eq!(conn.expect_json()["envdAccessToken"], sb["envdAccessToken"]);
    let still = api(&c, Method::GET, &format!("/sandboxes/{id}"), None)
        .await
        .expect_json();
    assert_eq!(
        still["endAt"], after["endAt"],
        "connect did not shorten the timeout"
    );
    let v1_connect = api(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/connect"),
        Some(json!({})),
    )
    .await;
    assert_eq!(
        v1_connect.status,
        StatusCode::BAD_REQUEST,
        "v1 connect needs a timeout"
    );
    assert!(v1_connect.message().contains("timeout"));

    // Kill; then 404 on the control plane and E2B's 502 "The sandbox was
    // not found" on the data plane (what the SDKs read as "gone").
    let del = api(&c, Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(
        del.status,
        StatusCode::NO_CONTENT,
        "{}",
        String::from_utf8_lossy(&del.body)
    );
    let gone = api(&c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.message(), format!("sandbox {id} not found"));
    let gone = envd_health(&c, &id, &[]).await;
    assert_eq!(gone.status, StatusCode::BAD_GATEWAY);
    // Exactly E2B's proxy's answer: clients compare the message.
    assert_eq!(
        gone.expect_json(),
        serde_json::json!({"message": "The sandbox was not found", "sandboxId": id, "code": 502})
    );
    let again = api(&c, Method::DELETE, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(
        again.status,
        StatusCode::NOT_FOUND,
        "a second kill is 404 (the SDK's kill() -> False)"
    );
    let listed = api(&c, Method::GET, "/v2/sandboxes", None)
        .await
        .expect_json();
    assert!(!listed
        .as_array()
        .expect("array")
        .iter()
        .any(|s| s["sandboxID"] == id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_create_and_fork() {
    let c = cluster(1).await;
    let body = json!({"templateID": "base", "timeout": 60});
    let first = create(&c, body.clone(), &[("idempotency-key", "retry-me")]).await;
    let second = create(&c, body.clone(), &[("idempotency-key", "retry-me")]).await;
    assert_eq!(
        first["sandboxID"], second["sandboxID"],
        "a retried create is the same sandbox"
    );
    let other = create(&c, body, &[("idempotency-key", "another")]).await;
    assert_ne!(first["sandboxID"], other["sandboxID"]);
    let listed = api(&c, Method::GET, "/v2/sandboxes", None)
        .await
        .expect_json();
    assert_eq!(listed.as_array().expect("array").len(), 2, "{listed}");

    // Fork: a child on the same node, reachable through the data plane.
    let parent = first["sandboxID"].as_str().expect("id");
    let forked = api(
        &c,
        Method::POST,
        &format!("/sandboxes/{parent}/fork"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(
        forked.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&forked.body)
    );
    let results = forked.expect_json();
    let child = &results[0]["sandbox"];
    let child_id = child["sandboxID"]
        .as_str()
        .unwrap_or_else(|| panic!("fork failed: {results}"));
    assert_ne!(child_id, parent);
    assert_eq!(
        child["clientID"], first["clientID"],
        "forks stay on the parent's node"
    );
    assert_eq!(
        envd_health(&c, child_id, &[]).await.status,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teams_keys_and_malformed_input() {
    let c = cluster(1).await;
    let sb = create(&c, json!({"templateID": "base"}), &[]).await;
    let id = sb["sandboxID"].as_str().expect("id").to_string();
    let as_b = |method: Method, path: String, body: Option<Value>| {
        let gw = c.gateway(0);
        async move { http(&gw, method, &path, &[("x-api-key", KEY_B)], body).await }
    };

    // Team B cannot see, read, change or kill team A's sandbox: 404, not 403.
    let listed = as_b(Method::GET, "/v2/sandboxes".into(), None)
        .await
        .expect_json();
    assert_eq!(listed, json!([]));
    let listed = as_b(Method::GET, "/sandboxes".into(), None)
        .await
        .expect_json();
    assert_eq!(listed, json!([]));
    for (method, path, body) in [
        (Method::GET, format!("/sandboxes/{id}"), None),
        (Method::DELETE, format!("/sandboxes/{id}"), None),
        (
            Method::POST,
            format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 1})),
        ),
        (
            Method::POST,
            format!("/v2/sandboxes/{id}/connect"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{id}/fork"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/sandboxes/{id}/pause"),
            Some(json!({})),
        ),
    ] {
        let r = as_b(method.clone(), path.clone(), body).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(r.message(), format!("sandbox {id} not found"));
    }
    assert_eq!(
        envd_health(&c, &id, &[]).await.status,
        StatusCode::NO_CONTENT,
        "still alive"
    );

    // Missing or unknown API key: 401 JSON.
    for headers in [vec![], vec![("x-api-key", "nope")]] {
        let r = http(&c.gateway(0), Method::GET, "/v2/sandboxes", &headers, None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.expect_json()["code"], 401);
    }

    // Malformed ids: 400 on both planes, and the scheduler is never asked.
    // (A well-formed unknown id first: it is always asked, as NotFound is
    // never cached, while the sandbox above routes from the cache.)
    let r = envd_health(&c, "nosuchsandbox0", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        r.expect_json(),
        serde_json::json!({"message": "The sandbox was not found", "sandboxId": "nosuchsandbox0", "code": 502})
    );
    let admin = c.gateways[0].addr("gateway admin");
    let lookups = metric(&admin, "warren_gateway_scheduler_lookups_total").await;
    let sched_before = scheduler_rpcs(&c, &["LookupNode", "GetSandbox"]).await;
    assert!(
        lookups > 0.0,
        "the lookup counter counts (the unknown id above)"
    );
    assert!(
        sched_before > 0.0,
        "the scheduler counts GetSandbox/LookupNode calls"
    );
    let r = api(&c, Method::GET, "/sandboxes/NOT_an-id", None).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.message().starts_with("invalid sandbox id"),
        "{}",
        r.message()
    );
    let r = envd_health(&c, "bad.id", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.message().starts_with("invalid sandbox id"),
        "{}",
        r.message()
    );
    let r = http(
        &c.gateway(0),
        Method::GET,
        "/health",
        &[("e2b-sandbox-id", &id), ("e2b-sandbox-port", "70000")],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.message().starts_with("invalid port"), "{}", r.message());
    let r = http(
        &c.gateway(0),
        Method::GET,
        "/health",
        &[("host", "49983-UPPER_case.localhost")],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        metric(&admin, "warren_gateway_scheduler_lookups_total").await,
        lookups
    );
    assert_eq!(
        scheduler_rpcs(&c, &["LookupNode", "GetSandbox"]).await,
        sched_before
    );

    // Bad bodies name the field; unknown routes and wrong methods are JSON too.
    let r = api(
        &c,
        Method::POST,
        "/v2/sandboxes",
        Some(json!({"timeout": 5})),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.message().contains("templateID"), "{}", r.message());
    let r = api(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/timeout"),
        Some(json!({"timeout": "soon"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.message().contains("timeout"), "{}", r.message());
    let r = api(&c, Method::GET, "/no/such/thing", None).await;
    assert_eq!(
        (r.status, r.expect_json()["code"].as_u64()),
        (StatusCode::NOT_FOUND, Some(404))
    );
    let r = api(&c, Method::PUT, "/v2/sandboxes", None).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(r.headers.get("allow").is_some());
    // The process runtime cannot freeze a sandbox: a 501 naming why, and
    // the sandbox stays running.
    let r = api(&c, Method::POST, &format!("/sandboxes/{id}/pause"), None).await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    assert!(
        r.message().contains("process runtime cannot pause"),
        "{}",
        r.message()
    );
    assert_eq!(r.expect_json()["code"], 501);
    // Nor filesystem-only (it keeps no disk to boot again from).
    let r = api(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/pause"),
        Some(json!({"memory": false})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_IMPLEMENTED);
    assert!(
        r.message()
            .contains("cannot pause a sandbox filesystem-only"),
        "{}",
        r.message()
    );
    let r = api(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/pause"),
        Some(json!({"memory": "no"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.message().contains("memory"), "{}", r.message());
    let r = api(&c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(r.expect_json()["state"], "running");
    let r = api(&c, Method::POST, &format!("/sandboxes/{id}/resume"), None).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "resuming a running sandbox");
}

/// E2B's lifecycle options at create: shown by GET, bad ones a 400
/// naming the field (nothing created), and on the `process` runtime (which
/// cannot freeze) an `autoPause` sandbox is killed at its end, as without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_options_and_auto_pause_on_the_process_runtime() {
    let c = cluster(1).await;
    let plain = create(&c, json!({"templateID": "base", "timeout": 300}), &[]).await;
    let id = plain["sandboxID"].as_str().unwrap_or_default().to_string();
    let r = api(&c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(
        r.expect_json()["lifecycle"],
        json!({"autoResume": false, "onTimeout": "kill"})
    );
    for (body, status, needle) in [
        (
            json!({"templateID": "base", "autoPause": true, "autoPauseMemory": false,
                   "autoResume": {"enabled": true}}),
            StatusCode::BAD_REQUEST,
            "autoPauseMemory",
        ),
        (
            json!({"templateID": "base", "autoResume": true}),
            StatusCode::BAD_REQUEST,
            "autoResume",
        ),
        (
            json!({"templateID": "base", "autoResume": {"enabled": "yes"}}),
            StatusCode::BAD_REQUEST,
            "autoResume.enabled",
        ),
        (
            json!({"templateID": "base", "autoPause": 1}),
            StatusCode::BAD_REQUEST,
            "autoPause",
        ),
    ] {
        let r = api(&c, Method::POST, "/v2/sandboxes", Some(body.clone())).await;
        assert_eq!(r.status, status, "{body}");
        assert!(r.message().contains(needle), "{body}: {}", r.message());
    }
    let r = api(&c, Method::GET, "/v2/sandboxes?state=running,paused", None).await;
    assert_eq!(
        r.expect_json().as_array().map(Vec::len),
        Some(1),
        "nothing else created"
    );

    let auto = create(
        &c,
        json!({"templateID": "base", "timeout": 300, "autoPause": true,
               "autoResume": {"enabled": true}}),
        &[],
    )
    .await;
    let id = auto["sandboxID"].as_str().unwrap_or_default().to_string();
    let r = api(&c, Method::GET, &format!("/sandboxes/{id}"), None).await;
    assert_eq!(
        r.expect_json()["lifecycle"],
        json!({"autoResume": true, "onTimeout": "pause"})
    );
    let r = api(
        &c,
        Method::POST,
        &format!("/sandboxes/{id}/timeout"),
        Some(json!({"timeout": 1})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    // The process runtime cannot freeze it: its node kills it at its end.
    wait_until(
        "the auto-pause sandbox to be killed at its end",
        Duration::from_secs(30),
        || {
            let (c, id) = (&c, id.clone());
            async move {
                let r = api(c, Method::GET, &format!("/sandboxes/{id}"), None).await;
                (r.status == StatusCode::NOT_FOUND).then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_down_is_a_fast_502_then_node_down() {
    let mut c = cluster_with(1, &["--lease", "1s"]).await;
    let sb = create(&c, json!({"templateID": "base"}), &[]).await;
    let id = sb["sandboxID"].as_str().expect("id").to_string();
    assert_eq!(
        envd_health(&c, &id, &[]).await.status,
        StatusCode::NO_CONTENT
    );
    c.kill_node(1).await;
    // The scheduler still believes in the node (its lease has not run out),
    // so this is the gateway failing to connect. Bounded by the connect
    // timeout: the 30 s inside `http` only guards against a hang.
    let r = envd_health(&c, &id, &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        r.message(),
        "Failed to reach sandbox (upstream connection error)"
    );
    assert_eq!(r.expect_json()["error_code"], "upstream_unreachable");

    // Once the lease runs out the scheduler marks the binding lost, and the
    // answer says so, with its own stable code.
    let down = wait_until(
        "the binding to be marked lost",
        Duration::from_secs(20),
        || {
            let c = &c;
            let id = id.clone();
            async move {
                let r = envd_health(c, &id, &[]).await;
                (r.expect_json()["error_code"] == "node_down").then_some(r)
            }
        },
    )
    .await;
    assert_eq!(down.status, StatusCode::BAD_GATEWAY);
    assert_eq!(
        down.message(),
        format!("sandbox {id} is on a node that is down")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests() {
    let mut c = cluster(1).await;
    let sb = create(&c, json!({"templateID": "base"}), &[]).await;
    let id = sb["sandboxID"].as_str().expect("id").to_string();
    let token = sb["envdAccessToken"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let port = ENVD.to_string();
    let envd = process_client(
        &c,
        &[
            ("e2b-sandbox-id", &id),
            ("e2b-sandbox-port", &port),
            ("x-access-token", &token),
        ],
    );
    let admin = c.gateways[0].addr("gateway admin");
    assert_eq!(
        http(&admin, Method::GET, "/readyz", &[], None).await.status,
        StatusCode::OK
    );

    // A command that outlives the SIGTERM; the stream is in flight.
    let mut stream = envd
        .start(sh("echo started; sleep 2; echo finished"))
        .await
        .expect("start");
    let first = stream
        .message::<StartResponse>()
        .await
        .expect("stream")
        .expect("first event");
    drop(first);
    c.gateways[0].signal(nix::sys::signal::Signal::SIGTERM);

    // Readiness turns false and new connections are refused while the
    // in-flight stream is still running.
    wait_until("readiness to turn false", Duration::from_secs(5), || {
        let admin = admin.clone();
        async move {
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let req = http::Request::get(format!("http://{admin}/readyz"))
                .body(Full::new(Bytes::new()))
                .ok()?;
            let r = client.request(req).await.ok()?;
            (r.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(())
        }
    })
    .await;
    wait_until("the listener to close", Duration::from_secs(5), || {
        let gw = c.gateway(0);
        async move {
            tokio::net::TcpStream::connect(&gw)
                .await
                .is_err()
                .then_some(())
        }
    })
    .await;

    let mut out = Vec::new();
    let mut code = None;
    while let Some(msg) = stream
        .message::<StartResponse>()
        .await
        .expect("the stream survives the SIGTERM")
    {
        match msg
            .to_owned_message()
            .event
            .into_option()
            .and_then(|e| e.event)
        {
            Some(process_event::Event::Data(d)) => {
                if let Some(process_event::data_event::Output::Stdout(b)) = d.output {
                    out.extend_from_slice(&b);
                }
            }
            Some(process_event::Event::End(end)) => code = Some(end.exit_code),
            _ => {}
        }
    }
    assert!(
        String::from_utf8_lossy(&out).contains("finished"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(code, Some(0));
    assert_eq!(
        c.gateways[0].terminate(Duration::from_secs(15)).await.code,
        Some(0),
        "gateway exits 0 after draining"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_configuration_exits_64_before_binding() {
    // Keys come from the environment (or a file), never the command line.
    for (args, keys, says) in [
        (
            vec!["gateway", "--listen", "127.0.0.1:0"],
            "",
            "no API keys",
        ),
        (vec!["gateway"], "nocolon", "KEY:TEAM"),
        (
            vec!["gateway", "--scheduler", "ftp://x"],
            "k:t",
            "--scheduler",
        ),
        (vec!["gateway", "--connect-timeout", "soon"], "k:t", "soon"),
        (
            vec!["gateway", "--route-cache-ttl", "0s"],
            "k:t",
            "--route-cache-ttl must be greater than zero",
        ),
        (
            vec!["gateway", "--route-cache-watch", "maybe"],
            "k:t",
            "--route-cache-watch",
        ),
        (
            vec!["gateway", "--api-key", "k:t"],
            "",
            "--api-key on the command line",
        ),
    ] {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args(&args).env_remove("WARREN_GATEWAY_API_KEY");
        if !keys.is_empty() {
            cmd.env("WARREN_GATEWAY_API_KEY", keys);
        }
        let out = cmd.output().await.expect("run warren gateway");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("listening"),
            "nothing was bound"
        );
    }
}
