//! What every warren component shares.
//!
//! # Layout
//! - [`id`]: sandbox and node id validation and generation.
//! - [`env`]: which sandbox environment variables are allowed.
//! - [`network`]: a sandbox's egress policy (E2B's `allowOut`/`denyOut`)
//!   and its egress rules (`network.rules`, [`network::rules`]).
//! - [`secrets`]: what a team secret's name, value and metadata may be.
//! - [`headers`]: the headers warren puts on the wire between its parts.
//! - [`config`]: CLI flags + `WARREN_*` env + optional TOML file, parsed and
//!   validated before any socket is bound; bad config exits with code 64.
//! - [`admin`]: the admin listener (`/metrics`, `/healthz`, `/readyz`).
//! - [`body`]: the one response body type, JSON/empty builders, bounded reads.
//! - [`node_api`]: the node control API's JSON types, paths and `ENVD_VERSION`.
//! - [`upgrade`]: HTTP/1.1 upgrade detection and splicing for proxies.
//! - [`backoff`]: the one retry pause policy (capped exponential, jittered).
//! - [`server`]: the one HTTP server loop every listener runs, generic over
//!   how connections are accepted (a handshake step for TLS), with the same
//!   timeouts, connection limits, metrics and graceful drain.
//! - [`private`]: host files only their owner may read (made so, checked).
//! - [`shutdown`]: SIGTERM/Ctrl-C as a future, readiness flag.
//! - [`logging`]: `tracing` setup (text or JSON).
//! - [`time`]: wall-clock milliseconds for stored timestamps.
//! - [`entropy`], [`blocking`]: where randomness comes from and where
//!   blocking work runs; the deterministic simulation (`crates/sim`)
//!   switches both on its own thread, nothing else does.
//! - [`volume`]: volume ids, names and mount paths, checked alike everywhere.

pub mod admin;
pub mod backoff;
pub mod blocking;
pub mod body;
pub mod config;
pub mod entropy;
pub mod env;
pub mod headers;
pub mod id;
pub mod logging;
pub mod network;
pub mod node_api;
pub mod private;
pub mod secrets;
pub mod server;
pub mod shutdown;
pub mod time;
pub mod upgrade;
pub mod volume;

/// Prints `"{component} {name} listening on {addr}"` to stdout and flushes.
///
/// Every component announces each listener this way once it is bound; people
/// read it, and `warren dev` and the tests parse it (so ports can be `:0`).
pub fn announce(component: &str, name: &str, addr: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{component} {name} listening on {addr}");
    let _ = out.flush();
}

/// Parses a line printed by [`announce`]: `Some(("<component> <name>", addr))`.
pub fn parse_announce(line: &str) -> Option<(&str, &str)> {
    let (what, addr) = line.split_once(" listening on ")?;
    Some((what.trim(), addr.trim()))
}
