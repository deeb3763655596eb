//! Volumes: E2B's persistent volumes, their tokens (sealed), which sandbox
//! mounts which, and where a volume's content is served.
//!
//! Every write is one conditional statement under the write lock:
//! - a create is refused for a name the team has (the unique index decides)
//!   and past the team's bounds, counted in the same transaction;
//! - a delete begins (READY → DELETING) only while no sandbox's binding
//!   names a mount of it, and a Place mounts only READY volumes, in its
//!   own transaction: so no sandbox ever mounts a volume whose data is
//!   being removed, and no volume a sandbox mounts is removed.
//!
//! A mount row outlives its binding until the sweep removes it; every read
//! that decides something joins `bindings`, so such a row counts for
//! nothing.

use super::{to_i64, to_u64, SqlStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::seal::{self, Sealer};
use crate::store::volumes::*;
use sqlx::any::AnyRow;
use sqlx::Row;

const VOLUME_COLUMNS: &str = "v.volume_id, v.team_id, v.name, v.token, v.node_id, \
     v.max_bytes, v.state, v.created_at_ms, COALESCE(n.endpoint, '') AS endpoint";

fn by_id() -> String {
    format!(
        "SELECT {VOLUME_COLUMNS} FROM volumes v LEFT JOIN nodes n ON n.node_id = v.node_id \
         WHERE v.volume_id = $1"
    )
}

fn by_name() -> String {
    format!(
        "SELECT {VOLUME_COLUMNS} FROM volumes v LEFT JOIN nodes n ON n.node_id = v.node_id \
         WHERE v.team_id = $1 AND v.name = $2"
    )
}

fn of_team() -> String {
    format!(
        "SELECT {VOLUME_COLUMNS} FROM volumes v LEFT JOIN nodes n ON n.node_id = v.node_id \
         WHERE v.team_id = $1 ORDER BY v.name"
    )
}

const INSERT_VOLUME: &str = "INSERT INTO volumes \
     (volume_id, team_id, name, token, node_id, max_bytes, state, created_at_ms, version) \
     VALUES ($1, $2, $3, $4, $5, $6, 'ready', $7, 1)";
/// Cast: PostgreSQL's `SUM(BIGINT)` is NUMERIC.
const TEAM_USAGE: &str = "SELECT COUNT(*), CAST(COALESCE(SUM(max_bytes), 0) AS BIGINT) \
     FROM volumes WHERE team_id = $1";
const NAME_TAKEN: &str = "SELECT COUNT(*) FROM volumes WHERE team_id = $1 AND name = $2";
const ID_TAKEN: &str = "SELECT COUNT(*) FROM volumes WHERE volume_id = $1";
/// Live sandboxes (any state: a paused one comes back with its volumes)
/// that mount volume `$1`.
const MOUNTED_BY: &str = "SELECT m.sandbox_id FROM volume_mounts m \
     JOIN bindings b ON b.sandbox_id = m.sandbox_id WHERE m.volume_id = $1 \
     ORDER BY m.sandbox_id LIMIT 3";
const BEGIN_DELETE: &str = "UPDATE volumes SET state = 'deleting', version = version + 1 \
     WHERE volume_id = $1 AND team_id = $2";
const FINISH_DELETE: &str =
    "DELETE FROM volumes WHERE volume_id = $1 AND team_id = $2 AND state = 'deleting'";
const DELETE_MOUNTS_OF_VOLUME: &str = "DELETE FROM volume_mounts WHERE volume_id = $1";
const DELETE_MOUNTS_OF_SANDBOX: &str = "DELETE FROM volume_mounts WHERE sandbox_id = $1";
const INSERT_MOUNT: &str =
    "INSERT INTO volume_mounts (sandbox_id, path, volume_id) VALUES ($1, $2, $3)";
const COPY_MOUNTS: &str = "INSERT INTO volume_mounts (sandbox_id, path, volume_id) \
     SELECT $2, path, volume_id FROM volume_mounts WHERE sandbox_id = $1";
const MOUNTS_OF: &str = "SELECT m.path, v.volume_id, v.name, v.node_id, v.max_bytes \
     FROM volume_mounts m JOIN volumes v ON v.volume_id = m.volume_id \
     WHERE m.sandbox_id = $1 ORDER BY m.path";
/// Mount rows whose binding is gone.
const STALE_MOUNTS: &str = "DELETE FROM volume_mounts WHERE sandbox_id IN \
     (SELECT m.sandbox_id FROM volume_mounts m LEFT JOIN bindings b \
      ON b.sandbox_id = m.sandbox_id WHERE b.sandbox_id IS NULL LIMIT 1000)";
/// The live node with a local volume store holding the fewest volumes.
const LOCAL_STORE_NODE: &str = "SELECT n.node_id, n.volume_max_bytes FROM nodes n \
     WHERE n.volume_store = 'local' AND n.lease_expires_at_ms > $1 \
     AND n.unreachable_since_ms IS NULL \
     ORDER BY (SELECT COUNT(*) FROM volumes v WHERE v.node_id = n.node_id), n.node_id LIMIT 1";
/// The live nodes with the shared store, by id.
const SHARED_STORE_NODES: &str =
    "SELECT n.node_id, n.endpoint, n.volume_max_bytes, n.unreachable_since_ms FROM nodes n \
     WHERE n.volume_store = 'shared' AND n.lease_expires_at_ms > $1 ORDER BY n.node_id";
const NODE_LEASE: &str = "SELECT lease_expires_at_ms FROM nodes WHERE node_id = $1";

const UNSEALED: &str = "SELECT volume_id, token FROM volumes WHERE token NOT LIKE $1 LIMIT $2";
const RESEAL: &str = "UPDATE volumes SET token = $1 WHERE volume_id = $2 AND token = $3";

fn volume_from_row(r: &AnyRow, sealer: &Sealer) -> Result<VolumeRow> {
    let volume_id: String = r.try_get("volume_id")?;
    let stored: String = r.try_get("token")?;
    let token = sealer
        .open(&volume_id, seal::VOLUME_TOKEN, &stored)
        .map_err(|e| Error::Corrupt(e.to_string()))?;
    let state: String = r.try_get("state")?;
    Ok(VolumeRow {
        team_id: r.try_get("team_id")?,
        name: r.try_get("name")?,
        token,
        node_id: r.try_get("node_id")?,
        endpoint: r.try_get("endpoint")?,
        max_bytes: to_u64(r.try_get("max_bytes")?, "max_bytes")?,
        state: VolumeState::parse(&state)
            .ok_or_else(|| Error::Corrupt(format!("unknown volume state {state:?}")))?,
        created_at_ms: r.try_get("created_at_ms")?,
        volume_id,
    })
}

fn mount_from_row(r: &AnyRow) -> Result<MountRow> {
    Ok(MountRow {
        path: r.try_get("path")?,
        volume_id: r.try_get("volume_id")?,
        name: r.try_get("name")?,
        node_id: r.try_get("node_id")?,
        max_bytes: to_u64(r.try_get("max_bytes")?, "max_bytes")?,
    })
}

fn not_found(id: &str) -> Error {
    Error::NotFound(format!("volume {id} not found"))
}

async fn create(
    store: &SqlStore,
    team: &str,
    name: &str,
    bounds: VolumeBounds,
) -> Result<VolumeRow> {
    let mut tx = store.write().await?;
    let taken: i64 = sqlx::query_scalar(NAME_TAKEN)
        .bind(team)
        .bind(name)
        .fetch_one(tx.conn())
        .await?;
    if taken > 0 {
        return Err(Error::AlreadyExists(format!(
            "the team already has a volume named {name}"
        )));
    }
    let now = tx.now;
    // Shared when any live node declares the shared store; else on the
    // least used live node with a store of its own.
    let shared: Vec<AnyRow> = sqlx::query(SHARED_STORE_NODES)
        .bind(now)
        .fetch_all(tx.conn())
        .await?;
    let (node_id, max_bytes) = if shared.is_empty() {
        let row = sqlx::query(LOCAL_STORE_NODE)
            .bind(now)
            .fetch_optional(tx.conn())
            .await?
            .ok_or_else(|| Error::Refused {
                message: "no live node has a volume store (nodes serve volumes from their \
                          --volume-dir); start one, or wait for one to come back"
                    .into(),
                reason: warren_proto::REASON_NO_VOLUME_STORE,
            })?;
        let max: i64 = row.try_get(1)?;
        (
            row.try_get::<String, _>(0)?,
            to_u64(max, "volume_max_bytes")?,
        )
    } else {
        let mut max = 0u64;
        for r in &shared {
            max = max.max(to_u64(r.try_get(2)?, "volume_max_bytes")?);
        }
        (String::new(), max)
    };
    let (count, bytes): (i64, i64) = sqlx::query_as(TEAM_USAGE)
        .bind(team)
        .fetch_one(tx.conn())
        .await?;
    let (count, bytes) = (to_u64(count, "count")?, to_u64(bytes, "bytes")?);
    if bounds.max_count > 0 && count >= u64::from(bounds.max_count) {
        return Err(Error::Bound {
            message: format!(
                "team {team} already has {count} volumes, its limit is {}; delete one first",
                bounds.max_count
            ),
            bound: warren_proto::BOUND_TEAM_VOLUMES,
        });
    }
    if bounds.max_bytes > 0 && bytes.saturating_add(max_bytes) > bounds.max_bytes {
        return Err(Error::Bound {
            message: format!(
                "team {team}'s volumes may hold {bytes} bytes together already and a new one \
                 {max_bytes} more, past its limit of {} bytes; delete one first",
                bounds.max_bytes
            ),
            bound: warren_proto::BOUND_TEAM_VOLUME_BYTES,
        });
    }
    let volume_id = fresh_id(&mut tx).await?;
    let token = warren_core::volume::new_token();
    sqlx::query(INSERT_VOLUME)
        .bind(&volume_id)
        .bind(team)
        .bind(name)
        .bind(tx.sealer.seal(&volume_id, seal::VOLUME_TOKEN, &token))
        .bind(&node_id)
        .bind(to_i64(max_bytes))
        .bind(now)
        .execute(tx.conn())
        .await?;
    let row = sqlx::query(&by_id())
        .bind(&volume_id)
        .fetch_one(tx.conn())
        .await?;
    let sealer = tx.sealer.clone();
    let volume = volume_from_row(&row, &sealer)?;
    tx.commit(&store.changed).await?;
    tracing::info!(volume = %volume_id, team, name, node = %node_id, max_bytes, "volume created");
    Ok(volume)
}

async fn fresh_id(tx: &mut WriteTx) -> Result<String> {
    for _ in 0..5 {
        let id = warren_core::volume::new_volume_id();
        let taken: i64 = sqlx::query_scalar(ID_TAKEN)
            .bind(&id)
            .fetch_one(tx.conn())
            .await?;
        if taken == 0 {
            return Ok(id);
        }
    }
    Err(Error::Corrupt(
        "5 random volume ids in a row were taken".into(),
    ))
}

/// Sandboxes (at most 3, for the message) whose binding mounts `id`.
async fn mounted_by(tx: &mut WriteTx, id: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(MOUNTED_BY)
        .bind(id)
        .fetch_all(tx.conn())
        .await?)
}

