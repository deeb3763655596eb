//! The nftables side of egress: a policy turned into address sets
//! ([`Plan`]) and the scripts that install the guard and a sandbox's table.
//!
//! Both tables have the same shape, so that a host packet pays one rule per
//! table whatever the sandboxes asked for: the base chain on the output
//! hook holds a single rule, `meta skuid <first>-<last> jump <chain>`, and
//! only the sandbox's own sockets get to the chain that judges them. (An
//! early `meta skuid != ... return` would not do: packets without a socket,
//! such as the kernel's own resets, have no skuid, skip such a rule and
//! would fall into the refusals; they never match the `jump`.) A sandbox's
//! chain matches addresses through sets (`flags interval`, one per family
//! for `allowOut` and `denyOut`, one for the resolvers it may query), so its
//! rule count is the same for one entry as for a thousand.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use warren_core::network::{parse_net, NetworkPolicy, MAX_ADDRESSES_PER_DOMAIN};

/// Why a sandbox's egress could not be set up as asked.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The policy cannot be enforced as given: the client's to fix (a 400).
    #[error("{0}")]
    Policy(String),
    /// The node could not apply it.
    #[error("{0}")]
    Node(String),
}

impl From<EgressError> for super::super::RuntimeError {
    fn from(e: EgressError) -> Self {
        match e {
            EgressError::Policy(m) => super::super::RuntimeError::Policy(m),
            EgressError::Node(m) => super::super::RuntimeError::Egress(m),
        }
    }
}

/// Address ranges `(first, last)`, sorted, overlaps and neighbours merged:
/// what one interval set holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ranges {
    pub v4: Vec<(u32, u32)>,
    pub v6: Vec<(u128, u128)>,
}

fn merge<T: Ord + Copy>(mut v: Vec<(T, T)>, next: impl Fn(T) -> Option<T>) -> Vec<(T, T)> {
    v.sort();
    let mut out: Vec<(T, T)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if next(last.1).is_none_or(|n| s <= n) => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

impl Ranges {
    /// The ranges of networks `(address, prefix length)` (host bits ignored).
    pub fn of(nets: impl IntoIterator<Item = (IpAddr, u8)>) -> Ranges {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (ip, len) in nets {
            match ip {
                IpAddr::V4(a) => {
                    let mask = u32::MAX
                        .checked_shl(32 - u32::from(len.min(32)))
                        .unwrap_or(0);
                    let s = u32::from(a) & mask;
                    v4.push((s, s | !mask));
                }
                IpAddr::V6(a) => {
                    let mask = u128::MAX
                        .checked_shl(128 - u32::from(len.min(128)))
                        .unwrap_or(0);
                    let s = u128::from(a) & mask;
                    v6.push((s, s | !mask));
                }
            }
        }
        Ranges {
            v4: merge(v4, |x| x.checked_add(1)),
            v6: merge(v6, |x| x.checked_add(1)),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4.iter().any(|(s, e)| *s <= a && a <= *e)
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6.iter().any(|(s, e)| *s <= a && a <= *e)
            }
        }
    }

    /// The set elements, IPv4 then IPv6 (`1.2.3.4`, `10.0.0.0-10.0.255.255`).
    fn elements(&self) -> (Vec<String>, Vec<String>) {
        fn el<A: std::fmt::Display>(s: A, e: A, same: bool) -> String {
            if same {
                s.to_string()
            } else {
                format!("{s}-{e}")
            }
        }
        (
            self.v4
                .iter()
                .map(|(s, e)| el(Ipv4Addr::from(*s), Ipv4Addr::from(*e), s == e))
                .collect(),
            self.v6
                .iter()
                .map(|(s, e)| el(Ipv6Addr::from(*s), Ipv6Addr::from(*e), s == e))
                .collect(),
        )
    }
}

/// A policy as the sets a sandbox's table holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `allowOut`, its domains resolved.
    pub allow: Ranges,
    pub deny: Ranges,
    /// The host's resolvers the sandbox may query on port 53 (slirp4netns
    /// forwards `10.0.2.3` to them; they may be local addresses, which the
    /// table otherwise refuses).
    pub dns: Ranges,
    /// `allow_internet_access`: false refuses whatever `allowOut` does not
    /// accept.
    pub internet: bool,
}

impl Plan {
    /// Whether this is the open policy (internet on, nothing allowed or
    /// denied, every resolver reachable): what the node's guard table
    /// alone enforces, so the sandbox needs no table of its own.
    pub fn is_open(&self, nameservers: &[IpAddr]) -> bool {
        let all = Ranges::of(
            nameservers
                .iter()
                .map(|ns| (*ns, if ns.is_ipv4() { 32 } else { 128 })),
        );
        self.internet
            && self.allow == Ranges::default()
            && self.deny == Ranges::default()
            && self.dns == all
    }

