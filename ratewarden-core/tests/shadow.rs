//! Rules in shadow mode (`Rule::with_shadow`): decided and counted in their
//! store as usual, never let to refuse; what the client is shown is the
//! enforcing rules' answer; switched on, a rule goes on from the counts
//! shadow mode kept.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Switch;
use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};

fn per_minute(n: u32) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(60)).unwrap()
}

fn limiter(clock: &ManualClock, rules: impl IntoIterator<Item = Rule>) -> Limiter {
    Limiter::builder()
        .clock(clock.clone())
        .rules(rules)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_shadow_rule_refuses_nobody_and_counts_what_it_would_have_refused() {
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    let rule = Rule::new("search", store.clone(), per_minute(3)).unwrap();
    let watching = limiter(&clock, [rule.clone().with_shadow(true)]);
    assert!(watching.rules()[0].is_shadow());
    let mut flagged = Vec::new();
    for _ in 0..7 {
        let d = watching.check(b"k").await;
        assert!(d.allowed, "{d:?}");
        assert_eq!(d.retry_after, Duration::ZERO);
        assert_eq!(d.source.rule, Some("search"));
        flagged.push(d.source.shadow_refused);
    }
    assert_eq!(flagged, [false, false, false, true, true, true, true]);
    let stats = &watching.stats()[0];
    assert_eq!(
        (stats.allowed, stats.refused, stats.shadow_refusals),
        (3, 0, 4),
        "{stats:?}"
    );
    // The inline entry point takes the same road.
    let d = watching
        .try_check(b"k")
        .expect("a memory store answers inline");
    assert!(d.allowed && d.source.shadow_refused);

    // Switched on, on the same store: the three admissions are still
    // there, and the four refusals counted nothing.
    let enforcing = limiter(&clock, [rule.with_shadow(false)]);
    let d = enforcing.check(b"k").await;
    assert!(!d.allowed && !d.source.shadow_refused, "{d:?}");
    assert_eq!(d.retry_after, Duration::from_secs(60));
    clock.advance(Duration::from_secs(60));
    for i in 0..4 {
        assert_eq!(enforcing.check(b"k").await.allowed, i < 3, "request {i}");
    }
}

#[tokio::test]
async fn the_client_is_shown_the_enforcing_rules_quota() {
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    // The shadow rule is the tighter one: its numbers must not reach the
    // client, admitted or refused.
    let limiter = limiter(
        &clock,
        [
            Rule::new("new-limit", store.clone(), per_minute(2))
                .unwrap()
                .with_shadow(true),
            Rule::new("search", store.clone(), per_minute(5)).unwrap(),
        ],
    );
    let mut seen = Vec::new();
    for _ in 0..6 {
        let d = limiter.check(b"k").await;
        assert_eq!(d.source.rule, Some("search"), "{d:?}");
        seen.push((d.allowed, d.remaining, d.source.shadow_refused));
    }
    assert_eq!(
        seen,
        [
            (true, 4, false),
            (true, 3, false),
            (true, 2, true),
            (true, 1, true),
            (true, 0, true),
            // Refused by the enforcing rule, after the shadow rule's would-be
            // refusal: the flag says so on the refusal too.
            (false, 0, true),
        ]
    );
    let peeked = limiter.peek(b"k").await;
    assert!(!peeked.allowed && peeked.source.shadow_refused);
    assert_eq!(peeked.source.rule, Some("search"));
    let stats = limiter.stats();
    assert_eq!(
        (stats[0].allowed, stats[0].shadow_refusals),
        (2, 4),
        "{stats:?}"
    );
    assert_eq!((stats[1].allowed, stats[1].refused), (5, 1), "{stats:?}");

    // The same with the enforcing rule first: its answer is still the one
    // shown, though the shadow rule's leaves fewer units.
    let limiter = self::limiter(
        &clock,
        [
            Rule::new("search-b", store.clone(), per_minute(5)).unwrap(),
            Rule::new("new-limit-b", store.clone(), per_minute(2))
                .unwrap()
                .with_shadow(true),
        ],
    );
    let mut seen = Vec::new();
    for _ in 0..3 {
        let d = limiter.check(b"k").await;
        assert_eq!(d.source.rule, Some("search-b"), "{d:?}");
        seen.push((d.allowed, d.remaining, d.source.shadow_refused));
    }
    assert_eq!(seen, [(true, 4, false), (true, 3, false), (true, 2, true)]);
    let peeked = limiter.peek(b"k").await;
    assert_eq!(
        (
            peeked.source.rule,
            peeked.remaining,
            peeked.source.shadow_refused
        ),
        (Some("search-b"), 2, true)
    );
}

#[tokio::test]
async fn an_enforcing_refusal_gives_back_what_the_shadow_rule_admitted() {
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    let shadow = Rule::new("watch", store.clone(), per_minute(4)).unwrap();
    let limiter = limiter(
        &clock,
        [
            shadow.clone().with_shadow(true),
            Rule::new("gate", store.clone(), per_minute(2)).unwrap(),
        ],
    );
    let admitted = {
        let mut n = 0;
        for _ in 0..6 {
            n += u32::from(limiter.check(b"k").await.allowed);
        }
        n
    };
    assert_eq!(admitted, 2);
    // "watch" counted the two admitted requests only: the four "gate"
    // refused were given back to it.
    let alone = self::limiter(&clock, [shadow]);
    let d = alone.peek(b"k").await;
    assert!(d.allowed);
    assert_eq!(d.remaining, 2, "4 - 2 left");
}

#[tokio::test]
async fn every_shadow_rule_admitting_shows_the_tightest_of_them() {
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    let limiter = limiter(
        &clock,
        [
            Rule::new("a", store.clone(), per_minute(5))
                .unwrap()
                .with_shadow(true),
            Rule::new("b", store.clone(), per_minute(2))
                .unwrap()
                .with_shadow(true),
        ],
    );
    let d = limiter.check(b"k").await;
    assert_eq!((d.source.rule, d.remaining), (Some("b"), 1));
    let peeked = limiter.peek(b"k").await;
    assert_eq!((peeked.source.rule, peeked.remaining), (Some("b"), 1));
    limiter.check(b"k").await;
    let d = limiter.check(b"k").await;
    assert!(d.allowed && d.source.shadow_refused, "{d:?}");
    let peeked = limiter.peek(b"k").await;
    assert!(peeked.allowed && peeked.source.shadow_refused, "{peeked:?}");
}

#[tokio::test]
async fn a_shadow_rule_on_a_shared_store_asks_the_store_every_time() {
    let clock = ManualClock::new();
    // Shared: an enforcing rule would repeat its refusals from its refusal
    // cache. A shadow rule's refusals refuse nothing, so they are not
    // repeated: each request is counted by the store, as it would be
    // switched on.
    let shared = Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(100).shared_as("shared")));
    let limiter = limiter(
        &clock,
        [Rule::new("search", shared.clone(), per_minute(2))
            .unwrap()
            .with_refusal_cache(100)
            .unwrap()
            .with_shadow(true)],
    );
    for _ in 0..10 {
        assert!(limiter.check(b"k").await.allowed);
    }
    assert_eq!(shared.calls(), 10);
    assert_eq!(limiter.stats()[0].refusals_cached, 0);
    assert_eq!(limiter.stats()[0].shadow_refusals, 8);
}
