//! How a rule decides one request, in two steps: [`Rule::local_now`] decides
//! everything that needs no waiting (a store answering inline, an open
//! breaker, a fallback answering inline) and asks the rule's store inline
//! exactly once; [`Rule::resume`] awaits what is left, under the rule's
//! timeout and breaker, and never asks inline again. Then the fallback and
//! failure policy, escalation, abuse events, refunds and the refusal cache.

// About 920 lines: all a rule does with one key (ask its store under the
// breaker, fallback and failure policy, answer from its refusal cache,
// escalate, give back, peek, reset, penalize), one concern read in one
// place; building a rule is `rule.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use smallvec::SmallVec;

use crate::abuse::Writes;
use crate::counter::bump;
use crate::decision::Decision;
use crate::error::{ErrorKind, StoreError};
use crate::failure::{Attempt, Breaker, BreakerState, Transition};
use crate::invalidation::Ticket;
use crate::policy::Policy;
use crate::store::{Key, Refund, Request, Store};
use crate::time::{Clock, Timestamp};

use crate::failure::ProbeGuard;
use crate::time::duration_to_micros as micros;

use super::{
    Applied, CLIENT_KEY, Called, Charge, Holder, INLINE_STORAGE_KEY, Rule, StorageKey, WORD_SLACK,
};

/// What [`Rule::local_now`] learned before it had to stop: what
/// [`Rule::resume`] must await, so that nothing is asked twice.
pub(crate) enum Tried {
    /// The rule's store must be awaited (it did not answer inline) and its
    /// breaker lets the call through.
    Store,
    /// The rule's store failed or is skipped by its breaker, and the
    /// fallback must be awaited (it did not answer inline).
    Fallback,
    /// The local decision is made; the escalation is left.
    Local(Decision, Option<Holder>),
}

