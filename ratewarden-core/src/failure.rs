//! What a rule does when its store fails: the failure policy that answers
//! instead of the store, and a circuit breaker per store, so that a dead
//! store costs one timeout rather than one per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::ConfigError;
use crate::time::duration_to_micros as micros;

/// What a rule answers when no store answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Admit the request: availability over enforcement. Right for abuse
    /// control in front of a page that must keep working.
    #[default]
    Open,
    /// Refuse the request: enforcement over availability. Right where
    /// over-admission costs money.
    Closed,
}

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

/// The breaker's state in one atomic word, so that the common case — a
/// closed breaker in front of a healthy store — costs one load per call and
/// no write, where a mutex would cost two lock round trips on a cache line
/// every thread shares.
///
/// The top two bits are the state, the rest its value: the failure count
/// when closed, the deadline when open or half-open. Times are microseconds
/// on the limiter clock's monotonic reading
/// ([`Clock::monotonic`](crate::Clock::monotonic)), never its wall time: a
/// wall clock stepped backwards would otherwise lengthen a cool-down, and one
/// stepped forwards would cut it short. A half-open state keeps the deadline
/// that let its probe through, restored if the probe ends without a verdict
/// on the store's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inner {
    Closed { failures: u64 },
    Open { until: u64 },
    HalfOpen { until: u64 },
}

const TAG_SHIFT: u32 = 62;
const VALUE_MASK: u64 = (1 << TAG_SHIFT) - 1;
const CLOSED_CLEAN: u64 = 0;

impl Inner {
    fn encode(self) -> u64 {
        // Deadlines saturate at 2^62 µs (146,000 years of uptime).
        match self {
            Inner::Closed { failures } => failures.min(VALUE_MASK),
            Inner::Open { until } => (1 << TAG_SHIFT) | until.min(VALUE_MASK),
            Inner::HalfOpen { until } => (2 << TAG_SHIFT) | until.min(VALUE_MASK),
        }
    }

    fn decode(word: u64) -> Inner {
        let value = word & VALUE_MASK;
        match word >> TAG_SHIFT {
            0 => Inner::Closed { failures: value },
            1 => Inner::Open { until: value },
            _ => Inner::HalfOpen { until: value },
        }
    }
}

