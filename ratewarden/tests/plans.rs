//! Limits chosen per request (`Plans` and `RateLimitLayerBuilder::plan`):
//! the plan an authentication layer names decides the limit and the
//! headers, usage carries over when a client changes plans, an unknown plan
//! gets the default, and a reset lifts every plan. On a store answered
//! inline, one awaited, Redis and PostgreSQL.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
#[cfg(feature = "axum")]
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use ratewarden::{
    ClientIdentity, ConfigError, Limiter, ManualClock, Plans, Policy, RateLimitLayer, Rule, Store,
};
use ratewarden_conformance::broken::ReferenceStore;
use ratewarden_conformance::composition::Switch;
use tower::ServiceExt;

const FREE: u32 = 4;
const PRO: u32 = 10;

/// What the application's authentication put in the request.
#[derive(Clone)]
struct Customer {
    plan: &'static str,
}

fn identity() -> ClientIdentity {
    ClientIdentity::new([7u8; 32]).unwrap()
}

fn plans(store: Arc<dyn Store>, clock: &ManualClock) -> Plans {
    Plans::builder("reports", store)
        .clock(clock.clone())
        .plan("free", &format!("{FREE}/min"))
        .plan("pro", &format!("{PRO}/min"))
        .build()
        .unwrap()
}

fn app(plans: Plans) -> (Router, RateLimitLayer) {
    let layer = RateLimitLayer::builder(plans, identity())
        .plan(|parts| parts.extensions.get::<Customer>().map(|c| c.plan))
        .build()
        .unwrap();
    let app = Router::new()
        .route("/reports", get(|| async { "ok" }))
        .layer(layer.clone());
    (app, layer)
}

fn request(plan: Option<&'static str>) -> Request<Body> {
    let mut request = Request::get("/reports").body(Body::empty()).unwrap();
    let peer: SocketAddr = "198.51.100.9:40000".parse().unwrap();
    #[cfg(feature = "axum")]
    request.extensions_mut().insert(ConnectInfo(peer));
    #[cfg(not(feature = "axum"))]
    request.extensions_mut().insert(peer);
    if let Some(plan) = plan {
        request.extensions_mut().insert(Customer { plan });
    }
    request
}

async fn send(app: &Router, plan: Option<&'static str>) -> Response<Body> {
    app.clone().oneshot(request(plan)).await.unwrap()
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> &'a str {
    response.headers()[name].to_str().unwrap()
}

fn client_key() -> Vec<u8> {
    identity()
        .key_for_addr("198.51.100.9".parse().unwrap())
        .as_bytes()
        .to_vec()
}

