//! Secrets at rest: a sandbox's envd access token and its `envVars` are
//! sealed before they enter the store, so a copy of the database (a
//! backup, a file another host account could read, a replica's disk)
//! holds neither.
//!
//! Each value is sealed with ChaCha20-Poly1305 (`ring`) under the store
//! key, with a fresh random nonce, and bound to its place: the sandbox id
//! and the column are the associated data, so a sealed value copied into
//! another row or column does not open. The stored text is
//! `sealed:v1:<key id>:<base64 of nonce ‖ ciphertext ‖ tag>`, where the key
//! id is the first 8 hex digits of the key's SHA-256.
//!
//! **The key file** (`--store-key-file`) holds one or more keys, one per
//! line, 64 hex digits each (`#` starts a comment). The first seals; every
//! one opens. To rotate, put a new key on the first line and restart the
//! replicas: each reseals, in the background, every value sealed under
//! another key (and any stored before sealing existed); once
//! `warren_scheduler_store_unsealed_values` is 0 everywhere, drop the old
//! key. The file must be readable by its owner only (0600 or stricter);
//! the scheduler refuses a wider one. With the embedded SQLite store and
//! no `--store-key-file`, the scheduler makes `store.key` beside the
//! database on first start; PostgreSQL replicas must share one file, so
//! there it is required.

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::path::Path;

/// The prefix of every sealed value.
const PREFIX: &str = "sealed:v1:";

/// The sealed columns of `bindings`, named as the associated data.
pub const ACCESS_TOKEN: &str = "access_token";
pub const ENV_VARS: &str = "env_vars";
/// A volume's bearer token (`volumes.token`), sealed with the volume id in
/// the place of the sandbox id.
pub const VOLUME_TOKEN: &str = "volume_token";

/// Why the key file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the store key file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the store key file {path} is readable by other accounts (mode {mode:03o}): chmod 600 {path}")]
    Mode { path: String, mode: u32 },
    #[error("the store key file {path}, line {line}: a key is 64 hex digits (32 bytes)")]
    Bad { path: String, line: usize },
    #[error("the store key file {path} holds no key")]
    Empty { path: String },
    #[error("cannot create the store key file {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
}

/// A value could not be opened: the store is damaged, or it was sealed
/// under a key the key file no longer holds.
#[derive(Debug, thiserror::Error)]
#[error("a sealed {column} of sandbox {sandbox} does not open: {why}")]
pub struct OpenError {
    pub sandbox: String,
    pub column: &'static str,
    pub why: &'static str,
}

struct Key {
    id: String,
    key: LessSafeKey,
}

/// The store's keys (see the module doc). The first one seals.
pub struct Sealer {
    keys: Vec<Key>,
    rng: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Sealer").field("key_ids", &ids).finish()
    }
}

