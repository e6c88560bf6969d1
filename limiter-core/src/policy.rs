//! Rate-limiting policies: an algorithm, a limit and a window, validated
//! once when built.

use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;
use crate::time::duration_to_micros;

/// The algorithm a [`Policy`] applies. Every algorithm's exact semantics are
/// given in [`algorithm`](crate::algorithm), and every backend must match
/// them decision for decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Exact: a log of the admitted requests' timestamps, at most `limit`
    /// entries per key. A request is admitted when fewer than `limit` units
    /// were admitted in the last `window`.
    SlidingLog,
    /// A counter per key; the window opens at the first request and its end
    /// is fixed then, never moved by later hits.
    FixedWindow,
    /// Two epoch-aligned fixed windows, the previous one weighted by how much
    /// of it still overlaps the sliding window. O(1) per key, approximate.
    SlidingWindow,
    /// The generic cell rate algorithm (a token bucket of `limit` tokens
    /// refilled evenly over `window`). O(1) per key, smooth.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ];

    /// A short, stable, lowercase name, usable in storage keys and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The largest exact integer a double holds, 2^53: the bound under which a
/// Lua script computes exactly what Rust does.
pub const MAX_EXACT: u64 = 1 << 53;

/// The shortest window accepted: one millisecond.
pub const MIN_WINDOW: Duration = Duration::from_millis(1);

/// The longest window accepted: 366 days. Longer windows are better served by
/// a quota in a database than by a rate limiter.
pub const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);

/// The largest limit of a sliding-window log, which stores one timestamp per
/// admitted unit.
pub const MAX_LOG_LIMIT: u32 = 10_000;

/// The largest limit of any policy.
pub const MAX_LIMIT: u32 = 1_000_000_000;

/// A validated rate-limiting policy: at most `limit` units per `window`,
/// applied with `algorithm`.
///
/// ```
/// use limiter_core::{Algorithm, Policy};
/// use std::time::Duration;
///
/// let search = Policy::sliding_log(60, Duration::from_secs(60)).unwrap();
/// assert_eq!(search.algorithm(), Algorithm::SlidingLog);
///
/// // Refused at construction, with a clear message:
/// let err = Policy::gcra(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err.to_string(), "limit must be at least 1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: Algorithm,
    limit: u32,
    window_us: u64,
}

impl Policy {
    /// A policy admitting at most `limit` units per `window` with `algorithm`.
    ///
    /// Refuses a zero limit, a window under [`MIN_WINDOW`] or over
    /// [`MAX_WINDOW`], a window with a sub-microsecond part, and limits the
    /// algorithm cannot represent exactly: above [`MAX_LIMIT`]; above
    /// [`MAX_LOG_LIMIT`] for the log; for the sliding window, a
    /// `limit × window` (in µs) above [`MAX_EXACT`]; for GCRA, a limit above
    /// the window in µs (the emission interval must be at least 1 µs).
    pub fn new(algorithm: Algorithm, limit: u32, window: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        if window < MIN_WINDOW {
            return Err(ConfigError::WindowTooShort {
                got: window,
                min: MIN_WINDOW,
            });
        }
        if window > MAX_WINDOW {
            return Err(ConfigError::WindowTooLong {
                got: window,
                max: MAX_WINDOW,
            });
        }
        if !window.subsec_nanos().is_multiple_of(1_000) {
            return Err(ConfigError::WindowNotWholeMicros(window));
        }
        let window_us = duration_to_micros(window);
        let max = match algorithm {
            Algorithm::SlidingLog => u64::from(MAX_LOG_LIMIT),
            Algorithm::FixedWindow => u64::from(MAX_LIMIT),
            Algorithm::SlidingWindow => (MAX_EXACT / window_us).min(u64::from(MAX_LIMIT)),
            Algorithm::Gcra => window_us.min(u64::from(MAX_LIMIT)),
        };
        if u64::from(limit) > max {
            return Err(ConfigError::LimitTooLarge {
                algorithm,
                limit: u64::from(limit),
                max,
            });
        }
        Ok(Policy {
            algorithm,
            limit,
            window_us,
        })
    }

