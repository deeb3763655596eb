//! Volumes in the scheduler's store, through the API, on both backends:
//! names unique per team, a team's bounds held, tokens sealed and checked
//! (a token opens only its volume), where a volume's users are placed
//! (its node for a local volume, a node with the shared store otherwise;
//! a fork mounts its parent's; a move stays with local volumes), and a
//! delete refused while any sandbox mounts it, and mounts refused once its
//! delete began.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;

async fn node_with_store(c: &mut Client, node_id: &str, store: &str, max_bytes: u64) -> u64 {
    let inc = incarnation();
    c.register_node(pb::RegisterNodeRequest {
        node_id: node_id.into(),
        endpoint: format!("{node_id}.test:7000"),
        capacity: 10,
        incarnation: inc,
        volume_store: store.into(),
        volume_max_bytes: max_bytes,
        ..Default::default()
    })
    .await
    .unwrap();
    inc
}

async fn create(c: &mut Client, team: &str, name: &str) -> Result<pb::Volume, tonic::Status> {
    c.create_volume(pb::CreateVolumeRequest {
        team_id: team.into(),
        name: name.into(),
        bounds: Some(pb::VolumeBounds {
            max_count: 3,
            max_bytes: 2500,
        }),
    })
    .await
    .map(|r| r.into_inner())
}

fn mounting(team: &str, names: &[(&str, &str)]) -> pb::PlaceRequest {
    pb::PlaceRequest {
        volume_mounts: names
            .iter()
            .map(|(n, p)| pb::VolumeMountRequest {
                name: n.to_string(),
                path: p.to_string(),
            })
            .collect(),
        ..place_req(team)
    }
}

async fn route(c: &mut Client, id: &str, token: &str) -> Result<pb::VolumeRoute, tonic::Status> {
    c.route_volume(pb::RouteVolumeRequest {
        volume_id: id.into(),
        token: token.into(),
        avoid_node_id: String::new(),
    })
    .await
    .map(|r| r.into_inner())
}

async fn begin_delete(c: &mut Client, team: &str, id: &str) -> Result<pb::Volume, tonic::Status> {
    c.begin_delete_volume(pb::BeginDeleteVolumeRequest {
        volume_id: id.into(),
        team_id: team.into(),
    })
    .await
    .map(|r| r.into_inner())
}

