//! Filesystem-only pauses through the blob store.

use super::*;

/// A filesystem-paused sandbox resumes on any host once its own is gone,
/// with nothing shared but the network: its pause through one gateway puts
/// its writable layer into the blob store and its record into the
/// scheduler's; with its host's cable pulled, a resume through the other
/// gateway boots it on another host from that layer (same id, the file
/// written before the pause there), and its record goes. Paused again
/// there and that host cut off too, it boots on the third from both
/// pauses' layers: the blob sweep (every second here) kept the first
/// pause's layer, whose record was gone, because a sandbox stacked it.
/// Killing a filesystem-paused sandbox removes its record too, and then
/// the sweeps remove the layers nothing names or stacks any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_paused_sandbox_resumes_on_another_host_once_its_own_is_gone() {
    let WithBlobs {
        garage: _garage,
        blobs: _blobs,
        store: _store,
        hosts: h,
    } = Hosts::start_with_blobs(Setup {
        gateway_args: strings(&["--layer-gc-interval", "1s", "--layer-gc-grace", "1s"]),
        ..Setup::default()
    })
    .await;
    let gateways: Vec<String> = h.gateways.iter().map(|g| g.addr("gateway http")).collect();

    // Killed while paused: its record goes with it.
    let k = h.create_from(&gateways[0], "base").await;
    let k_id = k["sandboxID"].as_str().expect("id").to_string();
    pause_filesystem_only(&gateways[0], &k_id).await;
    assert_eq!(records_named(&h, &format!("paused-{k_id}")), 1);
    let r = send(
        &gateways[1],
        Method::DELETE,
        &format!("/sandboxes/{k_id}"),
        &[("x-api-key", KEY)],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(records_named(&h, &format!("paused-{k_id}")), 0);

    // A file in a sandbox made through the first gateway, then paused
    // filesystem-only: its record is in the scheduler's store.
    let a = h.create_from(&gateways[0], "base").await;
    let client = warren_client::Client::new(&[format!("http://{}", h.balancer.addr)], KEY)
        .expect("a client");
    let sa: warren_client::Sandbox = serde_json::from_value(a.clone()).expect("a sandbox");
    client
        .write_file(
            &sa,
            "/home/user/mark.txt",
            "user",
            "written before the pause".into(),
        )
        .await
        .expect("a file written");
    pause_filesystem_only(&gateways[0], &sa.sandbox_id).await;
    let key = format!("paused-{}", sa.sandbox_id);
    assert_eq!(records_named(&h, &key), 1);

    // Its host is cut off; the other gateway resumes it elsewhere.
    let home = a["clientID"].as_str().expect("a node").to_string();
    let moved = cut_off_and_resume(&h, &home, &gateways[1], &sa.sandbox_id).await;
    assert_eq!(moved["sandboxID"], a["sandboxID"], "{moved}");
    assert_ne!(moved["clientID"].as_str(), Some(home.as_str()), "{moved}");
    assert_eq!(
        stdout_of(&client, &sa, "cat /home/user/mark.txt").await,
        "written before the pause"
    );
    // Running there, its record is done with.
    assert_eq!(records_named(&h, &key), 0);

    // Time for a few sweep rounds past the grace, then paused again and
    // its second host cut off: the third boots it from both layers.
    tokio::time::sleep(Duration::from_secs(5)).await;
    client
        .write_file(
            &sa,
            "/home/user/second.txt",
            "user",
            "after the move".into(),
        )
        .await
        .expect("a second file");
    pause_filesystem_only(&gateways[1], &sa.sandbox_id).await;
    let second = moved["clientID"].as_str().expect("a node").to_string();
    let third = cut_off_and_resume(&h, &second, &gateways[0], &sa.sandbox_id).await;
    assert!(
        third["clientID"] != a["clientID"] && third["clientID"] != moved["clientID"],
        "{third}"
    );
    assert_eq!(
        stdout_of(
            &client,
            &sa,
            "cat /home/user/mark.txt /home/user/second.txt"
        )
        .await,
        "written before the pauseafter the move"
    );
    // Killed, it is gone.
    let r = send(
        &gateways[1],
        Method::DELETE,
        &format!("/sandboxes/{}", sa.sandbox_id),
        &[("x-api-key", KEY)],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(records_named(&h, &key), 0);

    // Nothing names or stacks the three pauses' layers now: once every
    // node answers again (a sweep keeps every note while one does not, and
    // the cut-off hosts drop their stale copies when back), the gateways'
    // sweeps remove them from the bucket.
    for name in [&home, &second] {
        let i = h
            .node_hosts
            .iter()
            .position(|n| &n.name == name)
            .expect("a host");
        h.node_hosts[i].reconnect().expect("cable back");
        h.wait_up(i).await;
    }
    let admins: Vec<String> = h.gateways.iter().map(|g| g.addr("gateway admin")).collect();
    wait_until(
        "the sweeps to remove the three paused layers",
        Duration::from_secs(60),
        || {
            let admins = admins.clone();
            async move {
                let mut removed = 0;
                for a in &admins {
                    let m = send(a, Method::GET, "/metrics", &[], None).await.text();
                    removed += m
                        .lines()
                        .find_map(|l| l.strip_prefix("warren_gateway_blobs_removed_total "))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                        .unwrap_or(0.0) as u64;
                }
                (removed >= 3).then_some(())
            }
        },
    )
    .await;
}

/// Pulls the cable of `node`'s host and resumes sandbox `id` through
/// `gateway`: the sandbox as it answers (201).
pub(super) async fn cut_off_and_resume(h: &Hosts, node: &str, gateway: &str, id: &str) -> Value {
    let host = h
        .node_hosts
        .iter()
        .find(|n| n.name == node)
        .unwrap_or_else(|| panic!("{node}'s host"));
    host.disconnect().expect("cable out");
    let r = send(
        gateway,
        Method::POST,
        &format!("/sandboxes/{id}/resume"),
        &[("x-api-key", KEY)],
        Some(json!({"timeout": 120})),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    r.expect_json()
}

/// Pauses sandbox `id` filesystem-only through `gateway`.
pub(super) async fn pause_filesystem_only(gateway: &str, id: &str) {
    let r = send(
        gateway,
        Method::POST,
        &format!("/sandboxes/{id}/pause"),
        &[("x-api-key", KEY)],
        Some(json!({"memory": false})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "pause {id}: {}", r.text());
}
