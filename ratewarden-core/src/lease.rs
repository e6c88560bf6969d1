//! Leased quotas: one round trip to a shared store buys a batch of units
//! that an instance then admits locally, so a fleet's shared store sees a
//! fraction of its admitted requests, and the fleet still never admits more
//! than the limit.
//!
//! A [`LeasedStore`] wraps the shared store. When a key has no units in
//! hand it asks the shared store to admit a batch of `k` units at once (one
//! [`decide`](Store::decide) of cost `k`): the shared store counts them as
//! consumed, so the whole fleet's leases plus its direct admissions never
//! exceed the limit. The instance then admits from its batch without a round
//! trip until the batch is spent or the window it was counted in ends.
//!
//! # Where it is sound
//!
//! A leased unit is counted by the shared store when it is leased and spent
//! later; that is exact only if both happen in the same window of the
//! algorithm's own accounting. So a lease lives until the end of the window
//! that counted it:
//!
//! * **fixed window** — until the counting window ends (`now + reset_after`
//!   of the grant): every admission from the lease falls in the window that
//!   counted it. Sound.
//! * **sliding window** — until the end of the epoch-aligned window whose
//!   `current` counter holds the units. Sound.
//! * **sliding log** and **GCRA** are refused at construction: they count
//!   each unit at the instant it was admitted, so a unit leased at `t` and
//!   spent at `t' > t` would let the store free it a window (or an emission
//!   interval) too early, admitting more than the limit in the window that
//!   ends at `t' + W`.
//!
//! # The price: stranded units
//!
//! Units leased by an instance that does not spend them before the window
//! ends are lost for that window. Per key and window, an instance holds at
//! most `max_units − 1` unspent units (it leases only when its batch cannot
//! pay for a request; for requests of cost up to `max_units`), so a fleet of
//! `N` strands at most `N × (max_units − 1)`. A window's first batch is half
//! of what the instance spent in its previous window (one unit for a new
//! key) and batches double while the instance keeps spending them, up to
//! `max_units` and never above half of the units the shared store said were
//! left (or half of `max_units`, when fewer are left): an idle instance
//! holds little, a busy one makes few round trips, and the last units of a
//! window are spread rather than hoarded.
//! [`LeasedStore::release`] hands every unspent unit back (one
//! [`refund`](Store::refund) per lease): call it at shutdown.
//!
//! A request refused after its unit was spent (by a later rule of a
//! [`Limiter`](crate::Limiter)) gives the unit back to the lease, locally.
//!
//! # Over-demand
//!
//! A limiter matters most when a key is asked for past its limit, and then
//! the refused part of the traffic must not cost the round trips a lease
//! saves. When the shared store refuses a batch:
//!
//! * if its reply shows the request itself cannot fit, the refusal stands
//!   without a second call. On a fixed window that refusal is exactly the
//!   request's (any cost waits for the window to end);
//! * the refusal is **held**: repeated without a round trip, and told to
//!   the caller, until its retry time. A fixed window's hold is the store's
//!   own retry time. A sliding window frees its units a few at a time, so
//!   its retry times are short and a fleet would ask once per unit freed:
//!   there the hold is the time the refused *batch* takes to come free,
//!   doubled for each further refusal while the key stays asked for past
//!   its limit and halved by each grant (never past the window's end), so
//!   that a fleet contending for the units freed settles on asking about
//!   as often as it is granted; and while the key stays asked for past its
//!   limit it is bought in full batches (`max_units`, at most half the
//!   limit), never shrunk to a trickle, nor topped up by a second call for
//!   the few units left;
//! * a caller that waits the retry time it was told is asked for the batch
//!   that was refused, which by then has come free unless other instances
//!   took it;
//! * a give-back or reset of the key through any limiter of this process
//!   (and, on a shared store that hears other instances, a reset anywhere)
//!   ends the hold at once, as it lifts a rule's cached refusal: the shared
//!   store may admit again.
//!
//! Holding is the strict side: a sliding window's key may be refused
//! for longer than the shared store alone would say (its exact retry time
//! is for one unit), never admitted more. What it costs the fleet is the
//! units left unclaimed in the shared store while every instance waits for
//! a whole batch: at most `max_units − 1` per key and window, besides the
//! stranded units above. [`LeaseConfig::exact_refusals`] turns holding off,
//! for the shared store's exact refusals at a round trip per refused
//! request. Fleets of 2 to 32 instances on one key whose limit is at
//! least `8 × N × max_units`, asked for two, five and ten times it, make at
//! most 0.10 shared-store calls per admission and never exceed the limit:
//! on the wire to a real Redis (the `ratewarden` crate's `fleet_bound`
//! test, fleets of 2, 8 and 32), in the fleet simulator (`cargo bench -p
//! ratewarden --bench fleet -- over`: 0.038 on a fixed window, 0.057–0.087
//! on a sliding one) and in `tests/lease.rs`.
//!
//! One batch per key is asked for at a time. Concurrent requests that find
//! the batch empty wait for the one in flight and are paid from it, rather
//! than each buying a batch of its own: the shared store sees one round trip
//! where it would have seen one per caller, and what a decision reports as
//! remaining (the shared store's last answer plus the units in hand) is
//! exact, because grants are recorded in the order the shared store made
//! them.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use ratewarden_core::lease::{LeaseConfig, LeasedStore};
//! use ratewarden_core::{Policy, Request, Store, Timestamp};
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! # let shared: Arc<dyn Store> = Arc::new(ratewarden_memory::MemoryStore::default());
//! # /*
//! let shared: Arc<dyn Store> = Arc::new(redis_or_postgres); // shared by a fleet
//! # */
//! let leased = LeasedStore::new(shared, LeaseConfig::new(16)?);
//! let policy = Policy::fixed_window(1_000, Duration::from_secs(60))?;
//! leased.check_policy(&policy)?;
//! let now = Timestamp::from_micros(1_767_225_600_000_000);
//! let request = Request::new(&leased, b"client:42", &policy, 1, now)?;
//! for _ in 0..100 {
//!     assert!(leased.decide(request).await?.allowed);
//! }
//! // Batches of 1, 2, 4, 8, 16, then 16 at a time: 10 round trips for 100.
//! assert_eq!(leased.stats().round_trips, 10);
//! # Ok::<(), Box<dyn std::error::Error>>(()) }).unwrap();
//! ```
//!
//! About 900 lines in one file, 120 of them these docs: the lease, its
//! bookkeeping per key and the `Store` impl share one lock and one set of
//! invariants, which read best side by side.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;

