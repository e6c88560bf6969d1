//! A login route that counts only its failures (`count_only`): hammered by
//! many tasks with a mix of right and wrong passwords, it counts exactly the
//! wrong ones, on a store answered inline, one awaited, and Redis; and a
//! burst of right passwords, refused while in flight, leaves no lockout
//! behind in the refusal cache of Redis and Postgres rules.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
#[cfg(feature = "axum")]
use axum::extract::ConnectInfo;
use axum::routing::post;
use http::{HeaderMap, Request, StatusCode};
use ratewarden::{ClientIdentity, Limiter, ManualClock, Policy, RateLimitLayer, Rule, Store};
use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Switch;
use tower::ServiceExt;

const LIMIT: u32 = 100;
const TASKS: usize = 16;
const PER_TASK: usize = 12;
/// Every third attempt has the wrong password.
const WRONG_EVERY: usize = 3;

fn login(store: Arc<dyn Store>, clock: &ManualClock) -> (Router, Limiter) {
    login_limited(store, clock, LIMIT)
}

fn login_limited(store: Arc<dyn Store>, clock: &ManualClock, limit: u32) -> (Router, Limiter) {
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "login",
                store,
                Policy::fixed_window(limit, Duration::from_secs(900)).unwrap(),
            )
            .unwrap()
            // A burst of 50 on a loaded two-core machine can take a
            // networked store past the default 250 ms; a refund that times
            // out stays counted (the strict side), which is not what these
            // tests count.
            .with_timeout(Duration::from_secs(10))
            .unwrap(),
        )
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter.clone(), ClientIdentity::new([7u8; 32]).unwrap())
        .count_only(|status| status == StatusCode::UNAUTHORIZED)
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/login",
            post(|headers: HeaderMap| async move {
                if headers.get("x-password").is_some_and(|p| p == "right") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(layer);
    (app, limiter)
}

async fn attempt(app: &Router, password: &str) -> StatusCode {
    let mut request = Request::post("/login")
        .header("x-password", password)
        .body(Body::empty())
        .unwrap();
    let peer: SocketAddr = "198.51.100.7:40000".parse().unwrap();
    #[cfg(feature = "axum")]
    request.extensions_mut().insert(ConnectInfo(peer));
    #[cfg(not(feature = "axum"))]
    request.extensions_mut().insert(peer);
    app.clone().oneshot(request).await.unwrap().status()
}

/// The client's key as the layer derives it.
fn client_key() -> Vec<u8> {
    let identity = ClientIdentity::new([7u8; 32]).unwrap();
    identity
        .key_for_addr("198.51.100.7".parse().unwrap())
        .as_bytes()
        .to_vec()
}

async fn failures_are_counted_exactly(store: Arc<dyn Store>) {
    let clock = ManualClock::new();
    let (app, limiter) = login(store, &clock);
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for i in 0..PER_TASK {
                    let wrong = (t * PER_TASK + i).is_multiple_of(WRONG_EVERY);
                    statuses.push(attempt(&app, if wrong { "wrong" } else { "right" }).await);
                }
                statuses
            })
        })
        .collect();
    let mut counted = 0;
    let mut refused = 0;
    for task in tasks {
        for status in task.await.unwrap() {
            counted += u32::from(status == StatusCode::UNAUTHORIZED);
            refused += u32::from(status == StatusCode::TOO_MANY_REQUESTS);
        }
    }
    let wrong = (TASKS * PER_TASK).div_ceil(WRONG_EVERY) as u32;
    assert_eq!(counted, wrong, "{refused} refused");
    assert!(counted < LIMIT, "the run stays under the limit");
    assert_eq!(refused, 0, "successes never exhausted the quota");
    // Exactly the failures are counted: what is left is the rest.
    let left = limiter.peek(&client_key()).await.remaining;
    assert_eq!(left, LIMIT - wrong);

    // Successes alone never lock the client out; failures do, at the limit.
    for _ in 0..3 * LIMIT {
        assert_eq!(attempt(&app, "right").await, StatusCode::OK);
    }
    let mut failures = 0;
    while attempt(&app, "wrong").await == StatusCode::UNAUTHORIZED {
        failures += 1;
    }
    assert_eq!(failures, LIMIT - wrong);
    assert_eq!(attempt(&app, "right").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_counts_its_failures_exactly_on_an_inline_store() {
    failures_are_counted_exactly(Arc::new(ReferenceStore::new(1_000))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_counts_its_failures_exactly_on_an_awaited_store() {
    failures_are_counted_exactly(Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(
        1_000,
    ))))
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_counts_its_failures_exactly_on_redis() {
    use ratewarden_test_support::redis as fixture;
    let store = ratewarden::redis::RedisStore::builder(fixture::shared_url())
        .key_prefix(fixture::unique_prefix("login"))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    failures_are_counted_exactly(Arc::new(store)).await;
}

/// 50 concurrent right-password logins on a limit of 5 per 15 minutes:
/// requests in flight count, so some are refused; once all are answered
/// nothing is counted, and the next login must be admitted, not refused by
/// a refusal cached while the others were in flight.
#[cfg(any(feature = "redis", feature = "postgres"))]
async fn a_burst_of_right_passwords_leaves_no_lockout(store: Arc<dyn Store>) {
    assert!(
        store.capabilities().shared,
        "the test is about a shared store's refusal cache"
    );
    let clock = ManualClock::new();
    let (app, limiter) = login_limited(store, &clock, 5);
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { attempt(&app, "right").await })
        })
        .collect();
    let mut refused = 0;
    for task in tasks {
        refused += u32::from(task.await.unwrap() == StatusCode::TOO_MANY_REQUESTS);
    }
    assert!(
        refused > 0,
        "none of 50 concurrent logins was refused while 5 were in flight: the test proves nothing"
    );
    for i in 1..=10 {
        assert_eq!(
            attempt(&app, "right").await,
            StatusCode::OK,
            "login {i} after the burst ({refused} of 50 refused while in flight): nothing is counted"
        );
    }
    let peeked = limiter.peek(&client_key()).await;
    let failed = limiter.stats()[0].refund_failures;
    assert_eq!(peeked.remaining, 5, "{peeked:?}, {failed} refunds failed");
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_right_passwords_leaves_no_lockout_on_redis() {
    use ratewarden_test_support::redis as fixture;
    let store = ratewarden::redis::RedisStore::builder(fixture::shared_url())
        .key_prefix(fixture::unique_prefix("login"))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    a_burst_of_right_passwords_leaves_no_lockout(Arc::new(store)).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_right_passwords_leaves_no_lockout_on_postgres() {
    use ratewarden_test_support::postgres as fixture;
    a_burst_of_right_passwords_leaves_no_lockout(Arc::new(fixture::fresh_store("login").await))
        .await;
}
