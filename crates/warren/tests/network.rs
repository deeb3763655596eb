//! E2B's network API, one test per case, with the real `e2b` SDK through a
//! gateway (`tests/e2b/network.py`): `update_network` changes a running
//! isolated sandbox's egress at once (an address refused, allowed, refused
//! again; a sandbox created without a network given one), bad rules are a
//! 400 naming the entry and another team's sandbox a 404; the process
//! runtime answers 501 saying why; `allow_public_traffic=False` makes the
//! sandbox's ports need its traffic access token (envd's does not), on
//! any runtime, and the token is stored nowhere; `mask_request_host` is the Host a server in the
//! sandbox sees.
//!
//! The egress target is a listener in a network namespace of its own,
//! reached over a veth pair: routable from the host, yet none of the
//! host's own addresses (which every sandbox is refused), and no outside
//! host is needed. The isolated cases need what the security suite needs
//! (root, cgroups, slirp4netns, nftables, `ip`, the `base` template).

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;

/// In E2B's format (`e2b_` + 40 hex), as a user's SDK would send it.
const KEY: &str = "e2b_2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f1a3c5e7b9d";
/// Another team's key.
const OTHER_KEY: &str = "e2b_3c5e7a9b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c";

async fn cluster(runtime: &str) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: runtime.into(),
            keys: vec![
                (KEY.into(), "team-a".into()),
                (OTHER_KEY.into(), "team-b".into()),
            ],
            ..Spec::default()
        },
    )
    .await
    .expect("the cluster starts (isolated: needs root, cgroups, slirp4netns, nftables and the base template)")
}

async fn run(c: &Cluster, name: &str, env: &[(&str, String)]) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    let mut env = env.to_vec();
    env.push(("WARREN_OTHER_KEY", OTHER_KEY.to_string()));
    run_case(
        &gateway,
        "network.py",
        name,
        KEY,
        &env,
        Duration::from_secs(600),
    )
    .await
}

/// A TCP listener at `198.19.x.2` in a network namespace of its own,
/// joined to the host by a veth pair (the host's end `198.19.x.1`): an
/// address the host routes to that is not the host's. Removed on drop.
struct Target {
    netns: String,
    listener: std::process::Child,
    addr: String,
}

