//! E2B's template build API through a gateway with the real `e2b` SDK's
//! `Template.build` (`tests/e2b/template_builds.py`): a RUN step's file is
//! in a sandbox made from the built template; RUN steps run as the current
//! USER in the current WORKDIR with the ENVs so far, and the last of each
//! are the sandbox's defaults; the template is its team's (listed, aliased,
//! deletable by it; 404 for another team). A failing RUN fails the build
//! with its output in the log; an unknown user, an image from a registry,
//! and hostile bodies are refused with messages naming them.
//!
//! COPY: the SDK uploads a tar of a folder (a file, a script, a relative
//! symlink) through the signed link; the built template has them, owned
//! and moded as asked, the symlink a symlink. Another team's upload under
//! the same hash is never used; a forged link is 403; another team's or an
//! unknown hash is 400; an upload past `--build-upload-max-bytes` is 413,
//! one past a team's `--build-upload-team-bytes` 429 (another team's goes in);
//! an archive with `../` names and absolute symlinks is unpacked in the
//! sandbox only: the host paths it names stay absent.
//!
//! Tags: `name:tag` names a build; `Template.assign_tags` and
//! `remove_tags` move names, for the team only; bad tags are refused.
//!
//! Each cluster gets a template store of its own holding only `base` (its
//! root linked from the shared store), so builds never land in the store
//! other tests and `warren dev` read.
//!
//! Needs what the snapshot suite needs (root, cgroups, slirp4netns,
//! nftables, the `base` template in `/var/lib/warren/templates`).

use std::path::Path;
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;
use warren_test_support::templates::private_store;

const KEY: &str = "e2b_5a7c9e1b3d5f7a9c2e4b6d8f0a2c4e6b8d0f1a3c";
const KEY_B: &str = "e2b_b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a1c3e5b7d9";

async fn cluster(store: &Path) -> Cluster {
    cluster_with(store, &[]).await
}

async fn cluster_with(store: &Path, gateway: &[&str]) -> Cluster {
    let dir = vec!["--template-dir".to_string(), store.display().to_string()];
    let mut gateway_args = dir.clone();
    gateway_args.extend(gateway.iter().map(|s| s.to_string()));
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![
                (KEY.into(), "team-a".into()),
                (KEY_B.into(), "team-b".into()),
            ],
            node_args: dir,
            gateway_args,
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (needs root, cgroups, slirp4netns, nftables and the base template)")
}

async fn run(c: &Cluster, case: &str) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    run_case(
        &gateway,
        "template_builds.py",
        case,
        KEY,
        &[("E2B_API_KEY_B", KEY_B.to_string())],
        Duration::from_secs(900),
    )
    .await
}

#[tokio::test]
async fn a_built_template_has_its_steps_files_user_workdir_and_env_and_stays_with_its_team() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster(store.path()).await;
    let r = run(&c, "build_use_and_teams").await;
    assert_eq!(r["run"], "built-by-run", "{r}");
    assert_eq!(
        r["default_user"], "user",
        "RUN runs as the base's user: {r}"
    );
    assert_eq!(r["root_user"], "root", "RUN's own user: {r}");
    assert_eq!(
        r["env_file"], "hello from env",
        "ENV reaches later RUNs: {r}"
    );
    assert_eq!(r["run_cwd"], "/srv/app", "RUN runs in the WORKDIR: {r}");
    assert_eq!(r["guest"], "guest", "RUN runs as the USER: {r}");
    assert_eq!(r["whoami"], "guest", "the last USER is the default: {r}");
    assert_eq!(r["pwd"], "/srv/app", "the last WORKDIR is the default: {r}");
    assert_eq!(r["env"], "hello from env", "ENV is the default: {r}");
    // Deleted at the end: only base is recorded; the build sandbox's
    // snapshot record is gone too.
    let records: Vec<String> = std::fs::read_dir(store.path().join("templates"))
        .expect("records")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(records, vec!["base.json".to_string()]);
    drop(c);
}

#[tokio::test]
async fn failed_and_refused_builds_say_why_and_record_nothing() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster(store.path()).await;
    let r = run(&c, "failures").await;
    eprintln!("facts: {r}");
    let records = std::fs::read_dir(store.path().join("templates"))
        .expect("records")
        .count();
    assert_eq!(records, 1, "nothing but base recorded");
    drop(c);
}

#[tokio::test]
async fn tags_name_builds_and_move_between_names_for_their_team_only() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster(store.path()).await;
    let r = run(&c, "tags").await;
    assert_eq!(r["v1"], "v1", "{r}");
    assert_eq!(r["tags"], serde_json::json!(["default", "prod"]), "{r}");
    // base, tb-tag (default) and tb-tag:v1: prod was removed.
    let records = std::fs::read_dir(store.path().join("templates"))
        .expect("records")
        .count();
    assert_eq!(records, 3, "{r}");
    drop(c);
}

