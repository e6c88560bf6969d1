//! `Limiter::try_check`: a limiter whose stores answer inline is decided at
//! once, exactly as `check` decides it; one that must wait on a store gives
//! a `PendingCheck` that finishes the decision, with nothing asked twice.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Switch;
use ratewarden_core::{
    ConfigError, Key, Limiter, ManualClock, Policy, Refund, Request, Rule, Store,
};

fn policy() -> Policy {
    Policy::gcra(3, Duration::from_secs(60)).unwrap()
}

/// The reference store answers inline; bounded, exact.
fn inline_store() -> Arc<dyn Store> {
    Arc::new(ReferenceStore::new(1_000).with_max_key_len(64))
}

/// A limiter of `first` and then `then`, if given.
fn limiter(clock: &ManualClock, first: Rule, then: Option<Rule>) -> Limiter {
    let builder = Limiter::builder().clock(clock.clone()).rule(first);
    match then {
        Some(rule) => builder.rule(rule),
        None => builder,
    }
    .build()
    .unwrap()
}

/// A rule named `name` on the inline store.
fn inline_rule(name: &str) -> Rule {
    Rule::new(name, inline_store(), policy()).unwrap()
}

#[tokio::test]
async fn one_inline_rule_is_decided_at_once_as_check_decides_it() {
    let clock = ManualClock::new();
    let inline = limiter(&clock, inline_rule("r"), None);
    let awaited = limiter(&clock, inline_rule("r"), None);
    for step in 0..8 {
        let got = inline
            .try_check(b"client")
            .expect("an inline store answers");
        let want = awaited.check(b"client").await;
        assert_eq!(got, want, "request {step}");
        assert_eq!(got.source.rule, Some("r"));
        clock.advance(Duration::from_secs(7));
    }
    // Both paths count alike, and share the rule's state: `check` after
    // `try_check` sees the units it spent.
    assert_eq!(inline.stats(), awaited.stats());
    let stats = &inline.stats()[0];
    assert!(stats.allowed > 0 && stats.refused > 0, "{stats:?}");
    assert_eq!(
        inline.check(b"client").await,
        awaited.check(b"client").await
    );
}

#[tokio::test]
async fn compositions_of_inline_stores_are_decided_at_once() {
    let clock = ManualClock::new();
    let cases: Vec<(&str, Limiter)> = vec![
        (
            "two rules",
            limiter(&clock, inline_rule("a"), Some(inline_rule("b"))),
        ),
        (
            "a refusal cache",
            limiter(
                &clock,
                inline_rule("a").with_refusal_cache(10).unwrap(),
                None,
            ),
        ),
    ];
    for (case, limiter) in cases {
        for want_remaining in [2, 1, 0] {
            let decision = limiter.try_check(b"client").expect(case);
            assert!(decision.allowed, "{case}");
            assert_eq!(decision.remaining, want_remaining, "{case}");
        }
        let refused = limiter.try_check(b"client").expect(case);
        assert!(!refused.allowed, "{case}");
        assert_eq!(limiter.stats()[0].allowed, 3, "{case}");
    }
}

/// One rule on a store that must be awaited (Redis, Postgres): asked
/// inline once and awaited once, through `check`, through `try_check` and
/// its `PendingCheck`, and with a memory tier in front.
#[tokio::test]
async fn an_awaited_store_is_asked_inline_once_per_request() {
    let clock = ManualClock::new();
    // Never answers inline, as a network store; counts inline asks and calls.
    let store = Switch::<dyn Store>::new(inline_store());
    let shared = || {
        Rule::new("shared", store.clone(), policy())
            .unwrap()
            .without_refusal_cache()
    };
    let counts = || (store.inline_asks(), store.calls());
    let one = limiter(&clock, shared(), None);
    assert!(one.check(b"a").await.allowed);
    assert_eq!(counts(), (1, 1), "check");
    let pending = one.try_check(b"b").expect_err("the store must be awaited");
    assert_eq!(counts(), (2, 1), "try_check asked inline, awaited nothing");
    assert_eq!(one.stats()[0].allowed, 1, "nothing counted before the wait");
    assert!(pending.decide().await.allowed);
    assert_eq!(
        counts(),
        (2, 2),
        "the pending check awaited, asked nothing inline"
    );
    let tiers = limiter(&clock, inline_rule("local"), Some(shared()));
    assert!(tiers.check(b"c").await.allowed);
    assert_eq!(counts(), (3, 3), "behind a memory tier");
}

