//! Leased quotas against a shared store: a fleet never admits more than the
//! limit, batches amortise round trips, unspent units are bounded and handed
//! back, refunds go back into the batch, and a dead shared store follows the
//! failure policy once the batch is spent.

use ratewarden_conformance::call;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::{Health, Switch};
use ratewarden_core::lease::{LeaseConfig, LeaseStats, LeasedStore};
use ratewarden_core::{
    Algorithm, Clock, ConfigError, FailurePolicy, Key, Limiter, ManualClock, Policy, Refund,
    Request, Rule, Store, Timestamp,
};

const S: u64 = 1_000_000;
const T0: u64 = ManualClock::DEFAULT_START.as_micros();

/// The fleet's shared store: exact, counting the calls that reach it, and
/// able to fail.
fn shared_store() -> Arc<Switch<dyn Store>> {
    Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(100_000)))
}

/// One instance's store: batches of at most `max_units` from `shared`.
fn leased_store(shared: &Arc<Switch<dyn Store>>, max_units: u32) -> LeasedStore {
    LeasedStore::new(shared.clone(), LeaseConfig::new(max_units).unwrap())
}

fn fleet(shared: &Arc<Switch<dyn Store>>, n: usize, max_units: u32) -> Vec<LeasedStore> {
    (0..n).map(|_| leased_store(shared, max_units)).collect()
}

/// A small deterministic generator: the same schedule on every run.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

/// Four instances (each a `Limiter` with one rule on its own
/// `LeasedStore`, as deployed), random instance order and pace across six
/// windows, a demand far above the limit: in every window of the shared
/// store's own accounting the fleet admits at most the limit, and at
/// least the limit less what the idle batches can strand
/// (`N × (max_units − 1)`). With `gap_us` between requests on average
/// the demand is far above the limit; with a larger one, below it, and
/// then the shared store grants at most one batch per `per_batch`
/// admissions.
async fn fleet_stays_within_the_limit(policy: Policy, gap_us: u64, per_batch: u64) {
    let shared = shared_store();
    let (n, max_units) = (4, 8);
    let clock = ManualClock::new();
    let stores: Vec<Arc<LeasedStore>> = fleet(&shared, n, max_units)
        .into_iter()
        .map(Arc::new)
        .collect();
    let fleet: Vec<Limiter> = stores
        .iter()
        .map(|s| {
            Limiter::builder()
                .clock(clock.clone())
                .rule(Rule::new("r", s.clone(), policy).unwrap())
                .build()
                .unwrap()
        })
        .collect();
    let w = policy.window_micros();
    let mut admitted_in: HashMap<u64, u64> = HashMap::new();
    let mut seed = 0x9E37_79B9_7F4A_7C15;
    let mut now = T0;
    let end = T0 + 6 * w;
    while now < end {
        let instance = &fleet[(next(&mut seed) % n as u64) as usize];
        clock.set(Timestamp::from_micros(now));
        let d = instance.check(b"k").await;
        assert!(!d.source.degraded, "{d:?}");
        if d.allowed {
            *admitted_in.entry(now - now % w).or_default() += 1;
        }
        now += next(&mut seed) % (2 * gap_us);
    }
    let limit = u64::from(policy.limit());
    let stranded = (n as u64) * u64::from(max_units - 1);
    assert!(admitted_in.len() >= 5, "{admitted_in:?}");
    for (window, admitted) in &admitted_in {
        assert!(
            *admitted <= limit,
            "window at +{} s admitted {admitted} > {limit}",
            (window - T0) / S
        );
    }
    // Aligned windows are the fixed window's own only when they open
    // on the grid; the lower bound is for the sliding window's.
    let saturated = w / gap_us > 2 * limit;
    if saturated && policy.algorithm() == Algorithm::SlidingWindow {
        for admitted in admitted_in.values() {
            assert!(*admitted + stranded >= limit, "{admitted_in:?}");
        }
    }
    let stats: Vec<LeaseStats> = stores.iter().map(|s| s.stats()).collect();
    let admitted: u64 = admitted_in.values().sum();
    let trips: u64 = stats.iter().map(|s| s.round_trips).sum();
    assert_eq!(trips, shared.calls() + shared.refunds());
    let grants = stats.iter().map(|s| s.batches).sum::<u64>();
    assert!(
        grants * per_batch <= admitted,
        "{grants} batches for {admitted} admissions"
    );
}

