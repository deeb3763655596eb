//! Test-only switches (feature `mutations`, turned on only by the
//! deterministic simulation, `crates/sim`): each breaks one invariant on
//! purpose, so a test can show the simulation finds the breakage
//! (docs/simulation.md, "It bites"). Off unless a test turns it on; the
//! `warren` binary is never built with the feature. Per thread: the
//! simulation runs each seed on one thread (and hands the switch to the
//! thread that runs its store's operations), so runs side by side, with
//! and without a mutation, never see each other's.

use std::cell::Cell;

thread_local! {
    /// When set, [`crate::sandbox::Registry::get`] ignores the generation: a
    /// node serves a sandbox it hosts at whatever generation a request names
    /// (ARCHITECTURE.md invariant "Nodes check identity", broken).
    static NO_GENERATION_CHECK: Cell<bool> = const { Cell::new(false) };
}

/// Turns the generation check off (`true`) or back on.
pub fn skip_generation_check(on: bool) {
    NO_GENERATION_CHECK.with(|m| m.set(on));
}

/// Whether the generation check is off.
pub fn generation_check_skipped() -> bool {
    NO_GENERATION_CHECK.with(Cell::get)
}