/// A `PendingCheck` is decided as `check` decides: an escalating rule
/// always waits (its durable call may), and nothing is counted until it does.
#[tokio::test]
async fn a_pending_check_decides_as_check_does() {
    let clock = ManualClock::new();
    let escalating = || {
        inline_rule("a")
            .with_escalation(inline_store(), policy(), 1, None)
            .unwrap()
    };
    let pending = limiter(&clock, escalating(), None);
    let checked = limiter(&clock, escalating(), None);
    for step in 0..5 {
        let waiting = pending
            .try_check(b"client")
            .expect_err("an escalation waits");
        let stats = &pending.stats()[0];
        assert_eq!(
            stats.allowed + stats.refused,
            step,
            "nothing counted before the wait: {stats:?}"
        );
        let got = waiting.decide().await;
        let want = checked.check(b"client").await;
        assert_eq!(got, want, "request {step}");
    }
    assert_eq!(pending.stats(), checked.stats());
}

#[tokio::test]
async fn an_inline_store_error_is_decided_at_once_by_the_failure_policy() {
    let clock = ManualClock::new();
    let limiter = limiter(&clock, inline_rule("r"), None);
    let too_long = [b'k'; 100];
    let decision = limiter.try_check(&too_long).expect("decided inline");
    assert!(decision.source.degraded, "{decision:?}");
    assert!(decision.allowed, "the default failure policy admits");
    let stats = &limiter.stats()[0];
    assert_eq!((stats.store_errors, stats.degraded), (1, 1), "{stats:?}");
    assert_eq!(limiter.check(&too_long).await, decision);
}

/// A store that answers every call inline with one fixed decision.
#[derive(Debug)]
struct Fixed(ratewarden_core::Decision);

#[ratewarden_core::async_trait]
impl Store for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }

    // An in-process store's, as the reference store declares them.
    fn capabilities(&self) -> ratewarden_core::Capabilities {
        inline_store().capabilities()
    }

    fn max_key_len(&self) -> usize {
        64
    }

    async fn refund(&self, _: Refund<'_>) -> Result<(), ratewarden_core::StoreError> {
        Ok(())
    }

    async fn decide(
        &self,
        _: Request<'_>,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        Ok(self.0.clone())
    }

    fn decide_inline(
        &self,
        _: Request<'_>,
    ) -> Option<Result<ratewarden_core::Decision, ratewarden_core::StoreError>> {
        Some(Ok(self.0.clone()))
    }

    async fn peek(
        &self,
        request: Request<'_>,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let _ = (key, policy, cost, now);
        Ok(self.0.clone())
    }

    async fn reset(
        &self,
        key: Key<'_>,
        policy: &Policy,
    ) -> Result<(), ratewarden_core::StoreError> {
        let _ = (key, policy);
        Ok(())
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), ratewarden_core::StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let _ = (key, policy, cost, now);
        Ok(())
    }
}

/// The rule's policy, as `Source::policy` names it.
static POLICY: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(policy);

/// Every field of an inline store's decision arrives as the store gave it,
/// whichever flags are set, with the rule's name and policy added.
#[test]
fn an_inline_decision_keeps_every_field_of_the_stores() {
    for flags in 0..16u8 {
        let mut source = ratewarden_core::Source::store("fixed");
        source.fallback = flags & 1 != 0;
        source.degraded = flags & 2 != 0;
        source.escalated = flags & 4 != 0;
        source.cached = flags & 8 != 0;
        let mut given = ratewarden_core::Decision::new(
            flags % 3 == 0,
            &Policy::fixed_window(7, Duration::from_secs(9)).unwrap(),
            5,
            Duration::new(3, 250_000_000),
            Duration::new(1, 500_000_001),
            "fixed",
        );
        given.source = source;
        let clock = ManualClock::new();
        let rule = Rule::new("r", Arc::new(Fixed(given.clone())), policy()).unwrap();
        let got = limiter(&clock, rule, None)
            .try_check(b"client")
            .expect("the store answers inline");
        let mut want = given;
        want.source.rule = Some("r");
        // And the policy the rule decided under: a durable refusal's would
        // be the escalation's, and this rule has none.
        want.source.policy = Some(&*POLICY);
        assert_eq!(got, want, "flags {flags:#06b}");
    }
}

