//! The egress proxy in one process, against a real HTTPS server of the
//! test's own (its own CA, which the proxy is told to trust): a sandbox's
//! client (trusting the sandbox's CA) gets its rules' headers injected,
//! over HTTP/1.1, h2 and a WebSocket upgrade; a secret updated now is used
//! by the next request on the same connection; a host without rules is
//! spliced (the client sees the server's own certificate); a placeholder
//! that does not resolve, a destination whose certificate does not
//! verify and a request for another host are refused with a clear answer
//! that never carries a value, and the server sees nothing of them.
//!
//! What the node adds around it (the redirect in the sandbox's namespace,
//! dialing as the sandbox's uid, the trust store) is tested with real
//! sandboxes in `crates/warren/tests/secrets.rs`.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use warren_core::network::rules::EgressRules;
use warren_egress::{Dialer, ResolveError, Resolver, SandboxProxy, Settings, Target};
use warren_trust::sandbox_ca::SandboxCa;

const SECRET: &str = "s3cr3t-value-7f1d";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA of the test's own and a server certificate it signs for `names`.
struct TestCa {
    cert: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    fn new(cn: &str) -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = p.self_signed(&key).unwrap();
        TestCa {
            cert: cert.der().clone(),
            issuer: rcgen::Issuer::new(p, key),
        }
    }

    fn server(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate().unwrap();
        let p =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(cfg)
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut r = rustls::RootCertStore::empty();
        r.add(self.cert.clone()).unwrap();
        r
    }
}

/// What the test server saw: every request's version, path and headers.
type Seen = Arc<Mutex<Vec<serde_json::Value>>>;

/// An HTTPS echo server (h1, h2, WebSocket echo) on 127.0.0.1.
async fn upstream(tls: Arc<rustls::ServerConfig>, seen: Seen) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let (tls, seen) = (tls.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(s) = tokio_rustls::TlsAcceptor::from(tls).accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req| echo(req, seen.clone()));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

async fn echo(
    mut req: Request<Incoming>,
    seen: Seen,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let headers: BTreeMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let record = serde_json::json!({
        "version": format!("{:?}", req.version()),
        "path": req.uri().path(),
        "headers": headers,
    });
    seen.lock().unwrap().push(record.clone());
    if req.headers().contains_key(http::header::UPGRADE) {
        // A WebSocket-ish upgrade: echo raw bytes back.
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        return Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(Full::new(Bytes::new()))
            .unwrap());
    }
    Ok(Response::new(Full::new(Bytes::from(record.to_string()))))
}

/// Dials what the proxy asks for on loopback (the node dials as the
/// sandbox's uid; here every target is this machine).
struct LoopbackDialer {
    gateway: Option<SocketAddr>,
}

impl Dialer for LoopbackDialer {
    fn dial(&self, target: Target) -> BoxFuture<'static, std::io::Result<TcpStream>> {
        let gateway = self.gateway;
        Box::pin(async move {
            match target {
                Target::Out(a) | Target::Local(a) => TcpStream::connect(a).await,
                Target::Gateway => match gateway {
                    Some(g) => TcpStream::connect(g).await,
                    None => Err(std::io::Error::other("no gateway")),
                },
            }
        })
    }
}

/// The team's secrets, and how often they were asked for.
#[derive(Default)]
struct Vault {
    values: Mutex<BTreeMap<String, String>>,
    asked: Mutex<usize>,
    down: Mutex<bool>,
}

/// The proxy's handle on the vault.
struct VaultResolver(Arc<Vault>);

impl Resolver for VaultResolver {
    fn resolve(
        &self,
        _sandbox_id: &str,
        _generation: u64,
        names: Vec<String>,
    ) -> BoxFuture<'static, Result<BTreeMap<String, String>, ResolveError>> {
        *self.0.asked.lock().unwrap() += 1;
        let down = *self.0.down.lock().unwrap();
        let values = self.0.values.lock().unwrap().clone();
        Box::pin(async move {
            if down {
                return Err(ResolveError::Unavailable("scheduler down".into()));
            }
            let mut out = BTreeMap::new();
            for n in names {
                match values.get(&n) {
                    Some(v) => {
                        out.insert(n, v.clone());
                    }
                    None => return Err(ResolveError::Missing(n)),
                }
            }
            Ok(out)
        })
    }
}

struct World {
    proxy: Arc<SandboxProxy>,
    /// The sandbox's CA (what its clients trust).
    sandbox_ca: SandboxCa,
    server_ca: TestCa,
    upstream: SocketAddr,
    /// A server whose certificate comes from a CA nobody trusts.
    rogue: SocketAddr,
    seen: Seen,
    rogue_seen: Seen,
    vault: Arc<Vault>,
    /// What the proxy told the node's metrics.
    events: Arc<Mutex<Vec<&'static str>>>,
}

fn rules(json: &str) -> EgressRules {
    serde_json::from_str(json).unwrap()
}

