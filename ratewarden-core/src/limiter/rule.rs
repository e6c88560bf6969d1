//! One tier of a limiter: a [`Rule`], how it is configured, and what it
//! keeps between a request's rules. How it decides is in `decide.rs`.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use smallvec::SmallVec;

use crate::abuse::{AbuseRecorder, AbuseSink};
use crate::counter::load;
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::failure::{Breaker, BreakerConfig};
use crate::intern::{intern, intern_policy};
use crate::invalidation::{Invalidations, Ticket, Watch};
use crate::policy::Policy;
use crate::refusal_cache::{REFUSAL_CACHE_KEYS, RefusalCache};
use crate::store::Store;

use super::stats::{Counters, RuleStats};
use super::{DEFAULT_TIMEOUT, FailurePolicy};

mod decide;

pub(crate) use decide::{Local, Tried};
#[cfg(feature = "metrics")]
mod metric_keys;

/// Picks exactly one admitted request in every run of `every`, at a position
/// drawn afresh for each run from a keyed hash the clients cannot know.
///
/// A count per key (escalate when a key's count crosses a multiple of
/// `every`) depends on the client's pace: one pacing itself under the local
/// limit is never sampled, one whose count sits on a multiple is sampled on
/// every request. A rule-wide counter with a random phase per run is exact
/// (one in `every` over any run) and tells a client nothing.
pub(crate) struct Sampler {
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
pub(crate) struct Escalation {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) policy: Policy,
    /// The same policy, interned, for [`Source::policy`](crate::Source::policy).
    pub(crate) policy_label: &'static Policy,
    pub(crate) sampler: Sampler,
    pub(crate) breaker: Breaker,
    pub(crate) abuse: Option<AbuseRecorder>,
}

impl Escalation {
    /// A copy with fresh breakers, sampler and abuse tracker, for a rule
    /// reconfigured after it was cloned.
    fn rebuilt(&self) -> Escalation {
        let breaker = self.breaker.config();
        Escalation {
            store: self.store.clone(),
            policy: self.policy,
            policy_label: self.policy_label,
            sampler: Sampler::new(self.sampler.every as u32),
            breaker: Breaker::new(breaker),
            abuse: self.abuse.as_ref().map(|a| a.rebuilt()),
        }
    }
}

/// One tier of a [`Limiter`](crate::Limiter): a store, the policy it applies, and what to do
/// when it fails.
///
/// Clones share the rule's breakers, escalation sampler, abuse tracker and
/// counters.
#[derive(Clone)]
pub struct Rule {
    name: Arc<str>,
    /// The same name, interned, for [`Source::rule`](crate::Source::rule).
    label: &'static str,
    /// `{name}:`, which leads every storage key of the rule, interned.
    key_prefix: &'static str,
    /// The same as little-endian 8-byte words, padded with zeros to
    /// [`KEY_HEAD_WORDS`] words.
    key_head: [u64; KEY_HEAD_WORDS],
    store: Arc<dyn Store>,
    /// The store's name and key bound, read once: every request's
    /// arguments are checked against them before the store sees them.
    store_name: &'static str,
    max_key_len: usize,
    policy: Policy,
    /// The same policy, interned, for [`Source::policy`](crate::Source::policy).
    policy_label: &'static Policy,
    units_per_request: u32,
    timeout: Duration,
    on_failure: FailurePolicy,
    fallback: Option<Arc<dyn Store>>,
    breaker: Arc<Breaker>,
    escalation: Option<Arc<Escalation>>,
    /// Decided and counted, never let to refuse: see [`Rule::with_shadow`].
    shadow: bool,
    refusals: Option<Arc<RefusalCache>>,
    /// The store's notices of stale keys: told of this rule's give-backs
    /// and resets, and read by its refusal cache.
    notices: Arc<Invalidations>,
    counters: Arc<Counters>,
    #[cfg(feature = "metrics")]
    metric_keys: Arc<metric_keys::DecisionKeys>,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("store", &self.store.name())
            .field("policy", &self.policy)
            .field("units_per_request", &self.units_per_request)
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .field("shadow", &self.shadow)
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
pub(crate) enum Holder {
    Authoritative,
    Fallback,
    Durable,
}

/// One admission a rule made for a request whose fate is not yet known.
///
/// Only what locates the admission is kept ([`Store::refund`] reads
/// `reset_after`): a whole decision per rule would be copied on every
/// admitted request for the rare refusal that needs it.
#[derive(Clone, Copy)]
pub(crate) struct Charge {
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

