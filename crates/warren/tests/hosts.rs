//! warren on hosts that share nothing but the network
//! (`warren_harness::hosts`): two scheduler replicas on PostgreSQL, three
//! nodes and two gateways, each on a host of its own (a network namespace
//! with its own address and directories, internal mutual TLS with
//! certificates for those addresses), and stock HAProxy in front of the
//! gateways on the machine, where the database listens too. Needs root and
//! `haproxy` (`.ci/run` installs it); nodes run `--runtime process`.
#![allow(unused_crate_dependencies)]

use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use warren_chaos::haproxy::{Backend, Balancer, Mode};
use warren_harness::garage::GarageServer;
use warren_harness::hosts::{Host, Network};
use warren_harness::postgres::PgServer;
use warren_harness::Proc;
use warren_test_support::http::{Answer, Http};
use warren_test_support::wait_until;
use warren_trust::{Identity, Role, TlsArgs};

const KEY: &str = "key-hosts";
const ENVD: u16 = 49983;
/// Every part listens on its own host's address, so the ports can be fixed.
const GRPC: u16 = 7000;
const HTTP: u16 = 3000;
const ADMIN: u16 = 3001;

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// How the parts run: the nodes' runtime, and where the layers and
/// records are.
#[derive(Default)]
struct Setup {
    /// Nodes run `--runtime isolated` (else `process`).
    isolated: bool,
    /// Nodes and gateways get `--blob-store`.
    blobs: Option<Blobs>,
    /// node-1's `--capacity` (default: the node's).
    first_node_capacity: Option<u32>,
}

/// A blob store as the parts are given it.
struct Blobs {
    url: String,
    /// `--blob-store-option` values (never a secret).
    options: Vec<String>,
    /// The environment with its credentials.
    env: Vec<(String, String)>,
}

impl Blobs {
    fn of(garage: &GarageServer) -> Blobs {
        let mut options = Vec::new();
        let mut env = Vec::new();
        for (k, v) in garage.options() {
            match k.as_str() {
                "access_key_id" => env.push(("AWS_ACCESS_KEY_ID".to_string(), v)),
                "secret_access_key" => env.push(("AWS_SECRET_ACCESS_KEY".to_string(), v)),
                _ => options.push(format!("{k}={v}")),
            }
        }
        Blobs {
            url: garage.url(),
            options,
            env,
        }
    }

    /// `<url_flag> URL <option_flag> OPTION ...`.
    fn args(&self, url_flag: &str, option_flag: &str) -> Vec<String> {
        let mut a = vec![url_flag.to_string(), self.url.clone()];
        for o in &self.options {
            a.push(option_flag.to_string());
            a.push(o.clone());
        }
        a
    }
}

/// The running parts. Fields drop in order: the processes stop before
/// their hosts' namespaces and the bridge go.
struct Hosts {
    isolated: bool,
    schedulers: Vec<Proc>,
    nodes: Vec<Proc>,
    gateways: Vec<Proc>,
    balancer: Balancer,
    /// The schedulers' database's URL.
    db: String,
    node_hosts: Vec<Host>,
    _other_hosts: Vec<Host>,
    _pg: PgServer,
    _net: Network,
}

impl Hosts {
    async fn start(setup: Setup) -> Hosts {
        let net = Network::create().expect("a bridge and hosts (root, iproute2)");
        Hosts::start_on(net, setup).await
    }

