//! The layer over a real socket: axum serving on 127.0.0.1, a hyper client.
//!
//! About 510 lines: one test per behaviour of the layer over a socket.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{Method, StatusCode};
use ratewarden::{
    AddressSource, ClientIdentity, Decision, FailurePolicy, HeaderMode, Limiter, ManualClock,
    Policy, RateLimitHeaders, RateLimitLayer, Rule, Store,
};
use ratewarden_conformance::broken::Unavailable as Failing;
use ratewarden_test_support::http::TestClient;
// The peer address as this build's layer reads it: axum's `ConnectInfo`
// with the `axum` feature, a plain `SocketAddr` extension without it.
#[cfg(feature = "axum")]
use ratewarden_test_support::http::serve;
#[cfg(not(feature = "axum"))]
use ratewarden_test_support::http::serve_with_socket_addr as serve;
use ratewarden_test_support::stores::{AwaitedStore, Recording};

const SECRET: &[u8; 32] = b"test secret, thirty-two bytes!!!";

fn identity() -> ClientIdentity {
    ClientIdentity::new(SECRET).unwrap()
}

fn limiter(
    name: &str,
    store: Arc<dyn Store>,
    policy: Policy,
    clock: &ManualClock,
    on_failure: FailurePolicy,
) -> Limiter {
    Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new(name, store, policy)
                .unwrap()
                .on_failure(on_failure),
        )
        .build()
        .unwrap()
}

/// A limiter whose one rule, `name`, decides on an exact store of its own
/// and fails open.
fn exact(name: &str, policy: Policy, clock: &ManualClock) -> Limiter {
    limiter(
        name,
        Arc::new(AwaitedStore::default()),
        policy,
        clock,
        FailurePolicy::Open,
    )
}

/// Serves [`app`] with `search` behind `identity` on a fresh port: the
/// server's address, and the count of requests that reached the handler.
async fn serve_search(search: Limiter, identity: ClientIdentity) -> (SocketAddr, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let server = serve(app(
        RateLimitLayer::new(search, identity).unwrap(),
        hits.clone(),
    ))
    .await;
    (server, hits)
}

/// A router whose `/api/search` is limited by `layer` and counts the
/// requests that reach the handler.
fn app(layer: RateLimitLayer, hits: Arc<AtomicUsize>) -> Router {
    Router::new()
        .route(
            "/api/search",
            get(move || {
                let hits = hits.clone();
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    "results"
                }
            })
            .layer(layer),
        )
        .route("/health", get(|| async { "ok" }))
}

/// A client of [`app`] with an [`exact`] `search` limiter of `policy` on
/// `clock`, and the count of requests that reached the handler.
async fn search_client(policy: Policy, clock: &ManualClock) -> (TestClient, Arc<AtomicUsize>) {
    let (server, hits) = serve_search(exact("search", policy, clock), identity()).await;
    (TestClient::new(server, None), hits)
}

#[tokio::test]
async fn the_61st_search_in_a_minute_is_refused_with_headers_and_json() {
    let clock = ManualClock::new();
    let policy = Policy::sliding_log(60, Duration::from_secs(60)).unwrap();
    let (client, hits) = search_client(policy, &clock).await;

    for i in 1..=60u64 {
        let reply = client.get("/api/search?q=rust").await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}: {reply:?}");
        assert_eq!(reply.body, "results");
        assert_eq!(reply.limit(), 60);
        assert_eq!(reply.remaining(), 60 - i);
        assert_eq!(reply.reset(), 60);
        reply.assert_consistent("search", 60);
        clock.advance(Duration::from_millis(100));
    }
    assert_eq!(hits.load(Ordering::SeqCst), 60);

    let refused = client.get("/api/search?q=rust").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // The first admitted request was 6 s ago: it leaves the window in 54 s.
    assert_eq!(refused.header_u64("retry-after"), 54);
    assert_eq!(refused.remaining(), 0);
    assert_eq!(refused.reset(), 60);
    assert_eq!(refused.header("ratelimit-policy"), "\"search\";q=60;w=60");
    assert_eq!(refused.header("ratelimit"), "\"search\";r=0;t=60");
    refused.assert_consistent("search", 60);
    let json = refused.json();
    assert_eq!(json["error"], "rate_limited");
    assert_eq!(json["retry_after"], 54);
    assert_eq!(json["window"], 60);
    // A refused request never reaches the handler.
    assert_eq!(hits.load(Ordering::SeqCst), 60);

    // Routes without the layer are not limited and carry no headers.
    let health = client.get("/health").await;
    assert_eq!(health.status, StatusCode::OK);
    assert!(health.headers.get("ratelimit").is_none());
}

