//! Nanoseconds per decision and memory after a flood: `MemoryStore` beside
//! `governor`'s keyed limiter, on the same keys and the same workloads.
//!
//! Run with `cargo bench -p ratewarden-memory --bench memory_vs_governor`.
//!
//! A plain `harness = false` binary rather than criterion: the two-thread
//! workloads and the per-process peak RSS (each store floods in its own
//! child process, so `VmHWM` is that store's alone) do not fit criterion's
//! single-closure model, each figure is the best of several runs of
//! millions of decisions (so its statistics would add little), and it keeps
//! criterion's dependency tree out of a 2-core build.
//!
//! Time per decision is reported twice: on-CPU time of the benchmark's
//! threads (from `/proc/thread-self/schedstat`), which a busy machine does
//! not inflate, and wall time, which includes lock waits and preemption.
//! Each figure is the best of several rounds in which the contenders take
//! turns.
//!
//! Both sides use a frozen clock, so neither pays for reading time:
//! `governor` a `FakeRelativeClock`, the memory store a fixed `now`.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use governor::clock::{Clock, FakeRelativeClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use ratewarden_core::{ManualClock, Policy, Request, Store, Timestamp};
use ratewarden_memory::MemoryStore;

const NOW: Timestamp = ManualClock::DEFAULT_START;
const LIMIT: u32 = 60;
const FLOOD_KEYS: usize = 1_000_000;
const FLOOD_CAPACITY: usize = 100_000;
const ROUND_ROBIN_KEYS: usize = 10_000;
const STRIDE: usize = 7_919;
const DECISIONS: usize = 1_000_000;
const RUNS: usize = 5;

type Key = [u8; 32];

/// A 32-hex-character key, the shape of the workspace's HMAC client keys.
fn key(i: u64) -> Key {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let mut out = [0u8; 32];
    for (n, word) in [z, i].into_iter().enumerate() {
        for d in 0..16 {
            out[n * 16 + d] = HEX[((word >> (60 - 4 * d)) & 0xF) as usize];
        }
    }
    out
}

trait Contender: Sync {
    fn decide(&self, key: &Key) -> bool;
    fn keys(&self) -> usize;
}

struct MemorySync {
    store: MemoryStore,
    policy: Policy,
}

impl Contender for MemorySync {
    // Never inlined, in every contender alike: each pays the same call,
    // and a profiler can count one contender's decisions alone
    // (`valgrind --toggle-collect='*MemorySync as*decide'`).
    #[inline(never)]
    fn decide(&self, key: &Key) -> bool {
        self.store
            .decide_sync(key, &self.policy, 1, NOW)
            .is_ok_and(|d| d.allowed)
    }
    fn keys(&self) -> usize {
        self.store.len()
    }
}

/// Through `&dyn Store`, as a `Limiter` calls an in-process store: its
/// `decide_inline`, one virtual call and no future, on a request checked
/// against the store's key bound without a virtual call (a `Limiter` reads
/// the bound once, when a rule is built).
struct MemoryDyn {
    store: Arc<MemoryStore>,
    dyn_store: Arc<dyn Store>,
    policy: Policy,
}

impl Contender for MemoryDyn {
    #[inline(never)]
    fn decide(&self, key: &Key) -> bool {
        // Through `&dyn Store`: calling on the `Arc<dyn Store>` itself
        // would go through the blanket `Arc` impl, one more call deep.
        let store: &dyn Store = &*self.dyn_store;
        let Ok(request) = Request::new(&*self.store, key, &self.policy, 1, NOW) else {
            return false;
        };
        match store.decide_inline(request) {
            Some(answer) => answer.is_ok_and(|d| d.allowed),
            None => ready(store.decide(request)).is_ok_and(|d| d.allowed),
        }
    }
    fn keys(&self) -> usize {
        self.store.len()
    }
}

fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}

type Governor = RateLimiter<
    Key,
    DashMapStateStore<Key>,
    FakeRelativeClock,
    NoOpMiddleware<<FakeRelativeClock as Clock>::Instant>,
>;

struct GovernorKeyed(Governor);

impl Contender for GovernorKeyed {
    #[inline(never)]
    fn decide(&self, key: &Key) -> bool {
        self.0.check_key(key).is_ok()
    }
    fn keys(&self) -> usize {
        self.0.len()
    }
}

fn memory(policy: Policy, capacity: usize) -> MemorySync {
    MemorySync {
        store: MemoryStore::builder().capacity(capacity).build().unwrap(),
        policy,
    }
}

fn memory_dyn(policy: Policy, capacity: usize) -> MemoryDyn {
    let store = Arc::new(MemoryStore::builder().capacity(capacity).build().unwrap());
    MemoryDyn {
        dyn_store: store.clone(),
        store,
        policy,
    }
}