async fn plans_share_usage(store: Arc<dyn Store>) {
    let clock = ManualClock::new();
    let (app, layer) = app(plans(store, &clock));

    // The free plan: its limit, in the headers too.
    for i in 0..FREE {
        let response = send(&app, Some("free")).await;
        assert_eq!(response.status(), StatusCode::OK, "free request {i}");
        assert!(
            header(&response, "ratelimit").starts_with(&format!("\"reports\";r={};", FREE - 1 - i)),
            "{response:?}"
        );
        assert_eq!(
            header(&response, "ratelimit-policy"),
            "\"reports\";q=4;w=60"
        );
    }
    let refused = send(&app, Some("free")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "ratelimit-policy"), "\"reports\";q=4;w=60");
    // No plan, or one that does not exist, is the default (free): refused.
    assert_eq!(
        send(&app, None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        send(&app, Some("platinum")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // An upgrade inside the window: the four already counted carry over,
    // so the pro plan admits six more, not ten.
    let mut parts = request(Some("pro")).into_parts().0;
    let quota = layer.quota(&parts).await;
    assert_eq!(quota.status(), StatusCode::OK);
    let listed = quota.headers()["ratelimit-policy"].to_str().unwrap();
    assert!(listed.contains(&format!(";q={PRO};")), "{listed}");
    let field = quota.headers()["ratelimit"].to_str().unwrap();
    assert!(field.contains(&format!(";r={};", PRO - FREE)), "{field}");
    let mut admitted = 0;
    for _ in 0..2 * PRO {
        let response = send(&app, Some("pro")).await;
        if response.status() == StatusCode::OK {
            admitted += 1;
            assert_eq!(
                header(&response, "ratelimit-policy"),
                "\"reports\";q=10;w=60"
            );
        }
    }
    assert_eq!(admitted, PRO - FREE);
    // Back to free in the same window: nothing left on either reading.
    assert_eq!(
        send(&app, Some("free")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // A reset lifts the key on every plan, refusal caches included.
    layer.plans().reset(&client_key()).await.unwrap();
    for plan in ["free", "pro"] {
        parts.extensions.insert(Customer { plan });
        let left = layer.peek(&parts).await.unwrap().remaining;
        let limit = if plan == "free" { FREE } else { PRO };
        assert_eq!(left, limit, "{plan} after a reset");
    }
    assert_eq!(send(&app, Some("pro")).await.status(), StatusCode::OK);

    // A new window: each plan its own full limit again.
    clock.advance(Duration::from_secs(61));
    let mut admitted = 0;
    while send(&app, Some("pro")).await.status() == StatusCode::OK {
        admitted += 1;
    }
    assert_eq!(admitted, PRO);
}

#[tokio::test]
async fn plans_share_usage_on_an_inline_store() {
    plans_share_usage(Arc::new(ReferenceStore::new(1_000))).await;
}

#[tokio::test]
async fn plans_share_usage_on_an_awaited_store() {
    plans_share_usage(Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(
        1_000,
    ))))
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn plans_share_usage_on_redis() {
    use ratewarden_test_support::redis as fixture;
    let store = ratewarden::redis::RedisStore::builder(fixture::shared_url())
        .key_prefix(fixture::unique_prefix("plans"))
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    plans_share_usage(Arc::new(store)).await;
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn plans_share_usage_on_postgres() {
    use ratewarden_test_support::postgres as fixture;
    let store = ratewarden::postgres::PostgresStore::builder(fixture::server_url())
        .schema(fixture::unique_schema("plans"))
        .timeout(Duration::from_secs(10))
        .sweep_interval(None)
        .build()
        .await
        .unwrap();
    plans_share_usage(Arc::new(store)).await;
}

fn error(result: Result<Plans, ConfigError>) -> String {
    result.unwrap_err().to_string()
}

#[test]
fn plans_that_would_count_apart_are_refused() {
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    let build = |free: &str, pro: &str| {
        Plans::builder("api", store.clone())
            .plan("free", free)
            .plan("pro", pro)
            .build()
    };
    let e = error(build("100/h", "1000/min"));
    assert!(
        e.contains("plan \"pro\" has rules") && e.contains("usage carries over"),
        "{e}"
    );
    let e = error(build("10/s; 100/h", "1000/h"));
    assert!(e.contains("the same rules"), "{e}");
    let e = error(build("100/h", "1000/fortnight"));
    assert!(
        e.contains("plan \"pro\": invalid policy \"1000/fortnight\""),
        "{e}"
    );
    let e = error(
        Plans::builder("api", store.clone())
            .plan("free", "1/s")
            .plan("free", "2/s")
            .build(),
    );
    assert!(e.contains("given twice"), "{e}");
    let e = error(
        Plans::builder("api", store.clone())
            .plan("free", "1/s")
            .default("gold")
            .build(),
    );
    assert!(e.contains("default plan \"gold\""), "{e}");
    assert!(error(Plans::builder("api", store.clone()).build()).contains("at least one plan"));
    let e = error(
        Plans::builder("api", store.clone())
            .plan("free plan", "1/s")
            .build(),
    );
    assert!(e.contains("plan name \"free plan\""), "{e}");

    // Limiters built by hand: another store is another count.
    let other: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    let clock: Arc<dyn ratewarden::Clock> = Arc::new(ManualClock::new());
    let limiter = |store: &Arc<dyn Store>, limit| {
        Limiter::builder()
            .shared_clock(clock.clone())
            .rule(
                Rule::new(
                    "api",
                    store.clone(),
                    Policy::fixed_window(limit, Duration::from_secs(60)).unwrap(),
                )
                .unwrap(),
            )
            .build()
            .unwrap()
    };
    let e = error(Plans::new(
        "free",
        [("free", limiter(&store, 1)), ("pro", limiter(&other, 2))],
    ));
    assert!(e.contains("the same rules"), "{e}");
    let plans = Plans::new(
        "pro",
        [("free", limiter(&store, 1)), ("pro", limiter(&store, 2))],
    )
    .unwrap();
    assert_eq!(plans.default_name(), "pro");
    let names: Vec<&str> = plans.iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["pro", "free"]);
    assert_eq!(plans.choose(Some("free")).rules()[0].policy().limit(), 1);
    assert!(plans.get("gold").is_none());
}

#[test]
fn a_plan_chooser_needs_plans() {
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(100));
    let limiter = Limiter::builder()
        .rule(
            Rule::new(
                "api",
                store,
                Policy::fixed_window(1, Duration::from_secs(1)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap();
    let e = RateLimitLayer::builder(limiter, identity())
        .plan(|_| Some("pro"))
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs several plans"), "{e}");
}

/// A late charge through the layer: the request's own key and plan.
#[tokio::test]
async fn the_layer_penalizes_the_requests_client_on_its_plan() {
    let clock = ManualClock::new();
    let (app, layer) = app(plans(Arc::new(ReferenceStore::new(100)), &clock));
    assert_eq!(send(&app, Some("pro")).await.status(), StatusCode::OK);
    let parts = request(Some("pro")).into_parts().0;
    assert!(layer.penalize(&parts, 5).await.unwrap());
    let left = layer.peek(&parts).await.unwrap().remaining;
    assert_eq!(left, PRO - 1 - 5);
    // More than the plan ever admits: refused, nothing charged.
    assert!(layer.penalize(&parts, PRO + 1).await.is_err());
    assert_eq!(layer.peek(&parts).await.unwrap().remaining, left);
    // A request without a client address is not limited, nor charged.
    let mut bare = Request::get("/reports").body(Body::empty()).unwrap();
    bare.extensions_mut().insert(Customer { plan: "pro" });
    assert!(!layer.penalize(&bare.into_parts().0, 1).await.unwrap());
}
