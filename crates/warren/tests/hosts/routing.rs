//! Routing across hosts, and a node's host cut off.

use super::*;

/// Sandboxes spread over three hosts and are reached from every entry;
/// a node's host cut off from the network answers `node_down` once its
/// lease runs out while the others keep answering and new sandboxes go
/// elsewhere; plugged back in, its sandbox answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parts_on_separate_hosts_route_and_survive_a_host_cut_off() {
    let h = Hosts::start(Setup::default()).await;
    assert_eq!(h.schedulers.len(), 2);
    assert_eq!(h.nodes.len(), 3);

    // Least loaded first: one sandbox on each node's host.
    let mut on = Vec::new();
    for _ in 0..3 {
        let sb = h.create().await;
        on.push((
            sb["sandboxID"].as_str().expect("id").to_string(),
            sb["clientID"].as_str().expect("clientID").to_string(),
        ));
    }
    let mut nodes: Vec<&str> = on.iter().map(|(_, n)| n.as_str()).collect();
    nodes.sort();
    assert_eq!(nodes, ["node-1", "node-2", "node-3"], "{on:?}");
    for entry in h.entries() {
        for (id, node) in &on {
            let r = h.health(&entry, id).await;
            assert_eq!(
                r.status,
                StatusCode::NO_CONTENT,
                "{id} on {node} through {entry}: {}",
                r.message()
            );
        }
    }

    // node-2's host loses its network.
    let (cut_id, _) = on
        .iter()
        .find(|(_, n)| n == "node-2")
        .cloned()
        .expect("a sandbox on node-2");
    h.node_hosts[1].disconnect().expect("cable out");
    let down = wait_until(
        "node-2's sandbox to answer node_down",
        Duration::from_secs(60),
        || {
            let (h, id) = (&h, cut_id.clone());
            async move {
                let r = h.health(&h.balancer.addr, &id).await;
                (r.status == StatusCode::BAD_GATEWAY
                    && r.expect_json()["error_code"] == "node_down")
                    .then_some(r)
            }
        },
    )
    .await;
    assert_eq!(
        down.message(),
        format!("sandbox {cut_id} is on a node that is down")
    );
    for (id, node) in on.iter().filter(|(id, _)| *id != cut_id) {
        let r = h.health(&h.balancer.addr, id).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{id} on {node}");
    }
    let elsewhere = h.create().await;
    assert_ne!(elsewhere["clientID"], "node-2", "{elsewhere}");
    let id = elsewhere["sandboxID"].as_str().expect("id");
    assert_eq!(
        h.health(&h.balancer.addr, id).await.status,
        StatusCode::NO_CONTENT
    );

    // Plugged back in: it registers again with its roster, and the
    // scheduler gives it back the sandbox nobody took over meanwhile
    // (docs/node-loss.md): it answers again, through every entry.
    h.node_hosts[1].reconnect().expect("cable in");
    h.wait_up(1).await;
    wait_until(
        "node-2's sandbox to answer again",
        Duration::from_secs(60),
        || {
            let (h, id) = (&h, cut_id.clone());
            async move {
                let r = h.health(&h.balancer.addr, &id).await;
                (r.status == StatusCode::NO_CONTENT).then_some(())
            }
        },
    )
    .await;
    // Each entry on its own: a gateway may learn it later than another (its
    // watch, or a pooled connection to the host that died while it was
    // cut off and is found dead on first use), so each is waited for.
    for entry in h.entries() {
        wait_until(
            &format!("node-2's sandbox to answer through {entry}"),
            Duration::from_secs(60),
            || {
                let (h, id, entry) = (&h, cut_id.clone(), entry.clone());
                async move {
                    let r = h.health(&entry, &id).await;
                    (r.status == StatusCode::NO_CONTENT).then_some(())
                }
            },
        )
        .await;
    }
}
