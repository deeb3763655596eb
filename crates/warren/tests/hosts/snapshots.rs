//! Snapshots through the blob store: pushed, imported, taken on one host
//! and started on another; a corrupted blob; the store down.

use super::*;

/// Nothing shared but the network, and now no template store either:
/// `base` is pushed to a real S3 server (Garage, on the machine) and its
/// record imported through the gateways (`warren template push
/// --import`); nodes run isolated sandboxes from layers they fetch into
/// their own caches, and every record is the scheduler's. A snapshot taken
/// on one host through one gateway is listed by the other and starts on
/// another host, with the file written before it. A blob corrupted in the
/// bucket is refused (503 naming it) and never unpacked. With the store down,
/// hosts still create from what they hold, and placement sends creates to
/// them; a template no host holds gets a 503 naming the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_taken_on_one_host_starts_on_another_from_the_blob_store() {
    let WithBlobs {
        mut garage,
        blobs,
        store,
        hosts: h,
    } = Hosts::start_with_blobs(Setup {
        // Full with one sandbox: what it snapshots starts elsewhere.
        first_node_capacity: Some(1),
        ..Setup::default()
    })
    .await;
    let gateways: Vec<String> = h.gateways.iter().map(|g| g.addr("gateway http")).collect();
    for gw in &gateways {
        let r = send(gw, Method::GET, "/templates", &[("x-api-key", KEY)], None).await;
        let names: Vec<Value> = r.expect_json().as_array().cloned().unwrap_or_default();
        assert!(
            names.iter().any(|t| t["templateID"] == "base"),
            "{gw}: {}",
            r.text()
        );
    }

    // A sandbox on one host (fetching base into its cache), a file in it.
    let a = h.create_from(&h.balancer.addr, "base").await;
    let client = warren_client::Client::new(&[format!("http://{}", h.balancer.addr)], KEY)
        .expect("a client");
    let sa: warren_client::Sandbox = serde_json::from_value(a.clone()).expect("a sandbox");
    client
        .write_file(
            &sa,
            "/home/user/mark.txt",
            "user",
            "written on the first host".into(),
        )
        .await
        .expect("a file written");
    let r = send(
        &gateways[0],
        Method::POST,
        &format!("/sandboxes/{}/snapshots", sa.sandbox_id),
        &[("x-api-key", KEY)],
        Some(json!({"name": "moved"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = send(
        &gateways[1],
        Method::GET,
        "/snapshots",
        &[("x-api-key", KEY)],
        None,
    )
    .await;
    assert!(r.text().contains("\"moved\""), "{}", r.text());

    // Two gateways delete one snapshot at once: one wins, the other finds
    // it gone, and it is gone for both.
    let r = send(
        &gateways[0],
        Method::POST,
        &format!("/sandboxes/{}/snapshots", sa.sandbox_id),
        &[("x-api-key", KEY)],
        Some(json!({"name": "raced"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let del = |gw: &str| {
        let gw = gw.to_string();
        async move {
            send(
                &gw,
                Method::DELETE,
                "/templates/raced",
                &[("x-api-key", KEY)],
                None,
            )
            .await
        }
    };
    let (one, two) = tokio::join!(del(&gateways[0]), del(&gateways[1]));
    let mut got = [one.status.as_u16(), two.status.as_u16()];
    got.sort();
    assert_eq!(got, [204, 404], "{} / {}", one.text(), two.text());
    for gw in &gateways {
        let r = send(gw, Method::GET, "/snapshots", &[("x-api-key", KEY)], None).await;
        assert!(!r.text().contains("raced"), "{gw}: {}", r.text());
    }

    // From the other gateway, on another host (the first is full), which
    // fetches the snapshot's layer.
    assert_eq!(a["clientID"], "node-1", "{a}");
    let b = h.create_from(&gateways[1], "moved").await;
    assert_ne!(b["clientID"], a["clientID"], "{b}");
    let sb: warren_client::Sandbox = serde_json::from_value(b.clone()).expect("a sandbox");
    assert_eq!(
        stdout_of(&client, &sb, "cat /home/user/mark.txt").await,
        "written on the first host"
    );
    // The blob store goes down. What a host holds, it still creates from,
    // and placement sends those creates to it (the second host: the first
    // is full), not to the third, the emptiest, which holds nothing. No
    // host holds `tiny`: the third says it cannot fetch it, naming the
    // store.
    // A blob corrupted in the bucket is refused, and nothing of it kept:
    // `tiny`'s object replaced by other bytes (no host holds it yet).
    let tiny: Value = serde_json::from_slice(
        &std::fs::read(store.path().join("templates/tiny.json")).expect("tiny's record"),
    )
    .expect("tiny's record parses");
    let tiny = tiny["digest"].as_str().expect("a digest").to_string();
    tamper(&garage, &tiny).await;
    let r = h.try_create(&h.balancer.addr, "tiny").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(
        r.message().contains(&format!("blob {tiny}")) && r.message().contains("corrupt"),
        "{}",
        r.message()
    );

    // Once the scheduler knows what the second host fetched (its next
    // heartbeat, sent at once after a create that fetched).
    let b_node = b["clientID"].as_str().expect("a node").to_string();
    let want = 2;
    wait_until(
        "the scheduler to learn the second host's cache",
        Duration::from_secs(30),
        || {
            let b_node = b_node.clone();
            let h = &h;
            async move {
                let nodes = h.nodes().await;
                let n = nodes
                    .as_array()?
                    .iter()
                    .find(|n| n["nodeID"] == b_node.as_str())?;
                (n["cachedLayers"].as_array()?.len() >= want).then_some(())
            }
        },
    )
    .await;
    // Stopped (and waited for) before any create: kept until the end,
    // its files with it.
    let _garage = tokio::task::spawn_blocking(move || {
        garage.stop();
        garage
    })
    .await
    .expect("the garage task");
    for template in ["moved", "base"] {
        let e = h.create_from(&h.balancer.addr, template).await;
        assert_eq!(e["clientID"], b["clientID"], "{template}: {e}");
    }
    // Unavailable, not corrupt: the store is down, not wrong.
    let r = h.try_create(&h.balancer.addr, "tiny").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text());
    assert!(
        r.message().contains(&format!("blob store {}", blobs.url))
            && r.message().contains("is unavailable")
            && !r.message().contains("corrupt"),
        "{}",
        r.message()
    );
}

/// Replaces blob `digest`'s object in Garage's bucket with other bytes,
/// past the blob store.
async fn tamper(g: &GarageServer, digest: &str) {
    use object_store::ObjectStoreExt as _;
    // object_store's HTTP client takes the process's rustls provider (the
    // blob store installs the same one for itself).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bucket = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&g.endpoint)
        .with_region(&g.region)
        .with_bucket_name(&g.bucket)
        .with_access_key_id(&g.access_key_id)
        .with_secret_access_key(&g.secret_access_key)
        .with_allow_http(true)
        .build()
        .expect("a client of the bucket");
    let hex = digest.trim_start_matches("sha256-");
    let key = object_store::path::Path::from(format!("blobs/sha256/{hex}"));
    bucket
        .put(&key, b"not the layer".to_vec().into())
        .await
        .expect("the object replaced");
}
