//! Who a certificate says its holder is.

use std::fmt;
use x509_parser::extensions::GeneralName;

/// The part a certificate was issued to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Scheduler,
    Gateway,
    Node,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Scheduler, Role::Gateway, Role::Node];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Scheduler => "scheduler",
            Role::Gateway => "gateway",
            Role::Node => "node",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A certificate holder: its role and its name (a node's id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    pub role: Role,
    pub name: String,
}

/// The URI scheme of identity names.
const SCHEME: &str = "warren://";
/// Longest name; names are DNS-label-like (`a-z`, `0-9`, `-`, `.`, `_`).
pub const MAX_NAME: usize = 63;

impl Identity {
    pub fn new(role: Role, name: &str) -> Result<Identity, String> {
        check_name(name)?;
        Ok(Identity {
            role,
            name: name.to_string(),
        })
    }

    /// `warren://<role>/<name>`, the URI subject alternative name.
    pub fn uri(&self) -> String {
        format!("{SCHEME}{}/{}", self.role, self.name)
    }

    /// Parses [`Identity::uri`]'s form; `None` for any other URI.
    pub fn from_uri(uri: &str) -> Option<Identity> {
        let (role, name) = uri.strip_prefix(SCHEME)?.split_once('/')?;
        Identity::new(Role::parse(role)?, name).ok()
    }

    /// The identity a DER certificate names: exactly one `warren://` URI.
    pub fn from_der(der: &[u8]) -> Result<Identity, String> {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| format!("unreadable certificate: {e}"))?;
        let sans = cert
            .subject_alternative_name()
            .map_err(|e| format!("unreadable subject alternative names: {e}"))?;
        let mut found = sans
            .into_iter()
            .flat_map(|ext| ext.value.general_names.iter())
            .filter_map(|n| match n {
                GeneralName::URI(u) if u.starts_with(SCHEME) => Some(*u),
                _ => None,
            });
        let (Some(uri), None) = (found.next(), found.next()) else {
            return Err(format!(
                "the certificate must name exactly one {SCHEME}<role>/<name> identity"
            ));
        };
        Identity::from_uri(uri).ok_or_else(|| format!("{uri:?} is not a warren identity"))
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.role, self.name)
    }
}

fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("a name must be 1 to {MAX_NAME} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
    {
        return Err(format!(
            "{name:?}: a name may hold only a-z, 0-9, '-', '.' and '_'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_round_trip_and_odd_ones_are_refused() {
        let id = Identity::new(Role::Node, "node-1").expect("valid");
        assert_eq!(id.uri(), "warren://node/node-1");
        assert_eq!(Identity::from_uri(&id.uri()), Some(id));
        for bad in [
            "warren://admin/x",
            "warren://node/",
            "warren://node/A",
            "warren://node/a/b",
            "https://node/x",
        ] {
            assert_eq!(Identity::from_uri(bad), None, "{bad}");
        }
    }
}
