//! A running sandbox's network settings beyond its start: replacing its
//! egress policy (E2B's `PUT /sandboxes/{id}/network`), and who may reach
//! its ports and with which Host (E2B's `allowPublicTraffic: false` and its
//! traffic access token, `maskRequestHost`), checked on the data plane.

use super::state::Record;
use super::{NodeError, Registry, Sandbox};
use crate::runtime::{self, egress::NetworkPolicy};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use warren_core::network::rules::EgressRules;
use warren_core::node_api::NetworkInfo;
use warren_trust::sandbox_ca::SandboxCa;

/// Who may reach a sandbox's ports (other than envd's), and the Host
/// header requests to them arrive with. Fixed at create.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortAccess {
    /// SHA-256 (hex) of the traffic access token requests must carry; None:
    /// public. The token itself is never kept, on disk or in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_token_sha256: Option<String>,
    /// E2B's `maskRequestHost` (`${PORT}` replaced per request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
}

/// Why a request may not reach a sandbox's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    Missing,
    Wrong,
}

impl PortAccess {
    /// From a create request: the token hashed, the mask checked.
    pub fn new(token: Option<&str>, mask: Option<&str>) -> Result<PortAccess, NodeError> {
        if let Some(m) = mask {
            warren_core::network::validate_mask(m).map_err(NodeError::BadRequest)?;
        }
        if token.is_some_and(str::is_empty) {
            return Err(NodeError::BadRequest(
                "traffic_access_token is empty".into(),
            ));
        }
        Ok(PortAccess {
            traffic_token_sha256: token.map(sha256_hex),
            mask_request_host: mask.map(str::to_string),
        })
    }

    /// Whether a request carrying `token` (the `e2b-traffic-access-token`
    /// header) may reach the sandbox's ports. Compares digests in constant
    /// time, so the answer's timing says nothing about the token.
    pub fn admit(&self, token: Option<&[u8]>) -> Result<(), Denied> {
        let Some(want) = &self.traffic_token_sha256 else {
            return Ok(());
        };
        let got = sha256_hex_bytes(token.ok_or(Denied::Missing)?);
        let diff = want
            .bytes()
            .zip(got.bytes())
            .fold(want.len() ^ got.len(), |acc, (a, b)| {
                acc | usize::from(a ^ b)
            });
        if diff == 0 {
            Ok(())
        } else {
            Err(Denied::Wrong)
        }
    }
}

fn sha256_hex(s: &str) -> String {
    sha256_hex_bytes(s.as_bytes())
}

