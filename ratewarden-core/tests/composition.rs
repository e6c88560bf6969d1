//! Tiers, fallback, breaker, failure policy and escalation, against stores
//! whose health the test controls. Time is virtual: `start_paused` makes
//! tokio's timers jump, so a 250 ms timeout costs no wall-clock time.

use ratewarden_conformance::call;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::{Events, Health, Switch};
use ratewarden_core::{
    BreakerConfig, BreakerState, FailurePolicy, Limiter, ManualClock, Policy, Rule, Store,
};

/// An honest store called `name` that declares itself shared, whose health
/// the test switches, counting the decisions it is asked for.
fn switchable(name: &'static str) -> Arc<Switch<dyn Store>> {
    Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(10_000).shared_as(name)))
}

/// A limiter of the one `rule`, on `clock`.
fn limiter_of(clock: &ManualClock, rule: Rule) -> Limiter {
    Limiter::builder()
        .clock(clock.clone())
        .rule(rule)
        .build()
        .unwrap()
}

fn per_minute(limit: u32) -> Policy {
    Policy::sliding_log(limit, Duration::from_secs(60)).unwrap()
}

#[tokio::test(start_paused = true)]
async fn first_refusal_wins_and_later_tiers_are_not_called() {
    let local = switchable("local");
    let shared = switchable("shared");
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        // The test store declares itself shared; this tier stands for a
        // local one, asked on every request.
        .rule(
            Rule::new("burst", local.clone(), per_minute(3))
                .unwrap()
                .without_refusal_cache(),
        )
        .rule(Rule::new("hourly", shared.clone(), per_minute(40)).unwrap())
        .build()
        .unwrap();
    for _ in 0..3 {
        let d = limiter.check(b"client").await;
        assert!(d.allowed);
        assert_eq!(d.source.rule, Some("burst"), "tightest rule shown");
    }
    for _ in 0..10 {
        let d = limiter.check(b"client").await;
        assert!(!d.allowed);
        assert_eq!(d.source.rule, Some("burst"));
    }
    assert_eq!(local.calls(), 13);
    assert_eq!(
        shared.calls(),
        3,
        "refused requests never reach the second tier"
    );
}

#[tokio::test(start_paused = true)]
async fn fallback_answers_while_authoritative_store_fails_and_never_both() {
    let shared = switchable("shared");
    let local = switchable("local");
    let clock = ManualClock::new();
    let limiter = limiter_of(
        &clock,
        Rule::new("search", shared.clone(), per_minute(10))
            .unwrap()
            .with_fallback(local.clone())
            .unwrap()
            // Four failures in a row must not open the breaker here, so
            // that the shared store answers again as soon as it is up.
            .with_breaker(BreakerConfig::new(10, Duration::from_secs(5)).unwrap())
            .on_failure(FailurePolicy::Closed),
    );
    // An honest client at exactly its limit, with the shared store failing
    // for part of the window: never refused, each request counted once.
    for i in 0..10 {
        shared.set(if (3..7).contains(&i) {
            Health::Failing
        } else {
            Health::Up
        });
        let d = limiter.check(b"honest").await;
        assert!(d.allowed, "request {i} refused: {d:?}");
        assert_eq!(d.source.fallback, (3..7).contains(&i), "request {i}");
    }
    assert_eq!(
        local.calls(),
        4,
        "fallback consulted only when shared failed"
    );
    let stats = &limiter.stats()[0];
    assert_eq!(stats.fallbacks, 4);
    assert_eq!(stats.allowed, 10);
    assert_eq!(stats.degraded, 0);
}

