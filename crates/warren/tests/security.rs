//! The sandbox boundary, as a tenant attacks it: one test per class of
//! attack, each made with the real `e2b` SDK through a gateway
//! (`tests/e2b/security.py`) against an `isolated` node, and checked on the host
//! too (a process environment scan, a root-only host socket that must never
//! be connected, a root-only host file that must never leak, host uids).
//!
//! These run on this machine's cgroup v1 hybrid hierarchy and, where it
//! exists, on cgroup v2 (the node picks whichever is mounted).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;
use warren_test_support::workspace_root;

/// In E2B's format (`e2b_` + 40 hex), as a tenant's SDK would send them.
const KEY_A: &str = "e2b_3e9a1c7f5b2d8e4a6c0f9b1d3e5a7c2f4b6d8e0a";
const KEY_B: &str = "e2b_8c2e4a6f0b1d3c5e7a9f2b4d6c8e0a1f3b5d7c9e";

async fn cluster(node_args: &[&str]) -> Cluster {
    start("isolated", node_args, false).await
}

/// One node of `runtime` with `node_args`, teams a and b; with `logs`,
/// each part logs to its file in the cluster's dir.
async fn start(runtime: &str, node_args: &[&str], logs: bool) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: runtime.into(),
            keys: vec![
                (KEY_A.into(), "team-a".into()),
                (KEY_B.into(), "team-b".into()),
            ],
            node_args: node_args.iter().map(|s| s.to_string()).collect(),
            logs,
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (the security suite needs root, cgroups and the base template: scripts/test builds it)")
}

/// Runs one attack of `tests/e2b/security.py` as team a (team b's key in
/// `WARREN_OTHER_API_KEY`); returns its `RESULT` facts.
async fn attack(c: &Cluster, name: &str, env: &[(&str, String)]) -> serde_json::Value {
    let mut env = env.to_vec();
    env.push(("WARREN_OTHER_API_KEY", KEY_B.to_string()));
    run_case(
        &format!("http://{}", c.gateway(0)),
        "security.py",
        name,
        KEY_A,
        &env,
        Duration::from_secs(300),
    )
    .await
}

/// `(pid, host uid, user namespace)` of every process whose environment has `needle`.
fn host_processes_with_env(needle: &str) -> Vec<(i32, u32, String)> {
    let mut found = Vec::new();
    for pid in std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
    {
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            continue;
        }
        let uid = warren_test_support::host_uid(pid);
        let ns = std::fs::read_link(format!("/proc/{pid}/ns/user"))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        found.push((pid, uid, ns));
    }
    found
}

fn host_uids() -> Vec<(String, u64)> {
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.first()?.to_string(), f.get(2)?.parse().ok()?))
        })
        .collect()
}

/// Class 1: nothing a tenant supplies reaches a host-side process. Loader
/// variables are refused by name; other variables exist only in processes
/// inside the sandbox's user namespace, under its own host uids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_variables_never_reach_a_host_process() {
    let c = cluster(&[]).await;
    let marker = format!("m{}", rand::random::<u64>());
    let facts = attack(&c, "env_vars", &[("WARREN_ENV_MARKER", marker.clone())]).await;
    let base: u64 = facts["uid_map"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("uid_map base");
    let me = std::fs::read_link("/proc/self/ns/user")
        .expect("own user ns")
        .display()
        .to_string();
    let holders = host_processes_with_env(&format!("T_MARKER={marker}"));
    assert!(
        !holders.is_empty(),
        "the sandbox's command carries the variable"
    );
    for (pid, uid, ns) in holders {
        assert_ne!(
            ns, me,
            "process {pid} with tenant variables runs in the host's user namespace"
        );
        assert!(
            u64::from(uid) >= base && u64::from(uid) < base + 65536,
            "process {pid} with tenant variables runs as host uid {uid}, outside the sandbox's range {base}.."
        );
    }
}

/// Class 2: the node never follows a path the sandbox can write. Symlinks
/// to a root-only host socket, planted by the sandbox's root wherever a
/// socket could be looked up, are never connected; a fork taken while the
/// parent swaps files for symlinks to a root-only host file leaks nothing
/// and keeps holes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_never_follows_sandbox_paths() {
    use std::os::unix::fs::PermissionsExt;
    let c = cluster(&[]).await;
    let host = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let sock = host.path().join("host.sock");
    let listener = tokio::net::UnixListener::bind(&sock).expect("host socket");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    let secret = host.path().join("secret");
    std::fs::write(&secret, "SECRET host file\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");

    attack(
        &c,
        "sockets_and_fork",
        &[
            ("WARREN_HOST_SOCKET", sock.display().to_string()),
            ("WARREN_HOST_SECRET", secret.display().to_string()),
        ],
    )
    .await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "the root-only host socket was connected"
    );
}

