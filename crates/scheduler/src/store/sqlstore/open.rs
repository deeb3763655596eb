//! Opening the store: pools, per-connection settings, migrations.

use super::{local_clock_ms, SqlStore};
use crate::store::backend::Backend;
use crate::store::migrate;
use crate::store::seal::Sealer;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Executor as _};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a request waits for a pooled connection before it fails with
/// UNAVAILABLE (the database is down or every connection is busy): short
/// enough that gateways fail over to another replica instead of hanging.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Every pool's options: the acquire timeout, and no idle timeout or
/// maximum lifetime. With either set, sqlx (0.8.6 and 0.9.0) runs a
/// maintenance task that walks `0..num_idle()` without yielding; its
/// `num_idle` counter can read `usize::MAX` for an instant (a connection
/// taken from the idle queue before the releasing thread counts it in), and
/// a walk begun then spins on a runtime thread for good, starving the task
/// woken with the only writer permit: every write then fails with "pool
/// timed out" until the scheduler restarts. A connection broken meanwhile is
/// still found, by the ping before each use (`test_before_acquire`).
fn pool_options(max: u32) -> AnyPoolOptions {
    AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .idle_timeout(None)
        .max_lifetime(None)
}

/// Run on every SQLite connection. WAL lets readers run beside the writer;
/// NORMAL is durable across process crashes in WAL mode (only an OS crash
/// can lose the last transactions). The busy timeout (how long a statement
/// waits for another process's write lock) is sqlx's default, 5s.
const SQLITE_SETUP: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;";

/// The store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("bad database URL {url:?}: {source}")]
    Url { url: String, source: sqlx::Error },
    #[error("cannot open the store: {0}")]
    Open(#[from] sqlx::Error),
    #[error("cannot migrate the store: {0}")]
    Migrate(#[from] migrate::MigrateError),
}

impl SqlStore {
    /// Opens (creating if missing) the SQLite database file at `path`.
    pub async fn open_sqlite_file(
        path: PathBuf,
        readers: u32,
        sealer: Arc<Sealer>,
    ) -> Result<SqlStore, OpenError> {
        Self::open_sqlite(SqliteConnectOptions::new().filename(&path), readers, sealer).await
    }

    /// Opens a `sqlite://...` URL.
    pub async fn open_sqlite_url(
        url: &str,
        readers: u32,
        sealer: Arc<Sealer>,
    ) -> Result<SqlStore, OpenError> {
        let opts = SqliteConnectOptions::from_str(url).map_err(|source| OpenError::Url {
            url: url.to_string(),
            source,
        })?;
        Self::open_sqlite(opts, readers, sealer).await
    }

    async fn open_sqlite(
        opts: SqliteConnectOptions,
        readers: u32,
        sealer: Arc<Sealer>,
    ) -> Result<SqlStore, OpenError> {
        let path = opts.get_filename().to_path_buf();
        // A data directory made here is its owner's only; one the operator
        // made keeps its mode (the files in it are 0600 either way).
        if let Some(dir) = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty() && !d.exists())
        {
            warren_core::private::dir(dir).map_err(|source| OpenError::CreateDir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        private_database(&path)?;
        // The `Any` driver connects from a URL; an absolute path keeps the
        // file name intact through it (a relative one would be read as a host).
        let path = absolute(&path);
        let url = opts.filename(&path).create_if_missing(true).to_url_lossy();
        let any = AnyConnectOptions::from_url(&url).map_err(|source| OpenError::Url {
            url: url.to_string(),
            source,
        })?;
        let setup = |pool: AnyPoolOptions| {
            pool.after_connect(|conn, _| {
                Box::pin(async move { conn.execute(SQLITE_SETUP).await.map(|_| ()) })
            })
        };
        sqlx::any::install_default_drivers();
        let writer = setup(pool_options(1).min_connections(1))
            .connect_with(any.clone())
            .await?;
        migrate::run(&writer, Backend::Sqlite, local_clock_ms()).await?;
        let reader = setup(pool_options(readers.max(1)))
            .connect_with(any)
            .await?;
        Ok(SqlStore {
            backend: Backend::Sqlite,
            writer,
            reader,
            changed: Arc::new(Notify::new()),
            committed: Default::default(),
            pg_url: None,
            sealer,
            secrets: None,
            exec: None,
        })
    }

    /// Connects to a `postgres://` URL: one writer connection and up to
    /// `readers` reader connections; applies migrations (under the write
    /// lock, so replicas starting together migrate once).
    pub async fn open_postgres(
        url: &str,
        readers: u32,
        sealer: Arc<Sealer>,
    ) -> Result<SqlStore, OpenError> {
        // Parse with the native driver first, for a clear error.
        PgConnectOptions::from_str(url).map_err(|source| OpenError::Url {
            url: redact(url),
            source,
        })?;
        let any = AnyConnectOptions::from_str(url).map_err(|source| OpenError::Url {
            url: redact(url),
            source,
        })?;
        sqlx::any::install_default_drivers();
        let writer = pool_options(1)
            .min_connections(1)
            .connect_with(any.clone())
            .await?;
        // The applied-at time is a note for humans; the local clock will do.
        migrate::run(&writer, Backend::Postgres, local_clock_ms()).await?;
        let reader = pool_options(readers.max(1)).connect_with(any).await?;
        Ok(SqlStore {
            backend: Backend::Postgres,
            writer,
            reader,
            changed: Arc::new(Notify::new()),
            committed: Default::default(),
            pg_url: Some(url.to_string()),
            sealer,
            secrets: None,
            exec: None,
        })
    }
}

/// Makes the SQLite database at `path` (and its journal files, which
/// SQLite creates with the database's mode) readable by its owner only:
/// created so when missing, narrowed (with a warning) when an earlier
/// version left it wider. An in-memory database has no file.
fn private_database(path: &Path) -> Result<(), OpenError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if path.as_os_str().is_empty() || path == Path::new(":memory:") {
        return Ok(());
    }
    let fail = |source| OpenError::CreateDir {
        path: path.display().to_string(),
        source,
    };
    if !path.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(fail)?;
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        let file = PathBuf::from(file);
        let Ok(md) = std::fs::metadata(&file) else {
            continue;
        };
        let mode = md.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                file = %file.display(),
                mode = format!("{mode:03o}"),
                "the store was readable by other accounts; narrowing it to 0600 (it holds \
                 every team's sandboxes)"
            );
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(fail)?;
        }
    }
    Ok(())
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A URL fit for logs and errors: the password, if any, replaced.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_stay_out_of_messages() {
        let r = super::redact("postgres://warren:s3cret@db:5432/warren?sslmode=require");
        assert_eq!(r, "postgres://warren:***@db:5432/warren?sslmode=require");
        let plain = "postgres://postgres@127.0.0.1:5432/x";
        assert_eq!(super::redact(plain), plain);
        assert_eq!(super::redact("not a url"), "not a url");
    }
}