use crate::algorithm::Algorithm;
use crate::counter::{bump, load};
use crate::decision::Decision;
use crate::error::{ConfigError, StoreError};
use crate::invalidation::{Invalidations, Ticket};
use crate::policy::Policy;
use crate::store::{Capabilities, Key, Refund, Request, Store};
use crate::time::Timestamp;

/// The algorithms a lease is sound for; see the [module docs](self).
pub const LEASE_ALGORITHMS: [Algorithm; 2] = [Algorithm::FixedWindow, Algorithm::SlidingWindow];

/// How large a [`LeasedStore`]'s batches grow, and whether a key asked
/// for past its limit is held ([the module docs](self#over-demand)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    max_units: u32,
    exact: bool,
}

impl LeaseConfig {
    /// Batches of at most `max_units` units. One unit is a lease per
    /// request: a round trip each, no units stranded. Refuses zero.
    pub fn new(max_units: u32) -> Result<Self, ConfigError> {
        if max_units == 0 {
            return Err(ConfigError::Invalid(
                "a lease needs at least one unit".into(),
            ));
        }
        Ok(LeaseConfig {
            max_units,
            exact: false,
        })
    }

    /// Refuses each request exactly as the shared store alone would, at the
    /// price of the round trips a key asked for past its limit costs: no
    /// refusal is held, and a sliding window's refused batch is followed by
    /// a call for the request alone, for its exact retry time. See
    /// [over-demand](self#over-demand) for what the default does instead.
    pub fn exact_refusals(mut self) -> Self {
        self.exact = true;
        self
    }

    /// The largest batch.
    pub fn max_units(&self) -> u32 {
        self.max_units
    }

    /// Whether refusals are exact ([`exact_refusals`](Self::exact_refusals)).
    pub fn is_exact(&self) -> bool {
        self.exact
    }
}

/// What a [`LeasedStore`] has done, since it was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeaseStats {
    /// Calls to the shared store (`decide` and `refund`).
    pub round_trips: u64,
    /// Batches the shared store granted.
    pub batches: u64,
    /// Units the shared store granted in batches.
    pub leased: u64,
    /// Requests admitted from a batch in hand, without a round trip.
    pub local: u64,
    /// Requests refused without a round trip, repeating the shared store's
    /// standing refusal of the key.
    pub held: u64,
    /// Units spent on admitted requests (from a batch or from the grant
    /// that started it), less those given back by refunds. Units leased
    /// and neither spent nor released were stranded, or are still in hand.
    pub spent: u64,
    /// Units handed back to the shared store by [`LeasedStore::release`].
    pub released: u64,
}

/// What a lease and its refill gate are kept by.
type LeaseKey = (Algorithm, Vec<u8>);

/// One key's batch.
#[derive(Debug, Clone, Copy)]
struct Lease {
    policy: Policy,
    /// Taken before the call that bought the batch (or made the refusal
    /// held): a reset of the key since then, on any instance the shared
    /// store tells of, makes the lease stale ([`LeasedStore::fresh`]).
    ticket: Ticket,
    /// Units in hand.
    units: u32,
    /// The last batch's size, which the next one in the same window doubles.
    size: u32,
    /// Units spent in the lease's window so far: the instance's recent rate,
    /// from which the next window's first batch is sized.
    spent: u32,
    /// What the shared store said was left after the last grant.
    shared_remaining: u32,
    /// When the last batch was granted, and the grant's `reset_after`: they
    /// locate the units in the shared store's state for a refund.
    granted_at: u64,
    reset_after: u64,
    /// The end of the window that counted the units: none is spent after.
    until: u64,
    /// The shared store's last refusal for the key, answered locally while
    /// it stands: see [`Hold`].
    hold: Hold,
}

