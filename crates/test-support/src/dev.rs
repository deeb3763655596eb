//! `warren dev` as a user runs it, for tests of the whole product: one
//! command, its data in a temp dir, its first gateway's URL.

use crate::{temp_dir, Proc};
use std::path::Path;

/// A running `warren dev`; dropping it stops it (and its data dir goes).
pub struct Dev {
    pub proc: Proc,
    /// `http://host:port` of gateway 1.
    pub gateway: String,
    _data: tempfile::TempDir,
}

impl Dev {
    /// Starts `bin dev --data-dir <temp> --listen 127.0.0.1:0 <args>` and
    /// waits for its first gateway; `expect` says what a failure to start
    /// usually means. Loopback port 80 is left alone (`--sandbox-http
    /// off`) unless `args` say otherwise: tests run side by side, and only
    /// the one about it binds that port (under a lock).
    pub async fn start(bin: &Path, args: &[&str], expect: &str) -> Dev {
        Dev::start_with(bin, args, &[], expect).await
    }

    /// [`Dev::start`] with `envs` in its environment (and so in its
    /// parts'), e.g. `WARREN_DEV_API_KEY`: keys never go on a command line.
    pub async fn start_with(bin: &Path, args: &[&str], envs: &[(&str, &str)], expect: &str) -> Dev {
        let data = temp_dir();
        let dir = data.path().to_str().expect("utf-8 temp path");
        let mut all = vec!["dev", "--data-dir", dir, "--listen", "127.0.0.1:0"];
        if !args.iter().any(|a| a.starts_with("--sandbox-http")) {
            all.extend(["--sandbox-http", "off"]);
        }
        all.extend_from_slice(args);
        let proc = crate::spawn(bin, &all, envs, &["dev gateway-1"])
            .await
            .unwrap_or_else(|e| panic!("warren dev starts ({expect}): {e}"));
        let gateway = format!("http://{}", proc.addr("dev gateway-1"));
        Dev {
            proc,
            gateway,
            _data: data,
        }
    }
}
