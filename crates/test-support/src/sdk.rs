//! Running one case of an SDK script against a cluster's gateway: a Python
//! script under `tests/e2b/` (the `e2b` SDKs in the test virtualenv), or a
//! JavaScript one run by `node` in an npm package under `tests/`. The script
//! asserts what a user sees and prints one `RESULT {json}` line of facts for
//! the Rust side to check the host with.

use crate::{e2b_python, workspace_root};
use std::path::Path;
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
    run(&e2b_python(), &path, gateway, case, api_key, env, within).await
}

/// Runs `node tests/<package>/<script> <case>` like [`run_case`]: the npm
/// package's own `node_modules` (`scripts/setup-test-env` installs them)
/// hold the SDK.
pub async fn run_js_case(
    gateway: &str,
    package: &str,
    script: &str,
    case: &str,
    api_key: &str,
    env: &[(&str, String)],
    within: Duration,
) -> serde_json::Value {
    let dir = workspace_root().join("tests").join(package);
    assert!(
        dir.join("node_modules").is_dir(),
        "no node_modules in {} — run scripts/setup-test-env",
        dir.display()
    );
    let node = Path::new("node");
    run(node, &dir.join(script), gateway, case, api_key, env, within)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `program script case` with the SDK's variables; its `RESULT` facts.
async fn run(
    program: &Path,
    script: &Path,
    gateway: &str,
    case: &str,
    api_key: &str,
    env: &[(&str, String)],
    within: Duration,
) -> Result<serde_json::Value, String> {
    let name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg(script)
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
        .map_err(|_| format!("{name} {case} did not finish within {within:?}"))?
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!(
            "{name} {case} failed ({}):\n{stdout}\n{stderr}",
            out.status
        ));
    }
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .ok_or_else(|| format!("{name} {case} printed no RESULT:\n{stdout}\n{stderr}"))?;
    println!("{name} {case}: {line}");
    serde_json::from_str(line)
        .map_err(|e| format!("{name} {case}: RESULT is not JSON ({e}): {line}"))
}