async fn world() -> World {
    let server_ca = TestCa::new("test server CA");
    let seen: Seen = Default::default();
    let upstream = upstream(
        server_ca.server(&["api.test", "other.test", "127.0.0.1"]),
        seen.clone(),
    )
    .await;
    let rogue_seen: Seen = Default::default();
    let rogue = upstream_with(
        TestCa::new("rogue CA").server(&["rogue.test"]),
        rogue_seen.clone(),
    )
    .await;
    let sandbox_ca = SandboxCa::generate("sbxtest").unwrap();
    let events: Arc<Mutex<Vec<&'static str>>> = Default::default();
    let vault = Arc::new(Vault::default());
    vault
        .values
        .lock()
        .unwrap()
        .insert("api-key".into(), SECRET.into());
    let settings = Arc::new(Settings {
        client: Arc::new(warren_egress::tls::client_config(Arc::new(server_ca.roots())).unwrap()),
        sandbox_domain: Some("sbx.test".into()),
        observe: Some(Arc::new({
            let events = events.clone();
            move |e| events.lock().unwrap().push(e.label())
        })),
    });
    let proxy = SandboxProxy::new(
        "sbxtest",
        1,
        settings,
        &sandbox_ca,
        rules(
            r#"{"api.test":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.API-KEY}","X-Static":"one"}}},
                            {"transform":{"headers":{"x-static":"two"}}}],
                "rogue.test":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.api-key}"}}}],
                "missing.test":[{"transform":{"headers":{"Authorization":"${e2b.secrets.nope}"}}}]}"#,
        ),
        Arc::new(LoopbackDialer { gateway: None }),
        Arc::new(VaultResolver(vault.clone())),
    )
    .unwrap();
    World {
        proxy,
        sandbox_ca,
        server_ca,
        upstream,
        rogue,
        seen,
        rogue_seen,
        vault,
        events,
    }
}

async fn upstream_with(tls: Arc<rustls::ServerConfig>, seen: Seen) -> SocketAddr {
    upstream(tls, seen).await
}

impl World {
    /// A connection from the sandbox, as if it had connected to `orig`:
    /// the proxy handles the accepted end.
    async fn connect(&self, orig: SocketAddr) -> TcpStream {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let proxy = self.proxy.clone();
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            proxy.handle(s, orig).await;
        });
        TcpStream::connect(addr).await.unwrap()
    }

    /// TLS to `name` from the sandbox, trusting `roots`, offering `alpn`.
    async fn tls(
        &self,
        orig: SocketAddr,
        name: &str,
        roots: rustls::RootCertStore,
        alpn: &[&[u8]],
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, std::io::Error> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
        let tcp = self.connect(orig).await;
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
            .await
    }

    fn sandbox_roots(&self) -> rustls::RootCertStore {
        let mut r = rustls::RootCertStore::empty();
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(
            self.sandbox_ca.cert_pem().as_bytes(),
        )
        .unwrap();
        r.add(der).unwrap();
        r
    }
}

