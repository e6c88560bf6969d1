//! A fleet simulator: `N` instances, each a real `Limiter`, sharing one
//! store, under five traffic shapes and five compositions, measured in the
//! shared store's own windows.
//!
//! Deterministic and discrete-event: every request is an event at a time on
//! a `ManualClock` shared by the fleet, served to completion in time order
//! by the instance it arrives at. The shared store is a `MemoryStore`
//! standing for Redis or Postgres in client-clock mode (it decides at the
//! `now` the instance sends, as those stores do), behind a simulated network
//! whose round trip costs `2 × DELAY`: every call is counted, and the report
//! turns the count into the latency a request pays for it. What is measured
//! is the library's code, not a model of it.
//!
//! ```sh
//! cargo bench -p ratewarden --features memory --bench fleet            # N = 1, 4, 64, 1,000
//! cargo bench -p ratewarden --features memory --bench fleet -- 4       # one fleet size
//! cargo bench -p ratewarden --features memory --bench fleet -- over    # over-demand rows
//! ```
//!
//! For each run: **admitted ÷ limit** in the worst (key, window) — above 1
//! is over-admission; **store ops per request** and **per admitted
//! request**; **stranded** units (leased, never spent, not handed back),
//! as a share of the limit summed over windows; and **fairness**, Jain's
//! index of the instances' admitted counts for the busiest key (1 = even).
//!
//! The policy is a sliding window (its `current` counter is an exact count
//! per epoch-aligned window, so a window of the store is a window of the
//! report) of `LIMIT` per `WINDOW`, except for the busy key, whose limit
//! grows with the fleet (`BUSY_PER_INSTANCE` per instance).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ratewarden::lease::{LeaseConfig, LeaseStats, LeasedStore};
use ratewarden::memory::MemoryStore;
use ratewarden::{
    Algorithm, Capabilities, Clock, Decision, ErrorKind, Key, Limiter, ManualClock, Policy, Refund,
    Request, Rule, Store, StoreError, Timestamp,
};
use ratewarden_test_support::Rng;

const LIMIT: u32 = 100;
const WINDOW: Duration = Duration::from_secs(10);
const WINDOWS: u64 = 6;
/// One way, instance to shared store: a round trip costs twice this.
const DELAY: Duration = Duration::from_millis(1);
const LEASE_UNITS: u32 = 16;
const ESCALATE_EVERY: u32 = 10;

/// The shared store behind a simulated network: calls are counted, and
/// fail while an outage is switched on.
#[derive(Debug)]
struct Remote {
    inner: MemoryStore,
    calls: AtomicU64,
    down: AtomicBool,
}

impl Remote {
    fn new() -> Self {
        Remote {
            inner: MemoryStore::new(1_000_000),
            calls: AtomicU64::new(0),
            down: AtomicBool::new(false),
        }
    }

    fn call(&self) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return Err(StoreError::new(ErrorKind::Unavailable, "remote", "down"));
        }
        Ok(())
    }
}

#[async_trait]
impl Store for Remote {
    fn name(&self) -> &'static str {
        "remote"
    }
    fn capabilities(&self) -> Capabilities {
        let mut capabilities = self.inner.capabilities();
        capabilities.shared = true;
        capabilities.key_capacity = None;
        capabilities
    }
    fn max_key_len(&self) -> usize {
        self.inner.max_key_len()
    }
    async fn decide(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.call()?;
        self.inner.decide(request).await
    }
    async fn refund(&self, refund: Refund<'_>) -> Result<(), StoreError> {
        self.call()?;
        self.inner.refund(refund).await
    }

    async fn peek(&self, request: Request<'_>) -> Result<Decision, StoreError> {
        self.call()?;
        self.inner.peek(request).await
    }

    async fn reset(&self, key: Key<'_>, policy: &Policy) -> Result<(), StoreError> {
        self.call()?;
        self.inner.reset(key, policy).await
    }

    async fn penalize(&self, request: Request<'_>) -> Result<(), StoreError> {
        self.call()?;
        self.inner.penalize(request).await
    }
}

