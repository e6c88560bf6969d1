//! `Limiter::peek` and `Limiter::reset` over compositions: tiers, a refusal
//! cache, an escalation's durable store, a store that is down.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::{ReferenceStore, Unavailable};
use ratewarden_conformance::composition::{Health, Switch};
use ratewarden_core::{ErrorKind, FailurePolicy, Limiter, ManualClock, Policy, Rule, Store};

fn store() -> Arc<dyn Store> {
    Arc::new(ReferenceStore::new(1_000))
}

/// A store that others share, so that its rule keeps a refusal cache.
fn shared() -> Arc<dyn Store> {
    Arc::new(ReferenceStore::new(1_000).shared_as("shared"))
}

fn per_minute(n: u32) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(60)).unwrap()
}

#[tokio::test]
async fn a_peek_answers_the_tightest_tier_and_spends_nothing() {
    let clock = ManualClock::new();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("burst", store(), per_minute(5)).unwrap())
        .rule(Rule::new("daily", shared(), per_minute(3)).unwrap())
        .build()
        .unwrap();
    limiter.check(b"k").await;
    for _ in 0..10 {
        let peeked = limiter.peek(b"k").await;
        assert!(peeked.allowed);
        assert_eq!(peeked.remaining, 2, "the tighter tier's count");
        assert_eq!(peeked.source.rule, Some("daily"));
        assert_eq!(peeked.source.policy, Some(&per_minute(3)));
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats[0].allowed, stats[1].allowed),
        (1, 1),
        "peeks are not decisions"
    );
    let decided = limiter.check(b"k").await;
    assert_eq!(decided.remaining, 1);
    // A cost the limit never admits is refused as check_cost refuses it.
    assert!(limiter.peek_cost(b"k", 4).await.is_err());
    assert!(!limiter.peek_cost(b"k", 2).await.unwrap().allowed);
}

#[tokio::test]
async fn a_peek_of_a_refused_key_is_the_first_refusal_and_extends_nothing() {
    let clock = ManualClock::new();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("search", shared(), per_minute(2)).unwrap())
        .build()
        .unwrap();
    while limiter.check(b"k").await.allowed {}
    clock.advance(Duration::from_secs(30));
    for _ in 0..100 {
        let peeked = limiter.peek(b"k").await;
        assert!(!peeked.allowed);
        assert!(peeked.source.cached, "answered from the refusal cache");
        assert_eq!(peeked.retry_after, Duration::from_secs(30));
    }
    clock.advance(Duration::from_secs(30));
    assert!(limiter.peek(b"k").await.allowed);
    assert!(
        limiter.check(b"k").await.allowed,
        "the window ended on time"
    );
}

#[tokio::test]
async fn a_peek_on_a_dead_store_is_the_failure_policys_answer() {
    for (on_failure, allowed) in [(FailurePolicy::Open, true), (FailurePolicy::Closed, false)] {
        let limiter = Limiter::builder()
            .clock(ManualClock::new())
            .rule(
                Rule::new("search", Arc::new(Unavailable), per_minute(2))
                    .unwrap()
                    .on_failure(on_failure),
            )
            .build()
            .unwrap();
        let peeked = limiter.peek(b"k").await;
        assert_eq!(peeked.allowed, allowed, "{on_failure:?}");
        assert!(peeked.source.degraded);
        assert_eq!(limiter.stats()[0].degraded, 0, "a peek is not counted");
    }
}

#[tokio::test]
async fn a_reset_restores_every_tier_and_forgets_the_refusal_cache() {
    let clock = ManualClock::new();
    let durable = Switch::<dyn Store>::new(store());
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("local", store(), per_minute(4)).unwrap())
        .rule(
            Rule::new("shared", shared(), per_minute(3))
                .unwrap()
                .with_escalation(durable.clone(), per_minute(3), 1, None)
                .unwrap(),
        )
        .build()
        .unwrap();
    let mut admitted = 0;
    while limiter.check(b"alice").await.allowed {
        admitted += 1;
    }
    assert_eq!(admitted, 3);
    // Refused from the shared rule's cache from now on, without a store call.
    assert!(limiter.check(b"alice").await.source.cached);
    limiter.check(b"bob").await;

    limiter.reset(b"alice").await.unwrap();
    let mut again = Vec::new();
    loop {
        let d = limiter.check(b"alice").await;
        if !d.allowed {
            break;
        }
        again.push(d.remaining);
    }
    assert_eq!(
        again,
        [2, 1, 0],
        "every tier and the durable store were reset"
    );
    assert_eq!(
        limiter.peek(b"bob").await.remaining,
        2,
        "bob's usage is kept"
    );
}

