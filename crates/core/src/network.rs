//! A sandbox's egress policy as E2B's API states it (`allow_internet_access`,
//! `network.allowOut`, `network.denyOut`), shared by the gateway (which
//! validates it) and the node (which validates it again and enforces it).
//!
//! The lists are bounded ([`MAX_ENTRIES`], [`MAX_DOMAINS`]): E2B's API
//! states no bound, and the node turns every entry into an element of an
//! nftables set, so an unbounded list would be unbounded kernel memory and
//! an unbounded transaction on every policy change.

pub mod rules;

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Most entries `allowOut` or `denyOut` may have, each. E2B's OpenAPI spec
/// and SDKs state no bound; a thousand is far more than a policy written by
/// hand needs, and a list past it (a blocklist of a whole country) belongs
/// in an egress proxy, not in per-sandbox kernel rules.
pub const MAX_ENTRIES: usize = 1000;

/// Most domain names among `allowOut`'s entries: the node resolves each
/// when the sandbox starts and at every update, under the sandbox's lock.
pub const MAX_DOMAINS: usize = 100;

/// Most addresses one `allowOut` domain may resolve to (the node refuses a
/// policy whose domain answers with more); with [`MAX_DOMAINS`] this bounds
/// the addresses a policy's domains add to its allow set.
pub const MAX_ADDRESSES_PER_DOMAIN: usize = 64;

/// A sandbox's egress policy (E2B's `allow_internet_access` and
/// `network.allowOut`/`denyOut`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    pub allow_internet: bool,
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
}

impl NetworkPolicy {
    /// Open internet, no rules (E2B's default).
    pub fn open() -> NetworkPolicy {
        NetworkPolicy {
            allow_internet: true,
            ..NetworkPolicy::default()
        }
    }

    /// Whether the sandbox gets a network beyond `lo`.
    pub fn has_network(&self) -> bool {
        self.allow_internet || !self.allow_out.is_empty()
    }

    /// Whether `allowOut` names a domain (the sandbox then needs DNS).
    pub fn has_domains(&self) -> bool {
        self.allow_out.iter().any(|e| parse_net(e).is_none())
    }

    /// Checks every entry: a CIDR, a bare address, or (in `allowOut` only)
    /// a domain name; and the bounds ([`MAX_ENTRIES`] per list,
    /// [`MAX_DOMAINS`]). The error names the entry or the field and the
    /// limit.
    pub fn validate(&self) -> Result<(), String> {
        for (field, list) in [("allowOut", &self.allow_out), ("denyOut", &self.deny_out)] {
            if list.len() > MAX_ENTRIES {
                return Err(format!(
                    "network.{field} has {} entries; at most {MAX_ENTRIES} are allowed",
                    list.len()
                ));
            }
        }
        let domains = self
            .allow_out
            .iter()
            .filter(|e| parse_net(e).is_none())
            .count();
        if domains > MAX_DOMAINS {
            return Err(format!(
                "network.allowOut has {domains} domain names; at most {MAX_DOMAINS} are allowed \
                 (addresses and CIDRs count only against the {MAX_ENTRIES} entries)"
            ));
        }
        for e in &self.allow_out {
            if parse_net(e).is_none() && !is_domain(e) {
                return Err(format!(
                    "network.allowOut entry {e:?} is not a CIDR, an IP address or a domain name"
                ));
            }
            if e.starts_with("*.") {
                return Err(format!(
                    "network.allowOut entry {e:?}: wildcard domains are not supported by warren"
                ));
            }
        }
        for e in &self.deny_out {
            if parse_net(e).is_none() {
                return Err(format!(
                    "network.denyOut entry {e:?} is not a CIDR or an IP address (domains are not supported for deny rules)"
                ));
            }
        }
        Ok(())
    }
}

/// `(address, prefix length)` of a CIDR or bare address.
pub fn parse_net(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr = addr.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max)?,
        None => max,
    };
    Some((ip, len))
}

