//! Route policies from a `--config` TOML file: applied, overridden by
//! flags, and refused with the file and line when wrong.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use ratewarden::memory::MemoryStore;
use ratewarden::{ClientIdentity, FailurePolicy, ManualClock, Policy};
use ratewarden_demo::{Config, Settings, Stores, app, cli};
use ratewarden_test_support::http::{TestClient, serve};

/// Writes `text` to a file of its own under the test's scratch directory.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ratewarden-demo-config");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn config(args: &[&str]) -> Result<Config, String> {
    let matches = cli()
        .try_get_matches_from(["ratewarden-demo"].iter().chain(args))
        .map_err(|e| e.to_string())?;
    Config::from_matches(&matches).map_err(|e| e.to_string())
}

/// The error a `--config` file named `name` holding `text` is refused with.
fn config_error(name: &str, text: &str) -> String {
    let path = file(name, text);
    config(&["--config", path.to_str().unwrap()]).unwrap_err()
}

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

const VALID: &str = r#"
# Two routes; contact keeps its built-in limit.
[routes.feedback]
limit = "fixed_window 3/hour"

[routes.search]
limit = "gcra 10/s burst 20"
"#;

#[tokio::test]
async fn a_valid_file_is_applied_and_decides_through_the_memory_store() {
    let path = file("valid.toml", VALID);
    let config = config(&["--config", path.to_str().unwrap()]).unwrap();
    assert_eq!(config.config_file.as_deref(), Some(path.as_path()));
    let policies = config.limits.policies;
    assert_eq!(policies.feedback, Some(policy("fixed_window 3/h")));
    assert_eq!(policies.contact, None);
    assert_eq!(
        policies.search,
        Some(Policy::gcra_with_burst(10, Duration::from_secs(1), 20).unwrap())
    );
    let endpoints = config.limits.endpoints().unwrap();
    assert_eq!(endpoints[1].policy.to_string(), "sliding_log 10/d");

    // The burst of 20, then one every 100 ms, on a manual clock.
    let clock = ManualClock::new();
    let settings = Settings {
        limits: config.limits,
        stores: Stores {
            primary: Arc::new(MemoryStore::new(1_000)),
            local_tier: None,
            leased: None,
        },
        identity: ClientIdentity::new("config test secret of 32+ bytes!").unwrap(),
        clock: Arc::new(clock.clone()),
        on_failure: FailurePolicy::Open,
        admin_token: None,
        api_keys: Default::default(),
    };
    let client = TestClient::new(serve(app(&settings).unwrap()).await, None);
    for i in 0..20u64 {
        let reply = client.get("/api/search").await;
        assert_eq!(reply.status, StatusCode::OK, "search {i}");
        assert_eq!(reply.header_u64("x-ratelimit-remaining"), 19 - i);
    }
    let refused = client.get("/api/search").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    // The window a client sees is the time the burst takes to refill.
    assert_eq!(refused.header("ratelimit-policy"), "\"search\";q=20;w=2");
    // 100 ms, rounded up to whole seconds.
    assert_eq!(refused.header_u64("retry-after"), 1);
    clock.advance(Duration::from_millis(99));
    assert_eq!(
        client.get("/api/search").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(client.get("/api/search").await.status, StatusCode::OK);
    assert_eq!(
        client.get("/api/search").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Feedback is a fixed window of 3.
    for _ in 0..3 {
        let reply = client.send(http::Method::POST, "/api/feedback", &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
    }
    let reply = client.send(http::Method::POST, "/api/feedback", &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn a_flag_overrides_the_file_for_its_route_only() {
    let path = file("overridden.toml", VALID);
    let config = config(&[
        "--config",
        path.to_str().unwrap(),
        "--search-per-minute",
        "7",
    ])
    .unwrap();
    let endpoints = config.limits.endpoints().unwrap();
    assert_eq!(endpoints[2].policy, policy("sliding_log 7/min"));
    assert_eq!(endpoints[0].policy, policy("fixed_window 3/h"));
}

/// Each `(name, text, parts)`: a file `name` holding `text` is refused
/// with an error that says every one of `parts`.
fn assert_refused(cases: &[(&str, &str, &[&str])]) {
    for (name, text, parts) in cases {
        let err = config_error(name, text);
        for part in *parts {
            assert!(err.contains(part), "{name}: no {part:?} in {err}");
        }
    }
}

#[test]
fn a_bad_policy_is_refused_naming_the_file_and_line() {
    assert_refused(&[
        (
            "bad_policy.toml",
            "[routes.feedback]\nlimit = \"5/hour\"\n\n[routes.search]\nlimit = \"60/fortnight\"\n",
            &[
                "bad_policy.toml: line 5, column 9",
                "unknown unit \"fortnight\"",
            ],
        ),
        // Well formed, but a policy the constructor refuses.
        (
            "zero.toml",
            "[routes.contact]\nlimit = \"fixed_window 0/day\"\n",
            &["zero.toml: line 2", "limit must be at least 1"],
        ),
    ]);
}

#[test]
fn unknown_keys_and_routes_are_refused_naming_the_line() {
    assert_refused(&[
        (
            "unknown_key.toml",
            "[routes.search]\nlimit = \"60/min\"\nburst = 5\n",
            &["unknown_key.toml: line 3", "unknown field `burst`"],
        ),
        (
            "unknown_route.toml",
            "\n[routes.serach]\nlimit = \"60/min\"\n",
            // The known routes are listed.
            &[
                "unknown_route.toml: line 2",
                "unknown field `serach`",
                "`search`",
            ],
        ),
        (
            "top_level.toml",
            "listen = \"0.0.0.0:80\"\n",
            &["line 1", "unknown field `listen`"],
        ),
        (
            "not_toml.toml",
            "[routes.search\n",
            &["not_toml.toml: line 1"],
        ),
    ]);

    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-limits.toml");
    let err = config(&["--config", missing.to_str().unwrap()]).unwrap_err();
    assert!(
        err.contains("cannot read") && err.contains("no-such-limits.toml"),
        "{err}"
    );
}

#[test]
fn the_example_file_is_valid() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/limits.example.toml");
    let config = config(&["--config", example]).unwrap();
    let [feedback, contact, search] = config.limits.endpoints().unwrap();
    assert_eq!(feedback.policy, policy("5/hour"));
    assert_eq!(contact.policy, policy("fixed_window 10/day"));
    assert_eq!(search.policy, policy("gcra 2/s burst 30"));
}
