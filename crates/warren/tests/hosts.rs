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

/// The running parts. Fields drop in order: the processes stop before
/// their hosts' namespaces and the bridge go.
struct Hosts {
    schedulers: Vec<Proc>,
    nodes: Vec<Proc>,
    gateways: Vec<Proc>,
    balancer: Balancer,
    node_hosts: Vec<Host>,
    _other_hosts: Vec<Host>,
    _pg: PgServer,
    _net: Network,
}

impl Hosts {
    async fn start() -> Hosts {
        let net = Network::create().expect("a bridge and hosts (root, iproute2)");
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
        let start = |role: Role, host: &Host, port: u16, extra: &[&str]| {
            let part = role.as_str();
            let mut args = strings(&[
                part,
                "--listen",
                &format!("{}:{port}", host.addr),
                "--admin-listen",
                &format!("{}:{ADMIN}", host.addr),
            ]);
            args.extend(strings(extra));
            args.extend(tls(role, host));
            let listener = if role == Role::Scheduler {
                "grpc"
            } else {
                "http"
            };
            let log = host.dir().join("log");
            let launch = host
                .launch(bin(), &args)
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
            let extra = [
                "--database-url",
                &db,
                "--store-key-file",
                &store_key,
                "--lease",
                "2s",
                "--sweep-interval",
                "250ms",
            ];
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
            let extra = [
                "--node-id",
                &h.name,
                "--scheduler",
                &scheduler_urls,
                "--data-dir",
                &data,
                "--runtime",
                "process",
            ];
            nodes.push(start(Role::Node, h, HTTP, &extra).await);
        }
        let mut gateways = Vec::new();
        for h in &gateway_hosts {
            let extra = [
                "--scheduler",
                &scheduler_urls,
                "--api-keys-file",
                &keys,
                "--connect-timeout",
                "500ms",
                "--admin-team",
                "team-hosts",
            ];
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
            schedulers,
            nodes,
            gateways,
            balancer,
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
        let r = send(
            &self.balancer.addr,
            Method::POST,
            "/v2/sandboxes",
            &[("x-api-key", KEY)],
            Some(json!({"templateID": "base", "timeout": 120})),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        r.expect_json()
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
    let h = Hosts::start().await;
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

/// One request, answered within 30 s (a guard against a hang, not a timing
/// assertion).
async fn send(
    addr: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    Http::new(Duration::from_secs(30))
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