/// `RateLimitLayer::quota` is returned by an axum handler as it is: its
/// body is one axum accepts, and what it says is the quota the client's
/// next request on the limited route would find.
#[tokio::test]
async fn an_axum_handler_answers_with_the_quota_as_it_is() {
    let clock = ManualClock::new();
    let policy = Policy::sliding_log(60, Duration::from_secs(60)).unwrap();
    let layer = RateLimitLayer::new(exact("search", policy, &clock), identity()).unwrap();
    let quota = layer.clone();
    let app = Router::new()
        .route("/api/search", get(|| async { "results" }).layer(layer))
        .route(
            "/api/quota",
            get(move |request: axum::extract::Request| {
                let layer = quota.clone();
                async move { layer.quota(&request.into_parts().0).await }
            }),
        );
    let client = TestClient::new(serve(app).await, None);
    for _ in 0..3 {
        client.get("/api/search?q=rust").await;
    }
    let reply = client.get("/api/quota").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.header("ratelimit"), "\"search\";r=57;t=60");
    assert_eq!(reply.json()["remaining"], 57);
    // Asking spent nothing.
    assert_eq!(client.get("/api/search?q=rust").await.remaining(), 56);
}

#[tokio::test]
async fn retry_after_is_exactly_long_enough() {
    let clock = ManualClock::new();
    let policy = Policy::sliding_log(3, Duration::from_secs(10)).unwrap();
    let (client, _) = search_client(policy, &clock).await;

    // Admitted at +0.3 s, +2 s, +4 s; the oldest leaves the window at
    // +10.3 s, so a refusal at +5 s must wait 5.3 s: Retry-After 6.
    clock.advance(Duration::from_millis(300));
    for step in [1700, 2000] {
        assert_eq!(client.get("/api/search").await.status, StatusCode::OK);
        clock.advance(Duration::from_millis(step));
    }
    assert_eq!(client.get("/api/search").await.status, StatusCode::OK);
    clock.advance(Duration::from_secs(1));
    let refused = client.get("/api/search").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after = refused.header_u64("retry-after");
    assert_eq!(retry_after, 6);
    refused.assert_consistent("search", 10);

    // One second less than Retry-After: still refused (hammering meanwhile
    // must not push the window: refusals are not recorded).
    clock.advance(Duration::from_secs(retry_after - 1));
    let early = client.get("/api/search").await;
    assert_eq!(early.status, StatusCode::TOO_MANY_REQUESTS, "{early:?}");
    assert_eq!(early.header_u64("retry-after"), 1);
    // Exactly Retry-After after the first refusal: admitted.
    clock.advance(Duration::from_secs(1));
    let admitted = client.get("/api/search").await;
    assert_eq!(admitted.status, StatusCode::OK, "{admitted:?}");
    admitted.assert_consistent("search", 10);
}

