//! Waiting to be admitted, for a caller that must stay under someone
//! else's limit (a third-party API's quota, shared by a fleet through a
//! shared store) instead of refusing its own clients.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::sync::futures::Notified;

use super::{Admission, Limiter};
use crate::decision::Decision;
use crate::error::ConfigError;

/// The shortest pause between two attempts, whatever a refusal says,
/// unless the deadline comes sooner: a refusal with a retry time of zero
/// must not make a waiter spin.
pub const MIN_RETRY: Duration = Duration::from_millis(10);

/// The most a pause is lengthened by its jitter.
const MAX_JITTER: Duration = Duration::from_secs(1);

/// Why [`Limiter::until_ready`] or [`Limiter::acquire`] gave up (and so an
/// outbound layer's call that was not made).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// No chance of being admitted remains before the deadline: `last`,
    /// the last refusal, names a retry time past it, or came at the
    /// deadline itself. The caller waited `waited` of `max_wait`.
    #[error(
        "not admitted within {max_wait:?}: waited {waited:?}, and the last refusal said to retry in {:?}",
        last.retry_after
    )]
    Deadline {
        /// The longest the caller would wait.
        max_wait: Duration,
        /// How long it waited, on the limiter's clock.
        waited: Duration,
        /// The last refusal.
        last: Box<Decision>,
    },
    /// The request can never be admitted, so no wait would help: a cost
    /// of zero or above a rule's limit
    /// ([`Limiter::check_cost`](crate::Limiter::check_cost)).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

impl Limiter {
    /// Waits until a request for `key` is admitted, or gives up with
    /// [`WaitError::Deadline`]: the permit-before-calling pattern of an
    /// outbound quota (an API that allows 100 calls a second to the whole
    /// fleet).
    ///
    /// A waiter gives up only when no chance remains before its deadline
    /// (`max_wait` after the call); its jitter never makes it give up early
    /// (a pause is cut short at the deadline) and never makes it return
    /// later than its deadline plus one store round trip.
    ///
    /// A refusal whose [`retry_after`](Decision::retry_after) ends at or
    /// before the deadline is a chance: the waiter pauses for the retry
    /// time (at least [`MIN_RETRY`]) plus a jitter of up to a quarter of it
    /// (at most one second), drawn per pause so that waiters refused
    /// together do not all come back at the same instant, and the pause
    /// ends at the deadline if it would end later. A give-back of the key
    /// in this process (a refund, a released permit) ends one waiter's
    /// pause at once, and a reset (here, or heard from the fleet) every
    /// waiter's: the refusal they paused on no longer stands. A refusal
    /// whose retry time ends after the deadline, or one made at the
    /// deadline, ends the wait at once, with that refusal.
    ///
    /// Pauses are [`Clock::sleep`](crate::Clock::sleep)s on the limiter's
    /// clock: a [`ManualClock`](crate::ManualClock) moves itself forward
    /// instead of sleeping, so a test of waiting callers, one or many
    /// together, runs in no real time. A waiter dropped while it pauses has
    /// counted nothing; one dropped while a store decides may have been
    /// counted, as any cancelled [`check`](Self::check) may.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Clock, Limiter, ManualClock, Policy, Rule, WaitError};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn ratewarden_core::Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::builder()
    ///     .clock(clock.clone())
    ///     .rule(Rule::new("partner-api", store, Policy::gcra(1, Duration::from_secs(1))?)?)
    ///     .build()?;
    /// let start = clock.now();
    /// limiter.until_ready(b"partner", Duration::from_secs(5)).await?; // at once
    /// // The next chance is a second later, within a deadline of a second:
    /// // taken, at the deadline, whatever the jitter.
    /// limiter.until_ready(b"partner", Duration::from_secs(1)).await?;
    /// assert_eq!(clock.now().saturating_duration_since(start), Duration::from_secs(1));
    /// // Not within 100 ms: an error at once, with the refusal.
    /// let err = limiter.until_ready(b"partner", Duration::from_millis(100)).await.unwrap_err();
    /// assert!(matches!(err, WaitError::Deadline { .. }));
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn until_ready(&self, key: &[u8], max_wait: Duration) -> Result<Decision, WaitError> {
        self.until_ready_cost(key, 1, max_wait).await
    }