/// A refusal of the shared store, repeated without a round trip while it
/// stands: see [over-demand](self#over-demand).
#[derive(Debug, Clone, Copy, Default)]
struct Hold {
    /// Until when requests of at least `cost` units are refused.
    until: u64,
    /// Taken before the refused batch was asked for: a give-back or reset
    /// of the key in this process since then (or, for a shared store that
    /// hears other instances, a reset anywhere) ends the hold, since the
    /// shared store may admit again ([`LeasedStore::entry`]).
    ticket: Ticket,
    /// The cost of the request that was refused: a cheaper one may fit.
    cost: u32,
    /// Refusals so far while the key is asked for past its limit, less
    /// half at each grant: each doubles a sliding window's hold. A fixed
    /// window's count starts again in each window (`window_end`).
    streak: u32,
    window_end: u64,
    /// The key is asked for past its limit: batches are not shrunk to what
    /// the shared store said was left, which would buy the units a sliding
    /// window frees one call at a time, and a refused batch is not followed
    /// by a call for less.
    hot: bool,
    /// The batch whose refusal is held: asked for again when the hold ends
    /// (the retry time the refusal gave is that batch's), a full one after
    /// a grant.
    size: u32,
    /// What the refusal said: units left, and when the key's counted units
    /// expire (absolute).
    remaining: u32,
    reset_at: u64,
}

impl Hold {
    /// Whether the key is still asked for past its limit at `now`: until a
    /// grant leaves a whole batch in the shared store
    /// ([`LeasedStore::granted`]), and at most until the end of the window
    /// of its last refusal (a fixed window's next window frees the whole
    /// limit) or, on a sliding window, which frees its units gradually, of
    /// the window after it.
    fn hot_at(&self, policy: &Policy, now: u64) -> bool {
        let more = match policy.algorithm() {
            Algorithm::SlidingWindow => policy.window_micros(),
            _ => 0,
        };
        self.hot && now < self.window_end.saturating_add(more)
    }
}

/// What a batch is asked for under, taken before the call.
#[derive(Debug, Clone, Copy)]
struct Tickets {
    /// For the units it buys: stale after a reset of the key (the shared
    /// store forgot them with it), not after a give-back (which takes none
    /// from a lease).
    units: Ticket,
    /// For the refusal it may get, held ([`Hold`]): stale after a give-back
    /// too, which may leave the shared store admitting again.
    refusal: Ticket,
}

impl Lease {
    /// A lease of `policy` with nothing to spend, the shared store having
    /// `shared_remaining` units left at `now`.
    fn empty(policy: Policy, shared_remaining: u32, now: u64, ticket: Ticket) -> Self {
        Lease {
            policy,
            ticket,
            units: 0,
            size: 0,
            spent: 0,
            shared_remaining,
            granted_at: now,
            reset_after: 0,
            until: now,
            hold: Hold::default(),
        }
    }

    fn live(&self, policy: &Policy, now: u64) -> bool {
        self.policy == *policy && self.granted_at <= now && now < self.until
    }

    /// The standing refusal for a request of `cost` at `now`, if any.
    fn held(&self, policy: &Policy, cost: u32, now: u64, store: &'static str) -> Option<Decision> {
        let h = &self.hold;
        // A sliding window's hold is the time `h.size` units take to come
        // free: a dearer request is asked for, not told that time.
        let dearer = policy.algorithm() == Algorithm::SlidingWindow && cost > h.size;
        if self.policy != *policy || now >= h.until || cost < h.cost || dearer {
            return None;
        }
        Some(Decision::new(
            false,
            policy,
            h.remaining,
            Duration::from_micros(h.reset_at.saturating_sub(now)),
            Duration::from_micros(h.until - now),
            store,
        ))
    }

    /// The decision for a request paid from the batch: what the fleet has
    /// left as far as this instance knows, and the grant's `reset_after`, so
    /// that a refund of it locates the same window.
    fn admitted(&self, now: u64, store: &'static str) -> Decision {
        Decision::new(
            true,
            &self.policy,
            self.shared_remaining.saturating_add(self.units),
            Duration::from_micros((self.granted_at + self.reset_after).saturating_sub(now)),
            Duration::ZERO,
            store,
        )
    }
}

/// A shared store whose admissions are bought in batches; see the
/// [module docs](self).
pub struct LeasedStore {
    shared: Arc<dyn Store>,
    /// The shared store's notices of resets made elsewhere, or, for a store
    /// that hears no other instance, the process's table: either way the
    /// table the rules in front of this store tell of their give-backs and
    /// resets (`Rule::new` picks it the same way).
    notices: Arc<Invalidations>,
    config: LeaseConfig,
    /// Per (algorithm, key). Bounded by the keys that have a live lease: an
    /// expired lease is replaced by the key's next one and dropped by
    /// [`LeasedStore::release`]; see `MAX_LEASES`.
    leases: Mutex<HashMap<(Algorithm, Vec<u8>), Lease>>,
    /// Per (algorithm, key) with a batch in flight: the gate its other
    /// callers wait at. An entry lives while someone holds or waits for it,
    /// so the map is bounded by the requests in flight.
    refills: Mutex<HashMap<LeaseKey, Arc<tokio::sync::Mutex<()>>>>,
    round_trips: AtomicU64,
    batches: AtomicU64,
    leased: AtomicU64,
    local: AtomicU64,
    held: AtomicU64,
    spent: AtomicU64,
    released: AtomicU64,
}

