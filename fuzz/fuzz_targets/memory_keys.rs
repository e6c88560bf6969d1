//! The key path into the memory store: arbitrary byte keys (empty, long,
//! binary, colliding prefixes) and requests, on a tiny single-shard store
//! that evicts all the time. Never panics, never holds more than its
//! capacity, and agrees with the reference model told to forget exactly the
//! (algorithm, key) an LRU of that size evicts.
#![no_main]

use std::collections::VecDeque;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use ratewarden_conformance::model::{Expected, Model};
use ratewarden_core::{Algorithm, Policy, Timestamp};
use ratewarden_memory::MemoryStore;

fuzz_target!(|data: &[u8]| {
    let Some((&cap, rest)) = data.split_first() else {
        return;
    };
    let cap = usize::from(cap % 8) + 1;
    let store = match MemoryStore::builder().capacity(cap).shards(1).build() {
        Ok(s) => s,
        Err(e) => panic!("capacity {cap} on one shard refused: {e}"),
    };
    let policies = [
        Policy::sliding_log(3, Duration::from_millis(10)),
        Policy::fixed_window(4, Duration::from_millis(7)),
        Policy::sliding_window(5, Duration::from_millis(13)),
        Policy::gcra(3, Duration::from_micros(10_001)),
    ]
    .map(|p| p.unwrap_or_else(|e| panic!("{e}")));
    let mut model = Model::new();
    let mut lru: VecDeque<(Algorithm, Vec<u8>)> = VecDeque::new();
    let mut now: u64 = 1_767_225_600_000_000;
    // Each request: [policy+cost, clock move, key length] then the key.
    let mut input = rest;
    while input.len() >= 3 {
        let (head, tail) = input.split_at(3);
        let len = usize::from(head[2]) * if head[2] > 250 { 40 } else { 1 };
        let (key, tail) = tail.split_at(len.min(tail.len()));
        input = tail;
        let policy = policies[usize::from(head[0] % 4)];
        let cost = u32::from(head[0] >> 2) % (policy.limit() + 1);
        let step = u64::from(head[1] & 0x7F) * 500;
        now = if head[1] & 0x80 != 0 {
            now - step
        } else {
            now + step
        };
        let at = Timestamp::from_micros(now);
        let got = store.decide_sync(key, &policy, cost, at);
        let want = model.decide(key, &policy, cost, at);
        match (got, want) {
            (Err(_), Err(_)) => continue,
            (Ok(got), Ok(want)) => {
                let pair = (policy.algorithm(), key.to_vec());
                assert_eq!(Expected::of(&got), want, "{policy} key {key:?} cost {cost}");
                match lru.iter().position(|p| *p == pair) {
                    Some(i) => {
                        lru.remove(i);
                    }
                    None if lru.len() == cap => {
                        // The LRU pair is gone from the store: the model forgets it too.
                        if let Some((algorithm, k)) = lru.pop_front() {
                            let p = policies.iter().find(|p| p.algorithm() == algorithm);
                            if let Some(p) = p {
                                model.forget(&k, p);
                            }
                        }
                    }
                    None => {}
                }
                lru.push_back(pair);
            }
            (got, want) => panic!("store {got:?} but model {want:?}"),
        }
        assert!(store.len() <= cap);
        assert_eq!(store.len(), lru.len());
    }
});
