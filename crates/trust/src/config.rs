//! The flags every part shares for internal TLS, and the loaded [`Trust`]:
//! this part's certificate (re-read when its files change, so a rotated
//! certificate takes effect without a restart) and the CA(s) its peers'
//! certificates must chain to.

use crate::identity::{Identity, Role};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    client::ResolvesClientCert, client::WebPkiServerVerifier, ClientConfig, DigitallySignedStruct,
    DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// `--tls-ca`, `--tls-cert`, `--tls-key`, `--insecure-internal`: one set
/// for every part (flattened into each part's configuration).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// The cluster CA certificate (PEM; several concatenated while the CA
    /// is rotated): the other parts' certificates must chain to one of them.
    #[arg(long, env = "WARREN_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// This part's certificate (PEM, from `warren certs issue`). Re-read
    /// when the file changes, so a renewed certificate needs no restart.
    #[arg(long, env = "WARREN_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of `--tls-cert` (PEM).
    #[arg(long, env = "WARREN_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// Talk to the other parts over plain TCP, with no authentication at
    /// all: anyone who reaches a port may register nodes, read bindings and
    /// drive sandboxes. Only for a network nobody else is on, or tests.
    #[arg(long, env = "WARREN_INSECURE_INTERNAL")]
    pub insecure_internal: bool,
}

impl TlsArgs {
    /// The files of a certificate directory `warren certs` wrote for `id`.
    pub fn from_dir(dir: &Path, id: &Identity) -> TlsArgs {
        let base = crate::issue::file_base(id);
        TlsArgs {
            tls_ca: Some(dir.join(crate::issue::CA_CERT)),
            tls_cert: Some(dir.join(format!("{base}.pem"))),
            tls_key: Some(dir.join(format!("{base}.key"))),
            insecure_internal: false,
        }
    }

    /// The flags as command-line arguments (for starting a part).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (flag, path) in [
            ("--tls-ca", &self.tls_ca),
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
        ] {
            if let Some(p) = path {
                args.push(flag.to_string());
                args.push(p.display().to_string());
            }
        }
        if self.insecure_internal {
            args.push("--insecure-internal".into());
        }
        args
    }

    /// Validates the flags for a part of `role` (named `name`, when the part
    /// has a name of its own such as a node id) and loads the files.
    /// `Ok(None)` means `--insecure-internal`, which this announces loudly.
    pub fn load(&self, role: Role, name: Option<&str>) -> Result<Option<Arc<Trust>>, String> {
        let given = [&self.tls_ca, &self.tls_cert, &self.tls_key];
        if self.insecure_internal {
            if given.iter().any(|f| f.is_some()) {
                return Err(
                    "--insecure-internal and --tls-ca/--tls-cert/--tls-key exclude each other"
                        .into(),
                );
            }
            tracing::warn!(
                "INSECURE: --insecure-internal is set: this {role} talks to the other parts over \
                 plain TCP with no authentication; anyone who can reach its ports can act as any part"
            );
            return Ok(None);
        }
        let (Some(ca), Some(cert), Some(key)) = (&self.tls_ca, &self.tls_cert, &self.tls_key)
        else {
            return Err(format!(
                "the {role} needs --tls-ca, --tls-cert and --tls-key (make them with \
                 `warren certs`), or --insecure-internal to run without internal TLS"
            ));
        };
        Trust::load(role, name, ca, cert, key).map(|t| Some(Arc::new(t)))
    }
}

/// Who a part's loaded certificate says it is (`as node/node-1`), or that
/// it runs without internal TLS: for `--check-config`'s report.
pub fn describe(trust: Option<&Trust>) -> String {
    match trust {
        Some(t) => format!("as {}", t.identity),
        None => "none (--insecure-internal)".into(),
    }
}

/// This part's TLS material.
#[derive(Debug)]
pub struct Trust {
    /// Who this part's certificate says it is.
    pub identity: Identity,
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    own: Arc<OwnCert>,
}

