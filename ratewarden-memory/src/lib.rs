//! A bounded, sharded, in-process [`Store`] for the limiter workspace.
//!
//! [`MemoryStore`] keeps each key's state in process memory and applies
//! [`ratewarden_core::algorithm::apply`] to it under a short lock: no I/O, no
//! `.await` inside, so a decision costs about a hash-map lookup under a
//! mutex. It implements all four algorithms.
//!
//! ```
//! use std::time::Duration;
//! use ratewarden_core::{Policy, Request, Store, Timestamp};
//! use ratewarden_memory::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemoryStore::builder().capacity(100_000).shards(16).build()?;
//! let policy = Policy::gcra(5, Duration::from_secs(60))?;
//! let now = Timestamp::from_micros(1_767_225_600_000_000);
//!
//! let request = Request::new(&store, b"client:42", &policy, 1, now)?;
//! for _ in 0..5 {
//!     assert!(store.decide(request).await?.allowed);
//! }
//! let refused = store.decide(request).await?;
//! assert!(!refused.allowed);
//! // GCRA refills one unit every 60 s / 5 = 12 s.
//! assert_eq!(refused.retry_after, Duration::from_secs(12));
//! assert_eq!(store.len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! # Bounds
//!
//! The store holds at most [`capacity`](MemoryStore::capacity) keys, ever.
//! The keys are spread over `N` shards, each a mutex around its own table
//! and recency order; shard `i` holds at most `cᵢ` keys, where every `cᵢ`
//! is `⌊capacity / N⌋` or `⌈capacity / N⌉` and the `cᵢ` sum to `capacity`
//! exactly. When a key that is not held arrives at a full shard, the key
//! at the front of that shard's order (the least recently moved; see below)
//! is evicted, in amortised O(1). No decision scans the keys, but for the
//! table's own upkeep: now and then a full shard's table is rebuilt at its
//! size, as a growing hash table rehashes. That costs at most 64 keys moved
//! per eviction, amortised, and 2 at the default store's shards (a rebuild
//! every few thousand evictions). It is dearest, about 22 moves per
//! eviction, for a shard cap just under a table's capacity (7 × 2ᵏ keys,
//! such as 1,750 or 7,000 keys a shard), where the table has little room
//! beside the keys. A move copies a 64-byte bucket and hashes nothing, so
//! even there it costs about a fifth: a flood of new keys into a store of
//! 28,000 keys (16 × 1,750) ran at 1.5 to 1.7 million decisions a second,
//! against 1.9 to 2.5 million into the default store (sliding log,
//! `BENCHMARKS.md`). Another number of
//! [`shards`](MemoryStoreBuilder::shards) moves a cap out of that band:
//! 18 shards give that store 1,555 keys a shard, tables of the same size,
//! and 1.9 moves per eviction.
//!
//! Memory is bounded by the key count, whatever the keys' length. A key is
//! held as a 16-byte digest (see [Keys](#keys)) in the table's own bucket
//! with its state: 64 bytes a bucket, one cache line, and a table has 1.14
//! to 2.3 buckets per key of its cap (1.31 for the default store's
//! 6,250-key shards). A sliding-log key adds 8 bytes per admitted unit in
//! its window (at most the policy's limit, itself at most
//! [`MAX_LOG_LIMIT`](ratewarden_core::MAX_LOG_LIMIT)). The order of moves
//! takes 16 bytes a record, at most about 2.5 records per key of the cap,
//! and up to twice that allocated while a compaction pass runs. After a
//! flood of a million keys, a default store of 100,000 GCRA keys had
//! added 11.1 to 11.2 MiB to the process, about 117 bytes a key.
//!
//! # Keys
//!
//! The store keeps no key, only its digest: SipHash-1-3 with a 128-bit
//! output of the key's bytes, under a 128-bit secret key that each store
//! draws from the OS for each algorithm when built and never reveals. One half
//! of the digest places the key (its shard, its slot); a decision finds its
//! state where both halves match. So two distinct keys share one state only
//! if all 128 bits collide. SipHash is a keyed pseudo-random function (its
//! authors' claim, made for SipHash-2-4; SipHash-1-3 is the variant Rust's
//! own `HashMap` keys against hash flooding, with no known attack on it):
//! without the secret, a digest is as good as a random 128-bit value, so
//! for one pair of keys a collision has probability 2⁻¹²⁸ (assuming
//! SipHash-1-3 is a pseudo-random function, as no known attack denies),
//! and a flood of 10¹² distinct keys through a full default store forms fewer than 2⁵⁷
//! pairs held at once, under 2⁻⁷¹ for one collision ever. A caller learns
//! its decisions and nothing of the digests, so aiming a key at another's
//! state, shard or probe sequence means guessing the secret; keys crafted
//! against any other key spread as random ones do (the `shard` module's
//! test `keys_crafted_against_a_known_key_spread_like_random_ones_under_a_secret_one`).
//! The price: the digest is the largest part of a decision, about a third
//! of its instructions. On one thread a decision costs as many
//! instructions as a decision of `governor`'s keyed limiter (449 against
//! 456), which keeps every key under a 64-bit hash, and 1.02–1.12× its
//! time (`BENCHMARKS.md`).
//!
//! Why a digest and not the key: held inline, a key of the workspace's
//! HTTP layer (a rule name and 32 hex digits) made a bucket 96 bytes, two
//! cache lines, and the tables of 10,000 warm keys outgrew a 1 MiB cache
//! level; a longer key took a heap allocation and one more miss per
//! decision.
//!
//! # Eviction guarantee
//!
//! Every [`decide`](Store::decide) touches its key — admitted *or refused*.
//! Each shard keeps its keys in a list ordered by when each last *moved* to
//! the back, and evicts from the front; a touch moves its key to the back
//! unless the key already moved within the shard's last `θ` moves, where
//! `θ = max(1, ⌊c / 8⌋)` for a shard of capacity `c`. (A hit on a key that
//! moved recently then writes nothing but its own state, so warm keys read
//! by several threads do not bounce the list's cache lines between cores.)
//!
//! A key `K` in a shard of capacity `c` can only be evicted once `c − θ + 1`
//! other distinct keys of that shard have been decided since `K`'s last
//! touch. `K` is evicted only from the front of a full shard, when a new key
//! arrives: all `c − 1` others moved after `K` last moved; at most `θ − 1` of
//! those moves came before `K`'s last touch (or that touch would have moved
//! `K`), so at least `c − θ` distinct keys moved, and so were decided, after
//! it, and the arriving key is one more. Below 16 keys per shard, `θ = 1`
//! and this is an exact LRU. In round numbers, a key touched again before
//! 7/8 of its shard's capacity in distinct other keys have been decided is
//! never evicted. So:
//!
//! * **One shard** (`shards(1)`): a key is never evicted while at most
//!   `capacity − θ` distinct other keys have been decided since its last
//!   touch.
//! * **`N` shards**: with `c = ⌊capacity / N⌋`, a key is never evicted while
//!   fewer than `7c / 8` distinct other keys have been decided since its
//!   last touch, whatever the hash does. Beyond that it depends on how many
//!   of those keys share its shard; the shard is chosen by a hash keyed with
//!   a secret random per store, so an attacker cannot aim a flood at the
//!   offender's shard, and `D` flood keys put about `D / N` keys in each
//!   shard.
//!
//! An active offender is one that keeps sending requests, and each of them,
//! refused or not, renews its place; a flood of distinct keys cannot reset its
//! count unless it outpaces it by 7/8 of a whole shard's capacity.
//!
//! # Conformance
//!
//! This crate runs the whole `ratewarden-conformance` suite with two lines in
//! `tests/conformance.rs`:
//!
//! ```
//! # use std::sync::Arc;
//! # use ratewarden_core::Store;
//! # use ratewarden_memory::MemoryStore;
//! async fn store() -> Arc<dyn Store> { Arc::new(MemoryStore::new(1_000)) }
//! ratewarden_conformance::conformance_tests!(store);
//! # fn main() {}
//! ```
//!
//! About 530 lines before its tests, 120 of them these docs, which
//! state the bounds and the eviction guarantee once: the store, its builder
//! and its `Store` impl are here, its shards and key digests in `shard.rs`.

