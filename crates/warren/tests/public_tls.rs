//! The gateway's public TLS listener (`--public-tls-listen`): sandboxes
//! reached host-routed as E2B's SDKs reach them,
//! `https://{port}-{id}.{domain}`, over HTTP/1.1 and h2 (ALPN), with a
//! certificate from a CA made for the test; and a command stream cut by
//! killing its sandbox ends in a reset TCP connection, not a TLS
//! close_notify that would read as a clean end.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::{create_sandbox, Http};

const KEY: &str = "e2b_5a7c9e1b3d5f7a9c2e4b6d8f0a2c4e6b8d0f1a3c";
const DOMAIN: &str = "sandboxes.test";

/// A CA and a `*.{DOMAIN}` certificate it signs, written into `dir`;
/// returns the CA certificate (DER) for the client to trust.
fn make_certs(dir: &Path) -> rustls::pki_types::CertificateDer<'static> {
    let ca_key = KeyPair::generate().expect("a CA key");
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("a key");
    let leaf = CertificateParams::new(vec![format!("*.{DOMAIN}")])
        .expect("leaf params")
        .signed_by(&key, &issuer)
        .expect("the leaf certificate");
    std::fs::write(dir.join("leaf.pem"), leaf.pem()).expect("write leaf.pem");
    warren_core::private::write(&dir.join("leaf.key"), key.serialize_pem().as_bytes())
        .expect("write leaf.key");
    ca_cert.der().clone()
}

struct Rig {
    cluster: Cluster,
    ca: rustls::pki_types::CertificateDer<'static>,
    _certs: tempfile::TempDir,
}

impl Rig {
    async fn start() -> Rig {
        let certs = tempfile::tempdir().expect("a temp dir");
        let ca = make_certs(certs.path());
        let path = |f: &str| certs.path().join(f).display().to_string();
        let cluster = Cluster::start(
            env!("CARGO_BIN_EXE_warren").as_ref(),
            Spec {
                nodes: 1,
                keys: vec![(KEY.into(), "team-a".into())],
                gateway_args: vec![
                    "--domain".into(),
                    DOMAIN.into(),
                    "--public-tls-listen".into(),
                    "127.0.0.1:0".into(),
                    "--public-tls-cert".into(),
                    path("leaf.pem"),
                    "--public-tls-key".into(),
                    path("leaf.key"),
                ],
                ..Spec::default()
            },
        )
        .await
        .expect("a cluster starts");
        Rig {
            cluster,
            ca,
            _certs: certs,
        }
    }

    /// Creates a sandbox through the plain listener; (id, envd access token).
    async fn create(&self) -> (String, String) {
        create_sandbox(&self.cluster.gateway(0), KEY).await
    }

    /// A TLS connection to the gateway's TLS listener for host `host`
    /// (its SNI), offering `alpn`; the client trusts only the test CA.
    async fn connect(&self, host: &str, alpn: &[u8]) -> TlsStream<TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).expect("the CA is usable");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tcp = TcpStream::connect(self.cluster.gateways[0].addr("gateway https"))
            .await
            .expect("the TLS listener accepts");
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).expect("a host");
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .expect("the TLS handshake succeeds with the test CA");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
        tls
    }

    async fn kill(&self, id: &str) {
        let r = Http::default()
            .send(
                Method::DELETE,
                &self.cluster.gateway(0),
                &format!("/sandboxes/{id}"),
                &[("x-api-key", KEY)],
                None,
            )
            .await
            .expect("the gateway answers");
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    }
}

