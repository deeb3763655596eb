//! A layer download cut off with its host's network.

use super::*;

/// A node's host loses its network in the middle of fetching a layer: the
/// create fails saying so or goes to another node, the half-fetched layer
/// is dropped and never unpacked, and once the host is back creates work.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_cut_off_mid_download_never_uses_the_half_fetched_layer() {
    let WithBlobs {
        garage: _garage,
        blobs: _blobs,
        store,
        hosts: h,
    } = Hosts::start_with_blobs(Setup::default()).await;
    let base: Value = serde_json::from_slice(
        &std::fs::read(store.path().join("templates/base.json")).expect("base's record"),
    )
    .expect("base's record parses");
    let hex = base["digest"]
        .as_str()
        .expect("a digest")
        .trim_start_matches("sha256-")
        .to_string();

    // A create, and the host whose node is fetching base for it: a partial
    // download of at least 4 MiB in its cache's scratch directory.
    let entry = h.balancer.addr.clone();
    let create = tokio::spawn(async move {
        send(
            &entry,
            Method::POST,
            "/v2/sandboxes",
            &[("x-api-key", KEY)],
            Some(json!({"templateID": "base", "timeout": 120, "allow_internet_access": false})),
        )
        .await
    });
    let partial = |i: usize| -> Option<(std::path::PathBuf, u64)> {
        let tmp = h.node_hosts[i].dir().join("cache/tmp");
        std::fs::read_dir(tmp)
            .ok()?
            .flatten()
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
            .find(|(_, n)| *n >= 4 << 20)
    };
    let (cut, file) = wait_until(
        "a node to be fetching base",
        Duration::from_secs(120),
        || async { (0..h.node_hosts.len()).find_map(|i| partial(i).map(|(p, _)| (i, p))) },
    )
    .await;
    h.node_hosts[cut].disconnect().expect("the cable pulled");
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let r = create.await.expect("the create task");
    let unpacked = h.node_hosts[cut].dir().join("cache/rootfs").join(&hex);
    eprintln!(
        "cut {} at {size} bytes of base; the create: {} {}",
        h.node_hosts[cut].name,
        r.status,
        r.text()
    );
    if r.status == StatusCode::CREATED {
        assert_ne!(
            r.str("clientID"),
            h.node_hosts[cut].name,
            "created on the cut-off host: {}",
            r.text()
        );
    } else {
        assert!(
            r.status.is_server_error() && !r.message().is_empty(),
            "{} {}",
            r.status,
            r.text()
        );
    }
    // The cut-off host's node gives the download up: the partial file goes,
    // and nothing of it is unpacked.
    wait_until(
        "the cut-off node to drop its partial download",
        Duration::from_secs(120),
        || {
            let file = file.clone();
            async move { (!file.exists()).then_some(()) }
        },
    )
    .await;
    assert!(
        !unpacked.exists(),
        "base was unpacked on the cut-off host from {size} bytes"
    );

    // Back on the network, every node takes creates again.
    h.node_hosts[cut].reconnect().expect("the cable back");
    h.wait_up(cut).await;
    let client = warren_client::Client::new(&[format!("http://{}", h.balancer.addr)], KEY)
        .expect("a client");
    for _ in 0..3 {
        let s = h.create().await;
        let sb: warren_client::Sandbox = serde_json::from_value(s.clone()).expect("a sandbox");
        let version = stdout_of(&client, &sb, "cat /etc/debian_version").await;
        assert!(!version.is_empty(), "{s}");
    }
}