    async fn start_on(net: Network, setup: Setup) -> Hosts {
        let pg = PgServer::start_on(&net.machine_addr()).expect("PostgreSQL on the bridge");
        let db = pg.create_database("hosts").expect("a database");
        let dir = net.dir().to_path_buf();
        let add = |name: &str| net.add_host(name).expect("a host");
        let scheduler_hosts = [add("scheduler-1"), add("scheduler-2")];
        let node_hosts = vec![add("node-1"), add("node-2"), add("node-3")];
        let gateway_hosts = [add("gateway-1"), add("gateway-2")];

        // One CA; each part's certificate names its host's address.
        let certs = dir.join("certs");
        let ca =
            warren_trust::issue::Ca::load_or_create(&certs, warren_trust::issue::Validity::days(1))
                .expect("a CA");
        let tls = |role: Role, host: &Host| -> Vec<String> {
            let id = Identity::new(role, &host.name).expect("identity");
            ca.issue(
                &id,
                std::slice::from_ref(&host.addr),
                warren_trust::issue::Validity::days(1),
            )
            .and_then(|c| c.save(&certs, &warren_trust::issue::file_base(&id)))
            .expect("a certificate");
            TlsArgs::from_dir(&certs, &id).to_args()
        };
        let store_key = dir.join("store.key");
        warren_harness::write_store_key(&store_key).expect("store key");
        let keys = dir.join("api-keys");
        warren_core::private::write(&keys, format!("{KEY} team-hosts\n").as_bytes())
            .expect("keys file");

        // `warren <role> --listen <host>:<port> --admin-listen <host>:3001
        // <extra> <tls>` on `host`, once it announced both listeners.
        let no_env: Vec<(String, String)> = Vec::new();
        let env = setup.blobs.as_ref().map_or(&no_env, |b| &b.env);
        let start = |role: Role, host: &Host, port: u16, extra: &[String]| {
            let part = role.as_str();
            let mut args = strings(&[
                part,
                "--listen",
                &format!("{}:{port}", host.addr),
                "--admin-listen",
                &format!("{}:{ADMIN}", host.addr),
            ]);
            args.extend(extra.iter().cloned());
            args.extend(tls(role, host));
            let listener = if role == Role::Scheduler {
                "grpc"
            } else {
                "http"
            };
            let log = host.dir().join("log");
            let mut launch = host.launch(bin(), &args);
            for (k, v) in env {
                launch = launch.env(k, v);
            }
            let launch = launch
                .exit_with_parent()
                .wait_for(&[&format!("{part} {listener}"), &format!("{part} admin")])
                .log_to(&log);
            async move {
                launch
                    .spawn()
                    .await
                    .unwrap_or_else(|e| panic!("{e:#}\n{}", read(&log)))
            }
        };
        let (store_key, keys) = (store_key.display().to_string(), keys.display().to_string());
        let mut schedulers = Vec::new();
        for h in &scheduler_hosts {
            let extra = strings(&[
                "--database-url",
                &db,
                "--store-key-file",
                &store_key,
                "--lease",
                "2s",
                "--sweep-interval",
                "250ms",
            ]);
            schedulers.push(start(Role::Scheduler, h, GRPC, &extra).await);
        }
        let scheduler_urls = scheduler_hosts
            .iter()
            .map(|h| format!("http://{}:{GRPC}", h.addr))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for h in &node_hosts {
            let data = h.dir().join("data").display().to_string();
            let mut extra = strings(&[
                "--node-id",
                &h.name,
                "--scheduler",
                &scheduler_urls,
                "--data-dir",
                &data,
                "--runtime",
                if setup.isolated {
                    "isolated"
                } else {
                    "process"
                },
            ]);
            if let (Some(n), "node-1") = (setup.first_node_capacity, h.name.as_str()) {
                extra.push("--capacity".into());
                extra.push(n.to_string());
            }
            if let Some(b) = &setup.blobs {
                extra.extend(b.args("--blob-store", "--blob-store-option"));
                extra.push("--cache-dir".into());
                extra.push(h.dir().join("cache").display().to_string());
            }
            nodes.push(start(Role::Node, h, HTTP, &extra).await);
        }
        let mut gateways = Vec::new();
        for h in &gateway_hosts {
            let mut extra = strings(&[
                "--scheduler",
                &scheduler_urls,
                "--api-keys-file",
                &keys,
                "--connect-timeout",
                "500ms",
                "--admin-team",
                "team-hosts",
            ]);
            if let Some(b) = &setup.blobs {
                extra.extend(b.args("--blob-store", "--blob-store-option"));
            }
            gateways.push(start(Role::Gateway, h, HTTP, &extra).await);
        }
        let backends: Vec<Backend> = gateway_hosts
            .iter()
            .map(|h| Backend {
                http: format!("{}:{HTTP}", h.addr),
                admin_port: ADMIN,
            })
            .collect();
        let balancer = Balancer::start(Mode::L7, &backends, &dir)
            .await
            .expect("HAProxy (apt-get install haproxy)");
        let mut other_hosts: Vec<Host> = scheduler_hosts.into_iter().collect();
        other_hosts.extend(gateway_hosts);
        let hosts = Hosts {
            isolated: setup.isolated,
            schedulers,
            nodes,
            gateways,
            balancer,
            db: db.clone(),
            node_hosts,
            _other_hosts: other_hosts,
            _pg: pg,
            _net: net,
        };
        for i in 0..hosts.node_hosts.len() {
            hosts.wait_ready(i).await;
        }
        hosts
    }

