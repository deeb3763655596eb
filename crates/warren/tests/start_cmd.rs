//! A template's start command (docs/sandboxes.md, "Start and ready
//! commands") through a gateway with the real `e2b` SDK
//! (`tests/e2b/start_cmd.py`): a create answers once the start command's
//! ready command succeeds — its server answers the very first request —
//! and the command runs as the template's user, listed as `start_cmd`; a
//! start command that fails fails the create with its reason and output,
//! and no sandbox is left.
//!
//! Needs what the isolated sandbox tests need (root, cgroups, slirp4netns,
//! nftables, the `base` template).
#![allow(unused_crate_dependencies)]

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;
use warren_test_support::templates::{private_store_all, TestTemplate};

/// In E2B's format (`e2b_` + 40 hex), as a user's SDK would send it.
const KEY: &str = "e2b_5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_waits_for_the_start_command_and_fails_when_it_does() {
    let name = TestTemplate::name();
    let marker = format!("served-by-{name}");
    let dir = tempfile::tempdir().expect("tempdir");
    // The start command serves /srv/www once it has slept a while, so a
    // create that did not wait would find nothing on port 8000; with
    // BROKEN=1 (a create's env var) it fails at once instead. The while is
    // longer than the scheduler's --creating-timeout here: the node lists
    // a create under way in its roster, so the sweep does not remove it.
    let spec = format!(
        r#"name = "{name}"
from = "base"
run = ["mkdir -p /srv/www && echo {marker} > /srv/www/hello.txt"]
start_cmd = 'if [ "${{BROKEN:-}}" = 1 ]; then echo "broken on purpose" >&2; exit 3; fi; sleep 8; exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv/www'
ready_cmd = "curl -fsS -o /dev/null http://127.0.0.1:8000/hello.txt"
ready_timeout_secs = 120
"#
    );
    // A store of the test's own (the machine's templates linked in), the
    // cluster's too: the built template never lands in the machine's.
    let store = dir.path().join("store");
    private_store_all(&store);
    // Declared before the cluster: dropped (removed) after it.
    let _template = TestTemplate::build(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        &store,
        &name,
        &spec,
        dir.path(),
    )
    .await;
    let c = Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![(KEY.into(), "team-a".into())],
            // Past it by seconds, and long enough that a heartbeat sent
            // before the node got the create is never the last roster the
            // sweep reads for it (heartbeats come every 2 s).
            scheduler_args: vec!["--creating-timeout".into(), "3s".into()],
            template_dir: Some(store.clone()),
            ..Spec::default()
        },
    )
    .await
    .expect("an isolated cluster starts (needs root, cgroups, slirp4netns, nftables and the base template)");
    let gateway = format!("http://{}", c.gateway(0));
    let env = [
        ("WARREN_TEMPLATE", name.clone()),
        ("WARREN_MARKER", marker.clone()),
    ];
    let within = Duration::from_secs(300);

    let ready = run_case(&gateway, "start_cmd.py", "ready", KEY, &env, within).await;
    assert_eq!(ready["status"], 200, "{ready}");

    let broken = run_case(&gateway, "start_cmd.py", "broken", KEY, &env, within).await;
    assert!(
        broken["message"]
            .as_str()
            .is_some_and(|m| m.contains("broken on purpose")),
        "{broken}"
    );
}