/// A rule's local decision, made at once or left to await.
pub(crate) enum Local {
    /// Decided without waiting, with the store that holds the admission.
    Now(Decision, Option<Holder>),
    /// [`Rule::resume`] decides.
    Wait(Tried),
}

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

    /// Writes the storage key, `{name}:` then `key`, into `buf`, which a
    /// request reuses for each of its rules instead of moving a new key
    /// through every call: on the stack (see
    /// [`fill_inline_key`](Self::fill_inline_key)), or on the heap when it
    /// is longer than [`INLINE_STORAGE_KEY`].
    #[inline(always)]
    pub(crate) fn fill_storage_key<'b>(&self, buf: &'b mut StorageKey, key: &[u8]) -> &'b [u8] {
        let StorageKey { inline, heap } = buf;
        if let Some(written) = self.fill_inline_key(inline, key) {
            return written;
        }
        heap.clear();
        heap.extend_from_slice(self.key_prefix.as_bytes());
        heap.extend_from_slice(key);
        heap
    }

    /// Writes the storage key into `inline` and returns it, or returns
    /// `None`, having written nothing that counts, when it is longer than
    /// [`INLINE_STORAGE_KEY`].
    ///
    /// Why word by word: a store reads the key back at once, a memory
    /// store in 8-byte words from its start. Copied as two blocks (the
    /// prefix, then the key at the prefix's length), every word across the
    /// seam was a load spanning two stores, which the CPU cannot forward
    /// and waits out: a one-rule limiter's decision cost 1.35–1.50× the
    /// store's own, 1.27–1.32× once written this way (composition bench,
    /// one hot key and 1,000 keys). Here every 8-byte word is stored
    /// whole: the prefix's whole words, then words assembled in registers
    /// (the prefix's tail, the key shifted by the prefix's length; a
    /// 32-byte client key's words read whole from where each starts in
    /// it), so that each word a store reads comes from one store.
    // Always inlined: called from `Limiter::begin` in another codegen
    // unit, on the path of every decision answered in place, it was left
    // an outlined call that saved and restored six registers. A client
    // key is tested first, and the prefix kept as words: the key's length
    // then bounds every index, which needs no check, and no length is
    // summed or compared but the prefix's (with `Limiter::stepped` kept
    // out of line, a one-rule limiter's decision went from 547 to 531
    // instructions; `scripts/instructions.sh`).
    #[inline(always)]
    fn fill_inline_key<'b>(
        &self,
        inline: &'b mut [u8; INLINE_STORAGE_KEY + WORD_SLACK],
        key: &[u8],
    ) -> Option<&'b [u8]> {
        let at = self.key_prefix.len();
        let first = at / 8;
        if let Ok(client) = <&[u8; CLIENT_KEY]>::try_from(key) {
            // Never true (names are short): it tells the compiler so.
            if at > INLINE_STORAGE_KEY - CLIENT_KEY {
                return None;
            }
            put_head(inline, &self.key_head[..first]);
            put_client_key(inline, first, at % 8, self.key_head[first], client);
            return Some(&inline[..at + CLIENT_KEY]);
        }
        let end = at
            .checked_add(key.len())
            .filter(|&end| end <= INLINE_STORAGE_KEY)?;
        put_head(inline, self.key_head.get(..first)?);
        // The prefix's bytes in its last, partial word (zeros after).
        let carry = *self.key_head.get(first)?;
        put_words(inline, first, (at % 8) * 8, carry, key);
        Some(&inline[..end])
    }

    /// The arguments of a call to `store` (the rule's own, its fallback or
    /// its escalation's): the key checked against what that store accepts
    /// (the rule's own store's bound was read once, when the rule was
    /// built); the cost was checked when the request entered the limiter
    /// ([`check_cost`](Rule::check_cost)), once for every rule.
    #[inline]
    fn request<'a>(
        &self,
        store: &dyn Store,
        key: &'a [u8],
        policy: &'a Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Request<'a>, StoreError> {
        let key = if std::ptr::addr_eq(store, Arc::as_ptr(&self.store)) {
            Key::within(self.store_name, key, self.max_key_len)?
        } else {
            Key::new(store, key)?
        };
        Ok(Request::checked(key.as_bytes(), policy, cost, now))
    }

    /// One store call under the rule's timeout, without a breaker (a store
    /// answering inline is asked before, and needs neither).
    async fn awaited(
        &self,
        store: &dyn Store,
        request: Request<'_>,
    ) -> Result<Decision, StoreError> {
        #[cfg(feature = "metrics")]
        let started = std::time::Instant::now();
        let call = store.decide(request);
        // Not boxed: the whole awaited path is, once, where the limiter
        // leaves its inline step (`Limiter::check`).
        let result = match tokio::time::timeout(self.timeout, call).await {
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
        self.metric_keys
            .store_call_took(store, op, started.elapsed().as_secs_f64());
    }

    /// One call to an escalation's durable store, inline if it answers so,
    /// else under the rule's timeout and the store's breaker. A store that
    /// answers inline needs neither: it cannot hang, and a failure costs
    /// nothing to retry.
    async fn guarded(
        &self,
        store: &dyn Store,
        breaker: &Breaker,
        request: Request<'_>,
        clock: &dyn Clock,
    ) -> Called {
        if let Some(result) = store.decide_inline(request) {
            return match result {
                Ok(d) => Called::Answered(d),
                Err(e) => {
                    self.store_failed(store.name(), &e);
                    Called::Failed(e)
                }
            };
        }
        self.called(store, breaker, request, clock).await
    }

    /// One awaited store call under the rule's timeout and `breaker`.
    async fn called(
        &self,
        store: &dyn Store,
        breaker: &Breaker,
        request: Request<'_>,
        clock: &dyn Clock,
    ) -> Called {
        let attempt = breaker.attempt(|| micros(clock.monotonic()));
        if attempt == Attempt::Skip {
            return Called::Skipped;
        }
        let guard = ProbeGuard::new(breaker, attempt);
        let result = self.awaited(store, request).await;
        guard.disarm();
        let transition = match &result {
            Ok(_) => breaker.success(),
            // The caller's mistake says nothing about the store's health.
            Err(e) if e.kind() == ErrorKind::InvalidRequest => {
                breaker.release(attempt);
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

    /// The local decision that [`local_now`](Self::local_now) left to wait for: the
    /// authoritative store's, else the fallback's, else the failure policy's;
    /// with the store that holds the admission, if one does.
    async fn local_awaited(
        &self,
        key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
        tried: Tried,
    ) -> (Decision, Option<Holder>) {
        match tried {
            Tried::Local(decision, holder) => (decision, holder),
            Tried::Fallback => self.fallback_awaited(key, cost, now).await,
            Tried::Store => {
                let store = self.store.as_ref();
                // Checked again (two comparisons): the request `local_now`
                // asked inline with does not outlive that call.
                let called = match self.request(store, key, &self.policy, cost, now) {
                    Ok(request) => self.called(store, &self.breaker, request, clock).await,
                    Err(e) => Called::Failed(e),
                };
                match called {
                    Called::Answered(d) => (d, Some(Holder::Authoritative)),
                    // The request itself is wrong: the fallback would refuse it too.
                    Called::Failed(e) if e.kind() == ErrorKind::InvalidRequest => {
                        (self.degraded(store.name()), None)
                    }
                    Called::Failed(_) => self.fallback_any(key, cost, now).await,
                    // The breaker opened between the step and this call.
                    Called::Skipped => {
                        bump(&self.counters.short_circuited);
                        self.fallback_any(key, cost, now).await
                    }
                }
            }
        }
    }

    /// The fallback's answer, inline if it gives one; the failure policy's
    /// without a fallback.
    async fn fallback_any(
        &self,
        key: &[u8],
        cost: u32,
        now: Timestamp,
    ) -> (Decision, Option<Holder>) {
        match self.fallback_now(key, cost, now) {
            Some(answer) => answer,
            None => self.fallback_awaited(key, cost, now).await,
        }
    }

    /// The fallback's answer, awaited: it did not answer inline. The
    /// fallback has no breaker of its own: it is asked only when the
    /// authoritative store has failed.
    async fn fallback_awaited(
        &self,
        key: &[u8],
        cost: u32,
        now: Timestamp,
    ) -> (Decision, Option<Holder>) {
        let Some(fallback) = &self.fallback else {
            return (self.degraded(self.store.name()), None);
        };
        let answer = match self.request(fallback.as_ref(), key, &self.policy, cost, now) {
            Ok(request) => self.awaited(fallback.as_ref(), request).await,
            Err(e) => Err(e),
        };
        self.fallen_back(fallback.as_ref(), answer)
    }

    /// The fallback's answer if it gives one inline, the failure policy's
    /// without a fallback; `None`, having asked nothing else, when the
    /// fallback must be awaited.
    fn fallback_now(
        &self,
        key: &[u8],
        cost: u32,
        now: Timestamp,
    ) -> Option<(Decision, Option<Holder>)> {
        let Some(fallback) = &self.fallback else {
            return Some((self.degraded(self.store.name()), None));
        };
        // `None` from `decide_inline` decides nothing (the `Store`
        // contract), so leaving to await it counts nothing twice.
        let answer = match self.request(fallback.as_ref(), key, &self.policy, cost, now) {
            Ok(request) => fallback.decide_inline(request)?,
            Err(e) => Err(e),
        };
        Some(self.fallen_back(fallback.as_ref(), answer))
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

    /// What a decision leaves behind besides itself: a refusal that a store
    /// made goes into the refusal cache (unless the key was given back or
    /// reset since `ticket`, taken before the store was asked), and an
    /// admission that a later rule could undo (`keep`) is charged to the
    /// store that holds it.
    fn settle(
        &self,
        key: &[u8],
        units: u32,
        at: (Timestamp, Ticket),
        decision: &Decision,
        holder: Option<Holder>,
        keep: bool,
    ) -> SmallVec<[Charge; 2]> {
        self.settle_one(key, units, at, decision, holder, keep)
            .into_iter()
            .collect()
    }

    /// [`settle`](Self::settle) of a local decision, which holds at most
    /// one admission.
    #[inline]
    pub(crate) fn settle_one(
        &self,
        key: &[u8],
        units: u32,
        (now, ticket): (Timestamp, Ticket),
        decision: &Decision,
        holder: Option<Holder>,
        keep: bool,
    ) -> Option<Charge> {
        // A shadow rule's refusal is not one to repeat: it refused nothing.
        // Under a ban, only the ban's refusals are: the store counts every
        // other refusal toward the ban, so it must see them.
        if let (false, Some(cache)) = (
            decision.allowed
                || holder.is_none()
                || self.shadow
                || (self.policy.ban().is_some() && !decision.source.banned),
            &self.refusals,
        ) {
            cache.put(key, now, units, decision, ticket);
        }
        match (keep, decision.allowed, holder) {
            (true, true, Some(holder)) => Some(Charge::of(holder, decision)),
            _ => None,
        }
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
            if let Some((store, result)) = self.refund_now(storage_key, charge, cost, now) {
                self.refunded(store, result);
            } else if let Some((store, policy)) = self.holder(charge.holder) {
                let result = self
                    .refund_awaited(store, policy, storage_key, charge, cost, now)
                    .await;
                self.refunded(store, result);
            }
        }
        self.given_back(storage_key);
    }

    /// Refunds `charge` now if that needs no waiting; `false`, having done
    /// nothing, when it must be awaited ([`refund`](Self::refund)).
    pub(crate) fn refund_charge_now(
        &self,
        storage_key: &[u8],
        charge: &Charge,
        cost: u32,
        now: Timestamp,
    ) -> bool {
        match self.refund_now(storage_key, charge, cost, now) {
            Some((store, result)) => {
                self.refunded(store, result);
                self.given_back(storage_key);
                true
            }
            None => false,
        }
    }

    /// A refund that needs no waiting: skipped (the holder's breaker is
    /// open) or answered inline. `None`, having done nothing, when it must
    /// be awaited.
    fn refund_now(
        &self,
        storage_key: &[u8],
        charge: &Charge,
        cost: u32,
        now: Timestamp,
    ) -> Option<(&dyn Store, Result<(), StoreError>)> {
        let (store, policy) = self.holder(charge.holder)?;
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
        if skip {
            let e = StoreError::new(
                ErrorKind::CircuitOpen,
                store.name(),
                "breaker open; refund skipped",
            );
            return Some((store, Err(e)));
        }
        let admitted = charge.admitted(policy, store.name());
        let result = match self.refunding(store, storage_key, policy, cost, now, &admitted) {
            Ok(refund) => store.refund_inline(refund)?,
            Err(e) => Err(e),
        };
        Some((store, result))
    }

    /// A refund that must wait, under the rule's timeout.
    async fn refund_awaited(
        &self,
        store: &dyn Store,
        policy: &Policy,
        storage_key: &[u8],
        charge: &Charge,
        cost: u32,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        #[cfg(feature = "metrics")]
        let started = std::time::Instant::now();
        let admitted = charge.admitted(policy, store.name());
        let refund = self.refunding(store, storage_key, policy, cost, now, &admitted)?;
        let call = store.refund(refund);
        // Unboxed, as in `awaited`: a refund that must wait is made on the
        // limiter's boxed, awaited path.
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(StoreError::timeout(store.name(), self.timeout)),
        };
        #[cfg(feature = "metrics")]
        self.store_call_took(store.name(), "refund", started);
        result
    }

    /// The refund of `admitted`, checked as [`request`](Self::request)
    /// checks a decision's arguments.
    fn refunding<'a>(
        &self,
        store: &dyn Store,
        storage_key: &'a [u8],
        policy: &'a Policy,
        cost: u32,
        now: Timestamp,
        admitted: &'a Decision,
    ) -> Result<Refund<'a>, StoreError> {
        Refund::new(
            self.request(store, storage_key, policy, cost, now)?,
            admitted,
        )
    }

    fn refunded(&self, store: &dyn Store, result: Result<(), StoreError>) {
        match result {
            Ok(()) => bump(&self.counters.refunds),
            Err(e) => {
                bump(&self.counters.refund_failures);
                tracing::warn!(rule = %self.name, store = store.name(), error = %e,
                    "refund failed; the admission stays counted");
            }
        }
    }

    /// The refusal cache's answer for `key` and a request of `units`, if it
    /// holds one, counted as an abuse event like any refusal.
    pub(crate) async fn cached_refusal(
        &self,
        key: &[u8],
        units: u32,
        now: Timestamp,
        clock: &dyn Clock,
    ) -> Option<Decision> {
        if self.shadow {
            return None;
        }
        let mut d = self.refusals.as_ref()?.get(key, now, units)?;
        bump(&self.counters.refusals_cached);
        self.record_abuse(key, &d, now, clock).await;
        self.stamp_enforcing(&mut d);
        Some(d)
    }

    /// [`cached_refusal`](Self::cached_refusal) for a rule that records no
    /// abuse events, so that nothing waits.
    pub(crate) fn cached_refusal_now(
        &self,
        key: &[u8],
        units: u32,
        now: Timestamp,
    ) -> Option<Decision> {
        debug_assert!(!self.records_abuse());
        if self.shadow {
            return None;
        }
        let mut d = self.refusals.as_ref()?.get(key, now, units)?;
        bump(&self.counters.refusals_cached);
        self.stamp_enforcing(&mut d);
        Some(d)
    }

    /// The rule writes abuse events, which may wait on their sink.
    pub(crate) fn records_abuse(&self) -> bool {
        self.escalation.as_ref().is_some_and(|e| e.abuse.is_some())
    }

    /// The local decision as far as it goes without waiting, asking the
    /// rule's store inline once: a store answering inline, a store whose
    /// breaker is open (then the fallback inline, or the failure policy), an
    /// inline store's error (the same); with the store that holds the
    /// admission. [`Local::Wait`] says what is left for
    /// [`resume`](Self::resume), with nothing counted twice. An escalating
    /// rule is always resumed: its durable call and abuse writes may wait.
    #[inline]
    pub(crate) fn local_now(
        &self,
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
    ) -> Local {
        let answer = self.ask_inline(storage_key, cost, now);
        self.local_after(answer, storage_key, cost, now, clock)
    }

    /// The rule's store asked to answer inline: the one time a request asks.
    #[inline]
    pub(crate) fn ask_inline(
        &self,
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
    ) -> Option<Result<Decision, StoreError>> {
        if let Err(e) = Key::within(self.store_name, storage_key, self.max_key_len) {
            return Some(Err(e));
        }
        // Straight from the store's call: a match on a `Result` of the
        // request here cost the tiers' loop a copy of every answer.
        self.store
            .decide_inline(Request::checked(storage_key, &self.policy, cost, now))
    }

    /// [`local_now`](Self::local_now) given the store's inline `answer`.
    pub(crate) fn local_after(
        &self,
        answer: Option<Result<Decision, StoreError>>,
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
    ) -> Local {
        let (decision, holder) = match answer {
            Some(Ok(decision)) => (decision, Some(Holder::Authoritative)),
            Some(Err(e)) => {
                self.store_failed(self.store.name(), &e);
                if e.kind() == ErrorKind::InvalidRequest {
                    // The request itself is wrong: the fallback would refuse it too.
                    (self.degraded(self.store.name()), None)
                } else {
                    match self.fallback_now(storage_key, cost, now) {
                        Some(answer) => answer,
                        None => return Local::Wait(Tried::Fallback),
                    }
                }
            }
            None => {
                if !self.breaker.skips(|| micros(clock.monotonic())) {
                    return Local::Wait(Tried::Store);
                }
                // A store that is down costs every request this while its
                // breaker is open.
                bump(&self.counters.short_circuited);
                match self.fallback_now(storage_key, cost, now) {
                    Some(answer) => answer,
                    None => return Local::Wait(Tried::Fallback),
                }
            }
        };
        Local::Now(decision, holder)
    }

    /// Decides what [`local_now`](Self::local_now) left: the awaited local decision,
    /// then the escalation, with the admissions a later refusal must undo.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn resume(
        &self,
        key: &[u8],
        storage_key: &[u8],
        cost: u32,
        (now, ticket): (Timestamp, Ticket),
        clock: &dyn Clock,
        keep: bool,
        tried: Tried,
    ) -> Applied {
        let (decision, holder) = self
            .local_awaited(storage_key, cost, now, clock, tried)
            .await;
        let keep = keep || self.escalation.is_some();
        let mut charges = self.settle(key, cost, (now, ticket), &decision, holder, keep);
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
        let durable_store = escalation.store.as_ref();
        let durable = match self.request(durable_store, storage_key, &escalation.policy, cost, now)
        {
            Ok(request) => {
                self.guarded(durable_store, &escalation.breaker, request, clock)
                    .await
            }
            Err(e) => {
                self.store_failed(durable_store.name(), &e);
                Called::Failed(e)
            }
        };
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

    /// [`stamp`](Self::stamp) for a rule known not to be in shadow mode,
    /// on the roads no shadow rule takes (one rule, tiers, refusal
    /// caches): the shadow test alone cost a one-rule decision about 20
    /// instructions, in what it kept the compiler from doing with the
    /// decision (callgrind of the composition bench).
    #[inline]
    pub(crate) fn stamp_enforcing(&self, decision: &mut Decision) {
        debug_assert!(!self.shadow);
        self.label(decision);
        self.count(decision);
    }

    /// Labels `decision` with this rule and counts it: the last touch of
    /// every decision the rule hands back. A shadow rule's refusal leaves
    /// admitted, marked [`shadow_refused`](crate::Source::shadow_refused).
    #[inline]
    pub(crate) fn stamp(&self, decision: &mut Decision) {
        self.label(decision);
        if self.shadow && !decision.allowed {
            self.count_shadow_refusal();
            decision.allowed = true;
            decision.retry_after = Duration::ZERO;
            decision.source.shadow_refused = true;
        } else {
            self.count(decision);
        }
    }

    /// Counts a refusal this rule, in shadow mode, did not make. The store
    /// recorded nothing for it, as for any refusal, so nothing is owed back.
    #[cold]
    fn count_shadow_refusal(&self) {
        bump(&self.counters.shadow_refusals);
        #[cfg(feature = "metrics")]
        self.metric_keys.count_shadow_refusal();
    }

    /// Counts `decision` in the rule's statistics and metrics. A ban's
    /// refusals are told apart in the metrics alone (`outcome="banned"`):
    /// reading the flag here, on every road, kept the one-rule road from
    /// building its decision in place, about 55 instructions a decision
    /// (callgrind of the composition bench).
    #[inline]
    pub(crate) fn count(&self, decision: &Decision) {
        if decision.allowed {
            self.counters.allowed.bump();
        } else {
            self.counters.refused.bump();
        }
        #[cfg(feature = "metrics")]
        self.metric_keys.count(decision);
    }

    /// Names the rule, and the policy it decided under, in `decision`.
    #[inline]
    pub(crate) fn label(&self, decision: &mut Decision) {
        decision.source.rule = Some(self.label);
        decision.source.policy = Some(match &self.escalation {
            Some(e) if decision.source.escalated && !decision.allowed => e.policy_label,
            _ => self.policy_label,
        });
    }

    /// What a request of `cost` units for `key` would get from this rule at
    /// `now`, changing nothing: the refusal cache's standing refusal, else
    /// the store's [`peek`](Store::peek) under the rule's timeout, else the
    /// fallback's, else the failure policy's answer. Counted in no
    /// statistic and reported to no breaker (a peek is not a decision), but
    /// an open breaker is respected. The escalation's durable store is not
    /// asked: a request reaches it only when sampled, and its refusals are
    /// in the refusal cache. Its `remaining` is the units available now.
    pub(crate) async fn peek_at(
        &self,
        key: &[u8],
        cost: u32,
        now: Timestamp,
        clock: &dyn Clock,
    ) -> Decision {
        if let Some(mut d) = self
            .refusals
            .as_ref()
            .filter(|_| !self.shadow)
            .and_then(|c| c.get(key, now, cost))
        {
            self.label(&mut d);
            return d;
        }
        let mut buf = StorageKey::new();
        let storage_key = self.fill_storage_key(&mut buf, key);
        let mut d = 'peeked: {
            if !self.breaker.skips(|| micros(clock.monotonic())) {
                match self
                    .peeked(self.store.as_ref(), storage_key, cost, now)
                    .await
                {
                    Ok(d) => break 'peeked d,
                    Err(e) if e.kind() == ErrorKind::InvalidRequest => {
                        break 'peeked Decision::degraded(
                            self.on_failure,
                            &self.policy,
                            self.store.name(),
                        );
                    }
                    Err(_) => {}
                }
            }
            if let Some(fallback) = &self.fallback
                && let Ok(d) = self.peeked(fallback.as_ref(), storage_key, cost, now).await
            {
                break 'peeked d;
            }
            Decision::degraded(self.on_failure, &self.policy, self.store.name())
        };
        // A client is told what it has now, as the `RateLimit` header's
        // `r` means: a store's peek says what the request would leave,
        // which for an admission is `cost` fewer. A refusal's is already
        // what is free now; a failure policy's knows nothing to add to.
        if d.allowed && !d.source.degraded {
            d.remaining = d.remaining.saturating_add(cost).min(d.limit);
        }
        self.label(&mut d);
        d
    }

    /// One peek under the rule's timeout.
    async fn peeked(
        &self,
        store: &dyn Store,
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        let request = self.request(store, storage_key, &self.policy, cost, now)?;
        let call = store.peek(request);
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::timeout(store.name(), self.timeout)),
        }
    }

    /// What a request for `key` would get from this rule now, changing
    /// nothing; see [`Limiter::peek`](crate::Limiter::peek).
    pub async fn peek(&self, key: &[u8], clock: &dyn Clock) -> Decision {
        self.peek_at(key, self.units_per_request, clock.now(), clock)
            .await
    }

    /// Forgets `key` in every store of this rule (its store, its fallback
    /// and its escalation's durable store, each under the rule's timeout)
    /// and in this instance's refusal cache: the key's next requests get
    /// the rule's full limit. Every store is asked even when one fails;
    /// the first error is returned. See
    /// [`Limiter::reset`](crate::Limiter::reset) for what other instances
    /// still answer.
    pub async fn reset(&self, key: &[u8]) -> Result<(), StoreError> {
        let storage_key = self.storage_key(key);
        let stores = std::iter::once((&self.store, &self.policy))
            .chain(self.fallback.as_ref().map(|f| (f, &self.policy)))
            .chain(self.escalation.as_ref().map(|e| (&e.store, &e.policy)));
        let mut first_error = None;
        for (store, policy) in stores {
            let result = match Key::new(store.as_ref(), &storage_key) {
                Ok(key) => match tokio::time::timeout(self.timeout, store.reset(key, policy)).await
                {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::timeout(store.name(), self.timeout)),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                self.store_failed(store.name(), &e);
                first_error.get_or_insert(e);
            }
        }
        // After the stores: a refusal cached by a request decided while
        // they were being reset is forgotten too, in every limiter of the
        // process.
        self.was_reset(&storage_key);
        if let Some(cache) = &self.refusals {
            cache.remove(key);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Charges `key` this rule's units for a cost of `cost` at the clock's
    /// current time, admitted or not ([`Store::penalize`]): a late charge
    /// that lengthens the key's wait. In the rule's store only (a fallback
    /// or escalation store holds nothing to lengthen), within the rule's
    /// timeout; a failure is returned, not answered by the failure policy,
    /// since nothing is being decided. A cost the rule could never admit
    /// is an [`InvalidRequest`](crate::ErrorKind::InvalidRequest) error.
    pub async fn penalize(
        &self,
        key: &[u8],
        cost: u32,
        clock: &dyn Clock,
    ) -> Result<(), StoreError> {
        self.check_cost(cost)
            .map_err(|e| StoreError::invalid_request(self.store.name(), e))?;
        let storage_key = self.storage_key(key);
        let store = self.store.as_ref();
        let result = match self.request(
            store,
            &storage_key,
            &self.policy,
            self.units(cost),
            clock.now(),
        ) {
            Ok(request) => {
                match tokio::time::timeout(self.timeout, store.penalize(request)).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::timeout(store.name(), self.timeout)),
                }
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            self.store_failed(self.store.name(), e);
        }
        result
    }

    /// Applies this rule alone to `key` at the clock's current time,
    /// following its fallback, escalation and failure policy.
    pub async fn check(&self, key: &[u8], clock: &dyn Clock) -> Decision {
        let now = clock.now();
        if let Some(d) = self
            .cached_refusal(key, self.units_per_request, now, clock)
            .await
        {
            return d;
        }
        let mut buf = StorageKey::new();
        let storage_key = self.fill_storage_key(&mut buf, key);
        let ticket = self.ticket(storage_key);
        let tried = match self.local_now(storage_key, self.units_per_request, now, clock) {
            Local::Now(decision, holder) if self.escalation.is_none() => {
                // No later rule can refuse: nothing to keep for a refund.
                self.settle_one(
                    key,
                    self.units_per_request,
                    (now, ticket),
                    &decision,
                    holder,
                    false,
                );
                let mut decision = decision;
                self.stamp(&mut decision);
                return decision;
            }
            Local::Now(decision, holder) => Tried::Local(decision, holder),
            Local::Wait(tried) => tried,
        };
        let mut decision = self
            .resume(
                key,
                storage_key,
                self.units_per_request,
                (now, ticket),
                clock,
                false,
                tried,
            )
            .await
            .decision;
        self.stamp(&mut decision);
        decision
    }
}

