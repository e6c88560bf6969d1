//! Test doubles: an honest in-memory store and deliberately broken ones.
//!
//! These prove the suite's teeth: [`ReferenceStore`] passes every scenario,
//! and each [`BrokenStore`] carries one [`Defect`] that real limiters have
//! shipped, which the scenarios its docs name catch. Every scenario catches
//! at least one of them, and so does each check of key bounds, refunds and
//! the largest policies, on the inline entry points as on the awaited ones.
//! (Invalid costs, over-long keys and refunds of refusals are not among
//! them: [`Request`] and its kin refuse those
//! before a store is called, so no store can get them wrong.) They are built on
//! [`ratewarden_core::algorithm::apply`] with a key cap and least-recently-used
//! eviction; they are not meant for production (the `ratewarden-memory` crate
//! is).
//!
//! ```
//! use ratewarden_conformance::broken::{BrokenStore, Defect, ReferenceStore};
//! use ratewarden_conformance::ratewarden_core::Store;
//!
//! let honest = ReferenceStore::new(1_000);
//! assert_eq!(honest.capabilities().key_capacity, Some(1_000));
//! let broken = BrokenStore::new(Defect::RefusalsRecorded, 1_000);
//! assert_eq!(broken.name(), "broken-refusals-recorded");
//! ```
//!
//! About 840 lines before its tests: every defect is a variation of one
//! reference core, and lives next to the honest code it bends.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use ratewarden_core::algorithm::{self, KeyState, Verdict};
use ratewarden_core::ban::{self, BanState};
use ratewarden_core::{
    Algorithm, Ban, Capabilities, ConfigError, Decision, ErrorKind, Key, Policy, Refund, Request,
    Store, StoreError, Timestamp,
};

