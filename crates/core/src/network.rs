//! A sandbox's egress policy as E2B's API states it (`allow_internet_access`,
//! `network.allowOut`, `network.denyOut`), shared by the gateway (which
//! validates it) and the node (which enforces it).

use serde::{Deserialize, Serialize};
use std::net::IpAddr;

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

    /// Checks every entry: a CIDR, a bare address, or (in `allowOut` only)
    /// a domain name. The error names the entry.
    pub fn validate(&self) -> Result<(), String> {
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
}
