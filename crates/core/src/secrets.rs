//! What a team secret (E2B's `/secrets`) may be: its name, its value and
//! its metadata, checked by the gateway (a 400 naming the field) and again
//! by the scheduler before anything is stored.
//!
//! A value ends up in an HTTP header of a sandbox's outbound request (the
//! egress proxy substitutes it for `${e2b.secrets.NAME}`), so it must be
//! something a header value can hold: visible ASCII, spaces and tabs, no
//! line breaks (a value with CR/LF would inject headers), at most
//! [`MAX_VALUE_LEN`] bytes. E2B's metadata bounds are its OpenAPI's.

use std::collections::BTreeMap;

/// Longest value (a header value's bound in the proxy).
pub const MAX_VALUE_LEN: usize = crate::network::rules::MAX_VALUE_LEN;
/// E2B's `SecretMetadata`: at most 32 entries ...
pub const MAX_METADATA_ENTRIES: usize = 32;
/// ... keys of at most 128 bytes ...
pub const MAX_METADATA_KEY_LEN: usize = 128;
/// ... values of at most 1024 bytes ...
pub const MAX_METADATA_VALUE_LEN: usize = 1024;
/// ... and 8192 bytes in all.
pub const MAX_METADATA_BYTES: usize = 8192;
/// What starts a secret's id; a name may not.
pub const ID_PREFIX: &str = "sec_";

/// Checks a name (E2B's `^[a-zA-Z0-9_-]+$`, 1 to 128 bytes, not `sec_...`)
/// and returns it lower-cased, as it is stored.
pub fn name(name: &str) -> Result<String, String> {
    if !crate::network::rules::is_secret_name(name) {
        return Err(format!(
            "field \"name\": {name:?} is not a secret name (1 to {} letters, digits, '_' or '-')",
            crate::network::rules::MAX_SECRET_NAME_LEN
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with(ID_PREFIX) {
        return Err(format!(
            "field \"name\": {name:?} starts with {ID_PREFIX:?}, which is reserved for secret ids"
        ));
    }
    Ok(lower)
}

/// Checks a value (see the module doc). The message never quotes it.
pub fn value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("field \"value\" is empty".into());
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(format!(
            "field \"value\" is {} bytes; at most {MAX_VALUE_LEN} are allowed",
            value.len()
        ));
    }
    if !value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(
            "field \"value\" holds a character an HTTP header value cannot (visible ASCII, \
             spaces and tabs only; no line breaks)"
                .into(),
        );
    }
    Ok(())
}

/// Checks metadata against E2B's bounds.
pub fn metadata(m: &BTreeMap<String, String>) -> Result<(), String> {
    if m.len() > MAX_METADATA_ENTRIES {
        return Err(format!(
            "field \"metadata\" has {} entries; at most {MAX_METADATA_ENTRIES} are allowed",
            m.len()
        ));
    }
    let mut total = 0;
    for (k, v) in m {
        if k.is_empty() || k.len() > MAX_METADATA_KEY_LEN {
            return Err(format!(
                "field \"metadata\": the key {k:?} must be 1 to {MAX_METADATA_KEY_LEN} bytes"
            ));
        }
        if v.len() > MAX_METADATA_VALUE_LEN {
            return Err(format!(
                "field \"metadata\": the value of {k:?} is {} bytes; at most \
                 {MAX_METADATA_VALUE_LEN} are allowed",
                v.len()
            ));
        }
        total += k.len() + v.len();
    }
    if total > MAX_METADATA_BYTES {
        return Err(format!(
            "field \"metadata\" holds {total} bytes; at most {MAX_METADATA_BYTES} are allowed"
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_values_and_metadata_are_checked() {
        assert_eq!(name("OpenAI_Key-2").unwrap(), "openai_key-2");
        for bad in ["", "a b", "a.b", "sec_x", "SEC_x", &"a".repeat(129)] {
            assert!(name(bad).is_err(), "{bad:?}");
        }
        assert!(value("Bearer abc\t1").is_ok());
        for bad in ["", "a\r\nX-Evil: 1", "a\0", "é"] {
            let e = value(bad).unwrap_err();
            assert!(!bad.is_empty() || e.contains("empty"));
            assert!(!e.contains("Evil"), "{e}");
        }
        assert!(value(&"v".repeat(MAX_VALUE_LEN + 1)).is_err());
        let mut m: BTreeMap<String, String> =
            (0..32).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(metadata(&m).is_ok());
        m.insert("k32".into(), "v".into());
        assert!(metadata(&m).unwrap_err().contains("32"));
        let big: BTreeMap<String, String> = (0..9)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(metadata(&big).unwrap_err().contains("8192"));
    }
}
