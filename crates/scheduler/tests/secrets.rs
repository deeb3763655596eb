//! Team secrets and sandboxes' egress CAs in the store, through the API:
//! a secret's life (create, a new version, read, list by pages, delete,
//! by id and by name), team isolation and the team's bound; values and CAs
//! sealed at rest and never in a read; `ResolveSecrets` only for the node
//! hosting a sandbox of the team, at its generation, always the current
//! version; a rotated secrets key reseals every value in the background;
//! a scheduler without a secrets key says which flag it needs.
// Each file under tests/ is its own crate and sees every dependency of the
// package; the ones only the library or other test files use are not unused.
#![allow(unused_crate_dependencies)]
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use sqlx::Row;
use std::collections::HashMap;
use tonic::transport::Channel;
use tonic::Code;
use warren_proto::scheduler::v1 as pb;
use warren_proto::scheduler::v1::secrets_client::SecretsClient;

type Secrets = SecretsClient<Channel>;

/// The flags that give a scheduler of `store` a secrets key (SQLite makes
/// its own beside the database).
fn key_flags(store: &TestStore) -> Vec<String> {
    match store {
        TestStore::Sqlite(_) => vec![],
        TestStore::Postgres(_) => vec![format!(
            "--secrets-key-file={}",
            pg_server().store_key_file().display()
        )],
    }
}

async fn start(store: &TestStore) -> (Sched, Client, Secrets) {
    let flags = key_flags(store);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let s = Sched::start(store, &flags).await;
    let c = s.client().await;
    let secrets = SecretsClient::connect(format!("http://{}", s.addr))
        .await
        .unwrap();
    (s, c, secrets)
}

fn create(team: &str, name: &str, value: &str) -> pb::CreateSecretRequest {
    pb::CreateSecretRequest {
        team_id: team.into(),
        name: name.into(),
        value: value.into(),
        metadata: HashMap::from([("owner".into(), "ci".into())]),
        max_per_team: 0,
    }
}

fn by(team: &str, secret: &str) -> pb::GetSecretRequest {
    pb::GetSecretRequest {
        team_id: team.into(),
        secret: secret.into(),
    }
}

async fn resolve(
    s: &mut Secrets,
    p: &pb::Placement,
    node: &str,
    names: &[&str],
) -> Result<HashMap<String, String>, tonic::Status> {
    s.resolve_secrets(pb::ResolveSecretsRequest {
        sandbox_id: p.sandbox_id.clone(),
        node_id: node.into(),
        generation: p.generation,
        names: names.iter().map(|n| n.to_string()).collect(),
    })
    .await
    .map(|r| r.into_inner().values)
}

