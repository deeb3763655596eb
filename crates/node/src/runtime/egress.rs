//! Outbound network for isolated sandboxes, under a policy.
//!
//! A sandbox's network namespace gets a `tap0` from `slirp4netns` (a
//! userspace TCP/IP stack: the sandbox is `10.0.2.100`, its gateway
//! `10.0.2.2`, its resolver [`DNS`]), started with `--disable-host-loopback`
//! and as the sandbox's own first host uid, so every connection it makes on
//! the sandbox's behalf is a host socket owned by that uid. Once it is up,
//! slirp4netns joins the sandbox's cgroups (every hierarchy): the CPU it
//! spends and the memory it allocates for the sandbox's traffic count
//! against the sandbox's limits, a pause freezes it with the sandbox, and
//! the sandbox's kill takes it too. Two kinds of nftables tables judge its
//! sockets on the host's output hook ([`rules`]: each table's base chain
//! is one rule, so a host packet pays one rule per table, whatever the
//! policies hold).
//!
//! **The guard** (`inet warren_guard_<first uid>`, one per id space) refuses
//! the host and link-local to every uid of every range of the node. It is
//! installed when the node starts, before any sandbox, reasserted with every
//! sandbox's own table, and never removed: whatever happens to a sandbox's own
//! table (not yet there, being replaced or removed, deleted by hand), the
//! host stays out of reach. A packet must pass every table, so the guard
//! only ever adds refusals (its `accept` of the host's resolvers on port 53
//! ends only its own chain).
//!
//! **A table per restricted sandbox** (`inet warren_<slot>_<nonce>`) holds
//! its policy, its addresses in sets. A sandbox under the open policy
//! (E2B's default: internet on, nothing in `allowOut` or `denyOut`) has
//! none: the guard's verdicts are exactly that policy's (its resolvers,
//! the host refused, the rest accepted), so its create and delete run no
//! `nft` process at all — whose cost grows with every table on the host
//! (listing 929 tables took `nft` a minute of CPU). A restricted table:
//!
//! 1. the host's resolvers on port 53 are allowed when the policy lets the
//!    sandbox resolve: it has domains in `allowOut`, or it may reach the
//!    resolver anyway (`allowOut` names it, or internet is on and no
//!    `denyOut` entry covers it). With internet off and no domains, or a
//!    `denyOut` naming a resolver, DNS is refused like the rest;
//! 2. always refused: every address of the host itself (`fib daddr type
//!    local`: loopback, the node's, gateway's and scheduler's ports on any
//!    local address), link-local and cloud metadata (`169.254.0.0/16`,
//!    `fe80::/10`);
//! 3. `allowOut` entries are accepted (they win over denials, as in E2B);
//! 4. `denyOut` entries are refused, and everything when the sandbox was
//!    created with `allow_internet_access: false`.
//!
//! The lists are bounded where the policy is validated (1 000 entries each,
//! 100 domains: [`warren_core::network`]), and a domain may resolve to at
//! most 64 addresses. Domains in `allowOut` are resolved (on a blocking
//! thread) when the sandbox starts, and again when its policy is replaced
//! (`PUT /sandboxes/{id}/network`: the table is rewritten in one
//! transaction, [`EgressHandle::update`]; written when the policy stops
//! being the open one, removed when it becomes it). A sandbox with no internet access
//! and no `allowOut` gets no `tap0` at all: only `lo`, no route — until an
//! update gives it a network (slirp4netns is started then; the tap stays
//! after a later update takes the network away, its table refusing
//! everything). Other sandboxes are unreachable either way: each sits
//! behind its own slirp4netns, and the host's addresses are refused.
//!
//! **Egress rules** (E2B's `network.rules`): a sandbox with rules and a
//! network gets the node's egress proxy in its path ([`intercept`]): a
//! redirect inside its own namespace sends its connections to ports 80
//! and 443 to the proxy, whose onward connections the tables above judge
//! as they judge the sandbox's own. No rule of the host's tables changes.

pub mod intercept;
mod rules;

pub use intercept::ProxySetup;
pub use rules::EgressError;
use rules::Plan;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use warren_core::network::rules::EgressRules;
pub use warren_core::network::NetworkPolicy;
use warren_trust::sandbox_ca::SandboxCa;

/// The resolver address a sandbox with egress uses (slirp4netns's).
pub const DNS: &str = "10.0.2.3";