    /// Waits until node `i` has registered with the scheduler.
    async fn wait_ready(&self, i: usize) {
        let admin = format!("{}:{ADMIN}", self.node_hosts[i].addr);
        wait_until(
            &format!("node-{} to register", i + 1),
            Duration::from_secs(60),
            || {
                let admin = admin.clone();
                async move {
                    let a = Http::new(Duration::from_secs(5))
                        .send(Method::GET, &admin, "/readyz", &[], None)
                        .await
                        .ok()?;
                    a.status.is_success().then_some(())
                }
            },
        )
        .await;
    }

    /// Waits until the scheduler says node `i` is up (`GET /nodes`).
    async fn wait_up(&self, i: usize) {
        let name = self.node_hosts[i].name.clone();
        wait_until(
            &format!("the scheduler to see {name} up"),
            Duration::from_secs(60),
            || {
                let name = name.clone();
                async move {
                    let r = send(
                        &self.balancer.addr,
                        Method::GET,
                        "/nodes",
                        &[("x-api-key", KEY)],
                        None,
                    )
                    .await;
                    let nodes = r.expect_json();
                    nodes
                        .as_array()?
                        .iter()
                        .any(|n| n["nodeID"] == name.as_str() && n["status"] == "ready")
                        .then_some(())
                }
            },
        )
        .await;
    }

    /// A sandbox created through HAProxy.
    async fn create(&self) -> Value {
        self.create_from(&self.balancer.addr, "base").await
    }

    /// A sandbox of `template` (without internet access) created through
    /// `entry`.
    async fn create_from(&self, entry: &str, template: &str) -> Value {
        let r = self.try_create(entry, template).await;
        assert_eq!(
            r.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        r.expect_json()
    }

    async fn try_create(&self, entry: &str, template: &str) -> Answer {
        send(
            entry,
            Method::POST,
            "/v2/sandboxes",
            &[("x-api-key", KEY)],
            Some(if self.isolated {
                // Nodes in a test network may have no way out.
                json!({"templateID": template, "timeout": 120, "allow_internet_access": false})
            } else {
                json!({"templateID": template, "timeout": 120})
            }),
        )
        .await
    }

    /// envd's `/health` of sandbox `id` through `entry` (HAProxy or a
    /// gateway's `host:port`).
    async fn health(&self, entry: &str, id: &str) -> Answer {
        let port = ENVD.to_string();
        send(
            entry,
            Method::GET,
            "/health",
            &[("e2b-sandbox-id", id), ("e2b-sandbox-port", &port)],
            None,
        )
        .await
    }

    /// HAProxy, then each gateway directly.
    fn entries(&self) -> Vec<String> {
        let mut all = vec![self.balancer.addr.clone()];
        all.extend(self.gateways.iter().map(|g| g.addr("gateway http")));
        all
    }
}

/// Sandboxes spread over three hosts and are reached from every entry;
/// a node's host cut off from the network answers `node_down` once its
/// lease runs out while the others keep answering and new sandboxes go
/// elsewhere; plugged back in, its sandbox answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_on_separate_hosts_route_and_survive_a_host_cut_off() {
    let h = Hosts::start(Setup::default()).await;
    assert_eq!(h.schedulers.len(), 2);
    assert_eq!(h.nodes.len(), 3);

    // Least loaded first: one sandbox on each node's host.
    let mut on = Vec::new();
    for _ in 0..3 {
        let sb = h.create().await;
        on.push((
            sb["sandboxID"].as_str().expect("id").to_string(),
            sb["clientID"].as_str().expect("clientID").to_string(),
        ));
    }
    let mut nodes: Vec<&str> = on.iter().map(|(_, n)| n.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["node-1", "node-2", "node-3"], "{on:?}");
    for entry in h.entries() {
        for (id, node) in &on {
            let r = h.health(&entry, id).await;
            assert_eq!(
                r.status,
                StatusCode::NO_CONTENT,
                "{id} on {node} through {entry}: {}",
                r.message()
            );
        }
    }

