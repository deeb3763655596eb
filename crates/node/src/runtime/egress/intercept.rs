//! The node's side of the egress proxy (`warren-egress`) for one sandbox
//! with egress rules: how its connections get to the proxy, and how the
//! proxy dials on without leaving the sandbox's egress policy.
//!
//! **In.** Inside the sandbox's network namespace the node binds a
//! listener on `127.0.0.1:<any port>` and installs one table,
//! `ip warren_egress`, whose single chain on the nat output hook redirects
//! the sandbox's TCP to ports 80 and 443 there — any destination but the
//! slirp4netns network (`10.0.2.0/24`: its gateway, resolver and the
//! sandbox's own address) and the proxy's own connections (socket mark
//! [`MARK`]). The sandbox's root can delete that table (it has
//! `CAP_NET_ADMIN` over its own namespace): its connections then go out
//! directly, under its policy, without a secret — it can only lose what
//! the rules would add, never gain anything. That table is the only change
//! to the sandbox's namespace; the host's tables (the guard and the
//! sandbox's policy table, `rules.rs`) are untouched.
//!
//! **Out.** The policy still decides, for every connection the proxy
//! makes on a sandbox's behalf:
//! - to the outside ([`Target::Out`]): a socket made with the thread's
//!   filesystem uid set to the sandbox's first host uid, so the kernel
//!   records that uid as the socket's owner and the guard and the
//!   sandbox's own table judge it exactly as they judge slirp4netns's
//!   sockets (`meta skuid`): the host refused, `allowOut`/`denyOut` and
//!   internet access as for the sandbox's own connections;
//! - to the sandbox's own loopback ([`Target::Local`], a connection to
//!   one of its own ports on 80 or 443 that the redirect caught): a socket
//!   made inside its namespace, marked so the redirect lets it pass; it
//!   never leaves the sandbox;
//! - to the gateways ([`Target::Gateway`], a host under `--sandbox-domain`):
//!   only to `--sandbox-domain-gateway`, and only when the sandbox's
//!   policy would let it reach that address on the internet (internet
//!   access on and no `denyOut` covering it, or `allowOut` naming it); the
//!   guard's refusal of the host's own addresses is what this one route
//!   steps past, for that address alone.

use super::rules::Plan;
use super::{Egress, EgressError};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, RwLock};
use tokio::net::{TcpSocket, TcpStream};
use warren_core::network::rules::EgressRules;
use warren_egress::{Dialer, SandboxProxy, Target};
use warren_trust::sandbox_ca::SandboxCa;

/// The socket mark of the proxy's own connections inside a sandbox
/// (`WR`): the redirect lets them pass.
pub const MARK: u32 = 0x5752;
/// The sandbox namespace's table.
const TABLE: &str = "warren_egress";

/// What every sandbox's proxy on this node shares.
pub struct ProxySetup {
    pub settings: Arc<warren_egress::Settings>,
    pub resolver: Arc<dyn warren_egress::Resolver>,
    /// `--sandbox-domain-gateway`.
    pub gateway: Option<String>,
}

impl std::fmt::Debug for ProxySetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxySetup")
            .field("sandbox_domain", &self.settings.sandbox_domain)
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

/// One sandbox's interception: its proxy, accepting on the listener in
/// its namespace. Dropped: the proxy stops accepting (connections in
/// flight end with the sandbox's).
#[derive(Debug)]
pub struct Interception {
    proxy: Arc<SandboxProxy>,
    task: tokio::task::JoinHandle<()>,
    netns: Arc<File>,
}

impl Drop for Interception {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a sandbox's proxy is made for.
pub struct ProxyFor<'a> {
    pub sandbox_id: &'a str,
    pub generation: u64,
    pub ca: &'a SandboxCa,
    pub rules: &'a EgressRules,
}

