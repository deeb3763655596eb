//! The volume RPCs' bodies (`volumes.proto`): validate, call the store,
//! convert. Who may call them (gateways only) is decided in `mod.rs` like
//! for every RPC.

use super::SchedulerService;
use crate::error::{Error, Result};
use crate::store::{MountRequest, MountRow, VolumeBounds, VolumeRow, VolumeState};
use warren_proto::scheduler::v1 as pb;

fn volume_id(id: &str) -> Result<()> {
    warren_core::volume::validate_id(id).map_err(Error::invalid)
}

fn team(t: &str) -> Result<()> {
    super::validate::label("team_id", t)?;
    if t.is_empty() {
        return Err(Error::invalid("team_id is empty"));
    }
    Ok(())
}

pub(super) fn volume_pb(v: VolumeRow, with_token: bool) -> pb::Volume {
    pb::Volume {
        state: match v.state {
            VolumeState::Ready => pb::VolumeState::Ready,
            VolumeState::Deleting => pb::VolumeState::Deleting,
        } as i32,
        volume_id: v.volume_id,
        team_id: v.team_id,
        name: v.name,
        token: if with_token { v.token } else { String::new() },
        node_id: v.node_id,
        endpoint: v.endpoint,
        max_bytes: v.max_bytes,
        created_at_ms: v.created_at_ms,
    }
}

pub(super) fn mount_pb(m: MountRow) -> pb::VolumeMount {
    pb::VolumeMount {
        path: m.path,
        volume_id: m.volume_id,
        name: m.name,
        node_id: m.node_id,
        max_bytes: m.max_bytes,
    }
}

/// A Place's volume requests, checked: names valid, paths valid and
/// normalized, none twice, none inside another.
pub(super) fn mount_requests(reqs: &[pb::VolumeMountRequest]) -> Result<Vec<MountRequest>> {
    for r in reqs {
        warren_core::volume::validate_name(&r.name)
            .map_err(|e| Error::invalid(format!("volume_mounts: {e}")))?;
    }
    let paths = warren_core::volume::mount_paths(reqs.iter().map(|r| r.path.as_str()))
        .map_err(|e| Error::invalid(format!("volume_mounts: {e}")))?;
    Ok(reqs
        .iter()
        .zip(paths)
        .map(|(r, path)| MountRequest {
            name: r.name.clone(),
            path,
        })
        .collect())
}

/// `RegisterNodeRequest.volume_store`.
pub(super) fn store_kind(s: &str) -> Result<()> {
    match s {
        "" | crate::store::volumes::STORE_LOCAL | crate::store::volumes::STORE_SHARED => Ok(()),
        other => Err(Error::invalid(format!(
            "volume_store {other:?} is none of \"\", \"local\", \"shared\""
        ))),
    }
}

impl SchedulerService {
    pub(super) async fn create_volume(&self, r: pb::CreateVolumeRequest) -> Result<pb::Volume> {
        team(&r.team_id)?;
        warren_core::volume::validate_name(&r.name).map_err(Error::invalid)?;
        let b = r.bounds.unwrap_or_default();
        let v = self
            .store
            .create_volume(
                &r.team_id,
                &r.name,
                VolumeBounds {
                    max_count: b.max_count,
                    max_bytes: b.max_bytes,
                },
            )
            .await?;
        Ok(volume_pb(v, true))
    }

    pub(super) async fn get_volume(&self, r: pb::GetVolumeRequest) -> Result<pb::Volume> {
        volume_id(&r.volume_id)?;
        team(&r.team_id)?;
        self.store
            .volume(&r.volume_id)
            .await?
            .filter(|v| v.team_id == r.team_id)
            .map(|v| volume_pb(v, r.with_token))
            .ok_or_else(|| Error::NotFound(format!("volume {} not found", r.volume_id)))
    }

    pub(super) async fn list_volumes(
        &self,
        r: pb::ListVolumesRequest,
    ) -> Result<pb::ListVolumesResponse> {
        team(&r.team_id)?;
        let volumes = self.store.volumes(&r.team_id).await?;
        Ok(pb::ListVolumesResponse {
            volumes: volumes.into_iter().map(|v| volume_pb(v, false)).collect(),
        })
    }

    pub(super) async fn begin_delete_volume(
        &self,
        r: pb::BeginDeleteVolumeRequest,
    ) -> Result<pb::Volume> {
        volume_id(&r.volume_id)?;
        team(&r.team_id)?;
        let v = self
            .store
            .begin_delete_volume(&r.volume_id, &r.team_id)
            .await?;
        Ok(volume_pb(v, false))
    }

    pub(super) async fn finish_delete_volume(
        &self,
        r: pb::FinishDeleteVolumeRequest,
    ) -> Result<pb::FinishDeleteVolumeResponse> {
        volume_id(&r.volume_id)?;
        team(&r.team_id)?;
        self.store
            .finish_delete_volume(&r.volume_id, &r.team_id)
            .await?;
        Ok(pb::FinishDeleteVolumeResponse {})
    }

    pub(super) async fn route_volume(&self, r: pb::RouteVolumeRequest) -> Result<pb::VolumeRoute> {
        volume_id(&r.volume_id)?;
        if r.token.is_empty() || r.token.len() > 256 {
            return Err(Error::Unauthenticated(format!(
                "volume {} needs its token",
                r.volume_id
            )));
        }
        let avoid = match r.avoid_node_id.as_str() {
            "" => None,
            n => {
                super::validate::node_id(n)?;
                Some(n)
            }
        };
        let route = self
            .store
            .route_volume(&r.volume_id, &r.token, avoid)
            .await?;
        Ok(pb::VolumeRoute {
            volume: Some(volume_pb(route.volume, false)),
            node_id: route.node_id,
            endpoint: route.endpoint,
        })
    }

    /// The volumes a sandbox mounts, for a binding answered to a gateway.
    pub(super) async fn mounts_pb(&self, sandbox_id: &str) -> Result<Vec<pb::VolumeMount>> {
        Ok(self
            .store
            .volume_mounts(sandbox_id)
            .await?
            .into_iter()
            .map(mount_pb)
            .collect())
    }
}
