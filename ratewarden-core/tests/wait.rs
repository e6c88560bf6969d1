//! `Limiter::until_ready`: waiting to be admitted, on a manual clock that
//! moves as the waiter pauses.
//!
//! The rule under test: a waiter gives up only when no chance remains
//! before its deadline, and never returns after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ratewarden_core::{
    Capabilities, Clock, Decision, Key, Limiter, ManualClock, Policy, Refund, Request, Rule, Store,
    StoreError, Timestamp, WaitError, async_trait,
};
use ratewarden_test_support::stores::AwaitedStore;

fn limiter(policy: Policy) -> (Limiter, ManualClock) {
    let store: Arc<dyn Store> = Arc::new(AwaitedStore::default());
    let clock = ManualClock::new();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("api", store, policy).unwrap())
        .build()
        .unwrap();
    (limiter, clock)
}

fn elapsed(clock: &ManualClock, since: ratewarden_core::Timestamp) -> Duration {
    clock.now().saturating_duration_since(since)
}

#[tokio::test]
async fn a_waiter_is_admitted_at_the_refusals_retry_time_plus_its_jitter() {
    let (limiter, clock) = limiter(Policy::gcra(1, Duration::from_secs(1)).unwrap());
    let start = clock.now();
    let first = limiter
        .until_ready(b"k", Duration::from_secs(10))
        .await
        .unwrap();
    assert!(first.allowed);
    assert_eq!(
        elapsed(&clock, start),
        Duration::ZERO,
        "the first is admitted at once"
    );
    // Each next one waits one emission interval, plus at most a quarter.
    for n in 1..=5u32 {
        let before = clock.now();
        let d = limiter
            .until_ready(b"k", Duration::from_secs(10))
            .await
            .unwrap();
        assert!(d.allowed);
        let waited = elapsed(&clock, before);
        assert!(
            waited >= Duration::from_secs(1) && waited <= Duration::from_millis(1_250),
            "wait {n}: {waited:?}"
        );
    }
    assert_eq!(limiter.stats()[0].allowed, 6);
}

#[tokio::test]
async fn a_next_chance_past_the_deadline_is_an_error_at_once_with_the_refusal() {
    let (limiter, clock) = limiter(Policy::fixed_window(1, Duration::from_secs(60)).unwrap());
    limiter.until_ready(b"k", Duration::ZERO).await.unwrap();
    let before = clock.now();
    let err = limiter
        .until_ready(b"k", Duration::from_secs(10))
        .await
        .unwrap_err();
    let WaitError::Deadline {
        max_wait,
        waited,
        last,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(*max_wait, Duration::from_secs(10));
    assert_eq!(*waited, Duration::ZERO);
    assert!(!last.allowed);
    assert_eq!(last.retry_after, Duration::from_secs(60));
    assert_eq!(
        elapsed(&clock, before),
        Duration::ZERO,
        "no pause was taken"
    );
    assert!(err.to_string().contains("retry in 60s"), "{err}");
    // With time enough, the same waiter gets in when the window turns.
    let d = limiter
        .until_ready(b"k", Duration::from_secs(90))
        .await
        .unwrap();
    assert!(d.allowed);
    let waited = elapsed(&clock, before);
    assert!(
        waited >= Duration::from_secs(60) && waited <= Duration::from_secs(61),
        "{waited:?}"
    );
}

#[tokio::test]
async fn waiters_refused_together_come_back_at_different_times() {
    // Fifty waiters, each on a limiter and clock of its own, refused with
    // the same retry time: their pauses differ.
    let mut waits = Vec::new();
    for _ in 0..50 {
        let (limiter, clock) = limiter(Policy::fixed_window(1, Duration::from_secs(10)).unwrap());
        limiter.until_ready(b"k", Duration::ZERO).await.unwrap();
        let before = clock.now();
        limiter
            .until_ready(b"k", Duration::from_secs(60))
            .await
            .unwrap();
        waits.push(elapsed(&clock, before));
    }
    waits.sort();
    waits.dedup();
    assert!(
        waits.len() >= 40,
        "only {} distinct pauses: {waits:?}",
        waits.len()
    );
    assert!(
        waits
            .iter()
            .all(|w| *w >= Duration::from_secs(10) && *w <= Duration::from_millis(11_000))
    );
}

#[tokio::test]
async fn a_cost_no_wait_could_admit_is_an_error_at_once() {
    let (limiter, clock) = limiter(Policy::fixed_window(5, Duration::from_secs(60)).unwrap());
    let before = clock.now();
    for cost in [0, 6] {
        let err = limiter
            .until_ready_cost(b"k", cost, Duration::from_secs(600))
            .await
            .unwrap_err();
        assert!(matches!(err, WaitError::Invalid(_)), "{cost}: {err}");
    }
    assert_eq!(elapsed(&clock, before), Duration::ZERO);
    assert_eq!(limiter.stats()[0].allowed + limiter.stats()[0].refused, 0);
}

/// Takes `n` units at once (a deadline of zero), or says how many it got.
async fn take_now(limiter: &Limiter, n: usize) -> usize {
    for got in 0..n {
        match limiter.acquire(b"k", Duration::ZERO).await {
            Ok(permit) => {
                permit.used();
            }
            Err(_) => return got,
        }
    }
    n
}

#[tokio::test]
async fn permits_released_or_dropped_by_a_cancelled_holder_give_their_units_back() {
    let (limiter, clock) = limiter(Policy::fixed_window(3, Duration::from_secs(60)).unwrap());
    let start = clock.now();
    let used = limiter.acquire(b"k", Duration::ZERO).await.unwrap();
    assert!(used.decision().allowed);
    used.used();
    let released = limiter.acquire(b"k", Duration::ZERO).await.unwrap();
    released.release().await;
    // A holder cancelled between its permit and its call.
    let held = limiter.acquire(b"k", Duration::ZERO).await.unwrap();
    let holder = tokio::spawn(async move {
        let _permit = held;
        std::future::pending::<()>().await;
    });
    tokio::task::yield_now().await;
    holder.abort();
    assert!(holder.await.unwrap_err().is_cancelled());
    // The dropped permit's refund runs on a task of its own.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // One unit spent of three: two more now, not a third.
    assert_eq!(take_now(&limiter, 3).await, 2);
    assert_eq!(elapsed(&clock, start), Duration::ZERO);
}

#[test]
fn a_permit_dropped_outside_any_runtime_stays_counted_without_a_panic() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    };
    let (limiter, _clock) = limiter(Policy::fixed_window(2, Duration::from_secs(60)).unwrap());
    let permit = runtime()
        .block_on(limiter.acquire(b"k", Duration::ZERO))
        .unwrap();
    drop(permit);
    // Still counted: one more unit, not two.
    assert_eq!(runtime().block_on(take_now(&limiter, 2)), 1);
}

