//! Local state told of every give-back: a refund, a released or dropped
//! permit and a reset each leave no refusal cached from before them, so the
//! key's next request gets what the store would answer. On a shared store
//! (whose rules keep a refusal cache by default), with a manual clock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Late;
use ratewarden_core::{
    Capabilities, Clock, ConfigError, Decision, Key, Limiter, ManualClock, Policy, Refund, Request,
    Rule, Store, StoreError,
};

/// A store that others share, so that its rule keeps a refusal cache.
fn shared() -> Arc<dyn Store> {
    Arc::new(ReferenceStore::new(1_000).shared_as("shared"))
}

/// Five logins per 15 minutes.
fn login() -> Policy {
    Policy::fixed_window(5, Duration::from_secs(900)).unwrap()
}

fn limiter(store: Arc<dyn Store>, clock: &ManualClock) -> Limiter {
    Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("login", store, login()).unwrap())
        .build()
        .unwrap()
}

/// How many of `n` checks of `key` are admitted.
async fn admitted(limiter: &Limiter, key: &[u8], n: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u32::from(limiter.check(key).await.allowed);
    }
    admitted
}

#[tokio::test]
async fn a_give_back_after_a_cached_refusal_admits_the_next_request() {
    let clock = ManualClock::new();
    let limiter = limiter(shared(), &clock);
    // Five right-password logins in flight, a sixth refused while they are.
    let mut held = Vec::new();
    for _ in 0..5 {
        let a = limiter.check_admission(b"alice", 1).await.unwrap();
        assert!(a.decision().allowed);
        held.push(a);
    }
    let refused = limiter.check(b"alice").await;
    assert!(!refused.allowed);
    assert!(
        !limiter.check(b"alice").await.allowed && limiter.stats()[0].refusals_cached >= 1,
        "the refusal is cached: the scenario must go through the cache"
    );
    // The logins succeed: each is given back.
    for a in held {
        a.refund().await;
    }
    assert_eq!(
        admitted(&limiter, b"alice", 8).await,
        5,
        "after five give-backs the store has the whole limit back, and so must this instance"
    );
}

