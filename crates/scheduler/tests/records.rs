//! Template records, unused-blob notes and COPY uploads in the store,
//! through the API: round trips of every kind, writes fenced on the
//! version read (two replicas racing on one record: exactly one wins,
//! nothing partial), a team's bounds held under concurrent writers, notes
//! of layers a record stops naming, uploads and their expiry.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::collections::{BTreeSet, HashMap};
use tonic::{Code, Status};
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::{BlobRemoval, RecordKind};

fn defaults() -> pb::TemplateDefaults {
    pb::TemplateDefaults {
        user: "user".into(),
        workdir: "/home/user".into(),
        env: HashMap::from([("LANG".into(), "C.UTF-8".into())]),
        start_cmd: "python3 -m http.server".into(),
        ready_cmd: "curl -sf localhost:8000".into(),
        ready_timeout_secs: 30,
        cpu_count: 2,
        memory_mb: 512,
        disk_mb: 2048,
    }
}

fn operator(name: &str) -> pb::TemplateRecord {
    pb::TemplateRecord {
        name: name.into(),
        kind: RecordKind::Operator as i32,
        digest: blob(1),
        defaults: Some(defaults()),
        source: "build templates/base.toml".into(),
        images: vec!["e2bdev/base".into()],
        created_at_ms: 1_000,
        ..Default::default()
    }
}

/// A team's record of `kind` with layers `(digest n, size)`.
fn teams(name: &str, kind: RecordKind, team: &str, layers: &[(u64, u64)]) -> pb::TemplateRecord {
    pb::TemplateRecord {
        name: name.into(),
        kind: kind as i32,
        team_id: team.into(),
        digest: blob(1),
        layers: layers
            .iter()
            .map(|(n, size)| pb::Layer {
                digest: blob(*n),
                size_bytes: *size,
            })
            .collect(),
        defaults: Some(defaults()),
        source: "snapshot of abc123".into(),
        snapshot: Some(pb::SnapshotMeta {
            name: format!("{name}-named"),
            source_sandbox: "abc123".into(),
            node_id: "node-a".into(),
            paused: None,
            public: false,
        }),
        ..Default::default()
    }
}

fn snapshot(name: &str, team: &str, layers: &[(u64, u64)]) -> pb::TemplateRecord {
    teams(name, RecordKind::Snapshot, team, layers)
}

fn paused(sandbox: &str) -> pb::TemplateRecord {
    let mut r = teams(
        &format!("paused-{sandbox}"),
        RecordKind::Paused,
        "",
        &[(7, 10), (8, 20)],
    );
    let s = r.snapshot.as_mut().unwrap();
    s.source_sandbox = sandbox.into();
    s.paused = Some(pb::PausedMeta {
        generation: 4,
        settings_json: r#"{"egress":{"deny":["10.0.0.0/8"]}}"#.into(),
        own_layers: vec![blob(8)],
    });
    r
}

async fn put(
    c: &mut Client,
    records: Vec<(pb::TemplateRecord, u64)>,
    bounds: pb::RecordBounds,
) -> Result<Vec<pb::TemplateRecord>, Status> {
    c.put_template_records(pb::PutTemplateRecordsRequest {
        puts: records
            .into_iter()
            .map(|(record, expected_version)| pb::RecordPut {
                record: Some(record),
                expected_version,
            })
            .collect(),
        bounds: Some(bounds),
    })
    .await
    .map(|r| r.into_inner().records)
}

async fn put_one(
    c: &mut Client,
    r: pb::TemplateRecord,
    expected: u64,
) -> Result<pb::TemplateRecord, Status> {
    put(c, vec![(r, expected)], pb::RecordBounds::default())
        .await
        .map(|mut v| v.remove(0))
}

async fn get_record(c: &mut Client, name: &str, team: &str) -> Result<pb::TemplateRecord, Status> {
    c.get_template_record(pb::GetTemplateRecordRequest {
        name: name.into(),
        team_id: team.into(),
    })
    .await
    .map(|r| r.into_inner())
}

async fn delete(c: &mut Client, refs: &[(&str, u64)], team: &str) -> Result<Vec<String>, Status> {
    c.delete_template_records(pb::DeleteTemplateRecordsRequest {
        records: refs
            .iter()
            .map(|(name, v)| pb::RecordRef {
                name: name.to_string(),
                expected_version: *v,
            })
            .collect(),
        team_id: team.into(),
    })
    .await
    .map(|r| r.into_inner().noted_digests)
}