#[tokio::test]
async fn a_fleet_on_fixed_windows_never_admits_more_than_the_limit() {
    let policy = Policy::fixed_window(100, Duration::from_secs(60)).unwrap();
    // About 4,000 requests a window, then about 60.
    fleet_stays_within_the_limit(policy, 15_000, 2).await;
    fleet_stays_within_the_limit(policy, 1_000_000, 4).await;
}

#[tokio::test]
async fn a_fleet_on_sliding_windows_never_admits_more_than_the_limit() {
    let policy = Policy::sliding_window(100, Duration::from_secs(60)).unwrap();
    // Saturated, batches shrink to single units as the window's last
    // units go: no efficiency is asked of that case.
    fleet_stays_within_the_limit(policy, 15_000, 1).await;
    fleet_stays_within_the_limit(policy, 1_000_000, 4).await;
}

/// A fixed window that opens off the grid: the fleet is measured in the
/// store's own windows, which open at the first admission.
#[tokio::test]
async fn a_fixed_window_fleet_admits_the_limit_per_store_window() {
    let shared = shared_store();
    let fleet = fleet(&shared, 3, 16);
    let policy = Policy::fixed_window(50, Duration::from_secs(10)).unwrap();
    let mut admitted = 0;
    for i in 0..600u64 {
        // All inside the window opened by the first request at T0 + 1 ms.
        let now = Timestamp::from_micros(T0 + 1_000 + i * 10_000);
        if call::decide(&fleet[(i % 3) as usize], b"k", &policy, 1, now)
            .await
            .unwrap()
            .allowed
        {
            admitted += 1;
        }
    }
    assert!(admitted <= 50, "{admitted}");
    assert!(admitted >= 50 - 3 * 15, "{admitted}");
}