/// One defect a [`BrokenStore`] has, and the scenario meant to catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Defect {
    /// Evicts the key inserted first, however recently it was used
    /// (`distinct_key_flood`).
    InsertionOrderEviction,
    /// Refreshes a key's place in the eviction order only when a request is
    /// admitted, so an offender that is being refused ages out
    /// (`distinct_key_flood`).
    EvictionSkipsRefusals,
    /// Counts refused requests: appends them to the log, adds them to the
    /// counters, advances GCRA's arrival time (`refused_hammering`).
    RefusalsRecorded,
    /// Restarts a fixed window at every hit, admitted or refused, as a
    /// `PEXPIRE` on every request would (`window_renewal`).
    ExpiryRenewedOnEveryHit,
    /// Reads the state, yields to the runtime, then writes: get-then-set
    /// without atomicity, its gap held open as a round trip would
    /// (`concurrent_exactness`).
    NonAtomic,
    /// Reads the state under the lock, releases it, decides, then takes
    /// the lock again to write, on both entry points: get-then-set with
    /// nothing widening the gap between the two, so an update is lost only
    /// when another thread decides in that gap, on another core or while
    /// the system has suspended the first there (`concurrent_exactness`).
    LockReleasedBeforeWrite,
    /// Truncates keys to 256 bytes (`hostile_keys`).
    TruncatedKeys,
    /// Stores keys as lossily decoded UTF-8 (`hostile_keys`).
    LossyUtf8Keys,
    /// Forgets a key's state when `now` is earlier than the last time it saw
    /// (`clock_regression`).
    ResetOnClockRegression,
    /// Panics when `now` is earlier than the last time it saw
    /// (`clock_regression`).
    PanicOnClockRegression,
    /// Admits while the count is at most the limit: one unit too many
    /// (`policy_semantics`, `cost_accounting`).
    OffByOne,
    /// Lists only the sliding log and the fixed window, yet its
    /// `check_policy` accepts everything (`bad_configuration`).
    AcceptsUnsupportedAlgorithms,
    /// Hashes keys into 4 buckets that share state (`key_independence`).
    SharedBuckets,
    /// Answers every refund with success and changes nothing, as a store
    /// written before refunds existed would if it stubbed them out
    /// (`refund_exactness`).
    RefundIgnored,
    /// Refunds by taking `cost` units off whatever the key holds now (the
    /// newest log entries, the current counter, the arrival time), without
    /// checking that they are the refunded admission's (`refund_exactness`).
    RefundBlind,
    /// Answers [`Store::decide_inline`] (the path a `Limiter` takes for an
    /// in-process store) with a shortcut that counts refused requests, while
    /// [`Store::decide`] is honest: a fast path that drifted from the
    /// tested one (`refused_hammering`, which sends every other request
    /// inline).
    InlineRecordsRefusals,
    /// Forgets a key's state as soon as it is written when the window is
    /// longer than 30 days, as a memcached expiry does (more than 30 days of
    /// seconds is read as an absolute Unix time, long past), while
    /// `check_policy` accepts such windows: the largest policies are
    /// accepted, then never limit (`bad_configuration`).
    LongWindowsForgotten,
    /// Declares, and enforces, a key-length bound of 2 MiB: a bound too
    /// large to bound what one key costs (`key_length_bound`).
    HugeKeyBound,
    /// Refunds a key that holds nothing by creating it with a negative
    /// count, as a `DECRBY` on a missing Redis key does: that key then
    /// admits `cost` units more than its limit (`refund_exactness`).
    GhostRefundCredits,
    /// Answers [`Store::refund_inline`] with success and changes nothing,
    /// while [`Store::refund`] is honest (`refund_exactness`, which sends
    /// every other refund of its tables inline).
    InlineRefundIgnored,
    /// Answers [`Store::peek`] by deciding: the peek counts the units it
    /// only asked about, as a quota endpoint calling `decide` would
    /// (`peek_never_records`).
    PeekRecords,
    /// Peeks a key it does not hold by creating its record, as an upsert
    /// that reads would: a fixed window opens at the peek, with nothing
    /// counted, instead of at the key's first request, and ends that much
    /// earlier (`peek_never_records`).
    PeekOpensWindow,
    /// Answers [`Store::reset`] with success and changes nothing, a stub
    /// (`reset_is_exact`).
    ResetIgnored,
    /// Resets a sliding window's current count and keeps the previous
    /// window's, as a store keeping the two counts under two keys and
    /// deleting one would: the reset key admits fewer than its limit while
    /// the previous window still weighs (`reset_is_exact`).
    ResetKeepsPrevious,
    /// Keeps a key's state per policy rather than per algorithm, as a store
    /// that puts the limit in its storage key would: a client moved to
    /// another plan (another limit) starts from nothing, and one moved back
    /// and forth gets each plan's whole limit in the same window
    /// (`policy_change`).
    StatePerPolicy,
    /// Answers [`Store::penalize`] by deciding the penalty: it is recorded
    /// only when it fits, so a key already over its limit, the one a late
    /// charge is meant to hold back longer, is never charged
    /// (`penalty_is_counted`).
    PenaltyOnlyWhenItFits,
    /// Restarts a key's ban on every request refused while it lasts, as a
    /// ban set with `SET … EX` on each refusal would: a client that keeps
    /// retrying is never let back in (`bans_are_exact`).
    BanExtendedByRefusals,
    /// Declares bans and accepts a banning policy, then never bans: a store
    /// that stubbed the ban out (`bans_are_exact`).
    BanIgnored,
    /// Forgets the key's state on a reset but keeps its ban, as a store
    /// keeping the ban under a key of its own and deleting only the state's
    /// would: the customer an operator let back in stays locked out
    /// (`bans_are_exact`).
    BanSurvivesReset,
    /// Declares no bans, yet its `check_policy` accepts a banning policy,
    /// which it then decides without the ban (`bans_are_exact`).
    BanAcceptedUndeclared,
}

/// The longest window whose state a [`Defect::LongWindowsForgotten`] store
/// keeps: memcached's 30 days.
const FORGETS_WINDOWS_OVER: Duration = Duration::from_secs(30 * 24 * 3600);

/// The key-length bound a [`Defect::HugeKeyBound`] store declares.
const HUGE_KEY_BOUND: usize = 2 << 20;

impl Defect {
    /// Every defect.
    pub const ALL: [Defect; 30] = [
        Defect::InsertionOrderEviction,
        Defect::EvictionSkipsRefusals,
        Defect::RefusalsRecorded,
        Defect::ExpiryRenewedOnEveryHit,
        Defect::NonAtomic,
        Defect::LockReleasedBeforeWrite,
        Defect::TruncatedKeys,
        Defect::LossyUtf8Keys,
        Defect::ResetOnClockRegression,
        Defect::PanicOnClockRegression,
        Defect::OffByOne,
        Defect::AcceptsUnsupportedAlgorithms,
        Defect::SharedBuckets,
        Defect::RefundIgnored,
        Defect::RefundBlind,
        Defect::InlineRecordsRefusals,
        Defect::LongWindowsForgotten,
        Defect::HugeKeyBound,
        Defect::GhostRefundCredits,
        Defect::InlineRefundIgnored,
        Defect::PeekRecords,
        Defect::PeekOpensWindow,
        Defect::ResetIgnored,
        Defect::ResetKeepsPrevious,
        Defect::StatePerPolicy,
        Defect::PenaltyOnlyWhenItFits,
        Defect::BanExtendedByRefusals,
        Defect::BanIgnored,
        Defect::BanSurvivesReset,
        Defect::BanAcceptedUndeclared,
    ];