/// Every page of a listing.
async fn list_all(c: &mut Client, mut req: pb::ListTemplateRecordsRequest) -> Vec<String> {
    let mut names = Vec::new();
    loop {
        let r = c
            .list_template_records(req.clone())
            .await
            .unwrap()
            .into_inner();
        assert!(r.records.len() <= req.page_size.max(1) as usize);
        names.extend(r.records.into_iter().map(|r| r.name));
        if r.next_page_token.is_empty() {
            return names;
        }
        req.page_token = r.next_page_token;
    }
}

/// What a record is, without what the store sets.
fn content(mut r: pb::TemplateRecord) -> pb::TemplateRecord {
    r.version = 0;
    r.updated_at_ms = 0;
    r
}

async fn every_kind_round_trips(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let mut built = teams("snap-b1", RecordKind::Built, "team-1", &[(5, 100)]);
    built.source = "api build 0f8fad5b".into();
    let mut snap = snapshot("snap-s1", "team-1", &[(5, 100), (6, 50)]);
    snap.created_at_ms = 2_000;
    let records = [operator("base"), snap, built, paused("abc123")];
    for r in &records {
        let written = put_one(&mut c, r.clone(), 0).await.unwrap();
        assert!(written.version > 0);
        assert!(written.updated_at_ms > 0);
        let got = get_record(&mut c, &r.name, "").await.unwrap();
        assert_eq!(got.version, written.version);
        let mut want = r.clone();
        if want.created_at_ms == 0 {
            // 0 means the store's now.
            assert!(got.created_at_ms > 0);
            want.created_at_ms = got.created_at_ms;
        }
        assert_eq!(content(got), want, "{} round trips", r.name);
    }
    // A team sees its own records only.
    assert_status(
        get_record(&mut c, "snap-s1", "team-2").await,
        Code::NotFound,
        "snap-s1",
    );
    assert!(get_record(&mut c, "snap-s1", "team-1").await.is_ok());
    assert_status(
        get_record(&mut c, "nothing", "").await,
        Code::NotFound,
        "nothing",
    );

    // Listings: by name in pages, by team and kind, by source sandbox,
    // newest first.
    let all = pb::ListTemplateRecordsRequest {
        page_size: 1,
        ..Default::default()
    };
    assert_eq!(
        list_all(&mut c, all.clone()).await,
        ["base", "paused-abc123", "snap-b1", "snap-s1"]
    );
    let team1 = pb::ListTemplateRecordsRequest {
        team_id: "team-1".into(),
        kinds: vec![RecordKind::Snapshot as i32],
        ..all.clone()
    };
    assert_eq!(list_all(&mut c, team1).await, ["snap-s1"]);
    let ops = pb::ListTemplateRecordsRequest {
        kinds: vec![RecordKind::Operator as i32, RecordKind::Paused as i32],
        ..all.clone()
    };
    assert_eq!(list_all(&mut c, ops).await, ["base", "paused-abc123"]);
    let newest = pb::ListTemplateRecordsRequest {
        team_id: "team-1".into(),
        order: pb::RecordOrder::CreatedDesc as i32,
        ..all.clone()
    };
    // snap-b1 was made "now", after snap-s1's 2000.
    assert_eq!(list_all(&mut c, newest).await, ["snap-b1", "snap-s1"]);
    let by_sandbox = pb::ListTemplateRecordsRequest {
        source_sandbox: "abc123".into(),
        page_size: 10,
        ..Default::default()
    };
    assert_eq!(list_all(&mut c, by_sandbox).await.len(), 3);

    let usage = c
        .get_team_usage(pb::GetTeamUsageRequest {
            team_id: "team-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((usage.snapshots, usage.templates), (1, 1));
    assert_eq!(
        usage.layer_bytes, 150,
        "a layer two records name counts once"
    );

    // Records survive a restart.
    s.stop().await;
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let got = get_record(&mut c, "paused-abc123", "").await.unwrap();
    let mut want = paused("abc123");
    want.created_at_ms = got.created_at_ms;
    assert_eq!(content(got), want);
}

async fn writes_are_fenced_on_the_version_read(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let v1 = put_one(&mut c, snapshot("snap-a", "t", &[(10, 1), (11, 1)]), 0)
        .await
        .unwrap();
    // Insert-if-absent finds it; a stale version is refused; nothing changes.
    let other = snapshot("snap-a", "t", &[(12, 1)]);
    assert_status(
        put_one(&mut c, other.clone(), 0).await,
        Code::AlreadyExists,
        "already exists",
    );
    assert_status(
        put_one(&mut c, other.clone(), v1.version + 1000).await,
        Code::Aborted,
        "another writer",
    );
    assert_eq!(get_record(&mut c, "snap-a", "").await.unwrap(), v1);
    assert!(noted(&mut c, 0).await.is_empty());
    // A replace keeps the team and an operator record's kind.
    let mut stolen = other.clone();
    stolen.team_id = "u".into();
    assert_status(
        put_one(&mut c, stolen, v1.version).await,
        Code::FailedPrecondition,
        "team",
    );
    let base = put_one(&mut c, operator("base"), 0).await.unwrap();
    let mut over = snapshot("base", "", &[]);
    over.kind = RecordKind::Paused as i32;
    over.snapshot.as_mut().unwrap().paused = Some(pb::PausedMeta::default());
    assert_status(
        put_one(&mut c, over, base.version).await,
        Code::FailedPrecondition,
        "kind operator",
    );

    // The replace at the version read wins; the layers only the old
    // record named are noted.
    let v2 = put_one(
        &mut c,
        snapshot("snap-a", "t", &[(11, 1), (12, 1)]),
        v1.version,
    )
    .await
    .unwrap();
    assert!(v2.version > v1.version);
    let notes: Vec<String> = noted(&mut c, 0)
        .await
        .into_iter()
        .map(|n| n.digest)
        .collect();
    assert_eq!(notes, [blob(10)]);
    // Not due before its grace.
    assert!(noted(&mut c, 3_600_000).await.is_empty());
    // The same put sent again finds itself.
    let again = put_one(
        &mut c,
        snapshot("snap-a", "t", &[(11, 1), (12, 1)]),
        v1.version,
    )
    .await
    .unwrap();
    assert_eq!(again.version, v2.version);

    // Deletes: a stale version, another team's, then the right one.
    assert_status(
        delete(&mut c, &[("snap-a", v1.version)], "").await,
        Code::Aborted,
        "version",
    );
    assert_status(
        delete(&mut c, &[("snap-a", v2.version)], "u").await,
        Code::NotFound,
        "snap-a",
    );
    let gone = delete(&mut c, &[("snap-a", v2.version)], "t")
        .await
        .unwrap();
    assert_eq!(gone, [blob(11), blob(12)]);
    assert_status(
        get_record(&mut c, "snap-a", "").await,
        Code::NotFound,
        "snap-a",
    );
    // A version is never issued twice: one read before the delete never
    // matches the record made again.
    let v3 = put_one(&mut c, snapshot("snap-a", "t", &[]), 0)
        .await
        .unwrap();
    assert!(v3.version > v2.version);
    assert_status(
        delete(&mut c, &[("snap-a", v2.version)], "").await,
        Code::Aborted,
        "version",
    );
}

async fn two_replicas_racing_on_one_record_one_wins(store: TestStore) {
    let a = Sched::start(&store, &[]).await;
    let b = Sched::start(&store, &[]).await;
    let clients = [a.client().await, b.client().await];
    let writer = |i: usize| {
        let mut r = snapshot("snap-race", "t", &[(100 + i as u64, 1)]);
        r.source = format!("writer {i}");
        r
    };
    // Twenty inserts of one name with different contents.
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let mut c = clients[i % 2].clone();
            let r = writer(i);
            tokio::spawn(async move { put_one(&mut c, r, 0).await })
        })
        .collect();
    let mut won = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok(r) => won.push((i, r)),
            Err(e) => assert_eq!(e.code(), Code::AlreadyExists, "{e}"),
        }
    }
    assert_eq!(won.len(), 1, "exactly one insert wins");
    let (winner, first) = won.remove(0);
    let mut c = clients[0].clone();
    let got = get_record(&mut c, "snap-race", "").await.unwrap();
    assert_eq!(got, first);
    assert_eq!(got.source, format!("writer {winner}"));

    // Twenty replaces of the version read: one wins, the rest are ABORTED.
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let mut c = clients[i % 2].clone();
            let mut r = writer(i);
            r.source = format!("replacer {i}");
            let v = first.version;
            tokio::spawn(async move { put_one(&mut c, r, v).await })
        })
        .collect();
    let mut replaced = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => replaced.push(r),
            Err(e) => assert_eq!(e.code(), Code::Aborted, "{e}"),
        }
    }
    assert_eq!(replaced.len(), 1, "exactly one replace wins");
    let now = get_record(&mut c, "snap-race", "").await.unwrap();
    assert_eq!(now, replaced[0]);
    // Its layers are the winner's only: deleting it notes exactly those
    // (and its root, which no record names any more).
    let notes = delete(&mut c, &[("snap-race", now.version)], "")
        .await
        .unwrap();
    assert_eq!(notes, [now.digest.clone(), now.layers[0].digest.clone()]);

    // Two tag batches racing to point {v1, v2} and {v2, v3} at two builds
    // (two layers): one wins whole, the other leaves nothing.
    let tag = |t: &str, build: u64| {
        let mut r = teams(
            &format!("snap-tag-{t}"),
            RecordKind::Built,
            "t",
            &[(build, 1)],
        );
        r.snapshot.as_mut().unwrap().name = format!("app:{t}");
        r
    };
    let batch = |tags: [&str; 2], c: Client| {
        let build = if tags[0] == "v1" { 9 } else { 10 };
        let records = tags.iter().map(|t| (tag(t, build), 0)).collect::<Vec<_>>();
        async move {
            let mut c = c;
            put(&mut c, records, pb::RecordBounds::default()).await
        }
    };
    let (x, y) = tokio::join!(
        batch(["v1", "v2"], clients[0].clone()),
        batch(["v2", "v3"], clients[1].clone())
    );
    let names = list_all(
        &mut c,
        pb::ListTemplateRecordsRequest {
            kinds: vec![RecordKind::Built as i32],
            page_size: 10,
            ..Default::default()
        },
    )
    .await;
    match (x, y) {
        (Ok(_), Err(e)) => {
            assert_eq!(e.code(), Code::AlreadyExists, "{e}");
            assert_eq!(names, ["snap-tag-v1", "snap-tag-v2"]);
        }
        (Err(e), Ok(_)) => {
            assert_eq!(e.code(), Code::AlreadyExists, "{e}");
            assert_eq!(names, ["snap-tag-v2", "snap-tag-v3"]);
        }
        other => panic!("exactly one batch must win: {other:?}"),
    }
}