#[tokio::test]
async fn steady_traffic_costs_one_round_trip_per_batch() {
    let shared = shared_store();
    let leased = &fleet(&shared, 1, 32)[0];
    let policy = Policy::fixed_window(100_000, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    for _ in 0..1_000 {
        assert!(
            call::decide(leased, b"k", &policy, 1, now)
                .await
                .unwrap()
                .allowed
        );
    }
    let s = leased.stats();
    // 1 + 2 + 4 + 8 + 16 = 31 units in 5 trips, then 32 per trip.
    assert_eq!(s.round_trips, 5 + (1_000 - 31usize).div_ceil(32) as u64);
    assert_eq!(s.local + s.round_trips, 1_000);
    assert_eq!(s.spent, 1_000);
    // What is leased and not spent is in hand.
    let held = leased.units_in_hand(b"k", &policy, now);
    assert_eq!(s.leased, s.spent + u64::from(held));
    assert!(s.round_trips * 10 <= 1_000);
}

/// Decides `k` on `store` at `now` until it is refused: how many were
/// admitted before.
async fn admitted_until_refused(store: &LeasedStore, policy: &Policy, now: Timestamp) -> u32 {
    let mut admitted = 0;
    while call::decide(store, b"k", policy, 1, now)
        .await
        .unwrap()
        .allowed
    {
        admitted += 1;
    }
    admitted
}

#[tokio::test]
async fn unspent_units_are_bounded_and_released() {
    let shared = shared_store();
    let fleet = fleet(&shared, 3, 8);
    let policy = Policy::fixed_window(40, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    for _ in 0..20 {
        call::decide(&fleet[0], b"k", &policy, 1, now)
            .await
            .unwrap();
    }
    let held = fleet[0].units_in_hand(b"k", &policy, now);
    assert!(held <= 7, "{held}");
    assert!(held > 0, "the schedule should leave units in hand");
    // The other instance gets what is not leased, and no more.
    let other = admitted_until_refused(&fleet[1], &policy, now).await;
    assert_eq!(20 + held + other, 40);
    // Released units are admitted again, by an instance that holds no
    // refusal of the key (the one refused above repeats its refusal until
    // its retry time, without asking).
    assert_eq!(fleet[0].release(now).await, u64::from(held));
    assert_eq!(fleet[0].units_in_hand(b"k", &policy, now), 0);
    let calls = shared.calls();
    assert!(
        !call::decide(&fleet[1], b"k", &policy, 1, now)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(shared.calls(), calls, "a held refusal costs no round trip");
    let again = admitted_until_refused(&fleet[2], &policy, now).await;
    assert_eq!(again, held);
}

#[tokio::test]
async fn a_unit_spent_then_refused_by_a_later_rule_returns_to_the_lease() {
    let shared = shared_store();
    let leased = Arc::new(leased_store(&shared, 8));
    let leased_units = |l: &LeasedStore, p: &Policy, now| l.units_in_hand(b"fleet:k", p, now);
    let clock = ManualClock::new();
    let fleet_policy = Policy::fixed_window(1_000, Duration::from_secs(60)).unwrap();
    let burst = Policy::fixed_window(3, Duration::from_secs(60)).unwrap();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("fleet", leased.clone(), fleet_policy).unwrap())
        // Asked every time, so every refusal comes after the lease
        // paid for the request.
        .rule(
            Rule::new("burst", shared_store(), burst)
                .unwrap()
                .without_refusal_cache(),
        )
        .build()
        .unwrap();
    for _ in 0..3 {
        assert!(limiter.check(b"k").await.allowed);
    }
    let calls = shared.calls() + shared.refunds();
    for _ in 0..5 {
        let d = limiter.check(b"k").await;
        assert!(!d.allowed);
        assert_eq!(d.source.rule, Some("burst"));
    }
    // One batch of 4 for the fourth request; every refused request's unit
    // went back into it, so the next was paid from it again, with no
    // call to the shared store.
    assert_eq!(shared.calls() + shared.refunds(), calls + 1);
    assert_eq!(limiter.stats()[0].refunds, 5);
    assert_eq!(limiter.stats()[0].allowed, 8);
    let now = clock.now();
    assert_eq!(leased_units(&leased, &fleet_policy, now), 4);
}

#[tokio::test]
async fn a_dead_shared_store_follows_the_failure_policy_once_the_batch_is_spent() {
    let shared = shared_store();
    let leased = Arc::new(leased_store(&shared, 4));
    let clock = ManualClock::new();
    let policy = Policy::fixed_window(1_000, Duration::from_secs(60)).unwrap();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new("fleet", leased.clone(), policy)
                .unwrap()
                .on_failure(FailurePolicy::Closed),
        )
        .build()
        .unwrap();
    // Batches of 1, 2, then 4: three units in hand after 4 requests.
    for _ in 0..4 {
        assert!(limiter.check(b"k").await.allowed);
    }
    let now = clock.now();
    // The limiter stores `{rule}:{key}`.
    assert_eq!(leased.units_in_hand(b"fleet:k", &policy, now), 3);
    shared.set(Health::Failing);
    // Units counted before the outage are still sound to spend.
    for _ in 0..3 {
        assert!(limiter.check(b"k").await.allowed);
    }
    let d = limiter.check(b"k").await;
    assert!(!d.allowed && d.source.degraded, "{d:?}");
}

#[test]
fn algorithms_that_count_each_instant_are_refused() {
    let shared = shared_store();
    let leased: Arc<dyn Store> = Arc::new(leased_store(&shared, 8));
    for policy in [
        Policy::sliding_log(10, Duration::from_secs(1)).unwrap(),
        Policy::gcra(10, Duration::from_secs(1)).unwrap(),
    ] {
        // What the `Store` contract asks for an algorithm a store does not
        // list, so that a caller can tell it from a bad policy.
        let err = Rule::new("r", leased.clone(), policy).unwrap_err();
        assert_eq!(
            err,
            ConfigError::UnsupportedAlgorithm {
                store: "leased",
                algorithm: policy.algorithm(),
            }
        );
    }
    assert!(LeaseConfig::new(0).is_err());
}

/// Units in hand at a window's end are gone at its first instant, for
/// every algorithm a lease is sound for: the next request asks the shared
/// store, which counts it in the new window. Spending them there would
/// admit, in a window that never counted them, up to
/// `N × (max_units − 1)` beyond its limit.
#[tokio::test]
async fn units_in_hand_are_never_spent_after_the_window_that_counted_them() {
    for policy in [
        Policy::fixed_window(20, Duration::from_secs(10)).unwrap(),
        Policy::sliding_window(20, Duration::from_secs(10)).unwrap(),
    ] {
        let shared = shared_store();
        let leased = leased_store(&shared, 4);
        let opened = Timestamp::from_micros(T0);
        // Batches of 1 then 2: one unit left in hand.
        for _ in 0..2 {
            assert!(
                call::decide(&leased, b"k", &policy, 1, opened)
                    .await
                    .unwrap()
                    .allowed
            );
        }
        assert_eq!(shared.calls(), 2, "{policy:?}");
        let last = Timestamp::from_micros(T0 + 10 * S - 1);
        assert_eq!(leased.units_in_hand(b"k", &policy, last), 1, "{policy:?}");
        let next = Timestamp::from_micros(T0 + 10 * S);
        assert_eq!(leased.units_in_hand(b"k", &policy, next), 0, "{policy:?}");
        assert!(
            call::decide(&leased, b"k", &policy, 1, next)
                .await
                .unwrap()
                .allowed
        );
        assert_eq!(
            shared.calls(),
            3,
            "{policy:?}: the new window's first request must ask the shared store"
        );
    }
}

/// A shared store that takes a few scheduler turns to answer, as one across
/// a network does, so that callers overlap while a batch is in flight.
#[derive(Debug)]
struct Slow(ReferenceStore);

#[async_trait::async_trait]
impl Store for Slow {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn capabilities(&self) -> ratewarden_core::Capabilities {
        self.0.capabilities()
    }
    fn max_key_len(&self) -> usize {
        self.0.max_key_len()
    }
    async fn decide(
        &self,
        request: Request<'_>,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        self.0.decide(request).await
    }
    async fn refund(&self, refund: Refund<'_>) -> Result<(), ratewarden_core::StoreError> {
        self.0.refund(refund).await
    }

    async fn peek(
        &self,
        request: Request<'_>,
    ) -> Result<ratewarden_core::Decision, ratewarden_core::StoreError> {
        self.0.peek(request).await
    }

    async fn reset(
        &self,
        key: Key<'_>,
        policy: &Policy,
    ) -> Result<(), ratewarden_core::StoreError> {
        self.0.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), ratewarden_core::StoreError> {
        self.0.penalize(request).await
    }
}

/// Eight callers find a key's batch empty at once. Each buying its own
/// batch would cost eight round trips and report remaining counts out of
/// order; waiting for the batch in flight, they cost one per doubling
/// (1, 2, 4, then 8 bought by the last), and each reports exactly what the
/// one before it left.
#[tokio::test]
async fn callers_that_find_the_batch_empty_together_wait_for_one_refill() {
    let shared = Arc::new(Slow(ReferenceStore::new(1_000)));
    let store = Arc::new(LeasedStore::new(shared, LeaseConfig::new(8).unwrap()));
    let policy = Policy::fixed_window(100, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let store = Arc::clone(&store);
        callers.spawn(async move { call::decide(&store, b"burst", &policy, 1, now).await });
    }
    let mut remaining = Vec::new();
    while let Some(joined) = callers.join_next().await {
        let decision = joined.unwrap().unwrap();
        assert!(decision.allowed);
        remaining.push(decision.remaining);
    }
    remaining.sort_unstable();
    assert_eq!(remaining, (92..100).collect::<Vec<u32>>());
    let stats = store.stats();
    assert_eq!(
        (stats.round_trips, stats.batches, stats.local),
        (4, 4, 4),
        "{stats:?}"
    );
}

/// Over-demand on one key: `instances` instances (each a `Limiter` with one
/// rule on its own lease of up to 32 units) asked for `factor` times the
/// limit of 2,000 per window in all, in even streams at random phases,
/// for four windows. Returns the calls that reached the shared store and
/// what was admitted in each window.
async fn over_demand(policy: Policy, factor: u64) -> (u64, Vec<u64>) {
    let shared = shared_store();
    let instances = 8;
    let clock = ManualClock::new();
    let fleet: Vec<Limiter> = (0..instances)
        .map(|_| {
            let leased = Arc::new(leased_store(&shared, 32));
            Limiter::builder()
                .clock(clock.clone())
                .rule(Rule::new("r", leased, policy).unwrap())
                .build()
                .unwrap()
        })
        .collect();
    let w = policy.window_micros();
    let windows = 4;
    // Window-aligned, so that a window counted here is one of the store's.
    let t0 = T0.div_ceil(w) * w;
    let gap = w * instances / (u64::from(policy.limit()) * factor);
    let mut seed = 0x2545_F491_4F6C_DD1D;
    let mut events: Vec<(u64, usize)> = Vec::new();
    for i in 0..instances as usize {
        let mut t = next(&mut seed) % gap;
        while t < windows * w {
            events.push((t, i));
            t += gap;
        }
    }
    events.sort_unstable();
    let mut admitted = vec![0; windows as usize];
    for (t, i) in events {
        clock.set(Timestamp::from_micros(t0 + t));
        let d = fleet[i].check(b"k").await;
        assert!(!d.source.degraded, "{d:?}");
        if d.allowed {
            admitted[(t / w) as usize] += 1;
        }
    }
    (shared.calls(), admitted)
}

/// The shared store refuses a key that a fleet asks for at two and ten
/// times its limit: the refused part of the traffic must not cost the
/// round trips the leases save. At most 0.10 shared-store calls per
/// admission, never more than the limit in a window, and no less than the
/// limit less what the fleet's batches can strand (`8 × 31`) and what full
/// batches leave unclaimed in the shared store (31).
#[tokio::test]
async fn over_demand_costs_a_tenth_of_a_call_per_admission_and_never_exceeds_the_limit() {
    let window = Duration::from_secs(10);
    for policy in [
        Policy::fixed_window(2_000, window).unwrap(),
        Policy::sliding_window(2_000, window).unwrap(),
    ] {
        for factor in [2, 10] {
            let (calls, admitted) = over_demand(policy, factor).await;
            let total: u64 = admitted.iter().sum();
            let per_admission = calls as f64 / total as f64;
            let what = format!(
                "{:?} at {factor}x: {calls} calls for {admitted:?} admitted",
                policy.algorithm()
            );
            assert!(
                per_admission <= 0.10,
                "{what}: {per_admission:.3} per admission"
            );
            for &n in &admitted {
                assert!(n <= 2_000, "{what}: over the limit");
                assert!(n >= 2_000 - 9 * 31, "{what}: more stranded than the bound");
            }
        }
    }
}

/// A refusal is repeated locally until the retry time the shared store
/// gave, without a round trip, and counted in `LeaseStats::held`; a cheaper
/// request than the refused one is not held (it may fit), but once a key
/// is refused only a full batch is asked for. After the retry time the
/// shared store is asked again.
#[tokio::test]
async fn a_refusal_is_held_without_round_trips_until_its_retry_time() {
    let shared = shared_store();
    let fleet = fleet(&shared, 2, 4);
    let policy = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
    let now = Timestamp::from_micros(T0);
    // The other instance takes all but one unit.
    for _ in 0..9 {
        assert!(
            call::decide(&fleet[1], b"k", &policy, 1, now)
                .await
                .unwrap()
                .allowed
        );
    }
    let leased = &fleet[0];
    let refused = call::decide(leased, b"k", &policy, 2, now).await.unwrap();
    assert!(!refused.allowed);
    let calls = shared.calls();
    for i in 1..=5 {
        let at = Timestamp::from_micros(T0 + i * S);
        let d = call::decide(leased, b"k", &policy, 2, at).await.unwrap();
        assert!(!d.allowed);
        assert_eq!(d.retry_after, refused.retry_after - Duration::from_secs(i));
        assert_eq!(d.remaining, refused.remaining);
    }
    assert_eq!(shared.calls(), calls, "held refusals cost no round trip");
    assert_eq!(leased.stats().held, 5);
    // A cheaper request is asked for, as a full batch, which is refused.
    assert!(
        !call::decide(leased, b"k", &policy, 1, now)
            .await
            .unwrap()
            .allowed
    );
    assert_eq!(shared.calls(), calls + 1);
    // The window ends with the refusal's retry time: asked again, admitted.
    let later = Timestamp::from_micros(T0 + 60 * S);
    assert!(
        call::decide(leased, b"k", &policy, 2, later)
            .await
            .unwrap()
            .allowed
    );
}

/// When the shared store's reply to a refused batch says the request itself
/// cannot fit, the refusal stands without a second round trip; on a fixed
/// window it is then exactly the shared store's refusal of the request,
/// with exact refusals too.
#[tokio::test]
async fn a_refused_batch_costs_one_round_trip_when_the_request_cannot_fit() {
    for config in [
        LeaseConfig::new(8).unwrap(),
        LeaseConfig::new(8).unwrap().exact_refusals(),
    ] {
        let shared = shared_store();
        let alone = ReferenceStore::new(100);
        let leased = LeasedStore::new(shared.clone(), config);
        let policy = Policy::fixed_window(10, Duration::from_secs(60)).unwrap();
        let t = |s: u64| Timestamp::from_micros(T0 + s * S);
        // Batches of 1, 2, 4 and then 3 (half of what is left): the batch
        // in hand pays until the tenth request.
        for i in 0..10 {
            assert!(
                call::decide(&leased, b"k", &policy, 1, t(i))
                    .await
                    .unwrap()
                    .allowed
            );
            assert!(
                call::decide(&alone, b"k", &policy, 1, t(i))
                    .await
                    .unwrap()
                    .allowed
            );
        }
        let calls = shared.calls();
        let d = call::decide(&leased, b"k", &policy, 1, t(10))
            .await
            .unwrap();
        assert_eq!(shared.calls(), calls + 1, "{config:?}");
        let expected = call::decide(&alone, b"k", &policy, 1, t(10)).await.unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.reset_after, d.retry_after),
            (false, 0, expected.reset_after, expected.retry_after),
            "{config:?}"
        );
    }
}

