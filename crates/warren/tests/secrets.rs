//! Secrets that never enter a sandbox: E2B's secrets API and egress rules
//! with the real `e2b` SDK through a gateway (`tests/e2b/egress_rules.py`),
//! against an HTTPS server of the test's own in a network namespace (its
//! own CA, which the node is told to trust with `--egress-ca-file`; the
//! sandbox does not trust it): a `curl` in an isolated sandbox gets
//! `Authorization: Bearer <value>` injected (h2), the next request after
//! an update carries the new value, a host without rules sees the
//! sandbox's own TLS, an unknown or another team's secret and a
//! destination whose certificate does not verify are refused at the
//! proxy, a WebSocket passes with the header, a `denyOut` covering the
//! server stops the proxy too, rules replaced live and kept across a
//! frozen and a filesystem-only pause (the same CA); and inside the sandbox
//! neither the environment, files, `/proc`, the proxy's listener nor its
//! error messages show a value.
//!
//! The Rust side checks what the server saw (the injected headers on the
//! requests that should carry them, nothing of the refused ones) and that
//! no file the cluster left (the scheduler's database, every part's log,
//! the nodes' data) holds a value. Needs what the security suite needs
//! (root, cgroups, slirp4netns, nftables, `ip`, the `base` template).

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;

const KEY: &str = "e2b_4c6e8a0b2d4f6a8c0e2b4d6f8a0c2e4b6d8f0a1c";
const OTHER_KEY: &str = "e2b_5d7f9b1c3e5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e";

/// What the server saw, one JSON object per request.
type Seen = Arc<Mutex<Vec<serde_json::Value>>>;

/// A CA of the test's own.
struct Ca {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = rcgen::KeyPair::generate().expect("a CA key");
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = p.self_signed(&key).expect("the CA certificate");
        Ca {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(p, key),
        }
    }

    /// A server configuration for `names` (ALPN h2 and http/1.1).
    fn server(&self, names: &[&str]) -> Arc<rustls::ServerConfig> {
        let key = rcgen::KeyPair::generate().expect("a key");
        let cert =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params")
                .signed_by(&key, &self.issuer)
                .expect("a certificate");
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("a server config");
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(cfg)
    }
}

/// Two HTTPS servers on port 443 in a network namespace of their own,
/// joined to the host by a veth pair: `target` (certificate from `ca` for
/// the test's hosts) and `rogue` (from a CA nobody trusts). Routable from
/// the host, none of the host's own addresses (which sandboxes are
/// refused). Removed on drop.
struct Servers {
    netns: String,
    target_ip: String,
    rogue_ip: String,
    ca: Ca,
    seen: Seen,
    rogue_seen: Seen,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("ip runs");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Servers {
    async fn start() -> Servers {
        let tag = format!("{}", std::process::id() % 100_000);
        // 198.19.0.0/16 is for benchmarks: never a real destination. A /29:
        // the host .1, the servers .2 and .3.
        let third = std::process::id() % 250;
        let net = |last: u32| format!("198.19.{third}.{}", 200 + last);
        let (host_ip, target_ip, rogue_ip) = (net(1), net(2), net(3));
        let netns = format!("wrn-sec-{tag}");
        let (host_if, ns_if) = (format!("wrnsh{tag}"), format!("wrnsp{tag}"));
        // A run killed before its drop left it.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &netns])
            .stderr(std::process::Stdio::null())
            .status();
        ip(&["netns", "add", &netns]);
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &netns,
        ]);
        ip(&["addr", "add", &format!("{host_ip}/29"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        let ns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &netns, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        ns(&["addr", "add", &format!("{target_ip}/29"), "dev", &ns_if]);
        ns(&["addr", "add", &format!("{rogue_ip}/29"), "dev", &ns_if]);
        ns(&["link", "set", &ns_if, "up"]);
        ns(&["link", "set", "lo", "up"]);
        ns(&["route", "add", "default", "via", &host_ip]);
        let ca = Ca::new("warren test target CA");
        let good = ca.server(&[
            "api.test",
            "other.test",
            "ws.test",
            "missing.test",
            "theirs.test",
        ]);
        let rogue = Ca::new("nobody trusts this CA").server(&["bad.test"]);
        let (seen, rogue_seen): (Seen, Seen) = Default::default();
        let ns_file = std::fs::File::open(format!("/var/run/netns/{netns}")).expect("the netns");
        let tasks = vec![
            serve(listen_in(&ns_file, &target_ip), good, seen.clone()),
            serve(listen_in(&ns_file, &rogue_ip), rogue, rogue_seen.clone()),
        ];
        Servers {
            netns,
            target_ip,
            rogue_ip,
            ca,
            seen,
            rogue_seen,
            tasks,
        }
    }

    fn seen(&self) -> Vec<serde_json::Value> {
        self.seen.lock().expect("seen").clone()
    }
}

/// A listener on `addr:443` inside the network namespace `ns`.
fn listen_in(ns: &std::fs::File, addr: &str) -> tokio::net::TcpListener {
    let ns = ns.try_clone().expect("the netns descriptor");
    let addr = format!("{addr}:443");
    let l = std::thread::spawn(move || {
        nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        let l = std::net::TcpListener::bind(&addr).expect("bind in the netns");
        l.set_nonblocking(true).expect("non-blocking");
        l
    })
    .join()
    .expect("the netns thread");
    tokio::net::TcpListener::from_std(l).expect("a tokio listener")
}

fn serve(
    l: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    seen: Seen,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let (tls, seen) = (tls.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(s) = tokio_rustls::TlsAcceptor::from(tls).accept(s).await else {
                    return;
                };
                let sni = s.get_ref().1.server_name().unwrap_or("").to_string();
                let svc =
                    hyper::service::service_fn(move |req| handle(req, sni.clone(), seen.clone()));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(s), svc)
                    .await;
            });
        }
    })
}