    // node-2's host loses its network.
    let (cut_id, _) = on
        .iter()
        .find(|(_, n)| n == "node-2")
        .cloned()
        .expect("a sandbox on node-2");
    h.node_hosts[1].disconnect().expect("cable out");
    let down = wait_until(
        "node-2's sandbox to answer node_down",
        Duration::from_secs(60),
        || {
            let (h, id) = (&h, cut_id.clone());
            async move {
                let r = h.health(&h.balancer.addr, &id).await;
                (r.status == StatusCode::BAD_GATEWAY
                    && r.expect_json()["error_code"] == "node_down")
                    .then_some(r)
            }
        },
    )
    .await;
    assert_eq!(
        down.message(),
        format!("sandbox {cut_id} is on a node that is down")
    );
    for (id, node) in on.iter().filter(|(id, _)| *id != cut_id) {
        let r = h.health(&h.balancer.addr, id).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{id} on {node}");
    }
    let elsewhere = h.create().await;
    assert_ne!(elsewhere["clientID"], "node-2", "{elsewhere}");
    let id = elsewhere["sandboxID"].as_str().expect("id");
    assert_eq!(
        h.health(&h.balancer.addr, id).await.status,
        StatusCode::NO_CONTENT
    );

    // Plugged back in: it registers again with its roster, and the
    // scheduler gives it back the sandbox nobody took over meanwhile
    // (docs/node-loss.md): it answers again, through every entry.
    h.node_hosts[1].reconnect().expect("cable in");
    h.wait_up(1).await;
    wait_until(
        "node-2's sandbox to answer again",
        Duration::from_secs(60),
        || {
            let (h, id) = (&h, cut_id.clone());
            async move {
                let r = h.health(&h.balancer.addr, &id).await;
                (r.status == StatusCode::NO_CONTENT).then_some(())
            }
        },
    )
    .await;
    for entry in h.entries() {
        let r = h.health(&entry, &cut_id).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{cut_id} through {entry}");
    }
}

