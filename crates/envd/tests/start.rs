//! The template's start command (`warren_envd::start`): started once, listed
//! like any process, and `GET /warren/start` says `starting` until its ready
//! command succeeds, then `ready`; `failed`, with the reason and the
//! command's output, when it ends first or the ready command never succeeds.
#![allow(unused_crate_dependencies)]

mod common;

use common::{TestEnvd, TOKEN};
use std::time::Duration;
use warren_envd::start::{StartCommand, StartState};
use warren_envd_proto::process::ListRequest;
use warren_test_support::wait_until;

fn start(cmd: &str, ready_cmd: &str, timeout_secs: u64) -> StartCommand {
    StartCommand {
        cmd: cmd.into(),
        ready_cmd: ready_cmd.into(),
        user: None,
        cwd: None,
        timeout_secs,
    }
}

async fn state(envd: &TestEnvd) -> StartState {
    let token = envd.token.clone().unwrap_or_default();
    let (status, _, body) = envd
        .http(
            "GET",
            "/warren/start",
            &[("x-access-token", &token)],
            vec![],
        )
        .await;
    assert_eq!(
        status,
        http::StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&body)
    );
    serde_json::from_slice(&body).expect("a start state")
}

/// Waits until the start reaches a state `pick` accepts.
async fn wait_for<T>(envd: &TestEnvd, what: &str, pick: impl Fn(StartState) -> Option<T>) -> T {
    wait_until(what, Duration::from_secs(30), || async {
        pick(state(envd).await)
    })
    .await
}

#[tokio::test]
async fn ready_only_once_the_ready_command_succeeds() {
    // The start command waits for a file the test writes, then makes the
    // file the ready command looks for.
    let envd = TestEnvd::start_with(|s| {
        s.with_start(start(
            "touch started; while [ ! -f go ]; do sleep 0.05; done; touch ready; exec sleep 600",
            "test -f ready",
            60,
        ))
    })
    .await;
    let started = envd.host("/home/user/started");
    wait_until(
        "the start command to run",
        Duration::from_secs(30),
        || async { started.exists().then_some(()) },
    )
    .await;
    // A ready check ran and failed while the command was running: not ready.
    let last = wait_for(&envd, "a failed ready check", |s| match s {
        StartState::Starting {
            last_check: Some(why),
        } => Some(why),
        _ => None,
    })
    .await;
    assert!(last.contains("exit status: 1"), "{last}");
    let listed = envd
        .process(true)
        .list(ListRequest::default())
        .await
        .expect("list")
        .into_owned();
    let proc = listed
        .processes
        .iter()
        .find(|p| p.tag.as_deref() == Some("start_cmd"))
        .expect("the start command is listed with its tag");
    assert_eq!(
        state(&envd).await,
        StartState::Starting {
            last_check: Some(last)
        }
    );

    std::fs::write(envd.host("/home/user/go"), b"").expect("write go");
    let pid = wait_for(&envd, "ready", |s| match s {
        StartState::Ready { pid } => Some(pid),
        StartState::Failed { message } => panic!("failed: {message}"),
        _ => None,
    })
    .await;
    assert_eq!(pid, proc.pid, "ready names the start command's process");
    envd.stop().await;
}

#[tokio::test]
async fn a_start_command_that_ends_first_fails_with_its_output() {
    let envd = TestEnvd::start_with(|s| {
        s.with_start(start("echo no config file >&2; exit 4", "false", 60))
    })
    .await;
    let message = wait_for(&envd, "failed", |s| match s {
        StartState::Failed { message } => Some(message),
        StartState::Ready { .. } => panic!("ready although the ready command always fails"),
        _ => None,
    })
    .await;
    assert!(message.contains("exit status 4"), "{message}");
    assert!(message.contains("no config file"), "{message}");
    envd.stop().await;
}

#[tokio::test]
async fn a_ready_command_that_never_succeeds_fails_after_the_timeout() {
    let envd = TestEnvd::start_with(|s| {
        s.with_start(start("exec sleep 600", "echo not yet >&2; exit 7", 1))
    })
    .await;
    let message = wait_for(&envd, "failed", |s| match s {
        StartState::Failed { message } => Some(message),
        StartState::Ready { .. } => panic!("ready although the ready command always fails"),
        _ => None,
    })
    .await;
    assert!(message.contains("not ready within 1s"), "{message}");
    assert!(
        message.contains("echo not yet"),
        "names the ready command: {message}"
    );
    assert!(
        message.contains("not yet"),
        "quotes the last check: {message}"
    );
    envd.stop().await;
}

#[tokio::test]
async fn without_a_ready_command_it_is_ready_once_started() {
    let envd = TestEnvd::start_with(|s| s.with_start(start("exec sleep 600", "", 60))).await;
    wait_for(&envd, "ready", |s| match s {
        StartState::Ready { .. } => Some(()),
        StartState::Failed { message } => panic!("failed: {message}"),
        _ => None,
    })
    .await;
    envd.stop().await;
}

#[tokio::test]
async fn the_start_command_gets_the_tokens_digest_not_the_token() {
    let envd = TestEnvd::start_with(|s| {
        s.with_access_token(TOKEN).with_start(start(
            "echo \"$WARREN_ACCESS_TOKEN_SHA256\" > digest; env > env.txt; exec sleep 600",
            "test -f env.txt",
            60,
        ))
    })
    .await;
    wait_for(&envd, "ready", |s| match s {
        StartState::Ready { .. } => Some(()),
        StartState::Failed { message } => panic!("failed: {message}"),
        _ => None,
    })
    .await;
    let digest = std::fs::read_to_string(envd.host("/home/user/digest")).expect("digest");
    let want: String = {
        use sha2::Digest;
        sha2::Sha256::digest(TOKEN.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    assert_eq!(digest.trim(), want);
    let env = std::fs::read_to_string(envd.host("/home/user/env.txt")).expect("env");
    assert!(
        !env.contains(TOKEN),
        "the token itself reached the start command"
    );
    envd.stop().await;
}

#[tokio::test]
async fn without_a_start_command_there_is_none_and_it_needs_the_token() {
    let envd = TestEnvd::start_with(|s| s.with_access_token(TOKEN)).await;
    assert_eq!(state(&envd).await, StartState::None);
    let (status, _, _) = envd.http("GET", "/warren/start", &[], vec![]).await;
    assert_eq!(status, http::StatusCode::UNAUTHORIZED);
    envd.stop().await;
}
