//! The one retry pause policy: capped exponential backoff with jitter.
//!
//! Every loop that retries something remote (the gateway's watch stream, the
//! node's scheduler link, `warren-client`'s retried calls) pauses with a
//! [`Backoff`]: the first pause is `first`, each next one twice the last, never
//! more than `max`, each shaken by ±25% so processes restarted together do not
//! retry in step. `reset` after a success starts over.

use std::time::Duration;

/// The longest pause any warren retry loop waits by default.
pub const MAX: Duration = Duration::from_secs(5);

/// Pauses between retries; see the module doc.
#[derive(Debug, Clone)]
pub struct Backoff {
    /// The first pause, and where [`Backoff::reset`] starts again.
    first: Duration,
    /// The cap on the un-jittered pause.
    max: Duration,
    /// The un-jittered pause [`Backoff::next_pause`] hands out next.
    next: Duration,
}

impl Backoff {
    /// Pauses from `first`, doubling up to `max`.
    pub fn new(first: Duration, max: Duration) -> Self {
        let max = max.max(first);
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The pause before the next attempt (jittered), and doubles the one after.
    pub fn next_pause(&mut self) -> Duration {
        let pause = jitter(self.next);
        self.next = (self.next * 2).min(self.max);
        pause
    }

    /// The un-jittered pause that comes next, e.g. for a log line.
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Starts over from the first pause (after a success).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// `d` ± up to 25%.
fn jitter(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(0.75 + crate::entropy::with(|r| r.random::<f64>()) * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_within_the_jitter_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(500));
        let mut seen = Vec::new();
        for _ in 0..5 {
            let want = b.peek();
            let got = b.next_pause();
            assert!(got >= want.mul_f64(0.75) && got <= want.mul_f64(1.25));
            seen.push(want);
        }
        assert_eq!(seen, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        b.reset();
        assert_eq!(b.peek(), ms(100));
    }
}
