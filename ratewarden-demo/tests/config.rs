//! Route limits from a `--config` TOML file (`ratewarden::config`): bare
//! policies in the demo's own composition, rules as written, flags that
//! override a route, and files refused with the file, line and key, or for
//! limiting nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use ratewarden::memory::MemoryStore;
use ratewarden::{ClientIdentity, FailurePolicy, ManualClock};
use ratewarden_demo::{Config, Settings, Stores, app, cli, load_limits};
use ratewarden_test_support::http::{TestClient, serve};

/// Writes `text` to a file of its own under the test's scratch directory.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ratewarden-demo-config");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn config(args: &[&str]) -> Config {
    let matches = cli()
        .try_get_matches_from(["ratewarden-demo"].iter().chain(args))
        .unwrap();
    Config::from_matches(&matches).unwrap()
}

/// The settings the binary would serve with `args` and the file at `path`,
/// on a memory store and `clock`; or the error loading the file ends in.
async fn settings(
    path: &std::path::Path,
    args: &[&str],
    clock: &ManualClock,
) -> Result<Settings, String> {
    let mut all = vec!["--config", path.to_str().unwrap()];
    all.extend(args);
    let config = config(&all);
    let stores = Stores {
        primary: Arc::new(MemoryStore::new(1_000)),
        local_tier: None,
        leased: None,
    };
    let file = load_limits(path, &stores, Arc::new(clock.clone()))
        .await
        .map_err(|e| e.to_string())?;
    Ok(Settings {
        limits: config.limits,
        stores,
        identity: ClientIdentity::new("config test secret of 32+ bytes!").unwrap(),
        clock: Arc::new(clock.clone()),
        on_failure: FailurePolicy::Open,
        admin_token: None,
        api_keys: Default::default(),
        file: Some(file),
        shadow: config.shadow,
    })
}

const VALID: &str = r#"
# Two routes; contact keeps its built-in limit.
[limits.feedback]
policy = "fixed_window 3/hour"

[limits.search]
policy = "gcra 10/s burst 20"
"#;

