//! The code interpreter (docs/code-interpreter.md) as its users see it: the
//! unmodified `e2b-code-interpreter` Python SDK (`tests/e2b/code_interpreter.py`)
//! and `@e2b/code-interpreter` JavaScript SDK
//! (`tests/js-code-interpreter/code_interpreter.mjs`) against `warren dev`,
//! one case per test, each on its own `warren dev`: state kept across
//! `run_code` calls; `print` streamed to `on_stdout` before the code ends; an
//! exception as `execution.error` with its name; a matplotlib figure as a
//! PNG; contexts that share nothing; a short `timeout` that stops a loop and
//! leaves the context usable; JavaScript and bash contexts; per-run env vars;
//! no route but the ready probe does anything without the sandbox's access
//! token.
//!
//! They need what the isolated sandbox tests need (root, cgroups,
//! slirp4netns, nftables) and the `code-interpreter-v1` template in
//! `/var/lib/warren/templates`, or the store `WARREN_TEMPLATE_DIR` names
//! (scripts/test builds it from templates/code-interpreter.toml), plus
//! `.venv` and
//! `tests/js-code-interpreter/node_modules` (scripts/setup-test-env).
#![allow(unused_crate_dependencies)]

use std::time::Duration;
use warren_test_support::dev::Dev;
use warren_test_support::sdk::{run_case, run_js_case};

/// In E2B's format (`e2b_` + 40 hex), as a user's SDK would send it.
const KEY: &str = "e2b_0c1d2e3f405162738495a6b7c8d9eafb0c1d2e3f";

async fn dev() -> Dev {
    // The store warren dev reads: WARREN_TEMPLATE_DIR (its parts inherit it).
    let dir = std::env::var("WARREN_TEMPLATE_DIR")
        .unwrap_or_else(|_| warren_test_support::templates::TEMPLATE_DIR.into());
    let template = format!("{dir}/templates/code-interpreter-v1.json");
    assert!(
        std::path::Path::new(&template).exists(),
        "no code-interpreter-v1 template ({template}): build it with \
         `warren template build templates/code-interpreter.toml` (scripts/test does)"
    );
    Dev::start_with(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &["--nodes", "1", "--runtime", "isolated"],
        &[("WARREN_DEV_API_KEY", KEY)],
        "isolated: needs root, cgroups, slirp4netns, nftables",
    )
    .await
}

/// The SDK scripts, run against one `warren dev`.
trait DevExt {
    async fn python(&self, case: &str) -> serde_json::Value;
    async fn js(&self, case: &str) -> serde_json::Value;
    async fn stop(self);
}

impl DevExt for Dev {
    async fn python(&self, case: &str) -> serde_json::Value {
        run_case(
            &self.gateway,
            "code_interpreter.py",
            case,
            KEY,
            &[],
            Duration::from_secs(600),
        )
        .await
    }

    async fn js(&self, case: &str) -> serde_json::Value {
        run_js_case(
            &self.gateway,
            "js-code-interpreter",
            "code_interpreter.mjs",
            case,
            KEY,
            &[],
            Duration::from_secs(600),
        )
        .await
    }

    async fn stop(mut self) {
        let code = self.proc.terminate(Duration::from_secs(30)).await.code;
        assert_eq!(code, Some(0), "warren dev stops cleanly");
    }
}

// ---- Python: e2b-code-interpreter ----

/// `Sandbox.create()` makes a `code-interpreter-v1` sandbox; variables,
/// imports and functions stay between calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_state_is_kept_across_run_code() {
    let d = dev().await;
    let facts = d.python("state").await;
    assert_eq!(facts["template"], "code-interpreter-v1", "{facts}");
    assert_eq!(facts["text"], "84", "{facts}");
    d.stop().await;
}

/// `print` reaches `on_stdout` while the code still runs (the code waits
/// for a file only the callback writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_print_streams_before_the_code_finishes() {
    let d = dev().await;
    d.python("streaming").await;
    d.stop().await;
}

