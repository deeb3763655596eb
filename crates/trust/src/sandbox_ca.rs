//! A sandbox's egress CA (docs/security.md, "Secrets and the egress
//! proxy"): made by the scheduler when it places the sandbox, kept sealed
//! in its store with the binding, handed to the node that hosts the
//! sandbox with each create (a move, a resume on another node). Its
//! certificate goes into the sandbox's trust store; its key never enters
//! the sandbox: the node's egress proxy signs, with it, the certificates it
//! presents to the sandbox for the hosts it intercepts.
//!
//! One CA per sandbox, so a CA key that leaks (a node's memory) lets
//! nobody impersonate a host to any other sandbox. ECDSA P-256, path
//! length 0 (it signs leaves only), valid ten years: a sandbox lives at
//! most its timeout plus its paused retention, and its CA must outlive it.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// The PEM text a sandbox's CA is stored and handed on as: its certificate
/// then its PKCS#8 private key.
#[derive(Clone)]
pub struct SandboxCa {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SandboxCa(..)")
    }
}

/// Why a CA could not be made, read or used.
#[derive(Debug, thiserror::Error)]
#[error("sandbox egress CA: {0}")]
pub struct CaError(String);

fn err(what: &str) -> impl FnOnce(rcgen::Error) -> CaError + '_ {
    move |e| CaError(format!("{what}: {e}"))
}

impl SandboxCa {
    /// A new CA for `sandbox_id`.
    pub fn generate(sandbox_id: &str) -> Result<SandboxCa, CaError> {
        let key = KeyPair::generate().map_err(err("generating the key"))?;
        let params = ca_params(sandbox_id);
        let cert = params
            .self_signed(&key)
            .map_err(err("signing the certificate"))?;
        Ok(SandboxCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA as stored: certificate then key, PEM.
    pub fn to_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }

    /// A CA as [`SandboxCa::to_pem`] wrote it.
    pub fn from_pem(pem: &str) -> Result<SandboxCa, CaError> {
        let at = pem
            .find("-----BEGIN PRIVATE KEY-----")
            .ok_or_else(|| CaError("no private key in the PEM".into()))?;
        let (cert_pem, key_pem) = pem.split_at(at);
        if !cert_pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(CaError("no certificate in the PEM".into()));
        }
        let ca = SandboxCa {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
        };
        // Both parse, and belong together.
        ca.issuer()?;
        Ok(ca)
    }

    /// The certificate alone (what the sandbox trusts).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// What signs leaves.
    pub fn issuer(&self) -> Result<Issuer<'static, KeyPair>, CaError> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(err("reading the key"))?;
        Issuer::from_ca_cert_pem(&self.cert_pem, key).map_err(err("reading the certificate"))
    }
}

fn ca_params(sandbox_id: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "warren");
    dn.push(
        DnType::CommonName,
        format!("warren egress CA for sandbox {sandbox_id}"),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(3650);
    params
}

/// A leaf certificate (DER) for `host` (a DNS name or an IP address) with
/// `key`, signed by `issuer`, valid from an hour ago for `days` days.
pub fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    key: &KeyPair,
    host: &str,
    days: i64,
) -> Result<Vec<u8>, CaError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, host);
    params.distinguished_name = dn;
    let san = match host.trim_start_matches('[').trim_end_matches(']').parse() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(
            host.try_into()
                .map_err(|e| CaError(format!("{host:?} as a host name: {e}")))?,
        ),
    };
    params.subject_alt_names.push(san);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(days);
    let cert = params
        .signed_by(key, issuer)
        .map_err(err("signing a leaf"))?;
    Ok(cert.der().to_vec())
}

/// A fresh leaf key (one per sandbox's proxy: the CA is what is per
/// sandbox; the leaf key signs handshakes only).
pub fn leaf_key() -> Result<KeyPair, CaError> {
    KeyPair::generate().map_err(err("generating a leaf key"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_round_trips_and_signs_leaves() {
        let ca = SandboxCa::generate("sbx1").unwrap();
        let pem = ca.to_pem();
        let back = SandboxCa::from_pem(&pem).unwrap();
        assert_eq!(back.cert_pem(), ca.cert_pem());
        assert!(!back.cert_pem().contains("PRIVATE KEY"));
        let issuer = back.issuer().unwrap();
        let key = leaf_key().unwrap();
        for host in ["api.example.com", "10.0.0.1", "::1"] {
            assert!(!leaf(&issuer, &key, host, 1).unwrap().is_empty());
        }
        assert!(SandboxCa::from_pem("junk").is_err());
        assert!(SandboxCa::from_pem(ca.cert_pem()).is_err());
        assert_eq!(format!("{ca:?}"), "SandboxCa(..)");
    }
}
