//! `warren node --check-config`: everything a start checks before it
//! makes its data directory, probes its runtime or binds — every setting
//! and the files they name ([`Config::validate`]: the node id, the
//! scheduler URLs, the envd binary, the blob store's URL and options), the
//! internal TLS files (the certificate must name this node's id), and the
//! scheduler client — through the very functions a start calls, so a check
//! passes exactly when a start would get past them and fails with the
//! message the start would print. It binds nothing, dials nothing, makes
//! no directory and starts no sandbox: whether the `isolated` runtime
//! works here (root, cgroups, idmapped mounts) is only known from the
//! start's probe.

use crate::config::{Config, RuntimeChoice, Settings};
use std::sync::Arc;
use warren_core::config::ConfigError;
use warren_proto::client::Scheduler;
use warren_trust::Trust;

/// The internal TLS material (`--tls-*`), loaded as a start loads it: the
/// certificate must name this node's id.
pub fn trust(settings: &Settings) -> Result<Option<Arc<Trust>>, ConfigError> {
    settings
        .tls
        .load(warren_trust::Role::Node, Some(&settings.node_id))
        .map_err(ConfigError::Invalid)
}

/// The scheduler client (`--scheduler`, failing over in order); lazy: no
/// replica is dialed until the first call.
pub fn scheduler(settings: &Settings, trust: Option<&Trust>) -> Result<Scheduler, ConfigError> {
    Scheduler::new(
        &settings.schedulers,
        warren_proto::client::CONNECT_TIMEOUT,
        warren_proto::client::CALL_TIMEOUT,
        trust,
    )
    .map_err(|e| ConfigError::Invalid(format!("--scheduler: {e}")))
}

/// Checks `config` (see the module doc); what a start would use, for the
/// operator to read, or the error a start would exit 64 with. Runs in a
/// Tokio runtime (the scheduler client's channels need one to exist).
pub fn check(config: &Config) -> Result<String, ConfigError> {
    let settings = config.validate()?;
    let trust = trust(&settings)?;
    scheduler(&settings, trust.as_deref())?;
    let runtime = match settings.runtime {
        RuntimeChoice::Auto => {
            "auto (isolated when the start's probe finds it works, else process)"
        }
        RuntimeChoice::Isolated => "isolated (the start's probe decides whether it works here)",
        RuntimeChoice::Process => "process (NOT isolated, NOT limited)",
    };
    let layers = match &settings.blob {
        None => format!("--template-dir {}", settings.template_dir.display()),
        Some(b) => format!(
            "blob store {} (opened, not contacted), cache {} (at most {} bytes)",
            b.store.url,
            b.cache_dir.display(),
            b.cache_max_bytes
        ),
    };
    Ok(format!(
        "warren node: the configuration is valid\n\
         \x20 node id: {}\n\
         \x20 listener: {} (not bound), advertised as {}\n\
         \x20 admin listener: {} (not bound)\n\
         \x20 schedulers: {} (not dialed)\n\
         \x20 data dir: {} (not made)\n\
         \x20 layers: {layers}\n\
         \x20 runtime: {runtime}\n\
         \x20 internal TLS: {}\n",
        settings.node_id,
        settings.listen,
        settings
            .advertise
            .as_deref()
            .unwrap_or("the bound listen address"),
        settings.admin_listen,
        settings.schedulers.join(", "),
        settings.data_dir.display(),
        warren_trust::config::describe(trust.as_deref()),
    ))
}
