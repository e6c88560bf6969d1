//! The key layout of the crate docs, checked with the operator's tools: the
//! key a `Limiter` rule writes for a client is the documented one, printable,
//! and `redis-cli` (run inside the server's container) lists, inspects and
//! deletes it by that name.

use std::sync::Arc;
use std::time::Duration;

use ratewarden_core::{Algorithm, Limiter, ManualClock, Policy, Rule};
use ratewarden_redis::{DEFAULT_EXPIRY_MARGIN, RedisStore};
use ratewarden_test_support::redis as fixture;

const CLIENT: &[u8] = b"0123456789abcdef0123456789abcdef";
/// Copied from the crate docs (`# Keys`), not computed.
const DOCUMENTED: &str =
    "ratewarden:{af69f0a632b605e9}:log:search:0123456789abcdef0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_state_is_the_documented_key_and_redis_cli_deletes_it() {
    // A server of its own and the default prefix: `--scan` may print
    // nothing but what these decisions wrote.
    let (container, url) = fixture::start_redis().await;
    let store = Arc::new(
        RedisStore::builder(&url)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    );
    let window = Duration::from_secs(60);
    let limiter = Limiter::builder()
        .rule(
            Rule::new(
                "search",
                store.clone(),
                Policy::sliding_log(3, window).unwrap(),
            )
            .unwrap(),
        )
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let storage_key = limiter.rule("search").unwrap().storage_key(CLIENT);
    assert_eq!(
        store.redis_key(&storage_key, Algorithm::SlidingLog),
        DOCUMENTED.as_bytes()
    );

    for remaining in [2, 1] {
        let d = limiter.check(CLIENT).await;
        assert!(d.allowed && !d.source.degraded, "{d:?}");
        assert_eq!(d.remaining, remaining);
    }

    let all = fixture::redis_cli(&container, &["--scan", "--pattern", "*"]).await;
    assert_eq!(all, format!("{DOCUMENTED}\n"), "every key on the server");
    let pattern = "ratewarden:*:search:0123456789abcdef0123456789abcdef";
    let listed = fixture::redis_cli(&container, &["--scan", "--pattern", pattern]).await;
    assert_eq!(listed, format!("{DOCUMENTED}\n"), "the documented pattern");
    let name = listed.trim_end_matches('\n');
    assert!(name.bytes().all(|b| b.is_ascii_graphic()), "{name:?}");

    let kind = fixture::redis_cli(&container, &["TYPE", name]).await;
    assert_eq!(kind, "list\n");
    let ttl: u128 = fixture::redis_cli(&container, &["PTTL", name])
        .await
        .trim()
        .parse()
        .expect("PTTL of a key with an expiry is a positive number");
    let bound = (window + DEFAULT_EXPIRY_MARGIN).as_millis();
    assert!(ttl > 0 && ttl <= bound, "PTTL {ttl} not in (0, {bound}]");

    let deleted = fixture::redis_cli(&container, &["DEL", name]).await;
    assert_eq!(deleted, "1\n");
    let left = fixture::redis_cli(&container, &["--scan", "--pattern", "*"]).await;
    assert_eq!(left, "");

    // Without the DEL this decision would leave 0 of 3: the quota is fresh.
    let d = limiter.check(CLIENT).await;
    assert!(d.allowed && !d.source.degraded, "{d:?}");
    assert_eq!(d.remaining, 2, "a fresh quota after DEL");
}
