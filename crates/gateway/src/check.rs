//! `warren gateway --check-config`: everything a start checks before it
//! serves — the command line (no API key there), every setting and the
//! files they name ([`Config::validate`]: the API-key file, the upload-link
//! key, the public TLS certificate and key, the blob store's URL and
//! options), the internal TLS files, and the clients to the schedulers and
//! nodes built from them — through the very functions a start calls, so a
//! check passes exactly when a start would get past them and fails with
//! the message the start would print. It binds nothing and dials nothing:
//! the scheduler channels are lazy, and a cloud blob store is opened, not
//! contacted.

use crate::config::{refuse_secrets_in_args, Config, Settings};
use crate::node_client::NodeHttp;
use std::sync::Arc;
use warren_core::config::ConfigError;
use warren_core::server::Workers;
use warren_proto::client::Scheduler;
use warren_trust::Trust;

/// The internal TLS material (`--tls-*`), loaded as a start loads it.
pub fn trust(settings: &Settings) -> Result<Option<Arc<Trust>>, ConfigError> {
    settings
        .tls
        .load(warren_trust::Role::Gateway, None)
        .map_err(ConfigError::Invalid)
}

/// The scheduler client (`--scheduler`, failing over in order); lazy: no
/// replica is dialed until the first call.
pub fn scheduler(settings: &Settings, trust: Option<&Trust>) -> Result<Scheduler, ConfigError> {
    Scheduler::new(
        &settings.schedulers,
        settings.connect_timeout,
        settings.request_timeout,
        trust,
    )
    .map_err(|e| ConfigError::Invalid(format!("--scheduler: {e}")))
}

/// The node connection pools (one per worker thread of `workers`).
pub fn node_http(
    settings: &Settings,
    trust: Option<&Trust>,
    workers: Option<&Workers>,
) -> Result<NodeHttp, ConfigError> {
    NodeHttp::new(
        settings.connect_timeout,
        settings.dead_node_timeout,
        trust,
        workers,
    )
    .map_err(ConfigError::Invalid)
}

/// Checks `config` (see the module doc); what a start would use, for the
/// operator to read, or the error a start would exit 64 with. Runs in a
/// Tokio runtime (the scheduler client's channels need one to exist).
pub fn check(config: &Config) -> Result<String, ConfigError> {
    refuse_secrets_in_args(std::env::args_os())?;
    let settings = config.validate()?;
    let trust = trust(&settings)?;
    scheduler(&settings, trust.as_deref())?;
    node_http(&settings, trust.as_deref(), None)?;
    let public_tls = match &settings.public_tls {
        None => "off".to_string(),
        Some(t) => {
            let listen: Vec<String> = t.listen.iter().map(|a| a.to_string()).collect();
            format!("{} (not bound)", listen.join(", "))
        }
    };
    let blobs = match &settings.blob_store {
        None => format!(
            "none: layers and records in --template-dir {}",
            settings.template_dir.display()
        ),
        Some(b) => format!("{} (opened, not contacted)", b.url),
    };
    Ok(format!(
        "warren gateway: the configuration is valid\n\
         \x20 listener: {} (not bound)\n\
         \x20 public TLS listeners: {public_tls}\n\
         \x20 admin listener: {} (not bound)\n\
         \x20 domain: {}\n\
         \x20 schedulers: {} (not dialed)\n\
         \x20 API keys: {}\n\
         \x20 blob store: {blobs}\n\
         \x20 internal TLS: {}\n",
        config.listen,
        config.admin_listen,
        settings.domain,
        settings.schedulers.join(", "),
        settings.api_keys.len(),
        warren_trust::config::describe(trust.as_deref()),
    ))
}
