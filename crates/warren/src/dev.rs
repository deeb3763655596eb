//! `warren dev`: a whole local cluster in one command.
//!
//! It starts one scheduler (embedded SQLite under `--data-dir`), `--nodes`
//! nodes and `--gateways` gateways, each as a child process of this binary, so
//! any one of them can be killed to see what happens. Children bind
//! `127.0.0.1:0` (gateways: `--listen` and the ports after it) and announce
//! their listeners on stdout; `warren dev` reads those lines, wires the parts
//! together, and prints the exports an `e2b` SDK user needs.
//!
//! The API key (`WARREN_DEV_API_KEY`, `--api-key-file`, or generated)
//! reaches the gateways in `<data-dir>/gateway-api-keys`, a file only this
//! account can read, never on a command line (`ps` shows those to every
//! account).
//!
//! Templates: the machine's store (`--template-dir`) holds the operator's
//! templates; the run's parts use a store of the run's own under its data
//! dir, which holds those by reference and everything the run makes
//! (snapshots, built templates, paused layers): see [`crate::dev_store`].
//!
//! Sandbox URLs (`get_host(port)` = `{port}-{id}.{domain}`): the first
//! gateway also listens on loopback port 80 where it can bind it
//! (`--sandbox-http auto`), so `http://8080-<id>.localhost/` opens in a
//! browser and with curl (names under `.localhost` are loopback: browsers
//! and curl know it, and libnss-myhostname makes every program know it);
//! the domain the SDK is told is then `localhost`. Where port 80 cannot be
//! bound (taken, or no root or CAP_NET_BIND_SERVICE) the domain carries the
//! gateway's port, `localhost:3000`, and `get_host(8080)` is
//! `8080-<id>.localhost:3000`, which opens the same way.
//!
//! On Ctrl-C or SIGTERM it stops gateways first (no new traffic), then nodes,
//! then the scheduler, each with SIGTERM and a bounded wait, then SIGKILL.
//! A child that dies on its own is reported and left dead.

use anyhow::Context;
use nix::sys::signal::Signal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc;
use warren_core::config::ConfigError;
use warren_harness::{Launch, Proc};

/// Flags for `warren dev`.
#[derive(Debug, clap::Parser)]
#[command(
    name = "warren dev",
    about = "Run a whole warren cluster on this machine: one scheduler, N nodes, N gateways"
)]
pub struct Config {
    /// Where the scheduler's SQLite file and the nodes' sandboxes live.
    #[arg(long, env = "WARREN_DEV_DATA_DIR", default_value = ".warren/dev")]
    pub data_dir: PathBuf,
    /// The first gateway's address; further gateways take the following ports.
    #[arg(long, env = "WARREN_DEV_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// How many nodes to start.
    #[arg(long, env = "WARREN_DEV_NODES", default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub nodes: u16,
    /// How many gateways to start.
    #[arg(long, env = "WARREN_DEV_GATEWAYS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub gateways: u16,
    /// The API key clients use (team `dev`), from the environment
    /// (`WARREN_DEV_API_KEY`) or a TOML file: `--api-key` on the command
    /// line is refused, since every account on the host can read a
    /// process's arguments. A random one in E2B's format (`e2b_` and 40 hex
    /// digits) is generated and printed if unset. Any key without spaces or
    /// ':' works; one not in E2B's format is warned about, since versions
    /// of the JavaScript SDK refuse it.
    #[arg(long, env = "WARREN_DEV_API_KEY")]
    pub api_key: Option<String>,
    /// A file holding the API key (its first line), readable by its owner
    /// only (mode 0600).
    #[arg(long, env = "WARREN_DEV_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Sandbox runtime for the nodes: auto (isolated when it works), isolated or process.
    #[arg(long, env = "WARREN_DEV_RUNTIME", default_value = "auto")]
    pub runtime: String,
    /// The scheduler's gRPC address (default: any free port).
    #[arg(
        long,
        env = "WARREN_DEV_SCHEDULER_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    pub scheduler_listen: SocketAddr,
    /// Node lease given to the scheduler (how soon a dead node is noticed).
    #[arg(long, env = "WARREN_DEV_LEASE", default_value = "10s")]
    pub lease: String,
    /// How long each child gets to exit after SIGTERM before SIGKILL.
    #[arg(long, env = "WARREN_DEV_STOP_TIMEOUT", default_value = "10s", value_parser = warren_core::config::parse_duration)]
    pub stop_timeout: Duration,
    /// Extra arguments passed to every gateway (space-separated), e.g. "--route-cache-ttl 5s".
    #[arg(
        long,
        env = "WARREN_DEV_GATEWAY_ARGS",
        default_value = "",
        allow_hyphen_values = true
    )]
    pub gateway_args: String,
    /// Extra arguments passed to every node (space-separated).
    #[arg(
        long,
        env = "WARREN_DEV_NODE_ARGS",
        default_value = "",
        allow_hyphen_values = true
    )]
    pub node_args: String,
    /// Extra arguments passed to the scheduler (space-separated).
    #[arg(
        long,
        env = "WARREN_DEV_SCHEDULER_ARGS",
        default_value = "",
        allow_hyphen_values = true
    )]
    pub scheduler_args: String,
    /// The machine's template store, whose templates (the operator's,
    /// `warren template build`) the run uses; what the run makes goes into
    /// its own store, `<data-dir>/templates`, never here.
    #[arg(long, env = "WARREN_TEMPLATE_DIR", default_value = crate::cli::template::DEFAULT_TEMPLATE_DIR)]
    pub template_dir: PathBuf,
    /// Where sandboxes' URLs (`get_host(port)`, `{port}-{id}.localhost`)
    /// are served besides the first gateway's --listen: `auto` binds
    /// loopback port 80 (127.0.0.1, and ::1 where there is one) when it
    /// can, else none (the URLs then carry the gateway's port); `off`;
    /// or addresses, comma-separated.
    #[arg(long, env = "WARREN_DEV_SANDBOX_HTTP", default_value = "auto")]
    pub sandbox_http: String,
    /// Run the parts without internal TLS (plain TCP, no authentication
    /// between them). By default `warren dev` makes a cluster CA and a
    /// certificate per part in `<data-dir>/certs` and uses mutual TLS.
    #[arg(long, env = "WARREN_DEV_INSECURE_INTERNAL")]
    pub insecure_internal: bool,
}

