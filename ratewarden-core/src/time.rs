//! Time as the limiter sees it: microsecond timestamps and the clocks that
//! produce them.
//!
//! Time comes from above: the [`Limiter`](crate::Limiter) owns a [`Clock`] and
//! passes `now` into every [`Store`](crate::Store) call. Tests use a
//! [`ManualClock`], so a one-hour window is exercised in microseconds of real
//! time and the same scenario moves time identically on every backend.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
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
    /// it: [`ManualClock`] moves itself forward to the earliest end of its
    /// pauses, taking no real time.
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
///
/// Its [`sleep`](Clock::sleep) takes no real time: the pause that ends
/// first moves the clock to its end once every other task has had a turn
/// without starting a pause, and the pauses sharing the clock end in order
/// of their ends, each at its own. Tasks pausing together on one clock
/// (waiters on a current-thread runtime) therefore see the times they would
/// see on a real clock, not the sum of their pauses. A task waiting on
/// something else (a socket) does not hold time still; a pause that is
/// neither awaited nor dropped does.
#[derive(Debug, Clone)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
    monotonic: Arc<AtomicU64>,
    pauses: Arc<Mutex<Pauses>>,
}

/// The pauses under way on a [`ManualClock`] and its clones.
#[derive(Debug, Default)]
struct Pauses {
    /// Counts pauses begun: the first pause to end moves time only after a
    /// turn of the other tasks in which no pause began, since one that did
    /// may end sooner.
    begun: u64,
    /// Each pause's waker, by its end on the monotonic reading (µs) and the
    /// order it began in.
    waiting: BTreeMap<(u64, u64), Waker>,
}

impl Pauses {
    /// The waker of the pause that ends first, to wake once its lock is
    /// released.
    fn first(&self) -> Option<Waker> {
        self.waiting.values().next().cloned()
    }
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
            pauses: Arc::default(),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let d = duration_to_micros(d);
        self.shift(|t| t.saturating_add(d));
        self.monotonic.fetch_add(d, Ordering::SeqCst);
        self.end_pauses();
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
        self.end_pauses();
    }

    /// The monotonic reading in µs.
    fn monotonic_micros(&self) -> u64 {
        self.monotonic.load(Ordering::SeqCst)
    }

    /// Moves both readings forward to `end` on the monotonic one, unless
    /// the clock is already there.
    fn advance_to(&self, end: u64) {
        let before = self.monotonic.fetch_max(end, Ordering::SeqCst);
        if let Some(d) = end.checked_sub(before).filter(|d| *d > 0) {
            self.shift(|t| t.saturating_add(d));
        }
    }

    fn pauses(&self) -> MutexGuard<'_, Pauses> {
        // The lock guards plain data that every step leaves whole.
        self.pauses.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the pauses a move of the clock by hand has ended.
    fn end_pauses(&self) {
        let now = self.monotonic_micros();
        let ended: Vec<Waker> = self
            .pauses()
            .waiting
            .range(..(now.saturating_add(1), 0))
            .map(|(_, w)| w.clone())
            .collect();
        ended.into_iter().for_each(Waker::wake);
    }
}

/// A pause on a [`ManualClock`] until `end` on its monotonic reading.
struct ManualSleep {
    clock: ManualClock,
    end: u64,
    /// Its place among the clock's pauses, once it waits.
    key: Option<(u64, u64)>,
    /// How many pauses had begun when it last gave the other tasks a turn
    /// as the first to end.
    turn: Option<u64>,
}

