//! Composition: a limiter made of ordered rules, each a store with its own
//! policy, timeout, circuit breaker, fallback and failure policy.
//!
//! A rate limiter in production is usually a fast local check in front of a
//! shared or durable one, and the shared store must never become the outage.
//! Every invariant a single store keeps holds for a whole [`Limiter`]:
//!
//! * **Tiers** — a [`Limiter`] applies its [`Rule`]s in order; the first
//!   refusal wins and later rules are not consulted, so a request refused by
//!   a local tier costs no network call. **A request refused by any rule is
//!   recorded by no rule**: the admissions earlier rules made for it are
//!   undone with [`Store::refund`] (on the refusal path only; the admit path
//!   makes no extra call), so a client that waits the `Retry-After` it was
//!   given is not refused by the units its refused requests left behind.
//! * **Fallback** — [`Rule::with_fallback`]: the rule's store is
//!   authoritative; when it fails, times out or its breaker is open, the same
//!   policy is answered by the fallback store. The fallback is consulted only
//!   then, so exactly one store counts each request.
//! * **Failure policy** — [`FailurePolicy`] when no store answers; every call
//!   bounded by the rule's timeout; a [`BreakerConfig`] per store so a dead
//!   store costs one timeout per cool-down, not one per request. Cool-downs
//!   run on the clock's monotonic reading. A store that answers inline
//!   ([`Store::decide_inline`], the memory store) cannot hang, so its calls
//!   get neither timeout nor breaker: a local tier costs its own decision
//!   and little else.
//! * **Escalation** — [`Rule::with_escalation`]: the local store is
//!   authoritative and a durable store is consulted with a stricter policy
//!   on exactly one admitted request in every `every`, at a position drawn
//!   at random in each run of `every`, whatever the clients' pace. A durable
//!   refusal refuses that request and refunds its local unit. Refusals go to
//!   an [`AbuseSink`] as [`AbuseEvent`]s: at most one write per key per
//!   window of the rule's policy, each carrying the number of refusals it
//!   stands for, behind its own breaker and the rule's timeout.
//! * **Refusal cache** — [`Rule::with_refusal_cache`], on by default for a
//!   shared store: after the store refuses a key, the key is refused locally
//!   until the retry time it gave, before any tier is asked, so a hammering
//!   offender costs no round trip and no local admit-and-refund.
//!
//! # Over-admission bounds
//!
//! For a fleet of `N` instances sharing one server, in one window of a
//! policy with limit `L` (cost 1):
//!
//! | composition | admitted at most |
//! |---|---|
//! | shared store only (fail closed) | `L` |
//! | memory tier (limit `M`) in front of the shared store | `min(N·M, L)` |
//! | shared store, fallback to local | `L`, plus `L` per instance for each window in which the shared store failed (each local store counts alone; a key the shared store refused before the outage stays refused by the refusal cache until its retry time) |
//! | local store only | `N·L` |
//! | escalation, durable limit `D` | `N·L`: escalation samples and records abuse, it does not cap a fleet; the durable store admits at most `D` of the sampled requests, and each one it refuses is refused and its local unit refunded |
//!
//! The `limiter` crate's `fleet_bound` test measures every row with `N = 4`
//! instances sharing real Redis and Postgres servers, and
//! `limiter-conformance`'s composition scenarios attack each guarantee above.
//!
//! A call that times out may already have been applied by the store, so a
//! request whose authoritative call timed out and was then answered by the
//! fallback can be counted by both, and a timed-out admission cannot be
//! refunded; both need a store slower than its timeout, and both err on the
//! strict side. A refund that fails leaves the earlier rule's count as it
//! was: stricter, never more permissive ([`RuleStats::refund_failures`]).

use std::collections::HashSet;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use smallvec::SmallVec;

use crate::abuse::{AbuseRecorder, AbuseSink, Writes};
use crate::breaker::{Breaker, BreakerConfig, BreakerState, Permit, Transition};
use crate::decision::{Decision, Source};
use crate::error::{ConfigError, ErrorKind, StoreError};
use crate::policy::Policy;
use crate::refusal_cache::{REFUSAL_CACHE_KEYS, RefusalCache};
use crate::store::Store;
use crate::time::{Clock, SystemClock, Timestamp};

/// What a rule answers when no store answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Admit the request: availability over enforcement. Right for abuse
    /// control in front of a page that must keep working.
    #[default]
    Open,
    /// Refuse the request: enforcement over availability. Right where
    /// over-admission costs money.
    Closed,
}

