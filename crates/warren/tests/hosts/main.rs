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

mod builds;
mod downloads;
mod pauses;
mod routing;
mod snapshots;
mod volumes;

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
    /// node-1's `--capacity` (default: `capacity`).
    first_node_capacity: Option<u32>,
    /// Every node's `--capacity` (default: the node's).
    capacity: Option<u32>,
    /// More arguments for every gateway.
    gateway_args: Vec<String>,
    /// More arguments for every node.
    node_args: Vec<String>,
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
            let capacity = match (setup.first_node_capacity, h.name.as_str()) {
                (Some(n), "node-1") => Some(n),
                _ => setup.capacity,
            };
            if let Some(n) = capacity {
                extra.push("--capacity".into());
                extra.push(n.to_string());
            }
            if let Some(b) = &setup.blobs {
                extra.extend(b.args("--blob-store", "--blob-store-option"));
                extra.push("--cache-dir".into());
                extra.push(h.dir().join("cache").display().to_string());
            }
            extra.extend(setup.node_args.iter().cloned());
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
            extra.extend(setup.gateway_args.iter().cloned());
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
                    self.nodes()
                        .await
                        .as_array()?
                        .iter()
                        .any(|n| n["nodeID"] == name.as_str() && n["status"] == "ready")
                        .then_some(())
                }
            },
        )
        .await;
    }

    /// `GET /nodes` through HAProxy: every node the scheduler knows.
    async fn nodes(&self) -> Value {
        send(
            &self.balancer.addr,
            Method::GET,
            "/nodes",
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect_json()
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

/// The hosts with a real S3 server (Garage, on the machine) as their blob
/// store, `base` and a tiny template pushed to it and imported. Bind
/// `hosts` last when taking it apart, so that the parts stop before the
/// server does.
struct WithBlobs {
    hosts: Hosts,
    garage: GarageServer,
    blobs: Blobs,
    /// The template store that was pushed (`base_only_store`).
    store: tempfile::TempDir,
}

impl Hosts {
    /// [`Hosts::start`] with isolated sandboxes and a blob store (see
    /// [`WithBlobs`]); `setup`'s `isolated` and `blobs` are set here.
    async fn start_with_blobs(mut setup: Setup) -> WithBlobs {
        let net = Network::create().expect("a bridge and hosts (root, iproute2)");
        let addr: std::net::Ipv4Addr = net.machine_addr().parse().expect("an IPv4 address");
        let garage = tokio::task::spawn_blocking(move || GarageServer::start_on(addr))
            .await
            .expect("the garage task")
            .expect("Garage (cargo install garage; .ci/run installs it)");
        let blobs = Blobs::of(&garage);
        let store = base_only_store();
        setup.isolated = true;
        setup.blobs = Some(Blobs::of(&garage));
        let hosts = Hosts::start_on(net, setup).await;
        // The operator's upgrade: the store's blobs into the blob store, its
        // templates' records into the scheduler's, one command.
        push_and_import(&hosts, store.path(), &blobs);
        WithBlobs {
            hosts,
            garage,
            blobs,
            store,
        }
    }
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

/// What `cmd` (a shell line) prints to stdout in `sandbox`, run through
/// `client`.
async fn stdout_of(
    client: &warren_client::Client,
    sandbox: &warren_client::Sandbox,
    cmd: &str,
) -> String {
    let out = client
        .run_to_end(sandbox, warren_client::Command::shell(cmd))
        .await
        .unwrap_or_else(|e| panic!("{cmd:?} in {}: {e}", sandbox.sandbox_id));
    String::from_utf8_lossy(&out.stdout).into_owned()
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
