//! A store an older scheduler left (schema 5, before the records and the
//! nodes' cached layers) is migrated by this one at start, on both
//! backends: what it held is still there, and the records work in it.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sqlx::Row;
use warren_proto::scheduler::v1 as pb;

/// What schema 6 (`0006_records.sql`) added: its tables and its counter.
const SCHEMA_6_TABLES: &[&str] = &[
    "template_records",
    "record_layers",
    "unused_blobs",
    "builds",
    "build_logs",
    "build_uploads",
    "uploads",
];

async fn schema_version(db: &sqlx::AnyPool) -> i64 {
    sqlx::query("SELECT MAX(version) AS v FROM schema_migrations")
        .fetch_one(db)
        .await
        .unwrap()
        .get::<i64, _>("v")
}

/// What schema 8 (`0008_volumes.sql`) added: its tables.
const SCHEMA_8_TABLES: &[&str] = &["volumes", "volume_mounts"];

/// Takes a store this scheduler made back to schema 5. Migration 6 only
/// adds tables and a counter, migration 7 a column, migration 8 tables and
/// columns, so what is left is what a scheduler of schema 5 would have
/// written: its bindings, nodes, trust and quotas.
async fn back_to_schema_5(store: &TestStore) {
    let db = sqlx::AnyPool::connect(&store.raw_url()).await.unwrap();
    assert_eq!(schema_version(&db).await, 8);
    for t in SCHEMA_6_TABLES.iter().chain(SCHEMA_8_TABLES) {
        sqlx::query(&format!("DROP TABLE {t}"))
            .execute(&db)
            .await
            .unwrap();
    }
    for q in [
        "DELETE FROM counters WHERE name = 'record_version'",
        "ALTER TABLE nodes DROP COLUMN cached_layers",
        "ALTER TABLE nodes DROP COLUMN volume_store",
        "ALTER TABLE nodes DROP COLUMN volume_max_bytes",
        "DELETE FROM schema_migrations WHERE version >= 6",
    ] {
        sqlx::query(q).execute(&db).await.unwrap();
    }
    assert_eq!(schema_version(&db).await, 5);
    db.close().await;
}

async fn a_store_at_the_previous_schema_migrates(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut c = s.client().await;
    register(&mut c, "node-a", 10).await;
    let p = running(&mut c, "t").await;
    let before = get(&mut c, &p.sandbox_id).await.unwrap();
    s.stop().await;
    back_to_schema_5(&store).await;

    // Two replicas start on it at once: it is migrated once, and keeps
    // what it had.
    let (a, b) = tokio::join!(Sched::start(&store, &[]), Sched::start(&store, &[]));
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    assert_eq!(get(&mut cb, &p.sandbox_id).await.unwrap(), before);
    let db = sqlx::AnyPool::connect(&store.raw_url()).await.unwrap();
    eventually("the store to be at schema 8", || {
        let db = db.clone();
        async move { (schema_version(&db).await == 8).then_some(()) }
    })
    .await;
    for version in [6, 7, 8] {
        let applied: i64 = sqlx::query(&format!(
            "SELECT COUNT(*) AS n FROM schema_migrations WHERE version = {version}"
        ))
        .fetch_one(&db)
        .await
        .unwrap()
        .get("n");
        assert_eq!(applied, 1, "migration {version} applied once");
    }
    // A node registers with its cached layers in the migrated store.
    let layer = blob(3);
    ca.register_node(pb::RegisterNodeRequest {
        node_id: "node-b".into(),
        endpoint: "node-b.test:7000".into(),
        capacity: 10,
        incarnation: 1,
        roster: vec![],
        cached_layers: vec![layer.clone()],
        ..Default::default()
    })
    .await
    .unwrap();
    let nodes = cb
        .list_nodes(pb::ListNodesRequest {})
        .await
        .unwrap()
        .into_inner()
        .nodes;
    let b = nodes.iter().find(|n| n.node_id == "node-b").unwrap();
    assert_eq!(b.cached_layers, vec![layer]);

    // The records work in the migrated store, through either replica.
    let written = ca
        .put_template_records(pb::PutTemplateRecordsRequest {
            puts: vec![pb::RecordPut {
                record: Some(pb::TemplateRecord {
                    name: "base".into(),
                    kind: pb::RecordKind::Operator as i32,
                    digest: blob(1),
                    defaults: Some(pb::TemplateDefaults::default()),
                    ..Default::default()
                }),
                expected_version: 0,
            }],
            bounds: None,
        })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert_eq!(written[0].version, 1, "the version counter starts afresh");
    let got = cb
        .get_template_record(pb::GetTemplateRecordRequest {
            name: "base".into(),
            team_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got, written[0]);
    cb.create_build(pb::CreateBuildRequest {
        build_id: "b-1".into(),
        team_id: "t".into(),
        template_name: "app".into(),
        request_json: "{}".into(),
        start_ttl_ms: 60_000,
        retention_ms: 60_000,
        bounds: None,
    })
    .await
    .unwrap();
    cb.put_upload(pb::PutUploadRequest {
        team_id: "t".into(),
        files_hash: "e".repeat(64),
        blob_digest: blob(2),
        size_bytes: 1,
        ttl_ms: 60_000,
        ..Default::default()
    })
    .await
    .unwrap();
    db.close().await;
}

on_both_stores!(a_store_at_the_previous_schema_migrates);