    /// The plan of `policy` on a host whose resolvers are `nameservers`;
    /// `lookup` resolves an `allowOut` domain. DNS is allowed when the
    /// sandbox has domains to resolve in `allowOut`, or when the policy
    /// lets it reach the resolver anyway (`allowOut` names it, or internet
    /// is on and no `denyOut` entry covers it): with internet off and no
    /// domains, or a `denyOut` naming the resolver, DNS is refused like
    /// anything else.
    pub fn of(
        policy: &NetworkPolicy,
        nameservers: &[IpAddr],
        lookup: &mut dyn FnMut(&str) -> Result<Vec<IpAddr>, EgressError>,
    ) -> Result<Plan, EgressError> {
        let mut allow = Vec::new();
        for entry in &policy.allow_out {
            if let Some(net) = parse_net(entry) {
                allow.push(net);
                continue;
            }
            let mut addrs = lookup(entry)?;
            addrs.sort();
            addrs.dedup();
            if addrs.len() > MAX_ADDRESSES_PER_DOMAIN {
                return Err(EgressError::Policy(format!(
                    "network.allowOut: {entry:?} resolves to {} addresses; a domain may \
                     resolve to at most {MAX_ADDRESSES_PER_DOMAIN}",
                    addrs.len()
                )));
            }
            allow.extend(
                addrs
                    .into_iter()
                    .map(|a| (a, if a.is_ipv4() { 32 } else { 128 })),
            );
        }
        let mut deny = Vec::new();
        for entry in &policy.deny_out {
            deny.push(parse_net(entry).ok_or_else(|| {
                EgressError::Policy(format!(
                    "network.denyOut entry {entry:?} is not a CIDR or an IP address"
                ))
            })?);
        }
        let (allow, deny) = (Ranges::of(allow), Ranges::of(deny));
        let dns = Ranges::of(
            nameservers
                .iter()
                .filter(|ns| {
                    policy.has_domains()
                        || allow.contains(**ns)
                        || (policy.allow_internet && !deny.contains(**ns))
                })
                .map(|ns| (*ns, if ns.is_ipv4() { 32 } else { 128 })),
        );
        Ok(Plan {
            allow,
            deny,
            dns,
            internet: policy.allow_internet,
        })
    }
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

/// Every address of the host itself (`fib daddr type local`: loopback, the
/// node's, gateway's and scheduler's ports on any local address),
/// link-local and cloud metadata, refused.
fn host_refusals() -> Vec<String> {
    [
        "fib daddr type local",
        "ip daddr 169.254.0.0/16",
        "ip6 daddr fe80::/10",
    ]
    .into_iter()
    .flat_map(refuse)
    .collect()
}

/// An nftables set declaration.
fn set(name: &str, kind: &str, interval: bool, elements: &[String]) -> String {
    let flags = if interval { " flags interval;" } else { "" };
    let elements = if elements.is_empty() {
        String::new()
    } else {
        format!(" elements = {{ {} }}", elements.join(", "))
    };
    format!("  set {name} {{ type {kind};{flags}{elements} }}\n")
}

/// An nftables script that replaces table `name`, in one transaction
/// (`table` first so `delete` finds it the first time): `sets`, a base
/// chain on the output hook at `priority` whose one rule sends the sockets
/// of host uids `uids` (first, last) to chain `chain`, and that chain's
/// `rules`.
fn table_script(
    name: &str,
    priority: i32,
    uids: (u32, u32),
    sets: &[String],
    chain: &str,
    rules: &[String],
) -> String {
    let mut out = format!("table inet {name}\ndelete table inet {name}\ntable inet {name} {{\n");
    for s in sets {
        out.push_str(s);
    }
    out.push_str(&format!(
        "  chain out {{\n    type filter hook output priority {priority}; policy accept;\n    meta skuid {}-{} jump {chain}\n  }}\n  chain {chain} {{\n",
        uids.0, uids.1
    ));
    for r in rules {
        out.push_str("    ");
        out.push_str(r);
        out.push('\n');
    }
    out.push_str("  }\n}\n");
    out
}

/// The guard's script: table `name` refusing the host and link-local to
/// the host uids `uids` (first, last), after letting the host's resolvers
/// on port 53 through. That accept ends only the guard's own chain: every
/// table must pass a packet, so a sandbox's table still decides about DNS.
pub fn guard_script(name: &str, uids: (u32, u32), nameservers: &[IpAddr]) -> String {
    let mut rules = Vec::new();
    for ns in nameservers {
        let (family, len) = if ns.is_ipv4() {
            ("ip", 32)
        } else {
            ("ip6", 128)
        };
        for proto in ["udp", "tcp"] {
            rules.push(format!("{family} daddr {ns}/{len} {proto} dport 53 accept"));
        }
    }
    rules.extend(host_refusals());
    table_script(name, -10, uids, &[], "host", &rules)
}

/// One sandbox's script: table `name` over the host uids `uids` (first,
/// last) under `plan`. In its chain, in order: the resolvers it may query
/// on port 53; the host and link-local, refused; `allowOut`, accepted (it
/// wins over denials, as in E2B); `denyOut`, refused; and without internet
/// access, everything else refused.
pub fn sandbox_script(name: &str, uids: (u32, u32), plan: &Plan) -> String {
    let (allow4, allow6) = plan.allow.elements();
    let (deny4, deny6) = plan.deny.elements();
    let (dns4, dns6) = plan.dns.elements();
    let sets = [
        set("allow4", "ipv4_addr", true, &allow4),
        set("allow6", "ipv6_addr", true, &allow6),
        set("deny4", "ipv4_addr", true, &deny4),
        set("deny6", "ipv6_addr", true, &deny6),
        set("dns4", "ipv4_addr", true, &dns4),
        set("dns6", "ipv6_addr", true, &dns6),
    ];
    let mut rules = Vec::new();
    for (family, set) in [("ip", "@dns4"), ("ip6", "@dns6")] {
        for proto in ["udp", "tcp"] {
            rules.push(format!("{family} daddr {set} {proto} dport 53 accept"));
        }
    }
    rules.extend(host_refusals());
    rules.push("ip daddr @allow4 accept".into());
    rules.push("ip6 daddr @allow6 accept".into());
    rules.extend(refuse("ip daddr @deny4"));
    rules.extend(refuse("ip6 daddr @deny6"));
    if !plan.internet {
        rules.extend(refuse(""));
    }
    table_script(name, 0, uids, &sets, "egress", &rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: &str = "10.255.255.53";

    fn nameservers() -> Vec<IpAddr> {
        vec![NS.parse().unwrap()]
    }

    fn plan(policy: &NetworkPolicy) -> Plan {
        Plan::of(policy, &nameservers(), &mut |d| match d {
            "pypi.org" => Ok(vec!["203.0.113.80".parse().unwrap()]),
            other => Err(EgressError::Node(format!("no such domain {other}"))),
        })
        .unwrap()
    }

    /// The lines of chain `chain` of table `table` in `script`.
    fn chain<'a>(script: &'a str, table: &str, chain: &str) -> Vec<&'a str> {
        let head = format!("table inet {table} {{\n");
        let start = script
            .find(&head)
            .unwrap_or_else(|| panic!("{table} missing in {script}"));
        let body = &script[start + head.len()..];
        let head = format!("  chain {chain} {{\n");
        let at = body
            .find(&head)
            .unwrap_or_else(|| panic!("chain {chain} missing in {script}"));
        body[at + head.len()..]
            .lines()
            .take_while(|l| l.trim() != "}")
            .map(str::trim)
            .filter(|l| !l.starts_with("type "))
            .collect()
    }

