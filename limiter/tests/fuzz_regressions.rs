//! Inputs the fuzz targets in `fuzz/` found, kept as tests.

/// Found by the `store_url` fuzz target: a `memory://` URL with user info
/// is refused, but the reason repeats the raw path — password included —
/// although the URL itself is shown redacted. Fails until
/// `limiter::store::memory_capacity` stops echoing the unredacted part.
#[tokio::test]
#[ignore = "known bug: memory:// errors echo the password (limiter/src/store.rs, memory_capacity)"]
async fn memory_url_errors_do_not_echo_a_password() {
    let err = limiter::store::from_url("memory://user:hunter2@host")
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("hunter2"), "{err}");
}