/// The default bound on every call a rule makes ([`Rule::with_timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// Picks exactly one admitted request in every run of `every`, at a position
/// drawn afresh for each run from a keyed hash the clients cannot know.
///
/// A count per key (escalate when a key's count crosses a multiple of
/// `every`) depends on the client's pace: one pacing itself under the local
/// limit is never sampled, one whose count sits on a multiple is sampled on
/// every request. A rule-wide counter with a random phase per run is exact
/// (one in `every` over any run) and tells a client nothing.
struct Sampler {
    every: u64,
    admitted: AtomicU64,
    hasher: std::collections::hash_map::RandomState,
}

impl Sampler {
    fn new(every: u32) -> Self {
        Sampler {
            every: u64::from(every),
            admitted: AtomicU64::new(0),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    fn sample(&self) -> bool {
        let n = self.admitted.fetch_add(1, Ordering::Relaxed);
        let run = n / self.every;
        self.hasher.hash_one(run) % self.every == n % self.every
    }
}

/// A durable store consulted by an escalating rule; see
/// [`Rule::with_escalation`].
struct Escalation {
    store: Arc<dyn Store>,
    policy: Policy,
    sampler: Sampler,
    breaker: Breaker,
    abuse: Option<AbuseRecorder>,
}

impl Escalation {
    /// A copy with fresh breakers, sampler and abuse tracker, for a rule
    /// reconfigured after it was cloned.
    fn rebuilt(&self) -> Escalation {
        let breaker = self.breaker.config();
        Escalation {
            store: self.store.clone(),
            policy: self.policy,
            sampler: Sampler::new(self.sampler.every as u32),
            breaker: Breaker::new(breaker),
            abuse: self.abuse.as_ref().map(|a| a.rebuilt()),
        }
    }
}

/// Counters of one rule, updated with relaxed atomics.
#[derive(Debug, Default)]
struct Counters {
    allowed: Striped,
    refused: Striped,
    store_errors: AtomicU64,
    short_circuited: AtomicU64,
    fallbacks: AtomicU64,
    degraded: AtomicU64,
    breaker_opened: AtomicU64,
    escalations: AtomicU64,
    abuse_events: AtomicU64,
    abuse_dropped: AtomicU64,
    refunds: AtomicU64,
    refund_failures: AtomicU64,
    refusals_cached: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Stripes of a [`Striped`] counter.
const STRIPES: usize = 8;

/// A counter that every decision of a rule increments, split over stripes
/// on cache lines of their own: threads deciding for one rule at once each
/// write their own stripe, instead of bouncing one line between their cores
/// on every request. Reading sums the stripes.
#[derive(Debug, Default)]
struct Striped([Stripe; STRIPES]);

/// 128 bytes: two 64-byte lines, since adjacent-line prefetching pairs them.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

impl Striped {
    fn bump(&self) {
        thread_local! {
            static STRIPE: usize = {
                static NEXT: AtomicU64 = AtomicU64::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) as usize % STRIPES
            };
        }
        let stripe = STRIPE.with(|s| *s);
        self.0[stripe].0.fetch_add(1, Ordering::Relaxed);
    }

    fn load(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// A snapshot of one rule's counters, from [`Limiter::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuleStats {
    /// The rule's name.
    pub rule: Arc<str>,
    /// Requests this rule admitted.
    pub allowed: u64,
    /// Requests this rule refused (by its store, its escalation or its
    /// failure policy).
    pub refused: u64,
    /// Store calls that failed or timed out (the authoritative store, the
    /// fallback, the escalation store and the abuse sink).
    pub store_errors: u64,
    /// Calls skipped because the authoritative store's breaker was open.
    pub short_circuited: u64,
    /// Decisions answered by the fallback store.
    pub fallbacks: u64,
    /// Decisions made by the failure policy because no store answered.
    pub degraded: u64,
    /// Times the authoritative store's breaker opened.
    pub breaker_opened: u64,
    /// Sampled requests sent to the escalation store.
    pub escalations: u64,
    /// Abuse events written to the sink (each may stand for many refusals).
    pub abuse_events: u64,
    /// Refusals whose held-back count was forgotten because the sink was
    /// failing while the tracker was full.
    pub abuse_dropped: u64,
    /// Admissions of this rule undone because another rule refused the
    /// request.
    pub refunds: u64,
    /// Refunds that failed (the store errored, timed out, does not implement
    /// refunds, or its breaker was open): the admission stays counted, which
    /// is stricter, never more permissive.
    pub refund_failures: u64,
    /// Refusals answered from the rule's refusal cache, without a store
    /// call.
    pub refusals_cached: u64,
    /// The authoritative store's breaker now.
    pub breaker: BreakerState,
}

/// One tier of a [`Limiter`]: a store, the policy it applies, and what to do
/// when it fails.
///
/// Clones share the rule's breakers, escalation sampler, abuse tracker and
/// counters.
#[derive(Clone)]
pub struct Rule {
    name: Arc<str>,
    /// The same name, interned, for [`Source::rule`].
    label: &'static str,
    store: Arc<dyn Store>,
    policy: Policy,
    cost: u32,
    timeout: Duration,
    on_failure: FailurePolicy,
    fallback: Option<Arc<dyn Store>>,
    breaker: Arc<Breaker>,
    escalation: Option<Arc<Escalation>>,
    refusals: Option<Arc<RefusalCache>>,
    counters: Arc<Counters>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("store", &self.store.name())
            .field("policy", &self.policy)
            .field("cost", &self.cost)
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .field("fallback", &self.fallback.as_ref().map(|s| s.name()))
            .field(
                "escalation",
                &self
                    .escalation
                    .as_ref()
                    .map(|e| (e.store.name(), e.policy, e.sampler.every)),
            )
            .finish()
    }
}

/// Which of a rule's stores holds an admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Authoritative,
    Fallback,
    Durable,
}

/// One admission a rule made for a request whose fate is not yet known.
///
/// Only what locates the admission is kept ([`Store::refund`] reads
/// `reset_after`): a whole decision per rule would be copied on every
/// admitted request for the rare refusal that needs it.
struct Charge {
    holder: Holder,
    reset_after: Duration,
}

impl Charge {
    fn of(holder: Holder, d: &Decision) -> Self {
        Charge {
            holder,
            reset_after: d.reset_after,
        }
    }
}

/// What one rule did for one request: its decision, and the admissions to
/// undo if a later rule refuses.
struct Applied {
    decision: Decision,
    charges: SmallVec<[Charge; 2]>,
}

/// Undoes a breaker permit whose call never finished: a dropped future
/// gives the probe slot back instead of leaving the breaker half-open.
pub(crate) struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    permit: Option<Permit>,
}

