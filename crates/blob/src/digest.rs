//! A blob's name: `sha256-<64 lowercase hex>`, the spelling
//! `warren_template` uses for its blobs and records.

use std::fmt;
use std::str::FromStr;

/// The SHA-256 of a blob's bytes, spelled `sha256-<64 lowercase hex>`.
///
/// Only the canonical spelling parses (lowercase, exactly 64 digits), so one
/// blob has one name and one object key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(into = "String")]
pub struct Digest(String);

/// Why a string is not a [`Digest`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a blob digest (sha256- and 64 lowercase hex digits)")]
pub struct BadDigest(String);

/// The prefix every digest starts with.
const PREFIX: &str = "sha256-";

impl Digest {
    /// The digest of a finished SHA-256.
    pub fn from_sha256(bytes: [u8; 32]) -> Digest {
        let mut s = String::with_capacity(PREFIX.len() + 64);
        s.push_str(PREFIX);
        for b in bytes {
            s.push(char::from(HEX[usize::from(b >> 4)]));
            s.push(char::from(HEX[usize::from(b & 0xf)]));
        }
        Digest(s)
    }

    /// `hex` (64 lowercase hex digits) as a digest.
    pub fn from_hex(hex: &str) -> Result<Digest, BadDigest> {
        if is_hex64(hex) {
            Ok(Digest(format!("{PREFIX}{hex}")))
        } else {
            Err(BadDigest(hex.chars().take(80).collect()))
        }
    }

    /// `sha256-<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits alone (the object key's last segment).
    pub fn hex(&self) -> &str {
        &self.0[PREFIX.len()..]
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl FromStr for Digest {
    type Err = BadDigest;

    fn from_str(s: &str) -> Result<Digest, BadDigest> {
        match s.strip_prefix(PREFIX) {
            Some(hex) if is_hex64(hex) => Ok(Digest(s.to_string())),
            // Cut: a caller may hand anything in, a whole file even.
            _ => Err(BadDigest(s.chars().take(80).collect())),
        }
    }
}

impl TryFrom<String> for Digest {
    type Error = BadDigest;

    fn try_from(s: String) -> Result<Digest, BadDigest> {
        s.parse()
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

impl AsRef<str> for Digest {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parses_only_the_canonical_spelling() {
        let d: Digest = EMPTY.parse().expect("canonical");
        assert_eq!(d.as_str(), EMPTY);
        assert_eq!(d.to_string(), EMPTY);
        assert_eq!(d.hex(), &EMPTY[7..]);
        assert_eq!(Digest::from_hex(d.hex()), Ok(d.clone()));
        for bad in [
            "",
            "sha256-",
            &EMPTY[7..],
            &EMPTY.to_uppercase(),
            &EMPTY.replace("sha256-", "sha512-"),
            &EMPTY[..EMPTY.len() - 1],
            &format!("{EMPTY}0"),
            &EMPTY.replace('e', "g"),
            "sha256-../../etc/passwd",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn from_sha256_spells_lowercase_hex() {
        use sha2::Digest as _;
        let d = Digest::from_sha256(sha2::Sha256::digest(b"").into());
        assert_eq!(d.as_str(), EMPTY);
    }

    #[test]
    fn serde_checks_what_it_reads() {
        let d: Digest = EMPTY.parse().expect("canonical");
        let json = serde_json::to_string(&d).expect("serializes");
        assert_eq!(json, format!("\"{EMPTY}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).expect("reads"), d);
        assert!(serde_json::from_str::<Digest>("\"sha256-00\"").is_err());
    }
}
