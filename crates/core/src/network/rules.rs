//! E2B's `network.rules`: per-host transforms the node's egress proxy
//! applies to a sandbox's outbound HTTP(S) requests, and the placeholders in
//! their header values (`${e2b.secrets.NAME}`) that it resolves per request.
//! Shared by the gateway (which validates what a tenant sends) and the node
//! (which validates it again and applies it).
//!
//! A rule names no secret value: only placeholders, which the proxy
//! resolves at request time, so a secret updated now is used by the next
//! request and the sandbox never holds it.
//!
//! Keys are host names (`api.example.com`), wildcards (`*.example.com`: any
//! name under it, not the name itself), IP addresses or CIDRs (matched when
//! a request names its host by address). Which key applies to a host:
//! the exact name; else the longest wildcard; else the narrowest address
//! range. Its rules apply in order, each transform's headers replacing a
//! header of the same name (case-insensitive) or adding it.
//!
//! Everything is bounded ([`MAX_HOSTS`], [`MAX_RULES_PER_HOST`],
//! [`MAX_HEADERS`], [`MAX_VALUE_LEN`], [`MAX_TOTAL_BYTES`]): E2B's API states
//! no bound, and the node keeps the rules in memory and on disk per sandbox.

use super::parse_net;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Most hosts `rules` may name.
pub const MAX_HOSTS: usize = 100;
/// Most rules one host may have.
pub const MAX_RULES_PER_HOST: usize = 16;
/// Most headers all transforms together may set.
pub const MAX_HEADERS: usize = 256;
/// Longest header value, placeholders included.
pub const MAX_VALUE_LEN: usize = 8192;
/// Most bytes of header names and values all transforms together hold.
pub const MAX_TOTAL_BYTES: usize = 64 * 1024;
/// Longest header name.
pub const MAX_HEADER_NAME_LEN: usize = 256;
/// Longest secret name (E2B's `NewSecret.name`).
pub const MAX_SECRET_NAME_LEN: usize = 128;

/// The placeholder prefix of a secret: `${e2b.secrets.NAME}`.
pub const SECRET_PREFIX: &str = "${e2b.secrets.";
/// The placeholder prefix of a workload identity token, which warren does
/// not mint (`iam.tokens` is refused at create).
pub const IDENTITY_PREFIX: &str = "${e2b.identity.tokens.";
/// Every `${e2b.` placeholder is the platform's: an unknown kind is refused
/// rather than sent on as literal text.
const RESERVED_PREFIX: &str = "${e2b.";

/// Headers a transform may not set: they frame the request or name its
/// destination, which the proxy decides (the host a rule matched).
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
];

/// `network.rules`: host → ordered rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EgressRules(pub BTreeMap<String, Vec<Rule>>);

/// One rule (E2B's `SandboxNetworkRule`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<Transform>,
}

/// E2B's `SandboxNetworkTransform`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transform {
    /// Header name → value (placeholders allowed).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// A piece of a header value: literal text or a secret's placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece<'a> {
    Text(&'a str),
    /// The secret's name, lower-cased (names are stored lower-cased).
    Secret(String),
}

