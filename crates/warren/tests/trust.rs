//! Internal trust and admission, attacked as someone on the cluster's network
//! would (docs/security.md, "Internal trust" and "Quotas"): every internal
//! listener refuses clients without the right certificate, the scheduler's
//! reads carry no secrets, a team's quotas hold across gateways (paused
//! sandboxes count), a node killed under create load fails no create while
//! another node has room, and no API key or database password is ever on a
//! process's command line.

use http::Method;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use warren_proto::client::Scheduler;
use warren_proto::scheduler::v1::{
    GetAccessTokenRequest, GetSandboxRequest, HeartbeatRequest, ListSandboxesRequest,
    RegisterNodeRequest,
};
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::Http;
use warren_trust::issue::{Ca, Validity};
use warren_trust::{Identity, Role, Trust};

const KEY: &str = "key-team-a";

fn bin() -> &'static Path {
    env!("CARGO_BIN_EXE_warren").as_ref()
}

/// A certificate for `role`/`name` signed by the cluster's CA (or by
/// `other_ca`), valid for `validity`, loaded as that part would load it.
fn trust_as(c: &Cluster, role: Role, name: &str, ca: Option<&Ca>, validity: Validity) -> Trust {
    let certs = c.dir().join("certs");
    let cluster_ca = Ca::load(&certs).expect("the cluster's CA");
    let id = Identity::new(role, name).expect("identity");
    let issued = ca
        .unwrap_or(&cluster_ca)
        .issue(&id, &["127.0.0.1".into()], validity)
        .expect("issue");
    let dir = c.dir().join("attacker");
    let (cert, key) = issued
        .save(&dir, &format!("{role}-{name}-{}", rand::random::<u32>()))
        .expect("save");
    // The attacker trusts the real CA, so it can verify the server; `read`
    // does not refuse its own expired certificate, as `load` would.
    Trust::read(role, Some(name), &certs.join("ca.pem"), &cert, &key)
        .unwrap_or_else(|e| panic!("cannot load a test certificate: {e}"))
}

fn scheduler_as(c: &Cluster, trust: Option<&Trust>) -> Scheduler {
    Scheduler::new(
        &[c.scheduler_url()],
        Duration::from_secs(2),
        Duration::from_secs(5),
        trust,
    )
    .expect("client")
}

fn plain_scheduler(c: &Cluster) -> Scheduler {
    // `https://` is refused without TLS; dial the port plainly.
    scheduler_as(c, None)
}

async fn list_all(
    s: &Scheduler,
) -> Result<Vec<warren_proto::scheduler::v1::Binding>, tonic::Status> {
    s.call("ListSandboxes", |mut c| async move {
        c.list_sandboxes(ListSandboxesRequest::default()).await
    })
    .await
    .map(|r| r.sandboxes)
}

/// `RegisterNode` as `node_id`, with a huge capacity (what an attacker wants
/// the next creates placed on).
async fn register(
    s: &Scheduler,
    node_id: &str,
) -> Result<warren_proto::scheduler::v1::RegisterNodeResponse, tonic::Status> {
    s.call("RegisterNode", |mut c| async move {
        c.register_node(RegisterNodeRequest {
            node_id: node_id.into(),
            endpoint: "127.0.0.1:1".into(),
            capacity: 1000,
            incarnation: 7,
            roster: vec![],
            cached_layers: vec![],
            ..Default::default()
        })
        .await
    })
    .await
}

async fn create(c: &Cluster, gateway: usize, key: &str) -> warren_test_support::http::Answer {
    Http::default()
        .send(
            Method::POST,
            &c.gateway(gateway),
            "/sandboxes",
            &[("x-api-key", key)],
            Some(serde_json::json!({"templateID": "base", "envVars": {"SECRET_VAR": "hunter2"}})),
        )
        .await
        .expect("the gateway answers")
}