#[tokio::test]
async fn a_reset_asks_every_store_and_returns_the_first_error() {
    let down = Switch::<dyn Store>::new(store());
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(Rule::new("first", down.clone(), per_minute(2)).unwrap())
        .rule(Rule::new("second", store(), per_minute(2)).unwrap())
        .build()
        .unwrap();
    while limiter.check(b"k").await.allowed {}
    down.set(Health::Failing);
    let err = limiter.reset(b"k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    down.set(Health::Up);
    // The second rule was reset although the first failed; the first was
    // not: a second reset finishes the job.
    assert!(!limiter.check(b"k").await.allowed);
    limiter.reset(b"k").await.unwrap();
    assert!(limiter.check(b"k").await.allowed);
}

/// Several limits in one string: every one holds, and an error names the
/// part at fault.
#[tokio::test]
async fn several_limits_in_one_string_are_the_rules_of_one_limiter() {
    let policies = ratewarden_core::parse_policies("3/s ; fixed_window 5/min").unwrap();
    let clock = ManualClock::new();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rules(Rule::tiers("search", store(), &policies).unwrap())
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..4 {
        for _ in 0..5 {
            admitted += u32::from(limiter.check(b"k").await.allowed);
        }
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(admitted, 5, "3 in the first second, then the minute's 5");
    assert_eq!(limiter.check(b"k").await.source.rule, Some("search-2"));

    for (text, part, says) in [
        ("10/s; 1000/fortnight", 2, "unknown unit \"fortnight\""),
        ("10/s;; 1000/h", 2, "empty part"),
        ("10/s; 1000/h;", 3, "empty part"),
        ("", 1, "no policy"),
        ("10/s; 0/h", 2, "limit"),
        ("10/s; 10 per second", 2, "the same policy as part 1"),
    ] {
        let err = ratewarden_core::parse_policies(text).unwrap_err();
        assert_eq!(err.part(), Some(part), "{text:?}: {err}");
        assert!(err.to_string().contains(says), "{text:?}: {err}");
        assert!(
            err.to_string().contains(&format!("part {part} of")),
            "{err}"
        );
    }
    assert!(Rule::tiers("search", store(), &[]).is_err());
}

/// An admission given back is undone in every tier that counted it, the
/// durable store of an escalation included; a refusal gives nothing back.
#[tokio::test]
async fn an_admission_given_back_is_undone_in_every_tier() {
    let durable = Switch::<dyn Store>::new(store());
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(Rule::new("local", store(), per_minute(3)).unwrap())
        .rule(
            Rule::new("shared", shared(), per_minute(2))
                .unwrap()
                .with_escalation(durable.clone(), per_minute(2), 1, None)
                .unwrap(),
        )
        .build()
        .unwrap();
    for _ in 0..10 {
        let admission = limiter.check_admission(b"k", 1).await.unwrap();
        assert!(admission.decision().allowed);
        admission.refund().await;
    }
    assert_eq!(limiter.check(b"k").await.remaining, 1, "nothing was kept");
    assert_eq!(limiter.check(b"k").await.remaining, 0);
    let refused = limiter.check_admission(b"k", 1).await.unwrap();
    assert!(!refused.decision().allowed);
    refused.refund().await;
    assert!(
        !limiter.check(b"k").await.allowed,
        "a refusal gives nothing back"
    );
    assert!(
        limiter.check_admission(b"k", 3).await.is_err(),
        "a cost above a limit"
    );
}

/// A late charge on every tier: counted even on a key over its limit, so
/// it waits longer; a cost some tier never admits charges none.
#[tokio::test]
async fn a_penalty_charges_every_tier_even_over_the_limit() {
    let clock = ManualClock::new();
    let gcra = Policy::gcra(4, Duration::from_secs(4)).unwrap();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("burst", store(), gcra).unwrap())
        .rule(Rule::new("daily", shared(), per_minute(10)).unwrap())
        .build()
        .unwrap();
    for _ in 0..4 {
        assert!(limiter.check(b"card").await.allowed);
    }
    let refused = limiter.check(b"card").await;
    assert!(!refused.allowed);
    assert_eq!(refused.retry_after, Duration::from_secs(1));
    // Over the burst tier's limit, and charged all the same: three more
    // seconds to wait there, three more units counted in the daily tier.
    limiter.penalize(b"card", 3).await.unwrap();
    let waiting = limiter.peek(b"card").await;
    assert!(!waiting.allowed);
    assert_eq!(waiting.source.rule, Some("burst"));
    assert_eq!(waiting.retry_after, Duration::from_secs(4));
    clock.advance(Duration::from_secs(4));
    assert!(limiter.check(b"card").await.allowed);
    // What the daily tier has left now.
    let daily = limiter.rule("daily").unwrap();
    assert_eq!(daily.peek(b"card", &clock).await.remaining, 10 - 4 - 3 - 1);

    let e = limiter.penalize(b"card", 5).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    assert_eq!(
        daily.peek(b"card", &clock).await.remaining,
        2,
        "nothing charged"
    );
    // A store that is down: the error is returned, nothing is decided.
    let down = Limiter::builder()
        .rule(Rule::new("down", Arc::new(Unavailable), per_minute(10)).unwrap())
        .build()
        .unwrap();
    let e = down.penalize(b"card", 1).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
}
