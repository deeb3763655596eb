//! Running `warren` processes: the one harness `warren dev`, the chaos
//! experiment and the integration tests share.
//!
//! # Layout
//! - [`Launch`]: what to start (binary, arguments, environment, where its
//!   stderr goes, which announce lines to wait for); [`Launch::spawn`] starts
//!   it and waits until every listener it waits for is announced
//!   (`"<component> <name> listening on <addr>"`, `warren_core::announce`),
//!   so every part can bind port 0.
//! - [`Proc`]: the running process: its announced addresses, the other
//!   lines it printed, signals, and stopping with a bounded wait.
//! - [`free_port`], [`poll_until`]: a loopback port nothing listens on, and
//!   polling a condition with a deadline instead of sleeping.
//! - [`http::get_text`]: a plain GET for admin endpoints.
//! - [`postgres::PgServer`]: a private PostgreSQL server.
//! - [`garage::GarageServer`]: a private Garage server (S3-compatible
//!   object store) with one bucket and one key.
//! - [`hosts`]: hosts on one machine (network namespaces on a bridge) for
//!   runs in which the parts share nothing but the network.
//!
//! Nothing here is test-only: the binary uses it too.

pub mod garage;
pub mod hosts;
pub mod http;
pub mod postgres;
mod process;

pub use process::{Exit, Launch, Proc, EXIT_WITH_PARENT, START_TIMEOUT};

use std::future::Future;
use std::time::Duration;

/// Writes a new scheduler store key (`--store-key-file`: 32 random bytes
/// as 64 hex digits) to `path`, readable by its owner only.
pub fn write_store_key(path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Read;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    warren_core::private::write(path, format!("{hex}\n").as_bytes())
}

/// A loopback port that was free a moment ago (bound and released; the
/// process that gets it binds it right after).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Polls `check` every 20 ms until it returns `Some`, or gives up (`None`)
/// after `within`.
pub async fn poll_until<T, F, Fut>(within: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn private_postgres_starts_and_takes_connections() {
        let pg = super::postgres::PgServer::start().expect("postgres starts");
        let url = pg.create_database("probe").expect("createdb");
        assert!(url.ends_with("/probe"));
        let out = std::process::Command::new("psql")
            .args([url.as_str(), "-tAc", "select 40 + 2"])
            .output()
            .expect("psql runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    }

    #[test]
    fn private_garage_serves_its_bucket_and_goes_away() {
        let mut garage = super::garage::GarageServer::start()
            .expect("a private Garage server (cargo install garage --locked; .ci/run installs it)");
        assert!(garage.endpoint.starts_with("http://127.0.0.1:"));
        assert_eq!(garage.url(), "s3://warren-test");
        let config = garage.config_path();
        let out = std::process::Command::new(super::garage::binary().expect("found"))
            .arg("-c")
            .arg(&config)
            .args(["bucket", "info", "warren-test"])
            .output()
            .expect("garage runs");
        let info = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{info}");
        assert!(info.contains(&garage.access_key_id), "{info}");
        let port: u16 = garage
            .endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("a port");
        garage.stop();
        assert!(garage.exited().is_some(), "still running after stop");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "S3 port still open"
        );
        let dir = config.parent().expect("a dir").to_path_buf();
        assert!(dir.exists());
        drop(garage);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
