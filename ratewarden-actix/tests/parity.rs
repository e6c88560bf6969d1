//! The actix-web middleware beside the tower layer on axum, over real
//! sockets: the same layer configuration on each, the same requests, and
//! the same answers (status, rate-limit headers, `Retry-After`, body), for
//! admissions, refusals, a missing key and a store that is down.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{App, HttpMessage, HttpRequest, HttpServer, web};
use axum::Router;
use axum::routing::get;
use http::{Method, StatusCode};
use ratewarden::key::HeaderKey;
use ratewarden::{
    ClientIdentity, Decision, FailurePolicy, Limiter, ManualClock, MissingKey, Policy,
    RateLimitLayer, RateLimitLayerBuilder, Rule, Store,
};
use ratewarden_actix::RateLimit;
use ratewarden_conformance::broken::Unavailable;
use ratewarden_test_support::http::{Reply, TestClient, serve};

const LIMIT: u32 = 3;

/// A request with no header of note.
const PLAIN: &[(&str, &str)] = &[];

/// What each answer is compared on: everything but the date.
const COMPARED: [&str; 7] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit",
    "ratelimit-policy",
    "retry-after",
    "content-type",
];

fn identity() -> ClientIdentity {
    ClientIdentity::new([7u8; 32]).unwrap()
}

/// A layer of one rule on `store`, on a manual clock at the start of a
/// minute, shaped by `shape`.
fn layer(
    store: Arc<dyn Store>,
    failure: FailurePolicy,
    shape: &impl Fn(RateLimitLayerBuilder) -> RateLimitLayerBuilder,
) -> RateLimitLayer {
    let rule = Rule::new(
        "api",
        store,
        Policy::fixed_window(LIMIT, Duration::from_secs(60)).unwrap(),
    )
    .unwrap()
    .on_failure(failure);
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(rule)
        .build()
        .unwrap();
    shape(RateLimitLayer::builder(limiter, identity()))
        .build()
        .unwrap()
}

/// The handler of both servers: what it saw of the admitting decision,
/// with the status `x-status` asks for (200 without one).
fn seen(decision: Option<&Decision>, status: Option<&[u8]>) -> (StatusCode, String) {
    let status = status
        .and_then(|s| std::str::from_utf8(s).ok()?.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let body = match decision {
        Some(d) => format!("hello; {} left", d.remaining),
        None => "hello; no decision".into(),
    };
    (status, body)
}

async fn axum_server(layer: RateLimitLayer) -> SocketAddr {
    let app = Router::new()
        .route(
            "/hello",
            get(
                |decision: Option<axum::Extension<Decision>>, headers: http::HeaderMap| async move {
                    let status = headers.get("x-status").map(|v| v.as_bytes());
                    seen(decision.as_ref().map(|d| &d.0), status)
                },
            ),
        )
        .layer(layer);
    serve(app).await
}

async fn actix_server(layer: RateLimitLayer) -> SocketAddr {
    let server = HttpServer::new(move || {
        App::new().wrap(RateLimit::new(layer.clone())).route(
            "/hello",
            web::get().to(|request: HttpRequest| async move {
                let status = request.headers().get("x-status").map(|v| v.as_bytes());
                let (status, body) = seen(request.extensions().get::<Decision>(), status);
                let status = actix_web::http::StatusCode::from_u16(status.as_u16()).unwrap();
                actix_web::HttpResponse::build(status)
                    .content_type("text/plain; charset=utf-8")
                    .body(body)
            }),
        )
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    addr
}

/// Serves one configuration on both frameworks (each with its own store
/// from `store`), sends each the same `requests`, and checks the answers
/// match; returns actix-web's.
async fn both(
    store: impl Fn() -> Arc<dyn Store>,
    failure: FailurePolicy,
    shape: impl Fn(RateLimitLayerBuilder) -> RateLimitLayerBuilder,
    requests: &[&[(&str, &str)]],
) -> Vec<Reply> {
    let tower = TestClient::new(axum_server(layer(store(), failure, &shape)).await, None);
    let actix = TestClient::new(actix_server(layer(store(), failure, &shape)).await, None);
    let mut replies = Vec::new();
    for (n, headers) in requests.iter().enumerate() {
        let a = tower.send(Method::GET, "/hello", headers).await;
        let b = actix.send(Method::GET, "/hello", headers).await;
        assert_eq!(a.status, b.status, "request {n}: {a:?} / {b:?}");
        for name in COMPARED {
            assert_eq!(
                a.headers.get(name),
                b.headers.get(name),
                "request {n}, {name}: {a:?} / {b:?}"
            );
        }
        assert_eq!(a.body, b.body, "request {n}");
        replies.push(b);
    }
    replies
}

fn memory() -> Arc<dyn Store> {
    Arc::new(ratewarden::memory::MemoryStore::new(1_000))
}

#[actix_web::test]
async fn admissions_and_refusals_answer_as_the_tower_layer_does() {
    let replies = both(memory, FailurePolicy::Closed, |b| b, &[PLAIN; 5]).await;
    for (n, reply) in replies[..LIMIT as usize].iter().enumerate() {
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.body,
            format!("hello; {} left", LIMIT as usize - 1 - n)
        );
        assert_eq!(reply.remaining(), u64::from(LIMIT) - 1 - n as u64);
    }
    for reply in &replies[LIMIT as usize..] {
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.header("retry-after"), "60");
        assert_eq!(reply.json()["error"], "rate_limited");
    }
}

#[actix_web::test]
async fn keys_from_a_header_and_a_missing_key_answer_as_the_tower_layer_does() {
    let shape = |b: RateLimitLayerBuilder| {
        b.key(HeaderKey::new(&identity(), "x-api-key").unwrap())
            .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
    };
    let k1: &[(&str, &str)] = &[("x-api-key", "k1")];
    let k2: &[(&str, &str)] = &[("x-api-key", "k2")];
    let replies = both(
        memory,
        FailurePolicy::Closed,
        shape,
        &[k1, k1, k1, k1, k2, PLAIN],
    )
    .await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 200, 401]);
    assert_eq!(replies[5].json()["error"], "missing_key");
}