#[tokio::test]
async fn a_released_permit_is_usable_at_once() {
    let clock = ManualClock::new();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "partner",
                shared(),
                Policy::fixed_window(1, Duration::from_secs(10)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let permit = limiter.acquire(b"api", Duration::ZERO).await.unwrap();
    assert!(!limiter.check(b"api").await.allowed, "the one unit is held");
    permit.release().await;
    assert!(
        limiter.check(b"api").await.allowed,
        "the released unit came back: a refusal cached while it was held must not stand"
    );
}

#[tokio::test]
async fn a_dropped_permit_is_usable_once_its_refund_has_run() {
    let clock = ManualClock::new();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "partner",
                shared(),
                Policy::fixed_window(1, Duration::from_secs(10)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let permit = limiter.acquire(b"api", Duration::ZERO).await.unwrap();
    assert!(!limiter.check(b"api").await.allowed, "the one unit is held");
    drop(permit);
    // The refund runs on its own task; let it.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(limiter.check(b"api").await.allowed);
}

#[tokio::test]
async fn a_reset_through_another_limiter_reaches_this_ones_refusal_cache() {
    let clock = ManualClock::new();
    let store = shared();
    let app = limiter(store.clone(), &clock);
    let support = limiter(store, &clock);
    assert_eq!(admitted(&app, b"alice", 7).await, 5);
    assert!(!app.check(b"alice").await.allowed);
    support.reset(b"alice").await.unwrap();
    assert_eq!(
        admitted(&app, b"alice", 7).await,
        5,
        "a reset made through another limiter of the process must lift this one's cached refusal"
    );
}

#[tokio::test]
async fn a_give_back_to_one_rule_keeps_another_rules_cached_refusal() {
    // A local burst tier in front of the shared login rule: a refusal by
    // the shared rule refunds the local tier, which must not cost the
    // shared rule its cached refusal (a hammering client would then cost a
    // round trip per request).
    let clock = ManualClock::new();
    let local: Arc<dyn Store> = Arc::new(ReferenceStore::new(1_000));
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "burst",
                local,
                Policy::fixed_window(100, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .rule(Rule::new("login", shared(), login()).unwrap())
        .build()
        .unwrap();
    assert_eq!(admitted(&limiter, b"alice", 50).await, 5);
    let stats = limiter.stats();
    assert_eq!(
        stats[1].refusals_cached, 44,
        "45 refusals: the first asked the store"
    );
}

#[tokio::test]
async fn a_refusal_made_before_a_give_back_and_arriving_after_it_is_not_cached() {
    let clock = ManualClock::new();
    let store = Late::new(shared());
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "partner",
                store.clone(),
                Policy::fixed_window(1, Duration::from_secs(10)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let admission = limiter.check_admission(b"api", 1).await.unwrap();
    assert!(admission.decision().allowed);
    // A second request is refused by the store, and its reply is late.
    store.hold_next();
    let late = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.check(b"api").await }
    });
    store.decided().await;
    // Meanwhile the first is given back: the store has the unit again.
    admission.refund().await;
    store.release();
    assert!(
        !late.await.unwrap().allowed,
        "the late reply is the store's refusal"
    );
    assert!(
        limiter.check(b"api").await.allowed,
        "a refusal made before the give-back must not be cached after it"
    );
}

/// A shared store that hears other instances, standing for Redis or
/// Postgres: the test tells it what the fleet announced.
#[derive(Debug)]
struct Heard {
    inner: Arc<dyn Store>,
    notices: Arc<ratewarden_core::Invalidations>,
}

#[async_trait]
impl Store for Heard {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn check_policy(&self, policy: &Policy) -> Result<(), ConfigError> {
        self.inner.check_policy(policy)
    }
    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }
    fn invalidations(&self) -> Option<Arc<ratewarden_core::Invalidations>> {
        Some(self.notices.clone())
    }
    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.decide(request).await
    }
    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.inner.refund(refund).await
    }
    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.inner.peek(request).await
    }
    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.inner.reset(key, policy).await
    }
    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.inner.penalize(request).await
    }
}

fn heard() -> (Arc<Heard>, Arc<ratewarden_core::Invalidations>) {
    let notices = Arc::new(ratewarden_core::Invalidations::new());
    let store = Arc::new(Heard {
        inner: shared(),
        notices: notices.clone(),
    });
    (store, notices)
}

#[tokio::test]
async fn a_reset_heard_from_another_instance_lifts_the_cached_refusal() {
    let clock = ManualClock::new();
    let (store, notices) = heard();
    let limiter = limiter(store, &clock);
    assert_eq!(admitted(&limiter, b"alice", 7).await, 5);
    assert!(
        !limiter.peek(b"alice").await.allowed,
        "refused from the cache"
    );
    // Another instance reset the key in the shared store, which announced
    // it; here, the store's state is reset by hand to match.
    limiter.rules()[0]
        .store()
        .reset(Key::new(&*shared(), b"login:alice").unwrap(), &login())
        .await
        .unwrap();
    assert!(
        !limiter.peek(b"alice").await.allowed,
        "until the notice is heard, the cached refusal stands"
    );
    notices.reset(b"login:alice");
    assert!(
        limiter.peek(b"alice").await.allowed,
        "a reset heard from the fleet lifts the cached refusal"
    );
    assert_eq!(admitted(&limiter, b"alice", 7).await, 5);
}

#[tokio::test]
async fn while_notices_may_be_missed_no_refusal_is_answered_from_the_cache() {
    let clock = ManualClock::new();
    let (store, notices) = heard();
    let limiter = limiter(store, &clock);
    assert_eq!(admitted(&limiter, b"alice", 6).await, 5);
    let cached = limiter.stats()[0].refusals_cached;
    assert!(!limiter.check(b"alice").await.allowed);
    assert_eq!(
        limiter.stats()[0].refusals_cached,
        cached + 1,
        "cached while heard"
    );
    notices.lost();
    assert!(
        !limiter.check(b"alice").await.allowed,
        "the store still refuses"
    );
    assert_eq!(
        limiter.stats()[0].refusals_cached,
        cached + 1,
        "with the subscription lost, the store is asked"
    );
    notices.restored();
    assert!(!limiter.check(b"alice").await.allowed);
    assert!(!limiter.check(b"alice").await.allowed);
    assert_eq!(
        limiter.stats()[0].refusals_cached,
        cached + 2,
        "cached again once heard"
    );
}

