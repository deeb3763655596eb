//! docs/deploy.md's runbook, followed once on one machine: three hosts
//! (network namespaces on a bridge, `warren_harness::hosts`), each running
//! a scheduler, a gateway and a node started by their systemd units' own
//! lines (`deploy/check/units.py start`: the unit's user, environment file
//! and capabilities, the host's /etc/warren; systemd itself does not run
//! here), PostgreSQL and an S3 object store (Garage) and HAProxy in TCP
//! mode on the machine, a wildcard certificate for `*.warren.localhost`
//! (which resolves to loopback), and the e2b SDK as a user runs it.
//!
//! Then an upgrade one part at a time under probes, a backup of what
//! matters and a restore of the database, and what to watch. It prints a
//! transcript (docs/deploy.md, "The run on one machine", records one).
//!
//! Ignored: `scripts/runbook-run` runs it (a few minutes; root; port 443
//! on loopback under /work/wt/locks/port443; haproxy, postgresql, garage,
//! the base template, the e2b SDK's virtualenv).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use warren_harness::garage::GarageServer;
use warren_harness::hosts::{Host, Network};
use warren_harness::postgres::PgServer;
use warren_harness::{Launch, Proc};
use warren_test_support::http::Http;

const DOMAIN: &str = "warren.localhost";
const NAMES: [&str; 3] = ["warren-1", "warren-2", "warren-3"];
/// The units' user (deploy/check/units.py makes it on each host).
const WARREN_UID: u32 = 64999;
const OPS_KEY: &str = "e2b_00000000000000000000000000000000000000a1";
const TEAM_KEY: &str = "e2b_00000000000000000000000000000000000000b2";
/// Admin ports as the shipped TOML files give them.
const ADMIN: [(&str, u16); 3] = [("scheduler", 9090), ("gateway", 9091), ("node", 9092)];

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

fn repo() -> PathBuf {
    warren_test_support::workspace_root()
}

fn step(t0: Instant, title: &str) {
    println!("\n### [{:>6.1}s] {title}", t0.elapsed().as_secs_f64());
}

/// Runs `cmd`, prints it as `$ ...` and its output indented; its stdout.
fn shell(cmd: &mut Command) -> String {
    let shown: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    println!("$ {}", shown.join(" "));
    let out = cmd.output().unwrap_or_else(|e| panic!("{}: {e}", shown[0]));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in stdout
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        println!("    {line}");
    }
    assert!(out.status.success(), "{} failed", shown.join(" "));
    stdout
}

fn private_file(path: &Path, text: &str) {
    warren_core::private::write(path, text.as_bytes()).expect("write");
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(WARREN_UID)),
        Some(nix::unistd::Gid::from_raw(WARREN_UID)),
    )
    .expect("chown");
}

/// One host: its network namespace, and a mount namespace of its own
/// (held by a file in `Namespaces`) in which /etc/warren, the binary at
/// /usr/local/bin/warren, the `warren` account and its data directories
/// are what the runbook put there.
struct Machine {
    host: Host,
    etc: PathBuf,
    ns: PathBuf,
}

impl Machine {
    fn unit(&self, part: &str) -> PathBuf {
        repo().join(format!("deploy/systemd/warren-{part}.service"))
    }

