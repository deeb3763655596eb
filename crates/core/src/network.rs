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
}