/// The team every `warren dev` key belongs to.
const DEV_TEAM: &str = "dev";

/// One running child, labelled `scheduler`, `node-1`, `gateway-1`, ...
type Part = Proc;

/// The `base` build file, built into the binary so `warren dev` works from
/// any directory.
const BASE_TEMPLATE: &str = include_str!("../../../templates/base.toml");

/// Builds `base` into the machine's template store (`--template-dir`)
/// unless it is there and up to date: the first start takes a few minutes
/// (Debian packages), later ones reuse it.
fn ensure_base_template(dir: &Path) -> anyhow::Result<()> {
    let store = warren_template::Store::open(dir)?;
    let stamp = crate::cli::template::spec_stamp(BASE_TEMPLATE);
    if store.get("base").is_ok_and(|t| t.source.contains(&stamp)) {
        return Ok(());
    }
    eprintln!(
        "warren dev: building the base template into {} (first start only: a few minutes, \
         packages come from the Debian archive)...",
        dir.display()
    );
    crate::cli::template::build_text(&store, BASE_TEMPLATE, "templates/base.toml")
        .map_err(|e| anyhow::anyhow!("cannot build the base template: {e}"))?;
    eprintln!("warren dev: base template ready");
    Ok(())
}

pub async fn main(config: Config) -> anyhow::Result<()> {
    if !matches!(
        config.runtime.as_str(),
        "auto" | "isolated" | "bwrap" | "process"
    ) {
        return Err(ConfigError::Invalid(format!(
            "--runtime must be auto, isolated or process, not {:?}",
            config.runtime
        ))
        .into());
    }
    let last_port = u32::from(config.listen.port()) + u32::from(config.gateways) - 1;
    if config.listen.port() == 0 && config.gateways > 1 || last_port > 65535 {
        return Err(ConfigError::Invalid(format!(
            "--listen {} leaves no room for {} gateways on the following ports",
            config.listen, config.gateways
        ))
        .into());
    }
    let api_key = api_key(&config, std::env::args_os())?;
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("cannot create data dir {}", config.data_dir.display()))?;
    let data_dir = config
        .data_dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", config.data_dir.display()))?;
    let exe = std::env::current_exe().context("cannot find the warren binary")?;
    if config.runtime != "process" && nix::unistd::geteuid().is_root() {
        ensure_base_template(&config.template_dir)?;
    }
    // The run's own template store (see crate::dev_store).
    let own_store = data_dir.join("templates");
    crate::dev_store::prepare(&config.template_dir, &own_store)?;
    let sandbox_http = sandbox_http(&config)?;
    // The gateways read the key from a file only this account can read.
    let keys_file = data_dir.join("gateway-api-keys");
    warren_core::private::write(&keys_file, format!("{api_key} {DEV_TEAM}\n").as_bytes())
        .with_context(|| format!("cannot write {}", keys_file.display()))?;

    let (exited_tx, mut exited_rx) = mpsc::unbounded_channel::<String>();
    let mut parts: Vec<Part> = Vec::new();
    let started = start_all(
        &config,
        &exe,
        &data_dir,
        &keys_file,
        &sandbox_http,
        &mut parts,
    )
    .await;
    if let Err(e) = started {
        stop_all(&mut parts, config.stop_timeout).await;
        return Err(e);
    }
    print_summary(&config, &parts, &api_key, &data_dir, &sandbox_http);
    let (machine, own) = (config.template_dir.clone(), own_store.clone());
    let syncing = tokio::spawn(async move {
        loop {
            tokio::time::sleep(crate::dev_store::SYNC_EVERY).await;
            let (m, o) = (machine.clone(), own.clone());
            match tokio::task::spawn_blocking(move || crate::dev_store::sync(&m, &o)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    eprintln!("warren dev: cannot bring the run's templates up to date: {e}")
                }
                Err(_) => {}
            }
        }
    });

    // Report children that die on their own, and leave them dead: that is the
    // point of running the parts as separate processes.
    let mut watchers = Vec::new();
    for part in &mut parts {
        let Some(pid) = part.pid() else { continue };
        let name = part.label.clone();
        let tx = exited_tx.clone();
        watchers.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(pid) {
                    let _ = tx.send(name);
                    return;
                }
            }
        }));
    }
    let shutdown = warren_core::shutdown::signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(name) = exited_rx.recv() => {
                if let Some(p) = parts.iter_mut().find(|p| p.label == name) {
                    let status = p.child.try_wait().ok().flatten();
                    eprintln!("warren dev: {name} exited ({}); the rest keep running", status.map(|s| s.to_string()).unwrap_or_else(|| "gone".into()));
                }
            }
        }
    }
    for w in watchers {
        w.abort();
    }
    syncing.abort();
    eprintln!("warren dev: stopping");
    stop_all(&mut parts, config.stop_timeout).await;
    eprintln!("warren dev: stopped");
    Ok(())
}