#[tokio::test]
async fn units_leased_before_a_reset_heard_from_elsewhere_are_not_spent() {
    use ratewarden_core::lease::{LeaseConfig, LeasedStore};
    let clock = ManualClock::new();
    let (store, notices) = heard();
    let leased = Arc::new(LeasedStore::new(store, LeaseConfig::new(4).unwrap()));
    let policy = Policy::fixed_window(20, Duration::from_secs(900)).unwrap();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("partner", leased.clone(), policy).unwrap())
        .build()
        .unwrap();
    for _ in 0..2 {
        assert!(limiter.check(b"api").await.allowed);
    }
    let in_hand = || leased.units_in_hand(b"partner:api", &policy, clock.now());
    assert_eq!(in_hand(), 1, "batches of 1 and 2: one unit left");
    // A give-back takes no leased unit.
    notices.invalidate(b"partner:api");
    assert_eq!(in_hand(), 1);
    notices.reset(b"partner:api");
    assert_eq!(
        in_hand(),
        0,
        "a unit bought before the reset was forgotten with it"
    );
}

/// A customer's plan changes while a refusal is cached under the old one:
/// a give-back made under the new plan (counting the same usage) lifts the
/// old plan's cached refusal, so a change back finds what the store would
/// answer.
#[tokio::test]
async fn a_give_back_under_one_plan_reaches_another_plans_cached_refusal() {
    let clock = ManualClock::new();
    let plans = ratewarden_core::Plans::builder("api", shared())
        .shared_clock(Arc::new(clock.clone()))
        .plan("free", "fixed_window 2/15m")
        .plan("pro", "fixed_window 4/15m")
        .build()
        .unwrap();
    let (free, pro) = (plans.choose(Some("free")), plans.choose(Some("pro")));
    // On pro, two requests in flight: the usage free allows.
    let mut held = Vec::new();
    for _ in 0..2 {
        let a = pro.check_admission(b"acme", 1).await.unwrap();
        assert!(a.decision().allowed);
        held.push(a);
    }
    // Downgraded meanwhile: free refuses, and caches the refusal.
    assert!(!free.check(b"acme").await.allowed);
    assert!(
        !free.peek(b"acme").await.allowed,
        "refused from free's cache"
    );
    // One of pro's requests is given back: one unit of free's two is free.
    held.pop().unwrap().refund().await;
    assert!(
        free.check(b"acme").await.allowed,
        "a give-back under pro must lift free's cached refusal"
    );
    assert!(!free.check(b"acme").await.allowed);
}

/// Ten units a minute, a request costing its size.
fn uploads() -> Policy {
    Policy::fixed_window(10, Duration::from_secs(60)).unwrap()
}

/// A limiter of [`uploads`] on which `alice` has spent 7 units, and was
/// then refused 5 (3 are left).
async fn refused_five_of_three(clock: &ManualClock) -> Limiter {
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("upload", shared(), uploads()).unwrap())
        .build()
        .unwrap();
    assert!(limiter.check_cost(b"alice", 7).await.unwrap().allowed);
    assert!(!limiter.check_cost(b"alice", 5).await.unwrap().allowed);
    limiter
}

/// A refusal is of the units asked for: one of 5 with 3 left says nothing
/// of a request of 3, which the store admits. The cache answers only
/// requests of at least the refused units.
#[tokio::test]
async fn a_cached_refusal_of_a_dear_request_leaves_a_cheaper_one_to_the_store() {
    let clock = ManualClock::new();
    let limiter = refused_five_of_three(&clock).await;
    let dearer = limiter.check_cost(b"alice", 6).await.unwrap();
    assert!(
        !dearer.allowed && limiter.stats()[0].refusals_cached == 1,
        "a dearer request is refused from the cache: the scenario goes through it"
    );
    let cheaper = limiter.check_cost(b"alice", 3).await.unwrap();
    assert!(
        cheaper.allowed,
        "3 units fit the 3 the store has left: {cheaper:?}"
    );
    assert!(!limiter.check_cost(b"alice", 1).await.unwrap().allowed);
}