// About 780 lines, 150 of them the crate docs and 140 its unit tests: the
// store, its builder and its `Store` impl; the shards are `shard`.

mod shard;

use std::fmt;
use std::num::NonZeroUsize;

use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard};
use ratewarden_core::algorithm;
use ratewarden_core::ban;
use ratewarden_core::{
    Algorithm, Ban, Capabilities, ConfigError, Decision, Key, Policy, Refund, Request, Store,
    StoreError, Timestamp,
};
use shard::{Digest, KeyHasher, Shard};

/// The name this store reports in decisions and errors.
pub const NAME: &str = "memory";

/// The key capacity of [`MemoryStore::default`] and of a builder that is
/// not given one.
pub const DEFAULT_CAPACITY: usize = ratewarden_core::DEFAULT_KEY_CAPACITY;

/// The most shards a store may have.
pub const MAX_SHARDS: usize = 1 << 16;

/// When choosing the shard count itself, the store keeps at least this many
/// keys per shard: many tiny shards would make the per-shard LRU guarantee
/// (see the crate docs) much weaker than a global one for little gain.
const MIN_DEFAULT_SHARD_KEYS: usize = 64;

/// A bounded, sharded, in-process [`Store`] implementing every algorithm.
///
/// See the [crate docs](crate) for its bounds and eviction guarantee.
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    capacity: usize,
    max_key_len: usize,
    /// Makes each key's digest, whose index half chooses the shard and the
    /// slot in it: a keyed pseudo-random function under a secret drawn per
    /// store, not a fixed hash, since with a predictable one an attacker
    /// could compute keys that all land in the offender's shard and evict
    /// it with a flood of one shard's capacity instead of the whole store's,
    /// pile keys into one probe sequence (HashDoS), or aim a key at another
    /// key's state. See [Keys](crate#keys).
    hasher: KeyHasher,
}