/// Up to 8 bytes as a little-endian word, zeros after them.
#[inline]
fn word(bytes: &[u8]) -> u64 {
    match <[u8; 8]>::try_from(bytes) {
        Ok(whole) => u64::from_le_bytes(whole),
        Err(_) => bytes.iter().rev().fold(0, |w, &b| (w << 8) | u64::from(b)),
    }
}

/// Stores the prefix's whole words at the start of `out` (none for a name
/// under 7 bytes).
#[inline(always)]
fn put_head(out: &mut [u8], words: &[u64]) {
    for (slot, &w) in words.iter().enumerate() {
        put_word(out, slot, w);
    }
}

/// Stores `key` shifted left by `shift` bits (under 64) into `out` from
/// its `slot`-th 8-byte word on, word by word, the first word starting
/// with `carry`'s bits.
#[inline(always)]
fn put_words(out: &mut [u8], mut slot: usize, shift: usize, mut carry: u64, key: &[u8]) {
    for chunk in key.chunks(8) {
        let w = word(chunk);
        put_word(out, slot, carry | w << shift);
        slot += 1;
        // What of `w` did not fit this word starts the next one.
        carry = w.checked_shr(64 - shift as u32).unwrap_or(0);
    }
    put_word(out, slot, carry);
}

/// [`put_words`] for a key of the workspace's length: each word after the
/// first is read whole from the key, where it starts `8 - r` bytes in, so
/// that no word is assembled from two (`r` is the prefix's length modulo
/// 8, `carry` its last partial word).
// The same stores as `put_words` makes, one whole word at each slot, with
// no word shifted and carried: 28 instructions fewer a decision of a
// one-rule limiter (`scripts/instructions.sh`, 575 → 547).
#[inline(always)]
fn put_client_key(out: &mut [u8], slot: usize, r: usize, carry: u64, key: &[u8; CLIENT_KEY]) {
    let (head, _) = key.as_chunks::<8>();
    // The key's first `8 - r` bytes after the prefix's `r`.
    put_word(out, slot, carry | u64::from_le_bytes(head[0]) << (8 * r));
    let from = 8 - r;
    for i in 0..CLIENT_KEY / 8 - 1 {
        let at = from + 8 * i;
        put_word(out, slot + 1 + i, word(&key[at..at + 8]));
    }
    // Its last `r` bytes: the top of its last word (none when `r` is 0).
    let last = u64::from_le_bytes(head[CLIENT_KEY / 8 - 1]);
    put_word(
        out,
        slot + CLIENT_KEY / 8,
        last.checked_shr(8 * (8 - r) as u32).unwrap_or(0),
    );
}

/// Stores `w` as the `slot`-th 8-byte word of `out`.
#[inline]
fn put_word(out: &mut [u8], slot: usize, w: u64) {
    out[slot * 8..slot * 8 + 8].copy_from_slice(&w.to_le_bytes());
}
