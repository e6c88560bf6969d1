//! Rate-limiting policies: an algorithm, a limit and a window, validated
//! once when built, and written as text (`"60/minute"`,
//! `"gcra 10/s burst 20"`) (see [`Policy`]).

pub mod parse;

use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::ban::Ban;
use crate::error::ConfigError;
use crate::time::duration_to_micros;

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
/// Built by its constructors or parsed from text (the grammar is below,
/// [As text](#as-text)); its `Display` is that text, and parses back to an
/// equal policy.
///
/// ```
/// use ratewarden_core::{Algorithm, Policy};
/// use std::time::Duration;
///
/// let search = Policy::sliding_log(60, Duration::from_secs(60)).unwrap();
/// assert_eq!(search.algorithm(), Algorithm::SlidingLog);
/// assert_eq!("60/minute".parse::<Policy>().unwrap(), search);
/// assert_eq!(search.to_string(), "sliding_log 60/min");
///
/// // Refused at construction, with a clear message:
/// let err = Policy::gcra(0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err.to_string(), "limit must be at least 1");
/// ```
///
/// Equality compares the policy as it was written: `gcra 10/s burst 20`
/// and `gcra 20/2s` decide identically, but are different values.
///
/// # As text
///
/// `"60/minute"`, `"sliding_log 60/min"`, `"gcra 10/s burst 20"`, for
/// configuration files and command lines: [`FromStr`](std::str::FromStr),
/// and [`parse_policies`](crate::parse_policies) for several in one string.
///
/// ## Grammar
///
/// ```text
/// policy    = [ algorithm ] count ( "/" | "per" ) period [ "burst" count ] [ ban ]
/// ban       = "ban" "after" count ( "in" | "within" ) period "for" period
///             [ "growing" "x" count "up" "to" period ]
/// algorithm = "sliding_log" | "fixed_window" | "sliding_window" | "gcra"
/// period    = [ count ] unit
/// count     = decimal digits, at least 1
/// unit      = us | ms | s | min | h | d | w, or a longer name:
///             µs, micros, microsecond(s); millis, millisecond(s);
///             sec(s), second(s); m, min(s), minute(s); hr(s), hour(s);
///             day(s); week(s)
/// ```
///
/// Words and numbers are separated by spaces where they would otherwise run
/// together; spaces around `/` and between a period's count and unit are
/// optional (`100/1h`, `100 / 1 h`, `5 per 2 hours`). Keywords and units
/// are case-insensitive. `a/p` means at most `a` units per period `p`.
///
/// **Without an algorithm, the policy is a sliding-window log**
/// ([`Algorithm::SlidingLog`]): the one algorithm under which "60/minute"
/// means what it says, at most 60 in *any* minute. It stores one timestamp
/// per admitted unit, so its limit is at most
/// [`MAX_LOG_LIMIT`](crate::MAX_LOG_LIMIT); name another algorithm for more
/// (`sliding_window 100000/h`). A `burst` implies GCRA:
/// `10/s burst 20` is `gcra 10/s burst 20`,
/// [`Policy::gcra_with_burst`]`(10, 1 s, 20)`, and applies only to it.
///
/// | text | policy |
/// |---|---|
/// | `60/minute`, `60 per minute`, `60/min`, `60/1m` | `Policy::sliding_log(60, 60 s)` |
/// | `10/s` | `Policy::sliding_log(10, 1 s)` |
/// | `fixed_window 1000/day` | `Policy::fixed_window(1000, 86 400 s)` |
/// | `sliding_window 100/90s` | `Policy::sliding_window(100, 90 s)` |
/// | `gcra 10/s` | `Policy::gcra(10, 1 s)` |
/// | `gcra 10/s burst 20` | `Policy::gcra_with_burst(10, 1 s, 20)` |
/// | `5/min ban after 3 in 10min for 15min` | `Policy::sliding_log(5, 60 s)` [`with_ban`](Policy::with_ban)`(Ban::new(3, 600 s, 900 s))` |
/// | `… for 15min growing x2 up to 1d` | the same ban [`growing`](crate::Ban::growing)`(2, 86 400 s)` |
///
/// A policy's `Display` is this text with the algorithm always named and
/// the largest unit that divides the period (`sliding_log 60/min`,
/// `fixed_window 1000/d`, `gcra 10/s burst 20`), and parses back to an
/// equal policy. Limits and windows are validated by the constructors, so
/// text is held to exactly the rules code is.
///
/// ```
/// use ratewarden_core::{Algorithm, Policy};
///
/// let p: Policy = "gcra 10/s burst 20".parse()?;
/// assert_eq!(p.algorithm(), Algorithm::Gcra);
/// assert_eq!(p.burst(), Some(20));
///
/// let err = "60/fortnight".parse::<Policy>().unwrap_err();
/// assert!(err.to_string().contains(r#"unknown unit "fortnight""#), "{err}");
/// # Ok::<(), ratewarden_core::ParsePolicyError>(())
/// ```
///
/// With the `serde` feature, [`Policy`] deserializes from this text and
/// serializes to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: Algorithm,
    limit: u32,
    window_us: u64,
    // The sustained rate as written: `limit` per `window` except for a GCRA
    // policy built with its own burst, whose text it keeps.
    rate: u32,
    per_us: u64,
    // `window_us / limit`, divided once here: a 64-bit division cost a GCRA
    // decision more than the rest of its arithmetic.
    emission_us: u64,
    ban: Option<Ban>,
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
        let window_us = checked_window(window)?;
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
            rate: limit,
            per_us: window_us,
            emission_us: window_us / u64::from(limit),
            ban: None,
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

    /// A GCRA policy admitting `rate` units per `per` on average, and bursts
    /// of up to `burst` units at once.
    ///
    /// GCRA spaces units by an emission interval `T` and tolerates `burst`
    /// of them at once; [`Policy::gcra`]`(limit, window)` sets `T = window /
    /// limit` and a burst of `limit`. This is the same algorithm with
    /// `T = ⌊per / rate⌋` µs (rounded down, exactly as `gcra(rate, per)`
    /// rounds it) and a burst of `burst`: the policy
    /// `gcra(burst, ⌊burst · per / rate⌋ µs)`, whose emission interval is
    /// exactly `T`. Every backend therefore applies it unchanged, and
    /// `gcra_with_burst(r, p, r)` equals `gcra(r, p)`. Its [`window`]
    /// (reported in rate-limit headers) is the time an empty bucket takes
    /// to refill, and [`rate`] and [`per`] keep the rate as written.
    ///
    /// Refuses a zero rate or burst, a `per` that is not a valid window
    /// (see [`Policy::new`]), a rate above one unit per microsecond, and a
    /// burst whose refill time falls outside [`MIN_WINDOW`]..=[`MAX_WINDOW`].
    ///
    /// [`window`]: Policy::window
    /// [`rate`]: Policy::rate
    /// [`per`]: Policy::per
    ///
    /// ```
    /// use ratewarden_core::Policy;
    /// use std::time::Duration;
    ///
    /// // 10 a second sustained, 20 at once.
    /// let p = Policy::gcra_with_burst(10, Duration::from_secs(1), 20)?;
    /// assert_eq!((p.limit(), p.window()), (20, Duration::from_secs(2)));
    /// assert_eq!(p.emission_interval_micros(), 100_000);
    /// assert_eq!(p.to_string(), "gcra 10/s burst 20");
    /// assert_eq!("gcra 10/s burst 20".parse::<Policy>().unwrap(), p);
    /// # Ok::<(), ratewarden_core::ConfigError>(())
    /// ```
    pub fn gcra_with_burst(rate: u32, per: Duration, burst: u32) -> Result<Self, ConfigError> {
        if rate == 0 {
            return Err(ConfigError::Invalid("rate must be at least 1".into()));
        }
        if burst == 0 {
            return Err(ConfigError::Invalid("burst must be at least 1".into()));
        }
        // The period is held to a window's bounds: it is one, for `rate`.
        let per_us = checked_window(per)?;
        if burst > MAX_LIMIT {
            return Err(ConfigError::Invalid(format!(
                "burst {burst} is too large: at most {MAX_LIMIT}"
            )));
        }
        if u64::from(rate) > per_us {
            return Err(ConfigError::Invalid(format!(
                "rate {rate} per {per:?} is more than one unit per microsecond, \
                 the finest interval GCRA spaces units by"
            )));
        }
        // ⌊⌊b·p/r⌋ / b⌋ = ⌊p/r⌋: the rounded-down window keeps the exact
        // emission interval, in u128 as b·p can pass u64.
        let refill = u128::from(burst) * u128::from(per_us) / u128::from(rate);
        let refill_us = u64::try_from(refill).unwrap_or(u64::MAX);
        let window = Duration::from_micros(refill_us);
        let out_of_range = |bound: &str, limit: Duration| {
            ConfigError::Invalid(format!(
                "a burst of {burst} at {rate} per {per:?} takes {window:?} to refill, \
                 {bound} window of {limit:?}"
            ))
        };
        if window < MIN_WINDOW {
            return Err(out_of_range("under the shortest", MIN_WINDOW));
        }
        if window > MAX_WINDOW {
            return Err(out_of_range("over the longest", MAX_WINDOW));
        }
        let mut policy = Policy::new(Algorithm::Gcra, burst, window)?;
        policy.rate = rate;
        policy.per_us = per_us;
        Ok(policy)
    }

    /// The same policy with a [`Ban`]: a key refused `ban.after()` times
    /// within `ban.within()` is then refused outright for the ban's length,
    /// by the store, in the same step as the decision (see
    /// [`ban`](crate::ban)). A store that cannot keep bans refuses such a
    /// policy when a rule is built ([`Capabilities::bans`](crate::Capabilities::bans)).
    /// Written in text as `… ban after 3 in 10min for 15min [growing x2 up to 1d]`.
    pub const fn with_ban(mut self, ban: Ban) -> Self {
        self.ban = Some(ban);
        self
    }

    /// The policy's ban, if it has one.
    pub const fn ban(&self) -> Option<&Ban> {
        self.ban.as_ref()
    }

    /// The same policy without its ban.
    pub const fn without_ban(mut self) -> Self {
        self.ban = None;
        self
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

    /// The sustained rate as written: units admitted per [`per`](Self::per).
    /// The [`limit`](Self::limit), except for a policy built by
    /// [`Policy::gcra_with_burst`], where it is the rate it was given.
    pub const fn rate(&self) -> u32 {
        self.rate
    }

    /// The period of [`rate`](Self::rate): the [`window`](Self::window),
    /// except for a policy built by [`Policy::gcra_with_burst`].
    pub const fn per(&self) -> Duration {
        Duration::from_micros(self.per_us)
    }

    /// The burst of a GCRA policy built with one distinct from its rate
    /// ([`Policy::gcra_with_burst`]), which is its limit; `None` otherwise.
    pub const fn burst(&self) -> Option<u32> {
        match self.algorithm {
            Algorithm::Gcra if self.rate != self.limit || self.per_us != self.window_us => {
                Some(self.limit)
            }
            _ => None,
        }
    }

    /// GCRA's emission interval: `window / limit` in whole microseconds,
    /// rounded down. Defined for every algorithm, used by GCRA.
    pub const fn emission_interval_micros(&self) -> u64 {
        self.emission_us
    }

    /// Whether a request of `cost` units could ever be admitted, as
    /// [`validate_cost`](Self::validate_cost) tells, without building its error:
    /// for a caller that builds its own out of line.
    #[inline]
    pub(crate) fn admits_cost(&self, cost: u32) -> bool {
        cost != 0 && cost <= self.limit
    }

    /// Checks that a request of `cost` units could ever be admitted: between
    /// 1 and the limit.
    pub fn validate_cost(&self, cost: u32) -> Result<(), ConfigError> {
        if !self.admits_cost(cost) {
            return Err(ConfigError::InvalidCost {
                cost,
                limit: self.limit,
            });
        }
        Ok(())
    }
}