    /// [`until_ready`](Self::until_ready) for a request that weighs
    /// `cost` units ([`check_cost`](Self::check_cost)); a cost no rule
    /// could ever admit is [`WaitError::Invalid`] at once.
    pub async fn until_ready_cost(
        &self,
        key: &[u8],
        cost: u32,
        max_wait: Duration,
    ) -> Result<Decision, WaitError> {
        self.waiting(key, max_wait, || self.check_cost(key, cost), |d| d)
            .await
    }

    /// Waits as [`until_ready`](Self::until_ready) does (giving up only
    /// when no chance remains before the deadline), and returns the
    /// admission as a [`Permit`] for a call not yet made: mark it
    /// [`used`](Permit::used) when the call goes out. A permit dropped
    /// unused (its holder cancelled, a request that failed to build) gives
    /// its units back, so a fleet's shared quota is not spent on calls that
    /// were never made.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Clock, Limiter, ManualClock, Policy, Rule};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn ratewarden_core::Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let clock = ManualClock::new();
    /// let limiter = Limiter::builder()
    ///     .clock(clock.clone())
    ///     .rule(Rule::new("partner-api", store, Policy::sliding_log(1, Duration::from_secs(1))?)?)
    ///     .build()?;
    /// let start = clock.now();
    /// let permit = limiter.acquire(b"partner", Duration::from_secs(5)).await?;
    /// permit.release().await; // the call was not made after all
    /// let permit = limiter.acquire(b"partner", Duration::from_secs(5)).await?;
    /// assert_eq!(clock.now(), start); // at once: the unit had come back
    /// permit.used(); // the call goes out; the unit stays spent
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub async fn acquire(&self, key: &[u8], max_wait: Duration) -> Result<Permit, WaitError> {
        self.acquire_cost(key, 1, max_wait).await
    }

    /// [`acquire`](Self::acquire) for a request that costs `cost` units.
    pub async fn acquire_cost(
        &self,
        key: &[u8],
        cost: u32,
        max_wait: Duration,
    ) -> Result<Permit, WaitError> {
        let admission = self
            .waiting(
                key,
                max_wait,
                || self.check_admission(key, cost),
                Admission::decision,
            )
            .await?;
        Ok(Permit {
            admission: Some(admission),
        })
    }