impl<'a> ProbeGuard<'a> {
    pub(crate) fn new(breaker: &'a Breaker, permit: Permit) -> Self {
        ProbeGuard {
            breaker,
            permit: Some(permit),
        }
    }

    pub(crate) fn disarm(mut self) {
        self.permit = None;
    }
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit {
            self.breaker.release(permit);
        }
    }
}

/// How one guarded call ended.
enum Called {
    Answered(Decision),
    Failed(StoreError),
    /// The breaker was open: the store was not called.
    Skipped,
}

/// A rule's storage key, built on the stack for the keys a limiter usually
/// sees (a rule name of up to 64 bytes, `:`, a 32-byte client key), so that
/// a decision allocates nothing for it.
type StorageKey = SmallVec<[u8; 128]>;

impl Rule {
    /// A rule named `name` applying `policy` in `store`, with cost 1, the
    /// [`DEFAULT_TIMEOUT`], the default [`BreakerConfig`], no fallback and
    /// [`FailurePolicy::Open`].
    ///
    /// Refuses a policy the store cannot apply, and a name that is not 1 to
    /// [`MAX_RULE_NAME`] characters of `A–Z a–z 0–9 _ - .`: the name leads
    /// every storage key (`{rule}:{client key}`), which an operator lists and
    /// deletes with standard tools, and appears in rate-limit headers.
    ///
    /// Each distinct name is kept for the life of the process (at most
    /// [`MAX_RULE_NAME`] bytes), so that every decision can name its rule as
    /// a [`Source::rule`] without a reference count: build rule names from
    /// configuration, not from request data.
    pub fn new(
        name: impl Into<Arc<str>>,
        store: Arc<dyn Store>,
        policy: Policy,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        check_rule_name(&name)?;
        store.check_policy(&policy)?;
        // A shared store is a round trip away: repeating its refusals saves
        // one per request of a hammering client. An in-process store answers
        // as fast as the cache would.
        let refusals = store
            .capabilities()
            .shared
            .then(|| Arc::new(RefusalCache::new(REFUSAL_CACHE_KEYS)));
        Ok(Rule {
            label: intern(&name),
            name,
            store,
            policy,
            cost: 1,
            timeout: DEFAULT_TIMEOUT,
            on_failure: FailurePolicy::default(),
            fallback: None,
            breaker: Arc::new(Breaker::new(BreakerConfig::default())),
            escalation: None,
            refusals,
            counters: Arc::default(),
        })
    }