/// While the breaker is open, a fallback that must be awaited leaves the
/// request to the full path (one that answers inline is asked at once):
/// each request still counts its skip once and asks the fallback once.
#[tokio::test(start_paused = true)]
async fn open_breaker_asks_an_awaited_fallback_once_and_counts_once() {
    let shared = switchable("shared");
    shared.set(Health::Failing);
    // `Switch` has no inline answer: this fallback must be awaited.
    let awaited = switchable("awaited");
    let clock = ManualClock::new();
    let limiter = limiter_of(
        &clock,
        Rule::new("search", shared.clone(), per_minute(100))
            .unwrap()
            .with_fallback(awaited.clone())
            .unwrap()
            .with_breaker(BreakerConfig::new(1, Duration::from_secs(60)).unwrap())
            .on_failure(FailurePolicy::Closed),
    );
    for i in 0..10 {
        let d = limiter.check(b"k").await;
        assert!(d.allowed && d.source.fallback, "request {i}: {d:?}");
    }
    assert_eq!(shared.calls(), 1, "the breaker opened on the first failure");
    assert_eq!(awaited.calls(), 10, "the fallback asked once per request");
    let s = &limiter.stats()[0];
    assert_eq!(
        (s.store_errors, s.short_circuited, s.fallbacks, s.allowed),
        (1, 9, 10, 10),
        "{s:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn hanging_store_costs_one_timeout_then_breaker_answers_at_once() {
    let shared = switchable("shared");
    shared.set(Health::Hanging);
    let clock = ManualClock::new();
    let limiter = limiter_of(
        &clock,
        Rule::new("search", shared.clone(), per_minute(10))
            .unwrap()
            .with_timeout(Duration::from_millis(100))
            .unwrap()
            .with_breaker(BreakerConfig::new(2, Duration::from_secs(5)).unwrap())
            .on_failure(FailurePolicy::Open),
    );
    // Admitted, degraded, after `wait` of (virtual) time.
    let degraded_after = async |wait: Duration, why: &str| {
        let started = tokio::time::Instant::now();
        let d = limiter.check(b"k").await;
        assert!(d.allowed && d.source.degraded);
        assert_eq!(started.elapsed(), wait, "{why}");
    };
    for _ in 0..2 {
        degraded_after(Duration::from_millis(100), "virtual time").await;
    }
    assert_eq!(limiter.stats()[0].breaker, BreakerState::Open);
    for _ in 0..100 {
        degraded_after(Duration::ZERO, "open breaker never waits").await;
    }
    assert_eq!(shared.calls(), 2, "no calls while open");
    let stats = &limiter.stats()[0];
    assert_eq!((stats.store_errors, stats.short_circuited), (2, 100));
    assert_eq!(stats.breaker_opened, 1);

    // After the cool-down one probe goes through; the store is back, so the
    // breaker closes and the store answers again.
    shared.set(Health::Up);
    clock.advance(Duration::from_secs(5));
    let d = limiter.check(b"k").await;
    assert!(d.allowed && !d.source.degraded);
    assert_eq!(limiter.stats()[0].breaker, BreakerState::Closed);
    assert_eq!(shared.calls(), 3);
}

#[tokio::test(start_paused = true)]
async fn failed_probe_reopens_for_another_cool_down() {
    let shared = switchable("shared");
    shared.set(Health::Failing);
    let clock = ManualClock::new();
    let rule = Rule::new("r", shared.clone(), per_minute(1))
        .unwrap()
        .with_breaker(BreakerConfig::new(1, Duration::from_secs(5)).unwrap())
        .on_failure(FailurePolicy::Closed);
    let limiter = limiter_of(&clock, rule);
    let d = limiter.check(b"k").await;
    assert!(!d.allowed && d.source.degraded);
    assert_eq!(d.retry_after, Duration::from_secs(1));
    clock.advance(Duration::from_secs(5));
    limiter.check(b"k").await;
    assert_eq!(shared.calls(), 2, "one probe");
    clock.advance(Duration::from_secs(4));
    limiter.check(b"k").await;
    assert_eq!(shared.calls(), 2, "still open after a failed probe");
}

#[tokio::test(start_paused = true)]
async fn failure_policy_decides_without_fallback() {
    for (policy, allowed) in [(FailurePolicy::Open, true), (FailurePolicy::Closed, false)] {
        let shared = switchable("shared");
        shared.set(Health::Failing);
        let limiter = limiter_of(
            &ManualClock::new(),
            Rule::new("r", shared, per_minute(5))
                .unwrap()
                .on_failure(policy),
        );
        let d = limiter.check(b"k").await;
        assert_eq!(d.allowed, allowed, "{policy:?}");
        assert!(d.source.degraded);
        assert_eq!(d.source.store, "shared");
    }
}

#[tokio::test(start_paused = true)]
async fn escalation_samples_admitted_requests_and_records_refusals() {
    let local = switchable("memory");
    let durable = switchable("postgres");
    let events = Arc::new(Events::default());
    let limiter = limiter_of(
        &ManualClock::new(),
        Rule::new("feedback", local.clone(), per_minute(20))
            .unwrap()
            .with_escalation(durable.clone(), per_minute(2), 5, Some(events.clone()))
            .unwrap(),
    );
    let mut outcomes = Vec::new();
    for _ in 0..20 {
        let d = limiter.check(b"bot").await;
        outcomes.push((d.allowed, d.source.store, d.source.escalated));
    }
    // One sample in each run of 5 locally admitted requests: 4 runs. The
    // durable limit (2) admits the first two samples and refuses the next
    // two, whose local units are refunded.
    assert_eq!(durable.calls(), 4);
    let count = |o: (bool, &str, bool)| outcomes.iter().filter(|&&x| x == o).count();
    assert_eq!(count((true, "memory", true)), 2);
    assert_eq!(count((false, "postgres", true)), 2);
    assert_eq!(count((true, "memory", false)), 16);

    // Hammering on: the local store admits exactly 20 in all (the refunded
    // units were served again), every durable refusal after the first two
    // samples is refunded, and local refusals never reach the durable store.
    for _ in 0..10 {
        let d = limiter.check(b"bot").await;
        outcomes.push((d.allowed, d.source.store, d.source.escalated));
    }
    let admitted = outcomes.iter().filter(|o| o.0).count();
    assert_eq!(admitted, 20, "{outcomes:?}");
    let durable_refusals = outcomes
        .iter()
        .filter(|o| !o.0 && o.1 == "postgres")
        .count() as u64;
    assert_eq!(durable.calls(), 2 + durable_refusals);
    let stats = &limiter.stats()[0];
    assert_eq!(stats.refunds, durable_refusals);
    assert_eq!(stats.escalations, durable.calls());

    // Ten refusals of one key in one window: one write at the first, the
    // rest held back and written, with their count, by a flush.
    assert_eq!(events.recorded().len(), 1);
    assert_eq!(limiter.flush_abuse_events().await, 1);
    let recorded = events.recorded();
    assert_eq!(recorded.len(), 2);
    assert!(recorded.iter().all(|e| e.key == b"bot"));
    assert_eq!(recorded.iter().map(|e| e.refusals).sum::<u64>(), 10);
    assert_eq!(recorded[0].refused_by, "postgres");
    assert_eq!(limiter.stats()[0].abuse_events, 2);
    assert_eq!(
        limiter.flush_abuse_events().await,
        0,
        "nothing left to flush"
    );
}

#[tokio::test(start_paused = true)]
async fn durable_failure_never_refuses_an_escalating_rule() {
    let local = switchable("memory");
    let durable = switchable("postgres");
    durable.set(Health::Failing);
    let limiter = limiter_of(
        &ManualClock::new(),
        Rule::new("r", local, per_minute(10))
            .unwrap()
            .with_escalation(durable, per_minute(1), 1, None)
            .unwrap()
            .on_failure(FailurePolicy::Closed),
    );
    for _ in 0..10 {
        assert!(limiter.check(b"k").await.allowed);
    }
}

#[tokio::test(start_paused = true)]
async fn headers_come_from_a_store_that_answered_not_from_a_failed_tier() {
    let local = switchable("local");
    let shared = switchable("shared");
    shared.set(Health::Failing);
    let limiter = Limiter::builder()
        .rule(Rule::new("local", local, per_minute(10)).unwrap())
        .rule(Rule::new("shared", shared, per_minute(40)).unwrap())
        .build()
        .unwrap();
    let d = limiter.check(b"k").await;
    assert!(d.allowed && !d.source.degraded);
    assert_eq!(d.source.rule, Some("local"));
    assert_eq!(d.remaining, 9);
}

#[test]
fn bad_compositions_are_refused_at_construction() {
    let s = switchable("s");
    assert!(Rule::new("", s.clone(), per_minute(1)).is_err());
    assert!(Rule::new("a\0b", s.clone(), per_minute(1)).is_err());
    assert!(
        Rule::new("a:b", s.clone(), per_minute(1)).is_err(),
        "':' separates the rule from the key"
    );
    assert!(Rule::new("a b", s.clone(), per_minute(1)).is_err());
    assert!(Rule::new("x".repeat(65), s.clone(), per_minute(1)).is_err());
    assert!(Rule::new("x".repeat(64), s.clone(), per_minute(1)).is_ok());
    assert!(Rule::new("api.search-v2_eu", s.clone(), per_minute(1)).is_ok());
    let rule = Rule::new("r", s.clone(), per_minute(3)).unwrap();
    assert!(rule.clone().with_units_per_request(4).is_err());
    assert!(rule.clone().with_timeout(Duration::ZERO).is_err());
    assert!(
        rule.clone()
            .with_escalation(s.clone(), per_minute(3), 0, None)
            .is_err()
    );
    assert!(Limiter::builder().build().is_err());
    assert!(
        Limiter::builder()
            .rule(rule.clone())
            .rule(rule)
            .build()
            .is_err(),
        "duplicate names would share state"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shared_store_refusal_is_repeated_without_a_call_until_its_retry_time() {
    let shared = switchable("shared");
    let clock = ManualClock::new();
    let limiter = limiter_of(
        &clock,
        Rule::new("r", shared.clone(), per_minute(2)).unwrap(),
    );
    assert!(limiter.check(b"k").await.allowed);
    assert!(limiter.check(b"k").await.allowed);
    let first = limiter.check(b"k").await;
    assert!(!first.allowed && !first.source.cached);
    for _ in 0..50 {
        let d = limiter.check(b"k").await;
        assert!(!d.allowed && d.source.cached);
        assert_eq!(d.retry_after, Duration::from_secs(60));
    }
    assert_eq!(shared.calls(), 3, "on by default for a shared store");
    assert_eq!(limiter.stats()[0].refusals_cached, 50);
    // Another key is not affected.
    assert!(limiter.check(b"other").await.allowed);
    clock.advance(Duration::from_secs(60));
    assert!(
        limiter.check(b"k").await.allowed,
        "asked again at the retry time"
    );
    assert_eq!(shared.calls(), 5);
    assert!(
        Rule::new("r", shared.clone(), per_minute(2))
            .unwrap()
            .with_refusal_cache(0)
            .is_err()
    );
}

/// Tiers decided without a future while each store answers inline hand the
/// request on at the first store that must be awaited: the tighter answer
/// of an inline tier is still the one shown, and its admission is still
/// given back when the awaited tier refuses.
#[tokio::test(start_paused = true)]
async fn an_inline_tier_before_an_awaited_one_keeps_its_answer_and_its_refund() {
    let tiers = |burst: u32, hourly: u32| {
        let local: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
        let shared = switchable("shared");
        let limiter = Limiter::builder()
            .clock(ManualClock::new())
            .rule(
                Rule::new("burst", local.clone(), per_minute(burst))
                    .unwrap()
                    .without_refusal_cache(),
            )
            .rule(
                Rule::new("hourly", shared.clone(), per_minute(hourly))
                    .unwrap()
                    .without_refusal_cache(),
            )
            .build()
            .unwrap();
        (limiter, local, shared)
    };

    // The inline tier is the tighter: its answer is shown.
    let (limiter, _, shared) = tiers(2, 40);
    let d = limiter.check(b"client").await;
    assert!(d.allowed);
    assert_eq!(d.source.rule, Some("burst"));
    assert_eq!((d.limit, d.remaining), (2, 1));
    assert_eq!(shared.calls(), 1);

    // The awaited tier refuses: the inline tier's admission is undone.
    let (limiter, local, _) = tiers(40, 1);
    assert!(limiter.check(b"client").await.allowed);
    let d = limiter.check(b"client").await;
    assert!(!d.allowed);
    assert_eq!(d.source.rule, Some("hourly"));
    let burst = &limiter.rules()[0];
    let counted = call::peek(
        &local,
        &burst.storage_key(b"client"),
        burst.policy(),
        1,
        limiter.clock().now(),
    )
    .await
    .unwrap();
    assert_eq!(
        counted.remaining, 38,
        "only the admitted request is counted"
    );
}