async fn begin_delete(store: &SqlStore, id: &str, team: &str) -> Result<VolumeRow> {
    let mut tx = store.write().await?;
    let row = sqlx::query(&by_id())
        .bind(id)
        .fetch_optional(tx.conn())
        .await?;
    let sealer = tx.sealer.clone();
    let volume = row
        .as_ref()
        .map(|r| volume_from_row(r, &sealer))
        .transpose()?
        .filter(|v| v.team_id == team)
        .ok_or_else(|| not_found(id))?;
    let users = mounted_by(&mut tx, id).await?;
    if !users.is_empty() {
        return Err(Error::Refused {
            message: format!(
                "volume {} ({id}) is mounted by sandbox {}; kill the sandboxes that mount it \
                 (paused ones too) first",
                volume.name,
                users.join(", ")
            ),
            reason: warren_proto::REASON_VOLUME_MOUNTED,
        });
    }
    sqlx::query(BEGIN_DELETE)
        .bind(id)
        .bind(team)
        .execute(tx.conn())
        .await?;
    tx.commit(&store.changed).await?;
    Ok(VolumeRow {
        state: VolumeState::Deleting,
        ..volume
    })
}

async fn finish_delete(store: &SqlStore, id: &str, team: &str) -> Result<()> {
    let mut tx = store.write().await?;
    let gone = sqlx::query(FINISH_DELETE)
        .bind(id)
        .bind(team)
        .execute(tx.conn())
        .await?
        .rows_affected();
    if gone == 0 {
        return Err(Error::precondition(format!(
            "volume {id} is not being deleted (begin its delete first), or is gone"
        )));
    }
    sqlx::query(DELETE_MOUNTS_OF_VOLUME)
        .bind(id)
        .execute(tx.conn())
        .await?;
    tx.commit(&store.changed).await?;
    tracing::info!(volume = %id, team, "volume deleted");
    Ok(())
}

