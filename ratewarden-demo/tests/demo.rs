//! The demo server over a real socket, driven by a manual clock.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use ratewarden::memory::MemoryStore;
use ratewarden::{AddressSource, ClientIdentity, FailurePolicy, ManualClock, Store};
use ratewarden_conformance::broken::Unavailable as Failing;
use ratewarden_demo::{Config, FlagLimits, Settings, Stores, app, cli};
use ratewarden_test_support::http::{Reply, TestClient, serve};

const SECRET: &str = "demo test secret of 32+ bytes!!!";

fn settings(clock: &ManualClock) -> Settings {
    Settings {
        limits: FlagLimits::default(),
        stores: Stores {
            primary: Arc::new(MemoryStore::new(1_000)),
            local_tier: None,
            leased: None,
        },
        identity: ClientIdentity::new(SECRET).unwrap(),
        clock: Arc::new(clock.clone()),
        on_failure: FailurePolicy::Open,
        admin_token: None,
        api_keys: Default::default(),
        file: None,
        shadow: Vec::new(),
    }
}

async fn start(settings: &Settings) -> std::net::SocketAddr {
    serve(app(settings).unwrap()).await
}

async fn post(client: &TestClient, path: &str) -> Reply {
    client.send(Method::POST, path, &[]).await
}