/// How many times each jittered scenario runs: a pause's jitter is drawn
/// anew each time, and an early give-up must show on every run.
const RUNS: usize = 200;

#[tokio::test]
async fn a_chance_at_or_before_the_deadline_is_taken_whatever_the_jitter() {
    // One unit a second, spent: the refusal says to retry in exactly 1 s.
    for (name, policy) in [
        ("gcra 1/s", Policy::gcra(1, Duration::from_secs(1)).unwrap()),
        (
            "fixed window 1/s",
            Policy::fixed_window(1, Duration::from_secs(1)).unwrap(),
        ),
        (
            "sliding log 1/s",
            Policy::sliding_log(1, Duration::from_secs(1)).unwrap(),
        ),
    ] {
        // A chance exactly at the deadline counts.
        for max_wait_ms in [1_000, 1_100, 1_250] {
            let max_wait = Duration::from_millis(max_wait_ms);
            let mut admitted = 0;
            let mut gave_up_early = Vec::new();
            for _ in 0..RUNS {
                let (limiter, clock) = limiter(policy);
                limiter.until_ready(b"k", Duration::ZERO).await.unwrap();
                let before = clock.now();
                let outcome = limiter.until_ready(b"k", max_wait).await;
                let waited = elapsed(&clock, before);
                assert!(waited <= max_wait, "{name}: returned after {waited:?}");
                match outcome {
                    Ok(d) => {
                        assert!(d.allowed);
                        assert!(waited >= Duration::from_secs(1), "{name}: {waited:?}");
                        admitted += 1;
                    }
                    Err(e) => gave_up_early.push(format!("{waited:?}: {e}")),
                }
            }
            println!("{name}, retry 1 s, max_wait {max_wait:?}: {admitted} of {RUNS} admitted");
            assert!(
                gave_up_early.is_empty(),
                "{name}, max_wait {max_wait:?}: {} of {RUNS} gave up with a chance left, e.g. {}",
                gave_up_early.len(),
                gave_up_early[0]
            );
        }
    }
}

/// How many of `n` requests `policy` admits within `max_wait` of the
/// first, each made at the earliest time a refusal names: what waiters
/// released together can get at best.
async fn allowed_by_the_deadline(policy: &Policy, n: u32, max_wait: Duration) -> u32 {
    let (limiter, clock) = limiter(*policy);
    let start = clock.now();
    let mut admitted = 0;
    while admitted < n {
        let d = limiter.check(b"k").await;
        if d.allowed {
            admitted += 1;
            continue;
        }
        let left = max_wait.saturating_sub(elapsed(&clock, start));
        if d.retry_after > left {
            break;
        }
        clock.advance(d.retry_after.max(Duration::from_micros(1)));
    }
    admitted
}