/// Class 3: one host identity per sandbox. Two tenants' sandboxes map to
/// distinct id ranges that hold no host account; user code cannot read or
/// signal envd; per-uid kernel state (inotify) is not shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandbox_has_its_own_host_identity() {
    let c = cluster(&[]).await;
    let facts = attack(&c, "identities", &[]).await;
    let bases: Vec<u64> = facts["maps"]
        .as_array()
        .expect("maps")
        .iter()
        .map(|m| m[1].as_str().and_then(|s| s.parse().ok()).expect("base"))
        .collect();
    assert_eq!(bases.len(), 2);
    assert_ne!(bases[0], bases[1]);
    for (name, uid) in host_uids() {
        for base in &bases {
            assert!(
                !(uid >= *base && uid < base + 65536),
                "host account {name} ({uid}) lies in a sandbox's id range"
            );
        }
    }
}

/// Class 4: limits hold on this machine (cgroup v1 hybrid) as on v2. A fork
/// bomb, a memory hog spread over two processes and a disk fill each end
/// inside their sandbox with a clear error there; the neighbour keeps
/// answering and the node keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_end_attacks_inside_their_sandbox() {
    let c = cluster(&[
        "--memory-limit-mb",
        "256",
        "--disk-limit-mb",
        "64",
        "--pids-limit",
        "256",
    ])
    .await;
    attack(
        &c,
        "limits",
        &[
            ("WARREN_MEMORY_MB", "256".into()),
            ("WARREN_DISK_MB", "64".into()),
        ],
    )
    .await;
    let health = get(&c.gateways[0].addr("gateway admin"), "/healthz").await;
    assert_eq!(health.status.as_u16(), 200, "the gateway still serves");
}

/// Class 5: a smaller kernel surface: keyrings, bpf, perf, mount, io_uring,
/// nf_tables (a `NETLINK_NETFILTER` socket) and the legacy iptables
/// `setsockopt`, every new namespace (`unshare` of user, mount, net, uts,
/// ipc, pid, cgroup, time), `pidfd_getfd` and `TIOCSTI` into the caller's
/// own terminal are refused (EPERM), for `user` and for the sandbox's root;
/// `unshare -n`/`-m`/`-T`/`-C` ... fail as root; `sudo`, `pip`, threads,
/// Python's multiprocessing and node still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_refuses_the_dangerous_system_calls() {
    let c = cluster(&[]).await;
    attack(&c, "kernel_surface", &[]).await;
}

/// Class 6: no host information inside: the sandbox's own hostname, passwd
/// and resolv.conf; no host path in mountinfo or pid 1's command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_host_information_inside() {
    let c = cluster(&[]).await;
    let mut paths = vec![
        c.dir().display().to_string(),
        workspace_root().display().to_string(),
    ];
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            paths.push(dir.display().to_string());
        }
    }
    // The host's own accounts (Debian's system accounts below 1000 are in
    // every template too, so they say nothing about the host).
    let accounts: Vec<String> = host_uids()
        .into_iter()
        .filter(|(name, uid)| *uid >= 1000 && !["nobody", "user"].contains(&name.as_str()))
        .map(|(name, _)| name)
        .collect();
    attack(
        &c,
        "host_information",
        &[
            (
                "WARREN_HOST_PATHS",
                serde_json::to_string(&paths).expect("json"),
            ),
            (
                "WARREN_HOST_ACCOUNTS",
                serde_json::to_string(&accounts).expect("json"),
            ),
        ],
    )
    .await;
}

/// Class 7: routing signals are the node's alone. An app in the sandbox
/// answering 404 + `X-Warren-Route: not-found` reaches the client as the app
/// sent it (no `X-Warren-*`), and the gateway evicts nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_apps_cannot_forge_routing_signals() {
    let c = cluster(&[]).await;
    attack(&c, "forged_marker", &[]).await;
    let metrics = get(&c.gateways[0].addr("gateway admin"), "/metrics")
        .await
        .text();
    let stale: f64 = metric_sum(
        &metrics,
        "warren_gateway_route_cache_evictions_total",
        "stale",
    );
    assert_eq!(
        stale, 0.0,
        "the gateway evicted a route for a sandbox app's 404:\n{metrics}"
    );
}