/// The egress machinery of a node; `None` of it means sandboxes cannot get
/// internet access on this node.
#[derive(Debug, Clone)]
pub struct Egress {
    slirp: PathBuf,
    nft: PathBuf,
    /// The host's resolvers, which slirp4netns forwards DNS to.
    nameservers: Vec<IpAddr>,
    /// Every host uid any of the node's sandboxes can have (first, last):
    /// what the guard table covers.
    uids: (u32, u32),
    /// The egress proxy for sandboxes with rules (None: rules are refused).
    proxy: Option<Arc<ProxySetup>>,
}

/// Whose egress a handle is, with what its proxy needs.
#[derive(Debug, Clone, Copy)]
pub struct Sandboxed<'a> {
    pub sandbox_id: &'a str,
    pub generation: u64,
    /// Its egress CA (None: placed before there were any).
    pub ca: Option<&'a SandboxCa>,
    pub rules: &'a EgressRules,
}

impl Egress {
    /// Deletes the `warren_<slot>` tables of sandboxes that are gone (a
    /// node killed before it could clean up), as told by `gone(slot)`.
    pub fn sweep(&self, gone: impl Fn(u32) -> bool) {
        let Ok(out) = std::process::Command::new(&self.nft)
            .args(["list", "tables"])
            .output()
        else {
            return;
        };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some(name) = line.trim().strip_prefix("table inet ") else {
                continue;
            };
            let slot = name
                .strip_prefix("warren_")
                .and_then(|s| s.split('_').next())
                .and_then(|s| s.parse::<u32>().ok());
            if slot.is_some_and(&gone) {
                let _ = std::process::Command::new(&self.nft)
                    .args(["delete", "table", "inet", name])
                    .status();
            }
        }
    }

    /// Finds slirp4netns and nft, checks that nft works and
    /// installs the guard over the host uids `uids` (first, last): every
    /// range the node hands out.
    pub fn detect(uids: (u32, u32)) -> Result<Egress, String> {
        let find =
            |p: &str| super::limits::find_program(p).ok_or_else(|| format!("{p} is not installed"));
        let e = Egress {
            slirp: find("slirp4netns")?,
            nft: find("nft")?,
            nameservers: std::fs::read_to_string("/etc/resolv.conf")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().strip_prefix("nameserver"))
                .filter_map(|a| a.trim().parse().ok())
                .collect(),
            uids,
            proxy: None,
        };
        // slirp4netns runs as the sandbox's own uid and opens the tun device
        // before it enters the sandbox's namespaces. udev makes it 0666 on
        // Debian; without that (containers) the node does: opening it gives
        // nothing without CAP_NET_ADMIN over some network namespace.
        {
            use std::os::unix::fs::PermissionsExt;
            let tun = std::path::Path::new("/dev/net/tun");
            let md = std::fs::metadata(tun).map_err(|err| format!("/dev/net/tun: {err}"))?;
            if md.permissions().mode() & 0o006 != 0o006 {
                std::fs::set_permissions(tun, std::fs::Permissions::from_mode(0o666))
                    .map_err(|err| format!("cannot make /dev/net/tun usable (0666): {err}"))?;
                tracing::info!("made /dev/net/tun mode 0666 (as udev does on Debian)");
            }
        }
        let out = std::process::Command::new(&e.nft)
            .args(["list", "tables"])
            .output()
            .map_err(|err| format!("cannot run nft: {err}"))?;
        if !out.status.success() {
            return Err(format!(
                "nft does not work here: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        e.nft_blocking(&e.guard())
            .map_err(|err| format!("cannot install the guard table: {err}"))?;
        Ok(e)
    }

    /// The egress proxy sandboxes with rules get.
    pub fn with_proxy(mut self, setup: Arc<ProxySetup>) -> Egress {
        self.proxy = Some(setup);
        self
    }

    /// The guard's table name: one per id space, so nodes on one machine
    /// with the same `--sandbox-id-base` share it. (Not `warren_<number>_`:
    /// a sweep never takes it for a sandbox's table.)
    fn guard_table(&self) -> String {
        format!("warren_guard_{}", self.uids.0)
    }

    /// The nftables script that (re)installs the guard, atomically.
    fn guard(&self) -> String {
        rules::guard_script(&self.guard_table(), self.uids, &self.nameservers)
    }

    /// A table name of its own for a sandbox in range `slot`: the slot (so
    /// a sweep can tell a dead sandbox's table) and a nonce (so removing one
    /// sandbox's table can never remove the next one's in the same range).
    fn table(slot: u32) -> String {
        format!("warren_{slot}_{:08x}", rand::random::<u32>())
    }

    /// `policy` as sets, its domains resolved on a blocking thread (a slow
    /// resolver holds no async worker).
    async fn plan(&self, policy: &NetworkPolicy) -> Result<Plan, EgressError> {
        let (policy, ns) = (policy.clone(), self.nameservers.clone());
        tokio::task::spawn_blocking(move || Plan::of(&policy, &ns, &mut lookup))
            .await
            .map_err(|e| EgressError::Node(format!("the resolver task failed: {e}")))?
    }

    /// The nftables script for one sandbox's table, after the guard's
    /// (reasserted in the same transaction: if anything removed it, it is
    /// back before this sandbox's slirp4netns exists).
    fn ruleset(&self, base: u32, table: &str, plan: &Plan) -> Result<String, EgressError> {
        let end = base
            .checked_add(super::launch::IDS_PER_SANDBOX - 1)
            .ok_or_else(|| EgressError::Node(format!("id range {base} runs past the id space")))?;
        Ok(format!(
            "{}{}",
            self.guard(),
            rules::sandbox_script(table, (base, end), plan)
        ))
    }

    /// Runs an nftables script (one transaction: all of it or none).
    fn nft_blocking(&self, script: &str) -> Result<(), String> {
        use std::io::Write;
        let mut child = std::process::Command::new(&self.nft)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run nft: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .map_err(|e| format!("nft: {e}"))?;
        }
        let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "nft refused the rules: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    async fn nft(&self, script: &str) -> Result<(), EgressError> {
        let (me, script) = (self.clone(), script.to_string());
        tokio::task::spawn_blocking(move || me.nft_blocking(&script))
            .await
            .map_err(|e| format!("nft: {e}"))
            .and_then(|r| r)
            .map_err(EgressError::Node)
    }

    /// Gives the sandbox whose launcher is `pid` (it has made the network
    /// namespace) its table under `policy` and, when the policy gives it a
    /// network, a `tap0` through slirp4netns, which joins the sandbox's
    /// cgroups (`cgroup_procs`, every hierarchy's `cgroup.procs`). Returns
    /// once the interface is configured.
    pub async fn attach(
        &self,
        pid: i32,
        base: u32,
        slot: u32,
        policy: &NetworkPolicy,
        cgroup_procs: Vec<PathBuf>,
        who: Sandboxed<'_>,
    ) -> Result<EgressHandle, EgressError> {
        let table = Egress::table(slot);
        let plan = self.plan(policy).await?;
        // The open policy (E2B's default) is what the guard alone does: no
        // table, no `nft` process, nothing whose cost grows with the
        // sandboxes hosted (see the module doc).
        let has_table = !plan.is_open(&self.nameservers);
        if has_table {
            let rules = self.ruleset(base, &table, &plan)?;
            self.nft(&rules).await?;
        }
        let mut handle = EgressHandle {
            egress: self.clone(),
            pid,
            base,
            table,
            has_table,
            cgroup_procs,
            slirp: None,
            exit: None,
            table_handed_off: false,
            plan: Arc::new(RwLock::new(plan)),
            interception: None,
        };
        if policy.has_network() {
            handle.start_slirp().await?;
        }
        handle.apply_rules(who).await?;
        Ok(handle)
    }
}

