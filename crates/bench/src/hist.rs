//! A log-linear latency histogram: 32 buckets per power of two (each
//! about 3 % wide), so percentiles come out within 3 % of the truth at
//! any scale, in a fixed 16 KiB that merges by adding. Values are
//! microseconds. `hdrhistogram` does the same with more knobs; this is
//! the part a per-interval timeline needs.

/// Bits of mantissa kept: 2^SUB buckets per power of two.
const SUB: u32 = 5;
/// Values below this are their own bucket.
const LINEAR: u64 = 1 << SUB;
/// Enough buckets for any `u64`.
const BUCKETS: usize = ((64 - SUB as usize) + 1) << SUB;

#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let octave = 63 - v.leading_zeros(); // >= SUB
    let shift = octave - SUB;
    let mantissa = (v >> shift) as usize & (LINEAR as usize - 1);
    ((shift as usize + 1) << SUB) + mantissa
}

/// The largest value that falls in bucket `i`.
fn upper(i: usize) -> u64 {
    if i < LINEAR as usize {
        return i as u64;
    }
    let shift = (i >> SUB) - 1;
    let mantissa = (i & (LINEAR as usize - 1)) as u64;
    let lower = (LINEAR + mantissa) << shift;
    lower + ((1u64 << shift) - 1)
}

impl Histogram {
    pub fn record(&mut self, micros: u64) {
        self.counts[index(micros)] += 1;
        self.total += 1;
        self.max = self.max.max(micros);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` (0..=1): the upper edge of its bucket
    /// (never below the truth), capped at the largest value seen; None
    /// when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(upper(i).min(self.max));
            }
        }
        Some(self.max)
    }

    /// The non-empty buckets as `upper:count` pairs joined by commas, for
    /// a script to merge any range of intervals itself.
    pub fn sparse(&self) -> String {
        let mut out = String::new();
        for (i, c) in self.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(&format!("{}:{c}", upper(i).min(self.max)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_a_bucket_no_wider_than_three_percent() {
        let mut v = 0u64;
        while v < 1 << 40 {
            let i = index(v);
            assert!(i < BUCKETS);
            let hi = upper(i);
            assert!(v <= hi, "{v} above its bucket's top {hi}");
            if i > 0 {
                assert!(v > upper(i - 1), "{v} belongs below bucket {i}");
            }
            assert!(hi - v <= v / 32, "bucket of {v} too wide: {hi}");
            v = v * 9 / 8 + 1;
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn percentiles_of_a_uniform_spread_are_within_the_bucket_width() {
        let mut h = Histogram::default();
        for v in 1..=10_000u64 {
            h.record(v);
        }
        for (q, want) in [(0.5, 5_000f64), (0.99, 9_900.0), (1.0, 10_000.0)] {
            let got = h.quantile(q).expect("not empty") as f64;
            assert!(got >= want && got <= want * 1.035, "q{q}: {got} for {want}");
        }
        assert_eq!(h.quantile(0.0), Some(1));
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn merged_histograms_count_both() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record(10);
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.total, 2);
        assert_eq!(a.max, 1_000_000);
        assert_eq!(a.quantile(1.0), Some(1_000_000));
        assert_eq!(a.sparse(), "10:1,1000000:1");
    }
}
