//! The layer's builder: keys, missing keys, skipped requests, costs, custom
//! refusals and header modes, through the tower service the layer builds.
//!
//! About 520 lines: one test per option of the builder.

use std::convert::Infallible;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use ratewarden::key::{ExtensionKey, GlobalKey, HeaderKey, LimitKey};
use ratewarden::layer::{HeaderMode, MissingKey, RateLimitHeaders, RateLimitLayerBuilder};
use ratewarden::{ClientIdentity, Limiter, ManualClock, Policy, RateLimitLayer, Rule, Store};
use ratewarden_test_support::http::Reply;
use ratewarden_test_support::stores::{AwaitedStore, Recording};
use tower::{Layer, Service};

const SECRET: &[u8; 32] = b"test secret, thirty-two bytes!!!";

fn identity() -> ClientIdentity {
    ClientIdentity::new(SECRET).unwrap()
}

/// A rule on an exact store of its own.
fn exact_rule(name: &str, policy: Policy) -> Rule {
    Rule::new(name, Arc::new(AwaitedStore::default()), policy).unwrap()
}

fn one_rule(name: &str, store: Arc<dyn Store>, limit: u32) -> Limiter {
    Limiter::builder()
        .clock(ManualClock::new())
        .rule(
            Rule::new(
                name,
                store,
                Policy::fixed_window(limit, Duration::from_secs(60)).unwrap(),
            )
            .unwrap(),
        )
        .build()
        .unwrap()
}

/// A layer builder for [`one_rule`] named "api" on an exact store of its
/// own.
fn api_on_map(limit: u32, identity: ClientIdentity) -> RateLimitLayerBuilder {
    RateLimitLayer::builder(
        one_rule("api", Arc::new(AwaitedStore::default()), limit),
        identity,
    )
}

/// A layer builder for [`one_rule`] named "api", 2 a minute on `store`,
/// keyed by the `x-api-key` header.
fn api_keyed(store: Arc<dyn Store>) -> RateLimitLayerBuilder {
    let id = identity();
    RateLimitLayer::builder(one_rule("api", store, 2), id.clone())
        .key(HeaderKey::new(&id, "x-api-key").unwrap())
}

/// What these tests read from a [`Reply`] beside its headers.
trait ReplyExt {
    fn rate_limit_headers(&self) -> Vec<&str>;
}

impl ReplyExt for Reply {
    fn rate_limit_headers(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .headers
            .keys()
            .map(|n| n.as_str())
            .filter(|n| n.contains("ratelimit") || *n == "retry-after")
            .collect();
        names.sort_unstable();
        names
    }
}

/// The layer around a handler answering "ok"; each request comes from
/// `peer`, with `headers` and the extensions `prepare` adds.
struct Harness<S> {
    service: S,
}

impl<S, B> Harness<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body<Data = Bytes>,
    B::Error: std::fmt::Debug,
{
    async fn send(&mut self, peer: &str, headers: &[(&str, &str)]) -> Reply {
        self.send_with(peer, headers, |_| {}).await
    }

    async fn send_with(
        &mut self,
        peer: &str,
        headers: &[(&str, &str)],
        prepare: impl FnOnce(&mut Request<Full<Bytes>>),
    ) -> Reply {
        let mut request = Request::builder().uri("/api");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request = request.body(Full::new(Bytes::new())).unwrap();
        request
            .extensions_mut()
            .insert(format!("{peer}:4000").parse::<SocketAddr>().unwrap());
        prepare(&mut request);
        poll_fn(|cx| self.service.poll_ready(cx)).await.unwrap();
        Reply::read(self.service.call(request).await.unwrap()).await
    }
}

fn harness(
    layer: RateLimitLayer,
) -> Harness<
    impl Service<
        Request<Full<Bytes>>,
        Response = Response<impl http_body::Body<Data = Bytes, Error: std::fmt::Debug>>,
        Error = Infallible,
    >,