/// Two gateways (through two replicas) at one template's tag: one moves
/// it to another build while the other deletes it, both at the version
/// they read; then both delete it. Each time exactly one wins, and the
/// other is told plainly that another writer did.
async fn two_gateways_racing_to_tag_and_delete_one_template_one_wins(store: TestStore) {
    let a = Sched::start(&store, &[]).await;
    let b = Sched::start(&store, &[]).await;
    let clients = [a.client().await, b.client().await];
    let mut c = clients[0].clone();
    let tag = |build: u64| {
        let mut r = teams("snap-app-v1", RecordKind::Built, "t", &[(build, 1)]);
        r.snapshot.as_mut().unwrap().name = "app:v1".into();
        r.source = format!("api build {build}");
        r
    };
    let (mut tagged, mut deleted) = (0, 0);
    for round in 0..10u64 {
        let read = put_one(&mut c, tag(1000 + round), 0).await.unwrap();
        let (mut x, mut y) = (
            clients[(round % 2) as usize].clone(),
            clients[1 - (round % 2) as usize].clone(),
        );
        let moved = tag(2000 + round);
        let (put, del) = tokio::join!(
            async move { put_one(&mut x, moved, read.version).await },
            async move { delete(&mut y, &[("snap-app-v1", read.version)], "t").await }
        );
        let now = get_record(&mut c, "snap-app-v1", "t").await;
        match (put, del) {
            (Ok(r), Err(e)) => {
                tagged += 1;
                assert_eq!(e.code(), Code::Aborted, "{e}");
                assert!(e.message().contains("another writer changed it"), "{e}");
                assert_eq!(now.unwrap(), r);
                delete(&mut c, &[("snap-app-v1", r.version)], "t")
                    .await
                    .unwrap();
            }
            (Err(e), Ok(notes)) => {
                deleted += 1;
                assert_eq!(e.code(), Code::Aborted, "{e}");
                assert!(e.message().contains("another writer deleted it"), "{e}");
                // The layer; and the root when no other record names it.
                let layers: Vec<&String> = notes.iter().filter(|d| **d != blob(1)).collect();
                assert_eq!(layers, [&blob(1000 + round)]);
                assert_status(now, Code::NotFound, "snap-app-v1");
            }
            other => panic!("exactly one of the tag and the delete must win: {other:?}"),
        }
    }
    assert_eq!(tagged + deleted, 10);

    // Two deletes of the version read: one deletes, the other finds it gone.
    let read = put_one(&mut c, tag(1), 0).await.unwrap();
    let (mut x, mut y) = (clients[0].clone(), clients[1].clone());
    let (d1, d2) = tokio::join!(
        async move { delete(&mut x, &[("snap-app-v1", read.version)], "t").await },
        async move { delete(&mut y, &[("snap-app-v1", read.version)], "t").await }
    );
    match (d1, d2) {
        (Ok(_), Err(e)) | (Err(e), Ok(_)) => {
            assert_eq!(e.code(), Code::NotFound, "{e}");
            assert!(e.message().contains("snap-app-v1 not found"), "{e}");
        }
        other => panic!("exactly one delete must win: {other:?}"),
    }
    // Two tags of one new name to different builds: one wins, the other is
    // ALREADY_EXISTS; the same tag written twice (a retry, or two gateways
    // agreeing) is no conflict.
    let (mut x, mut y) = (clients[0].clone(), clients[1].clone());
    let (t1, t2) = tokio::join!(
        async move { put_one(&mut x, tag(7), 0).await },
        async move { put_one(&mut y, tag(8), 0).await }
    );
    let won = match (t1, t2) {
        (Ok(r), Err(e)) | (Err(e), Ok(r)) => {
            assert_eq!(e.code(), Code::AlreadyExists, "{e}");
            r
        }
        other => panic!("exactly one tag must win: {other:?}"),
    };
    let mut same = content(won.clone());
    same.created_at_ms = 0;
    assert_eq!(put_one(&mut c, same, 0).await.unwrap(), won);
}

