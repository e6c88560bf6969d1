//! `GET /metrics` over a real socket after some traffic: decisions,
//! refusals, store errors, breaker transitions, fallbacks, store-call
//! latency and the memory store's keys and evictions, with their values.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use ratewarden::memory::MemoryStore;
use ratewarden::{
    AddressSource, ClientIdentity, FailurePolicy, Limiter, ManualClock, Policy, Rule, Store,
};
use ratewarden_conformance::broken::Unavailable as Failing;
use ratewarden_demo::prometheus::Metrics;
use ratewarden_demo::{FlagLimits, Settings, Stores, app};
use ratewarden_test_support::http::{Reply, TestClient, serve};

const SECRET: &str = "metrics test secret of 32+ bytes";

/// The samples of a Prometheus text page: `name{labels}` → value, with the
/// labels sorted so that a lookup does not depend on their order.
fn samples(page: &str) -> BTreeMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("a sample line");
            let key = match series.split_once('{') {
                Some((name, labels)) => {
                    let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                    labels.sort_unstable();
                    format!("{name}{{{}}}", labels.join(","))
                }
                None => series.to_owned(),
            };
            (key, value.parse().expect("a numeric value"))
        })
        .collect()
}

fn value(samples: &BTreeMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    labels.sort_unstable();
    let key = format!("{name}{{{}}}", labels.join(","));
    *samples
        .get(&key)
        .unwrap_or_else(|| panic!("no sample {key} in {samples:#?}"))
}

/// `client`'s request `method path` from the address `ip`, forwarded by
/// the one proxy the settings trust.
async fn from(client: &TestClient, method: http::Method, path: &str, ip: &str) -> Reply {
    client.send(method, path, &[("x-forwarded-for", ip)]).await
}

fn memory_stores() -> Stores {
    Stores {
        primary: Arc::new(MemoryStore::new(100)),
        local_tier: None,
        leased: None,
    }
}

fn settings(clock: &ManualClock, stores: Stores, search_per_minute: u32) -> Settings {
    Settings {
        limits: FlagLimits {
            search_per_minute,
            ..FlagLimits::default()
        },
        stores,
        identity: ClientIdentity::new(SECRET)
            .unwrap()
            .with_source(AddressSource::x_forwarded_for(1).unwrap()),
        clock: Arc::new(clock.clone()),
        on_failure: FailurePolicy::Open,
        admin_token: None,
        api_keys: Default::default(),
        file: None,
        shadow: Vec::new(),
    }
}

