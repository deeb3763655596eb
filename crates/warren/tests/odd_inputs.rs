//! Odd inputs through the whole path (client → gateway → node → envd in an
//! `isolated` sandbox), each answered with a clear 4xx that names the
//! problem where it used to be a 200, 500 or 502 — one test per input, each
//! on its own cluster, with the real `e2b` SDK and raw HTTP
//! (`tests/e2b/odd_inputs.py`):
//!
//! - a bad `startedAfter` on `/v2/sandboxes` and `/sandboxes`: 400 naming it;
//! - an env var over the kernel's 131071 bytes at create and for a command:
//!   400 / `invalid_argument` naming it and the limit (one at the limit runs);
//! - writing to a read-only path: 403 "read-only"; changing a mount point:
//!   `failed_precondition`;
//! - a 9 MiB unary Connect request (and 32 MiB chunked): `resource_exhausted`
//!   naming the limit, passed through by node and gateway (was a 502);
//! - `/proc` files download with their content (were empty);
//!
//! and the attack: a client's `X-API-Key` on sandbox traffic never reaches
//! the sandbox (an app echoing its request headers does not see it).
//!
//! They need what the security suite needs: root, cgroups, and the `base`
//! template (scripts/test builds it).

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;

/// In E2B's format, as `warren dev` generates them.
const KEY: &str = "e2b_5d1c0a77e0b94f4e8b3f2a6c9d8e7f6a5b4c3d2e";

async fn cluster() -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![(KEY.into(), "team-a".into())],
            ..Spec::default()
        },
    )
    .await
    .expect("an isolated cluster starts (needs root, cgroups and the base template: scripts/test builds it)")
}

/// Runs one case of `tests/e2b/odd_inputs.py` on a cluster of its own.
async fn case(name: &str) -> serde_json::Value {
    let c = cluster().await;
    run_case(
        &format!("http://{}", c.gateway(0)),
        "odd_inputs.py",
        name,
        KEY,
        &[],
        Duration::from_secs(300),
    )
    .await
}

fn text(facts: &serde_json::Value, key: &str) -> String {
    facts[key]
        .as_str()
        .unwrap_or_else(|| panic!("no {key:?} in {facts}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_started_after_is_a_400_naming_it() {
    let facts = case("started_after").await;
    let refused = facts["refused"].as_object().expect("refused");
    assert_eq!(refused.len(), 14, "7 bad values on v1 and v2: {refused:?}");
    assert!(refused.values().all(|s| s == 400), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_var_over_the_kernel_limit_is_an_invalid_argument_naming_it() {
    let facts = case("env_vars").await;
    for key in ["create", "run"] {
        let message = text(&facts, key);
        assert!(message.contains("131071"), "{key}: {message}");
    }
    assert!(text(&facts, "run").starts_with("InvalidArgumentException"));
    assert!(text(&facts, "together").starts_with("InvalidArgumentException"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_to_a_read_only_path_is_a_403_not_a_500() {
    let facts = case("read_only_paths").await;
    assert_eq!(facts["upload_status"], 403, "{facts}");
    assert!(text(&facts, "upload").contains("403"), "{facts}");
    assert!(
        text(&facts, "remove").contains("FAILED_PRECONDITION"),
        "{facts}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_connect_request_is_resource_exhausted_not_a_502() {
    let facts = case("oversized_unary").await;
    for key in ["sized", "sdk"] {
        assert!(text(&facts, key).contains("8388608"), "{key}: {facts}");
    }
    assert!(text(&facts, "streamed").contains("limit"), "{facts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_files_download_with_their_content() {
    let facts = case("proc_files").await;
    for key in ["status_bytes", "cpuinfo_bytes"] {
        assert!(facts[key].as_u64().unwrap_or(0) > 100, "{key}: {facts}");
    }
}

/// The attack: a tenant's server in the sandbox logs every request header;
/// a client that sends its API key on sandbox traffic (by header routing
/// and by host routing) must not hand it over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_api_key_never_reaches_the_sandbox() {
    let facts = case("api_key_stripped").await;
    let seen = facts["seen"].as_object().expect("seen");
    assert_eq!(seen.len(), 2, "{facts}");
    for (routing, headers) in seen {
        let headers = headers.as_object().expect("headers");
        assert!(headers.contains_key("x-probe"), "{routing}: {headers:?}");
        assert!(!headers.contains_key("x-api-key"), "{routing}: {headers:?}");
        assert!(
            !headers
                .values()
                .any(|v| v.as_str().is_some_and(|v| v.contains(KEY))),
            "{routing}: {headers:?}"
        );
    }
}
