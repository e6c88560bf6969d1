//! The memory store against the reference model (`ratewarden_conformance::model`)
//! on random scripts of requests, keys, costs and clock moves (backwards
//! included): identical decisions, first with room for every key, then with
//! a key cap small enough to evict.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use ratewarden_conformance::model::{Expected, Model, Step};
use ratewarden_conformance::ratewarden_core::{Algorithm, ManualClock, Policy, Store, Timestamp};
use ratewarden_memory::MemoryStore;
use ratewarden_test_support::strategy::{policies, replay_case, replay_tiers_case, steps};

fn key(k: u8) -> Vec<u8> {
    format!("client:{k}").into_bytes()
}

/// Applies one step to the store and the model (the model first told to
/// forget what the store evicts, if `lru` tracks it); returns both answers.
fn step(
    store: &MemoryStore,
    model: &mut Model,
    policies: &[Policy; 4],
    s: &Step,
    now: &mut u64,
) -> (Expected, Expected, Policy, Vec<u8>) {
    *now = now.saturating_add_signed(s.advance_us);
    let policy = policies[s.policy % 4];
    let cost = 1 + s.cost % policy.limit();
    let k = key(s.key);
    let at = Timestamp::from_micros(*now);
    let got = Expected::of(
        &store
            .decide_sync(&k, &policy, cost, at)
            .expect("valid request"),
    );
    let want = model.decide(&k, &policy, cost, at).expect("valid cost");
    (got, want, policy, k)
}

/// How many moves a key of a shard of `capacity` keys may go without moving
/// again when touched: the rule the crate documents, written out here so the
/// store is checked against the spec rather than against itself.
fn reorder_after(capacity: usize) -> u64 {
    (capacity / 8).max(1) as u64
}

/// One shard's recency list as the crate docs describe it, plainly: a list
/// ordered by each key's last move to the back; a touch moves its key
/// unless it moved within the last `reorder_after(cap)` moves; a new key at
/// a full shard evicts the front.
struct Recency {
    list: VecDeque<((Algorithm, u8), u64)>,
    moves: u64,
    cap: usize,
}

impl Recency {
    fn new(cap: usize) -> Self {
        Recency {
            list: VecDeque::new(),
            moves: 0,
            cap,
        }
    }

    /// Touches `pair`; returns the pair evicted to make room for it, if any.
    fn touch(&mut self, pair: (Algorithm, u8)) -> Option<(Algorithm, u8)> {
        if let Some(at) = self.list.iter().position(|(p, _)| *p == pair) {
            if self.moves - self.list[at].1 >= reorder_after(self.cap) {
                self.list.remove(at);
                self.moves += 1;
                self.list.push_back((pair, self.moves));
            }
            return None;
        }
        let evicted = if self.list.len() == self.cap {
            self.list.pop_front().map(|(p, _)| p)
        } else {
            None
        };
        self.moves += 1;
        self.list.push_back((pair, self.moves));
        evicted
    }
}

