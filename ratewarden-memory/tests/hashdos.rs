//! HashDoS and shard targeting: the memory store places keys with a hash
//! keyed by a secret drawn per store, so nobody can compute, in advance,
//! keys that pile into one shard (to evict an offender with a flood of one
//! shard's capacity) or into one probe sequence.

use std::time::Duration;

use ratewarden_core::{ManualClock, Policy};
use ratewarden_memory::MemoryStore;

const SHARDS: usize = 256;

/// Inserts the same keys, in the same order, into a store with one key per
/// shard, and records after each whether it landed in a shard not used
/// before (the store grew) or evicted (it did not).
fn placement() -> Vec<bool> {
    let store = MemoryStore::builder()
        .capacity(SHARDS)
        .shards(SHARDS)
        .build()
        .unwrap();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let now = ManualClock::DEFAULT_START;
    let mut grew = Vec::with_capacity(SHARDS);
    for i in 0..SHARDS {
        let before = store.len();
        let key = format!("client:{i:032x}");
        store.decide_sync(key.as_bytes(), &policy, 1, now).unwrap();
        grew.push(store.len() > before);
    }
    grew
}

#[test]
fn shard_placement_differs_between_stores() {
    // With a fixed (unkeyed) hash all three patterns would be identical.
    // With independent secret keys, two 256-step patterns agree by chance
    // with a probability far below 1e-20.
    let (a, b, c) = (placement(), placement(), placement());
    // Not vacuous: some keys collided and some did not.
    assert!(a.iter().any(|g| *g) && a.iter().any(|g| !*g));
    assert!(
        a != b || b != c,
        "three stores placed 256 keys identically: the shard hash is not keyed per store"
    );
}