impl Interception {
    /// Starts the proxy of the sandbox whose launcher is `pid` (first
    /// host uid `base`), judged by `plan`.
    pub async fn start(
        egress: &Egress,
        setup: &ProxySetup,
        pid: i32,
        base: u32,
        plan: Arc<RwLock<Plan>>,
        what: ProxyFor<'_>,
    ) -> Result<Interception, EgressError> {
        let node = EgressError::Node;
        let netns = Arc::new(
            File::open(format!("/proc/{pid}/ns/net"))
                .map_err(|e| node(format!("cannot open the sandbox's network namespace: {e}")))?,
        );
        let nft = egress.nft.clone();
        let listener = {
            let ns = netns.clone();
            tokio::task::spawn_blocking(move || {
                in_netns(&ns, move || {
                    let l = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                    l.set_nonblocking(true)?;
                    let port = l.local_addr()?.port();
                    run_nft(&nft, &redirect_script(port))?;
                    Ok(l)
                })
            })
            .await
            .map_err(|e| node(format!("the interception task failed: {e}")))?
            .map_err(|e| {
                node(format!(
                    "cannot set up the egress proxy in the sandbox: {e}"
                ))
            })?
        };
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| node(format!("egress proxy listener: {e}")))?;
        let dialer = Arc::new(NodeDialer {
            base,
            netns: netns.clone(),
            plan,
            gateway: setup.gateway.clone(),
        });
        let proxy = SandboxProxy::new(
            what.sandbox_id,
            what.generation,
            setup.settings.clone(),
            what.ca,
            what.rules.clone(),
            dialer,
            setup.resolver.clone(),
        )
        .map_err(node)?;
        let task = proxy.serve(listener);
        tracing::info!(sandbox_id = %what.sandbox_id, hosts = what.rules.0.len(), "egress proxy started for the sandbox's rules");
        Ok(Interception { proxy, task, netns })
    }

    /// New rules, from the next connection and request on.
    pub fn set_rules(&self, rules: &EgressRules) {
        self.proxy.set_rules(rules.clone());
    }

    /// Removes the redirect (the sandbox's connections go out directly
    /// again) and stops the proxy.
    pub async fn stop(self, egress: &Egress) {
        let (ns, nft) = (self.netns.clone(), egress.nft.clone());
        let removed = tokio::task::spawn_blocking(move || {
            in_netns(&ns, move || {
                run_nft(&nft, &format!("delete table ip {TABLE}\n"))
            })
        })
        .await;
        if !matches!(removed, Ok(Ok(()))) {
            tracing::warn!(sandbox_id = %self.proxy.sandbox_id, "cannot remove the egress redirect from the sandbox (the proxy stops anyway)");
        }
    }
}

/// The table in the sandbox's namespace: its connections to ports 80 and
/// 443 to the proxy's listener on `port` (see the module doc).
fn redirect_script(port: u16) -> String {
    let (net, len) = warren_egress::SLIRP_NET;
    format!(
        "table ip {TABLE}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n  chain out {{\n    \
         type nat hook output priority -100; policy accept;\n    meta mark {MARK:#x} return\n    \
         ip daddr {net}/{len} return\n    tcp dport {{ 80, 443 }} redirect to :{port}\n  }}\n}}\n"
    )
}

/// Runs `f` on a thread of its own inside the network namespace `ns`
/// (the thread ends with it, so no other work ever runs there).
/// Blocking.
fn in_netns<T: Send + 'static>(
    ns: &Arc<File>,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let ns = ns.clone();
    std::thread::spawn(move || {
        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        f()
    })
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
}

/// `nft -f -` with `script` (inside the caller's network namespace: the
/// child inherits the thread's).
fn run_nft(nft: &std::path::Path, script: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new(nft)
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// How one sandbox's proxy dials on (see the module doc).
struct NodeDialer {
    base: u32,
    netns: Arc<File>,
    plan: Arc<RwLock<Plan>>,
    gateway: Option<String>,
}

impl Dialer for NodeDialer {
    fn dial(
        &self,
        target: Target,
    ) -> futures_util::future::BoxFuture<'static, std::io::Result<TcpStream>> {
        let base = self.base;
        let ns = self.netns.clone();
        let plan = self.plan.clone();
        let gateway = self.gateway.clone();
        Box::pin(async move {
            match target {
                Target::Out(addr) => socket_as(base, addr.is_ipv4())?.connect(addr).await,
                Target::Local(addr) => {
                    if !addr.ip().is_loopback() {
                        return Err(std::io::Error::other("not a loopback address"));
                    }
                    let fd = tokio::task::spawn_blocking(move || {
                        in_netns(&ns, move || marked_socket(addr.is_ipv4()))
                    })
                    .await
                    .map_err(std::io::Error::other)??;
                    TcpSocket::from_std_stream(std::net::TcpStream::from(fd))
                        .connect(addr)
                        .await
                }
                Target::Gateway => {
                    let Some(g) = gateway else {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "this node has no --sandbox-domain-gateway",
                        ));
                    };
                    let addr = tokio::net::lookup_host(g.as_str())
                        .await?
                        .next()
                        .ok_or_else(|| std::io::Error::other(format!("{g} resolves to nothing")))?;
                    let allowed = match plan.read() {
                        Ok(p) => reaches(&p, addr.ip()),
                        Err(p) => reaches(&p.into_inner(), addr.ip()),
                    };
                    if !allowed {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::PermissionDenied,
                            "the sandbox's egress policy does not let it reach the internet, \
                             where the sandbox domain is",
                        ));
                    }
                    TcpStream::connect(addr).await
                }
            }
        })
    }
}