    /// The store name of a [`BrokenStore`] with this defect.
    pub const fn store_name(self) -> &'static str {
        match self {
            Defect::InsertionOrderEviction => "broken-insertion-order-eviction",
            Defect::EvictionSkipsRefusals => "broken-eviction-skips-refusals",
            Defect::RefusalsRecorded => "broken-refusals-recorded",
            Defect::ExpiryRenewedOnEveryHit => "broken-expiry-renewed-on-every-hit",
            Defect::NonAtomic => "broken-non-atomic",
            Defect::LockReleasedBeforeWrite => "broken-lock-released-before-write",
            Defect::TruncatedKeys => "broken-truncated-keys",
            Defect::LossyUtf8Keys => "broken-lossy-utf8-keys",
            Defect::ResetOnClockRegression => "broken-reset-on-clock-regression",
            Defect::PanicOnClockRegression => "broken-panic-on-clock-regression",
            Defect::OffByOne => "broken-off-by-one",
            Defect::AcceptsUnsupportedAlgorithms => "broken-accepts-unsupported-algorithms",
            Defect::SharedBuckets => "broken-shared-buckets",
            Defect::RefundIgnored => "broken-refund-ignored",
            Defect::RefundBlind => "broken-refund-blind",
            Defect::InlineRecordsRefusals => "broken-inline-records-refusals",
            Defect::LongWindowsForgotten => "broken-long-windows-forgotten",
            Defect::HugeKeyBound => "broken-huge-key-bound",
            Defect::GhostRefundCredits => "broken-ghost-refund-credits",
            Defect::InlineRefundIgnored => "broken-inline-refund-ignored",
            Defect::PeekRecords => "broken-peek-records",
            Defect::PeekOpensWindow => "broken-peek-opens-window",
            Defect::ResetIgnored => "broken-reset-ignored",
            Defect::ResetKeepsPrevious => "broken-reset-keeps-previous",
            Defect::StatePerPolicy => "broken-state-per-policy",
            Defect::PenaltyOnlyWhenItFits => "broken-penalty-only-when-it-fits",
            Defect::BanExtendedByRefusals => "broken-ban-extended-by-refusals",
            Defect::BanIgnored => "broken-ban-ignored",
            Defect::BanSurvivesReset => "broken-ban-survives-reset",
            Defect::BanAcceptedUndeclared => "broken-ban-accepted-undeclared",
        }
    }
}

/// An honest bounded in-memory store: the reference the broken ones are
/// variations of. It passes every scenario.
///
/// State is kept per (algorithm, key) under one mutex; when full it evicts
/// the least recently touched key, and every request, admitted or refused,
/// touches its key.
#[derive(Debug)]
pub struct ReferenceStore {
    core: Core,
}

impl ReferenceStore {
    /// A store of every algorithm holding at most `capacity` keys (at least
    /// one).
    pub fn new(capacity: usize) -> Self {
        Self::with_algorithms(&Algorithm::ALL, capacity)
    }

    /// A store implementing only `algorithms`; its `check_policy` refuses
    /// the others, and `decide` answers them with an `InvalidRequest` error.
    pub fn with_algorithms(algorithms: &'static [Algorithm], capacity: usize) -> Self {
        ReferenceStore {
            core: Core::new("reference", None, algorithms, capacity),
        }
    }

    /// The same store accepting keys of at most `bytes` bytes (default
    /// [`DEFAULT_MAX_KEY_LEN`](ratewarden_core::DEFAULT_MAX_KEY_LEN)).
    pub fn with_max_key_len(mut self, bytes: usize) -> Self {
        self.core.max_key_len = bytes;
        self
    }

    /// The same store under the name `name`, declaring itself shared
    /// ([`Capabilities::shared`]): a stand-in for a named shared tier in a
    /// test of a composition, where the store's name shows in each
    /// decision's source and sharing turns the refusal cache on by default.
    pub fn shared_as(mut self, name: &'static str) -> Self {
        self.core.name = name;
        self.core.shared = true;
        self
    }

    /// How many keys the store holds now.
    pub fn len(&self) -> usize {
        self.core.lock().map.len()
    }

    /// The store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most keys the store has held at once.
    pub fn high_water(&self) -> usize {
        self.core.lock().high_water
    }
}

