//! Hosts on one machine, for tests in which parts share nothing but the
//! network: each [`Host`] is a network namespace with its own address on a
//! bridge ([`Network`]) and a directory of its own. A part started on a host
//! ([`Host::launch`]) listens on that host's address (any port: no other
//! host's listeners are there), reaches the others only through the bridge,
//! and loses them all when the host is cut off ([`Host::disconnect`]).
//!
//! The machine itself is on the bridge too, at [`Network::machine_addr`]:
//! the test process, and what it serves to every host (a database, an object
//! store), listen there. Needs root and `ip` (iproute2).
//!
//! Names carry the creating process's id, so a run killed before it cleaned
//! up is swept by the next one: `wrn-host-<pid>-...` namespaces and
//! `wrb<pid>x<n>` bridges whose process is gone are deleted on
//! [`Network::create`].

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

/// The bridges' /24s are `10.231.<octet>.0`, one octet per live network.
const PREFIX: &str = "10.231";

/// Where the machine holds the lock that orders networks being made.
const LOCK: &str = "/run/warren-test-hosts.lock";

/// A bridge joining [`Host`]s, deleted (with every host) on drop.
pub struct Network {
    bridge: String,
    octet: u8,
    tag: String,
    next_host: AtomicU8,
    dir: tempfile::TempDir,
}

/// One host: a network namespace on a [`Network`], deleted on drop (after
/// the processes in it are stopped, which the caller does first).
pub struct Host {
    /// The name it was added with (`node-1`, ...).
    pub name: String,
    /// Its address on the bridge.
    pub addr: String,
    netns: String,
    /// The machine's end of its cable.
    cable: String,
    dir: PathBuf,
}

impl Network {
    /// A new bridge in a /24 no live network uses, after sweeping what
    /// killed runs left behind.
    pub fn create() -> anyhow::Result<Network> {
        anyhow::ensure!(
            nix::unistd::Uid::effective().is_root(),
            "multi-host tests make network namespaces and a bridge: run them as root"
        );
        static NEXT: AtomicU8 = AtomicU8::new(0);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .with_context(|| format!("cannot open {LOCK}"))?;
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow::anyhow!("cannot lock {LOCK}: {e}"))?;
        sweep_dead();
        let used = run("ip", &["-o", "-4", "addr", "show"])?;
        let octet = (1..=254u8)
            .find(|o| !used.contains(&format!(" {PREFIX}.{o}.")))
            .context("every 10.231.x.0/24 is in use: too many multi-host tests at once")?;
        // No live network has this octet, so a cable named for it is a dead
        // run's (its namespace kept alive a while by the kernel, or by a
        // process of that run still exiting): it would clash with ours.
        let links = run("ip", &["-o", "link", "show"])?;
        let stale = format!("wv{octet}h");
        for name in links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n))
            .filter(|n| n.starts_with(&stale))
        {
            let _ = run("ip", &["link", "del", name]);
        }
        let tag = format!(
            "{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let bridge = format!("wrb{tag}");
        let net = Network {
            bridge: bridge.clone(),
            octet,
            tag,
            next_host: AtomicU8::new(10),
            dir: tempfile::Builder::new().prefix("warren-hosts-").tempdir()?,
        };
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", net.machine_addr()),
                "dev",
                &bridge,
            ],
        )?;
        run("ip", &["link", "set", &bridge, "up"])?;
        Ok(net)
    }

    /// The machine's own address on the bridge.
    pub fn machine_addr(&self) -> String {
        format!("{PREFIX}.{}.1", self.octet)
    }

    /// A new host named `name` (its directory is `<network dir>/<name>`).
    pub fn add_host(&self, name: &str) -> anyhow::Result<Host> {
        let n = self.next_host.fetch_add(1, Ordering::SeqCst);
        anyhow::ensure!(n < 250, "a network holds at most 240 hosts");
        let addr = format!("{PREFIX}.{}.{n}", self.octet);
        let netns = format!("wrn-host-{}-{name}", self.tag.replace('x', "-"));
        let cable = format!("wv{}h{n}", self.octet);
        let peer = format!("wp{}h{n}", self.octet);
        let dir = self.dir.path().join(name);
        std::fs::create_dir_all(&dir)?;
        let host = Host {
            name: name.to_string(),
            addr: addr.clone(),
            netns: netns.clone(),
            cable: cable.clone(),
            dir,
        };
        run("ip", &["netns", "add", &netns])?;
        run(
            "ip",
            &[
                "link", "add", &cable, "type", "veth", "peer", "name", &peer, "netns", &netns,
            ],
        )?;
        run("ip", &["link", "set", &cable, "master", &self.bridge])?;
        run("ip", &["link", "set", &cable, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &netns, "ip"];
            all.extend_from_slice(args);
            run("ip", &all)
        };
        inside(&["link", "set", &peer, "name", "eth0"])?;
        inside(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"])?;
        inside(&["link", "set", "eth0", "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        Ok(host)
    }

    /// A directory for what runs on the machine itself.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}

impl Host {
    /// `exe args...` started in this host's namespace.
    ///
    /// Only the network namespace is entered (`nsenter --net`): `ip netns
    /// exec` would also remount `/sys` for it, hiding the machine's cgroup
    /// hierarchies, which an isolated node needs.
    pub fn launch<S: AsRef<str>>(&self, exe: &Path, args: &[S]) -> crate::Launch {
        let mut all = vec![
            format!("--net=/run/netns/{}", self.netns),
            "--".into(),
            exe.display().to_string(),
        ];
        all.extend(args.iter().map(|a| a.as_ref().to_string()));
        crate::Launch::new(Path::new("nsenter"), &all).label(&self.name)
    }

    /// `program args...` run to completion in this host's namespace; its
    /// output, or an error with its stderr.
    pub fn run(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["netns", "exec", &self.netns, program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// The host's own directory (its data and caches go under it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Pulls the host's cable: nothing reaches it and it reaches nothing
    /// (its processes keep running).
    pub fn disconnect(&self) -> anyhow::Result<()> {
        run("ip", &["link", "set", &self.cable, "down"]).map(|_| ())
    }

    /// Plugs the cable back in.
    pub fn reconnect(&self) -> anyhow::Result<()> {
        run("ip", &["link", "set", &self.cable, "up"]).map(|_| ())
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the veth pair, and so
        // the machine's end too.
        let _ = run("ip", &["netns", "del", &self.netns]);
    }
}

/// Runs `program args...`; its stdout, or an error naming it with stderr.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    anyhow::ensure!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Deletes the namespaces and bridges of runs whose process is gone.
fn sweep_dead() {
    let alive = |pid: &str| Path::new("/proc").join(pid).exists();
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name
                .strip_prefix("wrn-host-")
                .and_then(|r| r.split('-').next())
            {
                if !alive(pid) {
                    let _ = run("ip", &["netns", "del", &name]);
                }
            }
        }
    }
    if let Ok(links) = run("ip", &["-o", "link", "show", "type", "bridge"]) {
        for line in links.lines() {
            let Some(name) = line.split(": ").nth(1) else {
                continue;
            };
            if let Some(pid) = name.strip_prefix("wrb").and_then(|r| r.split('x').next()) {
                if !alive(pid) {
                    let _ = run("ip", &["link", "del", name]);
                }
            }
        }
    }
}
