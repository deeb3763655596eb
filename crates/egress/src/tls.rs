//! Both TLS sides of an intercepted connection: what the proxy presents to
//! the sandbox (a leaf for the host it asked for, signed by the sandbox's
//! own CA, minted on first use and kept a day), and how it checks the real
//! destination (the host's roots plus the operator's bundle, the name the
//! sandbox asked for).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warren_trust::sandbox_ca::SandboxCa;

/// How long a minted leaf is valid, and used before another is minted.
const LEAF_DAYS: i64 = 2;
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);
/// Most leaves one sandbox's proxy keeps (a sandbox naming ever new hosts
/// that have rules cannot grow it further: the oldest goes).
const MAX_LEAVES: usize = 256;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The onward side's trust: the host's roots (as the system's TLS library
/// finds them) plus an operator's PEM bundle (`--egress-ca-file`). Empty
/// when the host has none and no bundle is named: every intercepted
/// request then fails verification (the node warns at start).
pub fn roots(extra: Option<&Path>) -> Result<rustls::RootCertStore, String> {
    let mut store = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for c in native.certs {
        // A root the verifier cannot use is skipped, as every client does.
        let _ = store.add(c);
    }
    if let Some(path) = extra {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| format!("--egress-ca-file {}: {e}", path.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--egress-ca-file {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "--egress-ca-file {}: no certificate in it",
                path.display()
            ));
        }
        for c in certs {
            store
                .add(c)
                .map_err(|e| format!("--egress-ca-file {}: {e}", path.display()))?;
        }
    }
    Ok(store)
}

/// The onward client configuration over `roots` (ALPN is set per
/// connection by the connector).
pub fn client_config(roots: Arc<rustls::RootCertStore>) -> Result<rustls::ClientConfig, String> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// What one sandbox's proxy presents: server configurations per host, with
/// a leaf from the sandbox's CA.
pub struct Leaves {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    key: rcgen::KeyPair,
    made: Mutex<HashMap<String, (Arc<rustls::ServerConfig>, Instant)>>,
}

impl std::fmt::Debug for Leaves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Leaves(..)")
    }
}

impl Leaves {
    pub fn new(ca: &SandboxCa) -> Result<Leaves, String> {
        Ok(Leaves {
            issuer: ca.issuer().map_err(|e| e.to_string())?,
            key: warren_trust::sandbox_ca::leaf_key().map_err(|e| e.to_string())?,
            made: Mutex::new(HashMap::new()),
        })
    }

    /// The server configuration presenting a leaf for `host` (ALPN `h2`
    /// and `http/1.1`).
    pub fn config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let now = Instant::now();
        if let Ok(made) = self.made.lock() {
            if let Some((cfg, at)) = made.get(host) {
                if now.duration_since(*at) < LEAF_REUSE {
                    return Ok(cfg.clone());
                }
            }
        }
        let der = warren_trust::sandbox_ca::leaf(&self.issuer, &self.key, host, LEAF_DAYS)
            .map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.serialize_der()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(der)], key)
            .map_err(|e| e.to_string())?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        if let Ok(mut made) = self.made.lock() {
            if made.len() >= MAX_LEAVES {
                if let Some(oldest) = made
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone())
                {
                    made.remove(&oldest);
                }
            }
            made.insert(host.to_string(), (cfg.clone(), now));
        }
        Ok(cfg)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn leaves_are_minted_once_per_host() {
        let ca = SandboxCa::generate("sbx").unwrap();
        let l = Leaves::new(&ca).unwrap();
        let a = l.config("a.example.com").unwrap();
        let b = l.config("a.example.com").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &l.config("10.0.0.1").unwrap()));
        for i in 0..MAX_LEAVES + 3 {
            l.config(&format!("h{i}.example.com")).unwrap();
        }
        assert!(l.made.lock().unwrap().len() <= MAX_LEAVES);
    }
}
