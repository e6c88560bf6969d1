//! A circuit breaker per store, so that a dead store costs one timeout
//! rather than one per request.

use std::sync::Mutex;
use std::time::Duration;

use crate::error::ConfigError;

/// When a rule stops calling a failing store, and for how long.
///
/// After `failures` consecutive failures the breaker *opens*: calls are
/// answered at once (by the fallback or the failure policy) without touching
/// the store. After `cool_down`, measured on the limiter clock's monotonic
/// reading, one probe call goes through; its success closes the breaker,
/// its failure opens it for another `cool_down`, and a probe that ends
/// without a verdict (cancelled, or an invalid request) lets the next call
/// probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    failures: u32,
    cool_down: Duration,
}

impl BreakerConfig {
    /// Opens after `failures` consecutive failures, for `cool_down`.
    /// Refuses zero for either.
    pub fn new(failures: u32, cool_down: Duration) -> Result<Self, ConfigError> {
        if failures == 0 {
            return Err(ConfigError::Invalid(
                "a circuit breaker needs at least one failure to open".into(),
            ));
        }
        if cool_down.is_zero() {
            return Err(ConfigError::Invalid(
                "a circuit breaker's cool-down must be positive".into(),
            ));
        }
        Ok(BreakerConfig {
            failures,
            cool_down,
        })
    }

    /// Consecutive failures that open the breaker.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long the breaker stays open before a probe.
    pub fn cool_down(&self) -> Duration {
        self.cool_down
    }
}

impl Default for BreakerConfig {
    /// Three consecutive failures open it for five seconds.
    fn default() -> Self {
        BreakerConfig {
            failures: 3,
            cool_down: Duration::from_secs(5),
        }
    }
}

/// The breaker's state, as reported in [`RuleStats`](crate::RuleStats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go to the store.
    Closed,
    /// Calls skip the store until the cool-down ends.
    Open,
    /// One probe call is in flight; other calls skip the store.
    HalfOpen,
}

/// Times are microseconds on the limiter clock's monotonic reading
/// ([`Clock::monotonic`](crate::Clock::monotonic)), never its wall time: a
/// wall clock stepped backwards would otherwise lengthen a cool-down, and
/// one stepped forwards would cut it short.
#[derive(Debug)]
enum Inner {
    Closed {
        failures: u32,
    },
    Open {
        until: u64,
    },
    /// `until` is the deadline that let the probe through, restored if the
    /// probe ends without a verdict on the store's health.
    HalfOpen {
        until: u64,
    },
}

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Call the store.
    Call,
    /// Call the store as the one probe after a cool-down.
    Probe,
    /// Do not call the store.
    Skip,
}

/// What happened to a call, as far as the breaker is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    None,
    Opened,
    Closed,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The state is a few integers that are valid after any panic, so a
        // poisoned lock is simply taken over.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn config(&self) -> BreakerConfig {
        self.config
    }

    pub(crate) fn state(&self) -> BreakerState {
        match *self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// `mono` reads the clock's monotonic time in µs; a closed breaker (the
    /// common case) never needs it, so it is read only when open.
    pub(crate) fn permit(&self, mono: impl FnOnce() -> u64) -> Permit {
        let mut inner = self.lock();
        match *inner {
            Inner::Closed { .. } => Permit::Call,
            Inner::Open { until } if mono() >= until => {
                *inner = Inner::HalfOpen { until };
                Permit::Probe
            }
            Inner::Open { .. } | Inner::HalfOpen { .. } => Permit::Skip,
        }
    }

    pub(crate) fn success(&self) -> Transition {
        let mut inner = self.lock();
        let was_closed = matches!(*inner, Inner::Closed { .. });
        *inner = Inner::Closed { failures: 0 };
        if was_closed {
            Transition::None
        } else {
            Transition::Closed
        }
    }

    pub(crate) fn failure(&self, mono: u64) -> Transition {
        let mut inner = self.lock();
        let open = Inner::Open {
            until: mono.saturating_add(micros(self.config.cool_down)),
        };
        match *inner {
            Inner::Closed { failures } if failures + 1 < self.config.failures => {
                *inner = Inner::Closed {
                    failures: failures + 1,
                };
                Transition::None
            }
            Inner::Closed { .. } | Inner::HalfOpen { .. } => {
                *inner = open;
                Transition::Opened
            }
            // A call admitted before the breaker opened failed late: the
            // breaker is already open, keep its original deadline.
            Inner::Open { .. } => Transition::None,
        }
    }

    /// A call that ended without saying anything about the store's health:
    /// its future was dropped (the client went away), or the request itself
    /// was invalid. A probe gives its slot back, so the next call probes at
    /// once; counting it as a failure would let a client that disconnects at
    /// every cool-down deadline keep the breaker open (and a fail-open rule
    /// unlimited) for ever, and doing nothing would leave it half-open for
    /// ever.
    pub(crate) fn release(&self, permit: Permit) {
        if permit != Permit::Probe {
            return;
        }
        let mut inner = self.lock();
        if let Inner::HalfOpen { until } = *inner {
            *inner = Inner::Open { until };
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_cool_down() {
        let b = Breaker::new(BreakerConfig::new(2, Duration::from_secs(5)).unwrap());
        let t = S;
        assert_eq!(b.permit(|| t), Permit::Call);
        assert_eq!(b.failure(t), Transition::None);
        assert_eq!(b.success(), Transition::None);
        assert_eq!(b.failure(t), Transition::None);
        assert_eq!(b.failure(t), Transition::Opened);
        assert_eq!(b.permit(|| t), Permit::Skip);
        assert_eq!(b.permit(|| t + 5 * S - 1), Permit::Skip);
        let later = t + 5 * S;
        assert_eq!(b.permit(|| later), Permit::Probe);
        assert_eq!(b.permit(|| later), Permit::Skip, "only one probe at a time");
        assert_eq!(b.failure(later), Transition::Opened);
        assert_eq!(b.state(), BreakerState::Open);
        let again = later + 5 * S;
        assert_eq!(b.permit(|| again), Permit::Probe);
        assert_eq!(b.success(), Transition::Closed);
        assert_eq!(b.permit(|| again), Permit::Call);
    }

    #[test]
    fn a_released_probe_lets_the_next_call_probe_at_once() {
        let b = Breaker::new(BreakerConfig::new(1, Duration::from_secs(1)).unwrap());
        b.failure(0);
        assert_eq!(b.permit(|| S), Permit::Probe);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.release(Permit::Probe);
        assert_eq!(b.state(), BreakerState::Open);
        // Not a new cool-down: the expired deadline stands.
        assert_eq!(b.permit(|| S), Permit::Probe);
        assert_eq!(b.success(), Transition::Closed);
    }

    #[test]
    fn releasing_an_ordinary_call_changes_nothing() {
        let b = Breaker::new(BreakerConfig::new(1, Duration::from_secs(1)).unwrap());
        b.release(Permit::Call);
        assert_eq!(b.state(), BreakerState::Closed);
        b.failure(0);
        assert_eq!(b.permit(|| 0), Permit::Skip);
        b.release(Permit::Skip);
        assert_eq!(b.permit(|| 0), Permit::Skip, "still cooling down");
    }

    #[test]
    fn refuses_zero_settings() {
        assert!(BreakerConfig::new(0, Duration::from_secs(1)).is_err());
        assert!(BreakerConfig::new(1, Duration::ZERO).is_err());
    }
}