    /// Repeats the store's refusal of a key, locally and without a store
    /// call, until the retry time it gave; holds at most `keys` keys (the
    /// least recently refused is forgotten first). On by default, for
    /// [`REFUSAL_CACHE_KEYS`](crate::REFUSAL_CACHE_KEYS) keys, for a rule
    /// whose store is [`shared`](crate::Capabilities::shared); off for an
    /// in-process store, which answers as fast.
    ///
    /// A cached refusal records nothing and refunds what earlier rules
    /// admitted, like any refusal; it is marked
    /// [`Source::cached`](crate::Source::cached). Within a fleet it can only
    /// be stricter than asking again (another instance's refund could free a
    /// unit a moment early), never more permissive. Refuses zero keys.
    pub fn with_refusal_cache(mut self, keys: usize) -> Result<Self, ConfigError> {
        if keys == 0 {
            return Err(ConfigError::Invalid(
                "a refusal cache needs room for at least one key; use without_refusal_cache".into(),
            ));
        }
        self.refusals = Some(Arc::new(RefusalCache::new(keys)));
        Ok(self)
    }

    /// Asks the store on every request, refused or not.
    pub fn without_refusal_cache(mut self) -> Self {
        self.refusals = None;
        self
    }

    /// Charges `cost` units per request instead of 1. Refuses a cost the
    /// policy (or the escalation policy) could never admit.
    pub fn with_cost(mut self, cost: u32) -> Result<Self, ConfigError> {
        self.policy.check_cost(cost)?;
        if let Some(e) = &self.escalation {
            e.policy.check_cost(cost)?;
        }
        self.cost = cost;
        Ok(self)
    }

    /// Bounds every call this rule makes (decision, fallback, escalation,
    /// refund, abuse write): the time a request can wait on a store. A call
    /// that takes longer is a failure, answered by the fallback or the
    /// failure policy. This is the timeout to tune for a request path; a
    /// store's own timeout (such as `RedisStoreBuilder::timeout` or
    /// `PostgresStoreBuilder::timeout`) is a transport bound beneath it,
    /// which frees the store's connection and applies when the store is
    /// used without a `Limiter`. The shorter of the two ends a call first.
    /// Refuses a zero timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() {
            return Err(ConfigError::Invalid("timeout must be positive".into()));
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// Replaces the default circuit breaker of the rule's stores (the
    /// authoritative store, the escalation store and the abuse sink each
    /// get one of this configuration).
    pub fn with_breaker(mut self, config: BreakerConfig) -> Self {
        self.breaker = Arc::new(Breaker::new(config));
        self.escalation = self.escalation.map(|e| {
            // Unshared until the rule is built into a limiter; a clone made
            // before this call keeps the old breakers.
            let e = Arc::try_unwrap(e).unwrap_or_else(|shared| shared.rebuilt());
            Arc::new(Escalation {
                breaker: Breaker::new(config),
                abuse: e.abuse.map(|a| a.with_breaker(config)),
                ..e
            })
        });
        self
    }