/// Builds a [`MemoryStore`]; see [`MemoryStore::builder`].
#[derive(Debug, Clone)]
pub struct MemoryStoreBuilder {
    capacity: usize,
    shards: Option<usize>,
    max_key_len: usize,
}

impl Default for MemoryStoreBuilder {
    fn default() -> Self {
        MemoryStoreBuilder {
            capacity: DEFAULT_CAPACITY,
            shards: None,
            max_key_len: ratewarden_core::DEFAULT_MAX_KEY_LEN,
        }
    }
}

impl MemoryStoreBuilder {
    /// The most keys the store holds at once (default [`DEFAULT_CAPACITY`]).
    /// Each (algorithm, key) pair counts as one key.
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// The longest key accepted, in bytes (default
    /// [`DEFAULT_MAX_KEY_LEN`](ratewarden_core::DEFAULT_MAX_KEY_LEN)); a longer
    /// one is an `InvalidRequest` error. The store holds a fixed-size digest
    /// of every key, so this bounds the hashing work a decision does, not
    /// the store's memory. Refused if zero.
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = bytes;
        self
    }

    /// The number of shards, each with its own lock, table and recency order. The
    /// default is the smallest power of two at least twice the available
    /// parallelism and at least 16, halved while a shard would hold fewer
    /// than 64 keys.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Builds the store, refusing a capacity of zero (a store that holds no
    /// key would forget every offender at once), a shard count of zero or
    /// above [`MAX_SHARDS`], and more shards than keys (a shard that holds no
    /// key could limit nobody).
    ///
    /// ```
    /// use ratewarden_memory::MemoryStore;
    ///
    /// let store = MemoryStore::builder().capacity(100_000).shards(16).build()?;
    /// assert_eq!(store.capacity(), 100_000);
    /// assert_eq!(store.shards(), 16);
    ///
    /// let err = MemoryStore::builder().capacity(0).build().unwrap_err();
    /// assert!(err.to_string().contains("capacity must be at least 1"));
    /// # Ok::<(), ratewarden_core::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<MemoryStore, ConfigError> {
        let capacity = self.capacity;
        if self.max_key_len == 0 {
            return Err(ConfigError::Invalid(
                "memory store max_key_len must be at least 1 byte".into(),
            ));
        }
        if capacity == 0 {
            return Err(ConfigError::Invalid(
                "memory store capacity must be at least 1 key".into(),
            ));
        }
        let shards = match self.shards {
            Some(0) => {
                return Err(ConfigError::Invalid(
                    "memory store needs at least 1 shard".into(),
                ));
            }
            Some(n) if n > MAX_SHARDS => {
                return Err(ConfigError::Invalid(format!(
                    "memory store shards must be at most {MAX_SHARDS}, got {n}"
                )));
            }
            Some(n) if n > capacity => {
                return Err(ConfigError::Invalid(format!(
                    "memory store has {n} shards but a capacity of only {capacity} keys; \
                     every shard must hold at least one key"
                )));
            }
            Some(n) => n,
            None => default_shards(capacity, std::thread::available_parallelism().ok()),
        };
        let hasher = KeyHasher::new().map_err(|e| {
            ConfigError::Invalid(format!(
                "memory store: no random source for its secret key: {e}"
            ))
        })?;
        let mut store = MemoryStore::with_shards(capacity, shards, hasher);
        store.max_key_len = self.max_key_len;
        Ok(store)
    }
}

