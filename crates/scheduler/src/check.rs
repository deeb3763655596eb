//! `warren scheduler --check-config`: everything a start checks before it
//! binds a socket or opens the store — the command line (no password
//! there), every setting ([`Config::validate`]), the store key file and
//! the internal TLS files — through the very functions a start calls, so
//! a check passes exactly when a start would get past them, and fails with
//! the message the start would print. It binds nothing, reaches no
//! database and makes no file (a missing SQLite key file, which a start
//! makes, is reported as such).

use crate::config::{self, StoreLocation};
use crate::store::seal::{KeyError, Sealer};
use crate::Config;
use std::path::PathBuf;
use std::sync::Arc;
use warren_core::config::ConfigError;

/// Where the store key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKey {
    /// `--store-key-file`: must be there, private, and hold keys.
    File(PathBuf),
    /// `store.key` beside the SQLite database: made on first start.
    Beside(PathBuf),
    /// An in-memory database: a key for this process only.
    Ephemeral,
}

impl StoreKey {
    /// The key a start with `config` uses; with PostgreSQL the file must
    /// be named (every replica seals with the same key).
    pub fn of(config: &Config, location: &StoreLocation) -> Result<StoreKey, ConfigError> {
        if let Some(path) = &config.store_key_file {
            return Ok(StoreKey::File(path.clone()));
        }
        match location.default_key_file() {
            Some(Some(path)) => Ok(StoreKey::Beside(path)),
            Some(None) => Ok(StoreKey::Ephemeral),
            None => Err(ConfigError::Invalid(
                "--store-key-file is required with a PostgreSQL store: every replica seals \
                 access tokens and envVars with the same key. Make one, readable by its owner \
                 only, with: (umask 077; openssl rand -hex 32 > store.key)"
                    .into(),
            )),
        }
    }

    /// The sealer, the file made first when it is the default one and
    /// missing (a start).
    pub fn open(&self) -> Result<Sealer, ConfigError> {
        match self {
            StoreKey::File(path) => Sealer::from_file(path).map_err(key_error),
            // Beside the database: a problem there is the data directory's.
            StoreKey::Beside(path) => Sealer::open_or_create(path)
                .map_err(|e| ConfigError::Invalid(format!("--data-dir: {e}"))),
            StoreKey::Ephemeral => Ok(Sealer::ephemeral()),
        }
    }

    /// What a check says of the key: opened as a start opens it, except
    /// that a default file which is not there yet is not made.
    fn check(&self) -> Result<String, ConfigError> {
        match self {
            StoreKey::Beside(path) if !path.exists() => Ok(format!(
                "{} (not there yet: made on first start)",
                path.display()
            )),
            StoreKey::File(path) | StoreKey::Beside(path) => {
                self.open()?;
                Ok(path.display().to_string())
            }
            StoreKey::Ephemeral => Ok("none (an in-memory database: one for this process)".into()),
        }
    }
}

fn key_error(e: KeyError) -> ConfigError {
    ConfigError::Invalid(e.to_string())
}

/// The internal TLS material (`--tls-*`), loaded as a start loads it.
pub fn trust(config: &Config) -> Result<Option<Arc<warren_trust::Trust>>, ConfigError> {
    config
        .tls
        .load(warren_trust::Role::Scheduler, None)
        .map_err(ConfigError::Invalid)
}

/// Checks `config` (see the module doc); what a start would use, for the
/// operator to read, or the error a start would exit 64 with.
pub fn check(config: &Config) -> Result<String, ConfigError> {
    config::refuse_secrets_in_args(std::env::args_os())?;
    let location = config.validate()?;
    let key = StoreKey::of(config, &location)?.check()?;
    let trust = trust(config)?;
    let store = match &location {
        StoreLocation::SqliteFile(path) => format!("sqlite {}", path.display()),
        StoreLocation::SqliteUrl(url) => url.clone(),
        StoreLocation::Postgres(url) => crate::store::redact_url(url),
    };
    Ok(format!(
        "warren scheduler: the configuration is valid\n\
         \x20 store: {store} (not opened)\n\
         \x20 store key: {key}\n\
         \x20 grpc listener: {} (not bound)\n\
         \x20 admin listener: {} (not bound)\n\
         \x20 internal TLS: {}\n",
        config.listen,
        config.admin_listen,
        warren_trust::config::describe(trust.as_deref()),
    ))
}
