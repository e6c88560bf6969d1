//! The layer's two paths answer alike: a limiter decided at once (one rule
//! on a store that answers inline, without a boxed future) and one that is
//! awaited give the same statuses, headers, bodies and request extension,
//! admissions and refusals, default and custom refusals.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
#[cfg(feature = "axum")]
use axum::extract::ConnectInfo;
use axum::extract::Extension;
use axum::response::IntoResponse;
use axum::routing::get;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use ratewarden::{
    ClientIdentity, Decision, Limiter, ManualClock, Policy, RateLimitLayer, Rule, Store,
};
use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Switch;
use tower::ServiceExt;

/// The route echoes the decision the layer put in the request.
fn app(store: Arc<dyn Store>, clock: &ManualClock, custom: bool) -> Router {
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(
                "search",
                store,
                Policy::gcra(3, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let identity = ClientIdentity::new([7u8; 32]).unwrap();
    let mut layer = RateLimitLayer::builder(limiter, identity);
    if custom {
        layer = layer.refusal(|d: &Decision| {
            (
                StatusCode::TOO_MANY_REQUESTS,
                format!("wait {}", d.retry_after_secs()),
            )
                .into_response()
        });
    }
    Router::new()
        .route(
            "/api/search",
            get(|Extension(d): Extension<Decision>| async move { format!("left {}", d.remaining) }),
        )
        .layer(layer.build().unwrap())
}

async fn send(app: &Router) -> (StatusCode, Vec<(String, String)>, Vec<u8>) {
    let mut request = Request::get("/api/search").body(Body::empty()).unwrap();
    let peer: SocketAddr = "198.51.100.7:40000".parse().unwrap();
    // The peer as this build's layer reads it: axum's `ConnectInfo` with
    // the `axum` feature, a plain `SocketAddr` extension without it.
    #[cfg(feature = "axum")]
    request.extensions_mut().insert(ConnectInfo(peer));
    #[cfg(not(feature = "axum"))]
    request.extensions_mut().insert(peer);
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let mut headers: Vec<(String, String)> = response
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    headers.sort();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, body)
}

#[tokio::test]
async fn inline_and_awaited_limiters_answer_alike() {
    for custom in [false, true] {
        let clock = ManualClock::new();
        let inline = app(Arc::new(ReferenceStore::new(100)), &clock, custom);
        let awaited_store = Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(100)));
        let awaited = app(awaited_store.clone(), &clock, custom);
        let mut statuses = Vec::new();
        for step in 0..6 {
            let (a, b) = (send(&inline).await, send(&awaited).await);
            assert_eq!(a, b, "request {step}, custom refusal {custom}");
            statuses.push(a.0);
            clock.advance(Duration::from_secs(5));
        }
        // Both admissions and refusals were compared, and the awaited
        // limiter really was awaited.
        assert!(statuses.contains(&StatusCode::OK), "{statuses:?}");
        assert!(
            statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
            "{statuses:?}"
        );
        assert_eq!(awaited_store.calls(), 6);
    }
}

/// Through the layer, a request on a store that must be awaited asks it
/// inline once and awaits it once: the awaited path never repeats the
/// inline attempt.
#[tokio::test]
async fn an_awaited_store_is_asked_inline_once_per_request() {
    let clock = ManualClock::new();
    // Never answers inline, as Redis and Postgres do not; counts both.
    let store = Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(100)));
    let app = app(store.clone(), &clock, false);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(send(&app).await.0);
    }
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    assert_eq!(store.inline_asks(), 6);
    assert_eq!(store.calls(), 6);
}

/// What `RateLimit::call` returns for each kind of request, read from the
/// response future's `Debug`: on a store that answers inline, a costly
/// request and a skipped one are the inner service's future (no box), a
/// refusal and a cost no rule admits are ready; on an awaited store, the
/// costly request is boxed.
#[tokio::test]
async fn only_what_waits_on_a_store_is_boxed() {
    use tower::{Layer, Service};
    let state = |store: Arc<dyn Store>| {
        let limiter = Limiter::builder()
            .clock(ManualClock::new())
            .rule(
                Rule::new(
                    "upload",
                    store,
                    Policy::fixed_window(10, Duration::from_secs(60)).unwrap(),
                )
                .unwrap(),
            )
            .build()
            .unwrap();
        let layer = RateLimitLayer::builder(limiter, ClientIdentity::new([7u8; 32]).unwrap())
            .skip(|parts| parts.uri.path() == "/health")
            .cost(|parts| parts.uri.query().and_then(|q| q.parse().ok()).unwrap_or(1))
            .build()
            .unwrap();
        let inner = tower::service_fn(|_: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let mut service = layer.layer(inner);
        move |uri: &str| {
            let mut request = Request::get(uri).body(Body::empty()).unwrap();
            let peer: SocketAddr = "198.51.100.7:40000".parse().unwrap();
            #[cfg(feature = "axum")]
            request.extensions_mut().insert(ConnectInfo(peer));
            #[cfg(not(feature = "axum"))]
            request.extensions_mut().insert(peer);
            let future = service.call(request);
            let debug = format!("{future:?}");
            debug
                .split('"')
                .nth(1)
                .expect("the state is quoted")
                .to_owned()
        }
    };
    let mut inline = state(Arc::new(ReferenceStore::new(100)));
    assert_eq!(inline("/upload?4"), "inner");
    assert_eq!(inline("/health"), "inner");
    assert_eq!(inline("/upload?11"), "ready"); // no wait ever admits it
    assert_eq!(inline("/upload?6"), "inner");
    assert_eq!(inline("/upload?1"), "ready"); // refused: 10 of 10 spent
    let mut awaited = state(Arc::new(
        ratewarden_test_support::stores::AwaitedStore::default(),
    ));
    assert_eq!(awaited("/upload?4"), "boxed");
    assert_eq!(awaited("/health"), "inner");
}
