//! `ratewarden_decisions_total` as a recorder sees it: one increment per
//! decision, under the rule, the answering store and the outcome, whether
//! the decision came from the rule's store, its fallback, its failure
//! policy or a store whose decisions name another store; and a recorder
//! that arrives after the limiter was built still sees every decision.

#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
};
use ratewarden_conformance::broken::{ReferenceStore, Unavailable};
use ratewarden_core::{
    Capabilities, Decision, FailurePolicy, Limiter, ManualClock, Policy, Refund, Request, Rule,
    Store, StoreError,
};

/// Series (`name{k=v,…}`, labels in the order given) → total.
type Totals = Arc<Mutex<BTreeMap<String, u64>>>;

/// A recorder of counters only, keeping each series' total.
#[derive(Default)]
struct Totalling {
    totals: Totals,
}

struct Series {
    name: String,
    totals: Totals,
}

impl CounterFn for Series {
    fn increment(&self, value: u64) {
        *self
            .totals
            .lock()
            .unwrap()
            .entry(self.name.clone())
            .or_default() += value;
    }

    fn absolute(&self, value: u64) {
        self.totals.lock().unwrap().insert(self.name.clone(), value);
    }
}

impl Recorder for Totalling {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        Counter::from_arc(Arc::new(Series {
            name: format!("{}{{{}}}", key.name(), labels.join(",")),
            totals: self.totals.clone(),
        }))
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

fn policy() -> Policy {
    Policy::gcra(3, Duration::from_secs(60)).unwrap()
}

fn one_rule(clock: &ManualClock, rule: Rule) -> Limiter {
    Limiter::builder()
        .clock(clock.clone())
        .rule(rule)
        .build()
        .unwrap()
}

/// The reference store under another name: its decisions name
/// `reference`, its `Store::name` says `renamed`.
#[derive(Debug)]
struct Renamed(ReferenceStore);

#[async_trait]
impl Store for Renamed {
    fn name(&self) -> &'static str {
        "renamed"
    }

    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }

    fn max_key_len(&self) -> usize {
        self.0.max_key_len()
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.0.decide(request).await
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.0.refund(refund).await
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.0.peek(request).await
    }

    async fn reset(
        &self,
        key: ratewarden_core::Key<'_>,
        policy: &Policy,
    ) -> Result<(), StoreError> {
        self.0.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.0.penalize(request).await
    }
}

fn decisions(rule: &str, outcome: &str, store: &str) -> String {
    format!("ratewarden_decisions_total{{rule={rule},outcome={outcome},store={store}}}")
}

#[test]
fn every_decision_is_counted_under_its_rule_store_and_outcome() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let clock = ManualClock::new();
    // Every limiter is built before the recorder is set.
    let local = one_rule(
        &clock,
        Rule::new("local", Arc::new(ReferenceStore::new(100)), policy()).unwrap(),
    );
    let fallback = one_rule(
        &clock,
        Rule::new("fallback", Arc::new(Unavailable), policy())
            .unwrap()
            .with_fallback(Arc::new(ReferenceStore::new(100)))
            .unwrap(),
    );
    let degraded = one_rule(
        &clock,
        Rule::new("degraded", Arc::new(Unavailable), policy())
            .unwrap()
            .on_failure(FailurePolicy::Closed),
    );
    let renamed = one_rule(
        &clock,
        Rule::new(
            "renamed",
            Arc::new(Renamed(ReferenceStore::new(100))),
            policy(),
        )
        .unwrap(),
    );
    let shadow = one_rule(
        &clock,
        Rule::new("shadow", Arc::new(ReferenceStore::new(100)), policy())
            .unwrap()
            .with_shadow(true),
    );
    let recorder = Totalling::default();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            for _ in 0..5 {
                // Both entry points: the inline one and the awaited one.
                assert!(local.try_check(b"a").is_ok());
                local.check(b"b").await;
                fallback.check(b"c").await;
                degraded.check(b"d").await;
                renamed.check(b"e").await;
                assert!(shadow.check(b"f").await.allowed);
            }
        })
    });
    let want: BTreeMap<String, u64> = [
        (decisions("local", "allowed", "reference"), 6),
        (decisions("local", "refused", "reference"), 4),
        (decisions("fallback", "allowed", "reference"), 3),
        (decisions("fallback", "refused", "reference"), 2),
        (decisions("degraded", "refused", "unavailable"), 5),
        (decisions("renamed", "allowed", "reference"), 3),
        (decisions("renamed", "refused", "reference"), 2),
        // A rule in shadow mode counts what it would have refused apart.
        (decisions("shadow", "allowed", "reference"), 3),
        (decisions("shadow", "shadow_refused", "reference"), 2),
        // The dead store fails three times, which opens its breaker; the
        // fourth request skips it, and the fifth repeats the fallback's
        // refusal from the rule's refusal cache (the dead store declares
        // itself shared), still named by the store that refused.
        ("ratewarden_fallbacks_total{rule=fallback}".to_owned(), 4),
        (
            "ratewarden_store_errors_total{rule=fallback,store=unavailable,kind=unavailable}"
                .to_owned(),
            3,
        ),
        (
            "ratewarden_store_errors_total{rule=degraded,store=unavailable,kind=unavailable}"
                .to_owned(),
            3,
        ),
    ]
    .into_iter()
    .collect();
    let stats = fallback.stats();
    assert_eq!(
        (stats[0].store_errors, stats[0].short_circuited),
        (3, 1),
        "{stats:?}"
    );
    assert_eq!(stats[0].refusals_cached, 1, "{stats:?}");
    let got = recorder.totals.lock().unwrap().clone();
    let got: BTreeMap<String, u64> = got
        .into_iter()
        .filter(|(k, _)| !k.starts_with("ratewarden_breaker"))
        .collect();
    assert_eq!(got, want);
}