> {
    let inner = tower::service_fn(|_: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    Harness {
        service: layer.layer(inner),
    }
}

#[tokio::test]
async fn each_api_key_has_its_own_quota_and_none_is_stored_raw() {
    let store = Arc::new(Recording::new(AwaitedStore::default()));
    let layer = api_keyed(store.clone()).build().unwrap();
    let mut h = harness(layer);
    let alice = [("x-api-key", "alice-secret-key")];
    let bob = [("x-api-key", "bob-secret-key")];

    // Alice from two addresses: one quota.
    assert_eq!(h.send("192.0.2.1", &alice).await.remaining(), 1);
    assert_eq!(h.send("192.0.2.2", &alice).await.remaining(), 0);
    let refused = h.send("192.0.2.3", &alice).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // Bob from Alice's address: his own.
    let b = h.send("192.0.2.1", &bob).await;
    assert_eq!((b.status, b.remaining()), (StatusCode::OK, 1));

    for key in store.keys() {
        let text = String::from_utf8_lossy(&key).to_string();
        assert!(!text.contains("secret-key"), "{text}");
        assert_eq!(key.len(), "api:".len() + 32, "{text}");
    }
}

#[tokio::test]
async fn a_request_without_a_key_falls_back_to_its_address_by_default() {
    let layer = api_keyed(Arc::new(AwaitedStore::default()))
        .build()
        .unwrap();
    let mut h = harness(layer);
    assert_eq!(h.send("192.0.2.1", &[]).await.remaining(), 1);
    assert_eq!(
        h.send("192.0.2.1", &[("x-api-key", "")]).await.remaining(),
        0
    );
    assert_eq!(
        h.send("192.0.2.1", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another address has its own quota; an API key its own too, even the
    // address's text as a key.
    assert_eq!(h.send("192.0.2.2", &[]).await.remaining(), 1);
    let keyed = h.send("192.0.2.1", &[("x-api-key", "192.0.2.1")]).await;
    assert_eq!((keyed.status, keyed.remaining()), (StatusCode::OK, 1));
}

#[tokio::test]
async fn a_request_without_a_key_can_be_rejected_before_the_limiter() {
    let store = Arc::new(Recording::new(AwaitedStore::default()));
    let layer = api_keyed(store.clone())
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .build()
        .unwrap();
    let mut h = harness(layer);
    for _ in 0..3 {
        let reply = h.send("192.0.2.1", &[]).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert_eq!(reply.rate_limit_headers(), Vec::<&str>::new());
        assert_eq!(reply.header("content-type"), "application/json");
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["error"], "missing_key");
    }
    assert!(store.keys().is_empty(), "the limiter was consulted");
    assert_eq!(
        h.send("192.0.2.1", &[("x-api-key", "k")]).await.status,
        StatusCode::OK
    );

    let not_an_error = RateLimitLayer::builder(one_rule("api", store, 2), identity())
        .on_missing_key(MissingKey::Reject(StatusCode::OK))
        .build();
    assert!(not_an_error.is_err());
}

#[derive(Clone)]
struct UserId(u64);

impl LimitKey for UserId {
    fn key_bytes(&self) -> impl AsRef<[u8]> {
        self.0.to_be_bytes()
    }
}

#[tokio::test]
async fn a_user_id_from_an_auth_layer_is_the_key() {
    let id = identity();
    let layer = api_on_map(1, id.clone())
        .key(ExtensionKey::<UserId>::new(&id, "user"))
        .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED))
        .build()
        .unwrap();
    let mut h = harness(layer);
    // What an authentication layer in front would do.
    let as_user = |n| {
        move |r: &mut Request<Full<Bytes>>| {
            r.extensions_mut().insert(UserId(n));
        }
    };
    assert_eq!(
        h.send_with("192.0.2.1", &[], as_user(7)).await.status,
        StatusCode::OK
    );
    // The same user from elsewhere: refused; another user: admitted.
    assert_eq!(
        h.send_with("192.0.2.9", &[], as_user(7)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        h.send_with("192.0.2.1", &[], as_user(8)).await.status,
        StatusCode::OK
    );
    assert_eq!(
        h.send("192.0.2.1", &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn a_global_key_limits_everyone_together() {
    let id = identity();
    let layer = RateLimitLayer::builder(
        one_rule("all", Arc::new(AwaitedStore::default()), 2),
        id.clone(),
    )
    .key(GlobalKey::new(&id))
    .build()
    .unwrap();
    let mut h = harness(layer);
    assert_eq!(h.send("192.0.2.1", &[]).await.status, StatusCode::OK);
    assert_eq!(h.send("198.51.100.1", &[]).await.status, StatusCode::OK);
    assert_eq!(
        h.send("203.0.113.1", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn skipped_requests_are_not_charged_and_carry_no_headers() {
    let layer = api_on_map(1, identity())
        .skip(|r| r.headers.get("x-internal").is_some_and(|v| v == "probe"))
        .build()
        .unwrap();
    let mut h = harness(layer);
    for _ in 0..5 {
        let skipped = h.send("192.0.2.1", &[("x-internal", "probe")]).await;
        assert_eq!(
            (skipped.status, skipped.body.as_str()),
            (StatusCode::OK, "ok")
        );
        assert_eq!(skipped.rate_limit_headers(), Vec::<&str>::new());
    }
    // The quota is whole.
    assert_eq!(h.send("192.0.2.1", &[]).await.remaining(), 0);
    assert_eq!(
        h.send("192.0.2.1", &[("x-internal", "other")]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

fn batch_cost(r: &http::request::Parts) -> u32 {
    r.headers
        .get("x-batch")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

#[tokio::test]
async fn a_request_costs_what_the_cost_closure_says() {
    let layer = api_on_map(10, identity()).cost(batch_cost).build().unwrap();
    let mut h = harness(layer);
    assert_eq!(
        h.send("192.0.2.1", &[("x-batch", "3")]).await.remaining(),
        7
    );
    // Zero is charged as one.
    assert_eq!(
        h.send("192.0.2.1", &[("x-batch", "0")]).await.remaining(),
        6
    );
    // More than the limit could ever admit: 413, nothing charged.
    let too_big = h.send("192.0.2.1", &[("x-batch", "11")]).await;
    assert_eq!(too_big.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(too_big.rate_limit_headers(), Vec::<&str>::new());
    assert!(
        too_big.body.contains("cost_exceeds_limit"),
        "{}",
        too_big.body
    );
    // More than remains: 429, nothing charged.
    let refused = h.send("192.0.2.1", &[("x-batch", "7")]).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        h.send("192.0.2.1", &[("x-batch", "6")]).await.remaining(),
        0
    );
}

/// A request of several units refused by a later rule is refunded in full by the
/// earlier rules, as a request of cost 1 is. (The memory store refunds; the
/// test map does not.)
#[cfg(feature = "memory")]
#[tokio::test]
async fn a_costly_refusal_refunds_its_whole_cost() {
    let id = identity();
    let clock = ManualClock::new();
    let window = Duration::from_secs(60);
    let burst = Rule::new(
        "burst",
        Arc::new(ratewarden::memory::MemoryStore::new(100)),
        Policy::fixed_window(10, window).unwrap(),
    )
    .unwrap();
    let limiter = Limiter::builder()
        .clock(clock.clone())
        .rule(burst.clone())
        .rule(exact_rule("slow", Policy::fixed_window(4, window).unwrap()))
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter, id.clone())
        .cost(batch_cost)
        .build()
        .unwrap();
    let mut h = harness(layer);
    let first = h.send("192.0.2.1", &[("x-batch", "3")]).await;
    assert_eq!(first.header("ratelimit"), "\"slow\";r=1;t=60");
    let refused = h.send("192.0.2.1", &[("x-batch", "3")]).await;
    assert_eq!(refused.header("ratelimit"), "\"slow\";r=1;t=60");
    // "burst" holds the first request's 3 units only: one more leaves 6.
    let key = id.key_for_addr("192.0.2.1".parse().unwrap());
    let d = burst.check(key.as_bytes(), &clock).await;
    assert_eq!(d.remaining, 6);
}

#[tokio::test]
async fn a_custom_refusal_still_carries_the_headers() {
    let layer = api_on_map(1, identity())
        .refusal(|d| {
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .header("content-type", "text/plain")
                .body(Full::new(Bytes::from(format!(
                    "busy, back in {} s",
                    d.retry_after_secs()
                ))))
                .unwrap()
        })
        .build()
        .unwrap();
    let mut h = harness(layer);
    let admitted = h.send("192.0.2.1", &[]).await;
    let refused = h.send("192.0.2.1", &[]).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.body, "busy, back in 60 s");
    assert_eq!(refused.header("content-type"), "text/plain");
    assert_eq!(refused.header("retry-after"), "60");
    assert_eq!(refused.header("ratelimit"), "\"api\";r=0;t=60");
    let mut with_retry = admitted.rate_limit_headers();
    with_retry.push("retry-after");
    with_retry.sort_unstable();
    assert_eq!(refused.rate_limit_headers(), with_retry);
}

#[tokio::test]
async fn header_modes_choose_the_headers() {
    let draft = ["ratelimit", "ratelimit-policy"];
    let legacy = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
    ];
    let both: Vec<&str> = draft.iter().chain(&legacy).copied().collect();
    // `None` here: a layer built without choosing, whose default is the
    // draft's two fields.
    for (mode, expected) in [
        (None, draft.to_vec()),
        (Some(HeaderMode::Both), both.clone()),
        (Some(HeaderMode::Draft11), draft.to_vec()),
        (Some(HeaderMode::XRateLimit), legacy.to_vec()),
        (Some(HeaderMode::None), vec![]),
    ] {
        let builder = api_on_map(1, identity());
        let layer = match mode {
            Some(mode) => builder.headers(mode),
            None => builder,
        }
        .build()
        .unwrap();
        let mut h = harness(layer);
        let admitted = h.send("192.0.2.1", &[]).await;
        assert_eq!(admitted.rate_limit_headers(), expected, "{mode:?}");
        let refused = h.send("192.0.2.1", &[]).await;
        let mut with_retry = expected.clone();
        with_retry.push("retry-after");
        with_retry.sort_unstable();
        // Retry-After is plain HTTP: written in every mode.
        assert_eq!(refused.rate_limit_headers(), with_retry, "{mode:?}");
    }
}

#[tokio::test]
async fn the_policy_header_lists_every_rule_and_ratelimit_the_tightest() {
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(exact_rule(
            "burst",
            Policy::sliding_log(12, Duration::from_secs(300)).unwrap(),
        ))
        .rule(exact_rule(
            "hourly",
            Policy::sliding_log(3, Duration::from_millis(3_599_500)).unwrap(),
        ))
        .build()
        .unwrap();
    let mut h = harness(RateLimitLayer::new(limiter, identity()).unwrap());
    let reply = h.send("192.0.2.1", &[]).await;
    assert_eq!(
        reply.header("ratelimit-policy"),
        "\"burst\";q=12;w=300, \"hourly\";q=3;w=3600"
    );
    assert_eq!(reply.header("ratelimit"), "\"hourly\";r=2;t=3600");
}

/// A hand-written middleware using [`RateLimitHeaders`] answers exactly as
/// the layer does.
#[tokio::test]
async fn the_exported_writer_matches_the_layer() {
    let limiter = one_rule("api", Arc::new(AwaitedStore::default()), 1);
    let layer = RateLimitLayer::new(limiter.clone(), identity()).unwrap();
    let mut h = harness(layer);
    let by_layer = [
        h.send("192.0.2.1", &[]).await,
        h.send("192.0.2.1", &[]).await,
    ];

    let headers = RateLimitHeaders::new(&limiter, HeaderMode::default());
    let key = identity().key_for_addr("192.0.2.2".parse().unwrap());
    let admitted = limiter.check(key.as_bytes()).await;
    let mut written = HeaderMap::new();
    headers.write(&admitted, &mut written);
    let refused = limiter.check(key.as_bytes()).await;
    let refusal = headers.refusal(&refused).into_http();

    for name in by_layer[0].rate_limit_headers() {
        assert_eq!(by_layer[0].headers.get(name), written.get(name), "{name}");
    }
    assert_eq!(by_layer[1].status, refusal.status());
    assert_eq!(&by_layer[1].headers, refusal.headers());
    assert_eq!(by_layer[1].body.as_bytes(), refusal.body().as_ref());
}

/// The refusal body is built on the stack before it is copied out: the
/// longest policy name (an escalating rule's durable one) and the largest
/// numbers a store can answer still give the whole body, valid JSON, and no
/// overflow in the rounding up to seconds.
#[tokio::test]
async fn the_longest_refusal_body_is_whole() {
    let name = "n".repeat(ratewarden::MAX_RULE_NAME);
    let local = Policy::sliding_log(10, Duration::from_secs(60)).unwrap();
    // The longest window a policy accepts (366 days).
    let durable = Policy::sliding_log(1, Duration::from_secs(31_622_400)).unwrap();
    let limiter = Limiter::builder()
        .clock(ManualClock::new())
        .rule(
            Rule::new(name.as_str(), Arc::new(AwaitedStore::default()), local)
                .unwrap()
                .with_escalation(Arc::new(AwaitedStore::default()), durable, 1, None)
                .unwrap(),
        )
        .build()
        .unwrap();
    let key = identity().key_for_addr("192.0.2.9".parse().unwrap());
    assert!(limiter.check(key.as_bytes()).await.allowed);
    let mut refused = limiter.check(key.as_bytes()).await;
    assert!(!refused.allowed && refused.source.escalated);
    refused.limit = u32::MAX;
    refused.remaining = u32::MAX;
    refused.retry_after = Duration::MAX;
    refused.reset_after = Duration::MAX;
    let refusal = RateLimitHeaders::new(&limiter, HeaderMode::Both)
        .refusal(&refused)
        .into_http();
    let json: serde_json::Value = serde_json::from_slice(refusal.body()).unwrap();
    assert_eq!(json["retry_after"], u64::MAX);
    assert_eq!(json["reset"], u64::MAX);
    assert_eq!(json["limit"], u32::MAX);
    assert_eq!(json["remaining"], u32::MAX);
    assert_eq!(json["policy"], format!("{name}/durable"));
    assert_eq!(json["window"], 31_622_400);
    assert_eq!(
        json["message"],
        format!("Too many requests. Retry in {} s.", u64::MAX)
    );
    assert_eq!(refusal.headers()["retry-after"], u64::MAX.to_string());
}

/// A server that passes no peer address to the layer (axum served without
/// `into_make_service_with_connect_info`) must not put every client under
/// one shared key: each such request is a 500 naming the problem, the
/// store is never asked, and requests that do carry an address are limited
/// as usual.
#[tokio::test]
async fn a_request_without_a_client_address_is_a_500_not_a_shared_key() {
    let store = Arc::new(Recording::new(AwaitedStore::default()));
    let layer = RateLimitLayer::new(one_rule("api", store.clone(), 1), identity()).unwrap();
    let mut h = harness(layer);
    let no_peer = |request: &mut Request<Full<Bytes>>| {
        request.extensions_mut().remove::<SocketAddr>();
    };
    for _ in 0..3 {
        let reply = h.send_with("192.0.2.1", &[], no_peer).await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(reply.header("content-type"), "application/json");
        let json: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(json["error"], "no_client_address", "{}", reply.body);
        assert_eq!(reply.rate_limit_headers(), Vec::<&str>::new());
    }
    assert_eq!(
        store.calls(),
        0,
        "a request without an address reached the store"
    );
    // Two clients with addresses each get their own quota of one.
    assert_eq!(h.send("192.0.2.1", &[]).await.status, StatusCode::OK);
    assert_eq!(h.send("192.0.2.2", &[]).await.status, StatusCode::OK);
    assert_eq!(
        h.send("192.0.2.1", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// The same holds where an extracted key is missing and the layer falls
/// back to the address; a request whose key is found needs no address, and
/// a trusted forwarding header is an address without a peer.
#[tokio::test]
async fn the_missing_address_error_covers_the_fallback_and_spares_requests_that_need_none() {
    let no_peer = |request: &mut Request<Full<Bytes>>| {
        request.extensions_mut().remove::<SocketAddr>();
    };
    let store = Arc::new(Recording::new(AwaitedStore::default()));
    let mut h = harness(api_keyed(store.clone()).build().unwrap());
    let reply = h.send_with("192.0.2.1", &[], no_peer).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(store.calls(), 0);
    let reply = h
        .send_with("192.0.2.1", &[("x-api-key", "k")], no_peer)
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(store.calls(), 1);

    let proxied =
        identity().with_source(ratewarden::identity::AddressSource::x_forwarded_for(1).unwrap());
    let mut h = harness(api_on_map(1, proxied).build().unwrap());
    let from = |client: &'static str| [("x-forwarded-for", client)];
    assert_eq!(
        h.send_with("10.0.0.1", &from("203.0.113.1"), no_peer)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        h.send_with("10.0.0.1", &from("203.0.113.2"), no_peer)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        h.send_with("10.0.0.1", &from("203.0.113.1"), no_peer)
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let reply = h.send_with("10.0.0.1", &[], no_peer).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
}

/// A random identity keys clients for one process only: enough in front of
/// that process's own memory, refused in front of a store other processes
/// share (each would give every client a quota of its own).
#[tokio::test]
async fn a_random_identity_serves_one_process_and_is_refused_before_a_shared_store() {
    let random = ClientIdentity::random().unwrap();
    assert!(random.is_random() && !identity().is_random());
    let addr = "203.0.113.7".parse().unwrap();
    assert_ne!(
        random.key_for_addr(addr),
        ClientIdentity::random().unwrap().key_for_addr(addr),
        "two random identities drew the same secret"
    );

    let mut h = harness(
        RateLimitLayer::new(
            one_rule("api", Arc::new(AwaitedStore::default()), 1),
            random.clone(),
        )
        .unwrap(),
    );
    assert_eq!(h.send("192.0.2.1", &[]).await.status, StatusCode::OK);
    assert_eq!(
        h.send("192.0.2.1", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(h.send("192.0.2.2", &[]).await.status, StatusCode::OK);

    let shared = || {
        Limiter::builder()
            .rule(exact_rule(
                "local",
                Policy::fixed_window(5, Duration::from_secs(1)).unwrap(),
            ))
            .rule(
                Rule::new(
                    "fleet",
                    Arc::new(AwaitedStore::shared()),
                    Policy::fixed_window(100, Duration::from_secs(60)).unwrap(),
                )
                .unwrap(),
            )
            .build()
            .unwrap()
    };
    let err = RateLimitLayer::new(shared(), random.clone())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"fleet\"") && err.contains("ClientIdentity::new"),
        "{err}"
    );
    assert!(RateLimitLayer::builder(shared(), random).build().is_err());
    assert!(RateLimitLayer::new(shared(), identity()).is_ok());
}