/// Where a new sandbox's volumes put it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pin {
    /// No volumes.
    Anywhere,
    /// Local volumes: their node.
    Node(String),
    /// Shared volumes only: a node with the shared store.
    SharedStore,
}

/// Resolves a Place's volume requests in its transaction: each the team's
/// and READY; all local ones on one node.
pub(super) async fn resolve(
    tx: &mut WriteTx,
    team: &str,
    reqs: &[MountRequest],
) -> Result<(Vec<MountRow>, Pin)> {
    let mut mounts = Vec::with_capacity(reqs.len());
    let mut pin = Pin::Anywhere;
    let sealer = tx.sealer.clone();
    for req in reqs {
        let row = sqlx::query(&by_name())
            .bind(team)
            .bind(&req.name)
            .fetch_optional(tx.conn())
            .await?;
        let v = row
            .as_ref()
            .map(|r| volume_from_row(r, &sealer))
            .transpose()?
            .ok_or_else(|| Error::NotFound(format!("volume {} not found", req.name)))?;
        if v.state == VolumeState::Deleting {
            return Err(Error::Refused {
                message: format!("volume {} is being deleted; it cannot be mounted", v.name),
                reason: warren_proto::REASON_VOLUME_DELETING,
            });
        }
        pin = match (pin, v.node_id.as_str()) {
            (Pin::Anywhere | Pin::SharedStore, "") => Pin::SharedStore,
            (Pin::Node(n), "") => Pin::Node(n),
            (Pin::Anywhere | Pin::SharedStore, node) => Pin::Node(node.to_string()),
            (Pin::Node(n), node) if n == node => Pin::Node(n),
            (Pin::Node(n), node) => {
                return Err(Error::invalid(format!(
                    "volume {} is on node {node} and another volume asked for is on node {n}: \
                     one sandbox can mount local volumes of one node only",
                    v.name
                )))
            }
        };
        mounts.push(MountRow {
            path: req.path.clone(),
            volume_id: v.volume_id,
            name: v.name,
            node_id: v.node_id,
            max_bytes: v.max_bytes,
        });
    }
    Ok((mounts, pin))
}

