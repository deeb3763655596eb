//! Where warren's non-secret-critical randomness comes from: the thread's
//! OS-seeded generator, or, on a thread the deterministic simulation
//! (`crates/sim`, docs/simulation.md) has seeded, a generator from its
//! seed, so that one seed replays one run exactly (sandbox ids, tokens,
//! backoff jitter).
//!
//! Only the simulation seeds a thread ([`seed_this_thread`]); no part of
//! warren does, so every id and token a real process makes comes from the
//! OS-seeded generator as before.

use std::cell::RefCell;

thread_local! {
    /// `Some` on a thread the simulation seeded.
    static SEEDED: RefCell<Option<rand::rngs::StdRng>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's generator: the seeded one if the simulation
/// set one, else `rand::rng()`.
pub fn with<R>(f: impl FnOnce(&mut dyn rand::RngCore) -> R) -> R {
    let mut f = Some(f);
    let seeded = SEEDED.with(|s| {
        let mut s = s.borrow_mut();
        s.as_mut().map(|rng| (f.take().expect("called once"))(rng))
    });
    match seeded {
        Some(r) => r,
        None => (f.take().expect("called once"))(&mut rand::rng()),
    }
}

/// Seeds this thread's generator (`None`: back to the OS-seeded one). For
/// the simulation only.
#[doc(hidden)]
pub fn seed_this_thread(seed: Option<u64>) {
    use rand::SeedableRng;
    SEEDED.with(|s| *s.borrow_mut() = seed.map(rand::rngs::StdRng::seed_from_u64));
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    #[test]
    fn a_seeded_thread_repeats_and_an_unseeded_one_does_not() {
        let draw = || super::with(|r| r.random::<u64>());
        super::seed_this_thread(Some(7));
        let a = (draw(), draw());
        super::seed_this_thread(Some(7));
        let b = (draw(), draw());
        assert_eq!(a, b);
        super::seed_this_thread(None);
        assert_ne!(draw(), draw());
    }
}