async fn local_volumes_pin_their_users_and_outlive_them(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    // No store anywhere: no volume, and a clear reason.
    register(&mut c, "plain", 10).await;
    let e = assert_status(
        create(&mut c, "t", "v").await,
        Code::FailedPrecondition,
        "volume store",
    );
    assert_eq!(reason(&e).as_deref(), Some("no-volume-store"));
    node_with_store(&mut c, "node-a", "local", 1000).await;
    node_with_store(&mut c, "node-b", "local", 1000).await;

    let v = create(&mut c, "t", "data").await.unwrap();
    assert!(v.token.starts_with("vt_") && v.max_bytes == 1000, "{v:?}");
    assert!(v.node_id == "node-a" || v.node_id == "node-b", "{v:?}");
    // A name is the team's: taken in the team, free in another.
    assert_status(
        create(&mut c, "t", "data").await,
        Code::AlreadyExists,
        "named data",
    );
    // The second volume goes to the node holding fewer.
    let w = create(&mut c, "t", "more").await.unwrap();
    assert_ne!(w.node_id, v.node_id, "{w:?}");
    let theirs = create(&mut c, "u", "data").await.unwrap();

    // Reads: the token only when asked, only for the team.
    let got = c
        .get_volume(pb::GetVolumeRequest {
            volume_id: v.volume_id.clone(),
            team_id: "t".into(),
            with_token: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.token, v.token);
    let other_team = c
        .get_volume(pb::GetVolumeRequest {
            volume_id: v.volume_id.clone(),
            team_id: "u".into(),
            with_token: true,
        })
        .await;
    assert_status(other_team, Code::NotFound, "not found");
    let listed = c
        .list_volumes(pb::ListVolumesRequest {
            team_id: "t".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .volumes;
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|l| l.token.is_empty()), "{listed:?}");

    // A token opens its volume only.
    let r = route(&mut c, &v.volume_id, &v.token).await.unwrap();
    assert_eq!(
        (r.node_id.as_str(), r.endpoint.is_empty()),
        (v.node_id.as_str(), false)
    );
    assert_status(
        route(&mut c, &v.volume_id, &w.token).await,
        Code::Unauthenticated,
        "token",
    );
    assert_status(
        route(&mut c, &v.volume_id, &theirs.token).await,
        Code::Unauthenticated,
        "token",
    );
    assert_status(
        route(&mut c, &v.volume_id, "").await,
        Code::Unauthenticated,
        "token",
    );

    // A sandbox that mounts it goes to its node, and gets the mount.
    let p = c
        .place(mounting("t", &[("data", "/mnt//data/")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p.node_id, v.node_id);
    let m = &p.binding.as_ref().unwrap().volume_mounts;
    assert_eq!(
        (m.len(), m[0].path.as_str(), m[0].volume_id.as_str()),
        (1, "/mnt/data", v.volume_id.as_str())
    );
    record(&mut c, &p).await;
    assert_eq!(
        get(&mut c, &p.sandbox_id)
            .await
            .unwrap()
            .volume_mounts
            .len(),
        1
    );
    // Volumes of two nodes in one sandbox: refused, naming both.
    assert_status(
        c.place(mounting("t", &[("data", "/a"), ("more", "/b")]))
            .await,
        Code::InvalidArgument,
        "one node",
    );
    // Another team's name: not found (its own volume of that name is its own).
    assert_status(
        c.place(mounting("v", &[("data", "/a")])).await,
        Code::NotFound,
        "data",
    );
    let pu = c
        .place(mounting("u", &[("data", "/a")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pu.binding.unwrap().volume_mounts[0].volume_id,
        theirs.volume_id
    );
    // Bad paths never reach the store.
    for bad in ["relative", "/proc/x", "/a/../b", "/"] {
        assert_status(
            c.place(mounting("t", &[("data", bad)])).await,
            Code::InvalidArgument,
            "",
        );
    }

    // A fork mounts its parent's volumes; a move stays with them.
    let f = c
        .place(pb::PlaceRequest {
            fork_of: p.sandbox_id.clone(),
            require_node_id: p.node_id.clone(),
            ..place_req("t")
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(f.binding.unwrap().volume_mounts.len(), 1);
    assert_status(
        c.reassign(pb::ReassignRequest {
            sandbox_id: p.sandbox_id.clone(),
            node_id: String::new(),
        })
        .await,
        Code::FailedPrecondition,
        "cannot move",
    );

    // Mounted (by the parent and the fork): no delete, naming them.
    let e = assert_status(
        begin_delete(&mut c, "t", &v.volume_id).await,
        Code::FailedPrecondition,
        &p.sandbox_id,
    );
    assert_eq!(reason(&e).as_deref(), Some("volume-mounted"));
    for (id, node, gen) in [
        (&p.sandbox_id, &p.node_id, p.generation),
        (&f.sandbox_id, &f.node_id, f.generation),
    ] {
        event(&mut c, node, id, gen, pb::EventType::Delete).await;
    }
    // Every sandbox gone: the delete begins, and then nothing mounts it.
    let d = begin_delete(&mut c, "t", &v.volume_id).await.unwrap();
    assert_eq!(d.state, pb::VolumeState::Deleting as i32);
    let e = assert_status(
        c.place(mounting("t", &[("data", "/a")])).await,
        Code::FailedPrecondition,
        "deleted",
    );
    assert_eq!(reason(&e).as_deref(), Some("volume-deleting"));
    // Another team cannot delete it; its own finish does.
    assert_status(
        begin_delete(&mut c, "u", &v.volume_id).await,
        Code::NotFound,
        "",
    );
    c.finish_delete_volume(pb::FinishDeleteVolumeRequest {
        volume_id: v.volume_id.clone(),
        team_id: "t".into(),
    })
    .await
    .unwrap();
    assert_status(
        route(&mut c, &v.volume_id, &v.token).await,
        Code::Unauthenticated,
        "",
    );
    // The name is free again.
    create(&mut c, "t", "data").await.unwrap();
}

async fn a_local_volume_is_unavailable_while_its_node_is_down(store: TestStore) {
    let s = Sched::start_fast(&store, &[]).await;
    let mut c = s.client().await;
    node_with_store(&mut c, "node-a", "local", 1000).await;
    let v = create(&mut c, "t", "data").await.unwrap();
    // node-b keeps heartbeating; node-a never does.
    let inc = node_with_store(&mut c, "node-b", "local", 1000).await;
    let _b = Heartbeats::start(c.clone(), "node-b", inc);
    let e = eventually("node-a's lease to run out", || {
        let mut c = c.clone();
        async move {
            let r = c.place(mounting("t", &[("data", "/mnt/data")])).await;
            match r {
                Err(e) if e.code() == Code::FailedPrecondition => Some(e),
                _ => None,
            }
        }
    })
    .await;
    assert_eq!(reason(&e).as_deref(), Some("node-down"));
    assert!(e.message().contains("node-a"), "{}", e.message());
    let e = assert_status(
        route(&mut c, &v.volume_id, &v.token).await,
        Code::FailedPrecondition,
        "node-a",
    );
    assert_eq!(reason(&e).as_deref(), Some("node-down"));
    // Without volumes, sandboxes go elsewhere meanwhile.
    assert_eq!(place(&mut c, "t").await.node_id, "node-b");
}

async fn shared_volumes_go_to_nodes_with_the_shared_store(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    node_with_store(&mut c, "local-1", "local", 1000).await;
    node_with_store(&mut c, "shared-1", "shared", 0).await;
    node_with_store(&mut c, "shared-2", "shared", 0).await;
    // Once a live node declares the shared store, volumes are made there.
    let v = create(&mut c, "t", "s").await.unwrap();
    assert_eq!((v.node_id.as_str(), v.max_bytes), ("", 0));
    // Users go to nodes with the shared store only, and may move among them.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let p = c
            .place(mounting("t", &[("s", "/mnt/s")]))
            .await
            .unwrap()
            .into_inner();
        assert!(p.node_id.starts_with("shared-"), "{}", p.node_id);
        seen.insert(p.node_id.clone());
        record(&mut c, &p).await;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    let p = c
        .place(mounting("t", &[("s", "/mnt/s")]))
        .await
        .unwrap()
        .into_inner();
    record(&mut c, &p).await;
    let moved = c
        .reassign(pb::ReassignRequest {
            sandbox_id: p.sandbox_id.clone(),
            node_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        moved.node_id.starts_with("shared-") && moved.node_id != p.node_id,
        "{moved:?}"
    );
    assert_eq!(moved.binding.unwrap().volume_mounts.len(), 1);
    // Its content is served by a node with the shared store; another one
    // when the gateway cannot reach the first.
    let r = route(&mut c, &v.volume_id, &v.token).await.unwrap();
    assert!(r.node_id.starts_with("shared-"), "{r:?}");
    let other = c
        .route_volume(pb::RouteVolumeRequest {
            volume_id: v.volume_id.clone(),
            token: v.token.clone(),
            avoid_node_id: r.node_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        other.node_id.starts_with("shared-") && other.node_id != r.node_id,
        "{other:?}"
    );
}

async fn a_teams_volumes_are_bounded(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    node_with_store(&mut c, "node-a", "local", 1000).await;
    // Bounds: 3 volumes, 2500 bytes of limits: the third (3000) is past
    // the bytes.
    create(&mut c, "t", "a").await.unwrap();
    create(&mut c, "t", "b").await.unwrap();
    let e = assert_status(
        create(&mut c, "t", "c").await,
        Code::ResourceExhausted,
        "2500",
    );
    assert_eq!(bound(&e).as_deref(), Some("team-volume-bytes"));
    // Another team is not held by this one's.
    create(&mut c, "u", "a").await.unwrap();
    // Smaller limits: the count binds.
    node_with_store(&mut c, "node-a", "local", 10).await;
    create(&mut c, "v", "a").await.unwrap();
    create(&mut c, "v", "b").await.unwrap();
    create(&mut c, "v", "c").await.unwrap();
    let e = assert_status(
        create(&mut c, "v", "d").await,
        Code::ResourceExhausted,
        "3 volumes",
    );
    assert_eq!(bound(&e).as_deref(), Some("team-volumes"));
    // Names are checked.
    for bad in ["", "a b", "../x", &"x".repeat(65)] {
        assert_status(create(&mut c, "t", bad).await, Code::InvalidArgument, "");
    }
}

on_both_stores!(
    local_volumes_pin_their_users_and_outlive_them,
    a_local_volume_is_unavailable_while_its_node_is_down,
    shared_volumes_go_to_nodes_with_the_shared_store,
    a_teams_volumes_are_bounded,
);
