//! The outbound layer: each call of a client service waits for its permit,
//! on a manual clock that moves as the calls wait.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratewarden::outbound::{WaitCallError, WaitLayer};
use ratewarden::{Clock, Limiter, ManualClock, Policy, Rule, Store, Timestamp, WaitError};
use tower::{Layer, Service, ServiceExt};

const QUOTA: usize = 10;

/// A partner API that records when it was called, on `clock`.
fn partner_api(
    clock: ManualClock,
) -> (
    impl Service<(), Response = (), Error = Infallible, Future: Send> + Clone + Send + 'static,
    Arc<Mutex<Vec<Timestamp>>>,
) {
    let seen: Arc<Mutex<Vec<Timestamp>>> = Arc::default();
    let log = seen.clone();
    let api = tower::service_fn(move |()| {
        log.lock().unwrap().push(clock.now());
        async { Ok::<_, Infallible>(()) }
    });
    (api, seen)
}

fn quota(clock: &ManualClock) -> Limiter {
    let store: Arc<dyn Store> = Arc::new(ratewarden_test_support::stores::AwaitedStore::default());
    Limiter::builder()
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
        .unwrap()
}

#[tokio::test]
async fn calls_wait_for_their_permits_and_the_api_never_sees_more_than_its_quota() {
    let clock = ManualClock::new();
    let start = clock.now();
    let (api, seen) = partner_api(clock.clone());
    let mut client = WaitLayer::new(quota(&clock), "partner", Duration::from_secs(5)).layer(api);
    for _ in 0..50 {
        client.ready().await.unwrap().call(()).await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 50);
    // Never more than the quota in any second.
    for (i, t) in seen.iter().enumerate() {
        let within = seen[i..]
            .iter()
            .take_while(|u| u.saturating_duration_since(*t) < Duration::from_secs(1))
            .count();
        assert!(
            within <= QUOTA,
            "{within} calls in the second from call {i}"
        );
    }
    // And close to it: 50 calls in 4 s of quota plus the pauses' jitter.
    let took = clock.now().saturating_duration_since(start);
    assert!(
        took >= Duration::from_secs(4) && took <= Duration::from_millis(5_000),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_call_that_would_wait_past_the_deadline_is_not_made() {
    let clock = ManualClock::new();
    let (api, seen) = partner_api(clock.clone());
    let mut client =
        WaitLayer::new(quota(&clock), "partner", Duration::from_millis(100)).layer(api);
    for _ in 0..QUOTA {
        client.ready().await.unwrap().call(()).await.unwrap();
    }
    let err = client.ready().await.unwrap().call(()).await.unwrap_err();
    let WaitCallError::Wait(WaitError::Deadline { last, .. }) = &err else {
        panic!("{err}")
    };
    assert_eq!(last.retry_after, Duration::from_secs(1));
    assert!(
        err.to_string().starts_with("no permit for the call"),
        "{err}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        QUOTA,
        "the refused call never reached the API"
    );
}
