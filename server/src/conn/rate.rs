//! The per-connection request rate limit: a token bucket.

use std::time::{Duration, Instant};

/// A token bucket: `rate_per_s` sustained, `burst` at once.
pub(super) struct RateLimiter {
    tokens: f64,
    rate_per_s: f64,
    burst: f64,
    last: Instant,
}

impl RateLimiter {
    pub(super) fn new(rate_per_s: u32, burst: u32) -> Self {
        Self {
            tokens: f64::from(burst),
            rate_per_s: f64::from(rate_per_s),
            burst: f64::from(burst),
            last: Instant::now(),
        }
    }

    /// Takes one token, or says how long until one is available.
    pub(super) fn take(&mut self) -> Result<(), Duration> {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * self.rate_per_s;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64(
            (1.0 - self.tokens) / self.rate_per_s,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limiter_allows_the_burst_then_says_when_to_retry() {
        let mut bucket = RateLimiter::new(10, 3);
        assert!(bucket.take().is_ok());
        assert!(bucket.take().is_ok());
        assert!(bucket.take().is_ok());
        let wait = bucket.take().expect_err("burst spent");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
    }
}
