//! A private PostgreSQL server: `initdb` into a temp dir, started on a free
//! loopback port, stopped (and its files removed) when dropped. The failover
//! experiment runs its scheduler replicas on one (unless given
//! `--database-url`), and the integration tests use it too.
//!
//! It uses Debian's `postgresql` package binaries (`/usr/lib/postgresql/<v>/bin`,
//! or whatever `pg_config --bindir` says). PostgreSQL refuses to run as root,
//! so as root the server runs as the `postgres` user via `runuser`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A running private PostgreSQL server.
pub struct PgServer {
    /// `postgres://postgres@<addr>:<port>/postgres`.
    pub url: String,
    /// The address it listens on (127.0.0.1 unless [`PgServer::start_on`]).
    pub addr: String,
    /// The port it listens on.
    pub port: u16,
    dir: tempfile::TempDir,
    bindir: PathBuf,
    as_postgres: bool,
}

fn bindir() -> anyhow::Result<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if p.join("initdb").exists() {
            return Ok(p);
        }
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| anyhow::anyhow!("PostgreSQL is not installed (no /usr/lib/postgresql: {e}); Debian: apt-get install postgresql"))?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().ok_or_else(|| {
        anyhow::anyhow!(
            "no initdb under /usr/lib/postgresql/*/bin; Debian: apt-get install postgresql"
        )
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PgServer {
    /// Starts a fresh server on loopback; fails with a message naming what
    /// is missing.
    pub fn start() -> anyhow::Result<PgServer> {
        Self::start_on("127.0.0.1")
    }

    /// Starts a fresh server listening on `addr` only, accepting clients on
    /// the subnets the machine has an address in (`samenet`: the hosts of a
    /// [`crate::hosts::Network`] when `addr` is its machine address).
    pub fn start_on(addr: &str) -> anyhow::Result<PgServer> {
        let bindir = bindir()?;
        let as_postgres = is_root();
        let dir = tempfile::Builder::new().prefix("warren-pg-").tempdir()?;
        let data = dir.path().join("data");
        let port = crate::free_port()?;
        if as_postgres {
            // The temp dir must be reachable and owned by the server's user.
            let _ = Command::new("chmod").arg("755").arg(dir.path()).status();
            let st = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()?;
            anyhow::ensure!(
                st.success(),
                "chown of {} to postgres failed",
                dir.path().display()
            );
        }
        crate::write_store_key(&dir.path().join("store.key"))?;
        let server = PgServer {
            url: format!("postgres://postgres@{addr}:{port}/postgres"),
            addr: addr.to_string(),
            port,
            dir,
            bindir,
            as_postgres,
        };
        server.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )?;
        if addr != "127.0.0.1" {
            let hba = data.join("pg_hba.conf");
            let mut rules = std::fs::read_to_string(&hba)?;
            rules.push_str("host all all samenet trust\n");
            std::fs::write(&hba, rules)?;
        }
        let opts = format!(
            "-c listen_addresses={addr} -p {port} -k {} -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            server.dir.path().display()
        );
        server.run(
            "pg_ctl",
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &server.dir.path().join("log").display().to_string(),
                "-o",
                &opts,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )?;
        Ok(server)
    }

    fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let exe = self.bindir.join(tool);
        let out = if self.as_postgres {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&exe)
                .args(args)
                .current_dir("/")
                .output()?
        } else {
            Command::new(&exe).args(args).output()?
        };
        anyhow::ensure!(
            out.status.success(),
            "{} {} failed: {}{}",
            exe.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// Creates a new empty database and returns its URL (one per test keeps tests apart).
    pub fn create_database(&self, name: &str) -> anyhow::Result<String> {
        self.run(
            "createdb",
            &[
                "-h",
                &self.addr,
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                name,
            ],
        )?;
        Ok(format!(
            "postgres://postgres@{}:{}/{name}",
            self.addr, self.port
        ))
    }

    /// The server's data directory.
    /// A scheduler store key (`--store-key-file`) for the schedulers of
    /// this server's databases: replicas of one store must share one.
    pub fn store_key_file(&self) -> PathBuf {
        self.dir.path().join("store.key")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn stop(&self) {
        let data = self.data_dir();
        let _ = self.run(
            "pg_ctl",
            &[
                "-D",
                &data.display().to_string(),
                "-m",
                "immediate",
                "-w",
                "-t",
                "20",
                "stop",
            ],
        );
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
        // Give the postmaster a moment to release files before the temp dir goes.
        std::thread::sleep(Duration::from_millis(50));
        let _ = Path::new(self.dir.path()).exists();
    }
}