async fn team_bounds_hold_under_concurrent_writers(store: TestStore) {
    let a = Sched::start(&store, &[]).await;
    let b = Sched::start(&store, &[]).await;
    let clients = [a.client().await, b.client().await];
    let bounds = pb::RecordBounds {
        max_snapshots: 3,
        max_templates: 2,
        max_layer_bytes: 1000,
    };
    // Ten snapshots at once against a bound of three.
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let mut c = clients[i % 2].clone();
            let r = snapshot(&format!("snap-{i}"), "t", &[(i as u64 + 1, 10)]);
            tokio::spawn(async move { put(&mut c, vec![(r, 0)], bounds).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
                assert_eq!(reason(&e).as_deref(), Some("quota"));
                assert_eq!(bound(&e).as_deref(), Some("snapshots"));
                assert!(e.message().contains("bound of 3"), "{}", e.message());
            }
        }
    }
    assert_eq!(ok, 3, "exactly the bound's worth of snapshots");
    let mut c = clients[0].clone();
    let usage = |c: Client, team: &'static str| async move {
        let mut c = c;
        c.get_team_usage(pb::GetTeamUsageRequest {
            team_id: team.into(),
        })
        .await
        .unwrap()
        .into_inner()
    };
    assert_eq!(usage(c.clone(), "t").await.snapshots, 3);
    // Another team is not crowded out.
    put(&mut c, vec![(snapshot("snap-other", "u", &[]), 0)], bounds)
        .await
        .unwrap();
    // Replacing one of the three at the bound is no growth: allowed.
    let mine = list_all(
        &mut c,
        pb::ListTemplateRecordsRequest {
            team_id: "t".into(),
            page_size: 10,
            ..Default::default()
        },
    )
    .await;
    let first = get_record(&mut c, &mine[0], "t").await.unwrap();
    let mut again = content(first.clone());
    again.source = "retaken".into();
    put(&mut c, vec![(again, first.version)], bounds)
        .await
        .unwrap();

    // Templates: a batch of three tags against a bound of two is refused
    // whole.
    let tags: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|t| {
            (
                teams(&format!("snap-t{t}"), RecordKind::Built, "t", &[(50, 10)]),
                0,
            )
        })
        .collect();
    let e = put(&mut c, tags.clone(), bounds).await.unwrap_err();
    assert_eq!(bound(&e).as_deref(), Some("templates"), "{e}");
    assert_eq!(usage(c.clone(), "t").await.templates, 0, "nothing partial");
    put(&mut c, tags[..2].to_vec(), bounds).await.unwrap();

    // Bytes: each distinct layer once. 3 snapshots × 10 + 10 (the tags'
    // shared layer) = 40 bytes now; a layer of 961 takes the team past 1000.
    assert_eq!(usage(c.clone(), "t").await.layer_bytes, 40);
    let big = snapshot("snap-big", "t", &[(900, 961)]);
    let roomy = pb::RecordBounds {
        max_snapshots: 10,
        ..bounds
    };
    let e = put(&mut c, vec![(big, 0)], roomy).await.unwrap_err();
    assert_eq!(bound(&e).as_deref(), Some("layer-bytes"), "{e}");
    // A snapshot that only stacks layers the team has adds no bytes: not
    // refused, even by a bound the team is over already.
    put(
        &mut c,
        vec![(snapshot("snap-stacked", "t", &[(50, 10)]), 0)],
        pb::RecordBounds {
            max_layer_bytes: 30,
            ..roomy
        },
    )
    .await
    .unwrap();
}