#[actix_web::test]
async fn a_store_that_is_down_answers_under_the_failure_policy_as_the_tower_layer_does() {
    let down = || Arc::new(Unavailable) as Arc<dyn Store>;
    let closed = both(down, FailurePolicy::Closed, |b| b, &[PLAIN; 2]).await;
    assert!(
        closed
            .iter()
            .all(|r| r.status == StatusCode::TOO_MANY_REQUESTS),
        "{closed:?}"
    );
    let open = both(down, FailurePolicy::Open, |b| b, &[PLAIN; 2]).await;
    assert!(open.iter().all(|r| r.status == StatusCode::OK), "{open:?}");
}

#[actix_web::test]
async fn count_only_skip_and_cost_answer_as_the_tower_layer_does() {
    let shape = |b: RateLimitLayerBuilder| {
        b.count_only(|status| status == StatusCode::UNAUTHORIZED)
            .skip(|parts| parts.headers.contains_key("x-skip"))
            .cost(|parts| {
                parts
                    .headers
                    .get("x-cost")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(1)
            })
    };
    let ok: &[(&str, &str)] = &[];
    let failed: &[(&str, &str)] = &[("x-status", "401")];
    let skipped: &[(&str, &str)] = &[("x-skip", "1")];
    let heavy: &[(&str, &str)] = &[("x-cost", "10")];
    let replies = both(
        memory,
        FailurePolicy::Closed,
        shape,
        &[
            ok, ok, ok, ok, failed, failed, failed, failed, skipped, heavy,
        ],
    )
    .await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    // Successes are given back; three failures count; a skipped request
    // passes untouched, one heavier than the limit is refused at once.
    assert_eq!(statuses, [200, 200, 200, 200, 401, 401, 401, 429, 200, 413]);
    assert!(replies[8].headers.get("ratelimit").is_none());
    assert_eq!(replies[9].json()["error"], "cost_exceeds_limit");
}

/// A decision the handler puts in its response (the state after a penalty,
/// `RateLimitLayer::penalize_and_peek`) is written instead of the
/// admission's, as the tower layer writes it.
#[actix_web::test]
async fn a_decision_the_handler_puts_in_its_response_is_the_one_shown() {
    let layer = layer(memory(), FailurePolicy::Closed, &|b| b);
    let server = HttpServer::new(move || {
        App::new().wrap(RateLimit::new(layer.clone())).route(
            "/pay",
            web::get().to(|request: HttpRequest| async move {
                let admitted = request.extensions().get::<Decision>().cloned().unwrap();
                // What a penalty of the rest of the window would leave.
                let mut after = admitted.clone();
                after.remaining = 0;
                let mut response = actix_web::HttpResponse::PaymentRequired().finish();
                response.extensions_mut().insert(after);
                response
            }),
        )
    })
    .workers(1)
    .bind(("127.0.0.1", 0))
    .unwrap();
    let addr = server.addrs()[0];
    actix_web::rt::spawn(server.run());
    let client = TestClient::new(addr, None);
    let reply = client.get("/pay").await;
    assert_eq!(reply.status, StatusCode::PAYMENT_REQUIRED);
    // The admission left 2; the handler's decision says 0.
    assert_eq!(reply.remaining(), 0, "{reply:?}");
}