    /// The admission as [`Store::refund`] is given it: what locates it.
    fn admitted(&self, policy: &Policy, store: &'static str) -> Decision {
        Decision::new(true, policy, 0, self.reset_after, Duration::ZERO, store)
    }
}

/// What one rule did for one request: its decision, and the admissions to
/// undo if a later rule refuses.
pub(crate) struct Applied {
    pub(crate) decision: Decision,
    pub(crate) charges: SmallVec<[Charge; 2]>,
}

/// How one guarded call ended.
pub(crate) enum Called {
    Answered(Decision),
    Failed(StoreError),
    /// The breaker was open: the store was not called.
    Skipped,
}

/// A rule's storage key, built on the stack for the keys a limiter usually
/// sees (a rule name of up to 64 bytes, `:`, a client key), so that a
/// decision allocates nothing for it; a longer key goes to the heap.
///
/// How it is written is the point: see [`Rule::fill_storage_key`].
pub(crate) struct StorageKey {
    /// [`INLINE_STORAGE_KEY`] bytes of key, and [`WORD_SLACK`] more that
    /// the last words written may spill into.
    pub(crate) inline: [u8; INLINE_STORAGE_KEY + WORD_SLACK],
    pub(crate) heap: Vec<u8>,
}

/// The longest storage key [`StorageKey`] holds on the stack.
pub(crate) const INLINE_STORAGE_KEY: usize = 128;

/// Bytes past the key that [`Rule::fill_storage_key`] may write: its last
/// word, and the word a key that ends mid-word carries into.
pub(crate) const WORD_SLACK: usize = 16;

/// The length in words of a rule's `{name}:` padded with zeros: every
/// prefix fits (at most [`MAX_RULE_NAME`] + 1 bytes) with a word to spare,
/// and so does any prefix [`Rule::fill_storage_key`] writes a client key
/// after (at most `INLINE_STORAGE_KEY - CLIENT_KEY` bytes), so that its
/// reads need no bounds check.
pub(crate) const KEY_HEAD_WORDS: usize = (INLINE_STORAGE_KEY - CLIENT_KEY) / 8 + 1;

/// The length of the workspace's client keys (32 hex digits), which
/// [`Rule::fill_storage_key`] writes in words read whole from the key.
pub(crate) const CLIENT_KEY: usize = 32;

impl StorageKey {
    pub(crate) fn new() -> Self {
        StorageKey {
            inline: [0; INLINE_STORAGE_KEY + WORD_SLACK],
            heap: Vec::new(),
        }
    }
}

// Every prefix, `{name}:`, fits the head it is copied as, and so does the
// whole word its last bytes are in (`Rule::fill_storage_key` reads it).
const _: () = assert!((MAX_RULE_NAME + 1) / 8 < KEY_HEAD_WORDS);

/// `prefix` followed by zeros, in [`KEY_HEAD_WORDS`] little-endian words
/// (`Rule::new` has checked the name's length).
fn key_head(prefix: &str) -> [u64; KEY_HEAD_WORDS] {
    let mut head = [0u64; KEY_HEAD_WORDS];
    for (word, chunk) in head.iter_mut().zip(prefix.as_bytes().chunks(8)) {
        let mut bytes = [0u8; 8];
        bytes[..chunk.len()].copy_from_slice(chunk);
        *word = u64::from_le_bytes(bytes);
    }
    head
}

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
    /// a [`Source::rule`](crate::Source::rule) without a reference count: build rule names from
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
        let notices = store.invalidations().unwrap_or_else(Invalidations::process);
        let refusals = store
            .capabilities()
            .shared
            .then(|| Arc::new(RefusalCache::new(REFUSAL_CACHE_KEYS, notices.clone())));
        let key_prefix = intern(&format!("{name}:"));
        let label = intern(&name);
        Ok(Rule {
            #[cfg(feature = "metrics")]
            metric_keys: Arc::new(metric_keys::DecisionKeys::new(label, store.name())),
            label,
            key_prefix,
            key_head: key_head(key_prefix),
            name,
            store_name: store.name(),
            max_key_len: store.max_key_len(),
            store,
            policy_label: intern_policy(&policy),
            policy,
            units_per_request: 1,
            timeout: DEFAULT_TIMEOUT,
            on_failure: FailurePolicy::default(),
            fallback: None,
            breaker: Arc::new(Breaker::new(BreakerConfig::default())),
            escalation: None,
            shadow: false,
            refusals,
            notices,
            counters: Arc::default(),
        })
    }

    /// One rule per policy, all in `store`, for a limit written as several
    /// (`"10/s; 1000/h"`, [`parse_policies`](crate::parse_policies)): the
    /// first named `name`, the next `name-2`, `name-3`, … A request must
    /// fit every one of them; one a later rule refuses is refunded to the
    /// earlier ones. Refuses what [`Rule::new`] refuses, and an empty list.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use ratewarden_core::{Limiter, ManualClock, Rule, Store, parse_policies};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let limiter = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rules(Rule::tiers("search", store, &parse_policies("2/s; 3/min")?)?)
    ///     .build()?;
    /// let names: Vec<&str> = limiter.rules().iter().map(|r| r.name()).collect();
    /// assert_eq!(names, ["search", "search-2"]);
    /// assert!(limiter.check(b"k").await.allowed);
    /// # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
    /// ```
    pub fn tiers(
        name: &str,
        store: Arc<dyn Store>,
        policies: &[Policy],
    ) -> Result<Vec<Rule>, ConfigError> {
        if policies.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "rule {name:?} needs at least one policy"
            )));
        }
        policies
            .iter()
            .enumerate()
            .map(|(i, policy)| {
                let name = match i {
                    0 => name.to_owned(),
                    _ => format!("{name}-{}", i + 1),
                };
                Rule::new(name, store.clone(), *policy)
            })
            .collect()
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
        self.refusals = Some(Arc::new(RefusalCache::new(keys, self.notices.clone())));
        Ok(self)
    }

    /// Asks the store on every request, refused or not.
    pub fn without_refusal_cache(mut self) -> Self {
        self.refusals = None;
        self
    }

    /// Puts the rule in shadow mode (`true`) or back to enforcing
    /// (`false`, the default).
    ///
    /// A rule in shadow mode decides and counts every request as usual, in
    /// its store, but its refusal refuses nothing: the request goes on to
    /// the next rule as if this one had admitted it, and the limiter's
    /// answer carries [`Source::shadow_refused`](crate::Source::shadow_refused).
    /// The would-be refusal is counted in
    /// [`RuleStats::shadow_refusals`](crate::RuleStats::shadow_refusals)
    /// and, with the `metrics` feature, as `ratewarden_decisions_total`
    /// with `outcome="shadow_refused"`. So a new limit can be watched on
    /// real traffic before it refuses anyone.
    ///
    /// Its state is the enforcing rule's: the same storage keys
    /// (`{rule}:{client key}`), so a limiter rebuilt with the rule
    /// enforcing, on the same store, goes on from the counts shadow mode
    /// kept. What it admitted is refunded when a later rule refuses, as for
    /// any rule; what it would have refused counts nothing. The answer a
    /// client sees (its headers) is the enforcing rules'; only when every
    /// rule is in shadow mode is it a shadow rule's, admitted. A shadow
    /// rule keeps no refusal cache, so each of its refusals is asked of its
    /// store.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use ratewarden_core::{Limiter, ManualClock, Policy, Rule, Store};
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let store: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
    /// let rule = Rule::new("search", store, Policy::fixed_window(2, Duration::from_secs(60))?)?;
    /// let watching = Limiter::builder()
    ///     .clock(ManualClock::new())
    ///     .rule(rule.clone().with_shadow(true))
    ///     .build()?;
    /// for _ in 0..2 {
    ///     assert!(!watching.check(b"k").await.source.shadow_refused);
    /// }
    /// let third = watching.check(b"k").await;
    /// assert!(third.allowed && third.source.shadow_refused); // would have been refused
    /// assert_eq!(watching.stats()[0].shadow_refusals, 1);
    ///
    /// // Switched on, the rule goes on from what shadow mode counted.
    /// let enforcing = Limiter::builder()
    ///     .shared_clock(watching.clock().clone())
    ///     .rule(rule.with_shadow(false))
    ///     .build()?;
    /// assert!(!enforcing.check(b"k").await.allowed);
    /// # Ok::<(), ratewarden_core::ConfigError>(()) }).unwrap();
    /// ```
    pub fn with_shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Whether the rule is in shadow mode ([`with_shadow`](Self::with_shadow)).
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// Charges `units` per request instead of 1 (a request of cost `c`,
    /// `c × units`). Refuses a number the policy (or the escalation policy)
    /// could never admit.
    pub fn with_units_per_request(mut self, units: u32) -> Result<Self, ConfigError> {
        self.policy.validate_cost(units)?;
        if let Some(e) = &self.escalation {
            e.policy.validate_cost(units)?;
        }
        self.units_per_request = units;
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
        #[cfg(feature = "metrics")]
        Arc::make_mut(&mut self.metric_keys).set_fallback(fallback.name());
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
    /// [`Limiter::flush_abuse_events`](crate::Limiter::flush_abuse_events)). Refused requests never reach the
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
        policy.validate_cost(self.units_per_request)?;
        let breaker = self.breaker.config();
        self.escalation = Some(Arc::new(Escalation {
            store: durable,
            policy_label: intern_policy(&policy),
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
    /// policy a decision with [`Source::escalated`](crate::Source::escalated) and `allowed == false`
    /// was made under.
    pub fn escalation_policy(&self) -> Option<&Policy> {
        self.escalation.as_ref().map(|e| &e.policy)
    }

    /// The rule's authoritative store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// A snapshot of the rule's counters.
    pub fn stats(&self) -> RuleStats {
        let c = &self.counters;
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
            shadow_refusals: load(&c.shadow_refusals),
            breaker: self.breaker.state(),
        }
    }

    /// The units this rule charges a request of `cost`, which
    /// [`check_cost`](Self::check_cost) has accepted.
    #[inline]
    pub(crate) fn units(&self, cost: u32) -> u32 {
        self.units_per_request * cost
    }

    /// Refuses a request cost this rule could never admit: zero, or units
    /// above its limit (or its escalation policy's).
    pub(crate) fn check_cost(&self, cost: u32) -> Result<(), ConfigError> {
        let units = self
            .units_per_request
            .checked_mul(cost)
            .ok_or(ConfigError::InvalidCost {
                cost,
                limit: self.policy.limit(),
            })?;
        self.policy.validate_cost(units)?;
        if let Some(e) = &self.escalation {
            e.policy.validate_cost(units)?;
        }
        Ok(())
    }

    /// The largest cost [`check_cost`](Self::check_cost) accepts.
    pub(crate) fn max_cost(&self) -> u32 {
        let limit = self.escalation.as_ref().map_or(self.policy.limit(), |e| {
            e.policy.limit().min(self.policy.limit())
        });
        limit / self.units_per_request
    }

    pub(crate) fn escalates(&self) -> bool {
        self.escalation.is_some()
    }

    /// The rule answers from a refusal cache: it has one and is not in
    /// shadow mode.
    pub(crate) fn has_refusal_cache(&self) -> bool {
        self.refusals.is_some() && !self.shadow
    }

    /// What a refusal of `storage_key` decided from now on is stamped
    /// with, for the refusal cache: [`Ticket::NONE`] when there is none.
    pub(crate) fn ticket(&self, storage_key: &[u8]) -> Ticket {
        match &self.refusals {
            Some(cache) => cache.ticket(storage_key),
            None => Ticket::NONE,
        }
    }

    /// Tells every refusal cache in front of this rule's store that
    /// `storage_key` has units back: what they hold of it is stale. Called
    /// once the store has them, and also before where that is not awaited.
    pub(crate) fn given_back(&self, storage_key: &[u8]) {
        self.notices.invalidate(storage_key);
    }

    /// Tells every refusal cache and lease in front of this rule's store
    /// that `storage_key` was reset: what they hold of it is stale.
    pub(crate) fn was_reset(&self, storage_key: &[u8]) {
        self.notices.reset(storage_key);
    }

    /// Writes the abuse events held back in memory; how many were written.
    pub(crate) async fn flush_abuse(&self, mono: u64) -> u64 {
        let Some(recorder) = self.escalation.as_ref().and_then(|e| e.abuse.as_ref()) else {
            return 0;
        };
        let writes = recorder.flush(mono, self.timeout).await;
        let written = writes.written;
        self.count_writes(writes);
        written
    }

    /// The key this rule stores for a client key: the rule's name, `:`,
    /// then the client key. Names hold no `:`, so two rules never share
    /// state, and the key is printable whenever the client key is.
    pub fn storage_key(&self, key: &[u8]) -> Vec<u8> {
        let mut buf = StorageKey::new();
        self.fill_storage_key(&mut buf, key).to_vec()
    }

    /// Registers a waiter for `key`'s give-backs and resets through this
    /// rule's table of notices, while the [`Watch`] lives.
    pub(crate) fn watch(&self, key: &[u8]) -> Watch {
        let mut buf = StorageKey::new();
        self.notices.watch(self.fill_storage_key(&mut buf, key))
    }
}

/// The longest rule name accepted.
pub const MAX_RULE_NAME: usize = 64;

pub(crate) fn check_rule_name(name: &str) -> Result<(), ConfigError> {
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