/// Echoes what it got as JSON; a WebSocket upgrade is accepted and echoes
/// text messages.
async fn handle(
    mut req: Request<Incoming>,
    sni: String,
    seen: Seen,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let headers: BTreeMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let record = serde_json::json!({
        "sni": sni,
        "version": format!("{:?}", req.version()),
        "path": req.uri().path(),
        "headers": headers,
    });
    seen.lock().expect("seen").push(record.clone());
    if let Some(key) = req.headers().get("sec-websocket-key").cloned() {
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            use futures_util::{SinkExt, StreamExt};
            let Ok(up) = on.await else { return };
            let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                TokioIo::new(up),
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            while let Some(Ok(m)) = ws.next().await {
                if m.is_text() && ws.send(m).await.is_err() {
                    break;
                }
            }
        });
        let r = Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-accept", accept)
            .body(Full::new(Bytes::new()))
            .expect("a response");
        return Ok(r);
    }
    Ok(Response::new(Full::new(Bytes::from(record.to_string()))))
}

/// Every file under `dir` (below 64 MiB: a sandbox's sparse disk image
/// would be gigabytes of nothing) that holds one of `values`.
fn files_holding(dir: &std::path::Path, values: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let p = e.path();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() && e.metadata().is_ok_and(|m| m.len() < 64 << 20) {
                let Ok(bytes) = std::fs::read(&p) else {
                    continue;
                };
                if values
                    .iter()
                    .any(|v| bytes.windows(v.len()).any(|w| w == v.as_bytes()))
                {
                    found.push(p.display().to_string());
                }
            }
        }
    }
    found
}

/// The whole story, in one sandbox (see the module doc).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_injected_on_the_way_out_and_never_enter_the_sandbox() {
    let servers = Servers::start().await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca_file = dir.path().join("target-ca.pem");
    std::fs::write(&ca_file, &servers.ca.pem).expect("write the CA");
    let c = Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![
                (KEY.into(), "team-a".into()),
                (OTHER_KEY.into(), "team-b".into()),
            ],
            node_args: vec!["--egress-ca-file".into(), ca_file.display().to_string()],
            logs: true,
            ..Spec::default()
        },
    )
    .await
    .expect(
        "the cluster starts (needs root, cgroups, slirp4netns, nftables and the base template)",
    );
    let facts = run_case(
        &format!("http://{}", c.gateway(0)),
        "egress_rules.py",
        "secrets_and_rules",
        KEY,
        &[
            ("WARREN_OTHER_KEY", OTHER_KEY.to_string()),
            ("WARREN_TARGET_IP", servers.target_ip.clone()),
            ("WARREN_ROGUE_IP", servers.rogue_ip.clone()),
            ("WARREN_TARGET_CA", servers.ca.pem.clone()),
        ],
        Duration::from_secs(600),
    )
    .await;
    let values: Vec<String> = facts["values"]
        .as_array()
        .expect("values")
        .iter()
        .map(|v| v.as_str().expect("a value").to_string())
        .collect();
    eprintln!("facts: {facts:#}");
    let (v1, v2) = (&values[0], &values[1]);
    assert_eq!(facts["inject"]["curl_version"], "2", "{facts}");

    // What the server saw: the header on the requests that should carry
    // it, over the protocol the sandbox chose; nothing of the refused.
    let seen = servers.seen();
    let at = |path: &str| -> Vec<&serde_json::Value> {
        seen.iter().filter(|r| r["path"] == path).collect()
    };
    let echo = at("/echo");
    assert!(
        echo.iter()
            .any(|r| r["headers"]["authorization"] == format!("Bearer {v1}")
                && r["version"] == "HTTP/2.0"
                && r["sni"] == "api.test"),
        "{seen:#?}"
    );
    assert_eq!(
        at("/rotated")[0]["headers"]["authorization"],
        format!("Bearer {v2}")
    );
    assert_eq!(
        at("/ws")[0]["headers"]["authorization"],
        format!("Bearer {v2}")
    );
    for path in ["/again", "/after-full", "/after-filesystem"] {
        assert_eq!(
            at(path)[0]["headers"]["authorization"],
            format!("Bearer {v2}"),
            "{path}"
        );
    }
    assert!(at("/plain")[0]["headers"].get("authorization").is_none());
    for refused in ["/refused", "/denied"] {
        assert!(
            at(refused).is_empty(),
            "the server saw {refused}: {seen:#?}"
        );
    }
    assert!(
        servers.rogue_seen.lock().expect("seen").is_empty(),
        "the rogue server got a request"
    );

    // No file the cluster wrote holds a value: not the scheduler's
    // database, not a log (every part's stderr), not the nodes' data.
    let found = files_holding(c.dir(), &values);
    assert!(found.is_empty(), "files holding a secret value: {found:?}");
    let node_log = std::fs::read_to_string(c.log("node-1")).unwrap_or_default();
    assert!(
        node_log.contains("egress proxy started"),
        "the node's log does not say its proxy started"
    );
}
