//! A private Garage server (an S3-compatible object store,
//! <https://garagehq.deuxfleurs.fr>): one node, replication 1, its
//! metadata and data in a temp dir, the S3 API on a free loopback port,
//! one bucket and one key that may use it. Stopped, and its files removed,
//! when dropped; it also dies with the process that started it (a parent-
//! death signal, from a thread that lives as long as the server), and a
//! later start removes the files of servers whose process died.
//!
//! It runs the `garage` binary found on `PATH` or in `~/.cargo/bin`
//! (`cargo install garage --locked`; `.ci/run` installs it).

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// The region Garage answers as (its `s3_region`).
pub const REGION: &str = "garage";

/// How long the server may take to answer after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a stop waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The temp dir prefix (and what a start sweeps for dead servers' files).
const DIR_PREFIX: &str = "warren-garage-";

/// A running private Garage server.
pub struct GarageServer {
    /// `http://127.0.0.1:<port>`: the S3 API.
    pub endpoint: String,
    /// [`REGION`].
    pub region: String,
    /// The bucket made for the caller.
    pub bucket: String,
    /// The key that may read, write and own the bucket.
    pub access_key_id: String,
    pub secret_access_key: String,
    /// The server process, kept by its own thread.
    keeper: Option<Keeper>,
    /// Its exit status, once it has exited (kept after [`Self::stop`]).
    status: Arc<Mutex<Option<ExitStatus>>>,
    /// The config, metadata, data and log; removed on drop.
    dir: tempfile::TempDir,
}

/// The `garage` binary: on `PATH`, else in `$CARGO_HOME/bin` or
/// `~/.cargo/bin`.
pub fn binary() -> anyhow::Result<PathBuf> {
    let mut places: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        places.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        places.push(PathBuf::from(home).join(".cargo/bin"));
    }
    places
        .into_iter()
        .map(|d| d.join("garage"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "garage is not installed (not on PATH nor in ~/.cargo/bin); the S3 tests need \
                 it: cargo install garage --locked (.ci/run installs it)"
            )
        })
}

impl GarageServer {
    /// Starts a fresh server with one bucket and one key; fails with a
    /// message naming what is missing or what went wrong (and the
    /// server's log). Blocks: from async code, call it in
    /// `spawn_blocking`.
    pub fn start() -> anyhow::Result<GarageServer> {
        GarageServer::start_on(std::net::Ipv4Addr::LOCALHOST)
    }

    /// [`GarageServer::start`], with the S3 API on `addr` (a test
    /// network's machine address, which its hosts reach) rather than
    /// loopback; its internal RPC stays on loopback.
    pub fn start_on(addr: std::net::Ipv4Addr) -> anyhow::Result<GarageServer> {
        let exe = binary()?;
        sweep_dead();
        let dir = tempfile::Builder::new().prefix(DIR_PREFIX).tempdir()?;
        std::fs::write(dir.path().join("owner.pid"), std::process::id().to_string())?;
        let rpc_port = crate::free_port()?;
        let s3_port = crate::free_port()?;
        let config = dir.path().join("garage.toml");
        let root = dir.path().display();
        warren_core::private::write(
            &config,
            format!(
                "metadata_dir = \"{root}/meta\"\n\
                 data_dir = \"{root}/data\"\n\
                 db_engine = \"sqlite\"\n\
                 replication_factor = 1\n\
                 rpc_bind_addr = \"127.0.0.1:{rpc_port}\"\n\
                 rpc_public_addr = \"127.0.0.1:{rpc_port}\"\n\
                 rpc_secret = \"{}\"\n\
                 \n\
                 [s3_api]\n\
                 s3_region = \"{REGION}\"\n\
                 api_bind_addr = \"{addr}:{s3_port}\"\n\
                 root_domain = \".s3.garage.localhost\"\n",
                random_hex(32)?
            )
            .as_bytes(),
        )?;
        let log = dir.path().join("garage.log");
        let mut cmd = match setpriv() {
            // Dies with the thread that starts it (see Keeper).
            Some(setpriv) => {
                let mut c = Command::new(setpriv);
                c.args(["--pdeathsig", "KILL", "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.arg("-c")
            .arg(&config)
            .arg("server")
            .env("RUST_LOG", "garage=info,warn")
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::fs::File::create(&log)?))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new().append(true).open(&log)?,
            ));
        let status = Arc::new(Mutex::new(None));
        let keeper =
            Keeper::spawn(cmd, Arc::clone(&status)).context("cannot start garage server")?;
        let mut server = GarageServer {
            endpoint: format!("http://{addr}:{s3_port}"),
            region: REGION.to_string(),
            bucket: "warren-test".to_string(),
            access_key_id: format!("GK{}", random_hex(12)?),
            secret_access_key: random_hex(32)?,
            keeper: Some(keeper),
            status,
            dir,
        };
        server.set_up(&exe, &config, addr, s3_port).map_err(|e| {
            let log = server.log();
            e.context(format!("garage did not come up; its log:\n{log}"))
        })?;
        Ok(server)
    }

