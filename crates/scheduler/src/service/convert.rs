//! Store values → protobuf messages.

use crate::store::{
    BindingRow, Change, ChangeKind, Lifecycle, NodeRow, RouteRow, SandboxRef, State,
};
use warren_proto::scheduler::v1 as pb;

pub(crate) fn state(s: State) -> pb::BindingState {
    match s {
        State::Creating => pb::BindingState::Creating,
        State::Running => pb::BindingState::Running,
        State::Paused => pb::BindingState::Paused,
        State::Lost => pb::BindingState::Lost,
        State::Expiring => pb::BindingState::Expiring,
    }
}

/// `None` for UNSPECIFIED and unknown values.
pub(crate) fn state_from_pb(v: i32) -> Option<State> {
    match pb::BindingState::try_from(v).ok()? {
        pb::BindingState::Unspecified => None,
        pb::BindingState::Creating => Some(State::Creating),
        pb::BindingState::Running => Some(State::Running),
        pb::BindingState::Paused => Some(State::Paused),
        pb::BindingState::Lost => Some(State::Lost),
        pb::BindingState::Expiring => Some(State::Expiring),
    }
}

/// A binding as reads return it: without its secrets (the access token and
/// environment), which only the placement for the node's create carries.
pub(crate) fn binding(b: &BindingRow) -> pb::Binding {
    pb::Binding {
        access_token: String::new(),
        env_vars: Default::default(),
        ..binding_with_secrets(b)
    }
}

/// A binding with its secrets, for `Place`/`Reassign` answers only.
fn binding_with_secrets(b: &BindingRow) -> pb::Binding {
    pb::Binding {
        sandbox_id: b.sandbox_id.clone(),
        node_id: b.node_id.clone(),
        endpoint: b.endpoint.clone(),
        generation: b.generation,
        state: state(b.state) as i32,
        team_id: b.team_id.clone(),
        template_id: b.template_id.clone(),
        started_at_ms: b.started_at_ms,
        end_at_ms: b.end_at_ms,
        metadata: b
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        access_token: b.access_token.clone(),
        resources: Some(pb::Resources {
            cpu_count: b.cpu_count,
            memory_mb: b.memory_mb,
        }),
        env_vars: b
            .env_vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        updated_at_ms: b.updated_at_ms,
        lifecycle: Some(pb::Lifecycle {
            auto_pause: b.lifecycle.auto_pause,
            auto_resume: b.lifecycle.auto_resume,
        }),
        // Filled by the RPCs that answer them (Place, Reassign, GetSandbox).
        volume_mounts: Vec::new(),
    }
}

pub(crate) fn lifecycle(l: pb::Lifecycle) -> Lifecycle {
    Lifecycle {
        auto_pause: l.auto_pause,
        auto_resume: l.auto_resume,
    }
}

pub(crate) fn placement(b: &BindingRow, existing: bool) -> pb::Placement {
    pb::Placement {
        sandbox_id: b.sandbox_id.clone(),
        node_id: b.node_id.clone(),
        endpoint: b.endpoint.clone(),
        generation: b.generation,
        state: state(b.state) as i32,
        existing,
        binding: Some(binding_with_secrets(b)),
    }
}

pub(crate) fn route(b: RouteRow) -> pb::Route {
    pb::Route {
        sandbox_id: b.sandbox_id,
        node_id: b.node_id,
        endpoint: b.endpoint,
        generation: b.generation,
        state: state(b.state) as i32,
        team_id: b.team_id,
        auto_resume: b.auto_resume,
    }
}

pub(crate) fn node(n: &NodeRow) -> pb::Node {
    pb::Node {
        node_id: n.node_id.clone(),
        endpoint: n.endpoint.clone(),
        capacity: n.capacity,
        incarnation: n.incarnation,
        state: if n.up {
            pb::NodeState::Up
        } else {
            pb::NodeState::Down
        } as i32,
        sandboxes: n.sandboxes,
        lease_expires_at_ms: n.lease_expires_at_ms,
        registered_at_ms: n.registered_at_ms,
        unreachable_since_ms: n.unreachable_since_ms.unwrap_or(0),
        cached_layers: n.cached_layers.clone(),
    }
}

pub(crate) fn change(c: &Change) -> pb::BindingChange {
    let kind = match c.kind {
        ChangeKind::Assigned => pb::ChangeKind::Assigned,
        ChangeKind::Moved => pb::ChangeKind::Moved,
        ChangeKind::Removed => pb::ChangeKind::Removed,
        ChangeKind::Lost => pb::ChangeKind::Lost,
        ChangeKind::State => pb::ChangeKind::State,
    };
    pb::BindingChange {
        revision: c.revision,
        kind: kind as i32,
        sandbox_id: c.sandbox_id.clone(),
        node_id: c.node_id.clone(),
        generation: c.generation,
        state: c.state.map_or(pb::BindingState::Unspecified, state) as i32,
        resync_required: false,
        at_ms: c.at_ms,
    }
}

pub(crate) fn refs(v: Vec<SandboxRef>) -> Vec<pb::SandboxRef> {
    v.into_iter()
        .map(|r| pb::SandboxRef {
            sandbox_id: r.sandbox_id,
            generation: r.generation,
        })
        .collect()
}