impl ManualSleep {
    /// Leaves the clock's pauses; the one that now ends first is woken, as
    /// it may be the one to move time.
    fn leave(&mut self, pauses: &mut Pauses) -> Option<Waker> {
        let key = self.key.take()?;
        let was_first = pauses.waiting.keys().next() == Some(&key);
        pauses.waiting.remove(&key);
        was_first.then(|| pauses.first()).flatten()
    }
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let clock = this.clock.clone();
        let mut pauses = clock.pauses();
        let next = if clock.monotonic_micros() >= this.end {
            this.leave(&mut pauses)
        } else {
            let key = *this.key.get_or_insert_with(|| {
                pauses.begun += 1;
                (this.end, pauses.begun)
            });
            pauses.waiting.insert(key, cx.waker().clone());
            if pauses.waiting.keys().next() != Some(&key) {
                return Poll::Pending;
            }
            if this.turn != Some(pauses.begun) {
                // First to end, but a task that has not had its turn may
                // begin a shorter pause: let every other task run once.
                this.turn = Some(pauses.begun);
                drop(pauses);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            clock.advance_to(this.end);
            this.leave(&mut pauses)
        };
        drop(pauses);
        if let Some(waker) = next {
            waker.wake();
        }
        Poll::Ready(())
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        if self.key.is_none() {
            return;
        }
        let clock = self.clock.clone();
        let next = self.leave(&mut clock.pauses());
        if let Some(waker) = next {
            waker.wake();
        }
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

    /// Ends when the clock reaches `d` from now, which it does by itself
    /// once this is the pause that ends first and every other task has had
    /// a turn (see [`ManualClock`]): a waiter's pause takes no real time.
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(ManualSleep {
            clock: self.clone(),
            end: self
                .monotonic_micros()
                .saturating_add(duration_to_micros(d)),
            key: None,
            turn: None,
        })
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

    /// Runs `tasks` pauses together on one clock, each a list of pause
    /// lengths in ms, and returns when (ms from the start) each pause ended.
    fn pause_together(clock: &ManualClock, tasks: &[&[u64]]) -> Vec<Vec<u64>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let start = clock.monotonic();
        runtime.block_on(async {
            let handles: Vec<_> = tasks
                .iter()
                .map(|pauses| {
                    let clock = clock.clone();
                    let pauses = pauses.to_vec();
                    tokio::spawn(async move {
                        let mut ends = Vec::new();
                        for ms in pauses {
                            clock.sleep(Duration::from_millis(ms)).await;
                            ends.push((clock.monotonic() - start).as_millis() as u64);
                        }
                        ends
                    })
                })
                .collect();
            let mut ends = Vec::new();
            for h in handles {
                ends.push(h.await.unwrap());
            }
            ends
        })
    }

    #[test]
    fn pauses_taken_together_end_each_at_its_own_end_not_after_the_sum() {
        let clock = ManualClock::new();
        let start = clock.now();
        let ends = pause_together(&clock, &[&[300], &[100, 100, 100], &[150, 10], &[0]]);
        assert_eq!(
            ends,
            [vec![300], vec![100, 200, 300], vec![150, 160], vec![0]]
        );
        assert_eq!(
            clock.now().saturating_duration_since(start),
            Duration::from_millis(300)
        );
    }

    #[test]
    fn a_pause_alone_moves_the_clock_by_its_length() {
        let clock = ManualClock::new();
        assert_eq!(pause_together(&clock, &[&[250, 1_000]]), [vec![250, 1_250]]);
    }

    #[test]
    fn a_pause_dropped_or_ended_by_hand_does_not_hold_the_others() {
        let clock = ManualClock::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let start = clock.monotonic();
        runtime.block_on(async {
            // The shorter pause is dropped before it ends: the longer one
            // still ends, at its own end.
            let mut short = clock.sleep(Duration::from_millis(10));
            let long = tokio::spawn(clock.sleep(Duration::from_millis(500)));
            assert!(futures_poll_once(short.as_mut()).await.is_pending());
            drop(short);
            long.await.unwrap();
            assert_eq!(clock.monotonic() - start, Duration::from_millis(500));
            // A move by hand ends a waiting pause it passes, which then
            // moves the clock no further.
            let mut waiting = clock.sleep(Duration::from_secs(60));
            assert!(futures_poll_once(waiting.as_mut()).await.is_pending());
            clock.advance(Duration::from_secs(61));
            waiting.await;
            assert_eq!(clock.monotonic() - start, Duration::from_millis(61_500));
        });
    }

    /// Polls `f` once.
    async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> Poll<F::Output> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut f).poll(cx))).await
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
