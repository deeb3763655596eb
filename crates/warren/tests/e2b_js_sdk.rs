//! The unmodified JavaScript `e2b` SDK (npm `e2b`, pinned in
//! `tests/js/package.json` and installed by `scripts/setup-test-env`), run
//! with node against `warren dev` started as a user would, with the API key
//! it generated and printed: the SDK creates a sandbox, runs a command,
//! checks its stdout, writes and reads a file and kills it
//! (`tests/js/sdk.mjs`).
//!
//! Also: `warren dev` keeps taking a key in another format
//! (`WARREN_DEV_API_KEY`), and warns that versions of the JavaScript SDK
//! refuse it.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use std::time::Duration;
use warren_test_support::dev::Dev;
use warren_test_support::http::Http;
use warren_test_support::{e2b_js_dir, temp_dir, Launch};

/// The key `warren dev` printed in its `export E2B_API_KEY=` line.
fn printed_key(lines: &[String]) -> String {
    lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("export E2B_API_KEY="))
        .unwrap_or_else(|| panic!("warren dev printed no E2B_API_KEY export: {lines:?}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_js_sdk_runs_a_command_against_warren_dev_with_its_generated_key() {
    let js = e2b_js_dir();
    assert!(
        js.join("node_modules/e2b/package.json").exists(),
        "no JavaScript e2b SDK in {} — run scripts/setup-test-env (or set WARREN_E2B_JS_DIR)",
        js.join("node_modules").display()
    );
    let mut dev = Dev::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &["--nodes", "1"],
        "the whole cluster on this machine",
    )
    .await;
    let gateway = dev.gateway.clone();
    let key = printed_key(&dev.proc.lines());
    assert!(
        warren_core::id::is_e2b_api_key(&key),
        "warren dev generates keys in E2B's format (e2b_ + 40 hex digits): {key}"
    );

    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new("node")
            .arg(js.join("sdk.mjs"))
            .current_dir(&js)
            .env("E2B_API_URL", &gateway)
            .env("E2B_SANDBOX_URL", &gateway)
            .env("E2B_API_KEY", &key)
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_ACCESS_TOKEN")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the JavaScript SDK checks finish within 5 minutes")
    .expect("node runs (install nodejs: see .ci/run)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the JavaScript SDK checks failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let result: serde_json::Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("sdk.mjs printed no RESULT:\n{stdout}\n{stderr}"));
    let id = result["sandbox"].as_str().expect("sandbox id");
    assert_eq!(
        result["stdout"].as_str(),
        Some(format!("hello from {id}\nuser\n").as_str()),
        "the command's stdout, as the SDK returned it"
    );
    assert_eq!(
        dev.proc.terminate(Duration::from_secs(30)).await.code,
        Some(0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warren_dev_takes_a_key_in_another_format_and_warns() {
    let data = temp_dir();
    let log = data.path().join("dev.log");
    let key = "my-own-key";
    let mut dev = Launch::new(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &[
            "dev",
            "--data-dir",
            data.path().join("dev").to_str().expect("utf-8 temp path"),
            "--listen",
            "127.0.0.1:0",
            "--nodes",
            "1",
            "--runtime",
            "process",
            "--sandbox-http",
            "off",
        ],
    )
    .env("WARREN_DEV_API_KEY", key)
    .label("warren dev")
    .log_to(&log)
    .wait_for(&["dev gateway-1"])
    .spawn()
    .await
    .expect("warren dev starts with a key in another format");
    assert_eq!(printed_key(&dev.lines()), key);
    let stderr = std::fs::read_to_string(&log).expect("warren dev's log");
    assert!(
        stderr.contains("not in E2B's format") && stderr.contains("JavaScript"),
        "warns that the JavaScript SDK refuses the key:\n{stderr}"
    );
    let gateway = dev.addr("dev gateway-1");
    let http = Http::new(Duration::from_secs(10));
    let answer = http
        .send(
            http::Method::GET,
            &gateway,
            "/v2/sandboxes",
            &[("X-API-Key", key)],
            None,
        )
        .await
        .expect("the gateway answers");
    assert_eq!(
        answer.status,
        http::StatusCode::OK,
        "the gateway takes the key: {}",
        answer.text()
    );
    assert_eq!(dev.terminate(Duration::from_secs(30)).await.code, Some(0));
}
