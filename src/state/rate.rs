//! A remote's rate of follower Service updates (issue 37): a token bucket. Pure: judged on the
//! instant it is given, tested without a clock.
//!
//! A remote may have its followers' Services updated `rate` times a second, in bursts of ten
//! seconds' worth. Past that, a pass leaves the Service as it is and comes back when a token is
//! due: the changes meanwhile collapse into the one update it then makes (the pass is
//! level-based), so a remote flipping a label a hundred times a second costs the local API
//! server `rate` updates a second, not a hundred. Endpoints (slices, Endpoints) are never
//! held back: they carry readiness, which failover needs at once.
use std::time::{Duration, Instant};

/// How many seconds' worth of updates a burst may take.
pub const BURST_SECONDS: u64 = 10;

/// Tokens of one remote: `rate` a second, at most `burst` saved up. A rate of 0: no limit.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: u64,
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub fn new(rate: u64) -> Self {
        Self {
            rate,
            tokens: Self::burst_of(rate),
            last: None,
        }
    }

    fn burst_of(rate: u64) -> f64 {
        (rate.saturating_mul(BURST_SECONDS)) as f64
    }

    /// The updates a second this bucket allows (0: no limit).
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Takes one token at `now`; Err with how long until one is due when there is none.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        if self.rate == 0 {
            return Ok(());
        }
        let rate = self.rate as f64;
        if let Some(last) = self.last {
            let earned = now.saturating_duration_since(last).as_secs_f64() * rate;
            self.tokens = (self.tokens + earned).min(Self::burst_of(self.rate));
        }
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_ten_seconds_then_the_rate() {
        let mut b = TokenBucket::new(2);
        let t0 = Instant::now();
        for _ in 0..20 {
            assert_eq!(b.take(t0), Ok(()));
        }
        let wait = b.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        // half a second later one token is due, and only one
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(b.take(t1), Ok(()));
        assert!(b.take(t1).is_err());
        // a long pause saves up no more than the burst
        let t2 = t1 + Duration::from_secs(3600);
        let taken = (0..100).filter(|_| b.take(t2).is_ok()).count();
        assert_eq!(taken, 20);
    }

    #[test]
    fn over_a_minute_at_most_the_burst_and_the_rate_pass() {
        let mut b = TokenBucket::new(3);
        let t0 = Instant::now();
        // one attempt every 10 ms for 60 s: 6,000 attempts
        let passed = (0..6000)
            .filter(|i| b.take(t0 + Duration::from_millis(10 * i)).is_ok())
            .count();
        // 30 saved up, then 3 a second for the 60 s
        assert!((208..=211).contains(&passed), "{passed}");
    }

    #[test]
    fn zero_is_no_limit() {
        let mut b = TokenBucket::new(0);
        let t0 = Instant::now();
        assert!((0..10_000).all(|_| b.take(t0).is_ok()));
    }
}
