//! E2B's persistent volumes with the unmodified SDKs (`tests/e2b/volumes.py`,
//! `tests/js/volumes.mjs`) on the `isolated` runtime, each volume local to
//! its node (an ext4 image of `--volume-max-bytes`): the volume API, the
//! content API without a sandbox, a volume mounted into two sandboxes at
//! once (each sees the other's writes, under different host id ranges),
//! its data outliving them, a delete refused while one mounts it; another
//! team's volume is "not found" and a token opens only its volume;
//! traversal and symlinks (planted from inside a sandbox, and swapped in
//! while calls are in flight) never lead out of a volume, and the mount
//! is nosuid,nodev; past the size limit a sandbox gets ENOSPC and the API
//! 507; a 1 GiB file streams in and out without either part holding it;
//! and a local volume whose node is down is unavailable (not deleted
//! either), with a clear error, until that node is back.
//!
//! The shared store (any node mounts any volume; a sandbox paused and
//! resumed on another node) is in `tests/hosts/volumes.rs`.
//!
//! Needs what the security suite needs (root, cgroups, the `base`
//! template in `/var/lib/warren/templates`).
#![allow(unused_crate_dependencies)]

use http::{Method, StatusCode};
use serde_json::json;
use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::http::Http;
use warren_test_support::sdk::{run_case, run_js_case};

const KEY: &str = "e2b_5a7c9e1b3d5f7a9c2e4b6d8f0a1c3e5b7d9f2a4c";
const OTHER: &str = "e2b_9c1e3b5d7f9a2c4e6b8d0f1a3c5e7b9d2f4a6c8e";

async fn cluster(nodes: usize, node_args: &[&str]) -> Cluster {
    Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes,
            runtime: "isolated".into(),
            keys: vec![
                (KEY.into(), "team-a".into()),
                (OTHER.into(), "team-b".into()),
            ],
            node_args: node_args.iter().map(|s| s.to_string()).collect(),
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (isolated needs root, cgroups and the base template)")
}

