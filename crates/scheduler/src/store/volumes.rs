//! Volumes as the store reads and writes them (`migrations/0008_volumes.sql`),
//! backend-free. The operations are in `sqlstore/volumes.rs`.

/// A volume's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeState {
    Ready,
    /// Its delete began: nothing new mounts it.
    Deleting,
}

impl VolumeState {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeState::Ready => "ready",
            VolumeState::Deleting => "deleting",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ready" => Some(VolumeState::Ready),
            "deleting" => Some(VolumeState::Deleting),
            _ => None,
        }
    }
}

/// One volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    pub volume_id: String,
    pub team_id: String,
    pub name: String,
    /// Opened (the store keeps it sealed).
    pub token: String,
    /// Its node; empty: the shared store.
    pub node_id: String,
    /// That node's address now ('' when shared or unknown).
    pub endpoint: String,
    pub max_bytes: u64,
    pub state: VolumeState,
    pub created_at_ms: i64,
}

/// One volume a sandbox mounts, with what a node needs to mount it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRow {
    pub path: String,
    pub volume_id: String,
    pub name: String,
    pub node_id: String,
    pub max_bytes: u64,
}

/// A volume a new sandbox asks for, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountRequest {
    pub name: String,
    /// Normalized (`warren_core::volume::mount_paths`).
    pub path: String,
}

/// A team's bounds on volumes, each 0 for none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeBounds {
    pub max_count: u32,
    pub max_bytes: u64,
}

/// The node a content call goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRouteRow {
    pub volume: VolumeRow,
    pub node_id: String,
    pub endpoint: String,
}

/// What a node's volume store is (`nodes.volume_store`).
pub const STORE_LOCAL: &str = "local";
pub const STORE_SHARED: &str = "shared";