/// The dev key: from `--api-key-file`, `WARREN_DEV_API_KEY` or TOML,
/// checked; generated when none is given. `args` (the process's own
/// command line) must not hold it.
fn api_key<I, S>(config: &Config, args: I) -> Result<String, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    if warren_core::config::names_flag(args, "--api-key") {
        return Err(ConfigError::Invalid(
            "warren dev --api-key: every account on this host can read a process's arguments \
             (ps, /proc/<pid>/cmdline), so the key is never taken there. Give it in the \
             environment (WARREN_DEV_API_KEY=KEY) or in a file (--api-key-file FILE, mode 0600); \
             without either, warren dev generates one"
                .into(),
        ));
    }
    let given = match (&config.api_key, &config.api_key_file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Invalid(
                "give the dev API key once: WARREN_DEV_API_KEY or --api-key-file, not both".into(),
            ))
        }
        (Some(k), None) => Some(k.clone()),
        (None, Some(path)) => {
            let text = warren_gateway::config::read_private(path, "--api-key-file")?;
            Some(text.lines().next().unwrap_or("").trim().to_string())
        }
        (None, None) => None,
    };
    match given {
        Some(k) if k.is_empty() || k.contains(char::is_whitespace) || k.contains(':') => Err(
            ConfigError::Invalid("the dev API key must be non-empty, without spaces or ':'".into()),
        ),
        Some(k) => {
            if !warren_core::id::is_e2b_api_key(&k) {
                eprintln!(
                    "warren dev: warning: the API key is not in E2B's format (e2b_ and 40 \
                     lowercase hex digits): the gateway, the CLI and the Python SDK take it, \
                     but versions of the JavaScript e2b SDK refuse it before sending anything"
                );
            }
            Ok(k)
        }
        None => Ok(warren_core::id::new_e2b_api_key()),
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
                .unwrap_or(false)
        })
        .unwrap_or(true)
}

