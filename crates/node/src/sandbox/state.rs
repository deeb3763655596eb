//! What the node keeps per sandbox in `sandbox.json` (a [`Record`]), so a restarted
//! node finds what it hosted. The access token is never written to disk (the traffic
//! access token only as its SHA-256).

use crate::runtime::Handle;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
pub use warren_core::node_api::{CreateSandbox, ForkSandbox, SandboxInfo};

/// `sandbox.json`: the info plus how to find the sandbox's processes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub info: SandboxInfo,
    pub metadata: BTreeMap<String, String>,
    pub timeout_secs: Option<u64>,
    pub handle: Handle,
    /// Its egress policy now (absent in files written before updates
    /// existed: the one it was created with, unknown).
    #[serde(default)]
    pub network: Option<warren_core::network::NetworkPolicy>,
    #[serde(default)]
    pub access: super::network::PortAccess,
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