fn governor() -> GovernorKeyed {
    let quota = Quota::per_minute(NonZeroU32::new(LIMIT).unwrap());
    GovernorKeyed(RateLimiter::dashmap_with_clock(
        quota,
        FakeRelativeClock::default(),
    ))
}

fn gcra() -> Policy {
    Policy::gcra(LIMIT, Duration::from_secs(60)).unwrap()
}

fn sliding_log() -> Policy {
    Policy::sliding_log(LIMIT, Duration::from_secs(60)).unwrap()
}

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    HotKey,
    RoundRobin,
    Flood,
}

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Workload::HotKey => "one hot key",
            Workload::RoundRobin => "10,000 keys round-robin",
            Workload::Flood => "1,000,000 distinct keys",
        }
    }
}

/// One measured run.
#[derive(Clone, Copy)]
struct Sample {
    /// On-CPU nanoseconds of all threads, per decision.
    cpu_ns: f64,
    /// Wall-clock nanoseconds over all decisions, per decision.
    wall_ns: f64,
    admitted: usize,
    held: usize,
}

/// Runs the workload on `threads` threads sharing one contender.
fn run<C: Contender>(contender: &C, workload: Workload, threads: usize, keys: &[Key]) -> Sample {
    let total = match workload {
        Workload::Flood => keys.len(),
        _ => DECISIONS,
    };
    let per_thread = total / threads;
    let start = Instant::now();
    let (admitted, cpu): (usize, u64) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let cpu_start = thread_cpu_ns();
                    let mut admitted = 0;
                    match workload {
                        Workload::HotKey => {
                            let hot = &keys[0];
                            for _ in 0..per_thread {
                                admitted += usize::from(contender.decide(black_box(hot)));
                            }
                        }
                        Workload::RoundRobin => {
                            // A stride coprime to the key count visits every
                            // key in an order unrelated to the order they were
                            // inserted (and so allocated) in, as a server's
                            // clients would.
                            let offset = t * ROUND_ROBIN_KEYS / threads;
                            for i in 0..per_thread {
                                let k = &keys[(offset + i) * STRIDE % ROUND_ROBIN_KEYS];
                                admitted += usize::from(contender.decide(black_box(k)));
                            }
                        }
                        Workload::Flood => {
                            for k in &keys[t * per_thread..(t + 1) * per_thread] {
                                admitted += usize::from(contender.decide(black_box(k)));
                            }
                        }
                    }
                    (admitted, thread_cpu_ns() - cpu_start)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |(a, c), (x, y)| (a + x, c + y))
    });
    let decisions = (per_thread * threads) as f64;
    Sample {
        cpu_ns: cpu as f64 / decisions,
        wall_ns: start.elapsed().as_nanos() as f64 / decisions,
        admitted,
        held: contender.keys(),
    }
}

/// Nanoseconds this thread has spent on a CPU (the first field of
/// `/proc/thread-self/schedstat`), so that time spent waiting for a CPU on a
/// busy machine is not charged to the store.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Builds a fresh contender and measures one run on it.
fn measure<C: Contender>(contender: C, workload: Workload, threads: usize, keys: &[Key]) -> Sample {
    // Bring the hot and round-robin keys in, in index order, up to their
    // limit, as a long-running server under attack would have them (so the
    // measured decisions are refusals); a flood starts from an empty store.
    let warm = match workload {
        Workload::HotKey => &keys[..1],
        Workload::RoundRobin => keys,
        Workload::Flood => &keys[..0],
    };
    for _ in 0..=LIMIT {
        for k in warm {
            contender.decide(k);
        }
    }
    run(&contender, workload, threads, keys)
}

