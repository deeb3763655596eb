//! Outbound network for isolated sandboxes, under a policy.
//!
//! A sandbox's network namespace gets a `tap0` from `slirp4netns` (a
//! userspace TCP/IP stack: the sandbox is `10.0.2.100`, its gateway
//! `10.0.2.2`, its resolver [`DNS`]), started with `--disable-host-loopback`
//! and as the sandbox's own first host uid, so every connection it makes on
//! the sandbox's behalf is a host socket owned by that uid. An nftables
//! table per sandbox (`inet warren_<range>`) then judges those sockets on the
//! host's output hook:
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
//! Domains in `allowOut` are resolved when the sandbox starts (the table
//! holds addresses). A sandbox with no internet access and no `allowOut`
//! gets no `tap0` at all: only `lo`, no route, no DNS. Other sandboxes are
//! unreachable either way: each sits behind its own slirp4netns, and the
//! host's addresses are refused.

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

/// The egress machinery of a node; `None` of it means sandboxes cannot get
/// internet access on this node.
#[derive(Debug, Clone)]
pub struct Egress {
    slirp: PathBuf,
    nft: PathBuf,
    setpriv: PathBuf,
    /// The host's resolvers, which slirp4netns forwards DNS to.
    nameservers: Vec<IpAddr>,
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

    /// Finds slirp4netns, nft and setpriv and checks that nft works.
    pub fn detect() -> Result<Egress, String> {
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
        Ok(e)
    }

    /// A table name of its own for a sandbox in range `slot`: the slot (so
    /// a sweep can tell a dead sandbox's table) and a nonce (so removing one
    /// sandbox's table can never remove the next one's in the same range).
    fn table(slot: u32) -> String {
        format!("warren_{slot}_{:08x}", rand::random::<u32>())
    }

    /// The nftables script for one sandbox's table.
    fn ruleset(&self, base: u32, table: &str, policy: &NetworkPolicy) -> Result<String, String> {
        let end = u64::from(base) + u64::from(super::launch::IDS_PER_SANDBOX) - 1;
        // Every rule matches the sandbox's own sockets only. (An early
        // `meta skuid != ... return` would not do: packets without a socket,
        // such as the kernel's own resets, have no skuid, skip that rule and
        // would fall into the rejections below.)
        let mut rules = Vec::new();
        for ns in &self.nameservers {
            for proto in ["udp", "tcp"] {
                rules.push(format!(
                    "{} {proto} dport 53 accept",
                    daddr(*ns, if ns.is_ipv4() { 32 } else { 128 })
                ));
            }
        }
        rules.push("fib daddr type local reject".into());
        rules.push("ip daddr 169.254.0.0/16 reject".into());
        rules.push("ip6 daddr fe80::/10 reject".into());
        for entry in &policy.allow_out {
            for (ip, len) in resolve(entry)? {
                rules.push(format!("{} accept", daddr(ip, len)));
            }
        }
        for entry in &policy.deny_out {
            let (ip, len) =
                parse_net(entry).ok_or_else(|| format!("bad denyOut entry {entry:?}"))?;
            rules.push(format!("{} reject", daddr(ip, len)));
        }
        if !policy.allow_internet {
            rules.push("reject".into());
        }
        let rules: Vec<String> = rules
            .into_iter()
            .map(|r| format!("meta skuid {base}-{end} {r}"))
            .collect();
        Ok(format!(
            "table inet {table}\ndelete table inet {table}\ntable inet {table} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n{}\n  }}\n}}\n",
            rules
                .iter()
                .map(|r| format!("    {r}"))
                .collect::<Vec<_>>()
                .join("\n")
        ))
    }

    async fn nft(&self, script: &str) -> Result<(), String> {
        use tokio::io::AsyncWriteExt;
        let mut child = tokio::process::Command::new(&self.nft)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run nft: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .await
                .map_err(|e| format!("nft: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| format!("nft: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "nft refused the rules: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Gives the sandbox whose launcher is `pid` (it has made the network
    /// namespace) a `tap0` through slirp4netns, under `policy`. Returns
    /// once the interface is configured. A sandbox without network gets
    /// no handle's worth of anything but the table that denies it all.
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
            nft: self.nft.clone(),
            table,
            slirp: None,
            exit: None,
        };
        if !policy.has_network() {
            return Ok(handle);
        }
        let pipe =
            || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"));
        let (ready_r, ready_w) = pipe()?;
        // slirp4netns exits when this pipe's write end closes: at detach,
        // and with the node however it dies.
        let (exit_r, exit_w) = pipe()?;
        handle.exit = Some(exit_w);
        let mut cmd = tokio::process::Command::new(&self.setpriv);
        cmd.args([
            format!("--reuid={base}"),
            format!("--regid={base}"),
            "--clear-groups".into(),
            "--pdeathsig=KILL".into(),
            "--".into(),
        ])
        .arg(&self.slirp)
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
        handle.slirp = Some(
            cmd.spawn()
                .map_err(|e| format!("cannot start slirp4netns: {e}"))?,
        );
        let ready = tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::from(ready_r);
            let mut b = [0u8; 1];
            std::io::Read::read(&mut f, &mut b).map(|n| n == 1)
        });
        match tokio::time::timeout(Duration::from_secs(10), ready).await {
            Ok(Ok(Ok(true))) => Ok(handle),
            Ok(_) => Err("slirp4netns exited before the sandbox's network was up (its error is in the node's log)".into()),
            Err(_) => Err("slirp4netns did not bring the sandbox's network up within 10s".into()),
        }
    }
}

/// One sandbox's egress: its slirp4netns and its nftables table, both gone
/// when this is dropped.
#[derive(Debug)]
pub struct EgressHandle {
    nft: PathBuf,
    table: String,
    slirp: Option<tokio::process::Child>,
    /// Closing it tells slirp4netns to exit (`--exit-fd`).
    exit: Option<std::os::fd::OwnedFd>,
}

impl EgressHandle {
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
        if let Some(c) = self.slirp.as_mut() {
            let _ = c.start_kill();
        }
        let _ = std::process::Command::new(&self.nft)
            .args(["delete", "table", "inet", &self.table])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
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

    #[test]
    fn rules_refuse_the_host_and_order_allow_before_deny() {
        let e = Egress {
            slirp: "/x".into(),
            nft: "/x".into(),
            setpriv: "/x".into(),
            nameservers: vec!["10.255.255.53".parse().unwrap()],
        };
        let p = NetworkPolicy {
            allow_internet: false,
            allow_out: vec!["1.1.1.1".into()],
            deny_out: vec!["8.8.8.0/24".into()],
        };
        let r = e.ruleset(2_000_000_000, "warren_3", &p).unwrap();
        let pos = |s: &str| r.find(s).unwrap_or_else(|| panic!("{s} missing in {r}"));
        assert!(!r.contains("return"), "{r}");
        for line in r
            .lines()
            .filter(|l| l.contains("accept") || l.contains("reject"))
        {
            if !line.contains("policy") {
                assert!(
                    line.trim().starts_with("meta skuid 2000000000-2000065535 "),
                    "{line}"
                );
            }
        }
        assert!(
            pos("ip daddr 10.255.255.53/32 udp dport 53 accept")
                < pos("fib daddr type local reject")
        );
        assert!(pos("ip daddr 1.1.1.1/32 accept") < pos("ip daddr 8.8.8.0/24 reject"));
        assert!(
            r.trim_end().ends_with("reject\n  }\n}") || r.contains("    reject\n"),
            "{r}"
        );
        assert!(r.contains("table inet warren_3"));
    }
}
