//! Outbound network for isolated sandboxes, under a policy.
//!
//! A sandbox's network namespace gets a `tap0` from `slirp4netns` (a
//! userspace TCP/IP stack: the sandbox is `10.0.2.100`, its gateway
//! `10.0.2.2`, its resolver [`DNS`]), started with `--disable-host-loopback`
//! and as the sandbox's own first host uid, so every connection it makes on
//! the sandbox's behalf is a host socket owned by that uid. Two kinds of
//! nftables tables judge those sockets on the host's output hook.
//!
//! **The guard** (`inet warren_guard_<first uid>`, one per id space) refuses
//! the host and link-local to every uid of every range of the node. It is
//! installed when the node starts, before any sandbox, reasserted with every
//! sandbox's table, and never removed: whatever happens to a sandbox's own
//! table (not yet there, being replaced or removed, deleted by hand), the
//! host stays out of reach. A packet must pass every table, so the guard
//! only ever adds refusals.
//!
//! **A table per sandbox** (`inet warren_<slot>_<nonce>`) holds its policy:
//!
//! 1. the host's nameservers on port 53 are allowed (when DNS is allowed);
//! 2. always refused: every address of the host itself (`fib daddr type
//!    local`: loopback, the node's, gateway's and scheduler's ports on any
//!    local address), link-local and cloud metadata (`169.254.0.0/16`,
//!    `fe80::/10`);
//! 3. `allowOut` entries are accepted (they win over denials, as in E2B);
//! 4. `denyOut` entries are refused, and everything when the sandbox was
//!    created with `allow_internet_access: false`.
//!
//! Domains in `allowOut` are resolved when the sandbox starts, and again
//! when its policy is replaced (`PUT /sandboxes/{id}/network`: the table,
//! which holds addresses, is rewritten in one transaction,
//! [`EgressHandle::update`]). A sandbox with no internet access and no
//! `allowOut` gets no `tap0` at all: only `lo`, no route — until an update
//! gives it a network (slirp4netns is started then; the tap stays after a
//! later update takes the network away, its table refusing everything).
//! Other sandboxes are unreachable either way: each sits behind its own
//! slirp4netns, and the host's addresses are refused.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use warren_core::network::parse_net;
pub use warren_core::network::NetworkPolicy;

/// The resolver address a sandbox with egress uses (slirp4netns's).
pub const DNS: &str = "10.0.2.3";

/// The nftables expression for a network: `ip daddr 1.2.3.0/24`.
fn daddr(ip: IpAddr, len: u8) -> String {
    let family = if ip.is_ipv4() { "ip" } else { "ip6" };
    format!("{family} daddr {ip}/{len}")
}

/// Rules refusing what `matching` matches (everything when empty): TCP with
/// a reset, so the sandbox's connect fails at once with "connection
/// refused", anything else with ICMP. (Answered with ICMP only, the
/// connects slirp4netns makes to the host's own addresses were left to
/// time out, and the sandbox's with them.)
fn refuse(matching: &str) -> [String; 2] {
    let sep = if matching.is_empty() { "" } else { " " };
    [
        format!("{matching}{sep}meta l4proto tcp reject with tcp reset"),
        format!("{matching}{sep}reject"),
    ]
}

/// An nftables script that replaces table `name` with one output chain of
/// `rules` at `priority`, in one transaction (`table` first so `delete`
/// finds it the first time).
fn table_script(name: &str, priority: i32, rules: &[String]) -> String {
    let mut out = format!(
        "table inet {name}\ndelete table inet {name}\ntable inet {name} {{\n  chain out {{\n    type filter hook output priority {priority}; policy accept;\n"
    );
    for r in rules {
        out.push_str("    ");
        out.push_str(r);
        out.push('\n');
    }
    out.push_str("  }\n}\n");
    out
}

/// The egress machinery of a node; `None` of it means sandboxes cannot get
/// internet access on this node.
#[derive(Debug, Clone)]
pub struct Egress {
    slirp: PathBuf,
    nft: PathBuf,
    setpriv: PathBuf,
    /// The host's resolvers, which slirp4netns forwards DNS to.
    nameservers: Vec<IpAddr>,
    /// Every host uid any of the node's sandboxes can have (first, last):
    /// what the guard table covers.
    uids: (u32, u32),
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