/// One sandbox's egress: its slirp4netns and its nftables table, both gone
/// when this is dropped.
#[derive(Debug)]
pub struct EgressHandle {
    egress: Egress,
    /// The sandbox's launcher, whose namespaces slirp4netns joins.
    pid: i32,
    /// The sandbox's first host uid (its rules match its uids).
    base: u32,
    table: String,
    /// Whether its table is in the kernel (an open policy has none).
    has_table: bool,
    /// The `cgroup.procs` of each of the sandbox's cgroups: slirp4netns
    /// joins them all.
    cgroup_procs: Vec<PathBuf>,
    slirp: Option<tokio::process::Child>,
    /// Closing it tells slirp4netns to exit (`--exit-fd`).
    exit: Option<std::os::fd::OwnedFd>,
    /// A task waiting for slirp4netns to die removes the table (see
    /// [`EgressHandle::detach`]), not the drop.
    table_handed_off: bool,
    /// Its policy's plan now, which the proxy's route to the gateways
    /// checks too.
    plan: Arc<RwLock<Plan>>,
    /// Its egress proxy, while it has rules and a network.
    interception: Option<intercept::Interception>,
}

impl EgressHandle {
    /// Replaces the sandbox's policy: its table is rewritten in one nftables
    /// transaction (the guard with it), so no packet ever meets a half
    /// policy; connections the new policy refuses are refused from their
    /// next packet on. A sandbox that had no `tap0` gets one when the new
    /// policy gives it a network; one that has a `tap0` keeps it (its table
    /// then refuses everything the policy does not allow).
    pub async fn update(
        &mut self,
        policy: &NetworkPolicy,
        who: Sandboxed<'_>,
    ) -> Result<(), EgressError> {
        let plan = self.egress.plan(policy).await?;
        if !plan.is_open(&self.egress.nameservers) {
            let rules = self.egress.ruleset(self.base, &self.table, &plan)?;
            self.egress.nft(&rules).await?;
            self.has_table = true;
        } else if self.has_table {
            // Open again: the guard alone, as for a sandbox created open.
            self.egress
                .nft(&format!("delete table inet {}\n", self.table))
                .await?;
            self.has_table = false;
        }
        match self.plan.write() {
            Ok(mut p) => *p = plan,
            Err(p) => *p.into_inner() = plan,
        }
        if policy.has_network() && self.slirp.is_none() {
            self.start_slirp().await?;
        }
        self.apply_rules(who).await
    }