impl Target {
    fn start() -> Target {
        static NEXT: AtomicU8 = AtomicU8::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}{n}", std::process::id() % 100_000);
        // 198.18.0.0/15 is for benchmarks: never a real destination.
        let subnet = format!("198.19.{}.{}", std::process::id() % 250, u32::from(n) * 4);
        let base: Vec<u8> = subnet
            .split('.')
            .map(|p| p.parse().expect("octet"))
            .collect();
        let host_ip = format!("198.19.{}.{}", base[2], base[3] + 1);
        let ns_ip = format!("198.19.{}.{}", base[2], base[3] + 2);
        let netns = format!("wrn-net-{tag}");
        let (host_if, ns_if) = (format!("wrnh{tag}"), format!("wrnp{tag}"));
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("ip runs");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip(&["netns", "add", &netns]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &netns,
        ]);
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        let ns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &netns, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        ns(&["addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if]);
        ns(&["link", "set", &ns_if, "up"]);
        ns(&["link", "set", "lo", "up"]);
        ns(&["route", "add", "default", "via", &host_ip]);
        let port = 8000;
        let listener = std::process::Command::new("ip")
            .args(["netns", "exec", &netns, "python3", "-c"])
            .arg(
                "import socket,sys\n\
                 s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                 s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)\n\
                 print('listening', flush=True)\n\
                 while True:\n    c,_=s.accept(); c.close()\n",
            )
            .args([&ns_ip, &port.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("the target listener starts");
        let mut t = Target {
            netns,
            listener,
            addr: format!("{ns_ip}:{port}"),
        };
        // Listening once it says so.
        let mut line = String::new();
        let out = t.listener.stdout.take().expect("stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line)
            .expect("the listener's first line");
        assert_eq!(line.trim(), "listening");
        // The host itself reaches it (what a sandbox's slirp4netns does).
        std::net::TcpStream::connect_timeout(
            &t.addr.parse().expect("addr"),
            Duration::from_secs(5),
        )
        .expect("the host connects to the target");
        t
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.listener.kill();
        let _ = self.listener.wait();
        // Deleting the namespace deletes the veth pair with it.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// An isolated sandbox created denying the target's address cannot reach
/// it; after `update_network({})` it can; after one that denies it again it
/// cannot; `deny_out` everything with `allow_out` it: it can; no internet:
/// it cannot. Bad rules are a 400 naming the entry (nothing changes);
/// another team's sandbox is a 404. GET /sandboxes/{id} reports the rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_network_changes_egress_live() {
    let target = Target::start();
    let c = cluster("isolated").await;
    let facts = run(
        &c,
        "update_egress",
        &[("WARREN_TARGET", target.addr.clone())],
    )
    .await;
    assert_eq!(facts["steps"]["after {}"], "ok", "{facts}");
}

/// A sandbox created with `allow_internet_access=False` (no network
/// interface at all) is given one by an update, and loses it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_without_network_is_given_one() {
    let target = Target::start();
    let c = cluster("isolated").await;
    let facts = run(
        &c,
        "network_given_later",
        &[("WARREN_TARGET", target.addr.clone())],
    )
    .await;
    assert_eq!(facts["steps"]["given"], "ok", "{facts}");
}

/// `allow_public_traffic=False`: a port other than envd's answers 403
/// without the traffic access token (or with another), and the server's
/// answer with it (the token is not passed on); envd works without it; the
/// token is in no listing and connect hands it out again; paused, the
/// sandbox is woken by a request with the token, not by one without; a
/// public sandbox needs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_ports_need_the_traffic_token() {
    let c = cluster("isolated").await;
    let facts = run(&c, "private_traffic", &[]).await;
    assert_eq!(facts["missing"]["code"], 403, "{facts}");
}

/// `mask_request_host`: the server in the sandbox sees the mask (its
/// `${PORT}` replaced) as Host; an unmasked sandbox sees the client's; a
/// bad mask is a 400 at create.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_a_sandbox_sees_is_the_mask() {
    let c = cluster("isolated").await;
    let facts = run(&c, "mask_host", &[]).await;
    assert_eq!(facts["seen"], "custom-host.example.com:8080", "{facts}");
}

/// The process runtime has no network isolation: `update_network` is a
/// 501 that says so, and the sandbox is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_runtime_says_it_has_no_network_isolation() {
    let c = cluster("process").await;
    let facts = run(&c, "no_isolation", &[]).await;
    assert_eq!(facts["status"], 501, "{facts}");
}

/// The node checks the traffic token whatever the runtime: a private
/// `process` sandbox's port needs it too, and its Host is masked. The
/// token is written nowhere under the cluster's directories (the node keeps
/// its SHA-256 in `sandbox.json`; the gateway derives it when asked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_traffic_token_is_checked_on_any_runtime_and_never_stored() {
    let c = cluster("process").await;
    let port = warren_harness::free_port()
        .expect("a free port")
        .to_string();
    let facts = run(&c, "private_process", &[("WARREN_PORT", port)]).await;
    let token = facts["token"].as_str().expect("token").to_string();
    let mut stack = vec![c.dir().to_path_buf()];
    let mut files = 0;
    let mut digests = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => {
                    files += 1;
                    let bytes = std::fs::read(&path).unwrap_or_default();
                    if path.ends_with("sandbox.json")
                        && String::from_utf8_lossy(&bytes).contains("traffic_token_sha256")
                    {
                        digests += 1;
                    }
                    assert!(
                        !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
                        "the traffic token is in {}",
                        path.display()
                    );
                }
                _ => {}
            }
        }
    }
    assert!(files > 0, "nothing under {}", c.dir().display());
    assert_eq!(
        digests, 1,
        "the sandbox's sandbox.json keeps the token's digest"
    );
}
