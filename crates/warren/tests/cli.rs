//! The operator CLI as the README shows it (`warren sandbox create | exec |
//! ls | rm`, `warren node ls`, `warren route`), run as a real process against
//! a real cluster from test-support: exit codes, output, and arguments passed
//! through exactly.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::Path;
use std::process::Output;
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::wait_until;

const KEY: &str = "key-cli";
const TEAM: &str = "team-cli";
const OTHER_KEY: &str = "key-other";

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// One node (`process` runtime), one gateway; `KEY` is an operator key.
async fn cluster() -> Cluster {
    let spec = Spec {
        nodes: 1,
        gateways: 1,
        keys: vec![
            (KEY.into(), TEAM.into()),
            (OTHER_KEY.into(), "other".into()),
        ],
        gateway_args: vec!["--admin-team".into(), TEAM.into()],
        ..Spec::default()
    };
    Cluster::start(bin(), spec).await.expect("cluster starts")
}

/// `warren args...` against gateway 0 with `key`, from a clean environment
/// (no `E2B_*` of the machine running the tests).
fn warren_as(c: &Cluster, key: &str, args: &[&str]) -> Output {
    std::process::Command::new(bin())
        .args(args)
        .env_remove("E2B_API_URL")
        .env_remove("E2B_SANDBOX_URL")
        .env("E2B_API_URL", format!("http://{}", c.gateway(0)))
        .env("E2B_API_KEY", key)
        .output()
        .expect("warren runs")
}