#[tokio::test]
async fn clients_at_different_peer_addresses_are_independent() {
    let clock = ManualClock::new();
    let policy = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let search = exact("search", policy, &clock);
    let (server, _) = serve_search(search, identity()).await;
    let a = TestClient::new(server, Some(IpAddr::from([127, 0, 0, 1])));
    let b = TestClient::new(server, Some(IpAddr::from([127, 0, 0, 2])));

    assert_eq!(a.get("/api/search").await.status, StatusCode::OK);
    assert_eq!(a.get("/api/search").await.status, StatusCode::OK);
    assert_eq!(
        a.get("/api/search").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let first_b = b.get("/api/search").await;
    assert_eq!(first_b.status, StatusCode::OK, "{first_b:?}");
    assert_eq!(first_b.remaining(), 1);
    // A forwarding header means nothing when the source is the peer.
    let spoofed = a.get_forwarded_for("/api/search", "198.51.100.9").await;
    assert_eq!(spoofed.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn clients_behind_one_trusted_proxy_are_told_apart_by_x_forwarded_for() {
    let clock = ManualClock::new();
    let policy = Policy::fixed_window(2, Duration::from_secs(60)).unwrap();
    let search = exact("search", policy, &clock);
    let identity = identity().with_source(AddressSource::x_forwarded_for(1).unwrap());
    let (server, _) = serve_search(search, identity).await;
    // The test client plays the proxy: it appends the client's address.
    let proxy = TestClient::new(server, None);
    let as_client = async |xff: &str| proxy.get_forwarded_for("/api/search", xff).await;

    assert_eq!(as_client("198.51.100.1").await.status, StatusCode::OK);
    assert_eq!(as_client("198.51.100.1").await.status, StatusCode::OK);
    assert_eq!(
        as_client("198.51.100.1").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The offender writes fresh addresses in front of the proxy's entry:
    // ignored, still refused.
    for spoof in ["1.2.3.4, 198.51.100.1", "garbage, 10.9.8.7, 198.51.100.1"] {
        assert_eq!(
            as_client(spoof).await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{spoof}"
        );
    }
    // Another client behind the same proxy has its own quota.
    let other = as_client("198.51.100.2").await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.remaining(), 1);
}

#[tokio::test]
async fn a_failing_store_fails_open_or_closed_and_never_500() {
    for (on_failure, expected) in [
        (FailurePolicy::Open, StatusCode::OK),
        (FailurePolicy::Closed, StatusCode::TOO_MANY_REQUESTS),
    ] {
        let clock = ManualClock::new();
        let policy = Policy::sliding_log(60, Duration::from_secs(60)).unwrap();
        let search = limiter("search", Arc::new(Failing), policy, &clock, on_failure);
        let (server, hits) = serve_search(search, identity()).await;
        let client = TestClient::new(server, None);
        for _ in 0..3 {
            let reply = client.get("/api/search").await;
            assert_eq!(reply.status, expected, "{on_failure:?}: {reply:?}");
            assert_eq!(reply.limit(), 60);
            assert_eq!(reply.remaining(), 0);
            reply.assert_consistent("search", 60);
            if expected == StatusCode::TOO_MANY_REQUESTS {
                assert_eq!(reply.header_u64("retry-after"), 1);
            }
        }
        let reached = if on_failure == FailurePolicy::Open {
            3
        } else {
            0
        };
        assert_eq!(hits.load(Ordering::SeqCst), reached, "{on_failure:?}");
    }
}

#[tokio::test]
async fn different_routes_have_different_limits() {
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(AwaitedStore::default());
    let per = |name: &str, limit, secs| {
        let policy = Policy::sliding_log(limit, Duration::from_secs(secs)).unwrap();
        RateLimitLayer::new(
            limiter(name, store.clone(), policy, &clock, FailurePolicy::Open),
            identity(),
        )
        .unwrap()
    };
    let app = Router::new()
        .route(
            "/api/feedback",
            axum::routing::post(|| async { "thanks" }).layer(per("feedback", 1, 3600)),
        )
        .route(
            "/api/search",
            get(|| async { "results" }).layer(per("search", 2, 60)),
        );
    let client = TestClient::new(serve(app).await, None);

    let feedback = client.send(Method::POST, "/api/feedback", &[]).await;
    assert_eq!(feedback.status, StatusCode::OK);
    feedback.assert_consistent("feedback", 3600);
    let feedback = client.send(Method::POST, "/api/feedback", &[]).await;
    assert_eq!(feedback.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(feedback.header_u64("retry-after"), 3600);
    feedback.assert_consistent("feedback", 3600);
    // Search has its own quota and policy name.
    let search = client.get("/api/search").await;
    assert_eq!(search.status, StatusCode::OK);
    assert_eq!(search.header("ratelimit-policy"), "\"search\";q=2;w=60");
}

/// Every textual form of the addresses used below.
fn raw_forms(addr: &str) -> Vec<String> {
    let ip: IpAddr = addr.parse().unwrap();
    let mut forms = vec![addr.to_owned(), ip.to_string()];
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            forms.push(format!("::ffff:{v4}"));
            forms.push(format!("{:02x}{:02x}{:02x}{:02x}", o[0], o[1], o[2], o[3]));
            forms.push(u32::from(v4).to_string());
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            forms.push(
                s.iter()
                    .map(|x| format!("{x:04x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
            );
            forms.push(s.iter().map(|x| format!("{x:04x}")).collect::<String>());
            // The /64 network alone, in both notations.
            forms.push(
                s[..4]
                    .iter()
                    .map(|x| format!("{x:x}"))
                    .collect::<Vec<_>>()
                    .join(":"),
            );
            forms.push(
                s[..4]
                    .iter()
                    .map(|x| format!("{x:04x}"))
                    .collect::<String>(),
            );
        }
    }
    forms
}

#[tokio::test]
async fn no_raw_address_ever_reaches_a_store() {
    let clock = ManualClock::new();
    #[cfg(feature = "memory")]
    let inner = ratewarden::memory::MemoryStore::new(10_000);
    #[cfg(not(feature = "memory"))]
    let inner = AwaitedStore::default();
    let store = Arc::new(Recording::new(inner));
    let policy = Policy::gcra(1000, Duration::from_secs(60)).unwrap();
    let mk = |source: AddressSource| {
        RateLimitLayer::new(
            limiter(
                "search",
                store.clone() as Arc<dyn Store>,
                policy,
                &clock,
                FailurePolicy::Open,
            ),
            identity().with_source(source),
        )
        .unwrap()
    };
    let app = Router::new()
        .route(
            "/peer",
            get(|| async { "ok" }).layer(mk(AddressSource::peer())),
        )
        .route(
            "/xff",
            get(|| async { "ok" }).layer(mk(AddressSource::x_forwarded_for(1).unwrap())),
        )
        .route(
            "/fwd",
            get(|| async { "ok" }).layer(mk(AddressSource::forwarded(1).unwrap())),
        )
        .route(
            "/cf",
            get(|| async { "ok" }).layer(mk(AddressSource::header("cf-connecting-ip").unwrap())),
        );
    let server = serve(app).await;
    let c1 = TestClient::new(server, Some(IpAddr::from([127, 0, 0, 1])));
    let c2 = TestClient::new(server, Some(IpAddr::from([127, 0, 0, 2])));

    let v4 = "203.0.113.77";
    let v6 = "2001:db8:abcd:12::1";
    let mapped = "::ffff:198.51.100.23";
    for c in [&c1, &c2] {
        assert_eq!(c.get("/peer").await.status, StatusCode::OK);
        for addr in [v4, v6, mapped] {
            let xff = format!("10.1.2.3, {addr}");
            let fwd = format!("for=10.1.2.3, for=\"[{addr}]:443\"");
            let fwd4 = format!("for=\"{addr}:80\"");
            for (path, name, value) in [
                ("/xff", "x-forwarded-for", xff.as_str()),
                ("/fwd", "forwarded", fwd.as_str()),
                ("/fwd", "forwarded", fwd4.as_str()),
                ("/cf", "cf-connecting-ip", addr),
            ] {
                let reply = c.send(Method::GET, path, &[(name, value)]).await;
                assert_eq!(reply.status, StatusCode::OK);
            }
        }
    }

    let keys = store.keys();
    assert!(keys.len() >= 26, "only {} keys recorded", keys.len());
    let mut forbidden = Vec::new();
    for addr in [
        "127.0.0.1",
        "127.0.0.2",
        v4,
        v6,
        "198.51.100.23",
        "10.1.2.3",
    ] {
        forbidden.extend(raw_forms(addr));
    }
    let mut distinct = std::collections::HashSet::new();
    for key in &keys {
        // Exactly: rule name, `:`, 32 lowercase hex characters.
        let (rule, client) = key.split_at(b"search:".len());
        assert_eq!(rule, b"search:");
        assert_eq!(client.len(), 32);
        assert!(
            client
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)),
            "{key:?}"
        );
        let text = String::from_utf8_lossy(key).to_lowercase();
        for form in &forbidden {
            assert!(!text.contains(&form.to_lowercase()), "{form} in {text:?}");
        }
        distinct.insert(client.to_vec());
    }
    // 127.0.0.1, 127.0.0.2, the v4, the v6 /64, the mapped one.
    assert_eq!(distinct.len(), 5, "{distinct:?}");
}

#[tokio::test]
async fn a_plain_tower_service_reads_a_socket_addr_extension() {
    use std::future::poll_fn;
    use tower::{Layer, Service};

    let clock = ManualClock::new();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let layer = RateLimitLayer::new(exact("api", policy, &clock), identity()).unwrap();
    let mut service = layer.layer(tower::service_fn(|_req: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(
            bytes::Bytes::from_static(b"ok"),
        )))
    }));
    for (peer, expected) in [
        ("192.0.2.1:5000", StatusCode::OK),
        // Same address, another port: the same client.
        ("192.0.2.1:5001", StatusCode::TOO_MANY_REQUESTS),
        ("192.0.2.2:5000", StatusCode::OK),
    ] {
        let mut request = http::Request::new(String::new());
        request
            .extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        let response = service.call(request).await.unwrap();
        assert_eq!(response.status(), expected, "{peer}");
    }
}

