//! Nanoseconds per decision of the composition: what a `Limiter` adds over
//! the bare memory store, what a second tier adds, and what a decision
//! costs while a rule's store is dead and its breaker open.
//!
//! Run with `cargo bench -p ratewarden --bench composition` (add `-- hot` or
//! `-- round` for the workloads whose name contains it, `-- "=one hot key"`
//! for the one so named; `--profile=N` runs contender N alone, (a)
//! being 0, (a2) 1 and (b) 2, for a profiler, and prints how many
//! decisions it made: `scripts/instructions.sh` divides a profile's
//! instruction count by it). (a) calls the store's
//! `decide`, whose future `async_trait` boxes; (a2) calls its
//! `decide_inline`, which a one-rule `Limiter` calls: (b) ÷ (a2) is what the
//! `Limiter` adds to the store's cheapest call, and (b) ÷ (a3), the same
//! call on the storage key the rule builds (`one:{key}`), what it adds
//! besides naming the rule. (g) is the peer:
//! `governor`'s keyed limiter (dashmap, on a fake clock that never moves,
//! as the memory store's `now` does not), the same GCRA quota on the same
//! keys, beside (b), a `Limiter` of one rule; `governor` is unbounded where
//! the memory store holds at most its capacity.
//!
//! A plain `harness = false` binary, like the memory store's benchmark: each
//! figure is the best of several interleaved rounds of a million decisions,
//! reported as on-CPU time of the benchmark thread (from
//! `/proc/thread-self/schedstat`, which time spent waiting for a CPU on a
//! busy machine does not inflate) and as wall time.
//!
//! Each thread runs a current-thread Tokio runtime (the `Limiter` bounds
//! an awaited store call with `tokio::time::timeout`, which needs one), and
//! the bare store is called from the same loop through `&dyn Store`, as a
//! rule calls it. The "2 threads" workloads share one contender between two
//! threads, as a multi-threaded server's workers share one limiter; their
//! CPU figure is the two threads' time per decision, so contention shows. The dead store fails at once, without I/O: the figure is the
//! cost of the composition around an open breaker, not of a network.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use governor::clock::FakeRelativeClock;
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use ratewarden::memory::MemoryStore;
use ratewarden::{
    BreakerConfig, Clock, FailurePolicy, Limiter, ManualClock, Policy, Request, Rule, Store,
    Timestamp,
};
use ratewarden_conformance::broken::Unavailable;

const LIMIT: u32 = 60;
const DECISIONS: usize = 1_000_000;
const KEYS: usize = 1_000;
const RUNS: usize = 5;

/// The abuse case: keys past their limit, decisions are refusals.
fn refusing() -> Policy {
    Policy::gcra(LIMIT, Duration::from_secs(60)).unwrap()
}

/// The admit path: a limit no run reaches, every decision an admission.
fn admitting() -> Policy {
    Policy::gcra(1_000_000, Duration::from_secs(60)).unwrap()
}

fn memory() -> Arc<dyn Store> {
    Arc::new(MemoryStore::new(100_000))
}

