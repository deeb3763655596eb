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
    /// When set, a binding's removal (a node's DELETE report, a gateway's
    /// kill, a release, a sweep) matches the sandbox id alone, not its
    /// `(node_id, generation)`: a delayed report about an old placement
    /// removes the new one (ARCHITECTURE.md invariant "Fenced writes", broken).
    static UNFENCED_REMOVALS: Cell<bool> = const { Cell::new(false) };
}

/// Turns the fence on binding removals off (`true`) or back on.
pub fn unfence_removals(on: bool) {
    UNFENCED_REMOVALS.with(|m| m.set(on));
}

/// Whether binding removals are unfenced.
pub fn removals_unfenced() -> bool {
    UNFENCED_REMOVALS.with(Cell::get)
}
