//! `warren-chaos`: the failover experiment (`warren chaos failover`).
//!
//! It starts a replicated warren cluster — two scheduler replicas on one
//! PostgreSQL database, two gateways, two nodes, each a child process of the
//! `warren` binary — and stock HAProxy in front of the gateways in L4 (TCP)
//! and L7 (HTTP) mode, from the configs shipped in `deploy/haproxy/`. It
//! probes through both balancers during a baseline, signals one replica of
//! the chosen component (TERM or KILL), keeps probing through recovery,
//! restarts the replica and probes again. Every probe is recorded; the
//! report gives successes/attempts per probe kind × entry point × phase,
//! and a timeline plot. Everything stays on loopback and is bounded in time
//! and request count.
//!
//! This crate is a harness run by the binary and by tests, so its errors
//! are `anyhow` like the binary's.
//!
//! # Layout
//! - [`failover`]: the flags and the run: setup, phases, teardown.
//! - [`cluster`]: the replicas as child processes on fixed ports (so a
//!   restarted one comes back where HAProxy and the others expect it).
//! - [`haproxy`]: HAProxy started from the shipped configs via their
//!   environment variables.
//! - [`probes`]: the list, command, workflow and stream probes.
//! - [`record`]: every probe's result and the phase it fell in.
//! - [`reconcile`]: the final listing: duplicates, unsettled workflows, cleanup.
//! - [`report`]: probes.json/.csv, summary.md/.json, timeline.svg.
//!
//! Processes, ports, the private PostgreSQL server and admin GETs come from
//! `warren-harness`, shared with `warren dev` and the tests.

pub mod cluster;
pub mod failover;
pub mod haproxy;
pub mod probes;
pub mod reconcile;
pub mod record;
pub mod report;

pub use failover::{run, Config};
pub use report::Summary;