impl EgressRules {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The keys lower-cased and without a trailing dot (as the proxy
    /// matches them); two keys that become one are refused by
    /// [`EgressRules::validate`].
    pub fn normalized(&self) -> EgressRules {
        EgressRules(
            self.0
                .iter()
                .map(|(k, v)| (normalize_host(k), v.clone()))
                .collect(),
        )
    }

    /// Checks every key, header and placeholder against what the proxy
    /// can apply and the bounds. The error names the host, header or
    /// placeholder and the limit; `field` is where the rules sit
    /// (`network.rules` at create, `rules` in an update).
    pub fn validate(&self, field: &str) -> Result<(), String> {
        if self.0.len() > MAX_HOSTS {
            return Err(format!(
                "{field} names {} hosts; at most {MAX_HOSTS} are allowed",
                self.0.len()
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        let (mut headers, mut bytes) = (0usize, 0usize);
        for (host, rules) in &self.0 {
            if !is_rule_host(host) {
                return Err(format!(
                    "{field}: {host:?} is not a host name, a wildcard (*.example.com), \
                     an IP address or a CIDR"
                ));
            }
            if !seen.insert(normalize_host(host)) {
                return Err(format!(
                    "{field}: {host:?} names the same host as another key"
                ));
            }
            if rules.len() > MAX_RULES_PER_HOST {
                return Err(format!(
                    "{field}[{host:?}] has {} rules; at most {MAX_RULES_PER_HOST} are allowed",
                    rules.len()
                ));
            }
            for rule in rules {
                let Some(t) = &rule.transform else { continue };
                for (name, value) in &t.headers {
                    headers += 1;
                    bytes += name.len() + value.len();
                    check_header(field, host, name, value)?;
                }
            }
        }
        if headers > MAX_HEADERS {
            return Err(format!(
                "{field} sets {headers} headers in all; at most {MAX_HEADERS} are allowed"
            ));
        }
        if bytes > MAX_TOTAL_BYTES {
            return Err(format!(
                "{field} holds {bytes} bytes of header names and values; at most \
                 {MAX_TOTAL_BYTES} are allowed"
            ));
        }
        Ok(())
    }

    /// The rules that apply to requests for `host` (a name or an address,
    /// as the request names it; see the module doc for which key wins).
    pub fn for_host(&self, host: &str) -> Option<(&str, &[Rule])> {
        let host = normalize_host(host);
        let entries = || self.0.iter().map(|(k, v)| (normalize_host(k), k, v));
        if let Some((_, k, v)) = entries().find(|(k, _, _)| *k == host) {
            return Some((k.as_str(), v.as_slice()));
        }
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return entries()
                .filter_map(|(k, key, v)| {
                    let (net, len) = parse_net(&k)?;
                    contains(net, len, ip).then_some((len, key, v))
                })
                .max_by_key(|(len, _, _)| *len)
                .map(|(_, k, v)| (k.as_str(), v.as_slice()));
        }
        entries()
            .filter_map(|(k, key, v)| {
                let suffix = k.strip_prefix("*.")?;
                let under = host.strip_suffix(suffix)?.strip_suffix('.')?;
                (!under.is_empty()).then_some((suffix.len(), key, v))
            })
            .max_by_key(|(len, _, _)| *len)
            .map(|(_, k, v)| (k.as_str(), v.as_slice()))
    }

    /// Every secret name any placeholder names (lower-cased).
    pub fn secret_names(&self) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for t in self
            .0
            .values()
            .flatten()
            .filter_map(|r| r.transform.as_ref())
        {
            for v in t.headers.values() {
                for p in pieces(v).unwrap_or_default() {
                    if let Piece::Secret(n) = p {
                        out.insert(n);
                    }
                }
            }
        }
        out
    }
}

/// A host as the proxy compares it: lower-case, no trailing dot.
pub fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

fn is_rule_host(host: &str) -> bool {
    if parse_net(host).is_some() {
        return true;
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
        })
}

/// Whether `name` is a valid secret name (E2B's `^[a-zA-Z0-9_-]+$`, at
/// most [`MAX_SECRET_NAME_LEN`] bytes).
pub fn is_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SECRET_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_header(field: &str, host: &str, name: &str, value: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > MAX_HEADER_NAME_LEN || !name.bytes().all(token) {
        return Err(format!(
            "{field}[{host:?}]: {name:?} is not a header name (a token of at most \
             {MAX_HEADER_NAME_LEN} bytes)"
        ));
    }
    if FORBIDDEN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "{field}[{host:?}]: the header {name:?} cannot be set by a transform (it frames \
             the request or names its destination)"
        ));
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(format!(
            "{field}[{host:?}]: the value of {name:?} is {} bytes; at most {MAX_VALUE_LEN} \
             are allowed",
            value.len()
        ));
    }
    if !value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(format!(
            "{field}[{host:?}]: the value of {name:?} holds a character a header value \
             cannot (visible ASCII, spaces and tabs only)"
        ));
    }
    pieces(value).map_err(|why| format!("{field}[{host:?}]: the value of {name:?}: {why}"))?;
    Ok(())
}