/// The smallest power of two at least twice `parallelism` and at least 16,
/// halved while a shard would hold fewer than [`MIN_DEFAULT_SHARD_KEYS`].
fn default_shards(capacity: usize, parallelism: Option<NonZeroUsize>) -> usize {
    let parallelism = parallelism.map_or(1, NonZeroUsize::get);
    let mut shards = parallelism
        .saturating_mul(2)
        .checked_next_power_of_two()
        .unwrap_or(MAX_SHARDS)
        .clamp(16, MAX_SHARDS);
    while shards > 1 && capacity / shards < MIN_DEFAULT_SHARD_KEYS {
        shards /= 2;
    }
    shards
}

/// Per-shard capacities that differ by at most one and sum to `capacity`
/// exactly: the first `capacity % shards` shards take one key more.
fn shard_capacities(capacity: usize, shards: usize) -> impl Iterator<Item = usize> {
    let base = capacity / shards;
    let extra = capacity % shards;
    (0..shards).map(move |i| base + usize::from(i < extra))
}

impl MemoryStore {
    /// A store holding at most `capacity` keys, with the default shard count
    /// (see [`MemoryStoreBuilder::shards`]).
    ///
    /// A capacity of 0 is raised to 1 key, the strictest store there is;
    /// use [`builder`](Self::builder) to have it refused instead.
    ///
    /// ```
    /// use ratewarden_memory::MemoryStore;
    ///
    /// let store = MemoryStore::new(1_000);
    /// assert_eq!(store.capacity(), 1_000);
    /// assert!(store.is_empty());
    /// ```
    ///
    /// # Panics
    ///
    /// If the OS has no random source to draw the store's secret key from
    /// (see [Keys](crate#keys)); [`builder`](Self::builder) returns that
    /// as an error instead.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let hasher = KeyHasher::new().expect("the OS's random source, for the store's secret key");
        MemoryStore::with_shards(
            capacity,
            default_shards(capacity, std::thread::available_parallelism().ok()),
            hasher,
        )
    }

    /// A store of `capacity` keys over `shards` shards, both already checked:
    /// at least 1, and `shards <= capacity`.
    fn with_shards(capacity: usize, shards: usize, hasher: KeyHasher) -> Self {
        MemoryStore {
            shards: shard_capacities(capacity, shards)
                .map(|cap| Mutex::new(Shard::new(cap)))
                .collect(),
            capacity,
            max_key_len: ratewarden_core::DEFAULT_MAX_KEY_LEN,
            hasher,
        }
    }

    /// A builder, to choose the capacity and the number of shards.
    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder::default()
    }

    /// The most keys the store holds at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The number of keys held now. Locks each shard in turn, so it is meant
    /// for monitoring and tests, not the request path.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many keys have been evicted to stay within the capacity, since
    /// the store was built. Locks each shard in turn, as [`len`](Self::len)
    /// does: each shard counts its own evictions, so that threads flooding
    /// different shards share no counter.
    pub fn evictions(&self) -> u64 {
        self.shards.iter().map(|s| lock(s).evictions()).sum()
    }

    /// The same as [`Store::decide`], without the future: for synchronous
    /// callers, which it spares the boxed future of an `async_trait` call.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratewarden_core::{ErrorKind, Policy, Timestamp};
    /// use ratewarden_memory::MemoryStore;
    ///
    /// let store = MemoryStore::new(1_000);
    /// let policy = Policy::fixed_window(2, Duration::from_secs(1))?;
    /// let now = Timestamp::from_micros(1_000_000);
    /// assert!(store.decide_sync(b"k", &policy, 2, now).unwrap().allowed);
    /// assert!(!store.decide_sync(b"k", &policy, 1, now).unwrap().allowed);
    /// // A cost above the limit could never be admitted: an error, not a refusal.
    /// let err = store.decide_sync(b"k", &policy, 3, now).unwrap_err();
    /// assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    /// # Ok::<(), ratewarden_core::ConfigError>(())
    /// ```
    pub fn decide_sync(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        self.decided(Request::new(self, key, policy, cost, now)?, Ok)
    }

    /// Sets the store's series in whichever `metrics` recorder is
    /// installed, labelled `store="{label}"`: the gauges
    /// `ratewarden_memory_keys` and `ratewarden_memory_capacity`, and the
    /// counter `ratewarden_memory_evictions_total`. The store keeps these
    /// counts itself (reading them takes each shard's lock once), so call
    /// this when they are wanted: before rendering a scrape, or from a
    /// timer. With the `metrics` feature.
    ///
    /// ```
    /// let store = ratewarden_memory::MemoryStore::new(1_000);
    /// store.report_metrics("primary"); // no recorder installed: nothing kept
    /// ```
    #[cfg(feature = "metrics")]
    pub fn report_metrics(&self, label: &'static str) {
        metrics::gauge!("ratewarden_memory_keys", "store" => label).set(self.len() as f64);
        metrics::gauge!("ratewarden_memory_capacity", "store" => label).set(self.capacity() as f64);
        metrics::counter!("ratewarden_memory_evictions_total", "store" => label)
            .absolute(self.evictions());
    }

    /// The same as [`Store::refund`], without the future; `admitted` is
    /// the decision being undone.
    pub fn refund_sync(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
        admitted: &Decision,
    ) -> Result<(), StoreError> {
        let request = Request::new(self, key, policy, cost, now)?;
        self.refunded(Refund::new(request, admitted)?);
        Ok(())
    }

    /// The same as [`Store::peek`], without the future: the key is neither
    /// touched (its place in the eviction order stays) nor inserted.
    pub fn peek_sync(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<Decision, StoreError> {
        Ok(self.peeked(Request::new(self, key, policy, cost, now)?))
    }

    /// The same as [`Store::penalize`], without the future: the key is
    /// touched, and inserted if new, as by a decision.
    pub fn penalize_sync(
        &self,
        key: &[u8],
        policy: &Policy,
        cost: u32,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.penalized(Request::new(self, key, policy, cost, now)?);
        Ok(())
    }

    /// The same as [`Store::reset`], without the future.
    pub fn reset_sync(&self, key: &[u8], policy: &Policy) -> Result<(), StoreError> {
        self.forget(Key::new(self, key)?, policy);
        Ok(())
    }

    // What each operation does to checked arguments, which cannot fail: the
    // `_sync` methods and the `Store` methods both come here.

    /// The decision on `request`, as `answer` makes it into what the
    /// caller returns.
    // `answer` is the caller's wrapping (`Ok`, `Some(Ok)`): each road then
    // writes the caller's return value itself, the common one from
    // registers and the others by a call that returns that same type. With
    // the roads' verdicts (or decisions) meeting first, they met on the
    // stack, copied on the way out, and read back wider than written, a
    // store-forwarding stall (callgrind of the composition bench).
    #[inline(always)]
    fn decided<R>(&self, request: Request<'_>, answer: impl FnOnce(Decision) -> R) -> R {
        let policy = request.policy();
        let digest = self.digest(policy, request.key());
        let (cost, now) = (request.cost(), request.now().as_micros());
        if let Some(ban) = policy.ban() {
            return self.decided_banned(request, (digest, ban), answer);
        }
        let mut shard = lock(&self.shards[self.shard_index(digest)]);
        if let Some(verdict) = shard.decide_held(digest, policy, cost, now) {
            drop(shard);
            return answer(Decision::from_verdict(verdict, policy, NAME));
        }
        decided_in(shard, digest, policy, (cost, now), answer)
    }

    /// [`decided`](Self::decided) under a ban: the key's ban record beside
    /// its state, in the state's shard, under one lock. Out of line, so
    /// that a policy without a ban pays a test of it and little else.
    #[inline(never)]
    fn decided_banned<R>(
        &self,
        request: Request<'_>,
        (digest, ban): (Digest, &Ban),
        answer: impl FnOnce(Decision) -> R,
    ) -> R {
        let policy = request.policy();
        let ban_digest = self.ban_digest(policy, request.key());
        let verdict = lock(&self.shards[self.shard_index(digest)]).decide_banned(
            digest,
            ban_digest,
            (policy, ban),
            request.cost(),
            request.now().as_micros(),
        );
        answer(Decision::from_ban_verdict(verdict, policy, NAME))
    }

    fn refunded(&self, refund: Refund<'_>) {
        let request = refund.request();
        let policy = request.policy();
        let digest = self.digest(policy, request.key());
        let reset_after = refund.admitted().reset_after.as_micros();
        let reset_after = u64::try_from(reset_after).unwrap_or(u64::MAX);
        let mut shard = lock(&self.shards[self.shard_index(digest)]);
        // A key evicted since holds nothing to refund; a refund never
        // inserts, so it can neither evict nor be used to flood the map.
        if let Some(state) = shard.state_mut(digest) {
            let now = request.now().as_micros();
            algorithm::refund(state, policy, request.cost(), now, reset_after);
        }
    }

    fn peeked(&self, request: Request<'_>) -> Decision {
        let policy = request.policy();
        let digest = self.digest(policy, request.key());
        let now = request.now().as_micros();
        let shard = lock(&self.shards[self.shard_index(digest)]);
        if policy.ban().is_some() {
            let state = shard.ban_state(self.ban_digest(policy, request.key()));
            if let Some(refused) = ban::banned(&state, now) {
                return Decision::from_ban_verdict((refused, true), policy, NAME);
            }
        }
        let verdict = shard.peek(digest, policy, request.cost(), now);
        Decision::from_verdict(verdict, policy, NAME)
    }

    fn penalized(&self, request: Request<'_>) {
        let policy = request.policy();
        let digest = self.digest(policy, request.key());
        lock(&self.shards[self.shard_index(digest)]).penalize(
            digest,
            policy,
            request.cost(),
            request.now().as_micros(),
        );
    }

    fn forget(&self, key: Key<'_>, policy: &Policy) {
        let digest = self.digest(policy, key.as_bytes());
        let mut shard = lock(&self.shards[self.shard_index(digest)]);
        shard.remove(digest);
        // A ban is lifted with the state, whether or not the policy has one
        // now: a reset leaves the key as one never seen.
        shard.remove(self.ban_digest(policy, key.as_bytes()));
    }

    /// Where the store keeps the ban record of `key` under `policy`'s
    /// algorithm: in the shard of the key's state ([`Self::digest`]), so
    /// that a decision changes both under one lock.
    fn ban_digest(&self, policy: &Policy, key: &[u8]) -> Digest {
        self.hasher
            .digest(BAN_TAGS + algorithm_tag(policy.algorithm()), key)
    }

    /// What the store keeps of `key` under `policy`'s algorithm.
    #[inline]
    fn digest(&self, policy: &Policy, key: &[u8]) -> Digest {
        self.hasher.digest(algorithm_tag(policy.algorithm()), key)
    }

    /// Maps bits 20..52 of the index hash onto the shards by multiply-shift.
    /// The shard's table indexes by the low bits and tags slots with the top
    /// 7, so taking the shard from those would cluster every shard's keys.
    fn shard_index(&self, digest: Digest) -> usize {
        let bits = (digest.index >> 20) & 0xFFFF_FFFF;
        // Shard counts are at most MAX_SHARDS, so the product fits in u64 and
        // the result is below the shard count.
        ((bits * self.shards.len() as u64) >> 32) as usize
    }
}