    /// What to answer when no store answers.
    pub fn on_failure(mut self, on_failure: FailurePolicy) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Answers the same policy from `fallback` (typically an in-process
    /// store) whenever the rule's store fails, times out or has its breaker
    /// open. The two are never both consulted for one request: the fallback
    /// counts as a side effect, so asking both would double-count an honest
    /// client. Refuses a fallback that cannot apply the policy.
    pub fn with_fallback(mut self, fallback: Arc<dyn Store>) -> Result<Self, ConfigError> {
        fallback.check_policy(&self.policy)?;
        self.fallback = Some(fallback);
        Ok(self)
    }

    /// Makes the rule's store the authoritative local check and consults
    /// `durable` with the stricter `policy` on exactly one admitted request
    /// in every `every` (rule-wide, at a random position in each run of
    /// `every`, so the rate does not depend on any client's pace and no
    /// client can predict it). A refusal by the durable store refuses the
    /// request and refunds its local unit. Durable failures never refuse a
    /// request: the local store stays authoritative.
    ///
    /// Every refusal, local or durable, is counted for `sink` when one is
    /// given: the first refusal of a key in a window of the rule's policy is
    /// written at once, later ones ride on the key's next event (see
    /// [`AbuseEvent::refusals`](crate::AbuseEvent::refusals) and
    /// [`Limiter::flush_abuse_events`]). Refused requests never reach the
    /// durable store's counter, since a refusal must never be counted.
    pub fn with_escalation(
        mut self,
        durable: Arc<dyn Store>,
        policy: Policy,
        every: u32,
        sink: Option<Arc<dyn AbuseSink>>,
    ) -> Result<Self, ConfigError> {
        if every == 0 {
            return Err(ConfigError::Invalid(
                "escalation sample interval must be at least 1".into(),
            ));
        }
        durable.check_policy(&policy)?;
        policy.check_cost(self.cost)?;
        let breaker = self.breaker.config();
        self.escalation = Some(Arc::new(Escalation {
            store: durable,
            policy,
            sampler: Sampler::new(every),
            breaker: Breaker::new(breaker),
            abuse: sink.map(|sink| {
                AbuseRecorder::new(self.name.clone(), sink, breaker, self.policy.window())
            }),
        }));
        Ok(self)
    }

    /// The rule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The rule's policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The stricter policy of the rule's escalation store, if it has one: the
    /// policy a decision with [`Source::escalated`] and `allowed == false`
    /// was made under.
    pub fn escalation_policy(&self) -> Option<&Policy> {
        self.escalation.as_ref().map(|e| &e.policy)
    }

    /// The policy `decision` (from this rule) was made under: the escalation
    /// policy for a durable refusal, the rule's own otherwise. Rate-limit
    /// headers describe this one, so that a limit and its window always
    /// belong together.
    pub fn policy_of(&self, decision: &Decision) -> &Policy {
        match (
            &self.escalation,
            decision.source.escalated && !decision.allowed,
        ) {
            (Some(e), true) => &e.policy,
            _ => &self.policy,
        }
    }

    /// The rule's authoritative store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// A snapshot of the rule's counters.
    pub fn stats(&self) -> RuleStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RuleStats {
            rule: self.name.clone(),
            allowed: c.allowed.load(),
            refused: c.refused.load(),
            store_errors: load(&c.store_errors),
            short_circuited: load(&c.short_circuited),
            fallbacks: load(&c.fallbacks),
            degraded: load(&c.degraded),
            breaker_opened: load(&c.breaker_opened),
            escalations: load(&c.escalations),
            abuse_events: load(&c.abuse_events),
            abuse_dropped: load(&c.abuse_dropped),
            refunds: load(&c.refunds),
            refund_failures: load(&c.refund_failures),
            refusals_cached: load(&c.refusals_cached),
            breaker: self.breaker.state(),
        }
    }

    /// The key this rule stores for a client key: the rule's name, `:`,
    /// then the client key. Names hold no `:`, so two rules never share
    /// state, and the key is printable whenever the client key is.
    pub fn storage_key(&self, key: &[u8]) -> Vec<u8> {
        self.storage_key_buf(key).into_vec()
    }

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

    fn storage_key_buf(&self, key: &[u8]) -> StorageKey {
        let mut k = StorageKey::new();
        self.fill_storage_key(&mut k, key);
        k
    }

