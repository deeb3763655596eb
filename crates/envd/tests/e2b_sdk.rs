//! The real e2b Python SDK (the final word on what clients send) against an
//! in-process envd: commands, stdin, reattach, kill, file upload/download in
//! every encoding the SDK uses, and the filesystem calls.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

mod common;

use common::TestEnvd;
use std::process::Stdio;

#[tokio::test]
async fn e2b_python_sdk_drives_envd_directly() {
    run_script("envd_direct.py", None).await;
}

/// PTYs through the SDK's `sandbox.pty`: size, env, cwd, input, resize,
/// disconnect and connect again, kill.
#[tokio::test]
async fn e2b_python_sdk_pty() {
    run_script("envd_parity.py", Some("pty")).await;
}

/// Directory watching: polled and streamed, recursive, entry info, refusals.
#[tokio::test]
async fn e2b_python_sdk_watch_dir() {
    run_script("envd_parity.py", Some("watch")).await;
}

/// File metadata: set on upload, surfaced in stat/list/rename, cleared on
/// overwrite, set out of band.
#[tokio::test]
async fn e2b_python_sdk_file_metadata() {
    run_script("envd_parity.py", Some("metadata")).await;
}

/// E2B's semantics for removing a missing path and for symlinks.
#[tokio::test]
async fn e2b_python_sdk_remove_and_symlinks() {
    run_script("envd_parity.py", Some("files")).await;
}

/// Runs `tests/sdk/<script> [case]` with the e2b SDK against a fresh envd.
async fn run_script(script: &str, case: Option<&str>) {
    let python = warren_test_support::e2b_python();
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-test-env (or set WARREN_E2B_PYTHON)",
        python.display()
    );
    let envd = TestEnvd::start().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/sdk")
        .join(script);
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .args(case)
        .env(
            "E2B_SANDBOX_URL",
            envd.base.to_string().trim_end_matches('/'),
        )
        .env("E2B_API_KEY", "unused-in-debug-mode")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "the e2b SDK script failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}