/// `window` in microseconds, if it is one a policy accepts.
fn checked_window(window: Duration) -> Result<u64, ConfigError> {
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
    Ok(duration_to_micros(window))
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
        assert!(p.validate_cost(1).is_ok());
        assert!(p.validate_cost(5).is_ok());
        assert_eq!(
            p.validate_cost(0),
            Err(ConfigError::InvalidCost { cost: 0, limit: 5 })
        );
        assert!(p.validate_cost(6).is_err());
    }

    #[test]
    fn a_gcra_burst_is_separate_from_its_rate() {
        // 10 a second sustained, 20 at once: what every backend applies,
        // since each runs `algorithm::apply`'s arithmetic on (limit, window).
        let p = Policy::gcra_with_burst(10, Duration::from_secs(1), 20).unwrap();
        let t0 = 1_767_225_600_000_000;
        let mut state = None;
        for left in (0..20).rev() {
            let v = crate::algorithm::apply(&mut state, &p, 1, t0);
            assert!(v.allowed);
            assert_eq!(v.remaining, left);
        }
        let refused = crate::algorithm::apply(&mut state, &p, 1, t0);
        assert!(!refused.allowed);
        assert_eq!(refused.retry_after_us, 100_000, "one emission interval");
        // Then exactly 10 a second, never a second burst while it is spent.
        let mut admitted = 0;
        for step in 1..=100u64 {
            let now = t0 + step * 10_000;
            if crate::algorithm::apply(&mut state, &p, 1, now).allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10, "one second after the burst");
        // Idle for the refill time (the window), the whole burst is back.
        let later = t0 + 1_000_000 + p.window_micros();
        let burst = (0..25)
            .filter(|_| crate::algorithm::apply(&mut state, &p, 1, later).allowed)
            .count();
        assert_eq!(burst, 20);
    }
}
