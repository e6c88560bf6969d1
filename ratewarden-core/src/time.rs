//! Time as the limiter sees it: microsecond timestamps and the clocks that
//! produce them.
//!
//! Time comes from above: the [`Limiter`](crate::Limiter) owns a [`Clock`] and
//! passes `now` into every [`Store`](crate::Store) call. Tests use a
//! [`ManualClock`], so a one-hour window is exercised in microseconds of real
//! time and the same scenario moves time identically on every backend.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A point in time: whole microseconds since the Unix epoch.
///
/// Microseconds keep every value the limiter computes below 2^53, so a Lua
/// script (whose numbers are doubles) and a SQL `bigint` represent them
/// exactly; see [`Policy`](crate::Policy) for the bounds that guarantee it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The Unix epoch.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// A timestamp `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Timestamp(micros)
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// This timestamp moved forward by `d`, saturating at the largest value.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_to_micros(d)))
    }

    /// This timestamp moved backward by `d`, saturating at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_to_micros(d)))
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }

    /// The current system time.
    pub fn now_system() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(duration_to_micros(since))
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timestamp({}µs)", self.0)
    }
}

/// Whole microseconds in `d`, saturating at `u64::MAX`.
pub(crate) fn duration_to_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of the current time.
///
/// Implementations must be cheap: the limiter reads the clock once per
/// decision.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;

    /// A reading that never goes backwards, for measuring how long
    /// something lasted (circuit-breaker cool-downs): elapsed time since an
    /// arbitrary, fixed origin. Wall time ([`now`](Clock::now)) can be
    /// stepped backwards by an operator or NTP and must not lengthen a
    /// cool-down.
    ///
    /// The default reads [`Instant`] against a process-wide origin, which is
    /// right for any clock that follows real time. A clock that drives time
    /// by hand (as [`ManualClock`] does) overrides it so that tests move
    /// both readings together.
    fn monotonic(&self) -> Duration {
        process_monotonic()
    }

    /// Waits for `d` to pass on this clock
    /// ([`Limiter::until_ready`](crate::Limiter::until_ready) pauses
    /// with it). The default sleeps on Tokio's timer, right for any clock
    /// that follows real time. A clock that drives time by hand overrides
    /// it: [`ManualClock`] moves itself forward by `d` and returns at once.
    ///
    /// # Migration
    ///
    /// Added with a default: an existing clock keeps compiling and sleeps
    /// in real time.
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// Elapsed real time since the first call in this process.
fn process_monotonic() -> Duration {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed()
}

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now_system()
    }
}

/// A clock that moves only when told to. Clones share one time.
///
/// ```
/// use ratewarden_core::{Clock, ManualClock};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let other = clock.clone();
/// let start = clock.now();
/// other.advance(Duration::from_secs(3600));
/// assert_eq!(clock.now().saturating_duration_since(start), Duration::from_secs(3600));
/// ```
/// Its [`monotonic`](Clock::monotonic) reading advances with every forward
/// move and stays put when the clock is moved backwards, as a host's
/// monotonic clock does when its wall clock is stepped back.
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
    monotonic: Arc<AtomicU64>,
}

impl ManualClock {
    /// The time a new manual clock shows: 2026-01-01T00:00:00Z.
    ///
    /// A fixed, realistic start keeps runs reproducible and makes a backend
    /// that confuses "zero" with "no value" visible. It is a whole number of
    /// days since the epoch, so every window of whole seconds up to a day
    /// starts exactly here.
    pub const DEFAULT_START: Timestamp = Timestamp::from_micros(1_767_225_600_000_000);

    /// A manual clock at [`ManualClock::DEFAULT_START`].
    pub fn new() -> Self {
        Self::starting_at(Self::DEFAULT_START)
    }

    /// A manual clock at `start`.
    pub fn starting_at(start: Timestamp) -> Self {
        ManualClock {
            micros: Arc::new(AtomicU64::new(start.as_micros())),
            monotonic: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let d = duration_to_micros(d);
        self.shift(|t| t.saturating_add(d));
        self.monotonic.fetch_add(d, Ordering::SeqCst);
    }

    /// Moves the clock backward by `d`, as a host with a skewed clock would.
    pub fn rewind(&self, d: Duration) {
        let d = duration_to_micros(d);
        self.shift(|t| t.saturating_sub(d));
    }

    /// Moves the wall-clock time by `f`, in one atomic step.
    fn shift(&self, f: impl Fn(u64) -> u64) {
        // fetch_update never fails with a closure that always returns Some.
        let _ = self
            .micros
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(f(t)));
    }

    /// Sets the clock to `t`, forward or backward.
    pub fn set(&self, t: Timestamp) {
        let before = self.micros.swap(t.as_micros(), Ordering::SeqCst);
        self.monotonic
            .fetch_add(t.as_micros().saturating_sub(before), Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.micros.load(Ordering::SeqCst))
    }

    fn monotonic(&self) -> Duration {
        Duration::from_micros(self.monotonic.load(Ordering::SeqCst))
    }

    /// Moves the clock forward by `d`, for everyone sharing it, and
    /// returns at once: a waiter's pause takes no real time.
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.advance(d);
        Box::pin(std::future::ready(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_ways_and_saturates() {
        let c = ManualClock::starting_at(Timestamp::from_micros(10));
        c.rewind(Duration::from_secs(1));
        assert_eq!(c.now(), Timestamp::EPOCH);
        c.advance(Duration::from_micros(5));
        assert_eq!(c.now().as_micros(), 5);
        c.set(Timestamp::from_micros(u64::MAX - 1));
        c.advance(Duration::from_secs(10));
        assert_eq!(c.now().as_micros(), u64::MAX);
    }

    #[test]
    fn manual_monotonic_reading_only_moves_forward() {
        let c = ManualClock::new();
        let start = c.monotonic();
        c.advance(Duration::from_secs(5));
        c.rewind(Duration::from_secs(60));
        assert_eq!(c.monotonic() - start, Duration::from_secs(5));
        // Back at the start is a forward move of 55 s from where it was.
        c.set(ManualClock::DEFAULT_START);
        assert_eq!(c.monotonic() - start, Duration::from_secs(60));
        let system = SystemClock;
        let a = system.monotonic();
        assert!(system.monotonic() >= a);
    }

    #[test]
    fn default_start_is_day_aligned() {
        assert_eq!(ManualClock::DEFAULT_START.as_micros() % 86_400_000_000, 0);
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now().as_micros() > 1_577_836_800_000_000);
    }
}
