//! E2B template builds `from_image(...)` through a gateway with the real
//! `e2b` SDK (`tests/e2b/template_images.py`): `ubuntu:22.04` starts from
//! the operator's `ubuntu-22.04` template (templates/ubuntu-22.04.toml, whose
//! `images` lists it): the steps run on Ubuntu 22.04 as E2B's `user` (with
//! sudo) in /home/user, or as root; a sandbox from the result is Ubuntu
//! 22.04. An image no template stands for is refused with the registry
//! message, naming the images there are.
//!
//! The cluster gets a template store of its own holding `base` and
//! `ubuntu-22.04` (their roots linked from the shared store). Skipped, and
//! said so, when `ubuntu-22.04` is not built (scripts/test builds it when
//! archive.ubuntu.com is reachable). Needs what the snapshot suite needs
//! (root, cgroups, slirp4netns, nftables, `base`).

use std::time::Duration;
use warren_test_support::cluster::{Cluster, Spec};
use warren_test_support::sdk::run_case;
use warren_test_support::templates::{add_shared, private_store, TEMPLATE_DIR};

const KEY: &str = "e2b_3e5a7c9b1d3f5a7c9e1b3d5f7a9c2e4b6d8f0a1c";

#[tokio::test]
async fn a_build_from_ubuntu_22_04_runs_on_ubuntu_22_04() {
    let store = tempfile::tempdir().expect("tempdir");
    private_store(store.path());
    if add_shared(store.path(), "ubuntu-22.04").is_none() {
        eprintln!(
            "SKIPPED: no ubuntu-22.04 template in {TEMPLATE_DIR} (build it with \
             `warren template build templates/ubuntu-22.04.toml`; it needs archive.ubuntu.com)"
        );
        return;
    }
    let dir = vec![
        "--template-dir".to_string(),
        store.path().display().to_string(),
    ];
    let c = Cluster::start(
        env!("CARGO_BIN_EXE_warren").as_ref(),
        Spec {
            nodes: 1,
            runtime: "isolated".into(),
            keys: vec![(KEY.into(), "team-a".into())],
            node_args: dir.clone(),
            gateway_args: dir,
            ..Spec::default()
        },
    )
    .await
    .expect("a cluster starts (needs root, cgroups, slirp4netns, nftables and the base template)");
    let gateway = format!("http://{}", c.gateway(0));
    let r = run_case(
        &gateway,
        "template_images.py",
        "from_ubuntu",
        KEY,
        &[],
        Duration::from_secs(600),
    )
    .await;
    let os = r["os_release"].as_str().unwrap_or_default();
    assert!(
        os.lines().any(|l| l == "VERSION_ID=\"22.04\"") && os.lines().any(|l| l == "ID=ubuntu"),
        "the sandbox is Ubuntu 22.04: {os}"
    );
    assert_eq!(
        r["step_os"], "ubuntu 22.04",
        "steps run on Ubuntu 22.04: {r}"
    );
    assert_eq!(r["step_user"], "user", "steps run as E2B's user: {r}");
    assert_eq!(r["sudo"], "sudo-ok", "the user has sudo: {r}");
    assert_eq!(r["root"], "root", "a step's own user: {r}");
    assert_eq!(r["sh"], "dash", "{r}");
    assert_eq!(r["whoami"], "user", "{r}");
    assert_eq!(r["pwd"], "/home/user", "{r}");
    let unknown = r["unknown_image"].as_str().unwrap_or_default();
    assert!(
        unknown.contains("alpine:3.20")
            && unknown.contains("cannot reach an image registry")
            && unknown.contains("ubuntu:22.04"),
        "an unknown image is refused, naming the images there are: {unknown}"
    );
    assert_eq!(r["alpine_recorded"], false, "{r}");
    drop(c);
}