/// Whether `plan` lets the sandbox reach `ip` as an internet address
/// (the host refusals aside: see the module doc).
fn reaches(plan: &Plan, ip: IpAddr) -> bool {
    plan.allow.contains(ip) || (plan.internet && !plan.deny.contains(ip))
}

/// A socket owned (as the kernel and nftables see it) by host uid `uid`:
/// made while this thread's filesystem uid is `uid`, which is put back at
/// once (nothing else runs on the thread in between).
fn socket_as(uid: u32, v4: bool) -> std::io::Result<TcpSocket> {
    use nix::unistd::{setfsuid, Uid};
    let prev = setfsuid(Uid::from_raw(uid));
    // setfsuid answers the previous value whether or not it changed it:
    // asking again says whether it did.
    if setfsuid(Uid::from_raw(uid)).as_raw() != uid {
        setfsuid(prev);
        return Err(std::io::Error::other(
            "cannot take the sandbox's uid for the egress proxy's socket",
        ));
    }
    let made = if v4 {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    };
    setfsuid(prev);
    made
}

/// A non-blocking TCP socket marked [`MARK`], in the calling thread's
/// network namespace.
fn marked_socket(v4: bool) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType};
    let family = if v4 {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    setsockopt(&fd, sockopt::Mark, &MARK)?;
    Ok(fd)
}

/// The sandbox-domain gateway's address, for logs: `None` when unset.
pub fn describe(setup: &ProxySetup) -> String {
    match (&setup.settings.sandbox_domain, &setup.gateway) {
        (Some(d), Some(g)) => format!("*.{d} -> {g}"),
        _ => "none".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redirect_skips_slirp_and_the_proxys_own_connections() {
        let s = redirect_script(40123);
        let at = |needle: &str| {
            s.find(needle)
                .unwrap_or_else(|| panic!("{needle} missing in {s}"))
        };
        assert!(at("meta mark 0x5752 return") < at("redirect to :40123"));
        assert!(at("ip daddr 10.0.2.0/24 return") < at("redirect to :40123"));
        assert!(
            s.contains("tcp dport { 80, 443 } redirect to :40123"),
            "{s}"
        );
        assert!(s.starts_with("table ip warren_egress\ndelete table ip warren_egress\n"));
    }

    #[test]
    fn the_gateway_route_follows_the_policy() {
        let ns: Vec<IpAddr> = Vec::new();
        let plan = |p: warren_core::network::NetworkPolicy| {
            Plan::of(&p, &ns, &mut |_| Ok(vec![])).unwrap_or_else(|e| panic!("{e}"))
        };
        let lo: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert!(reaches(
            &plan(warren_core::network::NetworkPolicy::open()),
            lo
        ));
        let off = warren_core::network::NetworkPolicy {
            allow_internet: false,
            ..Default::default()
        };
        assert!(!reaches(&plan(off), lo));
        let denied = warren_core::network::NetworkPolicy {
            allow_internet: true,
            allow_out: vec![],
            deny_out: vec!["0.0.0.0/0".into()],
        };
        assert!(!reaches(&plan(denied), lo));
        let allowed = warren_core::network::NetworkPolicy {
            allow_internet: false,
            allow_out: vec!["127.0.0.1".into()],
            deny_out: vec!["0.0.0.0/0".into()],
        };
        assert!(reaches(&plan(allowed), lo));
    }
}