/// The most leases held at once. A new key beyond it drops the spent and
/// expired leases first, and if that makes no room, is served without a
/// batch (one round trip per request, like the shared store alone): a flood
/// of distinct keys can cost round trips, never memory.
const MAX_LEASES: usize = 100_000;

impl fmt::Debug for LeasedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedStore")
            .field("shared", &self.shared.name())
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl LeasedStore {
    /// Leases from `shared`, in batches configured by `config`.
    pub fn new(shared: Arc<dyn Store>, config: LeaseConfig) -> Self {
        LeasedStore {
            notices: shared
                .invalidations()
                .unwrap_or_else(Invalidations::process),
            shared,
            config,
            leases: Mutex::default(),
            refills: Mutex::default(),
            round_trips: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            leased: AtomicU64::new(0),
            local: AtomicU64::new(0),
            held: AtomicU64::new(0),
            spent: AtomicU64::new(0),
            released: AtomicU64::new(0),
        }
    }

    /// What the store has done so far.
    pub fn stats(&self) -> LeaseStats {
        LeaseStats {
            round_trips: load(&self.round_trips),
            batches: load(&self.batches),
            leased: load(&self.leased),
            local: load(&self.local),
            held: load(&self.held),
            spent: load(&self.spent),
            released: load(&self.released),
        }
    }

    /// Units in hand for `key` under `policy` at `now`: leased, unspent, and
    /// still spendable.
    pub fn units_in_hand(&self, key: &[u8], policy: &Policy, now: Timestamp) -> u32 {
        let mut leases = self.lock();
        self.entry(&mut leases, &(policy.algorithm(), key.to_vec()))
            .filter(|l| l.live(policy, now.as_micros()))
            .map_or(0, |l| l.units)
    }

    /// Hands every unspent unit of a live lease back to the shared store
    /// (one refund per lease) and forgets every lease. Returns the units
    /// handed back; a refund that fails leaves its units stranded until the
    /// window ends, which is the strict side.
    pub async fn release(&self, now: Timestamp) -> u64 {
        let leases: Vec<((Algorithm, Vec<u8>), Lease)> = self.lock().drain().collect();
        let mut released = 0;
        for ((_, key), lease) in leases {
            if lease.units == 0
                || !lease.live(&lease.policy, now.as_micros())
                || !self.fresh(&lease)
            {
                continue;
            }
            // The grant as the shared store answered it: what locates the
            // units in its state.
            let grant = lease.admitted(lease.granted_at, self.shared.name());
            bump(&self.round_trips);
            let at = Timestamp::from_micros(lease.granted_at);
            let request = Request::new(&*self.shared, &key, &lease.policy, lease.units, at);
            let refunded = match request.and_then(|r| Refund::new(r, &grant)) {
                Ok(refund) => self.shared.refund(refund).await,
                Err(e) => Err(e),
            };
            if refunded.is_ok() {
                released += u64::from(lease.units);
            }
        }
        self.released.fetch_add(released, Ordering::Relaxed);
        released
    }

    /// The tickets of a batch of `key` asked for from now on.
    fn tickets(&self, key: &[u8]) -> Tickets {
        Tickets {
            units: self.notices.lease_ticket(key),
            refusal: self.notices.ticket(key),
        }
    }

    /// Whether no reset of the lease's key has been heard since it was
    /// bought, and resets are being heard: units bought before a reset
    /// were forgotten by the shared store with it, and spent after it
    /// would admit more than the limit.
    fn fresh(&self, lease: &Lease) -> bool {
        self.notices.lease_current(lease.ticket)
    }

    /// The key's lease in `leases`, dropped first if a reset made it
    /// stale, its hold ended first if a give-back or reset did: a refusal
    /// the shared store made before either may no longer be its answer,
    /// as a rule's refusal cache knows of its own copies.
    fn entry<'l>(
        &self,
        leases: &'l mut HashMap<(Algorithm, Vec<u8>), Lease>,
        map_key: &(Algorithm, Vec<u8>),
    ) -> Option<&'l mut Lease> {
        if leases.get(map_key).is_some_and(|l| !self.fresh(l)) {
            leases.remove(map_key);
        }
        let lease = leases.get_mut(map_key)?;
        if lease.hold.until != 0 && !self.notices.current(lease.hold.ticket) {
            lease.hold.until = 0;
        }
        Some(lease)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(Algorithm, Vec<u8>), Lease>> {
        // Plain integers per key: whole after any panic.
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key's refill gate, shared with every caller refilling it now.
    fn refill_gate(&self, key: &[u8], policy: &Policy) -> Refill<'_> {
        let map_key = (policy.algorithm(), key.to_vec());
        let gate = Arc::clone(
            self.refills
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(map_key.clone())
                .or_default(),
        );
        Refill {
            store: self,
            map_key,
            gate,
        }
    }

    /// Refuses a policy this store cannot lease (one its shared store does
    /// not apply, or any on a store deciding on its server's clock): the
    /// arguments are checked, but not against what a lease needs.
    fn check(&self, policy: &Policy) -> Result<(), StoreError> {
        self.check_policy(policy)
            .map_err(|e| StoreError::invalid_request(self.shared.name(), e))
    }

    /// Pays `cost` from the key's batch if it holds enough, or repeats the
    /// shared store's standing refusal ([`Hold`]).
    fn spend(&self, key: &[u8], policy: &Policy, cost: u32, now: u64) -> Option<Decision> {
        let mut leases = self.lock();
        let lease = self.entry(&mut leases, &(policy.algorithm(), key.to_vec()))?;
        if !lease.live(policy, now) || lease.units < cost {
            let refusal = lease.held(policy, cost, now, self.shared.name())?;
            bump(&self.held);
            return Some(refusal);
        }
        lease.units -= cost;
        lease.spent = lease.spent.saturating_add(cost);
        bump(&self.local);
        self.spent.fetch_add(u64::from(cost), Ordering::Relaxed);
        Some(lease.admitted(now, self.shared.name()))
    }

    /// The next batch for a request of `cost`: at a window's first lease,
    /// half of what the instance spent in its last window (one unit for a
    /// key it has not seen), then doubling while it keeps spending; capped
    /// by `max_units` and by half of what the shared store last said was
    /// left (or half of `max_units`, when less is left), and never below the
    /// cost. A key asked for past its limit ([`Hold::hot`]) is bought in
    /// [`full_batch`](Self::full_batch)es: the held one when its hold ends,
    /// the request alone while a hold it is not covered by stands.
    fn next_size(&self, key: &[u8], policy: &Policy, cost: u32, now: u64) -> u32 {
        let mut leases = self.lock();
        let map_key = (policy.algorithm(), key.to_vec());
        if leases.len() >= MAX_LEASES && !leases.contains_key(&map_key) {
            leases.retain(|_, l| (now < l.until && l.units > 0) || now < l.hold.until);
            if leases.len() >= MAX_LEASES {
                // No room to keep a batch: lease exactly the request, so
                // nothing is stranded.
                return cost;
            }
        }
        let size = match self.entry(&mut leases, &map_key) {
            Some(l) if l.policy == *policy && now < l.hold.until => cost,
            // The batch the client was told it could have when its hold
            // ended, else a full one.
            Some(l) if l.policy == *policy && l.hold.hot_at(policy, now) && l.hold.until != 0 => {
                l.hold.size
            }
            Some(l) if l.policy == *policy && l.hold.hot_at(policy, now) => self.full_batch(policy),
            Some(l) if l.live(policy, now) => l
                .size
                .saturating_mul(2)
                .min(self.config.max_units)
                .min((l.shared_remaining / 2).max(self.config.max_units / 2)),
            Some(l) if l.policy == *policy => (l.spent / 2).clamp(1, self.config.max_units),
            _ => 1,
        };
        // Never more than the limit: such a batch could never be granted.
        size.min(policy.limit()).max(cost)
    }

    /// Records a grant of `size` units of which `cost` are spent now, in
    /// the store's counters and in the key's lease.
    // The call's arguments and what it was bought under, side by side.
    #[allow(clippy::too_many_arguments)]
    fn granted(
        &self,
        key: &[u8],
        policy: &Policy,
        size: u32,
        cost: u32,
        now: u64,
        grant: &Decision,
        ticket: Ticket,
    ) {
        bump(&self.batches);
        self.leased.fetch_add(u64::from(size), Ordering::Relaxed);
        self.spent.fetch_add(u64::from(cost), Ordering::Relaxed);
        let reset_after = u64::try_from(grant.reset_after.as_micros()).unwrap_or(u64::MAX);
        let w = policy.window_micros();
        let until = match policy.algorithm() {
            Algorithm::SlidingWindow => (now - now % w).saturating_add(w),
            _ => now.saturating_add(reset_after),
        };
        let mut leases = self.lock();
        let map_key = (policy.algorithm(), key.to_vec());
        // Units still in hand from an earlier batch of the same window stay
        // spendable; they were counted in the window this one ends with.
        let previous = self
            .entry(&mut leases, &map_key)
            .map(|l| *l)
            .filter(|l| l.policy == *policy);
        let (carried, spent) = previous
            .filter(|l| l.live(policy, now) && l.until == until)
            .map_or((0, 0), |l| (l.units, l.spent));
        // A key asked for past its limit stays so, across windows and with
        // its streak of refusals, until a grant leaves a whole
        // batch in the shared store: the demand is below the limit again.
        // The refusal itself no longer stands.
        let hot = previous.is_some_and(|l| l.hold.hot_at(policy, now))
            && grant.remaining < self.full_batch(policy);
        let hold = Hold {
            hot,
            ..previous.filter(|_| hot).map_or(Hold::default(), |l| Hold {
                until: 0,
                // A grant means the holds were long enough to find units:
                // shorter next time, not back to the shortest.
                streak: l.hold.streak / 2,
                ..l.hold
            })
        };
        if leases.len() >= MAX_LEASES && !leases.contains_key(&map_key) {
            // Filled by other keys since `next_size`: the batch beyond this
            // request is stranded, at most `max_units − 1` as always.
            return;
        }
        leases.insert(
            map_key,
            Lease {
                policy: *policy,
                ticket,
                units: size - cost + carried,
                size,
                spent: spent.saturating_add(cost),
                shared_remaining: grant.remaining,
                granted_at: now,
                reset_after,
                until,
                hold,
            },
        );
    }

    /// Holds the shared store's `refusal` of a request of `cost` ([`Hold`]),
    /// and returns it as this instance will repeat it: refused until the
    /// hold ends.
    // The call's arguments and what it was bought under, side by side.
    #[allow(clippy::too_many_arguments)]
    fn refused(
        &self,
        key: &[u8],
        policy: &Policy,
        size: u32,
        cost: u32,
        now: u64,
        refusal: Decision,
        tickets: Tickets,
    ) -> Decision {
        let retry = u64::try_from(refusal.retry_after.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut leases = self.lock();
        let map_key = (policy.algorithm(), key.to_vec());
        if leases.len() >= MAX_LEASES && !leases.contains_key(&map_key) {
            // No room: the next request asks the shared store again.
            return refusal;
        }
        if self.entry(&mut leases, &map_key).is_none() {
            leases.insert(
                map_key.clone(),
                Lease::empty(*policy, refusal.remaining, now, tickets.units),
            );
        }
        let lease = leases
            .get_mut(&map_key)
            .expect("inserted above if it was missing");
        if lease.policy != *policy {
            if now < lease.until && lease.units > 0 {
                // Units of another policy in hand: kept, not held over.
                return refusal;
            }
            *lease = Lease::empty(*policy, refusal.remaining, now, tickets.units);
        }
        if now < lease.hold.until {
            // A cheaper request than the held one, refused too: the hold the
            // dearer one was told stands as it was.
            return refusal;
        }
        let window_end = match policy.algorithm() {
            Algorithm::SlidingWindow => {
                let w = policy.window_micros();
                (now - now % w).saturating_add(w)
            }
            // A fixed window opens at its first request, and ends when the
            // refusal says the key's units expire.
            _ => now
                .saturating_add(u64::try_from(refusal.reset_after.as_micros()).unwrap_or(u64::MAX)),
        };
        let streak = if lease.hold.window_end == window_end
            || (policy.algorithm() == Algorithm::SlidingWindow && lease.hold.hot_at(policy, now))
        {
            lease.hold.streak
        } else {
            0
        };
        let hold = match policy.algorithm() {
            // Doubled for each refusal while the key is asked for past its
            // limit, across windows, and halved by each grant (`granted`),
            // never past the window's end: an instance that keeps losing the
            // units a sliding window frees to others asks about once per
            // doubling, not once per unit freed. Started afresh at each
            // window, the doubling made every instance of a fleet climb it
            // again each window: 0.11 calls per admission at 32 instances.
            Algorithm::SlidingWindow => retry
                .saturating_mul(1 << streak.min(20))
                .min(window_end - now)
                .max(retry),
            // A fixed window's refusal already stands until the window
            // ends, when the whole limit is free.
            _ => retry,
        };
        lease.shared_remaining = refusal.remaining;
        lease.hold = Hold {
            until: now.saturating_add(hold),
            ticket: tickets.refusal,
            cost,
            streak: streak.saturating_add(1),
            window_end,
            hot: true,
            size,
            remaining: refusal.remaining,
            reset_at: now
                .saturating_add(u64::try_from(refusal.reset_after.as_micros()).unwrap_or(u64::MAX)),
        };
        let mut d = refusal;
        d.retry_after = Duration::from_micros(hold);
        d
    }

    /// The batch a key asked for past its limit is bought in: `max_units`,
    /// at most half the limit, so that a grant can leave a whole batch in
    /// the shared store and say the demand is below the limit again.
    fn full_batch(&self, policy: &Policy) -> u32 {
        self.config.max_units.min(policy.limit() / 2).max(1)
    }

    /// The key is asked for past its limit ([`Hold::hot`]).
    fn hot(&self, key: &[u8], policy: &Policy, now: u64) -> bool {
        self.lock()
            .get(&(policy.algorithm(), key.to_vec()))
            .is_some_and(|l| l.policy == *policy && l.hold.hot_at(policy, now))
    }

    /// One round trip for a batch of `units` that pays a request of
    /// `cost`: the request's admission, the rest of the batch in hand, or
    /// the shared store's refusal.
    async fn buy(
        &self,
        request: Request<'_>,
        units: u32,
        ticket: Ticket,
    ) -> Result<Result<Decision, Decision>, StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let batch = request
            .with_cost(units)
            .map_err(|e| StoreError::invalid_request(self.shared.name(), e))?;
        bump(&self.round_trips);
        let reply = self.shared.decide(batch).await?;
        if !reply.allowed {
            return Ok(Err(reply));
        }
        self.granted(key, policy, units, cost, now.as_micros(), &reply, ticket);
        let mut admitted = reply;
        admitted.remaining = admitted.remaining.saturating_add(units - cost);
        Ok(Ok(admitted))
    }

    /// What is left to do once the shared store refused a batch of `size`
    /// for a request of `cost`. When the reply says the request fits, one
    /// more call asks for it ([exact](LeaseConfig::exact_refusals)) or for
    /// all that is left, unless the key is asked for past its limit on a
    /// sliding window ([`Hold::hot`]), whose units come free a few at a
    /// time: there the refusal is held until a batch is free. When it does not fit, the reply stands
    /// without another call: a fixed window refuses any cost until it
    /// ends, so its reply is the request's own; a sliding window's reply
    /// gives the batch's retry time, longer than the request's, so with
    /// [exact refusals](LeaseConfig::exact_refusals) the request alone is
    /// asked for. Then, unless refusals are exact, the refusal is held.
    async fn after_refusal(
        &self,
        request: Request<'_>,
        size: u32,
        refusal: Decision,
        tickets: Tickets,
    ) -> Result<Decision, StoreError> {
        let (key, policy, cost, now) = (
            request.key(),
            request.policy(),
            request.cost(),
            request.now(),
        );
        let exact = self.config.exact;
        let ask = if refusal.remaining >= cost && size > cost {
            if exact {
                Some(cost)
            } else {
                (policy.algorithm() != Algorithm::SlidingWindow
                    || !self.hot(key, policy, now.as_micros()))
                .then(|| refusal.remaining.min(size - 1))
            }
        } else if exact && size > cost && policy.algorithm() != Algorithm::FixedWindow {
            Some(cost)
        } else {
            None
        };
        // The size the refusal that stands was for: its retry time is that
        // many units'.
        let (size, refusal) = match ask {
            Some(units) => match self.buy(request, units, tickets.units).await? {
                Ok(admitted) => return Ok(admitted),
                Err(refusal) => (units, refusal),
            },
            None => (size, refusal),
        };
        let t = now.as_micros();
        Ok(if exact {
            refusal
        } else {
            self.refused(key, policy, size, cost, t, refusal, tickets)
        })
    }
}