fn warren(c: &Cluster, args: &[&str]) -> Output {
    warren_as(c, KEY, args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts exit code `code` and returns stdout.
fn expect(o: &Output, code: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
    stdout(o)
}

/// `warren sandbox exec <id> -- argv...`.
fn exec(c: &Cluster, id: &str, argv: &[&str]) -> Output {
    let mut args = vec!["sandbox", "exec", id, "--"];
    args.extend_from_slice(argv);
    warren(c, &args)
}

/// `warren sandbox create ...` → the new id (the only thing printed).
fn create(c: &Cluster, extra: &[&str]) -> String {
    let mut args = vec!["sandbox", "create"];
    args.extend_from_slice(extra);
    let out = expect(&warren(c, &args), 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "create prints only the id: {out:?}");
    warren_core::id::validate_sandbox_id(lines[0]).expect("a sandbox id");
    lines[0].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_create_exec_ls_rm() {
    let c = cluster().await;

    // create: the sandbox's own --timeout does not collide with the
    // request timeout any more.
    let id = create(&c, &["--timeout", "120", "--metadata", "owner=cli"]);
    let same = create(&c, &["--idempotency-key", "cli-once", "--metadata", "k=v"]);
    assert_eq!(
        create(&c, &["--idempotency-key", "cli-once", "--metadata", "k=v"]),
        same,
        "the same idempotency key is the same sandbox"
    );

    // exec: the arguments arrive exactly as given, quoting and all.
    let out = exec(&c, &id, &["sh", "-c", "echo hi; echo \"a  b\""]);
    assert_eq!(expect(&out, 0), "hi\na  b\n");
    let out = exec(&c, &id, &["printf", "%s|", "a b", "\"q\"", "", "-n"]);
    assert_eq!(expect(&out, 0), "a b|\"q\"||-n|");
    // One argument is a shell command line.
    let out = exec(&c, &id, &["echo one; echo 'two  words'"]);
    assert_eq!(expect(&out, 0), "one\ntwo  words\n");
    // Its exit code and its stderr are the command's own.
    let out = exec(&c, &id, &["sh", "-c", "echo oops >&2; exit 3"]);
    assert_eq!(expect(&out, 3), "");
    assert_eq!(stderr(&out), "oops\n");
    // A program that does not exist fails the command, not the CLI.
    let out = exec(&c, &id, &["/no/such/program"]);
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));

    // ls: a table with both sandboxes, and the JSON form.
    let table = expect(&warren(&c, &["sandbox", "ls"]), 0);
    assert!(table.starts_with("SANDBOX ID"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} not listed: {table}"));
    assert!(row.contains("base") && row.contains("owner=cli"), "{row}");
    assert!(table.contains(&same), "{table}");
    let listed: Value =
        serde_json::from_str(&expect(&warren(&c, &["sandbox", "ls", "--json"]), 0)).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["sandboxID"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{listed}");
    assert!(ids.contains(&id.as_str()) && ids.contains(&same.as_str()));
    // Another team sees none of them.
    let theirs: Value = serde_json::from_str(&expect(
        &warren_as(&c, OTHER_KEY, &["sandbox", "ls", "--json"]),
        0,
    ))
    .unwrap();
    assert_eq!(theirs, Value::Array(vec![]));

    // rm: removes, says so; removing again (or an unknown id) fails with 1.
    let out = expect(&warren(&c, &["sandbox", "rm", &id, &same]), 0);
    assert_eq!(out, format!("{id} removed\n{same} removed\n"));
    let out = warren(&c, &["sandbox", "rm", &id]);
    expect(&out, 1);
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    let out = exec(&c, &id, &["true"]);
    expect(&out, 1);
    assert_eq!(
        expect(&warren(&c, &["sandbox", "ls", "--json"]), 0).trim(),
        "[]"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ls_and_route() {
    let c = cluster().await;

    // node ls: the operator key sees the node, as a table and as JSON, once
    // it has registered (it announces its listeners before that).
    wait_until("node-1 to register", Duration::from_secs(10), || async {
        let out = warren(&c, &["node", "ls", "--json"]);
        let nodes: Value = serde_json::from_str(&expect(&out, 0)).ok()?;
        (nodes[0]["nodeID"] == "node-1").then_some(())
    })
    .await;
    let table = expect(&warren(&c, &["node", "ls"]), 0);
    assert!(table.starts_with("NODE ID"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("node-1"))
        .unwrap_or_else(|| panic!("node-1 not listed: {table}"));
    assert!(row.contains(&c.node(1)), "{row}");
    let nodes: Value =
        serde_json::from_str(&expect(&warren(&c, &["node", "ls", "--json"]), 0)).unwrap();
    assert_eq!(nodes[0]["nodeID"], "node-1", "{nodes}");
    // A key that is not an operator's is refused, and says so.
    let out = warren_as(&c, OTHER_KEY, &["node", "ls"]);
    expect(&out, 1);
    assert!(!stderr(&out).is_empty());

    // route: what the gateway caches agrees with the scheduler.
    let id = create(&c, &[]);
    let text = expect(&warren(&c, &["route", &id]), 0);
    assert!(text.starts_with(&format!("sandbox    {id}\n")), "{text}");
    assert!(text.contains("agree      yes"), "{text}");
    let shown: Value =
        serde_json::from_str(&expect(&warren(&c, &["route", &id, "--json"]), 0)).unwrap();
    assert_eq!(shown["sandbox_id"], id.as_str());
    assert_eq!(shown["agree"], true);
    assert_eq!(shown["scheduler"]["node_id"], "node-1");
    expect(&warren(&c, &["sandbox", "rm", &id]), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_exits_64_and_help_exits_0() {
    let c = cluster().await;
    for args in [
        &["sandbox"][..],
        &["sandbox", "exec", "abc"],
        &["sandbox", "create", "--timeout", "soon"],
        &["sandbox", "ls", "--no-such-flag"],
        &["route", "Not-An-Id!"],
        &["node", "ls", "--request-timeout", "x"],
    ] {
        let out = warren(&c, args);
        expect(&out, 64);
        assert!(!stderr(&out).is_empty(), "{args:?} says why");
    }
    // An API key on the command line (which every account on the host can
    // read) is refused without being echoed; a private key file works, a
    // world-readable one is refused naming the flag.
    for flag in [
        vec!["--api-key", "key-on-argv"],
        vec!["--api-key=key-on-argv"],
    ] {
        let mut args = vec!["sandbox", "ls"];
        args.extend(flag);
        let out = warren(&c, &args);
        let err = expect(&out, 64);
        assert!(err.is_empty(), "{err}");
        assert!(stderr(&out).contains("E2B_API_KEY"), "{}", stderr(&out));
        assert!(!stderr(&out).contains("key-on-argv"), "{}", stderr(&out));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    warren_core::private::write(&file, format!("{KEY}\n").as_bytes()).unwrap();
    let from_file = |file: &Path| {
        std::process::Command::new(bin())
            .args(["sandbox", "ls", "--api-key-file"])
            .arg(file)
            .env_remove("E2B_API_KEY")
            .env("E2B_API_URL", format!("http://{}", c.gateway(0)))
            .output()
            .expect("warren runs")
    };
    expect(&from_file(&file), 0);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = from_file(&file);
    expect(&out, 64);
    assert!(stderr(&out).contains("--api-key-file"), "{}", stderr(&out));

    for args in [&["sandbox", "--help"][..], &["sandbox", "exec", "--help"]] {
        let out = expect(&warren(&c, args), 0);
        assert!(out.contains("Usage"), "{out}");
    }
    // Nothing answers: a clear failure, not a hang or a panic.
    let out = std::process::Command::new(bin())
        .args(["sandbox", "ls", "--request-timeout", "2s"])
        .env(
            "E2B_API_URL",
            format!("http://127.0.0.1:{}", warren_test_support::free_port()),
        )
        .env("E2B_API_KEY", KEY)
        .output()
        .expect("warren runs");
    expect(&out, 1);
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}