impl Trust {
    /// Loads the files; the certificate must name `role` (and `name`, when
    /// given), chain to `ca` and be valid now.
    pub fn load(
        role: Role,
        name: Option<&str>,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Result<Trust, String> {
        let trust = Trust::read(role, name, ca, cert, key)?;
        // The certificate must chain to the CA we were given and be valid
        // now, or every peer would refuse us: say so at start rather than
        // at every handshake.
        let verifier = WebPkiClientVerifier::builder_with_provider(
            trust.roots.clone(),
            trust.provider.clone(),
        )
        .build()
        .map_err(|e| format!("{}: {e}", ca.display()))?;
        let current = trust.own.current();
        verifier
            .verify_client_cert(&current.cert[0], &current.cert[1..], UnixTime::now())
            .map_err(|e| {
                format!(
                    "{}: the certificate is not valid under {}: {e}",
                    cert.display(),
                    ca.display()
                )
            })?;
        Ok(trust)
    }

    /// [`Trust::load`] without checking that the certificate is valid now
    /// under the CA: for tools, and for tests that present a bad one.
    pub fn read(
        role: Role,
        name: Option<&str>,
        ca: &Path,
        cert: &Path,
        key: &Path,
    ) -> Result<Trust, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        let cas = read_certs(ca)?;
        for c in cas {
            roots
                .add(c)
                .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
        }
        let own = OwnCert::load(cert, key, &provider, true)?;
        let Some(identity) = own.identity.clone() else {
            return Err(format!(
                "{}: the certificate names no warren identity",
                cert.display()
            ));
        };
        if identity.role != role {
            return Err(format!(
                "{}: the certificate is a {}'s ({identity}), but this is a {role}",
                cert.display(),
                identity.role
            ));
        }
        if let Some(name) = name {
            if identity.name != name {
                return Err(format!(
                    "{}: the certificate names {identity}, but this {role} is {name:?}",
                    cert.display()
                ));
            }
        }
        Ok(Trust {
            identity,
            roots: Arc::new(roots),
            provider,
            own: Arc::new(own),
        })
    }

    /// A server configuration that requires a client certificate of one of
    /// the `accept` roles.
    pub fn server_config(&self, accept: &[Role]) -> Result<Arc<ServerConfig>, String> {
        let inner =
            WebPkiClientVerifier::builder_with_provider(self.roots.clone(), self.provider.clone())
                .build()
                .map_err(|e| e.to_string())?;
        let verifier = Arc::new(RoleClientVerifier {
            inner,
            accept: accept.to_vec(),
        });
        let config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(self.own.clone());
        Ok(Arc::new(config))
    }

    /// A client configuration that presents this part's certificate and
    /// accepts only a server certificate of `server` role, valid for the
    /// host dialed.
    pub fn client_config(&self, server: Role) -> Result<ClientConfig, String> {
        let inner =
            WebPkiServerVerifier::builder_with_provider(self.roots.clone(), self.provider.clone())
                .build()
                .map_err(|e| e.to_string())?;
        let verifier = Arc::new(RoleServerVerifier {
            inner,
            role: server,
        });
        let config = ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_cert_resolver(self.own.clone());
        Ok(config)
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// How often [`OwnCert`] looks at its files' modification times.
const RELOAD_CHECK: Duration = Duration::from_secs(5);

/// A certificate and key, re-read when the files change: this part's
/// (naming its warren identity), or the gateway's public one (naming none).
#[derive(Debug)]
pub(crate) struct OwnCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    /// The identity the certificate must keep naming across reloads;
    /// `None` for a public certificate, which names none.
    identity: Option<Identity>,
    state: Mutex<OwnState>,
}

#[derive(Debug)]
struct OwnState {
    key: Arc<CertifiedKey>,
    stamp: Option<(SystemTime, SystemTime)>,
    checked: Instant,
}

impl OwnCert {
    /// Reads `cert` and `key`; with `named`, the certificate must name a
    /// warren identity, and every renewal the same one.
    pub(crate) fn load(
        cert: &Path,
        key: &Path,
        provider: &Arc<CryptoProvider>,
        named: bool,
    ) -> Result<OwnCert, String> {
        let (certified, identity) = read_own(cert, key, provider, named)?;
        Ok(OwnCert {
            cert_path: cert.to_path_buf(),
            key_path: key.to_path_buf(),
            provider: provider.clone(),
            identity,
            state: Mutex::new(OwnState {
                key: Arc::new(certified),
                stamp: stamp(cert, key),
                checked: Instant::now(),
            }),
        })
    }