#[derive(Clone, Copy, Debug)]
enum Composition {
    SharedOnly,
    MemoryTier,
    Fallback,
    Escalation,
    Leases,
}

impl Composition {
    const ALL: [Composition; 5] = [
        Composition::SharedOnly,
        Composition::MemoryTier,
        Composition::Fallback,
        Composition::Escalation,
        Composition::Leases,
    ];

    fn label(self) -> &'static str {
        match self {
            Composition::SharedOnly => "shared store only",
            Composition::MemoryTier => "memory tier in front",
            Composition::Fallback => "shared, memory fallback (down 1 window in 6)",
            Composition::Escalation => "memory, escalation 1 in 10",
            Composition::Leases => "leases of up to 16",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Shape {
    /// 50 clients, each about 1.5 requests/s (under the limit of 10/s).
    Steady,
    /// 50 clients, each a burst of 40 requests at a random instant of every
    /// window.
    Bursty,
    /// One key at 50 requests/s (5× the limit), from every instance.
    HotKey,
    /// 20,000 keys, one request each.
    ColdKeys,
    /// One attacker key at 500 requests/s spread evenly over the fleet.
    DistributedAttacker,
    /// One tenant's quota of `BUSY_PER_INSTANCE × N` per window, used at
    /// 80 % from every instance: the case leases are for.
    BusyKey,
}

/// A busy key's limit per instance of the fleet, per window.
const BUSY_PER_INSTANCE: u32 = 200;

impl Shape {
    const ALL: [Shape; 6] = [
        Shape::Steady,
        Shape::Bursty,
        Shape::HotKey,
        Shape::ColdKeys,
        Shape::DistributedAttacker,
        Shape::BusyKey,
    ];

    /// The limit per window this shape runs against.
    fn limit(self, instances: usize) -> u32 {
        match self {
            Shape::BusyKey => BUSY_PER_INSTANCE * instances as u32,
            _ => LIMIT,
        }
    }

    /// Whether one key is spread over the instances, so that how evenly
    /// they share it means something.
    fn shared_key(self) -> bool {
        matches!(
            self,
            Shape::HotKey | Shape::DistributedAttacker | Shape::BusyKey
        )
    }

    fn label(self) -> &'static str {
        match self {
            Shape::Steady => "steady",
            Shape::Bursty => "bursty",
            Shape::HotKey => "one hot key",
            Shape::ColdKeys => "many cold keys",
            Shape::DistributedAttacker => "distributed attacker",
            Shape::BusyKey => "busy key at 80 %",
        }
    }
}

/// Requests as (µs after the start, instance, key), in time order.
fn schedule(shape: Shape, instances: usize) -> Vec<(u64, usize, u32)> {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let span = WINDOWS * WINDOW.as_micros() as u64;
    let w = WINDOW.as_micros() as u64;
    let n = instances as u64;
    let mut events = Vec::new();
    match shape {
        Shape::Steady => {
            for client in 0..50 {
                let mut t = rng.below(1_000_000);
                while t < span {
                    events.push((t, rng.below(n) as usize, client));
                    t += 400_000 + rng.below(500_000);
                }
            }
        }
        Shape::Bursty => {
            for client in 0..50 {
                for window in 0..WINDOWS {
                    let start = window * w + rng.below(w - 500_000);
                    for i in 0..40 {
                        events.push((start + i * 10_000, rng.below(n) as usize, client));
                    }
                }
            }
        }
        Shape::HotKey => {
            let mut t = 0;
            while t < span {
                events.push((t, rng.below(n) as usize, 0));
                t += 20_000;
            }
        }
        Shape::ColdKeys => {
            for key in 0..20_000u32 {
                events.push((rng.below(span), rng.below(n) as usize, key));
            }
        }
        Shape::DistributedAttacker => {
            let mut t = 0;
            let mut i = 0;
            while t < span {
                events.push((t, i % instances, 0));
                i += 1;
                t += 2_000;
            }
        }
        Shape::BusyKey => {
            let per_window = u64::from(Shape::BusyKey.limit(instances)) * 8 / 10;
            let gap = w / per_window;
            let mut t = rng.below(gap);
            while t < span {
                events.push((t, rng.below(n) as usize, 0));
                t += gap;
            }
        }
    }
    events.sort_unstable();
    events
}

struct Instance {
    limiter: Limiter,
    lease: Option<Arc<LeasedStore>>,
}

fn policy(limit: u32) -> Policy {
    Policy::sliding_window(limit, WINDOW).unwrap()
}

fn local() -> Arc<dyn Store> {
    Arc::new(
        MemoryStore::builder()
            .capacity(25_000)
            .shards(4)
            .build()
            .unwrap(),
    )
}

fn instance(c: Composition, p: Policy, remote: &Arc<Remote>, clock: &ManualClock) -> Instance {
    let shared: Arc<dyn Store> = remote.clone();
    let mut lease = None;
    let rule = match c {
        Composition::SharedOnly => Rule::new("api", shared, p).unwrap(),
        Composition::MemoryTier => {
            let limiter = Limiter::builder()
                .clock(clock.clone())
                .rule(Rule::new("local", local(), p).unwrap())
                .rule(Rule::new("api", shared, p).unwrap())
                .build()
                .unwrap();
            return Instance {
                limiter,
                lease: None,
            };
        }
        Composition::Fallback => Rule::new("api", shared, p)
            .unwrap()
            .with_fallback(local())
            .unwrap(),
        Composition::Escalation => Rule::new("api", local(), p)
            .unwrap()
            .with_escalation(shared, p, ESCALATE_EVERY, None)
            .unwrap(),
        Composition::Leases => {
            let leased = Arc::new(LeasedStore::new(
                shared,
                LeaseConfig::new(LEASE_UNITS).unwrap(),
            ));
            lease = Some(leased.clone());
            Rule::new("api", leased, p).unwrap()
        }
    };
    Instance {
        limiter: Limiter::builder()
            .clock(clock.clone())
            .rule(rule)
            .build()
            .unwrap(),
        lease,
    }
}

struct Report {
    worst: f64,
    ops_per_request: f64,
    ops_per_admitted: f64,
    stranded: f64,
    fairness: f64,
    admitted: u64,
    requests: usize,
}

async fn run(c: Composition, shape: Shape, instances: usize) -> Report {
    let clock = ManualClock::new();
    let t0 = clock.now().as_micros();
    let remote = Arc::new(Remote::new());
    let limit = shape.limit(instances);
    let fleet: Vec<Instance> = (0..instances)
        .map(|_| instance(c, policy(limit), &remote, &clock))
        .collect();
    let events = schedule(shape, instances);
    let w = WINDOW.as_micros() as u64;
    let mut admitted_in: HashMap<(u32, u64), u64> = HashMap::new();
    let mut per_instance: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut admitted = 0;
    let outage = (2 * w, 3 * w);
    for &(t, i, key) in &events {
        let now = t0 + t;
        clock.set(Timestamp::from_micros(now));
        if let Composition::Fallback = c {
            remote
                .down
                .store((outage.0..outage.1).contains(&t), Ordering::Relaxed);
        }
        let k = key.to_be_bytes();
        if fleet[i].limiter.check(&k).await.allowed {
            admitted += 1;
            *admitted_in.entry((key, now - now % w)).or_default() += 1;
            per_instance
                .entry(key)
                .or_insert_with(|| vec![0; instances])[i] += 1;
        }
    }
    let leases: Vec<LeaseStats> = fleet
        .iter()
        .filter_map(|f| f.lease.as_ref().map(|l| l.stats()))
        .collect();
    let stranded: u64 = leases.iter().map(|s| s.leased - s.spent - s.released).sum();
    let ops = remote.calls.load(Ordering::Relaxed) as f64;
    let busiest = per_instance
        .values()
        .max_by_key(|v| v.iter().sum::<u64>())
        .cloned()
        .unwrap_or_default();
    let fairness = if !shape.shared_key() {
        f64::NAN
    } else {
        let sum: f64 = busiest.iter().map(|&x| x as f64).sum();
        let squares: f64 = busiest.iter().map(|&x| (x as f64).powi(2)).sum();
        if squares == 0.0 {
            1.0
        } else {
            sum * sum / (busiest.len() as f64 * squares)
        }
    };
    let windows_used = admitted_in.len().max(1) as f64;
    Report {
        worst: admitted_in.values().copied().max().unwrap_or(0) as f64 / f64::from(limit),
        ops_per_request: ops / events.len() as f64,
        ops_per_admitted: ops / admitted.max(1) as f64,
        stranded: stranded as f64 / (windows_used * f64::from(limit)),
        fairness,
        admitted,
        requests: events.len(),
    }
}

/// The over-demand rows: a fleet of `instances`, each instance one rule on
/// a lease of up to `OVER_UNITS` over the shared store, one key of
/// `OVER_LIMIT_PER_UNIT × instances × OVER_UNITS` per window (the smallest
/// limit the lease docs state the bound for) asked for `factor` times its
/// limit in all, in even streams that each instance starts at a random
/// phase.
const OVER_FLEETS: [usize; 6] = [2, 4, 8, 16, 24, 32];
const OVER_FACTORS: [u64; 3] = [2, 5, 10];
const OVER_UNITS: u32 = 32;
const OVER_LIMIT_PER_UNIT: u32 = 8;

fn over_limit(instances: usize) -> u32 {
    OVER_LIMIT_PER_UNIT * instances as u32 * OVER_UNITS
}

struct OverDemand {
    requests: usize,
    admitted: u64,
    /// Admitted per window, fewest and most.
    fewest: u64,
    most: u64,
    calls: u64,
    stranded: u64,
}

async fn over_demand(policy: Policy, instances: usize, factor: u64) -> OverDemand {
    let clock = ManualClock::new();
    let w = WINDOW.as_micros() as u64;
    // Window-aligned, so that a window of the report is one of the store's.
    let t0 = clock.now().as_micros().div_ceil(w) * w;
    let remote = Arc::new(Remote::new());
    let fleet: Vec<(Limiter, Arc<LeasedStore>)> = (0..instances)
        .map(|_| {
            let shared: Arc<dyn Store> = remote.clone();
            let leased = Arc::new(LeasedStore::new(
                shared,
                LeaseConfig::new(OVER_UNITS).unwrap(),
            ));
            let limiter = Limiter::builder()
                .clock(clock.clone())
                .rule(Rule::new("api", leased.clone(), policy).unwrap())
                .build()
                .unwrap();
            (limiter, leased)
        })
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let per_instance = u64::from(policy.limit()) * factor / instances as u64;
    let gap = w / per_instance;
    let mut events = Vec::new();
    for i in 0..instances {
        let mut t = rng.below(gap);
        while t < WINDOWS * w {
            events.push((t, i));
            t += gap;
        }
    }
    events.sort_unstable();
    let mut per_window = vec![0u64; WINDOWS as usize];
    for &(t, i) in &events {
        clock.set(Timestamp::from_micros(t0 + t));
        if fleet[i].0.check(b"tenant").await.allowed {
            per_window[(t / w) as usize] += 1;
        }
    }
    if std::env::var("FLEET_DEBUG").is_ok() {
        for (_, l) in &fleet {
            eprintln!("{instances} {factor} {:?}", l.stats());
        }
    }
    let stranded = fleet
        .iter()
        .map(|(_, l)| {
            let s = l.stats();
            s.leased - s.spent - s.released
        })
        .sum();
    OverDemand {
        requests: events.len(),
        admitted: per_window.iter().sum(),
        fewest: *per_window.iter().min().unwrap(),
        most: *per_window.iter().max().unwrap(),
        calls: remote.calls.load(Ordering::Relaxed),
        stranded,
    }
}

fn over_demand_table(rt: &tokio::runtime::Runtime, fleets: &[usize]) {
    println!(
        "\nover-demand: fleets of N instances, one key of {OVER_LIMIT_PER_UNIT} × N × \
         {OVER_UNITS} per {WINDOW:?}, leases of up to {OVER_UNITS}, {WINDOWS} windows\n"
    );
    println!(
        "| algorithm | N | limit | demand ÷ limit | requests | admitted | admitted per window, \
         fewest–most | store calls | calls ÷ admitted | stranded ÷ limit per window | bound |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        for &n in fleets {
            let limit = over_limit(n);
            let policy = Policy::new(algorithm, limit, WINDOW).unwrap();
            for factor in OVER_FACTORS {
                let r = rt.block_on(over_demand(policy, n, factor));
                assert!(
                    r.most <= u64::from(limit),
                    "{algorithm} N={n} {factor}×: {} admitted in one window",
                    r.most
                );
                println!(
                    "| {algorithm} | {n} | {limit} | {factor} | {} | {} | {}–{} | {} | {:.3} | {:.3} | {:.3} |",
                    r.requests,
                    r.admitted,
                    r.fewest,
                    r.most,
                    r.calls,
                    r.calls as f64 / r.admitted.max(1) as f64,
                    r.stranded as f64 / (WINDOWS as f64 * f64::from(limit)),
                    (n as f64 * f64::from(OVER_UNITS - 1)) / f64::from(limit),
                );
            }
        }
    }
}