/// The header a request to a sandbox's port carries when the sandbox was
/// created with `allowPublicTraffic: false` (E2B's name; the SDK's
/// `Sandbox.traffic_access_token`).
pub const TRAFFIC_ACCESS_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Longest `maskRequestHost` accepted.
pub const MAX_MASK_LEN: usize = 255;

/// The placeholder in `maskRequestHost` replaced with the port.
pub const MASK_PORT: &str = "${PORT}";

/// Checks E2B's `maskRequestHost`: a host, optionally with `:port`, in
/// which `${PORT}` stands for the port the request is for. The error names
/// the value.
pub fn validate_mask(mask: &str) -> Result<(), String> {
    let host = mask.replace(MASK_PORT, "1");
    let ok = !mask.is_empty()
        && mask.len() <= MAX_MASK_LEN
        && host.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'[' | b']')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "network.maskRequestHost {mask:?} is not a host name (letters, digits, '.', '-', '_', \
             an optional ':port', and ${{PORT}} for the port; at most {MAX_MASK_LEN} characters)"
        ))
    }
}

/// The Host header a request for `port` carries under `mask`.
pub fn masked_host(mask: &str, port: u16) -> String {
    mask.replace(MASK_PORT, &port.to_string())
}

fn is_domain(s: &str) -> bool {
    let s = s.strip_prefix("*.").unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.contains('.')
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_checked() {
        assert!(validate_mask("custom-host.example.com:${PORT}").is_ok());
        assert!(validate_mask("${PORT}-app.example.com").is_ok());
        assert_eq!(
            masked_host("custom-host.example.com:${PORT}", 8080),
            "custom-host.example.com:8080"
        );
        for bad in ["", "a b", "x\r\nEvil: 1", "h/ost", &"a".repeat(300)] {
            let e = validate_mask(bad).unwrap_err();
            assert!(e.contains("maskRequestHost"), "{e}");
        }
    }

    #[test]
    fn entries_are_checked() {
        let ok = NetworkPolicy {
            allow_internet: false,
            allow_out: vec!["8.8.8.8".into(), "10.0.0.0/8".into(), "pypi.org".into()],
            deny_out: vec!["0.0.0.0/0".into(), "2001:db8::/32".into()],
        };
        assert!(ok.validate().is_ok());
        for bad in [
            NetworkPolicy {
                deny_out: vec!["example.com".into()],
                ..Default::default()
            },
            NetworkPolicy {
                allow_out: vec!["1.2.3.4/40".into()],
                ..Default::default()
            },
            NetworkPolicy {
                allow_out: vec!["*.example.com".into()],
                ..Default::default()
            },
            NetworkPolicy {
                allow_out: vec!["not a host".into()],
                ..Default::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lists_are_bounded_and_the_error_names_field_and_limit() {
        let addrs = |n: usize| -> Vec<String> {
            (0..n)
                .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256))
                .collect()
        };
        let at_limit = NetworkPolicy {
            allow_internet: true,
            allow_out: addrs(MAX_ENTRIES),
            deny_out: addrs(MAX_ENTRIES),
        };
        assert!(at_limit.validate().is_ok());
        for (policy, field) in [
            (
                NetworkPolicy {
                    deny_out: addrs(MAX_ENTRIES + 1),
                    ..at_limit.clone()
                },
                "network.denyOut",
            ),
            (
                NetworkPolicy {
                    allow_out: addrs(MAX_ENTRIES + 1),
                    ..at_limit.clone()
                },
                "network.allowOut",
            ),
        ] {
            let e = policy.validate().unwrap_err();
            assert!(e.contains(field) && e.contains("1000"), "{e}");
        }
        let domains =
            |n: usize| -> Vec<String> { (0..n).map(|i| format!("h{i}.example.com")).collect() };
        let ok = NetworkPolicy {
            allow_out: domains(MAX_DOMAINS),
            ..Default::default()
        };
        assert!(ok.validate().is_ok() && ok.has_domains());
        let e = NetworkPolicy {
            allow_out: domains(MAX_DOMAINS + 1),
            ..Default::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.contains("network.allowOut") && e.contains("100 "), "{e}");
        assert!(!at_limit.has_domains());
    }
}