    /// Waits for the node, gives it a role, makes the key and the bucket,
    /// and waits until the S3 API answers.
    fn set_up(
        &mut self,
        exe: &Path,
        config: &Path,
        addr: std::net::Ipv4Addr,
        s3_port: u16,
    ) -> anyhow::Result<()> {
        let garage = |args: &[&str]| -> anyhow::Result<String> {
            let out = Command::new(exe)
                .arg("-c")
                .arg(config)
                .args(args)
                .stdin(Stdio::null())
                .output()
                .with_context(|| format!("cannot run garage {}", args.join(" ")))?;
            anyhow::ensure!(
                out.status.success(),
                "garage {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                anyhow::bail!("garage server exited ({status}) while starting");
            }
            match garage(&["status"]) {
                Ok(_) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context(format!("not up within {READY_TIMEOUT:?}")))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        let id = garage(&["node", "id", "-q"])?;
        let id = id.trim().split('@').next().unwrap_or("").to_string();
        anyhow::ensure!(!id.is_empty(), "garage node id printed nothing");
        garage(&["layout", "assign", "-z", "dc1", "-c", "1G", &id])?;
        garage(&["layout", "apply", "--version", "1"])?;
        garage(&[
            "key",
            "import",
            "--yes",
            "-n",
            "warren-test",
            &self.access_key_id,
            &self.secret_access_key,
        ])?;
        garage(&["bucket", "create", &self.bucket])?;
        garage(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            &self.bucket,
            "--key",
            &self.access_key_id,
        ])?;
        // Answered at all (an anonymous request is refused with a 4xx) and
        // not 5xx (the layout not yet in force).
        loop {
            match s3_status(addr, s3_port) {
                Some(code) if code < 500 => return Ok(()),
                _ if Instant::now() >= deadline => {
                    anyhow::bail!("the S3 API on port {s3_port} did not answer")
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// `s3://<bucket>`.
    pub fn url(&self) -> String {
        format!("s3://{}", self.bucket)
    }

    /// The object_store options that reach this server with its key:
    /// endpoint, region, path-style over plain HTTP, the credentials.
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("endpoint", self.endpoint.as_str()),
            ("region", self.region.as_str()),
            ("allow_http", "true"),
            ("access_key_id", self.access_key_id.as_str()),
            ("secret_access_key", self.secret_access_key.as_str()),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec()
    }

    /// The server's config file (for running `garage -c <it> ...`).
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("garage.toml")
    }

    /// What the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("garage.log")).unwrap_or_default()
    }

    /// The server's exit status, if it has exited.
    pub fn exited(&self) -> Option<ExitStatus> {
        *self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops the server (SIGTERM, then SIGKILL after 10 s) and waits for
    /// it; its files stay until the value is dropped. Idempotent.
    pub fn stop(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.stop();
        }
    }
}

impl Drop for GarageServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The server process and the thread that started it and waits on it.
/// The process has a parent-death signal, which the kernel sends when the
/// *thread* that forked it ends: so one thread, alive as long as the
/// server, starts it, and stops it when told (or when the [`Keeper`] is
/// dropped).
struct Keeper {
    /// Closed or sent to: stop the server.
    stop: mpsc::Sender<()>,
    /// The keeper thread, joined on stop.
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Keeper {
    /// Starts `cmd` on a new thread; its exit status goes to `seen`.
    fn spawn(mut cmd: Command, seen: Arc<Mutex<Option<ExitStatus>>>) -> anyhow::Result<Keeper> {
        let (started_tx, started_rx) = mpsc::channel();
        let (stop, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("garage".into())
            .spawn(move || {
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(()));
                // Until told to stop, or the server value is gone.
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(Duration::from_millis(100))
                {
                    if let Ok(Some(st)) = child.try_wait() {
                        set(&seen, st);
                    }
                }
                if let Some(st) = terminate(&mut child) {
                    set(&seen, st);
                }
            })?;
        started_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the garage thread ended before starting it"))??;
        Ok(Keeper {
            stop,
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn set(slot: &Mutex<Option<ExitStatus>>, st: ExitStatus) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(st);
}

/// SIGTERM, a bounded wait, then SIGKILL; the exit status.
fn terminate(child: &mut std::process::Child) -> Option<ExitStatus> {
    if let Ok(Some(st)) = child.try_wait() {
        return Some(st);
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().ok()
}

/// `setpriv` (util-linux), for the parent-death signal.
fn setpriv() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("setpriv"))
        .find(|p| p.is_file())
}

/// Removes the temp dirs of servers whose starting process is gone (it
/// was killed before it could drop them).
fn sweep_dead() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let owner = std::fs::read_to_string(e.path().join("owner.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        if let Some(pid) = owner {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The status code of an anonymous `GET /` on the S3 port, if it answers.
fn s3_status(ip: std::net::Ipv4Addr, port: u16) -> Option<u16> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from((ip, port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