/// What the breaker lets a call do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
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
    word: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Breaker {
            config,
            word: AtomicU64::new(CLOSED_CLEAN),
        }
    }

    fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// Moves from `seen` to `next` unless another call moved it first.
    fn replace(&self, seen: u64, next: Inner) -> bool {
        self.word
            .compare_exchange(seen, next.encode(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub(crate) fn config(&self) -> BreakerConfig {
        self.config
    }

    pub(crate) fn state(&self) -> BreakerState {
        match Inner::decode(self.load()) {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether [`attempt`](Self::attempt) would now answer `Skip` without
    /// moving the breaker: open with its cool-down still running, or
    /// half-open with the probe out. Changes nothing, so a caller that goes
    /// on to ask for a attempt after a `false` takes nothing from the probe.
    pub(crate) fn skips(&self, mono: impl FnOnce() -> u64) -> bool {
        match Inner::decode(self.load()) {
            Inner::Closed { .. } => false,
            Inner::Open { until } => mono() < until,
            Inner::HalfOpen { .. } => true,
        }
    }

    /// `mono` reads the clock's monotonic time in µs; a closed breaker (the
    /// common case) never needs it, so it is read only when open.
    pub(crate) fn attempt(&self, mono: impl FnOnce() -> u64) -> Attempt {
        let seen = self.load();
        match Inner::decode(seen) {
            Inner::Closed { .. } => Attempt::Call,
            Inner::Open { until } if mono() >= until => {
                // Of the callers that see the deadline pass, the one that
                // moves the word is the probe.
                if self.replace(seen, Inner::HalfOpen { until }) {
                    Attempt::Probe
                } else {
                    Attempt::Skip
                }
            }
            Inner::Open { .. } | Inner::HalfOpen { .. } => Attempt::Skip,
        }
    }

    pub(crate) fn success(&self) -> Transition {
        if self.load() == CLOSED_CLEAN {
            return Transition::None;
        }
        match Inner::decode(self.word.swap(CLOSED_CLEAN, Ordering::AcqRel)) {
            Inner::Closed { .. } => Transition::None,
            _ => Transition::Closed,
        }
    }

    pub(crate) fn failure(&self, mono: u64) -> Transition {
        let open = Inner::Open {
            until: mono.saturating_add(micros(self.config.cool_down)),
        };
        loop {
            let seen = self.load();
            let (next, transition) = match Inner::decode(seen) {
                Inner::Closed { failures } if failures + 1 < u64::from(self.config.failures) => (
                    Inner::Closed {
                        failures: failures + 1,
                    },
                    Transition::None,
                ),
                Inner::Closed { .. } | Inner::HalfOpen { .. } => (open, Transition::Opened),
                // A call admitted before the breaker opened failed late: the
                // breaker is already open, keep its original deadline.
                Inner::Open { .. } => return Transition::None,
            };
            if self.replace(seen, next) {
                return transition;
            }
        }
    }

    /// A call that ended without saying anything about the store's health:
    /// its future was dropped (the client went away), or the request itself
    /// was invalid. A probe gives its slot back, so the next call probes at
    /// once; counting it as a failure would let a client that disconnects at
    /// every cool-down deadline keep the breaker open (and a fail-open rule
    /// unlimited) for ever, and doing nothing would leave it half-open for
    /// ever.
    pub(crate) fn release(&self, attempt: Attempt) {
        if attempt != Attempt::Probe {
            return;
        }
        let seen = self.load();
        if let Inner::HalfOpen { until } = Inner::decode(seen) {
            // Lost only to a call that already moved the breaker on.
            let _ = self.replace(seen, Inner::Open { until });
        }
    }
}

/// Undoes a breaker attempt whose call never finished: a dropped future
/// gives the probe slot back instead of leaving the breaker half-open.
pub(crate) struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    attempt: Option<Attempt>,
}

impl<'a> ProbeGuard<'a> {
    pub(crate) fn new(breaker: &'a Breaker, attempt: Attempt) -> Self {
        ProbeGuard {
            breaker,
            attempt: Some(attempt),
        }
    }

    pub(crate) fn disarm(mut self) {
        self.attempt = None;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(attempt) = self.attempt {
            self.breaker.release(attempt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn opens_after_consecutive_failures_and_probes_after_cool_down() {
        let b = Breaker::new(BreakerConfig::new(2, Duration::from_secs(5)).unwrap());
        let t = S;
        assert_eq!(b.attempt(|| t), Attempt::Call);
        assert_eq!(b.failure(t), Transition::None);
        assert_eq!(b.success(), Transition::None);
        assert_eq!(b.failure(t), Transition::None);
        assert_eq!(b.failure(t), Transition::Opened);
        assert_eq!(b.attempt(|| t), Attempt::Skip);
        assert_eq!(b.attempt(|| t + 5 * S - 1), Attempt::Skip);
        let later = t + 5 * S;
        assert_eq!(b.attempt(|| later), Attempt::Probe);
        assert_eq!(
            b.attempt(|| later),
            Attempt::Skip,
            "only one probe at a time"
        );
        assert_eq!(b.failure(later), Transition::Opened);
        assert_eq!(b.state(), BreakerState::Open);
        let again = later + 5 * S;
        assert_eq!(b.attempt(|| again), Attempt::Probe);
        assert_eq!(b.success(), Transition::Closed);
        assert_eq!(b.attempt(|| again), Attempt::Call);
    }

    #[test]
    fn a_released_probe_lets_the_next_call_probe_at_once() {
        let b = Breaker::new(BreakerConfig::new(1, Duration::from_secs(1)).unwrap());
        b.failure(0);
        assert_eq!(b.attempt(|| S), Attempt::Probe);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.release(Attempt::Probe);
        assert_eq!(b.state(), BreakerState::Open);
        // Not a new cool-down: the expired deadline stands.
        assert_eq!(b.attempt(|| S), Attempt::Probe);
        assert_eq!(b.success(), Transition::Closed);
    }

    #[test]
    fn releasing_an_ordinary_call_changes_nothing() {
        let b = Breaker::new(BreakerConfig::new(1, Duration::from_secs(1)).unwrap());
        b.release(Attempt::Call);
        assert_eq!(b.state(), BreakerState::Closed);
        b.failure(0);
        assert_eq!(b.attempt(|| 0), Attempt::Skip);
        b.release(Attempt::Skip);
        assert_eq!(b.attempt(|| 0), Attempt::Skip, "still cooling down");
    }

    #[test]
    fn every_state_survives_its_encoding() {
        for inner in [
            Inner::Closed { failures: 0 },
            Inner::Closed { failures: 7 },
            Inner::Open { until: 0 },
            Inner::Open { until: 86_400 * S },
            Inner::HalfOpen { until: 5 * S },
        ] {
            assert_eq!(Inner::decode(inner.encode()), inner);
        }
        // A deadline beyond the encoding saturates instead of changing state.
        assert_eq!(
            Inner::decode(Inner::Open { until: u64::MAX }.encode()),
            Inner::Open { until: VALUE_MASK }
        );
    }

    #[test]
    fn of_many_threads_past_the_deadline_exactly_one_probes() {
        let b = std::sync::Arc::new(Breaker::new(
            BreakerConfig::new(1, Duration::from_secs(1)).unwrap(),
        ));
        b.failure(0);
        let probes: usize = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    (0..1_000)
                        .filter(|_| b.attempt(|| 2 * S) == Attempt::Probe)
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(probes, 1);
        assert_eq!(b.state(), BreakerState::HalfOpen);
    }

    #[test]
    fn refuses_zero_settings() {
        assert!(BreakerConfig::new(0, Duration::from_secs(1)).is_err());
        assert!(BreakerConfig::new(1, Duration::ZERO).is_err());
    }
}
