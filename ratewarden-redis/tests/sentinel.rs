//! Redis Sentinel: a store built from a `redis+sentinel://` URL decides on
//! the master the sentinels name, and on the new one after a failover.

use ratewarden_conformance::call;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden_core::{ErrorKind, FailurePolicy, Limiter, Policy, Rule};
use ratewarden_redis::RedisStore;
use ratewarden_test_support::redis as fixture;

/// Generous, so that a call slowed by a busy machine is not a failure; the
/// paused master makes every call wait for it.
const TIMEOUT: Duration = Duration::from_secs(1);
const LIMIT: u32 = 100;
/// Admitted (and replicated) before the master stops answering.
const BEFORE: u32 = 60;
/// A bound on the wait for a failover, so that a store that never finds
/// the new master fails the test instead of hanging it. What a failover
/// takes is printed, not asserted.
const GIVE_UP: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_moves_decisions_to_the_new_master_without_over_admitting() {
    let group = fixture::start_sentinel_group().await;
    let store = Arc::new(
        RedisStore::builder(&group.url)
            .timeout(TIMEOUT)
            .build()
            .unwrap(),
    );
    let limiter = Limiter::builder()
        .rule(
            Rule::new(
                "api",
                store.clone(),
                Policy::fixed_window(LIMIT, Duration::from_secs(3_600)).unwrap(),
            )
            .unwrap()
            .with_timeout(TIMEOUT)
            .unwrap()
            .on_failure(FailurePolicy::Closed),
        )
        // The system clock: the rule's circuit breaker, which opens while no
        // master answers, lets a probe through after its cool-down in real
        // time.
        .build()
        .unwrap();
    let key = b"client";
    let mut admitted = 0;
    while admitted < BEFORE {
        // A call slower than the timeout is refused under the failure
        // policy and counts nothing; the master is healthy, so the next
        // one answers.
        let d = limiter.check(key).await;
        assert!(d.allowed || d.source.degraded, "{d:?}");
        admitted += u32::from(d.allowed);
    }
    // Redis replicates asynchronously: what the master admitted and had not
    // yet sent to its replica is lost with the failover (the bound the crate
    // docs state). Wait until the replica has it all, so that any admission
    // past the limit below is the store's doing.
    let mut admin = fixture::admin(&group.master_url).await;
    let replicas: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(replicas, 1, "the replica never acknowledged the admissions");

    // The master stops answering (its process frozen, its connections
    // open), as a host that hangs or drops off the network does.
    group.master.pause().await.unwrap();
    let paused = Instant::now();
    let mut during = 0;
    let mut slowest = Duration::ZERO;
    let recovered = loop {
        assert!(
            paused.elapsed() < GIVE_UP,
            "no decision from a new master {GIVE_UP:?} after the old one stopped \
             ({during} decisions under the failure policy)"
        );
        let asked = Instant::now();
        let d = limiter.check(key).await;
        slowest = slowest.max(asked.elapsed());
        if !d.source.degraded {
            break d;
        }
        // Failing closed: refused, never admitted, while no master answers.
        assert!(!d.allowed, "{d:?}");
        during += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let failover = paused.elapsed();
    let stats = limiter.rule("api").unwrap().stats();
    println!(
        "failover: the first decision from the new master {failover:?} after the old one \
         stopped; {during} decisions under the failure policy in between, the slowest \
         answer {slowest:?} (timeout {TIMEOUT:?}); {stats:?}"
    );
    // The count survived the failover: exactly the rest of the limit is
    // admitted, then refusals, all from the new master (a call the busy
    // machine slowed past the timeout is refused by the failure policy,
    // counts nothing, and is asked again).
    admitted += u32::from(recovered.allowed);
    loop {
        assert!(
            paused.elapsed() < GIVE_UP * 2,
            "the new master stopped answering"
        );
        let d = limiter.check(key).await;
        if d.source.degraded {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        if !d.allowed {
            break;
        }
        admitted += 1;
        assert!(
            admitted <= LIMIT,
            "admitted past the limit after the failover"
        );
    }
    assert_eq!(
        admitted, LIMIT,
        "the failover lost admissions the replica had"
    );
    // Where the decisions went: the replica is the master now and holds the
    // key's whole count.
    let mut new_master = fixture::admin(&group.replica_url).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE")
        .query_async(&mut new_master)
        .await
        .unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec()))
    );
    let storage_key = limiter.rule("api").unwrap().storage_key(key);
    let count: u32 = redis::cmd("HGET")
        .arg(store.redis_key(&storage_key, ratewarden_core::Algorithm::FixedWindow))
        .arg("n")
        .query_async(&mut new_master)
        .await
        .unwrap();
    assert_eq!(count, LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_that_do_not_answer_are_an_error_within_the_timeout() {
    // Ports nothing listens on: no sentinel, so no master.
    let ports = [fixture::free_port(false), fixture::free_port(false)];
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/mymaster",
        ports[0], ports[1]
    );
    let store = RedisStore::builder(url).timeout(TIMEOUT).build().unwrap();
    let policy = Policy::fixed_window(LIMIT, Duration::from_secs(60)).unwrap();
    let err = call::decide(
        &store,
        b"k",
        &policy,
        1,
        ratewarden_core::Timestamp::from_micros(1),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
}