    fn pos(rules: &[&str], s: &str) -> usize {
        rules
            .iter()
            .position(|r| r.contains(s))
            .unwrap_or_else(|| panic!("{s} missing in {rules:#?}"))
    }

    #[test]
    fn the_guard_refuses_the_host_to_every_range_and_nothing_else() {
        let script = guard_script(
            "warren_guard_2000000000",
            (2_000_000_000, 2_002_097_151),
            &nameservers(),
        );
        // Host packets meet one rule; only the range's sockets go further.
        assert_eq!(
            chain(&script, "warren_guard_2000000000", "out"),
            ["meta skuid 2000000000-2002097151 jump host"],
            "{script}"
        );
        let rules = chain(&script, "warren_guard_2000000000", "host");
        assert!(pos(&rules, "10.255.255.53/32 udp dport 53 accept") < pos(&rules, "fib daddr"));
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
        assert!(!script.contains("return"), "{script}");
        // Replaced atomically, never a moment without it.
        assert!(
            script.starts_with(
                "table inet warren_guard_2000000000\ndelete table inet warren_guard_2000000000\n"
            ),
            "{script}"
        );
    }

    #[test]
    fn only_the_open_policy_needs_no_table() {
        assert!(plan(&NetworkPolicy::open()).is_open(&nameservers()));
        for p in [
            NetworkPolicy {
                allow_internet: false,
                allow_out: vec![],
                deny_out: vec![],
            },
            NetworkPolicy {
                allow_internet: true,
                allow_out: vec!["1.1.1.1".into()],
                deny_out: vec![],
            },
            NetworkPolicy {
                allow_internet: true,
                allow_out: vec![],
                deny_out: vec!["8.8.8.0/24".into()],
            },
            NetworkPolicy {
                allow_internet: true,
                allow_out: vec![],
                deny_out: vec![format!("{NS}/32")],
            },
        ] {
            assert!(!plan(&p).is_open(&nameservers()), "{p:?}");
        }
    }