    /// Makes the host's mount namespace (`units.py host`).
    fn make_namespace(&self) {
        let mut c = Command::new("python3");
        c.arg(repo().join("deploy/check/units.py"))
            .args(["host", "--warren"])
            .arg(bin())
            .arg("--etc")
            .arg(&self.etc)
            .arg("--ns")
            .arg(&self.ns)
            .arg("--work")
            .arg(self.host.dir());
        for (dir, at) in [
            ("node", "/var/lib/warren/node"),
            ("cache", "/var/lib/warren/cache"),
        ] {
            let d = self.host.dir().join(dir);
            std::fs::create_dir_all(&d).expect("dir");
            c.arg("--mount").arg(format!("{}:{at}", d.display()));
        }
        let out = c.output().expect("units.py host");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The unit's ExecStart (or, `check`, ExecStartPre) started on this
    /// host (its network and mount namespaces) as systemd would start it.
    fn launch(&self, part: &str, check: bool) -> Launch {
        let mut args = vec![
            format!("--mount={}", self.ns.display()),
            "--".into(),
            "python3".into(),
            repo().join("deploy/check/units.py").display().to_string(),
            "start".into(),
            "--in-place".into(),
            "--warren".into(),
            bin().display().to_string(),
            "--unit".into(),
            self.unit(part).display().to_string(),
            "--etc".into(),
            "/etc/warren".into(),
            "--work".into(),
            self.host.dir().display().to_string(),
        ];
        if check {
            args.push("--check".into());
        }
        // `Host::launch` runs `exe args...` in the host's network namespace.
        self.host.launch(Path::new("nsenter"), &args)
    }

    async fn start(&self, part: &str) -> Proc {
        let listener = if part == "scheduler" { "grpc" } else { "http" };
        let log = self.host.dir().join(format!("{part}.log"));
        self.launch(part, false)
            .label(&format!("{} {part}", self.host.name))
            .exit_with_parent()
            .wait_for(&[&format!("{part} {listener}"), &format!("{part} admin")])
            .log_to(&log)
            .spawn()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{e:#}\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
    }

    fn admin(&self, part: &str) -> String {
        let port = ADMIN.iter().find(|(p, _)| *p == part).expect("part").1;
        format!("{}:{port}", self.host.addr)
    }
}

/// The shipped example (written for warren-1 at 10.0.0.11) for `m`: its
/// own addresses and name, the three schedulers, the database, the object
/// store and the domain of this run.
fn adapt(text: &str, m: &Machine, all: &[Machine], pg: &str, s3: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = if line.starts_with("scheduler =") {
            let mut l = line.to_string();
            for (i, other) in all.iter().enumerate() {
                l = l.replace(&format!("10.0.0.1{}", i + 1), &other.host.addr);
            }
            l
        } else {
            line.replace("10.0.0.11", &m.host.addr)
                .replace("warren-1", &m.host.name)
        };
        let line = line
            .replace("http://10.0.0.6:3900", s3)
            .replace("10.0.0.5:5432", pg)
            .replace("sandbox.example.com", DOMAIN);
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `curl` through the balancer (the wildcard domain resolves to loopback):
/// the HTTP status, or 0 when no answer came.
fn curl(ca: &Path, url: &str, key: &str) -> u16 {
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .arg("--cacert")
        .arg(ca)
        .args(["-H", &format!("X-API-Key: {key}"), url])
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Probes through the balancer every 200 ms until stopped: the API (list
/// sandboxes) and, when given, a sandbox's envd; counts what failed.
struct Probes {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(u32, u32, Vec<String>)>,
}

impl Probes {
    fn start(ca: PathBuf, sandbox: Option<String>) -> Probes {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::task::spawn_blocking(move || {
            let (mut sent, mut failed, mut seen) = (0, 0, Vec::new());
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let mut urls = vec![format!("https://api.{DOMAIN}/sandboxes")];
                if let Some(id) = &sandbox {
                    urls.push(format!("https://49983-{id}.{DOMAIN}/health"));
                }
                for url in urls {
                    sent += 1;
                    let code = curl(&ca, &url, TEAM_KEY);
                    if !(200..300).contains(&code) {
                        failed += 1;
                        seen.push(format!("{url} -> {code}"));
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            (sent, failed, seen)
        });
        Probes { stop, task }
    }

    async fn finish(self) -> (u32, u32, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("probes")
    }
}

async fn wait_ready(admin: &str) {
    let admin = admin.to_string();
    warren_test_support::wait_until(&format!("{admin}/readyz"), Duration::from_secs(120), || {
        let admin = admin.clone();
        async move {
            let a = Http::new(Duration::from_secs(5))
                .send(http::Method::GET, &admin, "/readyz", &[], None)
                .await
                .ok()?;
            a.status.is_success().then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the runbook's recorded run: scripts/runbook-run (root, port 443, minutes)"]
async fn runbook() {
    let t0 = Instant::now();
    let net = Network::create().expect("a bridge (root, iproute2)");
    let machine_addr = net.machine_addr();
    let admin_dir = net.dir().join("admin");
    std::fs::create_dir_all(&admin_dir).expect("admin dir");

    step(
        t0,
        "1. The database: PostgreSQL on the machine (10.0.0.5 in the runbook)",
    );
    let pg = PgServer::start_on(&machine_addr).expect("PostgreSQL");
    let db_url = pg.create_database("warren").expect("a database");
    let pg_at = db_url
        .trim_start_matches("postgres://postgres@")
        .trim_end_matches("/warren")
        .to_string();
    println!("database: {db_url}");

    step(t0, "2. The object store: a bucket and a key (Garage, S3)");
    let addr: std::net::Ipv4Addr = machine_addr.parse().expect("IPv4");
    let garage = tokio::task::spawn_blocking(move || GarageServer::start_on(addr))
        .await
        .expect("task")
        .expect("Garage (cargo install garage --locked)");
    let opts = garage.options();
    let opt = |k: &str| {
        opts.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .expect("option")
    };
    let s3_endpoint = opt("endpoint");
    println!(
        "bucket: {} at {s3_endpoint} (region {})",
        garage.url(),
        opt("region")
    );

    step(t0, "3. Three hosts");
    let namespaces = Namespaces::new();
    let machines: Vec<Machine> = NAMES
        .iter()
        .map(|n| {
            let host = net.add_host(n).expect("a host");
            let etc = host.dir().join("etc-warren");
            std::fs::create_dir_all(etc.join("certs")).expect("etc");
            let ns = namespaces.dir.join(format!("{n}.mnt"));
            Machine { host, etc, ns }
        })
        .collect();
    for m in &machines {
        println!("{}: {}", m.host.name, m.host.addr);
    }

    step(
        t0,
        "4. Certificates: the cluster CA on the admin machine, one certificate per part and host",
    );
    let certs = admin_dir.join("certs");
    let w = || {
        let mut c = Command::new(bin());
        c.env_remove("WARREN_EXIT_WITH_PARENT");
        c
    };
    shell(w().args(["certs", "init", "--dir"]).arg(&certs));
    for m in &machines {
        for role in ["scheduler", "gateway", "node"] {
            let mut c = w();
            c.args(["certs", "issue", "--dir"]).arg(&certs).args([
                "--role",
                role,
                "--name",
                &m.host.name,
            ]);
            if role != "gateway" {
                c.args(["--host", &m.host.addr]);
            }
            shell(&mut c);
        }
    }

    step(
        t0,
        "5. Secrets: the store key, API keys, the upload-link key",
    );
    let store_key = String::from_utf8(
        Command::new("openssl")
            .args(["rand", "-hex", "32"])
            .output()
            .expect("openssl")
            .stdout,
    )
    .expect("hex");
    let upload_key = String::from_utf8(
        Command::new("openssl")
            .args(["rand", "-base64", "48"])
            .output()
            .expect("openssl")
            .stdout,
    )
    .expect("base64");
    println!(
        "$ (umask 077; openssl rand -hex 32 > store.key; openssl rand -base64 48 > upload.key)"
    );

    step(
        t0,
        "6. The wildcard domain: DNS and a certificate for *.warren.localhost",
    );
    // In the runbook an ACME DNS-01 client (certbot, lego) signs it; here a
    // CA made for the run, which the SDK trusts through SSL_CERT_FILE.
    // `*.localhost` resolves to loopback (libnss-myhostname), where the
    // balancer listens: the wildcard DNS record of the runbook.
    let pki = admin_dir.join("public");
    std::fs::create_dir_all(&pki).expect("pki");
    let p = |f: &str| pki.join(f).display().to_string();
    shell(Command::new("openssl").args([
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.pem"),
        "-days",
        "2",
        "-subj",
        "/CN=runbook public CA",
    ]));
    shell(Command::new("openssl").args([
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        &p("privkey.pem"),
        "-out",
        &p("req.csr"),
        "-subj",
        &format!("/CN={DOMAIN}"),
    ]));
    std::fs::write(
        pki.join("ext"),
        format!("subjectAltName=DNS:*.{DOMAIN},DNS:{DOMAIN}\n"),
    )
    .expect("ext");
    shell(Command::new("openssl").args([
        "x509",
        "-req",
        "-in",
        &p("req.csr"),
        "-CA",
        &p("ca.pem"),
        "-CAkey",
        &p("ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &p("ext"),
        "-out",
        &p("fullchain.pem"),
    ]));
    let public_ca = pki.join("ca.pem");

    step(
        t0,
        "7. /etc/warren on each host: the shipped files, its addresses, the files they name",
    );
    let shipped = repo().join("deploy/systemd/etc");
    let s3_url = garage.url();
    for m in &machines {
        for f in ["scheduler.toml", "gateway.toml", "node.toml"] {
            let text = std::fs::read_to_string(shipped.join(f)).expect("shipped toml");
            let text = adapt(&text, m, &machines, &pg_at, &s3_endpoint)
                .replace("s3://warren-layers", &s3_url);
            std::fs::write(m.etc.join(f), text).expect("toml");
        }
        let creds = format!(
            "AWS_ACCESS_KEY_ID={}\nAWS_SECRET_ACCESS_KEY={}\nWARREN_LOG_FORMAT=text\n",
            opt("access_key_id"),
            opt("secret_access_key")
        );
        private_file(
            &m.etc.join("scheduler.env"),
            &format!("WARREN_SCHEDULER_DATABASE_URL={db_url}\nWARREN_LOG_FORMAT=text\n"),
        );
        private_file(&m.etc.join("gateway.env"), &creds);
        private_file(&m.etc.join("node.env"), &creds);
        std::fs::copy(certs.join("ca.pem"), m.etc.join("certs/ca.pem")).expect("ca");
        for role in ["scheduler", "gateway", "node"] {
            let base = format!("{role}-{}", m.host.name);
            for ext in ["pem", "key"] {
                let from = certs.join(format!("{base}.{ext}"));
                let to = m.etc.join(format!("certs/{base}.{ext}"));
                let text = std::fs::read_to_string(&from).expect("cert");
                if role == "node" {
                    warren_core::private::write(&to, text.as_bytes()).expect("node cert");
                } else {
                    private_file(&to, &text);
                }
            }
        }
        private_file(&m.etc.join("store.key"), &store_key);
        private_file(
            &m.etc.join("api-keys"),
            &format!("{OPS_KEY} ops\n{TEAM_KEY} team-a\n"),
        );
        private_file(&m.etc.join("upload.key"), &upload_key);
        std::fs::create_dir_all(m.etc.join("public-tls")).expect("public-tls");
        for f in ["fullchain.pem", "privkey.pem"] {
            let text = std::fs::read_to_string(pki.join(f)).expect("public cert");
            private_file(&m.etc.join("public-tls").join(f), &text);
        }
    }
    println!(
        "{}/gateway.toml:\n{}",
        machines[0].etc.display(),
        std::fs::read_to_string(machines[0].etc.join("gateway.toml")).expect("toml")
    );

    for m in &machines {
        m.make_namespace();
    }

    step(
        t0,
        "8. Check every part's configuration (each unit's ExecStartPre)",
    );
    for m in &machines {
        for part in ["scheduler", "gateway", "node"] {
            let out = m
                .launch(part, true)
                .label(&format!("{} {part} check", m.host.name))
                .spawn()
                .await
                .expect("check");
            let mut out = out;
            let exit = out.wait_exit(Duration::from_secs(60)).await;
            assert_eq!(
                exit.code,
                Some(0),
                "{} {part}: {:?}",
                m.host.name,
                out.lines()
            );
            println!("{} warren-{part}.service ExecStartPre: exit 0", m.host.name);
            for l in out.lines() {
                println!("    {l}");
            }
        }
    }

    step(
        t0,
        "9. Start: schedulers, then gateways, then nodes (each unit's ExecStart)",
    );
    let mut schedulers = Vec::new();
    for m in &machines {
        schedulers.push(m.start("scheduler").await);
        println!(
            "{}: scheduler up ({})",
            m.host.name,
            schedulers.last().expect("s").addr("scheduler grpc")
        );
    }
    let mut gateways = Vec::new();
    for m in &machines {
        gateways.push(m.start("gateway").await);
        println!(
            "{}: gateway up ({})",
            m.host.name,
            gateways.last().expect("g").addr("gateway https")
        );
    }
    let mut nodes = Vec::new();
    for m in &machines {
        nodes.push(m.start("node").await);
        println!(
            "{}: node up: {:?}",
            m.host.name,
            nodes.last().expect("n").lines()
        );
    }
    for m in &machines {
        for (part, _) in ADMIN {
            wait_ready(&m.admin(part)).await;
        }
    }
    println!("every part's /readyz is 200");

    step(t0, "10. The balancer: HAProxy in TCP mode on loopback :443 (deploy/haproxy/warren-tls-passthrough.cfg)");
    let lb_log = admin_dir.join("haproxy.log");
    let haproxy = Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(repo().join("deploy/haproxy/warren-tls-passthrough.cfg"))
        .env("WARREN_LB_LISTEN", "127.0.0.1:443,[::1]:443")
        .env("WARREN_GW1", format!("{}:443", machines[0].host.addr))
        .env("WARREN_GW2", format!("{}:443", machines[1].host.addr))
        .env("WARREN_GW3", format!("{}:443", machines[2].host.addr))
        .env("WARREN_GW_ADMIN_PORT", "9091")
        .stderr(std::fs::File::create(&lb_log).expect("log"))
        .spawn()
        .expect("haproxy");
    let _haproxy = KillOnDrop(haproxy);
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if curl(
                &public_ca,
                &format!("https://api.{DOMAIN}/sandboxes"),
                TEAM_KEY,
            ) == 200
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    if waited.is_err() {
        let said = Command::new("curl")
            .args(["-sS", "-v", "--max-time", "5", "--cacert"])
            .arg(&public_ca)
            .arg(format!("https://api.{DOMAIN}/sandboxes"))
            .output()
            .expect("curl");
        panic!(
            "the balancer does not answer:\n{}\nhaproxy: {}",
            String::from_utf8_lossy(&said.stderr),
            std::fs::read_to_string(&lb_log).unwrap_or_default()
        );
    }
    warren_test_support::wait_until("HAProxy to answer", Duration::from_secs(30), || {
        let ca = public_ca.clone();
        async move {
            (curl(&ca, &format!("https://api.{DOMAIN}/sandboxes"), TEAM_KEY) == 200).then_some(())
        }
    })
    .await;
    println!("https://api.{DOMAIN}/sandboxes answers 200 through the balancer");

    step(
        t0,
        "11. The first template: base, pushed into the object store and imported",
    );
    let store = base_only_store();
    shell(
        w().arg("template")
            .arg("--template-dir")
            .arg(store.path())
            .args(["push", "--to", &s3_url])
            .args(["--blob-option", &format!("endpoint={s3_endpoint}")])
            .args(["--blob-option", &format!("region={}", opt("region"))])
            .args(["--blob-option", "allow_http=true"])
            .args(["--import", "--api-url"])
            .arg(format!("http://{}:3000", machines[0].host.addr))
            .env("E2B_API_KEY", OPS_KEY)
            .env("AWS_ACCESS_KEY_ID", opt("access_key_id"))
            .env("AWS_SECRET_ACCESS_KEY", opt("secret_access_key")),
    );

    step(
        t0,
        "12. Use it: the e2b SDK, E2B_DOMAIN=warren.localhost, through the balancer",
    );
    let sdk = r#"
import time
from e2b import Sandbox
t = time.time()
sbx = Sandbox.create(template="base", timeout=300, allow_internet_access=False)
print("created", sbx.sandbox_id, "in %.1f s" % (time.time() - t))
r = sbx.commands.run("echo hello from $(hostname); id -un")
print("stdout:", r.stdout.strip().replace("\n", " | "))
sbx.files.write("/home/user/runbook.txt", "written through the balancer")
print("read back:", sbx.files.read("/home/user/runbook.txt"))
print("envd at", sbx.get_host(49983))
print(sbx.sandbox_id)
"#;
    let python = warren_test_support::e2b_python();
    let out = shell(
        Command::new(&python)
            .args(["-c", sdk])
            .env("E2B_DOMAIN", DOMAIN)
            .env("E2B_API_KEY", TEAM_KEY)
            .env("SSL_CERT_FILE", &public_ca),
    );
    let sandbox = out.lines().last().expect("an id").trim().to_string();

    step(
        t0,
        "13. Upgrade one part at a time (SIGTERM, wait, start again, wait ready) under probes",
    );
    for (part, procs) in [("scheduler", &mut schedulers), ("gateway", &mut gateways)] {
        let probes = Probes::start(public_ca.clone(), Some(sandbox.clone()));
        for (i, m) in machines.iter().enumerate() {
            let t = Instant::now();
            let exit = procs[i].terminate(Duration::from_secs(90)).await;
            let stopped = t.elapsed();
            procs[i] = m.start(part).await;
            wait_ready(&m.admin(part)).await;
            println!(
                "{} {part}: stopped in {:.1}s (exit {:?}), ready again {:.1}s after the SIGTERM",
                m.host.name,
                stopped.as_secs_f64(),
                exit.code,
                t.elapsed().as_secs_f64()
            );
        }
        let (sent, failed, seen) = probes.finish().await;
        println!("probes during the {part}s' restarts: {sent} sent, {failed} failed {seen:?}");
    }
    // A node's restart ends its sandboxes: the API keeps answering, and
    // creates land on the other nodes meanwhile.
    let probes = Probes::start(public_ca.clone(), None);
    for (i, m) in machines.iter().enumerate() {
        let t = Instant::now();
        let exit = nodes[i].terminate(Duration::from_secs(120)).await;
        let stopped = t.elapsed();
        nodes[i] = m.start("node").await;
        wait_ready(&m.admin("node")).await;
        println!(
            "{} node: stopped in {:.1}s (exit {:?}), ready again {:.1}s after the SIGTERM",
            m.host.name,
            stopped.as_secs_f64(),
            exit.code,
            t.elapsed().as_secs_f64()
        );
    }
    let (sent, failed, seen) = probes.finish().await;
    println!("API probes during the nodes' restarts: {sent} sent, {failed} failed {seen:?}");
    println!(
        "the sandbox of step 12 after its node's restart: GET /sandboxes/{sandbox} -> {}",
        curl(
            &public_ca,
            &format!("https://api.{DOMAIN}/sandboxes/{sandbox}"),
            TEAM_KEY
        )
    );
    let after = shell(
        Command::new(&python)
            .args(["-c", "from e2b import Sandbox\ns = Sandbox.create(template='base', allow_internet_access=False)\nprint(s.commands.run('echo still here').stdout.strip()); s.kill()"])
            .env("E2B_DOMAIN", DOMAIN)
            .env("E2B_API_KEY", TEAM_KEY)
            .env("SSL_CERT_FILE", &public_ca),
    );
    assert!(after.contains("still here"), "{after}");

    step(
        t0,
        "14. Backups: the database (pg_dump), restored into a new one; the object store's blobs",
    );
    let dump = admin_dir.join("warren.sql");
    shell(
        Command::new("pg_dump")
            .arg(&db_url)
            .args(["--format=custom", "--file"])
            .arg(&dump),
    );
    println!(
        "dump: {} bytes",
        std::fs::metadata(&dump).expect("dump").len()
    );
    let restored = pg.create_database("warren_restored").expect("a database");
    shell(
        Command::new("pg_restore")
            .args(["--no-owner", "--dbname", &restored])
            .arg(&dump),
    );
    for db in [&db_url, &restored] {
        shell(Command::new("psql").arg(db).args([
            "-tAc",
            "SELECT 'template_records=' || count(*) FROM template_records",
        ]));
    }
    shell(
        Command::new(warren_harness::garage::binary().expect("garage"))
            .arg("-c")
            .arg(garage.config_path())
            .args(["bucket", "info", s3_url.trim_start_matches("s3://")]),
    );

    step(
        t0,
        "15. What to watch: each part's /metrics (a few of its lines)",
    );
    let http = Http::new(Duration::from_secs(5));
    for (part, _) in ADMIN {
        let a = http
            .send(
                http::Method::GET,
                &machines[0].admin(part),
                "/metrics",
                &[],
                None,
            )
            .await
            .expect("metrics");
        let text = String::from_utf8_lossy(&a.body).into_owned();
        println!(
            "{} {part}: {} metric lines, e.g.",
            machines[0].host.name,
            text.lines().filter(|l| !l.starts_with('#')).count()
        );
        for l in text.lines().filter(|l| {
            !l.starts_with('#')
                && [
                    "warren_scheduler_nodes",
                    "warren_scheduler_leader",
                    "warren_scheduler_bindings",
                    "warren_gateway_requests_total",
                    "warren_gateway_route_cache_watch_connected",
                    "warren_node_sandboxes",
                    "warren_node_capacity",
                ]
                .iter()
                .any(|m| l.starts_with(m))
        }) {
            println!("    {l}");
        }
    }

    step(t0, "Done: stopping the parts (nodes, gateways, schedulers)");
    for (part, procs) in [
        ("node", nodes),
        ("gateway", gateways),
        ("scheduler", schedulers),
    ] {
        for (i, mut p) in procs.into_iter().enumerate() {
            let exit = p.terminate(Duration::from_secs(120)).await;
            println!(
                "{} {part}: stopped in {:.1}s (exit {:?})",
                NAMES[i],
                exit.took.as_secs_f64(),
                exit.code
            );
        }
    }
    drop(garage);
    drop(pg);
    drop(machines);
    drop(namespaces);
    drop(net);
}

/// Where the hosts' mount namespaces are held: a directory on a private
/// mount (a namespace can be bound only there), all unmounted on drop.
struct Namespaces {
    dir: PathBuf,
}

impl Namespaces {
    fn new() -> Namespaces {
        let dir = PathBuf::from(format!("/run/warren-runbook-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("ns dir");
        let d = dir.display().to_string();
        for args in [vec!["--bind", &d, &d], vec!["--make-private", &d]] {
            let ok = Command::new("mount").args(&args).status().expect("mount");
            assert!(ok.success(), "mount {args:?}");
        }
        Namespaces { dir }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let _ = Command::new("umount").arg(e.path()).status();
            }
        }
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A template store holding only the machine's `base` (its record copied,
/// its blob linked): what `warren template push` reads.
fn base_only_store() -> tempfile::TempDir {
    let shared = Path::new(warren_test_support::templates::TEMPLATE_DIR);
    let dir = tempfile::tempdir().expect("a temporary directory");
    for sub in ["blobs", "rootfs", "templates", "tmp"] {
        std::fs::create_dir_all(dir.path().join(sub)).expect("store dirs");
    }
    let record = std::fs::read(shared.join("templates/base.json"))
        .unwrap_or_else(|e| panic!("the base template is built (scripts/test builds it): {e}"));
    let t: serde_json::Value = serde_json::from_slice(&record).expect("the record parses");
    let digest = t["digest"].as_str().expect("a digest");
    let blob = format!("blobs/{digest}.tar");
    std::fs::hard_link(shared.join(&blob), dir.path().join(&blob))
        .or_else(|_| std::fs::copy(shared.join(&blob), dir.path().join(&blob)).map(|_| ()))
        .expect("blob linked");
    std::fs::write(dir.path().join("templates/base.json"), &record).expect("record copied");
    dir
}