    /// Gives the sandbox its rules: its proxy started (once it has a
    /// network), told the new rules, or stopped when it has none.
    async fn apply_rules(&mut self, who: Sandboxed<'_>) -> Result<(), EgressError> {
        if who.rules.is_empty() {
            if let Some(i) = self.interception.take() {
                i.stop(&self.egress).await;
            }
            return Ok(());
        }
        if let Some(i) = &self.interception {
            i.set_rules(who.rules);
            return Ok(());
        }
        // Without a network nothing leaves the sandbox: the rules wait
        // for an update that gives it one.
        if self.slirp.is_none() {
            return Ok(());
        }
        let setup = self.egress.proxy.clone().ok_or_else(|| {
            EgressError::Node("this node runs no egress proxy; egress rules cannot apply".into())
        })?;
        let ca = who.ca.ok_or_else(|| {
            EgressError::Policy(format!(
                "sandbox {} was created before sandboxes had egress CAs: its egress rules \
                 cannot apply (create a new sandbox)",
                who.sandbox_id
            ))
        })?;
        self.interception = Some(
            intercept::Interception::start(
                &self.egress,
                &setup,
                self.pid,
                self.base,
                self.plan.clone(),
                intercept::ProxyFor {
                    sandbox_id: who.sandbox_id,
                    generation: who.generation,
                    ca,
                    rules: who.rules,
                },
            )
            .await?,
        );
        Ok(())
    }

