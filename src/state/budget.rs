//! A remote's budget: how many exported Services, endpoints (summed over its slices) and cached
//! bytes it may cost. Pure: judged on figures the caches keep, tested without I/O.
//!
//! A remote over budget is *degraded*: its caches are dropped (so it proves nothing and deletes
//! nothing: its followers stay as they are), it is not read again until a back-off has passed
//! (30 s, doubling to 10 min), and it is shown on /readyz and in `xcc_remote_over_budget`.
//! Each drop bumps an epoch, so every watch of the remote relists from scratch.
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The first wait after a remote went over budget; it doubles at each trip up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_secs(30);
pub const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// A remote's limits (0: none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Services exported (labelled `<key>=true`)
    pub services: u64,
    /// endpoints, summed over its slices
    pub endpoints: u64,
    /// bytes its caches hold (an estimate: the compressed objects and their bookkeeping)
    pub bytes: u64,
}

/// What a remote's caches hold now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub services: u64,
    pub endpoints: u64,
    pub bytes: u64,
}

impl std::ops::Add for Usage {
    type Output = Usage;

    fn add(self, o: Usage) -> Usage {
        Usage {
            services: self.services + o.services,
            endpoints: self.endpoints + o.endpoints,
            bytes: self.bytes + o.bytes,
        }
    }
}

impl Limits {
    /// Why `usage` is over these limits, if it is.
    pub fn exceeded(&self, usage: &Usage) -> Option<String> {
        let over = |used: u64, limit: u64| limit > 0 && used > limit;
        if over(usage.services, self.services) {
            return Some(format!("more than {} exported Services", self.services));
        }
        if over(usage.endpoints, self.endpoints) {
            return Some(format!("more than {} endpoints", self.endpoints));
        }
        if over(usage.bytes, self.bytes) {
            return Some(format!("more than {} cached bytes", self.bytes));
        }
        None
    }
}

/// What [`Budget::judge`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Judged {
    Within,
    /// over budget now: the caller drops the remote's caches
    Tripped(String),
}

#[derive(Debug, Default)]
struct Trip {
    /// why it is over budget (None: within)
    over: Option<String>,
    retry_at: Option<Instant>,
    backoff: Duration,
    epoch: u64,
}

/// A remote's limits and whether it is over them.
#[derive(Debug, Default)]
pub struct Budget {
    pub limits: Limits,
    trip: Mutex<Trip>,
}

impl Budget {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            trip: Mutex::new(Trip::default()),
        }
    }

    /// Judges what the caches hold; over the limits, the remote trips (again).
    pub fn judge(&self, usage: &Usage, now: Instant) -> Judged {
        let Some(why) = self.limits.exceeded(usage) else {
            return Judged::Within;
        };
        let mut t = self.trip.lock();
        t.backoff = if t.backoff.is_zero() {
            BACKOFF_MIN
        } else {
            (t.backoff * 2).min(BACKOFF_MAX)
        };
        t.retry_at = Some(now + t.backoff);
        t.epoch += 1;
        t.over = Some(why.clone());
        Judged::Tripped(why)
    }

    /// Err while the remote is over budget and its back-off runs: nothing is read from it.
    pub fn hold(&self, now: Instant) -> Result<(), String> {
        let t = self.trip.lock();
        match (&t.over, t.retry_at) {
            // the text stays the same for the whole back-off (it is recorded in the health Lease)
            (Some(why), Some(at)) if now < at => Err(format!(
                "over budget ({why}): its caches were dropped and its followers are kept; read again after a back-off of {}s",
                t.backoff.as_secs()
            )),
            _ => Ok(()),
        }
    }

    /// Bumped each time the remote trips: a watch that listed before must list again.
    pub fn epoch(&self) -> u64 {
        self.trip.lock().epoch
    }

    /// Why the remote is over budget, while it is (until a complete listing within it).
    pub fn over(&self) -> Option<String> {
        self.trip.lock().over.clone()
    }

    /// Every cache of the remote listed completely within the limits: it is not over budget any
    /// more (the back-off starts again from its minimum). True if it was.
    pub fn clear(&self) -> bool {
        let mut t = self.trip.lock();
        let was = t.over.take().is_some();
        t.retry_at = None;
        t.backoff = Duration::ZERO;
        was
    }
}