/// Nothing shared but the network, and now no template store either:
/// `base` is pushed to a real S3 server (Garage, on the machine) and its
/// record imported through the gateways (`warren template push
/// --import`); nodes run isolated sandboxes from layers they fetch into
/// their own caches, and every record is the scheduler's. A snapshot taken
/// on one host through one gateway is listed by the other and starts on
/// another host, with the file written before it. A blob corrupted in the
/// bucket is refused (503 naming it) and never unpacked. With the store down,
/// hosts still create from what they hold, and placement sends creates to
/// them; a template no host holds gets a 503 naming the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_on_one_host_starts_on_another_from_the_blob_store() {
    let net = Network::create().expect("a bridge and hosts (root, iproute2)");
    let addr: std::net::Ipv4Addr = net.machine_addr().parse().expect("an IPv4 address");
    let mut garage = tokio::task::spawn_blocking(move || GarageServer::start_on(addr))
        .await
        .expect("the garage task")
        .expect("Garage (cargo install garage; .ci/run installs it)");
    let blobs = Blobs::of(&garage);
    let store = base_only_store();
    let h = Hosts::start_on(
        net,
        Setup {
            isolated: true,
            blobs: Some(Blobs::of(&garage)),
            // Full with one sandbox: what it snapshots starts elsewhere.
            first_node_capacity: Some(1),
        },
    )
    .await;
    let gateways: Vec<String> = h.gateways.iter().map(|g| g.addr("gateway http")).collect();

    // The operator's upgrade: the store's blobs into the blob store, its
    // templates' records into the scheduler's, one command.
    push_and_import(&h, store.path(), &blobs);
    for gw in &gateways {
        let r = send(gw, Method::GET, "/templates", &[("x-api-key", KEY)], None).await;
        let names: Vec<Value> = r.expect_json().as_array().cloned().unwrap_or_default();
        assert!(
            names.iter().any(|t| t["templateID"] == "base"),
            "{gw}: {}",
            r.text()
        );
    }

    // A sandbox on one host (fetching base into its cache), a file in it.
    let a = h.create_from(&h.balancer.addr, "base").await;
    let client = warren_client::Client::new(&[format!("http://{}", h.balancer.addr)], KEY)
        .expect("a client");
    let sa: warren_client::Sandbox = serde_json::from_value(a.clone()).expect("a sandbox");
    client
        .write_file(
            &sa,
            "/home/user/mark.txt",
            "user",
            "written on the first host".into(),
        )
        .await
        .expect("a file written");
    let r = send(
        &gateways[0],
        Method::POST,
        &format!("/sandboxes/{}/snapshots", sa.sandbox_id),
        &[("x-api-key", KEY)],
        Some(json!({"name": "moved"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = send(
        &gateways[1],
        Method::GET,
        "/snapshots",
        &[("x-api-key", KEY)],
        None,
    )
    .await;
    assert!(r.text().contains("\"moved\""), "{}", r.text());

    // Two gateways delete one snapshot at once: one wins, the other finds
    // it gone, and it is gone for both.
    let r = send(
        &gateways[0],
        Method::POST,
        &format!("/sandboxes/{}/snapshots", sa.sandbox_id),
        &[("x-api-key", KEY)],
        Some(json!({"name": "raced"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let del = |gw: &str| {
        let gw = gw.to_string();
        async move {
            send(
                &gw,
                Method::DELETE,
                "/templates/raced",
                &[("x-api-key", KEY)],
                None,
            )
            .await
        }
    };
    let (one, two) = tokio::join!(del(&gateways[0]), del(&gateways[1]));
    let mut got = [one.status.as_u16(), two.status.as_u16()];
    got.sort();
    assert_eq!(got, [204, 404], "{} / {}", one.text(), two.text());
    for gw in &gateways {
        let r = send(gw, Method::GET, "/snapshots", &[("x-api-key", KEY)], None).await;
        assert!(!r.text().contains("raced"), "{gw}: {}", r.text());
    }

    // From the other gateway, on another host (the first is full), which
    // fetches the snapshot's layer.
    assert_eq!(a["clientID"], "node-1", "{a}");
    let b = h.create_from(&gateways[1], "moved").await;
    assert_ne!(b["clientID"], a["clientID"], "{b}");
    let sb: warren_client::Sandbox = serde_json::from_value(b.clone()).expect("a sandbox");
    let out = client
        .run_to_end(
            &sb,
            warren_client::Command::shell("cat /home/user/mark.txt"),
        )
        .await
        .expect("cat");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "written on the first host"
    );
    // The blob store goes down. What a host holds, it still creates from,
    // and placement sends those creates to it (the second host: the first
    // is full), not to the third, the emptiest, which holds nothing. No
    // host holds `tiny`: the third says it cannot fetch it, naming the
    // store.
    // A blob corrupted in the bucket is refused, and nothing of it kept:
    // `tiny`'s object replaced by other bytes (no host holds it yet).
    let tiny: Value = serde_json::from_slice(
        &std::fs::read(store.path().join("templates/tiny.json")).expect("tiny's record"),
    )
    .expect("tiny's record parses");
    let tiny = tiny["digest"].as_str().expect("a digest").to_string();
    tamper(&garage, &tiny).await;
    let r = h.try_create(&h.balancer.addr, "tiny").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(
        r.message().contains(&format!("blob {tiny}")) && r.message().contains("corrupt"),
        "{}",
        r.message()
    );

    // Once the scheduler knows what the second host fetched (its next
    // heartbeat, sent at once after a create that fetched).
    let b_node = b["clientID"].as_str().expect("a node").to_string();
    let want = 2;
    wait_until(
        "the scheduler to learn the second host's cache",
        Duration::from_secs(30),
        || {
            let b_node = b_node.clone();
            let h = &h;
            async move {
                let r = send(
                    &h.balancer.addr,
                    Method::GET,
                    "/nodes",
                    &[("x-api-key", KEY)],
                    None,
                )
                .await;
                let nodes = r.expect_json();
                let n = nodes
                    .as_array()?
                    .iter()
                    .find(|n| n["nodeID"] == b_node.as_str())?;
                (n["cachedLayers"].as_array()?.len() >= want).then_some(())
            }
        },
    )
    .await;
    // Stopped (and waited for) before any create: kept until the end,
    // its files with it.
    let _garage = tokio::task::spawn_blocking(move || {
        garage.stop();
        garage
    })
    .await
    .expect("the garage task");
    for template in ["moved", "base"] {
        let e = h.create_from(&h.balancer.addr, template).await;
        assert_eq!(e["clientID"], b["clientID"], "{template}: {e}");
    }
    // Unavailable, not corrupt: the store is down, not wrong.
    let r = h.try_create(&h.balancer.addr, "tiny").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(
        r.message().contains(&format!("blob store {}", blobs.url))
            && r.message().contains("is unavailable")
            && !r.message().contains("corrupt"),
        "{}",
        r.message()
    );
}

/// A filesystem-paused sandbox resumes on any host once its own is gone,
/// with nothing shared but the network: its pause through one gateway puts
/// its writable layer into the blob store and its record into the
/// scheduler's; with its host's cable pulled, a resume through the other
/// gateway boots it on another host from that layer (same id, the file
/// written before the pause there), and its record goes. Killing a
/// filesystem-paused sandbox removes its record too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_paused_sandbox_resumes_on_another_host_once_its_own_is_gone() {
    let net = Network::create().expect("a bridge and hosts (root, iproute2)");
    let addr: std::net::Ipv4Addr = net.machine_addr().parse().expect("an IPv4 address");
    let garage = tokio::task::spawn_blocking(move || GarageServer::start_on(addr))
        .await
        .expect("the garage task")
        .expect("Garage (cargo install garage; .ci/run installs it)");
    let blobs = Blobs::of(&garage);
    let store = base_only_store();
    let h = Hosts::start_on(
        net,
        Setup {
            isolated: true,
            blobs: Some(Blobs::of(&garage)),
            first_node_capacity: None,
        },
    )
    .await;
    let gateways: Vec<String> = h.gateways.iter().map(|g| g.addr("gateway http")).collect();
    push_and_import(&h, store.path(), &blobs);

    // Killed while paused: its record goes with it.
    let k = h.create_from(&gateways[0], "base").await;
    let k_id = k["sandboxID"].as_str().expect("id").to_string();
    pause_filesystem_only(&gateways[0], &k_id).await;
    assert_eq!(records_named(&h, &format!("paused-{k_id}")), 1);
    let r = send(
        &gateways[1],
        Method::DELETE,
        &format!("/sandboxes/{k_id}"),
        &[("x-api-key", KEY)],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(records_named(&h, &format!("paused-{k_id}")), 0);

    // A file in a sandbox made through the first gateway, then paused
    // filesystem-only: its record is in the scheduler's store.
    let a = h.create_from(&gateways[0], "base").await;
    let client = warren_client::Client::new(&[format!("http://{}", h.balancer.addr)], KEY)
        .expect("a client");
    let sa: warren_client::Sandbox = serde_json::from_value(a.clone()).expect("a sandbox");
    client
        .write_file(
            &sa,
            "/home/user/mark.txt",
            "user",
            "written before the pause".into(),
        )
        .await
        .expect("a file written");
    pause_filesystem_only(&gateways[0], &sa.sandbox_id).await;
    let key = format!("paused-{}", sa.sandbox_id);
    assert_eq!(records_named(&h, &key), 1);

    // Its host is cut off; the other gateway resumes it elsewhere.
    let home = a["clientID"].as_str().expect("a node").to_string();
    let i = h
        .node_hosts
        .iter()
        .position(|n| n.name == home)
        .expect("its host");
    h.node_hosts[i].disconnect().expect("cable out");
    let r = send(
        &gateways[1],
        Method::POST,
        &format!("/sandboxes/{}/resume", sa.sandbox_id),
        &[("x-api-key", KEY)],
        Some(json!({"timeout": 120})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let moved = r.expect_json();
    assert_eq!(moved["sandboxID"], a["sandboxID"], "{moved}");
    assert_ne!(moved["clientID"].as_str(), Some(home.as_str()), "{moved}");
    let out = client
        .run_to_end(
            &sa,
            warren_client::Command::shell("cat /home/user/mark.txt"),
        )
        .await
        .expect("cat");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "written before the pause"
    );
    // Running there, its record is done with; killed, it is gone.
    assert_eq!(records_named(&h, &key), 0);
    let r = send(
        &gateways[1],
        Method::DELETE,
        &format!("/sandboxes/{}", sa.sandbox_id),
        &[("x-api-key", KEY)],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(records_named(&h, &key), 0);
}

/// `warren template push --import` of the template store at `store` into
/// the blob store and, through HAProxy, the scheduler's records: the
/// operator's upgrade to `--blob-store`, one command.
fn push_and_import(h: &Hosts, store: &Path, blobs: &Blobs) {
    let pushed = std::process::Command::new(bin())
        .arg("template")
        .arg("--template-dir")
        .arg(store)
        .arg("push")
        .args(blobs.args("--to", "--blob-option"))
        .arg("--import")
        .env("E2B_API_URL", format!("http://{}", h.balancer.addr))
        .env("E2B_API_KEY", KEY)
        .envs(blobs.env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("warren template push");
    let said = String::from_utf8_lossy(&pushed.stdout).into_owned();
    assert!(
        pushed.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    assert!(said.contains("2 templates imported"), "{said}");
}

/// How many records the schedulers' store holds under `name` (0 or 1),
/// read from the database: a paused record belongs to no team, so no API
/// call shows it.
fn records_named(h: &Hosts, name: &str) -> u32 {
    assert!(
        name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
        "{name}"
    );
    let out = std::process::Command::new("psql")
        .arg(&h.db)
        .args([
            "-tAc",
            &format!("SELECT count(*) FROM template_records WHERE name = '{name}'"),
        ])
        .output()
        .expect("psql");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said.trim().parse().expect("a count")
}

/// Pauses sandbox `id` filesystem-only through `gateway`.
async fn pause_filesystem_only(gateway: &str, id: &str) {
    let r = send(
        gateway,
        Method::POST,
        &format!("/sandboxes/{id}/pause"),
        &[("x-api-key", KEY)],
        Some(json!({"memory": false})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "pause {id}: {}", r.text());
}

/// Replaces blob `digest`'s object in Garage's bucket with other bytes,
/// past the blob store.
async fn tamper(g: &GarageServer, digest: &str) {
    use object_store::ObjectStoreExt as _;
    // object_store's HTTP client takes the process's rustls provider (the
    // blob store installs the same one for itself).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bucket = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&g.endpoint)
        .with_region(&g.region)
        .with_bucket_name(&g.bucket)
        .with_access_key_id(&g.access_key_id)
        .with_secret_access_key(&g.secret_access_key)
        .with_allow_http(true)
        .build()
        .expect("a client of the bucket");
    let hex = digest.trim_start_matches("sha256-");
    let key = object_store::path::Path::from(format!("blobs/sha256/{hex}"));
    bucket
        .put(&key, b"not the layer".to_vec().into())
        .await
        .expect("the object replaced");
}

/// A template store holding only the machine's `base` (its record copied,
/// its blob linked) and a tiny template: what `warren template push` reads.
fn base_only_store() -> tempfile::TempDir {
    let shared = Path::new(warren_test_support::templates::TEMPLATE_DIR);
    let dir = tempfile::tempdir().expect("a temporary directory");
    for sub in ["blobs", "rootfs", "templates", "tmp"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("store dirs");
    }
    let record = std::fs::read(shared.join("templates/base.json")).unwrap_or_else(|e| {
        panic!("the base template is built (scripts/test builds it; docs/sandboxes.md): {e}")
    });
    let t: Value = serde_json::from_slice(&record).expect("the record parses");
    let digest = t["digest"].as_str().expect("a digest");
    let blob = format!("blobs/{digest}.tar");
    // Linked (a store never follows a symlink), or copied across filesystems.
    std::fs::hard_link(shared.join(&blob), dir.path().join(&blob))
        .or_else(|_| std::fs::copy(shared.join(&blob), dir.path().join(&blob)).map(|_| ()))
        .expect("blob linked");
    std::fs::write(dir.path().join("templates/base.json"), &record).expect("record copied");
    // And `tiny`, a template no sandbox is made from here (a few bytes).
    let root = dir.path().join("tiny-root");
    std::fs::create_dir_all(root.join("etc")).expect("a root");
    std::fs::write(root.join("etc/hostname"), "tiny\n").expect("a file");
    let tar = dir.path().join("tiny.tar");
    let made = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&root)
        .arg(".")
        .status()
        .expect("tar");
    assert!(made.success());
    let imported = std::process::Command::new(bin())
        .arg("template")
        .arg("--template-dir")
        .arg(dir.path())
        .args(["import", &tar.display().to_string(), "--name", "tiny"])
        .output()
        .expect("warren template import");
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    dir
}

/// One request, answered within 5 min (a guard against a hang, not a
/// timing assertion).
async fn send(
    addr: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    // A create may fetch and unpack a template first.
    Http::new(Duration::from_secs(300))
        .send(method.clone(), addr, path, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