/// A store with one deliberate [`Defect`], otherwise the [`ReferenceStore`].
#[derive(Debug)]
pub struct BrokenStore {
    defect: Defect,
    core: Core,
}

impl BrokenStore {
    /// A store of every algorithm (but see
    /// [`Defect::AcceptsUnsupportedAlgorithms`]) holding at most `capacity`
    /// keys, with `defect`.
    pub fn new(defect: Defect, capacity: usize) -> Self {
        let algorithms: &'static [Algorithm] = match defect {
            Defect::AcceptsUnsupportedAlgorithms => {
                &[Algorithm::SlidingLog, Algorithm::FixedWindow]
            }
            _ => &Algorithm::ALL,
        };
        BrokenStore {
            defect,
            core: Core::new(defect.store_name(), Some(defect), algorithms, capacity),
        }
    }

    /// The defect.
    pub fn defect(&self) -> Defect {
        self.defect
    }
}

#[derive(Debug)]
struct Entry {
    state: Option<KeyState>,
    tick: u64,
    last_now: u64,
    /// Units the key admits beyond its limit: the negative count of a
    /// [`Defect::GhostRefundCredits`] refund; zero otherwise.
    credit: u32,
    /// The key's ban ([`ratewarden_core::ban`]), beside its state.
    ban: Option<BanState>,
}

type MapKey = (Algorithm, Vec<u8>);

#[derive(Debug, Default)]
struct Keys {
    map: HashMap<MapKey, Entry>,
    /// Eviction order: the smallest tick goes first.
    order: BTreeMap<u64, MapKey>,
    tick: u64,
    high_water: usize,
}

#[derive(Debug)]
struct Core {
    name: &'static str,
    defect: Option<Defect>,
    algorithms: &'static [Algorithm],
    capacity: usize,
    max_key_len: usize,
    shared: bool,
    keys: Mutex<Keys>,
    /// Callers between their read and their write, for
    /// [`Defect::NonAtomic`].
    in_window: AtomicUsize,
}

/// How many times a [`Defect::NonAtomic`] caller yields, at most, waiting
/// for another caller to read between its own read and write.
const NON_ATOMIC_WAIT: usize = 100;

impl Core {
    fn new(
        name: &'static str,
        defect: Option<Defect>,
        algorithms: &'static [Algorithm],
        capacity: usize,
    ) -> Self {
        Core {
            name,
            defect,
            algorithms,
            capacity: capacity.max(1),
            max_key_len: ratewarden_core::DEFAULT_MAX_KEY_LEN,
            shared: false,
            keys: Mutex::new(Keys::default()),
            in_window: AtomicUsize::new(0),
        }
    }

    fn has(&self, defect: Defect) -> bool {
        self.defect == Some(defect)
    }