impl Default for MemoryStore {
    /// A store of [`DEFAULT_CAPACITY`] keys with the default shard count.
    fn default() -> Self {
        MemoryStore::new(DEFAULT_CAPACITY)
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("capacity", &self.capacity)
            .field("shards", &self.shards.len())
            .field("evictions", &self.evictions())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(&Algorithm::ALL)
            .with_key_capacity(self.capacity)
            .with_bans()
    }

    fn max_key_len(&self) -> usize {
        self.max_key_len
    }

    fn decide_inline(&self, request: Request<'_>) -> Option<Result<Decision, StoreError>> {
        self.decided(request, |d| Some(Ok(d)))
    }

    fn refund_inline(&self, refund: Refund<'_>) -> Option<Result<(), StoreError>> {
        self.refunded(refund);
        Some(Ok(()))
    }

    // Entirely synchronous: the shard lock is taken and released inside,
    // never held across an await point.

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.decided(request, Ok)
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.refunded(refund);
        Ok(())
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        Ok(self.peeked(request))
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.forget(key, policy);
        Ok(())
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.penalized(request);
        Ok(())
    }
}

/// [`MemoryStore::decided`] off the common road (`Shard::decide_held`): a
/// new key, a key due to move in the eviction order, another algorithm.
#[inline(never)]
fn decided_in<R>(
    mut shard: MutexGuard<'_, Shard>,
    digest: Digest,
    policy: &Policy,
    (cost, now): (u32, u64),
    answer: impl FnOnce(Decision) -> R,
) -> R {
    let verdict = shard.decide(digest, policy, cost, now);
    drop(shard);
    answer(Decision::from_verdict(verdict, policy, NAME))
}