/// One Connect envelope (flags 0) around a JSON message.
fn envelope(msg: &Value) -> Bytes {
    let body = msg.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

/// A `process.Process/Start` request for `sh -c script`, host-routed.
fn start(host: &str, token: &str, script: &str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::POST)
        .uri("/process.Process/Start")
        .header("host", host)
        .header("x-access-token", token)
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(Full::new(envelope(
            &json!({"process": {"cmd": "/bin/sh", "args": ["-c", script]}}),
        )))
        .expect("a request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_is_reached_host_routed_over_tls_with_http1_and_h2() {
    let rig = Rig::start().await;
    let (id, token) = rig.create().await;
    let host = format!("49983-{id}.{DOMAIN}");

    // HTTP/1.1: a command runs and its output streams back.
    let tls = rig.connect(&host, b"http/1.1").await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("HTTP/1.1 over TLS");
    tokio::spawn(conn);
    let resp = send
        .send_request(start(&host, &token, "echo hello over tls"))
        .await
        .expect("an answer");
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.expect("the whole stream");
    let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    // "hello over tls\n" in base64, as Connect's JSON carries bytes.
    assert!(text.contains("aGVsbG8gb3ZlciB0bHMK"), "{text}");
    assert!(text.contains("\"end\""), "{text}");

    // h2 by ALPN: the same sandbox, :authority routing.
    let tls = rig.connect(&host, b"h2").await;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 over TLS");
    tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("https://{host}/health"))
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let resp = send.send_request(req).await.expect("an answer");
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);

    // A host naming no sandbox is the control plane, over TLS as well.
    let api = format!("api.{DOMAIN}");
    let tls = rig.connect(&api, b"http/1.1").await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("HTTP/1.1 over TLS");
    tokio::spawn(conn);
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("/sandboxes/{id}"))
        .header("host", &api)
        .header("x-api-key", KEY)
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let resp = send.send_request(req).await.expect("an answer");
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_a_kill_ends_in_a_reset_over_tls() {
    let rig = Rig::start().await;
    let (id, token) = rig.create().await;
    let host = format!("49983-{id}.{DOMAIN}");
    let tls = rig.connect(&host, b"http/1.1").await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("HTTP/1.1 over TLS");
    let conn = tokio::spawn(conn);
    let resp = send
        .send_request(start(&host, &token, "echo started; exec sleep 600"))
        .await
        .expect("an answer");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();

    // Read until the command has printed (the stream is live), then kill.
    let mut seen = String::new();
    while !seen.contains("c3RhcnRlZAo") {
        let frame = body
            .frame()
            .await
            .expect("the stream is open")
            .expect("a frame before the kill");
        if let Some(data) = frame.data_ref() {
            seen.push_str(&String::from_utf8_lossy(data));
        }
    }
    rig.kill(&id).await;

    // The stream ends with an error, and the error is the TCP reset: a
    // close_notify would have ended it as a clean EOF instead.
    let err = loop {
        match body.frame().await {
            Some(Ok(_)) => continue,
            Some(Err(e)) => break e,
            None => panic!("the cut stream ended cleanly: {seen}"),
        }
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut kinds = Vec::new();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            kinds.push(io.kind());
        }
        source = e.source();
    }
    // hyper may report the broken body and keep the I/O error for the
    // connection task; either carries it.
    if !kinds.contains(&std::io::ErrorKind::ConnectionReset) {
        if let Ok(Err(conn_err)) = conn.await {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&conn_err);
            while let Some(e) = source {
                if let Some(io) = e.downcast_ref::<std::io::Error>() {
                    kinds.push(io.kind());
                }
                source = e.source();
            }
        }
    }
    assert!(
        kinds.contains(&std::io::ErrorKind::ConnectionReset),
        "expected a reset; got {err:?} (I/O kinds {kinds:?})"
    );
}

#[test]
fn a_key_of_another_certificate_stops_the_gateway_at_start() {
    let certs = tempfile::tempdir().expect("a temp dir");
    make_certs(certs.path());
    let other = KeyPair::generate().expect("a key");
    let other_key = certs.path().join("other.key");
    warren_core::private::write(&other_key, other.serialize_pem().as_bytes())
        .expect("write other.key");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .arg("gateway")
        .env("WARREN_GATEWAY_API_KEY", format!("{KEY}:team-a"))
        .args(["--insecure-internal", "--listen", "127.0.0.1:0"])
        .args(["--public-tls-listen", "127.0.0.1:0", "--public-tls-cert"])
        .arg(certs.path().join("leaf.pem"))
        .arg("--public-tls-key")
        .arg(&other_key)
        .output()
        .expect("the gateway runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("do not belong together") && stderr.contains("other.key"),
        "{stderr}"
    );
}