    fn lock(&self) -> MutexGuard<'_, Keys> {
        // A panicking defect poisons the lock; the state is still usable.
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::new(self.algorithms).with_key_capacity(self.capacity);
        capabilities.shared = self.shared;
        capabilities.bans = !self.has(Defect::BanAcceptedUndeclared);
        capabilities
    }

    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        if self.has(Defect::AcceptsUnsupportedAlgorithms)
            || self.algorithms.contains(&policy.algorithm())
        {
            Ok(())
        } else {
            Err(ConfigError::UnsupportedAlgorithm {
                store: self.name,
                algorithm: policy.algorithm(),
            })
        }
    }

    /// The policy's ban, as this store applies it.
    fn ban<'p>(&self, policy: &'p Policy) -> Option<&'p Ban> {
        policy
            .ban()
            .filter(|_| !self.has(Defect::BanIgnored) && !self.has(Defect::BanAcceptedUndeclared))
    }

    /// The bound [`Store::max_key_len`] declares.
    fn declared_max_key_len(&self) -> usize {
        match self.defect {
            Some(Defect::HugeKeyBound) => HUGE_KEY_BOUND,
            _ => self.max_key_len,
        }
    }

    fn map_key(&self, policy: &Policy, key: &[u8]) -> MapKey {
        let algorithm = policy.algorithm();
        let key = match self.defect {
            Some(Defect::StatePerPolicy) => {
                let mut k = key.to_vec();
                k.extend_from_slice(&policy.limit().to_be_bytes());
                k
            }
            Some(Defect::TruncatedKeys) => key[..key.len().min(256)].to_vec(),
            Some(Defect::LossyUtf8Keys) => String::from_utf8_lossy(key).into_owned().into_bytes(),
            Some(Defect::SharedBuckets) => {
                let sum = key.iter().map(|&b| u32::from(b)).sum::<u32>();
                vec![(sum % 4) as u8]
            }
            _ => key.to_vec(),
        };
        (algorithm, key)
    }

    /// The state transition, with this store's defect applied.
    fn transition(
        &self,
        state: &mut Option<KeyState>,
        last_now: Option<u64>,
        policy: &Policy,
        cost: u32,
        now: u64,
    ) -> Verdict {
        if let Some(last) = last_now.filter(|&last| now < last) {
            if self.has(Defect::ResetOnClockRegression) {
                *state = None;
            }
            if self.has(Defect::PanicOnClockRegression) {
                panic!("time went backwards: {now} µs < {last} µs");
            }
        }
        let before = self.has(Defect::OffByOne).then(|| state.clone());
        let mut verdict = algorithm::apply(state, policy, cost, now);
        if let Some(mut lenient) = before.filter(|_| !verdict.allowed) {
            // `count + cost <= limit + 1`: the classic `<=` for `<`.
            let one_more = Policy::new(policy.algorithm(), policy.limit() + 1, policy.window());
            if let Ok(one_more) = one_more {
                let v = algorithm::apply(&mut lenient, &one_more, cost, now);
                if v.allowed {
                    *state = lenient;
                    verdict = Verdict {
                        allowed: true,
                        remaining: 0,
                        reset_after_us: v.reset_after_us,
                        retry_after_us: 0,
                    };
                }
            }
        }
        if !verdict.allowed && self.has(Defect::RefusalsRecorded) {
            record_refusal(state, policy, cost, now);
        }
        if self.has(Defect::ExpiryRenewedOnEveryHit)
            && let Some(KeyState::FixedWindow { start, .. }) = state
        {
            *start = now;
        }
        if self.has(Defect::LongWindowsForgotten) && policy.window() > FORGETS_WINDOWS_OVER {
            *state = None;
        }
        verdict
    }

    /// Writes `state` back and decides whether the key's eviction position
    /// moves.
    fn store(
        &self,
        keys: &mut Keys,
        key: MapKey,
        state: Option<KeyState>,
        now: u64,
        allowed: bool,
    ) {
        keys.tick += 1;
        let tick = keys.tick;
        if let Some(entry) = keys.map.get_mut(&key) {
            entry.state = state;
            entry.last_now = now;
            let touch = match self.defect {
                Some(Defect::InsertionOrderEviction) => false,
                Some(Defect::EvictionSkipsRefusals) => allowed,
                _ => true,
            };
            if touch {
                let old = std::mem::replace(&mut entry.tick, tick);
                keys.order.remove(&old);
                keys.order.insert(tick, key);
            }
            return;
        }
        while keys.map.len() >= self.capacity {
            match keys.order.pop_first() {
                Some((_, victim)) => {
                    keys.map.remove(&victim);
                }
                None => break,
            }
        }
        keys.order.insert(tick, key.clone());
        keys.map.insert(
            key,
            Entry {
                state,
                tick,
                last_now: now,
                credit: 0,
                ban: None,
            },
        );
        keys.high_water = keys.high_water.max(keys.map.len());
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        if !self.has(Defect::NonAtomic) {
            return self.decide_now(key, policy, cost, now, false);
        }
        self.check_algorithm(policy)?;
        let now = now.as_micros();
        let key = self.map_key(policy, key);
        let verdict = {
            let (mut state, last_now) = {
                let keys = self.lock();
                match keys.map.get(&key) {
                    Some(e) => (e.state.clone(), Some(e.last_now)),
                    None => (None, None),
                }
            };
            // The round trip between the read and the write, where other
            // callers read the same state. Held open until another caller
            // is in it too (or a bounded number of yields, for a caller
            // alone): a single yield left the overlap to the scheduler,
            // and a loaded machine once ran the concurrent scenario's
            // callers one after the other, losing no update.
            self.in_window.fetch_add(1, Ordering::SeqCst);
            for _ in 0..NON_ATOMIC_WAIT {
                tokio::task::yield_now().await;
                if self.in_window.load(Ordering::SeqCst) > 1 {
                    break;
                }
            }
            let verdict = self.transition(&mut state, last_now, policy, cost, now);
            let mut keys = self.lock();
            self.store(&mut keys, key, state, now, verdict.allowed);
            drop(keys);
            self.in_window.fetch_sub(1, Ordering::SeqCst);
            verdict
        };
        Ok(Decision::from_verdict(verdict, policy, self.name))
    }

    /// Refuses an algorithm the store does not list (unless its defect is
    /// to accept them): a store is given checked arguments, but not checked
    /// against what it implements.
    fn check_algorithm(&self, policy: &Policy) -> Result<(), StoreError> {
        self.check_policy(policy)
            .map_err(|e| StoreError::invalid_request(self.name, e))
    }

    /// The whole decision under the lock (but see
    /// [`Defect::LockReleasedBeforeWrite`]), for `decide` and
    /// `decide_inline` (`inline` says which is asking).
    fn decide_now(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
        inline: bool,
    ) -> Result<Decision, StoreError> {
        self.check_algorithm(policy)?;
        let now = now.as_micros();
        let key = self.map_key(policy, key);
        let mut keys = self.lock();
        if let Some(ban) = self.ban(policy) {
            return Ok(self.decide_banned(&mut keys, key, policy, ban, cost, now));
        }
        let split = self.has(Defect::LockReleasedBeforeWrite);
        let (mut state, last_now, credit) = match keys.map.get_mut(&key) {
            Some(e) if split => (e.state.clone(), Some(e.last_now), e.credit),
            Some(e) => (e.state.take(), Some(e.last_now), e.credit),
            None => (None, None, 0),
        };
        // Released between the read and the write, and taken again below:
        // a thread that locks in between reads the same state.
        let held = if split {
            drop(keys);
            None
        } else {
            Some(keys)
        };
        // A negative count: the limit the key is held to grows by it.
        let credited = (credit > 0)
            .then(|| {
                let limit = policy.limit().saturating_add(credit);
                Policy::new(policy.algorithm(), limit, policy.window()).ok()
            })
            .flatten();
        let applied = credited.as_ref().unwrap_or(policy);
        let verdict = self.transition(&mut state, last_now, applied, cost, now);
        if inline && !verdict.allowed && self.has(Defect::InlineRecordsRefusals) {
            record_refusal(&mut state, policy, cost, now);
        }
        let mut keys = held.unwrap_or_else(|| self.lock());
        self.store(&mut keys, key, state, now, verdict.allowed);
        Ok(Decision::from_verdict(verdict, policy, self.name))
    }
}