#[tokio::test]
async fn metrics_show_what_the_limiter_did() {
    // Before any limiter records, as the binary does.
    let mut metrics = Metrics::install().unwrap();
    let clock = ManualClock::new();

    // A memory store of two keys in one shard: the third client evicts the
    // least recently touched one.
    let memory = Arc::new(
        MemoryStore::builder()
            .capacity(2)
            .shards(1)
            .build()
            .unwrap(),
    );
    metrics.watch_memory("primary", memory.clone());
    let stores = Stores {
        primary: memory.clone() as Arc<dyn Store>,
        local_tier: None,
        leased: None,
    };
    let router = app(&settings(&clock, stores, 2))
        .unwrap()
        .merge(metrics.router());
    let client = TestClient::new(serve(router).await, None);
    let search = |ip: &'static str| {
        let client = client.clone();
        async move {
            client
                .send(http::Method::GET, "/api/search", &[("x-forwarded-for", ip)])
                .await
                .status
        }
    };
    assert_eq!(search("203.0.113.1").await, StatusCode::OK);
    assert_eq!(search("203.0.113.1").await, StatusCode::OK);
    assert_eq!(search("203.0.113.1").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(search("203.0.113.2").await, StatusCode::OK);
    assert_eq!(search("203.0.113.3").await, StatusCode::OK);

    // A dead shared store behind a memory tier: three failures open its
    // breaker, and the fourth request does not call it.
    let tiered = Stores {
        primary: Arc::new(Failing),
        local_tier: Some(Arc::new(MemoryStore::new(100))),
        leased: None,
    };
    let dead = TestClient::new(
        serve(app(&settings(&clock, tiered, 60)).unwrap()).await,
        None,
    );
    for _ in 0..4 {
        let reply = from(&dead, http::Method::GET, "/api/search", "198.51.100.1").await;
        assert_eq!(reply.status, StatusCode::OK, "fail open");
    }

    // `--shadow feedback`: 7 posts against 5 per hour, all served, the last
    // two counted as what the limit would have refused.
    let shadow = Settings {
        shadow: vec!["feedback".to_owned()],
        ..settings(&clock, memory_stores(), 60)
    };
    let watched = TestClient::new(serve(app(&shadow).unwrap()).await, None);
    for i in 1..=7 {
        let reply = from(
            &watched,
            http::Method::POST,
            "/api/feedback",
            "198.51.100.7",
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "post {i}");
        let flagged = reply
            .headers
            .get("x-ratelimit-shadow")
            .map(|v| v.to_str().unwrap());
        assert_eq!(flagged, (i > 5).then_some("refused"), "post {i}");
    }

    // The demo configures no fallback; a rule with one reports through the
    // same recorder.
    let lookup = Limiter::builder()
        .shared_clock(Arc::new(clock.clone()))
        .rule(
            Rule::new(
                "lookup",
                Arc::new(Failing),
                Policy::gcra(10, Duration::from_secs(1)).unwrap(),
            )
            .unwrap()
            .with_fallback(Arc::new(MemoryStore::new(10)))
            .unwrap(),
        )
        .build()
        .unwrap();
    assert!(lookup.check(b"client").await.source.fallback);

    let reply = client.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.header("content-type").starts_with("text/plain"),
        "{reply:?}"
    );
    let page = reply.body;
    let s = samples(&page);
    let decisions = "ratewarden_decisions_total";
    let search_memory = [("rule", "search"), ("store", "memory")];
    assert_eq!(
        value(
            &s,
            decisions,
            &[search_memory[0], search_memory[1], ("outcome", "allowed")]
        ),
        4.0
    );
    assert_eq!(
        value(
            &s,
            decisions,
            &[search_memory[0], search_memory[1], ("outcome", "refused")]
        ),
        1.0
    );
    // The memory tier admitted all four; the dead store's rule decided by
    // the failure policy, each decision naming the store that failed.
    assert_eq!(
        value(
            &s,
            decisions,
            &[
                ("rule", "search-local"),
                ("store", "memory"),
                ("outcome", "allowed")
            ]
        ),
        4.0
    );
    assert_eq!(
        value(
            &s,
            decisions,
            &[
                ("rule", "search"),
                ("store", "unavailable"),
                ("outcome", "allowed")
            ]
        ),
        4.0
    );
    // `--shadow feedback`: five admitted, two that would have been refused.
    for (outcome, n) in [("shadow_refused", 2.0), ("allowed", 5.0)] {
        let labels = [
            ("rule", "feedback"),
            ("store", "memory"),
            ("outcome", outcome),
        ];
        assert_eq!(value(&s, decisions, &labels), n, "{outcome}");
    }
    let dead_search = [("rule", "search"), ("store", "unavailable")];
    assert_eq!(
        value(
            &s,
            "ratewarden_store_errors_total",
            &[dead_search[0], dead_search[1], ("kind", "unavailable")]
        ),
        3.0
    );
    assert_eq!(
        value(
            &s,
            "ratewarden_breaker_transitions_total",
            &[dead_search[0], dead_search[1], ("to", "open")]
        ),
        1.0
    );
    // The breaker's state now: open.
    assert_eq!(
        value(
            &s,
            "ratewarden_breaker_open",
            &[dead_search[0], dead_search[1]]
        ),
        1.0
    );
    // Store-call latency: the three awaited calls to the dead store (the
    // fourth was skipped by the open breaker), and lookup's one; memory
    // answers inline and is not timed.
    assert_eq!(
        value(
            &s,
            "ratewarden_store_call_seconds_count",
            &[dead_search[0], dead_search[1], ("op", "decide")]
        ),
        3.0
    );
    assert_eq!(
        value(
            &s,
            "ratewarden_store_call_seconds_bucket",
            &[
                dead_search[0],
                dead_search[1],
                ("op", "decide"),
                ("le", "+Inf")
            ]
        ),
        3.0
    );
    assert!(
        !s.keys()
            .any(|k| k.starts_with("ratewarden_store_call_seconds") && k.contains("\"memory\"")),
        "{page}"
    );
    assert_eq!(
        value(&s, "ratewarden_fallbacks_total", &[("rule", "lookup")]),
        1.0
    );
    assert_eq!(
        value(&s, "ratewarden_memory_keys", &[("store", "primary")]),
        2.0
    );
    assert_eq!(
        value(&s, "ratewarden_memory_capacity", &[("store", "primary")]),
        2.0
    );
    assert_eq!(
        value(
            &s,
            "ratewarden_memory_evictions_total",
            &[("store", "primary")]
        ),
        1.0
    );
    assert!(page.contains("# HELP ratewarden_decisions_total"), "{page}");
    assert_eq!(memory.len(), 2);
}

/// The recorder holds every histogram sample (each awaited store call's
/// latency) until upkeep folds it into the buckets: a thread keeps it from
/// the moment the recorder is installed, so that a demo nobody scrapes
/// does not grow by every call it makes to its store.
#[cfg(target_os = "linux")]
#[test]
fn the_recorder_is_kept_with_no_scrape() {
    Metrics::install().unwrap();
    assert!(
        ratewarden_test_support::threads::has_thread("metrics-upkeep"),
        "{:?}",
        ratewarden_test_support::threads::thread_names()
    );
}
