//! The README's composition snippets, compiled and run: tiers (a memory tier
//! in front of a shared one) and leased quotas.
//!
//! Memory stores stand in for Postgres and Redis, so this runs without a
//! server; `ratewarden::store::from_url("postgres://…")` or `("redis://…")`
//! gives the real ones, and nothing else changes.
//!
//! Run with `cargo run -p ratewarden --features memory --example compositions`.

use std::sync::Arc;
use std::time::Duration;

use ratewarden::memory::MemoryStore;
use ratewarden::{Limiter, Policy, Rule, Store};

// Unformatted: the README quotes these lines as they are.
#[rustfmt::skip]
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));
    let postgres: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));
    let redis: Arc<dyn Store> = Arc::new(MemoryStore::new(100_000));

    let search = Limiter::builder()
        .rule(Rule::new("burst", memory.clone(), Policy::sliding_log(12, Duration::from_secs(300))?)?)
        .rule(Rule::new("hourly", postgres.clone(), Policy::sliding_log(40, Duration::from_secs(3600))?)?)
        .build()?;
    // A request refused by "hourly" is refunded in "burst": one extra round trip, on refusals only.

    let admitted = {
        let mut n = 0;
        for _ in 0..20 {
            n += u32::from(search.check(b"client:1").await.allowed);
        }
        n
    };
    println!("tiers: {admitted} of 20 admitted (the burst tier allows 12 per 5 minutes)");

    use ratewarden::lease::{LeaseConfig, LeasedStore};
    let leased: Arc<dyn Store> = Arc::new(LeasedStore::new(redis.clone(), LeaseConfig::new(32)?));
    let api = Limiter::builder()
        .rule(Rule::new("api", leased, Policy::fixed_window(10_000, Duration::from_secs(60))?)?)
        .build()?;
    // Steady traffic: batches of 1, 2, 4, 8, 16, then 32 — about one Redis call per 32 requests.

    for _ in 0..1_000 {
        assert!(api.check(b"tenant:7").await.allowed);
    }
    println!("leases: 1,000 of 1,000 admitted");
    Ok(())
}
