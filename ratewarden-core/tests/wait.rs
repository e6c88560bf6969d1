//! `Limiter::until_ready`: waiting to be admitted, on a manual clock that
//! moves as the waiter pauses.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::example::MapStore;
use ratewarden_core::{Clock, Limiter, ManualClock, Policy, Rule, Store, WaitError};

fn limiter(policy: Policy) -> (Limiter, ManualClock) {
    let store: Arc<dyn Store> = Arc::new(MapStore::default());
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
async fn a_weight_no_wait_could_admit_is_an_error_at_once() {
    let (limiter, clock) = limiter(Policy::fixed_window(5, Duration::from_secs(60)).unwrap());
    let before = clock.now();
    for weight in [0, 6] {
        let err = limiter
            .until_ready_cost(b"k", weight, Duration::from_secs(600))
            .await
            .unwrap_err();
        assert!(matches!(err, WaitError::Invalid(_)), "{weight}: {err}");
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
