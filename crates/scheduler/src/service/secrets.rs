//! The `Secrets` service (`secrets.proto`): team secrets for gateways,
//! and their values for the node that hosts a sandbox of the team
//! (`ResolveSecrets`). Checked again here whatever the gateway checked
//! (`warren_core::secrets`); who may call what is decided in the trait
//! impl at the bottom, as for the scheduler's own RPCs.

use super::{speaks_for, Allowed, SchedulerService};
use crate::error::{Error, Result};
use crate::store::{SecretKey, SecretRow};
use std::collections::BTreeMap;
use tonic::{Request, Response, Status};
use warren_proto::scheduler::v1 as pb;

/// Most secrets one `ListSecrets` page holds (E2B's page bound).
const MAX_PAGE: u32 = 100;
/// Most placeholders one request may resolve (a rule set's headers bound
/// them well below this).
const MAX_NAMES: usize = 256;

fn secret(s: SecretRow) -> pb::Secret {
    pb::Secret {
        secret_id: s.secret_id,
        team_id: s.team_id,
        name: s.name,
        version: s.version,
        metadata: s.metadata.into_iter().collect(),
        created_at_ms: s.created_at_ms,
        updated_at_ms: s.updated_at_ms,
    }
}

fn team(t: &str) -> Result<()> {
    if t.is_empty() {
        return Err(Error::invalid("team_id is required"));
    }
    Ok(())
}

fn key(s: &str) -> Result<SecretKey> {
    if s.is_empty() || s.len() > 256 {
        return Err(Error::invalid("secret must be a secret id or name"));
    }
    Ok(SecretKey::parse(s))
}

fn metadata(m: std::collections::HashMap<String, String>) -> Result<BTreeMap<String, String>> {
    let m: BTreeMap<String, String> = m.into_iter().collect();
    warren_core::secrets::metadata(&m).map_err(Error::invalid)?;
    Ok(m)
}

impl SchedulerService {
    async fn create_secret(&self, r: pb::CreateSecretRequest) -> Result<pb::Secret> {
        team(&r.team_id)?;
        let name = warren_core::secrets::name(&r.name).map_err(Error::invalid)?;
        warren_core::secrets::value(&r.value).map_err(Error::invalid)?;
        let m = metadata(r.metadata)?;
        let s = self
            .store
            .create_secret(&r.team_id, &name, &r.value, &m, r.max_per_team)
            .await?;
        Ok(secret(s))
    }

    async fn update_secret(&self, r: pb::UpdateSecretRequest) -> Result<pb::Secret> {
        team(&r.team_id)?;
        let k = key(&r.secret)?;
        warren_core::secrets::value(&r.value).map_err(Error::invalid)?;
        let m = if r.set_metadata {
            Some(metadata(r.metadata)?)
        } else {
            None
        };
        let s = self
            .store
            .update_secret(&r.team_id, &k, &r.value, m.as_ref())
            .await?;
        Ok(secret(s))
    }

    async fn get_secret(&self, r: pb::GetSecretRequest) -> Result<pb::Secret> {
        team(&r.team_id)?;
        let k = key(&r.secret)?;
        self.store
            .get_secret(&r.team_id, &k)
            .await?
            .map(secret)
            .ok_or_else(|| Error::NotFound(format!("secret {} not found", k.as_str())))
    }

    async fn list_secrets(&self, r: pb::ListSecretsRequest) -> Result<pb::ListSecretsResponse> {
        team(&r.team_id)?;
        let limit = if r.limit == 0 {
            MAX_PAGE
        } else {
            r.limit.min(MAX_PAGE)
        };
        let after = (!r.after.is_empty()).then_some(r.after.as_str());
        let (rows, next) = self.store.list_secrets(&r.team_id, after, limit).await?;
        Ok(pb::ListSecretsResponse {
            secrets: rows.into_iter().map(secret).collect(),
            next_after: next.unwrap_or_default(),
        })
    }

    async fn delete_secret(&self, r: pb::DeleteSecretRequest) -> Result<pb::DeleteSecretResponse> {
        team(&r.team_id)?;
        let k = key(&r.secret)?;
        if self.store.delete_secret(&r.team_id, &k).await? {
            Ok(pb::DeleteSecretResponse {})
        } else {
            Err(Error::NotFound(format!("secret {} not found", k.as_str())))
        }
    }

    async fn resolve_secrets(
        &self,
        r: pb::ResolveSecretsRequest,
    ) -> Result<pb::ResolveSecretsResponse> {
        super::validate::sandbox_id(&r.sandbox_id)?;
        super::validate::node_id(&r.node_id)?;
        if r.names.len() > MAX_NAMES {
            return Err(Error::invalid(format!(
                "at most {MAX_NAMES} names may be resolved at once"
            )));
        }
        for n in &r.names {
            if !warren_core::network::rules::is_secret_name(n) {
                return Err(Error::invalid(format!("{n:?} is not a secret name")));
            }
        }
        let names: Vec<String> = r.names.iter().map(|n| n.to_ascii_lowercase()).collect();
        let values = self
            .store
            .resolve_secrets(&r.sandbox_id, &r.node_id, r.generation, &names)
            .await?;
        Ok(pb::ResolveSecretsResponse {
            values: values.into_iter().collect(),
        })
    }
}

#[tonic::async_trait]
impl pb::secrets_server::Secrets for SchedulerService {
    async fn create_secret(
        &self,
        req: Request<pb::CreateSecretRequest>,
    ) -> Result<Response<pb::Secret>, Status> {
        rpc!(self, req, "CreateSecret", Gateways, |r, caller| self
            .create_secret(r))
    }

    async fn update_secret(
        &self,
        req: Request<pb::UpdateSecretRequest>,
    ) -> Result<Response<pb::Secret>, Status> {
        rpc!(self, req, "UpdateSecret", Gateways, |r, caller| self
            .update_secret(r))
    }

    async fn get_secret(
        &self,
        req: Request<pb::GetSecretRequest>,
    ) -> Result<Response<pb::Secret>, Status> {
        rpc!(self, req, "GetSecret", Gateways, |r, caller| self
            .get_secret(r))
    }

    async fn list_secrets(
        &self,
        req: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        rpc!(self, req, "ListSecrets", Gateways, |r, caller| self
            .list_secrets(r))
    }

    async fn delete_secret(
        &self,
        req: Request<pb::DeleteSecretRequest>,
    ) -> Result<Response<pb::DeleteSecretResponse>, Status> {
        rpc!(self, req, "DeleteSecret", Gateways, |r, caller| self
            .delete_secret(r))
    }

    async fn resolve_secrets(
        &self,
        req: Request<pb::ResolveSecretsRequest>,
    ) -> Result<Response<pb::ResolveSecretsResponse>, Status> {
        rpc!(self, req, "ResolveSecrets", Nodes, |r, caller| async {
            speaks_for("ResolveSecrets", &caller, &r.node_id)?;
            self.resolve_secrets(r).await
        })
    }
}