async fn kill(c: &Cluster, gateway: usize, id: &str) {
    let a = Http::default()
        .send(
            Method::DELETE,
            &c.gateway(gateway),
            &format!("/sandboxes/{id}"),
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect("the gateway answers");
    assert_eq!(a.status.as_u16(), 204, "kill {id}: {}", a.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_apis_refuse_clients_without_the_right_certificate() {
    let c = Cluster::start(bin(), Spec::default())
        .await
        .expect("cluster");
    let created = create(&c, 0, KEY).await;
    assert_eq!(created.status.as_u16(), 201, "{}", created.text());
    let sandbox = created.str("sandboxID");

    // No certificate at all: plain gRPC to the scheduler is refused.
    let err = list_all(&plain_scheduler(&c))
        .await
        .expect_err("plain client");
    assert_ne!(err.code(), tonic::Code::Ok);

    // A certificate from another CA, and an expired one from the right CA.
    let foreign = Ca::generate(Validity::days(30)).expect("ca");
    let dir = c.dir().join("foreign");
    foreign.save(&dir).expect("save");
    let id = Identity::new(Role::Gateway, "gateway-x").expect("id");
    let issued = foreign
        .issue(&id, &["127.0.0.1".into()], Validity::days(30))
        .expect("issue");
    let (cert, key) = issued.save(&dir, "gw").expect("save");
    // Trusts the cluster's CA (so the client accepts the scheduler): only
    // the scheduler can refuse it.
    let foreign_trust = Trust::read(
        Role::Gateway,
        None,
        &c.dir().join("certs/ca.pem"),
        &cert,
        &key,
    )
    .expect("load");
    let err = list_all(&scheduler_as(&c, Some(&foreign_trust)))
        .await
        .expect_err("unknown CA");
    assert_ne!(err.code(), tonic::Code::Ok);

    // A node certificate posing as another node.
    let node9 = trust_as(&c, Role::Node, "node-9", None, Validity::days(1));
    let as_node9 = scheduler_as(&c, Some(&node9));
    let err = as_node9
        .call("Heartbeat", |mut s| async move {
            s.heartbeat(HeartbeatRequest {
                node_id: "node-1".into(),
                incarnation: 1,
                roster: vec![],
                cached_layers: vec![],
                paused: Vec::new(),
                lists_paused: false,
            })
            .await
        })
        .await
        .expect_err("node-9 speaking for node-1");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("node-1"), "{}", err.message());
    let err = register(&as_node9, "node-1")
        .await
        .expect_err("node-9 registering as node-1");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    // ... nor may a node read other teams' bindings.
    let err = list_all(&as_node9).await.expect_err("a node listing");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // A gateway certificate calling node-only RPCs.
    let gw = trust_as(&c, Role::Gateway, "gateway-9", None, Validity::days(1));
    let as_gw = scheduler_as(&c, Some(&gw));
    let err = register(&as_gw, "evil")
        .await
        .expect_err("a gateway registering a node");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");

    // The node's control API and data plane: only gateways.
    let node_list = |trust: Option<&Trust>| {
        let pool = warren_gateway::node_client::node_pool(
            Duration::from_secs(2),
            Duration::from_secs(10),
            trust,
        )
        .expect("pool");
        let node = c.node(1);
        async move {
            let req = http::Request::get("/_warren/v1/sandboxes")
                .body(warren_core::body::empty())
                .expect("request");
            tokio::time::timeout(Duration::from_secs(10), pool.request(&node, req))
                .await
                .expect("an answer or an error within 10 s")
        }
    };
    assert!(
        node_list(None).await.is_err(),
        "a plain client reached the node"
    );
    assert!(
        node_list(Some(&node9)).await.is_err(),
        "a node certificate reached another node's control API"
    );
    let gw_answer = node_list(Some(&gw))
        .await
        .expect("a gateway reaches the node");
    assert_eq!(gw_answer.status().as_u16(), 200);
    let expired = trust_as(
        &c,
        Role::Gateway,
        "gateway-old",
        None,
        Validity {
            not_before: time::OffsetDateTime::now_utc() - time::Duration::days(10),
            not_after: time::OffsetDateTime::now_utc() - time::Duration::days(1),
        },
    );
    assert!(
        node_list(Some(&expired)).await.is_err(),
        "an expired certificate was accepted"
    );

    // The gateway's own certificate still works: reads carry no secrets.
    let real = Trust::load(
        Role::Gateway,
        None,
        &c.dir().join("certs/ca.pem"),
        &c.dir().join("certs/gateway-gateway-1.pem"),
        &c.dir().join("certs/gateway-gateway-1.key"),
    )
    .expect("the gateway's certificate");
    let as_real = scheduler_as(&c, Some(&real));
    let listed = list_all(&as_real).await.expect("a gateway lists");
    assert!(listed.iter().any(|b| b.sandbox_id == sandbox));
    for b in &listed {
        assert!(b.access_token.is_empty(), "ListSandboxes leaked a token");
        assert!(b.env_vars.is_empty(), "ListSandboxes leaked env vars");
    }
    let got = as_real
        .call("GetSandbox", |mut s| {
            let id = sandbox.clone();
            async move { s.get_sandbox(GetSandboxRequest { sandbox_id: id }).await }
        })
        .await
        .expect("get");
    assert!(
        got.access_token.is_empty() && got.env_vars.is_empty(),
        "GetSandbox leaked secrets"
    );
    // The token goes only to the sandbox's own team.
    let err = as_real
        .call("GetAccessToken", |mut s| {
            let id = sandbox.clone();
            async move {
                s.get_access_token(GetAccessTokenRequest {
                    sandbox_id: id,
                    team_id: "team-b".into(),
                })
                .await
            }
        })
        .await
        .expect_err("another team's token");
    assert_eq!(err.code(), tonic::Code::NotFound);
    // And the tenant still gets its token from the gateway.
    let detail = Http::default()
        .send(
            Method::GET,
            &c.gateway(0),
            &format!("/sandboxes/{sandbox}"),
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect("get");
    assert!(
        !detail.str("envdAccessToken").is_empty(),
        "{}",
        detail.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn team_quotas_answer_429_across_gateways_and_free_up_on_kill() {
    let spec = Spec {
        gateways: 2,
        keys: vec![
            (KEY.into(), "team-a".into()),
            ("key-team-b".into(), "team-b".into()),
        ],
        scheduler_args: ["--team-quota", "team-a=2/100", "--team-quota", "team-b=0/2"]
            .map(String::from)
            .to_vec(),
        ..Spec::default()
    };
    let c = Cluster::start(bin(), spec).await.expect("cluster");
    let first = create(&c, 0, KEY).await;
    assert_eq!(first.status.as_u16(), 201, "{}", first.text());
    let second = create(&c, 1, KEY).await;
    assert_eq!(second.status.as_u16(), 201, "{}", second.text());
    for g in [0, 1] {
        let third = create(&c, g, KEY).await;
        assert_eq!(third.status.as_u16(), 429, "gateway {g}: {}", third.text());
        assert_eq!(third.expect_json()["code"], 429);
        assert!(
            third.message().contains("--quota-sandboxes"),
            "{}",
            third.message()
        );
    }
    kill(&c, 1, &first.str("sandboxID")).await;
    let again = create(&c, 0, KEY).await;
    assert_eq!(again.status.as_u16(), 201, "after a kill: {}", again.text());

    // The create rate: two a minute for team b (a bucket of two, one more
    // every 30 s), whichever gateway it uses. Creates until one is refused:
    // never more than the bucket allowed in the time taken (however slow
    // this machine is), and a refusal comes.
    let started = std::time::Instant::now();
    let mut created = 0;
    let refused = loop {
        let r = create(&c, created % 2, "key-team-b").await;
        match r.status.as_u16() {
            201 => created += 1,
            429 => break r,
            other => panic!("create answered {other}: {}", r.text()),
        }
        assert!(created <= 10, "10 creates and no 429");
    };
    let allowed = 2 + usize::try_from(started.elapsed().as_secs() / 30).unwrap_or(usize::MAX);
    assert!(
        (2..=allowed).contains(&created),
        "{created} creates before the 429 (the bucket allowed {allowed})"
    );
    assert!(
        refused.message().contains("--quota-creates-per-minute"),
        "{}",
        refused.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_create_load_fails_no_create() {
    let spec = Spec {
        nodes: 2,
        // Long enough that the scheduler still thinks node-1 is alive while
        // the creates after the kill run.
        scheduler_args: ["--lease", "20s"].map(String::from).to_vec(),
        ..Spec::default()
    };
    let mut c = Cluster::start(bin(), spec).await.expect("cluster");
    let gateway = c.gateway(0);
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let created = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (gateway, failures, created, stop) = (
            gateway.clone(),
            failures.clone(),
            created.clone(),
            stop.clone(),
        );
        workers.push(tokio::spawn(async move {
            let http = Http::default();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let a = http
                    .send(
                        Method::POST,
                        &gateway,
                        "/sandboxes",
                        &[("x-api-key", KEY)],
                        Some(serde_json::json!({"templateID": "base"})),
                    )
                    .await;
                match a {
                    Ok(a) if a.status.as_u16() == 201 => {
                        created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(a) => {
                        failures
                            .lock()
                            .expect("lock")
                            .push(format!("{}: {}", a.status, a.text()))
                    }
                    Err(e) => failures.lock().expect("lock").push(e.to_string()),
                }
            }
        }));
    }
    // Some creates land on both nodes, then node-1 dies mid-load.
    warren_test_support::wait_until("creates under way", Duration::from_secs(30), || {
        let n = created.load(std::sync::atomic::Ordering::Relaxed);
        async move { (n >= 6).then_some(()) }
    })
    .await;
    c.kill_node(1).await;
    let at_kill = created.load(std::sync::atomic::Ordering::Relaxed);
    warren_test_support::wait_until("creates after the kill", Duration::from_secs(60), || {
        let n = created.load(std::sync::atomic::Ordering::Relaxed);
        async move { (n >= at_kill + 12).then_some(()) }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }
    let failures = failures.lock().expect("lock").clone();
    assert!(failures.is_empty(), "failed creates: {failures:#?}");
}

/// A paused sandbox keeps its node slot, so it keeps its place in the
/// team's `--quota-sandboxes` (with paused sandboxes free, one
/// team could take every slot by pausing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_keeps_its_place_in_the_quota() {
    let spec = Spec {
        nodes: 1,
        runtime: "isolated".into(),
        scheduler_args: ["--team-quota", "team-a=1/0"].map(String::from).to_vec(),
        ..Spec::default()
    };
    let c = Cluster::start(bin(), spec)
        .await
        .expect("a cluster (isolated: root, cgroups and the base template)");
    let first = create(&c, 0, KEY).await;
    assert_eq!(first.status.as_u16(), 201, "{}", first.text());
    let id = first.str("sandboxID");
    let paused = Http::default()
        .send(
            Method::POST,
            &c.gateway(0),
            &format!("/sandboxes/{id}/pause"),
            &[("x-api-key", KEY)],
            None,
        )
        .await
        .expect("the gateway answers");
    assert_eq!(paused.status.as_u16(), 204, "{}", paused.text());
    let second = create(&c, 0, KEY).await;
    // Killed before anything is asserted: a frozen sandbox left behind
    // ignores the cluster's SIGKILLs until it is thawed.
    kill(&c, 0, &id).await;
    if second.status.is_success() {
        kill(&c, 0, &second.str("sandboxID")).await;
    }
    assert_eq!(second.status.as_u16(), 429, "{}", second.text());
    assert!(
        second.message().contains("--quota-sandboxes"),
        "{}",
        second.message()
    );
    let again = create(&c, 0, KEY).await;
    assert_eq!(again.status.as_u16(), 201, "after a kill: {}", again.text());
}

/// A key no other process on this host could hold by chance.
fn unique_key() -> String {
    format!("e2b_{:040x}", rand::random::<u128>())
}

/// Every process on this host whose command line holds `key`, described.
fn holding(key: &str) -> Vec<(u32, String)> {
    warren_test_support::cmdlines_holding(key.as_bytes())
}

/// The gateways' API keys were on their command lines, which every account
/// on the host reads (`ps`). Now: a test cluster's and `warren dev`'s keys
/// are in no process's command line on the host (every process scanned),
/// whether given or generated; a gateway or `warren dev` given `--api-key`
/// on its command line refuses to start (64, saying where keys go), and so
/// does a scheduler given a database password there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_is_ever_on_a_command_line() {
    // A cluster of every part.
    let key = unique_key();
    let spec = Spec {
        nodes: 1,
        keys: vec![(key.clone(), "team-a".into())],
        ..Spec::default()
    };
    let c = Cluster::start(bin(), spec).await.expect("cluster");
    let created = create(&c, 0, &key).await;
    assert_eq!(
        created.status.as_u16(),
        201,
        "the key works: {}",
        created.text()
    );
    assert_eq!(
        holding(&key),
        Vec::new(),
        "the cluster's key is on a command line"
    );
    drop(c);

    // warren dev with a key of the user's (from the environment), and with
    // the one it generates.
    let given = unique_key();
    let dev = warren_test_support::dev::Dev::start_with(
        bin(),
        &["--nodes", "1", "--runtime", "process"],
        &[("WARREN_DEV_API_KEY", &given)],
        "warren dev with its key in the environment",
    )
    .await;
    let printed = printed_key(&dev);
    assert_eq!(printed, given);
    assert_eq!(
        holding(&given),
        Vec::new(),
        "warren dev's key is on a command line"
    );
    drop(dev);
    let dev = warren_test_support::dev::Dev::start(
        bin(),
        &["--nodes", "1", "--runtime", "process"],
        "warren dev with the key it makes",
    )
    .await;
    let made = printed_key(&dev);
    let answer = Http::default()
        .send(
            Method::GET,
            dev.gateway.trim_start_matches("http://"),
            "/v2/sandboxes",
            &[("x-api-key", &made)],
            None,
        )
        .await
        .expect("the gateway answers");
    assert_eq!(
        answer.status.as_u16(),
        200,
        "the key works: {}",
        answer.text()
    );
    assert_eq!(
        holding(&made),
        Vec::new(),
        "warren dev's key is on a command line"
    );
    drop(dev);

    // Refused on a command line, saying where the secret goes instead.
    for (args, says) in [
        (vec!["gateway", "--api-key", "k:t"], "--api-keys-file"),
        (vec!["dev", "--api-key", "k"], "WARREN_DEV_API_KEY"),
        (
            vec![
                "scheduler",
                "--database-url",
                "postgres://warren:secret@127.0.0.1/warren",
            ],
            "WARREN_SCHEDULER_DATABASE_URL",
        ),
    ] {
        let out = tokio::process::Command::new(bin())
            .args(&args)
            .output()
            .await
            .expect("warren runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// The key `warren dev` printed in its `export E2B_API_KEY=` line.
fn printed_key(dev: &warren_test_support::dev::Dev) -> String {
    dev.proc
        .lines()
        .iter()
        .find_map(|l| {
            l.trim()
                .strip_prefix("export E2B_API_KEY=")
                .map(str::to_string)
        })
        .expect("warren dev prints the key")
}
