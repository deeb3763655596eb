//! Team secrets (E2B's `/secrets`): created, given a new version, read
//! (metadata only), listed, deleted, and resolved for a node's egress
//! proxy.
//!
//! A value is sealed under the secrets key (`--secrets-key-file`) bound
//! to its team and id before it is written, and opened only by
//! [`SqlStore::resolve_secrets`], for the node that hosts a sandbox of
//! that team at the generation it names. Names are unique per team
//! (lower-cased by the caller); a create past the team's bound is refused
//! in the same transaction that counts it.

use super::{json_map, map_json, to_i64, to_u64, SqlStore};
use crate::error::{Error, Result};
use crate::store::seal::Sealer;
use crate::store::sql_secrets as sql;
use crate::store::types::{SecretKey, SecretRow};
use sqlx::any::AnyRow;
use sqlx::Row;
use std::collections::BTreeMap;
use std::sync::Arc;

fn secret_from_row(r: &AnyRow) -> Result<SecretRow> {
    Ok(SecretRow {
        secret_id: r.try_get("secret_id")?,
        team_id: r.try_get("team_id")?,
        name: r.try_get("name")?,
        version: to_u64(r.try_get("version")?, "version")?,
        metadata: json_map(r.try_get("metadata")?, "secret metadata")?,
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
    })
}

impl SqlStore {
    /// Seals team secrets with `sealer` (`--secrets-key-file`). Without
    /// it, every secret operation fails with FAILED_PRECONDITION naming
    /// the flag.
    pub fn with_secrets(mut self, sealer: Arc<Sealer>) -> SqlStore {
        self.secrets = Some(sealer);
        self
    }

    fn secrets_sealer(&self) -> Result<Arc<Sealer>> {
        self.secrets.clone().ok_or_else(|| {
            Error::FailedPrecondition(
                "this scheduler keeps no secrets: start it with --secrets-key-file (required \
                 with a PostgreSQL store)"
                    .into(),
            )
        })
    }

    /// The id of the key secrets are sealed with now, if there is one.
    pub fn secrets_key_id(&self) -> Option<&str> {
        self.secrets.as_deref().map(Sealer::current_id)
    }

    /// A new secret of `team` at version 1. ALREADY_EXISTS when the team has
    /// one of that name; RESOURCE_EXHAUSTED (`bound`) when it holds
    /// `max_per_team` already (0: no bound).
    pub async fn create_secret(
        &self,
        team: &str,
        name: &str,
        value: &str,
        metadata: &BTreeMap<String, String>,
        max_per_team: u32,
    ) -> Result<SecretRow> {
        let sealer = self.secrets_sealer()?;
        let (team, name, value, metadata) = (
            team.to_string(),
            name.to_string(),
            value.to_string(),
            metadata.clone(),
        );
        self.detached(|s| async move {
            let mut tx = s.write().await?;
            let taken: Option<String> = sqlx::query_scalar(sql::SECRET_ID_BY_NAME)
                .bind(&team)
                .bind(&name)
                .fetch_optional(tx.conn())
                .await?;
            if taken.is_some() {
                return Err(Error::AlreadyExists(format!(
                    "a secret named {name:?} already exists"
                )));
            }
            if max_per_team > 0 {
                let held: i64 = sqlx::query_scalar(sql::TEAM_SECRETS)
                    .bind(&team)
                    .fetch_one(tx.conn())
                    .await?;
                if held >= i64::from(max_per_team) {
                    return Err(Error::Bound {
                        message: format!(
                            "the team has {held} secrets, its limit (--secrets-team-count) is \
                             {max_per_team}; delete one first"
                        ),
                        bound: warren_proto::BOUND_SECRETS,
                    });
                }
            }
            let secret_id = format!("sec_{}", warren_core::id::random_token(24));
            let row = SecretRow {
                secret_id: secret_id.clone(),
                team_id: team.clone(),
                name,
                version: 1,
                metadata,
                created_at_ms: tx.now,
                updated_at_ms: tx.now,
            };
            sqlx::query(sql::INSERT_SECRET)
                .bind(&row.secret_id)
                .bind(&row.team_id)
                .bind(&row.name)
                .bind(to_i64(row.version))
                .bind(sealer.seal_secret(&team, &secret_id, &value))
                .bind(map_json(&row.metadata))
                .bind(row.created_at_ms)
                .bind(row.updated_at_ms)
                .execute(tx.conn())
                .await?;
            tx.commit(&s.changed).await?;
            Ok(row)
        })
        .await
    }

