//! Flood: 10,000,000 decisions over 1,000,000 distinct keys into a store
//! capped at 100,000 keys. Prints, every 1,000,000 decisions, the keys held,
//! the evictions so far, the process's resident memory (VmRSS) and the
//! rate; then checks that the cap held and that resident memory stayed flat
//! after the first fill. Not a test: it is run by hand and its figures are
//! recorded in BENCHMARKS.md.
//!
//! The peer runs the same flood in a child process of its own, so that each
//! resident-memory figure is one contender's: the memory store under the
//! sliding log (the largest state per key) and under GCRA, and `governor`'s keyed limiter
//! (dashmap) at the same 10 per minute (as GCRA, the one algorithm it has),
//! with `retain_recent` and `shrink_to_fit` after every report, which is how
//! `governor` says to bound a keyed limiter's memory.
//!
//! ```text
//! cargo bench -p ratewarden-memory --bench flood
//! FLOOD_DECISIONS=20000000 FLOOD_KEYS=2000000 FLOOD_CAPACITY=100000 cargo bench -p ratewarden-memory --bench flood
//! FLOOD_CONTENDER=memory-log cargo bench -p ratewarden-memory --bench flood   # one contender, in this process
//! ```

use std::num::NonZeroU32;
use std::process::Command;
use std::time::{Duration, Instant};