impl Core {
    /// A decision under `ban`, whole under the lock: the ban's refusal
    /// while it lasts, touching the key; else the algorithm, a refusal of
    /// which is a breach.
    fn decide_banned(
        &self,
        keys: &mut Keys,
        key: MapKey,
        policy: &Policy,
        ban: &Ban,
        cost: u32,
        now: u64,
    ) -> Decision {
        let (mut state, last_now, mut banned) = match keys.map.get_mut(&key) {
            Some(e) => (e.state.take(), Some(e.last_now), e.ban.take()),
            None => (None, None, None),
        };
        let answer = match ban::banned(&banned, now) {
            Some(refused) => {
                if self.has(Defect::BanExtendedByRefusals)
                    && let Some(b) = banned.as_mut()
                {
                    let offences = b.offences.saturating_sub(1);
                    b.until = now + ban.length_micros(offences);
                }
                (refused, true)
            }
            None => {
                let verdict = self.transition(&mut state, last_now, policy, cost, now);
                if verdict.allowed {
                    (verdict, false)
                } else {
                    ban::breach(&mut banned, ban, now, verdict)
                }
            }
        };
        let allowed = answer.0.allowed;
        self.store(keys, key.clone(), state, now, allowed);
        if let Some(entry) = keys.map.get_mut(&key) {
            entry.ban = banned;
        }
        Decision::from_ban_verdict(answer, policy, self.name)
    }

    /// `refund`, or (`inline`) `refund_inline`.
    fn refund(&self, refund: Refund<'_>, inline: bool) -> Result<(), StoreError> {
        let request = refund.request();
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let admitted = refund.admitted();
        if self.has(Defect::RefundIgnored) || (inline && self.has(Defect::InlineRefundIgnored)) {
            return Ok(());
        }
        let key = self.map_key(policy, key);
        let mut keys = self.lock();
        if self.has(Defect::GhostRefundCredits) && !keys.map.contains_key(&key) {
            self.store(&mut keys, key.clone(), None, now.as_micros(), true);
            if let Some(entry) = keys.map.get_mut(&key) {
                entry.credit = cost;
            }
            return Ok(());
        }
        let Some(entry) = keys.map.get_mut(&key) else {
            return Ok(());
        };
        if self.has(Defect::RefundBlind) {
            refund_blindly(&mut entry.state, policy, cost);
        } else {
            let reset_after = u64::try_from(admitted.reset_after.as_micros()).unwrap_or(u64::MAX);
            algorithm::refund(&mut entry.state, policy, cost, now.as_micros(), reset_after);
        }
        Ok(())
    }
}