/// Writes a new binding's mounts (after clearing whatever rows a dead
/// binding of the same id could have left).
pub(super) async fn write_mounts(
    tx: &mut WriteTx,
    sandbox_id: &str,
    mounts: &[MountRow],
) -> Result<()> {
    sqlx::query(DELETE_MOUNTS_OF_SANDBOX)
        .bind(sandbox_id)
        .execute(tx.conn())
        .await?;
    for m in mounts {
        sqlx::query(INSERT_MOUNT)
            .bind(sandbox_id)
            .bind(&m.path)
            .bind(&m.volume_id)
            .execute(tx.conn())
            .await?;
    }
    Ok(())
}

/// A fork mounts what its parent mounts.
pub(super) async fn copy_mounts(tx: &mut WriteTx, parent: &str, child: &str) -> Result<()> {
    sqlx::query(DELETE_MOUNTS_OF_SANDBOX)
        .bind(child)
        .execute(tx.conn())
        .await?;
    sqlx::query(COPY_MOUNTS)
        .bind(parent)
        .bind(child)
        .execute(tx.conn())
        .await?;
    Ok(())
}

/// The mounts of a sandbox, in `tx`.
pub(super) async fn mounts_in(tx: &mut WriteTx, sandbox_id: &str) -> Result<Vec<MountRow>> {
    let rows = sqlx::query(MOUNTS_OF)
        .bind(sandbox_id)
        .fetch_all(tx.conn())
        .await?;
    rows.iter().map(mount_from_row).collect()
}

