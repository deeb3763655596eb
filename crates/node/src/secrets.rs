//! Placeholders of a sandbox's egress rules resolved for its egress proxy
//! (`warren-egress`): the scheduler's `ResolveSecrets`, per request, as
//! this node (its certificate names it), for a sandbox it hosts at the
//! generation the proxy was made for. Nothing is cached: a secret updated
//! now is used by the next request. Values are never logged.

use futures_util::future::BoxFuture;
use std::collections::BTreeMap;
use std::sync::Arc;
use warren_egress::ResolveError;
use warren_proto::scheduler::v1 as pb;

/// See the module doc.
pub struct SchedulerSecrets {
    /// A scheduler client of its own, so a resolve never waits behind a
    /// heartbeat.
    scheduler: Arc<warren_proto::client::Scheduler>,
    node_id: String,
}

impl SchedulerSecrets {
    pub fn new(scheduler: warren_proto::client::Scheduler, node_id: String) -> SchedulerSecrets {
        SchedulerSecrets {
            scheduler: Arc::new(scheduler),
            node_id,
        }
    }
}

impl warren_egress::Resolver for SchedulerSecrets {
    fn resolve(
        &self,
        sandbox_id: &str,
        generation: u64,
        names: Vec<String>,
    ) -> BoxFuture<'static, Result<BTreeMap<String, String>, ResolveError>> {
        let scheduler = self.scheduler.clone();
        let req = pb::ResolveSecretsRequest {
            sandbox_id: sandbox_id.to_string(),
            node_id: self.node_id.clone(),
            generation,
            names: names.clone(),
        };
        Box::pin(async move {
            let answer = scheduler
                .call_secrets("ResolveSecrets", |mut c| {
                    let req = req.clone();
                    async move { c.resolve_secrets(req).await }
                })
                .await
                .map_err(|s| {
                    tracing::warn!(code = ?s.code(), message = s.message(), "cannot resolve a sandbox's secrets");
                    ResolveError::Unavailable(format!(
                        "the scheduler answered {:?}: {}",
                        s.code(),
                        s.message()
                    ))
                })?;
            let values: BTreeMap<String, String> = answer.values.into_iter().collect();
            if let Some(missing) = names.iter().find(|n| !values.contains_key(*n)) {
                return Err(ResolveError::Missing(missing.clone()));
            }
            Ok(values)
        })
    }
}