fn status_kib(field: &str) -> u64 {
    ratewarden_test_support::rss::status_kib("self", field)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// In a child process: flood one contender with 1,000,000 distinct keys,
/// printing RSS growth and the peak as one table row.
fn rss_child(which: &str) {
    let base = status_kib("VmRSS:");
    let flood = |c: &dyn Contender, name: &str| {
        let mut row = format!("| {name} | {} |", mib(base));
        for i in 0..FLOOD_KEYS as u64 {
            c.decide(&key(i));
            if (i + 1) % 250_000 == 0 {
                row += &format!(" {} |", mib(status_kib("VmRSS:")));
            }
        }
        row += &format!(" {} | {} |", mib(status_kib("VmHWM:")), c.keys());
        println!("{row}");
    };
    match which {
        "memory-gcra" => flood(
            &memory(gcra(), FLOOD_CAPACITY),
            "memory store, GCRA, cap 100,000",
        ),
        "memory-log" => flood(
            &memory(sliding_log(), FLOOD_CAPACITY),
            "memory store, sliding log, cap 100,000",
        ),
        "governor" => flood(&governor(), "governor keyed (dashmap), unbounded"),
        other => eprintln!("unknown store {other}"),
    }
}

/// The contenders, in the order they run.
const NAMES: [&str; 4] = [
    "memory, GCRA",
    "memory, GCRA, via `&dyn Store` (inline)",
    "memory, sliding log",
    "governor keyed",
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--rss-child") {
        rss_child(args.get(i + 1).map_or("", String::as_str));
        return;
    }

    // Optional filters, e.g. `-- hot` or `-- flood`: workloads whose label
    // contains one of them (and no memory table unless "memory" is given).
    let valued = ["--only", "--threads", "--runs"];
    let filters: Vec<&str> = args[1..]
        .iter()
        .enumerate()
        .filter(|&(i, a)| !a.starts_with("--") && !valued.contains(&args[i].as_str()))
        .map(|(_, a)| a.as_str())
        .collect();
    let wanted = |label: &str| filters.is_empty() || filters.iter().any(|f| label.contains(f));
    // For profiling one contender (e.g. under cachegrind, with
    // `--toggle-collect` on `run`): `--only NAME` (a substring of the
    // store column), `--threads N`, `--runs N`.
    let option = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let only = option("--only");
    let thread_counts: Vec<usize> = match option("--threads").and_then(|t| t.parse().ok()) {
        Some(t) => vec![t],
        None => vec![1, 2],
    };
    let runs = option("--runs")
        .and_then(|r| r.parse().ok())
        .unwrap_or(RUNS);
    let flood_keys: Vec<Key> = (0..FLOOD_KEYS as u64).map(key).collect();
    let rr_keys = &flood_keys[..ROUND_ROBIN_KEYS];
    println!(
        "\n{DECISIONS} decisions per hot/round-robin run, {FLOOD_KEYS} per flood; \
         best of {runs} interleaved runs; limit {LIMIT}/min; memory store cap {FLOOD_CAPACITY}; \
         load average at start: {}\n",
        loadavg()
    );
    println!(
        "| workload | threads | store | CPU ns/decision | wall ns/decision | admitted | keys held |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|");
    for workload in [Workload::HotKey, Workload::RoundRobin, Workload::Flood] {
        if !wanted(workload.label()) {
            continue;
        }
        let keys = if workload == Workload::Flood {
            &flood_keys[..]
        } else {
            rr_keys
        };
        for &threads in &thread_counts {
            // Contenders take turns within each round, so a burst of load
            // from elsewhere hits them alike; the best of the rounds is kept.
            let mut best: [Option<Sample>; 4] = [None; 4];
            // Contender `i` of `NAMES`, measured once.
            let one = |i: usize| {
                let cap = FLOOD_CAPACITY;
                let (w, t) = (workload, threads);
                match i {
                    0 => measure(memory(gcra(), cap), w, t, keys),
                    1 => measure(memory_dyn(gcra(), cap), w, t, keys),
                    2 => measure(memory(sliding_log(), cap), w, t, keys),
                    _ => measure(governor(), w, t, keys),
                }
            };
            for _ in 0..runs {
                let samples: [Option<Sample>; 4] = std::array::from_fn(|i| {
                    only.is_none_or(|o| NAMES[i].contains(o)).then(|| one(i))
                });
                for (slot, sample) in best.iter_mut().zip(samples) {
                    let Some(sample) = sample else { continue };
                    *slot = Some(match *slot {
                        Some(b) if b.cpu_ns <= sample.cpu_ns => Sample {
                            wall_ns: b.wall_ns.min(sample.wall_ns),
                            ..b
                        },
                        Some(b) => Sample {
                            wall_ns: b.wall_ns.min(sample.wall_ns),
                            ..sample
                        },
                        None => sample,
                    });
                }
            }
            for (name, sample) in NAMES.into_iter().zip(best) {
                let Some(s) = sample else { continue };
                println!(
                    "| {} | {threads} | {name} | {:.1} | {:.1} | {} | {} |",
                    workload.label(),
                    s.cpu_ns,
                    s.wall_ns,
                    s.admitted,
                    s.held
                );
            }
        }
    }

    if !wanted("memory") {
        return;
    }
    println!("\nMemory after flooding {FLOOD_KEYS} distinct keys (one process per store, MiB):\n");
    println!(
        "| store | RSS before | after 250k | after 500k | after 750k | after 1M | peak (VmHWM) | keys held |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let exe = std::env::current_exe().unwrap();
    for which in ["memory-gcra", "memory-log", "governor"] {
        match Command::new(&exe).args(["--rss-child", which]).output() {
            Ok(out) => print!("{}", String::from_utf8_lossy(&out.stdout)),
            Err(e) => println!("| {which} | failed to run: {e} |"),
        }
    }
    println!("\nload average at end: {}", loadavg());
}