/// A caller's share of a key's refill gate. Dropped (also when the caller's
/// future is), it removes the gate once no one else holds or waits for it.
struct Refill<'a> {
    store: &'a LeasedStore,
    map_key: LeaseKey,
    gate: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        let mut refills = self
            .store
            .refills
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Clones are made only under this lock: two counts are the map's
        // and this one, so nobody else can be waiting.
        if Arc::strong_count(&self.gate) == 2 {
            refills.remove(&self.map_key);
        }
    }
}

#[async_trait]
impl Store for LeasedStore {
    fn name(&self) -> &'static str {
        self.shared.name()
    }

    /// The shared store's, for the algorithms a lease is sound for.
    fn capabilities(&self) -> Capabilities {
        let shared = self.shared.capabilities();
        let both = |a: &Algorithm| shared.algorithms.contains(a);
        Capabilities {
            algorithms: match (both(&LEASE_ALGORITHMS[0]), both(&LEASE_ALGORITHMS[1])) {
                (true, true) => &LEASE_ALGORITHMS,
                (true, false) => &LEASE_ALGORITHMS[..1],
                (false, true) => &LEASE_ALGORITHMS[1..],
                (false, false) => &[],
            },
            // Units spent from a lease are refused locally, unseen by the
            // shared store that would count them toward a ban.
            bans: false,
            ..shared
        }
    }

    /// Refuses the sliding log and GCRA as the `Store` contract asks of an
    /// algorithm a store does not list, with
    /// [`ConfigError::UnsupportedAlgorithm`] (from the `"leased"` store):
    /// they count each unit at the instant it is admitted, so a unit
    /// leased now and spent later would be freed too early and the fleet
    /// could exceed its limit (see the [module docs](self)). Then refuses
    /// a ban, which a lease cannot count (a refusal from leased units
    /// never reaches the shared store), a store on its server's clock, and
    /// whatever the shared store refuses.
    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        if !LEASE_ALGORITHMS.contains(&policy.algorithm()) {
            return Err(ConfigError::UnsupportedAlgorithm {
                store: "leased",
                algorithm: policy.algorithm(),
            });
        }
        if policy.ban().is_some() {
            return Err(ConfigError::UnsupportedBan { store: "leased" });
        }
        if self.shared.capabilities().server_clock {
            return Err(ConfigError::Invalid(format!(
                "the {} store decides with its server's clock, but a lease ends with the window \
                 that counted it on the limiter's clock: use the store in client-clock mode",
                self.shared.name()
            )));
        }
        self.shared.check_policy(policy)
    }

    /// The shared store's: a reset elsewhere reaches the refusal caches in
    /// front of the lease as it would reach them in front of the store.
    fn invalidations(&self) -> Option<Arc<crate::Invalidations>> {
        self.shared.invalidations()
    }

    fn max_key_len(&self) -> usize {
        self.shared.max_key_len()
    }

    /// Answers at once when the key's batch can pay.
    fn decide_inline(&self, request: Request<'_>) -> Option<Result<Decision, StoreError>> {
        let (key, policy) = (request.key(), request.policy());
        if let Err(e) = self.check(policy) {
            return Some(Err(e));
        }
        self.spend(key, policy, request.cost(), request.now().as_micros())
            .map(Ok)
    }

    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let (key, policy, cost) = (request.key(), request.policy(), request.cost());
        self.check(policy)?;
        let t = request.now().as_micros();
        if let Some(d) = self.spend(key, policy, cost, t) {
            return Ok(d);
        }
        let refill = self.refill_gate(key, policy);
        let _one_at_a_time = refill.gate.lock().await;
        // The batch another caller bought while this one waited may pay.
        if let Some(d) = self.spend(key, policy, cost, t) {
            return Ok(d);
        }
        // Before the call: a reset heard after it makes what it buys stale,
        // a give-back or reset the refusal it may get.
        let tickets = self.tickets(key);
        let size = self.next_size(key, policy, cost, t);
        match self.buy(request, size, tickets.units).await? {
            Ok(admitted) => Ok(admitted),
            Err(refusal) => self.after_refusal(request, size, refusal, tickets).await,
        }
    }

    /// Gives the units back to the key's batch when the admission was paid
    /// from it (or from the grant that started it) and the batch is still
    /// live; otherwise refunds the shared store.
    fn refund_inline(&self, refund: Refund<'_>) -> Option<Result<(), StoreError>> {
        let request = refund.request();
        let (key, policy, cost) = (request.key(), request.policy(), request.cost());
        let t = request.now().as_micros();
        let reset_after = u64::try_from(refund.admitted().reset_after.as_micros()).ok()?;
        let anchor = t.saturating_add(reset_after);
        let mut leases = self.lock();
        let lease = self.entry(&mut leases, &(policy.algorithm(), key.to_vec()))?;
        if !lease.live(policy, t) || lease.granted_at + lease.reset_after != anchor {
            return None;
        }
        lease.units = lease.units.saturating_add(cost);
        self.spent.fetch_sub(u64::from(cost), Ordering::Relaxed);
        Some(Ok(()))
    }

    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        if let Some(done) = self.refund_inline(refund) {
            return done;
        }
        self.check(refund.request().policy())?;
        bump(&self.round_trips);
        self.shared.refund(refund).await?;
        // The shared store has the units back: a refusal held from before
        // would refuse what it now admits. Dropped after any batch in
        // flight, whose refusal may predate the refund.
        let (key, policy) = (refund.request().key(), refund.request().policy());
        let refill = self.refill_gate(key, policy);
        let _one_at_a_time = refill.gate.lock().await;
        if let Some(lease) = self.lock().get_mut(&(policy.algorithm(), key.to_vec())) {
            lease.hold.until = 0;
        }
        Ok(())
    }

    /// What the batch in hand would pay, without a round trip; otherwise
    /// the shared store's peek, with the units in hand counted as left.
    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        let (key, policy, cost) = (request.key(), request.policy(), request.cost());
        self.check(policy)?;
        let t = request.now().as_micros();
        let known = self
            .entry(&mut self.lock(), &(policy.algorithm(), key.to_vec()))
            .map(|l| *l);
        let in_hand = known.filter(|l| l.live(policy, t));
        if let Some(lease) = in_hand.filter(|l| l.units >= cost) {
            let mut d = lease.admitted(t, self.shared.name());
            d.remaining = d.remaining.saturating_sub(cost);
            return Ok(d);
        }
        if let Some(refusal) = known.and_then(|l| l.held(policy, cost, t, self.shared.name())) {
            return Ok(refusal);
        }
        bump(&self.round_trips);
        let mut d = self.shared.peek(request).await?;
        d.remaining = d.remaining.saturating_add(in_hand.map_or(0, |l| l.units));
        Ok(d)
    }

    /// Drops the key's batch (its units were counted by the shared store,
    /// whose state for the key is forgotten with them) and resets the key
    /// in the shared store, with this instance's held refusal of it. Other
    /// instances' batches stay in their hands until their window ends (at
    /// most `max_units − 1` units each), and their held refusals until the
    /// retry time they told (at most the window, or a fixed window's end).
    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        // After any batch in flight is recorded, so that none bought before
        // the reset is spent after it.
        let refill = self.refill_gate(key.as_bytes(), policy);
        let _one_at_a_time = refill.gate.lock().await;
        self.lock()
            .remove(&(policy.algorithm(), key.as_bytes().to_vec()));
        bump(&self.round_trips);
        self.shared.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        let (key, policy) = (request.key(), request.policy());
        // The units this instance holds were counted when they were bought;
        // spending them after the penalty would let the key go on as if it
        // had not been charged, so they are given up (stricter), after any
        // batch in flight, which would otherwise land after the penalty.
        let refill = self.refill_gate(key, policy);
        let _one_at_a_time = refill.gate.lock().await;
        self.lock().remove(&(policy.algorithm(), key.to_vec()));
        bump(&self.round_trips);
        self.shared.penalize(request).await
    }
}