    /// A sliding-window log policy. See [`Policy::new`].
    pub fn sliding_log(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::new(Algorithm::SlidingLog, limit, window)
    }

    /// A fixed-window policy. See [`Policy::new`].
    pub fn fixed_window(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::new(Algorithm::FixedWindow, limit, window)
    }

    /// A sliding-window counter policy. See [`Policy::new`].
    pub fn sliding_window(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::new(Algorithm::SlidingWindow, limit, window)
    }

    /// A GCRA (token bucket) policy: bursts of up to `limit`, refilled evenly
    /// over `window`. See [`Policy::new`].
    pub fn gcra(limit: u32, window: Duration) -> Result<Self, ConfigError> {
        Self::new(Algorithm::Gcra, limit, window)
    }

    /// The algorithm.
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The most units admitted per window.
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// The window.
    pub const fn window(&self) -> Duration {
        Duration::from_micros(self.window_us)
    }

    /// The window in microseconds.
    pub const fn window_micros(&self) -> u64 {
        self.window_us
    }

    /// GCRA's emission interval: `window / limit` in whole microseconds,
    /// rounded down. Defined for every algorithm, used by GCRA.
    pub const fn emission_interval_micros(&self) -> u64 {
        self.window_us / self.limit as u64
    }

    /// Checks that a request of `cost` units could ever be admitted: between
    /// 1 and the limit.
    pub fn check_cost(&self, cost: u32) -> Result<(), ConfigError> {
        if cost == 0 || cost > self.limit {
            return Err(ConfigError::InvalidCost {
                cost,
                limit: self.limit,
            });
        }
        Ok(())
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} per {:?} ({})",
            self.limit,
            self.window(),
            self.algorithm
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_configuration() {
        let s = Duration::from_secs(1);
        for algorithm in Algorithm::ALL {
            assert_eq!(
                Policy::new(algorithm, 0, s),
                Err(ConfigError::ZeroLimit),
                "{algorithm}"
            );
            assert!(matches!(
                Policy::new(algorithm, 1, Duration::ZERO),
                Err(ConfigError::WindowTooShort { .. })
            ));
            assert!(matches!(
                Policy::new(algorithm, 1, MAX_WINDOW + s),
                Err(ConfigError::WindowTooLong { .. })
            ));
            assert!(matches!(
                Policy::new(algorithm, 1, Duration::from_nanos(1_000_000_500)),
                Err(ConfigError::WindowNotWholeMicros(_))
            ));
            assert!(matches!(
                Policy::new(algorithm, MAX_LIMIT + 1, MAX_WINDOW),
                Err(ConfigError::LimitTooLarge { .. })
            ));
        }
        assert!(matches!(
            Policy::sliding_log(MAX_LOG_LIMIT + 1, s),
            Err(ConfigError::LimitTooLarge { max: 10_000, .. })
        ));
        // A one-day sliding window can count up to 2^53 / 86_400_000_000.
        let day = Duration::from_secs(86_400);
        assert!(Policy::sliding_window(104_249, day).is_ok());
        assert!(Policy::sliding_window(104_250, day).is_err());
        // GCRA needs an emission interval of at least 1 µs.
        assert!(Policy::gcra(1_000_000, s).is_ok());
        assert!(Policy::gcra(1_000_001, s).is_err());
    }

    #[test]
    fn cost_must_fit_the_limit() {
        let p = Policy::fixed_window(5, Duration::from_secs(1)).unwrap();
        assert!(p.check_cost(1).is_ok());
        assert!(p.check_cost(5).is_ok());
        assert_eq!(
            p.check_cost(0),
            Err(ConfigError::InvalidCost { cost: 0, limit: 5 })
        );
        assert!(p.check_cost(6).is_err());
    }
}
