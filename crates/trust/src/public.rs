//! The gateway's public TLS: a certificate chain and its key from files
//! (an operator's, an ACME client's), served to any client — no client
//! authentication — with ALPN `h2` and `http/1.1`. The files are re-read
//! when they change, as the internal certificates are ([`crate::config`]),
//! so a renewed certificate needs no restart.

use crate::config::OwnCert;
use rustls::ServerConfig;
use std::path::Path;
use std::sync::Arc;

/// A server configuration for the public TLS listener, from `cert` (PEM:
/// the leaf first, then any intermediates) and `key` (PEM). Refuses, in
/// words naming the file, an unreadable or empty file, a key that does not
/// belong to the certificate, and a certificate that is not valid now.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let own = OwnCert::load(cert, key, &provider, false)?;
    let current = own.current();
    let (_, leaf) = x509_parser::parse_x509_certificate(&current.cert[0])
        .map_err(|e| format!("{}: not an X.509 certificate: {e}", cert.display()))?;
    let validity = leaf.validity();
    if !validity.is_valid() {
        return Err(format!(
            "{}: the certificate is not valid now (valid from {} to {})",
            cert.display(),
            validity.not_before,
            validity.not_after
        ));
    }
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(own));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    fn write_pair(dir: &Path, name: &str, params: CertificateParams) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        warren_core::private::write(Path::new(&k), key.serialize_pem().as_bytes()).unwrap();
        (c.display().to_string(), k.display().to_string())
    }

    fn load(cert: &str, key: &str) -> Result<Arc<ServerConfig>, String> {
        server_config(Path::new(cert), Path::new(key))
    }

    #[test]
    fn loads_a_pair_with_alpn() {
        let dir = tempfile::tempdir().unwrap();
        let params = CertificateParams::new(vec!["*.sandbox.example".into()]).unwrap();
        let (cert, key) = write_pair(dir.path(), "good", params);
        let config = load(&cert, &key).unwrap();
        assert_eq!(
            config.alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }

    #[test]
    fn refuses_bad_files_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let params = || CertificateParams::new(vec!["*.sandbox.example".into()]).unwrap();
        let (cert, key) = write_pair(dir.path(), "a", params());
        let (_, other_key) = write_pair(dir.path(), "b", params());

        // Missing files.
        let missing = dir.path().join("missing.pem").display().to_string();
        let err = load(&missing, &key).unwrap_err();
        assert!(
            err.contains("cannot read") && err.contains("missing.pem"),
            "{err}"
        );
        let err = load(&cert, &missing).unwrap_err();
        assert!(
            err.contains("cannot read") && err.contains("missing.pem"),
            "{err}"
        );

        // The key given as the certificate and the other way round.
        let err = load(&key, &key).unwrap_err();
        assert!(
            err.contains("no certificate") && err.contains("a.key"),
            "{err}"
        );
        {
            use std::os::unix::fs::PermissionsExt;
            // A key file other accounts may read is refused, naming the fix.
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
            let err = load(&cert, &key).unwrap_err();
            assert!(err.contains("a.key") && err.contains("chmod 600"), "{err}");
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::set_permissions(&cert, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let err = load(&cert, &cert).unwrap_err();
        assert!(
            err.contains("not a PEM private key") && err.contains("a.pem"),
            "{err}"
        );

        // Garbage.
        let junk = dir.path().join("junk.pem");
        std::fs::write(
            &junk,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let err = load(&junk.display().to_string(), &key).unwrap_err();
        assert!(err.contains("junk.pem"), "{err}");

        // A key that belongs to another certificate.
        let err = load(&cert, &other_key).unwrap_err();
        assert!(err.contains("do not belong together"), "{err}");

        // Expired.
        let mut old = params();
        old.not_before = rcgen::date_time_ymd(2000, 1, 1);
        old.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let (cert, key) = write_pair(dir.path(), "old", old);
        let err = load(&cert, &key).unwrap_err();
        assert!(
            err.contains("not valid now") && err.contains("old.pem"),
            "{err}"
        );
    }
}
