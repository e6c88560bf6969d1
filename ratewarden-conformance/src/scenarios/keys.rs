//! `key_independence` and `hostile_keys`: a key is data, and one key's
//! traffic is its own.

use crate::call;
use ratewarden_core::{Algorithm, Policy};

use crate::support::{Expect, Probe, S, check, evidence, fail, num, policy, refuse, show_key};
use crate::{Failure, ScenarioResult, StoreFactory};

/// How a key exhausted at T0 (L = 3, W = 60 s) is refused `secs` seconds
/// later.
fn exhausted_refusal(algorithm: Algorithm, secs: u64) -> Expect {
    let t = secs * S;
    match algorithm {
        // Newest and oldest entries (or the window's opening) are at T0.
        Algorithm::SlidingLog | Algorithm::FixedWindow => refuse(0, 60 * S - t, 60 * S - t),
        // cur = 3 in [0, 60 s): resets at 120 s; a unit fits in the next
        // window once 3·(W − e) ≤ 2·W, e = 20 s: at 80 s.
        Algorithm::SlidingWindow => refuse(0, 120 * S - t, 80 * S - t),
        // T = 20 s, tat = 60 s; one more would make it 80 s, 20 s past the
        // 60 s burst.
        Algorithm::Gcra => refuse(0, 60 * S - t, 20 * S - t),
    }
}

/// Sends `limit` requests and one more at the current time, failing unless
/// they are admitted with `remaining` counting down to zero, then refused.
async fn exhaust(probe: &Probe, key: &[u8], p: &Policy, who: &str) -> Result<(), Failure> {
    let limit = p.limit();
    for i in 0..limit {
        let d = probe.hit(key, p, 1).await?;
        let want = limit - 1 - i;
        if !d.allowed || d.remaining != want {
            return fail(format!(
                "{}: request {} of {limit} on {who} (key {}) must be admitted with {want} remaining \
                 (a key no other request has touched); the store answered {}, remaining {}",
                p.algorithm(),
                i + 1,
                show_key(key),
                if d.allowed { "admitted" } else { "refused" },
                d.remaining
            ));
        }
    }
    let d = probe.hit(key, p, 1).await?;
    if d.allowed {
        return fail(format!(
            "{}: request {} on {who} (key {}) admitted; the limit is {limit}",
            p.algorithm(),
            limit + 1,
            show_key(key)
        ));
    }
    Ok(())
}

