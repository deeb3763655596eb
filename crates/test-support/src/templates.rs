//! Test templates in the machine's template store (`/var/lib/warren/templates`,
//! where the isolated runtime's nodes read them): built from a build file's
//! text with the real `warren template build`, removed when dropped.

use std::path::Path;
use std::time::Duration;

/// The template store the tests' nodes read.
pub const TEMPLATE_DIR: &str = "/var/lib/warren/templates";

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
    let record = std::fs::read(format!("{TEMPLATE_DIR}/templates/{name}.json")).ok()?;
    let t: serde_json::Value = serde_json::from_slice(&record).expect("the record parses");
    let digest = t["digest"].as_str().expect("a digest");
    let hex = digest.trim_start_matches("sha256-");
    std::os::unix::fs::symlink(
        format!("{TEMPLATE_DIR}/rootfs/{hex}"),
        dir.join("rootfs").join(hex),
    )
    .unwrap_or_else(|e| panic!("link {name}'s root: {e}"));
    std::fs::write(dir.join(format!("templates/{name}.json")), &record)
        .unwrap_or_else(|e| panic!("{name}'s record: {e}"));
    Some(t)
}

/// A template a test made; removed (its name, blob and unpacked root: its
/// content, and so its digest, is the test's own) when dropped. Declare it
/// before the cluster that uses it, so it is dropped after.
pub struct TestTemplate(pub String);

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
    /// binary under test), failing the test with the build's output when it
    /// fails. Runs in `dir`, so `source` files there are found.
    pub async fn build(warren: &Path, name: &str, text: &str, dir: &Path) -> TestTemplate {
        let template = TestTemplate(name.to_string());
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let build = tokio::process::Command::new(warren)
            .arg("template")
            .arg("build")
            .arg(&file)
            .env("WARREN_TEMPLATE_DIR", TEMPLATE_DIR)
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
        let meta = format!("{TEMPLATE_DIR}/templates/{}.json", self.0);
        if let Ok(text) = std::fs::read_to_string(&meta) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                if let Some(digest) = v["digest"].as_str() {
                    let hex = digest.trim_start_matches("sha256-");
                    let _ = std::fs::remove_file(format!("{TEMPLATE_DIR}/blobs/{digest}.tar"));
                    let _ = std::fs::remove_dir_all(format!("{TEMPLATE_DIR}/rootfs/{hex}"));
                }
            }
            let _ = std::fs::remove_file(&meta);
        }
    }
}
