//! `ratewarden::store::from_url` with and without each backend feature.

use ratewarden::store::from_url;

async fn err(url: &str) -> String {
    match from_url(url).await {
        Ok(store) => panic!("{url} opened {store:?}"),
        Err(e) => e.to_string(),
    }
}

/// Panics unless opening `url` is refused with an error that says `because`.
async fn assert_refused(url: &str, because: &str) {
    let e = err(url).await;
    assert!(e.contains(because), "{url}: {e}");
}

#[tokio::test]
async fn unknown_and_malformed_urls_are_refused() {
    assert_refused("ftp://example.com", "unknown store scheme \"ftp\"").await;
    assert_refused("memory", "expected SCHEME://").await;
    assert_refused("", "expected SCHEME://").await;
    // A password never appears in the error.
    let e = err("mysql://app:hunter2@db/limits").await;
    assert!(e.contains("app:***@db") && !e.contains("hunter2"), "{e}");
}

#[cfg(feature = "memory")]
#[tokio::test]
async fn memory_urls_open_a_bounded_memory_store() {
    let store = from_url("memory://").await.unwrap();
    assert_eq!(store.name(), "memory");
    assert_eq!(
        store.capabilities().key_capacity,
        Some(ratewarden::store::DEFAULT_MEMORY_CAPACITY)
    );
    let store = from_url("memory://?capacity=5").await.unwrap();
    assert_eq!(store.capabilities().key_capacity, Some(5));
    assert!(!store.capabilities().shared);
    assert_refused("memory://?capacity=0", "positive").await;
    assert_refused("memory://?capacity=lots", "positive").await;
    assert_refused("memory://?ttl=5", "unknown parameter").await;
    assert_refused("memory://somehost", "no user, host or path").await;
}

#[cfg(not(feature = "memory"))]
#[tokio::test]
async fn memory_urls_name_the_missing_feature() {
    assert_refused("memory://", "needs the `memory` feature").await;
}

/// `{scheme}://{rest}` is refused naming the feature of the ratewarden crate
/// it needs, and without the password (`pw`) that `rest` carries.
#[cfg(any(not(feature = "redis"), not(feature = "postgres")))]
async fn assert_needs_feature(scheme: &str, rest: &str, feature: &str) {
    let e = err(&format!("{scheme}://{rest}")).await;
    assert!(
        e.contains(&format!(
            "{scheme}:// needs the `{feature}` feature of the ratewarden crate"
        )),
        "{e}"
    );
    assert!(!e.contains(":pw@"), "{e}");
}

#[cfg(not(feature = "redis"))]
#[tokio::test]
async fn redis_urls_name_the_missing_feature() {
    for scheme in ["redis", "rediss", "redis+cluster"] {
        assert_needs_feature(scheme, ":pw@127.0.0.1:6379", "redis").await;
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redis_urls_open_a_redis_store_without_connecting() {
    // Nothing listens on port 1: the store connects on its first decision,
    // where a failure goes through the rule's failure policy.
    let store = from_url("redis://127.0.0.1:1/0").await.unwrap();
    assert_eq!(store.name(), "redis");
    assert!(store.capabilities().shared);
    assert!(matches!(
        from_url("redis://127.0.0.1:notaport").await,
        Err(ratewarden::ConfigError::InvalidUrl { .. })
    ));
}

#[cfg(not(feature = "postgres"))]
#[tokio::test]
async fn postgres_urls_name_the_missing_feature() {
    for scheme in ["postgres", "postgresql"] {
        assert_needs_feature(scheme, "app:pw@db/limits", "postgres").await;
    }
}
