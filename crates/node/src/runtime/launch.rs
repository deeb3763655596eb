//! The node's part in starting an isolated sandbox's first processes; the
//! processes themselves (the holder, the launcher and pid 1: what they do,
//! in order, and the descriptors they are handed) are `warren_launch`,
//! run from the small `warren-sandbox` binary (or the `warren` binary's
//! `sandbox-launch` and `sandbox-init` subcommands).

use super::RuntimeError;
use std::time::Duration;
use tokio::io::AsyncReadExt;
pub use warren_launch::{
    LaunchArgs, ENVD_IN_SANDBOX, FD_API, FD_ENVD, FD_RELAY, FD_ROOT, FD_SECCOMP, FD_USERNS,
    FD_VOLUME_FIRST, FD_VOLUME_PATHS, IDS_PER_SANDBOX, INIT_SUBCOMMAND, STAGE, SUBCOMMAND,
};

async fn read_byte(
    out: &mut tokio::process::ChildStdout,
    want: u8,
    what: &str,
) -> Result<(), RuntimeError> {
    let fail = |m: String| RuntimeError::Spawn {
        what: what.to_string(),
        source: std::io::Error::other(m),
    };
    let mut b = [0u8; 1];
    match tokio::time::timeout(Duration::from_secs(10), out.read_exact(&mut b)).await {
        Ok(Ok(_)) if b[0] == want => Ok(()),
        Ok(_) => Err(fail(
            "exited before it was ready (its error is in the node's log)".into(),
        )),
        Err(_) => Err(fail("was not ready within 10s".into())),
    }
}

/// The node's half of the holder: waits until it has unshared its user
/// namespace, maps `base..base+65536` into it and returns the namespace.
pub async fn map_holder(
    holder: &mut tokio::process::Child,
    base: u32,
) -> Result<std::fs::File, RuntimeError> {
    let fail = |m: String| RuntimeError::Spawn {
        what: "the sandbox's user namespace".into(),
        source: std::io::Error::other(m),
    };
    let pid = holder
        .id()
        .ok_or_else(|| fail("its holder exited at once".into()))?;
    let out = holder
        .stdout
        .as_mut()
        .ok_or_else(|| fail("no control pipe".into()))?;
    read_byte(out, b'R', "the sandbox's user namespace").await?;
    let line = format!("0 {base} {IDS_PER_SANDBOX}\n");
    for map in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{map}");
        std::fs::write(&path, &line).map_err(|e| fail(format!("cannot write {path}: {e}")))?;
    }
    std::fs::File::open(format!("/proc/{pid}/ns/user"))
        .map_err(|e| fail(format!("cannot open it: {e}")))
}

/// Waits until the launcher has made the sandbox's namespaces.
pub async fn namespaces_ready(launcher: &mut tokio::process::Child) -> Result<(), RuntimeError> {
    let out = launcher
        .stdout
        .as_mut()
        .ok_or_else(|| RuntimeError::Spawn {
            what: "the sandbox launcher".into(),
            source: std::io::Error::other("no control pipe"),
        })?;
    read_byte(out, b'N', "the sandbox launcher").await
}
