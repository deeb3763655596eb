//! The sandbox's egress CA in its trust store: the node hands envd the
//! CA's certificate (never its key) at start, and envd, as the sandbox's
//! root, installs it before it serves — Debian's way: the certificate in
//! `/usr/local/share/ca-certificates/` (so an `update-ca-certificates` run
//! later keeps it) and appended to the bundle `/etc/ssl/certs/ca-certificates.crt`
//! that OpenSSL, curl, Python's `ssl` and Go read. Runtimes with a root
//! store of their own are pointed at them through the defaults of the
//! environment processes get (a variable the template or the create set
//! wins): `NODE_EXTRA_CA_CERTS` (Node.js), `REQUESTS_CA_BUNDLE`
//! (requests) and `SSL_CERT_FILE` (httpx, OpenSSL).
//!
//! In the bundle the certificate sits between two marker lines, and an
//! install replaces whatever is between markers: a sandbox trusts its own
//! egress CA only, not the one a fork's parent, a snapshot's source
//! sandbox or a template build's sandbox left in the files it was made
//! from. Installing again (a boot after a filesystem-only pause, on this
//! node or another) changes nothing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Where the certificate is written, inside the sandbox.
pub const CA_FILE: &str = "/usr/local/share/ca-certificates/warren-egress-ca.crt";
/// The system bundle it is appended to.
pub const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The lines around it there (text outside a PEM block is ignored by
/// every reader of the bundle).
const BEGIN: &str = "# warren sandbox egress CA: begin";
const END: &str = "# warren sandbox egress CA: end";

/// Installs `pem` under `root` and adds the environment defaults to `env`.
/// An error names the file; the sandbox runs without it (its egress
/// rules' hosts then fail verification).
pub fn install(root: &Path, pem: &str, env: &mut BTreeMap<String, String>) -> Result<(), String> {
    if !pem.contains("-----BEGIN CERTIFICATE-----") || pem.contains("PRIVATE KEY") {
        return Err("the CA bundle is not a PEM certificate".into());
    }
    let inside = |p: &str| root.join(p.trim_start_matches('/'));
    let ca = inside(CA_FILE);
    if let Some(dir) = ca.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(&ca, pem).map_err(|e| format!("{}: {e}", ca.display()))?;
    env.entry("NODE_EXTRA_CA_CERTS".into())
        .or_insert_with(|| CA_FILE.into());
    let bundle = inside(BUNDLE);
    let Ok(have) = std::fs::read_to_string(&bundle) else {
        // No Debian bundle in this template: the certificate file alone.
        return Ok(());
    };
    let want = with_ca(&have, pem);
    if want != have {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&bundle)
            .map_err(|e| format!("{}: {e}", bundle.display()))?;
        f.write_all(want.as_bytes())
            .map_err(|e| format!("{}: {e}", bundle.display()))?;
    }
    for var in ["REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"] {
        env.entry(var.into()).or_insert_with(|| BUNDLE.into());
    }
    Ok(())
}

/// `bundle` with every marked block taken out and `pem`'s appended.
fn with_ca(bundle: &str, pem: &str) -> String {
    let mut out = String::with_capacity(bundle.len() + pem.len() + 80);
    let mut inside = false;
    for line in bundle.lines() {
        match line.trim() {
            BEGIN => inside = true,
            END => inside = false,
            _ if !inside => {
                out.push_str(line);
                out.push('\n');
            }
            _ => {}
        }
    }
    out.push_str(&format!("{BEGIN}\n{}\n{END}\n", pem.trim()));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_ca_goes_in_once_and_the_environment_points_at_it() {
        let root = tempfile::tempdir().unwrap();
        let certs = root.path().join("etc/ssl/certs");
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::write(
            certs.join("ca-certificates.crt"),
            "-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----",
        )
        .unwrap();
        let mut env = BTreeMap::from([("SSL_CERT_FILE".to_string(), "/mine.pem".to_string())]);
        install(root.path(), PEM, &mut env).unwrap();
        install(root.path(), PEM, &mut env).unwrap();
        let bundle = std::fs::read_to_string(certs.join("ca-certificates.crt")).unwrap();
        assert_eq!(bundle.matches("MIIB").count(), 1, "{bundle}");
        assert!(
            bundle
                .starts_with("-----BEGIN CERTIFICATE-----\nA\n-----END CERTIFICATE-----\n# warren"),
            "{bundle}"
        );
        // Another sandbox's CA (a fork's, a snapshot's) replaces it.
        let other = PEM.replace("MIIB", "MIIC");
        install(root.path(), &other, &mut env).unwrap();
        let bundle = std::fs::read_to_string(certs.join("ca-certificates.crt")).unwrap();
        assert!(
            !bundle.contains("MIIB") && bundle.contains("MIIC") && bundle.contains("\nA\n"),
            "{bundle}"
        );
        assert_eq!(env["SSL_CERT_FILE"], "/mine.pem");
        assert_eq!(env["REQUESTS_CA_BUNDLE"], BUNDLE);
        assert_eq!(env["NODE_EXTRA_CA_CERTS"], CA_FILE);
        assert!(root.path().join(CA_FILE.trim_start_matches('/')).is_file());
        assert!(install(root.path(), "-----BEGIN PRIVATE KEY-----", &mut env).is_err());
    }
}