#[tokio::test]
async fn copy_puts_uploaded_files_in_the_template_and_never_unpacks_on_the_host() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster_with(
        store.path(),
        &[
            "--build-upload-max-bytes",
            "1048576",
            "--build-upload-team-bytes",
            "1572864",
        ],
    )
    .await;
    let r = run(&c, "copy").await;
    assert_eq!(
        r["hello"], "hello from copy",
        "team B's upload is not used: {r}"
    );
    assert_eq!(r["link"], "hello.txt", "a relative symlink stays one: {r}");
    assert_eq!(r["through_link"], "hello from copy", "{r}");
    assert_eq!(r["hello_owner"], "user:user", "owned by the USER: {r}");
    assert_eq!(r["script"], "ran", "modes kept: {r}");
    assert_eq!(
        r["single"], "root:root 600",
        "user and mode arguments; a relative dest is under the WORKDIR: {r}"
    );
    assert_eq!(r["temp_left"], "0", "the archive is cleaned up: {r}");
    assert_eq!(r["forged"], serde_json::json!([403, 403, 403]), "{r}");
    let paths = r["escape_paths"].as_array().expect("escape paths");
    assert_eq!(paths.len(), 3, "{r}");
    for p in paths {
        let p = p.as_str().expect("a path");
        assert!(
            !Path::new(p).exists() && std::fs::symlink_metadata(p).is_err(),
            "the hostile archive touched the host at {p}: {r}"
        );
    }
    assert!(
        r["evil_status"] == "ready" || r["evil_reason"].as_str().unwrap_or("").contains("tar"),
        "the hostile archive reached tar in the sandbox: {r}"
    );
    drop(c);
}

/// A sandbox from `template` (team A's), its id.
async fn sandbox_of(c: &Cluster, template: &str) -> String {
    let a = warren_test_support::http::Http::new(Duration::from_secs(120))
        .send(
            http::Method::POST,
            &c.gateway(0),
            "/v2/sandboxes",
            &[("x-api-key", KEY)],
            Some(serde_json::json!({"templateID": template, "timeout": 300})),
        )
        .await
        .expect("the gateway answers");
    assert_eq!(a.status, http::StatusCode::CREATED, "{}", a.text());
    a.str("sandboxID")
}

/// The attack: a tenant set its own limits through the
/// build API (1 TiB of memory, 64 CPUs) and nodes capped nothing. Now the
/// gateway refuses what is past its caps with a 400 naming the flag; a
/// template under them gets exactly what it asked for in the sandbox's
/// cgroup; and a node started without limit flags caps one asking for
/// more than its defaults (8 CPUs, 8 GiB) — here the gateway's caps are
/// raised past the node's to show the node's second line.
#[tokio::test]
async fn a_tenant_asks_for_resources_within_the_operators_caps_and_nodes_cap_again() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster_with(
        store.path(),
        &[
            "--max-sandbox-memory-mb",
            "16384",
            "--max-sandbox-cpus",
            "16",
        ],
    )
    .await;
    let r = run(&c, "limits").await;
    assert!(
        r["memory"]
            .as_str()
            .is_some_and(|m| m.contains("--max-sandbox-memory-mb")),
        "{r}"
    );
    let small = sandbox_of(&c, "tb-small").await;
    let limits = warren_test_support::cgroups::sandbox_limits(&small)
        .unwrap_or_else(|| panic!("no cgroup for sandbox {small}"));
    assert_eq!(
        limits.memory_bytes,
        768 << 20,
        "what the build asked: {limits:?}"
    );
    assert_eq!(limits.cpus, Some(1.0), "{limits:?}");
    let big = sandbox_of(&c, "tb-big").await;
    let limits = warren_test_support::cgroups::sandbox_limits(&big)
        .unwrap_or_else(|| panic!("no cgroup for sandbox {big}"));
    assert_eq!(
        limits.memory_bytes,
        8192 << 20,
        "the node's default cap: {limits:?}"
    );
    assert_eq!(limits.cpus, Some(8.0), "the node's default cap: {limits:?}");
    drop(c);
}

/// The attack: builds were held per gateway, 1 000 for
/// all teams, and requested ones never expired: 1 000 cheap requests
/// locked every other team out. Now team A filling its own bound is a 429
/// naming `--build-team-count` while team B builds, and requested builds
/// that never start are forgotten after `--build-start-ttl`.
#[tokio::test]
async fn one_team_cannot_hold_every_build_and_requested_builds_expire() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster_with(
        store.path(),
        &["--build-team-count", "3", "--build-start-ttl", "20s"],
    )
    .await;
    let r = run(&c, "build_bounds").await;
    assert!(
        r["full"]
            .as_str()
            .is_some_and(|m| m.contains("--build-team-count")),
        "{r}"
    );
    drop(c);
}

/// A build's log is bounded (one finished build used to pin ~49 MiB of
/// gateway memory for an hour): a step printing far more keeps at most
/// `--build-log-max-bytes` and the log says what it dropped.
#[tokio::test]
async fn a_builds_log_keeps_its_bound_and_says_what_it_dropped() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    let c = cluster_with(store.path(), &["--build-log-max-bytes", "65536"]).await;
    let r = run(&c, "log_bound").await;
    assert!(r["kept"].as_u64().is_some_and(|k| k <= 65536), "{r}");
    drop(c);
}