impl Sealer {
    /// The keys in `path`, which must be readable by its owner only.
    pub fn from_file(path: &Path) -> Result<Sealer, KeyError> {
        let shown = path.display().to_string();
        warren_core::private::check(path).map_err(|e| match e {
            warren_core::private::PrivateError::Read { source, .. } => KeyError::Read {
                path: shown.clone(),
                source,
            },
            warren_core::private::PrivateError::Mode { mode, .. } => KeyError::Mode {
                path: shown.clone(),
                mode,
            },
        })?;
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bytes = hex32(line).ok_or_else(|| KeyError::Bad {
                path: shown.clone(),
                line: i + 1,
            })?;
            keys.push(Key::new(&bytes));
        }
        if keys.is_empty() {
            return Err(KeyError::Empty { path: shown });
        }
        Ok(Sealer {
            keys,
            rng: SystemRandom::new(),
        })
    }

    /// The keys in `path`; when there is no such file, a new one with a
    /// fresh key, made readable by its owner only.
    pub fn open_or_create(path: &Path) -> Result<Sealer, KeyError> {
        if !path.exists() {
            if let Some(dir) = path
                .parent()
                .filter(|d| !d.as_os_str().is_empty() && !d.exists())
            {
                warren_core::private::dir(dir).map_err(|source| KeyError::Create {
                    path: path.display().to_string(),
                    source,
                })?;
            }
            let mut bytes = [0u8; 32];
            SystemRandom::new()
                .fill(&mut bytes)
                .map_err(|_| KeyError::Create {
                    path: path.display().to_string(),
                    source: std::io::Error::other("no randomness"),
                })?;
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let text = format!(
                "# warren scheduler store key (see --store-key-file); the first key seals\n{hex}\n"
            );
            warren_core::private::write(path, text.as_bytes()).map_err(|source| {
                KeyError::Create {
                    path: path.display().to_string(),
                    source,
                }
            })?;
        }
        Sealer::from_file(path)
    }

    /// A sealer with a fresh random key of its own, for an in-memory store
    /// that lives no longer than this process.
    pub fn ephemeral() -> Sealer {
        let mut key = [0u8; 32];
        let _ = SystemRandom::new().fill(&mut key);
        Sealer::with_key(key)
    }

    /// A sealer with `key` only (tests and benchmarks).
    pub fn with_key(key: [u8; 32]) -> Sealer {
        Sealer {
            keys: vec![Key::new(&key)],
            rng: SystemRandom::new(),
        }
    }

    /// `plain` sealed for `column` of `sandbox`.
    pub fn seal(&self, sandbox: &str, column: &'static str, plain: &str) -> String {
        let key = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        // The system's randomness does not fail on Linux once booted; a
        // zero nonce would only ever be used for this one value.
        let _ = self.rng.fill(&mut nonce);
        let mut data = plain.as_bytes().to_vec();
        let sealed = key.key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad(sandbox, column)),
            &mut data,
        );
        if sealed.is_err() {
            // Only for a value past ChaCha20's 256 GiB: never a row's.
            return String::new();
        }
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        format!(
            "{PREFIX}{}:{}",
            key.id,
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(out)
        )
    }

    /// The value `stored` holds: opened when sealed, as it is when it was
    /// stored before sealing existed.
    pub fn open(
        &self,
        sandbox: &str,
        column: &'static str,
        stored: &str,
    ) -> Result<String, OpenError> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_string());
        };
        let fail = |why| OpenError {
            sandbox: sandbox.to_string(),
            column,
            why,
        };
        let (id, body) = rest.split_once(':').ok_or(fail("no key id"))?;
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or(fail("its key is not in the store key file"))?;
        let mut data = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(body)
            .map_err(|_| fail("not base64"))?;
        if data.len() < NONCE_LEN {
            return Err(fail("too short"));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&data[..NONCE_LEN]);
        let plain = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(sandbox, column)),
                &mut data[NONCE_LEN..],
            )
            .map_err(|_| fail("it was altered, or belongs to another row"))?;
        String::from_utf8(plain.to_vec()).map_err(|_| fail("not UTF-8"))
    }

    /// The SQL `LIKE` pattern of values sealed under the key that seals now.
    pub fn current_pattern(&self) -> String {
        format!("{PREFIX}{}:%", self.keys[0].id)
    }

    /// The id of the key that seals now.
    pub fn current_id(&self) -> &str {
        &self.keys[0].id
    }

    /// Whether `stored` is sealed under the key that seals now.
    pub fn is_current(&self, stored: &str) -> bool {
        stored
            .strip_prefix(PREFIX)
            .and_then(|r| r.split_once(':'))
            .is_some_and(|(id, _)| id == self.keys[0].id)
    }
}

impl Key {
    fn new(bytes: &[u8; 32]) -> Key {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(bytes);
        let id: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        let key = match UnboundKey::new(&CHACHA20_POLY1305, bytes) {
            Ok(k) => LessSafeKey::new(k),
            // 32 bytes is ChaCha20-Poly1305's key length: this cannot fail.
            Err(_) => unreachable!("a 32-byte ChaCha20-Poly1305 key"),
        };
        Key { id, key }
    }
}

fn aad(sandbox: &str, column: &str) -> Vec<u8> {
    let mut a = b"warren-binding\0".to_vec();
    a.extend_from_slice(sandbox.as_bytes());
    a.push(0);
    a.extend_from_slice(column.as_bytes());
    a
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_open_only_where_they_were_sealed() {
        let s = Sealer::with_key([7; 32]);
        let sealed = s.seal("sbx1", "access_token", "tok");
        assert!(
            sealed.starts_with(PREFIX) && !sealed.contains("tok"),
            "{sealed}"
        );
        assert!(s.is_current(&sealed));
        assert_eq!(s.open("sbx1", "access_token", &sealed).unwrap(), "tok");
        // Another row, another column, another key, an altered byte.
        assert!(s.open("sbx2", "access_token", &sealed).is_err());
        assert!(s.open("sbx1", "env_vars", &sealed).is_err());
        assert!(Sealer::with_key([8; 32])
            .open("sbx1", "access_token", &sealed)
            .is_err());
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 2;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert!(s.open("sbx1", "access_token", &altered).is_err());
        // Two seals of one value differ (fresh nonces).
        assert_ne!(sealed, s.seal("sbx1", "access_token", "tok"));
        // A value stored before sealing is read as it is, and is not current.
        assert_eq!(s.open("sbx1", "env_vars", "{}").unwrap(), "{}");
        assert!(!s.is_current("{}"));
    }

    #[test]
    fn key_files_rotate_and_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.key");
        let first = Sealer::open_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let old = first.seal("s", "env_vars", "{\"A\":\"1\"}");
        // Rotation: a new first key; the old one still opens.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{}\n{text}", "ab".repeat(32))).unwrap();
        let rotated = Sealer::from_file(&path).unwrap();
        assert_eq!(
            rotated.open("s", "env_vars", &old).unwrap(),
            "{\"A\":\"1\"}"
        );
        assert!(!rotated.is_current(&old));
        assert!(rotated.is_current(&rotated.seal("s", "env_vars", "x")));
        // Wider than 0600: refused, naming the file.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Sealer::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("store.key") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not a key\n").unwrap();
        let e = Sealer::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }
}
