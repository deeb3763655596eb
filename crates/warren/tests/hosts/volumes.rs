//! Volumes on an operator's shared POSIX mount (`--volume-shared`): here a
//! directory on this machine's disk stands for it, the one thing the hosts
//! share besides the network.

use super::*;

/// Any node mounts any volume of the shared store: two sandboxes on two
/// hosts mount one volume at once and each sees what the other writes; one
/// paused filesystem-only and its host cut off resumes on a third host
/// with the volume mounted again, its files there; the content API keeps
/// answering through whichever node is up; and the volume is deleted once
/// no sandbox mounts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_volume_follows_a_sandbox_resumed_on_another_host() {
    let shared = tempfile::tempdir().expect("the shared volume store");
    let store = shared.path().display().to_string();
    let WithBlobs {
        garage: _garage,
        blobs: _blobs,
        store: _templates,
        hosts: h,
    } = Hosts::start_with_blobs(Setup {
        // One sandbox per node: the second sandbox, and the resumed one,
        // must go to other hosts.
        capacity: Some(1),
        node_args: strings(&["--volume-shared", "--volume-dir", &store]),
        ..Setup::default()
    })
    .await;
    let gateways: Vec<String> = h.gateways.iter().map(|g| g.addr("gateway http")).collect();
    let key = [("x-api-key", KEY)];
    let v = send(
        &gateways[0],
        Method::POST,
        "/volumes",
        &key,
        Some(json!({"name": "shared"})),
    )
    .await;
    assert_eq!(v.status, StatusCode::CREATED, "{}", v.text());
    let v = v.expect_json();
    let id = v["volumeID"].as_str().expect("an id").to_string();
    let auth = format!("Bearer {}", v["token"].as_str().expect("a token"));
    // Its directory is in the shared store, no node's own.
    assert!(shared.path().join(&id).is_dir());
    let put = Http::new(Duration::from_secs(60))
        .send_raw(
            Method::PUT,
            &gateways[1],
            &format!("/volumecontent/{id}/file?path=/from-api.txt"),
            &[("authorization", auth.as_str())],
            bytes::Bytes::from_static(b"written through the API"),
        )
        .await
        .expect("put");
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text());

    let create = |gateway: String| async move {
        let r = send(
            &gateway,
            Method::POST,
            "/v2/sandboxes",
            &[("x-api-key", KEY)],
            Some(json!({
                "templateID": "base", "timeout": 120, "allow_internet_access": false,
                "volumeMounts": [{"name": "shared", "path": "/mnt/shared"}],
            })),
        )
        .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r.expect_json()
    };
    let a = create(gateways[0].clone()).await;
    let b = create(gateways[1].clone()).await;
    assert_ne!(a["clientID"], b["clientID"], "two hosts");
    let client = warren_client::Client::new(&[format!("http://{}", h.balancer.addr)], KEY)
        .expect("a client");
    let sa: warren_client::Sandbox = serde_json::from_value(a.clone()).expect("a sandbox");
    let sb: warren_client::Sandbox = serde_json::from_value(b.clone()).expect("a sandbox");
    assert_eq!(
        stdout_of(&client, &sa, "cat /mnt/shared/from-api.txt").await,
        "written through the API"
    );
    stdout_of(&client, &sa, "echo -n from-a > /mnt/shared/a.txt").await;
    assert_eq!(
        stdout_of(&client, &sb, "cat /mnt/shared/a.txt").await,
        "from-a"
    );
    stdout_of(&client, &sb, "echo -n from-b > /mnt/shared/b.txt").await;
    assert_eq!(
        stdout_of(&client, &sa, "cat /mnt/shared/b.txt").await,
        "from-b"
    );

    // A paused filesystem-only, its host cut off: it resumes on the third
    // host, the volume mounted there.
    super::pauses::pause_filesystem_only(&gateways[0], &sa.sandbox_id).await;
    let home = a["clientID"].as_str().expect("a node").to_string();
    let moved = super::pauses::cut_off_and_resume(&h, &home, &gateways[1], &sa.sandbox_id).await;
    assert!(
        moved["clientID"] != a["clientID"] && moved["clientID"] != b["clientID"],
        "{moved}"
    );
    assert_eq!(
        stdout_of(&client, &sa, "cat /mnt/shared/a.txt /mnt/shared/b.txt").await,
        "from-afrom-b"
    );
    stdout_of(
        &client,
        &sa,
        "echo -n after-the-move > /mnt/shared/moved.txt",
    )
    .await;
    assert_eq!(
        stdout_of(&client, &sb, "cat /mnt/shared/moved.txt").await,
        "after-the-move"
    );
    // The content API answers through whichever node serves it now (not
    // the cut-off one), through either gateway.
    for g in &gateways {
        let r = Http::new(Duration::from_secs(60))
            .send(
                Method::GET,
                g,
                &format!("/volumecontent/{id}/file?path=/moved.txt"),
                &[("authorization", auth.as_str())],
                None,
            )
            .await
            .expect("get");
        assert_eq!(
            (r.status, r.text().as_str()),
            (StatusCode::OK, "after-the-move")
        );
    }

    // Mounted: no delete; once both are gone, deleted.
    let r = send(
        &gateways[0],
        Method::DELETE,
        &format!("/volumes/{id}"),
        &key,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    for s in [&sa, &sb] {
        let r = send(
            &gateways[1],
            Method::DELETE,
            &format!("/sandboxes/{}", s.sandbox_id),
            &key,
            None,
        )
        .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    }
    let r = send(
        &gateways[0],
        Method::DELETE,
        &format!("/volumes/{id}"),
        &key,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert!(!shared.path().join(&id).exists());
    let i = h
        .node_hosts
        .iter()
        .position(|n| n.name == home)
        .expect("a host");
    h.node_hosts[i].reconnect().expect("cable back");
}
