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
    let python = warren_test_support::e2b_python();
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-test-env (or set WARREN_E2B_PYTHON)",
        python.display()
    );
    let envd = TestEnvd::start().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/envd_direct.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
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