/// A 32-hex-character key, the shape of the workspace's client keys.
fn key(i: usize) -> [u8; 32] {
    let mut out = [b'0'; 32];
    let s = format!(
        "{:032x}",
        (i as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
    );
    out.copy_from_slice(s.as_bytes());
    out
}

/// What is measured.
enum Contender {
    Bare(Arc<dyn Store>),
    /// The bare store's cheapest call: `decide_inline` through `&dyn Store`,
    /// which has no boxed future, as a one-rule `Limiter` calls it.
    BareInline(Arc<dyn Store>),
    Limiter(Limiter),
    Governor(Governor),
    /// `decide_inline` on the storage key a rule named `one` builds,
    /// `one:{key}`, made before the run: what the store costs for the
    /// key the limiter hands it.
    Named(Arc<dyn Store>, Vec<Vec<u8>>),
}

type Governor = RateLimiter<
    [u8; 32],
    DashMapStateStore<[u8; 32]>,
    FakeRelativeClock,
    NoOpMiddleware<<FakeRelativeClock as governor::clock::Clock>::Instant>,
>;

/// `governor`'s keyed limiter with the quota of `policy` (a GCRA of
/// `limit` per minute, as every workload here is).
fn governor(policy: &Policy) -> Governor {
    let per_minute = NonZeroU32::new(policy.limit()).expect("a limit is never zero");
    RateLimiter::dashmap_with_clock(Quota::per_minute(per_minute), FakeRelativeClock::default())
}

impl Contender {
    /// Decides `key`, the `index`-th of the run's keys.
    async fn decide(&self, index: usize, key: &[u8], now: Timestamp, policy: &Policy) -> bool {
        match self {
            // Through `&dyn Store`, as a rule calls it.
            Contender::Bare(store) => {
                let store: &dyn Store = &**store;
                match Request::new(store, key, policy, 1, now) {
                    Ok(request) => store.decide(request).await.is_ok_and(|d| d.allowed),
                    Err(_) => false,
                }
            }
            Contender::BareInline(store) => inline(&**store, key, now, policy),
            Contender::Named(store, named) => inline(&**store, &named[index], now, policy),
            Contender::Limiter(l) => l.check(key).await.allowed,
            Contender::Governor(g) => {
                let key: &[u8; 32] = key.try_into().expect("the bench's keys are 32 bytes");
                g.check_key(key).is_ok()
            }
        }
    }
}

/// The store's `decide_inline` on `key`, through `&dyn Store` as a rule
/// calls it: whether it admitted.
fn inline(store: &dyn Store, key: &[u8], now: Timestamp, policy: &Policy) -> bool {
    Request::new(store, key, policy, 1, now).is_ok_and(|r| {
        store
            .decide_inline(r)
            .is_some_and(|d| d.is_ok_and(|d| d.allowed))
    })
}

fn rule(name: &str, store: Arc<dyn Store>, policy: Policy) -> Rule {
    Rule::new(name, store, policy).unwrap()
}

fn limiter(clock: &ManualClock, rules: Vec<Rule>) -> Limiter {
    rules
        .into_iter()
        .fold(Limiter::builder().clock(clock.clone()), |b, r| b.rule(r))
        .build()
        .unwrap()
}

/// A rule on the dead store whose breaker is already open and stays open
/// for the whole run (one failure opens it, for a day of manual time).
fn dead_rule(fallback: bool, policy: Policy) -> Rule {
    let r = rule("dead", Arc::new(Unavailable), policy)
        .with_breaker(BreakerConfig::new(1, Duration::from_secs(86_400)).unwrap())
        .on_failure(FailurePolicy::Open);
    if fallback {
        r.with_fallback(memory()).unwrap()
    } else {
        r
    }
}

const NAMES: [&str; 8] = [
    "(a) bare MemoryStore::decide via &dyn Store",
    "(a2) bare MemoryStore::decide_inline via &dyn Store",
    "(b) Limiter, one memory rule",
    "(c) Limiter, two memory tiers",
    "(d1) Limiter, dead store, breaker open, memory fallback",
    "(d2) Limiter, dead store, breaker open, fail open",
    "(g) governor keyed (dashmap), one quota, unbounded",
    "(a3) bare decide_inline on the rule's storage key",
];

fn contender(i: usize, clock: &ManualClock, p: Policy, keys: &[[u8; 32]]) -> Contender {
    match i {
        0 => Contender::Bare(memory()),
        1 => Contender::BareInline(memory()),
        2 => Contender::Limiter(limiter(clock, vec![rule("one", memory(), p)])),
        3 => Contender::Limiter(limiter(
            clock,
            vec![rule("burst", memory(), p), rule("hourly", memory(), p)],
        )),
        4 => Contender::Limiter(limiter(clock, vec![dead_rule(true, p)])),
        5 => Contender::Limiter(limiter(clock, vec![dead_rule(false, p)])),
        6 => Contender::Governor(governor(&p)),
        _ => Contender::Named(
            memory(),
            keys.iter().map(|k| [&b"one:"[..], k].concat()).collect(),
        ),
    }
}

#[derive(Clone, Copy)]
struct Sample {
    cpu_ns: f64,
    wall_ns: f64,
    admitted: usize,
    /// Decisions made, the warm-up's included (what a profile counts).
    made: usize,
}

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `DECISIONS` decisions of contender `i`, split over `threads` threads
/// (each on a current-thread runtime of its own, sharing the contender as a
/// multi-threaded server's workers share one limiter). CPU time is the
/// threads' sum, so with two threads it shows what sharing costs: lines
/// bounced between cores, lock waits.
fn measure(
    rt: &tokio::runtime::Runtime,
    i: usize,
    keys: &[[u8; 32]],
    policy: Policy,
    threads: usize,
) -> Sample {
    let clock = ManualClock::new();
    let now = clock.now();
    let c = contender(i, &clock, policy, keys);
    // Every key brought past its limit first (the breaker opens on the
    // first decision): with the refusing policy the measured decisions are
    // refusals, the abuse case, except where a dead store fails open; with
    // the admitting one, every key exists and every decision admits.
    let mut made = 0;
    rt.block_on(async {
        for _ in 0..=LIMIT {
            for (index, k) in keys.iter().enumerate() {
                c.decide(index, k, now, &policy).await;
                made += 1;
            }
        }
    });
    let per_thread = DECISIONS / threads;
    let start = Instant::now();
    let (cpu, admitted) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let c = &c;
                scope.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                        .unwrap();
                    let cpu = thread_cpu_ns();
                    let mut admitted = 0;
                    rt.block_on(async {
                        for n in 0..per_thread {
                            let index = (n * 7 + t * 13) % keys.len();
                            let k = &keys[index];
                            admitted += usize::from(
                                c.decide(black_box(index), black_box(k), now, &policy).await,
                            );
                        }
                    });
                    (thread_cpu_ns() - cpu, admitted)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .fold((0, 0), |(c, a), (wc, wa)| (c + wc, a + wa))
    });
    let wall = start.elapsed();
    let decisions = (per_thread * threads) as f64;
    Sample {
        cpu_ns: cpu as f64 / decisions,
        wall_ns: wall.as_nanos() as f64 / decisions,
        admitted,
        made: made + per_thread * threads,
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    // `--profile=N` runs contender N alone (0 is (a)), for a profiler.
    let profile: Option<usize> =
        std::env::args().find_map(|a| a.strip_prefix("--profile=")?.parse().ok());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let all: Vec<[u8; 32]> = (0..KEYS).map(key).collect();
    let workloads: [(&str, &[[u8; 32]], Policy, usize); 6] = [
        ("one hot key", &all[..1], refusing(), 1),
        ("1,000 keys round-robin", &all[..], refusing(), 1),
        ("admit path, one hot key", &all[..1], admitting(), 1),
        ("admit path, 1,000 keys", &all[..], admitting(), 1),
        (
            "2 threads, admit path, one hot key",
            &all[..1],
            admitting(),
            2,
        ),
        (
            "2 threads, admit path, 1,000 keys",
            &all[..],
            admitting(),
            2,
        ),
    ];
    println!(
        "\n{DECISIONS} decisions per run, best of {RUNS} interleaved runs, GCRA {LIMIT}/min \
         (admit path: 1,000,000/min), current-thread runtime; load average at start: {}\n",
        loadavg()
    );
    println!(
        "| workload | contender | CPU ns/decision | wall ns/decision | CPU ÷ (a) | CPU ÷ (a2) | CPU ÷ (b) | admitted |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (label, keys, policy, threads) in workloads {
        let wanted = |f: &String| match f.strip_prefix('=') {
            Some(exact) => label == exact,
            None => label.contains(f.as_str()),
        };
        if !filters.is_empty() && !filters.iter().any(wanted) {
            continue;
        }
        let mut best: [Option<Sample>; 8] = [None; 8];
        let mut made = 0;
        for _ in 0..RUNS {
            for (i, slot) in best.iter_mut().enumerate() {
                if profile.is_some_and(|p| p != i) {
                    *slot = Some(Sample {
                        cpu_ns: 1.0,
                        wall_ns: 1.0,
                        admitted: 0,
                        made: 0,
                    });
                    continue;
                }
                let s = measure(&rt, i, keys, policy, threads);
                made += s.made;
                *slot = Some(match *slot {
                    Some(b) => Sample {
                        cpu_ns: b.cpu_ns.min(s.cpu_ns),
                        wall_ns: b.wall_ns.min(s.wall_ns),
                        admitted: s.admitted,
                        made: s.made,
                    },
                    None => s,
                });
            }
        }
        if profile.is_some() {
            eprintln!("decisions made: {label}: {made}");
        }
        let best = best.map(Option::unwrap);
        for (name, s) in NAMES.iter().zip(best) {
            println!(
                "| {label} | {name} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} | {} |",
                s.cpu_ns,
                s.wall_ns,
                s.cpu_ns / best[0].cpu_ns,
                s.cpu_ns / best[1].cpu_ns,
                s.cpu_ns / best[2].cpu_ns,
                s.admitted
            );
        }
    }
}