/// An exception is `execution.error` with its name and value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_exception_is_execution_error() {
    let d = dev().await;
    let facts = d.python("error").await;
    assert_eq!(facts["name"], "ValueError", "{facts}");
    d.stop().await;
}

/// A matplotlib figure is a PNG result (with chart data); a DataFrame has
/// HTML and `data`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_matplotlib_figure_is_a_png() {
    let d = dev().await;
    let facts = d.python("matplotlib").await;
    assert_eq!(facts["chart"], "line", "{facts}");
    d.stop().await;
}

/// Two contexts do not share variables; restart and remove work. The
/// SDK's context calls carry no access token: refused by default, taken
/// with the sandbox's opt-out (`CODE_INTERPRETER_CONTEXTS_WITHOUT_TOKEN=1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_contexts_are_isolated() {
    let d = dev().await;
    let facts = d.python("contexts").await;
    assert_eq!(
        facts["removed_context_error"], "NotFoundException",
        "{facts}"
    );
    assert!(
        facts["refused"]
            .as_str()
            .is_some_and(|m| m.contains("access token")),
        "{facts}"
    );
    d.stop().await;
}

/// A loop stopped by a short `timeout`: TimeoutException, the kernel is
/// interrupted, the context keeps its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_timeout_interrupts_and_the_context_stays_usable() {
    let d = dev().await;
    let facts = d.python("timeout").await;
    assert!(
        facts["timeout"]
            .as_str()
            .is_some_and(|m| m.contains("Execution timed out")),
        "{facts}"
    );
    d.stop().await;
}

/// JavaScript and bash contexts run (their kernels are in the template).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_javascript_and_bash_contexts_run() {
    let d = dev().await;
    let facts = d.python("languages").await;
    let languages: Vec<&str> = facts["languages"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(languages, ["bash", "javascript", "python"], "{facts}");
    d.stop().await;
}

/// `envs` apply to one run only; the create's env vars reach the code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_env_vars_apply_to_one_run() {
    let d = dev().await;
    d.python("env_vars").await;
    d.stop().await;
}

/// The attack: knowing a sandbox's id but not its access
/// token, a client lists, creates, restarts and deletes its contexts and
/// runs code. Every route but the ready probe is 401 (without a token and
/// with a wrong one), no kernel starts, the victim's context keeps its
/// state; with the token each route works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_every_route_needs_the_access_token() {
    let d = dev().await;
    let facts = d.python("routes_need_the_token").await;
    let attempts = facts["attempts"].as_object().expect("attempts");
    assert_eq!(attempts.len(), 12, "{facts}");
    assert!(attempts.values().all(|s| s == 401), "{facts}");
    assert_eq!(facts["health"], 200, "{facts}");
    d.stop().await;
}

/// `/execute` without the sandbox's access token (or with another) is
/// refused with 401 and runs nothing: knowing a sandbox's id is not enough
/// to run code in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_execute_needs_the_access_token() {
    let d = dev().await;
    let facts = d.python("auth").await;
    assert_eq!(facts["missing"], 401, "{facts}");
    assert_eq!(facts["wrong"], 401, "{facts}");
    d.stop().await;
}

// ---- JavaScript: @e2b/code-interpreter ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_state_is_kept_across_run_code() {
    let d = dev().await;
    let facts = d.js("state").await;
    assert_eq!(facts["text"], "42", "{facts}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_print_streams_before_the_code_finishes() {
    let d = dev().await;
    d.js("streaming").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_exception_is_execution_error() {
    let d = dev().await;
    let facts = d.js("error").await;
    assert_eq!(facts["name"], "KeyError", "{facts}");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_matplotlib_figure_is_a_png() {
    let d = dev().await;
    d.js("matplotlib").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_contexts_are_isolated() {
    let d = dev().await;
    d.js("contexts").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_timeout_interrupts_and_the_context_stays_usable() {
    let d = dev().await;
    d.js("timeout").await;
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_javascript_and_bash_contexts_run() {
    let d = dev().await;
    let facts = d.js("languages").await;
    assert_eq!(facts["bash"], "10", "{facts}");
    d.stop().await;
}
