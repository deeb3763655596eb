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
    /// Its egress rules now (placeholders, never values).
    #[serde(
        default,
        skip_serializing_if = "warren_core::network::rules::EgressRules::is_empty"
    )]
    pub rules: warren_core::network::rules::EgressRules,
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

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"{"info":{"sandbox_id":"abc","generation":2},"metadata":{},
        "timeout_secs":null,"handle":{"runtime":"process","pid":1,"start_time":0,
        "pid_ns":null,"session":true,"cgroup":null,"mark":"m"}}"#;

    #[test]
    fn the_network_survives_a_save_and_older_files_still_load() {
        let old: Record = serde_json::from_str(OLD).expect("a file from before updates loads");
        assert_eq!(old.network, None);
        assert_eq!(old.access, super::super::network::PortAccess::default());

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sandbox.json");
        let mut rec = old.clone();
        rec.network = Some(warren_core::network::NetworkPolicy {
            allow_internet: false,
            allow_out: vec!["10.1.2.3".into()],
            deny_out: vec![],
        });
        rec.access =
            super::super::network::PortAccess::new(Some("tok"), Some("h:${PORT}")).expect("access");
        rec.save(&path).expect("save");
        let back = Record::load(&path).expect("load");
        assert_eq!(back.network, rec.network);
        assert_eq!(back.access, rec.access);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(!text.contains("\"tok\""), "{text}");
    }
}