    /// Writes the storage key into `buf`, which a request reuses for each of
    /// its rules instead of moving a new key through every call.
    fn fill_storage_key<'b>(&self, buf: &'b mut StorageKey, key: &[u8]) -> &'b [u8] {
        buf.clear();
        buf.extend_from_slice(self.name.as_bytes());
        buf.push(b':');
        buf.extend_from_slice(key);
        buf
    }

    /// One store call under a timeout, without a breaker: answered inline
    /// by a store that never waits ([`Store::decide_inline`]), awaited
    /// under the rule's timeout otherwise.
    async fn timed(
        &self,
        store: &dyn Store,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        if let Some(result) = store.decide_inline(key, policy, cost, now) {
            return result;
        }
        self.awaited(store, key, policy, cost, now).await
    }

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
        metrics::histogram!("limiter_store_call_seconds",
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
        match transition {
            Transition::Opened => {
                if std::ptr::eq(breaker, &*self.breaker) {
                    bump(&self.counters.breaker_opened);
                }
                tracing::warn!(rule = %self.name, store = store.name(), "circuit breaker opened");
                #[cfg(feature = "metrics")]
                metrics::counter!("limiter_breaker_transitions_total",
                    "rule" => self.label, "store" => store.name(), "to" => "open")
                .increment(1);
            }
            Transition::Closed => {
                tracing::info!(rule = %self.name, store = store.name(), "circuit breaker closed");
                #[cfg(feature = "metrics")]
                metrics::counter!("limiter_breaker_transitions_total",
                    "rule" => self.label, "store" => store.name(), "to" => "closed")
                .increment(1);
            }
            Transition::None => {}
        }
    }

    fn store_failed(&self, store: &'static str, e: &StoreError) {
        bump(&self.counters.store_errors);
        tracing::warn!(rule = %self.name, store, error = %e, "store call failed");
        #[cfg(feature = "metrics")]
        metrics::counter!("limiter_store_errors_total",
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
        let allowed = self.on_failure == FailurePolicy::Open;
        let mut source = Source::store(store);
        source.degraded = true;
        Decision {
            allowed,
            limit: self.policy.limit(),
            remaining: 0,
            reset_after: Duration::ZERO,
            // A failed store says nothing about when it will be back; one
            // second keeps well-behaved clients from retrying in a tight loop.
            retry_after: if allowed {
                Duration::ZERO
            } else {
                Duration::from_secs(1)
            },
            source,
        }
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
        match self
            .timed(fallback.as_ref(), key, &self.policy, cost, now)
            .await
        {
            Ok(mut d) => {
                bump(&self.counters.fallbacks);
                d.source.fallback = true;
                #[cfg(feature = "metrics")]
                metrics::counter!("limiter_fallbacks_total", "rule" => self.label).increment(1);
                (d, Some(Holder::Fallback))
            }
            Err(e) => {
                self.store_failed(fallback.name(), &e);
                (self.degraded(fallback.name()), None)
            }
        }
    }

    async fn record_abuse(&self, key: &[u8], d: &Decision, now: Timestamp, clock: &dyn Clock) {
        let Some(recorder) = self.escalation.as_ref().and_then(|e| e.abuse.as_ref()) else {
            return;
        };
        let mono = micros(clock.monotonic());
        let writes = recorder
            .refused(key, now, mono, d.source.store, self.timeout)
            .await;
        self.count_writes(writes);
    }

    fn count_writes(&self, writes: Writes) {
        let c = &self.counters;
        c.abuse_events.fetch_add(writes.written, Ordering::Relaxed);
        c.store_errors.fetch_add(writes.failed, Ordering::Relaxed);
        c.abuse_dropped.fetch_add(writes.dropped, Ordering::Relaxed);
    }

    /// Undoes the admissions of a request that was refused after all.
    async fn refund(&self, storage_key: &[u8], charges: &[Charge], cost: u32, now: Timestamp) {
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
                        let result = match tokio::time::timeout(self.timeout, call).await {
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
    async fn cached_refusal(
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

    /// [`apply`](Self::apply) for a rule whose whole answer is the
    /// authoritative store's and the store answers inline; `None` when the
    /// rule needs awaiting (an escalation, a store that must be awaited, or
    /// one that failed, which the full path asks again and handles).
    fn apply_inline(
        &self,
        key: &[u8],
        storage_key: &[u8],
        cost: u32,
        now: Timestamp,
        keep: bool,
    ) -> Option<Applied> {
        if self.escalation.is_some() {
            return None;
        }
        let Some(Ok(decision)) = self
            .store
            .decide_inline(storage_key, &self.policy, cost, now)
        else {
            return None;
        };
        let mut charges = SmallVec::new();
        if decision.allowed {
            if keep {
                charges.push(Charge::of(Holder::Authoritative, &decision));
            }
        } else if let Some(cache) = &self.refusals {
            cache.put(key, now, &decision);
        }
        Some(Applied { decision, charges })
    }

    /// `keep` says whether a later refusal could need this rule's
    /// admission undone: not for the last rule of a limiter, which then
    /// skips copying its decision.
    async fn apply(
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
        if let (false, Some(cache)) = (decision.allowed || holder.is_none(), &self.refusals) {
            cache.put(key, now, &decision);
        }
        let mut charges = SmallVec::new();
        let keep = keep || self.escalation.is_some();
        if let (true, true, Some(holder)) = (keep, decision.allowed, holder) {
            charges.push(Charge::of(holder, &decision));
        }
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

    fn finish(&self, decision: &mut Decision) {
        decision.source.rule = Some(self.label);
        if decision.allowed {
            self.counters.allowed.bump();
        } else {
            self.counters.refused.bump();
        }
        #[cfg(feature = "metrics")]
        metrics::counter!("limiter_decisions_total",
            "rule" => self.label,
            "outcome" => if decision.allowed { "allowed" } else { "refused" },
            "store" => decision.source.store)
        .increment(1);
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

/// The longest rule name accepted.
pub const MAX_RULE_NAME: usize = 64;

fn check_rule_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_RULE_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "rule name {name:?} must be 1 to {MAX_RULE_NAME} characters of A-Z, a-z, 0-9, '_', \
             '-' and '.'"
        )))
    }
}

/// A rule name as a `&'static str`, the same one for every rule of that
/// name. Each distinct name is leaked once, for the life of the process: at
/// most [`MAX_RULE_NAME`] bytes, for the handful of names an application
/// has, however many rules and limiters it builds with them.
fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Mutex::default)
        .lock()
        // A set of strings is whole after any panic.
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(interned) = names.get(name) {
        return interned;
    }
    let interned: &'static str = Box::leak(name.into());
    names.insert(interned);
    interned
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// An ordered list of [`Rule`]s sharing one clock. Each request goes through
/// the rules in order; the first refusal wins, later rules are not
/// consulted, and what earlier rules admitted for the refused request is
/// refunded, so that a refused request is recorded by no rule.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use limiter_core::{Limiter, ManualClock, Policy, Rule};
/// # use limiter_core::{Capabilities, Decision, Store, StoreError, Timestamp, Algorithm};
/// # #[derive(Debug)] struct Allow;
/// # #[async_trait::async_trait] impl Store for Allow {
/// #   fn name(&self) -> &'static str { "allow" }
/// #   fn capabilities(&self) -> Capabilities { Capabilities { algorithms: &Algorithm::ALL,
/// #     key_capacity: None, shared: false, server_clock: false } }
/// #   async fn decide(&self, _: &[u8], p: &Policy, _: u32, _: Timestamp) -> Result<Decision, StoreError> {
/// #     let mut s = None; let v = limiter_core::algorithm::apply(&mut s, p, 1, 0);
/// #     Ok(Decision::from_verdict(v, p, "allow")) } }
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store: Arc<dyn limiter_core::Store> = Arc::new(Allow);
/// let limiter = Limiter::builder()
///     .clock(ManualClock::new())
///     .rule(Rule::new("search", store, Policy::sliding_log(60, Duration::from_secs(60))?)?)
///     .build()?;
/// let decision = limiter.check(b"client:1").await;
/// assert!(decision.allowed);
/// # Ok::<(), limiter_core::ConfigError>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Limiter {
    rules: Arc<[Rule]>,
    clock: Arc<dyn Clock>,
    /// Some rule has a refusal cache, so each request first asks the caches.
    caches: bool,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.rules)
            .field("clock", &self.clock)
            .finish()
    }
}