/// Class 8: no host descriptor and no terminal inside. A descriptor the
/// node inherited (as from an operator's shell) to a file holding a
/// secret, and the node's own log with that secret in it, are not
/// reachable from any process of the sandbox, as its root sees them
/// (`/proc/*/fd`, pid 1 included); `/dev/tty` is nobody's; envd's stdout
/// and stderr are the node's pipes, which the sandbox cannot open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_host_descriptor_reaches_a_sandbox() {
    use std::os::fd::AsRawFd;
    let secret = format!("SECRET{:016x}", rand::random::<u64>());
    let host = tempfile::tempdir().expect("tempdir");
    let secret_file = host.path().join("secret");
    std::fs::write(&secret_file, format!("{secret}\n")).expect("secret");
    // Inherited by what this test starts (std opens close-on-exec; an
    // operator's shell leaves descriptors open like this).
    let stray = std::fs::File::open(&secret_file).expect("open");
    nix::fcntl::fcntl(
        &stray,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .expect("clear FD_CLOEXEC");
    let c = logged_cluster("isolated").await;
    let node_pid = c.nodes[0].as_ref().and_then(|n| n.pid()).expect("node pid");
    let inherited = std::fs::read_link(format!("/proc/{node_pid}/fd/{}", stray.as_raw_fd()));
    assert_eq!(
        inherited.ok().as_deref(),
        Some(secret_file.as_path()),
        "the node inherited the stray descriptor (the attack needs it)"
    );
    drop(stray);
    // The node's log holds the secret too (as `warren dev`'s held its API key).
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(c.log("node-1"))
            .expect("the node's log");
        writeln!(f, "{secret}").expect("append");
    }
    attack(
        &c,
        "descriptors",
        &[("WARREN_SECRET_MARKER", secret.clone())],
    )
    .await;
}

/// Class 8, the node's side: what a sandbox's first processes write on
/// stdout and stderr (envd's log; anything the sandbox's root makes envd
/// write, by ptrace) reaches the node's log only as that sandbox's output,
/// labelled, with control characters escaped, and bounded: a 16 MiB flood
/// grows the log by a bounded amount. Run on the `process` runtime, whose
/// commands can open envd's stderr (an isolated sandbox's cannot), through
/// the same console code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_output_reaches_the_node_log_labelled_escaped_and_bounded() {
    let forged = format!("FORGED{:016x}", rand::random::<u64>());
    let c = logged_cluster("process").await;
    let log = c.log("node-1");
    let before = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let facts = attack(
        &c,
        "console_flood",
        &[("WARREN_FORGED_MARKER", forged.clone())],
    )
    .await;
    let sandbox = facts["sandbox"].as_str().expect("sandbox id").to_string();
    // The flood is over when the command answered; the node may still be
    // reading what the pipe held, so wait for the forged line.
    let text = warren_test_support::wait_until(
        "the forged line in the node's log",
        Duration::from_secs(60),
        || {
            let log = log.clone();
            let forged = forged.clone();
            async move {
                let text = std::fs::read_to_string(&log).ok()?;
                text.contains(&forged).then_some(text)
            }
        },
    )
    .await;
    for line in text.lines().filter(|l| l.contains(&forged)) {
        assert!(
            line.contains("warren_node::sandbox_output") && line.contains(&sandbox),
            "a line the sandbox wrote is not labelled as its output: {line}"
        );
        assert!(
            !line.contains('\u{1b}') && line.contains("\\u{1b}"),
            "a control character from the sandbox reached the log unescaped: {line:?}"
        );
    }
    // The node logs at most its burst plus its refill over the attack (the
    // case has at most 300 s): well under 4 MiB, whatever is still queued.
    let grown = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) - before;
    assert!(
        grown < 4 << 20,
        "a 16 MiB write on envd's stderr grew the node's log by {grown} bytes"
    );
}

/// Class 9: the operator's terminal. `warren dev` runs on a
/// pseudo-terminal as from a shell (`tests/e2b/terminal.py`); a sandbox,
/// as `user` and as root, tries to type into it (`TIOCSTI` on `/dev/tty`
/// and on every terminal descriptor it can find), to send it Ctrl-C and
/// to take its foreground: nothing reaches the terminal, `warren dev`
/// keeps running, and no process of the sandbox has a controlling
/// terminal. Then Ctrl-C typed into the terminal stops every part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_sandbox_reaches_the_operators_terminal() {
    let data = tempfile::tempdir().expect("tempdir");
    run_case(
        "http://127.0.0.1:9",
        "terminal.py",
        "terminal",
        "unused",
        &[
            ("WARREN_BIN", env!("CARGO_BIN_EXE_warren").to_string()),
            ("WARREN_DATA_DIR", data.path().display().to_string()),
        ],
        Duration::from_secs(600),
    )
    .await;
}

