//! The templates tests use: the machine's template store
//! (`/var/lib/warren/templates`, or `WARREN_TEMPLATE_DIR`) read only, and
//! private stores made from it (its operator templates linked in), where
//! what a test makes (snapshots, builds, paused layers, test templates
//! built from a file) lands and is removed with the test's temporary
//! directory: tests never leave data in the operator's store.

use std::path::Path;
use std::time::Duration;

/// The machine's template store, where `scripts/test` builds the
/// templates tests use (read only).
pub const TEMPLATE_DIR: &str = "/var/lib/warren/templates";

/// The machine's template store: `WARREN_TEMPLATE_DIR`, else
/// [`TEMPLATE_DIR`].
pub fn machine_store() -> std::path::PathBuf {
    std::env::var_os("WARREN_TEMPLATE_DIR")
        .map(Into::into)
        .unwrap_or_else(|| TEMPLATE_DIR.into())
}

/// Makes `dir` a template store of its own holding every operator
/// template of the machine's store (records copied, roots linked; teams'
/// records left out), so what a test makes there never lands in the store
/// other tests and `warren dev` read. A machine store without templates
/// gives an empty store (a `process`-runtime cluster needs none).
pub fn private_store_all(dir: &Path) {
    for sub in ["blobs", "rootfs", "templates", "tmp"] {
        std::fs::create_dir_all(dir.join(sub)).expect("store dirs");
    }
    let machine = machine_store();
    let Ok(records) = std::fs::read_dir(machine.join("templates")) else {
        return;
    };
    for entry in records.flatten() {
        let Some(name) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".json"))
            .map(str::to_string)
        else {
            continue;
        };
        let Ok(text) = std::fs::read(entry.path()) else {
            continue;
        };
        let Ok(t) = serde_json::from_slice::<serde_json::Value>(&text) else {
            continue;
        };
        if !t["snapshot"].is_null() {
            continue;
        }
        let digests =
            std::iter::once(&t["digest"]).chain(t["layers"].as_array().into_iter().flatten());
        for d in digests.filter_map(|d| d.as_str()) {
            let hex = d.trim_start_matches("sha256-");
            let link = dir.join("rootfs").join(hex);
            if std::fs::symlink_metadata(&link).is_err() {
                let _ = std::os::unix::fs::symlink(machine.join("rootfs").join(hex), &link);
            }
        }
        let _ = std::fs::write(dir.join(format!("templates/{name}.json")), &text);
    }
}

/// Makes `dir` a template store of its own holding only the shared store's
/// `base` (its record copied, its root linked), so what a test makes there
/// (snapshots, API builds) never lands in the store other tests and
/// `warren dev` read. Returns `base`'s record.
pub fn private_store(dir: &Path) -> serde_json::Value {
    for sub in ["blobs", "rootfs", "templates", "tmp"] {
        std::fs::create_dir_all(dir.join(sub)).expect("store dirs");
    }
    add_shared(dir, "base")
        .expect("the base template is built (scripts/test builds it; docs/sandboxes.md, Templates)")
}

/// Adds the shared store's template `name` (built from a build file, like
/// `ubuntu-22.04`) to the private store at `dir` (made by
/// [`private_store`]): its record copied, its root linked. `None` when the
/// shared store has no such template.
pub fn add_shared(dir: &Path, name: &str) -> Option<serde_json::Value> {
    let machine = machine_store();
    let record = std::fs::read(machine.join(format!("templates/{name}.json"))).ok()?;
    let t: serde_json::Value = serde_json::from_slice(&record).expect("the record parses");
    let digest = t["digest"].as_str().expect("a digest");
    let hex = digest.trim_start_matches("sha256-");
    std::os::unix::fs::symlink(
        machine.join("rootfs").join(hex),
        dir.join("rootfs").join(hex),
    )
    .unwrap_or_else(|e| panic!("link {name}'s root: {e}"));
    std::fs::write(dir.join(format!("templates/{name}.json")), &record)
        .unwrap_or_else(|e| panic!("{name}'s record: {e}"));
    Some(t)
}

/// A template a test built into a private store (see
/// [`private_store_all`]); removed (its name, blob and unpacked root: its
/// content, and so its digest, is the test's own) when dropped, though the
/// store goes with the test's temporary directory anyway. Declare it before
/// the cluster that uses it, so it is dropped after.
pub struct TestTemplate(pub String, pub std::path::PathBuf);

impl TestTemplate {
    /// A template name no other test (or run) uses: `t-<time><pid>`.
    pub fn name() -> String {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("t-{nanos:x}{:x}", std::process::id())
    }

    /// Builds `text` (a build file naming `name`) with `warren` (the
    /// binary under test) into the template store `store`, failing the
    /// test with the build's output when it fails. Runs in `dir`, so
    /// `source` files there are found.
    pub async fn build(
        warren: &Path,
        store: &Path,
        name: &str,
        text: &str,
        dir: &Path,
    ) -> TestTemplate {
        let template = TestTemplate(name.to_string(), store.to_path_buf());
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let build = tokio::process::Command::new(warren)
            .arg("template")
            .arg("build")
            .arg(&file)
            .env("WARREN_TEMPLATE_DIR", store)
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(600), build)
            .await
            .unwrap_or_else(|_| panic!("building template {name} took over 10 minutes"))
            .unwrap_or_else(|e| panic!("cannot run warren template build: {e}"));
        assert!(
            out.status.success(),
            "warren template build {name} failed ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        template
    }
}

impl Drop for TestTemplate {
    fn drop(&mut self) {
        let store = &self.1;
        let meta = store.join(format!("templates/{}.json", self.0));
        if let Ok(text) = std::fs::read_to_string(&meta) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                if let Some(digest) = v["digest"].as_str() {
                    let hex = digest.trim_start_matches("sha256-");
                    let _ = std::fs::remove_file(store.join(format!("blobs/{digest}.tar")));
                    let _ = std::fs::remove_dir_all(store.join(format!("rootfs/{hex}")));
                }
            }
            let _ = std::fs::remove_file(&meta);
        }
    }
}
