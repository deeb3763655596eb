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
//! Egress under load and bounds: `allowOut`/`denyOut` past 1 000 entries
//! are a 400 naming the field and the limit, and a sandbox's nftables
//! table (read back from the kernel) has as many rules with a thousand
//! entries as with one, its addresses in sets; DNS follows the policy; a
//! sandbox's slirp4netns is in the sandbox's cgroups and goes with a kill
//! while paused.
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

/// The host's resolvers, as its /etc/resolv.conf names them (what the node
/// reads too).
fn host_resolvers() -> Vec<String> {
    std::fs::read_to_string("/etc/resolv.conf")
        .expect("/etc/resolv.conf")
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(|a| a.trim().to_string())
        .filter(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
        .collect()
}

/// The host's ruleset as `nft -j` reports it.
fn ruleset() -> Vec<serde_json::Value> {
    let out = std::process::Command::new("nft")
        .args(["-j", "list", "ruleset"])
        .output()
        .expect("nft runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nft -j is JSON");
    v["nftables"].as_array().cloned().unwrap_or_default()
}

/// The name of the table whose base chain sends the sockets of host uids
/// `uid..uid+65535` on (the sandbox's own; the guard covers every range).
fn table_of(objects: &[serde_json::Value], uid: u64) -> Option<String> {
    objects.iter().find_map(|o| {
        let r = &o["rule"];
        let starts = r["expr"].as_array()?.iter().any(|e| {
            e["match"]["left"]["meta"]["key"] == "skuid"
                && e["match"]["right"]["range"][0].as_u64() == Some(uid)
                && e["match"]["right"]["range"][1].as_u64() == Some(uid + 65535)
        });
        starts.then(|| r["table"].as_str().map(str::to_string))?
    })
}

/// `(chain, its rules' expressions)`, by chain name.
type Chains = Vec<(String, Vec<serde_json::Value>)>;

/// The chains of table `table`, and `(set, elements)`.
fn shape(objects: &[serde_json::Value], table: &str) -> (Chains, Vec<(String, usize)>) {
    let mut chains: Chains = Vec::new();
    let mut sets = Vec::new();
    for o in objects {
        if o["rule"]["table"] == table {
            let chain = o["rule"]["chain"].as_str().unwrap_or_default().to_string();
            let expr = o["rule"]["expr"].clone();
            match chains.iter_mut().find(|(c, _)| *c == chain) {
                Some((_, rules)) => rules.push(expr),
                None => chains.push((chain, vec![expr])),
            }
        }
        if o["set"]["table"] == table {
            let n = o["set"]["elem"].as_array().map_or(0, Vec::len);
            sets.push((o["set"]["name"].as_str().unwrap_or_default().to_string(), n));
        }
    }
    chains.sort_by(|a, b| a.0.cmp(&b.0));
    sets.sort();
    (chains, sets)
}

/// The structural side of "egress rules cost the host nothing per entry":
/// past 1 000 entries a create (SDK and HTTP) and an update are a 400
/// naming the field and the limit; at the limit the policy holds (its
/// denied address refused, then allowed when `allowOut` names it), and the
/// sandbox's table, read back from the kernel, has exactly the rules of a
/// sandbox with one entry a list (one in the hooked chain: host packets
/// meet only that), its entries all in sets. Timing the host's connects is
/// `bench/egress-rules.sh`'s (docs/benchmarks.md), not a test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_rules_cost_the_host_nothing_per_entry() {
    let target = Target::start();
    let c = cluster("isolated").await;
    let facts = run(
        &c,
        "bounded_lists",
        &[("WARREN_TARGET", target.addr.clone())],
    )
    .await;
    let objects = ruleset();
    let uid = |k: &str| facts[k].as_u64().unwrap_or_else(|| panic!("{k}: {facts}"));
    let full = table_of(&objects, uid("full")).expect("the full sandbox's table");
    let small = table_of(&objects, uid("small")).expect("the small sandbox's table");
    let (full_chains, full_sets) = shape(&objects, &full);
    let (small_chains, small_sets) = shape(&objects, &small);
    // The same rules, whatever the entries (the uid range aside).
    let count = |chains: &Chains| -> Vec<(String, usize)> {
        chains.iter().map(|(c, r)| (c.clone(), r.len())).collect()
    };
    assert_eq!(count(&full_chains), count(&small_chains), "{full_chains:?}");
    let out = full_chains
        .iter()
        .find(|(c, _)| c == "out")
        .expect("a hooked chain");
    assert_eq!(out.1.len(), 1, "host packets meet one rule: {:?}", out.1);
    assert_eq!(
        full_chains
            .iter()
            .find(|(c, _)| c == "egress")
            .map(|(_, r)| r),
        small_chains
            .iter()
            .find(|(c, _)| c == "egress")
            .map(|(_, r)| r),
        "the policy chains differ"
    );
    // Entries live in sets: no rule names an address of the lists.
    let rules_text = serde_json::to_string(&full_chains).expect("json");
    assert!(
        !rules_text.contains("100.64.") && !rules_text.contains("203.0."),
        "an entry became a rule: {rules_text}"
    );
    let elems = |sets: &[(String, usize)], name: &str| {
        sets.iter().find(|(n, _)| n == name).map_or(0, |(_, n)| *n)
    };
    assert_eq!(elems(&full_sets, "deny4"), 1000, "{full_sets:?}");
    assert_eq!(elems(&full_sets, "allow4"), 1000, "{full_sets:?}");
    assert_eq!(
        (elems(&small_sets, "deny4"), elems(&small_sets, "allow4")),
        (1, 1)
    );
    assert_eq!(facts["steps"]["allowed among 1000"], "ok", "{facts}");
}

