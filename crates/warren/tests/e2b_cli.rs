//! E2B's own CLI (`@e2b/cli`, pinned in `tests/cli/package.json`) against
//! `warren dev`, as a user drives it with `E2B_API_KEY` and `E2B_API_URL`:
//!
//! - `sandbox create` with its interactive terminal, through a real PTY:
//!   a command typed, its output read, `exit`;
//! - `sandbox create -d`, `exec`, `logs` (and again once killed), `metrics`,
//!   `snapshot create`/`delete`, `pause`, `resume`, `kill`;
//! - `template create` from a Dockerfile, `list`, `publish` (another team
//!   lists it and starts sandboxes from it, and may not delete it),
//!   `unpublish` (then it may not start them), `delete`; between build and
//!   publish, the template's management API (`tests/e2b/every_call.py
//!   manage`: its builds, a build's log, its tags).
//!
//! Needs what isolated sandboxes need (root, the `base` template) and the
//! CLI's `node_modules` (`scripts/setup-test-env`).
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use warren_test_support::dev::Dev;
use warren_test_support::workspace_root;

/// In E2B's format, as the CLI requires.
const KEY: &str = "e2b_3b4c5d6e7f8a9b0c1d2e3f4a5b6c7d8e9f0a1b2c";
const OTHER_KEY: &str = "e2b_7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b";

/// The CLI's entry point.
fn cli_js() -> PathBuf {
    let js = workspace_root().join("tests/cli/node_modules/@e2b/cli/dist/index.js");
    assert!(
        js.is_file(),
        "no {}: run scripts/setup-test-env (npm ci in tests/cli)",
        js.display()
    );
    js
}

/// What one CLI run printed and how it ended.
struct Ran {
    ok: bool,
    out: String,
}

/// `e2b ARGS` as team `key`, in `dir` (no terminal: stdin is empty).
async fn e2b(gateway: &str, key: &str, dir: &Path, args: &[&str]) -> Ran {
    let run = tokio::process::Command::new("node")
        .arg(cli_js())
        .args(args)
        .current_dir(dir)
        .env("E2B_API_KEY", key)
        .env("E2B_API_URL", gateway)
        .env("E2B_SANDBOX_URL", gateway)
        .env("NO_UPDATE_NOTIFIER", "1")
        .env("NO_COLOR", "1")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_ACCESS_TOKEN")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .unwrap_or_else(|_| panic!("e2b {args:?} did not finish within 5 minutes"))
        .expect("node runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("$ e2b {}\n{text}", args.join(" "));
    Ran {
        ok: out.status.success(),
        out: text,
    }
}

async fn ok(gateway: &str, key: &str, dir: &Path, args: &[&str]) -> String {
    let r = e2b(gateway, key, dir, args).await;
    assert!(r.ok, "e2b {args:?} failed:\n{}", r.out);
    r.out
}

/// `e2b sandbox create` with the CLI's interactive terminal on a real PTY:
/// types a command, reads its output, types `exit`, and waits for the CLI
/// to end. What the terminal showed.
async fn interactive_create(gateway: &str, dir: &Path) -> String {
    use warren_envd::process::pty;
    let (master, slave) = pty::open(pty::Size {
        cols: 120,
        rows: 40,
    })
    .expect("a pty");
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(cli_js())
        .args(["sandbox", "create", "base"])
        .current_dir(dir)
        .env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", gateway)
        .env("E2B_SANDBOX_URL", gateway)
        .env("NO_UPDATE_NOTIFIER", "1")
        .env("TERM", "xterm")
        .env_remove("E2B_DOMAIN")
        .stdin(Stdio::from(slave.try_clone().expect("dup")))
        .stdout(Stdio::from(slave.try_clone().expect("dup")))
        .stderr(Stdio::from(slave))
        .kill_on_drop(true);
    // The terminal is the CLI's controlling terminal, as in a shell.
    warren_sys::controlling_terminal_from_stdin(cmd.as_std_mut());
    let mut child = cmd.spawn().expect("node starts");
    drop(cmd);
    let mut reader = master.reader();
    let mut seen = Vec::new();
    // Reads until `needle` shows, or fails with what the terminal showed.
    async fn until(reader: &mut pty::Reader, seen: &mut Vec<u8>, needle: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while !String::from_utf8_lossy(seen).contains(needle) {
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, reader.read(&mut buf))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "the terminal never showed {needle:?}; it showed:\n{}",
                        String::from_utf8_lossy(seen)
                    )
                })
                .expect("the terminal reads");
            assert!(
                n > 0,
                "the terminal closed before {needle:?}:\n{}",
                String::from_utf8_lossy(seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    }
    // The shell's prompt ends in `$ ` (user's bash in the sandbox).
    until(&mut reader, &mut seen, "$ ", Duration::from_secs(120)).await;
    master
        .write_all(b"echo typed-in-$((6*7))\r")
        .await
        .expect("typed");
    until(
        &mut reader,
        &mut seen,
        "typed-in-42",
        Duration::from_secs(30),
    )
    .await;
    master.write_all(b"exit\r").await.expect("typed");
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the CLI ends after the shell exits")
        .expect("waited");
    // What is left of its output.
    let mut rest = [0u8; 65536];
    if let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(200), reader.read(&mut rest)).await
    {
        seen.extend_from_slice(&rest[..n]);
    }
    let shown = String::from_utf8_lossy(&seen).into_owned();
    assert!(status.success(), "the CLI exited {status}:\n{shown}");
    shown
}