    /// The current certificate, re-read first when the files changed
    /// (checked at most every [`RELOAD_CHECK`]). A changed file that does
    /// not load, or names someone else, is logged and the old one kept.
    pub(crate) fn current(&self) -> Arc<CertifiedKey> {
        let mut state = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = stamp(&self.cert_path, &self.key_path);
            if now.is_some() && now != state.stamp {
                state.stamp = now;
                let named = self.identity.is_some();
                match read_own(&self.cert_path, &self.key_path, &self.provider, named) {
                    Ok((key, id)) if id == self.identity => {
                        tracing::info!(cert = %self.cert_path.display(), "loaded the renewed certificate");
                        state.key = Arc::new(key);
                    }
                    Ok((_, id)) => tracing::error!(cert = %self.cert_path.display(),
                        "the new certificate names {}, not {}; keeping the old one",
                        show(id.as_ref()), show(self.identity.as_ref())),
                    Err(e) => {
                        tracing::error!(error = %e, "cannot load the renewed certificate; keeping the old one")
                    }
                }
            }
        }
        state.key.clone()
    }
}

fn stamp(cert: &Path, key: &Path) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(cert)?, m(key)?))
}

fn show(id: Option<&Identity>) -> String {
    id.map_or_else(|| "no warren identity".into(), Identity::to_string)
}

fn read_own(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
    named: bool,
) -> Result<(CertifiedKey, Option<Identity>), String> {
    let chain = read_certs(cert)?;
    let identity = if named {
        Some(Identity::from_der(&chain[0]).map_err(|e| format!("{}: {e}", cert.display()))?)
    } else {
        None
    };
    // A private key another account could read is a key that may be
    // copied: refused, as ssh refuses one.
    warren_core::private::check(key).map_err(|e| e.to_string())?;
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
        rustls::pki_types::pem::Error::Io(e) => format!("cannot read {}: {e}", key.display()),
        e => format!("{}: not a PEM private key: {e}", key.display()),
    })?;
    let certified = CertifiedKey::from_der(chain, private, provider).map_err(|e| {
        format!(
            "{} and {} do not belong together: {e}",
            cert.display(),
            key.display()
        )
    })?;
    Ok((certified, identity))
}

impl ResolvesServerCert for OwnCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for OwnCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The signature checks both verifiers leave to the CA's (`self.inner`).
macro_rules! delegate_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    };
}

fn names(roles: &[Role]) -> String {
    roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(" or ")
}

/// The CA's verification, then the role: a certificate of another role is
/// refused in the handshake.
#[derive(Debug)]
struct RoleClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    accept: Vec<Role>,
}

impl ClientCertVerifier for RoleClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let id = Identity::from_der(end_entity).map_err(rustls::Error::General)?;
        if !self.accept.contains(&id.role) {
            return Err(rustls::Error::General(format!(
                "a certificate of {id} is not accepted here (only {} certificates are)",
                names(&self.accept)
            )));
        }
        Ok(ClientCertVerified::assertion())
    }

    delegate_signatures!();
}

/// The CA's verification (including the host name), then the role.
#[derive(Debug)]
struct RoleServerVerifier {
    inner: Arc<WebPkiServerVerifier>,
    role: Role,
}

impl ServerCertVerifier for RoleServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)?;
        let id = Identity::from_der(end_entity).map_err(rustls::Error::General)?;
        if id.role != self.role {
            return Err(rustls::Error::General(format!(
                "expected a {} but {} answered",
                self.role, id
            )));
        }
        Ok(ServerCertVerified::assertion())
    }

    delegate_signatures!();
}