pub(crate) async fn key_independence(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    // A bounded store may legitimately evict alice once more keys than it
    // holds came after her: stay within its capacity.
    let others = match probe.store.capabilities().key_capacity {
        Some(cap) => cap.saturating_sub(1).min(64),
        None => 64,
    };
    let mut parts = Vec::new();
    for algorithm in algorithms {
        let p = policy(algorithm, 3, 60 * S)?;
        let alice = format!("independence/{algorithm}/alice");
        probe.at(0);
        exhaust(&probe, alice.as_bytes(), &p, "alice").await?;
        probe.at(S);
        let d = probe.hit(alice.as_bytes(), &p, 1).await?;
        check(
            &d,
            exhausted_refusal(algorithm, 1),
            &p,
            "alice, exhausted at t0, at t0+1 s",
        )?;
        // Keys that a store bucketing keys by a short hash would put with
        // alice: 64 of them leave almost no bucket empty.
        probe.at(2 * S);
        for i in 0..others {
            let other = format!("independence/{algorithm}/user-{i}");
            exhaust(&probe, other.as_bytes(), &p, &format!("user-{i}")).await?;
        }
        probe.at(3 * S);
        let d = probe.hit(alice.as_bytes(), &p, 1).await?;
        check(
            &d,
            exhausted_refusal(algorithm, 3),
            &p,
            &format!("alice at t0+3 s, after {others} other keys were exhausted"),
        )?;
        parts.push(format!(
            "{algorithm}: {others} keys each admitted exactly 3 times beside an exhausted key, \
             whose refusal stayed exact"
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

/// The hostile keys, named. Pairs that a normalising store would merge sit
/// next to each other.
fn hostile() -> Vec<(&'static str, Vec<u8>)> {
    let long = vec![b'k'; 10 * 1024];
    let mut long_other = long.clone();
    long_other[10 * 1024 - 1] = b'j';
    let long_prefix = long[..10 * 1024 - 1].to_vec();
    vec![
        ("the empty key", Vec::new()),
        ("a 10 KB key", long),
        ("a 10 KB key differing in its last byte", long_other),
        ("the 10 KB key minus its last byte", long_prefix),
        ("a short key", b"user:1".to_vec()),
        ("a key it is a prefix of", b"user:10".to_vec()),
        ("newlines", b"line1\nline2\r\n".to_vec()),
        ("quotes", b"'\"`".to_vec()),
        ("SQL", b"'; DROP TABLE x; --".to_vec()),
        ("Lua", b"]]..redis.call('FLUSHALL')..[[".to_vec()),
        ("a {hash} tag", b"{hash}tag".to_vec()),
        (
            "another key with the same {hash} tag",
            b"{hash}other".to_vec(),
        ),
        ("a NUL byte", b"a\0b".to_vec()),
        ("the part before the NUL byte", b"a".to_vec()),
        ("a lone NUL byte", b"\0".to_vec()),
        ("invalid UTF-8", b"\xff\xfe".to_vec()),
        ("other invalid UTF-8", b"\xfe\xff".to_vec()),
        ("non-ASCII", "ключ-🔑-鍵".as_bytes().to_vec()),
        ("a glob", b"*".to_vec()),
        ("format directives", b"%s%n%d".to_vec()),
        ("a space", b" ".to_vec()),
        ("JSON", br#"{"k":[1,2]}"#.to_vec()),
    ]
}

pub(crate) async fn hostile_keys(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let keys = hostile();
    let capacity = probe.store.capabilities().key_capacity;
    let mut parts = Vec::new();
    for algorithm in &algorithms {
        let p = policy(*algorithm, 2, 60 * S)?;
        probe.at(0);
        for (i, (name, key)) in keys.iter().enumerate() {
            // Each key must be fresh: any state here came from an earlier
            // key the store confused it with.
            exhaust(&probe, key, &p, name).await.map_err(|f| {
                Failure(format!(
                    "{f} (hostile key #{} of {}; {} keys before it were exhausted)",
                    i + 1,
                    keys.len(),
                    i
                ))
            })?;
        }
        // And each kept its own state, if the store can hold them all.
        if capacity.is_some_and(|cap| cap < keys.len()) {
            continue;
        }
        probe.at(S);
        for (name, key) in &keys {
            let d = probe.hit(key, &p, 1).await?;
            if d.allowed {
                return fail(format!(
                    "{algorithm}: {name} (key {}) was admitted a third time within its window: \
                     its state was lost or overwritten by another key",
                    show_key(key)
                ));
            }
        }
    }
    if !algorithms.is_empty() {
        let bytes: usize = keys.iter().map(|(_, k)| k.len()).sum();
        parts.push(format!(
            "{} hostile keys ({} bytes in all; empty, 10 KB, SQL, Lua, NUL, invalid UTF-8, …) \
             × {} algorithms: all valid and distinct, each admitted exactly 2 times",
            keys.len(),
            num(bytes as u64),
            algorithms.len()
        ));
    }
    if capacity.is_some_and(|cap| cap < keys.len()) {
        parts.push(format!(
            "not re-checked at the end: the store holds fewer than {} keys",
            keys.len()
        ));
    }
    parts.extend(skipped);
    evidence(parts)
}

/// The longest bound the scenario checks: a store may well accept more, but
/// a bound this large no longer bounds what one key costs.
const LARGEST_CHECKED_BOUND: usize = 1 << 20;

pub(crate) async fn key_length_bound(factory: &dyn StoreFactory) -> ScenarioResult {
    let probe = Probe::new(factory).await?;
    let store = probe.store.name();
    let max = probe.store.max_key_len();
    if max > LARGEST_CHECKED_BOUND {
        return fail(format!(
            "the {store} store declares a key-length bound of {} bytes; at most {} is checked \
             and useful",
            num(max as u64),
            num(LARGEST_CHECKED_BOUND as u64)
        ));
    }
    let (algorithms, skipped) = probe.supported(&Algorithm::ALL);
    let Some(&algorithm) = algorithms.first() else {
        return fail("scenario bug: no supported algorithm");
    };
    let p = policy(algorithm, 2, 60 * S)?;
    let longest = vec![b'k'; max];
    let d = probe.hit(&longest, &p, 1).await?;
    if !d.allowed || d.remaining != 1 {
        return fail(format!(
            "{algorithm}: a key of exactly {} bytes (the declared bound) must be valid and \
             admitted with 1 left; got {d:?}",
            num(max as u64)
        ));
    }
    // A sibling of the same length, differing in its last byte only: a
    // store that cut keys short of its own bound would merge the two.
    let mut sibling = longest.clone();
    sibling[max - 1] = b'j';
    let other = probe.hit(&sibling, &p, 1).await?;
    if !other.allowed || other.remaining != 1 {
        return fail(format!(
            "{algorithm}: two keys of {} bytes differing in their last byte must be distinct: \
             the second's first request must leave 1; got {other:?}",
            num(max as u64)
        ));
    }
    let again = probe.hit(&longest, &p, 1).await?;
    if !again.allowed || again.remaining != 0 {
        return fail(format!(
            "{algorithm}: the {}-byte key must have its second unit; got {again:?}",
            num(max as u64)
        ));
    }
    call::reset(&probe.store, &longest, &p).await.map_err(|e| {
        Failure(format!(
            "{algorithm}: reset of a key of exactly the declared bound failed: {e}"
        ))
    })?;
    let reset = probe.hit(&longest, &p, 1).await?;
    if !reset.allowed || reset.remaining != 1 {
        return fail(format!(
            "{algorithm}: after a reset the {}-byte key must admit its whole limit again; got \
             {reset:?}",
            num(max as u64)
        ));
    }
    let mut parts = vec![format!(
        "{algorithm}: keys of exactly {} bytes (the declared bound) valid, distinct to their \
         last byte and reset, for {}",
        num(max as u64),
        probe.decided_by(),
    )];
    parts.extend(skipped);
    evidence(parts)
}