use governor::clock::{Clock, FakeRelativeClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use ratewarden_core::{Algorithm, ManualClock, Policy, Timestamp};
use ratewarden_memory::MemoryStore;

/// The flood's limit: the demo's search limit, 10 per minute.
const LIMIT: u32 = 10;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident set size of this process in KiB.
fn vm_rss_kib() -> u64 {
    ratewarden_test_support::rss::status_kib("self", "VmRSS:")
}

/// A client key as the ratewarden crate makes them: a purpose prefix and 32
/// hex characters.
fn key(i: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let _ = write!(out, "search:{mixed:016x}{:016x}", i ^ 0x5555);
}

/// Each contender in a child process of its own (this binary again, with
/// `FLOOD_CONTENDER` set), one after the other, so that neither's memory
/// shows in the other's figures.
fn main() {
    match std::env::var("FLOOD_CONTENDER").as_deref() {
        Ok("memory-log") => {
            memory_flood(Policy::sliding_log(LIMIT, Duration::from_secs(60)).expect("valid policy"))
        }
        Ok("memory-gcra") => {
            memory_flood(Policy::gcra(LIMIT, Duration::from_secs(60)).expect("valid policy"))
        }
        Ok("governor") => governor_flood(),
        Ok(other) => panic!(
            "FLOOD_CONTENDER={other}: the contenders are memory-log, memory-gcra and governor"
        ),
        Err(_) => {
            let me = std::env::current_exe().expect("the bench's own path");
            for contender in ["memory-log", "memory-gcra", "governor"] {
                let status = Command::new(&me)
                    .env("FLOOD_CONTENDER", contender)
                    .status()
                    .expect("the bench runs itself");
                assert!(status.success(), "the {contender} flood failed: {status}");
                println!();
            }
        }
    }
}

/// The same stream of keys for every contender: `(is the offender, key)`
/// for each decision, the offender's every 100th.
struct Flood {
    x: u64,
    keys: u64,
    i: u64,
    buf: Vec<u8>,
}

impl Flood {
    fn new(keys: u64) -> Self {
        Flood {
            x: 0x2545_F491_4F6C_DD1D,
            keys,
            i: 0,
            buf: Vec::with_capacity(64),
        }
    }

    fn next_key(&mut self) -> (bool, &[u8]) {
        // xorshift64*: a cheap, deterministic stream of key indices.
        self.x ^= self.x >> 12;
        self.x ^= self.x << 25;
        self.x ^= self.x >> 27;
        let k = self.x.wrapping_mul(0x2545_F491_4F6C_DD1D) % self.keys;
        self.i += 1;
        // Every 100th request is the offender's, hammering through the flood.
        let offending = self.i.is_multiple_of(100);
        if offending {
            self.buf.clear();
            self.buf.extend_from_slice(b"search:offender");
        } else {
            key(k, &mut self.buf);
        }
        (offending, &self.buf)
    }
}

/// A flood key as a fixed-size value, as `governor`'s map wants its keys
/// (`Hash + Eq + Clone`): the bytes, zero-padded. Every key here is at most
/// 39 bytes, so none is cut and no two collide.
type FixedKey = [u8; 40];

type Governor = RateLimiter<
    FixedKey,
    DashMapStateStore<FixedKey>,
    FakeRelativeClock,
    NoOpMiddleware<<FakeRelativeClock as Clock>::Instant>,
>;

fn fixed(k: &[u8]) -> FixedKey {
    let mut out = [0u8; 40];
    assert!(k.len() < out.len(), "a flood key outgrew FixedKey");
    out[..k.len()].copy_from_slice(k);
    out
}

/// `governor`'s keyed limiter through the same flood, pruned after every
/// report as its docs advise; its key count and memory are the figures.
fn governor_flood() {
    let decisions = env("FLOOD_DECISIONS", 10_000_000);
    let keys = env("FLOOD_KEYS", 1_000_000);
    let report_every = env("FLOOD_REPORT_EVERY", 1_000_000).max(1);
    let clock = FakeRelativeClock::default();
    let quota = Quota::per_minute(NonZeroU32::new(LIMIT).expect("not zero"));
    let limiter: Governor = RateLimiter::dashmap_with_clock(quota, clock.clone());
    println!(
        "flood: {decisions} decisions over {keys} distinct keys, governor keyed (dashmap), \
         GCRA {LIMIT}/min, retain_recent + shrink_to_fit after every report"
    );
    println!("rss before the first decision: {} KiB", vm_rss_kib());
    println!(
        "{:>12} {:>10} {:>10} {:>10} {:>14}",
        "decisions", "held", "rss KiB", "allowed%", "decisions/s"
    );
    let mut flood = Flood::new(keys);
    let (mut allowed, mut offender_allowed) = (0u64, 0u64);
    let mut window_start = Instant::now();
    for i in 1..=decisions {
        let (offending, k) = flood.next_key();
        clock.advance(Duration::from_micros(10));
        let ok = limiter.check_key(&fixed(k)).is_ok();
        allowed += u64::from(ok);
        if offending {
            offender_allowed += u64::from(ok);
        }
        if i % report_every == 0 {
            let rate = report_every as f64 / window_start.elapsed().as_secs_f64();
            limiter.retain_recent();
            limiter.shrink_to_fit();
            println!(
                "{i:>12} {:>10} {:>10} {:>9.1}% {rate:>14.0}",
                limiter.len(),
                vm_rss_kib(),
                100.0 * allowed as f64 / i as f64
            );
            window_start = Instant::now();
        }
    }
    println!(
        "offender: {offender_allowed} of {} requests admitted",
        decisions / 100
    );
}

/// The memory store through the flood under `policy`: the sliding log, the
/// largest state a key can hold, or GCRA, the algorithm `governor` runs.
fn memory_flood(policy: Policy) {
    let decisions = env("FLOOD_DECISIONS", 10_000_000);
    let keys = env("FLOOD_KEYS", 1_000_000);
    let capacity = env("FLOOD_CAPACITY", 100_000) as usize;
    let report_every = env("FLOOD_REPORT_EVERY", 1_000_000).max(1);
    let store = MemoryStore::builder()
        .capacity(capacity)
        .build()
        .expect("valid capacity");
    println!(
        "flood: {decisions} decisions over {keys} distinct keys, capacity {capacity}, {} shards, {policy}",
        store.shards()
    );
    println!("rss before the first decision: {} KiB", vm_rss_kib());
    println!(
        "{:>12} {:>10} {:>12} {:>10} {:>10} {:>14}",
        "decisions", "held", "evictions", "rss KiB", "allowed%", "decisions/s"
    );
    let mut now = ManualClock::DEFAULT_START.as_micros();
    let mut flood = Flood::new(keys);
    let mut allowed = 0u64;
    let mut offender_allowed = 0u64;
    let mut samples = Vec::new();
    let mut window_start = Instant::now();
    for i in 1..=decisions {
        let (offending, k) = flood.next_key();
        // 10 µs of manual time per decision: 10 M decisions span 100 s, so
        // windows open, fill, refuse and expire during the run.
        now += 10;
        let d = store
            .decide_sync(k, &policy, 1, Timestamp::from_micros(now))
            .expect("valid request");
        allowed += u64::from(d.allowed);
        if offending {
            offender_allowed += u64::from(d.allowed);
        }
        if i % report_every == 0 {
            let held = store.len();
            let rss = vm_rss_kib();
            let rate = report_every as f64 / window_start.elapsed().as_secs_f64();
            println!(
                "{i:>12} {held:>10} {:>12} {rss:>10} {:>9.1}% {rate:>14.0}",
                store.evictions(),
                100.0 * allowed as f64 / i as f64
            );
            assert!(held <= capacity, "held {held} keys, capacity {capacity}");
            samples.push(rss);
            window_start = Instant::now();
        }
    }
    // After the first sample the store is full (1 M decisions over 1 M keys
    // touch far more than 100 k); from then on memory must not grow.
    if let (Some(first), Some(max)) = (samples.first(), samples.iter().skip(1).max()) {
        let growth = *max as f64 / *first as f64 - 1.0;
        println!(
            "rss after the first fill: {first} KiB; highest later: {max} KiB ({:+.1}%)",
            100.0 * growth
        );
        assert!(
            growth < 0.10,
            "resident memory grew {:.1}% after the first fill",
            100.0 * growth
        );
    }
    println!("cap held: at most {capacity} keys at every sample");
    // 10 per 60 s over the run's manual time: the offender, touched every
    // 100 decisions, is never evicted and never admitted past what its
    // algorithm allows over the span.
    let span_us = decisions * 10;
    let limit = u64::from(LIMIT);
    let max_admitted = match policy.algorithm() {
        // A full burst, then one emission interval (6 s) per unit.
        Algorithm::Gcra => limit + span_us * limit / 60_000_000,
        // The limit in every window the span touches.
        _ => limit * span_us.div_ceil(60_000_000),
    };
    println!(
        "offender: {offender_allowed} of {} requests admitted over {} s of manual time (limit allows at most {max_admitted})",
        decisions / 100,
        span_us / 1_000_000
    );
    assert!(offender_allowed <= max_admitted);
}
