//! Template builds behind a round-robin balancer.

use super::*;

/// A template build behind a round-robin balancer, nothing shared but the
/// network: the upload link one gateway made is taken by the other, the
/// build runs on one and its status and log are read through the other,
/// every node starts the template (fetching its layers), two gateways
/// racing on one tag: one wins; a build past the team's template bound is
/// refused at its request; and a build whose gateway dies fails, naming
/// that gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_template_built_through_one_gateway_is_read_through_another_and_used_everywhere() {
    // Both gateways sign upload links with one key.
    let keys = tempfile::tempdir().expect("a directory");
    let link_key = keys.path().join("upload-link.key");
    warren_core::private::write(&link_key, warren_core::id::random_token(43).as_bytes())
        .expect("the link key");
    let WithBlobs {
        garage: _garage,
        blobs: _blobs,
        store: _store,
        hosts: h,
    } = Hosts::start_with_blobs(Setup {
        // One sandbox each: the template's sandboxes go to every node.
        capacity: Some(1),
        gateway_args: strings(&[
            "--build-upload-key-file",
            &link_key.display().to_string(),
            "--build-lease",
            "3s",
            "--template-team-count",
            "2",
        ]),
        ..Setup::default()
    })
    .await;
    let gateways: Vec<String> = h.gateways.iter().map(|g| g.addr("gateway http")).collect();
    let auth = [("x-api-key", KEY)];

    // Requested through the first gateway.
    let r = send(
        &gateways[0],
        Method::POST,
        "/v3/templates",
        &auth,
        Some(json!({"name": "built-here", "cpuCount": 1, "memoryMB": 512})),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let build = r.str("buildID");

    // COPY's archive: the link from the first gateway, the upload to the
    // second.
    let files = tempfile::tempdir().expect("a directory");
    std::fs::write(files.path().join("hello.txt"), "copied across hosts\n").expect("a file");
    let tar = std::process::Command::new("tar")
        .arg("-cf")
        .arg("-")
        .arg("-C")
        .arg(files.path())
        .arg("hello.txt")
        .output()
        .expect("tar");
    assert!(tar.status.success());
    let hash = "c".repeat(64);
    let r = send(
        &gateways[0],
        Method::GET,
        &format!("/templates/built-here/files/{hash}"),
        &auth,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.expect_json()["present"], false, "{}", r.text());
    let url = r.str("url");
    let path = &url[url.find("/_warren/").expect("an upload path")..];
    let put = Http::new(Duration::from_secs(60))
        .send_raw(
            Method::PUT,
            &gateways[1],
            path,
            &[],
            bytes::Bytes::from(tar.stdout),
        )
        .await
        .expect("the upload");
    assert_eq!(put.status, StatusCode::OK, "{}", put.text());
    let r = send(
        &gateways[0],
        Method::GET,
        &format!("/templates/built-here/files/{hash}"),
        &auth,
        None,
    )
    .await;
    assert_eq!(r.expect_json()["present"], true, "{}", r.text());

    // Started through the second gateway; status and log through the first.
    let steps = json!({
        "fromTemplate": "base",
        "steps": [
            {"type": "COPY", "args": ["hello.txt", "/home/user/hello.txt", "user", ""],
             "filesHash": hash},
            {"type": "RUN", "args": ["echo built on $(hostname) > /home/user/built.txt; echo step-output-marker"]},
        ],
    });
    let r = send(
        &gateways[1],
        Method::POST,
        &format!("/v2/templates/built-here/builds/{build}"),
        &auth,
        Some(steps.clone()),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    // Claimed once: a second start, through either gateway, is refused.
    let again = send(
        &gateways[0],
        Method::POST,
        &format!("/v2/templates/built-here/builds/{build}"),
        &auth,
        Some(steps),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.text());
    let status = wait_build(&gateways[0], "built-here", &build, "ready").await;
    let logs = status["logs"].to_string();
    assert!(logs.contains("step-output-marker"), "{status}");

    // Every node starts it, from the blob store.
    let mut on = std::collections::BTreeSet::new();
    let mut sandboxes = Vec::new();
    for i in 0..3 {
        let s = h.create_from(&gateways[i % 2], "built-here").await;
        on.insert(s["clientID"].as_str().unwrap_or_default().to_string());
        sandboxes.push(s);
    }
    let client = warren_client::Client::new(&[format!("http://{}", h.balancer.addr)], KEY)
        .expect("a client");
    for s in &sandboxes {
        let sb: warren_client::Sandbox = serde_json::from_value(s.clone()).expect("a sandbox");
        let said = stdout_of(
            &client,
            &sb,
            "cat /home/user/hello.txt /home/user/built.txt",
        )
        .await;
        assert!(
            said.starts_with("copied across hosts\nbuilt on "),
            "{s}: {said}"
        );
    }
    assert_eq!(on.len(), 3, "the template's sandboxes ran on {on:?}");
    for s in &sandboxes {
        let sb: warren_client::Sandbox = serde_json::from_value(s.clone()).expect("a sandbox");
        client.kill(&sb.sandbox_id).await.expect("killed");
    }

    // Two gateways give one new tag at once, then take it away at once:
    // each time one wins, and the other's answer says why it did not.
    let assign = |gw: String| async move {
        send(
            &gw,
            Method::POST,
            "/templates/tags",
            &[("x-api-key", KEY)],
            Some(json!({"target": "built-here:default", "tags": ["raced"]})),
        )
        .await
    };
    let (one, two) = tokio::join!(assign(gateways[0].clone()), assign(gateways[1].clone()));
    let got = [one.status.as_u16(), two.status.as_u16()];
    assert!(
        got.contains(&201) && got.iter().all(|s| [201, 409].contains(s)),
        "{} / {}",
        one.text(),
        two.text()
    );
    let tagged = h.create_from(&gateways[1], "built-here:raced").await;
    let sb: warren_client::Sandbox = serde_json::from_value(tagged).expect("a sandbox");
    client.kill(&sb.sandbox_id).await.expect("killed");
    let remove = |gw: String| async move {
        let body = json!({"name": "built-here", "tags": ["raced"]});
        send(
            &gw,
            Method::DELETE,
            "/templates/tags",
            &[("x-api-key", KEY)],
            Some(body),
        )
        .await
    };
    let (one, two) = tokio::join!(remove(gateways[0].clone()), remove(gateways[1].clone()));
    let mut got = [one.status.as_u16(), two.status.as_u16()];
    got.sort();
    assert!(
        got == [204, 404] || got == [204, 409],
        "{} / {}",
        one.text(),
        two.text()
    );
    let r = h.try_create(&gateways[0], "built-here:raced").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());

    // The team keeps one template of two: a build of two more tags is
    // refused at its request, before anything runs.
    let r = send(
        &gateways[1],
        Method::POST,
        "/v3/templates",
        &auth,
        Some(json!({"name": "too-many", "tags": ["one", "two"]})),
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert!(
        r.message().contains("--template-team-count"),
        "{}",
        r.text()
    );

    // A build whose gateway dies: its lease runs out and the build fails,
    // naming that gateway (read through the other).
    let r = send(
        &gateways[0],
        Method::POST,
        "/v3/templates",
        &auth,
        Some(json!({"name": "orphaned"})),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let build = r.str("buildID");
    let r = send(
        &gateways[0],
        Method::POST,
        &format!("/v2/templates/orphaned/builds/{build}"),
        &auth,
        Some(json!({"fromTemplate": "base", "steps": [
            {"type": "RUN", "args": ["echo waiting-marker; sleep 600"]}]})),
    )
    .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    wait_until(
        "the build to run its step",
        Duration::from_secs(120),
        || {
            let gw = gateways[1].clone();
            let build = build.clone();
            async move {
                let r = send(
                    &gw,
                    Method::GET,
                    &format!("/templates/orphaned/builds/{build}/status"),
                    &[("x-api-key", KEY)],
                    None,
                )
                .await;
                r.text().contains("waiting-marker").then_some(())
            }
        },
    )
    .await;
    let mut h = h;
    h.gateways[0].kill9().await;
    let status = wait_build(&gateways[1], "orphaned", &build, "error").await;
    let reason = status["reason"]["message"].to_string();
    assert!(
        reason.contains("lease") && reason.contains("gateway"),
        "{status}"
    );
}

/// Polls a build's status through `gw` until it is `want` (up to 10 min:
/// a guard against a hang), failing at once on the other end state.
async fn wait_build(gw: &str, template: &str, build: &str, want: &str) -> Value {
    let path = format!("/templates/{template}/builds/{build}/status");
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        let r = send(gw, Method::GET, &path, &[("x-api-key", KEY)], None).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let v = r.expect_json();
        let status = v["status"].as_str().unwrap_or_default().to_string();
        if status == want {
            return v;
        }
        assert!(
            !["ready", "error"].contains(&status.as_str()),
            "the build ended {status}, not {want}: {v}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the build is still {status}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