    /// Stores `value` as the secret's next version (and `metadata` when
    /// given). NOT_FOUND unless the team has it.
    pub async fn update_secret(
        &self,
        team: &str,
        key: &SecretKey,
        value: &str,
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<SecretRow> {
        let sealer = self.secrets_sealer()?;
        let (team, key, value, metadata) = (
            team.to_string(),
            key.clone(),
            value.to_string(),
            metadata.cloned(),
        );
        self.detached(|s| async move {
            let mut tx = s.write().await?;
            let row = sqlx::query(key.select())
                .bind(&team)
                .bind(key.as_str())
                .fetch_optional(tx.conn())
                .await?
                .ok_or_else(|| not_found(&key))?;
            let mut secret = secret_from_row(&row)?;
            secret.version += 1;
            secret.updated_at_ms = tx.now;
            if let Some(m) = metadata {
                secret.metadata = m;
            }
            sqlx::query(sql::UPDATE_SECRET)
                .bind(to_i64(secret.version))
                .bind(sealer.seal_secret(&team, &secret.secret_id, &value))
                .bind(map_json(&secret.metadata))
                .bind(secret.updated_at_ms)
                .bind(&secret.secret_id)
                .bind(&team)
                .execute(tx.conn())
                .await?;
            tx.commit(&s.changed).await?;
            Ok(secret)
        })
        .await
    }

    /// One of the team's secrets (never its value).
    pub async fn get_secret(&self, team: &str, key: &SecretKey) -> Result<Option<SecretRow>> {
        if let Some(exec) = &self.exec {
            let (s, team, key) = (self.clone(), team.to_string(), key.clone());
            return super::run_on(exec, async move { s.get_secret_now(&team, &key).await });
        }
        self.get_secret_now(team, key).await
    }

    async fn get_secret_now(&self, team: &str, key: &SecretKey) -> Result<Option<SecretRow>> {
        self.secrets_sealer()?;
        let row = sqlx::query(key.select())
            .bind(team)
            .bind(key.as_str())
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(secret_from_row).transpose()
    }

    /// Up to `limit` of the team's secrets by name after `after`, and the
    /// name the next page starts after (None: this was the last page).
    pub async fn list_secrets(
        &self,
        team: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<SecretRow>, Option<String>)> {
        if let Some(exec) = &self.exec {
            let (s, team, after) = (self.clone(), team.to_string(), after.map(str::to_string));
            return super::run_on(exec, async move {
                s.list_secrets_now(&team, after.as_deref(), limit).await
            });
        }
        self.list_secrets_now(team, after, limit).await
    }

    async fn list_secrets_now(
        &self,
        team: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<SecretRow>, Option<String>)> {
        self.secrets_sealer()?;
        let rows = sqlx::query(sql::LIST_SECRETS)
            .bind(team)
            .bind(after.unwrap_or(""))
            .bind(i64::from(limit) + 1)
            .fetch_all(&self.reader)
            .await?;
        let mut out = rows
            .iter()
            .map(secret_from_row)
            .collect::<Result<Vec<_>>>()?;
        let next = if out.len() > limit as usize {
            out.truncate(limit as usize);
            out.last().map(|s| s.name.clone())
        } else {
            None
        };
        Ok((out, next))
    }

    /// Deletes the team's secret; false when it has none such.
    pub async fn delete_secret(&self, team: &str, key: &SecretKey) -> Result<bool> {
        self.secrets_sealer()?;
        let (team, key) = (team.to_string(), key.clone());
        self.detached(|s| async move {
            let mut tx = s.write().await?;
            let gone = sqlx::query(key.delete())
                .bind(&team)
                .bind(key.as_str())
                .execute(tx.conn())
                .await?
                .rows_affected();
            tx.commit(&s.changed).await?;
            Ok(gone > 0)
        })
        .await
    }

    /// The current values of the secrets named `names` (lower-cased) of
    /// the team that owns sandbox `sandbox_id`, for the egress proxy of
    /// `node_id`, which must host it at `generation`: the names the team
    /// has a secret of (never whether another team has one); NOT_FOUND
    /// for an unknown sandbox, FAILED_PRECONDITION when the node does not
    /// host it at that generation.
    pub async fn resolve_secrets(
        &self,
        sandbox_id: &str,
        node_id: &str,
        generation: u64,
        names: &[String],
    ) -> Result<BTreeMap<String, String>> {
        if let Some(exec) = &self.exec {
            let (s, id, node, names) = (
                self.clone(),
                sandbox_id.to_string(),
                node_id.to_string(),
                names.to_vec(),
            );
            return super::run_on(exec, async move {
                s.resolve_secrets_now(&id, &node, generation, &names).await
            });
        }
        self.resolve_secrets_now(sandbox_id, node_id, generation, names)
            .await
    }

    async fn resolve_secrets_now(
        &self,
        sandbox_id: &str,
        node_id: &str,
        generation: u64,
        names: &[String],
    ) -> Result<BTreeMap<String, String>> {
        let sealer = self.secrets_sealer()?;
        let binding = self
            .get(sandbox_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_id} not found")))?;
        if binding.node_id != node_id || binding.generation != generation {
            return Err(Error::FailedPrecondition(format!(
                "sandbox {sandbox_id} is not hosted by node {node_id} at generation {generation}"
            )));
        }
        let mut out = BTreeMap::new();
        for name in names {
            let Some(row) = sqlx::query(sql::SECRET_VALUE_BY_NAME)
                .bind(&binding.team_id)
                .bind(name)
                .fetch_optional(&self.reader)
                .await?
            else {
                continue;
            };
            let id: String = row.try_get("secret_id")?;
            let stored: String = row.try_get("value")?;
            let value = sealer
                .open_secret(&binding.team_id, &id, &stored)
                .map_err(|e| Error::Corrupt(e.to_string()))?;
            out.insert(name.clone(), value);
        }
        Ok(out)
    }

    /// Seals again, under the secrets key that seals now, up to `batch`
    /// secrets sealed under another (a rotation). Returns how many it
    /// looked at; 0 when none is left (or there is no secrets key).
    pub async fn reseal_secrets(&self, batch: u32) -> Result<usize> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return super::run_on(exec, async move { s.reseal_secrets_now(batch).await });
        }
        self.reseal_secrets_now(batch).await
    }

    async fn reseal_secrets_now(&self, batch: u32) -> Result<usize> {
        let Some(sealer) = self.secrets.clone() else {
            return Ok(0);
        };
        let rows = sqlx::query(sql::UNSEALED_SECRETS)
            .bind(sealer.current_pattern())
            .bind(i64::from(batch))
            .fetch_all(&self.reader)
            .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let mut tx = self.write().await?;
        for r in &rows {
            let (id, team, stored): (String, String, String) = (
                r.try_get("secret_id")?,
                r.try_get("team_id")?,
                r.try_get("value")?,
            );
            let plain = sealer
                .open_secret(&team, &id, &stored)
                .map_err(|e| Error::Corrupt(e.to_string()))?;
            sqlx::query(sql::RESEAL_SECRET)
                .bind(sealer.seal_secret(&team, &id, &plain))
                .bind(&id)
                .bind(&stored)
                .execute(tx.conn())
                .await?;
        }
        tx.commit(&self.changed).await?;
        Ok(rows.len())
    }
}

fn not_found(key: &SecretKey) -> Error {
    Error::NotFound(format!("secret {} not found", key.as_str()))
}
