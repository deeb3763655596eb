//! Running one case of an e2b SDK script under `tests/e2b/` against a
//! cluster's gateway: the script asserts what a user sees and prints one
//! `RESULT {json}` line of facts for the Rust side to check the host with.

use crate::{e2b_python, workspace_root};
use std::time::Duration;

/// Runs `python tests/e2b/<script> <case>` with `E2B_API_URL` and
/// `E2B_SANDBOX_URL` set to `gateway` (an `http://` URL), `E2B_API_KEY` to
/// `api_key`, plus `env`; returns its `RESULT` facts. Panics with the
/// script's output when it failed or printed no result, or after `within`.
pub async fn run_case(
    gateway: &str,
    script: &str,
    case: &str,
    api_key: &str,
    env: &[(&str, String)],
    within: Duration,
) -> serde_json::Value {
    try_run_case(gateway, script, case, api_key, env, within)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`run_case`], with what went wrong as an error instead of a panic: for a
/// test that checks the host first (and says what the case said).
pub async fn try_run_case(
    gateway: &str,
    script: &str,
    case: &str,
    api_key: &str,
    env: &[(&str, String)],
    within: Duration,
) -> Result<serde_json::Value, String> {
    let path = workspace_root().join("tests/e2b").join(script);
    let mut cmd = tokio::process::Command::new(e2b_python());
    cmd.arg(&path)
        .arg(case)
        .env("E2B_API_URL", gateway)
        .env("E2B_SANDBOX_URL", gateway)
        .env("E2B_API_KEY", api_key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_ACCESS_TOKEN")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(within, cmd.output())
        .await
        .map_err(|_| format!("{script} {case} did not finish within {within:?}"))?
        .map_err(|e| format!("cannot run {}: {e}", e2b_python().display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "{script} {case} failed ({}):\n{stdout}\n{stderr}",
            out.status
        ));
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| format!("{script} {case} printed no RESULT:\n{stdout}\n{stderr}"))?;
    println!("{script} {case}: {line}");
    serde_json::from_str(line)
        .map_err(|e| format!("{script} {case}: RESULT is not JSON ({e}): {line}"))
}