#[tokio::test]
async fn a_valid_file_is_applied_and_decides_through_the_memory_store() {
    let clock = ManualClock::new();
    let settings = settings(&file("valid.toml", VALID), &[], &clock)
        .await
        .unwrap();
    let client = TestClient::new(serve(app(&settings).unwrap()).await, None);
    // The burst of 20, then one every 100 ms, on a manual clock.
    for i in 0..20u64 {
        let reply = client.get("/api/search").await;
        assert_eq!(reply.status, StatusCode::OK, "search {i}");
        assert_eq!(reply.remaining(), 19 - i);
    }
    let refused = client.get("/api/search").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // The window a client sees is the time the burst takes to refill.
    assert_eq!(refused.header("ratelimit-policy"), "\"search\";q=20;w=2");
    assert_eq!(refused.header_u64("retry-after"), 1);
    clock.advance(Duration::from_millis(99));
    assert_eq!(
        client.get("/api/search").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(client.get("/api/search").await.status, StatusCode::OK);
    // Feedback is a fixed window of 3; contact keeps its 10 a day.
    for _ in 0..3 {
        let reply = client.send(http::Method::POST, "/api/feedback", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = client.send(http::Method::POST, "/api/feedback", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    let reply = client.send(http::Method::POST, "/api/contact", &[]).await;
    assert_eq!(reply.limit(), 10);
}

#[tokio::test]
async fn a_flag_overrides_the_file_for_its_route_only() {
    let clock = ManualClock::new();
    let path = file("overridden.toml", VALID);
    let settings = settings(&path, &["--search-per-minute", "7"], &clock)
        .await
        .unwrap();
    let client = TestClient::new(serve(app(&settings).unwrap()).await, None);
    assert_eq!(client.get("/api/search").await.limit(), 7);
    let feedback = client.send(http::Method::POST, "/api/feedback", &[]).await;
    assert_eq!(feedback.limit(), 3);
}

#[tokio::test]
async fn rules_spelled_out_are_used_as_written() {
    let clock = ManualClock::new();
    let text = "[stores]\nother = \"memory://?capacity=100\"\n\n[limits.search]\nrules = [\n  { name = \"search-a\", store = \"other\", policy = \"fixed_window 4/minute\" },\n  { name = \"search-b\", store = \"default\", policy = \"fixed_window 2/minute\" },\n]\n";
    let settings = settings(&file("rules.toml", text), &[], &clock)
        .await
        .unwrap();
    let client = TestClient::new(serve(app(&settings).unwrap()).await, None);
    let statuses: Vec<u16> = futures_statuses(&client, 3).await;
    assert_eq!(statuses, [200, 200, 429]);
    let refused = client.get("/api/search").await;
    assert!(
        refused
            .header("ratelimit-policy")
            .contains("\"search-b\";q=2;w=60"),
        "{refused:?}"
    );
}

async fn futures_statuses(client: &TestClient, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(client.get("/api/search").await.status.as_u16());
    }
    statuses
}

/// Each `(name, text, parts)`: a file `name` holding `text` is refused
/// with an error that says every one of `parts`.
async fn assert_refused(cases: &[(&str, &str, &[&str])]) {
    let clock = ManualClock::new();
    for (name, text, parts) in cases {
        let err = settings(&file(name, text), &[], &clock).await.unwrap_err();
        for part in *parts {
            assert!(err.contains(part), "{name}: no {part:?} in {err}");
        }
    }
}

#[tokio::test]
async fn a_bad_policy_is_refused_naming_the_file_line_and_key() {
    assert_refused(&[
        (
            "bad_policy.toml",
            "[limits.feedback]\npolicy = \"5/hour\"\n\n[limits.search]\npolicy = \"60/fortnight\"\n",
            &[
                "bad_policy.toml: line 5, column 10: `policy = \"60/fortnight\"`",
                "unknown unit \"fortnight\"",
            ],
        ),
        // Well formed, but a policy the constructor refuses.
        (
            "zero.toml",
            "[limits.contact]\npolicy = \"fixed_window 0/day\"\n",
            &["zero.toml: line 2", "limit must be at least 1"],
        ),
    ])
    .await;
}

#[tokio::test]
async fn unknown_keys_and_routes_are_refused_naming_the_line() {
    assert_refused(&[
        (
            "unknown_key.toml",
            "[limits.search]\npolicy = \"60/min\"\nburst = 5\n",
            &[
                "unknown_key.toml: line 3",
                "`burst = 5`",
                "unknown field `burst`",
            ],
        ),
        (
            "unknown_route.toml",
            "\n[limits.serach]\npolicy = \"60/min\"\n",
            // The known routes are listed.
            &[
                "unknown_route.toml",
                "no route of the demo is named \"serach\"",
                "feedback, contact, search",
            ],
        ),
        (
            "top_level.toml",
            "listen = \"0.0.0.0:80\"\n",
            &["line 1", "unknown field `listen`"],
        ),
        (
            "not_toml.toml",
            "[limits.search\n",
            &["not_toml.toml: line 1"],
        ),
        (
            "no_tier.toml",
            "[limits.search]\nstore = \"local\"\npolicy = \"60/min\"\n",
            // No memory tier without --tiered.
            &["line 2", "no store is named \"local\" (stores: default)"],
        ),
    ])
    .await;

    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-limits.toml");
    let err = settings(&missing, &[], &ManualClock::new())
        .await
        .unwrap_err();
    assert!(
        err.contains("cannot read") && err.contains("no-such-limits.toml"),
        "{err}"
    );
}

#[tokio::test]
async fn an_empty_or_commented_out_file_is_refused() {
    assert_refused(&[
        (
            "empty.toml",
            "",
            &[
                "empty.toml: no limit is defined, so nothing would be limited",
                "write at least one [limits.NAME]",
            ],
        ),
        (
            "commented_out.toml",
            "# [limits.search]\n# policy = \"60/min\"\n",
            &["commented_out.toml: no limit is defined"],
        ),
    ])
    .await;
}

#[tokio::test]
async fn the_example_file_is_valid() {
    let example = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/limits.example.toml"));
    let settings = settings(&example, &[], &ManualClock::new()).await.unwrap();
    let file = settings.file.as_ref().unwrap();
    let policy = |name: &str| file.limiter(name).unwrap().rules()[0].policy().to_string();
    assert_eq!(
        file.bare_policy("feedback").unwrap().to_string(),
        "sliding_log 5/h"
    );
    assert_eq!(policy("contact"), "fixed_window 10/d");
    assert_eq!(file.bare_policy("contact"), None);
    assert_eq!(
        file.bare_policy("search").unwrap().to_string(),
        "gcra 2/s burst 30"
    );
}

#[tokio::test]
async fn the_files_access_lists_guard_every_route() {
    let clock = ManualClock::new();
    let text = "[limits.search]\npolicy = \"fixed_window 2/minute\"\n\n[access]\ndeny = [\"127.0.0.3\"]\nallow = [\"127.0.0.2\"]\n";
    let settings = settings(&file("access.toml", text), &[], &clock)
        .await
        .unwrap();
    let server = serve(app(&settings).unwrap()).await;
    let at = |last: u8| TestClient::new(server, Some(std::net::IpAddr::from([127, 0, 0, last])));
    let denied = at(3);
    for path in ["/api/search", "/api/reports"] {
        let reply = denied.get(path).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{path}: {reply:?}");
    }
    let login = denied.send(http::Method::POST, "/api/login", &[]).await;
    assert_eq!(login.status, StatusCode::FORBIDDEN);
    let allowed: Vec<u16> = futures_statuses(&at(2), 4).await;
    assert_eq!(allowed, [200, 200, 200, 200]);
    let limited: Vec<u16> = futures_statuses(&at(1), 3).await;
    assert_eq!(limited, [200, 200, 429]);
}