#[tokio::test]
async fn wrong_methods_and_preflights_are_never_charged() {
    let clock = ManualClock::new();
    let client = TestClient::new(start(&settings(&clock)).await, None);
    for _ in 0..10 {
        let get = client.get("/api/feedback").await;
        assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
        assert!(
            get.headers.get("ratelimit").is_none(),
            "a 405 is not limited"
        );
        let preflight = client.send(Method::OPTIONS, "/api/feedback", &[]).await;
        assert_eq!(preflight.status, StatusCode::METHOD_NOT_ALLOWED);
    }
    // The full quota of 5 feedback posts is still there.
    for i in 1..=5u64 {
        let reply = post(&client, "/api/feedback").await;
        assert_eq!(reply.status, StatusCode::OK, "post {i}");
        assert_eq!(reply.remaining(), 5 - i);
    }
    assert_eq!(
        post(&client, "/api/feedback").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_61st_search_in_a_minute_is_refused() {
    let clock = ManualClock::new();
    let client = TestClient::new(start(&settings(&clock)).await, None);
    for i in 1..=60u64 {
        let reply = client.get("/api/search?q=rust").await;
        assert_eq!(reply.status, StatusCode::OK, "search {i}");
        assert_eq!(reply.body, r#"{"results":[]}"#);
        assert_eq!(reply.remaining(), 60 - i);
        reply.assert_consistent("search", 60);
        clock.advance(Duration::from_millis(500));
    }
    let refused = client.get("/api/search?q=rust").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // 30 s have passed since the first search.
    assert_eq!(refused.header_u64("retry-after"), 30);
    assert_eq!(refused.header("ratelimit-policy"), "\"search\";q=60;w=60");
    assert_eq!(refused.header("ratelimit"), "\"search\";r=0;t=60");
    refused.assert_consistent("search", 60);
    assert!(
        refused
            .body
            .starts_with(r#"{"error":"rate_limited","retry_after":30,"#),
        "{}",
        refused.body
    );
    // The other endpoints keep their own quotas.
    let feedback = post(&client, "/api/feedback").await;
    assert_eq!(feedback.status, StatusCode::OK);
    assert_eq!(
        feedback.header("ratelimit-policy"),
        "\"feedback\";q=5;w=3600"
    );
    assert_eq!(client.get("/health").await.status, StatusCode::OK);
}

#[tokio::test]
async fn retry_after_on_feedback_is_honoured_to_the_second() {
    let clock = ManualClock::new();
    let client = TestClient::new(start(&settings(&clock)).await, None);
    // Five posts, 7 min 30.5 s apart: the first leaves the hour at
    // 60 min, i.e. 1799.5 s after the last one plus 1 s of waiting.
    for _ in 0..5 {
        let reply = post(&client, "/api/feedback").await;
        assert_eq!(reply.status, StatusCode::OK);
        clock.advance(Duration::from_millis(450_500));
    }
    // Now at 37 min 32.5 s; the first post expires at 60 min.
    let refused = post(&client, "/api/feedback").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    refused.assert_consistent("feedback", 3600);
    let retry_after = refused.header_u64("retry-after");
    assert_eq!(retry_after, 1348); // 1347.5 s, rounded up

    clock.advance(Duration::from_secs(retry_after - 1));
    let early = post(&client, "/api/feedback").await;
    assert_eq!(early.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(early.header_u64("retry-after"), 1);
    clock.advance(Duration::from_secs(1));
    let admitted = post(&client, "/api/feedback").await;
    assert_eq!(admitted.status, StatusCode::OK);
    assert_eq!(admitted.remaining(), 0);
}

#[tokio::test]
async fn clients_at_different_addresses_have_their_own_quota() {
    let clock = ManualClock::new();
    let server = start(&settings(&clock)).await;
    let a = TestClient::new(server, Some(IpAddr::from([127, 0, 0, 1])));
    let b = TestClient::new(server, Some(IpAddr::from([127, 0, 0, 2])));
    for _ in 0..10 {
        assert_eq!(post(&a, "/api/contact").await.status, StatusCode::OK);
    }
    let refused = post(&a, "/api/contact").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header_u64("retry-after"), 86_400);
    let other = post(&b, "/api/contact").await;
    assert_eq!(other.status, StatusCode::OK);
    assert_eq!(other.remaining(), 9);
}

#[tokio::test]
async fn behind_a_trusted_proxy_clients_are_keyed_by_x_forwarded_for() {
    let clock = ManualClock::new();
    let mut settings = settings(&clock);
    settings.limits.search_per_minute = 2;
    settings.identity = settings
        .identity
        .with_source(AddressSource::x_forwarded_for(1).unwrap());
    let proxy = TestClient::new(start(&settings).await, None);
    let search = async |xff: &str| proxy.get_forwarded_for("/api/search", xff).await.status;
    assert_eq!(search("203.0.113.1").await, StatusCode::OK);
    assert_eq!(search("203.0.113.1").await, StatusCode::OK);
    assert_eq!(search("203.0.113.1").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        search("9.9.9.9, 203.0.113.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(search("203.0.113.2").await, StatusCode::OK);
}

#[tokio::test]
async fn a_dead_shared_store_behind_the_memory_tier_never_yields_500() {
    for (on_failure, status) in [
        (FailurePolicy::Open, StatusCode::OK),
        (FailurePolicy::Closed, StatusCode::TOO_MANY_REQUESTS),
    ] {
        let clock = ManualClock::new();
        let mut settings = settings(&clock);
        settings.limits.search_per_minute = 3;
        settings.on_failure = on_failure;
        settings.stores = Stores {
            primary: Arc::new(Failing) as Arc<dyn Store>,
            local_tier: Some(Arc::new(MemoryStore::new(1_000))),
            leased: None,
        };
        let client = TestClient::new(start(&settings).await, None);
        for i in 0..3 {
            let reply = client.get("/api/search").await;
            assert_eq!(reply.status, status, "{on_failure:?}: {reply:?}");
            // Fail open: the headers come from the memory tier, the one
            // store that answered, with its real count. Fail closed: the
            // failed shared rule refuses, with nothing known to remain.
            let (shown, remaining) = if on_failure == FailurePolicy::Open {
                ("search-local", 2 - i)
            } else {
                ("search", 0)
            };
            assert_eq!(reply.remaining(), remaining);
            reply.assert_consistent(shown, 60);
        }
        // The memory tier still counts and enforces on its own.
        let reply = client.get("/api/search").await;
        if on_failure == FailurePolicy::Open {
            assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
            // Every policy of the route's limiter is listed; the one that
            // decided is named by `RateLimit`.
            assert_eq!(
                reply.header("ratelimit-policy"),
                "\"search-local\";q=3;w=60, \"search\";q=3;w=60"
            );
            reply.assert_consistent("search-local", 60);
        } else {
            assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        }
    }
}

#[test]
fn command_line_defaults_and_overrides() {
    let config =
        Config::from_matches(&cli().try_get_matches_from(["ratewarden-demo"]).unwrap()).unwrap();
    assert_eq!(config.listen.to_string(), "127.0.0.1:3000");
    assert_eq!(config.store, "memory://");
    assert!(!config.tiered);
    assert_eq!(config.limits, FlagLimits::default());
    assert_eq!(config.on_failure, FailurePolicy::Open);

    let config = Config::from_matches(
        &cli()
            .try_get_matches_from([
                "ratewarden-demo",
                "--listen",
                "0.0.0.0:8080",
                "--search-per-minute",
                "100",
                "--client-address",
                "x-forwarded-for:2",
                "--fail-closed",
                "--secret",
                SECRET,
            ])
            .unwrap(),
    )
    .unwrap();
    assert_eq!(config.listen.port(), 8080);
    assert_eq!(config.limits.search_per_minute, 100);
    assert_eq!(config.limits.feedback_per_hour, 5);
    assert_eq!(config.address_source.to_string(), "x-forwarded-for:2");
    assert_eq!(config.on_failure, FailurePolicy::Closed);
    assert!(config.identity(true).is_ok());

    // A short secret is refused; a missing one draws a random identity.
    let short = Config::from_matches(
        &cli()
            .try_get_matches_from(["ratewarden-demo", "--secret", "too short"])
            .unwrap(),
    )
    .unwrap();
    assert!(
        short
            .identity(false)
            .unwrap_err()
            .to_string()
            .contains("at least 32 bytes")
    );
    let none =
        Config::from_matches(&cli().try_get_matches_from(["ratewarden-demo"]).unwrap()).unwrap();
    assert!(none.identity(false).unwrap().is_random());
    // With a shared store, a missing secret is refused, naming the flag.
    let err = none.identity(true).unwrap_err().to_string();
    assert!(
        err.contains("--secret") && err.contains("RATEWARDEN_SECRET"),
        "{err}"
    );

    assert!(
        cli()
            .try_get_matches_from(["ratewarden-demo", "--listen", "nowhere"])
            .is_err()
    );
    assert!(
        cli()
            .try_get_matches_from(["ratewarden-demo", "--search-per-minute", "-1"])
            .is_err()
    );
    let bad_source = cli()
        .try_get_matches_from(["ratewarden-demo", "--client-address", "xff:0"])
        .unwrap();
    assert!(Config::from_matches(&bad_source).is_err());

    // Shadow mode by route name, repeated or comma-separated; an unknown
    // name is refused, naming the routes.
    let shadow = |args: &[&str]| {
        Config::from_matches(
            &cli()
                .try_get_matches_from(["ratewarden-demo"].iter().chain(args))
                .unwrap(),
        )
        .map(|c| c.shadow)
        .map_err(|e| e.to_string())
    };
    assert_eq!(shadow(&[]).unwrap(), Vec::<String>::new());
    assert_eq!(
        shadow(&["--shadow", "search,login", "--shadow", "checkout"]).unwrap(),
        ["search", "login", "checkout"]
    );
    let err = shadow(&["--shadow", "uploads"]).unwrap_err();
    assert!(
        err.contains("\"uploads\"") && err.contains("feedback, contact, search"),
        "{err}"
    );
}

#[tokio::test]
async fn tiered_needs_a_shared_store() {
    let config = Config::from_matches(
        &cli()
            .try_get_matches_from(["ratewarden-demo", "--tiered"])
            .unwrap(),
    )
    .unwrap();
    let err = config.stores().await.unwrap_err().to_string();
    assert!(err.contains("--tiered"), "{err}");
    // Whether the limiter was built with Redis depends on feature
    // unification across the build; either way the demo must say the right
    // thing.
    let url = "redis://127.0.0.1:6379";
    let redis = Config::from_matches(
        &cli()
            .try_get_matches_from(["ratewarden-demo", "--store", url])
            .unwrap(),
    )
    .unwrap();
    match ratewarden::store::from_url(url).await {
        Err(e) => {
            assert!(e.to_string().contains("needs the `redis` feature"), "{e}");
            let err = redis.stores().await.unwrap_err().to_string();
            assert!(
                err.contains("cargo run -p ratewarden-demo --features redis"),
                "{err}"
            );
        }
        Ok(_) => assert!(redis.stores().await.unwrap().primary.capabilities().shared),
    }
    let zero = Config::from_matches(
        &cli()
            .try_get_matches_from(["ratewarden-demo", "--contact-per-day", "0"])
            .unwrap(),
    )
    .unwrap();
    let clock = ManualClock::new();
    let mut s = settings(&clock);
    s.limits = zero.limits;
    assert!(app(&s).is_err());
}

#[tokio::test]
async fn the_quota_is_told_without_being_spent() {
    let clock = ManualClock::new();
    let client = TestClient::new(start(&settings(&clock)).await, None);
    for _ in 0..3 {
        client.get("/api/search?q=rust").await;
    }
    for _ in 0..10 {
        let quota = client.get("/api/quota").await;
        assert_eq!(quota.status, StatusCode::OK);
        // What the client has left now, as the last search's response said.
        assert_eq!(quota.remaining(), 57);
        assert_eq!(quota.header("cache-control"), "no-store");
        quota.assert_consistent("search", 60);
        let body: serde_json::Value = serde_json::from_str(&quota.body).unwrap();
        assert_eq!(body["allowed"], true);
        assert_eq!(body["remaining"], 57);
        assert_eq!(body["policy"], "search");
    }
    assert_eq!(
        client.get("/api/search?q=rust").await.remaining(),
        56,
        "the quota requests spent nothing"
    );
    let feedback = client.get("/api/quota?route=feedback").await;
    assert_eq!(feedback.remaining(), 5, "no post yet: all 5 left");
    let unknown = client.get("/api/quota?route=nope").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(
        unknown.body.contains("feedback, contact, search"),
        "{unknown:?}"
    );

    // A refused client learns when it may retry, and asking again changes
    // nothing.
    for _ in 0..5 {
        post(&client, "/api/feedback").await;
    }
    clock.advance(Duration::from_secs(60));
    let refused = client.get("/api/quota?route=feedback").await;
    assert_eq!(refused.status, StatusCode::OK);
    let body: serde_json::Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(body["allowed"], false);
    assert_eq!(body["retry_after"], 3540);
    assert_eq!(refused.header_u64("retry-after"), 3540);
}

const TOKEN: &str = "an admin token of 24 bytes";

#[tokio::test]
async fn an_operator_resets_a_client_with_the_admin_token() {
    let clock = ManualClock::new();
    let mut with_admin = settings(&clock);
    with_admin.admin_token = Some(ratewarden_demo::admin::AdminToken::new(TOKEN).unwrap());
    let addr = start(&with_admin).await;
    let client = TestClient::new(addr, Some("127.0.0.2".parse().unwrap()));
    let operator = TestClient::new(addr, Some("127.0.0.3".parse().unwrap()));
    for _ in 0..5 {
        assert_eq!(post(&client, "/api/feedback").await.status, StatusCode::OK);
    }
    client.get("/api/search").await;
    assert_eq!(
        post(&client, "/api/feedback").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    let reset = "/admin/reset?client=127.0.0.2&route=feedback";
    for auth in [
        "",
        "Bearer wrong token of 24 bytes!",
        "an admin token of 24 bytes",
    ] {
        let headers: &[(&str, &str)] = if auth.is_empty() {
            &[]
        } else {
            &[("authorization", auth)]
        };
        let refused = operator.send(Method::POST, reset, headers).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{auth:?}");
    }
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let bad = operator
        .send(Method::POST, "/admin/reset?client=alice", &auth)
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let done = operator.send(Method::POST, reset, &auth).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let body: serde_json::Value = serde_json::from_str(&done.body).unwrap();
    assert_eq!(body["reset"], serde_json::json!(["feedback"]));
    assert!(
        !done.body.contains("127.0.0.2"),
        "the answer names the hashed key only"
    );
    // Exactly the full limit again on that route; the other route kept its
    // count.
    for i in 1..=5u64 {
        let reply = post(&client, "/api/feedback").await;
        assert_eq!(reply.status, StatusCode::OK, "post {i} after the reset");
        assert_eq!(reply.remaining(), 5 - i);
    }
    assert_eq!(
        post(&client, "/api/feedback").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(client.get("/api/search").await.remaining(), 58);
    // Every route when none is named.
    let all = operator
        .send(Method::POST, "/admin/reset?client=127.0.0.2", &auth)
        .await;
    let body: serde_json::Value = serde_json::from_str(&all.body).unwrap();
    assert_eq!(
        body["reset"],
        serde_json::json!([
            "feedback", "contact", "search", "login", "reports", "checkout"
        ])
    );
    assert_eq!(client.get("/api/search").await.remaining(), 59);
}

/// `--admin-token-file`: the token read from a file (its line end
/// ignored) authorizes the reset route as the token itself would; a file
/// that cannot be read or holds too short a token is refused, naming it.
#[tokio::test]
async fn the_admin_token_can_come_from_a_file() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ratewarden-demo-token");
    std::fs::create_dir_all(&dir).unwrap();
    let parse = |args: &[&str]| {
        let matches = cli()
            .try_get_matches_from(["ratewarden-demo"].iter().chain(args))
            .map_err(|e| e.to_string())?;
        Config::from_matches(&matches).map_err(|e| e.to_string())
    };
    let path = dir.join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
    let path = path.to_str().unwrap();
    let config = parse(&["--admin-token-file", path]).unwrap();
    let clock = ManualClock::new();
    let mut with_admin = settings(&clock);
    with_admin.admin_token = config.admin_token;
    let operator = TestClient::new(start(&with_admin).await, None);
    let reset = "/admin/reset?client=127.0.0.2";
    let bearer = format!("Bearer {TOKEN}");
    let done = operator
        .send(Method::POST, reset, &[("authorization", bearer.as_str())])
        .await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let wrong = [("authorization", "Bearer wrong token of 24 bytes!")];
    let refused = operator.send(Method::POST, reset, &wrong).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);

    let missing = dir.join("no such file");
    let error = parse(&["--admin-token-file", missing.to_str().unwrap()]).unwrap_err();
    assert!(
        error.contains("cannot read the admin token file") && error.contains("no such file"),
        "{error}"
    );
    let short = dir.join("short");
    std::fs::write(&short, "short\n").unwrap();
    let error = parse(&["--admin-token-file", short.to_str().unwrap()]).unwrap_err();
    assert!(
        error.contains(short.to_str().unwrap()) && error.contains("at least 16 bytes (it is 5)"),
        "{error}"
    );
    let both = parse(&["--admin-token-file", path, "--admin-token", TOKEN]).unwrap_err();
    assert!(both.contains("cannot be used with"), "{both}");
}

#[tokio::test]
async fn without_an_admin_token_there_is_no_reset_route() {
    let clock = ManualClock::new();
    let client = TestClient::new(start(&settings(&clock)).await, None);
    let reply = client
        .send(
            Method::POST,
            "/admin/reset?client=127.0.0.1",
            &[("authorization", "Bearer x")],
        )
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let short = ratewarden_demo::admin::AdminToken::new("short").unwrap_err();
    assert!(short.to_string().contains("at least 16 bytes"), "{short}");
}

/// `POST /api/login` with `password`, as a form.
async fn login(client: &TestClient, password: &str) -> ratewarden_test_support::http::Reply {
    let form = [("content-type", "application/x-www-form-urlencoded")];
    client
        .send_body(
            Method::POST,
            "/api/login",
            &form,
            format!("password={password}"),
        )
        .await
}

#[tokio::test]
async fn the_login_counts_only_failed_attempts() {
    let clock = ManualClock::new();
    let client = TestClient::new(start(&settings(&clock)).await, None);
    let login = |password: &'static str| login(&client, password);
    for _ in 0..20 {
        assert_eq!(login("demo").await.status, StatusCode::OK);
    }
    for i in 1..=5u64 {
        let reply = login("guess").await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "guess {i}");
        assert_eq!(reply.remaining(), 5 - i);
    }
    // Five failures: locked out, with the right password too.
    assert_eq!(login("demo").await.status, StatusCode::TOO_MANY_REQUESTS);
    let quota = client.get("/api/quota?route=login").await;
    let body: serde_json::Value = serde_json::from_str(&quota.body).unwrap();
    assert_eq!(body["allowed"], false);
    clock.advance(Duration::from_secs(15 * 60));
    assert_eq!(login("demo").await.status, StatusCode::OK);
}

#[tokio::test]
async fn a_client_that_keeps_guessing_is_banned_until_an_operator_resets_it() {
    let clock = ManualClock::new();
    let mut with_admin = settings(&clock);
    with_admin.admin_token = Some(ratewarden_demo::admin::AdminToken::new(TOKEN).unwrap());
    let addr = start(&with_admin).await;
    let client = TestClient::new(addr, Some("127.0.0.2".parse().unwrap()));
    let login = |password: &'static str| login(&client, password);
    let retry_after = |reply: &ratewarden_test_support::http::Reply| -> u64 {
        reply.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    for _ in 0..5 {
        assert_eq!(login("guess").await.status, StatusCode::UNAUTHORIZED);
    }
    // The first refusal waits for the window's end; the second bans for
    // an hour, and a ban's refusals never lengthen it.
    let first = login("guess").await;
    assert_eq!(first.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&first), 15 * 60);
    let banned = login("guess").await;
    assert_eq!(retry_after(&banned), 3600);
    for _ in 0..10 {
        clock.advance(Duration::from_secs(60));
        let reply = login("demo").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(retry_after(&reply) < 3600, "{:?}", reply.headers);
    }
    assert_eq!(retry_after(&login("demo").await), 3600 - 600);
    // Past the window, still banned: the ban outlasts it.
    clock.advance(Duration::from_secs(20 * 60));
    assert_eq!(login("demo").await.status, StatusCode::TOO_MANY_REQUESTS);
    let bearer = format!("Bearer {TOKEN}");
    let auth = [("authorization", bearer.as_str())];
    let done = client
        .send(
            Method::POST,
            "/admin/reset?client=127.0.0.2&route=login",
            &auth,
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    assert_eq!(login("demo").await.status, StatusCode::OK);
}

const PRO_KEY: &str = "a pro key of 16+ bytes";

#[tokio::test]
async fn an_api_key_chooses_the_plan_and_usage_carries_over() {
    let clock = ManualClock::new();
    let mut with_keys = settings(&clock);
    with_keys.api_keys =
        ratewarden_demo::plans::ApiKeys::parse([format!("{PRO_KEY}=pro").as_str()]).unwrap();
    let client = TestClient::new(start(&with_keys).await, Some("127.0.0.4".parse().unwrap()));
    let pro = [("x-api-key", PRO_KEY)];
    // Without a key: the free plan, 10 a minute.
    for i in 1..=10u64 {
        let reply = client.get("/api/reports").await;
        assert_eq!(reply.status, StatusCode::OK, "report {i}");
        assert_eq!(reply.limit(), 10);
        assert_eq!(reply.header("ratelimit-policy"), "\"reports\";q=10;w=60");
    }
    assert_eq!(
        client.get("/api/reports").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // An unknown key is refused before it is counted or limited.
    let unknown = client
        .send(
            Method::GET,
            "/api/reports",
            &[("x-api-key", "a guessed key of 16 bytes")],
        )
        .await;
    assert_eq!(unknown.status, StatusCode::UNAUTHORIZED);
    // The pro key: 100 a minute, and the 10 already spent count.
    let quota = client
        .send(Method::GET, "/api/quota?route=reports", &pro)
        .await;
    assert_eq!(quota.status, StatusCode::OK);
    assert_eq!(quota.limit(), 100);
    assert_eq!(quota.remaining(), 90);
    let mut admitted = 0;
    while client.send(Method::GET, "/api/reports", &pro).await.status == StatusCode::OK {
        admitted += 1;
    }
    assert_eq!(admitted, 90);
    let refused = client.send(Method::GET, "/api/reports", &pro).await;
    assert_eq!(refused.header("ratelimit-policy"), "\"reports\";q=100;w=60");
    // A minute later each plan has its whole limit again.
    clock.advance(Duration::from_secs(61));
    let reply = client.send(Method::GET, "/api/reports", &pro).await;
    assert_eq!(reply.remaining(), 99);
}

#[tokio::test]
async fn an_api_key_with_a_limit_of_its_own_is_held_to_it() {
    let clock = ManualClock::new();
    let mut with_keys = settings(&clock);
    let own = "a key with its own limit";
    with_keys.api_keys = ratewarden_demo::plans::ApiKeys::parse([
        format!("{PRO_KEY}=pro").as_str(),
        format!("{own}=gcra 1/s burst 3").as_str(),
    ])
    .unwrap();
    let client = TestClient::new(start(&with_keys).await, Some("127.0.0.5".parse().unwrap()));
    let key = [("x-api-key", own)];
    // Another algorithm than the plans': a burst of 3, then one a second.
    for i in 0..3u64 {
        let reply = client.send(Method::GET, "/api/reports", &key).await;
        assert_eq!(reply.status, StatusCode::OK, "report {i}");
        assert_eq!(reply.header("ratelimit-policy"), "\"reports\";q=3;w=3");
        assert_eq!(reply.remaining(), 2 - i);
    }
    let refused = client.send(Method::GET, "/api/reports", &key).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), "1");
    clock.advance(Duration::from_secs(1));
    let reply = client.send(Method::GET, "/api/reports", &key).await;
    assert_eq!(reply.status, StatusCode::OK);
    // The same client without the key is on the free plan, counted apart
    // (another algorithm).
    assert_eq!(client.get("/api/reports").await.remaining(), 9);
}

#[tokio::test]
async fn a_declined_card_costs_its_client_five_payments() {
    let clock = ManualClock::new();
    let client = TestClient::new(
        start(&settings(&clock)).await,
        Some("127.0.0.5".parse().unwrap()),
    );
    let paid = client
        .send_body(Method::POST, "/api/checkout", &[], "card=4242".into())
        .await;
    assert_eq!(paid.status, StatusCode::OK);
    assert_eq!(paid.remaining(), 9);
    for remaining in [4, 0] {
        let declined = client
            .send_body(Method::POST, "/api/checkout", &[], "card=declined".into())
            .await;
        assert_eq!(declined.status, StatusCode::PAYMENT_REQUIRED);
        // The headers say what the penalty left: 10 - 1 - 5, then none.
        assert_eq!(declined.remaining(), remaining);
    }
    // 1 + 5 + 5 of 10 would be 11: the second penalty filled the window.
    let refused = client
        .send_body(Method::POST, "/api/checkout", &[], "card=4242".into())
        .await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
}

/// `--lease`: the routes on a window algorithm buy the shared store's
/// units in batches; the others (the default sliding logs) ask it for each
/// request. A client's 60 searches a minute cost the shared store a
/// handful of calls, and the 61st is refused as without a lease.
#[tokio::test]
async fn a_lease_buys_window_routes_in_batches_and_leaves_the_others_alone() {
    use ratewarden::Policy;
    use ratewarden::lease::{LeaseConfig, LeasedStore};
    use ratewarden_conformance::broken::ReferenceStore;
    use ratewarden_conformance::composition::Switch;
    let clock = ManualClock::new();
    let shared =
        Switch::<dyn Store>::new(Arc::new(ReferenceStore::new(10_000).shared_as("shared")));
    let mut settings = settings(&clock);
    settings.limits.policies.search =
        Some(Policy::sliding_window(60, Duration::from_secs(60)).unwrap());
    settings.stores = Stores {
        primary: shared.clone(),
        local_tier: None,
        leased: Some(Arc::new(LeasedStore::new(
            shared.clone(),
            LeaseConfig::new(16).unwrap(),
        ))),
    };
    let client = TestClient::new(start(&settings).await, None);
    for i in 1..=60u64 {
        let reply = client.get("/api/search?q=x").await;
        assert_eq!(reply.status, StatusCode::OK, "search {i}");
        assert_eq!(reply.remaining(), 60 - i);
    }
    assert_eq!(
        client.get("/api/search?q=x").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Batches of 1, 2, 4, 8, 16, then what is left, and one refusal.
    let searches = shared.calls();
    assert!(
        searches <= 10,
        "{searches} shared-store calls for 61 searches"
    );
    // The feedback route's sliding log is not leased: a call per post.
    for _ in 0..3 {
        assert_eq!(post(&client, "/api/feedback").await.status, StatusCode::OK);
    }
    assert_eq!(shared.calls(), searches + 3);
}

#[tokio::test]
async fn a_lease_needs_a_shared_store() {
    let config = Config::from_matches(
        &cli()
            .try_get_matches_from(["ratewarden-demo", "--lease", "16"])
            .unwrap(),
    )
    .unwrap();
    assert_eq!(config.lease, Some(16));
    let err = config.stores().await.unwrap_err().to_string();
    assert!(err.contains("--lease"), "{err}");
}

/// Two demo servers on one Redis, as two instances of a deployment: a
/// client locked out on both (each refusing from its own refusal cache) is
/// reset through one server's admin endpoint, and the other server admits
/// it as soon as the store's notice reaches it; the two then admit exactly
/// the limit between them.
#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_reset_on_one_server_reaches_another_on_the_same_redis() {
    use ratewarden::redis::RedisStore;
    use ratewarden_test_support::redis as fixture;
    let clock = ManualClock::new();
    let prefix = fixture::unique_prefix("demo-fleet");
    let mut servers = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::builder(fixture::shared_url())
            .key_prefix(prefix.clone())
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        store.connect().await.unwrap();
        let mut s = settings(&clock);
        s.stores.primary = Arc::new(store);
        s.admin_token = Some(ratewarden_demo::admin::AdminToken::new(TOKEN).unwrap());
        servers.push(start(&s).await);
    }
    let client = |i: usize| TestClient::new(servers[i], Some("127.0.0.2".parse().unwrap()));
    let (a, b) = (client(0), client(1));
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += u32::from(post(&a, "/api/feedback").await.status == StatusCode::OK);
        admitted += u32::from(post(&b, "/api/feedback").await.status == StatusCode::OK);
    }
    assert_eq!(admitted, 5, "the two servers share one limit of 5");
    for server in [&a, &b] {
        for _ in 0..2 {
            let refused = post(server, "/api/feedback").await;
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        }
    }
    let operator = TestClient::new(servers[0], Some("127.0.0.3".parse().unwrap()));
    let bearer = format!("Bearer {TOKEN}");
    let done = operator
        .send(
            Method::POST,
            "/admin/reset?client=127.0.0.2&route=feedback",
            &[("authorization", bearer.as_str())],
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    // The other server stops refusing once the notice arrives; a refused
    // post counts nothing, so asking again costs nothing.
    let since = std::time::Instant::now();
    let mut first = post(&b, "/api/feedback").await;
    while first.status == StatusCode::TOO_MANY_REQUESTS {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the other server still refuses the client 10 s after the reset"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        first = post(&b, "/api/feedback").await;
    }
    assert_eq!(first.status, StatusCode::OK);
    let mut admitted = 1;
    for _ in 0..5 {
        admitted += u32::from(post(&a, "/api/feedback").await.status == StatusCode::OK);
        admitted += u32::from(post(&b, "/api/feedback").await.status == StatusCode::OK);
    }
    assert_eq!(
        admitted, 5,
        "after the reset the two servers admit exactly the limit"
    );
}