impl Core {
    /// `peek`: the decision `decide` would make, on a copy of the state.
    fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        if self.has(Defect::PeekRecords) {
            return self.decide_now(key, policy, cost, now, false);
        }
        self.check_algorithm(policy)?;
        let t = now.as_micros();
        let map_key = self.map_key(policy, key);
        let mut keys = self.lock();
        if self.ban(policy).is_some() {
            let banned = keys.map.get(&map_key).and_then(|e| e.ban);
            if let Some(refused) = ban::banned(&banned, t) {
                return Ok(Decision::from_ban_verdict(
                    (refused, true),
                    policy,
                    self.name,
                ));
            }
        }
        let Some(entry) = keys.map.get(&map_key) else {
            let verdict = self.transition(&mut None, None, policy, cost, t);
            if self.has(Defect::PeekOpensWindow) && policy.algorithm() == Algorithm::FixedWindow {
                let opened = Some(KeyState::FixedWindow { start: t, count: 0 });
                self.store(&mut keys, map_key, opened, t, true);
            }
            return Ok(Decision::from_verdict(verdict, policy, self.name));
        };
        let credited = (entry.credit > 0)
            .then(|| {
                let limit = policy.limit().saturating_add(entry.credit);
                Policy::new(policy.algorithm(), limit, policy.window()).ok()
            })
            .flatten();
        let applied = credited.as_ref().unwrap_or(policy);
        let mut state = entry.state.clone();
        let verdict = self.transition(&mut state, Some(entry.last_now), applied, cost, t);
        Ok(Decision::from_verdict(verdict, policy, self.name))
    }

    /// `reset`: the key's entry removed, with its place in the eviction
    /// order.
    fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        if self.has(Defect::ResetIgnored) {
            return Ok(());
        }
        let map_key = self.map_key(policy, key.as_bytes());
        let mut keys = self.lock();
        if self.has(Defect::ResetKeepsPrevious)
            && let Some(Entry {
                state: Some(KeyState::SlidingWindow { current, .. }),
                ..
            }) = keys.map.get_mut(&map_key)
        {
            *current = 0;
            return Ok(());
        }
        if self.has(Defect::BanSurvivesReset)
            && let Some(entry) = keys.map.get_mut(&map_key)
            && entry.ban.is_some()
        {
            entry.state = None;
            return Ok(());
        }
        if let Some(entry) = keys.map.remove(&map_key) {
            keys.order.remove(&entry.tick);
        }
        Ok(())
    }
}

impl Core {
    /// `penalize`: [`algorithm::penalize`] on the key's state, which is
    /// touched and inserted as by an admission.
    fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        if self.has(Defect::PenaltyOnlyWhenItFits) {
            return self.decide_now(key, policy, cost, now, false).map(|_| ());
        }
        self.check_algorithm(policy)?;
        let t = now.as_micros();
        let map_key = self.map_key(policy, key);
        let mut keys = self.lock();
        let mut state = keys.map.get_mut(&map_key).and_then(|e| e.state.take());
        algorithm::penalize(&mut state, policy, cost, t);
        self.store(&mut keys, map_key, state, t, true);
        Ok(())
    }
}

/// What a refund that does not locate its admission does.
fn refund_blindly(state: &mut Option<KeyState>, policy: &Policy, cost: u32) {
    let c = u64::from(cost);
    match state {
        Some(KeyState::SlidingLog(log)) => {
            for _ in 0..cost {
                log.pop_back();
            }
        }
        Some(KeyState::FixedWindow { count, .. }) => *count = count.saturating_sub(c),
        Some(KeyState::SlidingWindow {
            current, previous, ..
        }) => {
            if *current > 0 {
                *current = current.saturating_sub(c);
            } else {
                *previous = previous.saturating_sub(c);
            }
        }
        Some(KeyState::Gcra { tat }) => {
            *tat = tat.saturating_sub(c * policy.emission_interval_micros());
        }
        None => {}
    }
}

/// What a limiter that counts refusals writes.
fn record_refusal(state: &mut Option<KeyState>, policy: &Policy, cost: u32, now: u64) {
    let c = u64::from(cost);
    match state {
        Some(KeyState::SlidingLog(log)) => {
            let t = now.max(log.back().copied().unwrap_or(0));
            log.extend(std::iter::repeat_n(t, cost as usize));
            while log.len() > policy.limit() as usize {
                log.pop_front();
            }
        }
        Some(KeyState::FixedWindow { count, .. }) => *count += c,
        Some(KeyState::SlidingWindow { current, .. }) => *current += c,
        Some(KeyState::Gcra { tat }) => {
            *tat = (*tat).max(now) + c * policy.emission_interval_micros();
        }
        None => {}
    }
}