/// A refusal by an escalating rule's durable store carries the durable
/// policy's limit, so its headers name that policy and its window: never
/// the local limit beside the durable window. `RateLimit-Policy` lists both
/// policies on every response.
#[tokio::test]
async fn a_durable_refusal_describes_the_durable_policy() {
    let clock = ManualClock::new();
    let local = Policy::sliding_log(10, Duration::from_secs(60)).unwrap();
    let durable = Policy::sliding_log(1, Duration::from_secs(3600)).unwrap();
    let search = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new("search", Arc::new(AwaitedStore::default()), local)
                .unwrap()
                // Every admitted request is checked against the durable store.
                .with_escalation(Arc::new(AwaitedStore::default()), durable, 1, None)
                .unwrap(),
        )
        .build()
        .unwrap();
    let (server, hits) = serve_search(search, identity()).await;
    let client = TestClient::new(server, None);
    let first = client.get("/api/search").await;
    assert_eq!(first.status, StatusCode::OK);
    let both = "\"search\";q=10;w=60, \"search/durable\";q=1;w=3600";
    assert_eq!(first.header("ratelimit-policy"), both);
    assert_eq!(first.header("ratelimit"), "\"search\";r=9;t=60");
    let refused = client.get("/api/search").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.limit(), 1);
    assert_eq!(refused.header("ratelimit-policy"), both);
    assert_eq!(refused.header("ratelimit"), "\"search/durable\";r=0;t=3600");
    assert_eq!(refused.json()["policy"], "search/durable");
    assert_eq!(refused.json()["window"], 3600);
    assert_eq!(refused.header_u64("retry-after"), 3600);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}