/// A sliding window frees its units a few at a time, so each refusal's
/// retry time is short. Another instance takes every unit freed as soon as
/// it is: a lease with exact refusals asks again at each retry time, while
/// a holding lease doubles each hold and asks a handful of times in the
/// window, its last hold ending with the window the refusal fell in.
#[tokio::test]
async fn a_sliding_window_hold_doubles_while_refusals_continue() {
    let w = 100 * S;
    let policy = Policy::sliding_window(100, Duration::from_micros(w)).unwrap();
    let start = T0.div_ceil(w) * w;
    let at = |us: u64| Timestamp::from_micros(start + us);
    let mut asked = Vec::new();
    for config in [
        LeaseConfig::new(8).unwrap(),
        LeaseConfig::new(8).unwrap().exact_refusals(),
    ] {
        let shared = shared_store();
        let other = leased_store(&shared, 1);
        let leased = LeasedStore::new(shared.clone(), config);
        // A full previous window.
        for _ in 0..100 {
            call::decide(&other, b"k", &policy, 1, at(0)).await.unwrap();
        }
        let mut holds = Vec::new();
        let mut now = w;
        while now < 2 * w {
            while call::decide(&other, b"k", &policy, 1, at(now))
                .await
                .unwrap()
                .allowed
            {}
            let d = call::decide(&leased, b"k", &policy, 1, at(now))
                .await
                .unwrap();
            assert!(!d.allowed, "{config:?}");
            holds.push(d.retry_after);
            now += u64::try_from(d.retry_after.as_micros()).unwrap();
        }
        assert_eq!(
            now,
            2 * w,
            "{config:?}: the last refusal ends with the window: {holds:?}"
        );
        // Each refusal was asked for once, at the time the last one told.
        let asked_now = leased.stats().round_trips;
        assert_eq!(asked_now, holds.len() as u64, "{config:?}: {holds:?}");
        asked.push(asked_now);
    }
    let [holding, exact] = asked[..] else {
        unreachable!()
    };
    assert!(holding <= 8, "holding lease asked {holding} times");
    assert!(
        exact >= 4 * holding,
        "exact lease asked {exact} times, holding {holding}"
    );
}