macro_rules! impl_store {
    ($ty:ty) => {
        #[async_trait]
        impl Store for $ty {
            fn name(&self) -> &'static str {
                self.core.name
            }

            fn capabilities(&self) -> Capabilities {
                self.core.capabilities()
            }

            fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
                self.core.check_policy(policy)
            }

            fn max_key_len(&self) -> usize {
                self.core.declared_max_key_len()
            }

            async fn decide(&self, r: Request<'_>) -> Result<Decision, StoreError> {
                self.core.decide(r).await
            }

            // In process, so answered inline like the memory store, except
            // where the defect is a wait between read and write.
            fn decide_inline(&self, r: Request<'_>) -> Option<Result<Decision, StoreError>> {
                (!self.core.has(Defect::NonAtomic)).then(|| {
                    self.core
                        .decide_now(r.key(), r.policy(), r.cost(), r.now(), true)
                })
            }

            fn refund_inline(&self, refund: Refund<'_>) -> Option<Result<(), StoreError>> {
                (!self.core.has(Defect::NonAtomic)).then(|| self.core.refund(refund, true))
            }

            async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
                self.core.refund(refund, false)
            }

            async fn peek(&self, r: Request<'_>) -> Result<Decision, StoreError> {
                self.core.peek(r)
            }

            async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
                self.core.reset(key, policy)
            }

            async fn penalize(&self, r: Request<'_>) -> Result<(), StoreError> {
                self.core.penalize(r)
            }
        }
    };
}

impl_store!(ReferenceStore);
impl_store!(BrokenStore);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reference_store_is_bounded_and_evicts_the_least_recently_touched() {
        let store = ReferenceStore::new(3);
        let p = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
        let t = Timestamp::from_micros(1_000_000);
        assert!(
            crate::call::decide(&store, b"a", &p, 1, t)
                .await
                .unwrap()
                .allowed
        );
        assert!(
            crate::call::decide(&store, b"b", &p, 1, t)
                .await
                .unwrap()
                .allowed
        );
        assert!(
            crate::call::decide(&store, b"c", &p, 1, t)
                .await
                .unwrap()
                .allowed
        );
        // A refusal touches "a", so "b" is the oldest now.
        assert!(
            !crate::call::decide(&store, b"a", &p, 1, t)
                .await
                .unwrap()
                .allowed
        );
        assert!(
            crate::call::decide(&store, b"d", &p, 1, t)
                .await
                .unwrap()
                .allowed
        );
        assert_eq!(store.len(), 3);
        assert!(
            !crate::call::decide(&store, b"a", &p, 1, t)
                .await
                .unwrap()
                .allowed
        );
        assert!(
            crate::call::decide(&store, b"b", &p, 1, t)
                .await
                .unwrap()
                .allowed,
            "b was evicted"
        );
        assert_eq!(store.high_water(), 3);
    }
}

/// A store that is down: every call fails at once with
/// [`ErrorKind::Unavailable`], as a server refusing connections would. For
/// testing what a [`Limiter`](ratewarden_core::Limiter) does around a dead
/// store (fallback, breaker, failure policy); it is not a conformance
/// subject.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unavailable;

/// What every call to [`Unavailable`] answers.
fn refused() -> StoreError {
    StoreError::new(ErrorKind::Unavailable, "unavailable", "connection refused")
}

#[async_trait]
impl Store for Unavailable {
    fn name(&self) -> &'static str {
        "unavailable"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(&Algorithm::ALL).shared()
    }

    fn max_key_len(&self) -> usize {
        ratewarden_core::DEFAULT_MAX_KEY_LEN
    }

    async fn decide(&self, _: Request<'_>) -> Result<Decision, StoreError> {
        Err(refused())
    }

    async fn refund(&self, _: Refund<'_>) -> Result<(), StoreError> {
        Err(refused())
    }

    async fn peek(&self, _: Request<'_>) -> Result<Decision, StoreError> {
        Err(refused())
    }

    async fn reset(&self, _: Key<'_>, _: &Policy) -> Result<(), StoreError> {
        Err(refused())
    }

    async fn penalize(&self, _: Request<'_>) -> Result<(), StoreError> {
        Err(refused())
    }
}
