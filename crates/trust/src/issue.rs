//! The cluster CA and the certificates it signs.
//!
//! Keys are ECDSA P-256. A part's certificate is valid for both TLS server
//! and client authentication (every part is both), names the part in a
//! `warren://<role>/<name>` URI and lists the hosts (DNS names or IP
//! addresses) it is reached at.

use crate::identity::Identity;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// A certificate-making failure, naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Rcgen { what: String, source: rcgen::Error },
    #[error("{0}")]
    Invalid(String),
}

fn rc(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> IssueError {
    let what = what.into();
    move |source| IssueError::Rcgen { what, source }
}

/// A certificate and its private key, both PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// From a minute ago (clock skew) for `days` days.
    pub fn days(days: u32) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - Duration::minutes(1),
            not_after: now + Duration::days(i64::from(days)),
        }
    }
}

/// The cluster CA: its certificate and the key that signs with it.
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// The CA's file names in a certificate directory.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";

impl Ca {
    /// A new self-signed CA valid for `validity`.
    pub fn generate(validity: Validity) -> Result<Ca, IssueError> {
        let key = KeyPair::generate().map_err(rc("generating the CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "warren cluster CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        let cert = params
            .self_signed(&key)
            .map_err(rc("signing the CA certificate"))?;
        let key_pem = key.serialize_pem();
        Ok(Ca {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA in `dir` (`ca.pem`, `ca.key`).
    pub fn load(dir: &Path) -> Result<Ca, IssueError> {
        let cert_pem = read(&dir.join(CA_CERT))?;
        let key_pem = read(&dir.join(CA_KEY))?;
        let key = KeyPair::from_pem(&key_pem).map_err(rc(format!(
            "{} is not a private key",
            dir.join(CA_KEY).display()
        )))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(rc(format!(
            "{} is not a CA certificate",
            dir.join(CA_CERT).display()
        )))?;
        Ok(Ca {
            cert_pem,
            key_pem,
            issuer,
        })
    }

    /// The CA in `dir`, made there first if it has none.
    pub fn load_or_create(dir: &Path, validity: Validity) -> Result<Ca, IssueError> {
        if dir.join(CA_CERT).exists() {
            return Ca::load(dir);
        }
        let ca = Ca::generate(validity)?;
        ca.save(dir)?;
        Ok(ca)
    }

    /// Writes `ca.pem` and `ca.key` (0600) into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), IssueError> {
        create_dir(dir)?;
        write(&dir.join(CA_CERT), &self.cert_pem, 0o644)?;
        write(&dir.join(CA_KEY), &self.key_pem, 0o600)
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate for `id`, reachable at `hosts` (DNS names or IPs).
    pub fn issue(
        &self,
        id: &Identity,
        hosts: &[String],
        validity: Validity,
    ) -> Result<Issued, IssueError> {
        let key = KeyPair::generate().map_err(rc("generating a key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, id.uri());
        params.distinguished_name = dn;
        let uri = id
            .uri()
            .try_into()
            .map_err(rc(format!("{} as a URI name", id.uri())))?;
        params.subject_alt_names.push(SanType::URI(uri));
        for host in hosts {
            let san = match host.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(
                    host.as_str()
                        .try_into()
                        .map_err(rc(format!("{host:?} as a host name")))?,
                ),
            };
            params.subject_alt_names.push(san);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = validity.not_before;
        params.not_after = validity.not_after;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rc(format!("signing the certificate of {id}")))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl Issued {
    /// Writes `<dir>/<base>.pem` and `<dir>/<base>.key` (0600); returns
    /// both paths.
    pub fn save(&self, dir: &Path, base: &str) -> Result<(PathBuf, PathBuf), IssueError> {
        create_dir(dir)?;
        let cert = dir.join(format!("{base}.pem"));
        let key = dir.join(format!("{base}.key"));
        write(&cert, &self.cert_pem, 0o644)?;
        write(&key, &self.key_pem, 0o600)?;
        Ok((cert, key))
    }
}

/// The file base name `warren certs` gives a part's certificate:
/// `<role>-<name>`.
pub fn file_base(id: &Identity) -> String {
    format!("{}-{}", id.role, id.name)
}

fn read(path: &Path) -> Result<String, IssueError> {
    std::fs::read_to_string(path).map_err(|source| IssueError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn create_dir(dir: &Path) -> Result<(), IssueError> {
    std::fs::create_dir_all(dir).map_err(|source| IssueError::Write {
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes `text` to `path` with `mode`, replacing it atomically so that a
/// part reloading its files never reads half of one.
fn write(path: &Path, text: &str, mode: u32) -> Result<(), IssueError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let err = |source| IssueError::Write {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    f.sync_all().map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

/// Hosts every certificate of a one-machine cluster is valid for.
pub const LOCAL_HOSTS: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

/// For a cluster on one machine (`warren dev`, tests): the CA in `dir`
/// (made on first use, valid 10 years) and a fresh certificate for each
/// of `parts`, valid for [`LOCAL_HOSTS`] for a year.
pub fn local_cluster(dir: &Path, parts: &[Identity]) -> Result<(), IssueError> {
    let ca = Ca::load_or_create(dir, Validity::days(3650))?;
    let hosts: Vec<String> = LOCAL_HOSTS.iter().map(|h| h.to_string()).collect();
    for id in parts {
        ca.issue(id, &hosts, Validity::days(365))?
            .save(dir, &file_base(id))?;
    }
    Ok(())
}