/// A byte count: an integer, optionally with a binary suffix (`Ki`, `Mi`, `Gi`).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => {
            return Err(format!(
                "{text:?} is not a byte count (an integer, optionally followed by Ki, Mi or Gi)"
            ));
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a byte count"))?;
    n.checked_mul(factor)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// A count (Services, endpoints): a non-negative integer; 0 means no limit.
pub fn parse_count(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a count (a non-negative integer; 0: no limit)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(services: u64, endpoints: u64, bytes: u64) -> Usage {
        Usage {
            services,
            endpoints,
            bytes,
        }
    }

    const LIMITS: Limits = Limits {
        services: 10,
        endpoints: 100,
        bytes: 1000,
    };

    #[test]
    fn each_limit_is_judged_and_zero_is_none() {
        assert_eq!(LIMITS.exceeded(&usage(10, 100, 1000)), None);
        let s = LIMITS.exceeded(&usage(11, 0, 0)).unwrap();
        assert!(s.contains("more than 10 exported Services"), "{s}");
        let e = LIMITS.exceeded(&usage(0, 101, 0)).unwrap();
        assert!(e.contains("more than 100 endpoints"), "{e}");
        let b = LIMITS.exceeded(&usage(0, 0, 1001)).unwrap();
        assert!(b.contains("more than 1000 cached bytes"), "{b}");
        assert_eq!(Limits::default().exceeded(&usage(u64::MAX, 1, 1)), None);
    }

    #[test]
    fn a_trip_holds_the_remote_for_a_doubling_back_off_and_a_complete_listing_clears_it() {
        let b = Budget::new(LIMITS);
        let t0 = Instant::now();
        assert_eq!(b.judge(&usage(1, 1, 1), t0), Judged::Within);
        assert_eq!((b.epoch(), b.over()), (0, None));
        assert!(b.hold(t0).is_ok());
        assert!(matches!(b.judge(&usage(11, 1, 1), t0), Judged::Tripped(_)));
        assert_eq!(b.epoch(), 1);
        let held = b.hold(t0 + Duration::from_secs(29)).unwrap_err();
        assert!(
            held.contains("over budget (more than 10 exported Services)"),
            "{held}"
        );
        assert!(held.contains("followers are kept"), "{held}");
        assert!(held.ends_with("after a back-off of 30s"), "{held}");
        // the back-off has passed: it is read again, still shown over budget until it lists
        let t1 = t0 + BACKOFF_MIN;
        assert!(b.hold(t1).is_ok());
        assert!(b.over().is_some());
        // over again: twice as long
        b.judge(&usage(11, 1, 1), t1);
        assert_eq!(b.epoch(), 2);
        assert!(b.hold(t1 + Duration::from_secs(59)).is_err());
        assert!(b.hold(t1 + Duration::from_secs(60)).is_ok());
        assert!(b.clear());
        assert!(!b.clear());
        assert_eq!(b.over(), None);
        // and after a clear, the back-off starts again from its minimum
        b.judge(&usage(11, 1, 1), t1);
        assert!(b.hold(t1 + BACKOFF_MIN).is_ok());
    }

    #[test]
    fn the_back_off_stops_doubling_at_its_maximum() {
        let b = Budget::new(LIMITS);
        let t = Instant::now();
        for _ in 0..12 {
            b.judge(&usage(11, 1, 1), t);
        }
        assert!(b.hold(t + BACKOFF_MAX - Duration::from_secs(1)).is_err());
        assert!(b.hold(t + BACKOFF_MAX).is_ok());
    }

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("4Ki"), Ok(4096));
        assert_eq!(parse_bytes(" 32Mi "), Ok(32 << 20));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert!(parse_bytes("1MB").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("Mi").is_err());
        assert!(parse_bytes("99999999999999999999Gi").is_err());
        assert_eq!(parse_count("0"), Ok(0));
        assert!(parse_count("ten").is_err());
    }
}
