//! `warren-client`: warren's public API over several entry points.
//!
//! A warren deployment is reached through one or more **entry points**:
//! gateways, or load balancers in front of them. Any entry point can die at
//! any moment (a rolling restart, `kill -9`, a crashed host). This client
//! makes two things survive that:
//!
//! - **Creates happen exactly once.** [`Client::create`] sends an
//!   `Idempotency-Key`; when the request fails without an answer (connection
//!   refused or reset, no answer in time) or with `502`/`503`, it is retried
//!   through the next entry point with the *same* key, so the scheduler maps
//!   every attempt to one sandbox.
//! - **Command output is never lost or repeated.** [`Client::run`] starts a
//!   command with envd's `process.Process/Start` through an entry point and
//!   counts the output bytes it has received. When the stream is cut (a
//!   transport error, or an end without the process's end event), it
//!   reconnects through the next entry point with `process.Process/Connect`
//!   naming the pid and that byte offset (warren's `ConnectRequest.offset`,
//!   field 100). The node's envd keeps each process's output, so the stream
//!   goes on exactly where it stopped: the assembled output is complete and
//!   in order, and the command is never run twice.
//!
//! List, get and kill are retried through the next entry point on the same
//! failures (they are idempotent; a kill that finds the sandbox already gone
//! after a failed attempt counts as done).
//!
//! # Reattaching with the e2b SDK
//!
//! The e2b SDKs speak the same envd API but do not know warren's offset
//! field. An SDK user whose command stream was cut reattaches by pid:
//!
//! ```python
//! handle = sandbox.commands.run("long-job", background=True)
//! pid = handle.pid
//! # ... the connection is cut (a gateway died); reconnect through any entry:
//! handle = sandbox.commands.connect(pid)
//! result = handle.wait()
//! ```
//!
//! That is E2B's semantics: `connect(pid)` streams **live output only**, from
//! the moment it attaches; what the process printed in between is not
//! replayed. The process itself keeps running through the cut either way.
//! Clients that need every byte use this crate (or send
//! `ConnectRequest.offset` themselves).
//!
//! # Layout
//! - [`error`]: [`ClientError`], which says whether an outcome is known and
//!   whether a retry is allowed.
//! - `entry`: the entry-point list, round-robin and failover order.
//! - [`control`]: create / list / get / kill, and a data-plane health check
//!   that tells a lost node from an unreachable one.
//! - [`command`]: the resumable command stream.

pub mod command;
pub mod control;
mod entry;
pub mod error;

pub use command::{Command, CommandOutput, CommandStream, Exit, StreamEvent};
pub use control::{Client, ClientBuilder, Created, Health, Killed, NewSandbox, Sandbox};
pub use error::{ApiError, ClientError};

/// Header names the client sends (the same the e2b SDK sends).
pub mod headers {
    /// The API key for the control plane.
    pub const API_KEY: &str = "x-api-key";
    /// Makes retries of a create return the same sandbox.
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    /// Which sandbox a data-plane request is for.
    pub const E2B_SANDBOX_ID: &str = "e2b-sandbox-id";
    /// Which port in the sandbox (49983 is envd's API).
    pub const E2B_SANDBOX_PORT: &str = "e2b-sandbox-port";
    /// The sandbox's envd access token, when it has one.
    pub const ACCESS_TOKEN: &str = "x-access-token";
    /// envd's port inside every sandbox.
    pub const ENVD_PORT: u16 = 49983;
}
