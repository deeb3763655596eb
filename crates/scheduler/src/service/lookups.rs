//! `LookupNode` and its batch, `LookupNodes`: where sandboxes live, from
//! the route view when it is fresh enough for the caller (`route_view.rs`).

use super::{convert, validate, SchedulerService};
use crate::error::{Error, Result};
use crate::route_view::Freshness;
use crate::store::State;
use tonic::Status;
use warren_proto::scheduler::v1 as pb;
use warren_proto::REASON_METADATA;

/// Most ids in one `LookupNodes`.
pub const MAX_LOOKUPS: usize = 1024;

impl SchedulerService {
    pub(super) async fn lookup_node(&self, r: pb::LookupNodeRequest) -> Result<pb::Route> {
        let want = Freshness {
            min_revision: r.min_revision,
            consistent: r.consistent,
        };
        self.route(&r.sandbox_id, want).await
    }

    pub(super) async fn lookup_nodes(
        &self,
        r: pb::LookupNodesRequest,
    ) -> Result<pb::LookupNodesResponse> {
        if r.sandbox_ids.len() > MAX_LOOKUPS {
            return Err(Error::invalid(format!(
                "{} sandbox ids in one LookupNodes; the limit is {MAX_LOOKUPS}",
                r.sandbox_ids.len()
            )));
        }
        let want = Freshness {
            min_revision: r.min_revision,
            consistent: false,
        };
        let mut results = Vec::with_capacity(r.sandbox_ids.len());
        for id in &r.sandbox_ids {
            results.push(match self.route(id, want).await {
                Ok(route) => pb::LookupResult {
                    route: Some(route),
                    ..Default::default()
                },
                // The store failing fails the call: the caller retries
                // elsewhere, as it would a LookupNode.
                Err(e @ (Error::Store(_) | Error::Internal(_))) => return Err(e),
                Err(e) => failed(Status::from(e)),
            });
        }
        Ok(pb::LookupNodesResponse { results })
    }

    /// One sandbox's route as `LookupNode` answers it.
    async fn route(&self, sandbox_id: &str, want: Freshness) -> Result<pb::Route> {
        validate::sandbox_id(sandbox_id)?;
        let b = self
            .view
            .lookup(&self.store, sandbox_id, want)
            .await?
            .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_id} not found")))?;
        if b.state == State::Lost {
            return Err(Error::NodeDown(format!(
                "sandbox {} is on node {}, which is down",
                b.sandbox_id, b.node_id
            )));
        }
        Ok(convert::route(b))
    }
}

/// The result for an id `LookupNode` would have failed with `status`.
fn failed(status: Status) -> pb::LookupResult {
    let reason = status
        .metadata()
        .get(REASON_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    pb::LookupResult {
        route: None,
        code: status.code() as i32,
        message: status.message().to_string(),
        reason,
    }
}