/// A held refusal tells the time it holds for, and a client that waits
/// exactly that long is admitted: holding is stricter than the shared
/// store, never dishonest. One client hammering a sliding window alone,
/// every millisecond, obeying each retry time it is told.
#[tokio::test]
async fn a_client_that_waits_the_retry_time_it_was_told_is_admitted() {
    let shared = shared_store();
    let leased = leased_store(&shared, 8);
    let w = 10 * S;
    let policy = Policy::sliding_window(20, Duration::from_micros(w)).unwrap();
    let mut now = T0;
    let mut told = 0;
    while now < T0 + 8 * w {
        let d = call::decide(&leased, b"k", &policy, 1, Timestamp::from_micros(now))
            .await
            .unwrap();
        if d.allowed {
            now += 1_000;
            continue;
        }
        told += 1;
        let retry = u64::try_from(d.retry_after.as_micros()).unwrap();
        // Hammering meanwhile changes nothing.
        for early in (now + 1..now + retry).step_by(997) {
            let at = Timestamp::from_micros(early);
            assert!(
                !call::decide(&leased, b"k", &policy, 1, at)
                    .await
                    .unwrap()
                    .allowed
            );
        }
        now += retry;
        let at = Timestamp::from_micros(now);
        let d = call::decide(&leased, b"k", &policy, 1, at).await.unwrap();
        assert!(
            d.allowed,
            "refusal {told}: told to retry at +{retry} us, refused then: {d:?}"
        );
    }
    assert!(told >= 8, "the schedule should be refused often: {told}");
}