/// The sandbox id `sandbox create -d` printed (its last line).
fn last_line(out: &str) -> String {
    out.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_cli_drives_sandboxes_and_templates() {
    let other = format!("{OTHER_KEY}:other");
    let dev = Dev::start_with(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &["--nodes", "1"],
        &[
            ("WARREN_DEV_API_KEY", KEY),
            ("WARREN_GATEWAY_API_KEY", &other),
        ],
        "the whole cluster on this machine (isolated sandboxes need root and the base template)",
    )
    .await;
    let gw = dev.gateway.clone();
    let dir = tempfile::tempdir().expect("a directory");
    let d = dir.path();

    // The interactive terminal, through a PTY.
    let shown = interactive_create(&gw, d).await;
    println!("$ e2b sandbox create base (on a terminal)\n{shown}");
    assert!(shown.contains("typed-in-42"), "{shown}");

    // Sandboxes.
    let id = last_line(&ok(&gw, KEY, d, &["sandbox", "create", "-d", "base"]).await);
    assert!(!id.is_empty() && !id.contains(' '), "{id:?}");
    let out = ok(
        &gw,
        KEY,
        d,
        &["sandbox", "exec", &id, "sh", "-c", "echo exec-$((2+3))"],
    )
    .await;
    assert!(out.contains("exec-5"), "{out}");
    let out = ok(&gw, KEY, d, &["sandbox", "logs", "--format", "json", &id]).await;
    assert!(out.contains("Process started"), "{out}");
    assert!(
        out.contains("echo exec-$((2+3))"),
        "the command in its entry: {out}"
    );
    ok(&gw, KEY, d, &["sandbox", "metrics", &id]).await;
    let out = ok(
        &gw,
        KEY,
        d,
        &["sandbox", "snapshot", "create", &id, "-n", "cli-snap"],
    )
    .await;
    assert!(out.contains("Created snapshot"), "{out}");
    let out = ok(&gw, KEY, d, &["sandbox", "snapshot", "delete", "cli-snap"]).await;
    assert!(out.contains("has been deleted"), "{out}");
    ok(&gw, KEY, d, &["sandbox", "pause", &id]).await;
    let out = ok(
        &gw,
        KEY,
        d,
        &["sandbox", "list", "--format", "json", "--state", "paused"],
    )
    .await;
    assert!(out.contains(&id), "{out}");
    ok(&gw, KEY, d, &["sandbox", "resume", &id]).await;
    let out = ok(&gw, KEY, d, &["sandbox", "exec", &id, "echo", "back"]).await;
    assert!(out.contains("back"), "{out}");
    ok(&gw, KEY, d, &["sandbox", "kill", &id]).await;
    let out = ok(&gw, KEY, d, &["sandbox", "list", "--format", "json"]).await;
    assert!(!out.contains(&id), "{out}");
    // Its logs outlive it.
    let out = ok(&gw, KEY, d, &["sandbox", "logs", "--format", "json", &id]).await;
    assert!(out.contains("Sandbox killed"), "{out}");

    // Templates: from a Dockerfile, managed, published.
    let name = format!("cli-{:08x}", rand::random::<u32>());
    std::fs::write(
        d.join("e2b.Dockerfile"),
        "FROM e2bdev/base\nRUN echo cli-step-output && echo built-by-cli > /home/user/cli.txt\n",
    )
    .expect("a Dockerfile");
    let out = ok(
        &gw,
        KEY,
        d,
        &["template", "create", &name, "--memory-mb", "512"],
    )
    .await;
    assert!(out.contains("finished"), "{out}");
    let out = ok(&gw, KEY, d, &["template", "list", "--format", "json"]).await;
    assert!(out.contains(&name), "{out}");
    let facts = warren_test_support::sdk::run_case(
        &gw,
        "every_call.py",
        "manage",
        KEY,
        &[
            ("WARREN_OTHER_KEY", OTHER_KEY.to_string()),
            ("WARREN_TEMPLATE", name.clone()),
        ],
        Duration::from_secs(120),
    )
    .await;
    assert!(facts["log_entries"].as_u64().unwrap_or(0) > 2, "{facts}");

    ok(&gw, KEY, d, &["template", "publish", &name, "-y"]).await;
    let out = ok(&gw, OTHER_KEY, d, &["template", "list", "--format", "json"]).await;
    assert!(out.contains(&name), "another team lists it: {out}");
    let theirs = last_line(&ok(&gw, OTHER_KEY, d, &["sandbox", "create", "-d", &name]).await);
    let out = ok(
        &gw,
        OTHER_KEY,
        d,
        &["sandbox", "exec", &theirs, "cat", "/home/user/cli.txt"],
    )
    .await;
    assert!(out.contains("built-by-cli"), "{out}");
    ok(&gw, OTHER_KEY, d, &["sandbox", "kill", &theirs]).await;
    let refused = e2b(&gw, OTHER_KEY, d, &["template", "delete", &name, "-y"]).await;
    assert!(
        !refused.ok && refused.out.contains("403"),
        "{}",
        refused.out
    );

    ok(&gw, KEY, d, &["template", "unpublish", &name, "-y"]).await;
    let refused = e2b(&gw, OTHER_KEY, d, &["sandbox", "create", "-d", &name]).await;
    assert!(
        !refused.ok,
        "unpublished, another team cannot use it:\n{}",
        refused.out
    );
    ok(&gw, KEY, d, &["template", "delete", &name, "-y"]).await;
    let out = ok(&gw, KEY, d, &["template", "list", "--format", "json"]).await;
    assert!(!out.contains(&name), "{out}");
}
