//! What an operator does: list nodes with an operator key, and replace a
//! gateway gracefully (readiness first, keep serving for `--shutdown-delay`,
//! then close and drain).
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]

use http::{Method, StatusCode};
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::Http;
use warren_test_support::wait_until;

const OPERATOR_KEY: &str = "key-ops";
const TENANT_KEY: &str = "key-team-a";

fn bin() -> &'static std::path::Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

fn spec() -> Spec {
    Spec {
        nodes: 2,
        keys: vec![
            (TENANT_KEY.into(), "team-a".into()),
            (OPERATOR_KEY.into(), "ops".into()),
        ],
        gateway_args: vec![
            "--admin-team".into(),
            "ops".into(),
            "--shutdown-delay".into(),
            "1500ms".into(),
        ],
        ..Spec::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_list_nodes_tenants_cannot() {
    let c = Cluster::start(bin(), spec()).await.expect("cluster starts");
    let gw = c.gateway(0);
    // Nodes register right after they start listening; wait for both.
    let stdout = wait_until(
        "warren node ls to list both nodes",
        Duration::from_secs(10),
        || {
            let gw = gw.clone();
            async move {
                let out = tokio::process::Command::new(bin())
                    .args(["node", "ls", "--api-url", &format!("http://{gw}")])
                    .env("E2B_API_KEY", OPERATOR_KEY)
                    .output()
                    .await
                    .ok()?;
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
                (stdout.contains("node-1") && stdout.contains("node-2")).then_some(stdout)
            }
        },
    )
    .await;
    for node in ["node-1", "node-2"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node} missing from:\n{stdout}"));
        assert!(line.contains("ready"), "{line}");
        assert!(
            line.contains(&c.node(node[5..].parse().expect("index"))),
            "{line}"
        );
    }

    let http = Http::default();
    let a = http
        .send(
            Method::GET,
            &gw,
            "/nodes",
            &[("x-api-key", TENANT_KEY)],
            None,
        )
        .await
        .expect("answers");
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{:?}", a.json);
    assert!(a.str("message").contains("--admin-team"), "{:?}", a.json);
    let a = http
        .send(Method::GET, &gw, "/nodes", &[], None)
        .await
        .expect("answers");
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_readiness_false_first_and_keeps_serving_for_the_delay() {
    let mut c = Cluster::start(bin(), spec()).await.expect("cluster starts");
    let gw = c.gateway(0);
    let admin = c.gateways[0].addr("gateway admin");
    let http = Http::new(Duration::from_secs(5));
    let ready = |http: Http, admin: String| async move {
        http.send(Method::GET, &admin, "/readyz", &[], None)
            .await
            .map(|a| a.status)
            .ok()
    };
    // Readiness turns true just after the listeners are announced.
    wait_until("the gateway to be ready", Duration::from_secs(10), || {
        let (http, admin) = (http.clone(), admin.clone());
        async move { (ready(http, admin).await == Some(StatusCode::OK)).then_some(()) }
    })
    .await;

    c.gateways[0].signal(nix::sys::signal::Signal::SIGTERM);
    wait_until("readiness to turn false", Duration::from_secs(5), || {
        let (http, admin) = (http.clone(), admin.clone());
        async move { (ready(http, admin).await == Some(StatusCode::SERVICE_UNAVAILABLE)).then_some(()) }
    })
    .await;
    // Not ready, but still serving: a balancer that has not noticed yet
    // loses nothing.
    let a = http
        .send(
            Method::GET,
            &gw,
            "/sandboxes",
            &[("x-api-key", TENANT_KEY)],
            None,
        )
        .await
        .expect("still serving during the shutdown delay");
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.json);

    let code = c.gateways[0].terminate(Duration::from_secs(15)).await.code;
    assert_eq!(
        code,
        Some(0),
        "the gateway exits cleanly after the delay and drain"
    );
    assert!(
        tokio::net::TcpStream::connect(&gw).await.is_err(),
        "the listener is closed after exit"
    );
}
