//! Latency recording: an HDR histogram of microseconds per operation.
//!
//! Invariants: values are clamped into `[1 µs, LATENCY_US_MAX]` so a stall
//! longer than the range is counted at the top instead of being dropped, and
//! histograms from several client threads merge losslessly.

use std::time::Duration;

use hdrhistogram::Histogram;

/// The largest latency kept exactly: one minute. Longer ones count as this.
pub const LATENCY_US_MAX: u64 = 60_000_000;

/// Reply latencies of one client, or of all clients once merged.
#[derive(Clone, Debug)]
pub struct Latency {
    histogram: Histogram<u64>,
}

/// The percentiles the report prints, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Percentiles {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
}

impl Default for Latency {
    fn default() -> Self {
        Self::new()
    }
}

impl Latency {
    pub fn new() -> Self {
        // Three significant digits: 0.1% relative error, about 200 KiB a
        // histogram, which is nothing next to one connection's buffers.
        let histogram = Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
            .expect("static histogram bounds are valid");
        Self { histogram }
    }

    pub fn record(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.record_us(us);
    }

    pub fn record_us(&mut self, us: u64) {
        self.histogram
            .saturating_record(us.clamp(1, LATENCY_US_MAX));
    }

    pub fn merge(&mut self, other: &Latency) {
        // Same bounds on both sides, so `add` cannot fail.
        self.histogram
            .add(&other.histogram)
            .expect("histograms share their bounds");
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The value at quantile `q` (0..=1), in microseconds; 0 when empty.
    pub fn quantile_us(&self, q: f64) -> u64 {
        if self.histogram.is_empty() {
            return 0;
        }
        self.histogram.value_at_quantile(q)
    }

    pub fn percentiles(&self) -> Percentiles {
        #[expect(
            clippy::cast_precision_loss,
            reason = "latencies are far below 2^52 µs"
        )]
        Percentiles {
            p50_us: self.quantile_us(0.50) as f64,
            p99_us: self.quantile_us(0.99) as f64,
            p999_us: self.quantile_us(0.999) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_uniform_1_to_10000_us_are_within_a_tenth_of_a_percent() {
        let mut latency = Latency::new();
        for us in 1..=10_000 {
            latency.record_us(us);
        }
        let p = latency.percentiles();
        assert!((p.p50_us - 5_000.0).abs() <= 5.0, "p50 {}", p.p50_us);
        assert!((p.p99_us - 9_900.0).abs() <= 10.0, "p99 {}", p.p99_us);
        assert!((p.p999_us - 9_990.0).abs() <= 10.0, "p999 {}", p.p999_us);
        assert_eq!(latency.count(), 10_000);
    }

    #[test]
    fn a_rare_slow_reply_shows_in_p999_but_not_p99() {
        let mut latency = Latency::new();
        for _ in 0..9_980 {
            latency.record(Duration::from_micros(100));
        }
        // 0.2% of replies: above the 99.9th percentile's rank, below the 99th's.
        for _ in 0..20 {
            latency.record(Duration::from_millis(50));
        }
        let p = latency.percentiles();
        assert!(p.p99_us < 101.0, "p99 {}", p.p99_us);
        assert!(p.p999_us > 49_000.0, "p999 {}", p.p999_us);
    }

    #[test]
    fn merged_histograms_count_every_sample_of_every_client() {
        let mut a = Latency::new();
        let mut b = Latency::new();
        a.record_us(10);
        b.record_us(1_000);
        b.record_us(1_000);
        a.merge(&b);
        assert_eq!(a.count(), 3);
        assert!(a.quantile_us(1.0) >= 999);
    }

    #[test]
    fn stalls_beyond_the_range_are_clamped_not_dropped() {
        let mut latency = Latency::new();
        latency.record(Duration::from_secs(3_600));
        latency.record_us(0);
        assert_eq!(latency.count(), 2);
        assert!(latency.quantile_us(1.0) >= LATENCY_US_MAX - LATENCY_US_MAX / 1000);
        assert_eq!(Latency::new().quantile_us(0.99), 0);
    }
}