async fn unused_blob_notes_are_removed_only_when_nothing_names_them(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    let remove = |c: Client, n: u64, at: i64| async move {
        let mut c = c;
        BlobRemoval::try_from(
            c.remove_unused_blob(pb::RemoveUnusedBlobRequest {
                digest: blob(n),
                noted_at_ms: at,
            })
            .await
            .unwrap()
            .into_inner()
            .outcome,
        )
        .unwrap()
    };
    put_one(&mut c, snapshot("snap-a", "t", &[(20, 5)]), 0)
        .await
        .unwrap();
    c.note_unused_blobs(pb::NoteUnusedBlobsRequest {
        digests: vec![blob(20), blob(21), blob(22)],
    })
    .await
    .unwrap();
    let notes = noted(&mut c, 0).await;
    let at: HashMap<String, i64> = notes
        .iter()
        .map(|n| (n.digest.clone(), n.noted_at_ms))
        .collect();
    assert_eq!(at.len(), 3);
    // Named by a record: stays, noted.
    assert_eq!(
        remove(c.clone(), 20, at[&blob(20)]).await,
        BlobRemoval::Named
    );
    // Named by an upload: stays.
    c.put_upload(pb::PutUploadRequest {
        team_id: "t".into(),
        files_hash: "a".repeat(64),
        blob_digest: blob(22),
        size_bytes: 3,
        ttl_ms: 3_600_000,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        remove(c.clone(), 22, at[&blob(22)]).await,
        BlobRemoval::Named
    );
    // A stale note time: not due.
    assert_eq!(
        remove(c.clone(), 21, at[&blob(21)] - 1).await,
        BlobRemoval::NotedAgain
    );
    // Named by none: removed, once.
    assert_eq!(
        remove(c.clone(), 21, at[&blob(21)]).await,
        BlobRemoval::Removed
    );
    assert_eq!(
        remove(c.clone(), 21, at[&blob(21)]).await,
        BlobRemoval::Gone
    );
    let left: BTreeSet<String> = noted(&mut c, 0)
        .await
        .into_iter()
        .map(|n| n.digest)
        .collect();
    assert_eq!(left, BTreeSet::from([blob(20), blob(22)]));
}

async fn uploads_round_trip_and_expire(store: TestStore) {
    let s = Sched::start_fast(&store, &[]).await;
    let mut c = s.client().await;
    let hash = "b".repeat(64);
    let req = |blob_n: u64, size: u64, ttl_ms: u64, expected: u64| pb::PutUploadRequest {
        team_id: "t".into(),
        files_hash: hash.clone(),
        blob_digest: blob(blob_n),
        size_bytes: size,
        ttl_ms,
        expected_version: expected,
        bounds: Some(pb::UploadBounds {
            max_team_bytes: 100,
            max_total_bytes: 150,
        }),
    };
    let get = |c: Client, team: &'static str, hash: String| async move {
        let mut c = c;
        c.get_upload(pb::GetUploadRequest {
            team_id: team.into(),
            files_hash: hash,
        })
        .await
        .map(|r| r.into_inner())
    };
    let u1 = c
        .put_upload(req(30, 40, 3_600_000, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(u1.blob_digest, blob(30));
    assert!(u1.expires_at_ms - u1.created_at_ms == 3_600_000);
    assert_eq!(get(c.clone(), "t", hash.clone()).await.unwrap(), u1);
    assert_status(
        get(c.clone(), "u", hash.clone()).await,
        Code::NotFound,
        "no upload",
    );
    // The same archive again finds itself; another one needs the version.
    let same = c
        .put_upload(req(30, 40, 3_600_000, 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same, u1);
    assert_status(
        c.put_upload(req(31, 40, 3_600_000, 0)).await,
        Code::AlreadyExists,
        "already exists",
    );
    assert_status(
        c.put_upload(req(31, 40, 3_600_000, u1.version + 7)).await,
        Code::Aborted,
        "another writer",
    );
    // The team's bytes: a replace counts only the new size.
    let e = c
        .put_upload(req(31, 101, 3_600_000, u1.version))
        .await
        .unwrap_err();
    assert_eq!(bound(&e).as_deref(), Some("team-upload-bytes"), "{e}");
    let u2 = c
        .put_upload(req(31, 100, 3_600_000, u1.version))
        .await
        .unwrap()
        .into_inner();
    // The replaced archive's blob is noted.
    let notes: Vec<String> = noted(&mut c, 0)
        .await
        .into_iter()
        .map(|n| n.digest)
        .collect();
    assert_eq!(notes, [blob(30)]);
    // Every team's bytes together.
    let mut other = req(32, 60, 3_600_000, 0);
    other.team_id = "u".into();
    let e = c.put_upload(other.clone()).await.unwrap_err();
    assert_eq!(bound(&e).as_deref(), Some("total-upload-bytes"), "{e}");
    // Deleted at the version read: gone, its blob noted.
    assert_status(
        c.delete_upload(pb::DeleteUploadRequest {
            team_id: "t".into(),
            files_hash: hash.clone(),
            expected_version: u1.version,
        })
        .await,
        Code::Aborted,
        "another writer",
    );
    let d = c
        .delete_upload(pb::DeleteUploadRequest {
            team_id: "t".into(),
            files_hash: hash.clone(),
            expected_version: u2.version,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.noted_digest, blob(31));
    c.put_upload(other).await.unwrap();

    // An upload past its TTL is hidden at once and swept: its blob noted.
    let short = c.put_upload(req(33, 1, 1, 0)).await.unwrap().into_inner();
    eventually("the expired upload to be hidden", || {
        let (c, h) = (c.clone(), hash.clone());
        async move { get(c, "t", h).await.err() }
    })
    .await;
    eventually("the sweep to note the expired upload's blob", || {
        let mut c = c.clone();
        async move {
            noted(&mut c, 0)
                .await
                .iter()
                .any(|n| n.digest == blob(33))
                .then_some(())
        }
    })
    .await;
    // Then it is absent: a new upload of the hash is an insert.
    let fresh = c
        .put_upload(req(34, 1, 3_600_000, 0))
        .await
        .unwrap()
        .into_inner();
    assert!(fresh.version > short.version);
}

/// One event of `node_id` about `sandbox_id`, carrying `record`.
async fn report(
    c: &mut Client,
    node_id: &str,
    p: &pb::Placement,
    kind: pb::EventType,
    record: Option<pb::TemplateRecord>,
) -> Result<pb::EventResult, Status> {
    c.report_sandbox_event(pb::ReportSandboxEventRequest {
        node_id: node_id.into(),
        events: vec![pb::SandboxEvent {
            sandbox_id: p.sandbox_id.clone(),
            generation: p.generation,
            r#type: kind as i32,
            paused_record: record,
            logs: Vec::new(),
        }],
    })
    .await
    .map(|r| r.into_inner().results.remove(0))
}

/// A node's auto-pause report carries the sandbox's paused record: it is
/// written with the PAUSE, in its transaction, and only when the PAUSE
/// applies (a report from a node the sandbox is not on writes nothing); a
/// record that is not the sandbox's own, of this pause, or on another
/// event is refused with the report. A RESUME, and the binding's removal,
/// remove the record (and note its layers).
async fn a_pause_report_writes_its_paused_record_and_a_resume_or_delete_removes_it(
    store: TestStore,
) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "t").await;
    assert_eq!(p.node_id, "node-a");
    register(&mut c, "node-b", 10).await;
    let name = format!("paused-{}", p.sandbox_id);
    let mut record = paused(&p.sandbox_id);
    record.created_at_ms = 1_000;
    if let Some(m) = record.snapshot.as_mut().and_then(|s| s.paused.as_mut()) {
        m.generation = p.generation;
    }

    let mut others = record.clone();
    others.name = "paused-someoneelse".into();
    let mut older = record.clone();
    if let Some(m) = older.snapshot.as_mut().and_then(|s| s.paused.as_mut()) {
        m.generation = p.generation + 1;
    }
    let mut snap = record.clone();
    snap.kind = RecordKind::Snapshot as i32;
    for (bad, kind, needle) in [
        (others, pb::EventType::Pause, "own paused record"),
        (older, pb::EventType::Pause, "own paused record"),
        (snap, pb::EventType::Pause, "team_id"),
        (record.clone(), pb::EventType::Resume, "only for a PAUSE"),
    ] {
        let r = report(&mut c, "node-a", &p, kind, Some(bad)).await;
        assert_status(r, Code::InvalidArgument, needle);
    }
    assert_status(get_record(&mut c, &name, "").await, Code::NotFound, "");
    assert_eq!(
        get(&mut c, &p.sandbox_id).await.unwrap().state,
        pb::BindingState::Running as i32
    );

    // Not the sandbox's node: the PAUSE misses, and no record is written.
    let r = report(
        &mut c,
        "node-b",
        &p,
        pb::EventType::Pause,
        Some(record.clone()),
    )
    .await
    .unwrap();
    assert!(!r.applied, "{r:?}");
    assert_status(get_record(&mut c, &name, "").await, Code::NotFound, "");

    // Its node: paused, its record kept; sent again, the same.
    for _ in 0..2 {
        let r = report(
            &mut c,
            "node-a",
            &p,
            pb::EventType::Pause,
            Some(record.clone()),
        )
        .await
        .unwrap();
        assert!(r.applied, "{r:?}");
        let kept = get_record(&mut c, &name, "").await.unwrap();
        assert_eq!(content(kept), content(record.clone()));
    }
    assert_eq!(
        get(&mut c, &p.sandbox_id).await.unwrap().state,
        pb::BindingState::Paused as i32
    );

    // Resumed where it was: the record is stale, and goes with the RESUME.
    let r = report(&mut c, "node-a", &p, pb::EventType::Resume, None)
        .await
        .unwrap();
    assert!(r.applied, "{r:?}");
    assert_status(get_record(&mut c, &name, "").await, Code::NotFound, "");
    let r = report(
        &mut c,
        "node-a",
        &p,
        pb::EventType::Pause,
        Some(record.clone()),
    )
    .await
    .unwrap();
    assert!(r.applied, "{r:?}");
    assert!(get_record(&mut c, &name, "").await.is_ok());

    // Gone for good: so is its record, and its layers are noted.
    let r = report(&mut c, "node-a", &p, pb::EventType::Delete, None)
        .await
        .unwrap();
    assert!(r.applied, "{r:?}");
    assert_status(get_record(&mut c, &name, "").await, Code::NotFound, "");
    let left: BTreeSet<String> = noted(&mut c, 0)
        .await
        .into_iter()
        .map(|n| n.digest)
        .collect();
    assert!(left.contains(&blob(8)), "{left:?}");
}

on_both_stores!(
    every_kind_round_trips,
    writes_are_fenced_on_the_version_read,
    two_replicas_racing_on_one_record_one_wins,
    two_gateways_racing_to_tag_and_delete_one_template_one_wins,
    team_bounds_hold_under_concurrent_writers,
    unused_blob_notes_are_removed_only_when_nothing_names_them,
    uploads_round_trip_and_expire,
    a_pause_report_writes_its_paused_record_and_a_resume_or_delete_removes_it,
);
