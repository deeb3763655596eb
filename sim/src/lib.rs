//! Deterministic simulation of warren's routing layer under faults
//! (docs/simulation.md).
//!
//! One seed is one run: two scheduler replicas over one store, two
//! gateways, three nodes and a client that creates, uses, pauses,
//! resumes, forks and deletes sandboxes, in turmoil's simulated network
//! and time, while faults drawn from the seed partition, delay, crash and
//! restart parts and step the store's clock. Everything is warren's own
//! code (the scheduler's service, store, watch hub and sweeps; the
//! gateway's handlers, resolver, route cache, watch follower and proxy;
//! the node's registry, control API, identity check and scheduler link)
//! except what a node starts (its runtime and the sandboxes' envd, in
//! [`sandbox`]) and the wire's TLS. The invariants are checked as the run
//! goes and once it is quiet ([`check`], [`client`]).
//!
//! # Layout
//! - this file: [`Options`], [`Outcome`], [`run`], the run's constants.
//! - [`world`]: the store, the hosts and the fault schedule; the stepping loop.
//! - [`client`]: the workload and the quiescence checks.
//! - [`check`]: the invariants.
//! - [`sandbox`]: simulated envds and the node runtime that "starts" them.
//! - [`net`]: warren's listeners and dialers over turmoil's network.
//!
//! # Why turmoil
//! turmoil runs each host on its own Tokio runtime with a paused clock,
//! so warren's code runs unchanged: the real `tokio`, `hyper` and `tonic`,
//! over a simulated TCP whose delays, partitions, holds and crashes come
//! from the seed. madsim replaces Tokio (and tonic) with its own at build
//! time (`--cfg madsim`), which would mean a second build of the whole
//! workspace under another configuration, and shims for every crate that
//! touches a socket or a clock; turmoil needs only the seams warren's parts
//! already have or now have (listeners generic over `Accept`, a scheduler
//! connector, a node dialer, an envd dialer, the wall clock, the entropy
//! source, where blocking work runs, and where store operations run).

pub mod check;
pub mod client;
pub mod net;
pub mod sandbox;
pub mod world;

use std::time::Duration;

/// A run's event log, one line an event.
pub type Trace = Vec<String>;

/// The header that carries a data-plane request's number to the
/// simulated sandbox, so a delivery can be matched with what was sent.
pub const REQUEST_HEADER: &str = "x-sim-request";

/// When the faults stop: every partition is repaired, every hold
/// released, every crashed part restarted (except a node left dead on
/// purpose).
pub const FAULTS_END: Duration = Duration::from_secs(5);
/// Node lease (`--lease`) and the sweep's interval (`--sweep-interval`).
pub const LEASE: Duration = Duration::from_secs(2);
pub const SWEEP: Duration = Duration::from_millis(500);
/// Heartbeat interval (`--heartbeat-interval`).
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// The gateways' route cache TTL (`--route-cache-ttl`).
pub const ROUTE_TTL: Duration = Duration::from_secs(2);
/// What a request may spend between being routed and reaching its node,
/// on top of the TTL, in the staleness check: the longest network delay
/// plus a hold.
pub const IN_FLIGHT: Duration = Duration::from_millis(1500);
/// After the faults stop: how long until every live sandbox must be
/// reachable through every gateway, and every binding on a dead node
/// marked lost (lease + sweep + a heartbeat, plus the longest request
/// timeout). Stated in docs/simulation.md.
pub const SETTLE: Duration = Duration::from_secs(7);
/// Once settled, how long a quiescence check retries before it reports.
pub const REACH_BOUND: Duration = Duration::from_secs(2);

/// Which invariant a run breaks on purpose (the `mutations` features).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// Binding removals match the sandbox id alone (no `(node, generation)` fence).
    Unfenced,
    /// Nodes serve a sandbox at any generation a request names.
    NoGenerationCheck,
}

/// How to run one seed.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub mutation: Option<Mutation>,
    /// Client operations in the run (spread over its users).
    pub ops: usize,
}

impl Options {
    /// The defaults for `seed`.
    pub fn new(seed: u64) -> Options {
        Options {
            seed,
            mutation: None,
            ops: 30,
        }
    }
}

/// What one run found.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub violations: Vec<String>,
    pub trace: Trace,
    /// Deliveries to sandboxes and answers to clients.
    pub deliveries: u64,
    pub answers: u64,
    /// Sandboxes moved to another node (a filesystem-paused one resumed
    /// elsewhere).
    pub moves: u64,
    /// Simulated time the run took.
    pub simulated: Duration,
}

impl Outcome {
    /// A digest of the trace, to compare two runs of one seed.
    pub fn fingerprint(&self) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for line in &self.trace {
            h = (h ^ warren_core::id::fnv1a(line.as_bytes())).wrapping_mul(0x100_0000_01b3);
        }
        h
    }
}

/// Runs one seed to its end.
pub fn run(options: &Options) -> Outcome {
    world::run(options)
}
