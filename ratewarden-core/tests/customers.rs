//! Limits per customer from the application's data (`CustomerLimits`): read
//! from the source once per TTL, answered from the cache in between, the
//! default plan whenever the lookup goes wrong, and usage that carries over
//! between limits of one algorithm.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_core::{
    CustomerLimit, CustomerLimits, ErrorKind, LimitSource, ManualClock, Store, StoreError,
    async_trait,
};

/// A table of customer limits an operator edits, counting its reads.
#[derive(Debug, Default)]
struct Table {
    rows: Mutex<Vec<(String, CustomerLimit)>>,
    reads: AtomicUsize,
    down: std::sync::atomic::AtomicBool,
}

impl Table {
    fn set(&self, customer: &str, limit: CustomerLimit) {
        let mut rows = self.rows.lock().unwrap();
        rows.retain(|(c, _)| c != customer);
        rows.push((customer.to_owned(), limit));
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

/// The table as the limits read it.
#[derive(Debug)]
struct Source(Arc<Table>);

#[async_trait]
impl LimitSource for Source {
    async fn limit(&self, customer: &str) -> Result<Option<CustomerLimit>, StoreError> {
        self.0.reads.fetch_add(1, Ordering::SeqCst);
        if self.0.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                ErrorKind::Unavailable,
                "table",
                "the table is down",
            ));
        }
        let rows = self.0.rows.lock().unwrap();
        Ok(rows
            .iter()
            .find(|(c, _)| c == customer)
            .map(|(_, l)| l.clone()))
    }
}

fn limits(clock: &ManualClock, table: &Arc<Table>, capacity: usize) -> CustomerLimits {
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(1_000));
    CustomerLimits::builder("api", store)
        .shared_clock(Arc::new(clock.clone()))
        .plan("free", "fixed_window 3/min")
        .plan("pro", "fixed_window 10/min")
        .plan("burst", "gcra 5/s burst 50")
        .source(Source(table.clone()))
        .ttl(Duration::from_secs(30))
        .capacity(capacity)
        .build()
        .unwrap()
}

fn plan(name: &str) -> CustomerLimit {
    CustomerLimit::Plan(name.into())
}

#[tokio::test]
async fn a_changed_limit_takes_effect_within_the_ttl_and_usage_carries_over() {
    let clock = ManualClock::new();
    let table = Arc::new(Table::default());
    let limits = limits(&clock, &table, 100);
    for _ in 0..3 {
        let free = limits.resolve(Some("acme")).await;
        assert_eq!(&*free.name, "plan:free");
        assert!(free.limiter.check(b"acme").await.allowed);
    }
    assert!(
        !limits
            .resolve(Some("acme"))
            .await
            .limiter
            .check(b"acme")
            .await
            .allowed
    );
    assert_eq!(table.reads(), 1, "one read for four requests");
    // Upgraded in the table: the cached limit stands until the TTL ends...
    table.set("acme", plan("pro"));
    clock.advance(Duration::from_secs(29));
    assert_eq!(&*limits.resolve(Some("acme")).await.name, "plan:free");
    // ...then the new one applies, on the usage already counted: 3 of 10
    // spent, this request the fourth.
    clock.advance(Duration::from_secs(1));
    let pro = limits.resolve(Some("acme")).await;
    assert_eq!(&*pro.name, "plan:pro");
    assert_eq!(pro.limiter.check(b"acme").await.remaining, 6);
    assert_eq!(table.reads(), 2);
    // A limit of another algorithm counts apart.
    table.set("acme", plan("burst"));
    clock.advance(Duration::from_secs(30));
    let burst = limits.resolve(Some("acme")).await;
    assert_eq!(burst.limiter.check(b"acme").await.remaining, 49);
    // A limit of its own, shared by every customer given the same one.
    table.set(
        "acme",
        CustomerLimit::policies("fixed_window 100/min").unwrap(),
    );
    table.set(
        "bigco",
        CustomerLimit::policies("fixed_window 100/min").unwrap(),
    );
    clock.advance(Duration::from_secs(30));
    let own = limits.resolve(Some("acme")).await;
    assert_eq!(&*own.name, "own:fixed_window 100/min");
    // The fixed window the first requests opened has closed by now.
    assert_eq!(own.limiter.check(b"acme").await.remaining, 99);
    let other = limits.resolve(Some("bigco")).await;
    assert_eq!(other.name, own.name);
}

#[tokio::test]
async fn every_lookup_that_goes_wrong_is_the_default_plan() {
    let clock = ManualClock::new();
    let table = Arc::new(Table::default());
    let limits = limits(&clock, &table, 100);
    assert_eq!(&*limits.resolve(None).await.name, "plan:free");
    assert_eq!(table.reads(), 0, "no customer, no read");
    table.set("typo", plan("platinum"));
    assert_eq!(&*limits.resolve(Some("typo")).await.name, "plan:free");
    // A limit the store refuses (a log this long is not kept).
    table.set(
        "huge",
        CustomerLimit::Policies(vec!["sliding_window 100000/h".parse().unwrap()]),
    );
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::with_algorithms(
        &[ratewarden_core::Algorithm::FixedWindow],
        10,
    ));
    let narrow = CustomerLimits::builder("api", store)
        .shared_clock(Arc::new(clock.clone()))
        .plan("free", "fixed_window 3/min")
        .source(Source(table.clone()))
        .build()
        .unwrap();
    assert_eq!(&*narrow.resolve(Some("huge")).await.name, "plan:free");
    // A failing source: the default plan, and asked again next time.
    table.set("acme", plan("pro"));
    table.down.store(true, Ordering::SeqCst);
    let before = table.reads();
    assert_eq!(&*limits.resolve(Some("acme")).await.name, "plan:free");
    assert_eq!(&*limits.resolve(Some("acme")).await.name, "plan:free");
    assert_eq!(table.reads(), before + 2);
    table.down.store(false, Ordering::SeqCst);
    assert_eq!(&*limits.resolve(Some("acme")).await.name, "plan:pro");
}

#[tokio::test]
async fn the_cache_holds_at_most_its_capacity_of_customers() {
    let clock = ManualClock::new();
    let table = Arc::new(Table::default());
    let limits = limits(&clock, &table, 2);
    for customer in ["a", "b", "a", "c", "a", "b"] {
        limits.resolve(Some(customer)).await;
    }
    // a, b read; a cached; c read (b forgotten); a cached; b read again.
    assert_eq!(table.reads(), 4);
    assert!(limits.cached("a").is_some() && limits.cached("c").is_none());
}

#[test]
fn bad_limits_are_refused_at_build() {
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(10));
    let build = |f: &dyn Fn(
        ratewarden_core::CustomerLimitsBuilder,
    ) -> ratewarden_core::CustomerLimitsBuilder| {
        f(CustomerLimits::builder("api", store.clone()))
            .build()
            .unwrap_err()
            .to_string()
    };
    assert!(build(&|b| b).contains("at least one plan"));
    assert!(build(&|b| b.plan("free", "3/fortnight")).contains("plan \"free\""));
    assert!(build(&|b| b.plan("free", "3/min").plan("free", "4/min")).contains("given twice"));
    assert!(build(&|b| b.plan("free", "3/min").default("pro")).contains("not one of the plans"));
    assert!(build(&|b| b.plan("free", "3/min").ttl(Duration::ZERO)).contains("TTL"));
    assert!(build(&|b| b.plan("free", "3/min").capacity(0)).contains("at least one customer"));
}