/// One request over an h1 or h2 connection; (status, body).
async fn send(
    io: tokio_rustls::client::TlsStream<TcpStream>,
    h2: bool,
    host: &str,
    paths: &[&str],
) -> Vec<(StatusCode, String)> {
    let io = TokioIo::new(io);
    let mut out = Vec::new();
    if h2 {
        let (mut tx, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        for p in paths {
            let req = Request::get(format!("https://{host}{p}"))
                .body(Empty::<Bytes>::new())
                .unwrap();
            let r = tx.send_request(req).await.unwrap();
            let status = r.status();
            let body = r.into_body().collect().await.unwrap().to_bytes();
            out.push((status, String::from_utf8_lossy(&body).to_string()));
        }
    } else {
        let (mut tx, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        for p in paths {
            let req = Request::get(*p)
                .header("host", host)
                .body(Empty::<Bytes>::new())
                .unwrap();
            let r = tx.send_request(req).await.unwrap();
            let status = r.status();
            let body = r.into_body().collect().await.unwrap().to_bytes();
            out.push((status, String::from_utf8_lossy(&body).to_string()));
        }
    }
    out
}

#[tokio::test]
async fn headers_are_injected_over_h1_and_h2_and_follow_the_current_secret() {
    let w = world().await;
    for h2 in [false, true] {
        let alpn: &[&[u8]] = if h2 { &[b"h2"] } else { &[b"http/1.1"] };
        let io = w
            .tls(w.upstream, "api.test", w.sandbox_roots(), alpn)
            .await
            .expect("the sandbox trusts the proxy's certificate for api.test");
        let answers = send(io, h2, "api.test", &["/one"]).await;
        let (status, body) = &answers[0];
        assert_eq!(*status, StatusCode::OK, "{body}");
        let seen: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(seen["headers"]["authorization"], format!("Bearer {SECRET}"));
        // Rules apply in order: the later one replaces the earlier's.
        assert_eq!(seen["headers"]["x-static"], "two");
        let want = if h2 { "HTTP/2.0" } else { "HTTP/1.1" };
        assert_eq!(seen["version"], want, "the server saw {body}");
    }
    // Rotated: the next request on an open connection uses the new value.
    let io = w
        .tls(w.upstream, "api.test", w.sandbox_roots(), &[b"h2"])
        .await
        .unwrap();
    let io = TokioIo::new(io);
    let (mut tx, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    tokio::spawn(conn);
    for value in ["v1-a", "v2-b"] {
        w.vault
            .values
            .lock()
            .unwrap()
            .insert("api-key".into(), value.into());
        let r = tx
            .send_request(
                Request::get("https://api.test/rot")
                    .body(Empty::<Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(seen["headers"]["authorization"], format!("Bearer {value}"));
    }
}

#[tokio::test]
async fn a_host_without_rules_is_spliced_with_the_servers_own_certificate() {
    let w = world().await;
    // Trusting only the server's CA: the proxy's certificate would not do.
    let io = w
        .tls(
            w.upstream,
            "other.test",
            w.server_ca.roots(),
            &[b"http/1.1"],
        )
        .await
        .expect("the server's own certificate reaches the sandbox");
    let answers = send(io, false, "other.test", &["/plain"]).await;
    let seen: serde_json::Value = serde_json::from_str(&answers[0].1).unwrap();
    assert!(seen["headers"].get("authorization").is_none(), "{seen}");
    assert_eq!(w.events.lock().unwrap().first(), Some(&"spliced"));
    // And a host with rules is intercepted: the server's CA alone fails.
    assert!(w
        .tls(w.upstream, "api.test", w.server_ca.roots(), &[b"http/1.1"])
        .await
        .is_err());
}

#[tokio::test]
async fn refusals_are_clear_never_carry_a_value_and_send_nothing() {
    let w = world().await;
    let before = w.seen.lock().unwrap().len();
    // An unknown secret.
    let io = w
        .tls(
            w.upstream,
            "missing.test",
            w.sandbox_roots(),
            &[b"http/1.1"],
        )
        .await
        .unwrap();
    let (status, body) = send(io, false, "missing.test", &["/x"]).await.remove(0);
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(
        body.contains("${e2b.secrets.nope}") && body.contains("no secret named"),
        "{body}"
    );
    // The scheduler unreachable: 503, nothing sent.
    *w.vault.down.lock().unwrap() = true;
    let io = w
        .tls(w.upstream, "api.test", w.sandbox_roots(), &[b"http/1.1"])
        .await
        .unwrap();
    let (status, body) = send(io, false, "api.test", &["/x"]).await.remove(0);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    *w.vault.down.lock().unwrap() = false;
    // Another host on an intercepted connection.
    let io = w
        .tls(w.upstream, "api.test", w.sandbox_roots(), &[b"http/1.1"])
        .await
        .unwrap();
    let (status, body) = send(io, false, "other.test", &["/x"]).await.remove(0);
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{body}");
    assert_eq!(
        w.seen.lock().unwrap().len(),
        before,
        "the server saw a refused request"
    );
    // A destination whose certificate does not verify.
    let io = w
        .tls(w.rogue, "rogue.test", w.sandbox_roots(), &[b"http/1.1"])
        .await
        .unwrap();
    let (status, body) = send(io, false, "rogue.test", &["/x"]).await.remove(0);
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(body.contains("certificate"), "{body}");
    assert!(w.rogue_seen.lock().unwrap().is_empty());
    // A value a header cannot hold is never sent, nor quoted.
    w.vault
        .values
        .lock()
        .unwrap()
        .insert("api-key".into(), "bad\r\nX-Evil: 1".into());
    let io = w
        .tls(w.upstream, "api.test", w.sandbox_roots(), &[b"http/1.1"])
        .await
        .unwrap();
    let (status, body) = send(io, false, "api.test", &["/x"]).await.remove(0);
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(!body.contains("Evil") && !body.contains("bad"), "{body}");
    assert_eq!(w.seen.lock().unwrap().len(), before);
    assert!(!body.contains(SECRET));
    let events = w.events.lock().unwrap().clone();
    assert_eq!(
        events.iter().filter(|e| **e == "refused").count(),
        5,
        "{events:?}"
    );
    assert!(!events.contains(&"forwarded"), "{events:?}");
}

#[tokio::test]
async fn a_websocket_upgrade_passes_with_its_headers() {
    let w = world().await;
    let io = w
        .tls(w.upstream, "api.test", w.sandbox_roots(), &[b"http/1.1"])
        .await
        .unwrap();
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn.with_upgrades());
    let req = Request::get("/ws")
        .header("host", "api.test")
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let mut r = tx.send_request(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::SWITCHING_PROTOCOLS);
    let up = hyper::upgrade::on(&mut r).await.unwrap();
    let mut io = TokioIo::new(up);
    io.write_all(b"ping through the proxy").await.unwrap();
    let mut buf = [0u8; 64];
    let n = io.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"ping through the proxy");
    let seen = w.seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(seen["path"], "/ws");
    assert_eq!(seen["headers"]["authorization"], format!("Bearer {SECRET}"));
}