/// An admitting rule's charges, kept until the request's fate is known.
/// The storage key is built again on the refusal path rather than carried
/// along the admit path.
struct Pending<'a> {
    rule: &'a Rule,
    charges: SmallVec<[Charge; 2]>,
}

impl Limiter {
    /// A builder with the system clock and no rules.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder {
            rules: Vec::new(),
            clock: Arc::new(SystemClock),
        }
    }

    /// The rules, in the order they are applied.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| &*r.name == name)
    }

    /// The clock every decision reads.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A snapshot of every rule's counters, in rule order.
    pub fn stats(&self) -> Vec<RuleStats> {
        self.rules.iter().map(Rule::stats).collect()
    }

    /// Decides one request for `key`. Never fails: a store error becomes a
    /// decision under the failing rule's fallback or [`FailurePolicy`].
    ///
    /// Returns the first refusal, after refunding what earlier rules
    /// admitted for the request; or when every rule admits, the admitting
    /// decision with the fewest units remaining (the one a client should
    /// see in rate-limit headers). A rule admitted by its failure policy
    /// knows nothing of the client's quota, so it is shown only when no
    /// store answered at all.
    pub async fn check(&self, key: &[u8]) -> Decision {
        self.decide(key, 1).await
    }

    /// [`check`](Self::check) for a request that weighs `weight` units: each
    /// rule charges `weight` times its own cost ([`Rule::with_cost`]), and
    /// refunds as much if a later rule refuses.
    ///
    /// Refuses with [`ConfigError::InvalidCost`], before any store is asked
    /// and charging nothing, a weight that some rule could never admit: zero,
    /// or a charge above the rule's limit (or its escalation policy's).
    /// Such a request is not refused *for now*: no wait would ever admit it,
    /// so it gets no decision and no retry time.
    pub async fn check_cost(&self, key: &[u8], weight: u32) -> Result<Decision, ConfigError> {
        for rule in self.rules.iter() {
            let charge = rule
                .cost
                .checked_mul(weight)
                .ok_or(ConfigError::InvalidCost {
                    cost: weight,
                    limit: rule.policy.limit(),
                })?;
            rule.policy.check_cost(charge)?;
            if let Some(e) = &rule.escalation {
                e.policy.check_cost(charge)?;
            }
        }
        Ok(self.decide(key, weight).await)
    }

    /// `weight` was checked against every rule: their charges cannot
    /// overflow.
    async fn decide(&self, key: &[u8], weight: u32) -> Decision {
        let now = self.clock.now();
        // A standing refusal from any rule's cache answers before any store
        // is asked, so a hammering offender costs no round trip and no
        // local tier's admit-then-refund either.
        if self.caches {
            for rule in self.rules.iter() {
                if let Some(d) = rule.cached_refusal(key, now, self.clock.as_ref()).await {
                    return d;
                }
            }
        }
        let clock = self.clock.as_ref();
        let mut buf = StorageKey::new();
        let last = self.rules.len() - 1;
        let mut pending: SmallVec<[Pending<'_>; 3]> = SmallVec::new();
        let mut tightest: Option<Decision> = None;
        for (i, rule) in self.rules.iter().enumerate() {
            let storage_key = rule.fill_storage_key(&mut buf, key);
            let cost = rule.cost * weight;
            // A rule answered inline (a local tier) is decided without
            // building its future, whose size alone made moving it cost
            // more than the store's own decision.
            let applied = match rule.apply_inline(key, storage_key, cost, now, i < last) {
                Some(applied) => applied,
                None => {
                    rule.apply(key, storage_key, cost, now, clock, i < last)
                        .await
                }
            };
            let Applied {
                mut decision,
                charges,
            } = applied;
            rule.finish(&mut decision);
            // One rule, the common case: nothing to refund, no tightest to
            // pick.
            if last == 0 {
                return decision;
            }
            if !decision.allowed {
                for p in pending.iter().rev() {
                    let storage_key = p.rule.fill_storage_key(&mut buf, key);
                    let cost = p.rule.cost * weight;
                    p.rule.refund(storage_key, &p.charges, cost, now).await;
                }
                return decision;
            }
            if i < last && !charges.is_empty() {
                pending.push(Pending { rule, charges });
            }
            let tighter = match &tightest {
                None => true,
                Some(t) => match (t.source.degraded, decision.source.degraded) {
                    (true, false) => true,
                    (false, true) => false,
                    _ => decision.remaining < t.remaining,
                },
            };
            if tighter {
                tightest = Some(decision);
            }
        }
        // The builder refuses a limiter without rules.
        tightest.expect("a limiter has at least one rule")
    }

    /// Writes every abuse event held back in memory (refusals counted since
    /// each key's last event), so that none is lost: call it at shutdown,
    /// and periodically if keys may stay quiet for long. Returns how many
    /// events were written.
    pub async fn flush_abuse_events(&self) -> u64 {
        let mono = micros(self.clock.monotonic());
        let mut written = 0;
        for rule in self.rules.iter() {
            if let Some(recorder) = rule.escalation.as_ref().and_then(|e| e.abuse.as_ref()) {
                let writes = recorder.flush(mono, rule.timeout).await;
                written += writes.written;
                rule.count_writes(writes);
            }
        }
        written
    }
}

/// Builds a [`Limiter`].
#[derive(Debug)]
pub struct LimiterBuilder {
    rules: Vec<Rule>,
    clock: Arc<dyn Clock>,
}

impl LimiterBuilder {
    /// Appends a rule; rules apply in the order they are added.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Uses `clock` instead of the system clock.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Uses a shared clock.
    pub fn shared_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Builds the limiter. Refuses an empty rule list and duplicate rule
    /// names (they would share state).
    pub fn build(self) -> Result<Limiter, ConfigError> {
        if self.rules.is_empty() {
            return Err(ConfigError::Invalid(
                "a limiter needs at least one rule".into(),
            ));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if self.rules[..i].iter().any(|r| r.name == rule.name) {
                return Err(ConfigError::Invalid(format!(
                    "two rules are named {:?}",
                    rule.name
                )));
            }
        }
        let caches = self.rules.iter().any(|r| r.refusals.is_some());
        Ok(Limiter {
            rules: self.rules.into(),
            clock: self.clock,
            caches,
        })
    }
}