    #[test]
    fn a_sandbox_jumps_once_and_orders_host_allow_deny() {
        let p = NetworkPolicy {
            allow_internet: false,
            allow_out: vec!["1.1.1.1".into()],
            deny_out: vec!["8.8.8.0/24".into()],
        };
        let script = sandbox_script(
            "warren_3_0000abcd",
            (2_000_000_000, 2_000_065_535),
            &plan(&p),
        );
        assert_eq!(
            chain(&script, "warren_3_0000abcd", "out"),
            ["meta skuid 2000000000-2000065535 jump egress"],
            "{script}"
        );
        assert!(!script.contains("return"), "{script}");
        let rules = chain(&script, "warren_3_0000abcd", "egress");
        assert!(pos(&rules, "@dns4 udp dport 53 accept") < pos(&rules, "fib daddr type local"));
        assert!(pos(&rules, "fib daddr type local") < pos(&rules, "ip daddr @allow4 accept"));
        assert!(
            pos(&rules, "ip daddr @allow4 accept")
                < pos(
                    &rules,
                    "ip daddr @deny4 meta l4proto tcp reject with tcp reset"
                )
        );
        // No internet: everything else refused, last.
        assert_eq!(
            &rules[rules.len() - 2..],
            ["meta l4proto tcp reject with tcp reset", "reject"],
            "{script}"
        );
        assert!(
            script
                .contains("set allow4 { type ipv4_addr; flags interval; elements = { 1.1.1.1 } }"),
            "{script}"
        );
        assert!(
            script.contains(
                "set deny4 { type ipv4_addr; flags interval; elements = { 8.8.8.0-8.8.8.255 } }"
            ),
            "{script}"
        );
        // No domain, no internet: no resolver either.
        assert!(
            script.contains("set dns4 { type ipv4_addr; flags interval; }"),
            "{script}"
        );
    }

    #[test]
    fn the_rules_are_the_same_for_one_entry_and_for_a_thousand() {
        let uids = (2_000_000_000, 2_000_065_535);
        let few = NetworkPolicy {
            allow_internet: true,
            allow_out: vec!["198.18.0.1".into()],
            deny_out: vec!["198.19.0.1".into()],
        };
        let many = NetworkPolicy {
            allow_internet: true,
            // Every other address: nothing merges.
            allow_out: (0..1000)
                .map(|i| format!("198.18.{}.{}", i / 100, (i % 100) * 2))
                .collect(),
            deny_out: (0..1000)
                .map(|i| format!("2001:db8::{:x}/128", i * 2))
                .collect(),
        };
        let (a, b) = (
            sandbox_script("t", uids, &plan(&few)),
            sandbox_script("t", uids, &plan(&many)),
        );
        for c in ["out", "egress"] {
            assert_eq!(chain(&a, "t", c), chain(&b, "t", c));
        }
        let p = plan(&many);
        assert_eq!((p.allow.v4.len(), p.deny.v6.len()), (1000, 1000));
        assert!(!b.contains("198.18.0.2 accept"), "an entry became a rule");
    }