async fn start_all(
    config: &Config,
    exe: &Path,
    data_dir: &Path,
    keys_file: &Path,
    sandbox_http: &SandboxHttp,
    parts: &mut Vec<Part>,
) -> anyhow::Result<()> {
    let own_store = data_dir.join("templates").display().to_string();
    use warren_trust::{Identity, Role, TlsArgs};
    let certs = data_dir.join("certs");
    let id = |role, name: &str| Identity::new(role, name).map_err(anyhow::Error::msg);
    let scheduler_id = id(Role::Scheduler, "scheduler")?;
    let node_ids = (1..=config.nodes)
        .map(|i| id(Role::Node, &format!("node-{i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let gateway_ids = (1..=config.gateways)
        .map(|i| id(Role::Gateway, &format!("gateway-{i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if !config.insecure_internal {
        let all: Vec<Identity> = std::iter::once(scheduler_id.clone())
            .chain(node_ids.iter().cloned())
            .chain(gateway_ids.iter().cloned())
            .collect();
        warren_trust::issue::local_cluster(&certs, &all)
            .map_err(|e| anyhow::anyhow!("cannot make the cluster's certificates: {e}"))?;
    }
    let tls = |id: &Identity| {
        if config.insecure_internal {
            TlsArgs {
                insecure_internal: true,
                ..TlsArgs::default()
            }
            .to_args()
        } else {
            TlsArgs::from_dir(&certs, id).to_args()
        }
    };
    let sched_dir = data_dir.join("scheduler");
    let mut args = vec![
        "scheduler".to_string(),
        "--listen".into(),
        config.scheduler_listen.to_string(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        sched_dir.display().to_string(),
        "--lease".into(),
        config.lease.clone(),
    ];
    args.extend(tls(&scheduler_id));
    args.extend(config.scheduler_args.split_whitespace().map(String::from));
    let sched = spawn_part(
        exe,
        "scheduler",
        &args,
        &["scheduler grpc", "scheduler admin"],
    )
    .await?;
    let sched_url = format!("http://{}", sched.addr("scheduler grpc"));
    parts.push(sched);

    for i in 1..=config.nodes {
        let name = format!("node-{i}");
        let mut args = vec![
            "node".to_string(),
            "--node-id".into(),
            name.clone(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--scheduler".into(),
            sched_url.clone(),
            "--data-dir".into(),
            data_dir.join(&name).display().to_string(),
            "--runtime".into(),
            config.runtime.clone(),
        ];
        if !names(&config.node_args, "--template-dir") {
            args.extend(["--template-dir".into(), own_store.clone()]);
        }
        args.extend(tls(&node_ids[usize::from(i) - 1]));
        args.extend(config.node_args.split_whitespace().map(String::from));
        parts.push(spawn_part(exe, &name, &args, &["node http", "node admin"]).await?);
    }

    for i in 0..config.gateways {
        let name = format!("gateway-{}", i + 1);
        let listen = SocketAddr::new(sandbox_http.listen.ip(), sandbox_http.listen.port() + i);
        let mut args = vec![
            "gateway".to_string(),
            "--listen".into(),
            listen.to_string(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--scheduler".into(),
            sched_url.clone(),
            "--api-keys-file".into(),
            keys_file.display().to_string(),
            // The dev key is the operator's key too (`warren node ls`).
            "--admin-team".into(),
            DEV_TEAM.into(),
        ];
        // Flags the caller's --gateway-args give win (clap takes each once).
        if !names(&config.gateway_args, "--template-dir") {
            args.extend(["--template-dir".into(), own_store.clone()]);
        }
        if !names(&config.gateway_args, "--domain") {
            args.extend(["--domain".into(), sandbox_http.domain.clone()]);
        }
        if i == 0 && !sandbox_http.also.is_empty() {
            args.push("--http-listen".into());
            args.push(
                sandbox_http
                    .also
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            );
        }
        args.extend(tls(&gateway_ids[usize::from(i)]));
        args.extend(config.gateway_args.split_whitespace().map(String::from));
        parts.push(spawn_part(exe, &name, &args, &["gateway http", "gateway admin"]).await?);
    }
    Ok(())
}

/// Whether the space-separated `args` name `flag` (`--flag V` or
/// `--flag=V`).
fn names(args: &str, flag: &str) -> bool {
    value_of(args, flag).is_some()
}

/// The value the space-separated `args` give `flag`, if they name it.
fn value_of(args: &str, flag: &str) -> Option<String> {
    let mut words = args.split_whitespace();
    while let Some(a) = words.next() {
        if a == flag {
            return Some(words.next().unwrap_or_default().to_string());
        }
        if let Some(v) = a.strip_prefix(&format!("{flag}=")) {
            return Some(v.to_string());
        }
    }
    None
}

/// Starts `exe args` as `name`, and waits until it announced every
/// listener in `wait_for`.
async fn spawn_part(
    exe: &Path,
    name: &str,
    args: &[String],
    wait_for: &[&str],
) -> anyhow::Result<Part> {
    Launch::new(exe, args)
        .label(name)
        .exit_with_parent()
        .wait_for(wait_for)
        .spawn()
        .await
}

/// Where sandboxes' URLs are served and what domain the SDK is told.
#[derive(Debug, Clone)]
struct SandboxHttp {
    /// The first gateway's --listen (a concrete port when the URLs carry it).
    listen: SocketAddr,
    /// Its other plain-HTTP listeners (loopback port 80).
    also: Vec<SocketAddr>,
    /// `localhost`, or `localhost:PORT` when nothing serves port 80.
    domain: String,
    /// Why port 80 is not used, when it is not.
    why_not_80: Option<String>,
}

/// Decides `--sandbox-http`: binds nothing itself (each address is tried
/// and let go, for the gateway to bind at once).
fn sandbox_http(config: &Config) -> Result<SandboxHttp, ConfigError> {
    let try_bind = |a: SocketAddr| std::net::TcpListener::bind(a).map(drop);
    let (also, why_not_80) = match config.sandbox_http.trim() {
        "off" => (Vec::new(), Some("--sandbox-http off".to_string())),
        "auto" => {
            let v4: SocketAddr = (std::net::Ipv4Addr::LOCALHOST, 80).into();
            let v6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, 80).into();
            match try_bind(v4) {
                Ok(()) => {
                    let mut also = vec![v4];
                    if try_bind(v6).is_ok() {
                        also.push(v6);
                    }
                    (also, None)
                }
                Err(e) => (
                    Vec::new(),
                    Some(match e.kind() {
                        std::io::ErrorKind::PermissionDenied => {
                            "binding port 80 needs root or CAP_NET_BIND_SERVICE".to_string()
                        }
                        std::io::ErrorKind::AddrInUse => {
                            "127.0.0.1:80 is in use (another warren dev, or a web server)"
                                .to_string()
                        }
                        _ => format!("cannot bind 127.0.0.1:80: {e}"),
                    }),
                ),
            }
        }
        list => {
            let also = list
                .split(',')
                .map(|a| {
                    a.trim().parse::<SocketAddr>().map_err(|e| {
                        ConfigError::Invalid(format!(
                            "--sandbox-http {a:?}: not auto, off or an address: {e}"
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let on_80 = also.iter().any(|a| a.port() == 80);
            (
                also,
                (!on_80).then(|| "--sandbox-http names no port 80".to_string()),
            )
        }
    };
    let mut listen = config.listen;
    let domain = if why_not_80.is_none() {
        "localhost".to_string()
    } else {
        // The URLs carry the first gateway's port: a concrete one.
        if listen.port() == 0 {
            let port = warren_harness::free_port().map_err(|e| {
                ConfigError::Invalid(format!("--listen {listen}: cannot find a free port: {e}"))
            })?;
            listen.set_port(port);
        }
        format!("localhost:{}", listen.port())
    };
    Ok(SandboxHttp {
        listen,
        also,
        domain,
        why_not_80,
    })
}

fn print_summary(
    config: &Config,
    parts: &[Part],
    api_key: &str,
    data_dir: &Path,
    sandbox_http: &SandboxHttp,
) {
    let gw = parts
        .iter()
        .find(|p| p.label == "gateway-1")
        .and_then(|p| p.addrs.get("gateway http"))
        .cloned()
        .unwrap_or_else(|| config.listen.to_string());
    println!();
    println!(
        "warren dev is up: 1 scheduler, {} node(s), {} gateway(s). Data in {}.",
        config.nodes,
        config.gateways,
        data_dir.display()
    );
    println!();
    println!("Point the e2b SDK (or `warren sandbox ...`) at it:");
    println!();
    println!("  export E2B_API_URL=http://{gw}");
    println!("  export E2B_SANDBOX_URL=http://{gw}");
    println!("  export E2B_VOLUME_API_URL=http://{gw}");
    println!("  export E2B_API_KEY={api_key}");
    // The gateways' --domain, theirs when --gateway-args names one.
    let domain =
        value_of(&config.gateway_args, "--domain").unwrap_or_else(|| sandbox_http.domain.clone());
    println!("  export E2B_DOMAIN={domain}");
    println!();
    println!(
        "A sandbox's ports open in a browser or with curl at get_host(port): \
         http://8080-<sandbox id>.{domain}/"
    );
    if let Some(why) = &sandbox_http.why_not_80 {
        println!("  (not on port 80: {why}; the URLs carry the gateway's port)");
    }
    println!(
        "Templates: the machine's from {}; what this run makes is kept in {}.",
        config.template_dir.display(),
        data_dir.join("templates").display()
    );
    println!();
    println!("Components (kill any of them to see what happens):");
    for p in parts {
        let pid = p.pid().unwrap_or(0);
        let mut addrs: Vec<_> = p.addrs.iter().collect();
        addrs.sort();
        let shown: Vec<String> = addrs
            .iter()
            .map(|(what, addr)| {
                let label = what.split_whitespace().nth(1).unwrap_or(what);
                if label == "admin" {
                    format!("metrics http://{addr}/metrics")
                } else {
                    format!("{label} {addr}")
                }
            })
            .collect();
        println!("  {:<10} pid {:<7} {}", p.label, pid, shown.join("  "));
    }
    println!();
    println!("Ctrl-C stops everything.");
    // Machine-readable lines for scripts and tests, in the same form every
    // part uses: `dev gateway-N` (its HTTP listener) last, and before it
    // `dev gateway-N https` for a first TLS listener given in --gateway-args
    // (`--public-tls-listen 127.0.0.1:0` lands on a port only this tells).
    for p in parts.iter().filter(|p| p.label.starts_with("gateway")) {
        if let Some(addr) = p.addrs.get("gateway https") {
            warren_core::announce("dev", &format!("{} https", p.label), addr);
        }
        if let Some(addr) = p.addrs.get("gateway http") {
            warren_core::announce("dev", &p.label, addr);
        }
    }
}

async fn stop_all(parts: &mut [Part], timeout: Duration) {
    // Gateways first (no new traffic), then nodes, then the scheduler.
    for prefix in ["gateway", "node", "scheduler"] {
        let group: Vec<&mut Part> = parts
            .iter_mut()
            .filter(|p| p.label.starts_with(prefix))
            .collect();
        for p in &group {
            p.signal(Signal::SIGTERM);
        }
        for p in group {
            if !p.wait_exit(timeout).await.on_its_own {
                eprintln!(
                    "warren dev: {} did not stop within {timeout:?}; killed it",
                    p.label
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("dev").chain(args.iter().copied()))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_key_never_comes_from_the_command_line() {
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        let c = config(&["--api-key", key]);
        let err = api_key(&c, ["warren", "dev", "--api-key", key]).unwrap_err();
        assert!(err.to_string().contains("WARREN_DEV_API_KEY"), "{err}");
        let err = api_key(&c, ["warren", "dev", &format!("--api-key={key}")]).unwrap_err();
        assert!(err.to_string().contains("--api-key-file"), "{err}");
        // From the environment (or TOML) it is taken.
        assert_eq!(api_key(&c, ["warren", "dev"]).unwrap(), key);
        // From a file only its owner reads.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        warren_core::private::write(&file, format!("{key}\n").as_bytes()).unwrap();
        let path = file.display().to_string();
        let c = config(&["--api-key-file", &path]);
        assert_eq!(api_key(&c, ["warren", "dev"]).unwrap(), key);
        let c = config(&["--api-key-file", &path, "--api-key", key]);
        assert!(api_key(&c, ["warren", "dev"]).is_err(), "not both");
        // None: one is made, in E2B's format.
        let made = api_key(&config(&[]), ["warren", "dev"]).unwrap();
        assert!(warren_core::id::is_e2b_api_key(&made), "{made}");
    }
}