    async fn start_slirp(&mut self) -> Result<(), EgressError> {
        let (e, pid, base) = (&self.egress, self.pid, self.base);
        let node = EgressError::Node;
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| node(format!("pipe: {e}")))
        };
        let (ready_r, ready_w) = pipe()?;
        // slirp4netns exits when this pipe's write end closes: at detach,
        // and with the node however it dies.
        let (exit_r, exit_w) = pipe()?;
        // As the sandbox's first host uid, dying with the node's thread
        // that started it (no `setpriv` process in between).
        let mut cmd = tokio::process::Command::new(&e.slirp);
        warren_sys::run_as_with_parent(cmd.as_std_mut(), base);
        cmd.args([
            "--configure".to_string(),
            "--mtu=65520".into(),
            "--disable-host-loopback".into(),
            "--enable-seccomp".into(),
            "--ready-fd=3".into(),
            "--exit-fd=4".into(),
            format!("--userns-path=/proc/{pid}/ns/user"),
            "--netns-type=path".into(),
            format!("/proc/{pid}/ns/net"),
            "tap0".into(),
        ])
        .env_clear()
        .env("PATH", super::SANDBOX_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        // Never the node's own stderr (an operator's terminal under `warren
        // dev`): slirp4netns parses the sandbox's packets, so what it says
        // is treated as the sandbox's (`console`), labelled with its table.
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        {
            use command_fds::{CommandFdExt, FdMapping};
            cmd.as_std_mut()
                .fd_mappings(vec![
                    FdMapping {
                        parent_fd: ready_w,
                        child_fd: 3,
                    },
                    FdMapping {
                        parent_fd: exit_r,
                        child_fd: 4,
                    },
                ])
                .map_err(|_| node("descriptor numbers collide".into()))?;
        }
        self.exit = Some(exit_w);
        let mut child = cmd
            .spawn()
            .map_err(|e| node(format!("cannot start slirp4netns: {e}")))?;
        if let Some(err) = child.stderr.take() {
            super::console::relay(&self.table, "slirp4netns", err);
        }
        let slirp_pid = child.id();
        self.slirp = Some(child);
        let ready = tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::from(ready_r);
            let mut b = [0u8; 1];
            std::io::Read::read(&mut f, &mut b).map(|n| n == 1)
        });
        match tokio::time::timeout(Duration::from_secs(10), ready).await {
            Ok(Ok(Ok(true))) => {}
            Ok(_) => return Err(node("slirp4netns exited before the sandbox's network was up (its error is in the node's log)".into())),
            Err(_) => return Err(node("slirp4netns did not bring the sandbox's network up within 10s".into())),
        }
        // Into the sandbox's cgroups, now that it is up. Not before exec (a
        // wrapper could): a paused sandbox given a network by an update is
        // frozen, and a slirp4netns in its freezer would never get ready.
        // Until now it has forwarded nothing, and the process it forked to
        // enter the namespaces has exited: all that runs for the sandbox
        // from here on is counted against it.
        let joined = match slirp_pid {
            Some(p) => self.cgroup_procs.iter().try_for_each(|f| {
                std::fs::write(f, p.to_string()).map_err(|e| format!("{}: {e}", f.display()))
            }),
            None => Ok(()),
        };
        if let Err(why) = joined {
            self.stop_slirp();
            return Err(node(format!(
                "cannot move slirp4netns into the sandbox's cgroups ({why})"
            )));
        }
        Ok(())
    }

    /// Kills slirp4netns and waits for it briefly (blocking); true when it
    /// is gone.
    fn stop_slirp(&mut self) -> bool {
        self.exit.take();
        match self.slirp.as_mut() {
            Some(c) => {
                let _ = c.start_kill();
                let gone = reaped(c, Duration::from_secs(5));
                if gone {
                    self.slirp = None;
                }
                gone
            }
            None => true,
        }
    }

    /// Stops slirp4netns and removes the table. A slirp4netns that does
    /// not die at once is in a frozen sandbox (it shares its freezer, and a
    /// frozen process dies only once thawed, which the sandbox's kill that
    /// follows does): a task then waits for it and removes the table after,
    /// so the table never goes while slirp4netns can still forward. One
    /// already dead (killed with its cgroup) is simply reaped.
    pub async fn detach(mut self) {
        self.exit.take();
        let Some(mut c) = self.slirp.take() else {
            return;
        };
        let _ = c.start_kill();
        if tokio::time::timeout(Duration::from_secs(2), c.wait())
            .await
            .is_ok()
        {
            return;
        }
        self.table_handed_off = true;
        if !self.has_table {
            tokio::spawn(async move {
                let _ = c.wait().await;
            });
            return;
        }
        let (nft, table) = (self.egress.nft.clone(), self.table.clone());
        tokio::spawn(async move {
            let _ = c.wait().await;
            let _ = tokio::process::Command::new(&nft)
                .args(["delete", "table", "inet", &table])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
            tracing::info!(table = %table, "slirp4netns exited once its sandbox was thawed; table removed");
        });
    }
}

impl Drop for EgressHandle {
    fn drop(&mut self) {
        if self.table_handed_off {
            return;
        }
        // The table goes only once slirp4netns is gone: removed first, it
        // would leave a moment in which slirp4netns forwards under nothing
        // but the guard. One that will not die keeps its table (the next
        // node start sweeps it once the range is free).
        if !self.stop_slirp() {
            tracing::warn!(table = %self.table, "slirp4netns did not exit after SIGKILL; keeping its nftables table");
            return;
        }
        if !self.has_table {
            return;
        }
        let _ = std::process::Command::new(&self.egress.nft)
            .args(["delete", "table", "inet", &self.table])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether `child` has exited (waiting up to `within`). Blocking: a killed
/// slirp4netns is gone within milliseconds.
fn reaped(child: &mut tokio::process::Child, within: Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            // Not ours to wait for any more: gone.
            Err(_) => return true,
            Ok(None) if std::time::Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// The addresses an `allowOut` domain resolves to now (blocking).
fn lookup(domain: &str) -> Result<Vec<IpAddr>, EgressError> {
    Ok((domain, 443)
        .to_socket_addrs()
        .map_err(|e| {
            EgressError::Node(format!("network.allowOut: cannot resolve {domain:?}: {e}"))
        })?
        .map(|a| a.ip())
        .collect())
}