/// `value` split into literal text and secret placeholders. An identity
/// placeholder, an unknown `${e2b.` kind, an unclosed placeholder or a bad
/// secret name is an error naming it.
pub fn pieces(value: &str) -> Result<Vec<Piece<'_>>, String> {
    let mut out = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find(RESERVED_PREFIX) {
        if at > 0 {
            out.push(Piece::Text(&rest[..at]));
        }
        let tail = &rest[at..];
        let end = tail
            .find('}')
            .ok_or_else(|| format!("the placeholder {tail:?} is not closed with '}}'"))?;
        let placeholder = &tail[..=end];
        if placeholder.starts_with(IDENTITY_PREFIX) {
            return Err(format!(
                "{placeholder}: workload identity tokens (iam.tokens) are not supported by warren"
            ));
        }
        let Some(name) = placeholder
            .strip_prefix(SECRET_PREFIX)
            .and_then(|p| p.strip_suffix('}'))
        else {
            return Err(format!(
                "{placeholder} is not a placeholder warren resolves (only ${{e2b.secrets.NAME}})"
            ));
        };
        if !is_secret_name(name) {
            return Err(format!(
                "{placeholder}: a secret name is 1 to {MAX_SECRET_NAME_LEN} letters, digits, \
                 '_' or '-'"
            ));
        }
        out.push(Piece::Secret(name.to_ascii_lowercase()));
        rest = &tail[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rules(json: &str) -> EgressRules {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn e2b_shapes_parse_and_validate() {
        let r = rules(
            r#"{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.OpenAI-key}"}}},{}]}"#,
        );
        r.validate("network.rules").unwrap();
        assert_eq!(
            r.secret_names().into_iter().collect::<Vec<_>>(),
            ["openai-key"]
        );
        assert_eq!(
            pieces("Bearer ${e2b.secrets.A_b} and ${x} ${e2b.secrets.c}").unwrap(),
            [
                Piece::Text("Bearer "),
                Piece::Secret("a_b".into()),
                Piece::Text(" and ${x} "),
                Piece::Secret("c".into()),
            ]
        );
    }

    #[test]
    fn bad_rules_are_refused_by_name() {
        for (json, needle) in [
            (r#"{"not a host":[]}"#, "not a host"),
            (
                r#"{"a.com":[{"transform":{"headers":{"Host":"x"}}}]}"#,
                "Host",
            ),
            (
                r#"{"a.com":[{"transform":{"headers":{"X":"a\r\nB: c"}}}]}"#,
                "character",
            ),
            (
                r#"{"a.com":[{"transform":{"headers":{"X":"${e2b.secrets.a"}}}]}"#,
                "not closed",
            ),
            (
                r#"{"a.com":[{"transform":{"headers":{"X":"${e2b.identity.tokens.aws}"}}}]}"#,
                "iam.tokens",
            ),
            (
                r#"{"a.com":[{"transform":{"headers":{"X":"${e2b.other.x}"}}}]}"#,
                "e2b.other",
            ),
            (
                r#"{"a.com":[{"transform":{"headers":{"X":"${e2b.secrets.a b}"}}}]}"#,
                "secret name",
            ),
            (
                r#"{"a.com":[{"transform":{"headers":{"Bad Name":"1"}}}]}"#,
                "header name",
            ),
            (r#"{"A.com":[],"a.com.":[]}"#, "same host"),
        ] {
            let e = rules(json).validate("network.rules").unwrap_err();
            assert!(
                e.contains(needle) && e.contains("network.rules"),
                "{json}: {e}"
            );
        }
        let many: BTreeMap<String, Vec<Rule>> = (0..=MAX_HOSTS)
            .map(|i| (format!("h{i}.example.com"), vec![]))
            .collect();
        let e = EgressRules(many).validate("rules").unwrap_err();
        assert!(e.contains("at most 100"), "{e}");
        let big = "x".repeat(MAX_VALUE_LEN + 1);
        let e = rules(&format!(
            r#"{{"a.com":[{{"transform":{{"headers":{{"X":"{big}"}}}}}}]}}"#
        ))
        .validate("rules")
        .unwrap_err();
        assert!(e.contains("8192"), "{e}");
    }

    #[test]
    fn the_most_specific_key_wins() {
        let r = rules(
            r#"{"*.example.com":[{}],"*.api.example.com":[{},{}],"API.example.com":[{},{},{}],
                "10.0.0.0/8":[{}],"10.1.0.0/16":[{},{}]}"#,
        );
        let n = |h: &str| r.for_host(h).map(|(_, v)| v.len());
        assert_eq!(n("api.example.com"), Some(3));
        assert_eq!(n("API.Example.com."), Some(3));
        assert_eq!(n("v1.api.example.com"), Some(2));
        assert_eq!(n("www.example.com"), Some(1));
        assert_eq!(n("example.com"), None);
        assert_eq!(n("badexample.com"), None);
        assert_eq!(n("10.1.2.3"), Some(2));
        assert_eq!(n("10.2.2.3"), Some(1));
        assert_eq!(n("11.0.0.1"), None);
    }
}