/// A small limit, below twice `max_units`: once the key's demand falls
/// under the limit again it is admitted in full, not kept waiting for a
/// batch that could only be granted by an empty window. Sliding window of
/// 10 a minute, leases of up to 16: hammered for a minute, then asked 5
/// times a minute for five minutes; from the second of those minutes on,
/// every request is admitted.
#[tokio::test]
async fn a_small_limit_recovers_once_demand_falls_under_it() {
    let shared = shared_store();
    let leased = leased_store(&shared, 16);
    let m = 60 * S;
    let policy = Policy::sliding_window(10, Duration::from_micros(m)).unwrap();
    let start = T0.div_ceil(m) * m;
    for i in 0..600 {
        let at = Timestamp::from_micros(start + i * 100_000);
        call::decide(&leased, b"k", &policy, 1, at).await.unwrap();
    }
    let mut refused_late = Vec::new();
    for minute in 1..6 {
        for i in 0..5 {
            let t = start + minute * m + i * (m / 5);
            let d = call::decide(&leased, b"k", &policy, 1, Timestamp::from_micros(t))
                .await
                .unwrap();
            if !d.allowed && minute > 1 {
                refused_late.push((minute, i, d.retry_after));
            }
        }
    }
    assert!(
        refused_late.is_empty(),
        "refused under the limit: {refused_late:?}"
    );
}

