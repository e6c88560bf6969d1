//! A policy's ban through a `Limiter`: the store bans, the limiter passes
//! its refusals on, counts them, and repeats only a ban's refusals from its
//! refusal cache (every other refusal must reach the store, which counts
//! it toward the ban); stores that keep no bans are refused at build.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_core::lease::{LeaseConfig, LeasedStore};
use ratewarden_core::{Ban, ConfigError, Limiter, ManualClock, Policy, Rule, Store};

const MINUTE: Duration = Duration::from_secs(60);

/// Two a minute; the second refusal within a minute bans for ten.
fn banning() -> Policy {
    Policy::fixed_window(2, MINUTE)
        .unwrap()
        .with_ban(Ban::new(2, MINUTE, 10 * MINUTE).unwrap())
}

#[tokio::test]
async fn a_shared_stores_refusal_cache_repeats_only_the_bans_refusals() {
    let clock = ManualClock::new();
    // Shared: its rule keeps a refusal cache.
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100).shared_as("shared"));
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(Rule::new("login", store, banning()).unwrap())
        .build()
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..10 {
        let d = limiter.check(b"guesser").await;
        seen.push((d.allowed, d.source.banned, d.source.cached, d.retry_after));
    }
    assert_eq!(&seen[..2], [(true, false, false, Duration::ZERO); 2]);
    // The first refusal went to the store and was not cached, so that the
    // second could reach it and start the ban.
    assert_eq!(seen[2], (false, false, false, MINUTE));
    assert_eq!(seen[3], (false, true, false, 10 * MINUTE));
    for (i, s) in seen.iter().enumerate().skip(4) {
        assert_eq!(*s, (false, true, true, 10 * MINUTE), "request {i}");
    }
    let stats = &limiter.stats()[0];
    assert_eq!((stats.refused, stats.refusals_cached), (8, 6));
    // A reset lifts the ban, the cached one included.
    limiter.reset(b"guesser").await.unwrap();
    assert!(limiter.check(b"guesser").await.allowed);
    // The ban ends on time for a key left banned.
    for _ in 0..4 {
        limiter.check(b"other").await;
    }
    clock.advance(10 * MINUTE - Duration::from_micros(1));
    assert!(limiter.check(b"other").await.source.banned);
    clock.advance(Duration::from_micros(1));
    assert!(limiter.check(b"other").await.allowed);
}

#[tokio::test]
async fn stores_that_keep_no_bans_refuse_a_banning_policy_when_the_rule_is_built() {
    let no_bans: Arc<dyn Store> = Arc::new(ratewarden_conformance::broken::ReferenceStore::new(10));
    assert!(no_bans.capabilities().bans);
    let leased: Arc<dyn Store> = Arc::new(LeasedStore::new(no_bans, LeaseConfig::new(8).unwrap()));
    let err = Rule::new("login", leased, banning()).unwrap_err();
    assert!(
        matches!(err, ConfigError::UnsupportedBan { store: "leased" }),
        "{err}"
    );
    assert!(err.to_string().contains("does not keep bans"), "{err}");
}