    /// Attempts until one is admitted, pausing after each refusal until its
    /// retry time, or until a give-back or reset of `key` in this process
    /// (or one heard from the fleet) makes the refusal stale.
    async fn waiting<T, Fut>(
        &self,
        key: &[u8],
        max_wait: Duration,
        mut attempt: impl FnMut() -> Fut,
        decision: impl Fn(&T) -> &Decision,
    ) -> Result<T, WaitError>
    where
        Fut: Future<Output = Result<T, ConfigError>>,
    {
        let clock = self.clock().clone();
        let started = clock.monotonic();
        // Registered once, before the stores are first asked, and held for
        // the whole wait: a give-back or reset after any of their answers
        // ends the pause that answer sets.
        let watches: SmallVec<[_; 2]> = self.rules().iter().map(|r| r.watch(key)).collect();
        loop {
            // Enabled before each attempt, so that a notice between the
            // answer and the pause is not missed.
            let mut stale: SmallVec<[Pin<Box<Notified<'_>>>; 2]> = watches
                .iter()
                .map(|w| {
                    let mut notified = Box::pin(w.notify().notified());
                    notified.as_mut().enable();
                    notified
                })
                .collect();
            let outcome = attempt().await?;
            let refusal = decision(&outcome);
            if refusal.allowed {
                return Ok(outcome);
            }
            let waited = clock.monotonic().saturating_sub(started);
            let left = max_wait.saturating_sub(waited);
            // A refusal with no time left (one at the deadline) is final
            // even when it names no retry time, or the waiter would spin.
            if refusal.retry_after > left || left.is_zero() {
                return Err(WaitError::Deadline {
                    max_wait,
                    waited,
                    last: Box::new(refusal.clone()),
                });
            }
            // The chance is within the deadline: the jitter may delay the
            // next try up to the deadline, never past it.
            let mut pause = clock.sleep(pause_after(refusal).min(left));
            std::future::poll_fn(|cx| {
                // The notice first: a manual clock's pause, once polled
                // again, moves the clock to its end.
                if stale.iter_mut().any(|n| n.as_mut().poll(cx).is_ready())
                    || pause.as_mut().poll(cx).is_ready()
                {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
        }
    }
}

/// An admitted request whose call has not been made yet, from
/// [`Limiter::acquire`]. [`used`](Self::used) keeps its units spent;
/// dropped unused, it gives them back ([`Admission::refund`]) on a task of
/// the Tokio runtime it is dropped in, or stays counted (the strict side)
/// when dropped outside any runtime. [`release`](Self::release) gives them
/// back and waits until the stores have them.
#[must_use = "a permit dropped without `used` gives its units back"]
#[derive(Debug)]
pub struct Permit {
    /// `None` once used or released.
    admission: Option<Admission>,
}

impl Permit {
    /// The admission's decision.
    pub fn decision(&self) -> &Decision {
        // Only `used` and `release` take it, and both consume the permit.
        self.admission
            .as_ref()
            .map(Admission::decision)
            .expect("a permit holds its admission until consumed")
    }

    /// The call is being made: its units stay spent.
    pub fn used(mut self) -> Decision {
        self.admission
            .take()
            .map(|a| a.decision)
            .expect("a permit holds its admission until consumed")
    }

    /// Gives the units back now, waiting for every store that counted them.
    pub async fn release(mut self) {
        if let Some(admission) = self.admission.take() {
            admission.refund().await;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(admission) = self.admission.take() else {
            return;
        };
        // Drop cannot wait for a store, so the refund runs on its own task;
        // outside a runtime there is nothing to run it, and the units stay
        // counted: stricter, never looser.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // Now, not when the task first runs: a request right after the
            // drop must not be answered by a refusal cached before it.
            admission.forget_refusals();
            runtime.spawn(admission.refund());
        }
    }
}

/// The refusal's retry time (at least [`MIN_RETRY`]) plus its jitter.
fn pause_after(refusal: &Decision) -> Duration {
    let base = refusal.retry_after.max(MIN_RETRY);
    let spread = (base / 4).min(MAX_JITTER);
    base + spread.mul_f64(unit_interval())
}

/// A number in [0, 1), different for each call in the process: SplitMix64
/// over a counter. Jitter needs values that differ between waiters, not
/// secret ones, so a counter is enough and no random source is asked.
fn unit_interval() -> f64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0x853C_49E6_748F_EA9B);
    let mut z = COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    // The top 53 bits, as a fraction of 2^53: exact in an f64.
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_a_quarter_and_a_second_and_varies() {
        let policy = crate::Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
        let refusal = |retry: Duration| {
            let mut d = Decision::degraded(crate::FailurePolicy::Closed, &policy, "test");
            d.retry_after = retry;
            d
        };
        for retry in [
            Duration::ZERO,
            Duration::from_millis(400),
            Duration::from_secs(60),
        ] {
            let base = retry.max(MIN_RETRY);
            let pauses: Vec<Duration> = (0..200).map(|_| pause_after(&refusal(retry))).collect();
            for p in &pauses {
                assert!(
                    *p >= base && *p <= base + (base / 4).min(MAX_JITTER),
                    "{retry:?}: {p:?}"
                );
            }
            let mut distinct = pauses.clone();
            distinct.sort();
            distinct.dedup();
            assert!(
                distinct.len() > 150,
                "{retry:?}: {} distinct pauses",
                distinct.len()
            );
        }
    }
}