#[tokio::test]
async fn a_waiter_for_fewer_units_than_a_cached_refusal_is_admitted_at_once() {
    let clock = ManualClock::new();
    let limiter = refused_five_of_three(&clock).await;
    let before = clock.now();
    let waited = limiter
        .until_ready_cost(b"alice", 2, Duration::from_secs(1))
        .await;
    assert!(
        waited.is_ok_and(|d| d.allowed) && clock.now() == before,
        "2 units fit the 3 left: admitted without a pause"
    );
}

/// A lease's held refusal is a copy of the shared store's answer like a
/// cached one: a reset or give-back of the key by another limiter of the
/// process (an admin tool on the bare store, say) reaches it, on a store
/// that hears no other instance as on one that does.
mod lease_holds {
    use super::*;
    use ratewarden_core::lease::{LeaseConfig, LeasedStore};

    /// Eight logins per 15 minutes.
    fn eight() -> Policy {
        Policy::fixed_window(8, Duration::from_secs(900)).unwrap()
    }

    /// The application's limiter, leasing batches of up to 4 from `store`,
    /// and an admin's on `store` itself.
    fn app_and_admin(store: Arc<dyn Store>, clock: &ManualClock) -> (Limiter, Limiter) {
        let one = |store: Arc<dyn Store>| {
            Limiter::builder()
                .clock(clock.clone())
                .rule(Rule::new("login", store, eight()).unwrap())
                .build()
                .unwrap()
        };
        let leased = Arc::new(LeasedStore::new(
            store.clone(),
            LeaseConfig::new(4).unwrap(),
        ));
        (one(leased), one(store))
    }

    /// A shared store that hears no other instance.
    fn unheard() -> Arc<dyn Store> {
        Arc::new(ReferenceStore::new(1_000))
    }

    async fn a_reset_by_the_admin_ends_the_apps_hold(store: Arc<dyn Store>) {
        let clock = ManualClock::new();
        let (app, admin) = app_and_admin(store, &clock);
        assert_eq!(admitted(&app, b"alice", 12).await, 8);
        admin.reset(b"alice").await.unwrap();
        assert_eq!(
            admitted(&app, b"alice", 12).await,
            8,
            "after the reset the store admits the whole limit again, and so must the app"
        );
    }

    async fn a_give_back_by_the_admin_ends_the_apps_hold(store: Arc<dyn Store>) {
        let clock = ManualClock::new();
        let (app, admin) = app_and_admin(store, &clock);
        let held = admin.check_admission(b"alice", 1).await.unwrap();
        assert!(held.decision().allowed);
        assert_eq!(admitted(&app, b"alice", 12).await, 7);
        held.refund().await;
        assert_eq!(
            admitted(&app, b"alice", 3).await,
            1,
            "the unit given back is the store's again, and the app's to spend"
        );
    }

    #[tokio::test]
    async fn a_reset_reaches_the_hold_on_a_store_that_hears_no_one() {
        a_reset_by_the_admin_ends_the_apps_hold(unheard()).await;
    }

    #[tokio::test]
    async fn a_reset_reaches_the_hold_on_a_store_that_hears_the_fleet() {
        a_reset_by_the_admin_ends_the_apps_hold(heard().0).await;
    }

    #[tokio::test]
    async fn a_give_back_reaches_the_hold_on_a_store_that_hears_no_one() {
        a_give_back_by_the_admin_ends_the_apps_hold(unheard()).await;
    }

    #[tokio::test]
    async fn a_give_back_reaches_the_hold_on_a_store_that_hears_the_fleet() {
        a_give_back_by_the_admin_ends_the_apps_hold(heard().0).await;
    }
}