/// A shard's lock. `parking_lot`'s, not the standard library's: with two
/// threads deciding one hot key (an attacker's, say), the standard mutex's
/// waiter spins reading the lock's line, so the holder's unlock must take
/// the line back, which roughly doubled the CPU per decision in the
/// hot-key bench. Uncontended, the two cost the same.
///
/// It does not poison: a panic while the lock is held can only come from
/// inside `algorithm::apply` on one key's state; the shard's table and move
/// queue are only changed by hashbrown and `VecDeque` calls that do not
/// panic (allocation failure aborts), so the table is still consistent and
/// every other key must keep being limited, which an unpoisoned lock does.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock()
}

/// The first of the secrets that digest ban records, one per algorithm.
const BAN_TAGS: usize = 4;

/// Which of the store's secrets digests a key under `algorithm`, so that
/// the same key under two algorithms holds two independent states (see
/// [`Store::decide`]). Below [`shard::TAGS`].
const fn algorithm_tag(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::SlidingLog => 0,
        Algorithm::FixedWindow => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::Gcra => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratewarden_core::ErrorKind;
    use std::time::Duration;

    const T0: Timestamp = ratewarden_core::ManualClock::DEFAULT_START;

    #[test]
    fn shard_capacities_sum_to_capacity_exactly() {
        for capacity in [1, 2, 7, 15, 16, 17, 1_000, 100_001] {
            for shards in [1, 2, 3, 7, 16].into_iter().filter(|&s| s <= capacity) {
                let caps: Vec<usize> = shard_capacities(capacity, shards).collect();
                assert_eq!(caps.len(), shards);
                assert_eq!(caps.iter().sum::<usize>(), capacity, "{capacity}/{shards}");
                let (min, max) = (caps.iter().min().unwrap(), caps.iter().max().unwrap());
                assert!(max - min <= 1, "{capacity}/{shards}: {caps:?}");
                assert_eq!(*max, capacity.div_ceil(shards));
            }
        }
    }

    #[test]
    fn default_shards_follow_parallelism_and_capacity() {
        let par = NonZeroUsize::new;
        assert_eq!(default_shards(100_000, par(2)), 16);
        assert_eq!(default_shards(100_000, par(12)), 32);
        assert_eq!(default_shards(100_000, None), 16);
        // 1_000 keys: 16 shards would hold 62 each, so 8 shards of 125.
        assert_eq!(default_shards(1_000, par(2)), 8);
        assert_eq!(default_shards(1, par(64)), 1);
        assert_eq!(default_shards(usize::MAX, par(usize::MAX)), MAX_SHARDS);
    }

    #[test]
    fn bad_configuration_is_refused() {
        let err = |b: MemoryStoreBuilder| b.build().unwrap_err().to_string();
        assert!(err(MemoryStore::builder().capacity(0)).contains("capacity must be at least 1"));
        assert!(err(MemoryStore::builder().shards(0)).contains("at least 1 shard"));
        assert!(err(MemoryStore::builder().max_key_len(0)).contains("max_key_len"));
        let small = MemoryStore::builder().max_key_len(8).build().unwrap();
        assert_eq!(Store::max_key_len(&small), 8);
        assert!(err(MemoryStore::builder().shards(MAX_SHARDS + 1)).contains("at most"));
        assert!(
            err(MemoryStore::builder().capacity(4).shards(5)).contains("at least one key"),
            "more shards than keys"
        );
        assert_eq!(MemoryStore::new(0).capacity(), 1);
        let store = MemoryStore::builder()
            .capacity(5)
            .shards(5)
            .build()
            .unwrap();
        assert_eq!((store.capacity(), store.shards()), (5, 5));
    }

    #[test]
    fn capabilities_declare_everything() {
        let store = MemoryStore::new(1_234);
        assert_eq!(
            store.capabilities(),
            Capabilities::new(&Algorithm::ALL)
                .with_key_capacity(1_234)
                .with_bans()
        );
        assert_eq!(store.name(), "memory");
        assert_eq!(MemoryStore::default().capacity(), DEFAULT_CAPACITY);
        for algorithm in Algorithm::ALL {
            let policy = Policy::new(algorithm, 1, Duration::from_secs(1)).unwrap();
            assert!(store.check_policy(&policy).is_ok());
        }
    }

    #[test]
    fn invalid_cost_is_an_error_and_records_nothing() {
        let store = MemoryStore::new(10);
        let policy = Policy::gcra(3, Duration::from_secs(3)).unwrap();
        for cost in [0, 4, u32::MAX] {
            let err = store.decide_sync(b"k", &policy, cost, T0).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidRequest, "cost {cost}");
            assert_eq!(err.store(), "memory");
        }
        assert!(store.is_empty());
    }

    #[test]
    fn algorithms_on_one_key_do_not_collide() {
        let store = MemoryStore::builder()
            .capacity(8)
            .shards(1)
            .build()
            .unwrap();
        let window = Duration::from_secs(60);
        for algorithm in Algorithm::ALL {
            let policy = Policy::new(algorithm, 2, window).unwrap();
            let first = store.decide_sync(b"same", &policy, 2, T0).unwrap();
            assert!(
                first.allowed,
                "{algorithm}: another algorithm's state leaked"
            );
            assert!(!store.decide_sync(b"same", &policy, 1, T0).unwrap().allowed);
        }
        assert_eq!(store.len(), 4);
        // The empty key and a one-byte key are distinct keys too.
        let policy = Policy::fixed_window(1, window).unwrap();
        assert!(store.decide_sync(b"", &policy, 1, T0).unwrap().allowed);
        assert!(store.decide_sync(&[1], &policy, 1, T0).unwrap().allowed);
        assert!(!store.decide_sync(b"", &policy, 1, T0).unwrap().allowed);
    }

    #[test]
    fn a_panic_under_a_shard_lock_leaves_the_shard_limiting() {
        let store = MemoryStore::builder()
            .capacity(10)
            .shards(1)
            .build()
            .unwrap();
        let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
        assert!(
            store
                .decide_sync(b"offender", &policy, 1, T0)
                .unwrap()
                .allowed
        );
        std::thread::scope(|scope| {
            let poisoner = scope.spawn(|| {
                let _guard = store.shards[0].lock();
                panic!("deliberate panic while holding the shard lock");
            });
            assert!(poisoner.join().is_err());
        });
        // Unwinding released the lock; nothing else was changed.
        assert!(!store.shards[0].is_locked());
        // Same state as before the panic: still refused, others still admitted.
        assert!(
            !store
                .decide_sync(b"offender", &policy, 1, T0)
                .unwrap()
                .allowed
        );
        assert!(store.decide_sync(b"other", &policy, 1, T0).unwrap().allowed);
        assert_eq!(store.len(), 2);
    }
}
