//! HashDoS, timed: nanoseconds per decision on keys crafted to share one
//! probe sequence, beside random keys, on the memory store and on a bare
//! hash table keyed the way the attacker assumed.
//!
//! Run with `cargo bench -p ratewarden-memory --bench crafted_keys`
//! (`-- --rounds N`, default 7).
//!
//! The attacker computes the store's digest (SipHash-1-3, 128 bits, of the
//! key's bytes) under a secret it guesses, the all-zero one,
//! and keeps the client keys whose digests share their low 14 bits: under
//! that key they start one probe sequence in any table of up to 16,384
//! slots, so each lookup walks past all the keys inserted before it. The
//! *table* rows run exactly that: a `hashbrown::HashTable` of the digests
//! under the guessed key, the structure the store's shards use, which the
//! crafted keys slow down. The *store* rows run the same keys through
//! `MemoryStore`, whose secret key the attacker did not guess: crafted
//! keys should cost what random ones do.
//!
//! Each figure is the best of several rounds in which the four contenders
//! take turns (wall time, one thread; run it on a quiet machine).

use std::hash::Hasher;
use std::hint::black_box;
use std::time::{Duration, Instant};

use hashbrown::HashTable;
use ratewarden_core::{ManualClock, Policy, Timestamp};
use ratewarden_memory::MemoryStore;
use siphasher::sip128::{Hasher128, SipHasher13};

const NOW: Timestamp = ManualClock::DEFAULT_START;
const KEYS: usize = 2_000;
/// Low bits of the guessed digest every crafted key shares.
const SHARED_BITS: u32 = 14;
const DECISIONS: usize = 1_000_000;

/// The digest's two halves under the guessed key: the first is what the
/// store places a key by (its shard and its slot), the second what tells
/// keys apart.
fn guessed_digest(key: &[u8]) -> (u64, u64) {
    let mut hasher = SipHasher13::new_with_key(&[0; 16]);
    hasher.write(key);
    let h = hasher.finish128();
    (h.h1, h.h2)
}

/// A client key of the HTTP layer's shape: 32 lowercase hex digits.
fn client_key(i: u64) -> Vec<u8> {
    format!("{:016x}{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15), i).into_bytes()
}

fn crafted_keys() -> Vec<Vec<u8>> {
    let mask = (1u64 << SHARED_BITS) - 1;
    let mut keys = Vec::with_capacity(KEYS);
    let mut i = 0u64;
    while keys.len() < KEYS {
        let key = client_key(i);
        if guessed_digest(&key).0 & mask == 0 {
            keys.push(key);
        }
        i += 1;
    }
    keys
}

/// Nanoseconds per decision over `keys`, cycled.
fn store_round(keys: &[Vec<u8>]) -> f64 {
    let store = MemoryStore::new(100_000);
    let policy = Policy::gcra(60, Duration::from_secs(60)).expect("a valid policy");
    let start = Instant::now();
    for i in 0..DECISIONS {
        let key = &keys[i % keys.len()];
        black_box(store.decide_sync(key, &policy, 1, NOW).map(|d| d.allowed)).ok();
    }
    start.elapsed().as_nanos() as f64 / DECISIONS as f64
}

/// Nanoseconds per find-or-insert of the guessed digests of `keys`,
/// cycled, in a table placing them by their first half, as a shard does.
fn table_round(keys: &[Vec<u8>]) -> f64 {
    let digests: Vec<(u64, u64)> = keys.iter().map(|k| guessed_digest(k)).collect();
    let mut table: HashTable<(u64, u64)> = HashTable::new();
    let start = Instant::now();
    for i in 0..DECISIONS {
        let d = digests[i % digests.len()];
        let entry = table.entry(d.0, |v| *v == d, |v| v.0);
        black_box(entry.or_insert(d));
    }
    start.elapsed().as_nanos() as f64 / DECISIONS as f64
}

fn main() {
    let rounds = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .map(|n| n.parse().expect("--rounds N"))
        .unwrap_or(7);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "crafted_keys: {KEYS} keys, {DECISIONS} decisions a round, best of {rounds}; load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let crafting = Instant::now();
    let crafted = crafted_keys();
    let random: Vec<Vec<u8>> = (0..KEYS as u64)
        .map(|i| client_key(i.wrapping_mul(6_364_136_223_846_793_005) ^ 0xA5A5))
        .collect();
    println!(
        "crafted {KEYS} keys sharing {SHARED_BITS} low digest bits under the guessed key in {:.1?}",
        crafting.elapsed()
    );
    let mut best = [f64::MAX; 4];
    for _ in 0..rounds {
        let figures = [
            store_round(&random),
            store_round(&crafted),
            table_round(&random),
            table_round(&crafted),
        ];
        for (b, f) in best.iter_mut().zip(figures) {
            *b = b.min(f);
        }
    }
    println!("| contender | random keys, ns | crafted keys, ns | crafted ÷ random |");
    println!("|---|---:|---:|---:|");
    for (name, random, crafted) in [
        ("`MemoryStore` (its own secret key)", best[0], best[1]),
        ("table under the guessed key", best[2], best[3]),
    ] {
        println!(
            "| {name} | {random:.1} | {crafted:.1} | {:.2} |",
            crafted / random
        );
    }
}
