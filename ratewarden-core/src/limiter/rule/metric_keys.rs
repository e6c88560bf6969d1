//! The keys of the series a rule counts per decision, built once per rule:
//! `ratewarden_decisions_total` for its usual decisions (outcome `allowed`,
//! `refused`, `banned` for a ban's refusals, `shadow_refused` for its
//! refusals in shadow mode), and
//! `ratewarden_fallbacks_total`, which a rule whose store is down counts on
//! every decision.
//!
//! `metrics::counter!` with labels known only at run time (the rule's name,
//! the answering store's) builds its key on every call: a vector of three
//! labels, allocated and freed, and their hash: a large share of a memory
//! limiter's decision, even with no recorder installed (the composition
//! bench shows it). The key of each decision a rule usually makes, by its store or its
//! fallback, is built here once; a recorder installed after the limiter
//! was built still sees every decision, since only the key is kept, not a
//! registered handle.

use metrics::{Key, Label, Level, Metadata};

use crate::decision::Decision;

/// The metric every decision counts.
const DECISIONS: &str = "ratewarden_decisions_total";

/// The metric every decision its fallback answered counts.
const FALLBACKS: &str = "ratewarden_fallbacks_total";

/// The histogram of every awaited store call's latency.
const CALLS: &str = "ratewarden_store_call_seconds";

/// What `counter!` in this module would pass as the metadata.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Adds one to the counter `key` in whichever recorder is installed now.
fn increment(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(1);
}

/// The two keys of one store's decisions under one rule.
#[derive(Debug, Clone)]
struct StoreKeys {
    store: &'static str,
    allowed: Key,
    refused: Key,
    banned: Key,
}

/// The outcome label of a refusal by a rule in shadow mode, which refused
/// nothing.
const SHADOW_REFUSED: &str = "shadow_refused";

/// The outcome label of a refusal of a policy's ban.
const BANNED: &str = "banned";

/// The outcome label of `decision`.
fn outcome(decision: &Decision) -> &'static str {
    match (decision.allowed, decision.source.banned) {
        (true, _) => "allowed",
        (false, false) => "refused",
        (false, true) => BANNED,
    }
}

impl StoreKeys {
    fn new(rule: &'static str, store: &'static str) -> Self {
        let key = |outcome: &'static str| {
            // The labels in `counter!`'s order, so that a recorder that
            // keeps them as given sees the same series either way.
            Key::from_parts(
                DECISIONS,
                vec![
                    Label::from_static_parts("rule", rule),
                    Label::from_static_parts("outcome", outcome),
                    Label::from_static_parts("store", store),
                ],
            )
        };
        StoreKeys {
            store,
            allowed: key("allowed"),
            refused: key("refused"),
            banned: key(BANNED),
        }
    }
}

/// A rule's decision keys: for its store and, once it has one, its
/// fallback; and its fallbacks' key.
#[derive(Debug, Clone)]
pub(crate) struct DecisionKeys {
    rule: &'static str,
    store: StoreKeys,
    fallback: Option<StoreKeys>,
    fallbacks: Key,
    /// `ratewarden_decisions_total` of the rule's shadow refusals, named
    /// by its store.
    shadow_refused: Key,
    /// `ratewarden_store_call_seconds` of the rule's store's `decide`: the
    /// call every request on a store that must be awaited makes.
    store_decide: Key,
    store_name: &'static str,
}

impl DecisionKeys {
    pub(crate) fn new(rule: &'static str, store: &'static str) -> Self {
        DecisionKeys {
            rule,
            store: StoreKeys::new(rule, store),
            fallback: None,
            fallbacks: Key::from_parts(FALLBACKS, vec![Label::from_static_parts("rule", rule)]),
            shadow_refused: Key::from_parts(
                DECISIONS,
                vec![
                    Label::from_static_parts("rule", rule),
                    Label::from_static_parts("outcome", SHADOW_REFUSED),
                    Label::from_static_parts("store", store),
                ],
            ),
            // In `histogram!`'s label order, as for the decision keys.
            store_decide: Key::from_parts(
                CALLS,
                vec![
                    Label::from_static_parts("rule", rule),
                    Label::from_static_parts("store", store),
                    Label::from_static_parts("op", "decide"),
                ],
            ),
            store_name: store,
        }
    }

    /// Records the latency of an awaited call `op` to `store`, in seconds.
    pub(crate) fn store_call_took(&self, store: &'static str, op: &'static str, seconds: f64) {
        if (store, op) == (self.store_name, "decide") {
            metrics::with_recorder(|r| r.register_histogram(&self.store_decide, &METADATA))
                .record(seconds);
        } else {
            metrics::histogram!(CALLS, "rule" => self.rule, "store" => store, "op" => op)
                .record(seconds);
        }
    }

    /// Builds the keys of the decisions of the rule's fallback, `fallback`.
    pub(crate) fn set_fallback(&mut self, fallback: &'static str) {
        self.fallback = Some(StoreKeys::new(self.rule, fallback));
    }

    /// Counts a decision of the rule's fallback in `ratewarden_fallbacks_total`.
    pub(crate) fn count_fallback(&self) {
        increment(&self.fallbacks);
    }

    /// Counts a refusal of the rule in shadow mode in
    /// `ratewarden_decisions_total`, as `outcome="shadow_refused"`.
    pub(crate) fn count_shadow_refusal(&self) {
        increment(&self.shadow_refused);
    }

    /// Counts `decision` in `ratewarden_decisions_total`.
    pub(crate) fn count(&self, decision: &Decision) {
        let store = decision.source.store;
        // A decision is named by the store that answered it, which is
        // nearly always the rule's store or its fallback; any other name
        // (a store whose decisions name it differently from `Store::name`,
        // say, or an escalation's durable store) gets its key built here,
        // as `counter!` would.
        let known = [Some(&self.store), self.fallback.as_ref()]
            .into_iter()
            .flatten()
            .find(|k| k.store == store);
        match known {
            Some(keys) => increment(match (decision.allowed, decision.source.banned) {
                (true, _) => &keys.allowed,
                (false, false) => &keys.refused,
                (false, true) => &keys.banned,
            }),
            None => metrics::counter!(DECISIONS,
                "rule" => self.rule,
                "outcome" => outcome(decision),
                "store" => store)
            .increment(1),
        }
    }
}