fn sha256_hex_bytes(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

impl Sandbox {
    /// Its network now, as the control API reports it (no secrets).
    pub fn network_info(&self) -> NetworkInfo {
        NetworkInfo {
            policy: self.policy(),
            allow_public_traffic: self.access.traffic_token_sha256.is_none(),
            mask_request_host: self.access.mask_request_host.clone(),
            rules: self.rules(),
        }
    }

    /// Its egress rules now.
    pub fn rules(&self) -> EgressRules {
        self.rules
            .lock()
            .map(|r| r.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Its egress CA, from its create (None: placed before there were any,
    /// or adopted).
    fn egress_ca(&self) -> Result<Option<SandboxCa>, NodeError> {
        self.boot
            .as_ref()
            .and_then(|b| b.0.egress_ca.as_deref())
            .map(SandboxCa::from_pem)
            .transpose()
            .map_err(|e| NodeError::Internal(e.to_string()))
    }

    /// Its egress policy now.
    pub fn policy(&self) -> NetworkPolicy {
        self.network
            .lock()
            .map(|p| p.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

impl Registry {
    /// Replaces the egress policy and rules of the sandbox hosted at
    /// `generation` (E2B's `PUT /sandboxes/{id}/network`), under the
    /// sandbox id's lock: the runtime applies them (isolated: its nftables
    /// table rewritten in one transaction, its egress proxy started, told
    /// or stopped), then `sandbox.json` keeps them. A runtime without
    /// network isolation answers `Unsupported`. A filesystem-paused
    /// sandbox keeps them for its next boot.
    pub async fn update_network(
        self: &Arc<Self>,
        id: &str,
        generation: u64,
        policy: NetworkPolicy,
        rules: EgressRules,
    ) -> Result<NetworkInfo, NodeError> {
        policy.validate().map_err(NodeError::BadRequest)?;
        rules.validate("rules").map_err(NodeError::BadRequest)?;
        let rules = rules.normalized();
        let lock = self.lock_for(id);
        let result = {
            let _held = lock.lock().await;
            match self.get(id, generation) {
                None => Err(self.not_hosted(id, Some(generation))),
                Some(sb) => self.update_network_locked(&sb, policy, rules).await,
            }
        };
        self.release_lock(id, lock);
        result
    }

    async fn update_network_locked(
        &self,
        sb: &Arc<Sandbox>,
        policy: NetworkPolicy,
        rules: EgressRules,
    ) -> Result<NetworkInfo, NodeError> {
        let ca = sb.egress_ca()?;
        // Halted (paused filesystem-only): nothing runs to apply them to;
        // its next boot starts with them.
        let applied = if sb.halted {
            Ok(())
        } else {
            // Out of its slot while the runtime works on it (the id's lock
            // keeps everyone else away), and back whatever happens.
            let mut egress = sb.egress.lock().ok().and_then(|mut e| e.take());
            let who = runtime::egress::Sandboxed {
                sandbox_id: &sb.info.sandbox_id,
                generation: sb.info.generation,
                ca: ca.as_ref(),
                rules: &rules,
            };
            let applied = self
                .runtime
                .update_network(&sb.handle, &mut egress, &policy, who)
                .await;
            if let Ok(mut slot) = sb.egress.lock() {
                *slot = egress;
            }
            applied
        };
        match applied {
            Ok(()) => {}
            Err(runtime::RuntimeError::Unsupported(m)) => return Err(NodeError::Unsupported(m)),
            Err(runtime::RuntimeError::Policy(m)) => return Err(NodeError::BadRequest(m)),
            Err(e) => {
                return Err(NodeError::Internal(format!(
                    "cannot apply the network policy: {e}"
                )))
            }
        }
        if let Ok(mut p) = sb.network.lock() {
            *p = policy;
        }
        if let Ok(mut r) = sb.rules.lock() {
            *r = rules;
        }
        let record = self.record_of(sb);
        if let Err(e) = record.save(&sb.paths.state) {
            // Enforced already; only a restarted node would not know it.
            tracing::error!(sandbox_id = %sb.info.sandbox_id, error = %e, "cannot write sandbox.json after a network update");
        }
        tracing::info!(sandbox_id = %sb.info.sandbox_id, generation = sb.info.generation, "network policy replaced");
        Ok(sb.network_info())
    }

    /// What `sandbox.json` holds for `sb` now.
    pub(super) fn record_of(&self, sb: &Sandbox) -> Record {
        Record {
            info: sb.info.clone(),
            metadata: sb.metadata.clone(),
            timeout_secs: sb.timeout_secs,
            handle: sb.handle.clone(),
            network: Some(sb.policy()),
            access: sb.access.clone(),
            rules: sb.rules(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_token_is_admitted() {
        let open = PortAccess::default();
        assert_eq!(open.admit(None), Ok(()));
        let closed = PortAccess::new(Some("s3cret"), None).unwrap_or_default();
        assert_eq!(closed.admit(None), Err(Denied::Missing));
        assert_eq!(closed.admit(Some(b"s3cre")), Err(Denied::Wrong));
        assert_eq!(closed.admit(Some(b"s3cret ")), Err(Denied::Wrong));
        assert_eq!(closed.admit(Some(b"s3cret")), Ok(()));
        // Never the token itself.
        let json = serde_json::to_string(&closed).unwrap_or_default();
        assert!(!json.contains("s3cret"), "{json}");
        assert!(PortAccess::new(Some(""), None).is_err());
        assert!(PortAccess::new(None, Some("bad host\r\n")).is_err());
    }
}
