//! The reqwest middleware: each request of a `reqwest-middleware` client
//! waits for its permit before it reaches a partner API over HTTP, on a
//! manual clock that moves as the requests wait.
#![cfg(feature = "reqwest")]

use std::error::Error as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use ratewarden::outbound::reqwest::WaitMiddleware;
use ratewarden::{Clock, Limiter, ManualClock, Policy, Rule, Store, Timestamp, WaitError};
use ratewarden_test_support::http::serve;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, reqwest};

const QUOTA: usize = 10;

/// A partner API on a local port that records when it was called, on
/// `clock`; its URL and the record.
async fn partner_api(clock: ManualClock) -> (String, Arc<Mutex<Vec<Timestamp>>>) {
    let seen: Arc<Mutex<Vec<Timestamp>>> = Arc::default();
    let log = seen.clone();
    let app = Router::new().route(
        "/v1/rates",
        get(move || async move {
            log.lock().unwrap().push(clock.now());
            "ok"
        }),
    );
    let addr = serve(app).await;
    (format!("http://{addr}/v1/rates"), seen)
}

fn client(clock: &ManualClock, max_wait: Duration) -> ClientWithMiddleware {
    let store: Arc<dyn Store> = Arc::new(ratewarden_test_support::stores::AwaitedStore::default());
    let quota = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "partner-api",
                store,
                Policy::sliding_log(QUOTA as u32, Duration::from_secs(1)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    ClientBuilder::new(reqwest::Client::new())
        .with(WaitMiddleware::new(quota, "partner", max_wait))
        .build()
}

#[tokio::test]
async fn requests_wait_for_their_permits_and_the_api_never_sees_more_than_its_quota() {
    let clock = ManualClock::new();
    let start = clock.now();
    let (url, seen) = partner_api(clock.clone()).await;
    let client = client(&clock, Duration::from_secs(5));
    for n in 0..30 {
        let response = client.get(&url).send().await.unwrap_or_else(|e| {
            panic!("request {n}: {e:#}");
        });
        assert!(response.status().is_success(), "request {n}");
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 30);
    // Never more than the quota in any second.
    for (i, t) in seen.iter().enumerate() {
        let within = seen[i..]
            .iter()
            .take_while(|u| u.saturating_duration_since(*t) < Duration::from_secs(1))
            .count();
        assert!(
            within <= QUOTA,
            "{within} requests in the second from request {i}"
        );
    }
    // 30 requests are three seconds' quota: the first ten at once, the
    // others after two seconds of waiting at least.
    let took = clock.now().saturating_duration_since(start);
    assert!(took >= Duration::from_secs(2), "{took:?}");
}

#[tokio::test]
async fn a_request_that_would_wait_past_the_deadline_is_not_sent() {
    let clock = ManualClock::new();
    let (url, seen) = partner_api(clock.clone()).await;
    let client = client(&clock, Duration::from_millis(100));
    for n in 0..QUOTA {
        let response = client.get(&url).send().await.unwrap_or_else(|e| {
            panic!("request {n}: {e:#}");
        });
        assert!(response.status().is_success(), "request {n}");
    }
    let err = client.get(&url).send().await.unwrap_err();
    assert!(err.is_middleware(), "{err:#}");
    assert!(
        err.to_string().starts_with("no permit for the call"),
        "{err}"
    );
    // The wait's error says why, for a caller that wants the retry time.
    let Some(WaitError::Deadline { last, .. }) =
        err.source().and_then(|s| s.downcast_ref::<WaitError>())
    else {
        panic!("no WaitError behind {err:#}")
    };
    assert_eq!(last.retry_after, Duration::from_secs(1));
    assert_eq!(
        seen.lock().unwrap().len(),
        QUOTA,
        "the refused request never reached the API"
    );
}
