//! Wall-clock time for stored timestamps (binding `started_at`, `end_at`).
//!
//! Durations and deadlines inside a process use `tokio::time::Instant` so that
//! paused-clock tests stay deterministic; only values that leave the process
//! are wall-clock. The deterministic simulation (`crates/sim`) replaces this
//! clock with its own ([`set_wall_clock`]): the one seam through which a
//! store's lease and deadline arithmetic sees simulated time and skew.

use std::sync::OnceLock;

/// The simulation's clock, when one was installed.
static WALL_CLOCK: OnceLock<fn() -> i64> = OnceLock::new();

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    if let Some(clock) = WALL_CLOCK.get() {
        return clock();
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Makes [`now_ms`] read `clock` for the rest of the process: for the
/// simulation only (its test process), never set by a part of warren.
/// False when a clock was installed already.
#[doc(hidden)]
pub fn set_wall_clock(clock: fn() -> i64) -> bool {
    WALL_CLOCK.set(clock).is_ok()
}

/// RFC 3339 (UTC, millisecond precision) for a Unix-epoch millisecond value,
/// as E2B's API returns `startedAt`/`endAt`.
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    )
}

// Howard Hinnant's days-from-civil inverse; exact for the proleptic Gregorian calendar.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_rfc3339() {
        assert_eq!(super::rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            super::rfc3339_ms(1_796_000_000_123),
            "2026-11-30T00:53:20.123Z"
        );
    }
}
