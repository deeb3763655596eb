//! The unmodified `e2b` Python SDK (pinned in `scripts/setup-test-env`) against
//! `warren dev`, started exactly as the README tells a new user to.
//!
//! The checks themselves live in `tests/e2b/test_sdk.py`; this test starts the
//! cluster, runs the script with the exports `warren dev` prints, and fails with
//! the script's report if any check failed.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use std::time::Duration;
use warren_test_support::dev::Dev;
use warren_test_support::{e2b_python, workspace_root};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_python_sdk_end_to_end_against_warren_dev() {
    let python = e2b_python();
    assert!(
        python.exists(),
        "no Python with the e2b SDK at {} — run scripts/setup-test-env (or set WARREN_E2B_PYTHON)",
        python.display()
    );
    // In E2B's format, as `warren dev` generates them (`e2b_` + 40 hex).
    let api_key = "e2b_0d3c8a9e5f1b4c7a2e6d9f0b3a5c7e1d4f8b2a6c";
    let other_key = "e2b_7a1f3c5e9b2d4f6a8c0e1b3d5f7a9c2e4b6d8f0a";
    // Keys in the environment, never on a command line: warren dev's own,
    // and a second team's for its gateways (which inherit it).
    let other = format!("{other_key}:other");
    let mut dev = Dev::start_with(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &["--nodes", "2"],
        &[
            ("WARREN_DEV_API_KEY", api_key),
            ("WARREN_GATEWAY_API_KEY", &other),
        ],
        "the whole cluster on this machine",
    )
    .await;
    let gateway = dev.gateway.clone();

    let script = workspace_root().join("tests/e2b/test_sdk.py");
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(&python)
            .arg(&script)
            .env("E2B_API_URL", &gateway)
            .env("E2B_SANDBOX_URL", &gateway)
            .env("E2B_API_KEY", api_key)
            .env("WARREN_OTHER_API_KEY", other_key)
            .env_remove("E2B_DOMAIN")
            .env_remove("E2B_ACCESS_TOKEN")
            .output(),
    )
    .await
    .expect("the SDK checks finish within 5 minutes")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "e2b SDK checks failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
    // A clean stop: `warren dev` stops every part it started and exits 0.
    assert_eq!(
        dev.proc.terminate(Duration::from_secs(30)).await.code,
        Some(0)
    );
}
