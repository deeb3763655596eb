//! `warren dev`'s own template store, `<data-dir>/templates`.
//!
//! The machine's store (`--template-dir`, default `/var/lib/warren/templates`)
//! holds the operator's templates (`warren template build`): every run of
//! `warren dev` uses them. What a run makes — snapshots, templates built
//! through the E2B API, paused sandboxes' layers, COPY uploads — goes into
//! the run's own store instead, under its data dir: it lives as long as the
//! run's scheduler database does (the same data dir), is gone with it, and
//! is never listed to another run (a test's or another engineer's) on the
//! machine, nor left in the machine's store.
//!
//! The run's store holds the machine's operator templates by reference:
//! each record copied, each root (`rootfs/<hex>`) a symbolic link to the
//! machine's tree. [`sync`] runs at the start and every [`SYNC_EVERY`], so
//! a template built (or built again) in the machine's store while the run
//! goes on is there within that time: the new root is linked before the
//! record that names it is written, so a create never finds a record
//! without its root. Records of the operator's templates that left the
//! machine's store leave the run's; links to trees that are gone go.
//! Sandboxes lease the trees they stack through the links (the machine's
//! directories themselves), so collecting the machine's store
//! (`warren template gc`) never removes a tree a run's sandbox stacks.

use std::path::Path;
use std::time::Duration;
use warren_template::{Store, Template};

/// How often the run's store catches up with the machine's.
pub const SYNC_EVERY: Duration = Duration::from_secs(2);

/// Makes the run's store at `own` (if missing) and brings it up to date
/// with the machine's at `machine`.
pub fn prepare(machine: &Path, own: &Path) -> anyhow::Result<()> {
    Store::open(own).map_err(|e| anyhow::anyhow!("cannot make {}: {e}", own.display()))?;
    sync(machine, own)
}

/// The operator's templates of the machine's store, into the run's (see
/// the module doc). A machine store that is not there leaves the run's
/// with what it has.
pub fn sync(machine: &Path, own: &Path) -> anyhow::Result<()> {
    let Ok(theirs) = std::fs::read_dir(machine.join("templates")) else {
        return Ok(());
    };
    let mut operators = std::collections::HashSet::new();
    for entry in theirs.flatten() {
        let file = entry.path();
        let Some(name) = file
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let Ok(text) = std::fs::read(&file) else {
            continue;
        };
        // Teams' snapshots and paused sandboxes there are other runs'.
        let Ok(t) = serde_json::from_slice::<Template>(&text) else {
            continue;
        };
        if t.snapshot.is_some() || warren_template::validate_name(name).is_err() {
            continue;
        }
        operators.insert(name.to_string());
        let mut complete = true;
        for digest in std::iter::once(&t.digest).chain(&t.layers) {
            let Some(hex) = digest.strip_prefix("sha256-") else {
                complete = false;
                break;
            };
            let target = machine.join("rootfs").join(hex);
            let link = own.join("rootfs").join(hex);
            if std::fs::symlink_metadata(&link).is_ok() {
                continue;
            }
            if !target.join(".warren-complete").exists() {
                complete = false;
                break;
            }
            std::os::unix::fs::symlink(&target, &link)?;
        }
        // Not all of it unpacked yet (a build in progress): next time.
        if !complete {
            continue;
        }
        let mine = own.join("templates").join(format!("{name}.json"));
        if std::fs::read(&mine).is_ok_and(|m| m == text) {
            continue;
        }
        let tmp = own.join("tmp").join(format!("sync-{name}.json"));
        std::fs::write(&tmp, &text)?;
        std::fs::rename(&tmp, &mine)?;
    }
    // The operator's templates that left the machine's store leave the run's.
    if let Ok(mine) = std::fs::read_dir(own.join("templates")) {
        for entry in mine.flatten() {
            let file = entry.path();
            let Some(name) = file
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            let operator = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<Template>(&b).ok())
                .is_some_and(|t| t.snapshot.is_none());
            if operator && !operators.contains(name) {
                let _ = std::fs::remove_file(&file);
            }
        }
    }
    // Links to trees the machine's store no longer has.
    if let Ok(roots) = std::fs::read_dir(own.join("rootfs")) {
        for entry in roots.flatten() {
            let path = entry.path();
            let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
            if is_link && !path.join(".warren-complete").exists() {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn tree(store: &Path, hex: &str) {
        let root = store.join("rootfs").join(hex);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join(".warren-complete"), hex).unwrap();
    }

    fn record(store: &Path, name: &str, digest: &str, team: Option<&str>) {
        let mut t = serde_json::json!({
            "name": name, "digest": digest, "defaults": {}, "created_at_ms": 1
        });
        if let Some(team) = team {
            t["snapshot"] =
                serde_json::json!({"team": team, "source_sandbox": "s", "node_id": "n"});
        }
        std::fs::create_dir_all(store.join("templates")).unwrap();
        std::fs::write(
            store.join("templates").join(format!("{name}.json")),
            t.to_string(),
        )
        .unwrap();
    }

    #[test]
    fn a_run_sees_the_operators_templates_and_keeps_its_own() {
        let machine = tempfile::tempdir().unwrap();
        let own = tempfile::tempdir().unwrap();
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        tree(machine.path(), &a);
        record(machine.path(), "base", &format!("sha256-{a}"), None);
        record(
            machine.path(),
            "snap-x",
            &format!("sha256-{a}"),
            Some("dev"),
        );
        // A build in progress: its root is not unpacked yet.
        record(machine.path(), "half", &format!("sha256-{b}"), None);
        prepare(machine.path(), own.path()).unwrap();
        let store = Store::open(own.path()).unwrap();
        let names: Vec<String> = store.list().unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["base"], "another run's snapshot is not this run's");
        assert!(store.rootfs(&format!("sha256-{a}")).is_ok());
        // The run's own records stay; the machine's store is untouched.
        record(own.path(), "snap-mine", &format!("sha256-{a}"), Some("dev"));
        tree(machine.path(), &b);
        sync(machine.path(), own.path()).unwrap();
        let names: Vec<String> = store.list().unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["base", "half", "snap-mine"]);
        assert!(!machine.path().join("templates/snap-mine.json").exists());
        // An operator template removed from the machine leaves the run.
        std::fs::remove_file(machine.path().join("templates/half.json")).unwrap();
        std::fs::remove_dir_all(machine.path().join("rootfs").join(&b)).unwrap();
        sync(machine.path(), own.path()).unwrap();
        let names: Vec<String> = store.list().unwrap().into_iter().map(|t| t.name).collect();
        assert_eq!(names, ["base", "snap-mine"]);
        assert!(std::fs::symlink_metadata(own.path().join("rootfs").join(&b)).is_err());
    }
}
