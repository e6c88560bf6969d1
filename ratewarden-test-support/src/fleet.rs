//! A fleet of instances on one shared store, as the notice tests drive it:
//! each instance a `Limiter` of one rule in front of a store object of its
//! own, so that what one instance does reaches another only through the
//! store.

use std::time::{Duration, Instant};

use ratewarden_core::Limiter;

/// Far longer than a notice takes on any machine: reached, a test fails as
/// a notice that never came.
pub const NEVER: Duration = Duration::from_secs(10);

/// How many of `n` requests for `key`, round robin over `fleet`, are
/// admitted.
pub async fn admitted(fleet: &[Limiter], key: &[u8], n: usize) -> u32 {
    let mut admitted = 0;
    for limiter in fleet.iter().cycle().take(n) {
        admitted += u32::from(limiter.check(key).await.allowed);
    }
    admitted
}

/// Spends the key's `limit` (each instance's first rule's) and has every
/// instance refuse it once more from its refusal cache; panics otherwise,
/// since a test of what reaches those caches would then prove nothing.
pub async fn lock_out(fleet: &[Limiter], key: &[u8], limit: u32) {
    assert_eq!(
        admitted(fleet, key, 4 * fleet.len()).await,
        limit,
        "the fleet admits the limit"
    );
    for (i, limiter) in fleet.iter().enumerate() {
        let cached = limiter.stats()[0].refusals_cached;
        assert!(!limiter.check(key).await.allowed);
        assert_eq!(
            limiter.stats()[0].refusals_cached,
            cached + 1,
            "instance {i} must refuse from its refusal cache, or the test proves nothing"
        );
    }
}

/// How long after `since` each instance other than `from` stopped refusing
/// `key`: a peek answers from the refusal cache while it holds a refusal,
/// and spends nothing. Polled every 0.2 ms, instances in turn, so each
/// figure is an upper bound. Panics after [`NEVER`].
pub async fn heard(fleet: &[Limiter], key: &[u8], from: usize, since: Instant) -> Vec<Duration> {
    let mut delays = Vec::new();
    for (i, limiter) in fleet.iter().enumerate() {
        if i == from {
            continue;
        }
        loop {
            if limiter.peek(key).await.allowed {
                delays.push(since.elapsed());
                break;
            }
            assert!(
                since.elapsed() < NEVER,
                "instance {i} still refuses the key {NEVER:?} after a reset on instance {from}"
            );
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    delays
}

/// Prints the delays' p50, p99 and maximum under `what`: figures for the
/// record (`--no-capture`), never asserted.
pub fn report(what: &str, mut delays: Vec<Duration>) {
    if delays.is_empty() {
        println!("{what}: no notices");
        return;
    }
    delays.sort();
    let at = |p: f64| delays[((delays.len() - 1) as f64 * p).round() as usize];
    println!(
        "{what}: {} notices, p50 {:?}, p99 {:?}, max {:?}",
        delays.len(),
        at(0.50),
        at(0.99),
        delays[delays.len() - 1]
    );
}