/// `Retry-After` in whole seconds, rounded up for every wait: a whole one
/// is itself, anything past a whole second (by a microsecond) is the next
/// one, a sub-second wait is one second, and an admission has none. The
/// JSON body says the same.
#[test]
fn retry_after_rounds_up_whole_fractional_and_sub_second_waits() {
    let clock = ManualClock::new();
    let policy = Policy::fixed_window(60, Duration::from_secs(60)).unwrap();
    let headers = RateLimitHeaders::new(&exact("search", policy, &clock), HeaderMode::Both);
    let refused = |retry_after: Duration| {
        Decision::new(
            false,
            &policy,
            0,
            Duration::from_secs(60),
            retry_after,
            "reference",
        )
    };
    for (wait, shown) in [
        (Duration::from_secs(60), "60"),
        (Duration::from_secs(1), "1"),
        (Duration::from_micros(59_000_001), "60"),
        (Duration::from_micros(60_999_999), "61"),
        (Duration::from_micros(1), "1"),
        (Duration::from_nanos(1), "1"),
        (Duration::from_millis(999), "1"),
        (Duration::ZERO, "0"),
    ] {
        let decision = refused(wait);
        let mut map = http::HeaderMap::new();
        headers.write(&decision, &mut map);
        assert_eq!(
            map.get("retry-after").map(|v| v.to_str().unwrap()),
            Some(shown),
            "{wait:?}"
        );
        let response = headers.refusal(&decision).into_http();
        assert_eq!(response.headers()["retry-after"], shown, "{wait:?}");
        let json: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(json["retry_after"].to_string(), shown, "{wait:?}");
    }
    let allowed = Decision::new(
        true,
        &policy,
        59,
        Duration::from_secs(60),
        Duration::ZERO,
        "reference",
    );
    let mut map = http::HeaderMap::new();
    headers.write(&allowed, &mut map);
    assert!(map.get("retry-after").is_none(), "{map:?}");
    assert_eq!(map["x-ratelimit-remaining"], "59", "{map:?}");
}