/// Class 10: host files only root can reach. The scheduler's database
/// holds no sandbox's envd token or `envVars` in the clear (sealed with
/// the store key), and it, its journal and the key are 0600 in a 0700
/// directory, so `nobody` reads none of them; the template store's blobs
/// are 0600 and its `blobs/`, `rootfs/` and `tmp/` (where layers are
/// unpacked) 0700, so a tenant's set-user-ID shell in a snapshot's layer
/// cannot be run by `nobody` from anywhere in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_files_hold_nothing_another_account_can_use() {
    use std::os::unix::fs::PermissionsExt;
    let c = cluster(&[]).await;
    let secret = format!("sk-{:032x}", rand::random::<u128>());
    let facts = attack(
        &c,
        "host_files",
        &[("WARREN_SECRET_MARKER", secret.clone())],
    )
    .await;
    let token = facts["token"]
        .as_str()
        .expect("the sandbox's envd token")
        .to_string();
    let snapshot = facts["snapshot"].as_str().expect("snapshot id").to_string();
    assert!(token.len() >= 16, "{token:?}");
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .permissions()
            .mode()
            & 0o777
    };
    // The scheduler's files: private, and nothing in the clear.
    let sched = c.dir().join("scheduler");
    assert_eq!(mode(&sched), 0o700, "{}", sched.display());
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&sched)
        .expect("the scheduler's data dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(
        files.iter().any(|f| f.ends_with("store.key")),
        "no store key beside the database: {files:?}"
    );
    for f in &files {
        assert_eq!(
            mode(f),
            0o600,
            "{} is readable by other accounts",
            f.display()
        );
        let bytes = std::fs::read(f).expect("read");
        for (what, needle) in [("envd token", &token), ("envVars value", &secret)] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{} holds the sandbox's {what} in the clear",
                f.display()
            );
        }
        assert!(
            !as_nobody(&["cat", &f.display().to_string()]).0,
            "nobody read {}",
            f.display()
        );
    }
    // The template store (the cluster's own, where its snapshot went):
    // private where it holds tenants' files.
    let store = c
        .template_dir()
        .expect("the cluster's template store")
        .to_path_buf();
    for sub in ["blobs", "rootfs", "tmp"] {
        assert_eq!(mode(&store.join(sub)), 0o700, "{sub}");
    }
    for blob in std::fs::read_dir(store.join("blobs"))
        .expect("blobs")
        .flatten()
    {
        assert_eq!(mode(&blob.path()), 0o600, "{}", blob.path().display());
    }
    let shells: Vec<std::path::PathBuf> = std::fs::read_dir(store.join("rootfs"))
        .expect("rootfs")
        .flatten()
        .map(|e| e.path().join("home/user/suid-bash"))
        .filter(|p| p.exists())
        .collect();
    assert!(
        !shells.is_empty(),
        "the snapshot's layer is not unpacked in the store"
    );
    for shell in &shells {
        let bits = std::fs::metadata(shell).expect("stat").permissions().mode();
        assert_ne!(
            bits & 0o4000,
            0,
            "the layer keeps the sandbox's set-user-ID bit"
        );
        let (ran, out) = as_nobody(&[&shell.display().to_string(), "-p", "-c", "id -u"]);
        assert!(
            !ran,
            "nobody ran the tenant's set-user-ID shell {}: {out}",
            shell.display()
        );
    }
    attack(&c, "host_files_cleanup", &[("WARREN_SNAPSHOT", snapshot)]).await;
}

/// Runs `argv` as the account `nobody`: whether it succeeded, and its output.
fn as_nobody(argv: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .args(argv)
        .output()
        .expect("runuser");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// One node of `runtime`, each part logging to its file in the cluster's dir.
async fn logged_cluster(runtime: &str) -> Cluster {
    start(runtime, &[], true).await
}

async fn get(addr: &str, path: &str) -> warren_test_support::http::Answer {
    warren_test_support::http::Http::new(Duration::from_secs(10))
        .send(http::Method::GET, addr, path, &[], None)
        .await
        .expect("the gateway's admin listener answers")
}

/// The sum of a counter's samples whose labels contain `label_part`.
fn metric_sum(text: &str, name: &str, label_part: &str) -> f64 {
    let mut by_line: HashMap<&str, f64> = HashMap::new();
    for line in text.lines() {
        if line.starts_with(name) && line.contains(label_part) {
            if let Some((k, v)) = line.rsplit_once(' ') {
                by_line.insert(k, v.parse().unwrap_or(0.0));
            }
        }
    }
    by_line.values().sum()
}
