//! warren's template records (`warren_template::Template`, what the node
//! control API and the shared store's files carry) as the scheduler stores
//! them (`records.proto`), both ways: gateways convert every record they
//! read and write; a node converts the paused record it reports with an
//! auto-pause (`SandboxEvent.paused_record`).

use crate::scheduler::v1 as pb;
use warren_template::{Paused, Snapshot, Template};

/// The kind a record is stored as: an operator's template, a team's
/// snapshot or built template (`built`: the caller knows), a paused
/// sandbox's own.
pub fn kind_of(t: &Template, built: bool) -> pb::RecordKind {
    match &t.snapshot {
        None => pb::RecordKind::Operator,
        Some(s) if s.paused.is_some() => pb::RecordKind::Paused,
        Some(_) if built => pb::RecordKind::Built,
        Some(_) => pb::RecordKind::Snapshot,
    }
}

/// `t` as the scheduler stores it; `size` gives each layer's bytes.
pub fn to_record(
    t: &Template,
    kind: pb::RecordKind,
    size: impl Fn(&str) -> u64,
) -> pb::TemplateRecord {
    let d = &t.defaults;
    pb::TemplateRecord {
        name: t.name.clone(),
        kind: kind as i32,
        team_id: t
            .snapshot
            .as_ref()
            .map(|s| s.team.clone())
            .unwrap_or_default(),
        digest: t.digest.clone(),
        layers: t
            .layers
            .iter()
            .map(|l| pb::Layer {
                digest: l.clone(),
                size_bytes: size(l),
            })
            .collect(),
        defaults: Some(pb::TemplateDefaults {
            user: d.user.clone(),
            workdir: d.workdir.clone(),
            env: d.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            start_cmd: d.start_cmd.clone(),
            ready_cmd: d.ready_cmd.clone(),
            ready_timeout_secs: d.ready_timeout_secs,
            cpu_count: d.cpu_count,
            memory_mb: d.memory_mb,
            disk_mb: d.disk_mb,
        }),
        source: t.source.clone(),
        images: t.images.clone(),
        snapshot: t.snapshot.as_ref().map(|s| pb::SnapshotMeta {
            name: s.name.clone().unwrap_or_default(),
            source_sandbox: s.source_sandbox.clone(),
            node_id: s.node_id.clone(),
            paused: s.paused.as_ref().map(|p| pb::PausedMeta {
                generation: p.generation,
                settings_json: p.settings.to_string(),
                own_layers: p.own_layers.clone(),
            }),
            public: s.public,
        }),
        created_at_ms: i64::try_from(t.created_at_ms).unwrap_or(0),
        updated_at_ms: 0,
        version: 0,
    }
}

/// The record the scheduler holds, as a `Template`; an error names what
/// is wrong with it (the store's own validation makes that rare).
pub fn from_record(r: pb::TemplateRecord) -> Result<Template, String> {
    let d = r.defaults.unwrap_or_default();
    let defaults = warren_template::spec::Defaults {
        user: d.user,
        workdir: d.workdir,
        env: d.env.into_iter().collect(),
        start_cmd: d.start_cmd,
        ready_cmd: d.ready_cmd,
        ready_timeout_secs: d.ready_timeout_secs,
        cpu_count: d.cpu_count,
        memory_mb: d.memory_mb,
        disk_mb: d.disk_mb,
    };
    let snapshot = match r.snapshot {
        None => None,
        Some(s) => Some(Snapshot {
            team: r.team_id.clone(),
            name: (!s.name.is_empty()).then_some(s.name),
            source_sandbox: s.source_sandbox,
            node_id: s.node_id,
            paused: match s.paused {
                None => None,
                Some(p) => Some(Paused {
                    generation: p.generation,
                    settings: serde_json::from_str(&p.settings_json).map_err(|e| {
                        format!("record {}: its paused settings are not JSON: {e}", r.name)
                    })?,
                    own_layers: p.own_layers,
                }),
            },
            public: s.public,
        }),
    };
    Ok(Template {
        name: r.name,
        digest: r.digest,
        defaults,
        created_at_ms: u64::try_from(r.created_at_ms).unwrap_or(0),
        source: r.source,
        layers: r.layers.into_iter().map(|l| l.digest).collect(),
        snapshot,
        images: r.images,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_converts_both_ways() {
        let t = Template {
            name: "snap-abc".into(),
            digest: format!("sha256-{}", "a".repeat(64)),
            defaults: warren_template::spec::Defaults {
                start_cmd: "run".into(),
                ..Default::default()
            },
            created_at_ms: 1234,
            source: "snapshot of sandbox s1".into(),
            layers: vec![format!("sha256-{}", "b".repeat(64))],
            snapshot: Some(Snapshot {
                team: "t1".into(),
                name: Some("mine".into()),
                source_sandbox: "s1".into(),
                node_id: "n1".into(),
                paused: Some(Paused {
                    generation: 3,
                    settings: serde_json::json!({"private_ports": true}),
                    own_layers: vec![format!("sha256-{}", "b".repeat(64))],
                }),
                public: false,
            }),
            images: vec!["ubuntu:22.04".into()],
        };
        let kind = kind_of(&t, false);
        assert_eq!(kind, pb::RecordKind::Paused);
        let r = to_record(&t, kind, |_| 77);
        assert_eq!(r.team_id, "t1");
        assert_eq!(r.layers[0].size_bytes, 77);
        assert_eq!(from_record(r).unwrap(), t);
    }
}