/// Over the socket: a wait of exactly one window is that many seconds,
/// not one more or one less, and a wait of one microsecond is one second.
#[tokio::test]
async fn a_whole_minute_wait_says_60_and_a_microsecond_says_1() {
    let clock = ManualClock::new();
    let policy = Policy::fixed_window(1, Duration::from_secs(60)).unwrap();
    let (client, _) = search_client(policy, &clock).await;
    assert_eq!(client.get("/api/search").await.status, StatusCode::OK);
    let refused = client.get("/api/search").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header_u64("retry-after"), 60, "{refused:?}");
    assert_eq!(refused.json()["retry_after"], 60);

    clock.advance(Duration::from_micros(59_999_999));
    let last = client.get("/api/search").await;
    assert_eq!(last.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(last.header_u64("retry-after"), 1, "{last:?}");
    clock.advance(Duration::from_micros(1));
    assert_eq!(client.get("/api/search").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_limit_in_shadow_mode_serves_everyone_and_says_so_when_asked() {
    let clock = ManualClock::new();
    let store: Arc<dyn Store> = Arc::new(AwaitedStore::default());
    let per_minute = |n| Policy::fixed_window(n, Duration::from_secs(60)).unwrap();
    let search = Limiter::builder()
        .clock(clock.clone())
        .rule(
            Rule::new("trial", store.clone(), per_minute(2))
                .unwrap()
                .with_shadow(true),
        )
        .rule(Rule::new("search", store, per_minute(4)).unwrap())
        .build()
        .unwrap();
    for shadow_header in [true, false] {
        let builder = RateLimitLayer::builder(search.clone(), identity());
        let builder = match shadow_header {
            true => builder.shadow_header(),
            false => builder,
        };
        let hits = Arc::new(AtomicUsize::new(0));
        let client = TestClient::new(serve(app(builder.build().unwrap(), hits)).await, None);
        let mut seen = Vec::new();
        for _ in 0..5 {
            let reply = client.get("/api/search").await;
            // The client's limit is the enforcing rule's alone.
            assert_eq!(reply.header("ratelimit-policy"), "\"search\";q=4;w=60");
            let shadow = reply
                .headers
                .get("x-ratelimit-shadow")
                .map(|v| v.to_str().unwrap().to_owned());
            seen.push((
                reply.status.as_u16(),
                reply.header("ratelimit").to_owned(),
                shadow,
            ));
        }
        let flag = |on: bool| (on && shadow_header).then(|| "refused".to_owned());
        assert_eq!(
            seen,
            [
                (200, "\"search\";r=3;t=60".to_owned(), flag(false)),
                (200, "\"search\";r=2;t=60".to_owned(), flag(false)),
                (200, "\"search\";r=1;t=60".to_owned(), flag(true)),
                (200, "\"search\";r=0;t=60".to_owned(), flag(true)),
                (429, "\"search\";r=0;t=60".to_owned(), flag(true)),
            ],
            "shadow header {shadow_header}"
        );
        // The second round starts from fresh counts.
        clock.advance(Duration::from_secs(60));
    }
}

#[tokio::test]
async fn a_denied_client_gets_403_without_a_store_call_and_an_allowed_one_is_not_limited() {
    let clock = ManualClock::new();
    let store = Arc::new(Recording::new(AwaitedStore::default()));
    let search = limiter(
        "search",
        store.clone(),
        Policy::fixed_window(2, Duration::from_secs(60)).unwrap(),
        &clock,
        FailurePolicy::Open,
    );
    let api_keys = identity().hasher("header:x-api-key");
    let access = ratewarden::access::AccessList::new()
        .allow("127.0.0.2")
        .unwrap()
        .deny("127.0.0.3/32")
        .unwrap()
        .allow("127.0.0.0/24")
        .unwrap()
        .deny("127.0.0.4")
        .unwrap()
        .deny_key(identity().key_for_addr(IpAddr::from([127, 0, 0, 5])))
        .allow_key(api_keys.key(b"partner"));
    let layer = RateLimitLayer::builder(search.clone(), identity())
        .access(access.clone())
        .build()
        .unwrap();
    // A denied client asking for its quota is forbidden too, not "not
    // limited".
    let mut request = http::Request::new(());
    request
        .extensions_mut()
        .insert(std::net::SocketAddr::from(([127, 0, 0, 3], 4000)));
    let (parts, ()) = request.into_parts();
    assert_eq!(layer.quota(&parts).await.status(), StatusCode::FORBIDDEN);
    let hits = Arc::new(AtomicUsize::new(0));
    let server = serve(app(layer, hits.clone())).await;
    let at = |last: u8| TestClient::new(server, Some(IpAddr::from([127, 0, 0, last])));

    // Denied by range: 403 every time, the handler and the store never
    // reached, whatever forwarding header the client sends.
    for client in [at(3), at(4)] {
        for _ in 0..3 {
            let reply = client.get("/api/search").await;
            assert_eq!(reply.status, StatusCode::FORBIDDEN, "{reply:?}");
            assert_eq!(reply.json()["error"], "forbidden");
            assert!(reply.headers.get("ratelimit").is_none());
        }
        let spoofed = client.get_forwarded_for("/api/search", "127.0.0.2").await;
        assert_eq!(spoofed.status, StatusCode::FORBIDDEN);
    }
    // Denied by key: the address's key is listed.
    assert_eq!(at(5).get("/api/search").await.status, StatusCode::FORBIDDEN);
    assert_eq!((hits.load(Ordering::SeqCst), store.calls()), (0, 0));

    // Allowed: served past the limit, no store call, no rate-limit header.
    for _ in 0..5 {
        let reply = at(2).get("/api/search").await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert!(reply.headers.get("ratelimit").is_none());
    }
    assert_eq!((hits.load(Ordering::SeqCst), store.calls()), (5, 0));

    // 127.0.1.9 is on neither list: limited as usual.
    let limited = TestClient::new(server, Some(IpAddr::from([127, 0, 1, 9])));
    let statuses: Vec<u16> = {
        let mut s = Vec::new();
        for _ in 0..3 {
            s.push(limited.get("/api/search").await.status.as_u16());
        }
        s
    };
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(store.calls(), 3);

    // Keys other extractors derive are listed the same way.
    let layer = RateLimitLayer::builder(search, identity())
        .key(ratewarden::key::HeaderKey::new(&identity(), "x-api-key").unwrap())
        .access(access)
        .build()
        .unwrap();
    let server = serve(app(layer, hits.clone())).await;
    let client = TestClient::new(server, Some(IpAddr::from([127, 0, 1, 10])));
    for _ in 0..4 {
        let reply = client
            .send(Method::GET, "/api/search", &[("x-api-key", "partner")])
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    assert_eq!(store.calls(), 3);
}

/// A 402 that charged a penalty carries the headers of what it left, on a
/// store answered inline and on one that must be awaited (the layer's two
/// roads to the handler).
#[tokio::test]
async fn a_penalty_the_handler_charges_shows_in_its_responses_headers() {
    for awaited in [false, true] {
        let clock = ManualClock::new();
        let policy = Policy::fixed_window(10, Duration::from_secs(3600)).unwrap();
        let store: Arc<dyn Store> = if awaited {
            Arc::new(AwaitedStore::default())
        } else {
            Arc::new(ratewarden_conformance::broken::ReferenceStore::new(100))
        };
        let layer = RateLimitLayer::new(
            limiter("pay", store, policy, &clock, FailurePolicy::Open),
            identity(),
        )
        .unwrap();
        let handler_layer = layer.clone();
        let app = Router::new().route(
            "/pay",
            get(move |request: axum::extract::Request| {
                let layer = handler_layer.clone();
                async move {
                    let (parts, _) = request.into_parts();
                    let mut response =
                        axum::response::IntoResponse::into_response(StatusCode::PAYMENT_REQUIRED);
                    let after = layer.penalize_and_peek(&parts, 4).await.unwrap().unwrap();
                    response.extensions_mut().insert(after);
                    response
                }
            })
            .layer(layer),
        );
        let client = TestClient::new(serve(app).await, None);
        let first = client.get("/pay").await;
        assert_eq!(first.status, StatusCode::PAYMENT_REQUIRED);
        // 1 admitted and 4 charged of 10: 5 left, not the admission's 9.
        assert_eq!(first.remaining(), 5, "awaited: {awaited}: {first:?}");
        assert_eq!(
            client.get("/pay").await.remaining(),
            0,
            "awaited: {awaited}"
        );
    }
}
