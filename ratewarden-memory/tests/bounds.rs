//! The memory store's bounds: a hard key cap under a flood, the per-shard
//! LRU guarantee for an offender touched only by refused requests, and
//! exactness under concurrency.

use ratewarden_conformance::call;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ratewarden_core::{Algorithm, ManualClock, Policy, Store, Timestamp};
use ratewarden_memory::MemoryStore;

const T0: Timestamp = ManualClock::DEFAULT_START;

fn hour_window(limit: u32) -> Policy {
    Policy::fixed_window(limit, Duration::from_secs(3600)).unwrap()
}

fn flood_key(i: u64) -> [u8; 13] {
    let mut key = *b"flood\0\0\0\0\0\0\0\0";
    key[5..].copy_from_slice(&i.to_le_bytes());
    key
}

/// Puts the offender at its limit; returns the policy it is limited by.
fn limit_offender(store: &MemoryStore) -> Policy {
    let policy = hour_window(3);
    for _ in 0..3 {
        assert!(
            store
                .decide_sync(b"offender", &policy, 1, T0)
                .unwrap()
                .allowed
        );
    }
    policy
}

fn offender_refused(store: &MemoryStore, policy: &Policy) -> bool {
    !store
        .decide_sync(b"offender", policy, 1, T0)
        .unwrap()
        .allowed
}

#[test]
fn a_flood_of_a_million_keys_never_exceeds_the_cap() {
    // 16 shards do not divide 1_000: 8 shards hold 63 keys and 8 hold 62, so
    // rounding every shard up would show here as 1_008 keys.
    let store = MemoryStore::builder()
        .capacity(1_000)
        .shards(16)
        .build()
        .unwrap();
    let policy = hour_window(10);
    let mut max_len = 0;
    for i in 0..1_000_000u64 {
        let decision = store.decide_sync(&flood_key(i), &policy, 1, T0).unwrap();
        assert!(decision.allowed, "key {i} is fresh");
        if (i + 1) % 1_000 == 0 {
            let len = store.len();
            assert!(len <= 1_000, "{len} keys held after {} inserts", i + 1);
            assert_eq!(
                store.evictions(),
                i + 1 - len as u64,
                "after {} inserts",
                i + 1
            );
            max_len = max_len.max(len);
        }
    }
    // The per-shard capacities sum to the cap exactly, so a long flood fills
    // every shard: all 1_000 slots are used, never more.
    assert_eq!(max_len, 1_000);
    assert_eq!(store.len(), 1_000);
    assert_eq!(store.evictions(), 999_000);
}

/// One shard is an exact LRU: a key survives exactly as long as fewer than
/// `capacity` other distinct keys arrive between its touches.
#[test]
fn one_shard_is_an_exact_lru_over_refused_touches() {
    const CAP: u64 = 1_000;
    let store = MemoryStore::builder()
        .capacity(CAP as usize)
        .shards(1)
        .build()
        .unwrap();
    let policy = limit_offender(&store);
    let flood = hour_window(1);
    let mut next = 0u64;
    // 100 rounds of `CAP - 1` fresh keys, each round followed by a refused
    // request from the offender: it must never be evicted.
    for round in 0..100 {
        for _ in 0..CAP - 1 {
            store.decide_sync(&flood_key(next), &flood, 1, T0).unwrap();
            next += 1;
        }
        assert!(
            offender_refused(&store, &policy),
            "offender evicted in round {round} after only {} distinct keys",
            CAP - 1
        );
    }
    assert!(store.evictions() > 90_000);
    // One more key than that between touches, and it is evicted: the bound
    // above is exact, and the test would notice a store that never evicts.
    for _ in 0..CAP {
        store.decide_sync(&flood_key(next), &flood, 1, T0).unwrap();
        next += 1;
    }
    assert!(
        !offender_refused(&store, &policy),
        "the offender should have been the least recently touched key"
    );
}

/// With 4 shards of 250 keys, an offender touched every 50 keys can never
/// see 250 other keys of its shard between touches, however the hash falls.
#[test]
fn sharded_store_keeps_an_offender_touched_every_50_keys() {
    let store = MemoryStore::builder()
        .capacity(1_000)
        .shards(4)
        .build()
        .unwrap();
    let policy = limit_offender(&store);
    // A second offender at its limit that stops sending: the flood must
    // evict it, which shows the flood does reach every shard.
    let quiet = hour_window(1);
    assert!(store.decide_sync(b"quiet", &quiet, 1, T0).unwrap().allowed);
    let flood = hour_window(1);
    for i in 0..100_000u64 {
        store.decide_sync(&flood_key(i), &flood, 1, T0).unwrap();
        if i % 50 == 49 {
            assert!(
                offender_refused(&store, &policy),
                "offender evicted after {} flood keys",
                i + 1
            );
        }
    }
    assert!(store.len() <= 1_000);
    assert!(store.evictions() >= 99_000);
    assert!(
        store.decide_sync(b"quiet", &quiet, 1, T0).unwrap().allowed,
        "a key nobody touched should have been evicted by the flood"
    );
}

/// Two OS threads, many tasks, one key: exactly `limit` admissions for
/// every algorithm, through the `Store` trait object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_on_one_key_are_admitted_exactly_limit_times() {
    const LIMIT: u32 = 100;
    const TASKS: usize = 400;
    const PER_TASK: usize = 5;
    for algorithm in Algorithm::ALL {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(1_000));
        let policy = Policy::new(algorithm, LIMIT, Duration::from_secs(3600)).unwrap();
        let admitted = Arc::new(AtomicU32::new(0));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let (store, admitted) = (store.clone(), admitted.clone());
                tokio::spawn(async move {
                    for _ in 0..PER_TASK {
                        let d = call::decide(&store, b"hot", &policy, 1, T0).await.unwrap();
                        if d.allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(admitted.load(Ordering::Relaxed), LIMIT, "{algorithm}");
    }
}

/// The same on plain OS threads hitting the synchronous path, where the two
/// threads really do race for one shard lock.
#[test]
fn racing_threads_on_one_key_are_admitted_exactly_limit_times() {
    const LIMIT: u32 = 1_000;
    for algorithm in Algorithm::ALL {
        let store = MemoryStore::builder()
            .capacity(16)
            .shards(2)
            .build()
            .unwrap();
        let policy = Policy::new(algorithm, LIMIT, Duration::from_secs(3600)).unwrap();
        let admitted = AtomicU32::new(0);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..LIMIT {
                        if store.decide_sync(b"hot", &policy, 1, T0).unwrap().allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), LIMIT, "{algorithm}");
    }
}
