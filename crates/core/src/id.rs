//! Sandbox and node ids.
//!
//! Sandbox ids appear in host names (`{port}-{id}.{domain}`), paths and SQL, so
//! they are kept to `[a-z0-9]`, 1..=64 characters. Node ids are
//! `[a-z0-9-]`, 1..=63 characters, not starting or ending with `-`.

use rand::Rng;

/// Longest sandbox id accepted.
pub const MAX_SANDBOX_ID_LEN: usize = 64;
/// Longest node id accepted.
pub const MAX_NODE_ID_LEN: usize = 63;
/// Length of a generated sandbox id (E2B's ids are 20 characters too).
pub const GENERATED_SANDBOX_ID_LEN: usize = 20;

/// Why an id was rejected; the message names the problem for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidId {
    #[error("{kind} id is empty")]
    Empty { kind: &'static str },
    #[error("{kind} id is {len} characters long; the limit is {max}")]
    TooLong {
        kind: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{kind} id {shown:?} has a character outside {allowed}")]
    BadChar {
        kind: &'static str,
        shown: String,
        allowed: &'static str,
    },
}

fn shown(id: &str) -> String {
    id.chars().take(80).collect()
}

/// FNV-1a of `bytes`: a short, stable (across builds and platforms) name
/// for something, not a digest that resists forgery.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Checks a sandbox id: 1..=64 characters of `[a-z0-9]`.
pub fn validate_sandbox_id(id: &str) -> Result<(), InvalidId> {
    const KIND: &str = "sandbox";
    if id.is_empty() {
        return Err(InvalidId::Empty { kind: KIND });
    }
    if id.len() > MAX_SANDBOX_ID_LEN {
        return Err(InvalidId::TooLong {
            kind: KIND,
            len: id.len(),
            max: MAX_SANDBOX_ID_LEN,
        });
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(InvalidId::BadChar {
            kind: KIND,
            shown: shown(id),
            allowed: "[a-z0-9]",
        });
    }
    Ok(())
}

/// Checks a node id: 1..=63 characters of `[a-z0-9-]`, no leading or trailing `-`.
pub fn validate_node_id(id: &str) -> Result<(), InvalidId> {
    const KIND: &str = "node";
    if id.is_empty() {
        return Err(InvalidId::Empty { kind: KIND });
    }
    if id.len() > MAX_NODE_ID_LEN {
        return Err(InvalidId::TooLong {
            kind: KIND,
            len: id.len(),
            max: MAX_NODE_ID_LEN,
        });
    }
    let ok_chars = id
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok_chars || id.starts_with('-') || id.ends_with('-') {
        return Err(InvalidId::BadChar {
            kind: KIND,
            shown: shown(id),
            allowed: "[a-z0-9-] (not starting or ending with '-')",
        });
    }
    Ok(())
}

/// A new random sandbox id of [`GENERATED_SANDBOX_ID_LEN`] characters of `[a-z0-9]`.
pub fn new_sandbox_id() -> String {
    random_token(GENERATED_SANDBOX_ID_LEN)
}

/// The prefix of E2B's API keys.
pub const E2B_KEY_PREFIX: &str = "e2b_";
/// How many hex digits follow [`E2B_KEY_PREFIX`] in E2B's API keys.
pub const E2B_KEY_HEX_DIGITS: usize = 40;

/// A new random API key in E2B's format: `e2b_` and 40 lowercase hex
/// digits (160 random bits), which the JavaScript `e2b` SDK's client-side
/// check accepts.
pub fn new_e2b_api_key() -> String {
    const HEX: &[u8] = b"0123456789abcdef";
    let mut rng = rand::rng();
    let digits: String = (0..E2B_KEY_HEX_DIGITS)
        .map(|_| HEX[rng.random_range(0..HEX.len())] as char)
        .collect();
    format!("{E2B_KEY_PREFIX}{digits}")
}

/// Whether `key` is in E2B's API key format (`e2b_` and 40 lowercase hex
/// digits). Other keys work with warren, the Python SDK and `curl`, but
/// versions of the JavaScript SDK refuse them before sending a request.
pub fn is_e2b_api_key(key: &str) -> bool {
    key.strip_prefix(E2B_KEY_PREFIX).is_some_and(|digits| {
        digits.len() == E2B_KEY_HEX_DIGITS
            && digits
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A random string of `[a-z0-9]`, for ids and access tokens (from the
/// thread's OS-seeded generator; on the simulation's thread, from its seed:
/// [`crate::entropy`]).
pub fn random_token(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    crate::entropy::with(|rng| {
        (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2b_api_keys() {
        let key = new_e2b_api_key();
        assert!(is_e2b_api_key(&key), "{key}");
        assert_ne!(key, new_e2b_api_key());
        assert!(is_e2b_api_key(
            "e2b_0123456789abcdef0123456789abcdef01234567"
        ));
        for bad in [
            "",
            "e2b_",
            "warren_abc",
            "e2b_0123456789abcdef0123456789abcdef0123456", // 39 digits
            "e2b_0123456789abcdef0123456789abcdef012345678", // 41 digits
            "e2b_0123456789ABCDEF0123456789abcdef01234567",
            "e2b_0123456789abcdef0123456789abcdef0123456z",
            "E2B_0123456789abcdef0123456789abcdef01234567",
        ] {
            assert!(!is_e2b_api_key(bad), "{bad}");
        }
    }

    #[test]
    fn sandbox_ids() {
        assert!(validate_sandbox_id("abc123").is_ok());
        assert!(validate_sandbox_id(&new_sandbox_id()).is_ok());
        assert!(matches!(
            validate_sandbox_id(""),
            Err(InvalidId::Empty { .. })
        ));
        assert!(matches!(
            validate_sandbox_id(&"a".repeat(65)),
            Err(InvalidId::TooLong { len: 65, .. })
        ));
        let err = validate_sandbox_id("ABC").unwrap_err();
        assert!(err.to_string().contains("[a-z0-9]"), "{err}");
        assert!(validate_sandbox_id("a-b").is_err());
        assert!(validate_sandbox_id("a.b").is_err());
        assert!(validate_sandbox_id("é").is_err());
    }

    #[test]
    fn node_ids() {
        assert!(validate_node_id("node-1").is_ok());
        assert!(validate_node_id("-node").is_err());
        assert!(validate_node_id("node-").is_err());
        assert!(validate_node_id("Node").is_err());
        assert!(validate_node_id(&"n".repeat(64)).is_err());
    }
}
