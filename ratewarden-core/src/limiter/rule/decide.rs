//! How a rule decides one request: the inline path, the awaited call under
//! its timeout and breaker, the fallback and failure policy, escalation,
//! abuse events, refunds and the refusal cache.

use std::sync::atomic::Ordering;
use std::time::Duration;

use smallvec::SmallVec;

use crate::abuse::Writes;
use crate::breaker::{Breaker, BreakerState, Permit, Transition};
use crate::counter::bump;
use crate::decision::{Decision, Source};
use crate::error::{ErrorKind, StoreError};
use crate::policy::Policy;
use crate::store::Store;
use crate::time::{Clock, Timestamp};

use super::{
    Applied, CLIENT_KEY, Called, Charge, Holder, KEY_HEAD, ProbeGuard, Rule, StorageKey, micros,
};

impl Rule {
    fn holder(&self, holder: Holder) -> Option<(&dyn Store, &Policy)> {
        match holder {
            Holder::Authoritative => Some((self.store.as_ref(), &self.policy)),
            Holder::Fallback => self.fallback.as_deref().map(|s| (s, &self.policy)),
            Holder::Durable => self
                .escalation
                .as_ref()
                .map(|e| (e.store.as_ref(), &e.policy)),
        }
    }

    /// Writes the storage key into `buf`, which a request reuses for each of
    /// its rules instead of moving a new key through every call.
    // Inlined: it is called from `Limiter::check_inline` in another codegen
    // unit, on the path of every decision answered in place.
    #[inline]
    pub(crate) fn fill_storage_key<'b>(&self, buf: &'b mut StorageKey, key: &[u8]) -> &'b [u8] {
        let at = self.key_prefix.len();
        let end = at.saturating_add(key.len());
        let StorageKey { inline, heap } = buf;
        if let Some(out) = inline.get_mut(..end.max(KEY_HEAD)) {
            out[..KEY_HEAD].copy_from_slice(&self.key_head);
            match <&[u8; CLIENT_KEY]>::try_from(key) {
                Ok(client) => out[at..at + CLIENT_KEY].copy_from_slice(client),
                Err(_) => out[at..end].copy_from_slice(key),
            }
            return &inline[..end];
        }
        heap.clear();
        heap.extend_from_slice(self.key_prefix.as_bytes());
        heap.extend_from_slice(key);
        heap
    }

    /// One store call under the rule's timeout, without a breaker (a store
    /// answering inline is asked before, and needs neither).
    async fn awaited(
        &self,
        store: &dyn Store,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        #[cfg(feature = "metrics")]
        let started = std::time::Instant::now();
        let call = store.decide(key, policy, cost, now);
        // Boxed: the timer's state would otherwise be part of every future
        // that awaits this one, up to `Limiter::check`'s, which every caller
        // of `check` carries. A store that must be awaited is a round trip
        // away, beside which one allocation is nothing; an inline store
        // never comes here.
        let result = match Box::pin(tokio::time::timeout(self.timeout, call)).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::timeout(store.name(), self.timeout)),
        };
        #[cfg(feature = "metrics")]
        self.store_call_took(store.name(), "decide", started);
        result
    }

    /// The latency of an awaited store call, timeouts included. Inline
    /// calls are not timed: they cost a memory store's lookup, which the
    /// timing would double.
    #[cfg(feature = "metrics")]
    fn store_call_took(&self, store: &'static str, op: &'static str, started: std::time::Instant) {
        metrics::histogram!("ratewarden_store_call_seconds",
            "rule" => self.label, "store" => store, "op" => op)
        .record(started.elapsed().as_secs_f64());
    }

    /// One store call under a timeout and a breaker. A store that answers
    /// inline needs neither: it cannot hang, and a failure costs nothing to
    /// retry.
    // The request's inputs, one by one: a struct bundling them would be
    // built on every decision for the sake of a lint.
    #[allow(clippy::too_many_arguments)]
    async fn guarded(
        &self,
        store: &dyn Store,
        breaker: &Breaker,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
    ) -> Called {
        if let Some(result) = store.decide_inline(key, policy, cost, now) {
            return match result {
                Ok(d) => Called::Answered(d),
                Err(e) => {
                    self.store_failed(store.name(), &e);
                    Called::Failed(e)
                }
            };
        }
        let permit = breaker.permit(|| micros(clock.monotonic()));
        if permit == Permit::Skip {
            return Called::Skipped;
        }
        let guard = ProbeGuard::new(breaker, permit);
        let result = self.awaited(store, key, policy, cost, now).await;
        guard.disarm();
        let transition = match &result {
            Ok(_) => breaker.success(),
            // The caller's mistake says nothing about the store's health.
            Err(e) if e.kind() == ErrorKind::InvalidRequest => {
                breaker.release(permit);
                Transition::None
            }
            Err(_) => breaker.failure(micros(clock.monotonic())),
        };
        self.report(store, breaker, transition);
        match result {
            Ok(d) => Called::Answered(d),
            Err(e) => {
                self.store_failed(store.name(), &e);
                Called::Failed(e)
            }
        }
    }

    fn report(&self, store: &dyn Store, breaker: &Breaker, transition: Transition) {
        let open = match transition {
            Transition::Opened => true,
            Transition::Closed => false,
            Transition::None => return,
        };
        if open {
            if std::ptr::eq(breaker, &*self.breaker) {
                bump(&self.counters.breaker_opened);
            }
            tracing::warn!(rule = %self.name, store = store.name(), "circuit breaker opened");
        } else {
            tracing::info!(rule = %self.name, store = store.name(), "circuit breaker closed");
        }
        #[cfg(feature = "metrics")]
        {
            metrics::counter!("ratewarden_breaker_transitions_total",
                "rule" => self.label, "store" => store.name(),
                "to" => if open { "open" } else { "closed" })
            .increment(1);
            metrics::gauge!("ratewarden_breaker_open",
                "rule" => self.label, "store" => store.name())
            .set(if open { 1.0 } else { 0.0 });
        }
    }

    fn store_failed(&self, store: &'static str, e: &StoreError) {
        bump(&self.counters.store_errors);
        tracing::warn!(rule = %self.name, store, error = %e, "store call failed");
        #[cfg(feature = "metrics")]
        metrics::counter!("ratewarden_store_errors_total",
            "rule" => self.label, "store" => store,
            "kind" => e.kind().to_string())
        .increment(1);
    }

    /// The failure policy's decision; `store` is the store that failed.
    fn degraded(&self, store: &'static str) -> Decision {
        bump(&self.counters.degraded);
        tracing::debug!(
            rule = %self.name,
            store,
            on_failure = ?self.on_failure,
            "no store answered; failure policy decides"
        );
        Decision::degraded(self.on_failure, &self.policy, store)
    }

    /// The authoritative store, else the fallback, else the failure policy;
    /// with the store that holds the admission, if one does.
    async fn decide_local(
        &self,
        key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
    ) -> (Decision, Option<Holder>) {
        match self
            .guarded(
                self.store.as_ref(),
                &self.breaker,
                key,
                &self.policy,
                cost,
                now,
                clock,
            )
            .await
        {
            Called::Answered(d) => return (d, Some(Holder::Authoritative)),
            // The request itself is wrong: the fallback would refuse it too.
            Called::Failed(e) if e.kind() == ErrorKind::InvalidRequest => {
                return (self.degraded(self.store.name()), None);
            }
            Called::Failed(_) => {}
            Called::Skipped => bump(&self.counters.short_circuited),
        }
        let Some(fallback) = &self.fallback else {
            return (self.degraded(self.store.name()), None);
        };
        // The fallback has no breaker of its own: it is asked only when the
        // authoritative store has failed, inline if it can answer so, else
        // under the rule's timeout.
        let answer = match fallback.decide_inline(key, &self.policy, cost, now) {
            Some(answer) => answer,
            None => {
                self.awaited(fallback.as_ref(), key, &self.policy, cost, now)
                    .await
            }
        };
        self.fallen_back(fallback.as_ref(), answer)
    }

    /// The rule's answer from its fallback, asked because the authoritative
    /// store failed or its breaker is open; the failure policy's if the
    /// fallback failed too.
    fn fallen_back(
        &self,
        fallback: &dyn Store,
        answer: Result<Decision, StoreError>,
    ) -> (Decision, Option<Holder>) {
        match answer {
            Ok(mut d) => {
                bump(&self.counters.fallbacks);
                d.source.fallback = true;
                #[cfg(feature = "metrics")]
                self.metric_keys.count_fallback();
                (d, Some(Holder::Fallback))
            }
            Err(e) => {
                self.store_failed(fallback.name(), &e);
                (self.degraded(fallback.name()), None)
            }
        }
    }

    /// The answer of [`decide_local`](Self::decide_local) when the breaker
    /// keeps the authoritative store from being called and nothing else
    /// needs waiting for: the fallback's, if it answers inline, or the
    /// failure policy's. `None`, having counted nothing, when the store may
    /// be called (a closed breaker, or a cool-down just over: the probe's
    /// turn) or the fallback must be awaited: the full path decides then.
    ///
    /// A store that is down costs every request this while its breaker is
    /// open; through the full path it also cost a boxed future and two more
    /// calls asking the dead store to answer inline.
    fn short_circuited(
        &self,
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
    ) -> Option<(Decision, Option<Holder>)> {
        if !self.breaker.skips(|| micros(clock.monotonic())) {
            return None;
        }
        let Some(fallback) = &self.fallback else {
            bump(&self.counters.short_circuited);
            return Some((self.degraded(self.store.name()), None));
        };
        // `None` from `decide_inline` decides nothing (the `Store`
        // contract), so leaving for the full path here counts nothing twice.
        let answer = fallback.decide_inline(storage_key, &self.policy, cost, now)?;
        bump(&self.counters.short_circuited);
        Some(self.fallen_back(fallback.as_ref(), answer))
    }

    /// What a decision leaves behind besides itself: a refusal that a store
    /// made goes into the refusal cache, and an admission that a later rule
    /// could undo (`keep`) is charged to the store that holds it.
    fn settle(
        &self,
        key: &[u8],
        now: Timestamp,
        decision: &Decision,
        holder: Option<Holder>,
        keep: bool,
    ) -> SmallVec<[Charge; 2]> {
        if let (false, Some(cache)) = (decision.allowed || holder.is_none(), &self.refusals) {
            cache.put(key, now, decision);
        }
        let mut charges = SmallVec::new();
        if let (true, true, Some(holder)) = (keep, decision.allowed, holder) {
            charges.push(Charge::of(holder, decision));
        }
        charges
    }

    async fn record_abuse(&self, key: &[u8], d: &Decision, now: Timestamp, clock: &dyn Clock) {
        let Some(recorder) = self.escalation.as_ref().and_then(|e| e.abuse.as_ref()) else {
            return;
        };
        let mono = micros(clock.monotonic());
        let Some(writes) = recorder.refused(key, now, mono, d.source.store, self.timeout) else {
            return;
        };
        self.count_writes(writes.await);
    }

    pub(crate) fn count_writes(&self, writes: Writes) {
        let c = &self.counters;
        c.abuse_events.fetch_add(writes.written, Ordering::Relaxed);
        c.store_errors.fetch_add(writes.failed, Ordering::Relaxed);
        c.abuse_dropped.fetch_add(writes.dropped, Ordering::Relaxed);
    }

    /// Undoes the admissions of a request that was refused after all.
    pub(crate) async fn refund(
        &self,
        storage_key: &[u8],
        charges: &[Charge],
        cost: u32,
        now: Timestamp,
    ) {
        for charge in charges.iter().rev() {
            let Some((store, policy)) = self.holder(charge.holder) else {
                continue;
            };
            // A store whose breaker is open has just failed: a refund would
            // cost a timeout to save a unit, and failing it is the strict
            // side anyway.
            let skip = match charge.holder {
                Holder::Authoritative => self.breaker.state() == BreakerState::Open,
                Holder::Durable => self
                    .escalation
                    .as_ref()
                    .is_some_and(|e| e.breaker.state() == BreakerState::Open),
                Holder::Fallback => false,
            };
            let result = if skip {
                Err(StoreError::new(
                    ErrorKind::CircuitOpen,
                    store.name(),
                    "breaker open; refund skipped",
                ))
            } else {
                let admitted = Decision {
                    allowed: true,
                    limit: policy.limit(),
                    remaining: 0,
                    reset_after: charge.reset_after,
                    retry_after: Duration::ZERO,
                    source: Source::store(store.name()),
                };
                match store.refund_inline(storage_key, policy, cost, now, &admitted) {
                    Some(r) => r,
                    None => {
                        #[cfg(feature = "metrics")]
                        let started = std::time::Instant::now();
                        let call = store.refund(storage_key, policy, cost, now, &admitted);
                        // Boxed, as in `awaited`.
                        let bounded = Box::pin(tokio::time::timeout(self.timeout, call));
                        let result = match bounded.await {
                            Ok(r) => r,
                            Err(_) => Err(StoreError::timeout(store.name(), self.timeout)),
                        };
                        #[cfg(feature = "metrics")]
                        self.store_call_took(store.name(), "refund", started);
                        result
                    }
                }
            };
            match result {
                Ok(()) => bump(&self.counters.refunds),
                Err(e) => {
                    bump(&self.counters.refund_failures);
                    tracing::warn!(rule = %self.name, store = store.name(), error = %e,
                        "refund failed; the admission stays counted");
                }
            }
        }
    }

    /// Applies the rule for one request: the local decision, then the
    /// escalation, with the admissions a later refusal must undo.
    /// The refusal cache's answer for `key`, if it holds one, counted as an
    /// abuse event like any refusal.
    pub(crate) async fn cached_refusal(
        &self,
        key: &[u8],
        now: Timestamp,
        clock: &dyn Clock,
    ) -> Option<Decision> {
        let mut d = self.refusals.as_ref()?.get(key, now)?;
        bump(&self.counters.refusals_cached);
        self.record_abuse(key, &d, now, clock).await;
        self.finish(&mut d);
        Some(d)
    }

    /// [`apply`](Self::apply) for a rule without escalation that needs no
    /// waiting: its store answers inline, or its breaker is open and its
    /// fallback answers inline or it has none (see
    /// [`short_circuited`](Self::short_circuited)). `None` when the rule
    /// needs awaiting (an escalation, a store that must be awaited, or one
    /// that failed, which the full path asks again and handles). `asked`:
    /// the store was just asked to answer inline and did not.
    // The request's inputs, one by one, as `apply` takes them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_inline(
        &self,
        key: &[u8],
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
        keep: bool,
        asked: bool,
    ) -> Option<Applied> {
        if self.escalation.is_some() {
            return None;
        }
        let answer = if asked {
            None
        } else {
            self.store
                .decide_inline(storage_key, &self.policy, cost, now)
        };
        let (decision, holder) = match answer {
            Some(Ok(decision)) => (decision, Some(Holder::Authoritative)),
            Some(Err(_)) => return None,
            None => self.short_circuited(storage_key, cost, now, clock)?,
        };
        let charges = self.settle(key, now, &decision, holder, keep);
        Some(Applied { decision, charges })
    }

    /// `keep` says whether a later refusal could need this rule's
    /// admission undone: not for the last rule of a limiter, which then
    /// skips copying its decision.
    pub(crate) async fn apply(
        &self,
        key: &[u8],
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
        keep: bool,
    ) -> Applied {
        // A store answering inline, the common case of a local tier, is
        // decided without building the awaiting machinery at all; a failure
        // takes the full path, which asks again and handles it.
        let inline = match self
            .store
            .decide_inline(storage_key, &self.policy, cost, now)
        {
            Some(Ok(d)) => Some((d, Some(Holder::Authoritative))),
            _ => None,
        };
        let (decision, holder) = match inline {
            Some(answer) => answer,
            None => self.decide_local(storage_key, cost, now, clock).await,
        };
        let keep = keep || self.escalation.is_some();
        let mut charges = self.settle(key, now, &decision, holder, keep);
        let Some(escalation) = &self.escalation else {
            return Applied { decision, charges };
        };
        if !decision.allowed {
            self.record_abuse(key, &decision, now, clock).await;
            return Applied { decision, charges };
        }
        if !escalation.sampler.sample() {
            return Applied { decision, charges };
        }
        bump(&self.counters.escalations);
        let durable = self
            .guarded(
                escalation.store.as_ref(),
                &escalation.breaker,
                storage_key,
                &escalation.policy,
                cost,
                now,
                clock,
            )
            .await;
        match durable {
            Called::Answered(mut refused) if !refused.allowed => {
                refused.source.escalated = true;
                self.refund(storage_key, &charges, cost, now).await;
                self.record_abuse(key, &refused, now, clock).await;
                Applied {
                    decision: refused,
                    charges: SmallVec::new(),
                }
            }
            Called::Answered(admitted) => {
                charges.push(Charge::of(Holder::Durable, &admitted));
                let mut decision = decision;
                decision.source.escalated = true;
                Applied { decision, charges }
            }
            Called::Failed(_) | Called::Skipped => Applied { decision, charges },
        }
    }

    pub(crate) fn finish(&self, decision: &mut Decision) {
        decision.source.rule = Some(self.label);
        if decision.allowed {
            self.counters.allowed.bump();
        } else {
            self.counters.refused.bump();
        }
        #[cfg(feature = "metrics")]
        self.metric_keys.count(decision);
    }

    /// Applies this rule alone to `key` at the clock's current time,
    /// following its fallback, escalation and failure policy.
    pub async fn check(&self, key: &[u8], clock: &dyn Clock) -> Decision {
        let now = clock.now();
        if let Some(d) = self.cached_refusal(key, now, clock).await {
            return d;
        }
        let mut buf = StorageKey::new();
        let storage_key = self.fill_storage_key(&mut buf, key);
        let mut decision = self
            .apply(key, storage_key, self.cost, now, clock, false)
            .await
            .decision;
        self.finish(&mut decision);
        decision
    }
}