    #[test]
    fn ranges_merge_mask_host_bits_and_contain() {
        let nets = [
            "10.0.0.0/24",
            "10.0.1.0/24",
            "10.0.0.7/8",
            "192.168.1.1",
            "192.168.1.2",
            "192.168.1.4",
            "0.0.0.0/0",
            "2001:db8::/32",
        ]
        .map(|n| parse_net(n).unwrap());
        let r = Ranges::of(nets[..6].iter().copied());
        assert_eq!(
            r.elements().0,
            [
                "10.0.0.0-10.255.255.255",
                "192.168.1.1-192.168.1.2",
                "192.168.1.4"
            ]
        );
        assert!(r.contains("10.9.9.9".parse().unwrap()));
        assert!(!r.contains("192.168.1.3".parse().unwrap()));
        let all = Ranges::of([nets[6], nets[7]]);
        assert_eq!(
            all.elements(),
            (
                vec!["0.0.0.0-255.255.255.255".to_string()],
                vec!["2001:db8::-2001:db8:ffff:ffff:ffff:ffff:ffff:ffff".to_string()]
            )
        );
        assert!(all.contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn dns_follows_the_policy() {
        let ns: IpAddr = NS.parse().unwrap();
        let cases = [
            // (internet, allowOut, denyOut, may query the resolver)
            (true, vec![], vec![], true),
            (false, vec![], vec![], false),
            (false, vec!["1.1.1.1"], vec![], false),
            (false, vec!["pypi.org"], vec![], true),
            (true, vec![], vec![NS], false),
            (true, vec![], vec!["10.0.0.0/8"], false),
            (true, vec![NS], vec![NS], true),
            (true, vec!["pypi.org"], vec!["0.0.0.0/0"], true),
            (false, vec![NS], vec![], true),
        ];
        for (internet, allow, deny, want) in cases {
            let p = NetworkPolicy {
                allow_internet: internet,
                allow_out: allow.iter().map(|s| s.to_string()).collect(),
                deny_out: deny.iter().map(|s| s.to_string()).collect(),
            };
            assert_eq!(plan(&p).dns.contains(ns), want, "{p:?}");
        }
    }

    #[test]
    fn a_domain_with_too_many_addresses_is_the_clients_error() {
        let p = NetworkPolicy {
            allow_internet: false,
            allow_out: vec!["many.example.com".into()],
            deny_out: vec![],
        };
        let e = Plan::of(&p, &[], &mut |_| {
            Ok((0..=MAX_ADDRESSES_PER_DOMAIN as u32)
                .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))
                .collect())
        })
        .unwrap_err();
        match e {
            EgressError::Policy(m) => {
                assert!(
                    m.contains("many.example.com") && m.contains("at most 64"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        // At the bound (duplicates counted once) it is fine.
        let ok = Plan::of(&p, &[], &mut |_| {
            let mut v: Vec<IpAddr> = (0..MAX_ADDRESSES_PER_DOMAIN as u32)
                .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i * 2)))
                .collect();
            v.extend(v.clone());
            Ok(v)
        })
        .unwrap();
        assert_eq!(ok.allow.v4.len(), MAX_ADDRESSES_PER_DOMAIN);
    }

    /// The kernel takes the scripts (`nft --check`: parsed and validated by
    /// the kernel in a transaction that is never committed), at the bounds.
    /// Needs root and nft.
    #[test]
    fn nft_accepts_the_scripts() {
        let Some(nft) = super::super::super::limits::find_program("nft") else {
            eprintln!("skipped: nft is not installed");
            return;
        };
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: nft --check needs root");
            return;
        }
        let full = NetworkPolicy {
            allow_internet: false,
            allow_out: (0..1000)
                .map(|i| format!("198.18.{}.{}", i / 100, (i % 100) * 2))
                .chain(["pypi.org".to_string(), "2001:db8::/48".to_string()])
                .collect(),
            deny_out: (0..1000)
                .map(|i| format!("10.{}.{}.0/24", i / 100, (i % 100) * 2))
                .chain(["0.0.0.0/0".to_string(), "::/0".to_string()])
                .collect(),
        };
        let uids = (2_000_000_000, 2_000_065_535);
        for script in [
            guard_script(
                "wrn_check_guard",
                (2_000_000_000, 2_002_097_151),
                &nameservers(),
            ),
            sandbox_script("wrn_check_0", uids, &plan(&full)),
            sandbox_script("wrn_check_1", uids, &plan(&NetworkPolicy::open())),
        ] {
            use std::io::Write;
            let mut child = std::process::Command::new(&nft)
                .args(["--check", "-f", "-"])
                .stdin(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("nft runs");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(script.as_bytes())
                .expect("script written");
            let out = child.wait_with_output().expect("nft exits");
            assert!(
                out.status.success(),
                "nft refused:\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                &script[..script.len().min(3000)]
            );
        }
    }

    #[test]
    fn an_open_sandbox_refuses_only_the_host() {
        let script = sandbox_script("t", (1, 2), &plan(&NetworkPolicy::open()));
        let rules = chain(&script, "t", "egress");
        assert_eq!(rules.last(), Some(&"ip6 daddr @deny6 reject"), "{script}");
        assert!(script.contains("set deny4 { type ipv4_addr; flags interval; }"));
        assert!(script.contains("elements = { 10.255.255.53 }"), "{script}");
    }
}