fn main() {
    let sizes: Vec<usize> = {
        let picked: Vec<usize> = std::env::args()
            .skip(1)
            .filter_map(|a| a.parse().ok())
            .collect();
        if picked.is_empty() {
            vec![1, 4, 64, 1_000]
        } else {
            picked
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    if std::env::args().any(|a| a == "over") {
        let picked: Vec<usize> = sizes.iter().copied().filter(|n| *n > 1).collect();
        let fleets = if std::env::args().any(|a| a.parse::<usize>().is_ok()) {
            picked
        } else {
            OVER_FLEETS.to_vec()
        };
        over_demand_table(&rt, &fleets);
        return;
    }
    println!(
        "\nsliding window {LIMIT} per {WINDOW:?}, {WINDOWS} windows, a round trip to the \
         shared store costs {:?}; worst = admitted ÷ limit in the worst (key, window)\n",
        2 * DELAY
    );
    println!(
        "| N | traffic | composition | requests | admitted | worst | ops/request | ops/admitted | \
         added µs/request | stranded ÷ limit | bound ÷ limit | fairness |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &sizes {
        for shape in Shape::ALL {
            for c in Composition::ALL {
                let r = rt.block_on(run(c, shape, n));
                println!(
                    "| {n} | {} | {} | {} | {} | {:.2} | {:.3} | {:.3} | {:.0} | {:.3} | {} | {} |",
                    shape.label(),
                    c.label(),
                    r.requests,
                    r.admitted,
                    r.worst,
                    r.ops_per_request,
                    r.ops_per_admitted,
                    r.ops_per_request * 2.0 * DELAY.as_micros() as f64,
                    r.stranded,
                    match c {
                        // N × (max_units − 1) per key and window.
                        Composition::Leases => format!(
                            "{:.3}",
                            (n as f64 * f64::from(LEASE_UNITS - 1)) / f64::from(shape.limit(n))
                        ),
                        _ => "–".to_string(),
                    },
                    if r.fairness.is_nan() {
                        "–".to_string()
                    } else {
                        format!("{:.2}", r.fairness)
                    },
                );
            }
        }
    }
}
