//! A private PostgreSQL server for tests. It lives in `warren-chaos` (the
//! failover experiment starts one too); re-exported here so tests keep
//! using `warren_test_support::postgres::PgServer`.

pub use warren_chaos::postgres::PgServer;