    /// Finds slirp4netns, nft and setpriv, checks that nft works and
    /// installs the guard over the host uids `uids` (first, last): every
    /// range the node hands out.
    pub fn detect(uids: (u32, u32)) -> Result<Egress, String> {
        let find =
            |p: &str| super::limits::find_program(p).ok_or_else(|| format!("{p} is not installed"));
        let e = Egress {
            slirp: find("slirp4netns")?,
            nft: find("nft")?,
            setpriv: find("setpriv")?,
            nameservers: std::fs::read_to_string("/etc/resolv.conf")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().strip_prefix("nameserver"))
                .filter_map(|a| a.trim().parse().ok())
                .collect(),
            uids,
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

    /// The guard's table name: one per id space, so nodes on one machine
    /// with the same `--sandbox-id-base` share it. (Not `warren_<number>_`:
    /// a sweep never takes it for a sandbox's table.)
    fn guard_table(&self) -> String {
        format!("warren_guard_{}", self.uids.0)
    }

    /// The rules every connection of the sandbox with host uids
    /// `first..=last` meets, whatever its policy: the host's resolvers on
    /// port 53 pass (they may be local, e.g. `127.0.0.53`), then every
    /// address of the host and link-local are refused. Refusals answer TCP
    /// with a reset, so the sandbox sees "connection refused" at once.
    fn host_rules(&self, first: u32, last: u32) -> Vec<String> {
        let mut rules = Vec::new();
        for ns in &self.nameservers {
            for proto in ["udp", "tcp"] {
                rules.push(format!(
                    "{} {proto} dport 53 accept",
                    daddr(*ns, if ns.is_ipv4() { 32 } else { 128 })
                ));
            }
        }
        for what in [
            "fib daddr type local",
            "ip daddr 169.254.0.0/16",
            "ip6 daddr fe80::/10",
        ] {
            rules.extend(refuse(what));
        }
        rules
            .into_iter()
            .map(|r| format!("meta skuid {first}-{last} {r}"))
            .collect()
    }

    /// The nftables script that (re)installs the guard, atomically.
    fn guard(&self) -> String {
        table_script(
            &self.guard_table(),
            -10,
            &self.host_rules(self.uids.0, self.uids.1),
        )
    }

    /// A table name of its own for a sandbox in range `slot`: the slot (so
    /// a sweep can tell a dead sandbox's table) and a nonce (so removing one
    /// sandbox's table can never remove the next one's in the same range).
    fn table(slot: u32) -> String {
        format!("warren_{slot}_{:08x}", rand::random::<u32>())
    }

    /// The nftables script for one sandbox's table, after the guard's
    /// (reasserted in the same transaction: if anything removed it, it is
    /// back before this sandbox's slirp4netns exists).
    fn ruleset(&self, base: u32, table: &str, policy: &NetworkPolicy) -> Result<String, String> {
        let end = base
            .checked_add(super::launch::IDS_PER_SANDBOX - 1)
            .ok_or_else(|| format!("id range {base} runs past the id space"))?;
        // Every rule matches the sandbox's own sockets only. (An early
        // `meta skuid != ... return` would not do: packets without a socket,
        // such as the kernel's own resets, have no skuid, skip that rule and
        // would fall into the rejections below.)
        let mut rules = self.host_rules(base, end);
        let mut policy_rules = Vec::new();
        for entry in &policy.allow_out {
            for (ip, len) in resolve(entry)? {
                policy_rules.push(format!("{} accept", daddr(ip, len)));
            }
        }
        for entry in &policy.deny_out {
            let (ip, len) =
                parse_net(entry).ok_or_else(|| format!("bad denyOut entry {entry:?}"))?;
            policy_rules.extend(refuse(&daddr(ip, len)));
        }
        if !policy.allow_internet {
            policy_rules.extend(refuse(""));
        }
        rules.extend(
            policy_rules
                .into_iter()
                .map(|r| format!("meta skuid {base}-{end} {r}")),
        );
        Ok(format!(
            "{}{}",
            self.guard(),
            table_script(table, 0, &rules)
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

    async fn nft(&self, script: &str) -> Result<(), String> {
        let (me, script) = (self.clone(), script.to_string());
        tokio::task::spawn_blocking(move || me.nft_blocking(&script))
            .await
            .map_err(|e| format!("nft: {e}"))?
    }

    /// Gives the sandbox whose launcher is `pid` (it has made the network
    /// namespace) its table under `policy` and, when the policy gives it a
    /// network, a `tap0` through slirp4netns. Returns once the interface is
    /// configured.
    pub async fn attach(
        &self,
        pid: i32,
        base: u32,
        slot: u32,
        policy: &NetworkPolicy,
    ) -> Result<EgressHandle, String> {
        let table = Egress::table(slot);
        let rules = self.ruleset(base, &table, policy)?;
        self.nft(&rules).await?;
        let mut handle = EgressHandle {
            egress: self.clone(),
            pid,
            base,
            table,
            slirp: None,
            exit: None,
        };
        if policy.has_network() {
            handle.start_slirp().await?;
        }
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
    slirp: Option<tokio::process::Child>,
    /// Closing it tells slirp4netns to exit (`--exit-fd`).
    exit: Option<std::os::fd::OwnedFd>,
}

impl EgressHandle {
    /// Replaces the sandbox's policy: its table is rewritten in one nftables
    /// transaction (the guard with it), so no packet ever meets a half
    /// policy; connections the new policy refuses are refused from their
    /// next packet on. A sandbox that had no `tap0` gets one when the new
    /// policy gives it a network; one that has a `tap0` keeps it (its table
    /// then refuses everything the policy does not allow).
    pub async fn update(&mut self, policy: &NetworkPolicy) -> Result<(), String> {
        let rules = self.egress.ruleset(self.base, &self.table, policy)?;
        self.egress.nft(&rules).await?;
        if policy.has_network() && self.slirp.is_none() {
            self.start_slirp().await?;
        }
        Ok(())
    }

    async fn start_slirp(&mut self) -> Result<(), String> {
        let (e, pid, base) = (&self.egress, self.pid, self.base);
        let pipe =
            || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"));
        let (ready_r, ready_w) = pipe()?;
        // slirp4netns exits when this pipe's write end closes: at detach,
        // and with the node however it dies.
        let (exit_r, exit_w) = pipe()?;
        let mut cmd = tokio::process::Command::new(&e.setpriv);
        cmd.args([
            format!("--reuid={base}"),
            format!("--regid={base}"),
            "--clear-groups".into(),
            "--pdeathsig=KILL".into(),
            "--".into(),
        ])
        .arg(&e.slirp)
        .args([
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
        .stderr(Stdio::inherit())
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
                .map_err(|_| "descriptor numbers collide".to_string())?;
        }
        self.exit = Some(exit_w);
        self.slirp = Some(
            cmd.spawn()
                .map_err(|e| format!("cannot start slirp4netns: {e}"))?,
        );
        let ready = tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::from(ready_r);
            let mut b = [0u8; 1];
            std::io::Read::read(&mut f, &mut b).map(|n| n == 1)
        });
        match tokio::time::timeout(Duration::from_secs(10), ready).await {
            Ok(Ok(Ok(true))) => Ok(()),
            Ok(_) => Err("slirp4netns exited before the sandbox's network was up (its error is in the node's log)".into()),
            Err(_) => Err("slirp4netns did not bring the sandbox's network up within 10s".into()),
        }
    }
    /// Stops slirp4netns and removes the table.
    pub async fn detach(mut self) {
        self.exit.take();
        if let Some(mut c) = self.slirp.take() {
            let _ = c.kill().await;
        }
    }
}

impl Drop for EgressHandle {
    fn drop(&mut self) {
        // The table goes only once slirp4netns is gone: removed first, it
        // would leave a moment in which slirp4netns forwards under nothing
        // but the guard. One that will not die keeps its table (the next
        // node start sweeps it once the range is free).
        if let Some(c) = self.slirp.as_mut() {
            let _ = c.start_kill();
            if !reaped(c, Duration::from_secs(5)) {
                tracing::warn!(table = %self.table, "slirp4netns did not exit after SIGKILL; keeping its nftables table");
                return;
            }
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

/// Addresses of an `allowOut` entry (a domain is resolved now).
fn resolve(entry: &str) -> Result<Vec<(IpAddr, u8)>, String> {
    if let Some(net) = parse_net(entry) {
        return Ok(vec![net]);
    }
    let addrs: Vec<(IpAddr, u8)> = (entry, 443)
        .to_socket_addrs()
        .map_err(|e| format!("network.allowOut: cannot resolve {entry:?}: {e}"))?
        .map(|a| (a.ip(), if a.is_ipv4() { 32 } else { 128 }))
        .collect();
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u32 = 2_000_000_000;

    fn egress() -> Egress {
        Egress {
            slirp: "/x".into(),
            nft: "/x".into(),
            setpriv: "/x".into(),
            nameservers: vec!["10.255.255.53".parse().unwrap()],
            uids: (BASE, BASE + 32 * 65536 - 1),
        }
    }

    /// The rule lines of table `name` in `script`.
    fn rules_of<'a>(script: &'a str, name: &str) -> Vec<&'a str> {
        let head = format!("table inet {name} {{\n");
        let start = script
            .find(&head)
            .unwrap_or_else(|| panic!("{name} missing in {script}"));
        script[start + head.len()..]
            .lines()
            .take_while(|l| l.trim() != "}")
            .map(str::trim)
            .filter(|l| !l.starts_with("chain") && !l.starts_with("type"))
            .collect()
    }

    #[test]
    fn the_guard_refuses_the_host_to_every_range_and_nothing_else() {
        let e = egress();
        let script = e.guard();
        let rules = rules_of(&script, "warren_guard_2000000000");
        assert!(!rules.is_empty(), "{script}");
        for r in &rules {
            assert!(r.starts_with("meta skuid 2000000000-2002097151 "), "{r}");
        }
        let pos = |s: &str| {
            rules
                .iter()
                .position(|r| r.contains(s))
                .unwrap_or_else(|| panic!("{s} missing in {script}"))
        };
        assert!(pos("10.255.255.53/32 udp dport 53 accept") < pos("fib daddr type local"));
        for what in ["fib daddr type local", "169.254.0.0/16", "fe80::/10"] {
            for verdict in ["meta l4proto tcp reject with tcp reset", "reject"] {
                let rule = format!("{what} {verdict}");
                assert!(rules.iter().any(|r| r.ends_with(&rule)), "{rule}: {script}");
            }
        }
        // Only refusals (and the resolvers let through to the tables after it).
        assert!(
            rules.iter().all(|r| r.ends_with("reject")
                || r.ends_with("reset")
                || r.contains("dport 53 accept")),
            "{script}"
        );
        // Replaced atomically, never a moment without it.
        assert!(
            script.starts_with(
                "table inet warren_guard_2000000000\ndelete table inet warren_guard_2000000000\n"
            ),
            "{script}"
        );
    }

    #[test]
    fn rules_refuse_the_host_and_order_allow_before_deny() {
        let e = egress();
        let p = NetworkPolicy {
            allow_internet: false,
            allow_out: vec!["1.1.1.1".into()],
            deny_out: vec!["8.8.8.0/24".into()],
        };
        let script = e.ruleset(BASE, "warren_3_0000abcd", &p).unwrap();
        // The guard comes back in the same transaction, before the table.
        assert!(
            script.find("table inet warren_guard_2000000000 {").unwrap()
                < script.find("table inet warren_3_0000abcd {").unwrap(),
            "{script}"
        );
        let rules = rules_of(&script, "warren_3_0000abcd");
        assert!(!script.contains("return"), "{script}");
        for r in &rules {
            assert!(r.starts_with("meta skuid 2000000000-2000065535 "), "{r}");
        }
        let pos = |s: &str| {
            rules
                .iter()
                .position(|r| r.contains(s))
                .unwrap_or_else(|| panic!("{s} missing in {script}"))
        };
        assert!(pos("ip daddr 10.255.255.53/32 udp dport 53 accept") < pos("fib daddr type local"));
        assert!(pos("fib daddr type local") < pos("ip daddr 1.1.1.1/32 accept"));
        assert!(
            pos("ip daddr 1.1.1.1/32 accept")
                < pos("ip daddr 8.8.8.0/24 meta l4proto tcp reject with tcp reset")
        );
        assert!(pos("ip daddr 1.1.1.1/32 accept") < pos("ip daddr 8.8.8.0/24 reject"));
        // No internet: everything else refused, last.
        assert_eq!(
            rules.last(),
            Some(&"meta skuid 2000000000-2000065535 reject"),
            "{script}"
        );
        assert_eq!(
            rules[rules.len() - 2],
            "meta skuid 2000000000-2000065535 meta l4proto tcp reject with tcp reset"
        );
    }

    #[test]
    fn an_open_sandbox_refuses_only_the_host() {
        let script = egress()
            .ruleset(BASE, "warren_0_00000001", &NetworkPolicy::open())
            .unwrap();
        let rules = rules_of(&script, "warren_0_00000001");
        assert!(
            rules
                .last()
                .is_some_and(|r| r.ends_with("ip6 daddr fe80::/10 reject")),
            "{script}"
        );
    }
}