#[tokio::test]
async fn waiters_released_together_are_admitted_as_often_as_the_policy_allows_by_their_deadline() {
    const N: u32 = 40;
    let gcra = Policy::gcra(10, Duration::from_secs(1)).unwrap();
    let log = Policy::sliding_log(10, Duration::from_secs(1)).unwrap();
    let window = Policy::sliding_window(10, Duration::from_secs(1)).unwrap();
    // (policy, deadline, what the policy allows by then): gcra 10/s has a
    // burst of 10 at once, then one every 100 ms, the tenth of those at
    // 1 s; the log frees its 10 at 1 s; the sliding window weighs its first
    // window's 10 down by a tenth every 100 ms of the next one.
    let scenarios = [
        ("gcra 10/s", gcra, Duration::from_secs(1), 20),
        ("sliding log 10/s", log, Duration::from_secs(1), 20),
        (
            "sliding window 10/s",
            window,
            Duration::from_millis(1_500),
            15,
        ),
    ];
    for (name, policy, max_wait, expected) in scenarios {
        let allowed = allowed_by_the_deadline(&policy, N, max_wait).await;
        assert_eq!(allowed, expected, "{name}: what the policy allows");
        let mut figures = Vec::new();
        // Waiters that returned after their deadline, or gave up before it
        // while chances remained: every chance before the deadline was
        // someone's, the last one at the deadline itself.
        let mut untimely = Vec::new();
        for _ in 0..RUNS / 10 {
            let (limiter, clock) = limiter(policy);
            let start = clock.now();
            let waiters: Vec<_> = (0..N)
                .map(|_| {
                    let (limiter, clock) = (limiter.clone(), clock.clone());
                    tokio::spawn(async move {
                        let outcome = limiter.until_ready(b"k", max_wait).await;
                        (outcome, elapsed(&clock, start))
                    })
                })
                .collect();
            let mut admitted = 0;
            for waiter in waiters {
                let (outcome, at) = waiter.await.unwrap();
                match outcome {
                    Ok(_) if at <= max_wait => admitted += 1,
                    Ok(_) => untimely.push(format!("admitted at {at:?}")),
                    Err(WaitError::Deadline { waited, .. }) if at == max_wait => {
                        assert_eq!(waited, max_wait, "{name}");
                    }
                    Err(WaitError::Deadline { .. }) => untimely.push(format!("gave up at {at:?}")),
                    Err(e) => panic!("{name}: {e}"),
                }
            }
            figures.push(admitted);
        }
        let (low, high) = (figures.iter().min(), figures.iter().max());
        println!(
            "{name}, deadline {max_wait:?}, {} runs: of {N} waiters, {} admitted where the policy \
             allows {allowed}; {} gave up early or returned late",
            figures.len(),
            if low == high {
                format!("{}", low.unwrap())
            } else {
                format!("{} to {}", low.unwrap(), high.unwrap())
            },
            untimely.len(),
        );
        assert!(
            figures.iter().all(|a| *a == allowed),
            "{name}: of {N} waiters, {figures:?} admitted where the policy allows {allowed}"
        );
        assert!(untimely.is_empty(), "{name}: {untimely:?}");
    }
}

/// A partner that gives one call in every 100 ms slot from `start` to
/// someone else, so it refuses every call of ours and names the next slot,
/// until `reopens`, when it admits them all.
#[derive(Debug)]
struct Busy {
    inner: AwaitedStore,
    start: Timestamp,
    reopens: Timestamp,
    calls: AtomicU32,
}

const SLOT: Duration = Duration::from_millis(100);

#[async_trait]
impl Store for Busy {
    fn name(&self) -> &'static str {
        "busy"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if request.now() < self.reopens {
            let since = request.now().saturating_duration_since(self.start);
            let into_slot = since.as_micros() % SLOT.as_micros();
            let retry = SLOT - Duration::from_micros(into_slot as u64);
            return Ok(Decision::new(
                false,
                request.policy(),
                0,
                retry,
                retry,
                "busy",
            ));
        }
        self.inner.decide(request).await
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.inner.refund(refund).await
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.inner.penalize(request).await
    }
}

