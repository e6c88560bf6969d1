//! A circuit breaker per store, so that a dead store costs one timeout
//! rather than one per request.

use std::sync::Mutex;
use std::time::Duration;

use crate::error::ConfigError;
use crate::time::Timestamp;

/// When a rule stops calling a failing store, and for how long.
///
/// After `failures` consecutive failures the breaker *opens*: calls are
/// answered at once (by the fallback or the failure policy) without touching
/// the store. After `cool_down`, measured on the limiter's clock, one probe
/// call goes through; its success closes the breaker, its failure opens it
/// for another `cool_down`.
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

#[derive(Debug)]
enum Inner {
    Closed { failures: u32 },
    Open { until: Timestamp },
    HalfOpen,
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

    pub(crate) fn state(&self) -> BreakerState {
        match *self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen => BreakerState::HalfOpen,
        }
    }

    pub(crate) fn permit(&self, now: Timestamp) -> Permit {
        let mut inner = self.lock();
        match *inner {
            Inner::Closed { .. } => Permit::Call,
            Inner::Open { until } if now >= until => {
                *inner = Inner::HalfOpen;
                Permit::Probe
            }
            Inner::Open { .. } | Inner::HalfOpen => Permit::Skip,
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

    pub(crate) fn failure(&self, now: Timestamp) -> Transition {
        let mut inner = self.lock();
        let open = Inner::Open {
            until: now.saturating_add(self.config.cool_down),
        };
        match *inner {
            Inner::Closed { failures } if failures + 1 < self.config.failures => {
                *inner = Inner::Closed {
                    failures: failures + 1,
                };
                Transition::None
            }
            Inner::Closed { .. } | Inner::HalfOpen => {
                *inner = open;
                Transition::Opened
            }
            // A call admitted before the breaker opened failed late: the
            // breaker is already open, keep its original deadline.
            Inner::Open { .. } => Transition::None,
        }
    }

    /// A probe that never finished (its future was dropped) counts as a
    /// failure, or the breaker would stay half-open for ever.
    pub(crate) fn abandon_probe(&self, now: Timestamp) {
        let mut inner = self.lock();
        if matches!(*inner, Inner::HalfOpen) {
            *inner = Inner::Open {
                until: now.saturating_add(self.config.cool_down),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_cool_down() {
        let b = Breaker::new(BreakerConfig::new(2, Duration::from_secs(5)).unwrap());
        let t = Timestamp::from_micros(1_000_000);
        assert_eq!(b.permit(t), Permit::Call);
        assert_eq!(b.failure(t), Transition::None);
        assert_eq!(b.success(), Transition::None);
        assert_eq!(b.failure(t), Transition::None);
        assert_eq!(b.failure(t), Transition::Opened);
        assert_eq!(b.permit(t), Permit::Skip);
        let later = t.saturating_add(Duration::from_secs(5));
        assert_eq!(b.permit(later), Permit::Probe);
        assert_eq!(b.permit(later), Permit::Skip, "only one probe at a time");
        assert_eq!(b.failure(later), Transition::Opened);
        assert_eq!(b.state(), BreakerState::Open);
        let again = later.saturating_add(Duration::from_secs(5));
        assert_eq!(b.permit(again), Permit::Probe);
        assert_eq!(b.success(), Transition::Closed);
        assert_eq!(b.permit(again), Permit::Call);
    }

    #[test]
    fn abandoned_probe_reopens() {
        let b = Breaker::new(BreakerConfig::new(1, Duration::from_secs(1)).unwrap());
        let t = Timestamp::from_micros(0);
        b.failure(t);
        let later = t.saturating_add(Duration::from_secs(1));
        assert_eq!(b.permit(later), Permit::Probe);
        b.abandon_probe(later);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn refuses_zero_settings() {
        assert!(BreakerConfig::new(0, Duration::from_secs(1)).is_err());
        assert!(BreakerConfig::new(1, Duration::ZERO).is_err());
    }
}
