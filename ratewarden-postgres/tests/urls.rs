//! Store URLs: exactly the schemes of `URL_SCHEMES` are accepted, TLS modes
//! need the `tls` feature, and a password, wherever it sits in the URL,
//! never reaches an error's text or any `Debug` output.

use std::error::Error as _;
use std::time::Duration;

use ratewarden_core::{ConfigError, StoreError};
use ratewarden_postgres::{BuildError, PostgresStore, URL_SCHEMES};
use ratewarden_test_support::postgres as fixture;

/// A password as a query parameter, and one holding an unencoded `/`
/// (which makes the URL unparseable, so that a careless error would quote
/// it raw).
const SECRET_URLS: [&str; 2] = [
    "postgres://app@db/x?password=hunter2",
    "postgres://app:hunter/2@db/x",
];

/// Every rendering of `err` and of each error under it.
fn renderings(err: &BuildError) -> Vec<String> {
    let mut all = vec![err.to_string(), format!("{err:?}")];
    let mut source = err.source();
    while let Some(e) = source {
        all.push(e.to_string());
        all.push(format!("{e:?}"));
        source = e.source();
    }
    all
}

/// Every run of five characters of the passwords above (four would find
/// "nter" in the builder's `sweep_interval`).
fn password_parts() -> impl Iterator<Item = &'static str> {
    ["hunter2", "hunter/2"]
        .into_iter()
        .flat_map(|p| (0..=p.len() - 5).map(move |at| &p[at..at + 5]))
}

fn assert_hidden(texts: &[String], what: &str) {
    for text in texts {
        for part in password_parts() {
            assert!(
                !text.contains(part),
                "{what} shows {part:?} of the password: {text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_appear_in_errors_or_debug_output() {
    for url in SECRET_URLS {
        let builder = PostgresStore::builder(url)
            .sweep_interval(None)
            .connect_timeout(Duration::from_secs(2));
        assert_hidden(&[format!("{builder:?}")], &format!("the builder of {url}"));

        // A bad setting beside the URL.
        let err = builder.clone().pool_size(0).build().await.unwrap_err();
        assert!(matches!(err, BuildError::Config(_)), "{err:?}");
        assert_hidden(&renderings(&err), &format!("a setting error for {url}"));

        // The URL itself: unreachable (no server named db) or unparseable.
        let err = builder.build().await.unwrap_err();
        assert_hidden(&renderings(&err), &format!("the build error of {url}"));
        let store_error = StoreError::from(err);
        assert_hidden(
            &[store_error.to_string(), format!("{store_error:?}")],
            &format!("the store error of {url}"),
        );
    }
    // The unencoded `/` is refused as a URL, saying how to fix it.
    let err = PostgresStore::from_url(SECRET_URLS[1]).await.unwrap_err();
    assert!(
        matches!(err, BuildError::Config(ConfigError::InvalidUrl { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("percent-encoded"), "{err}");

    // A reachable address that refuses connections: an error from the
    // connection attempt, still without the password.
    let err = PostgresStore::builder("postgres://app@127.0.0.1:1/x?password=hunter2")
        .sweep_interval(None)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
    assert_hidden(&renderings(&err), "a connection error");
}

/// A store on the test server, with a password parameter the server's trust
/// authentication ignores: nothing it prints shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_store_shows_no_password() {
    let mut url = ratewarden_core::url::Url::parse(&fixture::server_url()).unwrap();
    url.query_pairs_mut().append_pair("password", "hunter2");
    let builder = PostgresStore::builder(url.as_str())
        .schema(fixture::unique_schema("urls"))
        .sweep_interval(None);
    assert_hidden(&[format!("{builder:?}")], "the builder");
    let store = builder.build().await.expect("the store builds");
    assert_hidden(&[format!("{store:?}")], "the store");
}

/// Exactly the documented schemes are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_documented_schemes_are_accepted() {
    assert_eq!(URL_SCHEMES, ["postgres", "postgresql"]);
    let server = fixture::server_url();
    let (_, rest) = server.split_once("://").expect("a URL");
    for scheme in URL_SCHEMES {
        PostgresStore::builder(format!("{scheme}://{rest}"))
            .schema(fixture::unique_schema("schemes"))
            .sweep_interval(None)
            .build()
            .await
            .unwrap_or_else(|e| panic!("{scheme}:// is accepted: {e}"));
    }
    for scheme in ["pg", "postgres+tls", "redis", "POSTGRES+x", "mysql"] {
        let err = PostgresStore::from_url(&format!("{scheme}://{rest}"))
            .await
            .unwrap_err();
        assert!(
            matches!(err, BuildError::Config(ConfigError::InvalidUrl { .. })),
            "{scheme}: {err:?}"
        );
        assert!(
            err.to_string().contains("postgres, postgresql"),
            "{scheme}: {err}"
        );
    }
}

/// Without the `tls` feature, a URL asking for TLS is refused when the
/// store is built, naming the feature, rather than connecting in clear.
#[cfg(not(feature = "tls"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_modes_are_refused_without_the_tls_feature() {
    for mode in ["require", "verify-ca", "verify-full"] {
        let url = format!("postgres://app:hunter2@db/x?sslmode={mode}");
        let err = PostgresStore::from_url(&url).await.unwrap_err();
        assert!(
            matches!(err, BuildError::Config(ConfigError::InvalidUrl { .. })),
            "{mode}: {err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("`tls` feature"), "{text}");
        assert!(text.contains(&format!("sslmode={mode}")), "{text}");
        assert_hidden(&renderings(&err), mode);
    }
}
