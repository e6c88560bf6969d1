//! `Limiter::check_inline`: a limiter of one rule on a store that answers
//! inline is decided at once, exactly as `check` decides it, and everything
//! else is left to `check` with nothing decided or counted.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Switch;
use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};

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
            .check_inline(b"client")
            .expect("an inline store answers");
        let want = awaited.check(b"client").await;
        assert_eq!(got, want, "request {step}");
        assert_eq!(got.source.rule, Some("r"));
        clock.advance(Duration::from_secs(7));
    }
    // Both paths count alike, and share the rule's state: `check` after
    // `check_inline` sees the units it spent.
    assert_eq!(inline.stats(), awaited.stats());
    let stats = &inline.stats()[0];
    assert!(stats.allowed > 0 && stats.refused > 0, "{stats:?}");
    assert_eq!(
        inline.check(b"client").await,
        awaited.check(b"client").await
    );
}

#[tokio::test]
async fn compositions_that_may_wait_are_left_to_check_with_nothing_counted() {
    let clock = ManualClock::new();
    let awaited = Switch::<dyn Store>::new(inline_store());
    let cases: Vec<(&str, Limiter)> = vec![
        (
            "two rules",
            limiter(&clock, inline_rule("a"), Some(inline_rule("b"))),
        ),
        (
            "a store that must be awaited",
            limiter(
                &clock,
                Rule::new("a", awaited.clone(), policy()).unwrap(),
                None,
            ),
        ),
        (
            "a refusal cache",
            limiter(
                &clock,
                inline_rule("a").with_refusal_cache(10).unwrap(),
                None,
            ),
        ),
        (
            "an escalation",
            limiter(
                &clock,
                inline_rule("a")
                    .with_escalation(inline_store(), policy(), 1, None)
                    .unwrap(),
                None,
            ),
        ),
    ];
    for (case, limiter) in cases {
        assert_eq!(limiter.check_inline(b"client"), None, "{case}");
        for stats in limiter.stats() {
            assert_eq!((stats.allowed, stats.refused), (0, 0), "{case}: {stats:?}");
        }
        // Nothing was spent: `check` still finds the whole quota.
        let decision = limiter.check(b"client").await;
        assert!(decision.allowed, "{case}");
        assert_eq!(decision.remaining, 2, "{case}");
    }
    assert_eq!(awaited.calls(), 1, "only `check` reached the awaited store");
}

#[tokio::test]
async fn an_inline_store_error_is_left_to_the_failure_policy() {
    let clock = ManualClock::new();
    let limiter = limiter(&clock, inline_rule("r"), None);
    let too_long = [b'k'; 100];
    assert_eq!(limiter.check_inline(&too_long), None);
    assert_eq!(limiter.stats()[0].store_errors, 0, "nothing counted yet");
    let decision = limiter.check(&too_long).await;
    assert!(decision.source.degraded, "{decision:?}");
    assert!(decision.allowed, "the default failure policy admits");
    let stats = &limiter.stats()[0];
    assert_eq!((stats.store_errors, stats.degraded), (1, 1), "{stats:?}");
}

/// A store that answers every call inline with one fixed decision.
#[derive(Debug)]
struct Fixed(ratewarden_core::Decision);

#[async_trait::async_trait]
impl Store for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }

    // An in-process store's, as the reference store declares them.
    fn capabilities(&self) -> ratewarden_core::Capabilities {
        inline_store().capabilities()
    }

    async fn decide(
        &self,
        _: &[u8],
        _: &Policy,
        _: u32,
        _: ratewarden_core::Timestamp,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        Ok(self.0.clone())
    }

    fn decide_inline(
        &self,
        _: &[u8],
        _: &Policy,
        _: u32,
        _: ratewarden_core::Timestamp,
    ) -> Option<Result<ratewarden_core::Decision, ratewarden_core::StoreError>> {
        Some(Ok(self.0.clone()))
    }
}

/// The limiter copies the store's decision field by field (see
/// `ratewarden_core::limiter::copied`): every field must arrive as the store
/// gave it, whichever flags are set, with the rule's name added.
#[test]
fn an_inline_decision_keeps_every_field_of_the_stores() {
    for flags in 0..16u8 {
        let mut source = ratewarden_core::Source::store("fixed");
        source.fallback = flags & 1 != 0;
        source.degraded = flags & 2 != 0;
        source.escalated = flags & 4 != 0;
        source.cached = flags & 8 != 0;
        let given = ratewarden_core::Decision {
            allowed: flags % 3 == 0,
            limit: 7,
            remaining: 5,
            reset_after: Duration::new(3, 250_000_000),
            retry_after: Duration::new(1, 500_000_001),
            source,
        };
        let clock = ManualClock::new();
        let rule = Rule::new("r", Arc::new(Fixed(given.clone())), policy()).unwrap();
        let got = limiter(&clock, rule, None)
            .check_inline(b"client")
            .expect("the store answers inline");
        let mut want = given;
        want.source.rule = Some("r");
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
