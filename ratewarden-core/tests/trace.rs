//! One `ratewarden.decision` span per decision, as a subscriber sees it:
//! the rule and store that answered, the outcome, what answered, the cost
//! and the latency, on every entry point, inline or awaited; never the
//! client's key.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratewarden_conformance::broken::{ReferenceStore, Unavailable};
use ratewarden_conformance::composition::Switch;
use ratewarden_core::{FailurePolicy, Limiter, ManualClock, Policy, Rule, Store};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Each span's name and fields, in the order the spans were opened.
type Spans = Arc<Mutex<Vec<(String, BTreeMap<String, String>)>>>;

/// A subscriber that keeps every span's fields and nothing else.
#[derive(Default)]
struct Keeping {
    spans: Spans,
    next: AtomicU64,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Keeping {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = BTreeMap::new();
        span.record(&mut Fields(&mut fields));
        let mut spans = self.spans.lock().unwrap();
        spans.push((span.metadata().name().to_owned(), fields));
        self.next.fetch_add(1, Ordering::Relaxed);
        Id::from_u64(spans.len() as u64)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut spans = self.spans.lock().unwrap();
        let (_, fields) = &mut spans[span.into_u64() as usize - 1];
        values.record(&mut Fields(fields));
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn per_minute(n: u32) -> Policy {
    Policy::fixed_window(n, Duration::from_secs(60)).unwrap()
}

/// The decision spans' fields, but the latency, which is checked apart.
fn decisions(spans: &Spans) -> Vec<BTreeMap<String, String>> {
    spans
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| name == "ratewarden.decision")
        .map(|(_, fields)| {
            let mut fields = fields.clone();
            let latency = fields.remove("ratewarden.latency_us").expect("a latency");
            assert!(latency.parse::<u64>().is_ok(), "{latency}");
            fields
        })
        .collect()
}

fn span(rule: &str, store: &str, outcome: &str, by: &str, cost: u32) -> BTreeMap<String, String> {
    [
        ("ratewarden.rule", rule),
        ("ratewarden.store", store),
        ("ratewarden.outcome", outcome),
        ("ratewarden.answered_by", by),
        ("ratewarden.cost", &cost.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

#[test]
fn every_decision_is_one_span_with_its_rule_store_outcome_and_latency() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let memory: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    // Awaited: it never answers inline.
    let awaited = Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(100)));
    let one = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("search", memory.clone(), per_minute(2)).unwrap())
        .build()
        .unwrap();
    let tiers = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new("trial", memory.clone(), per_minute(1))
                .unwrap()
                .with_shadow(true),
        )
        .rule(Rule::new("upload", awaited.clone(), per_minute(5)).unwrap())
        .build()
        .unwrap();
    let dead = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new("login", Arc::new(Unavailable), per_minute(5))
                .unwrap()
                .on_failure(FailurePolicy::Closed),
        )
        .build()
        .unwrap();
    let keeping = Keeping::default();
    let spans = keeping.spans.clone();
    tracing::subscriber::with_default(keeping, || {
        rt.block_on(async {
            assert!(one.check(b"secret-client-key").await.allowed);
            assert!(one.try_check_cost(b"secret-client-key", 1).unwrap().is_ok());
            assert!(
                !one.check_cost(b"secret-client-key", 1)
                    .await
                    .unwrap()
                    .allowed
            );
            assert!(
                tiers
                    .check_cost(b"secret-client-key", 1)
                    .await
                    .unwrap()
                    .allowed
            );
            let pending = tiers.try_check(b"secret-client-key").unwrap_err();
            assert!(pending.decide().await.source.shadow_refused);
            let admission = tiers
                .check_admission(b"secret-client-key", 1)
                .await
                .unwrap();
            assert!(admission.decision().allowed);
            assert!(!dead.check(b"secret-client-key").await.allowed);
        })
    });
    assert_eq!(
        decisions(&spans),
        [
            span("search", "reference", "allowed", "store", 1),
            span("search", "reference", "allowed", "store", 1),
            span("search", "reference", "refused", "store", 1),
            span("upload", "reference", "allowed", "store", 1),
            span("upload", "reference", "shadow_refused", "store", 1),
            span("upload", "reference", "shadow_refused", "store", 1),
            span("login", "unavailable", "refused", "failure_policy", 1),
        ]
    );
    for (_, fields) in spans.lock().unwrap().iter() {
        for value in fields.values() {
            assert!(!value.contains("secret-client-key"), "{fields:?}");
        }
    }
}