/// Where a sandbox that mounts `mounts` may go when it moves: its local
/// volumes' node, or a node with the shared store.
pub(super) fn pin_of(mounts: &[MountRow]) -> Pin {
    match mounts.iter().find(|m| !m.node_id.is_empty()) {
        Some(m) => Pin::Node(m.node_id.clone()),
        None if mounts.is_empty() => Pin::Anywhere,
        None => Pin::SharedStore,
    }
}

/// Removes mount rows whose binding is gone (a pass of the sweep).
pub(super) async fn sweep(store: &SqlStore) -> Result<u64> {
    Ok(sqlx::query(STALE_MOUNTS)
        .execute(&store.writer)
        .await?
        .rows_affected())
}

async fn route(
    store: &SqlStore,
    id: &str,
    token: &str,
    avoid: Option<&str>,
) -> Result<VolumeRouteRow> {
    let denied = || {
        Error::Unauthenticated(format!(
            "volume {id} does not exist, or the token does not open it"
        ))
    };
    let volume = store.volume(id).await?.ok_or_else(denied)?;
    if !constant_time_eq(volume.token.as_bytes(), token.as_bytes()) {
        return Err(denied());
    }
    // A deleting volume is still routed: its delete removes its data
    // through its node. Content calls refuse it at the gateway.
    let now = store.clock_ms().await?;
    if !volume.node_id.is_empty() {
        let lease: Option<i64> = sqlx::query_scalar(NODE_LEASE)
            .bind(&volume.node_id)
            .fetch_optional(&store.reader)
            .await?;
        if lease.is_none_or(|l| l <= now) {
            return Err(Error::NodeDown(format!(
                "volume {} is on node {}, which is down; it is back when that node is",
                volume.name, volume.node_id
            )));
        }
        return Ok(VolumeRouteRow {
            node_id: volume.node_id.clone(),
            endpoint: volume.endpoint.clone(),
            volume,
        });
    }
    let rows = sqlx::query(SHARED_STORE_NODES)
        .bind(now)
        .fetch_all(&store.reader)
        .await?;
    let mut nodes: Vec<(String, String)> = Vec::new();
    for r in &rows {
        let unreachable: Option<i64> = r.try_get(3)?;
        let node: String = r.try_get(0)?;
        if unreachable.is_none() && avoid != Some(node.as_str()) {
            nodes.push((node, r.try_get(1)?));
        }
    }
    if nodes.is_empty() {
        return Err(Error::Refused {
            message: format!(
                "no live node has the shared volume store that holds volume {}",
                volume.name
            ),
            reason: warren_proto::REASON_NO_VOLUME_STORE,
        });
    }
    // The same node for a volume while the set of nodes stays the same:
    // its page cache and connections are reused.
    let pick = (warren_core::id::fnv1a(id.as_bytes()) % nodes.len() as u64) as usize;
    let (node_id, endpoint) = nodes.swap_remove(pick);
    Ok(VolumeRouteRow {
        volume,
        node_id,
        endpoint,
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl SqlStore {
    /// A new volume of `team` (see `CreateVolume` in scheduler.proto).
    pub async fn create_volume(
        &self,
        team: &str,
        name: &str,
        bounds: VolumeBounds,
    ) -> Result<VolumeRow> {
        let (team, name) = (team.to_string(), name.to_string());
        self.detached(|s| async move { create(&s, &team, &name, bounds).await })
            .await
    }

    /// One volume, if it exists.
    pub async fn volume(&self, id: &str) -> Result<Option<VolumeRow>> {
        if let Some(exec) = &self.exec {
            let (s, id) = (self.clone(), id.to_string());
            return super::run_on(exec, async move { s.volume_now(&id).await });
        }
        self.volume_now(id).await
    }

    async fn volume_now(&self, id: &str) -> Result<Option<VolumeRow>> {
        let row = sqlx::query(&by_id())
            .bind(id)
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref()
            .map(|r| volume_from_row(r, &self.sealer))
            .transpose()
    }

    /// A team's volumes, by name.
    pub async fn volumes(&self, team: &str) -> Result<Vec<VolumeRow>> {
        if let Some(exec) = &self.exec {
            let (s, team) = (self.clone(), team.to_string());
            return super::run_on(exec, async move { s.volumes_now(&team).await });
        }
        self.volumes_now(team).await
    }

    async fn volumes_now(&self, team: &str) -> Result<Vec<VolumeRow>> {
        let rows = sqlx::query(&of_team())
            .bind(team)
            .fetch_all(&self.reader)
            .await?;
        rows.iter()
            .map(|r| volume_from_row(r, &self.sealer))
            .collect()
    }

    /// READY → DELETING, unless a sandbox mounts it.
    pub async fn begin_delete_volume(&self, id: &str, team: &str) -> Result<VolumeRow> {
        let (id, team) = (id.to_string(), team.to_string());
        self.detached(|s| async move { begin_delete(&s, &id, &team).await })
            .await
    }

    /// Removes a DELETING volume's record and its mount rows.
    pub async fn finish_delete_volume(&self, id: &str, team: &str) -> Result<()> {
        let (id, team) = (id.to_string(), team.to_string());
        self.detached(|s| async move { finish_delete(&s, &id, &team).await })
            .await
    }

    /// Checks a content call's token; the node that serves it.
    pub async fn route_volume(
        &self,
        id: &str,
        token: &str,
        avoid: Option<&str>,
    ) -> Result<VolumeRouteRow> {
        if let Some(exec) = &self.exec {
            let (s, id, token, avoid) = (
                self.clone(),
                id.to_string(),
                token.to_string(),
                avoid.map(str::to_string),
            );
            return super::run_on(exec, async move {
                s.route_volume_now(&id, &token, avoid.as_deref()).await
            });
        }
        self.route_volume_now(id, token, avoid).await
    }

    async fn route_volume_now(
        &self,
        id: &str,
        token: &str,
        avoid: Option<&str>,
    ) -> Result<VolumeRouteRow> {
        route(self, id, token, avoid).await
    }

    /// Seals again, under the key that seals now, up to `batch` volume
    /// tokens stored under another key (`SqlStore::reseal` does the
    /// bindings'). Returns how many it looked at; 0 when none is left.
    pub async fn reseal_volumes(&self, batch: u32) -> Result<usize> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return super::run_on(exec, async move { s.reseal_volumes_now(batch).await });
        }
        self.reseal_volumes_now(batch).await
    }

    async fn reseal_volumes_now(&self, batch: u32) -> Result<usize> {
        let rows: Vec<(String, String)> = sqlx::query_as(UNSEALED)
            .bind(self.sealer.current_pattern())
            .bind(i64::from(batch))
            .fetch_all(&self.reader)
            .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut tx = self.write().await?;
        for (id, stored) in &rows {
            let token = self
                .sealer
                .open(id, seal::VOLUME_TOKEN, stored)
                .map_err(|e| Error::Corrupt(e.to_string()))?;
            sqlx::query(RESEAL)
                .bind(self.sealer.seal(id, seal::VOLUME_TOKEN, &token))
                .bind(id)
                .bind(stored)
                .execute(tx.conn())
                .await?;
        }
        tx.commit(&self.changed).await?;
        Ok(rows.len())
    }

    /// The volumes a sandbox mounts.
    pub async fn volume_mounts(&self, sandbox_id: &str) -> Result<Vec<MountRow>> {
        if let Some(exec) = &self.exec {
            let (s, id) = (self.clone(), sandbox_id.to_string());
            return super::run_on(exec, async move { s.volume_mounts_now(&id).await });
        }
        self.volume_mounts_now(sandbox_id).await
    }

    async fn volume_mounts_now(&self, sandbox_id: &str) -> Result<Vec<MountRow>> {
        let rows = sqlx::query(MOUNTS_OF)
            .bind(sandbox_id)
            .fetch_all(&self.reader)
            .await?;
        rows.iter().map(mount_from_row).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moving_sandbox_stays_with_its_local_volumes() {
        let m = |node: &str| MountRow {
            path: "/mnt/x".into(),
            volume_id: "v".into(),
            name: "x".into(),
            node_id: node.into(),
            max_bytes: 0,
        };
        assert_eq!(pin_of(&[]), Pin::Anywhere);
        assert_eq!(pin_of(&[m("")]), Pin::SharedStore);
        assert_eq!(pin_of(&[m(""), m("node-2")]), Pin::Node("node-2".into()));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
