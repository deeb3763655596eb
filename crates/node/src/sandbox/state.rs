//! What the control API exchanges (`CreateSandbox`, `SandboxInfo`) and what
//! the node keeps per sandbox in `sandbox.json` (a [`Record`]), so a restarted
//! node finds what it hosted. The access token is never written to disk.

use crate::runtime::Handle;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// `POST /_warren/v1/sandboxes` body (docs/internals.md "Control API").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    pub sandbox_id: String,
    pub generation: u64,
    #[serde(default)]
    pub template_id: String,
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub access_token: Option<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Egress policy; absent: open internet (E2B's default).
    #[serde(default)]
    pub network: Option<crate::runtime::egress::NetworkPolicy>,
}

/// `POST /_warren/v1/sandboxes/{id}/fork` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkSandbox {
    /// The parent's generation, as the caller believes it is hosted.
    pub generation: u64,
    pub child: CreateSandbox,
}

/// A hosted sandbox as the control API reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxInfo {
    pub sandbox_id: String,
    pub generation: u64,
    pub template_id: String,
    pub node_id: String,
    pub started_at_ms: i64,
    pub envd_version: String,
}

/// `sandbox.json`: the info plus how to find the sandbox's processes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub info: SandboxInfo,
    pub metadata: BTreeMap<String, String>,
    pub timeout_secs: Option<u64>,
    pub handle: Handle,
}

impl Record {
    /// Writes atomically (temp file + rename), so a crash never leaves half a file.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }

    pub fn load(path: &Path) -> std::io::Result<Record> {
        let text = std::fs::read(path)?;
        serde_json::from_slice(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}
