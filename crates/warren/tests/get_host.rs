//! A sandbox's `get_host(port)` URL in `warren dev` as the README starts
//! it opens with curl and in a real browser (headless Chromium): a web
//! server in the sandbox on port 8080, reached at
//! `http://8080-<id>.localhost/` through the gateway's loopback port 80,
//! and, where port 80 cannot be had (here: the test holds it), at
//! `http://8080-<id>.localhost:<gateway port>/`, the domain the SDK is told
//! carrying the port.
//!
//! Binds loopback port 80 (it must be free: on a machine where other work
//! binds it, run this test alone). Needs root, the base template, curl and
//! chromium (.ci/run installs them).
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use std::time::Duration;
use warren_test_support::dev::Dev;
use warren_test_support::sdk::run_case;

const KEY: &str = "e2b_4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e";

/// The `export E2B_DOMAIN=...` warren dev printed.
fn exported_domain(dev: &Dev) -> String {
    dev.proc
        .lines()
        .iter()
        .find_map(|l| {
            l.trim()
                .strip_prefix("export E2B_DOMAIN=")
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("warren dev printed no E2B_DOMAIN: {:?}", dev.proc.lines()))
}

/// Starts a web server in a sandbox of `dev`; its `get_host(8080)` and
/// the marker it serves.
async fn web_server(dev: &Dev) -> (String, String) {
    let facts = run_case(
        &dev.gateway,
        "every_call.py",
        "web_server",
        KEY,
        &[("WARREN_OTHER_KEY", String::new())],
        Duration::from_secs(120),
    )
    .await;
    (
        facts["host"].as_str().expect("a host").to_string(),
        facts["marker"].as_str().expect("a marker").to_string(),
    )
}

/// `curl http://{host}/`: what it got.
async fn curl(host: &str) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-fsS", "--max-time", "20", &format!("http://{host}/")])
        .output()
        .await
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl http://{host}/ failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The page as headless Chromium renders it (its DOM).
async fn browser(host: &str) -> String {
    let profile = tempfile::tempdir().expect("a profile directory");
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                &format!("--user-data-dir={}", profile.path().display()),
                "--dump-dom",
                &format!("http://{host}/"),
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("chromium finishes within 90 s")
    .expect("chromium runs (apt-get install chromium)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_host_url_opens_with_curl_and_in_a_browser() {
    let bin = env!("CARGO_BIN_EXE_warren");
    let keys = [("WARREN_DEV_API_KEY", KEY)];
    let ports = ["--nodes", "1", "--sandbox-http", "auto"];

    // Port 80 taken (by this test): the URLs carry the gateway's port.
    let held = std::net::TcpListener::bind("127.0.0.1:80")
        .expect("loopback port 80 is free for this test (it needs root)");
    let dev = Dev::start_with(bin.as_ref(), &ports, &keys, "warren dev").await;
    let domain = exported_domain(&dev);
    let port = dev.gateway.rsplit(':').next().expect("a port").to_string();
    assert_eq!(domain, format!("localhost:{port}"));
    let (host, marker) = web_server(&dev).await;
    assert!(
        host.starts_with("8080-") && host.ends_with(&format!(".localhost:{port}")),
        "{host}"
    );
    assert!(curl(&host).await.contains(&marker));
    assert!(browser(&host).await.contains(&marker));
    drop(dev);
    drop(held);

    // Port 80 free: `http://8080-<id>.localhost/`, as on E2B.
    let dev = Dev::start_with(bin.as_ref(), &ports, &keys, "warren dev").await;
    assert_eq!(exported_domain(&dev), "localhost");
    let (host, marker) = web_server(&dev).await;
    assert!(
        host.starts_with("8080-") && host.ends_with(".localhost"),
        "{host}"
    );
    let page = curl(&host).await;
    assert!(page.contains(&marker), "{page}");
    let dom = browser(&host).await;
    assert!(dom.contains(&marker), "the browser showed: {dom}");
    // A killed sandbox's URL is E2B's 502 there too.
    let id = host
        .trim_start_matches("8080-")
        .trim_end_matches(".localhost")
        .to_string();
    let killed = warren_test_support::http::Http::default()
        .send(
            http::Method::DELETE,
            dev.gateway.trim_start_matches("http://"),
            &format!("/sandboxes/{id}"),
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect("the kill answers");
    assert_eq!(killed.status, http::StatusCode::NO_CONTENT);
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", &format!("http://{host}/")])
        .output()
        .await
        .expect("curl runs");
    let body: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("a JSON answer for a killed sandbox");
    assert_eq!(
        body,
        serde_json::json!({"message": "The sandbox was not found", "sandboxId": id, "code": 502})
    );
}