/// Replays `steps` on one shard of `cap` keys and on the model told to
/// forget exactly what the recency rule evicts: every decision, the length
/// and the eviction count must agree.
fn capped_shard_follows_the_rule(
    cap: usize,
    policies: &[Policy; 4],
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let store = MemoryStore::builder()
        .capacity(cap)
        .shards(1)
        .build()
        .unwrap();
    let mut model = Model::new();
    let mut recency = Recency::new(cap);
    let mut evictions = 0u64;
    let mut now = ManualClock::DEFAULT_START.as_micros();
    for (i, s) in steps.iter().enumerate() {
        let pair = (policies[s.policy % 4].algorithm(), s.key);
        if let Some((algorithm, k)) = recency.touch(pair) {
            let evicted = policies
                .iter()
                .find(|p| p.algorithm() == algorithm)
                .expect("policy");
            model.forget(&key(k), evicted);
            evictions += 1;
        }
        let (got, want, policy, k) = step(&store, &mut model, policies, s, &mut now);
        prop_assert_eq!(
            got,
            want,
            "step {}: {} key {:?}",
            i,
            policy,
            String::from_utf8_lossy(&k)
        );
        prop_assert_eq!(store.len(), recency.list.len());
        prop_assert_eq!(store.evictions(), evictions);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Room for every key: the store is the model, decision for decision.
    #[test]
    fn memory_store_agrees_with_model(policies in policies(), steps in steps(4, 120)) {
        let store = MemoryStore::builder().capacity(1_000).build().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        replay_case(&rt, &store, &policies, &steps, key)?;
    }

    /// One shard of `cap` keys evicts exactly what the documented recency
    /// rule evicts, over (algorithm, key) pairs touched by every request,
    /// admitted or refused: an exact LRU below 16 keys, a key moved only
    /// when it has not moved in the last `cap / 8` moves above. The model,
    /// told to forget exactly the pair the rule evicts, agrees on every
    /// decision, and the store's length and eviction count are the rule's.
    #[test]
    fn capped_single_shard_store_is_the_model_with_the_documented_eviction(
        cap in prop_oneof![1usize..=6, 16usize..=40],
        policies in policies(),
        steps in steps(24, 400),
    ) {
        capped_shard_follows_the_rule(cap, &policies, &steps)?;
    }

    /// The same over one policy and a couple of keys more than the shard
    /// holds, so that most touches hit a held key and move it: each move
    /// leaves a stale record in the shard's move queue, which its
    /// compaction must drop without losing a live one.
    #[test]
    fn capped_shard_churning_its_own_keys_evicts_by_the_rule(
        (cap, steps) in (2usize..=24).prop_flat_map(|cap| (Just(cap), steps(cap as u8 + 2, 600))),
        policies in policies(),
    ) {
        capped_shard_follows_the_rule(cap, &[policies[0]; 4], &steps)?;
    }

    /// The guarantee the crate documents, checked without knowing how the
    /// store evicts: with `n` shards of `per` keys each, a key touched again
    /// while at most `per − max(1, per / 8)` distinct other keys were
    /// touched is never forgotten. Hot keys are touched in turn with fresh
    /// keys between them, as many as that bound allows, until four times the
    /// capacity has been touched: every shard overflows and evicts, and every
    /// decision on a hot key still agrees with a model that never evicts.
    #[test]
    fn sharded_store_never_forgets_a_recently_touched_key(
        shards in 1usize..=4,
        per in prop_oneof![2usize..=6, 16usize..=28],
        policies in policies(),
        moves in steps(1, 64),
    ) {
        let cap = shards * per;
        let store = MemoryStore::builder().capacity(cap).shards(shards).build().unwrap();
        let mut model = Model::new();
        // Between two touches of a hot key: the other hot keys and a round
        // of fresh ones, `safe` distinct keys in all.
        let safe = per - reorder_after(per) as usize;
        let hot = (safe / 2).max(1);
        let fresh_per_round = safe - (hot - 1);
        let rounds = 4 * cap / fresh_per_round + 2;
        let mut now = ManualClock::DEFAULT_START.as_micros();
        let mut fresh = 0usize;
        let mut compared = 0usize;
        for round in 0..rounds {
            for h in 0..hot {
                let m = &moves[(round * hot + h) % moves.len()];
                let s = Step { key: h as u8, policy: h % 4, cost: m.cost, advance_us: m.advance_us };
                let (got, want, policy, k) = step(&store, &mut model, &policies, &s, &mut now);
                prop_assert_eq!(got, want, "round {}: {} hot key {:?}", round, policy, String::from_utf8_lossy(&k));
                compared += usize::from(round > 0);
            }
            for _ in 0..fresh_per_round {
                let policy = policies[fresh % 4];
                let k = format!("fresh:{fresh}").into_bytes();
                let at = Timestamp::from_micros(now);
                let got = Expected::of(&store.decide_sync(&k, &policy, 1, at).expect("valid request"));
                let want = model.decide(&k, &policy, 1, at).expect("valid cost");
                prop_assert_eq!(got, want, "fresh key {}", fresh);
                fresh += 1;
                prop_assert!(store.len() <= cap, "{} keys held, capacity {}", store.len(), cap);
            }
        }
        prop_assert_eq!(compared, (rounds - 1) * hot);
        // Every key past the capacity evicted one: the shards did overflow.
        let distinct = hot + fresh;
        prop_assert!(
            store.evictions() as usize >= distinct - cap,
            "{} evictions for {} keys in {}", store.evictions(), distinct, cap
        );
    }
}

/// The exact-LRU property above is not vacuous: a tiny store does evict, and
/// a model that is not told about it disagrees.
#[test]
fn eviction_is_visible_to_the_model() {
    let store = MemoryStore::builder()
        .capacity(1)
        .shards(1)
        .build()
        .unwrap();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let t0 = ManualClock::DEFAULT_START;
    let mut model = Model::new();
    for k in [b"a", b"b", b"a"] {
        let got = Expected::of(&store.decide_sync(k, &policy, 1, t0).unwrap());
        let want = model.decide(k, &policy, 1, t0).unwrap();
        if k == b"a" && !want.allowed {
            // "a" was evicted by "b": the store forgot it, the model did not.
            assert!(got.allowed);
            assert_eq!(store.evictions(), 2);
            return;
        }
        assert_eq!(got, want);
    }
    panic!("the model never refused the second request of \"a\"");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// A `Limiter` of two or three memory tiers decides as the composition
    /// model does: refusals by a later tier are refunded in earlier ones.
    #[test]
    fn limiter_of_memory_tiers_agrees_with_the_model(
        policies in policies(),
        picks in prop::collection::vec((0usize..4, 0u32..6), 2..=3),
        steps in prop::collection::vec((0u8..3, prop_oneof![3 => Just(0u64), 4 => 0u64..=3_000, 2 => 0u64..=45_000]), 1..120),
    ) {
        let tiers: Vec<(Policy, u32)> = picks
            .iter()
            .map(|&(p, cost)| (policies[p], 1 + cost % policies[p].limit()))
            .collect();
        let stores: Vec<Arc<dyn Store>> = tiers
            .iter()
            .map(|_| Arc::new(MemoryStore::new(1_000)) as Arc<dyn Store>)
            .collect();
        replay_tiers_case(&stores, &tiers, &steps)?;
    }
}
