//! Blocking work (file system, system calls) off the async threads:
//! `tokio::task::spawn_blocking`, or, on a thread the deterministic
//! simulation (`crates/sim`, docs/simulation.md) has switched, right there
//! on the calling task. A blocking-pool thread finishes when the OS says,
//! which a simulation cannot replay; what a simulated node does blocking
//! is quick (its runtime is simulated), so running it inline keeps one
//! seed one run.
//!
//! Only the simulation switches a thread ([`run_inline_on_this_thread`]).

use std::cell::Cell;

thread_local! {
    /// True on a thread the simulation switched.
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// The blocking task panicked or was cancelled.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BlockingError(String);

/// Runs `f` where blocking is allowed (see the module doc) and waits for it.
pub async fn run<F, T>(f: F) -> Result<T, BlockingError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if INLINE.with(Cell::get) {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BlockingError(e.to_string()))
}

/// Whether [`run`] runs blocking work inline on this thread. For the
/// simulation only.
#[doc(hidden)]
pub fn run_inline_on_this_thread(on: bool) {
    INLINE.with(|i| i.set(on));
}

/// Whether this thread runs blocking work inline (the simulation's).
pub fn inline_on_this_thread() -> bool {
    INLINE.with(Cell::get)
}
