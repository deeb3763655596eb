//! The node's sandbox metrics (`GET /_warren/v1/sandboxes/{id}/metrics`,
//! [`warren_core::node_api::metrics`]).

use super::{parse, NodeClient, NodeError};
use http::Method;
use warren_core::node_api::metrics::{metrics_path, SandboxMetric, Window};

impl NodeClient {
    /// The samples the node keeps for `id` at `generation` within `w`,
    /// oldest first.
    pub async fn metrics(
        &self,
        endpoint: &str,
        id: &str,
        generation: u64,
        w: &Window,
    ) -> Result<Vec<SandboxMetric>, NodeError> {
        let path = metrics_path(id, generation, w);
        let (_, bytes) = self.send(endpoint, Method::GET, path, None).await?;
        parse(endpoint, &bytes)
    }
}