async fn case(c: &Cluster, name: &str, env: &[(&str, String)]) -> serde_json::Value {
    let gateway = format!("http://{}", c.gateway(0));
    let mut all = vec![
        ("E2B_VOLUME_API_URL", gateway.clone()),
        ("WARREN_OTHER_API_KEY", OTHER.to_string()),
    ];
    all.extend(env.iter().cloned());
    run_case(
        &gateway,
        "volumes.py",
        name,
        KEY,
        &all,
        Duration::from_secs(300),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_shared_by_sandboxes_and_outlives_them() {
    let c = cluster(1, &[]).await;
    let r = case(&c, "round_trip", &[]).await;
    // Deleted through the API: its image is gone from the node's store.
    let id = r["volume"].as_str().expect("a volume id");
    let image = c.dir().join(format!("node-1/volumes/images/{id}.img"));
    assert!(!image.exists(), "{} is left", image.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_team_gets_404_and_a_token_opens_only_its_volume() {
    let c = cluster(1, &[]).await;
    case(&c, "isolation", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_and_symlinks_never_lead_out_of_a_volume() {
    let c = cluster(1, &[]).await;
    // A file on the host the calls try to read, a directory they try to
    // write into: both where root may look, neither in any volume.
    let secret = c.dir().join("host-secret.txt");
    std::fs::write(&secret, "the host's, never a volume's\n").expect("a host file");
    let trap = c.dir().join("trap");
    std::fs::create_dir(&trap).expect("a host dir");
    let r = case(
        &c,
        "attacks",
        &[
            ("WARREN_HOST_SECRET", secret.display().to_string()),
            ("WARREN_HOST_TRAP", trap.display().to_string()),
        ],
    )
    .await;
    eprintln!("facts: {r}");
    assert_eq!(std::fs::read_dir(&trap).expect("trap").count(), 0);
    assert_eq!(
        std::fs::read_to_string(&secret).expect("secret"),
        "the host's, never a volume's\n"
    );
    // The store is root's: no host account may walk into a volume.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(c.dir().join("node-1/volumes"))
        .expect("the volume store")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_size_limit_a_volume_is_full_inside_and_507_outside() {
    let limit = (64u64 << 20).to_string();
    let c = cluster(1, &["--volume-max-bytes", &limit]).await;
    let r = case(&c, "size_limit", &[("WARREN_VOLUME_LIMIT", limit.clone())]).await;
    eprintln!("facts: {r}");
}

/// Peak resident memory of process `pid` so far (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gib_streams_through_gateway_and_node_without_being_held() {
    let c = cluster(1, &[]).await;
    let gateway = c.gateways[0].pid().expect("gateway pid");
    let node = c.nodes[0].as_ref().and_then(|n| n.pid()).expect("node pid");
    let before = (peak_rss(gateway), peak_rss(node));
    let r = case(&c, "big_write", &[]).await;
    eprintln!("facts: {r}");
    assert_eq!(r["bytes"].as_u64(), Some(1 << 30));
    // Neither part held the file: each one's peak grew by far less than it.
    let after = (peak_rss(gateway), peak_rss(node));
    eprintln!("peak RSS (gateway, node) before {before:?}, after {after:?}");
    let bound = 128 << 20;
    assert!(
        after.0 < before.0 + bound && after.1 < before.1 + bound,
        "peak RSS before {before:?}, after {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_sdk_creates_mounts_reads_and_writes_a_volume() {
    let c = cluster(1, &[]).await;
    let gateway = format!("http://{}", c.gateway(0));
    let r = run_js_case(
        &gateway,
        "js",
        "volumes.mjs",
        "round_trip",
        KEY,
        &[("E2B_VOLUME_API_URL", gateway.clone())],
        Duration::from_secs(300),
    )
    .await;
    eprintln!("facts: {r}");
}

/// A local volume lives on its node: while that node is down a sandbox
/// that mounts it cannot be created and its content cannot be reached,
/// each with an error naming the node; a sandbox without volumes goes to
/// the other node meanwhile; with the node back, both work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_volume_is_unavailable_while_its_node_is_down() {
    let mut c = cluster(2, &[]).await;
    let gw = c.gateway(0);
    let http = Http::new(Duration::from_secs(120));
    let key = [("x-api-key", KEY)];
    let v = http
        .send(
            Method::POST,
            &gw,
            "/volumes",
            &key,
            Some(json!({"name": "pinned"})),
        )
        .await
        .expect("create");
    assert_eq!(v.status, StatusCode::CREATED, "{}", v.text());
    let v = v.expect_json();
    let (id, token) = (
        v["volumeID"].as_str().expect("id").to_string(),
        v["token"].as_str().expect("token").to_string(),
    );
    let auth = format!("Bearer {token}");
    let bearer = [("authorization", auth.as_str())];
    let put = http
        .send_raw(
            Method::PUT,
            &gw,
            &format!("/volumecontent/{id}/file?path=/kept.txt"),
            &bearer,
            bytes::Bytes::from_static(b"kept"),
        )
        .await
        .expect("put");
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text());
    // Which node holds it: the one whose store has its image.
    let holder = (1..=2)
        .find(|i| {
            c.dir()
                .join(format!("node-{i}/volumes/images/{id}.img"))
                .exists()
        })
        .expect("a node holds the volume");
    let create = |mount: bool| {
        let mut body = json!({"templateID": "base", "timeout": 60, "allow_internet_access": false});
        if mount {
            body["volumeMounts"] = json!([{"name": "pinned", "path": "/mnt/p"}]);
        }
        body
    };
    c.kill_node(holder).await;
    let node = format!("node-{holder}");
    warren_test_support::wait_until(
        "the scheduler to see the volume's node down",
        Duration::from_secs(30),
        || {
            let (http, gw, node) = (http.clone(), gw.clone(), node.clone());
            async move {
                let r = http
                    .send(
                        Method::POST,
                        &gw,
                        "/v2/sandboxes",
                        &[("x-api-key", KEY)],
                        Some(create(true)),
                    )
                    .await
                    .ok()?;
                (r.status == StatusCode::SERVICE_UNAVAILABLE && r.text().contains(&node))
                    .then_some(r)
            }
        },
    )
    .await;
    let r = http
        .send(
            Method::GET,
            &gw,
            &format!("/volumecontent/{id}/file?path=/kept.txt"),
            &bearer,
            None,
        )
        .await
        .expect("get");
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(r.text().contains(&node), "{}", r.text());
    // Nor can it be deleted meanwhile: nothing changes, and it is still there.
    let r = http
        .send(Method::DELETE, &gw, &format!("/volumes/{id}"), &key, None)
        .await
        .expect("delete");
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    let r = http
        .send(Method::GET, &gw, &format!("/volumes/{id}"), &key, None)
        .await
        .expect("get");
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // Sandboxes without volumes go to the other node meanwhile.
    let plain = http
        .send(
            Method::POST,
            &gw,
            "/v2/sandboxes",
            &key,
            Some(create(false)),
        )
        .await
        .expect("create");
    assert_eq!(plain.status, StatusCode::CREATED, "{}", plain.text());

    c.restart_node(holder).await.expect("the node restarts");
    let mounted = warren_test_support::wait_until(
        "a sandbox mounting the volume once its node is back",
        Duration::from_secs(60),
        || {
            let (http, gw) = (http.clone(), gw.clone());
            async move {
                let r = http
                    .send(
                        Method::POST,
                        &gw,
                        "/v2/sandboxes",
                        &[("x-api-key", KEY)],
                        Some(create(true)),
                    )
                    .await
                    .ok()?;
                (r.status == StatusCode::CREATED).then_some(r.expect_json())
            }
        },
    )
    .await;
    assert_eq!(mounted["clientID"], node.as_str(), "{mounted}");
    let r = http
        .send(
            Method::GET,
            &gw,
            &format!("/volumecontent/{id}/file?path=/kept.txt"),
            &bearer,
            None,
        )
        .await
        .expect("get");
    assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "kept"));
}