/// DNS under the policy: a default sandbox resolves (through slirp's
/// 10.0.2.3 and at the host's resolver itself); a `denyOut` naming the
/// resolver refuses DNS (at create and by an update), unless `allowOut`
/// names it too; with internet off, a sandbox with an address allowed
/// cannot resolve, one with a domain allowed can, one with nothing has no
/// network at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_follows_the_policy() {
    let resolvers = host_resolvers();
    assert!(!resolvers.is_empty(), "the host has an IPv4 resolver");
    let target = Target::start();
    let c = cluster("isolated").await;
    let facts = run(
        &c,
        "dns_under_policy",
        &[
            ("WARREN_TARGET", target.addr.clone()),
            (
                "WARREN_RESOLVERS",
                serde_json::to_string(&resolvers).expect("json"),
            ),
        ],
    )
    .await;
    assert_eq!(
        facts["seen"]["no internet, address allowed"]["host resolver tcp"], "refused",
        "{facts}"
    );
}

/// The `(pid, uid, launcher pid)` of every slirp4netns on the host.
fn slirps() -> Vec<(i32, u64, i32)> {
    let mut found = Vec::new();
    for pid in std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
    {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "slirp4netns" {
            continue;
        }
        let uid = warren_test_support::host_uid(pid);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let launcher = cmdline
            .split(|b| *b == 0)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .find_map(|a| a.strip_prefix("--userns-path=/proc/"))
            .and_then(|a| a.split('/').next()?.parse().ok())
            .unwrap_or(0);
        found.push((pid, u64::from(uid), launcher));
    }
    found
}

/// slirp4netns inside the sandbox's bounds: the sandbox's slirp4netns (the
/// one running as its first host uid) is in exactly the cgroups of the
/// sandbox's launcher, every hierarchy, named for the sandbox; it lives
/// through a pause and a resume (the network works after), and a kill
/// while paused takes it and its nftables table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slirp4netns_runs_inside_the_sandboxs_cgroups() {
    let target = Target::start();
    let c = cluster("isolated").await;
    let env = [("WARREN_TARGET", target.addr.clone())];
    let facts = run(&c, "slirp_running", &env).await;
    let sandbox = facts["sandbox"].as_str().expect("sandbox").to_string();
    let uid = facts["uid"].as_u64().expect("uid");
    let mine: Vec<_> = slirps().into_iter().filter(|s| s.1 == uid).collect();
    assert_eq!(mine.len(), 1, "the sandbox's slirp4netns: {:?}", slirps());
    let (pid, _, launcher) = mine[0];
    let cgroups = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/cgroup: {e}"))
    };
    let (theirs, its) = (cgroups(pid), cgroups(launcher));
    assert_eq!(
        theirs, its,
        "slirp4netns ({pid}) is not in the cgroups of its sandbox's launcher ({launcher})"
    );
    let named: Vec<&str> = theirs.lines().filter(|l| l.contains(&sandbox)).collect();
    assert!(
        named
            .iter()
            .any(|l| l.contains("memory") || l.starts_with("0::")),
        "slirp4netns is not in the sandbox's memory cgroup:\n{theirs}"
    );
    for controller in ["pids", "freezer"] {
        assert!(
            theirs.starts_with("0::")
                || named
                    .iter()
                    .any(|l| l.split(':').nth(1).is_some_and(|c| c.contains(controller))),
            "slirp4netns is not in the sandbox's {controller} cgroup:\n{theirs}"
        );
    }
    let facts = run(
        &c,
        "slirp_pause_kill",
        &[
            ("WARREN_TARGET", target.addr.clone()),
            ("WARREN_SANDBOX", sandbox.clone()),
        ],
    )
    .await;
    assert_eq!(facts["after_resume"], "ok", "{facts}");
    // Killed while frozen, it dies once thawed; its table goes after it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists()
            && slirps().iter().any(|s| s.0 == pid);
        let table = table_of(&ruleset(), uid);
        if !alive && table.is_none() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "60 s after the kill: slirp4netns alive {alive}, table {table:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
