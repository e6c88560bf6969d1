//! One `tracing` span per decision: `ratewarden.decision`, at `DEBUG`, with
//! the rule and store that answered, the outcome, what answered (the store,
//! its fallback, the failure policy or a refusal cache), the request's cost
//! and the decision's latency. Field names are dotted, as OpenTelemetry
//! attributes are, so that `tracing-opentelemetry` exports them as they
//! are. No field holds the client's key.
//!
//! Without a subscriber listening at `DEBUG` for this crate, a decision
//! pays one check of the level and the callsite's interest, and reads no
//! clock.

use std::time::Instant;

use tracing::Span;
use tracing::field::Empty;

use crate::decision::Decision;

/// The span of one decision and when it began; `None` when no subscriber
/// wants it.
pub(super) struct Traced(Option<(Span, Instant)>);

/// Whether a subscriber wants decision spans. Asked before a span is
/// made: a span made while no subscriber wants it is still built and
/// recorded for the `log` crate when some crate of the build turns on
/// tracing's `log` feature (axum's defaults do), about 300 instructions per
/// decision (callgrind of the composition bench).
#[inline]
pub(super) fn wanted() -> bool {
    tracing::enabled!(tracing::Level::DEBUG)
}

impl Traced {
    /// No span: the decision is not traced.
    pub(super) const NONE: Traced = Traced(None);

    /// Opens the span of a decision of `cost` units, if a subscriber
    /// wants it.
    pub(super) fn start(cost: u32) -> Self {
        if !wanted() {
            return Traced::NONE;
        }
        let span = tracing::debug_span!(
            "ratewarden.decision",
            ratewarden.cost = cost,
            ratewarden.rule = Empty,
            ratewarden.store = Empty,
            ratewarden.outcome = Empty,
            ratewarden.answered_by = Empty,
            ratewarden.latency_us = Empty,
        );
        if span.is_disabled() {
            Traced(None)
        } else {
            Traced(Some((span, Instant::now())))
        }
    }

    /// The span, for the awaited part of the decision to run in (the spans
    /// and events of its store calls then nest under it).
    pub(super) fn span(&self) -> Span {
        self.0
            .as_ref()
            .map_or_else(Span::none, |(span, _)| span.clone())
    }

    /// Records `decision` in the span and closes it.
    #[inline]
    pub(super) fn end(self, decision: &Decision) {
        if let Some((span, started)) = self.0 {
            record(&span, started, decision);
        }
    }
}

#[cold]
fn record(span: &Span, started: Instant, d: &Decision) {
    let outcome = match (d.allowed, d.source.shadow_refused) {
        (false, _) => "refused",
        (true, true) => "shadow_refused",
        (true, false) => "allowed",
    };
    let answered_by = if d.source.degraded {
        "failure_policy"
    } else if d.source.cached {
        "refusal_cache"
    } else if d.source.fallback {
        "fallback"
    } else if d.source.escalated {
        "escalation"
    } else {
        "store"
    };
    span.record("ratewarden.rule", d.source.rule.unwrap_or(""));
    span.record("ratewarden.store", d.source.store);
    span.record("ratewarden.outcome", outcome);
    span.record("ratewarden.answered_by", answered_by);
    span.record(
        "ratewarden.latency_us",
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    );
}
