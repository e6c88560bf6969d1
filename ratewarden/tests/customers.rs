//! Limits per customer through a layer (`CustomerLayer`): the limit the
//! application's data gives the request's customer decides it and its
//! headers, plans of different algorithms included; the data is read once
//! per TTL, a change applies after it, and a customer without a limit of
//! its own, or a request without a customer, gets the default plan.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
#[cfg(feature = "axum")]
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, Response, StatusCode};
use ratewarden::customers::CustomerLayer;
use ratewarden::{
    ClientIdentity, CustomerLimit, CustomerLimits, LimitSource, ManualClock, RateLimitLayer, Store,
    StoreError, async_trait,
};
use ratewarden_conformance::broken::ReferenceStore;
use tower::ServiceExt;

/// What the application's authentication put in the request.
#[derive(Clone)]
struct Customer(&'static str);

/// The application's table of customer limits, counting its reads; each
/// read yields first, as a query would.
#[derive(Debug, Default)]
struct Table {
    rows: Mutex<Vec<(&'static str, CustomerLimit)>>,
    reads: AtomicUsize,
}

#[derive(Debug)]
struct Source(Arc<Table>);

#[async_trait]
impl LimitSource for Source {
    async fn limit(&self, customer: &str) -> Result<Option<CustomerLimit>, StoreError> {
        tokio::task::yield_now().await;
        self.0.reads.fetch_add(1, Ordering::SeqCst);
        let rows = self.0.rows.lock().unwrap();
        Ok(rows
            .iter()
            .find(|(c, _)| *c == customer)
            .map(|(_, l)| l.clone()))
    }
}

fn identity() -> ClientIdentity {
    ClientIdentity::new([7u8; 32]).unwrap()
}

fn app(clock: &ManualClock, table: &Arc<Table>) -> (Router, CustomerLayer) {
    let store: Arc<dyn Store> = Arc::new(ReferenceStore::new(1_000));
    let limits = CustomerLimits::builder("reports", store)
        .shared_clock(Arc::new(clock.clone()))
        .plan("free", "fixed_window 2/min")
        .plan("pro", "gcra 10/min")
        .source(Source(table.clone()))
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let layer = CustomerLayer::new(
        limits,
        |parts| parts.extensions.get::<Customer>().map(|c| c.0.to_owned()),
        |limiter| RateLimitLayer::builder(limiter, identity()).build(),
    )
    .unwrap();
    let app = Router::new()
        .route("/reports", get(|| async { "ok" }))
        .layer(layer.clone());
    (app, layer)
}

fn request(customer: Option<&'static str>, peer: u8) -> Request<Body> {
    let mut request = Request::get("/reports").body(Body::empty()).unwrap();
    let peer = SocketAddr::from(([198, 51, 100, peer], 40000));
    #[cfg(feature = "axum")]
    request.extensions_mut().insert(ConnectInfo(peer));
    #[cfg(not(feature = "axum"))]
    request.extensions_mut().insert(peer);
    if let Some(customer) = customer {
        request.extensions_mut().insert(Customer(customer));
    }
    request
}

async fn send(app: &Router, customer: Option<&'static str>, peer: u8) -> Response<Body> {
    app.clone().oneshot(request(customer, peer)).await.unwrap()
}

fn ratelimit(response: &Response<Body>) -> &str {
    response.headers()["ratelimit"].to_str().unwrap()
}

#[tokio::test]
async fn each_customer_is_limited_by_its_own_limit_read_once_per_ttl() {
    let clock = ManualClock::new();
    let table = Arc::new(Table::default());
    table
        .rows
        .lock()
        .unwrap()
        .push(("acme", CustomerLimit::Plan("pro".into())));
    let (app, layer) = app(&clock, &table);

    // acme on the pro plan (GCRA, 10 a minute), another customer and a
    // request without one on the free plan (a fixed window of 2).
    for i in 0..10u32 {
        let r = send(&app, Some("acme"), 1).await;
        assert_eq!(r.status(), StatusCode::OK, "acme {i}");
        assert!(
            ratelimit(&r).starts_with(&format!("\"reports\";r={};", 9 - i)),
            "{r:?}"
        );
    }
    assert_eq!(
        send(&app, Some("acme"), 1).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        table.reads.load(Ordering::SeqCst),
        1,
        "one read for 11 requests"
    );
    for customer in [Some("globex"), None] {
        let peer = if customer.is_some() { 2 } else { 3 };
        for _ in 0..2 {
            assert_eq!(send(&app, customer, peer).await.status(), StatusCode::OK);
        }
        let refused = send(&app, customer, peer).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("q=2")
        );
    }

    // globex is given a limit of its own: it applies once the TTL ends.
    table.rows.lock().unwrap().push((
        "globex",
        CustomerLimit::policies("fixed_window 5/min").unwrap(),
    ));
    clock.advance(Duration::from_secs(29));
    assert_eq!(
        send(&app, Some("globex"), 2).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(1));
    // The same rule and algorithm: the two requests already counted in
    // this window count toward 5.
    for _ in 0..3 {
        assert_eq!(send(&app, Some("globex"), 2).await.status(), StatusCode::OK);
    }
    assert_eq!(
        send(&app, Some("globex"), 2).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // The quota answers under the customer's limit too.
    let (parts, _) = request(Some("acme"), 1).into_parts();
    let quota = layer.quota(&parts).await;
    assert_eq!(quota.status(), StatusCode::OK);
    assert!(
        quota.headers()["ratelimit-policy"]
            .to_str()
            .unwrap()
            .contains("q=10")
    );
}