/// Storage keys are `{rule}:{key}` whatever the lengths: the 32-byte client
/// keys copied whole, other keys that fit on the stack, and keys too long
/// for it (built on the heap).
#[test]
fn storage_keys_are_the_prefix_and_the_key_at_every_length() {
    for name_len in [1, 5, 31, 47, ratewarden_core::MAX_RULE_NAME] {
        let name = "n".repeat(name_len);
        let rule = Rule::new(name.clone(), inline_store(), policy()).unwrap();
        for key_len in (0..=140).chain([1_000]) {
            let key: Vec<u8> = (0..key_len).map(|i| b'a' + (i % 26) as u8).collect();
            let want = [format!("{name}:").as_bytes(), &key].concat();
            assert_eq!(
                rule.storage_key(&key),
                want,
                "name {name_len}, key {key_len}"
            );
        }
    }
}

/// Every caller of `check` carries its future (a handler awaiting it holds
/// it in its own, which axum boxes per request), so the paths that must wait
/// on a store box their own state instead of growing it. The bound has room
/// for the compiler's layout to change; a future above it has taken in the
/// state of an awaited path (a timer, an abuse write, a refund) unboxed.
#[test]
fn a_check_future_stays_small() {
    const BOUND: usize = 1_536;
    let clock = ManualClock::new();
    let two = limiter(&clock, inline_rule("a"), Some(inline_rule("b")));
    let size = std::mem::size_of_val(&two.check(b"client"));
    assert!(
        size <= BOUND,
        "a check future of {size} bytes, above {BOUND}"
    );
}

/// `try_check_cost` decides a request of several units as `check_cost` does, and
/// refuses the costs `check_cost` refuses, naming the same limit, before
/// any unit is spent: at the bound of the tightest rule (its limit over its
/// units per request, or its escalation policy's) and one past it.
#[tokio::test]
async fn try_check_cost_decides_and_refuses_costs_as_check_cost_does() {
    let clock = ManualClock::new();
    let window = Duration::from_secs(60);
    let build = || {
        let wide = Rule::new(
            "wide",
            inline_store(),
            Policy::fixed_window(100, window).unwrap(),
        )
        .unwrap();
        // 30 / 3 units per request: costs up to 10; the escalation policy
        // (24 / 3) lowers it to 8.
        let narrow = Rule::new(
            "narrow",
            inline_store(),
            Policy::fixed_window(30, window).unwrap(),
        )
        .unwrap()
        .with_units_per_request(3)
        .unwrap()
        .with_escalation(
            inline_store(),
            Policy::fixed_window(24, window).unwrap(),
            1,
            None,
        )
        .unwrap();
        limiter(&clock, wide, Some(narrow))
    };
    let (tried, awaited) = (build(), build());
    // Each error names the first rule's refusal: units and the limit.
    for (cost, units, limit) in [(0, 0, 100), (9, 27, 24), (u32::MAX, u32::MAX, 100)] {
        let want = ConfigError::InvalidCost { cost: units, limit };
        assert_eq!(awaited.check_cost(b"client", cost).await, Err(want.clone()));
        assert_eq!(tried.try_check_cost(b"client", cost).err(), Some(want));
    }
    for cost in [8, 1, 8] {
        let want = awaited.check_cost(b"client", cost).await.unwrap();
        let got = match tried.try_check_cost(b"client", cost).unwrap() {
            Ok(decision) => decision,
            Err(pending) => pending.decide().await,
        };
        assert_eq!(got, want, "cost {cost}");
    }
    // The first 8 spend the escalation's 24 units, so the next two
    // requests are refused for now, not invalid; the errors spent nothing.
    assert_eq!(tried.stats(), awaited.stats());
    let narrow = &tried.stats()[1];
    assert_eq!((narrow.allowed, narrow.refused), (1, 2), "{narrow:?}");
}