#[tokio::test]
async fn a_waiter_refused_again_and_again_gives_up_at_its_deadline_not_before_and_not_after() {
    let max_wait = Duration::from_secs(1);
    let mut gave_up_at = Vec::new();
    for _ in 0..RUNS {
        let clock = ManualClock::new();
        // Had the waiter ignored its deadline, it would be admitted at 5 s.
        let busy = Arc::new(Busy {
            inner: AwaitedStore::default(),
            start: clock.now(),
            reopens: clock.now().saturating_add(Duration::from_secs(5)),
            calls: AtomicU32::new(0),
        });
        let store: Arc<dyn Store> = busy.clone();
        let limiter = Limiter::builder()
            .clock(clock.clone())
            .rule(
                Rule::new(
                    "api",
                    store,
                    Policy::gcra(10, Duration::from_secs(1)).unwrap(),
                )
                .unwrap(),
            )
            .build()
            .unwrap();
        let start = clock.now();
        let outcome = limiter.until_ready(b"k", max_wait).await;
        let at = elapsed(&clock, start);
        let Err(WaitError::Deadline { waited, last, .. }) = &outcome else {
            panic!("not refused at the deadline: {outcome:?} at {at:?}")
        };
        assert_eq!(last.retry_after, SLOT, "refused at the deadline, a slot");
        assert_eq!(*waited, at);
        // One try at the start and one in each slot up to the deadline's:
        // no jitter makes a try miss its slot.
        let calls = busy.calls.load(Ordering::Relaxed);
        assert_eq!(calls, 11, "tries");
        gave_up_at.push(at);
    }
    gave_up_at.sort();
    gave_up_at.dedup();
    assert_eq!(
        gave_up_at,
        [max_wait],
        "a waiter told each time to retry at the next 100 ms slot, with a deadline of 1 s, gave up at"
    );
}

#[tokio::test]
async fn gcra_lets_its_burst_then_its_rate_through_in_the_first_second_a_sliding_log_its_limit() {
    // Within [0, 1 s) and [0, 1 s], of as many calls as wait for them.
    let just_under = Duration::from_secs(1) - Duration::from_micros(1);
    let gcra = Policy::gcra(5, Duration::from_secs(1)).unwrap();
    let log = Policy::sliding_log(5, Duration::from_secs(1)).unwrap();
    let first_second = [
        allowed_by_the_deadline(&gcra, 100, just_under).await,
        allowed_by_the_deadline(&gcra, 100, Duration::from_secs(1)).await,
        allowed_by_the_deadline(&log, 100, just_under).await,
        allowed_by_the_deadline(&log, 100, Duration::from_secs(1)).await,
    ];
    println!("gcra(5, 1s) and sliding_log(5, 1s), in [0, 1s) and [0, 1s]: {first_second:?}");
    // GCRA: the burst of 5 at once, then one every 200 ms (at 200, 400,
    // 600, 800 ms, and 1 s). The log: 5, and its 5 again when they expire.
    assert_eq!(first_second, [9, 10, 5, 10]);
}

/// A limiter of `limit` per minute on a store whose next answer can be
/// held back ([`Late`](ratewarden_conformance::composition::Late)).
fn on_a_late_store(
    limit: u32,
) -> (
    Limiter,
    Arc<ratewarden_conformance::composition::Late>,
    ManualClock,
) {
    let store = ratewarden_conformance::composition::Late::new(Arc::new(
        ratewarden_conformance::broken::ReferenceStore::new(100),
    ));
    let clock = ManualClock::new();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "api",
                store.clone(),
                Policy::fixed_window(limit, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    (limiter, store, clock)
}

/// A waiter for `k`, started once the store has refused it and while the
/// refusal is held back: the moment between the store's answer and the
/// waiter's pause. [`Late::release`](ratewarden_conformance::composition::Late::release)
/// lets the answer through.
async fn refused_on_the_way(
    limiter: &Limiter,
    store: &ratewarden_conformance::composition::Late,
) -> tokio::task::JoinHandle<Result<Decision, WaitError>> {
    store.hold_next();
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.until_ready(b"k", Duration::from_secs(120)).await }
    });
    store.decided().await;
    waiter
}

/// A waiter's pause is a copy of a refusal: a give-back of the key made
/// after the store refused it (here, while its answer was on the way) ends
/// the pause at once, rather than at the retry time of a refusal the store
/// no longer stands by.
#[tokio::test]
async fn a_give_back_after_a_waiters_refusal_ends_its_pause() {
    let (limiter, store, clock) = on_a_late_store(1);
    let held = limiter.check_admission(b"k", 1).await.unwrap();
    let start = clock.now();
    let waiter = refused_on_the_way(&limiter, &store).await;
    held.refund().await;
    store.release();
    let admitted = waiter.await.unwrap().unwrap();
    assert!(admitted.allowed);
    assert_eq!(
        elapsed(&clock, start),
        Duration::ZERO,
        "the unit given back is the waiter's at once, not a minute later"
    );
}

/// The same for a reset (which wakes every waiter of the key, where a
/// give-back wakes one).
#[tokio::test]
async fn a_reset_after_a_waiters_refusal_ends_its_pause() {
    let (limiter, store, clock) = on_a_late_store(2);
    assert_eq!(take_now(&limiter, 2).await, 2);
    let start = clock.now();
    let waiter = refused_on_the_way(&limiter, &store).await;
    limiter.reset(b"k").await.unwrap();
    store.release();
    assert!(waiter.await.unwrap().unwrap().allowed);
    assert_eq!(elapsed(&clock, start), Duration::ZERO);
}