/// A cheaper request during a hold is asked for alone and leaves the hold
/// as it was told: the dearer client that waits its retry time is asked
/// for again then, not pushed later by the cheaper one's refusal.
#[tokio::test]
async fn a_cheaper_request_leaves_the_hold_it_was_not_covered_by() {
    let shared = shared_store();
    let fleet = fleet(&shared, 2, 8);
    let w = 60 * S;
    let policy = Policy::sliding_window(100, Duration::from_micros(w)).unwrap();
    let start = T0.div_ceil(w) * w;
    let at = |us: u64| Timestamp::from_micros(start + us);
    for _ in 0..100 {
        call::decide(&fleet[1], b"k", &policy, 1, at(0))
            .await
            .unwrap();
    }
    let leased = &fleet[0];
    let dear = call::decide(leased, b"k", &policy, 4, at(w)).await.unwrap();
    assert!(!dear.allowed);
    let told = u64::try_from(dear.retry_after.as_micros()).unwrap();
    // A cheaper request within the hold: asked for, refused, hold unmoved.
    let calls = shared.calls();
    let cheap = call::decide(leased, b"k", &policy, 1, at(w + 1))
        .await
        .unwrap();
    assert_eq!(
        shared.calls(),
        calls + 1,
        "the cheaper request is asked for"
    );
    assert!(!cheap.allowed);
    let again = call::decide(leased, b"k", &policy, 4, at(w + 2))
        .await
        .unwrap();
    assert_eq!(
        again.retry_after,
        dear.retry_after - Duration::from_micros(2)
    );
    // At the time it was told, the dearer request is admitted.
    assert!(
        call::decide(leased, b"k", &policy, 4, at(w + told))
            .await
            .unwrap()
            .allowed
    );
}