/// Create, update, get, list and delete, by id and by name; names are
/// lower-cased and `sec_` is reserved; another team sees none of it.
async fn a_secret_lives_by_id_and_name_within_its_team(store: TestStore) {
    let (s, _, mut sec) = start(&store).await;
    let a = sec
        .create_secret(create("team-a", "OpenAI-Key", "sk-1"))
        .await
        .unwrap()
        .into_inner();
    assert!(a.secret_id.starts_with("sec_"), "{a:?}");
    assert_eq!((a.name.as_str(), a.version), ("openai-key", 1));
    assert_eq!(a.metadata["owner"], "ci");
    assert_status(
        sec.create_secret(create("team-a", "OPENAI-KEY", "x")).await,
        Code::AlreadyExists,
        "openai-key",
    );
    assert_status(
        sec.create_secret(create("team-a", "sec_mine", "x")).await,
        Code::InvalidArgument,
        "reserved",
    );
    assert_status(
        sec.create_secret(create("team-a", "k", "a\r\nX-Evil: 1"))
            .await,
        Code::InvalidArgument,
        "line breaks",
    );
    // Another team may use the same name: its own secret.
    let b = sec
        .create_secret(create("team-b", "openai-key", "sk-b"))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(a.secret_id, b.secret_id);
    for key in [a.secret_id.as_str(), "openai-key", "OpenAI-Key"] {
        let got = sec
            .get_secret(by("team-a", key))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.secret_id, a.secret_id);
    }
    // A new version, by name; metadata kept when the update names none,
    // replaced when it does.
    let u = sec
        .update_secret(pb::UpdateSecretRequest {
            team_id: "team-a".into(),
            secret: "openai-key".into(),
            value: "sk-2".into(),
            set_metadata: false,
            metadata: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((u.version, u.metadata["owner"].as_str()), (2, "ci"));
    let u = sec
        .update_secret(pb::UpdateSecretRequest {
            team_id: "team-a".into(),
            secret: a.secret_id.clone(),
            value: "sk-3".into(),
            set_metadata: true,
            metadata: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(u.version, 3);
    assert!(u.metadata.is_empty());
    // Team B reaches none of team A's by id.
    assert_status(
        sec.get_secret(by("team-b", &a.secret_id)).await,
        Code::NotFound,
        "not found",
    );
    assert_status(
        sec.delete_secret(pb::DeleteSecretRequest {
            team_id: "team-b".into(),
            secret: a.secret_id.clone(),
        })
        .await,
        Code::NotFound,
        "not found",
    );
    // Pages by name.
    for i in 0..5 {
        sec.create_secret(create("team-a", &format!("k{i}"), "v"))
            .await
            .unwrap();
    }
    let (mut names, mut after) = (Vec::new(), String::new());
    loop {
        let page = sec
            .list_secrets(pb::ListSecretsRequest {
                team_id: "team-a".into(),
                after: after.clone(),
                limit: 2,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.secrets.len() <= 2);
        names.extend(page.secrets.into_iter().map(|s| s.name));
        if page.next_after.is_empty() {
            break;
        }
        after = page.next_after;
    }
    assert_eq!(names, ["k0", "k1", "k2", "k3", "k4", "openai-key"]);
    sec.delete_secret(pb::DeleteSecretRequest {
        team_id: "team-a".into(),
        secret: "OPENAI-KEY".into(),
    })
    .await
    .unwrap();
    assert_status(
        sec.get_secret(by("team-a", &a.secret_id)).await,
        Code::NotFound,
        "not found",
    );
    // Team B's is still there.
    sec.get_secret(by("team-b", "openai-key")).await.unwrap();
    s.stop().await;
}

/// Past `max_per_team` a create is RESOURCE_EXHAUSTED naming the bound;
/// another team is not held by it; a delete makes room.
async fn a_team_holds_at_most_its_bound(store: TestStore) {
    let (s, _, mut sec) = start(&store).await;
    let bounded = |team: &str, name: &str| pb::CreateSecretRequest {
        max_per_team: 2,
        ..create(team, name, "v")
    };
    sec.create_secret(bounded("t", "a")).await.unwrap();
    sec.create_secret(bounded("t", "b")).await.unwrap();
    let e = assert_status(
        sec.create_secret(bounded("t", "c")).await,
        Code::ResourceExhausted,
        "--secrets-team-count",
    );
    assert_eq!(
        e.metadata()
            .get(warren_proto::BOUND_METADATA)
            .and_then(|v| v.to_str().ok()),
        Some(warren_proto::BOUND_SECRETS)
    );
    sec.create_secret(bounded("u", "c")).await.unwrap();
    sec.delete_secret(pb::DeleteSecretRequest {
        team_id: "t".into(),
        secret: "a".into(),
    })
    .await
    .unwrap();
    sec.create_secret(bounded("t", "c")).await.unwrap();
    s.stop().await;
}

/// Only the node hosting a sandbox, at its generation, resolves its
/// team's secrets: the current version, never another team's.
async fn only_the_hosting_node_resolves_its_teams_secrets(store: TestStore) {
    let (s, mut c, mut sec) = start(&store).await;
    register(&mut c, "node-a", 10).await;
    register(&mut c, "node-b", 10).await;
    let mut req = place_req("team-a");
    req.require_node_id = "node-a".into();
    let p = c.place(req).await.unwrap().into_inner();
    record(&mut c, &p).await;
    sec.create_secret(create("team-a", "api", "v1"))
        .await
        .unwrap();
    sec.create_secret(create("team-b", "theirs", "b-value"))
        .await
        .unwrap();
    let got = resolve(&mut sec, &p, "node-a", &["api"]).await.unwrap();
    assert_eq!(got["api"], "v1");
    sec.update_secret(pb::UpdateSecretRequest {
        team_id: "team-a".into(),
        secret: "api".into(),
        value: "v2".into(),
        set_metadata: false,
        metadata: HashMap::new(),
    })
    .await
    .unwrap();
    let got = resolve(&mut sec, &p, "node-a", &["api", "theirs", "nope"])
        .await
        .unwrap();
    assert_eq!(
        got.len(),
        1,
        "another team's and unknown names resolve to nothing: {got:?}"
    );
    assert_eq!(got["api"], "v2");
    assert_status(
        resolve(&mut sec, &p, "node-b", &["api"]).await,
        Code::FailedPrecondition,
        "not hosted by node node-b",
    );
    let mut stale = p.clone();
    stale.generation += 1;
    assert_status(
        resolve(&mut sec, &stale, "node-a", &["api"]).await,
        Code::FailedPrecondition,
        "generation",
    );
    let mut gone = p.clone();
    gone.sandbox_id = "nosuchsandbox0000000".into();
    assert!(resolve(&mut sec, &gone, "node-a", &["api"]).await.is_err());
    s.stop().await;
}

/// A copy of the database holds no secret value and no CA key; reads
/// never carry a CA; a move hands the node the same CA; rotating the
/// secrets key reseals every value, which still resolves.
async fn values_and_cas_are_sealed_and_the_key_rotates(store: TestStore) {
    let secrets_key = tempfile::NamedTempFile::new().unwrap();
    let first = "11".repeat(32);
    std::fs::write(secrets_key.path(), format!("{first}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(secrets_key.path(), std::fs::Permissions::from_mode(0o600))
            .unwrap();
    }
    let flag = format!("--secrets-key-file={}", secrets_key.path().display());
    let s = Sched::start(&store, &[&flag]).await;
    let mut c = s.client().await;
    let mut sec = SecretsClient::connect(format!("http://{}", s.addr))
        .await
        .unwrap();
    register(&mut c, "node-a", 10).await;
    register(&mut c, "node-b", 10).await;
    let marker = format!("sk-{:032x}", rand::random::<u128>());
    let made = sec
        .create_secret(create("team-a", "marker", &marker))
        .await
        .unwrap()
        .into_inner();
    let p = running(&mut c, "team-a").await;
    let ca = p.binding.clone().unwrap().egress_ca;
    assert!(
        ca.contains("BEGIN CERTIFICATE") && ca.contains("BEGIN PRIVATE KEY"),
        "{ca}"
    );
    let read = get(&mut c, &p.sandbox_id).await.unwrap();
    assert!(read.egress_ca.is_empty(), "a read carries the CA");
    assert!(all_sandboxes(&mut c)
        .await
        .iter()
        .all(|b| b.egress_ca.is_empty()));
    sqlx::any::install_default_drivers();
    let db = sqlx::AnyPool::connect(&store.raw_url()).await.unwrap();
    let value = |db: sqlx::AnyPool, id: String| async move {
        sqlx::query("SELECT value FROM secrets WHERE secret_id = $1")
            .bind(id)
            .fetch_one(&db)
            .await
            .unwrap()
            .get::<String, _>("value")
    };
    let stored = value(db.clone(), made.secret_id.clone()).await;
    assert!(
        stored.starts_with("sealed:v1:") && !stored.contains(&marker),
        "{stored}"
    );
    let stored_ca: String = sqlx::query("SELECT egress_ca FROM bindings WHERE sandbox_id = $1")
        .bind(&p.sandbox_id)
        .fetch_one(&db)
        .await
        .unwrap()
        .get("egress_ca");
    assert!(
        stored_ca.starts_with("sealed:v1:") && !stored_ca.contains("PRIVATE KEY"),
        "{stored_ca}"
    );
    // A move: the new node is handed the same CA.
    let moved = c
        .reassign(pb::ReassignRequest {
            sandbox_id: p.sandbox_id.clone(),
            node_id: "node-b".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.binding.clone().unwrap().egress_ca, ca);
    s.stop().await;

    // Rotation: a new first key; the old one still opens.
    let second = "22".repeat(32);
    std::fs::write(secrets_key.path(), format!("{second}\n{first}\n")).unwrap();
    let s = Sched::start(&store, &[&flag]).await;
    let mut sec = SecretsClient::connect(format!("http://{}", s.addr))
        .await
        .unwrap();
    let (db2, id) = (db.clone(), made.secret_id.clone());
    let new_id = {
        use sha2::Digest;
        let bytes: Vec<u8> = (0..32).map(|_| 0x22).collect();
        let d = sha2::Sha256::digest(&bytes);
        d[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    eventually("the secret sealed again under the new key", || {
        let (db, id, new_id) = (db2.clone(), id.clone(), new_id.clone());
        async move {
            let v = value(db, id).await;
            v.starts_with(&format!("sealed:v1:{new_id}:")).then_some(())
        }
    })
    .await;
    let got = resolve(&mut sec, &moved, "node-b", &["marker"])
        .await
        .unwrap();
    assert_eq!(got["marker"], marker);
    db.close().await;
    s.stop().await;
}

/// With PostgreSQL and no --secrets-key-file, the secrets RPCs say which
/// flag the scheduler needs; with SQLite the key is made beside the
/// database, readable by its owner only.
async fn without_a_secrets_key_the_flag_is_named(store: TestStore) {
    let s = Sched::start(&store, &[]).await;
    let mut sec = SecretsClient::connect(format!("http://{}", s.addr))
        .await
        .unwrap();
    let r = sec.create_secret(create("t", "a", "v")).await;
    match &store {
        TestStore::Postgres(_) => {
            assert_status(r, Code::FailedPrecondition, "--secrets-key-file");
        }
        TestStore::Sqlite(dir) => {
            use std::os::unix::fs::PermissionsExt;
            r.unwrap();
            let key = dir.path().join("secrets.key");
            let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
    }
    s.stop().await;
}

on_both_stores!(
    a_secret_lives_by_id_and_name_within_its_team,
    a_team_holds_at_most_its_bound,
    only_the_hosting_node_resolves_its_teams_secrets,
    values_and_cas_are_sealed_and_the_key_rotates,
    without_a_secrets_key_the_flag_is_named,
);
