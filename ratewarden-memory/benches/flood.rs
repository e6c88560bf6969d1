//! Flood: 10,000,000 decisions over 1,000,000 distinct keys into a store
//! capped at 100,000 keys. Prints, every 1,000,000 decisions, the keys held,
//! the evictions so far, the process's resident memory (VmRSS) and the
//! rate; then checks that the cap held and that resident memory stayed flat
//! after the first fill. Not a test: it is run by hand and its figures are
//! recorded in BENCHMARKS.md.
//!
//! ```text
//! cargo bench -p ratewarden-memory --bench flood
//! FLOOD_DECISIONS=20000000 FLOOD_KEYS=2000000 FLOOD_CAPACITY=100000 cargo bench -p ratewarden-memory --bench flood
//! ```

use std::time::{Duration, Instant};

use ratewarden_core::{ManualClock, Policy, Timestamp};
use ratewarden_memory::MemoryStore;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident set size of this process in KiB, from /proc/self/status.
fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A client key as the ratewarden crate makes them: a purpose prefix and 32
/// hex characters.
fn key(i: u64, out: &mut Vec<u8>) {
    use std::io::Write;
    out.clear();
    let mixed = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let _ = write!(out, "search:{mixed:016x}{:016x}", i ^ 0x5555);
}

fn main() {
    let decisions = env("FLOOD_DECISIONS", 10_000_000);
    let keys = env("FLOOD_KEYS", 1_000_000);
    let capacity = env("FLOOD_CAPACITY", 100_000) as usize;
    let report_every = env("FLOOD_REPORT_EVERY", 1_000_000).max(1);
    // The demo's search limit, the log being the largest state per key.
    let policy = Policy::sliding_log(10, Duration::from_secs(60)).expect("valid policy");
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
    // xorshift64*: a cheap, deterministic stream of key indices.
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut buf = Vec::with_capacity(64);
    let mut allowed = 0u64;
    let mut offender_allowed = 0u64;
    let mut samples = Vec::new();
    let mut window_start = Instant::now();
    for i in 1..=decisions {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let k = x.wrapping_mul(0x2545_F491_4F6C_DD1D) % keys;
        // Every 100th request is the offender's, hammering through the flood.
        let offending = i % 100 == 0;
        if offending {
            buf.clear();
            buf.extend_from_slice(b"search:offender");
        } else {
            key(k, &mut buf);
        }
        // 10 µs of manual time per decision: 10 M decisions span 100 s, so
        // windows open, fill, refuse and expire during the run.
        now += 10;
        let d = store
            .decide_sync(&buf, &policy, 1, Timestamp::from_micros(now))
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
    // 100 decisions, is never evicted and never admitted past its limit.
    let span_us = decisions * 10;
    let max_admitted = 10 * span_us.div_ceil(60_000_000);
    println!(
        "offender: {offender_allowed} of {} requests admitted over {} s of manual time (limit allows at most {max_admitted})",
        decisions / 100,
        span_us / 1_000_000
    );
    assert!(offender_allowed <= max_admitted);
}
